"""Running `specsample generate`'s requests: a line per request as it finishes, progress, and the time
spent inside and outside the decoder's calls.

Continuous batching (Runner.run_stream, the default): every request goes through one
generate_stream() call with --batch-size rows, each request with its own settings; a finished
request's row takes the next request at once. It needs a fixed gamma and a method whose random
numbers follow the request (not "baseline"): continuous_allowed() says why not.

Static batching (Runner.run, --static): one generate() call per batch. Requests of one call share its
max_new_tokens and temperature, so a request joins only a batch of equal settings (each keeps its own
seed: generate()'s seeds). In input order, each request joins the open batch of its settings; a batch
runs as soon as it holds --batch-size requests; at the end of the input the partial batches run in the
order their first requests came.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from specsample_cupy.batch.inputs import Request
from specsample_cupy.decode.continuous import StreamRequest
from specsample_cupy.decode.stats import RequestTally


def batches(requests: list[Request], batch_size: int):
    """The requests in batches of equal settings, by the module's rule."""
    open_batches = {}
    for request in requests:
        key = request.settings.batch_key
        batch = open_batches.setdefault(key, [])
        batch.append(request)
        if len(batch) == batch_size:
            yield open_batches.pop(key)
    yield from open_batches.values()


def continuous_allowed(gamma, adaptive_gamma: bool, method: str) -> str | None:
    """None when a run with these options can batch continuously, else why not."""
    if gamma == "auto" or adaptive_gamma:
        return "continuous batching takes a fixed gamma"
    if method == "baseline":
        return "method baseline's random numbers do not follow the request"
    return None


@dataclass
class DecodeOptions:
    """What every generate() call of a run shares (the per-request settings come from each batch)."""
    method: str
    gamma: int | str
    adaptive_gamma: bool
    stop: tuple = ()   # stop strings (generate(stop=...))
    truncation: dict = field(default_factory=dict)   # generate()'s top_k / top_p / min_p
    logprobs: bool = False   # each line also holds "logprobs", one per token (generate(logprobs=True))
    settings: dict = field(default_factory=dict)   # the run's settings, in every line (batch/run_settings.py)


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

    def _write(self, request: Request, ids: list[int], text: str, reason: str, counts: dict, latency_s: float,
               batch_size: int, logprobs: list[float] | None = None):
        """counts: the request's rounds, proposed, accepted and acceptance_rate (RequestTally.fields);
        logprobs: None, or one per id (the line then holds them)."""
        s = request.settings
        self.writer.write({"id": request.id, "line": request.line, "text": text, "token_ids": ids,
                           **({} if logprobs is None else {"logprobs": logprobs}),
                           "finish_reason": reason, "new_tokens": len(ids), **counts,
                           "latency_s": latency_s, "batch_size": batch_size,
                           "max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "seed": s.seed,
                           "seed_from": s.seed_from,
                           **({"settings": self.options.settings} if self.options.settings else {})})
        self.written += 1
        self.tokens += len(ids)
        self.proposed += counts["proposed"]
        self.accepted += counts["accepted"]
        elapsed = time.perf_counter() - self.started
        acceptance = f"{self.accepted / self.proposed:.2f}" if self.proposed else "-"
        self.bar.set_postfix_str(f"{self.tokens / elapsed:.1f} tok/s, acceptance {acceptance}", refresh=False)
        self.bar.update(1)

    def run(self, batch: list[Request], source):
        """Decode one batch (equal settings); source(request) names a request in messages."""
        s, tokenizer, logprobs = batch[0].settings, self.decoder.tokenizer, self.options.logprobs
        tally, written = RequestTally(len(batch)), np.zeros(len(batch), bool)
        finished_s = {}   # with logprobs: when each request finished, for its line written after the call

        def on_round(rnd, req):
            entered = time.perf_counter()
            tally.add(rnd)
            # A request a stop string ended is written from generate()'s output, which cuts it.
            for b in np.flatnonzero(req.finished & ~req.stopped & ~written).tolist():
                if logprobs:   # they come with generate()'s output (as decode --jsonl --logprobs)
                    finished_s.setdefault(b, entered - started)
                    continue
                ids = req.generated(b)
                self._write(batch[b], ids, tokenizer.decode(ids, skip_special_tokens=True), req.finish_reason(b),
                            tally.fields(b), entered - started, len(batch))
                written[b] = True
            self.callback_s += time.perf_counter() - entered

        started = time.perf_counter()
        try:
            out = self.decoder.generate([r.prompt for r in batch], max_new_tokens=s.max_new_tokens,
                                        gamma=self.options.gamma, method=self.options.method,
                                        temperature=s.temperature, seeds=[r.settings.seed for r in batch],
                                        adaptive_gamma=self.options.adaptive_gamma, on_round=on_round,
                                        stop=self.options.stop, logprobs=logprobs, **self.options.truncation)
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
        # Requests that no round reported finished (max_new_tokens 0), that a stop string ended, or
        # whose log-probabilities were asked for are written from the output.
        for b in np.flatnonzero(~written).tolist():
            self._write(batch[b], out.token_ids[b], out.texts[b], out.finish_reasons[b], tally.fields(b),
                        finished_s.get(b, ended - started), len(batch), out.logprobs[b] if logprobs else None)
        self.writer.sync()

    def run_stream(self, requests: list[Request], batch_size: int, source):
        """Decode the requests with continuous batching (module docstring), each with its own settings;
        source(request) names a request in messages. A line per request as it finishes, the file
        synced every batch_size lines. A call the decoder refuses (ValueError) fails the requests it
        had not finished: they are reported on stderr, and a re-run retries them."""
        o = self.options
        stream = [StreamRequest(r.prompt, r.settings.max_new_tokens, r.settings.temperature, r.settings.seed)
                  for r in requests]
        rows = min(batch_size, len(requests))
        written = np.zeros(len(requests), bool)
        started = time.perf_counter()
        try:
            results = self.decoder.generate_stream(stream, batch_size, gamma=o.gamma, method=o.method, stop=o.stop,
                                                   logprobs=o.logprobs, **o.truncation)
            for out in results:
                entered = time.perf_counter()
                counts = {k: out.stats[k] for k in ("rounds", "proposed", "accepted", "acceptance_rate")}
                self._write(requests[out.index], out.token_ids, out.text, out.finish_reason, counts,
                            out.stats["latency_s"], rows, out.logprobs)
                written[out.index] = True
                if written.sum() % batch_size == 0:
                    self.writer.sync()
                self.callback_s += time.perf_counter() - entered
        except ValueError as exc:   # the decoder refused: report what it did not write (a re-run retries it)
            for i in np.flatnonzero(~written).tolist():
                self.bar.write(f"{source(requests[i])}: not generated: {exc}", file=sys.stderr)
                self.failed += 1
                self.bar.update(1)
        finally:
            self.generate_s += time.perf_counter() - started
            self.writer.sync()

    def close(self):
        self.bar.close()
