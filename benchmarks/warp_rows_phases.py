"""Where warp_rows_kernel's time goes: clock64 stamps of thread 0 of block 0 (the first row's rank 0)
at the phases of kernels_cu/warp_rows.cu, from a copy of its source patched in memory (the tree's
kernel is not changed); the last of three launches per case, on bench verify's inputs.

    python3 benchmarks/warp_rows_phases.py [--batch 1,64] [--dtype float32] [--vocab 151936] [--gamma 5]
                                          [--spec top_p=0.9 ...] [--kernels DIR] [--json F]

Each row of the printout: a phase and its cycles, up to that stamp from the one before (the select's
linear pass also gives its crossing bin's count). A stamp costs thread 0 a few tens of cycles (a
shared-memory counter and a global store). Then every row's span: thread 0 of its rank-0 block reads
%globaltimer (ns, one clock for the GPU) after the row's start and before its last barrier, and keeps
its last crossing bin's count; printed: the span from the first row's start to the last row's end, the
target and draft rows' durations (median, max) and the slowest rows (the kernel waits for them).
--kernels: another revision's kernels_cu/ folder, whose warp_rows.cu must still hold the anchors below."""
import argparse
import json

# (anchor in warp_rows.cu, stamp before (<) or after (>) it, phase ending there; None: a count, `value`)
MARKS = (
    ("  if (!active) return;", ">", "start"),
    ("  best = block_reduce<WR_WARPS>(best, BetterRace(), best_red);", "<", "copy into shared memory"),
    ("  const float M = top.key;", ">", "cluster maximum"),
    ("    WarpHist& h = wr_hist[pass++ & 1];", ">", "(between passes)"),
    ("    cg::cluster_group cluster = cg::this_cluster();\n    cluster.sync();\n    // Reduce-scatter", "<",
     "pass: this block's histogram"),
    ("    CountMass chunk_sum;", "<", "pass: barrier, chunk sums"),
    ("    // The lowest rank with a hit has the crossing", "<", "pass: scan, barriers"),
    ("    const int lin = x.bin;", ">", None, "x.count_bin"),
    ("    WarpHist& mine = wr_hist[pass++ & 1];", ">", "pass: crossing"),
    ("    cluster.sync();\n    // The peers' list lengths", "<", "gather: own list"),
    ("    if (by_rank) {", "<", "gather: barrier, peers' lists"),
    ("      *mass_le = mass_below + wr_rank_mass;", "<", "select by rank"),
    ("  if (has_mass && !mass_known) {", "<", "(after the select)"),
    ("  cluster.sync();   // no block leaves", "<", "kept mass, record"),
)
STAMP = ("__device__ long long wr_stamps[256];\n__shared__ int wr_nstamp;\n"
         "#define WR_STAMP(tag, value) if (threadIdx.x == 0 && blockIdx.x == 0) "
         "{ const int s_ = wr_nstamp++; "
         "if (s_ < 128) { wr_stamps[2 * s_] = (tag) + 1; wr_stamps[2 * s_ + 1] = (value); } }\n")
COUNT = 100
ROWS = 4096   # rows timed (request b, row r at b (2G + 1) + r)
_RANK0 = f"threadIdx.x == 0 && blockIdx.x % WR_CLUSTER == 0 && blockIdx.x / WR_CLUSTER < {ROWS}"
ROW_TIMES = (f"__device__ unsigned long long wr_row_t[2 * {ROWS}];\n__device__ unsigned wr_row_n[{ROWS}];\n"
             "__device__ __forceinline__ unsigned long long wr_now() {\n"
             "  unsigned long long t;\n  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n  return t;\n}\n"
             f"#define WR_ROW_T(k) if ({_RANK0}) wr_row_t[2 * (blockIdx.x / WR_CLUSTER) + (k)] = wr_now();\n"
             f"#define WR_ROW_N(v) if ({_RANK0}) wr_row_n[blockIdx.x / WR_CLUSTER] = (v);\n")
# (anchor, before (<) or after (>) it, the statement put there)
ROW_MARKS = (
    ("  if (!active) return;", ">", "WR_ROW_T(0)"),
    ("  cluster.sync();   // no block leaves", "<", "WR_ROW_T(1)"),
    ("    const int lin = x.bin;", ">", "WR_ROW_N(x.count_bin)"),
)


def _insert(source, anchor, where, text):
    """text put before (<) or after (>) the one occurrence of anchor."""
    assert source.count(anchor) == 1, anchor
    return source.replace(anchor, text + anchor if where == "<" else anchor + "\n" + text)


def patched(source):
    at = source.index("struct CountMass")
    source = source[:at] + STAMP + ROW_TIMES + source[at:]
    for tag, mark in enumerate(MARKS):
        stamp = f"WR_STAMP({tag}, clock64());\n" if mark[2] else f"WR_STAMP({COUNT}, {mark[3]});\n"
        if tag == 0:
            stamp = "if (threadIdx.x == 0) wr_nstamp = 0;\n" + stamp
        source = _insert(source, *mark[:2], stamp)
    for anchor, where, statement in ROW_MARKS:
        source = _insert(source, anchor, where, statement + ";\n")
    return source


