"""Benchmark of verify() on the GPU: baseline / exact / sigmoid over vocabulary, gamma, batch, dtype.

Device time: CUDA events around each call (median), with the calls queued behind a busy kernel
so the events time GPU work rather than host launch gaps. Wall time: host clock around each
call including reading `accepted` back to the host (median). Inputs rotate, call after call (warm-up,
timed and wall-clock calls of every method alike), through enough copies to hold at least twice the
device's L2 cache (queried: `l2CacheSize`), so between two reads of one byte of input at least
2 x L2 of other input bytes are read (a single set that large rotates through itself): no call reads
logits that an earlier call left in cache.
Bandwidth: the bytes the method must read (every active logit row of both models once: exact and
baseline for the statistics, sigmoid for its NaN/Inf and no-mass checks) over the device time, and
that as a fraction of the device-to-device copy bandwidth measured in the same run.

On the CPU (NumPy inputs, run_cpu): the methods take turns call by call on one input set, and each
call's wall time and this process's CPU time are taken (medians); CPU time leaves out the time
other processes hold the cores, so it is the steadier number on a shared machine.
"""
import functools
import itertools
import platform
import time

import numpy as np

from specsample_cupy.verification.api import verify

L2_FALLBACK_BYTES = 60 * 2 ** 20   # H200; used only when the device does not report its L2 size


def l2_bytes(cp):
    """The current device's L2 cache size in bytes."""
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    return int(props.get("l2CacheSize") or L2_FALLBACK_BYTES)


class InputRing(list):
    """Input sets (tokens, draft, target), taken in turn by next(): consecutive uses of one set
    are len(self) calls apart, and len(self) sets hold at least `rotate_bytes` together."""

    def __init__(self, sets, rotate_bytes):
        super().__init__(sets)
        self.rotate_bytes, self.cursor = rotate_bytes, 0

    def next(self):
        item = self[self.cursor % len(self)]
        self.cursor += 1
        return item


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


ONEHOT = "exact-onehot"   # exact verification of deterministic drafts: verify(tokens, None, target)


def must_read_bytes(method, B, G, V, itemsize):
    """Logit bytes the method must read: every row of both models, or only the target's rows when the
    drafts are one-hot (no draft logits)."""
    rows = G + 1 if parse_method(method)[0] == ONEHOT else 2 * G + 1
    return B * rows * V * itemsize


def warped(method, spec):
    """The benchmark name of `method` with truncation `spec` ("top_p=0.9" or "top_k=50,top_p=0.9")."""
    return f"{method}[{spec}]"


def parse_method(name):
    """(verify method or ONEHOT, dict of top_k / top_p / min_p) from a benchmark method name."""
    if not name.endswith("]"):
        return name, {}
    method, spec = name[:-1].split("[", 1)
    warps = {}
    for item in spec.split(","):
        key, value = item.split("=")
        if key not in ("top_k", "top_p", "min_p"):
            raise ValueError(f"unknown truncation {key!r} in {name!r}: top_k, top_p or min_p")
        warps[key] = int(value) if key == "top_k" else float(value)
    return method, warps


def call_verify(method, inputs, warps=None, **kw):
    """verify() on one (tokens, draft, target) input set under a benchmark method name; warps: the
    name's truncation prebuilt (build_warps), else verify() builds it from top_k / top_p / min_p."""
    tokens, draft, target = inputs
    method, spec = parse_method(method)
    truncation = {} if not spec else (dict(warps=warps) if warps is not None else spec)
    if method == ONEHOT:
        return verify(tokens, None, target, method="exact", **truncation, **kw)
    return verify(tokens, draft, target, method=method, **truncation, **kw)


