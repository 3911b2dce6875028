"""Minimal ONNX Runtime wrapper around an exported decoder (CPU, numpy I/O).

Used by the tests and by ``models.evaluate``; the GPU decoding path of the
project has its own runner.
"""
from __future__ import annotations

import json
import os

import numpy as np


class OrtDecoder:
    def __init__(self, model_dir: str, providers=("CPUExecutionProvider",), threads: int = 0):
        import onnxruntime as ort

        with open(os.path.join(model_dir, "config.json")) as f:
            self.config = json.load(f)
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(os.path.join(model_dir, "model.onnx"),
                                            sess_options=opts, providers=list(providers))
        self.n_layer = self.config["n_layer"]
        self.n_head = self.config["n_head"]
        self.head_dim = self.config["n_embd"] // self.n_head

    def empty_past(self, batch: int) -> list[np.ndarray]:
        """[k0, v0, k1, v1, ...] with a zero-length past."""
        shape = (batch, self.n_head, 0, self.head_dim)
        return [np.zeros(shape, np.float32) for _ in range(2 * self.n_layer)]

    def __call__(self, input_ids, attention_mask=None, position_ids=None, past=None):
        """Returns (logits [B,S,V] float32, present list like ``past``).

        Defaults: all-ones mask over past+new, positions continuing from the past.
        """
        ids = np.asarray(input_ids, np.int64)
        B, S = ids.shape
        past = self.empty_past(B) if past is None else past
        P = past[0].shape[2]
        if attention_mask is None:
            attention_mask = np.ones((B, P + S), np.int64)
        if position_ids is None:
            position_ids = np.broadcast_to(np.arange(P, P + S, dtype=np.int64), (B, S))
        feed = {"input_ids": ids,
                "attention_mask": np.asarray(attention_mask, np.int64),
                "position_ids": np.ascontiguousarray(position_ids, np.int64)}
        for i in range(self.n_layer):
            feed[f"past_key_values.{i}.key"] = past[2 * i]
            feed[f"past_key_values.{i}.value"] = past[2 * i + 1]
        out = self.session.run(None, feed)
        return out[0], out[1:]
