"""Random-weight Whisper-style encoder-decoder pair in optimum's ONNX layout, for tests.

No torch: the graphs are written with onnx.helper (reusing the small graph
helper of models/export_onnx.py). Each model folder looks like an
``optimum-cli export onnx --task automatic-speech-recognition-with-past`` export:

encoder_model.onnx         input_features [B, n_mels, 3000] -> last_hidden_state [B, 1500, d]
decoder_model_merged.onnx  input_ids, encoder_hidden_states,
                           past_key_values.{i}.decoder/encoder.key/value, use_cache_branch
                           -> logits, present.{i}.decoder/encoder.key/value
config.json, generation_config.json, preprocessor_config.json, tokenizer.json

Like optimum's merged decoder, the graph is an ``If`` on use_cache_branch: the
no-cache branch ignores the past inputs and computes cross-attention K/V from
encoder_hidden_states; the cache branch reads them from the past inputs and
returns empty [0, H, 1, hd] placeholders as present.{i}.encoder.*.

The draft is a shallower copy of the target (shared embeddings and encoder,
first decoder layers) with noise mixed in, so draft and target agree often but
not always; the logit scale is sharpened so distributions are not flat.

    python -m models.build_tiny_whisper out/tiny_whisper
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np
import onnx
from onnx import TensorProto, helper

from .export_onnx import OPSET, _Graph, _layer_norm

N_FRAMES = 3000
ENC_LEN = N_FRAMES // 2
MAX_TARGET_POSITIONS = 64
SPECIAL_TOKENS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>",
                  "<|translate|>", "<|transcribe|>", "<|nospeech|>", "<|notimestamps|>"]
_CHARS = " etaoinshrdlucmfwypvbgkjqxz'.,?!0123456789-"


# --------------------------------------------------------------------------- weights

def _weight_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    D, V, M = cfg["d_model"], cfg["vocab_size"], cfg["num_mel_bins"]
    F = cfg["encoder_ffn_dim"]
    shapes = {"encoder.conv1.weight": (D, M, 3), "encoder.conv1.bias": (D,),
              "encoder.conv2.weight": (D, D, 3), "encoder.conv2.bias": (D,),
              "encoder.layer_norm.weight": (D,), "encoder.layer_norm.bias": (D,),
              "decoder.embed_tokens": (V, D), "decoder.embed_positions": (MAX_TARGET_POSITIONS, D),
              "decoder.layer_norm.weight": (D,), "decoder.layer_norm.bias": (D,)}

    def attn(p):
        for n in ("q", "k", "v", "out"):
            shapes[f"{p}.{n}_proj.weight"] = (D, D)
            if n != "k":                       # Whisper's k_proj has no bias
                shapes[f"{p}.{n}_proj.bias"] = (D,)
        shapes[f"{p}_layer_norm.weight"] = shapes[f"{p}_layer_norm.bias"] = (D,)

    def mlp(p):
        shapes.update({f"{p}.fc1.weight": (D, F), f"{p}.fc1.bias": (F,),
                       f"{p}.fc2.weight": (F, D), f"{p}.fc2.bias": (D,),
                       f"{p}.final_layer_norm.weight": (D,), f"{p}.final_layer_norm.bias": (D,)})

    for i in range(cfg["encoder_layers"]):
        attn(f"encoder.layers.{i}.self_attn")
        mlp(f"encoder.layers.{i}")
    for i in range(cfg["decoder_layers"]):
        attn(f"decoder.layers.{i}.self_attn")
        attn(f"decoder.layers.{i}.encoder_attn")
        mlp(f"decoder.layers.{i}")
    return shapes


def random_whisper_weights(cfg: dict, seed: int = 0, scale: float = 0.2) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in _weight_shapes(cfg).items():
        if "layer_norm.weight" in name:
            out[name] = np.ones(shape, np.float32)
        elif "layer_norm.bias" in name:
            out[name] = np.zeros(shape, np.float32)
        else:
            out[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return out


def _sinusoids(length: int, channels: int) -> np.ndarray:
    """Whisper's fixed encoder position embedding."""
    inc = np.log(10000) / (channels // 2 - 1)
    inv = np.exp(-inc * np.arange(channels // 2))
    t = np.arange(length)[:, None] * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


# --------------------------------------------------------------------------- graph pieces

def _weights(g, w):
    """name -> initializer name, adding each weight once however often it is used."""
    added = {}

    def get(name):
        if name not in added:
            added[name] = g.weight(w[name], name)
        return added[name]
    return get


def _gelu(g, x):
    # Exact (erf) GELU, Whisper's activation: 0.5 * x * (1 + erf(x / sqrt 2)).
    e = g.op("Erf", [g.op("Mul", [x, g.const(np.float32(1 / np.sqrt(2)))])])
    return g.op("Mul", [g.op("Mul", [x, g.const(np.float32(0.5))]),
                        g.op("Add", [e, g.const(np.float32(1.0))])])


def _heads(g, t, H, hd):  # [B,S,D] -> [B,H,S,hd]
    return g.op("Transpose", [g.op("Reshape", [t, g.const(np.array([0, -1, H, hd], np.int64))])],
                perm=[0, 2, 1, 3])


def _merge_heads(g, t, D):  # [B,H,S,hd] -> [B,S,D]
    t = g.op("Transpose", [t], perm=[0, 2, 1, 3])
    return g.op("Reshape", [t, g.const(np.array([0, -1, D], np.int64))])


def _proj(g, x, W, p, n):
    y = g.op("MatMul", [x, W(f"{p}.{n}_proj.weight")])
    return y if n == "k" else g.op("Add", [y, W(f"{p}.{n}_proj.bias")])


def _attend(g, q, k, v, hd, allowed=None):
    s = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                     g.const(np.float32(1 / np.sqrt(hd)))])
    if allowed is not None:
        s = g.op("Where", [allowed, s, g.const(np.float32(np.finfo(np.float32).min))])
    return g.op("MatMul", [g.op("Softmax", [s], axis=-1), v])


def _mlp(g, x, W, p, eps=1e-5):
    h = _layer_norm(g, x, W(f"{p}.final_layer_norm.weight"), W(f"{p}.final_layer_norm.bias"), eps)
    h = _gelu(g, g.op("Add", [g.op("MatMul", [h, W(f"{p}.fc1.weight")]), W(f"{p}.fc1.bias")]))
    return g.op("Add", [x, g.op("Add", [g.op("MatMul", [h, W(f"{p}.fc2.weight")]),
                                        W(f"{p}.fc2.bias")])])


def _self_attn_block(g, x, W, p, H, hd, D, past=None, allowed=None):
    """Pre-LN self-attention; returns (x, k_all, v_all) with past K/V prepended."""
    h = _layer_norm(g, x, W(f"{p}_layer_norm.weight"), W(f"{p}_layer_norm.bias"), 1e-5)
    q, k, v = (_heads(g, _proj(g, h, W, p, n), H, hd) for n in ("q", "k", "v"))
    if past is not None:
        k = g.op("Concat", [past[0], k], axis=2)
        v = g.op("Concat", [past[1], v], axis=2)
    ctx = _merge_heads(g, _attend(g, q, k, v, hd, allowed), D)
    return g.op("Add", [x, _proj(g, ctx, W, p, "out")]), k, v


# --------------------------------------------------------------------------- encoder

def build_encoder(w: dict, cfg: dict) -> onnx.ModelProto:
    g = _Graph(np.float32)
    W = _weights(g, w)
    D, H = cfg["d_model"], cfg["encoder_attention_heads"]
    x = _gelu(g, g.op("Conv", ["input_features", W("encoder.conv1.weight"),
                               W("encoder.conv1.bias")], kernel_shape=[3], pads=[1, 1]))
    x = _gelu(g, g.op("Conv", [x, W("encoder.conv2.weight"), W("encoder.conv2.bias")],
                      kernel_shape=[3], pads=[1, 1], strides=[2]))
    x = g.op("Add", [g.op("Transpose", [x], perm=[0, 2, 1]), g.const(_sinusoids(ENC_LEN, D))])
    for i in range(cfg["encoder_layers"]):
        p = f"encoder.layers.{i}"
        x, _, _ = _self_attn_block(g, x, W, f"{p}.self_attn", H, D // H, D)
        x = _mlp(g, x, W, p)
    g.op("LayerNormalization", [x, W("encoder.layer_norm.weight"), W("encoder.layer_norm.bias")],
         outputs=["last_hidden_state"], axis=-1, epsilon=1e-5)
    graph = helper.make_graph(
        g.nodes, "whisper_encoder",
        [helper.make_tensor_value_info("input_features", TensorProto.FLOAT,
                                       ["batch_size", cfg["num_mel_bins"], N_FRAMES])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                       ["batch_size", ENC_LEN, D])],
        initializer=g.inits)
    return _finish(graph)


# --------------------------------------------------------------------------- merged decoder

def _decoder_branch(g, W, cfg, with_past: bool) -> list[str]:
    """Nodes of one If branch (appended to g.nodes); returns its output names in order."""
    D, H, L = cfg["d_model"], cfg["decoder_attention_heads"], cfg["decoder_layers"]
    hd = D // H
    i64 = lambda v: g.const(np.array(v, np.int64))  # noqa: E731
    seq = g.op("Gather", [g.op("Shape", ["input_ids"]), i64(1)], axis=0)          # scalar
    past_len = (g.op("Gather", [g.op("Shape", ["past_key_values.0.decoder.key"]), i64(2)],
                     axis=0) if with_past else i64(0))
    total = g.op("Add", [past_len, seq])
    q_pos = g.op("Range", [past_len, total, i64(1)])                                # [S]
    k_pos = g.op("Range", [i64(0), total, i64(1)])                                  # [T]
    allowed = g.op("LessOrEqual", [k_pos, g.op("Unsqueeze", [q_pos, i64([1])])])    # [S,T]
    x = g.op("Add", [g.op("Gather", [W("decoder.embed_tokens"), "input_ids"], axis=0),
                     g.op("Gather", [W("decoder.embed_positions"), q_pos], axis=0)])
    outs = []
    for i in range(L):
        p = f"decoder.layers.{i}"
        past = ((f"past_key_values.{i}.decoder.key", f"past_key_values.{i}.decoder.value")
                if with_past else None)
        x, k_self, v_self = _self_attn_block(g, x, W, f"{p}.self_attn", H, hd, D, past, allowed)
        c = f"{p}.encoder_attn"
        h = _layer_norm(g, x, W(f"{c}_layer_norm.weight"), W(f"{c}_layer_norm.bias"), 1e-5)
        q = _heads(g, _proj(g, h, W, c, "q"), H, hd)
        if with_past:
            k_x, v_x = f"past_key_values.{i}.encoder.key", f"past_key_values.{i}.encoder.value"
            # optimum's cache branch returns empty constants for the (unchanged) cross K/V.
            empty = np.zeros((0, H, 1, hd), np.float32)
            enc_outs = [g.op("Identity", [g.const(empty)]), g.op("Identity", [g.const(empty)])]
        else:
            k_x = _heads(g, _proj(g, "encoder_hidden_states", W, c, "k"), H, hd)
            v_x = _heads(g, _proj(g, "encoder_hidden_states", W, c, "v"), H, hd)
            enc_outs = [g.op("Identity", [k_x]), g.op("Identity", [v_x])]
        x = g.op("Add", [x, _proj(g, _merge_heads(g, _attend(g, q, k_x, v_x, hd), D), W, c, "out")])
        x = _mlp(g, x, W, p)
        outs += [g.op("Identity", [k_self]), g.op("Identity", [v_self])] + enc_outs
    x = _layer_norm(g, x, W("decoder.layer_norm.weight"), W("decoder.layer_norm.bias"), 1e-5)
    # proj_out is tied to the token embedding, as in Whisper.
    logits = g.op("MatMul", [x, g.op("Transpose", [W("decoder.embed_tokens")], perm=[1, 0])])
    return [logits] + outs


def _present_names(L):
    return [f"present.{i}.{part}.{kind}" for i in range(L)
            for part in ("decoder", "encoder") for kind in ("key", "value")]


def build_decoder_merged(w: dict, cfg: dict) -> onnx.ModelProto:
    D, H, L, V = cfg["d_model"], cfg["decoder_attention_heads"], cfg["decoder_layers"], cfg["vocab_size"]
    hd = D // H
    g = _Graph(np.float32)
    W = _weights(g, w)         # initializers live in the main graph, seen by both branches
    branches = {}
    for with_past in (True, False):
        main_nodes, g.nodes = g.nodes, []
        out_names = _decoder_branch(g, W, cfg, with_past)
        # Subgraph outputs carry no shapes: the two branches differ in them.
        value_infos = [helper.make_empty_tensor_value_info(n) for n in out_names]
        branches[with_past] = helper.make_graph(
            g.nodes, "with_past" if with_past else "no_past", [], value_infos)
        g.nodes = main_nodes
    out_names = ["logits"] + _present_names(L)
    g.nodes.append(helper.make_node("If", ["use_cache_branch"], out_names, name="optimum::if",
                                    then_branch=branches[True], else_branch=branches[False]))
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                            ["batch_size", "decoder_sequence_length"]),
              helper.make_tensor_value_info("encoder_hidden_states", TensorProto.FLOAT,
                                            ["batch_size", "encoder_sequence_length / 2", D])]
    for i in range(L):
        for part, seq in (("decoder", "past_decoder_sequence_length"),
                          ("encoder", "encoder_sequence_length_out")):
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(
                    f"past_key_values.{i}.{part}.{kind}", TensorProto.FLOAT,
                    ["batch_size", H, seq, hd]))
    inputs.append(helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]))
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                             ["batch_size", "decoder_sequence_length", V])]
    for name in _present_names(L):
        seq = ("past_decoder_sequence_length + decoder_sequence_length" if ".decoder." in name
               else "encoder_sequence_length_out")
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                     ["batch_size", H, seq, hd]))
    graph = helper.make_graph(g.nodes, "whisper_decoder_merged", inputs, outputs,
                              initializer=g.inits)
    return _finish(graph)


