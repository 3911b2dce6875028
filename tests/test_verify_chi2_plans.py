"""Exactness of the kernel at realistic vocabularies, with the work split across blocks.

For each configuration the launch plan is forced (kernels.PlanOptions) to several vocabulary slices
per row (P1) and several P2 blocks per request, in both item orders (all rows, and the walk that
stops at each request's first rejection), so the statistics are combined across blocks and the
race is won across blocks. Two checks per configuration:

* chi-square: every request shares one target/draft pair; the draft proposes x_i ~ q_i (sampled on
  the host), lengths are ragged, and the first emitted token must follow the exact closed form
  (analysis.first_token_distribution, equal to softmax(target_0 / T)). 2^18 draws (512 requests x
  512 calls, a new Philox offset per call), bins merged smallest-expected first until each expects
  >= 5 draws; the test fails when the p-value is < 1e-3. Fixed seeds: the outcome is reproducible.
* agreement: on independent random requests, the kernel's tokens and accepted counts equal the
  NumPy reference's (same Philox numbers) for all but float near-ties: at most max(1, 1 %) of the
  requests may differ, counted for this configuration alone.
"""
import numpy as np
import pytest

from helpers_verify import merged_chisquare, random_problem, softmax
from specsample_cupy import verify
from specsample_cupy.verification.analysis import first_token_distribution

pytestmark = pytest.mark.gpu

P_MIN = 1e-3
CALLS, BATCH = 512, 512

# (V, dtype, p1_sweeps, p2_sweeps, temperature, gamma); a sweep is 256 threads x (16 bytes / itemsize)
# elements, or 256 elements when V is not a multiple of the vector width (scalar loads).
CONFIGS = {
    "V32000-f32-32x32slices": (32000, "float32", 1, 1, 1.0, 3),
    "V32000-f32-8x16slices": (32000, "float32", 4, 2, 0.8, 3),
    "V32000-f32-2x4slices": (32000, "float32", 16, 8, 1.0, 2),
    "V32000-f16-6x4slices": (32000, "float16", 3, 5, 0.8, 3),          # last P1 slice short
    "V32003-f32-scalar-13x18slices": (32003, "float32", 10, 7, 1.0, 3),
    "V151936-f32-5x3slices": (151936, "float32", 30, 50, 1.0, 2),
}


def _plan(cfg, walk):
    from specsample_cupy.verification.kernel_launch import PlanOptions
    V, dtype, p1, p2, T, G = CONFIGS[cfg]
    return PlanOptions(p1_sweeps=p1, p2_sweeps=p2, walk=walk)


def _expected_slices(cfg):
    V, dtype, p1, p2, T, G = CONFIGS[cfg]
    vec = 16 // np.dtype(dtype).itemsize
    if V % vec:
        vec = 1
    sweeps = -(-V // (256 * vec))
    return -(-sweeps // p1), -(-sweeps // p2)


def _cast(a, dtype):
    """(array for the kernel, float32 array of exactly the values it reads)."""
    cast = a.astype(dtype)
    return cast, cast.astype(np.float32)


def _check_plan(cfg, walk, tokens, draft, target):
    from specsample_cupy.verification.kernel_launch import MODE_LOGITS, plan_info
    V, dtype, *_ = CONFIGS[cfg]
    info = plan_info(tokens, draft, target, dtype_name=dtype, mode=MODE_LOGITS, options=_plan(cfg, walk))
    assert (info["S1"], info["S2"], info["walk"]) == (*_expected_slices(cfg), walk), info
    assert info["S1"] > 1 and info["S2"] > 1


@pytest.mark.parametrize("walk", [False, True], ids=["all-rows", "walk"])
@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_first_token_chi_square_with_forced_slices(cfg, walk):
    import cupy as cp
    V, dtype, p1, p2, T, G = CONFIGS[cfg]
    rng = np.random.default_rng(1000 + list(CONFIGS).index(cfg))
    target = rng.normal(size=(G + 1, V)) * 2.5
    draft = 0.5 * target[:G] + 0.5 * rng.normal(size=(G, V)) * 2.5
    t_dev, t_host = _cast(target, dtype)
    d_dev, d_host = _cast(draft, dtype)
    q = softmax(d_host.astype(np.float64) / T)                     # what the draft samples from
    n = CALLS * BATCH
    tokens = np.stack([rng.choice(V, size=n, p=q[i]) for i in range(G)], -1).astype(np.int32)
    tokens = cp.asarray(tokens.reshape(CALLS, BATCH, G))
    lengths = cp.asarray(rng.integers(0, G + 1, (CALLS, BATCH)).astype(np.int32))
    t_all = cp.ascontiguousarray(cp.broadcast_to(cp.asarray(t_dev), (BATCH, G + 1, V)))
    d_all = cp.ascontiguousarray(cp.broadcast_to(cp.asarray(d_dev), (BATCH, G, V)))
    _check_plan(cfg, walk, tokens[0], d_all, t_all)
    first = cp.empty((CALLS, BATCH), cp.int32)
    accepted = cp.empty((CALLS, BATCH), cp.int32)
    errs = cp.zeros(BATCH, cp.int32)
    for c in range(CALLS):
        res = verify(tokens[c], d_all, t_all, temperature=T, seed=31, offset=c, draft_lengths=lengths[c],
                     plan=_plan(cfg, walk))
        first[c] = res.tokens[:, 0]
        accepted[c] = res.accepted
        errs |= res.error
    assert int(errs.max()) == 0
    acc = accepted.get()
    assert 0.02 < acc.mean() < 0.98 * lengths.get().mean(), "both acceptance and rejection must occur"
    counts = cp.bincount(first.ravel(), minlength=V).get()
    exact = first_token_distribution(t_host[0], d_host[0], "exact", temperature=T)
    np.testing.assert_allclose(exact, softmax(t_host[0].astype(np.float64) / T), atol=1e-12)
    pvalue = merged_chisquare(counts, exact)
    assert pvalue >= P_MIN, f"{cfg}: chi-square p-value {pvalue:.2e}"


@pytest.mark.parametrize("walk", [False, True], ids=["all-rows", "walk"])
@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_kernel_matches_reference_per_configuration(cfg, walk):
    import cupy as cp
    V, dtype, p1, p2, T, G = CONFIGS[cfg]
    B = 64 if V > 100_000 else 128
    rng = np.random.default_rng(2000 + list(CONFIGS).index(cfg))
    tokens, draft, target = random_problem(rng, B, G, V, temperature=T, scale=2.0, closeness=0.6)
    lengths = rng.integers(0, G + 1, B).astype(np.int32)
    d_dev, d_host = _cast(draft, dtype)
    t_dev, t_host = _cast(target, dtype)
    args = (cp.asarray(tokens.astype(np.int32)), cp.asarray(d_dev), cp.asarray(t_dev))
    _check_plan(cfg, walk, *args)
    gpu = verify(*args, temperature=T, seed=8, offset=2, draft_lengths=cp.asarray(lengths), plan=_plan(cfg, walk))
    cpu = verify(tokens, d_host, t_host, temperature=T, seed=8, offset=2, draft_lengths=lengths)
    assert (gpu.error.get() == 0).all() and (cpu.error == 0).all()
    same = (gpu.accepted.get() == cpu.accepted) & (gpu.tokens.get() == cpu.tokens).all(1)
    mismatched = int((~same).sum())
    assert mismatched <= max(1, B // 100), f"{cfg}: {mismatched} of {B} requests differ from the reference"
    assert 0 < cpu.accepted.mean() < lengths.mean(), "both acceptance and rejection must occur"
