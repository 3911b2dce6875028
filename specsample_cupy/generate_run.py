"""Running `specsample generate`'s requests: batching, one generate() call per batch, a line per request
as it finishes, progress, and the time spent inside and outside generate().

Batching rule: requests of one generate() call share its max_new_tokens, temperature and seed, so a
request joins only a batch of equal settings. In input order, each request joins the open batch of its
settings; a batch runs as soon as it holds --batch-size requests; at the end of the input the partial
batches run in the order their first requests came.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from specsample_cupy.generate_input import Request


def batches(requests: list[Request], batch_size: int):
    """The requests in batches of equal settings, by the module's rule."""
    open_batches = {}
    for request in requests:
        batch = open_batches.setdefault(request.settings, [])
        batch.append(request)
        if len(batch) == batch_size:
            yield open_batches.pop(request.settings)
    yield from open_batches.values()


@dataclass
class DecodeOptions:
    """What every generate() call of a run shares (the per-request settings come from each batch)."""
    method: str
    gamma: int | str
    adaptive_gamma: bool
    stop: tuple = ()   # stop strings (generate(stop=...))
    truncation: dict = field(default_factory=dict)   # generate()'s top_k / top_p / min_p


class RoundTally:
    """Per-request counts from the rounds a generate() call reports: the decoder's stats sum them over
    the batch, a line needs each request's own."""

    def __init__(self, batch: int):
        self.rounds = np.zeros(batch, np.int64)
        self.proposed = np.zeros(batch, np.int64)
        self.accepted = np.zeros(batch, np.int64)

    def add(self, rnd):
        active = rnd.active
        self.rounds += active
        self.proposed += np.where(active, rnd.draft_len, 0)
        self.accepted += np.where(active, rnd.accepted, 0)

    def fields(self, b: int) -> dict:
        proposed, accepted = int(self.proposed[b]), int(self.accepted[b])
        return {"rounds": int(self.rounds[b]), "proposed": proposed, "accepted": accepted,
                "acceptance_rate": accepted / proposed if proposed else None}


class Runner:
    """Runs batches on one decoder, writing each request's line to `writer` as soon as the request
    finishes; a request that a generate() call refused is reported on stderr."""

    def __init__(self, decoder, writer, options: DecodeOptions, total: int, progress: bool):
        from tqdm import tqdm

        self.decoder, self.writer, self.options = decoder, writer, options
        self.bar = tqdm(total=total, disable=not progress, unit="req", file=sys.stderr, dynamic_ncols=True)
        self.written = self.failed = self.tokens = self.proposed = self.accepted = 0
        self.generate_s = 0.0    # wall time inside generate() calls ...
        self.callback_s = 0.0    # ... of which this runner's own work in its round callback
        self.started = time.perf_counter()

    @property
    def decoding_s(self) -> float:
        """Wall time of the decoder's own work: the generate() calls less this runner's writing and
        bookkeeping inside them (its round callback)."""
        return self.generate_s - self.callback_s

    def _write(self, request: Request, ids: list[int], text: str, reason: str, tally: RoundTally, b: int,
               latency_s: float, batch_size: int):
        s = request.settings
        self.writer.write({"id": request.id, "line": request.line, "text": text, "token_ids": ids,
                           "finish_reason": reason, "new_tokens": len(ids), **tally.fields(b),
                           "latency_s": latency_s, "batch_size": batch_size,
                           "max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "seed": s.seed})
        self.written += 1
        self.tokens += len(ids)
        self.proposed += int(tally.proposed[b])
        self.accepted += int(tally.accepted[b])
        elapsed = time.perf_counter() - self.started
        acceptance = f"{self.accepted / self.proposed:.2f}" if self.proposed else "-"
        self.bar.set_postfix_str(f"{self.tokens / elapsed:.1f} tok/s, acceptance {acceptance}", refresh=False)
        self.bar.update(1)

    def run(self, batch: list[Request], source):
        """Decode one batch (equal settings); source(request) names a request in messages."""
        s, tokenizer = batch[0].settings, self.decoder.tokenizer
        tally, written = RoundTally(len(batch)), np.zeros(len(batch), bool)

        def on_round(rnd, req):
            entered = time.perf_counter()
            tally.add(rnd)
            # A request a stop string ended is written from generate()'s output, which cuts it.
            for b in np.flatnonzero(req.finished & ~req.stopped & ~written).tolist():
                ids = req.generated(b)
                self._write(batch[b], ids, tokenizer.decode(ids, skip_special_tokens=True), req.finish_reason(b),
                            tally, b, entered - started, len(batch))
                written[b] = True
            self.callback_s += time.perf_counter() - entered

        started = time.perf_counter()
        try:
            out = self.decoder.generate([r.prompt for r in batch], max_new_tokens=s.max_new_tokens,
                                        gamma=self.options.gamma, method=self.options.method,
                                        temperature=s.temperature, seed=s.seed,
                                        adaptive_gamma=self.options.adaptive_gamma, on_round=on_round,
                                        stop=self.options.stop, **self.options.truncation)
        except ValueError as exc:   # the decoder refused the batch: report what it did not write (a re-run retries it)
            for b in np.flatnonzero(~written).tolist():
                self.bar.write(f"{source(batch[b])}: not generated: {exc}", file=sys.stderr)
                self.failed += 1
                self.bar.update(1)
            self.writer.sync()
            return
        finally:
            self.generate_s += time.perf_counter() - started
        ended = time.perf_counter()
        # Requests that no round reported finished (max_new_tokens 0) or that a stop string ended are
        # written from the output.
        for b in np.flatnonzero(~written).tolist():
            self._write(batch[b], out.token_ids[b], out.texts[b], out.finish_reasons[b], tally, b,
                        ended - started, len(batch))
        self.writer.sync()

    def close(self):
        self.bar.close()