def make_inputs(cp, B, G, V, dtype, seed=0, rotate_bytes=None):
    """An InputRing of (tokens, draft, target) input sets (one random set, copied to distinct
    buffers) that together hold at least rotate_bytes (default: twice the device's L2 cache)."""
    rotate_bytes = 2 * l2_bytes(cp) if rotate_bytes is None else rotate_bytes
    per_set = B * (2 * G + 1) * V * np.dtype(dtype).itemsize + B * G * 4
    copies = int(max(1, -(-rotate_bytes // per_set)))
    rs = cp.random.RandomState(seed)
    tokens, draft, target = random_set(cp, lambda shape: rs.standard_normal(shape, dtype=cp.float32),
                                       lambda high, shape: rs.randint(0, high, shape), B, G, V, dtype)
    sets = [(tokens, draft, target)] + [tuple(a.copy() for a in (tokens, draft, target)) for _ in range(copies - 1)]
    return InputRing(sets, rotate_bytes)


def random_set(xp, normal, integers, B, G, V, dtype):
    """(tokens, draft, target): target logits ~ N(0, 4), draft logits 0.8 x target + N(0, 0.16),
    uniformly random draft tokens. normal(shape) gives float32 N(0, 1), integers(high, shape) ints."""
    target = (normal((B, G + 1, V)) * 2).astype(dtype)
    draft = (0.8 * target[:, :G].astype(xp.float32) + 0.4 * normal((B, G, V))).astype(dtype)
    tokens = integers(V, (B, G)).astype(xp.int32)
    return tokens, draft, target


def _next_input(inputs, k):
    """The next input set: in turn from an InputRing; a plain list is indexed k % len."""
    return inputs.next() if isinstance(inputs, InputRing) else inputs[k % len(inputs)]


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


def device_seconds(cp, call, reps, per_call_s=200e-6):
    """Median device seconds of call(k), k = 0 .. reps-1, each between two CUDA events on the current
    stream, all queued behind a busy kernel (hold_device) that outlasts their launches."""
    stream = cp.cuda.get_current_stream()
    starts = [cp.cuda.Event() for _ in range(reps)]
    ends = [cp.cuda.Event() for _ in range(reps)]
    hold_device(cp, 0.002 + reps * per_call_s)
    for k in range(reps):
        starts[k].record(stream)
        call(k)
        ends[k].record(stream)
    ends[-1].synchronize()
    return float(np.median([cp.cuda.get_elapsed_time(s, e) * 1e-3 for s, e in zip(starts, ends)]))


def wall_seconds(call, reps):
    """Median wall seconds of call(k), k = 0 .. reps-1 (each returns with its result on the host)."""
    wall = []
    for k in range(reps):
        t0 = time.perf_counter()
        call(k)
        wall.append(time.perf_counter() - t0)
    return float(np.median(wall))


def time_method(cp, method, inputs, reps, temperature=1.0):
    """(median device seconds per call from CUDA events, median wall seconds per call including
    reading `accepted` to the host). A truncation is built once (build_warps), as a decoding loop
    does: built per call, its three uploads from pageable memory would wait for the stream and put
    host time between the events."""
    from specsample_cupy.verification.truncation import build_warps
    target = _next_input(inputs, 0)[2]
    spec = parse_method(method)[1]
    warps = build_warps(cp, target.shape[0], target.shape[2], temperature, **spec) if spec else None
    call = functools.partial(call_verify, warps=warps)
    for k in range(3):
        call(method, _next_input(inputs, k), temperature=temperature, seed=1, offset=k).accepted.get()
    device = device_seconds(cp, lambda k: call(method, _next_input(inputs, k), temperature=temperature, seed=1,
                                               offset=k), reps)
    wall = wall_seconds(lambda k: call(method, _next_input(inputs, k), temperature=temperature, seed=2,
                                       offset=k).accepted.get(), reps)
    return device, wall


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


def time_cpu(methods, inputs, reps, temperature=1.0):
    """{method: (median wall seconds, median CPU seconds)} per verify() call on NumPy inputs, the
    methods taking turns call by call so that a change in the machine's load hits them alike."""
    for k in range(3):
        for method in methods:
            call_verify(method, inputs, temperature=temperature, seed=1, offset=k)
    wall = {method: [] for method in methods}
    cpu = {method: [] for method in methods}
    for k in range(reps):
        for method in methods:
            w0, c0 = time.perf_counter(), time.process_time()
            call_verify(method, inputs, temperature=temperature, seed=1, offset=k)
            cpu[method].append(time.process_time() - c0)
            wall[method].append(time.perf_counter() - w0)
    return {method: (float(np.median(wall[method])), float(np.median(cpu[method]))) for method in methods}


def run_cpu(methods, vocabs, gammas, batches, dtypes, reps=30, progress=None):
    """verify() on NumPy inputs (the CPU reference and the NumPy baseline), one row per method and
    configuration, with speed-ups over the baseline where it ran."""
    rows = []
    grid = list(itertools.product(dtypes, vocabs, gammas, batches))
    for dtype, V, G, B in (progress(grid) if progress else grid):
        rng = np.random.default_rng(0)
        inputs = random_set(np, lambda shape: rng.standard_normal(shape, dtype=np.float32),
                            lambda high, shape: rng.integers(0, high, shape), B, G, V, dtype)
        times = time_cpu(methods, inputs, reps)
        for method, (wall, cpu) in times.items():
            row = dict(method=method, dtype=dtype, V=V, gamma=G, B=B, wall_us=wall * 1e6, cpu_us=cpu * 1e6)
            if "baseline" in times:
                row["wall_speedup_vs_baseline"] = times["baseline"][0] / wall
                row["cpu_speedup_vs_baseline"] = times["baseline"][1] / cpu
            rows.append(row)
    return dict(device=_cpu_name(), numpy=np.__version__, reps=reps, rows=rows)


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


# ---- the rows-read table (issue 38): exact / sigmoid / sigmoid-paper, random and sampled drafts ------
ROWS_READ_POINTS = ((1, 32000), (1, 151936), (1, 256000), (8, 151936), (64, 151936), (64, 256000))


def sampled_drafts(cp, inputs, seed=0):
    """The input ring with each set's draft tokens drawn from softmax(draft) (Gumbel argmax), so
    acceptance is what a real draft gets instead of random ids' early rejections."""
    rs = cp.random.RandomState(seed + 1)
    out = []
    for tokens, draft, target in inputs:
        g = -cp.log(-cp.log(rs.uniform(1e-20, 1.0, draft.shape, dtype=cp.float32)))
        out.append(((draft.astype(cp.float32) + g).argmax(-1).astype(cp.int32), draft, target))
    return InputRing(out, inputs.rotate_bytes)


def drafts_ring(cp, B, G, V, dtype, drafts):
    """make_inputs' InputRing with one kind of drafts: "random" (uniformly random ids: most requests
    reject at position 0), "sampled" (ids drawn from the draft's softmax: a fair draft's acceptance)
    or "accepted" (draft logits equal to the target's: every draft accepted)."""
    ring = make_inputs(cp, B, G, V, dtype)
    if drafts == "accepted":
        return InputRing([(t, cp.ascontiguousarray(tg[:, :G]), tg) for t, _, tg in ring], ring.rotate_bytes)
    if drafts == "sampled":
        return sampled_drafts(cp, ring)
    if drafts != "random":
        raise ValueError(f"drafts must be random, sampled or accepted, got {drafts!r}")
    return ring


def rows_read_table(points=ROWS_READ_POINTS, dtypes=("float32",), gamma=5, reps=30,
                    methods=("exact", "sigmoid", "sigmoid-paper")):
    """Device µs per call (time_method: rotated inputs, queued behind a busy kernel) of each method
    at each (B, V) point, for random draft ids and for ids sampled from the draft."""
    import cupy as cp
    rows = []
    for dtype in dtypes:
        for B, V in points:
            ring = make_inputs(cp, B, gamma, V, dtype)
            for drafts, inputs in (("random", ring), ("sampled", sampled_drafts(cp, ring))):
                for method in methods:
                    dev, _ = time_method(cp, method, inputs, reps)
                    rows.append(dict(dtype=dtype, B=B, V=V, drafts=drafts, method=method, us=dev * 1e6))
            del ring, inputs
            cp.get_default_memory_pool().free_all_blocks()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    return dict(device=props["name"].decode(), gamma=gamma, reps=reps, rows=rows)
