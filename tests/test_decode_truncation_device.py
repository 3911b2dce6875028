"""Truncated sampling (top_k / top_p / min_p) on the device loop: before each sampling kernel the
sampled rows' thresholds come from warp_rows.cu (warp_rows_launch.RowWarps), the samplers race over the kept
entries only, and verify() gets the same truncation, so the device loop gives the host loop's tokens
(but for float near-ties, as in test_decode_device); and log-probabilities on the device loop."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime")


from helpers_decode_gpu import GPU_DECODE, PROMPTS, on_device, on_host, same_fraction  # noqa: E402,F401

pytestmark = GPU_DECODE


@pytest.mark.parametrize("kwargs", [
    dict(max_new_tokens=40, gamma=4, method="exact", temperature=0.9, seed=7, top_k=5),
    dict(max_new_tokens=40, gamma=3, method="exact", temperature=1.0, seed=8, top_p=0.8),
    dict(max_new_tokens=33, gamma=2, method="exact", temperature=0.7, seed=9, top_k=10, min_p=0.1),
    dict(max_new_tokens=40, gamma=0, method="target", temperature=0.8, seed=10, top_p=0.7, min_p=0.05),
    dict(max_new_tokens=40, gamma=3, method="exact", temperature=1.2, seed=11, top_k=6, top_p=0.9, min_p=0.02),
])
def test_truncation_on_the_device_loop_gives_the_host_loops_tokens(on_device, on_host, kwargs):
    prompts = PROMPTS * 3
    dev = on_device.generate(prompts, **kwargs)
    host = on_host.generate(prompts, **kwargs)
    assert dev.stats["loop"] == "device" and dev.stats["device_rounds"] is True
    assert host.stats["loop"] == "host"
    assert same_fraction(dev.token_ids, host.token_ids) >= 0.9, kwargs
    for ids in dev.token_ids:
        assert all(0 <= t < on_device.target.vocab_size for t in ids)


@pytest.mark.parametrize("gamma", [0, 3])
def test_top_k_1_on_the_device_loop_is_greedy(on_device, gamma):
    prompts = PROMPTS * 2
    method = "exact" if gamma else "target"
    greedy = on_device.generate(prompts, max_new_tokens=24, gamma=gamma, method="greedy" if gamma else "target",
                                temperature=0)
    top1 = on_device.generate(prompts, max_new_tokens=24, gamma=gamma, method=method, temperature=1.0, top_k=1,
                              seed=5)
    assert top1.stats["loop"] == "device"
    assert top1.token_ids == greedy.token_ids


@pytest.mark.parametrize("kwargs", [
    dict(gamma=3, method="exact", temperature=0.8, seed=2, top_k=5),
    dict(gamma=3, method="exact", temperature=1.0, seed=3),
    dict(gamma=0, method="target", temperature=0.9, seed=4),
    dict(gamma=0, method="target", temperature=0.7, seed=5, top_p=0.8),
    dict(gamma=4, method="greedy"),
    dict(gamma=0, method="target", temperature=0),
])
def test_logprobs_on_the_device_loop_equal_the_host_loops(on_device, on_host, kwargs):
    """One finite log-probability <= 0 per token, written beside each round's report (speculative
    rounds: verify()'s; target steps: from the row's warp_rows record), equal to the host loop's
    where the tokens are the same."""
    prompts = PROMPTS * 2
    dev = on_device.generate(prompts, max_new_tokens=24, logprobs=True, **kwargs)
    host = on_host.generate(prompts, max_new_tokens=24, logprobs=True, **kwargs)
    assert dev.stats["loop"] == "device" and host.stats["loop"] == "host"
    assert same_fraction(dev.token_ids, host.token_ids) >= 0.9, kwargs
    for a, b, ids_a, ids_b in zip(dev.logprobs, host.logprobs, dev.token_ids, host.token_ids):
        assert len(a) == len(ids_a) and all(np.isfinite(a)) and max(a) <= 1e-6
        if ids_a == ids_b:
            np.testing.assert_allclose(a, b, atol=2e-3)
