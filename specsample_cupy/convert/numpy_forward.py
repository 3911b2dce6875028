"""A plain NumPy forward pass of a Llama-family checkpoint (float64, no cache): the ground truth the
converted graphs are tested against. Written from the Hugging Face modelling code's maths, by tensor
name, independently of llama_graph.py (it repeats the KV heads instead of stacking queries, applies
rotary with rotate_half, and masks by position).
"""
from __future__ import annotations

import numpy as np

from specsample_cupy.convert.families import LlamaShape, layer_names


def _rms_norm(x, w, eps):
    return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def llama_logits(get, s: LlamaShape, input_ids, attention_mask=None, position_ids=None) -> np.ndarray:
    """Logits [B, S, V] (float64) of the whole sequence input_ids [B, S].

    get(name) returns a checkpoint tensor (any float dtype). attention_mask [B, S]: 0 marks a slot no
    token attends to; position_ids [B, S] default 0..S-1."""
    W = lambda name: np.asarray(get(name), np.float64)  # noqa: E731
    ids = np.asarray(input_ids, np.int64)
    B, S = ids.shape
    mask = np.ones((B, S), bool) if attention_mask is None else np.asarray(attention_mask) != 0
    pos = np.broadcast_to(np.arange(S), (B, S)) if position_ids is None else np.asarray(position_ids)
    H, KV, hd = s.heads, s.kv_heads, s.head_dim
    angles = pos[..., None] * np.asarray(s.inv_freq)[None, None, :]          # [B, S, hd/2]
    cos = np.concatenate([np.cos(angles)] * 2, -1)[:, None]                   # [B, 1, S, hd]
    sin = np.concatenate([np.sin(angles)] * 2, -1)[:, None]
    visible = mask[:, None, None, :] & np.tril(np.ones((S, S), bool))[None, None]
    x = W("model.embed_tokens.weight")[ids]
    for i in range(s.layers):
        n = layer_names(i)
        h = _rms_norm(x, W(n["input_norm"]), s.rms_eps)
        proj = {}
        for r, heads in zip("qkv", (H, KV, KV)):
            t = h @ W(n[r]).T + (W(n[r + "_bias"]) if s.qkv_bias else 0.0)
            proj[r] = t.reshape(B, S, heads, hd).transpose(0, 2, 1, 3)
        q = proj["q"] * cos + _rotate_half(proj["q"]) * sin
        k = proj["k"] * cos + _rotate_half(proj["k"]) * sin
        k, v = (np.repeat(t, H // KV, axis=1) for t in (k, proj["v"]))
        scores = np.where(visible, q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd), -np.inf)
        scores = np.where(visible.any(-1, keepdims=True), scores, 0.0)       # a query that sees nothing
        ctx = (_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(B, S, H * hd)
        x = x + ctx @ W(n["o"]).T + (W(n["o_bias"]) if s.o_bias else 0.0)
        h = _rms_norm(x, W(n["post_norm"]), s.rms_eps)
        gate, up = h @ W(n["gate"]).T, h @ W(n["up"]).T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ W(n["down"]).T
    x = _rms_norm(x, W("model.norm.weight"), s.rms_eps)
    return x @ W("model.embed_tokens.weight" if s.tied else "lm_head.weight").T
