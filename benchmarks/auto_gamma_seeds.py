"""Auto gamma against the best fixed gamma over many seeds, from per-seed wall times (docs/performance.md's
auto-gamma tables): per pair and batch, each gamma's median speed-up over target-only (per seed,
target-only's wall over the method's), auto / best fixed by medians with a 95 % interval from 4000
bootstrap resamples of the seeds (the best fixed gamma chosen afresh in each), and by total time.
Usage: python3 benchmarks/auto_gamma_seeds.py benchmarks/results/auto_gamma_expected_h200.json"""
import json
import sys

import numpy as np


def summary(run, resamples=4000, seed=0):
    walls = {str(r["gamma"]): np.array(r["wall_s"]) for r in run["rows"]}
    target = walls.pop("0")
    speedup = {g: target / w for g, w in walls.items()}
    fixed = [g for g in speedup if g != "auto"]
    best = max(fixed, key=lambda g: np.median(speedup[g]))
    rng, ratios = np.random.default_rng(seed), []
    for _ in range(resamples):
        pick = rng.integers(0, len(target), len(target))
        medians = {g: np.median(s[pick]) for g, s in speedup.items()}
        ratios.append(medians["auto"] / max(medians[g] for g in fixed))
    best_total = max(target.sum() / walls[g].sum() for g in fixed)
    auto_row = next(r for r in run["rows"] if r["gamma"] == "auto")
    return {"medians": {g: float(np.median(s)) for g, s in speedup.items()}, "best": best,
            "auto": speedup["auto"], "ratio": float(np.median(speedup["auto"]) / np.median(speedup[best])),
            "interval": np.percentile(ratios, [2.5, 97.5]), "ratio_totals": target.sum() / walls["auto"].sum() / best_total,
            "mean_gamma": float(np.mean(auto_row.get("mean_gamma", [np.nan])))}


def main(paths):
    print("| pair | B | seeds | fixed γ: speed-up (medians) | auto [min–max] (mean γ) | auto ÷ best fixed: medians [95 %] | totals |")
    print("|---|---|---|---|---|---|---|")
    for path in paths:
        for run in json.load(open(path))["runs"]:
            s = summary(run)
            fixed = ", ".join(f"{g}: {m:.2f}×" for g, m in s["medians"].items() if g != "auto")
            a = s["auto"]
            print(f"| {run['pair']} | {run['batch']} | {run['seeds']} | {fixed} | {np.median(a):.2f}× "
                  f"[{a.min():.2f}–{a.max():.2f}] ({s['mean_gamma']:.1f}) | {s['ratio']:.3f} "
                  f"[{s['interval'][0]:.2f}–{s['interval'][1]:.2f}] | {s['ratio_totals']:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