def _finish(graph) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="specsample-cupy.models.build_tiny_whisper")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# --------------------------------------------------------------------------- files

def tiny_whisper_vocab(vocab_size: int) -> list[str]:
    """Single characters, then Whisper's special tokens at the end (as in Whisper)."""
    n_chars = vocab_size - len(SPECIAL_TOKENS)
    if n_chars < 2:
        raise ValueError(f"vocab_size must be >= {len(SPECIAL_TOKENS) + 2}")
    chars, code = list(_CHARS), 0xC0
    while len(chars) < n_chars:                  # beyond ASCII: Latin-1 letters
        if chr(code).isprintable():
            chars.append(chr(code))
        code += 1
    return chars[:n_chars] + SPECIAL_TOKENS


def write_tokenizer(out_dir: str, vocab_size: int) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(tiny_whisper_vocab(vocab_size))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.save(os.path.join(out_dir, "tokenizer.json"))


def whisper_configs(cfg: dict) -> tuple[dict, dict, dict]:
    """config.json, generation_config.json, preprocessor_config.json contents."""
    vocab = {t: i for i, t in enumerate(tiny_whisper_vocab(cfg["vocab_size"]))}
    eos, sot = vocab["<|endoftext|>"], vocab["<|startoftranscript|>"]
    config = {"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
              "max_source_positions": ENC_LEN, "max_target_positions": MAX_TARGET_POSITIONS,
              "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos,
              "decoder_start_token_id": sot, "activation_function": "gelu",
              "scale_embedding": False, "use_cache": True, **cfg}
    generation = {
        "decoder_start_token_id": sot, "bos_token_id": eos, "eos_token_id": eos,
        "pad_token_id": eos, "max_length": MAX_TARGET_POSITIONS, "is_multilingual": True,
        "lang_to_id": {"<|en|>": vocab["<|en|>"], "<|de|>": vocab["<|de|>"]},
        "task_to_id": {"transcribe": vocab["<|transcribe|>"], "translate": vocab["<|translate|>"]},
        "no_timestamps_token_id": vocab["<|notimestamps|>"],
        "forced_decoder_ids": [[1, None], [2, vocab["<|transcribe|>"]],
                               [3, vocab["<|notimestamps|>"]]],
        "suppress_tokens": [vocab[t] for t in ("<|translate|>", "<|transcribe|>",
                                                "<|startoftranscript|>", "<|nospeech|>")],
        "begin_suppress_tokens": [vocab[" "], eos],
    }
    preprocessor = {"feature_extractor_type": "WhisperFeatureExtractor",
                    "feature_size": cfg["num_mel_bins"], "sampling_rate": 16000,
                    "hop_length": 160, "n_fft": 400, "chunk_length": 30,
                    "n_samples": 480000, "nb_max_frames": N_FRAMES, "padding_value": 0.0,
                    "return_attention_mask": False, "processor_class": "WhisperProcessor"}
    return config, generation, preprocessor


