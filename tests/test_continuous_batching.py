"""Continuous batching (SpeculativeDecoder.generate_stream) on the CPU: every request gets the tokens
generate() gives it alone (greedy and sampled with its own seed), whatever the rows around it; rows
are refilled as requests finish by length, EOS, the context's end or a stop string."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specsample_cupy.decode import continuous  # noqa: E402
from specsample_cupy.decode.continuous import StreamRequest  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402

PROMPTS = ["the sea", "hello there", "a", "def f(x):", "rain", "so it goes", "once upon a time there was",
           "x = 1", "what now", "zz"]


@pytest.fixture(scope="module")
def dec(pair):
    return SpeculativeDecoder(*pair, device="cpu")


@pytest.fixture(scope="module")
def eos_dec(tmp_path_factory):
    """A pair whose 16-token vocabulary makes EOS (id 0) frequent, and whose context is short."""
    from models.build_tiny import build_tiny_pair
    return SpeculativeDecoder(*build_tiny_pair(str(tmp_path_factory.mktemp("eos")), vocab_size=16, seed=5,
                                               n_positions=40), device="cpu")


def _requests(n, temperature, rng):
    """n requests of mixed prompts, budgets and seeds."""
    return [StreamRequest(PROMPTS[i % len(PROMPTS)] + " ." * (i // len(PROMPTS)),
                          max_new_tokens=int(rng.integers(1, 30)), temperature=temperature, seed=int(rng.integers(1 << 40)))
            for i in range(n)]


def _alone(dec, r, **kw):
    out = dec.generate([r.prompt], max_new_tokens=r.max_new_tokens, temperature=r.temperature, seed=r.seed, **kw)
    return out.token_ids[0], out.texts[0], out.finish_reasons[0]


def _check_against_alone(dec, requests, batch_size, **kw):
    """Decode the requests continuously; every result must equal its request decoded alone. Returns the
    results in the order they came."""
    stream = dec.generate_stream(requests, batch_size, **kw)
    results = list(stream)
    assert sorted(r.index for r in results) == list(range(len(requests)))
    rows = min(batch_size, len(requests))
    assert stream.stats["rows"] == rows and stream.stats["refills"] == len(requests) - rows
    assert stream.stats["request_rounds"] == sum(r.stats["rounds"] for r in results)
    assert stream.stats["loop"] == "host"   # the CPU runs the host loop
    for res in results:
        expected = _alone(dec, requests[res.index], **kw)
        assert (res.token_ids, res.text, res.finish_reason) == expected, res.index
        assert res.stats["new_tokens"] == len(res.token_ids)
    return results


@pytest.mark.parametrize("kw", [dict(gamma=3), dict(gamma=4, method="greedy"), dict(gamma=0)],
                         ids=["exact", "greedy", "target-only"])
def test_greedy_requests_equal_decoding_each_alone(dec, kw):
    rng = np.random.default_rng(0)
    requests = _requests(11, 0.0, rng)
    results = _check_against_alone(dec, requests, batch_size=4, **kw)
    # Rows were refilled: requests finished out of input order.
    assert [r.index for r in results] != list(range(len(requests)))
    # Greedy tokens do not depend on the batch: the same as one static generate() call.
    batch = dec.generate([r.prompt for r in requests], max_new_tokens=30, temperature=0, **kw)
    for res in results:
        n = requests[res.index].max_new_tokens
        assert res.token_ids == batch.token_ids[res.index][:n]


@pytest.mark.parametrize("kw", [dict(gamma=3), dict(gamma=5, method="sigmoid"), dict(gamma=0, method="target")],
                         ids=["exact", "sigmoid", "target-only"])
def test_sampled_requests_with_their_own_seeds_equal_decoding_each_alone(dec, kw):
    rng = np.random.default_rng(1)
    requests = _requests(12, 0.8, rng)
    requests[3].temperature, requests[7].temperature = 1.3, 0.5   # settings differ per request too
    _check_against_alone(dec, requests, batch_size=3, **kw)


def test_a_request_draws_the_same_tokens_in_any_batch(dec):
    """The same sampled request among other requests, in another row, at another batch size: the same
    tokens (its random numbers are keyed by its own seed and rounds, not by row or round)."""
    rng = np.random.default_rng(2)
    probe = StreamRequest("once upon a time", max_new_tokens=25, temperature=0.8, seed=1234)
    seen = []
    for batch_size, before in ((1, 0), (2, 3), (5, 4), (8, 7)):
        requests = _requests(before, 0.8, rng) + [probe] + _requests(3, 0.8, rng)
        out = {r.index: r for r in dec.generate_stream(requests, batch_size, gamma=4)}
        seen.append(out[before].token_ids)
    assert all(ids == seen[0] for ids in seen) and len(seen[0]) == 25


def test_eos_and_the_context_end_finish_requests_mid_batch(eos_dec):
    rng = np.random.default_rng(3)
    requests = [StreamRequest(p, max_new_tokens=int(rng.integers(5, 60)), temperature=t, seed=i)
                for i, (p, t) in enumerate(zip(PROMPTS * 2, [0.0, 0.9] * 10))]
    results = _check_against_alone(eos_dec, requests, batch_size=3, gamma=3)
    reasons = {r.finish_reason for r in results}
    assert {"eos", "length", "context"} <= reasons, reasons


def test_stop_strings_finish_requests_mid_batch(dec):
    rng = np.random.default_rng(4)
    requests = _requests(9, 0.0, rng)
    for r in requests:
        r.max_new_tokens = 30
    texts = [_alone(dec, r, gamma=3)[1] for r in requests]
    stop = next(t[5:7] for t in texts if len(t) > 10)
    results = _check_against_alone(dec, requests, batch_size=3, gamma=3, stop=[stop])
    assert "stop" in {r.finish_reason for r in results}
    assert all(stop not in r.text for r in results)


def test_requests_with_nothing_to_generate_and_more_rows_than_requests(dec):
    requests = [StreamRequest("the sea", 0), StreamRequest("rain", 6, 0.0), StreamRequest("a", 0),
                StreamRequest("zz", 3, 0.7, 9)]
    results = list(dec.generate_stream(requests, batch_size=16, gamma=2))
    by_index = {r.index: r for r in results}
    assert sorted(by_index) == [0, 1, 2, 3]
    for i in (0, 2):
        assert (by_index[i].text, by_index[i].token_ids, by_index[i].finish_reason) == ("", [], "length")
    assert by_index[1].token_ids == _alone(dec, requests[1], gamma=2)[0]
    only_empty = list(dec.generate_stream([StreamRequest("a", 0)] * 3, batch_size=2))
    assert [r.index for r in only_empty] == [0, 1, 2]


@pytest.mark.parametrize("gamma", [3, 0])
def test_logprobs_equal_decoding_each_alone(dec, gamma):
    """Each request's log-probabilities (with truncation, per-request temperatures, a stop string and a
    request with nothing to generate) are those generate() gives it alone, one per token."""
    rng = np.random.default_rng(6)
    requests = _requests(8, 0.8, rng)
    requests[2].temperature, requests[5].temperature = 0.0, 1.3
    kw = dict(gamma=gamma, top_k=20, min_p=0.05)
    stop = next(t[5:7] for t in (_alone(dec, r, **kw)[1] for r in requests) if len(t) > 10)
    kw["stop"] = [stop]
    results = _check_against_alone(dec, requests, batch_size=3, logprobs=True, **kw)
    for res in results:
        r = requests[res.index]
        alone = dec.generate([r.prompt], max_new_tokens=r.max_new_tokens, temperature=r.temperature, seed=r.seed,
                             logprobs=True, **kw).logprobs[0]
        assert len(res.logprobs) == len(res.token_ids) == len(alone)
        np.testing.assert_allclose(res.logprobs, alone, rtol=1e-5, atol=1e-5)
    assert any(r.finish_reason == "stop" for r in results)
    empty = list(dec.generate_stream([StreamRequest("rain", 0), requests[0]], batch_size=2, logprobs=True, **kw))
    assert empty[0].logprobs == [] and len(empty[1].logprobs) == len(empty[1].token_ids)
    assert all(r.logprobs is None for r in dec.generate_stream(requests[:3], batch_size=2, gamma=gamma))


def test_prefill_in_place_gives_the_same_tokens(dec, monkeypatch):
    """Caches that cannot take rows (CUDA-graph sessions) prefill a newcomer in its own row."""
    monkeypatch.setattr(continuous, "takes_rows", lambda caches: False)
    rng = np.random.default_rng(5)
    _check_against_alone(dec, _requests(8, 0.8, rng), batch_size=3, gamma=3)


def test_prompt_lookup_drafts(pair):
    ngram = SpeculativeDecoder(pair[0], "ngram", device="cpu")
    rng = np.random.default_rng(6)
    requests = _requests(7, 0.8, rng)
    for r in requests:
        r.prompt = (r.prompt + " ") * 3
    _check_against_alone(ngram, requests, batch_size=3, gamma=4)


def test_refusals_name_the_argument(dec):
    with pytest.raises(ValueError, match="fixed gamma"):
        dec.generate_stream(["a"], gamma="auto")
    with pytest.raises(ValueError, match="baseline"):
        dec.generate_stream(["a"], method="baseline")
    with pytest.raises(ValueError, match="batch_size"):
        dec.generate_stream(["a"], batch_size=0)
    with pytest.raises(ValueError, match="request 1: temperature"):
        dec.generate_stream([StreamRequest("a"), StreamRequest("b", temperature=-1)])
    with pytest.raises(ValueError, match="request 0: method 'sigmoid' needs temperature > 0"):
        dec.generate_stream([StreamRequest("a", temperature=0)], method="sigmoid")
    with pytest.raises(ValueError, match="no requests"):
        dec.generate_stream([])
    with pytest.raises(ValueError, match="the models' context holds"):
        dec.generate_stream(["x" * 300])


def test_the_decoder_is_busy_until_the_stream_ends(dec):
    results = dec.generate_stream([StreamRequest("the sea", 8, 0.0), StreamRequest("rain", 20, 0.0)], 1)
    first = next(results)
    with pytest.raises(RuntimeError, match="already generating"):
        dec.generate(["a"], max_new_tokens=2)
    rest = list(results)
    assert [first.index] + [r.index for r in rest] == [0, 1]
    assert dec.generate(["a"], max_new_tokens=2).token_ids   # free again
