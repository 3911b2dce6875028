"""verify(..., logprobs=True): each emitted token's log-probability under the (truncated) target
distribution it was drawn from, on the reference and (GPU) on the kernels."""
import numpy as np
import pytest

from specsample_cupy import verify


def _inputs(seed, B=40, G=4, V=300, dtype=np.float32):
    rng = np.random.default_rng(seed)
    target = (rng.normal(size=(B, G + 1, V)) * 2).astype(np.float32)
    draft = (0.8 * target[:, :G] + 0.5 * rng.normal(size=(B, G, V))).astype(np.float32)
    tokens = np.stack([[rng.choice(V, p=np.exp(r) / np.exp(r).sum()) for r in req] for req in draft.astype(np.float64)])
    lengths = rng.integers(0, G + 1, B).astype(np.int32)
    temps = rng.choice(np.array([1.0, 0.6, 0.0], np.float32), B)
    return tokens.astype(np.int32), draft.astype(dtype), target.astype(dtype), lengths, temps


def _expected(target, res, temps, kept=None):
    """log softmax(target[b, j] / T) at the emitted tokens (greedy: T = 1), -inf elsewhere; kept: the
    truncation's mask per row (None: everything)."""
    tokens, emitted = res.tokens, res.emitted
    out = np.full(tokens.shape, -np.inf)
    for b in range(tokens.shape[0]):
        t = 1.0 if temps[b] == 0 else float(temps[b])
        for j in range(emitted[b]):
            z = target[b, j].astype(np.float64) / t
            if kept is not None and temps[b] != 0:
                z = np.where(kept[b, j], z, -np.inf)
            out[b, j] = z[tokens[b, j]] - (z.max() + np.log(np.exp(z - z.max()).sum()))
    return out


def test_reference_logprobs_plain_and_truncated():
    tokens, draft, target, lengths, temps = _inputs(0)
    res = verify(tokens, draft, target, temperature=temps, draft_lengths=lengths, seed=3, logprobs=True)
    np.testing.assert_allclose(res.logprobs, _expected(target, res, temps), rtol=1e-5, atol=1e-5)
    assert np.isneginf(res.logprobs[res.tokens < 0]).all()
    res = verify(tokens, draft, target, temperature=temps, draft_lengths=lengths, seed=3, logprobs=True, top_k=7)
    kth = -np.sort(-target, -1)[..., 6:7]
    lp = res.logprobs[res.tokens >= 0]
    assert np.isfinite(lp).all() and (lp <= 0).all()
    np.testing.assert_allclose(res.logprobs, _expected(target, res, temps, kept=target >= kth), rtol=1e-5, atol=1e-5)


def test_bad_requests_and_methods():
    tokens, draft, target, lengths, temps = _inputs(1, B=4)
    target[2, 0, 3] = np.nan
    res = verify(tokens, draft, target, temperature=temps, seed=3, logprobs=True)
    assert res.error[2] != 0 and np.isneginf(res.logprobs[2]).all()
    with pytest.raises(ValueError, match="logprobs"):
        verify(tokens, draft, target, method="sigmoid", logprobs=True)
    with pytest.raises(AttributeError):
        verify(tokens, draft, target).logprobs


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("kw", [{}, {"top_p": 0.8}, {"top_k": 20, "min_p": 0.02}])
@pytest.mark.parametrize("onehot", [False, True])
@pytest.mark.parametrize("method", ["exact", "greedy"])
def test_kernel_logprobs_match_the_reference(dtype, kw, onehot, method):
    import cupy as cp
    tokens, draft, target, lengths, temps = _inputs(5, V=3000, dtype=dtype)
    cpu = verify(tokens, None if onehot else draft, target, method=method, temperature=temps, draft_lengths=lengths,
                 seed=4, logprobs=True, **kw)
    gpu = verify(cp.asarray(tokens), None if onehot else cp.asarray(draft), cp.asarray(target), method=method,
                 temperature=cp.asarray(temps), draft_lengths=cp.asarray(lengths), seed=4, logprobs=True, **kw)
    same = (gpu.tokens.get() == cpu.tokens).all(1)
    assert same.mean() >= 0.95
    np.testing.assert_allclose(gpu.logprobs.get()[same], cpu.logprobs[same], rtol=1e-4, atol=2e-4)


def test_to_host_of_a_numpy_result_is_itself():
    tokens, draft, target, lengths, temps = _inputs(2, B=6)
    res = verify(tokens, draft, target, temperature=temps, draft_lengths=lengths, seed=3, logprobs=True)
    assert res.to_host() is res
    plain = verify(tokens, draft, target, temperature=temps, seed=3)
    assert plain.to_host() is plain


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [{}, {"top_k": 20}])
def test_kernel_logprobs_come_with_the_packed_result(kw):
    """On CuPy the log-probabilities follow the packed result in one allocation, so to_host() reads
    both with one copy; what it reads equals the two arrays read apart."""
    import cupy as cp
    tokens, draft, target, lengths, temps = _inputs(6, B=12, V=500)
    res = verify(cp.asarray(tokens), cp.asarray(draft), cp.asarray(target), temperature=cp.asarray(temps),
                 draft_lengths=cp.asarray(lengths), seed=4, logprobs=True, **kw)
    assert res.logprobs.data.ptr == res.packed.data.ptr + res.packed.nbytes
    host = res.to_host()
    assert isinstance(host.packed, np.ndarray) and host.logprobs.shape == res.logprobs.shape
    np.testing.assert_array_equal(host.packed, res.packed.get())
    np.testing.assert_array_equal(host.logprobs, res.logprobs.get())
    np.testing.assert_array_equal(host.tokens, res.tokens.get())
    plain = verify(cp.asarray(tokens), cp.asarray(draft), cp.asarray(target), seed=4).to_host()
    assert isinstance(plain.packed, np.ndarray)
    with pytest.raises(AttributeError):
        plain.logprobs