def export_whisper(weights: dict, cfg: dict, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    onnx.save_model(build_encoder(weights, cfg), os.path.join(out_dir, "encoder_model.onnx"))
    onnx.save_model(build_decoder_merged(weights, cfg),
                    os.path.join(out_dir, "decoder_model_merged.onnx"))
    for name, content in zip(("config.json", "generation_config.json",
                              "preprocessor_config.json"), whisper_configs(cfg)):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(content, f, indent=2)
            f.write("\n")
    write_tokenizer(out_dir, cfg["vocab_size"])
    return out_dir


def _draft_from_target(target: dict, d_cfg: dict, similarity: float, seed: int) -> dict:
    """Target tensors (first decoder layers only) mixed with same-scale noise.

    similarity * t + sqrt(1 - similarity^2) * noise keeps each tensor's scale;
    LayerNorm parameters are copied so the logit sharpness matches.
    """
    noise = random_whisper_weights(d_cfg, seed=seed, scale=1.0)
    mix = float(np.sqrt(max(0.0, 1.0 - similarity ** 2)))
    out = {}
    for name, n in noise.items():
        t = target[name]
        if "layer_norm" in name:
            out[name] = t.copy()
        else:
            out[name] = (similarity * t + mix * n * (float(t.std()) or 1.0)).astype(np.float32)
    return out


def build_tiny_whisper_pair(out_dir: str, *, n_mels: int = 80, vocab_size: int = 51,
                            seed: int = 0, d_model: int = 32, n_head: int = 2,
                            decoder_layers: int = 2, draft_decoder_layers: int = 1,
                            encoder_layers: int = 1, draft_similarity: float = 0.98,
                            logit_gain: float = 2.5,
                            extra_layer_scale: float = 0.2) -> tuple[str, str]:
    """Write out_dir/target and out_dir/draft (optimum Whisper layout); return their paths."""
    t_cfg = {"d_model": d_model, "encoder_layers": encoder_layers,
             "decoder_layers": decoder_layers, "encoder_attention_heads": n_head,
             "decoder_attention_heads": n_head, "encoder_ffn_dim": 4 * d_model,
             "decoder_ffn_dim": 4 * d_model, "num_mel_bins": n_mels, "vocab_size": vocab_size}
    d_cfg = dict(t_cfg, decoder_layers=draft_decoder_layers)
    if draft_decoder_layers > decoder_layers:
        raise ValueError("the draft must not be deeper than the target")
    target = random_whisper_weights(t_cfg, seed=seed)
    # The target's extra decoder layers only nudge the residual stream, so the
    # shallower draft predicts the target's tokens often (but not always).
    for i in range(draft_decoder_layers, decoder_layers):
        for name in list(target):
            if name.startswith(f"decoder.layers.{i}.") and name.split(".")[-2] in ("out_proj", "fc2"):
                target[name] *= extra_layer_scale
    # Sharper output distributions than random init gives: scale the final LayerNorm.
    target["decoder.layer_norm.weight"] *= logit_gain
    draft = _draft_from_target(target, d_cfg, draft_similarity, seed + 1)
    return (export_whisper(target, t_cfg, os.path.join(out_dir, "target")),
            export_whisper(draft, d_cfg, os.path.join(out_dir, "draft")))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--n-mels", type=int, default=80, choices=(80, 128))
    ap.add_argument("--vocab-size", type=int, default=51)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(*build_tiny_whisper_pair(a.out_dir, n_mels=a.n_mels, vocab_size=a.vocab_size,
                                   seed=a.seed))


if __name__ == "__main__":
    main()
