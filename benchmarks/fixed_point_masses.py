"""How much the top-p thresholds of warp_rows.cu's linear histogram depend on how its bins' masses are
summed, simulated in NumPy (no GPU): rows of bench verify's kind, binned as the kernel bins them (WR_BINS
bins linear in d = M - z over [0, span), the rest in a last bin summed exactly), each bin's mass summed
  count+deficit  as the kernel does: a count and U = sum round(u q) with u = 1 - 2^(-t A) (two atomics);
  mass-only      W = sum round(2^(-t A) q'), q' = 2^floor(log2(2^32 / C)) so that a slice of C entries in
                 one bin cannot overflow 32 bits (one atomic, no count);
then the crossing bin by float64 cumulative sums and the exact threshold inside it by float64 masses.
Everything but the bins' sums is float64, so a row whose threshold differs from the CPU reference's
(warps.row_thresholds, float64 sums) differs because of the bins' sums. Prints, per kind of row, the
rows whose threshold differs and the error of the mass below the crossing bin in units of the mass of
the entry at the threshold (median, mean, max): a row flips when that error exceeds the target's
distance to an entry's boundary, so its mean bounds the chance that a row differs.

    python3 benchmarks/fixed_point_masses.py [--rows 400] [--vocab 151936] [--top-p 0.9] [--seed 0] [--json F]
"""
import argparse
import json

import numpy as np

from specsample_cupy.kernels import WARP_CLUSTER
from specsample_cupy.warps import make_warps, row_thresholds

WR_BINS = 2048   # warp_rows.cu's linear bins
LOG2E = 1.4426950408889634


def exact_threshold(z, p):
    """The CPU reference's top-p threshold on d = max z - z of one row z at temperature 1."""
    return row_thresholds(z[None], np.ones(1), make_warps(np, 1, z.size, None, 1.0, top_p=p))[1][0]


def binned_threshold(d, p, scheme):
    """(threshold, error) through the kernel's linear bins, the bins' masses summed by `scheme`; error:
    that of the mass below the crossing bin against float64, over the threshold entry's mass."""
    V = d.size
    C = -(-V // WARP_CLUSTER)
    c = np.float32(LOG2E)
    span = np.float32(min(float(d.max()), 40.0 / LOG2E))
    scale = np.float32(WR_BINS) / span
    f = (d * scale).astype(np.float32)
    inner = f < WR_BINS - 1
    j = np.where(inner, f.astype(np.int64), WR_BINS - 1)
    t = (f - j).astype(np.float64)
    A = float(c / scale)
    if scheme == "count+deficit":
        q = 2.0 ** min(30, np.floor(np.log2((4e9 / C - 0.5) / (A * np.log(2)))))
        u = 1 - 2.0 ** (-t * A)
        n = np.bincount(j[inner], minlength=WR_BINS).astype(np.float64)
        U = np.bincount(j[inner], weights=np.rint(u[inner] * q), minlength=WR_BINS)
        mass = 2.0 ** (-np.arange(WR_BINS) * A) * (n - U / q)
    else:
        q = 2.0 ** np.floor(np.log2(2.0 ** 32 / C))
        W = np.bincount(j[inner], weights=np.rint(2.0 ** (-t[inner] * A) * q), minlength=WR_BINS)
        mass = 2.0 ** (-np.arange(WR_BINS) * A) * W / q
    mass[WR_BINS - 1] = np.exp(-d[~inner].astype(np.float64)).sum()
    cum = np.cumsum(mass)
    target = p * cum[-1]
    lin = int(np.searchsorted(cum, target))
    below = cum[lin - 1] if lin else 0.0
    ds = np.sort(d[j == lin])
    inside = below + np.cumsum(np.exp(-ds.astype(np.float64)))
    k = min(int(np.searchsorted(inside, target)), ds.size - 1)
    exact_below = np.exp(-d[j < lin].astype(np.float64)).sum()
    return ds[k], abs(below - exact_below) / np.exp(-float(ds[k]))


def rows(kind, rng, n, V):
    if kind == "bench target":     # bench verify's target rows: logits N(0, 4)
        return (rng.standard_normal((n, V), dtype=np.float32) * 2)
    if kind == "bench draft":      # and its draft rows
        t = rng.standard_normal((n, V), dtype=np.float32) * 2
        return (0.8 * t + 0.4 * rng.standard_normal((n, V), dtype=np.float32)).astype(np.float32)
    # peaked: a few dominant entries over a long tail, as language models' rows often are
    z = rng.standard_normal((n, V), dtype=np.float32) * 1.5
    top = rng.integers(0, V, (n, 8))
    np.put_along_axis(z, top, np.float32(12) + rng.standard_normal((n, 8), dtype=np.float32) * 2, 1)
    return z


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=400, help="rows per kind")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    p = float(np.float32(args.top_p))   # as the kernel and the reference read it
    out = []
    print("| rows | count+deficit differs | mass-only differs |\n|---|---|---|")
    for kind in ("bench target", "bench draft", "peaked"):
        differ = {"count+deficit": 0, "mass-only": 0}
        errors = {k: [] for k in differ}
        for start in range(0, args.rows, 50):
            for z in rows(kind, rng, min(50, args.rows - start), args.vocab):
                d = (z.max() - z).astype(np.float32)
                ref = exact_threshold(z, p)
                for scheme in differ:
                    got, err = binned_threshold(d, p, scheme)
                    differ[scheme] += got != ref
                    errors[scheme].append(err)
        cell = lambda k: (f"{differ[k]} (error {np.median(errors[k]):.1e}, mean {np.mean(errors[k]):.1e}, "
                          f"max {np.max(errors[k]):.1e})")
        print(f"| {kind} ({args.rows}) | {cell('count+deficit')} | {cell('mass-only')} |")
        out.append({"kind": kind, "rows": args.rows, "differ": {k: int(v) for k, v in differ.items()},
                    "error_median": {k: float(np.median(v)) for k, v in errors.items()},
                    "error_mean": {k: float(np.mean(v)) for k, v in errors.items()},
                    "error_max": {k: float(np.max(v)) for k, v in errors.items()}})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"vocab": args.vocab, "top_p": args.top_p, "seed": args.seed, "cases": out}, f,
                      separators=(",", ":"))


if __name__ == "__main__":
    main()
