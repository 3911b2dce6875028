"""Greedy speculative decoding must reproduce target-only greedy decoding token for token."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from models.build_tiny import build_tiny_pair  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402

PROMPTS = ["the rain in spain", "a", "hello there, a test of holes", "dense"]


@pytest.fixture(scope="module")
def decoder(pair):
    return SpeculativeDecoder(*pair, device="cpu")


def _reference(decoder, prompts, n):
    return decoder.generate(prompts, max_new_tokens=n, method="target", temperature=0).token_ids


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_speculative_equals_target_only(decoder, batch, gamma):
    for start in range(0, len(PROMPTS) - batch + 1, 2):
        prompts = PROMPTS[start:start + batch]
        expected = _reference(decoder, prompts, 40)
        out = decoder.generate(prompts, max_new_tokens=40, gamma=gamma, method="greedy")
        assert out.token_ids == expected, (prompts, gamma)
        # Every round gives each active request its accepted drafts and one more token, so the longest
        # request bounds the round count from both sides.
        longest = max(map(len, out.token_ids))
        assert longest - out.stats["accepted"] <= out.stats["rounds"] <= longest
        assert 0.0 < out.stats["acceptance_rate"] <= 1.0


def test_batched_requests_match_single_requests(decoder):
    """Left padding and ragged acceptance must not change any request's tokens."""
    singles = [_reference(decoder, [p], 30)[0] for p in PROMPTS]
    batched = decoder.generate(PROMPTS, max_new_tokens=30, gamma=4, method="greedy")
    assert batched.token_ids == singles


@pytest.mark.parametrize("kv_slack", [0, 1000])
def test_rollback_by_mask_or_by_compaction_gives_same_tokens(pair, kv_slack):
    decoder = SpeculativeDecoder(*pair, device="cpu", kv_slack=kv_slack)
    out = decoder.generate(PROMPTS, max_new_tokens=40, gamma=5, method="greedy")
    assert out.token_ids == _reference(decoder, PROMPTS, 40)
    if kv_slack == 0:
        assert out.stats["kv_compactions"] > 0
    else:
        assert out.stats["kv_compactions"] == 0


def test_exact_at_temperature_zero_and_adaptive_gamma_are_greedy(decoder):
    expected = _reference(decoder, PROMPTS, 32)
    assert decoder.generate(PROMPTS, max_new_tokens=32, gamma=3, method="exact", temperature=0).token_ids == expected
    out = decoder.generate(PROMPTS, max_new_tokens=32, gamma=2, method="greedy", adaptive_gamma=True,
                           gamma_min=1, gamma_max=6)
    assert out.token_ids == expected
    assert 1 <= out.stats["final_gamma"] <= 6


def test_budgets_eos_and_streaming(decoder):
    seen = {}
    out = decoder.generate(PROMPTS, max_new_tokens=7, gamma=5, method="greedy",
                           on_tokens=lambda b, ids: seen.setdefault(b, []).extend(ids))
    for b, ids in enumerate(out.token_ids):
        assert seen.get(b, []) == ids
        assert 1 <= len(ids) <= 7
        eos = [i for i, t in enumerate(ids) if t in decoder.target_spec.eos_token_ids]
        assert not eos or eos[0] == len(ids) - 1   # nothing follows an EOS
        assert out.texts[b] == decoder.tokenizer.decode(ids, skip_special_tokens=True)
    assert out.stats["generated_tokens"] == sum(map(len, out.token_ids))


def test_requests_stop_at_eos_without_disturbing_others(tmp_path):
    # With 16 tokens EOS comes often, so requests finish at different rounds.
    decoder = SpeculativeDecoder(*build_tiny_pair(str(tmp_path), vocab_size=16, seed=1), device="cpu")
    prompts = ["hsao e tlr", "sh", "salei", "at", "odioua", "leucaisrnt"]
    expected = _reference(decoder, prompts, 60)
    stops = sorted(len(ids) for ids in expected if ids[-1] == 0)
    assert len(stops) >= 3 and stops[0] < stops[-1] < 60, "requests should stop at EOS in different rounds"
    for gamma in (2, 5):
        out = decoder.generate(prompts, max_new_tokens=60, gamma=gamma, method="greedy")
        assert out.token_ids == expected
        # Texts of requests that finished early are decoded early: still the text of the final ids.
        assert out.texts == [decoder.tokenizer.decode(ids, skip_special_tokens=True) for ids in expected]


def test_stats_are_consistent(decoder):
    s = decoder.generate(PROMPTS[:2], max_new_tokens=20, gamma=4, temperature=1.0, seed=5).stats
    assert s["proposed"] > 0 and 0 <= s["accepted"] <= s["proposed"]
    assert s["acceptance_rate"] == pytest.approx(s["accepted"] / s["proposed"])
    assert s["wall_s"] >= s["model_time_s"] > 0
    assert s["verify_time_per_round_s"] > 0 and s["host_overhead_per_round_s"] >= 0
    assert s["tokens_per_s"] == pytest.approx(s["generated_tokens"] / s["wall_s"])
    assert np.isfinite(list(v for v in s.values() if isinstance(v, float))).all()
    assert 0 < s["prefill_model_time_s"] <= s["model_time_s"]


def test_untimed_calls_give_the_same_tokens_without_run_timings(pair):
    decoder = SpeculativeDecoder(*pair, device="cpu")
    timed = decoder.generate(PROMPTS[:2], max_new_tokens=20, gamma=4, temperature=1.0, seed=5)
    decoder.time_model_runs = False
    untimed = decoder.generate(PROMPTS[:2], max_new_tokens=20, gamma=4, temperature=1.0, seed=5)
    assert untimed.token_ids == timed.token_ids
    s = untimed.stats
    assert s["model_time_s"] is None and s["verify_time_per_round_s"] is None
    assert s["host_overhead_per_round_s"] is None and s["prefill_model_time_s"] > 0
