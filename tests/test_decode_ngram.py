"""Decoding with prompt-lookup drafts (draft="ngram"): exact verification of one-hot drafts."""
import numpy as np
import pytest

from specsample_cupy.decode.decoder import SpeculativeDecoder

# Code that repeats itself: the continuation copies earlier spans, so prompt lookup finds matches.
GROUNDED = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
            "def mul(a, b):\n    return a * b\n\n\ndef ")
PROMPTS = [GROUNDED, "import os\nimport sys\nimport os\nimport "]


def _decoders(device):
    return SpeculativeDecoder(draft="ngram", device=device), SpeculativeDecoder(device=device)


def _greedy_matches_target_only(device):
    ngram, plain = _decoders(device)
    for gamma in (1, 4, "auto"):
        out = ngram.generate(PROMPTS, max_new_tokens=40, gamma=gamma, method="greedy", ignore_eos=True)
        ref = plain.generate(PROMPTS, max_new_tokens=40, method="target", temperature=0.0, ignore_eos=True)
        assert out.token_ids == ref.token_ids, gamma
        assert out.stats["proposed"] > 0 and 0 < out.stats["acceptance_rate"] <= 1
    return out


def test_greedy_ngram_equals_target_only_greedy():
    out = _greedy_matches_target_only("cpu")
    assert out.stats["loop"] == "host"


def test_sampled_ngram_generates_the_budget_and_refuses_draft_model_methods():
    ngram, _ = _decoders("cpu")
    out = ngram.generate(PROMPTS, max_new_tokens=24, gamma=5, method="exact", temperature=1.0, seed=3,
                         ignore_eos=True)
    assert [len(t) for t in out.token_ids] == [24, 24]
    assert out.stats["accepted"] <= out.stats["proposed"]
    for method in ("sigmoid", "sigmoid-paper", "baseline"):
        with pytest.raises(ValueError, match="one-hot"):
            ngram.generate(PROMPTS, max_new_tokens=4, method=method)
    with pytest.raises(ValueError, match="ngram_min"):
        SpeculativeDecoder(draft="ngram", device="cpu", ngram_min=3, ngram_max=2)


def test_ngram_proposals_respect_the_budget_at_every_round():
    ngram, _ = _decoders("cpu")
    for budget in (1, 2, 5):
        out = ngram.generate([GROUNDED], max_new_tokens=budget, gamma=8, method="greedy", ignore_eos=True)
        assert len(out.token_ids[0]) == budget


@pytest.mark.gpu
def test_greedy_ngram_equals_target_only_greedy_on_the_device_loop():
    out = _greedy_matches_target_only("cuda")
    assert out.stats["loop"] == "device", out.stats["device_rounds"]


@pytest.mark.gpu
def test_ngram_device_loop_equals_host_loop():
    """The same proposals, verification and random numbers on both loops: the same tokens, sampled too
    (up to float near-ties, absent at this size), and the same proposed/accepted counts."""
    device = SpeculativeDecoder(draft="ngram", device="cuda")
    host = SpeculativeDecoder(draft="ngram", device="cuda", device_rounds=False)
    for kw in (dict(method="greedy"), dict(method="exact", temperature=1.0, seed=5)):
        a = device.generate(PROMPTS, max_new_tokens=48, gamma=5, ignore_eos=True, **kw)
        b = host.generate(PROMPTS, max_new_tokens=48, gamma=5, ignore_eos=True, **kw)
        assert a.stats["loop"] == "device" and b.stats["loop"] == "host"
        counts = [(o.stats["rounds"], o.stats["proposed"], o.stats["accepted"]) for o in (a, b)]
        assert a.token_ids == b.token_ids, (kw, counts, a.token_ids, b.token_ids)
        assert counts[0] == counts[1], (kw, counts)
