"""exact / sigmoid / sigmoid-paper device µs per call at chosen (B, V) points, random draft ids and ids
sampled from the draft (specsample_cupy.bench.verify.rows_read_table: rotated inputs, calls queued
behind a busy kernel), for the package found on PYTHONPATH: run it once per source tree, alternating,
to compare two versions of the kernel in one session on one GPU.

Usage (GPU): python3 benchmarks/verify_rows_read.py LABEL OUT.json [--points 1x32000,8x151936]
                 [--dtypes float32,float16] [--reps 30] [--gamma 5]
                 [--methods exact,sigmoid,sigmoid-paper]
A revision older than the harness (no specsample_cupy.verification: the first package layout) is timed
by this tree's harness calling that revision's verify() (methods exact and sigmoid), so an old
measurement can be repeated beside today's in one session.
Combine runs: python3 benchmarks/verify_rows_read.py --combine OUT.json RUN.json [RUN.json ...]
(the median of each label's runs per point, each method's ratio to exact, and each label's time over
the first label's)."""
import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

DEFAULT_POINTS = "1x32000,1x151936,1x256000,8x32000,8x51864,8x151936,64x151936,64x256000"


def harness():
    """specsample_cupy.bench.verify of the package on PYTHONPATH; for a revision older than it (no
    specsample_cupy.verification), this tree's harness file, its imports of the package answered by
    that revision's verify()."""
    import importlib.util
    import sys
    import types

    import specsample_cupy
    if any((Path(p) / "verification").is_dir() for p in specsample_cupy.__path__):
        from specsample_cupy.bench import verify as bv
        return bv
    for name, attrs in (("specsample_cupy.verification", {"__path__": []}),
                        ("specsample_cupy.verification.api", {"verify": specsample_cupy.verify}),
                        ("specsample_cupy.verification.truncation", {"build_warps": None})):
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
    path = Path(__file__).resolve().parents[1] / "specsample_cupy" / "bench" / "verify.py"
    spec = importlib.util.spec_from_file_location("rows_read_harness", path)
    bv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bv)
    return bv


def measure(args):
    bv = harness()
    points = tuple(tuple(int(x) for x in p.split("x")) for p in args.points.split(","))
    table = bv.rows_read_table(points=points, dtypes=tuple(args.dtypes.split(",")), reps=args.reps,
                               methods=tuple(args.methods.split(",")), gamma=args.gamma)
    table["label"] = args.label
    with open(args.out, "w") as f:
        json.dump(table, f)
    for r in table["rows"]:
        print(args.label, r["dtype"], r["B"], r["V"], r["drafts"], r["method"], f"{r['us']:.2f}")


def combine(out, runs):
    by = defaultdict(list)   # (label, dtype, B, V, drafts, method) -> µs of each run
    labels, device = [], None
    for path in runs:
        t = json.load(open(path))
        device = device or t["device"]
        if t["label"] not in labels:
            labels.append(t["label"])
        for r in t["rows"]:
            by[(t["label"], r["dtype"], r["B"], r["V"], r["drafts"], r["method"])].append(r["us"])
    rows = []
    order = sorted(by.items(), key=lambda kv: (labels.index(kv[0][0]),) + kv[0][1:])
    for (label, dtype, B, V, drafts, method), us in order:
        med = statistics.median(us)
        exact = by.get((label, dtype, B, V, drafts, "exact"))       # a run may lack a method or a point
        first = by.get((labels[0], dtype, B, V, drafts, method))
        rows.append([label, dtype, B, V, drafts, method, round(med, 2), round(min(us), 2), round(max(us), 2),
                     round(statistics.median(exact) / med, 3) if exact else None,
                     round(med / statistics.median(first), 3) if first else None])
    doc = dict(device=device, runs=len(runs), labels=labels,
               columns=["label", "dtype", "B", "V", "drafts", "method", "us_median", "us_min", "us_max",
                        "exact_over_method", "over_first_label"],
               rows=rows)
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print(f"{'label':<8} {'dtype':<8} {'B':>3} {'V':>7} {'drafts':<8} {'method':<14} {'us':>8} "
          f"{'exact/x':>8} {'vs ' + labels[0]:>10}")

    def ratio(x, width):
        return f"{x:>{width}.3f}" if x is not None else " " * (width - 1) + "-"

    for r in rows:
        print(f"{r[0]:<8} {r[1]:<8} {r[2]:>3} {r[3]:>7} {r[4]:<8} {r[5]:<14} {r[6]:>8.2f} {ratio(r[9], 8)} "
              f"{ratio(r[10], 10)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="LABEL OUT.json, or with --combine OUT.json RUN.json ...")
    ap.add_argument("--combine", action="store_true")
    ap.add_argument("--points", default=DEFAULT_POINTS)
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--methods", default="exact,sigmoid,sigmoid-paper")
    args = ap.parse_args()
    if args.combine:
        combine(args.paths[0], args.paths[1:])
    else:
        args.label, args.out = args.paths
        measure(args)


if __name__ == "__main__":
    main()
