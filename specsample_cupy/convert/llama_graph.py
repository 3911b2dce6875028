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

    h = RMSNorm(x)                        SkipSimplifiedLayerNormalization: the residual add, the norm
    q, k, v = split(h @ Wqkv (+ b))       one MatMul for the three projections
    q, k = rotary(q), rotary(k)           com.microsoft.RotaryEmbedding, tables [context, head_dim/2]
    a = Attention(q, k, v, past)          ONNX Attention (opset 23): grouped-query heads, present =
                                          concat(past, new), an additive mask from attention_mask
    x = x + a @ Wo,  h = RMSNorm(x)
    x = x + (silu(h @ Wgate) * (h @ Wup)) @ Wdown

Fused operators keep the number of kernels per layer low (about 14): at batch 1 a decoder run is a
chain of small kernels between the weight reads, and each kernel costs microseconds however little
it does.

attention="gqa" writes the layout of ONNX Runtime's own LLM builder instead: com.microsoft
GroupQueryAttention over one fixed-capacity past/present buffer that the run writes in place, rotary
inside the attention kernel, the packed q/k/v projection fed as it is:

inputs   input_ids              int64  [B, S]
         attention_mask         int64  [B, T]    its row sums are the rows' token counts (past + S):
                                                 a row's cache holds its tokens without holes
         total_sequence_length  int32  [1]       on the host; the buffer's capacity C
         past_key_values.{i}.key/.value  dtype [B, kv_heads, C, head_dim]
