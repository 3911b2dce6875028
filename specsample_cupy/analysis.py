"""Closed-form distribution of the first emitted token, to measure how far a method is from exact.

For one position with draft distribution q (the draft samples x ~ q) and per-token weights the
method uses for acceptance and resampling (p~, q~: softmax for "exact", the element-wise sigmoid
for "sigmoid"), the first emitted token is distributed as

    P(x) = q(x) a(x) + (1 - sum_y q(y) a(y)) * r(x) / sum r,
    a(x) = min(1, p~(x) / q~(x)),  r = max(0, p~ - q~)  (r = p~ if that is all zero).

For "exact" this equals p. For "sigmoid" it does not; the total-variation distance to p is the
approximation's error.
"""
import numpy as np


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def method_weights(logits, method, temperature=1.0, sigmoid_offset=-10000.0, sigmoid_scale=20000.0):
    z = np.asarray(logits, np.float64) / temperature
    if method == "sigmoid":
        return 1.0 / (1.0 + np.exp(-(z - sigmoid_offset) / sigmoid_scale))
    return _softmax(z)


def first_token_distribution(target_logits, draft_logits, method, temperature=1.0, **sigmoid):
    """Distribution [V] of the first emitted token when the draft samples from softmax(draft / T)."""
    q_true = _softmax(np.asarray(draft_logits, np.float64) / temperature)
    pw = method_weights(target_logits, method, temperature, **sigmoid)
    qw = method_weights(draft_logits, method, temperature, **sigmoid)
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = np.where(pw > 0, np.minimum(1.0, np.where(qw > 0, pw / qw, np.inf)), 0.0)
    residual = np.maximum(pw - qw, 0.0)
    if residual.sum() == 0:
        residual = pw
    reject = 1.0 - (q_true * accept).sum()
    return q_true * accept + reject * residual / residual.sum()


def total_variation(a, b):
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())
