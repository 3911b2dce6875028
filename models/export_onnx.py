"""Torch-free ONNX export of a GPT-2-style decoder from numpy weights.

The graph has the same inputs/outputs as Hugging Face optimum's
``text-generation-with-past`` export, so any runtime written against such
models can load it:

inputs   input_ids            int64   [batch_size, sequence_length]
         attention_mask       int64   [batch_size, past_sequence_length + sequence_length]
         position_ids         int64   [batch_size, sequence_length]
         past_key_values.{i}.key/.value  float32 [batch_size, n_head, past_sequence_length, head_dim]
outputs  logits               float32 [batch_size, sequence_length, vocab_size]
         present.{i}.key/.value          float32 [batch_size, n_head, past_sequence_length + sequence_length, head_dim]

Weights are stored in ``weight_dtype`` (float16 by default, halving the file)
and cast to float32 inside the graph, so all arithmetic and all I/O is fp32.
ONNX Runtime constant-folds those casts when the session is created.
"""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from specsample_cupy.convert.graph import GraphBuilder as _Graph
from specsample_cupy.convert.graph import attention_allowed as _attention_allowed

OPSET = 17

BATCH = "batch_size"
SEQ = "sequence_length"
PAST = "past_sequence_length"
TOTAL = "past_sequence_length + sequence_length"

# Masked attention scores are *replaced* (not offset) by this value: masked
# keys then get exactly zero weight, and a query whose keys are all masked
# (a left-padding slot) gets a uniform softmax instead of NaN.
MASKED_SCORE = float(np.finfo(np.float32).min)

_WEIGHT_DTYPES = {"float16": np.float16, "float32": np.float32}

CONFIG_DEFAULTS = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
    "n_inner": None,
    "tie_word_embeddings": True,
    "use_cache": True,
}


