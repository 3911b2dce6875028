"""Continuous batching on CUDA runs the device loop (device_loop.DeviceRounds.refill(): rows refilled
behind the round in flight): every request gets the tokens generate() gives it alone (also the device loop), greedy
and sampled with its own seed and temperature, with truncation and log-probabilities, through
target steps and prompt lookup."""
import numpy as np
import pytest

from specsample_cupy.decode.continuous import StreamRequest
from specsample_cupy.decode.decoder import SpeculativeDecoder

from helpers_decode_gpu import GPU_DECODE

pytestmark = GPU_DECODE
PROMPTS = ["the sea", "hello there", "a", "def f(x):", "rain", "so it goes", "once upon a time there was"]


def _requests(n, temperatures, seed):
    rng = np.random.default_rng(seed)
    return [StreamRequest(PROMPTS[i % len(PROMPTS)], max_new_tokens=int(rng.integers(1, 30)),
                          temperature=float(rng.choice(temperatures)), seed=int(rng.integers(1 << 40)))
            for i in range(n)]


def _each_alone(dec, requests, results, **kw):
    """Compare each finished request with generate() on it alone: tokens equal; log-probabilities
    (when asked for) equal to float32 rounding."""
    assert sorted(r.index for r in results) == list(range(len(requests)))
    for res in results:
        r = requests[res.index]
        alone = dec.generate([r.prompt], max_new_tokens=r.max_new_tokens, temperature=r.temperature, seed=r.seed,
                             **kw)
        assert alone.stats["loop"] == "device"
        assert res.token_ids == alone.token_ids[0], res.index
        if kw.get("logprobs"):
            np.testing.assert_allclose(res.logprobs, alone.logprobs[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw, temperatures", [
    (dict(gamma=3), [0.0, 0.6, 1.0]),                  # per-row temperatures, greedy rows among them
    (dict(gamma=4, method="greedy"), [0.0]),
    (dict(gamma=0), [0.0, 0.8]),
    (dict(gamma=3, top_p=0.8, top_k=20, logprobs=True), [0.7, 1.0]),
    (dict(gamma=0, min_p=0.05, logprobs=True), [0.0, 0.9]),
], ids=["exact", "greedy", "target-only", "exact-truncated-logprobs", "target-only-min-p-logprobs"])
def test_continuous_batching_on_the_device_loop_equals_each_request_alone(pair, kw, temperatures):
    dec = SpeculativeDecoder(*pair, device="cuda")
    requests = _requests(11, temperatures, seed=3)
    stream = dec.generate_stream(requests, 4, **kw)
    results = list(stream)
    assert stream.stats["loop"] == "device"
    assert stream.stats["refills"] == len(requests) - 4
    _each_alone(dec, requests, results, **kw)


def test_prompt_lookup_continuous_batching_on_the_device_loop(pair):
    dec = SpeculativeDecoder(pair[0], "ngram", device="cuda")
    requests = _requests(9, [0.0, 0.9], seed=5)
    stream = dec.generate_stream(requests, 3, gamma=3)
    results = list(stream)
    assert stream.stats["loop"] == "device"
    _each_alone(dec, requests, results, gamma=3)


def test_stop_strings_end_rows_that_are_refilled_on_the_device_loop(pair):
    """A stop string ends a request mid-segment; its row takes the next request, as on the host loop."""
    dec = SpeculativeDecoder(*pair, device="cuda")
    host = SpeculativeDecoder(*pair, device="cuda", device_rounds=False)
    requests = _requests(10, [0.8], seed=7)
    texts = [r.text for r in dec.generate_stream(requests, 3, gamma=3) if len(r.text) > 4]
    stop = sorted({t[2:4] for t in texts[:3]})   # each ends at least one request early
    by_loop = {}
    for name, d in (("device", dec), ("host", host)):
        stream = d.generate_stream(requests, 3, gamma=3, stop=stop)
        by_loop[name] = {r.index: (r.token_ids, r.finish_reason) for r in stream}
        assert stream.stats["loop"] == name
    assert by_loop["device"] == by_loop["host"]
    assert any(reason == "stop" for _, reason in by_loop["device"].values())


def test_truncation_starts_when_the_first_sampled_request_takes_a_row(pair):
    """The first rows are greedy, so min-p truncates nothing and the loop starts without warps;
    sampled requests that come later are truncated from their refill on, drafts included."""
    dec = SpeculativeDecoder(*pair, device="cuda")
    requests = _requests(10, [0.9], seed=11)
    for r in requests[:3]:
        r.temperature = 0.0
    kw = dict(gamma=3, min_p=0.1)
    stream = dec.generate_stream(requests, 3, **kw)
    results = list(stream)
    assert stream.stats["loop"] == "device"
    _each_alone(dec, requests, results, **kw)
