"""NumPy reference of the verification kernels (the CPU path of verify()), and the per-request
error codes every method computes on either backend.

It computes in float64 what kernels_cu/verify.cu computes in float32, with the same Philox
random numbers, the same acceptance rule, the same exponential race and the same error codes,
so kernel and reference agree except on float near-ties. Shapes: draft_tokens [B, G] int,
draft [B, G, V], target [B, G+1, V], lengths [B] int, temps [B] float.
"""
import numpy as np

from specsample_cupy import errors
from specsample_cupy.philox import (PURPOSE_ACCEPT, acceptance_uniform, race_exponential,
                                    random_bits)


def _or(xp, err, mask, code):
    return err | xp.where(mask, int(code), 0).astype(xp.int32)


def request_errors(draft_tokens, draft, target, lengths, temps, *, probs, greedy_ok=True,
                   greedy_all=False, xp=np):
    """Error codes [B] int32 (specsample_cupy.errors) of every request, as the kernels compute them,
    with arrays of module xp (the GPU baseline runs this on CuPy, without synchronising).

    Rules (verify()'s docstring states them for users):
      TEMPERATURE: temps[b] negative or not finite, or 0 where the method has no greedy mode
          (greedy_ok=False); such a request is checked at temperature 1.
      LENGTH: lengths[b] outside [0, G]; the request is checked with L = lengths[b] clamped.
      Active rows: target rows 0..L; draft rows 0..L-1 unless the request is greedy (temperature 0
          with greedy_ok, or greedy_all).
      TARGET_VALUES / DRAFT_VALUES: an active row holds NaN or +Inf (probs: NaN, a negative
          value or +Inf).
      NO_MASS: an active row has no entry > -Inf (probs: no entry in (0, +Inf)).
      TOKEN_RANGE: one of draft_tokens[b, :L] is outside [0, V).

    Returns (err [B] int32, L [B] int64, greedy [B] bool, temps [B] float64 with 1 where the
    request is greedy or its temperature is bad).
    """
    B, G1, V = target.shape
    G = G1 - 1
    temps = temps.astype(xp.float64)
    lengths = lengths.astype(xp.int64)
    err = xp.zeros(B, xp.int32)
    bad_t = ~((temps >= 0) & (temps < np.inf))
    if not greedy_ok:
        bad_t = bad_t | (temps == 0)
    err = _or(xp, err, bad_t, errors.TEMPERATURE)
    greedy = xp.ones(B, dtype=bool) if greedy_all else (temps == 0) & ~bad_t
    temps = xp.where(bad_t | greedy, 1.0, temps)
    err = _or(xp, err, (lengths < 0) | (lengths > G), errors.LENGTH)
    L = xp.clip(lengths, 0, G)
    t_rows = xp.arange(G1)[None, :] <= L[:, None]
    if probs:
        invalid = lambda a: ~((a >= 0) & (a < np.inf))
        no_mass = lambda a: ~((a > 0) & (a < np.inf)).any(-1)
    else:
        invalid = lambda a: ~(a < np.inf)
        no_mass = lambda a: ~(a > -np.inf).any(-1)
    err = _or(xp, err, (invalid(target).any(-1) & t_rows).any(-1), errors.TARGET_VALUES)
    err = _or(xp, err, (no_mass(target) & t_rows).any(-1), errors.NO_MASS)
    if G:
        in_draft = xp.arange(G)[None, :] < L[:, None]
        d_rows = in_draft & ~greedy[:, None]
        err = _or(xp, err, (invalid(draft).any(-1) & d_rows).any(-1), errors.DRAFT_VALUES)
        err = _or(xp, err, (no_mass(draft) & d_rows).any(-1), errors.NO_MASS)
        err = _or(xp, err, (((draft_tokens < 0) | (draft_tokens >= V)) & in_draft).any(-1), errors.TOKEN_RANGE)
    return err, L, greedy, temps


def row_weights(x, temps, *, mode, sigmoid_offset, sigmoid_scale):
    """Per-row probabilities [B, R, V] float64 for mode 'logits' (softmax), 'probs' (the valid
    entries normalised) or 'sigmoid'. temps: [B], already 1 for greedy and bad requests (their
    rows' weights are not used for sampling)."""
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if mode == "probs":
            x = np.where((x >= 0) & (x < np.inf), x, 0.0)
            return x / x.sum(-1, keepdims=True)
        x = x * (1.0 / temps)[:, None, None]
        if mode == "sigmoid":
            return 1.0 / (1.0 + np.exp(-(x - sigmoid_offset) / sigmoid_scale))
        top = x.max(-1, keepdims=True)
        w = np.exp(x - np.where(np.isfinite(top), top, 0.0))
        return w / w.sum(-1, keepdims=True)


def reference_verify(draft_tokens, draft, target, lengths, temps, *, mode, seed, offset,
                     race_purpose, sigmoid_offset=-10000.0, sigmoid_scale=20000.0, greedy_all=False):
    """Returns (accepted [B], tokens [B, G+1], emitted [B], error [B]) as int32 NumPy arrays.

    mode: 'logits' (exact), 'probs' (exact from probabilities) or 'sigmoid'.
    Temperature-0 requests are greedy (accept while the draft is the target's argmax) except in
    'sigmoid', where temperature 0 is an error; greedy_all makes every request greedy (method
    "greedy"). A request with an error emits nothing (see request_errors()).
    """
    B, G1, V = target.shape
    G = G1 - 1
    err, L, greedy, temps = request_errors(draft_tokens, draft, target, np.asarray(lengths),
                                           np.asarray(temps, np.float64), probs=mode == "probs",
                                           greedy_ok=mode != "sigmoid", greedy_all=greedy_all)
    kw = dict(mode=mode, sigmoid_offset=sigmoid_offset, sigmoid_scale=sigmoid_scale)
    p = row_weights(target, temps, **kw)
    q = row_weights(draft, temps, **kw)

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
    with np.errstate(invalid="ignore"):
        residual = np.maximum(p_n - q_n, 0.0)
        residual = np.where((residual > 0).any(-1, keepdims=True), residual, p_n)
    e = race_exponential(random_bits(seed, offset, b[:, None], n[:, None], race_purpose,
                                     np.arange(V)[None, :]))
    with np.errstate(invalid="ignore", divide="ignore"):
        key = np.where(residual > 0, residual / e, -1.0)
    token = np.where(greedy, target_argmax[b, n], key.argmax(-1))
    # No positive weight left in row n (only float underflow gets here without another error).
    err = _or(np, err, (err == 0) & ~greedy & ~(key.max(-1) > 0), errors.NO_MASS)

    tokens = np.full((B, G1), -1, np.int32)
    tokens[:, :G] = np.where(pos[None, :] < n[:, None], draft_tokens, -1)
    tokens[b, n] = token
    accepted = n.astype(np.int32)
    failed = err != 0
    tokens[failed] = -1
    accepted[failed] = -1
    return accepted, tokens, (accepted + 1) * ~failed, err
