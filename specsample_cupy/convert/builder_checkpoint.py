"""An ONNX Runtime GenAI builder folder (genai_config.json, its decoder's ONNX file, tokenizer.json) read
as a checkpoint, so that the converter can write it again in the project's format. Converted, such a
model decodes batches with ragged acceptance on both backends, where the builder's own graph runs
several new tokens over a past at batch 1 only (GroupQueryAttention) and its CPU exports number
tokens by cache column (no position_ids input): decode/one_at_a_time.py.

The builder names each weight after the node that reads it (a MatMul's weight stored [in, out]):

    model.embed_tokens.weight                         [V, H]  (tied: the Gather reads lm_head's, transposed)
    model.layers.{i}.input_layernorm.weight           and post_attention_layernorm.weight
    model.layers.{i}.attn.qkv_proj.MatMul.weight      [H, (heads + 2 kv_heads) head_dim], packed, or
    model.layers.{i}.attn.{q,k,v}_proj.MatMul.weight  one per projection
    model.layers.{i}.attn.qkv_proj.Add.bias           or {q,k,v}_proj.Add.bias: absent when all zero
    model.layers.{i}.attn.o_proj.MatMul.weight        (o_proj.Add.bias)
    model.layers.{i}.mlp.{gate,up,down}_proj.MatMul.weight
    model.layers.{N}.final_norm_layernorm.weight      N = num_hidden_layers
    lm_head.MatMul.weight                             [H, V]
    cos_cache, sin_cache                              [max length, head_dim / 2]: the rotary tables

The rotary tables are used as the folder holds them (the builder bakes rope scaling into them), so the
converted model rotates exactly as the folder's did. A sliding window (GroupQueryAttention's
local_window_size) caps the converted model's context at the window, as for a checkpoint. Refused, in
one line: quantized weights (MatMulNBits and kin), partial or interleaved rotary, scaled tables
(mscale), logit softcapping, and any model type but llama, qwen2 and mistral.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from specsample_cupy.convert.checkpoint import ConversionError, TensorFolder, read_json
from specsample_cupy.convert.families import layer_names
from specsample_cupy.runtime.genai_config import GENAI_CONFIG, config_from_genai

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
QUANTIZED_OPS = ("MatMulNBits", "GatherBlockQuantized", "DequantizeLinear", "QMoE", "MatMulInteger")
NORM_OPS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")


def is_builder_folder(folder) -> bool:
    """Whether `folder` holds a builder export: genai_config.json and no safetensors weights."""
    folder = Path(folder)
    return (folder / GENAI_CONFIG).exists() and not (folder / "model.safetensors").exists() \
        and not (folder / "model.safetensors.index.json").exists()


def _attribute(node, name, default=None):
    from onnx import helper
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


class BuilderCheckpoint(TensorFolder):
    """A builder folder's tensors under their Hugging Face names and a config.json made from its
    genai_config.json and graph (module docstring)."""

    def __init__(self, folder):
        import onnx

        self.folder = Path(folder)
        genai_path = self.folder / GENAI_CONFIG
        genai = read_json(genai_path)
        try:
            config, filename = config_from_genai(genai, genai_path)
        except ValueError as exc:
            raise ConversionError(str(exc)) from exc
        model_type = genai["model"].get("type")
        if model_type not in ARCHITECTURES:
            raise ConversionError(f"{genai_path}: model type {model_type!r} is not supported "
                                  f"(supported: {', '.join(sorted(ARCHITECTURES))})")
        path = self.folder / (filename or "model.onnx")
        if not path.exists():
            raise ConversionError(f"{genai_path} names {path.name}, which the folder lacks")
        self.path = path
        model = onnx.load(str(path), load_external_data=False)
        self._inits = {t.name: t for t in model.graph.initializer}
        nodes = list(model.graph.node)
        window = self._refuse_what_it_cannot_write(nodes)
        self.config = c = self._config(config, model_type, nodes, window)
        self.head_dim = int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
        self._where = self._hf_names(self.config["num_hidden_layers"])
        self._last = (None, None)   # (tensor, array): the packed q/k/v tensor read last (q, k, v in turn)
        self.rotary = self._rotary()

    def _refuse_what_it_cannot_write(self, nodes) -> int:
        """ConversionError for what the module docstring lists; the attention's window (-1: none)."""
        window = -1
        for node in nodes:
            if node.op_type in QUANTIZED_OPS:
                raise ConversionError(f"{self.path}: quantized weights ({node.op_type}) are not read; "
                                      "export the model with float16 or float32 weights")
            if node.op_type == "GroupQueryAttention":
                for attribute, allowed in (("rotary_interleaved", 0), ("softcap", 0.0)):
                    value = _attribute(node, attribute, allowed)
                    if value != allowed:
                        raise ConversionError(f"{self.path}: GroupQueryAttention {attribute}={value} is not supported")
                window = int(_attribute(node, "local_window_size", -1))
        return window

    def _config(self, config: dict, model_type: str, nodes, window: int) -> dict:
        """config.json's keys: genai_config.json's, the architecture, and what only the graph says."""
        norm = next((n for n in nodes if n.op_type in NORM_OPS), None)
        if norm is None:
            raise ConversionError(f"{self.path} has no {' or '.join(NORM_OPS)} node (not a builder export)")
        config = {k: v for k, v in config.items() if k != "past_present_share_buffer"}
        if window > 0:
            config.update(sliding_window=window, use_sliding_window=True)
        layers = sum(1 for t in self._inits if t.endswith(".input_layernorm.weight"))
        if config.get("num_hidden_layers") != layers:
            raise ConversionError(f"{self.folder / GENAI_CONFIG} says num_hidden_layers = "
                                  f"{config.get('num_hidden_layers')} but {self.path.name} has {layers} layers")
        gate = self._init("model.layers.0.mlp.gate_proj.MatMul.weight")
        # Tied: the embedding is lm_head's weight transposed (a Transpose node feeds the Gather).
        tied = any(n.op_type == "Transpose" and "lm_head.MatMul.weight" in n.input for n in nodes)
        if not tied:
            self._init("model.embed_tokens.weight")   # absent: the graph takes inputs_embeds
        biases = [f"model.layers.{i}.attn.{p}.Add.bias" for i in range(layers)
                  for p in ("qkv_proj", "q_proj", "o_proj")]
        config.update(architectures=[ARCHITECTURES[model_type]], model_type=model_type, hidden_act="silu",
                      intermediate_size=int(gate.dims[1]), rms_norm_eps=float(_attribute(norm, "epsilon", 1e-6)),
                      tie_word_embeddings=tied,
                      attention_bias=any(b in self._inits for b in biases))
        return config

    def _init(self, tensor: str):
        if tensor not in self._inits:
            raise ConversionError(f"{self.path}: the graph lacks the tensor {tensor!r}")
        return self._inits[tensor]

    def _hf_names(self, layers: int) -> dict:
        """Hugging Face name -> how to read it: (initializer, transposed?) or a packed slice."""
        where = {"lm_head.weight": ("lm_head.MatMul.weight", True),
                 "model.norm.weight": (f"model.layers.{layers}.final_norm_layernorm.weight", False)}
        if not self.config["tie_word_embeddings"]:
            where["model.embed_tokens.weight"] = ("model.embed_tokens.weight", False)
        else:
            where["model.embed_tokens.weight"] = ("lm_head.MatMul.weight", True)
            del where["lm_head.weight"]
        for i in range(layers):
            names, p = layer_names(i), f"model.layers.{i}."
            where[names["input_norm"]] = (p + "input_layernorm.weight", False)
            where[names["post_norm"]] = (p + "post_attention_layernorm.weight", False)
            packed = p + "attn.qkv_proj.MatMul.weight" in self._inits
            for n in "qkv":
                where[names[n]] = ("qkv", i, n) if packed else (p + f"attn.{n}_proj.MatMul.weight", True)
                where[names[n + "_bias"]] = ("qkv_bias", i, n) if packed else \
                    ("bias", p + f"attn.{n}_proj.Add.bias", p + f"attn.{n}_proj.MatMul.weight")
            where[names["o"]] = (p + "attn.o_proj.MatMul.weight", True)
            where[names["o_bias"]] = ("bias", p + "attn.o_proj.Add.bias", p + "attn.o_proj.MatMul.weight")
            for n in ("gate", "up", "down"):
                where[names[n]] = (p + f"mlp.{n}_proj.MatMul.weight", True)
        return where

    def _array(self, tensor: str) -> np.ndarray:
        from onnx import numpy_helper
        return numpy_helper.to_array(self._init(tensor), base_dir=str(self.folder))

    def _packed(self, i: int, n: str, bias: bool) -> np.ndarray:
        c = self.config
        q = c["num_attention_heads"] * self.head_dim
        kv = c.get("num_key_value_heads", c["num_attention_heads"]) * self.head_dim
        start, width = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[n]
        tensor = f"model.layers.{i}.attn.qkv_proj." + ("Add.bias" if bias else "MatMul.weight")
        if bias and tensor not in self._inits:
            return np.zeros(width, np.float32)
        if self._last[0] != tensor:   # q, k and v come from one read
            self._last = (tensor, self._array(tensor))
        packed = self._last[1]
        return packed[start:start + width] if bias else np.ascontiguousarray(packed[:, start:start + width].T)

    def get(self, name: str) -> np.ndarray:
        where = self._where.get(name)
        if where is None:
            raise ConversionError(f"{self.folder}: the builder export has no tensor for {name!r}")
        if where[0] in ("qkv", "qkv_bias"):
            return self._packed(where[1], where[2], where[0] == "qkv_bias")
        if where[0] == "bias":   # the builder leaves out an all-zero bias: its MatMul's width [in, out]
            _, tensor, weight = where
            return self._array(tensor) if tensor in self._inits else np.zeros(self._init(weight).dims[1], np.float32)
        tensor, transposed = where
        value = self._array(tensor)
        return np.ascontiguousarray(value.T) if transposed else value

    def _rotary(self):
        """(cos, sin) [rows, head_dim / 2] as float64 from the folder's tables, checked."""
        c, head_dim = self.config, self.head_dim
        cos, sin = (self._array(t).astype(np.float64) for t in ("cos_cache", "sin_cache"))
        if cos.ndim != 2 or cos.shape != sin.shape:
            raise ConversionError(f"{self.path}: cos_cache {cos.shape} and sin_cache {sin.shape} "
                                  "are not one [positions, head_dim / 2] table each")
        if 2 * cos.shape[1] != head_dim:
            raise ConversionError(f"{self.path}: rotary over {2 * cos.shape[1]} of {head_dim} head "
                                  "dimensions (partial rotary) is not supported")
        if np.abs(cos[0] - 1.0).max() > 1e-2:
            raise ConversionError(f"{self.path}: scaled rotary tables (mscale) are not supported")
        rows = cos.shape[0]
        c["max_position_embeddings"] = min(int(c.get("max_position_embeddings") or rows), rows)
        return cos, sin

    def inv_freq(self, shape) -> tuple:
        """The tables' inverse frequencies (what the config would say): each column's unwrapped angle
        fitted through the origin."""
        cos, sin = self.rotary
        angle = np.unwrap(np.arctan2(sin, cos), axis=0)
        p = np.arange(len(angle), dtype=np.float64)[:, None]
        return tuple((p * angle).sum(axis=0) / (p * p).sum())

    def rotary_tables(self, shape, dtype) -> tuple[np.ndarray, np.ndarray]:
        """The folder's own tables, its first shape.context rows, in `dtype`."""
        cos, sin = self.rotary
        return cos[:shape.context].astype(dtype), sin[:shape.context].astype(dtype)
