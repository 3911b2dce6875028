"""A Llama-family decoder (Llama 2/3, Qwen2, Mistral) as an ONNX graph in the project's decoder format.

Inputs and outputs are those of models/export_onnx.py (optimum's text-generation-with-past names), with
grouped-query attention's KV heads in the cache:

inputs   input_ids          int64  [B, S]
         attention_mask     int64  [B, past + S]    0: a slot no token sees (padding, a hole)
         position_ids       int64  [B, S]
         past_key_values.{i}.key/.value  dtype [B, kv_heads, past, head_dim]
outputs  logits             dtype  [B, S, vocab]
         present.{i}.key/.value          dtype [B, kv_heads, past + S, head_dim]

dtype is the compute dtype: float16 for CUDA (weights used as stored, as the checkpoint's own fp16
inference does), float32 for the CPU. The cache is concat(past, new) with masked slots, so it works
with the fixed-capacity binding of sessions_static and can be captured as a CUDA graph: the graph has
no shape arithmetic (graph.attention_allowed). Per layer, as Hugging Face computes it:

    h = RMSNorm(x)                        in float32, rounded to dtype before the weight (as HF)
    q, k, v = split(h @ Wqkv (+ b))       one MatMul for the three projections
    q, k = rotary(q), rotary(k)           com.microsoft.RotaryEmbedding, tables [context, head_dim/2]
    attention over concat(past, k/v)      queries of one KV head stacked: [B, kv, G*S, hd] @ [B, kv, hd, T]
    x = x + o_proj(attention)
    x = x + down(silu(h @ Wgate) * (h @ Wup)),  h = RMSNorm(x)

ONNX Runtime fuses these primitives when it creates the session (RMSNorm into
SimplifiedLayerNormalization and the residual Add into it, x * sigmoid(x) into one kernel, the
transposed, scaled score MatMul into one).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from specsample_cupy.convert.families import LlamaShape, layer_names
from specsample_cupy.convert.graph import MS_DOMAIN, GraphBuilder, attention_allowed, onnx_type

OPSET = 17
MS_OPSET = 1
BATCH, SEQ, PAST, TOTAL = "batch_size", "sequence_length", "past_sequence_length", "past_sequence_length + sequence_length"


class _Weights:
    """Reads the checkpoint's tensors by role, in the graph's dtype, transposed to [in, out]."""

    def __init__(self, checkpoint, shape: LlamaShape, g: GraphBuilder):
        self.ckpt, self.s, self.g = checkpoint, shape, g

    def get(self, name, shape):
        return self.ckpt.get_float(name, shape, self.g.weight_dtype)


def _rms_norm(g: GraphBuilder, x: str, weight: str, eps: float) -> str:
    """weight * dtype(x32 / sqrt(mean(x32^2) + eps)), x32 = float32(x): Hugging Face's order."""
    f32 = g.compute_dtype == np.float32
    x32 = x if f32 else g.op("Cast", [x], to=TensorProto.FLOAT)
    var = g.op("ReduceMean", [g.op("Pow", [x32, g.const(np.float32(2.0))])], axes=[-1], keepdims=1)
    normed = g.op("Div", [x32, g.op("Sqrt", [g.op("Add", [var, g.const(np.float32(eps))])])])
    if not f32:
        normed = g.op("Cast", [normed], to=onnx_type(g.compute_dtype))
    return g.op("Mul", [normed, weight])


def _heads(g, t, n, hd):   # [B, S, n*hd] -> [B, n, S, hd]
    return g.op("Transpose", [g.op("Reshape", [t, g.const(np.array([0, 0, n, hd], np.int64))])], perm=[0, 2, 1, 3])


def _attention(g, i, q, k, v, s: LlamaShape, allowed):
    H, KV, hd = s.heads, s.kv_heads, s.head_dim
    k_all = g.op("Concat", [f"past_key_values.{i}.key", _heads(g, k, KV, hd)], outputs=[f"present.{i}.key"], axis=2)
    v_all = g.op("Concat", [f"past_key_values.{i}.value", _heads(g, v, KV, hd)], outputs=[f"present.{i}.value"],
                 axis=2)
    # Query heads h = kv * G + j share KV head kv: [B, H, S, hd] viewed as [B, KV, G*S, hd], so one
    # batched MatMul per KV head serves its G query heads without repeating the cache.
    q4 = g.op("Reshape", [_heads(g, q, H, hd), g.const(np.array([0, KV, -1, hd], np.int64))])
    scores = g.op("Mul", [g.op("MatMul", [q4, g.op("Transpose", [k_all], perm=[0, 1, 3, 2])]),
                          g.scalar(1.0 / np.sqrt(hd))])                               # [B, KV, G*S, T]
    # Masked per query head, [B, H, S, T] against allowed [B, 1, S, T] (views, no copies).
    scores = g.op("Reshape", [scores, g.const(np.array([0, H, -1, 0], np.int64))])
    scores = g.op("Where", [allowed, scores, g.scalar(np.finfo(g.compute_dtype).min)])
    probs = g.op("Reshape", [g.op("Softmax", [scores], axis=-1), g.const(np.array([0, KV, -1, 0], np.int64))])
    ctx = g.op("MatMul", [probs, v_all])                                              # [B, KV, G*S, hd]
    ctx = g.op("Reshape", [ctx, g.const(np.array([0, H, -1, hd], np.int64))])         # [B, H, S, hd]
    return g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]),
                            g.const(np.array([0, 0, H * hd], np.int64))])


