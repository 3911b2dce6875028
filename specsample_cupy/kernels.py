"""Loads kernels_cu/verify.cu with cupy.RawModule, one compiled instantiation per
(dtype, token dtype, vector width, mode), cached for the process (and on disk by CuPy).

The launch is a single persistent grid sized to the device's occupancy (see the header of
verify.cu). A plan per (shapes, dtypes, mode, device, stream) holds the grid, the slicing, the
workspace (counters, per-slice statistics, race winners; the kernel leaves every counter at
zero, so no memset per call) and a prebuilt parameter block, so the host work per call is a
handful of pointer writes and one driver launch.
"""
import ctypes
import functools
import os
import re
from importlib import resources

MODE_LOGITS, MODE_PROBS, MODE_SIGMOID = 0, 1, 2
THREADS = 256
_DTYPE_TAG = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_TOKEN_TYPE = {"int32": "int", "int64": "long long"}
_ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2}


def kernel_source(name="verify.cu"):
    """A kernels_cu/ source with its local #include "..." lines inlined (NVRTC gets one self-contained
    text)."""
    root = resources.files("kernels_cu")

    def inline(name, seen):
        if name in seen:
            return ""
        seen.add(name)
        text = root.joinpath(name).read_text()
        return re.sub(r'^#include "([^"]+)"\s*$', lambda m: inline(m.group(1), seen), text, flags=re.M)

    return inline(name, set())


def name_expression(tag, token, vec, mode):
    return f"verify_kernel<{tag}, {token}, {vec}, {mode}>"


