"""Timing and statistics of one generate() call.

Clock times the GPU work of model runs and verify() with CUDA events on the decoder's stream (read
once after the loop, so no sync inside it), or with perf_counter on the CPU. Totals counts rounds,
proposals and acceptances as the loop reports them, and stats() turns both into the dict that
GenerationOutput.stats holds. One definition of overhead: wall time minus the GPU time of model runs
and verify(), per round.
"""
from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass

import numpy as np

KINDS = ("model", "prefill", "verify", "sampling")


class Clock:
    """GPU (or CPU) seconds per kind of work; `span(kind)` brackets work enqueued inside the block.

    Events are taken from `pool`, a list the decoder keeps across calls (creating an event costs µs).
    """

    def __init__(self, stream, pool: list):
        self.stream = stream
        self._events = {k: [] for k in KINDS}
        self._seconds = {k: 0.0 for k in KINDS}
        self._each = {k: [] for k in KINDS}      # seconds of every span, in order
        self._pool, self._used = pool, 0

    def _event(self):
        import cupy
        if self._used == len(self._pool):
            self._pool.append(cupy.cuda.Event())
        self._used += 1
        return self._pool[self._used - 1]

    @contextlib.contextmanager
    def span(self, kind: str, start=None):
        """Time the work enqueued inside the block. `start`: an event recorded right before it (the end
        of the previous span, nothing enqueued since), used instead of a new one."""
        if self.stream is None:
            started = time.perf_counter()
            yield
            self._each[kind].append(time.perf_counter() - started)
            return
        if start is None:
            start = self._event()
            start.record(self.stream)
        end = self._event()
        yield
        end.record(self.stream)
        self._events[kind].append((start, end))

    def last_end(self, kind: str):
        """The end event of the latest span of `kind` on the GPU, or None."""
        spans = self._events[kind] if self.stream is not None else ()
        return spans[-1][1] if spans else None

    def _collect(self, kind: str):
        if self.stream is not None and self._events[kind]:
            import cupy
            self.stream.synchronize()
            self._each[kind] += [cupy.cuda.get_elapsed_time(s, e) / 1e3 for s, e in self._events[kind]]
            self._events[kind].clear()

    def seconds(self, kind: str) -> float:
        self._collect(kind)
        return float(sum(self._each[kind]))

    def each(self, kind: str) -> list[float]:
        """Seconds of every span of `kind`, in the order they ran."""
        self._collect(kind)
        return list(self._each[kind])


@contextlib.contextmanager
def timed_runs(sessions, clock: Clock, kind: str = "model"):
    """Each session wraps its run call in the clock's `kind` span, so that model time is the GPU time
    of the runs alone: feeds, cache commits, sampling and idle gaps all count as overhead."""
    for session in sessions:
        session.run_span = functools.partial(clock.span, kind)
    try:
        yield
    finally:
        for session in sessions:
            session.run_span = None


@dataclass
class Round:
    """What one round did, as the loop reports it to the host (all host arrays [B]):
    active: rows unfinished before the round; draft_len: drafts proposed; accepted: drafts accepted;
    taken: tokens the rows took (after EOS and budget cuts); gamma: the round's gamma (0: a target
    step); expected_accepted: None, or (where the gamma policy asks: policy.expected) [B] float64, the
    accepted count's expectation over the positions tried (acceptance.expected_accepted)."""
    active: np.ndarray
    draft_len: np.ndarray
    accepted: np.ndarray
    taken: np.ndarray
    gamma: int
    expected_accepted: np.ndarray | None = None


class Totals:
    """Running counts over the rounds of one call."""

    def __init__(self):
        self.rounds = self.request_rounds = self.proposed = self.accepted = 0
        self.gammas: list[int] = []

    def add(self, r: Round):
        self.rounds += 1
        self.request_rounds += int(r.active.sum())
        self.proposed += int(r.draft_len[r.active].sum())
        self.accepted += int(np.where(r.active, r.accepted, 0).sum())
        self.gammas.append(r.gamma)


class RequestTally:
    """Per-row counts of the rounds a loop reports (Totals sums them over the batch; a request's own
    line or output needs its row's). reset() starts a row over for a new request."""

    def __init__(self, batch: int):
        self.rounds = np.zeros(batch, np.int64)
        self.proposed = np.zeros(batch, np.int64)
        self.accepted = np.zeros(batch, np.int64)

    def add(self, rnd: Round):
        active = rnd.active
        self.rounds += active
        self.proposed += np.where(active, rnd.draft_len, 0)
        self.accepted += np.where(active, rnd.accepted, 0)

    def reset(self, rows):
        for counts in (self.rounds, self.proposed, self.accepted):
            counts[rows] = 0

    def fields(self, b: int) -> dict:
        proposed, accepted = int(self.proposed[b]), int(self.accepted[b])
        return {"rounds": int(self.rounds[b]), "proposed": proposed, "accepted": accepted,
                "acceptance_rate": accepted / proposed if proposed else None}


def stats(*, method, speculative, device, req, totals: Totals, clock: Clock, timed: bool, wall_s: float,
          loop: str, extra: dict) -> dict:
    """GenerationOutput.stats (see SpeculativeDecoder.generate)."""
    prefill_s, verify_s, sampling_s = (clock.seconds(k) for k in ("prefill", "verify", "sampling"))
    model_s = clock.seconds("model") + prefill_s
    rounds = max(totals.rounds, 1)
    generated = int((req.seq_len - req.prompt_len).sum())
    gammas = totals.gammas or [0]
    return {
        "method": method if speculative else "target", "device": device, "batch": req.batch,
        "gamma": gammas[0], "final_gamma": gammas[-1], "mean_gamma": float(np.mean(gammas)),
        "rounds": totals.rounds, "proposed": totals.proposed, "accepted": totals.accepted,
        "acceptance_rate": totals.accepted / totals.proposed if totals.proposed else 0.0,
        "mean_accepted_per_round": totals.accepted / max(totals.request_rounds, 1),
        "generated_tokens": generated, "tokens_per_s": generated / wall_s if wall_s > 0 else 0.0,
        "wall_s": wall_s,
        "model_time_s": model_s if timed else None,
        "prefill_model_time_s": prefill_s,
        "verify_time_s": verify_s if timed else None,
        "verify_time_per_round_s": verify_s / rounds if timed else None,
        "verify_times_s": clock.each("verify") if timed else None,
        # The one overhead: wall time outside the GPU time of model runs and verify(), per round.
        "host_overhead_per_round_s": max(wall_s - model_s - verify_s, 0.0) / rounds if timed else None,
        "sampling_time_s": sampling_s,
        "loop": loop,
        **extra,
    }
