"""Closed-form distributions of the tokens a method emits, to measure how far it is from exact.

For one position with draft distribution q (the draft samples x ~ q) and per-token weights the
method uses for acceptance and resampling (p~, q~: softmax for "exact", the element-wise sigmoid
for the sigmoid methods), the first emitted token is distributed as

    P(x) = q(x) a(x) + (1 - sum_y q(y) a(y)) * r(x) / sum r,
    a(x) = min(1, p~(x) / q~(x)),
    r = max(0, p~ - q~)  (r = p~ if that is all zero)                 "exact", "sigmoid"
    r = max(1e-5, max(0, p~ - q~) / (1e-6 + sum max(0, p~ - q~)))     "sigmoid-paper"

and when every draft is accepted the bonus token is drawn from softmax(z / T) ("exact", "sigmoid")
or in proportion to max(1e-5, z / T) ("sigmoid-paper": the paper's released code samples the raw
logits). For "exact" both equal the target's distribution p; the total-variation distance to p is
a method's error at that token. specsample_cupy/verification/cpu_numpy.py states the same rules (and is what the
tests sample).
"""
import numpy as np

from specsample_cupy.verification.cpu_numpy import PAPER_EPS, PAPER_FLOOR, SIGMOID_MODES, row_weights

METHODS = ("exact",) + SIGMOID_MODES


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def method_weights(logits, method, temperature=1.0, sigmoid_offset=-10000.0, sigmoid_scale=20000.0):
    """p~ of one row [V]: the method's acceptance weights."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "exact":
        return _softmax(np.asarray(logits, np.float64) / temperature)
    row = np.asarray(logits, np.float64)[None, None, :]
    return row_weights(row, np.array([float(temperature)]), mode=method, sigmoid_offset=sigmoid_offset,
                       sigmoid_scale=sigmoid_scale)[0, 0]


def first_token_distribution(target_logits, draft_logits, method, temperature=1.0, **sigmoid):
    """Distribution [V] of the first emitted token when the draft samples from softmax(draft / T)."""
    q_true = _softmax(np.asarray(draft_logits, np.float64) / temperature)
    pw = method_weights(target_logits, method, temperature, **sigmoid)
    qw = method_weights(draft_logits, method, temperature, **sigmoid)
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = np.where(pw > 0, np.minimum(1.0, np.where(qw > 0, pw / qw, np.inf)), 0.0)
    residual = np.maximum(pw - qw, 0.0)
    if method == "sigmoid-paper":
        residual = np.maximum(residual / (PAPER_EPS + residual.sum()), PAPER_FLOOR)
    elif residual.sum() == 0:
        residual = pw
    reject = 1.0 - (q_true * accept).sum()
    return q_true * accept + reject * residual / residual.sum()


def bonus_distribution(target_logits, method, temperature=1.0):
    """Distribution [V] of the bonus token (every draft accepted) at a target row."""
    z = np.asarray(target_logits, np.float64) / temperature
    if method == "sigmoid-paper":
        w = np.maximum(z, PAPER_FLOOR)
        return w / w.sum()
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return _softmax(z)


def total_variation(a, b):
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())
