"""Continuous batching on CUDA through both ways of prefilling a newcomer: in place (CUDA-graph
sessions' fixed caches) and moved in with KVCache.take_rows (rebinding sessions, CuPy caches); and the
same requests on the GPU and the CPU. (test_continuous_batching_gpu.py compares with the device loop.)"""
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specsample_cupy.decode.continuous import StreamRequest  # noqa: E402
from specsample_cupy.decode.decoder import SpeculativeDecoder  # noqa: E402

from helpers_decode_gpu import GPU_DECODE, PROMPTS  # noqa: E402

pytestmark = GPU_DECODE


def _requests(n, temperature, seed):
    rng = np.random.default_rng(seed)
    return [StreamRequest(PROMPTS[i % len(PROMPTS)] + " x" * (i // len(PROMPTS)), int(rng.integers(2, 40)),
                          temperature, int(rng.integers(1 << 40))) for i in range(n)]


@pytest.mark.parametrize("cuda_graphs", [True, False], ids=["graphs-in-place", "rebinding-take-rows"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_continuous_batching_on_cuda_equals_each_request_alone(pair, cuda_graphs, temperature):
    """Identical tokens unless a float near-tie between batched and single-row model runs flips a
    choice (then that request's continuation differs): allow that for a small fraction."""
    dec = SpeculativeDecoder(*pair, device="cuda", cuda_graphs=cuda_graphs, device_rounds=False)
    requests = _requests(16, temperature, seed=int(temperature * 10) + cuda_graphs)
    results = list(dec.generate_stream(requests, batch_size=5, gamma=4))
    assert sorted(r.index for r in results) == list(range(len(requests)))
    same = []
    for res in results:
        r = requests[res.index]
        alone = dec.generate([r.prompt], max_new_tokens=r.max_new_tokens, gamma=4, temperature=r.temperature,
                             seed=r.seed)
        same.append(alone.token_ids[0] == res.token_ids)
    assert np.mean(same) >= 0.9, f"only {np.mean(same):.0%} of requests equal to their decoding alone"


def test_continuous_batching_on_cuda_matches_the_cpu(pair):
    """The same requests on both devices (same Philox numbers per request): identical tokens up to
    float near-ties."""
    requests = _requests(12, 0.8, seed=3)
    on = {}
    for device in ("cuda", "cpu"):
        dec = SpeculativeDecoder(*pair, device=device)
        on[device] = {r.index: r.token_ids for r in dec.generate_stream(requests, batch_size=4, gamma=3)}
    same = np.mean([on["cuda"][i] == on["cpu"][i] for i in range(len(requests))])
    assert same >= 0.9, f"only {same:.0%} of requests identical on GPU and CPU"
