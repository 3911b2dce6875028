"""SamplingSettings: one checked object for a call's sampling, whose keyword arguments are exactly what
generate(), generate_stream() and verify() take, and whose record is an output line's "settings"."""
import dataclasses
import inspect

import numpy as np
import pytest

from specsample_cupy import SamplingSettings, verify
from specsample_cupy.settings import RECORDED


def test_defaults_are_generates():
    s = SamplingSettings()
    assert (s.method, s.temperature, s.gamma, s.seed, s.max_new_tokens, s.stop) == ("exact", 1.0, 5, 0, 64, ())
    assert SamplingSettings(method="greedy").temperature == 0.0   # None resolves by generate()'s rule


def test_frozen_and_replace_checks_again():
    s = SamplingSettings(stop="\n\n")
    assert s.stop == ("\n\n",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.method = "greedy"
    assert s.replace(seed=7).seed == 7
    with pytest.raises(ValueError, match="temperature"):
        s.replace(temperature=-1.0)


@pytest.mark.parametrize("bad, match", [
    (dict(method="nucleus"), "method"),
    (dict(method="greedy", temperature=0.7), "greedy"),
    (dict(method="sigmoid", temperature=0.0), "greedy"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(gamma=-1), ">= 0"),
    (dict(gamma="sometimes"), "gamma"),
    (dict(gamma=True), "gamma"),
    (dict(max_new_tokens=-1), ">= 0"),
    (dict(max_new_tokens=2.5), "max_new_tokens"),
    (dict(top_k=-1), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(min_p=2.0), "min_p"),
    (dict(stop=[""]), "empty"),
    (dict(seed="random"), "seed"),
    (dict(logprobs="yes"), "logprobs"),
    (dict(gamma_max=-2), "gamma_max"),
])
def test_refusals_name_the_field(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SamplingSettings(**bad)


def test_stop_must_be_strings():
    with pytest.raises(TypeError, match="str"):
        SamplingSettings(stop=[3])


def test_record_round_trip():
    s = SamplingSettings(method="exact", temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, seed=11, gamma="auto",
                         stop=("###", "\n\n"), max_new_tokens=32)
    record = s.record()
    assert tuple(record) == RECORDED
    assert record["stop"] == ["###", "\n\n"] and record["gamma"] == "auto"
    assert SamplingSettings.from_record(record) == s
    assert SamplingSettings.from_record(record, logprobs=True) == s.replace(logprobs=True)


def test_the_run_record_holds_it_in_its_order(tmp_path):
    from specsample_cupy.batch.run_settings import run_settings
    target = tmp_path / "target"
    target.mkdir()
    (target / "model.onnx").write_bytes(b"x")
    s = SamplingSettings(seed=3, stop=("x",))
    record = run_settings(sampling=s, seed_origin="option", target=target, draft="ngram", ngram_min=1,
                          ngram_max=4)
    assert list(record)[:len(RECORDED) + 2] == list(RECORDED) + ["seed_rule", "seed_origin"]
    assert SamplingSettings.from_record(record) == s


def test_generate_and_stream_take_its_keywords():
    pytest.importorskip("onnxruntime")
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    s = SamplingSettings()
    assert set(s.generate_kwargs()) <= set(inspect.signature(SpeculativeDecoder.generate).parameters)
    assert set(s.stream_kwargs()) <= set(inspect.signature(SpeculativeDecoder.generate_stream).parameters)


def test_verify_takes_its_keywords():
    rng = np.random.default_rng(0)
    B, G, V = 2, 3, 50
    draft_logits = rng.standard_normal((B, G, V)).astype(np.float32)
    target_logits = rng.standard_normal((B, G + 1, V)).astype(np.float32)
    tokens = rng.integers(0, V, (B, G)).astype(np.int32)
    s = SamplingSettings(temperature=0.7, top_k=10, seed=5)
    by_settings = verify(tokens, draft_logits, target_logits, **s.verify_kwargs())
    by_keywords = verify(tokens, draft_logits, target_logits, method="exact", temperature=0.7, seed=5, top_k=10)
    assert np.array_equal(by_settings.tokens, by_keywords.tokens)
    with pytest.raises(ValueError, match="target"):
        SamplingSettings(method="target").verify_kwargs()


def test_generate_takes_the_settings_object():
    """generate(settings=...) and generate_stream(settings=...) give what the same keywords give."""
    from specsample_cupy import SamplingSettings
    from specsample_cupy.decode.decoder import SpeculativeDecoder
    decoder = SpeculativeDecoder(device="cpu")
    settings = SamplingSettings(method="exact", temperature=0.8, top_k=50, seed=11, gamma=3, max_new_tokens=12,
                                ignore_eos=True)
    prompts = ["def f(x):", "import os\n"]
    by_object = decoder.generate(prompts, settings=settings)
    by_keywords = decoder.generate(prompts, method="exact", temperature=0.8, top_k=50, seed=11, gamma=3,
                                   max_new_tokens=12, ignore_eos=True)
    assert by_object.token_ids == by_keywords.token_ids
    stream = sorted((r.index, r.token_ids) for r in decoder.generate_stream(prompts, batch_size=2, settings=settings))
    keywords = sorted((r.index, r.token_ids) for r in decoder.generate_stream(
        prompts, batch_size=2, method="exact", top_k=50, seed=11, gamma=3, ignore_eos=True))
    assert stream == keywords
