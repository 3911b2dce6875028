"""Where a small-batch `exact` call spends its time: the verify kernel with a %globaltimer stamp
(thread 0, per block) at each step of its chain, read back after every call.

The instrumented text is made here from kernels_cu/verify.cu (kernel_runtime.kernel_source) by inserting
stamps at fixed anchors; an anchor that is no longer in the source stops the probe. The package's
kernel is unchanged: kernel_runtime.functions is replaced for verify.cu in this process only.

Stamps (ns after the first block started, medians over calls; P1: every P1 block; P2: every P2 block;
the finisher: the request's last P2 block):
  start        the block entered the kernel          ticket     its first ticket came back
  p1_read      P1: slice read and reduced            p1_pub     P1: partial published, counted in
  p2_gather    P2: token logits asked for            p2_wait    P2: every P1 item counted
  p2_combine   P2: rows combined into shared memory  p2_decide  P2: stop position n known
  p2_race      P2: its slice of row n raced          p2_reduce  P2: the block's winner reduced
  p2_pub       P2: winner published, counted in      fin_read   finisher: winners reduced
  fin_end      finisher: outputs written
CUDA-event µs of the instrumented and of the plain kernel (same inputs, same harness as bench verify)
are printed beside them: the stamps cost a little.

Usage (GPU): python3 benchmarks/probes/verify_timeline.py [--batch 1] [--vocab 32000,151936,256000]
                 [--dtype float32] [--calls 60] [--json OUT]
"""
import argparse
import json

import numpy as np

N_SLOTS = 16          # stamps per block; slot 14: items the block ran, slot 15: its first item
MAX_BLOCKS = 8192

PRELUDE = r"""
#define SS_TL_N 16
__device__ unsigned long long ss_tl[%d * SS_TL_N];
__device__ __forceinline__ unsigned long long ss_now() {
  unsigned long long t; asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t) :: "memory"); return t;
}
#define SS_TL_RAW(k) (ss_tl[blockIdx.x * SS_TL_N + (k)] = ss_now())
#define SS_TL(k) do { if (threadIdx.x == 0) SS_TL_RAW(k); } while (0)
""" % MAX_BLOCKS

TICKET = "const long long item = take_ticket(ticket, sh + 5);\n"
# (anchor, text inserted after it, occurrences expected)
ANCHORS = [
    ("  Verifier<T, TOK, VEC, MODE> v;\n", "  SS_TL(0);\n", 1),
    (TICKET, "      if (item < total && threadIdx.x == 0) {\n"
             "        if (ss_tl[blockIdx.x * SS_TL_N + 14]++ == 0) {\n"
             "          SS_TL_RAW(1); ss_tl[blockIdx.x * SS_TL_N + 15] = item;\n        }\n"
             "      }\n", 2),
    ("        st = block_reduce(st, Combine(), red);\n", "        SS_TL(2);\n", 1),
    ("      publish_add(req_ctr + b, 1);\n", "      SS_TL_RAW(3);\n", 1),
    ("      if (threadIdx.x < 32) first = gather(b, threadIdx.x, rq);\n", "      SS_TL(4);\n", 1),
    ("    wait_rows(b);\n    if (threadIdx.x == 0) sh[4] = 0;\n", "    SS_TL(5);\n", 1),
    ("    combine_rows(b, rq, sh + 4);\n    __syncthreads();\n", "    SS_TL(6);\n", 1),
    ("    __syncthreads();\n    const int n = sh[0];\n", "    SS_TL(7);\n", 1),
    ("        }\n      }\n    }\n    int checks = 0;", None, 1),   # checked only; SS_TL(8) goes before it
    ("    if (paper_rejects) rsum = block_reduce(rsum, AddFloat(), reinterpret_cast<float*>(red));\n",
     "    SS_TL(9);\n", 1),
    ("    __syncthreads();\n    if (!sh[2]) return;\n", None, 1),
    ("    for (int i = threadIdx.x; i <= G; i += SS_THREADS) {\n      int t = -1;\n", None, 1),
]
STAMPS = ["start", "ticket", "p1_read", "p1_pub", "p2_gather", "p2_wait", "p2_combine", "p2_decide",
          "p2_race", "p2_reduce", "p2_pub", "fin_read", "fin_end"]


def instrument(src):
    """verify.cu's inlined text with the stamps; raises if the source no longer has an anchor."""
    for anchor, insert, count in ANCHORS:
        found = src.count(anchor)
        if found != count:
            raise SystemExit(f"verify_timeline: anchor found {found} times, expected {count}:\n{anchor}")
        if insert is not None:
            src = src.replace(anchor, anchor + insert)
    src = src.replace("    int checks = 0;   // the sigmoid", "    SS_TL(8);\n    int checks = 0;   // the sigmoid")
    src = src.replace("    __syncthreads();\n    if (!sh[2]) return;\n",
                      "    __syncthreads();\n    SS_TL(10);\n    if (!sh[2]) return;\n")
    # finisher: after its reductions (before thread 0 writes the outputs), and after the token writes
    src = src.replace("    if (threadIdx.x == 0) {\n      int token = -1;\n",
                      "    SS_TL(11);\n    if (threadIdx.x == 0) {\n      int token = -1;\n")
    tail = "      tokens[(long long)b * (G + 1) + i] = t;\n    }\n"
    if src.count(tail) != 1:
        raise SystemExit("verify_timeline: the finisher's token loop is not where it was")
    src = src.replace(tail, tail + "    SS_TL(12);\n")
    return PRELUDE + src


