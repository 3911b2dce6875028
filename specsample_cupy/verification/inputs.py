"""Checks of verify()'s inputs (TypeError / ValueError naming the argument) and their dtype handling:
one array module for all arrays, shapes [B, gamma] / [B, gamma, V] / [B, gamma + 1, V], float32, float16
or bfloat16 logits (bfloat16 as uint16 bits on NumPy), seeds and per-request streams."""
from numbers import Integral

import numpy as np

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def array_module_of(*arrays):
    kinds = {type(a).__module__.split(".")[0] for a in arrays}
    if kinds <= {"numpy"}:
        return np
    if kinds <= {"cupy"}:
        import cupy
        return cupy
    raise TypeError("draft_tokens, draft_logits and target_logits must all be NumPy arrays or all CuPy arrays")


_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16", np.dtype(np.uint16): "uint16"}


def float_dtype_name(arr, arg, logits_dtype):
    name = _DTYPE_NAMES.get(arr.dtype) or arr.dtype.name  # dtype.name is slow on NumPy 2
    if logits_dtype == "bfloat16" and name == "uint16":
        return "bfloat16"
    if name not in FLOAT_DTYPES:
        raise TypeError(f"{arg} must be float32, float16 or bfloat16 (float64 is converted), got {arr.dtype}")
    return name


def check_shapes(draft_tokens, draft_logits, target_logits):
    """draft_logits None: one-hot drafts, only draft_tokens and target_logits to check."""
    if draft_tokens.ndim != 2:
        raise ValueError(f"draft_tokens must be [B, gamma], got shape {draft_tokens.shape}")
    if draft_tokens.dtype.kind not in "iu":
        raise TypeError(f"draft_tokens must be an integer array, got {draft_tokens.dtype}")
    if draft_logits is not None and draft_logits.ndim != 3:
        raise ValueError(f"draft_logits must be [B, gamma, V] or None, got shape {draft_logits.shape}")
    if target_logits.ndim != 3:
        raise ValueError(f"target_logits must be [B, gamma+1, V], got shape {target_logits.shape}")
    B, G = draft_tokens.shape
    if draft_logits is not None and draft_logits.shape[:2] != (B, G):
        raise ValueError(f"draft_logits shape {draft_logits.shape} does not match draft_tokens [B={B}, gamma={G}]")
    if target_logits.shape[:2] != (B, G + 1):
        raise ValueError(f"target_logits shape {target_logits.shape} must be [B={B}, gamma+1={G + 1}, V]")
    if draft_logits is not None and draft_logits.shape[2] != target_logits.shape[2]:
        raise ValueError(f"vocabulary sizes differ: draft_logits V={draft_logits.shape[2]}, "
                         f"target_logits V={target_logits.shape[2]}")
    if target_logits.shape[2] < 1 or B < 1:
        raise ValueError("B and V must be at least 1")
    if target_logits.shape[2] >= 2 ** 31 or target_logits.size >= 2 ** 62:
        raise ValueError("target_logits too large")


def check_seed(arg, v, xp):
    """seed / offset: an int, or (CuPy) a one-element int64 device array that the kernel reads when
    it runs (so a captured CUDA graph replays with the array's new value)."""
    if isinstance(v, (int, Integral)):
        return
    if xp is not np and isinstance(v, xp.ndarray):
        if v.size != 1 or v.dtype != xp.int64:
            raise TypeError(f"{arg} as a device array must be a one-element int64 CuPy array, got shape "
                            f"{v.shape} dtype {v.dtype} (the kernel reads 8 bytes; convert it once before "
                            "capturing a graph, since a converted copy would not follow later writes)")
        return
    raise TypeError(f"{arg} must be an int (or a one-element int64 CuPy array), got {type(v).__name__}")


def check_streams(streams, xp, B, method):
    """streams as a C-contiguous [B, 2] int64 array of module xp (or None); TypeError/ValueError
    naming the argument otherwise."""
    if streams is None:
        return None
    if type(streams).__module__.split(".")[0] != xp.__name__:
        raise TypeError("streams must be an array of the same module as the logits")
    if streams.shape != (B, 2) or streams.dtype.kind not in "iu":
        raise ValueError(f"streams must be an integer array of shape [B={B}, 2] (seed, offset per request), "
                         f"got shape {streams.shape} dtype {streams.dtype}")
    if method == "baseline":
        raise ValueError("streams do not work with method 'baseline' (its random numbers come from a "
                         "stateful generator)")
    return xp.ascontiguousarray(streams, dtype=xp.int64)


def as_float(a, dtype_name):
    if dtype_name == "bfloat16" and a.dtype.name == "uint16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32) if dtype_name == "bfloat16" else a


def bf16_to_f32(a):
    import cupy
    return (a.astype(cupy.uint32) << 16).view(cupy.float32)
