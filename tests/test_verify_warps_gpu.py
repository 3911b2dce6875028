"""Truncated sampling on the GPU (kernels_cu/warp_rows.cu and verify_kernel's warped mode) against
the NumPy reference (specsample_cupy/verification/truncation.py): the thresholds row by row, the verification results
per configuration, and chi-square of the first emitted token at realistic vocabulary sizes (several
blocks per row, fixed seeds, fail below p = 1e-4)."""
import numpy as np
import pytest

from helpers_verify import merged_chisquare
from specsample_cupy import verify
from specsample_cupy.verification.truncation import make_warps, row_thresholds

pytestmark = pytest.mark.gpu
P_MIN = 1e-4
CONFIGS = {
    "top_k": dict(top_k=50),
    "top_p": dict(top_p=0.9),
    "min_p": dict(min_p=0.05),
    "k+p": dict(top_k=200, top_p=0.8),
    "k+p+min_p": dict(top_k=100, top_p=0.95, min_p=0.02),
}


def _rows(rng, B, G, V, dtype, ties):
    target = (rng.normal(size=(B, G + 1, V)) * 2).astype(np.float32)
    draft = (0.8 * target[:, :G] + 0.4 * rng.normal(size=(B, G, V))).astype(np.float32)
    if ties:   # a coarse grid of values: many entries tie at every threshold
        target, draft = np.round(target * 2) / 2, np.round(draft * 2) / 2
    return draft.astype(dtype), target.astype(dtype)


@pytest.mark.parametrize("V", [1000, 32000, 151936])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("ties", [False, True])
def test_row_thresholds_match_the_reference(V, dtype, config, ties):
    """The record warp_rows.cu writes for every active row: the same max, the same dmax (the kept
    set), and the kept mass, as the reference computes them from the same float32 rows."""
    import cupy as cp
    from specsample_cupy.verification import kernel_launch as kernels
    rng = np.random.default_rng(V + len(config) + 7 * ties)
    B, G, T = 4, 3, 0.8
    draft, target = _rows(rng, B, G, V, dtype, ties)
    tokens = rng.integers(0, V, (B, G)).astype(np.int32)
    kw = CONFIGS[config]
    args = (cp.asarray(tokens), cp.asarray(draft), cp.asarray(target))
    # logprobs=True: warp_rows.cu runs for min-p alone too (without it min-p is fused into verify.cu)
    verify(*args, temperature=T, seed=1, logprobs=True, **kw).accepted.get()
    plan, _ = kernels._plan(args[0], args[1], args[2], dtype, kernels.MODE_WARPED, None)
    record = plan.record.get().reshape(B, 2 * G + 1, kernels.WARP_RECORD)
    rows = np.concatenate([target, draft], 1).astype(np.float32)          # verify.cu's row order
    warps = make_warps(np, B, V, None, T, **kw)
    per_row = warps.select(np.repeat(np.arange(B), 2 * G + 1))
    M, dmax = row_thresholds(rows.reshape(-1, V), np.full(B * (2 * G + 1), T), per_row)
    np.testing.assert_array_equal(record[..., 3].ravel(), M)
    got = record[..., 4].ravel()
    # top-p thresholds are found from float32 sums on the GPU and float64 sums here: a row may
    # differ where the cumulative mass crosses top_p within rounding of a boundary; no more than one.
    differ = np.flatnonzero(got != dmax)
    assert differ.size <= (1 if "top_p" in kw else 0), (config, differ, got[differ], dmax[differ])
    d = np.subtract(M[:, None], rows.reshape(-1, V))
    kept = d <= got[:, None]
    mass = np.where(kept, np.exp(-d.astype(np.float64) / T), 0.0).sum(-1)
    np.testing.assert_allclose(record[..., 1].ravel(), mass, rtol=2e-4)


