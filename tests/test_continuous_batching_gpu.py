"""Continuous batching on CUDA (the host loop with the GPU's kernels): every request gets the tokens
generate() gives it alone (on CUDA that is the device loop), greedy and sampled with its own seed."""
import numpy as np
import pytest

from specsample_cupy.continuous import StreamRequest
from specsample_cupy.decoder import SpeculativeDecoder

pytestmark = pytest.mark.gpu
PROMPTS = ["the sea", "hello there", "a", "def f(x):", "rain", "so it goes", "once upon a time there was"]


@pytest.mark.parametrize("kw", [dict(gamma=3), dict(gamma=4, method="greedy"), dict(gamma=0)],
                         ids=["exact", "greedy", "target-only"])
def test_requests_equal_decoding_each_alone_on_cuda(pair, kw):
    dec = SpeculativeDecoder(*pair, device="cuda")
    rng = np.random.default_rng(3)
    temperature = 0.0 if kw.get("method") == "greedy" else 0.8
    requests = [StreamRequest(PROMPTS[i % len(PROMPTS)], max_new_tokens=int(rng.integers(1, 30)),
                              temperature=temperature, seed=int(rng.integers(1 << 40))) for i in range(11)]
    results = list(dec.generate_stream(requests, 4, **kw))
    assert sorted(r.index for r in results) == list(range(len(requests)))
    for res in results:
        r = requests[res.index]
        alone = dec.generate([r.prompt], max_new_tokens=r.max_new_tokens, temperature=r.temperature, seed=r.seed,
                             **kw)
        assert res.token_ids == alone.token_ids[0], res.index