def expected_weight_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight the exporter needs (GPT-2 Conv1D layout)."""
    V, P, D = config["vocab_size"], config["n_positions"], config["n_embd"]
    shapes = {"wte": (V, D), "wpe": (P, D), "ln_f.weight": (D,), "ln_f.bias": (D,)}
    for i in range(config["n_layer"]):
        p = f"h.{i}."
        shapes.update({
            p + "ln_1.weight": (D,), p + "ln_1.bias": (D,),
            p + "attn.c_attn.weight": (D, 3 * D), p + "attn.c_attn.bias": (3 * D,),
            p + "attn.c_proj.weight": (D, D), p + "attn.c_proj.bias": (D,),
            p + "ln_2.weight": (D,), p + "ln_2.bias": (D,),
            p + "mlp.c_fc.weight": (D, 4 * D), p + "mlp.c_fc.bias": (4 * D,),
            p + "mlp.c_proj.weight": (4 * D, D), p + "mlp.c_proj.bias": (D,),
        })
    return shapes


def full_config(config: dict) -> dict:
    """The config with GPT-2 defaults filled in and consistency checked."""
    cfg = {**CONFIG_DEFAULTS, **config}
    for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head",
                "bos_token_id", "eos_token_id"):
        if key not in cfg:
            raise ValueError(f"config lacks {key!r}")
    if cfg["n_embd"] % cfg["n_head"]:
        raise ValueError("n_embd must be divisible by n_head")
    cfg.setdefault("n_ctx", cfg["n_positions"])
    return cfg


def _layer_norm(g, x, w, b, eps):
    return g.op("LayerNormalization", [x, w, b], axis=-1, epsilon=float(eps))


def _gelu_tanh(g, x):
    # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))  -- GPT-2's gelu_new
    x3 = g.op("Mul", [g.op("Mul", [x, x]), x])
    inner = g.op("Add", [x, g.op("Mul", [x3, g.const(np.float32(0.044715))])])
    t = g.op("Tanh", [g.op("Mul", [inner, g.const(np.float32(np.sqrt(2.0 / np.pi)))])])
    half_x = g.op("Mul", [x, g.const(np.float32(0.5))])
    return g.op("Mul", [half_x, g.op("Add", [t, g.const(np.float32(1.0))])])


def _block(g, i, x, weights, cfg, allowed):
    D, H = cfg["n_embd"], cfg["n_head"]
    hd = D // H
    eps = cfg["layer_norm_epsilon"]
    p = f"h.{i}."
    W = lambda n: g.weight(weights[p + n], p + n)  # noqa: E731

    h = _layer_norm(g, x, W("ln_1.weight"), W("ln_1.bias"), eps)
    qkv = g.linear(h, W("attn.c_attn.weight"), W("attn.c_attn.bias"))         # [B,S,3D]
    q, k, v = (g._name(f"{p}{n}") for n in "qkv")
    g.op("Split", [qkv, g.const(np.array([D, D, D], np.int64))], outputs=[q, k, v], axis=-1)
    heads_shape = g.const(np.array([0, 0, H, hd], np.int64))

    def to_heads(t):  # [B,S,D] -> [B,H,S,hd]
        return g.op("Transpose", [g.op("Reshape", [t, heads_shape])], perm=[0, 2, 1, 3])

    k_all = g.op("Concat", [f"past_key_values.{i}.key", to_heads(k)],
                 outputs=[f"present.{i}.key"], axis=2)
    v_all = g.op("Concat", [f"past_key_values.{i}.value", to_heads(v)],
                 outputs=[f"present.{i}.value"], axis=2)
    k_t = g.op("Transpose", [k_all], perm=[0, 1, 3, 2])
    scores = g.op("Mul", [g.op("MatMul", [to_heads(q), k_t]),
                          g.const(np.float32(1.0 / np.sqrt(hd)))])              # [B,H,S,T]
    scores = g.op("Where", [allowed, scores, g.const(np.float32(MASKED_SCORE))])
    probs = g.op("Softmax", [scores], axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [probs, v_all])], perm=[0, 2, 1, 3])  # [B,S,H,hd]
    ctx = g.op("Reshape", [ctx, g.const(np.array([0, 0, D], np.int64))])
    x = g.op("Add", [x, g.linear(ctx, W("attn.c_proj.weight"), W("attn.c_proj.bias"))])

    h = _layer_norm(g, x, W("ln_2.weight"), W("ln_2.bias"), eps)
    h = _gelu_tanh(g, g.linear(h, W("mlp.c_fc.weight"), W("mlp.c_fc.bias")))
    return g.op("Add", [x, g.linear(h, W("mlp.c_proj.weight"), W("mlp.c_proj.bias"))],
                hint=f"h{i}_out")


def build_model(weights: dict[str, np.ndarray], config: dict, *,
                weight_dtype: str = "float16") -> onnx.ModelProto:
    """The decoder as an in-memory ONNX model (see module docstring for I/O)."""
    if weight_dtype not in _WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype must be one of {sorted(_WEIGHT_DTYPES)}")
    cfg = full_config(config)
    for name, shape in expected_weight_shapes(cfg).items():
        if name not in weights:
            raise KeyError(f"missing weight {name!r}")
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"{name}: shape {weights[name].shape}, expected {shape}")

    g = _Graph(_WEIGHT_DTYPES[weight_dtype])
    H, hd = cfg["n_head"], cfg["n_embd"] // cfg["n_head"]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [BATCH, SEQ]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [BATCH, TOTAL]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [BATCH, SEQ]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                             [BATCH, SEQ, cfg["vocab_size"]])]
    for i in range(cfg["n_layer"]):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(
                f"past_key_values.{i}.{kind}", TensorProto.FLOAT, [BATCH, H, PAST, hd]))
            outputs.append(helper.make_tensor_value_info(
                f"present.{i}.{kind}", TensorProto.FLOAT, [BATCH, H, TOTAL, hd]))

    wte = g.weight(weights["wte"], "wte")
    wpe = g.weight(weights["wpe"], "wpe")
    x = g.op("Add", [g.op("Gather", [wte, "input_ids"], axis=0),
                     g.op("Gather", [wpe, "position_ids"], axis=0)], hint="embed")
    allowed = _attention_allowed(g, "input_ids", "attention_mask")
    for i in range(cfg["n_layer"]):
        x = _block(g, i, x, weights, cfg, allowed)
    x = _layer_norm(g, x, g.weight(weights["ln_f.weight"], "ln_f.weight"),
                    g.weight(weights["ln_f.bias"], "ln_f.bias"), cfg["layer_norm_epsilon"])
    # LM head tied to the token embedding: logits = x @ wte^T.
    g.op("MatMul", [x, g.op("Transpose", [wte], perm=[1, 0])], outputs=["logits"])

    graph = helper.make_graph(g.nodes, "gpt2_decoder_with_past", inputs, outputs,
                              initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="specsample-cupy.models.export_onnx")
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    onnx.checker.check_model(model)
    return model


def generation_config(config: dict) -> dict:
    return {"bos_token_id": int(config["bos_token_id"]),
            "eos_token_id": int(config["eos_token_id"]),
            "max_length": int(config["n_positions"])}


def export_decoder(weights: dict[str, np.ndarray], config: dict, out_dir: str, *,
                   weight_dtype: str = "float16") -> str:
    """Write out_dir/{model.onnx, config.json, generation_config.json}.

    Returns the path of model.onnx. The tokenizer is written by the caller.
    """
    model = build_model(weights, config, weight_dtype=weight_dtype)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.onnx")
    onnx.save_model(model, path)
    cfg = full_config(config)
    cfg["torch_dtype"] = weight_dtype
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(generation_config(cfg), f, indent=2, sort_keys=True)
        f.write("\n")
    return path


def random_weights(config: dict, seed: int = 0, *, scale: float = 0.02,
                   embed_scale: float | None = None) -> dict[str, np.ndarray]:
    """GPT-2-shaped random weights (normal(0, scale); LayerNorm gamma 1, beta 0).

    ``embed_scale`` sets the std of ``wte`` separately: since the LM head is
    tied to it, it controls how peaked the output distribution is.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_weight_shapes(full_config(config)).items():
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            out[name] = np.ones(shape, np.float32)
        elif name.endswith(("ln_1.bias", "ln_2.bias", "ln_f.bias")):
            out[name] = np.zeros(shape, np.float32)
        else:
            std = embed_scale if (name == "wte" and embed_scale is not None) else scale
            out[name] = (rng.standard_normal(shape) * std).astype(np.float32)
    return out


def read_weights(model_path: str, config: dict) -> dict[str, np.ndarray]:
    """The named weights of a model.onnx written by export_decoder, as float32 arrays."""
    model = onnx.load(model_path)
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    wanted = expected_weight_shapes(full_config(config))
    missing = sorted(set(wanted) - set(stored))
    if missing:
        raise ValueError(f"{model_path} lacks the weights {missing[:3]}")
    return {name: stored[name].astype(np.float32) for name in wanted}


def reexport(model_dir: str) -> str:
    """Rebuild model_dir/model.onnx with this module's graph, keeping its weights and config."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    path = os.path.join(model_dir, "model.onnx")
    weights = read_weights(path, config)
    return export_decoder(weights, config, model_dir, weight_dtype=config.get("torch_dtype", "float16"))


if __name__ == "__main__":
    import sys
    for model_dir in sys.argv[1:] or [os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "stdlib-code", r) for r in ("target", "draft")]:
        print("re-exported", reexport(model_dir))