@pytest.mark.parametrize("V", [3000, 32000])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("config", list(CONFIGS) + ["mixed"])
def test_kernel_matches_reference_per_configuration(V, dtype, config):
    """>= 99.9 % of requests give identical results (tokens, accepted, errors), ragged lengths,
    temperatures 1 and 0.7 and greedy mixed, one-hot drafts too."""
    import cupy as cp
    rng = np.random.default_rng(V + 13 * len(config))
    B, G = 96, 4
    same = total = 0
    for call in range(4):
        draft, target = _rows(rng, B, G, V, dtype, ties=call == 3)
        tokens = rng.integers(0, V, (B, G)).astype(np.int32)
        lengths = rng.integers(0, G + 1, B).astype(np.int32)
        temps = rng.choice(np.array([1.0, 0.7, 0.0], np.float32), B)
        if config == "mixed":   # per-request values, some off
            kw = dict(top_k=rng.choice([0, 5, 300], B).astype(np.int32),
                      top_p=rng.choice([1.0, 0.5, 0.9], B).astype(np.float32),
                      min_p=rng.choice([0.0, 0.1], B).astype(np.float32))
        else:
            kw = CONFIGS[config]
        onehot = call == 2
        cpu = verify(tokens, None if onehot else draft, target, temperature=temps, draft_lengths=lengths,
                     seed=call, offset=3, **kw)
        gkw = {k: cp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
        gpu = verify(cp.asarray(tokens), None if onehot else cp.asarray(draft), cp.asarray(target),
                     temperature=cp.asarray(temps), draft_lengths=cp.asarray(lengths), seed=call, offset=3, **gkw)
        assert (gpu.error.get() == cpu.error).all()
        same += int(((gpu.accepted.get() == cpu.accepted) & (gpu.tokens.get() == cpu.tokens).all(1)).sum())
        total += B
    assert same >= 0.999 * total or total - same <= 1, (same, total)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_first_token_follows_the_warped_target(config, temperature):
    """Drafts sampled from the warped draft (sample_tokens with the same warps), V = 32000 (several
    blocks per row): the first emitted token follows the warped target; nothing outside the kept
    set is ever emitted. 200,000 draws."""
    import cupy as cp
    from specsample_cupy import sample_tokens
    rng = np.random.default_rng(len(config) + int(10 * temperature))
    V, G, B, calls = 32000, 2, 20_000, 10
    row_t = (rng.normal(size=(G + 1, V)) * 2.5).astype(np.float32)
    row_d = (0.7 * row_t[:G] + 0.8 * rng.normal(size=(G, V))).astype(np.float32)
    kw = CONFIGS[config]
    warps = make_warps(np, 1, V, None, temperature, **kw)
    M, dmax = row_thresholds(row_t[:1], np.array([temperature]), warps)
    d = M[0] - row_t[0]
    p0 = np.where(d <= dmax[0], np.exp(-d.astype(np.float64) / temperature), 0.0)
    p0 /= p0.sum()
    target = cp.asarray(np.broadcast_to(row_t, (B, G + 1, V)).copy())
    draft = cp.asarray(np.broadcast_to(row_d, (B, G, V)).copy())
    counts = np.zeros(V, np.int64)
    for call in range(calls):
        tokens = cp.stack([sample_tokens(draft[:, i], temperature=temperature, seed=100 + call, offset=i, **kw)
                           for i in range(G)], 1)
        res = verify(tokens, draft, target, temperature=temperature, seed=call, offset=7, **kw)
        counts += np.bincount(res.tokens[:, 0].get(), minlength=V)
    assert counts[p0 == 0].sum() == 0
    assert merged_chisquare(counts, p0) >= P_MIN


@pytest.mark.parametrize("config", list(CONFIGS))
def test_prebuilt_warps_equal_the_per_call_ones(config):
    """verify(warps=build_warps(cupy, ...)) and sample_tokens(warps=...) on CuPy give what the calls that
    build their warps from top_k / top_p / min_p give, bit for bit (the decode loop's path)."""
    import cupy as cp
    from specsample_cupy import sample_tokens
    from specsample_cupy.verification.truncation import build_warps
    rng = np.random.default_rng(len(config))
    B, G, V = 8, 3, 3000
    draft, target = (cp.asarray(a) for a in _rows(rng, B, G, V, "float32", False))
    tokens = cp.asarray(rng.integers(0, V, (B, G)).astype(np.int32))
    kw = CONFIGS[config]
    for temperature in (0.8, cp.asarray(np.float32([1.0, 0.0, 0.5, 1.3, 0.7, 0.9, 0.0, 1.0]))):
        warps = build_warps(cp, B, V, temperature, **kw)
        for d in (draft, None):
            common = dict(temperature=temperature, seed=3, offset=1, logprobs=True)
            per_call = verify(tokens, d, target, **common, **kw).to_host()
            prebuilt = verify(tokens, d, target, warps=warps, **common).to_host()
            np.testing.assert_array_equal(prebuilt.packed, per_call.packed)
            np.testing.assert_array_equal(prebuilt.logprobs, per_call.logprobs)
        z = target[:, 0]
        np.testing.assert_array_equal(sample_tokens(z, temperature=temperature, seed=2, warps=warps).get(),
                                      sample_tokens(z, temperature=temperature, seed=2, **kw).get())
