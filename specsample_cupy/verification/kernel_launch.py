"""The verification kernel (kernels_cu/verify.cu): one compiled instantiation per (dtype, token
dtype, vector width, mode, line info), and launch plans, both through specsample_cupy.kernel_runtime.

The launch is a single grid whose blocks take work items in order from a ticket counter (see the
header of verify.cu), sized by default to the blocks that fit on the device at once. A plan per
(shapes, dtypes, mode, device, stream, PlanOptions) holds the grid, the slicing, the workspace
(ticket and request counters, per-slice statistics, race winners; the kernel leaves every counter
at zero, so no memset per call) and a prebuilt parameter block, so the host work per call is a
handful of slot writes and one driver launch. Plans live in a kernel_runtime.PlanCache of
PLAN_LIMIT plans, plus those used during a CUDA graph capture, which stay for the process.

Constants shared with the CUDA sources (error codes, Philox purposes) are defined once in Python
(specsample_cupy/runtime/errors.py, specsample_cupy/runtime/philox.py):
kernel_runtime.kernel_source() replaces every `#include "codes.cuh"` line with the header
kernel_runtime.codes_header() generates from them. Offline compilers use the same text:
`python3 -m specsample_cupy.verification.kernel_launch --source NAME.cu` (one self-contained source)
or `--codes-header` (the header alone).
"""
import ctypes
import dataclasses
import functools
import math

from specsample_cupy.runtime import kernel_runtime
from specsample_cupy.runtime.kernel_runtime import codes_header, kernel_source
from specsample_cupy.verification.load_width import DTYPE_TAG, ITEMSIZE, vec_width
from specsample_cupy.verification.warp_rows_launch import WARP_RECORD, WarpRows

MODE_LOGITS, MODE_PROBS, MODE_SIGMOID, MODE_SIGMOID_PAPER = 0, 1, 2, 3
MODE_WARPED = 4     # logits truncated by top-k / top-p / min-p (row statistics from warp_rows.cu)
MODE_MIN_P = 5      # logits truncated by min-p alone (row statistics fused into verify.cu's P1)
CAND_INTS = 6       # verify.cu's SS_CAND: ints per P2 slice's race candidates
PART_INTS = 4       # verify.cu's SS_PART: ints per P1 slice's partial (statistics and value-error bits)
MIN_P_LIST = 1024   # verify.cu's SS_LIST: candidates per warp of a min-p slice of several load groups
THREADS = 256
_TOKEN_TYPE = {"int32": "int", "int64": "long long"}


def name_expression(tag, token, vec, mode):
    return f"verify_kernel<{tag}, {token}, {vec}, {mode}>"


