"""kernels_cu/expected_accept.cu's launcher: each draft position's acceptance probability,
sum_x min(p, q), for automatic gamma on the device loop (reference: acceptance.expected_acceptance)."""
from __future__ import annotations

import ctypes
import numbers

import numpy as np

from specsample_cupy.runtime import kernel_runtime
from specsample_cupy.verification import kernel_launch as kernels

SPAN = 8192   # vocabulary entries per block (kernels.MIN_ITEM_ELEMENTS: one block's share of a row)
THREADS = 256
DTYPES = ("float32", "float16")   # the logits dtypes expected_accept.cu is instantiated for


class ExpectedAcceptance:
    """Launches for rows of V entries of one dtype, at most B requests and G drafts per call, with the
    workspace they share (so one stream at a time: the device loop's)."""

    def __init__(self, dtype_name: str, B: int, G: int, V: int, stream):
        import cupy
        self.B, self.G, self.V, self.S = B, G, V, -(-V // SPAN)
        tag, vec = kernels.vec_width(dtype_name, V)
        stats, total = kernel_runtime.functions(
            "expected_accept.cu", (f"expected_stats<{tag}, {vec}>", f"expected_sum<{tag}, {vec}>"))
        with stream:
            self.stats = cupy.empty(B * G * self.S * 8, cupy.float32)   # two float4 per block
            self.partial = cupy.empty(B * G * self.S, cupy.float32)
            self.arrived = cupy.zeros(B * G, cupy.uint32)              # reset by each call's last blocks
        c = ctypes
        common = [("target", c.c_void_p()), ("draft", c.c_void_p()), ("G", c.c_int32()), c.c_int32(V),
                  c.c_int32(self.S), c.c_int32(SPAN), ("temperature", c.c_float()), ("temps", c.c_void_p()),
                  ("draft_len", c.c_void_p())]
        self.first = kernel_runtime.Launch(stats, common + [c.c_void_p(self.stats.data.ptr)])
        self.second = kernel_runtime.Launch(total, common + [
            c.c_void_p(self.stats.data.ptr), c.c_void_p(self.partial.data.ptr), c.c_void_p(self.arrived.data.ptr),
            ("out", c.c_void_p())])

    def __call__(self, stream, target: int, draft: int, B: int, G: int, temperature, draft_len: int, out: int):
        """out [B, G] float32 (any address the device can write, page-locked host memory included) =
        the acceptance probability of each draft position, 0 at i >= draft_len[b]. target: [B, G + 1, V],
        draft: [B, G, V] (addresses, allocation-aligned); temperature: a float > 0 or [B] float32 on the
        device; draft_len: [B] int32 on the device."""
        scalar, per_row = kernel_runtime.temperature_args(temperature)
        args = dict(target=target, draft=draft, G=G, temperature=scalar, temps=per_row, draft_len=draft_len)
        grid = B * G * self.S
        self.first(stream, grid, THREADS, **args)
        self.second(stream, grid, THREADS, out=out, **args)

    def fits(self, draft_logits, target_logits) -> bool:
        """Whether these CuPy rows (draft [B, g, V], target [B, g + 1, V]) can be read in place: C-contiguous,
        16-byte aligned, of this launch's sizes at most."""
        B, g, V = draft_logits.shape
        return (target_logits.shape == (B, g + 1, V) and V == self.V and B <= self.B and g <= self.G
                and all(a.flags.c_contiguous and a.data.ptr % 16 == 0 for a in (draft_logits, target_logits)))

    def to_host(self, stream, draft_logits, target_logits, temperature, draft_len) -> np.ndarray:
        """[B, g] float64 on the host, as acceptance.expected_acceptance: rows that fit() (CuPy, this
        dtype); temperature a float > 0 or [B] (CuPy); draft_len [B] int32 on the device. Waits for the
        stream to read the result."""
        import cupy
        B, g = draft_logits.shape[:2]
        if B * g == 0:
            return np.zeros((B, g))
        if not isinstance(temperature, numbers.Real):
            temperature = cupy.asarray(temperature, cupy.float32)
        with stream:
            out = cupy.empty(B * g, cupy.float32)
        self(stream, target_logits.data.ptr, draft_logits.data.ptr, B, g, temperature, draft_len.data.ptr,
             out.data.ptr)
        return out.get(stream=stream).reshape(B, g).astype(np.float64)
