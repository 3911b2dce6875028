"""The op-by-op verification of Hugging Face assisted generation (`_speculative_sampling`).

This is the paper's baseline: softmax of both models, gather, ratio, uniform draws, first rejection
by a cumulative sum, clamp + normalise the residual, multinomial. Every intermediate is a
materialised array and every step its own kernel; written once for NumPy and CuPy. It draws its
random numbers from a stateful generator, as the original does, so it is exact in distribution
but not reproducible against the Philox-keyed kernels. Its per-request error codes are those of
the kernels (reference.request_errors, array operations too, so CuPy never synchronises): a bad
request runs through the same operations on sanitised values and is blanked at the end.
"""
import numpy as np

from specsample_cupy.verification.cpu_numpy import request_errors

_generators = {}


def _generator(xp, seed):
    key = (xp.__name__, int(seed))
    if key not in _generators:
        _generators[key] = xp.random.default_rng(int(seed))
    return _generators[key]


def _softmax(x, xp):
    x = x - x.max(-1, keepdims=True)
    e = xp.exp(x)
    return e / e.sum(-1, keepdims=True)


def baseline_verify(draft_tokens, draft, target, lengths, temps, *, probs, seed, xp=np):
    """Returns (accepted [B], tokens [B, G+1], emitted [B], error [B]) int32 arrays of module xp.

    Temperature 0 is an error here (no greedy mode: error code TEMPERATURE), as are the other
    conditions of reference.request_errors(); such requests get accepted -1, emitted 0, tokens -1.
    """
    B, G1, V = target.shape
    G = G1 - 1
    err, lengths, _, temps = request_errors(draft_tokens, draft, target, lengths, temps, probs=probs,
                                            greedy_ok=False, xp=xp)
    with np.errstate(all="ignore"):   # NaN/Inf of bad requests flow through and are blanked below
        draft = draft.astype(xp.float32)
        target = target.astype(xp.float32)
        if probs:
            q = draft / draft.sum(-1, keepdims=True)
            p = target / target.sum(-1, keepdims=True)
        else:
            inv_t = (1.0 / temps.astype(xp.float32))[:, None, None]
            q = _softmax(draft * inv_t, xp)
            p = _softmax(target * inv_t, xp)
        rng = _generator(xp, seed)
        if G:
            x = xp.clip(draft_tokens.astype(xp.int64), 0, V - 1)
            q_i = xp.take_along_axis(q, x[..., None], -1)[..., 0]
            p_i = xp.take_along_axis(p[:, :G], x[..., None], -1)[..., 0]
            ratio = p_i / q_i
            r_i = rng.random((B, G), dtype=xp.float32)
            in_draft = xp.arange(G)[None, :] < lengths[:, None]
            is_accepted = (r_i <= ratio) & in_draft
            n = ((~is_accepted).cumsum(-1) < 1).sum(-1)
        else:
            n = xp.zeros(B, xp.int64)

        b = xp.arange(B)
        p_n = p[b, n]
        if G:
            q_n = q[b, xp.minimum(n, G - 1)]
            residual = xp.where((n < lengths)[:, None], xp.clip(p_n - q_n, 0, None), p_n)
        else:
            residual = p_n
        mass = residual.sum(-1, keepdims=True)
        residual = xp.where(mass > 0, residual / xp.where(mass > 0, mass, 1), p_n)
        cdf = xp.cumsum(residual, -1)
        draw = rng.random((B, 1), dtype=xp.float32) * cdf[:, -1:]
        token = xp.minimum((cdf <= draw).sum(-1), V - 1)

    tokens = xp.full((B, G1), -1, xp.int32)
    tokens[:, :G] = xp.where(xp.arange(G)[None, :] < n[:, None], draft_tokens, -1)
    tokens[b, n] = token
    failed = err != 0
    tokens = xp.where(failed[:, None], -1, tokens).astype(xp.int32)
    accepted = xp.where(failed, -1, n).astype(xp.int32)
    emitted = xp.where(failed, 0, n + 1).astype(xp.int32)
    return accepted, tokens, emitted, err
