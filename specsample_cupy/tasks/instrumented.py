"""Per-step records and stop strings on top of decoder.SpeculativeDecoder's loop.

The evaluations need, for every verification step, its time and how many
draft tokens were proposed and accepted; the decoder reports only totals.
``StepRecorder`` is a mixin that keeps the decoder's loop untouched and hooks
into the round methods it calls:

* each round's ``clock`` is wrapped so that every ``clock.span("verify")`` is
  also timed on its own (CUDA events on the decoder's stream, read after
  generation so no extra synchronisation happens inside the loop;
  perf_counter on the CPU);
* the (draft lengths, accepted) that ``_speculative_round`` returns are logged;
* after a round, a request whose generated text contains a stop string is
  marked finished (the text is cut at the stop string afterwards);
* prompts may be given as token-id lists (Whisper's forced decoder prefix).
"""
from __future__ import annotations

import contextlib
import time

import numpy as np


class _RecordingClock:
    """Delegates to the decoder's clock and also times each verify span by itself."""

    def __init__(self, clock, stream, log: list):
        self._clock, self._stream, self._log = clock, stream, log

    @contextlib.contextmanager
    def span(self, kind: str):
        if kind != "verify":
            with self._clock.span(kind):
                yield
            return
        if self._stream is None:
            start = time.perf_counter()
            with self._clock.span(kind):
                yield
            self._log.append(time.perf_counter() - start)
            return
        import cupy

        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(self._stream)
        with self._clock.span(kind):
            yield
        end.record(self._stream)
        self._log.append((start, end))

    def seconds(self, kind: str) -> float:
        return self._clock.seconds(kind)


class StepRecorder:
    """Mixin for SpeculativeDecoder: ``generate`` adds per-step lists to ``stats``.

    stats["verify_times_s"]: seconds of each verification step, in order.
    stats["draft_lengths"], stats["accepted_per_round"]: per step, summed over the batch
    (the evaluations decode one item per call, so these are that item's numbers).
    """

    stop_strings: tuple[str, ...] = ()

    def generate(self, prompts, *args, stop_strings=(), **kwargs):
        self._verify_log, self._draft_log, self._accept_log = [], [], []
        self._stop = tuple(s for s in stop_strings if s)
        out = super().generate(prompts, *args, **kwargs)
        times = []
        for entry in self._verify_log:
            if isinstance(entry, tuple):
                import cupy

                entry[1].synchronize()
                entry = cupy.cuda.get_elapsed_time(*entry) / 1e3
            times.append(float(entry))
        out.stats["verify_times_s"] = times
        out.stats["draft_lengths"] = self._draft_log
        out.stats["accepted_per_round"] = self._accept_log
        if self._stop:
            out.texts = [_cut_at_stop(t, self._stop) for t in out.texts]
        return out

    def encode_prompts(self, prompts):
        if all(isinstance(p, (list, tuple)) for p in prompts):
            ids = [[int(t) for t in p] for p in prompts]
            for i, p in enumerate(ids):
                if not p:
                    raise ValueError(f"prompt {i} is empty")
                if self.context_length and len(p) >= self.context_length:
                    raise ValueError(f"prompt {i} has {len(p)} tokens; the models' context holds "
                                     f"{self.context_length}, leaving no room to generate")
            return ids
        return super().encode_prompts(prompts)

    def _why_not_device_rounds(self, speculative, adaptive_gamma, gamma):
        # The records and stop strings hook the host-driven round; device rounds have no such hook.
        return "per-round records and stop strings"

    def _speculative_round(self, req, *args):
        *head, clock = args
        wrapped = _RecordingClock(clock, self.stream, self._verify_log)
        draft_len, accepted, n_new = super()._speculative_round(req, *head, wrapped)
        active = draft_len > 0
        self._draft_log.append(int(draft_len.sum()))
        self._accept_log.append(int(np.where(active, accepted, 0).sum()))
        self._apply_stop(req)
        return draft_len, accepted, n_new

    def _target_step(self, req, *args):
        n_new = super()._target_step(req, *args)
        self._apply_stop(req)
        return n_new

    def _apply_stop(self, req):
        if not self._stop:
            return
        for b in np.flatnonzero(~req.finished):
            text = self.tokenizer.decode(req.generated(int(b)), skip_special_tokens=True)
            if any(s in text for s in self._stop):
                req.finished[b] = True


def _cut_at_stop(text: str, stops) -> str:
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    return text if cut < 0 else text[:cut]
