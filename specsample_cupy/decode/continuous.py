"""Continuous batching: a queue of requests decoded with at most B in flight
(SpeculativeDecoder.generate_stream()).

A row whose request finishes takes the next request of the queue between two rounds, so throughput
does not wait for the slowest request of a batch. The newcomer's prompt is prefilled in a small cache
of its own (the other rows' caches are left alone, and their columns cost that prefill nothing), then
moved into its row, whose old slots become holes (KVCache.take_rows); the next round decodes every
row. Caches that cannot take rows (CUDA-graph sessions' fixed buffers) prefill the newcomer in place:
its row is reset and fed while the other rows' columns are holes.

Every request has its own max_new_tokens, temperature and seed: its own, or by default the one
seeds.request_seed derives from the call's base seed and its index, as generate() derives them. Its
random numbers are keyed by that seed and counted from its own first round (host_loop.RequestStreams,
verify()'s `streams`), never by its row or by the requests around it, so it gets the tokens
generate([prompt], seed=its seed, ...) gives it alone, greedy or sampled (up to float near-ties of the
batched model runs).

On CUDA the rounds are the device loop's where generate() would run it (device_loop.DeviceRounds:
a newcomer's state and prefill are enqueued behind the rounds in flight, DeviceRounds.refill()),
else the host loop's (host_loop.HostRounds), as on the CPU; gamma is fixed (0, or method "target":
target-only steps).
"""
from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field
from numbers import Integral

import numpy as np

from specsample_cupy.decode.call_args import resolve_temperature
from specsample_cupy.decode.call_loops import call_sessions, new_caches, numbers_by_column, why_not_device_loop
from specsample_cupy.decode.detokenize import TextAssembler
from specsample_cupy.decode.device_loop import DeviceRounds
from specsample_cupy.decode.gamma_policy import FixedGamma
from specsample_cupy.decode.host_loop import HostRounds, RequestStreams
from specsample_cupy.decode.request_state import Requests
from specsample_cupy.decode.stats import Clock, RequestTally
from specsample_cupy.decode.stop_strings import StopStrings, check_stop_strings
from specsample_cupy.runtime.sessions_cache import KVCache
from specsample_cupy.verification.seeds import as_int64, check_seed, request_seed


@dataclass
class StreamRequest:
    """One request of generate_stream(): a prompt and its own settings."""
    prompt: str
    max_new_tokens: int = 64
    temperature: float | None = None   # 0: greedy; None: 1, or 0 with method "greedy" (generate()'s rule)
    seed: int | None = None   # None: derived from generate_stream()'s seed and the request's index


@dataclass
class FinishedRequest:
    """A request generate_stream() has finished, as generate() would return it alone."""
    index: int                  # its position in the requests given
    text: str
    token_ids: list[int]        # EOS included when one was produced; cut after a stop string
    finish_reason: str          # length | eos | context | stop
    stats: dict = field(default_factory=dict)   # new_tokens, rounds, proposed, accepted, acceptance_rate,
    #                                             latency_s (from taking a row to finishing, prefill included),
    #                                             seed (the request's: its own or the derived one)
    logprobs: list[float] | None = None   # generate_stream(logprobs=True): one per token of token_ids


def check_requests(requests, method: str, base_seed: int = 0) -> list[StreamRequest]:
    """The requests as new StreamRequests (a str is a prompt with the defaults) whose temperature and
    seed are resolved (generate()'s rules; a request without a seed gets request_seed(base_seed, its
    index)); TypeError/ValueError naming the request otherwise."""
    out = []
    for i, r in enumerate([requests] if isinstance(requests, (str, StreamRequest)) else list(requests)):
        r = StreamRequest(r) if isinstance(r, str) else r
        if not isinstance(r, StreamRequest) or not isinstance(r.prompt, str):
            raise TypeError(f"request {i} must be a str or a StreamRequest with a str prompt, got {r!r:.80}")
        if not isinstance(r.max_new_tokens, Integral) or isinstance(r.max_new_tokens, bool) or r.max_new_tokens < 0:
            raise ValueError(f"request {i}: max_new_tokens must be an int >= 0, got {r.max_new_tokens!r}")
        try:
            temperature = resolve_temperature(method, r.temperature, f"request {i}: temperature")
            seed = request_seed(base_seed, i) if r.seed is None else check_seed(r.seed, f"request {i}: seed")
        except ValueError as exc:
            raise ValueError(str(exc) if str(exc).startswith("request") else f"request {i}: {exc}") from None
        out.append(dataclasses.replace(r, temperature=temperature, seed=seed))
    if not out:
        raise ValueError("no requests given")
    return out


