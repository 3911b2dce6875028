"""min-p alone, fused into verify.cu's P1 (mode MODE_MIN_P): slices of one load group held in
registers while their row agrees on the maximum, longer slices listing their candidates per warp
(compacting, or re-reading when a list overflows), and the re-read of slices that stopped waiting.
Against the NumPy reference per configuration (>= 99.9 % of requests identical) and against the
two-kernel path (warp_rows.cu then the warped verifier), under plans that force each of those."""
import numpy as np
import pytest

from specsample_cupy import verify
from specsample_cupy.verification.kernel_launch import PlanOptions

pytestmark = pytest.mark.gpu

PLANS = {
    "default": None,
    "one block": PlanOptions(grid=1),            # fewer blocks than slices: nobody waits
    "seven blocks": PlanOptions(grid=7, p1_sweeps=1),
    "one-sweep slices": PlanOptions(p1_sweeps=1),
    "long slices": PlanOptions(p1_sweeps=64),   # several load groups: candidate lists
    "long slices, one block": PlanOptions(p1_sweeps=16, grid=1),
}


def _case(rng, B, G, V, dtype, ties, flat=False):
    target = (rng.normal(size=(B, G + 1, V)) * (0.05 if flat else 2)).astype(np.float32)
    draft = (0.8 * target[:, :G] + (0.01 if flat else 0.4) * rng.normal(size=(B, G, V))).astype(np.float32)
    if ties:   # a coarse grid of values: entries tie at the span's edge
        target, draft = np.round(target * 2) / 2, np.round(draft * 2) / 2
    tokens = rng.integers(0, V, (B, G)).astype(np.int32)
    lengths = rng.integers(0, G + 1, B).astype(np.int32)
    temps = rng.choice(np.array([1.0, 0.7, 0.0], np.float32), B)
    min_p = rng.choice(np.array([0.0, 0.05, 0.1, 0.5], np.float32), B)
    return draft.astype(dtype), target.astype(dtype), tokens, lengths, temps, min_p


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("V,dtype", [(3000, "float32"), (3001, "float32"), (32000, "float16"), (151936, "float32")])
def test_fused_min_p_matches_the_reference(plan, V, dtype):
    import cupy as cp
    rng = np.random.default_rng(V + len(plan))
    B, G = (24, 3) if V > 100000 else (64, 4)
    same = total = 0
    for call in range(4):   # flat rows (call 3): most entries kept, the candidate lists overflow
        draft, target, tokens, lengths, temps, min_p = _case(rng, B, G, V, dtype, ties=call == 2, flat=call == 3)
        onehot = call == 1
        kw = dict(temperature=temps, draft_lengths=lengths, seed=call, offset=5, min_p=min_p)
        cpu = verify(tokens, None if onehot else draft, target, **kw)
        g = [cp.asarray(a) for a in (tokens, draft, target)]
        gkw = {k: cp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
        gpu = verify(g[0], None if onehot else g[1], g[2], plan=PLANS[plan], **gkw)
        assert (gpu.error.get() == cpu.error).all()
        same += int(((gpu.accepted.get() == cpu.accepted) & (gpu.tokens.get() == cpu.tokens).all(1)).sum())
        total += B
    assert same >= 0.999 * total or total - same <= 1, (same, total)


def test_fused_and_two_kernel_paths_agree():
    """The same calls through the fused kernel and through warp_rows.cu + the warped verifier
    (logprobs=True takes that path): identical tokens on >= 99.9 % of requests, and the fused
    kernel leaves its counters at zero (a second call gives the first call's result)."""
    import cupy as cp
    rng = np.random.default_rng(11)
    B, G, V = 128, 5, 32000
    draft, target, tokens, lengths, temps, min_p = (cp.asarray(a) for a in _case(rng, B, G, V, "float32", False))
    kw = dict(temperature=temps, draft_lengths=lengths, seed=4, offset=2, min_p=min_p)
    fused = verify(tokens, draft, target, **kw).to_host()
    again = verify(tokens, draft, target, **kw).to_host()
    two = verify(tokens, draft, target, logprobs=True, **kw).to_host()
    np.testing.assert_array_equal(again.packed, fused.packed)
    same = (fused.accepted == two.accepted) & (fused.tokens == two.tokens).all(1)
    assert same.sum() >= B - 1, np.flatnonzero(~same)


def test_fused_min_p_reports_bad_rows():
    """NaN / +Inf in a row and a row with no mass are reported as in every mode; other requests go on."""
    import cupy as cp
    from specsample_cupy.runtime.errors import NO_MASS, TARGET_VALUES
    rng = np.random.default_rng(3)
    B, G, V = 4, 2, 5000
    draft, target, tokens, _, _, _ = _case(rng, B, G, V, "float32", False)
    target[0, 1, 77] = np.nan
    target[1, 0, 4000] = np.inf
    target[2, 0] = -np.inf
    args = [cp.asarray(a) for a in (tokens, draft, target)]
    gpu = verify(*args, min_p=0.1, seed=1)
    cpu = verify(tokens, draft, target, min_p=0.1, seed=1)
    err = gpu.error.get()
    np.testing.assert_array_equal(err, cpu.error)
    assert err[0] & TARGET_VALUES and err[1] & TARGET_VALUES and err[2] & NO_MASS and err[3] == 0
    np.testing.assert_array_equal(gpu.tokens.get()[3], cpu.tokens[3])
