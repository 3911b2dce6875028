"""Where a large-batch `exact` call in the walk order spends its time: per work item, the %globaltimer
when its ticket came back and when it finished, whether a P1 item read its row or skipped it, and per
request when its stop was published. The instrumented text is made here from kernels_cu/verify.cu by
inserting stamps at fixed anchors (an anchor no longer in the source stops the probe); the package's
kernel is unchanged: kernel_runtime.functions is replaced for verify.cu in this process only.

Printed per position i (its 2B row items, B at the bonus position): items, rows read, and the first /
median / last ticket and finish (µs after the first ticket); then the P2 items, the stops' publish
times and the accepted counts. CUDA-event µs of the plain and the instrumented kernel beside them.

Usage (GPU): python3 benchmarks/probes/walk_items.py [--batch 64] [--vocab 151936] [--dtype float32]
                 [--drafts random,accepted] [--calls 20] [--json OUT]
"""
import argparse
import json

import numpy as np

MAX_ITEMS = 1 << 17
MAX_B = 1024

PRELUDE = r"""
__device__ unsigned long long ss_take[%d], ss_done[%d], ss_stop_t[%d];
__device__ int ss_read[%d];
__device__ long long ss_cur[65536];
__device__ __forceinline__ unsigned long long ss_now() {
  unsigned long long t; asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t) :: "memory"); return t;
}
""" % (MAX_ITEMS, MAX_ITEMS, MAX_B, MAX_ITEMS)

WALK_TAKE = ("      const long long item = take_ticket(ticket, sh + 5);\n"
             "      if (past_last_item(item, total, ticket, one_each)) return;\n      if (item < p1) {\n")
WALK_DONE = ("        v.phase2((int)((item - p1) / S2), (int)((item - p1) % S2), red_race, sh);\n      }\n")
ACTIVE = "    if (walking() && active && i > 0) active = !stopped_before(b, i, sh);\n"
STOP = "            stop_n[b] = p + 1;\n"
# (anchor, text inserted after it)
ANCHORS = [
    (WALK_TAKE.replace("      if (item < p1) {\n", ""),
     "      if (threadIdx.x == 0 && item < %d) { ss_take[item] = ss_now(); ss_cur[blockIdx.x] = item; }\n" % MAX_ITEMS),
    (WALK_DONE, "      if (threadIdx.x == 0 && item < %d) ss_done[item] = ss_now();\n" % MAX_ITEMS),
    (ACTIVE, "    if (walking() && threadIdx.x == 0 && ss_cur[blockIdx.x] < %d) ss_read[ss_cur[blockIdx.x]] = active;\n"
     % MAX_ITEMS),
    (STOP, "            if (b < %d) ss_stop_t[b] = ss_now();\n" % MAX_B),
]


def instrument(src):
    """verify.cu's inlined text with the stamps; raises if the source no longer has an anchor."""
    for anchor, insert in ANCHORS:
        if src.count(anchor) != 1:
            raise SystemExit(f"walk_items: anchor found {src.count(anchor)} times, expected 1:\n{anchor}")
        src = src.replace(anchor, anchor + insert)
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


def one_call(take, done, read, stop_t, accepted, B, G, S1, S2):
    """One call's figures (µs after its first ticket) per position and for P2."""
    per_pos, p1 = 2 * B * S1, B * (2 * G + 1) * S1
    total = p1 + B * S2
    t0 = take[:total][take[:total] > 0].min()

    def us(a):
        return (a.astype(np.int64) - int(t0)) * 1e-3
    rows = {}
    for i in range(G + 1):
        lo = i * per_pos
        hi = min(p1, lo + per_pos)
        sel = slice(lo, hi)
        rows[f"pos{i}"] = dict(items=hi - lo, read=int(read[sel].sum()), take=us(take[sel]), done=us(done[sel]))
    rows["p2"] = dict(items=B * S2, read=B * S2, take=us(take[p1:total]), done=us(done[p1:total]))
    stops = stop_t[:B]
    rows["stops"] = us(stops[stops > 0])
    rows["accepted_mean"] = float(accepted.mean())
    return rows


