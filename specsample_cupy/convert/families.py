"""What the converter knows of each Hugging Face architecture: one shared description of a Llama-family
decoder (RMSNorm, rotary, grouped-query attention, SwiGLU) and a few lines per family stating how it
differs. Anything else is refused in one line that names it.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np

from specsample_cupy.convert.checkpoint import ConversionError

# Attention layouts of the converted graph (llama_graph.py): the masked cache, or GroupQueryAttention
# over a shared buffer.
ATTENTION = ("onnx", "gqa")

# Config keys that change the maths when set; the converter implements none of them.
_UNSUPPORTED_WHEN_SET = ("mlp_bias", "qk_layernorm", "use_qk_norm", "attn_logit_softcapping",
                         "final_logit_softcapping", "logits_scaling", "embedding_multiplier",
                         "residual_multiplier", "attention_multiplier")


@dataclass(frozen=True)
class LlamaShape:
    """A Llama-family decoder's hyperparameters, read and checked from config.json."""
    architecture: str
    vocab_size: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float
    context: int            # positions the converted model takes (capped by a sliding window)
    qkv_bias: bool
    o_bias: bool
    tied: bool
    inv_freq: tuple          # rotary inverse frequencies, float64, head_dim / 2 of them

    def rotary_tables(self, dtype) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [context, head_dim / 2] in `dtype`: cos(p * inv_freq), computed in float64."""
        angles = np.arange(self.context, dtype=np.float64)[:, None] * np.asarray(self.inv_freq)[None, :]
        return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def _int(config: dict, key: str, default=None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConversionError(f"config.json: {key} must be a positive integer, got {value!r}")
    return value


def _inv_freq(config: dict, head_dim: int) -> np.ndarray:
    """Rotary inverse frequencies as Hugging Face computes them, with rope_scaling applied."""
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConversionError(f"config.json: partial_rotary_factor {config['partial_rotary_factor']} "
                              "is not supported")
    theta = float(config.get("rope_theta", 10000.0))
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = config.get("rope_scaling")
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_context = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_context / high) & ~(wavelen > old_context / low)
        return np.where(medium, smoothed, scaled)
    raise ConversionError(f"config.json: rope_scaling type {kind!r} is not supported "
                          "(supported: default, linear, llama3)")


def _context(config: dict, architecture: str) -> int:
    """max_position_embeddings, capped by a sliding window: within the window, windowed attention
    and full attention are the same, so the converted model is exact for contexts up to it."""
    context = _int(config, "max_position_embeddings")
    window = config.get("sliding_window")
    uses_window = bool(config.get("use_sliding_window", architecture == "MistralForCausalLM"))
    if uses_window and window and window < context:
        print(f"note: {architecture} uses sliding-window attention ({window} positions); the converted "
              f"model takes contexts up to {window} tokens", file=sys.stderr)
        return int(window)
    return context


def llama_shape(config: dict) -> LlamaShape:
    """The checked shape of a Llama, Qwen2 or Mistral config; ConversionError for anything else."""
    architecture = (config.get("architectures") or [None])[0]
    family = FAMILIES.get(architecture)
    if family is None:
        known = ", ".join(sorted(FAMILIES) + ["GPT2LMHeadModel"])
        raise ConversionError(f"config.json: architecture {architecture!r} is not supported (supported: {known})")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ConversionError(f"config.json: hidden_act {act!r} is not supported (Llama-family models use silu)")
    for key in _UNSUPPORTED_WHEN_SET:
        if config.get(key):
            raise ConversionError(f"config.json: {key}={config[key]!r} is not supported")
    hidden, heads = _int(config, "hidden_size"), _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    head_dim = _int(config, "head_dim") if config.get("head_dim") is not None else hidden // heads
    if heads % kv_heads:
        raise ConversionError(f"config.json: num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv_heads}")
    if head_dim % 2:
        raise ConversionError(f"config.json: head size {head_dim} is odd; rotary embeddings need it even")
    qkv_bias, o_bias = family(config)
    return LlamaShape(
        architecture=architecture, vocab_size=_int(config, "vocab_size"), hidden=hidden,
        intermediate=_int(config, "intermediate_size"), layers=_int(config, "num_hidden_layers"),
        heads=heads, kv_heads=kv_heads, head_dim=head_dim, rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        context=_context(config, architecture), qkv_bias=qkv_bias, o_bias=o_bias,
        tied=bool(config.get("tie_word_embeddings", False)), inv_freq=tuple(_inv_freq(config, head_dim)))


def _llama(config):       # attention_bias: biases on q, k, v and o
    bias = bool(config.get("attention_bias", False))
    return bias, bias


def _qwen2(config):       # q, k, v always carry biases; o never
    return True, False


def _mistral(config):
    return False, False


# architecture -> (config) -> (q/k/v biases, o bias)
FAMILIES = {"LlamaForCausalLM": _llama, "Qwen2ForCausalLM": _qwen2, "MistralForCausalLM": _mistral}


def layer_names(i: int) -> dict[str, str]:
    """Hugging Face tensor names of layer i, by role."""
    p = f"model.layers.{i}."
    names = {"input_norm": p + "input_layernorm.weight", "post_norm": p + "post_attention_layernorm.weight"}
    for n in "qkvo":
        names[n] = p + f"self_attn.{n}_proj.weight"
        names[n + "_bias"] = p + f"self_attn.{n}_proj.bias"
    for n in ("gate", "up", "down"):
        names[n] = p + f"mlp.{n}_proj.weight"
    return names
