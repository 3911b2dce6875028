"""Truncated sampling (top-k, top-p, min-p) as verify() and sample_tokens() apply it.

The rule, per logit row z (float32; float16/bfloat16 convert exactly) at temperature T > 0:
M = max z and d = float32(M - z). Every threshold is a value of d, and an entry is kept iff
d <= dmax, the smallest active threshold, so every backend agrees on the kept set however it
computes the thresholds:
  top_k (0 = off): the k-th smallest d;
  top_p (1 = off): the first d, in ascending order over the top-k set, at which the cumulative
      mass exp(-d / T) reaches top_p of that set's mass (+inf if rounding never gets there);
  min_p (0 = off): span = float32(-T ln(min_p)) (computed in float64), i.e. p >= min_p * p_max.
Ties at a threshold are kept. This is Hugging Face's order (temperature, top-k, top-p within the
top-k set, min-p, which is relative to the max and so order-free). The warped distribution is
softmax(z / T) over the kept entries, renormalised. A row whose max is not finite (NaN, +Inf, or
no entry above -Inf) keeps everything, so verification's error checks see it unchanged.
"""
from numbers import Real
from typing import Any, NamedTuple

import numpy as np


class Warps(NamedTuple):
    """Per-request thresholds' parameters, [B] arrays of the logits' module."""
    top_k: Any   # int32, 0 = off (values >= V arrive as 0)
    top_p: Any   # float32, 1 = off
    span: Any    # float32, +inf = off: the min-p span -T ln(min_p), temperature included

    def select(self, index):
        """These warps' arrays (NumPy) at `index` (rows of requests): one entry per row."""
        return type(self)(*(np.asarray(a)[index] for a in self))


class MinPWarps(Warps):
    """Warps whose top-k and top-p are off for every request, as make_warps() (and build_warps())
    found them on the host: the GPU verifier then fuses the truncation, min-p alone, into its own
    pass over the rows. Only those functions make them; a Warps built by hand takes the general
    path, whatever it holds."""
    __slots__ = ()


def per_request(value, xp, B, arg, dtype):
    """(array, None) for a [B] array of module xp (checked, made contiguous in dtype), or (None, value) for a
    scalar, which stays a Python number: how verify() reads its per-request arguments."""
    if isinstance(value, (float, int, np.generic, Real)) and not isinstance(value, np.ndarray):
        return None, value
    if type(value).__module__.split(".")[0] != xp.__name__:
        raise TypeError(f"{arg} must be a scalar or a [B] array of the same module as the logits")
    if value.shape != (B,):
        raise ValueError(f"{arg} must be a scalar or shape [B={B}], got {value.shape}")
    return xp.ascontiguousarray(value, dtype=dtype), None


def _validate(arg, v):
    """v: NumPy array (0-d for a scalar) of one argument's values."""
    if v.dtype.kind not in "iuf":
        raise ValueError(f"{arg} must be a number or a [B] numeric array, got dtype {v.dtype}")
    with np.errstate(invalid="ignore"):
        if arg == "top_k":
            bad = ~(v >= 0) if v.dtype.kind in "iu" else ~((v >= 0) & (v < np.inf) & (v == np.floor(v)))
            rule = "an integer >= 0 (0 = off)"
        elif arg == "top_p":
            bad = ~((v > 0) & (v <= 1))
            rule = "in (0, 1] (1 = off)"
        else:
            bad = ~((v >= 0) & (v <= 1))
            rule = "in [0, 1] (0 = off)"
    if bad.any():
        got = v if v.ndim == 0 else f"{v[bad][:4].tolist()} at requests {np.flatnonzero(bad)[:4].tolist()}"
        raise ValueError(f"{arg} must be {rule}, got {got}")


_OFF = {}   # (device, B) -> the GPU's all-off Warps: read only, made once


