"""Summarise `specsample bench decode --json` results: per pair, batch and method, auto gamma against
the best fixed gamma, with ideal and efficiency (docs/performance.md's decode table).
Usage: python3 benchmarks/decode_summary.py benchmarks/results/decode_*_h200.json"""
import json
import sys


def median(value):
    """A row's statistic as a number: files keep either {median, min, max} or the median alone."""
    return value["median"] if isinstance(value, dict) else value


def summary_rows(report):
    for run in report["runs"]:
        rows = run["rows"]
        target = rows[0]
        for method in sorted({r["method"] for r in rows} - {"target"}):
            fixed = [r for r in rows if r["method"] == method and r["gamma"] != "auto"]
            auto = next(r for r in rows if r["method"] == method and r["gamma"] == "auto")
            best = max(fixed, key=lambda r: r["speedup"]["median"])
            yield (report["pair"], run["batch"], method, target["ms_per_token"]["median"], auto, best,
                   min(median(r["efficiency"]) for r in rows))


def reports(data: dict):
    """The bench decode reports in a result file: the file itself, or those it holds by pair or layout
    (files that put several runs of one call together)."""
    if "runs" in data:
        yield data
    for container in ("pairs", "layouts"):
        for name, report in data.get(container, {}).items():
            if "runs" in report:
                yield {**report, "pair": f"{report.get('pair', name)} ({name})" if container == "layouts" else name}


def main(paths):
    print("| pair | B | method | target-only ms/token | auto γ: speed-up median [min–max] | ideal | efficiency "
          "| mean γ | best fixed γ: speed-up (ideal) | auto ÷ best fixed | lowest efficiency, all γ |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        for pair, batch, method, ms, auto, best, low in (row for report in reports(json.load(open(path)))
                                                         for row in summary_rows(report)):
            s = auto["speedup"]
            print(f"| {pair} | {batch} | {method} | {ms:.2f} | {s['median']:.2f}× [{s['min']:.2f}–{s['max']:.2f}] "
                  f"| {median(auto['ideal']):.2f}× | {median(auto['efficiency']):.3f} | {auto['mean_gamma']:.1f} "
                  f"| γ = {best['gamma']}: {best['speedup']['median']:.2f}× ({median(best['ideal']):.2f}×) "
                  f"| {s['median'] / best['speedup']['median']:.2f} | {low:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
