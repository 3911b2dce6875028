"""Speculative summarization with a decoder-only draft/target pair, scored by ROUGE.

The prompt is the article in a template (default ``"{article}\\nSummary:"``);
decoding stops at EOS, at a blank line ("\\n\\n") or at the token budget. ROUGE
is the mean over the articles with a reference summary; an article without one
is decoded and timed like the others but not scored (the table counts them:
scoring it against, say, the target's own output would inflate the figures).
With draft="ngram" the decoder drafts by prompt lookup over the request's tokens (no draft model).
"""
from __future__ import annotations

import time
from pathlib import Path

from specsample_cupy.decode.decoder import SpeculativeDecoder
from specsample_cupy.decode.ngram import NGRAM
from specsample_cupy.tasks.datasets import NoUsableItems, Skipped, load_summary_items
from specsample_cupy.tasks.evaluation import (RunSettings, check_ngram_methods, draft_label, finish_report,
                                              item_record, progress_bar)
from specsample_cupy.tasks.instrumented import StepRecorder
from specsample_cupy.tasks.metrics import rouge_scores

DEFAULT_TEMPLATE = "{article}\nSummary:"
STOP_STRINGS = ("\n\n",)


class RecordingDecoder(StepRecorder, SpeculativeDecoder):
    """SpeculativeDecoder whose generate() also returns per-step verify times and acceptances."""


def render_prompt(template: str, article: str) -> str:
    """Put the article into the template; ``{article}`` (or ``<article>``) marks where.

    Plain replacement rather than str.format, so braces elsewhere in a template
    (or in the article) are kept as they are; backslash-n typed on a shell
    command line becomes a newline.
    """
    template = template.replace("\\n", "\n").replace("\\t", "\t")
    for mark in ("{article}", "<article>"):
        if mark in template:
            return template.replace(mark, article.strip())
    raise ValueError("the template must contain {article}")


def run_summarize(target, draft, data, settings: RunSettings, *, device=None, limit=None,
                  template: str = DEFAULT_TEMPLATE, json_path=None, plot_path=None,
                  echo=print, ngram_min=1, ngram_max=4) -> dict:
    """Evaluate every method on the articles; print the table; write JSON/plot; return the report.
    draft="ngram": prompt-lookup drafts over ngram_min..ngram_max tokens instead of a draft model."""
    settings.check()
    if draft == NGRAM:
        check_ngram_methods(settings.methods)
    render_prompt(template, "")                        # reject a bad template before loading models
    items, skipped = load_summary_items(data)
    if not items:
        raise NoUsableItems(data, "articles", skipped)
    decoder = RecordingDecoder(target, draft, device=device, ngram_min=ngram_min, ngram_max=ngram_max)
    methods = settings.methods
    records = {m: [] for m in methods}
    references: list[str | None] = []   # per evaluated item: its summary, or None

    def decode(prompt, method, max_new):
        return decoder.generate([prompt], max_new_tokens=max_new, gamma=settings.gamma, method=method,
                                temperature=settings.temperature_for(method), seed=settings.seed,
                                stop_strings=STOP_STRINGS)

    warmed = not settings.warmup
    planned = items if limit is None else items[:limit]
    bar = progress_bar(len(planned) * len(methods), settings.progress, "summarize")
    for item in items:
        if limit is not None and len(records[methods[0]]) >= limit:
            break                                      # --limit counts usable items only
        prompt = render_prompt(template, item.article)
        try:
            decoder.encode_prompts([prompt])
        except ValueError as exc:                      # e.g. longer than the models' context
            skipped.append(Skipped(item.id, item.source, str(exc)))
            bar.update(len(methods))
            continue
        if not warmed:
            for m in methods:                          # compile kernels, size buffers: untimed
                decode(prompt, m, min(8, settings.max_new_tokens))
            warmed = True
        outputs = {}
        for m in methods:
            start = time.perf_counter()
            out = decode(prompt, m, settings.max_new_tokens)
            outputs[m] = out.texts[0].strip()
            records[m].append(item_record(item.id, out, time.perf_counter() - start,
                                          prediction=outputs[m]))
            bar.update(1)
        references.append(item.summary)
    bar.close()
    if not references:                                # every prompt was refused (e.g. too long)
        raise NoUsableItems(data, "articles", skipped)

    scored = [i for i, ref in enumerate(references) if ref is not None]
    accuracy = {}
    for m in methods:
        for r, ref in zip(records[m], references):
            r["reference"] = ref
        if scored:
            scores = rouge_scores([references[i] for i in scored], [records[m][i]["prediction"] for i in scored])
            for i, p in zip(scored, scores["per_item"]):
                records[m][i].update(p)
        else:   # nothing to score against: no figure rather than a zero
            scores = {"rouge1": None, "rouge2": None, "rougeL": None, "per_item": []}
        accuracy[m] = {**scores, "rouge_items": len(scored), "unscored_items": len(references) - len(scored)}
    header = {"target": str(Path(target)), "draft": draft_label(draft, decoder.ngram), "data": str(Path(data)),
              "device": decoder.device, "methods": methods, "gamma": settings.gamma,
              "max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature,
              "seed": settings.seed, "template": template, "stop_strings": list(STOP_STRINGS),
              "items_evaluated": len(references), "items_with_reference": len(scored),
              "items_without_reference": len(references) - len(scored)}
    return finish_report("summarize", header, records, accuracy, skipped, json_path=json_path,
                         plot_path=plot_path, echo=echo)
