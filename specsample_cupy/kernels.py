"""Loads kernels_cu/verify.cu with cupy.RawModule, one compiled instantiation per
(dtype, token dtype, vector width, mode), cached for the process (and on disk by CuPy).

The launch is a single persistent grid sized to the device's occupancy (see the header of
verify.cu). Workspace (counters, per-slice statistics, race winners) is preallocated per
(device, stream) and reused; the kernel leaves every counter at zero, so no memset per call.
"""
import functools
import os
import re
from importlib import resources

import numpy as np

MODE_LOGITS, MODE_PROBS, MODE_SIGMOID = 0, 1, 2
THREADS = 256
_DTYPE_TAG = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_TOKEN_TYPE = {"int32": "int", "int64": "long long"}
_ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2}


def kernel_source():
    """verify.cu with its local #include "..." lines inlined (NVRTC gets one self-contained text)."""
    root = resources.files("kernels_cu")

    def inline(name, seen):
        if name in seen:
            return ""
        seen.add(name)
        text = root.joinpath(name).read_text()
        return re.sub(r'^#include "([^"]+)"\s*$', lambda m: inline(m.group(1), seen), text, flags=re.M)

    return inline("verify.cu", set())


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
    options = ("--std=c++17",)
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


def _slices(sweeps_per_row, rows, capacity, max_sweeps):
    """Sweeps (THREADS * VEC elements) per item: enough items to fill the grid twice, then as
    much work per item as allowed, since every item pays a fence, an atomic and barriers."""
    k = max(1, min(max_sweeps, (sweeps_per_row * rows) // max(1, 2 * capacity)))
    return 1 << (k.bit_length() - 1)


class _Plan:
    """Everything about a launch that depends only on shapes, dtypes, mode, device and stream:
    the kernel, the grid, the slicing, and a private workspace whose counters start (and are
    left by every launch) at zero."""

    def __init__(self, B, G, V, tag, token, vec, mode, device_id):
        import cupy
        self.kern = _kernel(device_id, name_expression(tag, token, vec, mode))
        capacity = _resident_blocks(device_id, name_expression(tag, token, vec, mode))
        R = 0 if mode == MODE_SIGMOID else 2 * G + 1
        sweep = THREADS * vec
        sweeps = -(-V // sweep)
        max_sweeps = int(os.environ.get("SPECSAMPLE_MAX_SWEEPS", "32"))
        C1 = sweep * _slices(sweeps, B * R, capacity, max_sweeps)
        C2 = sweep * _slices(sweeps, B, capacity // 2, max_sweeps)
        S1, S2 = -(-V // C1), -(-V // C2)
        counters, part, stat = B * R + 3 * B, B * R * S1 * 3, B * R * 3
        self.workspace = cupy.zeros(counters + part + stat + B * S2 * 4, dtype=cupy.int32)
        self.grid = (max(1, min(B * (R * S1 + S2), capacity)),)
        self.shape_args = tuple(np.int32(v) for v in (B, G, V, S1, C1, S2, C2))
        self.ws_args = (self.workspace, np.int64(counters), np.int64(counters + part),
                        np.int64(counters + part + stat))
        self.out_size = 3 * B + B * (G + 1)


_plans = {}
_NULL = np.uint64(0)


def launch(draft_tokens, draft, target, *, dtype_name, lengths, temps, temp_scalar, seed, offset,
           mode, sigmoid_offset, sigmoid_scale, race_purpose):
    """Enqueue the verification kernel on the current stream. Returns the int32 output buffer
    [accepted B | emitted B | error B | tokens B*(G+1)]."""
    import cupy
    B, G1, V = target.shape
    tag = _DTYPE_TAG[dtype_name]
    vec = 16 // _ITEMSIZE[tag]
    if V % vec or target.data.ptr % 16 or (draft.size and draft.data.ptr % 16):
        vec = 1  # rows not 16-byte aligned: scalar loads
    stream = cupy.cuda.get_current_stream()
    device_id = cupy.cuda.runtime.getDevice()
    key = (B, G1, V, tag, draft_tokens.dtype.char, vec, mode, device_id, stream.ptr)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) > 256:
            _plans.clear()
        plan = _plans[key] = _Plan(B, G1 - 1, V, tag, _TOKEN_TYPE[draft_tokens.dtype.name], vec, mode, device_id)
    out = cupy.empty(plan.out_size, dtype=cupy.int32)
    seed_dev = isinstance(seed, cupy.ndarray)
    offset_dev = isinstance(offset, cupy.ndarray)
    plan.kern(plan.grid, (THREADS,), (
        draft_tokens, draft if draft.size else target, target,
        _NULL if lengths is None else lengths, _NULL if temps is None else temps, np.float32(temp_scalar),
        _NULL if seed_dev else np.uint64(seed), seed if seed_dev else _NULL,
        _NULL if offset_dev else np.uint64(offset & 0xFFFFFFFFFFFFFFFF), offset if offset_dev else _NULL,
        np.float32(sigmoid_offset), np.float32(sigmoid_scale), np.uint32(race_purpose),
        *plan.shape_args, *plan.ws_args, out))
    return out


def instantiation_source():
    """verify.cu plus a function that takes the address of every instantiation, so that an
    offline `nvcc -Xptxas -v` compiles (and reports registers/spills for) each one."""
    refs = "\n".join(f"  (void)&{name};" for name in all_name_expressions())
    return kernel_source() + f"\nvoid specsample_instantiate_all() {{\n{refs}\n}}\n"


if __name__ == "__main__":
    print(instantiation_source())
