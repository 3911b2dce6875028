"""Plain numpy forward pass of the GPT-2-style decoder, no cache.

It is the ground truth the ONNX export is tested against; it follows the
same maths (pre-LN blocks, tanh GELU, tied LM head) written independently of
the graph builder.
"""
from __future__ import annotations

import numpy as np


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def reference_logits(weights: dict[str, np.ndarray], config: dict, input_ids,
                     attention_mask=None, position_ids=None, *,
                     weight_dtype: str | None = "float16") -> np.ndarray:
    """Logits [batch, seq, vocab] for a full (cache-free) pass, in float64.

    ``weight_dtype`` rounds the weights the way the export stores them, so a
    float16 export is compared against the same rounded weights.
    """
    ids = np.asarray(input_ids, np.int64)
    B, S = ids.shape
    mask = np.ones((B, S), np.int64) if attention_mask is None else np.asarray(attention_mask)
    pos = np.broadcast_to(np.arange(S), (B, S)) if position_ids is None else np.asarray(position_ids)
    W = {k: (v.astype(weight_dtype) if weight_dtype else v).astype(np.float64)
         for k, v in weights.items()}
    D, H = config["n_embd"], config["n_head"]
    hd = D // H
    eps = config.get("layer_norm_epsilon", 1e-5)

    allowed = (mask[:, None, None, :] != 0) & np.tril(np.ones((S, S), bool))[None, None]
    x = W["wte"][ids] + W["wpe"][pos]
    for i in range(config["n_layer"]):
        p = f"h.{i}."
        h = _layer_norm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = h @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]
        q, k, v = (t.reshape(B, S, H, hd).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, -1))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
        scores = np.where(allowed, scores, np.finfo(np.float64).min)
        ctx = (_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(B, S, D)
        x = x + ctx @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        h = _layer_norm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        h = _gelu_tanh(h @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
        x = x + h @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    x = _layer_norm(x, W["ln_f.weight"], W["ln_f.bias"], eps)
    return x @ W["wte"].T