def all_name_expressions():
    """Every instantiation the package can launch (CI compiles all of them with nvcc)."""
    out = []
    for tag in DTYPE_TAG.values():
        for token in _TOKEN_TYPE.values():
            for vec in (1, 16 // ITEMSIZE[tag]):
                for mode in (MODE_LOGITS, MODE_PROBS, MODE_SIGMOID, MODE_SIGMOID_PAPER, MODE_WARPED, MODE_MIN_P):
                    out.append(name_expression(tag, token, vec, mode))
    return out


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """Explicit parameters of the verification kernel's launch plan, for tuning, tests and
    sanitizer runs; the defaults are the production plan. Every field is part of the plan cache
    key, and `lineinfo` also of the compiled-module cache key.

    max_sweeps: most sweeps (THREADS * VEC consecutive elements of a row) per work item.
    min_sweeps: fewest sweeps per work item where the plan sizes them (fewer, longer items: fewer
        arrivals on a request's counter); None: 1, and P1 items of MIN_ITEM_ELEMENTS elements where
        those leave half the grid free.
    p1_sweeps: sweeps per P1 item (one vocabulary slice of one row), forcing
        ceil(V / (p1_sweeps * THREADS * VEC)) slices per row; None sizes them from the occupancy.
    p2_sweeps: sweeps per P2 item (one slice of the emitted row), forcing that many P2 blocks per
        request likewise; None sizes them from the occupancy.
    lag_waves: how far, in waves of the grid, a request's P2 items follow its P1 items in the item
        order (so P2 blocks rarely wait); 0 puts them right after.
    walk: exact, probabilities and greedy verification in the walk order (position by position,
        skipping the rows of requests known to have stopped before them; verify.cu's header) instead
        of every row at once. It pays where the grid is oversubscribed and drafts are rejected early
        (H100, B = 64, V = 151936, random drafts: 111 against 183 µs fp32, 85 against 112 fp16) and
        costs where every item is resident at once (0.5-0.72x at B <= 8; benchmarks/verify_walk.py).
        None (the default): the walk where a call's rows hold at least WALK_MIN_BYTES.
    grid: blocks launched; None launches min(work items, blocks resident at once). Any value is
        correct: work is handed out in order from a ticket counter, so extra blocks only queue and
        a single block does everything in turn. Changing it never changes the result.
    lineinfo: compile with --generate-line-info (source lines in compute-sanitizer reports).
    """
    max_sweeps: int = 256
    min_sweeps: int | None = None
    p1_sweeps: int | None = None
    p2_sweeps: int | None = None
    lag_waves: float = 4.0
    walk: bool | None = None
    grid: int | None = None
    lineinfo: bool = False

    def __post_init__(self):
        for name in ("max_sweeps", "min_sweeps", "p1_sweeps", "p2_sweeps", "grid"):
            v = getattr(self, name)
            if v is None and name in ("min_sweeps", "p1_sweeps", "p2_sweeps", "grid"):
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"PlanOptions.{name} must be a positive int, got {v!r}")
        if self.min_sweeps is not None and self.min_sweeps > self.max_sweeps:
            raise ValueError(f"PlanOptions.min_sweeps ({self.min_sweeps}) > max_sweeps ({self.max_sweeps})")
        if not (isinstance(self.lag_waves, (int, float)) and 0 <= self.lag_waves < float("inf")):
            raise ValueError(f"PlanOptions.lag_waves must be finite and >= 0, got {self.lag_waves!r}")
        if self.walk is not None and not isinstance(self.walk, bool):
            raise ValueError(f"PlanOptions.walk must be a bool or None, got {self.walk!r}")
        if not isinstance(self.lineinfo, bool):
            raise ValueError(f"PlanOptions.lineinfo must be a bool, got {self.lineinfo!r}")


DEFAULT_PLAN = PlanOptions()

# The walk order by default (PlanOptions.walk None) where a call's 2 gamma + 1 rows per request hold this
# many bytes: there reading every row costs more than the walk's position-by-position decisions
# (H100, V = 151936, gamma = 5: float32 B = 64, 428 MB, 183 -> 111 µs on random drafts and 1 % faster
# with every draft accepted; float16 B = 64, 214 MB, 2-4 % slower when every draft is accepted; B <= 8,
# 53 MB or less, 0.5-0.72x; benchmarks/NOTES.md, "The walk order").
WALK_MIN_BYTES = 256 << 20
# Sweeps per P1 item in the walk order at most (64 KiB). Items sized so that one position's rows fill
# exactly one wave all finish together, so the next position's items are handed out before any of the
# decisions they could skip on; with shorter items a position spans two or more waves and the early
# requests' decisions are known by the time their next items are handed out (H100, V = 151936, random
# drafts, device µs, one-wave items -> 16 sweeps: float32 B = 64 127.7 -> 111.3, B = 128 228.6 ->
# 194.7; float16 B = 128 144.7 -> 130.3; drafts sampled from q 0.89-0.95x; every draft accepted
# float32 1.00x, float16 up to 1.05x; benchmarks/verify_walk.py --sweeps, NOTES.md "The walk order").
WALK_ITEM_SWEEPS = 16


def _kernel(name, lineinfo):
    """The compiled instantiation `name` of verify.cu for the current device."""
    return kernel_runtime.functions("verify.cu", (name,), lineinfo=lineinfo)[0]


@functools.lru_cache(maxsize=None)
def _multiprocessors(device_id):
    import cupy
    return cupy.cuda.Device(device_id).attributes["MultiProcessorCount"]