def _layer(g, w: _Weights, i, x, s: LlamaShape, allowed, rotary):
    n = layer_names(i)
    H, KV, hd, D = s.heads, s.kv_heads, s.head_dim, s.hidden
    norm = lambda t, key: _rms_norm(g, t, g.weight(w.get(n[key], (D,)), n[key]), s.rms_eps)  # noqa: E731
    h = norm(x, "input_norm")
    outs = [H * hd, KV * hd, KV * hd]
    wqkv = np.concatenate([w.get(n[r], (o, D)).T for r, o in zip("qkv", outs)], axis=1)
    qkv = g.op("MatMul", [h, g.weight(wqkv, f"layers.{i}.qkv")])
    if s.qkv_bias:
        bias = np.concatenate([w.get(n[r + "_bias"], (o,)) for r, o in zip("qkv", outs)])
        qkv = g.op("Add", [qkv, g.weight(bias, f"layers.{i}.qkv_bias")])
    q, k, v = (g._name(f"l{i}_{r}") for r in "qkv")
    g.op("Split", [qkv, g.const(np.array(outs, np.int64))], outputs=[q, k, v], axis=-1)
    q, k = (g.op("RotaryEmbedding", [t, "position_ids", *rotary], domain=MS_DOMAIN, interleaved=0) for t in (q, k))
    attn = g.op("MatMul", [_attention(g, i, q, k, v, s, allowed), g.weight(w.get(n["o"], (D, H * hd)).T,
                                                                         f"layers.{i}.o")])
    if s.o_bias:
        attn = g.op("Add", [attn, g.weight(w.get(n["o_bias"], (D,)), f"layers.{i}.o_bias")])
    x = g.op("Add", [x, attn])
    h = norm(x, "post_norm")
    F = s.intermediate
    gate = g.op("MatMul", [h, g.weight(w.get(n["gate"], (F, D)).T, f"layers.{i}.gate")])
    up = g.op("MatMul", [h, g.weight(w.get(n["up"], (F, D)).T, f"layers.{i}.up")])
    act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
    down = g.op("MatMul", [act, g.weight(w.get(n["down"], (D, F)).T, f"layers.{i}.down")])
    return g.op("Add", [x, down], hint=f"layer{i}_out")


def build_graph(checkpoint, s: LlamaShape, g: GraphBuilder) -> onnx.ModelProto:
    """The decoder (see the module docstring) with the checkpoint's weights, written through g."""
    w = _Weights(checkpoint, s, g)
    dt = onnx_type(g.compute_dtype)
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [BATCH, SEQ]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [BATCH, TOTAL]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, [BATCH, SEQ])]
    outputs = [helper.make_tensor_value_info("logits", dt, [BATCH, SEQ, s.vocab_size])]
    for i in range(s.layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", dt,
                                                        [BATCH, s.kv_heads, PAST, s.head_dim]))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", dt,
                                                         [BATCH, s.kv_heads, TOTAL, s.head_dim]))
    embed = g.weight(w.get("model.embed_tokens.weight", (s.vocab_size, s.hidden)), "embed_tokens")
    x = g.op("Gather", [embed, "input_ids"], axis=0, hint="embed")
    allowed = attention_allowed(g, "input_ids", "attention_mask")             # [B, 1, S, T]
    cos, sin = s.rotary_tables(g.compute_dtype)
    rotary = (g.const(cos, "rotary_cos"), g.const(sin, "rotary_sin"))
    for i in range(s.layers):
        x = _layer(g, w, i, x, s, allowed, rotary)
    x = _rms_norm(g, x, g.weight(w.get("model.norm.weight", (s.hidden,)), "norm"), s.rms_eps)
    head = embed if s.tied else g.weight(w.get("lm_head.weight", (s.vocab_size, s.hidden)), "lm_head")
    g.op("FusedMatMul", [x, head], outputs=["logits"], domain=MS_DOMAIN, transB=1)    # x @ head^T
    graph = helper.make_graph(g.nodes, "llama_decoder_with_past", inputs, outputs, initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid(MS_DOMAIN, MS_OPSET)],
                              producer_name="specsample-cupy.convert")
    model.ir_version = 8
    return model
