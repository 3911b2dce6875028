"""What the ASR and summarization evaluations share: method list, per-item records, the report.

Items are the outer loop and methods the inner one, so every method sees each
input right after the others (same caches, same clocks, input read once).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from specsample_cupy.decode.ngram import NGRAM
from specsample_cupy.verification.api import ONEHOT_METHODS, SAMPLING_ONLY
from specsample_cupy.tasks.report import (add_relative_changes, plot_verify_times, render_table,
                                          summarize_method, write_json)

VERIFY_METHODS = ("baseline", "exact", "sigmoid", "sigmoid-paper", "greedy")
ALL_METHODS = VERIFY_METHODS + ("target",)
DEFAULT_METHODS = ("baseline", "exact", "sigmoid", "target")
# Prompt-lookup drafts (draft="ngram") have no draft distribution: only the methods that verify one-hot
# drafts apply, and target-only decoding as the reference.
NGRAM_METHODS = ONEHOT_METHODS + ("target",)


def parse_methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in ALL_METHODS]
    if unknown or not methods:
        raise ValueError(f"unknown method(s) {unknown or text!r}; choose from {', '.join(ALL_METHODS)}")
    return list(dict.fromkeys(methods))


def check_ngram_methods(methods) -> None:
    """ValueError naming the methods that need a draft model's logits, which prompt lookup lacks."""
    refused = [m for m in methods if m not in NGRAM_METHODS]
    if refused:
        raise ValueError(f"--draft ngram proposes one-hot drafts (no draft logits): method(s) "
                         f"{', '.join(refused)} need a draft model; choose from {', '.join(NGRAM_METHODS)}")


def draft_label(draft, ngram) -> str:
    """The report's "draft": the model folder, or "ngram MIN..MAX" for prompt lookup."""
    return f"{NGRAM} {ngram[0]}..{ngram[1]}" if ngram else str(Path(draft))


@dataclass
class RunSettings:
    methods: list[str]
    gamma: int = 5
    max_new_tokens: int = 128
    temperature: float = 1.0
    seed: int = 0
    warmup: bool = True
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def temperature_for(self, method: str) -> float:
        return 0.0 if method == "greedy" else self.temperature

    def check(self):
        if self.gamma < 1:
            raise ValueError("--gamma must be at least 1")
        if self.max_new_tokens < 1:
            raise ValueError("--max-new-tokens must be at least 1")
        if self.temperature == 0 and any(m in SAMPLING_ONLY for m in self.methods):
            raise ValueError(f"methods {', '.join(SAMPLING_ONLY)} sample: use --temperature > 0 "
                             "(or method 'greedy' for temperature 0)")


def item_record(item_id: str, out, end_to_end_s: float, **extra) -> dict:
    """One item's numbers for one method from a GenerationOutput (with StepRecorder's lists)."""
    s = out.stats
    verify_times = list(s.get("verify_times_s", []))
    return {
        "id": item_id, **extra,
        "token_ids": list(out.token_ids[0]),
        "new_tokens": len(out.token_ids[0]),
        "rounds": int(s.get("rounds", 0)) if s.get("method") != "target" else 0,
        "draft_lengths": list(s.get("draft_lengths", [])),
        "accepted_per_round": list(s.get("accepted_per_round", [])),
        "acceptance_rate": s.get("acceptance_rate"),
        "mean_accepted_per_round": s.get("mean_accepted_per_round"),
        "verify_times_s": verify_times,
        "verify_time_total_s": sum(verify_times),
        "model_time_s": s.get("model_time_s"),
        "decode_wall_s": s.get("wall_s"),
        "end_to_end_s": end_to_end_s,
    }


def progress_bar(total: int, enabled: bool, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, desc=desc, unit="run", file=sys.stderr,
                dynamic_ncols=True, leave=False)


def finish_report(task: str, header: dict, records: dict[str, list[dict]], accuracy: dict[str, dict],
                  skipped: list, *, json_path=None, plot_path=None, echo=print) -> dict:
    """Summaries + relative changes, the printed table and skipped list, JSON and plot files."""
    summaries = {m: summarize_method(records[m], accuracy[m]) for m in records}
    add_relative_changes(summaries, "baseline")
    render_table(task, summaries)
    if skipped:
        echo(f"skipped {len(skipped)} item(s):")
        for s in skipped:
            echo(f"  {s}")
    report = {**header, "task": task, "summary": summaries,
              "items": {m: records[m] for m in records},
              "accuracy_per_item": {m: accuracy[m].get("per_item", []) for m in accuracy},
              "skipped": [s.to_dict() for s in skipped]}
    if json_path:
        write_json(json_path, report)
        echo(f"wrote {json_path}")
    if plot_path:
        steps = {m: [t for r in records[m] for t in r["verify_times_s"]] for m in records}
        plot_verify_times(plot_path, steps, title=f"{task}: verification time per step")
        echo(f"wrote {plot_path}")
    return report
