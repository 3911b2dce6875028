"""Tiny Whisper exports, their sessions, the decoder prompt, and the speculative loop on them."""
import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from models.build_tiny_whisper import build_tiny_whisper_pair  # noqa: E402
from specsample_cupy.tasks.datasets import DataError  # noqa: E402
from specsample_cupy.tasks.whisper_config import check_pair, load_whisper_spec, whisper_prompt  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_tiny_whisper_pair(str(tmp_path_factory.mktemp("tiny_whisper")))


@pytest.fixture(scope="module")
def features():
    rng = np.random.default_rng(0)
    t = np.arange(16000 * 2) / 16000
    audio = 0.2 * np.sin(2 * np.pi * 300 * t) + 0.02 * rng.standard_normal(t.size)
    from specsample_cupy.tasks.audio import log_mel_spectrogram

    return log_mel_spectrogram(audio, 80)[None]


def test_export_has_optimum_layout(pair):
    import onnx

    for d in pair:
        names = {p.name for p in __import__("pathlib").Path(d).iterdir()}
        assert {"encoder_model.onnx", "decoder_model_merged.onnx", "config.json", "tokenizer.json",
                "generation_config.json", "preprocessor_config.json"} <= names
    dec = onnx.load(f"{pair[0]}/decoder_model_merged.onnx")
    inputs = [i.name for i in dec.graph.input]
    outputs = [o.name for o in dec.graph.output]
    assert inputs[:2] == ["input_ids", "encoder_hidden_states"] and inputs[-1] == "use_cache_branch"
    assert "past_key_values.1.encoder.value" in inputs and "present.1.decoder.key" in outputs
    assert dec.graph.node[-1].op_type == "If"
    enc = onnx.load(f"{pair[0]}/encoder_model.onnx")
    assert [i.name for i in enc.graph.input] == ["input_features"]
    assert [o.name for o in enc.graph.output] == ["last_hidden_state"]


def test_tokenizer_has_whisper_special_tokens(pair):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{pair[0]}/tokenizer.json")
    for t in ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>", "<|endoftext|>"):
        assert tok.token_to_id(t) is not None
    ids = tok.encode("hello").ids
    assert tok.decode(ids + [tok.token_to_id("<|endoftext|>")], skip_special_tokens=True) == "hello"


def test_prompt_from_generation_config(pair):
    spec = load_whisper_spec(pair[0])
    vocab = json.load(open(f"{pair[0]}/tokenizer.json"))["model"]["vocab"]
    assert spec.prompt_ids == [vocab[t] for t in ("<|startoftranscript|>", "<|en|>", "<|transcribe|>",
                                                   "<|notimestamps|>")]
    assert spec.n_mels == 80 and spec.eos_token_id == vocab["<|endoftext|>"]
    assert load_whisper_spec(pair[0], language="de", task="translate").prompt_ids[1:3] == \
        [vocab["<|de|>"], vocab["<|translate|>"]]
    with pytest.raises(DataError, match="language 'xx'"):
        load_whisper_spec(pair[0], language="xx")
    # An English-only export: no lang_to_id, forced ids give <|notimestamps|> only.
    english = {"decoder_start_token_id": 50257, "forced_decoder_ids": [[1, 50362]],
               "no_timestamps_token_id": 50362}
    assert whisper_prompt(english, {}, None) == [50257, 50362]


def test_pair_mismatch_is_reported(pair):
    t, d = load_whisper_spec(pair[0]), load_whisper_spec(pair[1])
    check_pair(t, d)
    d.vocab_size = 7
    with pytest.raises(DataError, match="vocabulary sizes differ"):
        check_pair(t, d)


def test_cache_matches_full_recompute_and_rolls_back(pair, features):
    from specsample_cupy.tasks.whisper_session import WhisperDecoderSession, WhisperModel

    model = WhisperModel(pair[0])
    session = WhisperDecoderSession(model)
    session.set_encoder_output(model.encode(features))
    prompt = model.spec.prompt_ids
    rng = np.random.default_rng(1)
    seq = np.array([prompt + rng.integers(0, 30, 8).tolist()])
    one = np.ones_like
    full_cache = session.new_cache(1)
    full = session.forward(full_cache, seq, one(seq, bool), None).copy()
    cache = session.new_cache(1)
    parts = [session.forward(cache, seq[:, :3], one(seq[:, :3], bool), None).copy()]
    for j in range(3, seq.shape[1]):
        parts.append(session.forward(cache, seq[:, j:j + 1], np.ones((1, 1), bool), None).copy())
    stepwise = np.concatenate(parts, axis=1)
    finite = np.isfinite(full)
    assert (np.isfinite(stepwise) == finite).all()
    np.testing.assert_allclose(stepwise[finite], full[finite], atol=1e-4)
    # Suppressed tokens are -inf everywhere; begin-suppressed ones only where the text starts.
    assert np.isneginf(full[0, :, model.spec.suppress_tokens]).all()
    first = len(prompt) - 1
    assert np.isneginf(full[0, first, model.spec.begin_suppress_tokens]).all()
    assert np.isfinite(full[0, first + 1, model.spec.begin_suppress_tokens]).all()
    # Roll back 4 tokens and feed different ones: same as a fresh pass over the new sequence.
    cache.rollback(np.array([seq.shape[1] - 4]))
    assert cache.length == seq.shape[1] - 4 and len(cache.cross_kv) == 2 * model.n_layers
    new = rng.integers(0, 30, (1, 4))
    redo = session.forward(cache, new, np.ones((1, 4), bool), None)
    seq2 = np.concatenate([seq[:, :-4], new], axis=1)
    ref = session.forward(session.new_cache(1), seq2, one(seq2, bool), None)[:, -4:]
    np.testing.assert_allclose(redo[np.isfinite(ref)], ref[np.isfinite(ref)], atol=1e-4)
    with pytest.raises(ValueError, match="no attention mask"):
        session.forward(cache, new, np.array([[True, False, True, True]]), None)


def test_greedy_speculative_equals_target_greedy(pair, features):
    from specsample_cupy.tasks.asr import WhisperSpeculativeDecoder

    dec = WhisperSpeculativeDecoder(pair[0], pair[1], device="cpu")
    audio = np.random.default_rng(3).standard_normal(16000).astype(np.float32) * 0.1
    ref = dec.transcribe(audio, method="target", max_new_tokens=20, temperature=0.0)
    for gamma in (1, 3, 6):
        out = dec.transcribe(audio, method="greedy", gamma=gamma, max_new_tokens=20)
        assert out.token_ids == ref.token_ids
        s = out.stats
        assert len(s["verify_times_s"]) == len(s["accepted_per_round"]) == s["rounds"] > 0
        assert sum(s["accepted_per_round"]) == s["accepted"]
    assert ref.stats["verify_times_s"] == []


def test_sampled_methods_run_and_record_steps(pair):
    from specsample_cupy.tasks.asr import WhisperSpeculativeDecoder

    dec = WhisperSpeculativeDecoder(pair[0], pair[1], device="cpu")
    audio = np.random.default_rng(4).standard_normal(16000).astype(np.float32) * 0.1
    for method in ("baseline", "exact", "sigmoid"):
        out = dec.transcribe(audio, method=method, gamma=4, max_new_tokens=16, seed=2)
        s = out.stats
        assert 0 < len(out.token_ids[0]) <= 16
        assert all(0 <= a <= d for a, d in zip(s["accepted_per_round"], s["draft_lengths"]))
        assert all(t > 0 for t in s["verify_times_s"])
