"""The two sigmoid methods sample exactly the rules they state (reference_verify's docstring,
verification/analysis.py's closed forms), on the CPU reference and on the kernel.

Chi-square against the closed form, 200,000 draws per case, fixed seeds, fail below p = 1e-4.
"sigmoid" (softmax-bonus) draws its bonus token exactly from softmax(z / T); "sigmoid-paper"
draws it in proportion to max(1e-5, z / T) as the paper's released code does.
"""
import numpy as np
import pytest

from helpers_verify import BACKENDS, merged_chisquare, random_problem, softmax
from specsample_cupy import verify
from specsample_cupy.verification.analysis import bonus_distribution, first_token_distribution, total_variation

DRAWS = 200_000
P_MIN = 1e-4
# A sigmoid far enough from exact to tell the rules apart (and, for the paper's clamps, a window
# t = z in [0, 1] that cuts through the logits).
STEEP = dict(sigmoid_offset=0.0, sigmoid_scale=1.0)
METHODS = ("sigmoid", "sigmoid-paper")


def _backend(name):
    if name == "numpy":
        return np
    import cupy
    return cupy


def _run(xp, tokens, draft, target, **kw):
    res = verify(xp.asarray(tokens.astype(np.int32)), xp.asarray(draft), xp.asarray(target), **kw)
    out = res.tokens
    return np.asarray(out.get() if hasattr(out, "get") else out), res


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("temperature", [1.0, pytest.param(0.7, marks=pytest.mark.slow)])   # ~3 s each on 2 cores
def test_first_token_follows_the_methods_closed_form(backend, method, temperature):
    rng = np.random.default_rng(31 if method == "sigmoid" else 37)
    V, G = 10, 2
    tokens, draft, target = random_problem(rng, DRAWS, G, V, temperature=temperature, closeness=0.5, share=True)
    out, res = _run(_backend(backend), tokens, draft, target, method=method, temperature=temperature, seed=4, **STEEP)
    predicted = first_token_distribution(target[0, 0], draft[0, 0], method, temperature, **STEEP)
    assert merged_chisquare(np.bincount(out[:, 0], minlength=V), predicted) >= P_MIN
    accepted = np.asarray(res.accepted.get() if hasattr(res.accepted, "get") else res.accepted)
    assert 0 < accepted.mean() < G, "some drafts accepted, some rejected"
    # Neither is exact: the closed form is measurably away from the target's distribution.
    assert total_variation(predicted, softmax(target[0, 0].astype(np.float64) / temperature)) > 0.01


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
def test_bonus_token_follows_the_methods_rule(backend, method):
    """gamma = 0: every request's one token is the bonus token."""
    rng = np.random.default_rng(5)
    V, T = 12, 0.8
    row = (rng.normal(size=V) * 2.0).astype(np.float32)
    row[3] = -np.inf                                   # a masked token: weight 0 (paper: 1e-5)
    target = np.broadcast_to(row, (DRAWS, 1, V)).copy()
    draft = np.zeros((DRAWS, 0, V), np.float32)
    tokens = np.zeros((DRAWS, 0), np.int64)
    out, _ = _run(_backend(backend), tokens, draft, target, method=method, temperature=T, seed=9)
    predicted = bonus_distribution(row, method, T)
    if method == "sigmoid":
        np.testing.assert_allclose(predicted, softmax(row.astype(np.float64) / T), atol=1e-12)
    else:
        assert predicted[3] > 0 and total_variation(predicted, softmax(row.astype(np.float64) / T)) > 0.1
    assert merged_chisquare(np.bincount(out[:, 0], minlength=V), predicted) >= P_MIN


@pytest.mark.parametrize("backend", BACKENDS)
def test_paper_residual_keeps_its_floor(backend):
    """A rejection where max(0, p~ - q~) is 0 everywhere: the paper's rule leaves the 1e-5 floor
    alone, i.e. a uniform draw over the vocabulary, whatever the target's logits."""
    V, B = 8, 40_000
    target = np.full((B, 2, V), -1.0, np.float32)      # t < 0: p~ = 0 everywhere, so x is rejected
    target[:, 0, 5] = -0.5                             # (a target that is not flat: the floor ignores it)
    draft = np.zeros((B, 1, V), np.float32)
    tokens = np.zeros((B, 1), np.int64)
    out, res = _run(_backend(backend), tokens, draft, target, method="sigmoid-paper", seed=2, **STEEP)
    assert (np.asarray(res.accepted.get() if hasattr(res.accepted, "get") else res.accepted) == 0).all()
    assert merged_chisquare(np.bincount(out[:, 0], minlength=V), np.full(V, 1.0 / V)) >= P_MIN
