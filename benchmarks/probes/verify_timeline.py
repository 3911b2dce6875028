"""Where a small-batch `exact` call spends its time: verify.cu with a %globaltimer stamp (thread 0 of
each block) at each step of its chain (STAMPS), read back after every call; per stamp the first, median
and last block's time after the first block started (µs, medians over calls), beside the instrumented
kernel's CUDA-event time in bench verify's harness (the plain kernel's: verify_rows_read.py's exact rows,
which benchmarks/gpu_verify.sh measures in the same call).

The instrumented text is verify.cu's (kernel_runtime.kernel_source) with stamps inserted at anchors,
each checked (a missing one stops the probe); only this process compiles it.

Usage (GPU): python3 benchmarks/probes/verify_timeline.py [--batch 1] [--vocab 32000,151936,256000]
                 [--dtype float32] [--calls 60] [--json OUT]
"""
import argparse
import json

import numpy as np

SLOTS, MAX_BLOCKS = 16, 8192   # stamps per block; slot 14: items the block ran, slot 15: its first item
STAMPS = {   # slot: (name, what it marks; P1 / P2 blocks, the finisher: the request's last P2 block)
    0: ("start", "block entered the kernel"), 1: ("ticket", "first ticket back"),
    2: ("p1_read", "P1 slice read and reduced"), 3: ("p1_pub", "P1 partial published"),
    4: ("p2_gather", "P2 token logits asked for"), 5: ("p2_wait", "P2 saw every P1 item"),
    6: ("p2_combine", "P2 rows combined"), 7: ("p2_decide", "P2 stop n known"),
    8: ("p2_race", "P2 slice of row n raced"), 9: ("p2_reduce", "P2 winner reduced"),
    10: ("p2_pub", "P2 winner published"), 11: ("fin_read", "finisher reduced the winners"),
    12: ("fin_end", "finisher wrote the outputs")}
PRELUDE = r"""
__device__ unsigned long long ss_tl[%d * %d];
__device__ __forceinline__ unsigned long long ss_now() {
  unsigned long long t; asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t) :: "memory"); return t;
}
#define SS_TL_RAW(k) (ss_tl[blockIdx.x * %d + (k)] = ss_now())
#define SS_TL(k) do { if (threadIdx.x == 0) SS_TL_RAW(k); } while (0)
""" % (MAX_BLOCKS, SLOTS, SLOTS)
FIRST_ITEM = ("      if (item < total && threadIdx.x == 0 && ss_tl[blockIdx.x * %d + 14]++ == 0) {\n"
              "        SS_TL_RAW(1); ss_tl[blockIdx.x * %d + 15] = item;\n      }\n" % (SLOTS, SLOTS))
# (anchor, text, occurrences, whether the text goes after the anchor or before it)
ANCHORS = [
    ("  Verifier<T, TOK, VEC, MODE> v;\n", "  SS_TL(0);\n", 1, True),
    ("const long long item = take_ticket(ticket, sh + 5);\n", FIRST_ITEM, 2, True),
    ("        st = block_reduce(st, Combine(), red);\n", "        SS_TL(2);\n", 1, True),
    ("      publish_add(req_ctr + b, 1);\n", "      SS_TL_RAW(3);\n", 1, True),
    ("      if (threadIdx.x < 32) first = gather(b, threadIdx.x, rq);\n", "      SS_TL(4);\n", 1, True),
    ("    wait_rows(b);\n    if (threadIdx.x == 0) sh[4] = 0;\n", "    SS_TL(5);\n", 1, True),
    ("    combine_rows(b, rq, sh + 4);\n    __syncthreads();\n", "    SS_TL(6);\n", 1, True),
    ("    __syncthreads();\n    const int n = sh[0];\n", "    SS_TL(7);\n", 1, True),
    ("    int checks = 0;   // the sigmoid", "    SS_TL(8);\n", 1, False),
    ("    if (paper_rejects) rsum = block_reduce(rsum, AddFloat(), reinterpret_cast<float*>(red));\n",
     "    SS_TL(9);\n", 1, True),
    ("\n    if (!sh[2]) return;\n", "\n    SS_TL(10);", 1, False),
    ("    if (threadIdx.x == 0) {\n      int token = -1;\n", "    SS_TL(11);\n", 1, False),
    ("      tokens[(long long)b * (G + 1) + i] = t;\n    }\n", "    SS_TL(12);\n", 1, True),
]


