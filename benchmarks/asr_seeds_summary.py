"""The paper's ASR table from `specsample eval asr --json` runs over several seeds: per method the WER
(mean, min-max over seeds), acceptance, verification time per step and in total, end-to-end time, and
the change against baseline, as a Markdown table and a compact JSON (no per-item records).

    python3 benchmarks/asr_seeds_summary.py RUN.json [RUN.json ...] [--json OUT.json]

Runs are grouped by (target, draft); every run of a group must share data, gamma and temperature.
"""
import argparse
import json
import statistics
from collections import defaultdict

FIELDS = ("wer", "acceptance_rate", "verify_time_per_step_s", "verify_time_total_s", "end_to_end_s")


def summarize(runs):
    """{method: {field: {"mean", "min", "max"}}, "seeds": [...]} for runs of one (target, draft)."""
    keys = {(r["data"], r["gamma"], r["temperature"], r["normalizer"]) for r in runs}
    if len(keys) != 1:
        raise SystemExit(f"runs of one pair differ in data/gamma/temperature/normalizer: {sorted(keys)}")
    methods = runs[0]["methods"]
    out = {"seeds": sorted(r["seed"] for r in runs), "data": runs[0]["data"], "gamma": runs[0]["gamma"],
           "temperature": runs[0]["temperature"], "normalizer": runs[0]["normalizer"],
           "items": runs[0]["items_evaluated"], "methods": {}}
    for m in methods:
        per = {}
        for f in FIELDS:
            vals = [r["summary"][m][f] for r in runs if r["summary"][m].get(f) is not None]
            if vals:
                per[f] = {"mean": statistics.fmean(vals), "min": min(vals), "max": max(vals)}
        out["methods"][m] = per
    return out


def table(name, s):
    base = s["methods"].get("baseline", {})
    lines = [f"**{name}** ({s['items']} clips, γ = {s['gamma']}, T = {s['temperature']}, seeds "
             f"{s['seeds'][0]}–{s['seeds'][-1]}, WER on text normalised by {s['normalizer']})", "",
             "| method | WER % mean [min–max] | acceptance | verify ms/step | verify s total | end-to-end s | "
             "Δ WER vs baseline (points) | Δ verify/step vs baseline |", "|---|---|---|---|---|---|---|---|"]
    for m, per in s["methods"].items():
        w = per["wer"]
        cells = [m, f"{100 * w['mean']:.2f} [{100 * w['min']:.2f}–{100 * w['max']:.2f}]"]
        for f, fmt in (("acceptance_rate", "{:.3f}"), ("verify_time_per_step_s", "{:.2f}"),
                       ("verify_time_total_s", "{:.3f}"), ("end_to_end_s", "{:.1f}")):
            v = per.get(f)
            cells.append("–" if v is None else fmt.format(v["mean"] * (1e3 if f == "verify_time_per_step_s" else 1)))
        cells.append("–" if m == "baseline" or not base else f"{100 * (w['mean'] - base['wer']['mean']):+.2f}")
        step, bstep = per.get("verify_time_per_step_s"), base.get("verify_time_per_step_s")
        cells.append("–" if m == "baseline" or not step or not bstep else
                     f"{100 * (step['mean'] / bstep['mean'] - 1):+.0f} %")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    groups = defaultdict(list)
    for path in a.runs:
        with open(path) as f:
            run = json.load(f)
        groups[(run["target"], run["draft"])].append(run)
    report = {}
    for (target, draft), runs in groups.items():
        short = lambda path: "/".join(path.rstrip("/").split("/")[-2:])   # noqa: E731
        name = f"target {short(target)}, draft {short(draft)}"
        report[name] = summarize(runs)
        print(table(name, report[name]) + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
