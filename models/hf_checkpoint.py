"""Hugging Face-layout Llama-family checkpoints with random weights, written with NumPy (no torch, no
download): config.json, safetensors weights (one file or shards with model.safetensors.index.json),
tokenizer.json and generation_config.json. Tests and benchmarks build the models they convert here.

Shapes of real models (`REAL_SHAPES`) give real per-run costs; the tokenizer is the embedded pair's
byte-level BPE with filler tokens appended up to the vocabulary size (prompts encode to the same ids
as on the embedded pair; a filler token decodes to its name).

Self-drafting pairs: `write_checkpoint(..., zero_layers_from=k)` zeroes o_proj and down_proj of layers
k and up, so those layers add nothing to the residual stream and the model's logits equal those of its
first k layers: a draft that is exactly those k layers proposes what the target would pick.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

EMBEDDED_TOKENIZER = Path(__file__).resolve().parent / "stdlib-code" / "target" / "tokenizer.json"

_QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
          "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
          "use_sliding_window": False, "sliding_window": 32768, "bos_token_id": 151643, "eos_token_id": 151643}
_LLAMA3 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
           "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192},
           "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}

# Public configs' shapes (random weights): Qwen2.5 and Llama 3.x.
REAL_SHAPES = {
    "qwen2.5-0.5b": {**_QWEN2, "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
                     "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                     "tie_word_embeddings": True},
    "qwen2.5-1.5b": {**_QWEN2, "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
                     "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                     "tie_word_embeddings": True},
    "qwen2.5-7b": {**_QWEN2, "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
                   "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                   "tie_word_embeddings": False},
    "llama-3.2-1b": {**_LLAMA3, "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
                     "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "head_dim": 64, "tie_word_embeddings": True},
    "llama-3.1-8b": {**_LLAMA3, "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "tie_word_embeddings": False},
}

_POOL = 1 << 24   # random values generated once per checkpoint; tensors are slices of it at random offsets


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> shape of every tensor of a Llama/Qwen2/Mistral checkpoint."""
    D, F, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    H = config["num_attention_heads"]
    KV = config.get("num_key_value_heads", H)
    hd = config.get("head_dim") or D // H
    qwen = config["architectures"][0] == "Qwen2ForCausalLM"
    bias = qwen or config.get("attention_bias", False)
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (V, D)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
                       p + "self_attn.q_proj.weight": (H * hd, D), p + "self_attn.k_proj.weight": (KV * hd, D),
                       p + "self_attn.v_proj.weight": (KV * hd, D), p + "self_attn.o_proj.weight": (D, H * hd),
                       p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D),
                       p + "mlp.down_proj.weight": (D, F)})
        if bias:
            shapes.update({p + "self_attn.q_proj.bias": (H * hd,), p + "self_attn.k_proj.bias": (KV * hd,),
                           p + "self_attn.v_proj.bias": (KV * hd,)})
        if bias and not qwen:
            shapes[p + "self_attn.o_proj.bias"] = (D,)
    return shapes


def _np_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def random_tensors(config: dict, *, seed: int = 0, scale: float = 0.02, embed_scale: float = 1.0,
                   zero_layers_from: int | None = None, final_norm_scale: float = 1.0, dtype: str = "float32"):
    """(name, array) pairs: normal(0, scale) weights, norms 1 + small noise, embeddings normal(0, embed_scale)
    (tied: they are the LM head, so their scale sets how peaked the output is); the final norm's weight
    times final_norm_scale (applied after drawing: no other tensor changes). Tensors larger than the
    pool are slices of one random pool at random offsets (real bytes per run, quick to write)."""
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(_POOL, dtype=np.float32)
    target = _np_dtype(dtype)
    for name, shape in tensor_shapes(config).items():
        n = int(np.prod(shape))
        if name.endswith("norm.weight"):
            values = 1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)
            if name == "model.norm.weight":
                values = values * final_norm_scale
        else:
            std = embed_scale if name in ("model.embed_tokens.weight", "lm_head.weight") else scale
            if n <= _POOL // 4:
                values = rng.standard_normal(n, dtype=np.float32) * std
            else:
                start = int(rng.integers(0, _POOL))
                values = np.resize(np.roll(pool, -start), n) * std
            layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
            if zero_layers_from is not None and layer >= zero_layers_from and name.endswith(
                    ("o_proj.weight", "o_proj.bias", "down_proj.weight")):
                values = np.zeros(n, np.float32)
        yield name, values.reshape(shape).astype(target)


def tokenizer_json(vocab_size: int) -> str:
    """The embedded pair's tokenizer.json with filler tokens <|fill_i|> appended up to vocab_size ids."""
    spec = json.loads(EMBEDDED_TOKENIZER.read_text())
    vocab = spec["model"]["vocab"]
    used = set(vocab.values()) | {t["id"] for t in spec.get("added_tokens", [])}
    for i in range(vocab_size):
        if i not in used:
            vocab[f"<|fill_{i}|>"] = i
    return json.dumps(spec)


def write_checkpoint(folder, config: dict, *, dtype: str = "float16", shards: int = 1, seed: int = 0,
                     scale: float = 0.02, embed_scale: float = 1.0, zero_layers_from: int | None = None,
                     final_norm_scale: float = 1.0, tokenizer: bool = True) -> Path:
    """Write a random checkpoint of `config` (a Hugging Face config dict) into `folder`; dtype float16,
    bfloat16 or float32; shards > 1 splits the tensors over model-0000i-of-0000n.safetensors files."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {**config, "torch_dtype": dtype}
    tensors = list(random_tensors(config, seed=seed, scale=scale, embed_scale=embed_scale,
                                  zero_layers_from=zero_layers_from, final_norm_scale=final_norm_scale,
                                  dtype=dtype))
    if shards == 1:
        save_file(dict(tensors), str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for k in range(shards):
            name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = dict(tensors[k::shards])
            save_file(part, str(folder / name), metadata={"format": "pt"})
            weight_map.update({t: name for t in part})
        total = sum(a.nbytes for _, a in tensors)
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    eos = config.get("eos_token_id")
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": config.get("bos_token_id"),
                                                               "eos_token_id": eos}, indent=2))
    if tokenizer:
        (folder / "tokenizer.json").write_text(tokenizer_json(config["vocab_size"]))
    return folder