def row_summary(times, counts, G):
    """Rows' spans from the (start, end) globaltimer pairs `times` [2 R] (0: a row that did not run) and
    their crossing counts [R]: the kernel's span from the first start to the last end, µs; the target
    (r <= G) and draft rows' durations, median and max; the five slowest rows."""
    import numpy as np
    t = np.asarray(times, np.int64).reshape(-1, 2)
    ran = np.flatnonzero((t[:, 0] > 0) & (t[:, 1] > 0))
    if not ran.size:
        return {"rows": 0}
    t0 = t[ran, 0].min()
    dur = (t[ran, 1] - t[ran, 0]) / 1e3
    kind = np.where(ran % (2 * G + 1) <= G, "target", "draft")
    out = {"rows": int(ran.size), "span_us": round(float((t[ran, 1].max() - t0) / 1e3), 2),
           "last_start_us": round(float((t[ran, 0].max() - t0) / 1e3), 2)}
    for k in ("target", "draft"):
        d = dur[kind == k]
        if d.size:
            out[k] = {"median_us": round(float(np.median(d)), 2), "max_us": round(float(d.max()), 2)}
    slow = np.argsort(-dur)[:5]
    out["slowest"] = [{"row": int(ran[i]), "kind": str(kind[i]), "us": round(float(dur[i]), 2),
                       "crossing_count": int(counts[ran[i]])} for i in slow]
    return out


def phases_of(pairs):
    """[(phase, cycles, count or None)] from the stamps' (tag + 1, value) pairs; the total cycles."""
    phases, last, first = [], None, None
    for t, value in pairs:
        if t == 0:
            break
        if t - 1 == COUNT:
            phases[-1]["count"] = int(value)
            continue
        if last is not None:
            phases.append({"phase": MARKS[t - 1][2], "cycles": int(value - last)})
        else:
            first = value
        last = value
    return phases, int(last - first)


def main():
    import cupy as cp

    from specsample_cupy.bench_verify import make_inputs
    from specsample_cupy.kernel_runtime import kernel_source
    from specsample_cupy.kernels import WARP_RECORD, _WarpRows, vec_width
    from specsample_cupy.warps import build_warps

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,64")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--spec", action="append", help="a truncation, e.g. top_p=0.9 (repeatable)")
    ap.add_argument("--kernels", help="another kernels_cu/ folder to read warp_rows.cu from (default: the tree's)")
    ap.add_argument("--json")
    args = ap.parse_args()
    specs = [{k: float(v) if "." in v else int(v) for k, v in (kv.split("="),)} for kv in
             (args.spec or ["top_p=0.9", "top_k=50"])]
    G, V = args.gamma, args.vocab
    from warp_rows_ab import folder_reader   # this folder's A/B script: another revision's kernels_cu/
    src = patched(kernel_source("warp_rows.cu", read=folder_reader(args.kernels) if args.kernels else None))
    stream = cp.cuda.get_current_stream()
    out = []
    for dtype in args.dtype.split(","):
        tag, vec = vec_width(dtype, V)
        name = f"warp_rows_kernel<{tag}, {vec}>"
        mod = cp.RawModule(code=src, options=("--std=c++17",), name_expressions=[name])
        kern = mod.get_function(name)
        stamps = cp.ndarray((256,), cp.int64, mod.get_global("wr_stamps"))
        row_t = cp.ndarray((2 * ROWS,), cp.uint64, mod.get_global("wr_row_t"))
        row_n = cp.ndarray((ROWS,), cp.uint32, mod.get_global("wr_row_n"))
        for B in map(int, args.batch.split(",")):
            _, draft, target = make_inputs(cp, B, G, V, dtype, rotate_bytes=1)[0]
            for spec in specs:
                warps = build_warps(cp, B, V, 1.0, **spec)
                err = cp.zeros(B, cp.int32)
                record = cp.zeros(B * (2 * G + 1) * WARP_RECORD, cp.float32)
                launch = _WarpRows(tag, vec, B, G, V, cp.cuda.Device().id, err.data.ptr, record, kernel=kern)
                for _ in range(3):
                    stamps.fill(0)
                    row_t.fill(0)
                    row_n.fill(0)
                    launch(stream, (draft.data.ptr, target.data.ptr, 0, 0, 1.0, 0), warps)
                stream.synchronize()
                phases, total = phases_of(stamps.get().reshape(-1, 2))
                rows = row_summary(row_t.get(), row_n.get(), G)
                print(f"\n{dtype} B={B} {spec}: {total} cycles")
                for p in phases:
                    extra = f"  (crossing bin: {p['count']} entries)" if "count" in p else ""
                    print(f"  {p['phase']:32s} {p['cycles']:7d}{extra}")
                print(f"  rows: {json.dumps(rows)}")
                out.append({"dtype": dtype, "B": B, "spec": spec, "cycles": total, "phases": phases, "rows": rows})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"V": V, "gamma": G, "cases": out}, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
