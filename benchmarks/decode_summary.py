"""Summarise `specsample bench decode --json` results: per pair, batch and method, auto gamma against
the best fixed gamma, with ideal and efficiency (docs/performance.md's decode table).
Usage: python3 benchmarks/decode_summary.py benchmarks/results/decode_*_h200.json"""
import json
import sys


def summary_rows(report):
    for run in report["runs"]:
        rows = run["rows"]
        target = rows[0]
        for method in sorted({r["method"] for r in rows} - {"target"}):
            fixed = [r for r in rows if r["method"] == method and r["gamma"] != "auto"]
            auto = next(r for r in rows if r["method"] == method and r["gamma"] == "auto")
            best = max(fixed, key=lambda r: r["speedup"]["median"])
            yield (report["pair"], run["batch"], method, target["ms_per_token"]["median"], auto, best,
                   min(r["efficiency"]["median"] for r in rows))


def main(paths):
    print("| pair | B | method | target-only ms/token | auto γ: speed-up median [min–max] | ideal | efficiency "
          "| mean γ | best fixed γ: speed-up (ideal) | auto ÷ best fixed | lowest efficiency, all γ |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        for pair, batch, method, ms, auto, best, low in summary_rows(json.load(open(path))):
            s = auto["speedup"]
            print(f"| {pair} | {batch} | {method} | {ms:.2f} | {s['median']:.2f}× [{s['min']:.2f}–{s['max']:.2f}] "
                  f"| {auto['ideal']['median']:.2f}× | {auto['efficiency']['median']:.3f} | {auto['mean_gamma']:.1f} "
                  f"| γ = {best['gamma']}: {best['speedup']['median']:.2f}× ({best['ideal']['median']:.2f}×) "
                  f"| {s['median'] / best['speedup']['median']:.2f} | {low:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
