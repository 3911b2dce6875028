"""kernels_cu/expected_accept.cu against acceptance.expected_acceptance (its NumPy reference), and both
loops on the GPU (the device loop, the host loop over CuPy) reporting it to automatic gamma for exact
sampling."""
import numpy as np
import pytest

from specsample_cupy.decode.acceptance import expected_acceptance
from specsample_cupy.verification.expected_accept import SPAN, ExpectedAcceptance

from helpers_decode_gpu import GPU_DECODE, PROMPTS, on_device, on_host  # noqa: F401

pytestmark = GPU_DECODE


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("V", [32000, 16385, 1001])   # 4 slices of 16-byte loads; 3 and 1 of scalar loads
@pytest.mark.parametrize("per_row", [False, True])
def test_expected_accept_matches_reference(dtype, V, per_row):
    import cupy as cp
    rng = np.random.default_rng(V + per_row)
    B, G = 3, 5
    target = rng.normal(0, 3, (B, G + 1, V)).astype(dtype)
    draft = (target[:, :G] + rng.normal(0, 1.5, (B, G, V))).astype(dtype)   # related rows: beta well inside (0, 1)
    target[0, 1, :7] = -np.inf                                                # masked entries count as p = 0
    draft[0, 0, SPAN:2 * SPAN] = -np.inf                                      # a whole slice of them, where V has one
    temps = np.array([1.0, 0.7, 1.6], np.float32)
    draft_len = np.array([5, 2, 0], np.int32)
    stream = cp.cuda.get_current_stream()
    run = ExpectedAcceptance(dtype, B, G + 2, V, stream)   # buffers for more drafts than this call has
    t, d, lens = cp.asarray(target), cp.asarray(draft), cp.asarray(draft_len)
    want = expected_acceptance(np, draft, target, temps if per_row else 1.3, draft_len)
    assert (0.05 < want[draft_len[:, None] > np.arange(G)]).all()
    for _ in range(2):   # the second call finds the arrival counters the first one reset
        out = cp.full(B * G, -1, cp.float32)
        run(stream, t.data.ptr, d.data.ptr, B, G, cp.asarray(temps) if per_row else 1.3, lens.data.ptr, out.data.ptr)
        np.testing.assert_allclose(out.get().reshape(B, G), want, atol=2e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_expected_acceptance_reads_the_host_loops_rows_in_place(dtype):
    """The host loop's path on CuPy (ExpectedAcceptance.to_host): the reference's values for rows that
    fit; views it cannot read in place (strided, misaligned, wider than its launches) do not fit."""
    import cupy as cp
    rng = np.random.default_rng(7)
    B, G, V = 4, 3, 5003
    target = rng.normal(0, 2, (B, G + 1, V)).astype(dtype)
    draft = (target[:, :G] + rng.normal(0, 1, (B, G, V))).astype(dtype)
    draft_len = np.array([3, 1, 0, 2], np.int32)
    temps = np.array([1.0, 0.5, 2.0, 0.8], np.float32)
    stream = cp.cuda.get_current_stream()
    run = ExpectedAcceptance(dtype, B, G, V, stream)
    t, d = cp.asarray(target), cp.asarray(draft)
    assert run.fits(d, t)
    for temperature in (0.9, cp.asarray(temps, cp.float64)):   # a [B] of any float dtype is cast
        got = run.to_host(stream, d, t, temperature, cp.asarray(draft_len))
        want = expected_acceptance(np, draft, target, temps if not np.isscalar(temperature) else 0.9, draft_len)
        assert got.dtype == np.float64 and got.shape == (B, G)
        np.testing.assert_allclose(got, want, atol=2e-5)
    wide = cp.asarray(rng.normal(0, 1, (B, G + 1, V + 5)).astype(dtype))
    assert not run.fits(d[:, ::2], t[:, :3])                     # strided rows
    misaligned = cp.empty(d.size + 8, d.dtype)[1:1 + d.size].reshape(d.shape)
    assert not run.fits(misaligned, t)
    assert not run.fits(wide[:, :G, :V], wide[:, :, :V])       # rows V + 5 apart
    assert not run.fits(cp.asarray(np.concatenate([draft] * 2)), cp.asarray(np.concatenate([target] * 2)))  # 2 B


@pytest.mark.parametrize("loop", ["on_device", "on_host"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_loops_report_expected_acceptance_to_auto_gamma(request, loop, temperature, monkeypatch):
    """Every speculative round of an auto-gamma exact call carries each request's expected accepted count
    over the positions it tried; over the call it tracks the accepted count (their difference is a
    martingale whose variance is at most a quarter of the positions tried: within 5 standard deviations)."""
    from specsample_cupy.decode.gamma_policy import AutoGamma
    # The tiny pair's drafts do not pay on a GPU, so auto gamma would soon decode with target steps:
    # keep it drafting (gamma_min at least), its rounds' reports being what is tested here.
    hand_out = AutoGamma._hand_out
    monkeypatch.setattr(AutoGamma, "_hand_out", lambda self: max(hand_out(self), self.lo))
    rounds = []
    out = request.getfixturevalue(loop).generate(
        PROMPTS, max_new_tokens=80, gamma="auto", method="exact", temperature=temperature, seed=4,
        ignore_eos=True, on_round=lambda rnd, req: rounds.append(rnd))
    assert (out.stats["device_rounds"] is True) == (loop == "on_device")
    speculative = [r for r in rounds if r.gamma]
    assert len(speculative) > 10
    exp_total = acc_total = var = 0.0
    for rnd in speculative:
        tried = np.where(rnd.active, np.minimum(rnd.accepted + 1, rnd.draft_len), 0)
        e = rnd.expected_accepted
        assert e is not None and np.isfinite(e).all()
        assert np.all(e >= -1e-6) and np.all(e <= tried + 1e-4) and np.all(e[tried == 0] == 0)
        live = rnd.active & (rnd.draft_len > 0)
        exp_total += e[live].sum()
        acc_total += rnd.accepted[live].sum()
        var += tried[live].sum() / 4
    assert abs(acc_total - exp_total) <= 5 * np.sqrt(var), (acc_total, exp_total, var)
