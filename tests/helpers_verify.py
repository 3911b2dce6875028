"""Random verification problems shared by the CPU and GPU tests and the benchmark checks."""
import numpy as np
import pytest


def softmax(x, axis=-1):
    x = x - x.max(axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis, keepdims=True)


def sample_rows(probs, rng):
    """One id per row of probs [..., V] by inverse CDF."""
    cdf = np.cumsum(probs, -1)
    u = rng.random(probs.shape[:-1] + (1,)) * cdf[..., -1:]
    return np.minimum((cdf <= u).sum(-1), probs.shape[-1] - 1)


def random_problem(rng, B, G, V, *, temperature=1.0, scale=2.0, closeness=0.7, share=False):
    """Target logits, correlated draft logits, and draft tokens sampled from the draft.

    closeness in [0, 1] mixes the target into the draft so acceptance is neither 0 nor 1.
    share=True gives every request the same distributions (for chi-square tests).
    """
    shape_b = 1 if share else B
    target = rng.normal(size=(shape_b, G + 1, V)) * scale
    draft = closeness * target[:, :G] + (1 - closeness) * rng.normal(size=(shape_b, G, V)) * scale
    if share:
        target = np.broadcast_to(target, (B, G + 1, V))
        draft = np.broadcast_to(draft, (B, G, V))
    t = np.asarray(temperature, np.float64).reshape(-1, 1, 1) if np.ndim(temperature) else temperature
    q = softmax(draft / t) if np.all(np.asarray(temperature) > 0) else softmax(draft)
    tokens = sample_rows(q, rng).astype(np.int64)
    return tokens, draft.astype(np.float32), target.astype(np.float32)


def merged_chisquare(counts, probs, min_expected=5.0):
    """Chi-square p-value of observed counts [V] against probabilities [V], bins merged (smallest
    expected first) until every bin expects at least min_expected draws. Asserts nothing was drawn
    where probs is 0."""
    from scipy.stats import chisquare
    counts = np.asarray(counts, np.float64)
    probs = np.asarray(probs, np.float64)
    assert counts[probs <= 0].sum() == 0, "drew a token of probability 0"
    keep = probs > 0
    counts, expected = counts[keep], probs[keep] / probs[keep].sum() * counts.sum()
    order = np.argsort(expected, kind="stable")
    obs_bins, exp_bins, o, e = [], [], 0.0, 0.0
    for k in order:
        o += counts[k]
        e += expected[k]
        if e >= min_expected:
            obs_bins.append(o)
            exp_bins.append(e)
            o = e = 0.0
    if e > 0:                      # the leftover joins the last bin
        if exp_bins:
            obs_bins[-1] += o
            exp_bins[-1] += e
        else:
            obs_bins, exp_bins = [o], [e]
    if len(exp_bins) < 2:
        return 1.0
    return float(chisquare(obs_bins, exp_bins).pvalue)


def wait_or_fail(events, seconds, what):
    """Poll CUDA events until all completed; fail (instead of hanging forever) after `seconds`."""
    import time
    deadline = time.monotonic() + seconds
    while not all(e.done for e in events):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not finished after {seconds} s (kernel hang?)")
        time.sleep(0.001)


# verify()'s two backends as test parameters: the GPU one marked gpu (skipped without a CUDA device).
BACKENDS = [pytest.param("numpy"), pytest.param("cupy", marks=pytest.mark.gpu)]


def backend_module(name):
    """The array module of a BACKENDS parameter."""
    if name == "numpy":
        return np
    import cupy
    return cupy
