"""A CTranslate2 Whisper folder (faster-whisper's format) as the ONNX export the ASR evaluation reads.

Input: a folder with CTranslate2's ``model.bin`` (spec ``WhisperSpec``),
its ``config.json`` (suppressed tokens, language ids) and the Hugging Face
``tokenizer.json``. Output: the layout of ``optimum-cli export onnx --task
automatic-speech-recognition-with-past`` (encoder_model.onnx,
decoder_model_merged.onnx, config.json, generation_config.json,
preprocessor_config.json, tokenizer.json).

The graphs are models/build_tiny_whisper.py's, fed with the real weights:
CTranslate2's variables are renamed to the Hugging Face names that builder
uses, linear weights transposed from [out, in] to [in, out], fused Q/K/V
projections split, and fp16 (or quantized) weights widened to float32 for
ONNX Runtime's CPU kernels.

    python -m models.convert_ct2_whisper CT2_DIR OUT_DIR
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import onnx

from .build_tiny_whisper import (ENC_LEN, N_FRAMES, _sinusoids, build_decoder_merged,
                                       build_encoder)
from .ct2_model_file import Ct2FormatError, Ct2Model, float_variable, read_ct2_model

SPEC_NAME = "WhisperSpec"
_GELU = 3                    # CTranslate2's Activation.GELU (erf), Whisper's activation
# Decoder switches CTranslate2 stores as scalars; Whisper's values, which the graphs assume.
_DECODER_FLAGS = {"decoder/pre_norm": 1, "decoder/activation": _GELU, "decoder/scale_embeddings": 0,
                  "decoder/alibi": 0, "decoder/start_from_zero_embedding": 0}
# fp16 rounding of the stored sinusoids is ~2.5e-4; anything larger is a different embedding.
_SINUSOID_TOLERANCE = 1e-2


def _count_layers(model: Ct2Model, scope: str) -> int:
    n = 0
    while f"{scope}/layer_{n}/ffn/linear_0/weight" in model.variables:
        n += 1
    return n


def _linears(model: Ct2Model, scope: str) -> list[str]:
    names, i = [], 0
    while f"{scope}/linear_{i}/weight" in model.variables:
        names.append(f"{scope}/linear_{i}")
        i += 1
    return names


def _bias(model: Ct2Model, linear: str, rows: int) -> np.ndarray:
    name = f"{linear}/bias"
    return float_variable(model, name) if name in model.variables else np.zeros(rows, np.float32)


def _attention(model: Ct2Model, scope: str, prefix: str, d: int, out: dict) -> None:
    """Q/K/V/out projections of one attention block, as ``{prefix}.{q,k,v,out}_proj.*``.

    The last linear is the output projection; those before it hold Q, K, V in
    that order, fused (self-attention: one [3d, d]; cross-attention: Q, then
    one [2d, d] for K and V) or split, so stacking them gives [3d, d] either way.
    """
    linears = _linears(model, scope)
    if len(linears) < 2:
        raise Ct2FormatError(f"{scope}: expected Q/K/V and output linears, found {len(linears)}")
    qkv_w = np.concatenate([float_variable(model, f"{n}/weight") for n in linears[:-1]], axis=0)
    qkv_b = np.concatenate([_bias(model, n, model.variables[f"{n}/weight"].shape[0])
                            for n in linears[:-1]])
    if qkv_w.shape != (3 * d, d):
        raise Ct2FormatError(f"{scope}: Q/K/V weights stack to {qkv_w.shape}, expected {(3 * d, d)}")
    for j, part in enumerate("qkv"):
        out[f"{prefix}.{part}_proj.weight"] = qkv_w[j * d:(j + 1) * d].T
        # The graph has no key bias, like Whisper: a key bias adds q·b_k to every score
        # of a query row, which softmax cancels, so dropping it changes nothing.
        if part != "k":
            out[f"{prefix}.{part}_proj.bias"] = qkv_b[j * d:(j + 1) * d]
    out[f"{prefix}.out_proj.weight"] = float_variable(model, f"{linears[-1]}/weight").T
    out[f"{prefix}.out_proj.bias"] = _bias(model, linears[-1], d)


def _layer_norm(model: Ct2Model, scope: str, name: str, out: dict) -> None:
    out[f"{name}.weight"] = float_variable(model, f"{scope}/gamma")
    out[f"{name}.bias"] = float_variable(model, f"{scope}/beta")


def _ffn(model: Ct2Model, scope: str, prefix: str, out: dict) -> None:
    _layer_norm(model, f"{scope}/layer_norm", f"{prefix}.final_layer_norm", out)
    for i, fc in ((0, "fc1"), (1, "fc2")):
        w = float_variable(model, f"{scope}/linear_{i}/weight")
        out[f"{prefix}.{fc}.weight"] = w.T
        out[f"{prefix}.{fc}.bias"] = _bias(model, f"{scope}/linear_{i}", w.shape[0])


def _check_whisper(model: Ct2Model, d: int) -> None:
    """Refuse what the graphs would compute differently instead of converting it silently."""
    for name, expected in _DECODER_FLAGS.items():
        value = model.scalar(name, expected)
        if int(value) != expected:
            raise Ct2FormatError(f"{name} is {value}; Whisper's graphs need {expected}")
    enc_pos = float_variable(model, "encoder/position_encodings/encodings")
    if enc_pos.shape != (ENC_LEN, d) or np.abs(enc_pos - _sinusoids(ENC_LEN, d)).max() > _SINUSOID_TOLERANCE:
        raise Ct2FormatError("encoder position encodings are not Whisper's sinusoids")
    emb = model.variables["decoder/embeddings/weight"]
    proj = model.variables.get("decoder/projection/weight", emb)
    # The builder ties the output projection to the token embedding, as Whisper does.
    if proj is not emb and not np.array_equal(proj, emb):
        raise Ct2FormatError("decoder/projection/weight differs from the token embedding")
    bias = model.variables.get("decoder/projection/bias")
    if bias is not None and np.any(bias):
        raise Ct2FormatError("decoder/projection has a bias; Whisper's output projection has none")


def whisper_weights_from_ct2(model: Ct2Model) -> tuple[dict, dict]:
    """(weights under build_tiny_whisper's names, its cfg dict plus max_target_positions)."""
    if model.spec_name != SPEC_NAME:
        raise Ct2FormatError(f"model.bin holds a {model.spec_name}, not a {SPEC_NAME}")
    emb = float_variable(model, "decoder/embeddings/weight")
    vocab, d = emb.shape
    _check_whisper(model, d)
    conv1 = float_variable(model, "encoder/conv1/weight")
    cfg = {"d_model": int(d), "vocab_size": int(vocab), "num_mel_bins": int(conv1.shape[1]),
           "encoder_layers": _count_layers(model, "encoder"),
           "decoder_layers": _count_layers(model, "decoder"),
           "encoder_attention_heads": int(model.scalar("encoder/num_heads")),
           "decoder_attention_heads": int(model.scalar("decoder/num_heads")),
           "encoder_ffn_dim": int(model.variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
           "decoder_ffn_dim": int(model.variables["decoder/layer_0/ffn/linear_0/weight"].shape[0])}
    w = {"encoder.conv1.weight": conv1, "encoder.conv1.bias": float_variable(model, "encoder/conv1/bias"),
         "encoder.conv2.weight": float_variable(model, "encoder/conv2/weight"),
         "encoder.conv2.bias": float_variable(model, "encoder/conv2/bias"),
         "decoder.embed_tokens": emb,
         "decoder.embed_positions": float_variable(model, "decoder/position_encodings/encodings")}
    _layer_norm(model, "encoder/layer_norm", "encoder.layer_norm", w)
    _layer_norm(model, "decoder/layer_norm", "decoder.layer_norm", w)
    for i in range(cfg["encoder_layers"]):
        src, dst = f"encoder/layer_{i}", f"encoder.layers.{i}"
        _attention(model, f"{src}/self_attention", f"{dst}.self_attn", d, w)
        _layer_norm(model, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm", w)
        _ffn(model, f"{src}/ffn", dst, w)
    for i in range(cfg["decoder_layers"]):
        src, dst = f"decoder/layer_{i}", f"decoder.layers.{i}"
        _attention(model, f"{src}/self_attention", f"{dst}.self_attn", d, w)
        _layer_norm(model, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm", w)
        _attention(model, f"{src}/attention", f"{dst}.encoder_attn", d, w)
        _layer_norm(model, f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm", w)
        _ffn(model, f"{src}/ffn", dst, w)
    cfg["max_target_positions"] = int(w["decoder.embed_positions"].shape[0])
    return w, cfg


# --------------------------------------------------------------------------- JSON files

def _special_ids(tokenizer) -> dict:
    ids = {}
    for key, token in (("eot", "<|endoftext|>"), ("sot", "<|startoftranscript|>"),
                       ("transcribe", "<|transcribe|>"), ("translate", "<|translate|>"),
                       ("no_timestamps", "<|notimestamps|>")):
        ids[key] = tokenizer.token_to_id(token)
        if ids[key] is None:
            raise Ct2FormatError(f"tokenizer.json has no {token}")
    return ids


def whisper_json_files(cfg: dict, ct2_config: dict, tokenizer) -> dict[str, dict]:
    """config.json, generation_config.json, preprocessor_config.json for the export folder.

    Suppressed tokens and language ids come from CTranslate2's config.json
    (``suppress_ids``, ``suppress_ids_begin``, ``lang_ids``); a model without
    language ids is English-only and is prompted without language and task tokens.
    """
    ids = _special_ids(tokenizer)
    config = {"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
              **cfg, "max_source_positions": ENC_LEN,
              "bos_token_id": ids["eot"], "eos_token_id": ids["eot"], "pad_token_id": ids["eot"],
              "decoder_start_token_id": ids["sot"], "activation_function": "gelu",
              "scale_embedding": False, "use_cache": True}
    lang_to_id = {tokenizer.id_to_token(int(i)): int(i) for i in ct2_config.get("lang_ids") or []}
    generation = {"decoder_start_token_id": ids["sot"], "bos_token_id": ids["eot"],
                  "eos_token_id": ids["eot"], "pad_token_id": ids["eot"],
                  "max_length": cfg["max_target_positions"], "is_multilingual": bool(lang_to_id),
                  "no_timestamps_token_id": ids["no_timestamps"],
                  "suppress_tokens": [int(t) for t in ct2_config.get("suppress_ids") or []],
                  "begin_suppress_tokens": [int(t) for t in ct2_config.get("suppress_ids_begin") or []]}
    if lang_to_id:
        generation.update(lang_to_id=lang_to_id,
                          task_to_id={"transcribe": ids["transcribe"], "translate": ids["translate"]},
                          forced_decoder_ids=[[1, None], [2, ids["transcribe"]],
                                              [3, ids["no_timestamps"]]])
    else:
        generation["forced_decoder_ids"] = [[1, ids["no_timestamps"]]]
    preprocessor = {"feature_extractor_type": "WhisperFeatureExtractor",
                    "feature_size": cfg["num_mel_bins"], "sampling_rate": 16000, "hop_length": 160,
                    "n_fft": 400, "chunk_length": 30, "n_samples": 480000, "nb_max_frames": N_FRAMES,
                    "padding_value": 0.0, "return_attention_mask": False,
                    "processor_class": "WhisperProcessor"}
    return {"config.json": config, "generation_config.json": generation,
            "preprocessor_config.json": preprocessor}


# --------------------------------------------------------------------------- conversion

def round_to_int8(weights: dict) -> dict:
    """A cheaper-to-make draft of the same model: every weight of two or more dimensions rounded to
    int8 (symmetric, one scale per slice along the last axis) and widened back to float32; biases
    and layer norms untouched. Its distribution is close to the original's, not equal."""
    out = {}
    for name, w in weights.items():
        if w.ndim < 2:
            out[name] = w
            continue
        rows = w.reshape(-1, w.shape[-1]).astype(np.float32)
        scale = np.abs(rows).max(-1, keepdims=True) / 127.0
        scale[scale == 0] = 1.0
        out[name] = (np.clip(np.rint(rows / scale), -127, 127) * scale).reshape(w.shape).astype(np.float32)
    return out


def convert_ct2_whisper(ct2_dir, out_dir, *, int8_rounded=False) -> Path:
    """Write the ONNX export of the CTranslate2 Whisper model in ct2_dir to out_dir; return out_dir.
    int8_rounded: export round_to_int8() of the weights instead (a draft for the original)."""
    from tokenizers import Tokenizer

    ct2_dir, out_dir = Path(ct2_dir), Path(out_dir)
    tok_path = ct2_dir / "tokenizer.json"
    if not tok_path.is_file():
        raise Ct2FormatError(f"{ct2_dir} has no tokenizer.json")
    ct2_config_path = ct2_dir / "config.json"
    ct2_config = json.loads(ct2_config_path.read_text()) if ct2_config_path.is_file() else {}
    weights, cfg = whisper_weights_from_ct2(read_ct2_model(ct2_dir / "model.bin"))
    if int8_rounded:
        weights = round_to_int8(weights)
    files = whisper_json_files(cfg, ct2_config, Tokenizer.from_file(str(tok_path)))
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, build in (("encoder_model.onnx", build_encoder),
                        ("decoder_model_merged.onnx", build_decoder_merged)):
        graph = build(weights, cfg)
        graph.producer_name = "specsample-cupy.models.convert_ct2_whisper"
        onnx.save_model(graph, str(out_dir / name))
    for name, content in files.items():
        (out_dir / name).write_text(json.dumps(content, indent=2) + "\n")
    shutil.copyfile(tok_path, out_dir / "tokenizer.json")
    return out_dir


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ct2_dir", help="folder with model.bin, config.json and tokenizer.json")
    ap.add_argument("out_dir")
    ap.add_argument("--int8-rounded", action="store_true",
                    help="export the weights rounded to int8 (a draft whose distribution is close to the original's)")
    a = ap.parse_args(argv)
    print(convert_ct2_whisper(a.ct2_dir, a.out_dir, int8_rounded=a.int8_rounded))


if __name__ == "__main__":
    main()
