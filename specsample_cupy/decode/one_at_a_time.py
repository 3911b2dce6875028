"""Batches for pairs that decode one prompt per call: generate() runs each prompt of such a batch as a
call of its own and returns one output for the batch.

Two kinds of model decode one prompt at a time. A model without a position_ids input (ONNX Runtime
GenAI's builder exports for the CPU) numbers its tokens by cache column, so a row with padding or a
rejected draft's hole would shift its positions. A model whose GroupQueryAttention writes into a
shared past/present buffer (the builder's CUDA exports, convert --attention gqa) may run several new
tokens over a past at batch 1 only: ONNX Runtime refuses more ("batch_size must be 1 when
sequence_length > 1 and past context is given"), on the CPU and on CUDA.

Each request keeps its own seed (seeds.request_seed(seed, i), or the one given), so its tokens are
those it gets decoded alone, as in any batch. on_tokens gets the batch's request index; on_round gets
each round of the request being decoded (a batch of one) with `requests` a view of the whole batch
(BatchView: which requests have finished and why), and the indices it returns are the batch's. The
statistics add up over the calls (stats["one_prompt_at_a_time"] says why the batch ran so).
"""
from __future__ import annotations

import time

import numpy as np

from specsample_cupy.decode.call_loops import call_sessions, numbers_by_column

SUMMED = ("rounds", "proposed", "accepted", "generated_tokens", "prefill_model_time_s", "sampling_time_s",
          "kv_compactions", "discarded_rounds")
SUMMED_TIMED = ("model_time_s", "verify_time_s")   # None when the runs were not timed


BATCHES_WHEN_CONVERTED = ("; the default layout of `specsample convert` batches (a builder folder opened with "
                          "batch_layout=True, as the CLI's runs of several prompts do, is converted once)")


def one_prompt_reason(dec, speculative: bool) -> str | None:
    """Why decoder `dec` decodes one prompt per call (module docstring), or None when it batches."""
    sessions = call_sessions(dec, speculative)
    if numbers_by_column(sessions):
        return "a model of the pair has no position_ids input (it numbers tokens by cache column)" \
            + BATCHES_WHEN_CONVERTED
    if any(getattr(s, "shared_buffer", False) for s in sessions):
        return ("GroupQueryAttention over a shared buffer runs several new tokens over a past at batch 1 only "
                "(ONNX Runtime)" + BATCHES_WHEN_CONVERTED)
    return None


class BatchView:
    """on_round's `requests` for a batch decoded one request at a time: batch, finished [B] and
    finish_reason(b), as the request state of a batched call has them."""

    def __init__(self, batch: int):
        self.batch = batch
        self.reasons: list[str | None] = [None] * batch
        self.current, self.req = 0, None

    @property
    def finished(self) -> np.ndarray:
        done = np.array([r is not None for r in self.reasons])
        if self.req is not None:
            done[self.current] = bool(self.req.finished[0])
        return done

    def finish_reason(self, b: int) -> str | None:
        if b == self.current and self.req is not None:
            return self.req.finish_reason(0)
        return self.reasons[b]


def generate_each(dec, prompts, *, encoded: bool, base_seed, request_seeds, reason: str, on_tokens, on_round,
                  kwargs: dict):
    """dec.generate() once per prompt (module docstring): (texts, token_ids, finish_reasons, stats,
    logprobs) of the batch, a GenerationOutput's fields. kwargs: generate()'s sampling arguments, passed
    to every call."""
    start = time.perf_counter()
    view, outs = BatchView(len(prompts)), []
    for i, prompt in enumerate(prompts):
        tokens_cb = None if on_tokens is None else (lambda b, ids, i=i: on_tokens(i, ids))
        round_cb = None if on_round is None else _round_callback(on_round, view, i)
        seeds = None if request_seeds is None else [int(request_seeds[i])]
        text = dict(prompt_ids=[prompt]) if encoded else dict(prompts=[prompt])
        out = dec.generate(**text, seed=base_seed, seeds=seeds, on_tokens=tokens_cb, on_round=round_cb, **kwargs)
        view.reasons[i], view.req = out.finish_reasons[0], None
        outs.append(out)
    stats = merged_stats([o.stats for o in outs], time.perf_counter() - start)
    stats.update(seed=base_seed, seeds=request_seeds, one_prompt_at_a_time=reason)
    logprobs = None if outs[0].logprobs is None else [o.logprobs[0] for o in outs]
    return ([o.texts[0] for o in outs], [o.token_ids[0] for o in outs], [o.finish_reasons[0] for o in outs],
            stats, logprobs)


def _round_callback(on_round, view: BatchView, i: int):
    def round_cb(rnd, req):
        view.current, view.req = i, req
        return [0 for b in (on_round(rnd, view) or ()) if b == i]
    return round_cb


def merged_stats(each: list[dict], wall_s: float) -> dict:
    """The stats of calls of one request each as those of one call of the batch: counts and times
    summed, rates recomputed, the rest from the first call (gamma) or the last (final_gamma)."""
    stats = dict(each[0])
    for key in SUMMED:
        stats[key] = sum(s[key] for s in each)
    timed = all(s[key] is not None for s in each for key in SUMMED_TIMED)
    for key in SUMMED_TIMED:
        stats[key] = sum(s[key] for s in each) if timed else None
    rounds = max(stats["rounds"], 1)
    stats.update(
        batch=len(each), final_gamma=each[-1]["final_gamma"], wall_s=wall_s,
        mean_gamma=sum(s["mean_gamma"] * s["rounds"] for s in each) / rounds,
        acceptance_rate=stats["accepted"] / stats["proposed"] if stats["proposed"] else 0.0,
        mean_accepted_per_round=stats["accepted"] / rounds,
        tokens_per_s=stats["generated_tokens"] / wall_s if wall_s > 0 else 0.0,
        read_wait_per_round_s=sum(s["read_wait_per_round_s"] * s["rounds"] for s in each) / rounds,
        auto_target_only=all(s["auto_target_only"] for s in each),
        verify_times_s=[t for s in each for t in s["verify_times_s"]] if timed else None,
        verify_time_per_round_s=stats["verify_time_s"] / rounds if timed else None,
        host_overhead_per_round_s=max(wall_s - stats["model_time_s"] - stats["verify_time_s"], 0.0) / rounds
        if timed else None)
    return stats
