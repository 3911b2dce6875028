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


class _Workspace:
    """One int32 buffer: [counters (zeroed once) | slice statistics | row statistics | race winners]."""

    def __init__(self):
        self.buf = None
        self.counters = 0
        self.size = 0

    def get(self, counters, data):
        import cupy
        if self.buf is None or counters > self.counters or data > self.size - self.counters:
            self.counters = max(counters, 2 * self.counters)
            self.size = self.counters + max(data, 2 * (self.size - self.counters))
            self.buf = cupy.zeros(self.size, dtype=cupy.int32)
        return self.buf, self.counters


_workspaces = {}


def _slices(sweeps_per_row, rows, capacity):
    """Sweeps (THREADS * VEC elements) per item: enough items to fill the grid, at most 8 sweeps."""
    k = max(1, min(8, (sweeps_per_row * rows) // max(1, 2 * capacity)))
    return 1 << (k.bit_length() - 1)


def launch(draft_tokens, draft, target, *, dtype_name, lengths, temps, temp_scalar, seed, offset,
           mode, sigmoid_offset, sigmoid_scale, race_purpose):
    """Enqueue the verification kernel on the current stream. Returns the int32 output buffer
    [accepted B | emitted B | error B | tokens B*(G+1)]."""
    import cupy
    B, G1, V = target.shape
    G = G1 - 1
    tag = _DTYPE_TAG[dtype_name]
    vec = 16 // _ITEMSIZE[tag]
    aligned = V % vec == 0 and all(a.data.ptr % 16 == 0 for a in (draft, target) if a.size)
    if not aligned:
        vec = 1
    name = name_expression(tag, _TOKEN_TYPE[draft_tokens.dtype.name], vec, mode)
    device_id = cupy.cuda.Device().id
    kern = _kernel(device_id, name)
    capacity = _resident_blocks(device_id, name)

    R = 0 if mode == MODE_SIGMOID else 2 * G + 1
    sweep = THREADS * vec
    sweeps = -(-V // sweep)
    C1 = sweep * _slices(sweeps, B * R, capacity)
    C2 = sweep * _slices(sweeps, B, capacity // 2)
    S1, S2 = -(-V // C1), -(-V // C2)

    stream = cupy.cuda.get_current_stream()
    ws = _workspaces.setdefault((device_id, stream.ptr), _Workspace())
    part, stat, cand = B * R * S1 * 3, B * R * 3, B * S2 * 4
    buf, counters = ws.get(B * R + 3 * B, part + stat + cand)
    out = cupy.empty(3 * B + B * G1, dtype=cupy.int32)

    def ptr(a):
        return a if a is not None else np.uint64(0)

    seed_val, seed_arr = (np.uint64(0), seed) if isinstance(seed, cupy.ndarray) else (np.uint64(seed), None)
    off_val, off_arr = (np.uint64(0), offset) if isinstance(offset, cupy.ndarray) else (np.uint64(offset & 0xFFFFFFFFFFFFFFFF), None)
    items = B * (R * S1 + S2)
    grid = max(1, min(items, capacity))
    kern((grid,), (THREADS,), (
        draft_tokens, draft if draft.size else target, target, ptr(lengths), ptr(temps),
        np.float32(temp_scalar), seed_val, ptr(seed_arr), off_val, ptr(off_arr),
        np.float32(sigmoid_offset), np.float32(sigmoid_scale), np.uint32(race_purpose),
        np.int32(B), np.int32(G), np.int32(V), np.int32(S1), np.int32(C1), np.int32(S2), np.int32(C2),
        buf, np.int64(counters), np.int64(counters + part), np.int64(counters + part + stat), out))
    return out


def instantiation_source():
    """verify.cu plus a function that takes the address of every instantiation, so that an
    offline `nvcc -Xptxas -v` compiles (and reports registers/spills for) each one."""
    refs = "\n".join(f"  (void)&{name};" for name in all_name_expressions())
    return kernel_source() + f"\nvoid specsample_instantiate_all() {{\n{refs}\n}}\n"


if __name__ == "__main__":
    print(instantiation_source())
