"""verify(draft_tokens, None, target_logits): one-hot drafts (a deterministic drafter such as n-gram
lookup). Exactness by chi-square (200,000 draws, fixed seeds, fail below p = 1e-4) on the reference and
the kernel, kernel-vs-reference agreement per configuration, greedy and error rules."""
import numpy as np
import pytest

from helpers_verify import BACKENDS, backend_module, merged_chisquare, softmax
from specsample_cupy import verify
from specsample_cupy.runtime import errors

DRAWS = 200_000
P_MIN = 1e-4


def _host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("proposal", [pytest.param("argmax", marks=pytest.mark.slow),   # ~4 s each on 2 cores
                                      pytest.param("unlikely", marks=pytest.mark.slow), "mixed"])
@pytest.mark.parametrize("temperature", [1.0, pytest.param(0.7, marks=pytest.mark.slow)])
def test_first_token_follows_the_target(backend, proposal, temperature):
    """Whatever the drafter proposes, the first emitted token is distributed as softmax(p_0 / T)."""
    xp = backend_module(backend)
    rng = np.random.default_rng({"argmax": 1, "unlikely": 2, "mixed": 3}[proposal])
    V, G = 12, 3
    row = rng.normal(size=(G + 1, V)) * 1.5
    target = np.broadcast_to(row, (DRAWS, G + 1, V)).astype(np.float32)
    if proposal == "argmax":
        tokens = np.broadcast_to(row[:G].argmax(-1), (DRAWS, G))
    elif proposal == "unlikely":
        tokens = np.broadcast_to(row[:G].argmin(-1), (DRAWS, G))
    else:
        tokens = rng.integers(0, V, (DRAWS, G))
    res = verify(xp.asarray(np.ascontiguousarray(tokens).astype(np.int32)), None, xp.asarray(target),
                 temperature=temperature, seed=7, offset=3)
    out = _host(res.tokens)[:, 0]
    p0 = softmax(row[0] / temperature)
    assert merged_chisquare(np.bincount(out, minlength=V), p0) >= P_MIN
    accepted = _host(res.accepted)
    if proposal == "argmax":
        # x_0 is accepted with probability p_0(x_0)
        assert abs((accepted >= 1).mean() - p0[row[0].argmax()]) < 0.01


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_accepts_while_the_proposal_is_the_argmax(backend):
    xp = backend_module(backend)
    rng = np.random.default_rng(4)
    B, G, V = 64, 5, 40
    target = rng.normal(size=(B, G + 1, V)).astype(np.float32)
    tokens = target[:, :G].argmax(-1)
    cut = rng.integers(0, G + 1, B)                       # first position whose proposal is wrong
    for b in range(B):
        if cut[b] < G:
            tokens[b, cut[b]] = (tokens[b, cut[b]] + 1) % V
    res = verify(xp.asarray(tokens.astype(np.int32)), None, xp.asarray(target), method="greedy")
    np.testing.assert_array_equal(_host(res.accepted), cut)
    toks = _host(res.tokens)
    np.testing.assert_array_equal(toks[np.arange(B), cut], target.argmax(-1)[np.arange(B), cut])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_requests_and_arguments(backend):
    xp = backend_module(backend)
    B, G, V = 4, 2, 16
    target = np.zeros((B, G + 1, V), np.float32)
    tokens = np.ones((B, G), np.int32)
    tokens[1, 0] = V                                        # out of range
    target[2, 0, 4] = np.nan                                # a bad target row a decision reads (position 0)
    target[3, 0, 1] = -np.inf                               # p(x_0) = 0: request 3 surely rejects at 0 ...
    clean = verify(xp.asarray(tokens), None, xp.asarray(target), seed=1)
    target[3, 1, 4] = np.nan                                # ... so its row 1 is never read
    res = verify(xp.asarray(tokens), None, xp.asarray(target), seed=1)
    err = _host(res.error)
    assert err[0] == 0 and err[1] & errors.TOKEN_RANGE and err[2] & errors.TARGET_VALUES and err[3] == 0
    assert (_host(res.tokens)[1:3] == -1).all() and (_host(res.emitted)[1:3] == 0).all()
    assert _host(res.accepted)[3] == 0 and _host(res.tokens)[3, 0] != 1
    for f in ("tokens", "accepted", "emitted"):
        np.testing.assert_array_equal(_host(getattr(res, f))[[0, 3]], _host(getattr(clean, f))[[0, 3]], err_msg=f)
    for method in ("sigmoid", "sigmoid-paper", "baseline"):
        with pytest.raises(ValueError, match="one-hot"):
            verify(xp.asarray(tokens), None, xp.asarray(target), method=method)


@pytest.mark.gpu
@pytest.mark.parametrize("B, G, V, dtype, ragged, mixed_t", [
    (2000, 5, 64, "float32", True, True),
    (400, 4, 32000, "float16", True, False),
    (16, 5, 151936, "float32", False, True),
])
def test_kernel_matches_reference_per_configuration(B, G, V, dtype, ragged, mixed_t):
    import cupy as cp
    rng = np.random.default_rng(B + V)
    target = (rng.normal(size=(B, G + 1, V)) * 2).astype(dtype)
    # Proposals the target likes half of the time: both acceptances and rejections.
    best = target[:, :G].astype(np.float32).argmax(-1)
    tokens = np.where(rng.random((B, G)) < 0.5, best, rng.integers(0, V, (B, G))).astype(np.int32)
    lengths = rng.integers(0, G + 1, B).astype(np.int32) if ragged else None
    temps = rng.choice([0.0, 0.7, 1.0], B).astype(np.float32) if mixed_t else 1.0
    kw = dict(seed=11, offset=5)
    gpu = verify(cp.asarray(tokens), None, cp.asarray(target), draft_lengths=None if lengths is None else
                 cp.asarray(lengths), temperature=cp.asarray(temps) if mixed_t else temps, **kw)
    cpu = verify(tokens, None, target, draft_lengths=lengths, temperature=temps, **kw)
    same = (gpu.accepted.get() == cpu.accepted) & (gpu.tokens.get() == cpu.tokens).all(1)
    assert (gpu.error.get() == cpu.error).all()
    assert same.mean() >= 0.999, f"{(~same).sum()} of {B} differ"
