"""Per-method summaries, the printed table, the JSON report and the timing plot.

Each evaluated method produces a list of per-item records; every record has
``rounds``, ``accepted_per_round`` (draft tokens accepted in each verification
step), ``draft_lengths`` (tokens proposed in each step), ``verify_times_s``
(seconds of each verification step: CUDA events on the GPU, perf_counter on
the CPU), ``new_tokens`` and ``end_to_end_s``. The summary aggregates those
over all items, adds the task's accuracy numbers and the relative change
against the ``baseline`` method, as in the paper's tables.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

# Accuracy keys per task, and whether larger is better (for the table's arrows).
ACCURACY_KEYS = {"asr": [("wer", False)],
                 "summarize": [("rouge1", True), ("rouge2", True), ("rougeL", True)]}


def summarize_method(records: list[dict], accuracy: dict) -> dict:
    """Aggregate per-item records of one method into the paper's table row."""
    steps = [t for r in records for t in r.get("verify_times_s", [])]
    accepted = [a for r in records for a in r.get("accepted_per_round", [])]
    proposed = [d for r in records for d in r.get("draft_lengths", [])]
    rounds = sum(r.get("rounds", 0) for r in records)
    out = {
        **{k: v for k, v in accuracy.items() if k != "per_item"},
        "items": len(records),
        "new_tokens": sum(r.get("new_tokens", 0) for r in records),
        "rounds": rounds,
        # Mean number of draft tokens accepted per verification step.
        "mean_accepted_per_round": (sum(accepted) / len(accepted)) if accepted else None,
        # Fraction of proposed draft tokens that were accepted.
        "acceptance_rate": (sum(accepted) / sum(proposed)) if sum(proposed) else None,
        "verify_steps": len(steps),
        "verify_time_per_step_s": (sum(steps) / len(steps)) if steps else None,
        "verify_time_total_s": sum(steps) if steps else None,
        "end_to_end_s": sum(r.get("end_to_end_s", 0.0) for r in records),
    }
    return out


def add_relative_changes(summaries: dict[str, dict], reference: str = "baseline") -> None:
    """Add ``relative_to_<reference>``: (value - ref) / ref for every timing/accuracy number."""
    ref = summaries.get(reference)
    if ref is None:
        return
    keys = ("verify_time_per_step_s", "verify_time_total_s", "end_to_end_s",
            "mean_accepted_per_round", "acceptance_rate", "wer", "rouge1", "rouge2", "rougeL")
    for name, s in summaries.items():
        rel = {}
        for k in keys:
            a, b = s.get(k), ref.get(k)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b and math.isfinite(b):
                rel[k] = (a - b) / b
        s[f"relative_to_{reference}"] = rel
        # Accuracy also as a plain difference: a relative change of a 0 score is undefined.
        s[f"difference_to_{reference}"] = {
            k: s[k] - ref[k] for k in ("wer", "rouge1", "rouge2", "rougeL")
            if isinstance(s.get(k), (int, float)) and isinstance(ref.get(k), (int, float))
            and math.isfinite(s[k]) and math.isfinite(ref[k])}


# --------------------------------------------------------------------------- table

def _fmt(v, scale=1.0, digits=3, pct=False):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if pct:
        return f"{v * 100:+.1f}%"
    return f"{v * scale:.{digits}f}"


def _acc_label(key):
    return {"wer": "WER", "rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L"}[key] + " (points)"


def _fmt_points(v):
    return "-" if v is None or not math.isfinite(v) else f"{v * 100:+.2f}"


def render_table(task: str, summaries: dict[str, dict], *, reference: str = "baseline",
                 console=None) -> None:
    """Print one row per method with the paper's columns."""
    from rich.console import Console
    from rich.table import Table

    acc = ACCURACY_KEYS[task]
    table = Table(title=f"{task}: accuracy and verification time per method")
    table.add_column("method")
    for key, _ in acc:
        table.add_column({"wer": "WER %", "rouge1": "ROUGE-1", "rouge2": "ROUGE-2",
                          "rougeL": "ROUGE-L"}[key], justify="right")
    if task == "summarize":   # ROUGE is over the items with a reference summary only
        table.add_column("ROUGE over", justify="right")
    for col in ("acc./round", "accept rate", "verify ms/step", "verify total s",
                "end-to-end s", f"Δ verify/step vs {reference}", f"Δ {_acc_label(acc[0][0])} vs {reference}"):
        table.add_column(col, justify="right")
    for name, s in summaries.items():
        rel = s.get(f"relative_to_{reference}", {})
        diff = s.get(f"difference_to_{reference}", {})
        acc_cells = [_fmt(s.get(k), 100 if k == "wer" else 1, 2 if k == "wer" else 4)
                     for k, _ in acc]
        main_key = acc[0][0]
        if task == "summarize":
            acc_cells.append(f"{s.get('rouge_items', s['items'])} of {s['items']} items")
        table.add_row(name, *acc_cells,
                      _fmt(s.get("mean_accepted_per_round"), digits=2),
                      _fmt(s.get("acceptance_rate"), digits=3),
                      _fmt(s.get("verify_time_per_step_s"), 1e3, 4),
                      _fmt(s.get("verify_time_total_s"), digits=4),
                      _fmt(s.get("end_to_end_s"), digits=2),
                      "" if name == reference else _fmt(rel.get("verify_time_per_step_s"), pct=True),
                      "" if name == reference else _fmt_points(diff.get(main_key)))
    if console is None:
        # Pipes and files get a wide fixed width so the table does not wrap.
        console = Console() if sys.stdout.isatty() else Console(width=200, color_system=None)
    console.print(table)


# --------------------------------------------------------------------------- JSON

def _jsonable(obj):
    """Numpy scalars/arrays and Paths into JSON types; non-finite floats into strings."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):
        return _jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def write_json(path, report: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_jsonable(report), f, indent=2, ensure_ascii=False)
        f.write("\n")


# --------------------------------------------------------------------------- plot

def plot_verify_times(path, per_method_steps: dict[str, list[float]], *, title: str) -> None:
    """PNG: verification time of every step in run order (left) and its distribution (right)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed; safe on servers and in tests
    import matplotlib.pyplot as plt

    methods = [m for m, steps in per_method_steps.items() if steps]
    fig, (ax_line, ax_box) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    for m in methods:
        ms = [t * 1e3 for t in per_method_steps[m]]
        ax_line.plot(range(1, len(ms) + 1), ms, marker=".", linewidth=0.8, markersize=3, label=m)
    ax_line.set_xlabel("verification step")
    ax_line.set_ylabel("verification time (ms)")
    ax_line.set_title(title)
    if methods:
        ax_line.legend()
        ax_box.boxplot([[t * 1e3 for t in per_method_steps[m]] for m in methods])
        ax_box.set_xticks(range(1, len(methods) + 1), methods)
    ax_box.set_ylabel("ms per step")
    ax_box.set_title("distribution")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