def instrument(src):
    """verify.cu's inlined text with the stamps; stops if the source no longer has an anchor."""
    for anchor, text, count, after in ANCHORS:
        if src.count(anchor) != count:
            raise SystemExit(f"verify_timeline: anchor found {src.count(anchor)} times, not {count}:\n{anchor}")
        src = src.replace(anchor, anchor + text if after else text + anchor)
    return PRELUDE + src


def install(cp):
    """Compile verify.cu through instrument() in this process (before its first verify() call: plans keep
    their kernel); returns the list its modules land in."""
    from specsample_cupy.runtime import kernel_runtime
    original, modules, cache = kernel_runtime.functions, [], {}

    def functions(source_name, names, *, lineinfo=False):
        if source_name != "verify.cu":
            return original(source_name, names, lineinfo=lineinfo)
        names = tuple(names)
        if names not in cache:
            modules.append(cp.RawModule(code=instrument(kernel_runtime.kernel_source("verify.cu")),
                                        options=("--std=c++17",), name_expressions=list(names)))
            cache[names] = tuple(modules[-1].get_function(n) for n in names)
        return cache[names]

    kernel_runtime.functions = functions
    return modules


def stamps_of(buf):
    """One call: ({name: ns after the first start, over the blocks that set that stamp}, blocks that ran
    more than one item: their stamps are their last item's)."""
    t = buf.reshape(MAX_BLOCKS, SLOTS).astype(np.int64)
    ran = t[:, 0] > 0
    t0 = t[ran, 0].min()
    return {name: t[ran & (t[:, k] > 0), k] - t0 for k, (name, _) in STAMPS.items()}, int((t[ran, 14] > 1).sum())


def summary(calls):
    """Per stamp: medians over calls of the first, median and last block's µs, and of the block count."""
    rows = {}
    for name in calls[0]:
        hit = [c[name] for c in calls if c[name].size]
        if hit:
            rows[name] = {key: round(float(np.median([f(h) for h in hit])) * 1e-3, 3)
                          for key, f in (("first", np.min), ("median", np.median), ("last", np.max))}
            rows[name]["blocks"] = int(np.median([h.size for h in hit]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="1")
    ap.add_argument("--vocab", default="32000,151936,256000")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--json")
    args = ap.parse_args()
    import cupy as cp
    from specsample_cupy.bench import verify as bv
    points = [(int(b), int(v), d) for d in args.dtype.split(",") for b in args.batch.split(",")
              for v in args.vocab.split(",")]
    modules, results = install(cp), []
    for B, V, dtype in points:
        ring = bv.make_inputs(cp, B, 5, V, dtype)
        bv.call_verify("exact", ring.next(), seed=0).accepted.get()
        tl = cp.ndarray((MAX_BLOCKS * SLOTS,), cp.uint64, modules[-1].get_global("ss_tl"))
        calls, multi = [], []
        for k in range(args.calls):
            tl.fill(0)
            bv.call_verify("exact", ring.next(), seed=100 + k).accepted.get()
            stamps, m = stamps_of(tl.get())
            calls.append(stamps)
            multi.append(m)
        events_us = bv.time_method(cp, "exact", ring, 30)[0] * 1e6
        row = dict(B=B, V=V, dtype=dtype, instrumented_us=round(events_us, 2), stamps=summary(calls),
                   multi_item_blocks=max(multi))
        results.append(row)
        print(f"\nexact B={B} V={V} {dtype}: instrumented {events_us:.2f} µs (events); stamps: µs after the"
              f" first block started, medians over {args.calls} calls (blocks with several items: {max(multi)})")
        for name, s in row["stamps"].items():
            print(f"{name:<18} {s['first']:>7.2f} {s['median']:>7.2f} {s['last']:>7.2f} {s['blocks']:>6}")
    if args.json:
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        with open(args.json, "w") as f:
            json.dump(dict(device=props["name"].decode(), stamps={v[0]: v[1] for v in STAMPS.values()},
                           rows=results), f, separators=(",", ":"))


if __name__ == "__main__":
    main()
