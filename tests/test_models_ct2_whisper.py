"""CTranslate2 Whisper -> ONNX conversion, checked against a numpy forward pass of the same weights.

A tiny random Whisper is written in CTranslate2's model.bin format the way
CTranslate2 lays it out (fp16, [out, in] linears, fused Q/K/V, key biases,
the output projection as an alias of the embedding), converted, and the
ONNX graphs' outputs compared with numpy run directly on those variables.
"""
import json
import math

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from models.build_tiny_whisper import (ENC_LEN, N_FRAMES, _sinusoids, tiny_whisper_vocab,  # noqa: E402
                                       write_tokenizer)
from models.convert_ct2_whisper import convert_ct2_whisper  # noqa: E402
from models.ct2_model_file import (Ct2FormatError, float_variable, parse_ct2_model,  # noqa: E402
                                   read_ct2_model, write_ct2_model)

D, H, F, MELS, VOCAB, POSITIONS = 16, 2, 32, 80, 51, 24
ENC_LAYERS, DEC_LAYERS = 1, 2


# --------------------------------------------------------------------------- a tiny CTranslate2 Whisper

def ct2_whisper_variables(seed=0) -> dict:
    """Random variables under CTranslate2's WhisperSpec names, stored as fp16 like the real model."""
    rng = np.random.default_rng(seed)

    def rand(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    v = {"encoder/num_heads": np.int16(H), "decoder/num_heads": np.int16(H),
         "decoder/pre_norm": np.int8(1), "decoder/activation": np.int8(3),
         "decoder/scale_embeddings": np.int8(0), "decoder/alibi": np.int8(0),
         "encoder/conv1/weight": rand(D, MELS, 3), "encoder/conv1/bias": rand(D),
         "encoder/conv2/weight": rand(D, D, 3), "encoder/conv2/bias": rand(D),
         # float32 here: the graph computes Whisper's sinusoids exactly rather than reading
         # the stored copy (which the real model rounds to fp16), so the two must agree.
         "encoder/position_encodings/encodings": _sinusoids(ENC_LEN, D),
         "decoder/embeddings/weight": rand(VOCAB, D, scale=1.0),
         "decoder/position_encodings/encodings": rand(POSITIONS, D)}

    def norm(scope):
        v[f"{scope}/gamma"] = (1 + rand(D, scale=0.1)).astype(np.float16)
        v[f"{scope}/beta"] = rand(D, scale=0.1)

    def linear(scope, rows, cols):
        v[f"{scope}/weight"], v[f"{scope}/bias"] = rand(rows, cols), rand(rows)

    def layer(scope, cross):
        norm(f"{scope}/self_attention/layer_norm")
        linear(f"{scope}/self_attention/linear_0", 3 * D, D)   # fused Q, K, V (with a key bias)
        linear(f"{scope}/self_attention/linear_1", D, D)
        if cross:
            norm(f"{scope}/attention/layer_norm")
            linear(f"{scope}/attention/linear_0", D, D)        # Q
            linear(f"{scope}/attention/linear_1", 2 * D, D)    # fused K, V
            linear(f"{scope}/attention/linear_2", D, D)
        norm(f"{scope}/ffn/layer_norm")
        linear(f"{scope}/ffn/linear_0", F, D)
        linear(f"{scope}/ffn/linear_1", D, F)

    for i in range(ENC_LAYERS):
        layer(f"encoder/layer_{i}", cross=False)
    for i in range(DEC_LAYERS):
        layer(f"decoder/layer_{i}", cross=True)
    norm("encoder/layer_norm")
    norm("decoder/layer_norm")
    return v


TIED = {"decoder/projection/weight": "decoder/embeddings/weight"}


def write_ct2_whisper(folder, *, multilingual=True, seed=0) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    variables = ct2_whisper_variables(seed)
    write_ct2_model(folder / "model.bin", "WhisperSpec", 3, variables, TIED)
    write_tokenizer(str(folder), VOCAB)
    ids = {t: i for i, t in enumerate(tiny_whisper_vocab(VOCAB))}
    config = {"suppress_ids": [ids["<|translate|>"], ids["<|nospeech|>"]],
              "suppress_ids_begin": [ids[" "], ids["<|endoftext|>"]],
              "lang_ids": [ids["<|en|>"], ids["<|de|>"]] if multilingual else []}
    (folder / "config.json").write_text(json.dumps(config))
    return variables


# --------------------------------------------------------------------------- numpy reference

def _f32(v, name):
    return v[name].astype(np.float32)


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _layer_norm(v, scope, x):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * _f32(v, f"{scope}/gamma") + _f32(v, f"{scope}/beta")


def _linear(v, scope, x):
    return x @ _f32(v, f"{scope}/weight").T + _f32(v, f"{scope}/bias")


def _conv1d(x, w, b, stride):
    """x [C, T], w [O, C, 3], padding 1."""
    xp = np.pad(x, ((0, 0), (1, 1)))
    t_out = (x.shape[1] - 1) // stride + 1
    cols = np.stack([xp[:, k:k + stride * (t_out - 1) + 1:stride] for k in range(3)], -1)
    return np.einsum("ctk,ock->ot", cols, w) + b[:, None]


def _attention(q, k, v, causal_offset=None):
    """q [S, D], k/v [T, D]; heads split here. causal_offset: position of q's first row."""
    hd = D // H
    out = []
    for h in range(H):
        sl = slice(h * hd, (h + 1) * hd)
        s = q[:, sl] @ k[:, sl].T / math.sqrt(hd)
        if causal_offset is not None:
            rows = causal_offset + np.arange(q.shape[0])[:, None]
            s = np.where(np.arange(k.shape[0])[None, :] <= rows, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        out.append((p / p.sum(-1, keepdims=True)) @ v[:, sl])
    return np.concatenate(out, -1)


def _ffn(v, scope, x):
    h = _gelu(_linear(v, f"{scope}/linear_0", _layer_norm(v, f"{scope}/layer_norm", x)))
    return x + _linear(v, f"{scope}/linear_1", h)


def numpy_encoder(v, features):
    """features [n_mels, 3000] -> [1500, D], with CTranslate2's variables as they are stored."""
    x = _gelu(_conv1d(features, _f32(v, "encoder/conv1/weight"), _f32(v, "encoder/conv1/bias"), 1))
    x = _gelu(_conv1d(x, _f32(v, "encoder/conv2/weight"), _f32(v, "encoder/conv2/bias"), 2))
    x = x.T + _f32(v, "encoder/position_encodings/encodings")
    for i in range(ENC_LAYERS):
        s = f"encoder/layer_{i}/self_attention"
        q, k, val = np.split(_linear(v, f"{s}/linear_0", _layer_norm(v, f"{s}/layer_norm", x)), 3, -1)
        x = x + _linear(v, f"{s}/linear_1", _attention(q, k, val))
        x = _ffn(v, f"encoder/layer_{i}/ffn", x)
    return _layer_norm(v, "encoder/layer_norm", x)


def numpy_decoder(v, ids, enc):
    """Logits [S, V] for token ids [S] from position 0, attending to enc [1500, D]."""
    x = _f32(v, "decoder/embeddings/weight")[ids] + _f32(v, "decoder/position_encodings/encodings")[:len(ids)]
    for i in range(DEC_LAYERS):
        s = f"decoder/layer_{i}/self_attention"
        q, k, val = np.split(_linear(v, f"{s}/linear_0", _layer_norm(v, f"{s}/layer_norm", x)), 3, -1)
        x = x + _linear(v, f"{s}/linear_1", _attention(q, k, val, causal_offset=0))
        c = f"decoder/layer_{i}/attention"
        q = _linear(v, f"{c}/linear_0", _layer_norm(v, f"{c}/layer_norm", x))
        k, val = np.split(_linear(v, f"{c}/linear_1", enc), 2, -1)
        x = x + _linear(v, f"{c}/linear_2", _attention(q, k, val))
        x = _ffn(v, f"decoder/layer_{i}/ffn", x)
    return _layer_norm(v, "decoder/layer_norm", x) @ _f32(v, "decoder/embeddings/weight").T


# --------------------------------------------------------------------------- tests

@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("ct2_whisper")
    variables = write_ct2_whisper(root / "ct2")
    return variables, convert_ct2_whisper(root / "ct2", root / "onnx")


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _decoder_feeds(ids, enc, past=None):
    feeds = {"input_ids": np.array([ids], np.int64), "encoder_hidden_states": enc,
             "use_cache_branch": np.array([past is not None])}
    zeros = np.zeros((1, H, 1, D // H), np.float32)   # ignored by the no-cache branch
    for i in range(DEC_LAYERS):
        for part in ("decoder", "encoder"):
            for kind in ("key", "value"):
                name = f"{i}.{part}.{kind}"
                feeds[f"past_key_values.{name}"] = zeros if past is None else past[f"present.{name}"]
    return feeds


def test_onnx_graphs_match_numpy_forward_of_the_ct2_weights(converted):
    v, out = converted
    feats = np.random.default_rng(1).standard_normal((MELS, N_FRAMES)).astype(np.float32)
    enc = _session(out / "encoder_model.onnx").run(None, {"input_features": feats[None]})[0]
    want_enc = numpy_encoder(v, feats)
    np.testing.assert_allclose(enc[0], want_enc, rtol=1e-4, atol=2e-5)

    dec = _session(out / "decoder_model_merged.onnx")
    names = [o.name for o in dec.get_outputs()]
    ids = [45, 2, 5, 7, 3, 11, 20]
    want = numpy_decoder(v, np.array(ids), want_enc)
    # The no-cache branch reads a prefix; the cache branch continues it one token at a time.
    first = dict(zip(names, dec.run(None, _decoder_feeds(ids[:4], enc))))
    np.testing.assert_allclose(first["logits"][0], want[:4], rtol=1e-4, atol=1e-4)
    past = first
    for t in range(4, len(ids)):
        step = dict(zip(names, dec.run(None, _decoder_feeds(ids[t:t + 1], enc, past))))
        np.testing.assert_allclose(step["logits"][0, 0], want[t], rtol=1e-4, atol=1e-4)
        past = {**step, **{k: first[k] for k in first if ".encoder." in k}}


def test_export_folder_loads_and_transcribes(converted):
    from specsample_cupy.tasks.asr import WhisperSpeculativeDecoder

    _, out = converted
    ids = {t: i for i, t in enumerate(tiny_whisper_vocab(VOCAB))}
    config = json.loads((out / "config.json").read_text())
    assert (config["d_model"], config["decoder_layers"], config["vocab_size"]) == (D, DEC_LAYERS, VOCAB)
    assert config["max_target_positions"] == POSITIONS
    decoder = WhisperSpeculativeDecoder(out, out, "cpu")
    assert decoder.prompt_ids == [ids[t] for t in ("<|startoftranscript|>", "<|en|>", "<|transcribe|>",
                                                   "<|notimestamps|>")]
    assert decoder.target_model.spec.suppress_tokens == [ids["<|translate|>"], ids["<|nospeech|>"]]
    audio = 0.1 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)
    result = decoder.transcribe(audio, method="target", max_new_tokens=5, temperature=0.0)
    assert 1 <= len(result.token_ids[0]) <= 5


def test_english_only_model_is_prompted_without_language(tmp_path):
    from specsample_cupy.tasks.whisper_config import load_whisper_spec

    write_ct2_whisper(tmp_path / "ct2", multilingual=False)
    out = convert_ct2_whisper(tmp_path / "ct2", tmp_path / "onnx")
    ids = {t: i for i, t in enumerate(tiny_whisper_vocab(VOCAB))}
    assert load_whisper_spec(out).prompt_ids == [ids["<|startoftranscript|>"], ids["<|notimestamps|>"]]


def test_model_file_round_trip_with_alias_and_quantization(tmp_path):
    w = np.arange(6, dtype=np.float16).reshape(2, 3)
    q = np.array([[10, -20], [30, 40]], np.int8)
    write_ct2_model(tmp_path / "model.bin", "TestSpec", 7,
                    {"a/weight": w, "q/weight": q, "q/weight_scale": np.array([10, 20], np.float32),
                     "flag": np.int8(1)}, {"b/weight": "a/weight"})
    m = read_ct2_model(tmp_path / "model.bin")
    assert (m.spec_name, m.spec_revision, m.binary_version) == ("TestSpec", 7, 6)
    assert m.variables["a/weight"].dtype == np.float16 and m.variables["b/weight"] is m.variables["a/weight"]
    assert m.scalar("flag") == 1 and m.scalar("missing", 5) == 5
    np.testing.assert_allclose(float_variable(m, "q/weight"), [[1, -2], [1.5, 2]])


def test_reader_refuses_truncated_files_and_other_models(tmp_path):
    write_ct2_model(tmp_path / "model.bin", "TransformerSpec", 1, {"x": np.ones(4, np.float32)})
    data = (tmp_path / "model.bin").read_bytes()
    with pytest.raises(Ct2FormatError, match="ends early"):
        parse_ct2_model(data[:-10])
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(Ct2FormatError, match="not a WhisperSpec"):
        convert_ct2_whisper(tmp_path, tmp_path / "onnx")


def test_converter_refuses_an_untied_output_projection(tmp_path):
    folder = tmp_path / "ct2"
    variables = write_ct2_whisper(folder)
    variables["decoder/projection/weight"] = variables["decoder/embeddings/weight"] + np.float16(1)
    write_ct2_model(folder / "model.bin", "WhisperSpec", 3, variables)
    with pytest.raises(Ct2FormatError, match="projection"):
        convert_ct2_whisper(folder, tmp_path / "onnx")


def test_int8_rounded_draft_weights():
    """Matrices take at most 255 levels per row, within half a step of the original; vectors untouched."""
    from models.convert_ct2_whisper import round_to_int8
    rng = np.random.default_rng(0)
    w = {"m": rng.normal(size=(6, 40)).astype(np.float32), "b": rng.normal(size=40).astype(np.float32),
         "z": np.zeros((2, 3), np.float32)}
    r = round_to_int8(w)
    step = np.abs(w["m"]).max(-1, keepdims=True) / 127
    assert np.all(np.abs(r["m"] - w["m"]) <= step / 2 + 1e-7)
    assert all(len(np.unique(row)) <= 255 for row in r["m"]) and not np.array_equal(r["m"], w["m"])
    assert r["b"] is w["b"] and np.array_equal(r["z"], w["z"])