def decode_stream(dec, requests, batch_size: int, *, gamma: int, method: str, ignore_eos: bool, stop,
                  truncation: dict, logprobs: bool = False, seed: int = 0):
    """Check the arguments now (ValueError/TypeError), then return the generator of FinishedRequests
    that SpeculativeDecoder.generate_stream() documents."""
    if gamma == "auto" or not isinstance(gamma, Integral) or isinstance(gamma, bool) or gamma < 0:
        raise ValueError(f"continuous batching takes a fixed gamma (an int >= 0), got {gamma!r}: automatic "
                         "and adaptive gamma choose per call from the whole batch")
    if method == "baseline":
        raise ValueError("method 'baseline' draws from a stateful generator, so a request's tokens would depend "
                         "on the rows around it; continuous batching takes exact, sigmoid, sigmoid-paper, greedy "
                         "or target")
    if not isinstance(batch_size, Integral) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    dec._check(method, 1.0, 0, gamma)
    truncation = dec._check_truncation(method, 1.0, logprobs, **truncation)
    stops = check_stop_strings(stop)
    base_seed = check_seed(seed)
    requests = check_requests(requests, method, base_seed)
    speculative = method != "target" and gamma > 0
    sessions = call_sessions(dec, speculative)
    if numbers_by_column(sessions):
        raise ValueError("continuous batching needs models with a position_ids input (a refilled row's tokens "
                         "sit after other requests' columns)")
    prompt_ids = dec.encode_prompts([r.prompt for r in requests])
    context = dec.context_length or 1 << 62
    budgets = np.array([min(r.max_new_tokens, context - len(p)) for r, p in zip(requests, prompt_ids)], np.int64)
    run = _Run(dec, requests, prompt_ids, budgets, sessions, gamma if speculative else 0, method, ignore_eos,
               stops, truncation, logprobs)
    run.counts["seed"] = base_seed
    return StreamResults(run, batch_size)


class StreamResults:
    """What generate_stream() returns: an iterator of FinishedRequests, one per request as it
    finishes, and `stats`, the call's counts so far: rows (requests in flight at most), rounds (the
    loop's), request_rounds (rounds summed over the requests in them), refills (rows given a new
    request between rounds), occupancy (request_rounds / (rounds * rows)), loop ("device" or "host",
    once decoding has started), seed (the call's base seed)."""

    def __init__(self, run, batch_size: int):
        self._run, self._results = run, run.results(batch_size)

    def __iter__(self):
        return self

    def __next__(self) -> FinishedRequest:
        return next(self._results)

    def close(self):
        """End the call now (the decoder is free again); requests not finished are dropped."""
        self._results.close()

    @property
    def stats(self) -> dict:
        c = self._run.counts
        return {**c, "occupancy": c["request_rounds"] / (c["rounds"] * c["rows"]) if c["rounds"] else 0.0}


def takes_rows(caches) -> bool:
    """Whether every cache can take a newcomer's row from a cache of its own (KVCache.take_rows): the
    fixed buffers of CUDA-graph sessions (sessions_static) cannot."""
    return all(type(cache) is KVCache for cache in caches)


