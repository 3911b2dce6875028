"""Launchers of kernels_cu/warp_rows.cu, the row statistics and thresholds of truncated sampling (top-k,
top-p, min-p): for verify()'s warped mode (WarpRows, over a plan's rows) and for the device loop's
samplers (RowWarps, over the last column of each model run).
"""
import ctypes
import numbers

from specsample_cupy.runtime import kernel_runtime
from specsample_cupy.verification.load_width import ITEMSIZE, vec_width

WARP_CLUSTER = 8    # warp_rows.cu's WR_CLUSTER: blocks per row, each holding a slice in shared memory
WARP_THREADS = 256  # warp_rows.cu's WR_THREADS
WARP_RECORD = 6     # warp_record.cuh's SS_RECORD: floats per row record


class WarpRows:
    """warp_rows.cu for one plan (dtype, B, G, V): one cluster of WARP_CLUSTER blocks per row, each
    block holding a 1 / WARP_CLUSTER slice of the row (as float32) in dynamic shared memory. It
    writes the plan's row records and ORs value errors into the plan's per-request error bits.
    kernel: the compiled warp_rows_kernel<tag, vec> to launch (default: this package's; a benchmark
    passes another revision's)."""

    def __init__(self, tag, vec, B, G, V, device_id, err_ptr, record, kernel=None):
        import cupy
        kern = kernel or kernel_runtime.functions("warp_rows.cu", (f"warp_rows_kernel<{tag}, {vec}>",))[0]
        C = -(-V // WARP_CLUSTER)
        C = -(-C // vec) * vec     # slices start on vec boundaries: 16-byte loads stay aligned
        self.shared_bytes = 4 * C
        limit = cupy.cuda.Device(device_id).attributes["MaxSharedMemoryPerBlockOptin"]
        static = kern.attributes["shared_size_bytes"]
        if self.shared_bytes + static > limit:
            raise ValueError(f"top_k / top_p / min_p on this GPU support vocabularies up to "
                             f"{WARP_CLUSTER * ((limit - static) // 4)} entries, got V={V}")
        # Dynamic shared memory above 48 KB must be allowed per function
        # (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8).
        cupy.cuda.driver.funcSetAttribute(kern.kernel.ptr, 8, self.shared_bytes)
        self.grid = B * (2 * G + 1) * WARP_CLUSTER
        self.G, self.V = G, V
        c = ctypes
        self.launch = kernel_runtime.Launch(kern, [
            c.c_void_p(), c.c_void_p(), c.c_void_p(), c.c_void_p(), c.c_float(), c.c_int32(),
            c.c_void_p(), c.c_void_p(), c.c_void_p(), c.c_int32(B), c.c_int32(G), c.c_int32(V), c.c_int32(C),
            ("tpitch", c.c_int64((G + 1) * V)), c.c_void_p(err_ptr), c.c_void_p(record.data.ptr)])

    def __call__(self, stream, head, warps, tpitch=None):
        """head: draft, target, lengths, temps (pointers), temp_scalar, greedy_all. tpitch: elements
        from one request's target rows to the next's (default (G + 1) V: [B, G + 1, V])."""
        pitch = (self.G + 1) * self.V if tpitch is None else tpitch
        self.launch(stream, self.grid, WARP_THREADS, self.shared_bytes,
                    leading=head + (warps.top_k.data.ptr, warps.top_p.data.ptr, warps.span.data.ptr), tpitch=pitch)


class RowWarps:
    """warp_rows.cu over one logits row per request, for the device loop's samplers (decode_round.cu
    reads `record` [B, WARP_RECORD]: the row's maximum M and truncation threshold dmax): the last of
    the S columns of a [B, S, V] run output, which need not be contiguous rows. Value errors it finds
    go to a scratch buffer: the samplers report them themselves."""

    def __init__(self, dtype_name, B, V, device_id):
        import cupy
        self.B, self.V = B, V
        tag, vec = vec_width(dtype_name, V)   # run outputs are allocation-aligned: V decides
        self.itemsize = ITEMSIZE[tag]
        self.record = cupy.empty(B * WARP_RECORD, cupy.float32)
        self._errors = cupy.zeros(B, cupy.int32)
        self._rows = WarpRows(tag, vec, B, 0, V, device_id, self._errors.data.ptr, self.record)

    def __call__(self, stream, logits_ptr, S, temperature, warps):
        """Enqueue: rows logits[b, S - 1] of a [B, S, V] output at logits_ptr, at this temperature
        (0: greedy, nothing truncated; or [B] float32 CuPy, each row's), warps: a Warps of [B] CuPy
        arrays."""
        last = logits_ptr + (S - 1) * self.V * self.itemsize
        if isinstance(temperature, numbers.Real):
            head = (0, last, 0, 0, float(temperature), int(temperature == 0))
        else:
            head = (0, last, 0, temperature.data.ptr, 1.0, 0)
        self._rows(stream, head, warps, tpitch=S * self.V)