outputs  logits, present.{i}.key/.value (bound to the past's buffer: the new S columns land at each
         row's count)

ONNX Runtime runs S > 1 new tokens over a past only at batch 1 in that operator; S = 1 at any batch.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from specsample_cupy.convert.families import ATTENTION, LlamaShape, layer_names
from specsample_cupy.convert.graph import MS_DOMAIN, GraphBuilder, attention_allowed, onnx_type

OPSET = 23              # the ONNX Attention operator
MS_OPSET = 1
# Added to masked scores. Finite, so that a query that sees no key (a padding slot's) still gets finite
# values that cannot poison later layers; -30000 keeps score + bias finite in float16 (max 65504).
MASKED_BIAS = -30000.0
BATCH, SEQ, PAST, TOTAL = "batch_size", "sequence_length", "past_sequence_length", "past_sequence_length + sequence_length"


class _Weights:
    """Reads the checkpoint's tensors by role, in the graph's dtype, transposed to [in, out]."""

    def __init__(self, checkpoint, shape: LlamaShape, g: GraphBuilder):
        self.ckpt, self.s, self.g = checkpoint, shape, g

    def get(self, name, shape):
        return self.ckpt.get_float(name, shape, self.g.weight_dtype)


def _norm(g: GraphBuilder, x: str, weight: str, eps: float, skip: str | None = None) -> tuple[str, str]:
    """(RMSNorm(x + skip) * weight, x + skip): one kernel that also returns the residual sum."""
    if skip is None:
        return g.op("SimplifiedLayerNormalization", [x, weight], axis=-1, epsilon=float(eps)), x
    normed, total = g._name("normed"), g._name("residual")
    g.op("SkipSimplifiedLayerNormalization", [x, skip, weight], outputs=[normed, "", "", total],
         domain=MS_DOMAIN, epsilon=float(eps))
    return normed, total


def _onnx_attention(g, i, qkv, s: LlamaShape, bias, rotary, position_ids):
    """ONNX Attention: [B, S, H*hd] queries over concat(past, new) keys/values of KV heads (grouped-query),
    the additive mask [B, 1, S, T] holding padding, holes and causality; present = concat(past, new)."""
    H, KV, hd = s.heads, s.kv_heads, s.head_dim
    outs = [H * hd, KV * hd, KV * hd]
    q, k, v = (g._name(f"l{i}_{r}") for r in "qkv")
    g.op("Split", [qkv, g.const(np.array(outs, np.int64))], outputs=[q, k, v], axis=-1)
    q, k = (g.op("RotaryEmbedding", [t, position_ids, *rotary], domain=MS_DOMAIN, interleaved=0) for t in (q, k))
    return g.op("Attention", [q, k, v, bias, f"past_key_values.{i}.key", f"past_key_values.{i}.value"],
                outputs=[g._name(f"l{i}_attn"), f"present.{i}.key", f"present.{i}.value"],
                q_num_heads=H, kv_num_heads=KV)


def _gqa_attention(g, i, qkv, s: LlamaShape, seqlens, rotary, total):
    """GroupQueryAttention on the packed projection: rotary at each row's positions (count - S + j),
    the new keys/values written at the row's count in the shared buffer, attention over its first
    count + S slots."""
    return g.op("GroupQueryAttention", [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value",
                                        seqlens, total, *rotary],
                outputs=[g._name(f"l{i}_attn"), f"present.{i}.key", f"present.{i}.value"], domain=MS_DOMAIN,
                num_heads=s.heads, kv_num_heads=s.kv_heads, do_rotary=1, rotary_interleaved=0)


def _layer(g, w: _Weights, i, x, pending, s: LlamaShape, attend):
    """Layer i on the residual stream x plus `pending` (the last layer's MLP output, not yet added:
    the add happens inside this layer's first norm). attend(i, qkv) is the attention of the graph's
    layout. Returns (x, pending) for the next layer."""
    n = layer_names(i)
    H, KV, hd, D, F = s.heads, s.kv_heads, s.head_dim, s.hidden, s.intermediate
    weight = lambda key, shape: g.weight(w.get(n[key], shape), n[key])  # noqa: E731
    h, x = _norm(g, x, weight("input_norm", (D,)), s.rms_eps, pending)
    outs = [H * hd, KV * hd, KV * hd]
    wqkv = np.concatenate([w.get(n[r], (o, D)).T for r, o in zip("qkv", outs)], axis=1)
    qkv = g.op("MatMul", [h, g.weight(wqkv, f"layers.{i}.qkv")])
    if s.qkv_bias:
        qkv_bias = np.concatenate([w.get(n[r + "_bias"], (o,)) for r, o in zip("qkv", outs)])
        qkv = g.op("Add", [qkv, g.weight(qkv_bias, f"layers.{i}.qkv_bias")])
    attn = g.op("MatMul", [attend(i, qkv), g.weight(w.get(n["o"], (D, H * hd)).T, f"layers.{i}.o")])
    if s.o_bias:
        attn = g.op("Add", [attn, g.weight(w.get(n["o_bias"], (D,)), f"layers.{i}.o_bias")])
    h, x = _norm(g, x, weight("post_norm", (D,)), s.rms_eps, attn)
    gate = g.op("MatMul", [h, g.weight(w.get(n["gate"], (F, D)).T, f"layers.{i}.gate")])
    up = g.op("MatMul", [h, g.weight(w.get(n["up"], (F, D)).T, f"layers.{i}.up")])
    act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
    return x, g.op("MatMul", [act, g.weight(w.get(n["down"], (D, F)).T, f"layers.{i}.down")])


def _io(s: LlamaShape, dt, attention: str):
    """The graph's inputs and outputs (see the module docstring)."""
    info = helper.make_tensor_value_info
    if attention == "gqa":
        inputs = [info("input_ids", TensorProto.INT64, [BATCH, SEQ]),
                  info("attention_mask", TensorProto.INT64, [BATCH, "total_sequence_length"]),
                  info("total_sequence_length", TensorProto.INT32, [1])]
        past = present = [BATCH, s.kv_heads, "capacity", s.head_dim]
    else:
        inputs = [info("input_ids", TensorProto.INT64, [BATCH, SEQ]),
                  info("attention_mask", TensorProto.INT64, [BATCH, TOTAL]),
                  info("position_ids", TensorProto.INT64, [BATCH, SEQ])]
        past, present = [BATCH, s.kv_heads, PAST, s.head_dim], [BATCH, s.kv_heads, TOTAL, s.head_dim]
    outputs = [info("logits", dt, [BATCH, SEQ, s.vocab_size])]
    for i in range(s.layers):
        for kind in ("key", "value"):
            inputs.append(info(f"past_key_values.{i}.{kind}", dt, past))
            outputs.append(info(f"present.{i}.{kind}", dt, present))
    return inputs, outputs


def build_graph(checkpoint, s: LlamaShape, g: GraphBuilder, attention: str = "onnx") -> onnx.ModelProto:
    """The decoder (see the module docstring) with the checkpoint's weights, written through g.
    attention: "onnx" (the masked cache, any batch) or "gqa" (GroupQueryAttention, shared buffer)."""
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    w = _Weights(checkpoint, s, g)
    inputs, outputs = _io(s, onnx_type(g.compute_dtype), attention)
    embed = g.weight(w.get("model.embed_tokens.weight", (s.vocab_size, s.hidden)), "embed_tokens")
    x = g.op("Gather", [embed, "input_ids"], axis=0, hint="embed")
    cos, sin = checkpoint.rotary_tables(s, g.compute_dtype)
    rotary = (g.const(cos, "rotary_cos"), g.const(sin, "rotary_sin"))
    if attention == "gqa":
        counts = g.op("ReduceSum", ["attention_mask", g.const(np.array([1], np.int64))], keepdims=0)
        seqlens = g.op("Cast", [g.op("Sub", [counts, g.const(np.array(1, np.int64))])], to=TensorProto.INT32,
                       hint="seqlens_k")                                        # [B]: count - 1
        attend = lambda i, qkv: _gqa_attention(g, i, qkv, s, seqlens, rotary, "total_sequence_length")  # noqa: E731
    else:
        allowed = attention_allowed(g, "input_ids", "attention_mask")             # [B, 1, S, T]
        bias = g.op("Where", [allowed, g.scalar(0.0), g.scalar(MASKED_BIAS)], hint="attn_bias")
        attend = lambda i, qkv: _onnx_attention(g, i, qkv, s, bias, rotary, "position_ids")  # noqa: E731
    pending = None
    for i in range(s.layers):
        x, pending = _layer(g, w, i, x, pending, s, attend)
    x, _ = _norm(g, x, g.weight(w.get("model.norm.weight", (s.hidden,)), "norm"), s.rms_eps, pending)
    head = embed if s.tied else g.weight(w.get("lm_head.weight", (s.vocab_size, s.hidden)), "lm_head")
    g.op("FusedMatMul", [x, head], outputs=["logits"], domain=MS_DOMAIN, transB=1)    # x @ head^T
    graph = helper.make_graph(g.nodes, "llama_decoder_with_past", inputs, outputs, initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid(MS_DOMAIN, MS_OPSET)],
                              producer_name="specsample-cupy.convert")
    model.ir_version = 10
    return model