class _Run:
    """One generate_stream() call: the queue, the rows and what each row's request has done."""

    def __init__(self, dec, requests, prompt_ids, budgets, sessions, gamma, method, ignore_eos, stops, truncation,
                 logprobs=False):
        self.dec, self.requests, self.prompt_ids, self.budgets = dec, requests, prompt_ids, budgets
        self.sessions, self.gamma, self.stops, self.truncation = sessions, gamma, stops, truncation
        self.logprobs = logprobs
        self.method = method if gamma > 0 else "target"
        self.greedy = method == "greedy"
        self.eos = () if ignore_eos else dec.target_spec.eos_token_ids
        self.queue = deque(range(len(requests)))
        self.counts = {"rows": 0, "rounds": 0, "request_rounds": 0, "refills": 0, "loop": None}

    def results(self, batch_size: int):
        """FinishedRequests as requests finish; the decoder is busy until the generator ends."""
        dec = self.dec
        if not dec._busy.acquire(blocking=False):
            raise RuntimeError("this SpeculativeDecoder is already generating (in another thread): a decoder "
                               "runs one call at a time; use one decoder per thread")
        try:
            B = min(batch_size, int((self.budgets > 0).sum()))
            first, empty = self._take(B if B else len(self.queue))
            yield from empty
            if first:
                yield from self._decode(first)
        finally:
            dec._busy.release()

    def _take(self, n: int):
        """(up to n request indices for rows, in queue order; FinishedRequests of the requests met on
        the way that have nothing to generate, max_new_tokens 0)."""
        taken, empty = [], []
        while self.queue and len(taken) < n:
            i = self.queue.popleft()
            if self.budgets[i] > 0:
                taken.append(i)
            else:
                empty.append(FinishedRequest(i, "", [], "length", {"new_tokens": 0, "rounds": 0, "proposed": 0,
                                                                   "accepted": 0, "acceptance_rate": None,
                                                                   "latency_s": 0.0, "seed": self.requests[i].seed},
                                             [] if self.logprobs else None))
        return taken, empty

    def _decode(self, first: list[int]):
        dec, B = self.dec, len(first)
        self.counts["rows"] = B
        self.req = Requests([self.prompt_ids[i] for i in first], self.budgets[first], dec.target_spec.pad_token_id,
                            self.eos, extra=self.gamma + 2)
        self.req.requested[:] = [self.requests[i].max_new_tokens for i in first]
        self.rows, self.admitted = list(first), np.full(B, time.perf_counter())
        longest = max(len(p) + int(n) for p, n in zip(self.prompt_ids, self.budgets))
        # Wide enough for every request now: refills never widen the sequences (the device loop's
        # buffers are sized by their width).
        self.req.widen(longest + self.gamma + 2)
        # In-place prefills append a newcomer's prompt to every row's columns.
        columns = longest + self.gamma + 2 + min(dec.prefill_chunk, max(map(len, self.prompt_ids)))
        with dec._on_stream():
            self.caches = new_caches(dec, self.req, self.sessions, self.gamma, columns=columns)
            dec._prefill(list(zip(self.sessions, self.caches)), self.req)
        self.temps = np.array([self.requests[i].temperature for i in first], np.float32)
        self.streams = RequestStreams(as_int64([self.requests[i].seed for i in first]))
        caches = (self.caches[0], self.caches[1] if len(self.caches) > 1 else None)
        on_device = why_not_device_loop(dec, self.gamma > 0, self.gamma) is None
        self.counts["loop"] = "device" if on_device else "host"
        if on_device:
            self.loop = DeviceRounds(dec, self.req, *caches, policy=FixedGamma(self.gamma), method=self.method,
                                     temperature=self._temperature(), seed=0, clock=Clock(None, []),
                                     warps=self._device_warps(), logprobs=self.logprobs, streams=self.streams)
        else:
            self.loop = HostRounds(dec, self.req, *caches, policy=FixedGamma(self.gamma), method=self.method,
                                   temperature=self._temperature(), seed=0, clock=Clock(None, []),
                                   truncation=self.truncation, logprobs=self.logprobs, streams=self.streams)
        self.assembler = TextAssembler(dec.tokenizer, B, incremental=True)
        self.stopper = StopStrings(self.stops, dec.tokenizer, B) if self.stops else None
        self.tally = RequestTally(B)
        rounds = iter(self.loop)
        while True:
            # The decoder's stream is current only while it works, not while the caller holds a result.
            with dec._on_stream():
                rnd = next(rounds, None)
                if rnd is None:
                    return
                done = self._after_round(rnd)
                finished = [self._finished(b) for b in done]
            yield from finished
            with dec._on_stream():
                empty = self._refill(done)
            yield from empty

    def _temperature(self, xp=None):
        """The loop's temperature: 0 for method greedy, else each row's, on the loop's device or as an
        `xp` array (a new array: the device loop updates its own in place)."""
        return 0.0 if self.greedy else (xp or self.dec.xp).array(self.temps)

    def _device_warps(self):
        """The device loop's truncation at the rows' temperatures (min-p's span depends on them), or None.
        Built on the host, where the temperatures are, and uploaded from page-locked memory into arrays
        of its own: a refill neither reads the device back nor waits for the rounds in flight."""
        if not self.truncation:
            return None
        import cupy
        from specsample_cupy.verification.truncation import build_warps
        host = build_warps(np, self.req.batch, self.dec.target.vocab_size, self._temperature(np), **self.truncation)
        if host is None:
            return None
        stream = self.dec.stream
        with stream:
            arrays = [cupy.empty(a.shape, a.dtype) for a in host]
        return type(host)(*(self.dec.uploads.upload(a, stream, out=d) for a, d in zip(host, arrays)))

    def _after_round(self, rnd) -> list[int]:
        """Hand the round's tokens on; the rows whose requests it finished (a rule or a stop string)."""
        self.tally.add(rnd)
        self.counts["rounds"] += 1
        self.counts["request_rounds"] += int(rnd.active.sum())
        self.dec._deliver(rnd, self.req, self.assembler, None)
        if self.stopper is not None:
            stopped = self.stopper.after_round(rnd, self.assembler.current)
            if stopped:
                self.loop.finish(stopped)
        return np.flatnonzero(rnd.active & self.req.finished).tolist()

    def _finished(self, b: int) -> FinishedRequest:
        req = self.req
        text, ids = self.assembler.text(b), req.generated(b)
        if self.stopper is not None and self.stopper.matched[b]:
            text, ids = self.stopper.cut_row(ids)
        stats = {"new_tokens": len(ids), **self.tally.fields(b),
                 "latency_s": float(time.perf_counter() - self.admitted[b]), "seed": self.requests[self.rows[b]].seed}
        logprobs = self.loop.logprobs[b][:len(ids)] if self.logprobs else None   # cut as the ids are
        return FinishedRequest(self.rows[b], text, ids, req.finish_reason(b), stats, logprobs)

    def _refill(self, done: list[int]) -> list[FinishedRequest]:
        """Give the rows `done` the next requests of the queue and prefill them; returns the
        FinishedRequests of queued requests with nothing to generate."""
        picks, empty = self._take(len(done))
        rows = done[:len(picks)]
        if not rows:
            return empty
        now = time.perf_counter()
        for b, i in zip(rows, picks):
            self.req.refill(b, self.prompt_ids[i], int(self.budgets[i]), self.requests[i].max_new_tokens)
            self.assembler.reset(b)
            if self.stopper is not None:
                self.stopper.reset(b)
            self.rows[b], self.admitted[b] = i, now
            self.temps[b] = self.requests[i].temperature
            if self.logprobs:
                self.loop.logprobs[b] = []
        self.tally.reset(rows)
        self.counts["refills"] += len(rows)
        self.streams.restart(rows, as_int64([self.requests[i].seed for i in picks]), self.loop.round)
        if isinstance(self.loop, DeviceRounds):   # the rows' state and prefill enqueued behind the rounds
            self.loop.refill(rows, temperatures=None if self.greedy else self.temps[rows],
                             truncated=bool(self.truncation), warps=self._device_warps())
        else:
            self.loop.temperature = self._temperature()
            self._prefill_rows(rows, [self.prompt_ids[i] for i in picks])
        return empty

    def _prefill_rows(self, rows: list[int], prompts: list[list[int]]):
        """Every newcomer's prompt but its last token into its row of every cache (module docstring)."""
        dec, runs = self.dec, list(zip(self.sessions, self.caches))
        if takes_rows(self.caches):
            side = Requests(prompts, np.ones(len(prompts), np.int64), dec.target_spec.pad_token_id, (), extra=0)
            width = max(map(len, prompts))
            side_caches = [session.new_cache(len(prompts), width, slack=width) for session in self.sessions]
            dec._prefill(list(zip(self.sessions, side_caches)), side)
            for cache, side_cache in zip(self.caches, side_caches):
                cache.take_rows(rows, side_cache)
            return
        only = np.zeros(self.req.batch, bool)
        only[rows] = True
        for cache in self.caches:
            cache.reset_rows(rows)
        dec._prefill(runs, self.req, only=only)
