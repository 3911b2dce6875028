"""Benchmark of verify() on the GPU: baseline / exact / sigmoid over vocabulary, gamma, batch, dtype.

Device time: CUDA events around each call (median), with the calls queued behind a busy kernel
so the events time GPU work rather than host launch gaps. Wall time: host clock around each
call including reading `accepted` back to the host (median). Inputs rotate among enough copies to
exceed twice the L2 cache, so no call reads logits that the previous call left in cache.
Bandwidth: the bytes the method must read (exact/baseline: every active logit row of both
models once; sigmoid: the two rows at the emitted position) over the device time, and that as
a fraction of the device-to-device copy bandwidth measured in the same run.
"""
import itertools
import time

import numpy as np

from specsample_cupy.verify import verify

L2_ROTATE_BYTES = 160 * 2 ** 20


def copy_bandwidth(cp, nbytes=2 * 2 ** 30, reps=20):
    """Device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = cp.ones(nbytes // 4, cp.float32)
    dst = cp.empty_like(src)
    for _ in range(3):
        dst[...] = src
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        dst[...] = src
    end.record()
    end.synchronize()
    return 2 * nbytes * reps / (cp.cuda.get_elapsed_time(start, end) * 1e-3)


def must_read_bytes(method, B, G, V, itemsize):
    rows = 2 if method == "sigmoid" else 2 * G + 1
    return B * rows * V * itemsize


def make_inputs(cp, B, G, V, dtype, seed=0):
    """A list of (tokens, draft, target) input sets; together larger than L2_ROTATE_BYTES."""
    per_set = B * (2 * G + 1) * V * np.dtype(dtype).itemsize
    copies = int(min(16, max(1, -(-L2_ROTATE_BYTES // per_set))))
    rs = cp.random.RandomState(seed)
    out = []
    for _ in range(copies):
        target = (rs.standard_normal((B, G + 1, V), dtype=cp.float32) * 2).astype(dtype)
        draft = (0.8 * target[:, :G].astype(cp.float32)
                 + 0.4 * rs.standard_normal((B, G, V), dtype=cp.float32)).astype(dtype)
        tokens = rs.randint(0, V, (B, G)).astype(cp.int32)
        out.append((tokens, draft, target))
    return out


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}
"""


def hold_device(cp, seconds):
    """Keep the stream busy so the calls queued behind it run back to back: their events then
    time the GPU's work, not the host's launch overhead."""
    kern = cp.RawKernel(_SPIN, "spin")
    clock_hz = cp.cuda.Device().attributes["ClockRate"] * 1e3
    kern((1,), (1,), (np.int64(seconds * clock_hz),))


def time_method(cp, method, inputs, reps, temperature=1.0):
    """(median device seconds per call from CUDA events, median wall seconds per call including
    reading `accepted` to the host)."""
    stream = cp.cuda.get_current_stream()
    for k in range(3):
        verify(*inputs[k % len(inputs)], method=method, temperature=temperature, seed=1, offset=k).accepted.get()
    starts = [cp.cuda.Event() for _ in range(reps)]
    ends = [cp.cuda.Event() for _ in range(reps)]
    hold_device(cp, 0.002 + reps * 200e-6)
    for k in range(reps):
        starts[k].record(stream)
        verify(*inputs[k % len(inputs)], method=method, temperature=temperature, seed=1, offset=k)
        ends[k].record(stream)
    ends[-1].synchronize()
    device = [cp.cuda.get_elapsed_time(s, e) * 1e-3 for s, e in zip(starts, ends)]
    wall = []
    for k in range(reps):
        t0 = time.perf_counter()
        verify(*inputs[k % len(inputs)], method=method, temperature=temperature, seed=2, offset=k).accepted.get()
        wall.append(time.perf_counter() - t0)
    return float(np.median(device)), float(np.median(wall))


def run(methods, vocabs, gammas, batches, dtypes, reps=30, progress=None):
    import cupy as cp
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    copy_bw = copy_bandwidth(cp)
    rows = []
    grid = list(itertools.product(dtypes, vocabs, gammas, batches))
    for dtype, V, G, B in (progress(grid) if progress else grid):
        inputs = make_inputs(cp, B, G, V, dtype)
        itemsize = np.dtype(dtype).itemsize
        for method in methods:
            dev, wall = time_method(cp, method, inputs, reps)
            nbytes = must_read_bytes(method, B, G, V, itemsize)
            row = dict(method=method, dtype=dtype, V=V, gamma=G, B=B, device_us=dev * 1e6,
                       wall_us=wall * 1e6, bytes=nbytes, gbps=nbytes / dev / 1e9,
                       copy_bw_fraction=nbytes / dev / copy_bw)
            rows.append(row)
        by_method = {r["method"]: r for r in rows[-len(methods):]}
        if "baseline" in by_method:
            base = by_method["baseline"]
            for r in by_method.values():
                r["wall_speedup_vs_baseline"] = base["wall_us"] / r["wall_us"]
                r["device_speedup_vs_baseline"] = base["device_us"] / r["device_us"]
        del inputs
        cp.get_default_memory_pool().free_all_blocks()
    return dict(device=props["name"].decode(), copy_bandwidth_gbps=copy_bw / 1e9,
                cupy=cp.__version__, reps=reps, rows=rows)