def all_name_expressions():
    """Every instantiation the package can launch (CI compiles all of them with nvcc)."""
    out = []
    for tag in _DTYPE_TAG.values():
        for token in _TOKEN_TYPE.values():
            for vec in (1, 16 // _ITEMSIZE[tag]):
                for mode in (MODE_LOGITS, MODE_PROBS, MODE_SIGMOID):
                    out.append(name_expression(tag, token, vec, mode))
    return out


@functools.lru_cache(maxsize=None)
def _kernel(device_id, name):
    import cupy
    options = ("--std=c++17",) + tuple(os.environ.get("SPECSAMPLE_KERNEL_DEFINES", "").split())
    if os.environ.get("SPECSAMPLE_KERNEL_LINEINFO"):
        options += ("--generate-line-info",)  # source lines in compute-sanitizer reports
    module = cupy.RawModule(code=kernel_source(), options=options, name_expressions=[name])
    return module.get_function(name)


@functools.lru_cache(maxsize=None)
def _resident_blocks(device_id, name):
    """Blocks of this kernel that fit on the device at once: the persistent grid's size."""
    import cupy
    kern = _kernel(device_id, name)
    sms = cupy.cuda.Device(device_id).attributes["MultiProcessorCount"]
    try:
        per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kern.kernel.ptr, THREADS, 0)
    except AttributeError:
        regs = max(kern.attributes["num_regs"], 1)
        per_sm = min(2048 // THREADS, 65536 // (((regs + 7) // 8 * 8) * THREADS))
    return max(per_sm, 1) * sms


def _sweeps_per_item(total_sweeps, capacity, max_sweeps):
    """Sweeps (THREADS * VEC elements) per work item: few enough items to fit one wave of the
    grid when the problem is small (latency: every load in flight at once), as much work per
    item as allowed when it is large (each item pays a fence, an atomic and a few barriers).
    SPECSAMPLE_MIN_SWEEPS (tuning) sets a floor: fewer, longer items and so fewer atomics."""
    floor = int(os.environ.get("SPECSAMPLE_MIN_SWEEPS", "1"))
    return max(floor, min(max_sweeps, -(-total_sweeps // capacity)))


class PrebuiltLaunch:
    """A kernel launched through the driver with a parameter block built once: a call writes the
    values that change into their ctypes slots and launches, a few µs of host time."""

    def __init__(self, func_ptr, args):
        import cupy
        self.func, self.args = func_ptr, args
        self.params = (ctypes.c_void_p * len(args))(*(ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args))
        self._launch = cupy.cuda.driver.launchKernel

    def set(self, values, start=0):
        """Write values into the argument slots start, start + 1, ..."""
        for slot, value in zip(self.args[start:], values):
            slot.value = value

    def __call__(self, stream, grid, block, shared_bytes=0):
        self._launch(self.func, grid, 1, 1, block, 1, 1, shared_bytes, stream.ptr, ctypes.addressof(self.params), 0)


class _Plan:
    """Everything about a launch that depends only on shapes, dtypes, mode, device and stream:
    the kernel, the grid, the slicing, a private workspace whose counters start (and are left by
    every launch) at zero, and a prebuilt kernel-parameter block so that a call only rewrites
    the pointers and scalars that change."""

    def __init__(self, B, G, V, tag, token, vec, mode, device_id):
        import cupy
        name = name_expression(tag, token, vec, mode)
        self.kern = _kernel(device_id, name)
        capacity = _resident_blocks(device_id, name)
        R = 0 if mode == MODE_SIGMOID else 2 * G + 1
        sweep = THREADS * vec
        sweeps = -(-V // sweep)
        max_sweeps = int(os.environ.get("SPECSAMPLE_MAX_SWEEPS", "256"))
        C1 = sweep * _sweeps_per_item(sweeps * B * R, capacity, max_sweeps)
        S1 = -(-V // C1)
        # P2: when P1 leaves part of the grid free, split the emitted rows over just that part,
        # so no P2 item waits for a block.
        spare = capacity - B * R * S1
        C2 = sweep * (-(-sweeps // max(1, spare // B)) if spare >= B else
                      _sweeps_per_item(sweeps * B, capacity, max_sweeps))
        S2 = -(-V // C2)
        grid = max(1, min(B * (R * S1 + S2), capacity))
        lag_waves = float(os.environ.get("SPECSAMPLE_LAG_WAVES", "4"))
        lag = 0 if R == 0 else max(1, int(-(-lag_waves * grid // (R * S1 + S2))))
        counters, part = 3 * B, B * R * S1 * 3
        self.workspace = cupy.zeros(counters + part + B * S2 * 4, dtype=cupy.int32)
        self.shared_bytes = R * 12  # the combined statistics of one request's rows
        self.grid = grid
        self.out_size = 3 * B + B * (G + 1)
        c = ctypes
        self.launch = PrebuiltLaunch(self.kern.kernel.ptr, [
            c.c_void_p(), c.c_void_p(), c.c_void_p(), c.c_void_p(), c.c_void_p(), c.c_float(),
            c.c_uint64(), c.c_void_p(), c.c_uint64(), c.c_void_p(), c.c_float(), c.c_float(),
            c.c_uint32(), *(c.c_int32(v) for v in (B, G, V, S1, C1, S2, C2, lag)),
            c.c_void_p(self.workspace.data.ptr), c.c_int64(counters), c.c_int64(counters + part),
            c.c_void_p()])

    def __call__(self, stream, head, out):
        """head: the 13 leading kernel arguments (pointers as ints); out: the output array."""
        self.launch.set(head)
        self.launch.args[-1].value = out.data.ptr
        self.launch(stream, self.grid, THREADS, self.shared_bytes)


_plans = {}


def _ptr(a):
    return 0 if a is None else a.data.ptr


def launch(draft_tokens, draft, target, *, dtype_name, lengths, temps, temp_scalar, seed, offset,
           mode, sigmoid_offset, sigmoid_scale, race_purpose, out=None):
    """Enqueue the verification kernel on the current stream. Returns the int32 output buffer
    [accepted B | emitted B | error B | tokens B*(G+1)]: `out` when given (a caller that reuses one
    buffer must have consumed the previous result in stream order), else a new array."""
    import cupy
    B, G1, V = target.shape
    tag = _DTYPE_TAG[dtype_name]
    vec = 16 // _ITEMSIZE[tag]
    target_ptr, draft_ptr = target.data.ptr, (draft.data.ptr if draft.size else target.data.ptr)
    if V % vec or target_ptr % 16 or draft_ptr % 16:
        vec = 1  # rows not 16-byte aligned: scalar loads
    stream = cupy.cuda.get_current_stream()
    key = (B, G1, V, tag, draft_tokens.dtype.char, vec, mode, cupy.cuda.runtime.getDevice(), stream.ptr)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) > 256:
            _plans.clear()
        plan = _plans[key] = _Plan(B, G1 - 1, V, tag, _TOKEN_TYPE[draft_tokens.dtype.name], vec, mode, key[7])
    if out is None or out.size != plan.out_size:
        out = cupy.empty(plan.out_size, dtype=cupy.int32)
    seed_dev = isinstance(seed, cupy.ndarray)
    offset_dev = isinstance(offset, cupy.ndarray)
    plan(stream, (draft_tokens.data.ptr, draft_ptr, target_ptr, _ptr(lengths), _ptr(temps), float(temp_scalar or 0.0),
                  0 if seed_dev else int(seed) & 0xFFFFFFFFFFFFFFFF, seed.data.ptr if seed_dev else 0,
                  0 if offset_dev else int(offset) & 0xFFFFFFFFFFFFFFFF, offset.data.ptr if offset_dev else 0,
                  float(sigmoid_offset), float(sigmoid_scale), int(race_purpose)), out)
    return out


def instantiation_source():
    """verify.cu plus a function that takes the address of every instantiation, so that an
    offline `nvcc -Xptxas -v` compiles (and reports registers/spills for) each one."""
    refs = "\n".join(f"  (void)&{name};" for name in all_name_expressions())
    return kernel_source() + f"\nvoid specsample_instantiate_all() {{\n{refs}\n}}\n"


if __name__ == "__main__":
    print(instantiation_source())