def off_warps(xp, B):
    """Warps that keep every entry (the GPU path uses them when only the rows' statistics are wanted).
    On CuPy the arrays are made once per device and batch size (kernels only read them)."""
    make = lambda: Warps(xp.zeros(B, np.int32), xp.ones(B, np.float32), xp.full(B, np.inf, np.float32))  # noqa: E731
    if xp is np:
        return make()
    key = (xp.cuda.runtime.getDevice(), B)
    warps = _OFF.get(key)
    if warps is None:
        warps = make()
        xp.cuda.get_current_stream().synchronize()   # filled before any stream reads them
        warps = _OFF.setdefault(key, warps)
    return warps


def make_warps(xp, B, V, temps, temp_scalar, top_k=None, top_p=None, min_p=None):
    """Validated Warps of arrays of module xp, or None when every request has every warp off.

    top_k, top_p, min_p: None, a scalar or a [B] array of module xp. temps / temp_scalar: verify()'s
    per-request temperatures ([B] array, or None and a scalar). Raises ValueError naming the
    argument for a bad value. On CuPy, [B] arrays are read back to validate them (and the
    temperatures, to compute the min-p span), which synchronises with the device.
    """
    if top_k is None and top_p is None and min_p is None:   # every call without truncation: nothing to do
        return None
    host = lambda a: a.get() if hasattr(a, "get") else np.asarray(a)
    values = {}
    for arg, v in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):
        if v is not None:
            arr, scalar = per_request(v, xp, B, arg, None)
            values[arg] = np.asarray(scalar) if arr is None else host(arr)
            _validate(arg, values[arg])
    k = np.broadcast_to(values.get("top_k", 0), (B,)).astype(np.float64)
    k = np.where(k >= V, 0, k).astype(np.int32)         # top_k >= V keeps every entry: off
    p = np.broadcast_to(values.get("top_p", 1.0), (B,)).astype(np.float32)
    span = np.full(B, np.inf, np.float32)
    if "min_p" in values:
        t = np.broadcast_to(np.float64(temp_scalar) if temps is None else host(temps).astype(np.float64), (B,))
        m = np.broadcast_to(values["min_p"], (B,)).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            s = (-t * np.log(m)).astype(np.float32)      # min_p = 0: +inf (off); 1: 0 (ties of the max)
        # Greedy or bad temperatures never sample, so the span is moot there.
        span = np.where((t > 0) & (t < np.inf) & (m > 0), s, np.float32(np.inf)).astype(np.float32)
    if not ((k > 0).any() or (p < 1).any() or (span < np.inf).any()):
        return None
    kind = Warps if (k > 0).any() or (p < 1).any() else MinPWarps
    return kind(*(xp.asarray(a) for a in (k, p, span)))


def build_warps(xp, B, V, temperature=1.0, *, top_k=None, top_p=None, min_p=None):
    """The Warps that verify() and sample_tokens() build from top_k / top_p / min_p for B requests
    of V entries at `temperature` (their argument: a scalar or a [B] array of module xp), for their
    `warps` keyword: a loop of such calls builds them once instead of on every call (on CuPy each
    build is three small uploads, and a [B] argument is read back, which synchronises). Validated
    as those calls validate the arguments. None when every warp is off: then pass no warps at all.
    Build them again when the temperatures change: min-p's span includes them."""
    temps, temp_scalar = per_request(temperature, xp, B, "temperature", np.float32)   # as verify() reads it
    return make_warps(xp, B, V, temps, temp_scalar, top_k, top_p, min_p)


def check_warps(warps, xp, B):
    """TypeError/ValueError unless warps is a Warps of C-contiguous [B] arrays of module xp with
    make_warps()'s dtypes. Attributes only: nothing is read from the device."""
    if not isinstance(warps, Warps):
        raise TypeError(f"warps must be a specsample_cupy.verification.truncation.Warps (build_warps()), "
                        f"got {type(warps).__name__}")
    for name, a, dtype in zip(Warps._fields, warps, (np.int32, np.float32, np.float32)):
        if (type(a).__module__.split(".")[0] != xp.__name__ or a.shape != (B,) or a.dtype != dtype
                or not a.flags.c_contiguous):
            raise ValueError(f"warps.{name} must be a contiguous [B={B}] {np.dtype(dtype)} array of the logits' "
                             f"module, got {type(a).__name__} of shape {getattr(a, 'shape', None)} "
                             f"dtype {getattr(a, 'dtype', None)}")