def install(cp):
    """Route verify.cu's compilation through instrument(); returns the list the modules land in."""
    from specsample_cupy.runtime import kernel_runtime
    original, modules, cache = kernel_runtime.functions, [], {}

    def functions(source_name, name_expressions, *, lineinfo=False):
        if source_name != "verify.cu":
            return original(source_name, name_expressions, lineinfo=lineinfo)
        names = tuple(name_expressions)
        if names not in cache:
            module = cp.RawModule(code=instrument(kernel_runtime.kernel_source("verify.cu")),
                                  options=("--std=c++17",), name_expressions=list(names))
            modules.append(module)
            cache[names] = tuple(module.get_function(n) for n in names)
        return cache[names]

    kernel_runtime.functions = functions
    return modules


def stamps_of(buf):
    """One call's stamps: {name: array over the blocks that set it}, ns after the first start."""
    t = buf.reshape(MAX_BLOCKS, N_SLOTS).astype(np.int64)
    ran = t[:, 0] > 0
    t0 = t[ran, 0].min()
    p1 = ran & (t[:, 2] > 0)
    p2 = ran & (t[:, 4] > 0)
    fin = ran & (t[:, 12] > 0)
    out = {"start": t[ran, 0] - t0, "ticket": t[ran & (t[:, 1] > 0), 1] - t0}
    for k, name in enumerate(STAMPS[2:], start=2):
        sel = p1 if k in (2, 3) else (fin if k in (11, 12) else p2)
        out[name] = t[sel & (t[:, k] > 0), k] - t0
    out["multi_item_blocks"] = np.array([int((t[ran, 14] > 1).sum())])
    return out


def summary(calls):
    """Per stamp: median over calls of the first, median and last block's time (µs)."""
    rows = {}
    for name in STAMPS + ["multi_item_blocks"]:
        first = [c[name].min() for c in calls if c[name].size]
        med = [np.median(c[name]) for c in calls if c[name].size]
        last = [c[name].max() for c in calls if c[name].size]
        if first:
            scale = 1.0 if name == "multi_item_blocks" else 1e-3
            rows[name] = dict(first=round(float(np.median(first)) * scale, 3),
                              median=round(float(np.median(med)) * scale, 3),
                              last=round(float(np.median(last)) * scale, 3),
                              blocks=int(np.median([c[name].size for c in calls])))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="1")
    ap.add_argument("--vocab", default="32000,151936,256000")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--method", default="exact")
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--json")
    args = ap.parse_args()
    import cupy as cp
    from specsample_cupy.bench import verify as bv
    plain = {}
    points = [(int(b), int(v), d) for d in args.dtype.split(",") for b in args.batch.split(",")
              for v in args.vocab.split(",")]
    for B, V, dtype in points:   # the package's own kernel first, in the bench's harness
        plain[(B, V, dtype)] = bv.time_method(cp, args.method, bv.make_inputs(cp, B, 5, V, dtype), 30)[0] * 1e6
    cp.get_default_memory_pool().free_all_blocks()
    modules = install(cp)
    from specsample_cupy.verification import kernel_launch
    kernel_launch._plans._unpinned.clear()   # plans hold their kernel: make them again, instrumented
    results = []
    for B, V, dtype in points:
        ring = bv.make_inputs(cp, B, 5, V, dtype)
        for k in range(3):
            bv.call_verify(args.method, ring.next(), seed=k)
        cp.cuda.Device().synchronize()
        if not modules:
            raise SystemExit("verify_timeline: the package did not compile verify.cu through kernel_runtime.functions")
        ptr = modules[-1].get_global("ss_tl")
        tl = cp.ndarray((MAX_BLOCKS * N_SLOTS,), cp.uint64, ptr)
        calls = []
        for k in range(args.calls):
            tl.fill(0)
            bv.call_verify(args.method, ring.next(), seed=100 + k)
            cp.cuda.Device().synchronize()
            calls.append(stamps_of(tl.get()))
        instrumented = bv.time_method(cp, args.method, ring, 30)[0] * 1e6
        row = dict(B=B, V=V, dtype=dtype, method=args.method, plain_us=round(plain[(B, V, dtype)], 2),
                   instrumented_us=round(instrumented, 2), stamps=summary(calls))
        results.append(row)
        print(f"\n{args.method} B={B} V={V} {dtype}: plain {row['plain_us']:.2f} µs, instrumented "
              f"{row['instrumented_us']:.2f} µs (events); stamps in µs after the first block started")
        print(f"{'stamp':<12} {'first':>7} {'median':>7} {'last':>7} {'blocks':>6}")
        for name, s in row["stamps"].items():
            print(f"{name:<12} {s['first']:>7.2f} {s['median']:>7.2f} {s['last']:>7.2f} {s['blocks']:>6}")
        del ring
        cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        with open(args.json, "w") as f:
            json.dump(dict(device=props["name"].decode(), rows=results), f, separators=(",", ":"))


if __name__ == "__main__":
    main()
