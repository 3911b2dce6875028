"""NumPy reference of the verification kernels (the CPU path of verify()).

It computes in float64 what kernels_cu/verify.cu computes in float32, with the same Philox
random numbers, the same acceptance rule, the same exponential race and the same error codes,
so kernel and reference agree except on float near-ties. Shapes: draft_tokens [B, G] int,
draft [B, G, V], target [B, G+1, V], lengths [B] int, temps [B] float.
"""
import numpy as np

from specsample_cupy import errors
from specsample_cupy.philox import (PURPOSE_ACCEPT, acceptance_uniform, race_exponential,
                                    random_bits)


def row_weights(x, temps, *, mode, sigmoid_offset, sigmoid_scale):
    """Per-row probabilities for mode 'logits' (softmax), 'probs' (normalise) or 'sigmoid'.

    Returns (weights [B, R, V] float64, no_mass [B, R] bool). Greedy rows (temperature 0)
    keep temperature 1 here; the caller uses their argmax instead.
    """
    x = x.astype(np.float64)
    if mode == "probs":
        total = x.sum(-1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            return x / total, total[..., 0] <= 0
    inv_t = np.where(temps > 0, 1.0 / np.where(temps > 0, temps, 1.0), 1.0)[:, None, None]
    x = x * inv_t
    if mode == "sigmoid":
        return 1.0 / (1.0 + np.exp(-(x - sigmoid_offset) / sigmoid_scale)), np.zeros(x.shape[:2], bool)
    top = x.max(-1, keepdims=True)
    no_mass = ~np.isfinite(top[..., 0])
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.exp(x - np.where(np.isfinite(top), top, 0.0))
        return w / w.sum(-1, keepdims=True), no_mass


def value_errors(draft_tokens, draft, target, lengths, temps, *, probs):
    """Error codes [B] int32 for everything the kernels flag, checked over the rows they read."""
    B, G1, V = target.shape
    G = G1 - 1
    err = np.zeros(B, np.int32)
    bad_t = ~np.isfinite(temps) | (temps < 0)
    err[bad_t] |= errors.TEMPERATURE
    err[(lengths < 0) | (lengths > G)] |= errors.LENGTH
    L = np.clip(lengths, 0, G)
    greedy = temps == 0
    t_rows = np.arange(G1)[None, :] <= L[:, None]
    d_rows = (np.arange(G)[None, :] < L[:, None]) & ~greedy[:, None]
    t = target.astype(np.float64)
    d = draft.astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = (lambda a: ~((a >= 0) & (a < np.inf))) if probs else (lambda a: ~(a < np.inf) & ~(a == -np.inf))
        err[(bad(t).any(-1) & t_rows).any(-1)] |= errors.TARGET_VALUES
        if G:
            err[(bad(d).any(-1) & d_rows).any(-1)] |= errors.DRAFT_VALUES
    in_draft = np.arange(G)[None, :] < L[:, None]
    err[(((draft_tokens < 0) | (draft_tokens >= V)) & in_draft).any(-1)] |= errors.TOKEN_RANGE
    return err, L, greedy


def reference_verify(draft_tokens, draft, target, lengths, temps, *, mode, seed, offset,
                     race_purpose, sigmoid_offset=-10000.0, sigmoid_scale=20000.0):
    """Returns (accepted [B], tokens [B, G+1], emitted [B], error [B]) as int32 NumPy arrays.

    mode: 'logits' (exact), 'probs' (exact from probabilities) or 'sigmoid'.
    Temperature-0 requests are greedy: accept while the draft is the target's argmax.
    """
    B, G1, V = target.shape
    G = G1 - 1
    temps = np.asarray(temps, np.float64)
    err, L, greedy = value_errors(draft_tokens, draft, target, lengths, temps, probs=mode == "probs")
    kw = dict(mode=mode, sigmoid_offset=sigmoid_offset, sigmoid_scale=sigmoid_scale)
    p, p_empty = row_weights(target, temps, **kw)
    q, q_empty = row_weights(draft, temps, **kw)
    rows = np.arange(G1)[None, :]
    err[(p_empty & (rows <= L[:, None])).any(-1)] |= errors.NO_MASS
    if G:
        err[(q_empty & (rows[:, :G] < L[:, None]) & ~greedy[:, None]).any(-1)] |= errors.NO_MASS

    b = np.arange(B)
    x = np.clip(draft_tokens, 0, V - 1).astype(np.int64)
    pos = np.arange(G)
    px = np.take_along_axis(p[:, :G], x[..., None], -1)[..., 0]
    qx = np.take_along_axis(q, x[..., None], -1)[..., 0]
    u = acceptance_uniform(random_bits(seed, offset, b[:, None], 0, PURPOSE_ACCEPT, pos[None, :]))
    with np.errstate(invalid="ignore"):
        accept = (px > 0) & (u * qx <= px)
    target_argmax = target.astype(np.float64).argmax(-1)          # first index of the maximum
    accept = np.where(greedy[:, None], x == target_argmax[:, :G], accept)
    reject = ~accept & (pos[None, :] < L[:, None])
    n = np.where(reject.any(-1), reject.argmax(-1), L) if G else L

    p_n = p[b, n]
    q_n = np.where((n < L)[:, None], q[b, np.minimum(n, max(G - 1, 0))] if G else 0.0, 0.0)
    residual = np.maximum(p_n - q_n, 0.0)
    residual = np.where((residual > 0).any(-1, keepdims=True), residual, p_n)
    e = race_exponential(random_bits(seed, offset, b[:, None], n[:, None], race_purpose,
                                     np.arange(V)[None, :]))
    with np.errstate(invalid="ignore", divide="ignore"):
        key = np.where(residual > 0, residual / e, -1.0)
    token = np.where(greedy, target_argmax[b, n], key.argmax(-1))

    tokens = np.full((B, G1), -1, np.int32)
    tokens[:, :G] = np.where(pos[None, :] < n[:, None], draft_tokens, -1)
    tokens[b, n] = token
    accepted = n.astype(np.int32)
    failed = err != 0
    tokens[failed] = -1
    accepted[failed] = -1
    return accepted, tokens, (accepted + 1) * ~failed, err