def row_thresholds(z, temps, warps):
    """(M [N] float32, dmax [N] float32) of rows z [N, V] by the module docstring's rule, with
    temps [N] (> 0) and warps a Warps of NumPy [N] arrays (one entry per row)."""
    z = np.asarray(z, np.float32)
    N, V = z.shape
    with np.errstate(invalid="ignore", over="ignore"):
        M = z.max(-1)
        d = np.subtract(M[:, None], z)
    k = np.asarray(warps.top_k).astype(np.int64)
    k = np.where(k >= V, 0, k)
    p = np.asarray(warps.top_p, np.float32)
    finite = np.isfinite(M)               # rows whose max is not finite keep everything (the checks report them)
    K_k = np.full(N, np.inf, np.float32)
    for kv in np.unique(k[finite & (k > 0)]):            # one partition per distinct k
        sel = np.flatnonzero(finite & (k == kv))
        K_k[sel] = np.partition(d[sel], kv - 1, -1)[:, kv - 1]
    tp = np.flatnonzero(finite & (p < 1))
    if tp.size:
        # Only the entries of the top-k set count, and they are the smallest d: when every row has
        # top-k on, sorting the first `width` entries of a partition covers them (ties included).
        width = V if (k[tp] == 0).any() else int((d[tp] <= K_k[tp, None]).sum(-1).max())
        ds = d[tp] if width == V else np.partition(d[tp], width - 1, -1)[:, :width]
        ds = np.sort(ds, -1)                              # ascending d: descending probability
        w = ds.astype(np.float64)
        np.divide(w, -np.asarray(temps, np.float64)[tp, None], out=w)
        np.exp(w, out=w)
        w[ds > K_k[tp, None]] = 0.0                       # mass within the top-k set only
        cum = np.cumsum(w, -1, out=w)
        # The set's mass is the last cumulative sum, so top_p = 1 would reach it exactly.
        reach = cum >= p[tp, None].astype(np.float64) * cum[:, -1:]
        K_p = np.where(reach.any(-1), ds[np.arange(tp.size), reach.argmax(-1)], np.float32(np.inf))
        K_k[tp] = np.minimum(K_k[tp], K_p)               # from here on: min(top-k, top-p threshold)
    dmax = np.minimum(np.asarray(warps.span, np.float32), K_k)
    dmax[~finite] = np.inf
    return M, dmax


def apply_warps(z, temps, warps_rows):
    """A float32 copy of z [N, V] with the entries outside the kept set set to -inf, in the rows
    whose temperature (temps [N]) is > 0 and finite; warps_rows: a Warps of NumPy [N] arrays.
    NaN and +Inf entries stay (d > dmax is False for them, or dmax is +inf in their row), so the
    error checks are unchanged."""
    z = np.array(z, np.float32)
    temps = np.asarray(temps, np.float64)
    rows = np.flatnonzero((temps > 0) & (temps < np.inf))
    if rows.size:
        sub = z[rows]
        M, dmax = row_thresholds(sub, temps[rows], warps_rows.select(rows))
        with np.errstate(invalid="ignore", over="ignore"):
            sub[np.subtract(M[:, None], sub) > dmax[:, None]] = -np.inf
        z[rows] = sub
    return z


def warp_request_rows(x, temps, warps, rows):
    """x [B, R, V] with the rows where rows [B, R] is True warped by their request's temperature
    (temps [B]) and warps (NumPy [B] arrays); float32, a new array when any row is warped."""
    b, r = np.nonzero(rows)
    if not b.size:
        return x
    x = np.array(x, np.float32)
    x[b, r] = apply_warps(x[b, r], np.asarray(temps, np.float64)[b], warps.select(b))
    return x