def summarise(calls):
    out = {}
    for key in calls[0]:
        if key == "accepted_mean":
            out[key] = round(float(np.mean([c[key] for c in calls])), 3)
            continue
        if key == "stops":
            s = [c[key] for c in calls if c[key].size]
            spread = {} if not s else dict(first=_med(s, np.min), median=_med(s, np.median), last=_med(s, np.max))
            out[key] = dict(count=float(np.median([c[key].size for c in calls])), **spread)
            continue
        row = dict(items=calls[0][key]["items"], read=float(np.median([c[key]["read"] for c in calls])))
        for part in ("take", "done"):
            a = [c[key][part] for c in calls]
            row[part] = [_med(a, np.min), _med(a, np.median), _med(a, np.max)]
        out[key] = row
    return out


def _med(arrays, f):
    return round(float(np.median([f(a) for a in arrays])), 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--drafts", default="random,accepted")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    import cupy as cp
    from specsample_cupy import verify
    from specsample_cupy.bench import verify as bv
    from specsample_cupy.verification import kernel_launch
    B, G, V = args.batch, 5, args.vocab
    plan_opts = kernel_launch.PlanOptions(walk=True)

    def ring_of(drafts):
        ring = bv.make_inputs(cp, B, G, V, args.dtype)
        if drafts == "accepted":
            ring = bv.InputRing([(t, cp.ascontiguousarray(tg[:, :G]), tg) for t, _, tg in ring], ring.rotate_bytes)
        return ring if drafts in ("random", "accepted") else bv.sampled_drafts(cp, ring)

    def timed(ring):
        return bv.device_seconds(cp, lambda k: verify(*ring.next(), method="exact", seed=1, offset=k,
                                                      plan=plan_opts), 30, per_call_s=400e-6) * 1e6

    drafts = args.drafts.split(",")
    plain = {d: timed(ring_of(d)) for d in drafts}
    cp.get_default_memory_pool().free_all_blocks()
    modules = install(cp)
    kernel_launch._plans._unpinned.clear()   # plans hold their kernel: make them again, instrumented
    results = []
    for d in drafts:
        ring = ring_of(d)
        out = verify(*ring.next(), method="exact", seed=1, plan=plan_opts)
        cp.cuda.Device().synchronize()
        plan = next(p for p in kernel_launch._plans._unpinned.values() if p.B == B and p.V == V)
        if not modules or not plan.walk:
            raise SystemExit("walk_items: the instrumented kernel or the walk order is not in use")
        glob = {n: cp.ndarray((size,), dt, modules[-1].get_global(n)) for n, size, dt in (
            ("ss_take", MAX_ITEMS, cp.uint64), ("ss_done", MAX_ITEMS, cp.uint64),
            ("ss_stop_t", MAX_B, cp.uint64), ("ss_read", MAX_ITEMS, cp.int32))}
        calls = []
        for k in range(args.calls):
            for a in glob.values():
                a.fill(0)
            out = verify(*ring.next(), method="exact", seed=100 + k, plan=plan_opts)
            cp.cuda.Device().synchronize()
            calls.append(one_call(*(glob[n].get() for n in ("ss_take", "ss_done", "ss_read", "ss_stop_t")),
                                  out.accepted.get(), B, G, plan.S1, plan.S2))
        row = dict(B=B, V=V, dtype=args.dtype, drafts=d, S1=plan.S1, S2=plan.S2, grid=plan.grid,
                   plain_us=round(plain[d], 2), instrumented_us=round(timed(ring), 2), items=summarise(calls))
        results.append(row)
        print(f"\nwalk B={B} V={V} {args.dtype} {d} drafts: S1={plan.S1} S2={plan.S2} grid={plan.grid}; "
              f"plain {row['plain_us']} µs, instrumented {row['instrumented_us']} µs; "
              f"mean accepted {row['items']['accepted_mean']}")
        print("| items | count | read | ticket first / median / last µs | done first / median / last µs |")
        print("|---|---|---|---|---|")
        for key, r in row["items"].items():
            if isinstance(r, dict) and "take" in r:
                print(f"| {key} | {r['items']} | {r['read']:.0f} | {' / '.join(map(str, r['take']))} | "
                      f"{' / '.join(map(str, r['done']))} |")
        print(f"stops published: {row['items']['stops']}")
        del ring
        cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        with open(args.json, "w") as f:
            json.dump(dict(device=props["name"].decode(), rows=results), f, separators=(",", ":"))


if __name__ == "__main__":
    main()