@functools.lru_cache(maxsize=None)
def _resident_blocks(device_id, name, lineinfo, shared_bytes):
    """Blocks of this kernel that fit on the device at once with `shared_bytes` of dynamic shared
    memory each (what the launch passes): the default grid's size."""
    import cupy
    kern = _kernel(name, lineinfo)
    sms = _multiprocessors(device_id)
    try:
        per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kern.kernel.ptr, THREADS, shared_bytes)
    except AttributeError:
        regs = max(kern.attributes["num_regs"], 1)
        per_sm = min(2048 // THREADS, 65536 // (((regs + 7) // 8 * 8) * THREADS))
    return max(per_sm, 1) * sms


# Elements of a row per P1 item at small batches (PlanOptions.min_sweeps None). Filling the grid there
# cut rows into items of one or a few sweeps, and every item pays a ticket, a fence, its statistics'
# write and an arrival on its request's counter, which P2 then combines. Items of 8192 elements are
# faster where they leave half the grid free (B = 1, gamma = 5, H200: plain exact 19.6 -> 17.7 µs at
# float32, V = 151936; 15.2 -> 13.1 at V = 32000), slower where the grid was full (B = 8, V = 32000:
# 17.6 -> 19.7); min-p's register path holds one such item (benchmarks/NOTES.md, "P1 items at small
# batches").
MIN_ITEM_ELEMENTS = 8192


def _sweeps_per_item(total_sweeps, capacity, max_sweeps, min_sweeps):
    """Sweeps (THREADS * VEC) per work item for `total_sweeps` over at most `capacity` items: few
    enough items to fit one wave of the grid when the problem is small (latency: every load in
    flight at once), as much work per item as allowed when it is large (each item pays a ticket, a
    fence, an atomic and a few barriers)."""
    return max(min_sweeps, min(max_sweeps, -(-total_sweeps // capacity)))


def _p1_sweeps(V, B, R, sweep, capacity, sms, mode, opts):
    """Sweeps per P1 item for B requests of R rows of V elements, sweeps of `sweep` elements, a grid
    of `capacity` resident blocks on `sms` multiprocessors: sized from the occupancy, then lengthened
    to MIN_ITEM_ELEMENTS where such items leave half the grid free; where they do not, a single
    request's logits to about one item per multiprocessor (opts.min_sweeps None)."""
    rows, row_sweeps = B * R, -(-V // sweep)
    sized = _sweeps_per_item(row_sweeps * rows, capacity, opts.max_sweeps, opts.min_sweeps or 1)
    if opts.min_sweeps is not None:
        return sized
    longer = max(sized, min(opts.max_sweeps, MIN_ITEM_ELEMENTS // sweep))
    if 2 * rows * -(-V // (sweep * longer)) <= capacity:
        return longer
    # One request (V = 256000 at gamma 5, V >= 151936 from gamma 7): its 132 items of one per
    # multiprocessor still keep enough loads in flight, and P2's decision combines a third of the
    # partials that one wave of short items leaves (H100, gamma 5, V = 256000: exact 20.1 -> 19.3 µs
    # float32, 20.1 -> 17.5 float16; greedy and one-hot drafts 0.89-0.97x). Not where 8192-element
    # items leave half the grid free (fp32 1.01-1.035x, greedy 1.02x), nor for two requests or more
    # (B = 2-8: 0.97-1.78x), nor probabilities (1.01-1.05x), nor min-p (whose register path holds
    # MIN_ITEM_ELEMENTS); benchmarks/NOTES.md, "One request: a P1 item per multiprocessor".
    if B == 1 and mode == MODE_LOGITS:
        return max(longer, min(opts.max_sweeps, -(-row_sweeps // max(1, sms // R))))
    return sized


class _Plan:
    """Everything about a launch that depends only on shapes, dtypes, mode, device, stream and
    PlanOptions: the kernel, the grid, the slicing, a private workspace whose counters start (and
    are left by every launch) at zero, and a prebuilt kernel-parameter block so that a call only
    rewrites the pointers and scalars that change."""

    def __init__(self, B, G, V, tag, token, vec, mode, device_id, opts):
        import cupy
        name = name_expression(tag, token, vec, mode)
        self.kern = _kernel(name, opts.lineinfo)
        R = 2 * G + 1                 # rows per request: gamma + 1 target rows, gamma draft rows
        # Dynamic: the combined statistics (3 ints) and value-error bits (1 int) of one request's rows;
        # min-p: then 8 warps' candidate lists of MIN_P_LIST floats (verify.cu's SS_LIST).
        self.shared_bytes = R * 16 + (8 * MIN_P_LIST * 4 if mode == MODE_MIN_P else 0)
        capacity = _resident_blocks(device_id, name, opts.lineinfo, self.shared_bytes)
        sweep = THREADS * vec
        sweeps = -(-V // sweep)
        walk = B * R * V * ITEMSIZE[tag] >= WALK_MIN_BYTES if opts.walk is None else opts.walk
        walk = walk and mode in (MODE_LOGITS, MODE_PROBS)
        if walk:   # one position's 2B rows in at least one wave of the grid, of WALK_ITEM_SWEEPS at most
            one_wave = -(-sweeps // max(1, capacity // (2 * B)))
            C1 = sweep * (opts.p1_sweeps or min(opts.max_sweeps, WALK_ITEM_SWEEPS, one_wave))
        else:
            sms = _multiprocessors(device_id)
            C1 = sweep * (opts.p1_sweeps or _p1_sweeps(V, B, R, sweep, capacity, sms, mode, opts))
        S1 = -(-V // C1)
        if mode in (MODE_WARPED, MODE_SIGMOID, MODE_SIGMOID_PAPER):
            S1 = 0   # warped: the statistics come from warp_rows.cu; sigmoid: P2 reads what it needs
        # P2: the emitted rows cut into as many slices as fill one wave of the grid at most, one sweep
        # each where they fit (each block's race is then one round trip). Items past the blocks P1
        # leaves free go to blocks as they finish P1; sharing the rows among the free blocks alone made
        # items of 7-23 sweeps where few were free, each a long race after the decision (H100, exact:
        # B = 2, V = 151936 float32 24.8 -> 20.2 µs; B = 4 float16 33.6 -> 22.0; B = 2, V = 256000
        # float32 35.4 -> 24.5; benchmarks/plan_sweep.py --p2, results/verify_p2_rule_h100.json). One
        # slice more per row than a wave holds costs a second wave: the sigmoid methods, whose work is
        # all P2, took 1.3x at B = 64, V = 256000 with 9 slices per row instead of 8.
        C2 = sweep * (opts.p2_sweeps or _sweeps_per_item(sweeps, max(1, capacity // B), opts.max_sweeps,
                                                         opts.min_sweeps or 1))
        S2 = -(-V // C2)
        per_request = R * S1 + S2
        items = B * per_request
        auto_grid = max(1, min(items, capacity))
        grid = opts.grid or auto_grid
        lag = max(1, math.ceil(opts.lag_waves * auto_grid / per_request)) if opts.lag_waves > 0 else 0
        if items + grid >= 2 ** 31:
            raise ValueError(f"verify: {items} work items and {grid} blocks exceed the kernel's 31-bit ticket counter")
        # [req B | fin B | err B | ticket | min-p: row max keys B R | row counts B R | walk: stops B |
        # position counters B (G + 1)], then the partials (16-byte words of PART_INTS: the counters
        # padded to a multiple of it)
        extra = 2 * B * R if mode == MODE_MIN_P else (B * (G + 2) if walk else 0)
        counters = -(-(3 * B + 1 + extra) // PART_INTS) * PART_INTS
        part = B * R * S1 * PART_INTS
        self.workspace = cupy.zeros(counters + part + B * S2 * CAND_INTS, dtype=cupy.int32)
        self.err_ptr = self.workspace.data.ptr + 4 * 2 * B      # the per-request error bits
        self.record = cupy.empty(B * R * WARP_RECORD, cupy.float32) if mode == MODE_WARPED else None
        self.grid, self.capacity = grid, capacity
        self.S1, self.C1, self.S2, self.C2, self.lag, self.walk = S1, C1, S2, C2, lag, walk
        self.out_size = 3 * B + B * (G + 1)
        c = ctypes
        self.launch = kernel_runtime.Launch(self.kern, [
            c.c_void_p(), c.c_void_p(), c.c_void_p(), c.c_void_p(), c.c_void_p(), c.c_float(), c.c_int32(),
            c.c_uint64(), c.c_void_p(), c.c_uint64(), c.c_void_p(), c.c_void_p(), c.c_float(), c.c_float(),
            c.c_uint32(), *(c.c_int32(v) for v in (B, G, V, S1, C1, S2, C2, lag, walk)),
            c.c_void_p(self.workspace.data.ptr), c.c_int64(counters), c.c_int64(counters + part),
            ("record", c.c_void_p(0 if self.record is None else self.record.data.ptr)), ("out", c.c_void_p())])
        self.warp = WarpRows(tag, vec, B, G, V, device_id, self.err_ptr, self.record) \
            if mode == MODE_WARPED else None
        self.tag, self.B, self.G, self.V = tag, B, G, V
        self._logprobs = None

    def logprobs(self, stream, target_ptr, temps_ptr, temp_scalar, greedy, out, logprobs):
        """Warped mode: the emitted tokens' log-probabilities [B, G + 1] into `logprobs` (float32),
        from this plan's row records and the output `out` of its last launch (stream order)."""
        if self._logprobs is None:
            kern, = kernel_runtime.functions("warp_rows.cu", (f"emitted_logprobs_kernel<{self.tag}>",))
            c = ctypes
            self._logprobs = kernel_runtime.Launch(kern, [
                c.c_void_p(), c.c_void_p(self.record.data.ptr), c.c_void_p(), c.c_void_p(), c.c_float(),
                c.c_int32(), c.c_int32(self.B), c.c_int32(self.G), c.c_int32(self.V), ("logprobs", c.c_void_p())])
        n = self.B * (self.G + 1)
        self._logprobs(stream, -(-n // THREADS), THREADS, leading=(target_ptr, self.record.data.ptr, out.data.ptr,
                                                                    temps_ptr, temp_scalar, greedy),
                       logprobs=logprobs.data.ptr)

    def __call__(self, stream, head, out, span=None):
        """head: the 15 leading kernel arguments (pointers as ints); out: the output array; span:
        mode MODE_MIN_P's [B] float32 spans. One locked launch writes them all, so threads sharing
        the plan (one stream) never mix their arguments."""
        named = {} if span is None else {"record": span.data.ptr}
        self.launch(stream, self.grid, THREADS, self.shared_bytes, leading=head, out=out.data.ptr, **named)


PLAN_LIMIT = 256
_plans = kernel_runtime.PlanCache(PLAN_LIMIT)


def _ptr(a):
    return 0 if a is None else a.data.ptr


def _plan(draft_tokens, draft, target, dtype_name, mode, options):
    import cupy
    B, G1, V = target.shape
    tag, vec = vec_width(dtype_name, V, target, draft)
    stream = cupy.cuda.get_current_stream()
    options = DEFAULT_PLAN if options is None else options
    key = (B, G1, V, tag, draft_tokens.dtype.char, vec, mode, cupy.cuda.runtime.getDevice(), stream.ptr, options)

    def make():
        return _Plan(B, G1 - 1, V, tag, _TOKEN_TYPE[draft_tokens.dtype.name], vec, mode, key[7], options)

    return _plans.get(key, make, stream), stream


def plan_info(draft_tokens, draft, target, *, dtype_name, mode, options=None):
    """The plan a launch with these arrays on the current stream uses: dict(grid, capacity (blocks
    resident at once), S1/C1 (P1 slices per row / their length), S2/C2 (P2 slices), lag)."""
    plan, _ = _plan(draft_tokens, draft, target, dtype_name, mode, options)
    return dict(grid=plan.grid, capacity=plan.capacity, S1=plan.S1, C1=plan.C1, S2=plan.S2, C2=plan.C2,
                lag=plan.lag, walk=plan.walk)


def launch(draft_tokens, draft, target, *, dtype_name, lengths, temps, temp_scalar, seed, offset,
           mode, sigmoid_offset, sigmoid_scale, race_purpose, greedy=False, options=None, out=None,
           warps=None, logprobs=None, streams=None):
    """Enqueue the verification kernel on the current stream. Returns the int32 output buffer
    [accepted B | emitted B | error B | tokens B*(G+1)]: `out` when given (a caller that reuses one
    buffer must have consumed the previous result in stream order), else a new array.
    greedy: every request greedy (method "greedy"); temps are then only checked.
    draft: [B, G, V] logits/probabilities, or None for one-hot drafts (q(x_i) = 1).
    options: PlanOptions (None: the default plan). seed/offset: ints, or one-element int64 CuPy
    arrays (read by the kernel when it runs). streams: None or a C-contiguous [B, 2] int64 CuPy
    array of per-request (seed, offset) (verify()'s argument; the kernel then ignores seed/offset).
    warps: modes MODE_WARPED and MODE_MIN_P only: a specsample_cupy.warps.Warps of CuPy arrays;
    MODE_WARPED runs warp_rows.cu first, which writes every row's statistics and truncation;
    MODE_MIN_P reads warps.span alone (a warps.MinPWarps: top_k / top_p off).
    logprobs: mode MODE_WARPED only: a float32 CuPy array of B * (G + 1) that gets the emitted tokens'
    log-probabilities (warp_rows.cu's emitted_logprobs_kernel, after the verification)."""
    import cupy
    plan, stream = _plan(draft_tokens, draft, target, dtype_name, mode, options)
    if out is None or out.size != plan.out_size:
        out = cupy.empty(plan.out_size, dtype=cupy.int32)
    seed_dev = isinstance(seed, cupy.ndarray)
    offset_dev = isinstance(offset, cupy.ndarray)
    # draft None: one-hot drafts (the kernel reads no draft row); gamma = 0: never read.
    draft_ptr = 0 if draft is None else (draft.data.ptr if draft.size else target.data.ptr)
    if mode == MODE_WARPED:
        plan.warp(stream, (draft_ptr, target.data.ptr, _ptr(lengths), _ptr(temps), float(temp_scalar or 0.0),
                           int(bool(greedy))), warps)
    plan(stream, (draft_tokens.data.ptr, draft_ptr, target.data.ptr, _ptr(lengths), _ptr(temps),
                  float(temp_scalar or 0.0), int(bool(greedy)),
                  0 if seed_dev else int(seed) & 0xFFFFFFFFFFFFFFFF, seed.data.ptr if seed_dev else 0,
                  0 if offset_dev else int(offset) & 0xFFFFFFFFFFFFFFFF, offset.data.ptr if offset_dev else 0,
                  _ptr(streams), float(sigmoid_offset), float(sigmoid_scale), int(race_purpose)), out,
         span=warps.span if mode == MODE_MIN_P else None)
    if logprobs is not None:
        plan.logprobs(stream, target.data.ptr, _ptr(temps), float(temp_scalar or 0.0), int(bool(greedy)), out,
                      logprobs)
    return out


def instantiation_source():
    """verify.cu plus a function that takes the address of every instantiation, so that an
    offline `nvcc -Xptxas -v` compiles (and reports registers/spills for) each one."""
    refs = "\n".join(f"  (void)&{name};" for name in all_name_expressions())
    return kernel_source() + f"\nvoid specsample_instantiate_all() {{\n{refs}\n}}\n"


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="python3 -m specsample_cupy.verification.kernel_launch",
                                 description="Print CUDA source as the package compiles it (default: verify.cu "
                                             "with every instantiation named, for an offline nvcc).")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--source", metavar="NAME.cu", help="one kernels_cu/ source, self-contained")
    group.add_argument("--codes-header", action="store_true", help="the generated codes.cuh alone")
    args = ap.parse_args(argv)
    if args.codes_header:
        print(codes_header(), end="")
    elif args.source:
        print(kernel_source(args.source))
    else:
        print(instantiation_source())


if __name__ == "__main__":
    main()
