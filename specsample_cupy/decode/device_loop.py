"""The decode loop on CUDA: rounds whose bookkeeping lives on the GPU (kernels_cu/decode_round.cu).

The device keeps its own copy of the requests' state (sequences, lengths, budgets, finished flags,
both caches' slot masks) and one small kernel between two model runs does what the host loop's
NumPy lines do (host_loop):

    draft run i      (a captured graph: S = 2 for i = 0, the tokens the draft has not seen; else S = 1)
    draft_step_done  sample the draft token, keep its logits row, commit the run's KV columns and
                     mask, write the next run's feeds (the next draft run's, or the target's)
    target run       (S = gamma + 1)
    verify()
    round_done       append the emitted tokens (EOS, budget), commit the target's columns, roll
                     both masks back, next round's draft lengths and first draft feed, a report

Target-only decoding is gamma = 0 of the same loop: a target run (S = 1) then target_step_done
(sample, append, commit, next feed, report). So the host enqueues whole rounds without reading
anything, and reads each round's report (a few ints per request, written by the round's last kernel
into page-locked host memory) one round late: while the GPU runs round r + 1 the host applies round
r's tokens to its own copy of the sequences. It enqueues round r + 1 before reading round r only
when round r cannot end the generation by the budget alone (an EOS still can: that round's work is
then discarded, counted in stats["discarded_rounds"]).

gamma may change from round to round (gamma_policy): the buffers are sized for the policy's largest
gamma, a round of gamma drafts uses their first B * gamma rows, and the choice for round r + 1 is made
when round r is enqueued, from the reports read by then. A call whose policy may stop drafting also
gets the target's S = 1 step on its buffers (enable_target_steps); a target step at round r samples
at offset r * (cap + 1), host_loop's rule. Truncated sampling, log-probabilities, cache compaction
on the device and continuous batching's refills (refill()): docs/decode-loop.md ("The device loop").

Buffers and launches: round_buffers.py; automatic gamma's costs: device_cost.py.
Used on CUDA when the models run with fixed bindings (sessions_static) and their logits share a dtype
(float32/float16); otherwise host_loop runs.
"""
from __future__ import annotations

import contextlib
import ctypes
import time

import numpy as np

from specsample_cupy.decode.device_cost import DeviceCost, calibrate_model_costs
from specsample_cupy.decode.acceptance import expected_accepted
from specsample_cupy.decode.device_proposers import device_proposer
from specsample_cupy.decode.round_buffers import EVENTS, PITCH_ROUND, THREADS, round_buffers
from specsample_cupy.decode.stats import Round
from specsample_cupy.runtime import errors, kernel_runtime
from specsample_cupy.verification.api import VerifyResult, verify

__all__ = ["DeviceCost", "DeviceRounds"]


class DeviceRounds:
    """The rounds of one generate() call, with the state on the device (module docstring).

    Iterating yields a decode_stats.Round per round as the host reads it, after the host's copy of the
    sequences (req) has taken the round's tokens. draft_cache None: target-only (gamma = 0).

    Continuous batching (continuous.py) gives finished rows new requests between rounds: refill()
    enqueues the newcomers' state and prefill behind the rounds in flight, so the loop never
    drains; streams, a host_loop.RequestStreams, keys each row's random numbers by its request
    (with a fixed gamma: its offsets count its own rounds), and temperature is then [B] on the
    device, each row's, updated in place.
    """

    def __init__(self, decoder, req, target_cache, draft_cache, *, policy, method, temperature, seed, clock,
                 warps=None, logprobs=False, streams=None):
        if draft_cache is not None and target_cache.capacity != draft_cache.capacity:
            raise ValueError("device rounds need both caches at the same capacity")
        self.dec, self.req, self.clock, self.policy = decoder, req, clock, policy
        self.target, self.draft = decoder.target, decoder.draft
        self.tc, self.dc = target_cache, draft_cache
        self.proposer = device_proposer(decoder)   # what drafts each speculative round (device_proposers.py)
        self.method, self.temperature, self.seed = method, temperature, seed
        self.cap = policy.cap
        self.per_round = self.cap + 1
        self.stream = decoder.stream
        self.discarded = 0
        self.read_wait_s = 0.0
        self.enqueued = self.read = 0   # rounds enqueued, and those of them whose reports the host read
        self.B = B = req.batch
        self.joined = np.zeros(B, np.int64)   # the first round of each row's request (refill())
        P = -(-req.seq.shape[1] // PITCH_ROUND) * PITCH_ROUND
        self.buf = buf = round_buffers(decoder, B, target_cache.capacity, P, self.cap, int(req.eos_ids.size))
        self.masks = {"target": buf.dev["mask_t"].reshape(B, -1), "draft": buf.dev["mask_d"].reshape(B, -1)}
        if hasattr(policy, "cost") and isinstance(policy.cost, DeviceCost) and policy.cost.model_s is None:
            policy.cost.model_s = calibrate_model_costs(decoder, buf, range(policy.lo, policy.cap + 1))
            policy.choose()   # from the measured costs (and what earlier calls measured, if loaded)
        if getattr(policy, "expected", False):
            buf.prepare_expected(self.stream)
        # A policy that may stop drafting mid-call (automatic gamma) gets target steps on these buffers.
        self.steps_after_drafts = self.cap > 0 and getattr(policy, "target_steps", False)
        if self.steps_after_drafts:
            buf.enable_target_steps(self.target)
        # Round 0's time, for a policy that learns costs: from an event recorded right before its first
        # launch (later rounds: from the previous round's report event).
        self._round0_start = None
        if getattr(policy, "cost", None) is not None:
            import cupy
            self._round0_start = cupy.cuda.Event(disable_timing=False)
        policy.begin(int(np.max(req.remaining, initial=0)), probe_steps=1)   # automatic gamma's (gamma_policy)
        self.gammas = {0: policy.next_gamma()}
        limit = decoder.context_length
        self.pos_limit = (limit or np.iinfo(np.int64).max) - 1
        self._streams = streams
        self._stream_base = self._upload_streams(streams)
        buf.start(req, (target_cache, draft_cache), gamma=self.gammas[0], temperature=temperature, seed=seed,
                  pad_id=req.pad_id, pos_limit=self.pos_limit, stream=self.stream,
                  warps=warps, logprobs=logprobs, stream_base=self._stream_base)
        # generate(logprobs=True): per request, one log-probability per token taken (as host_loop's).
        self.logprobs = [[] for _ in range(B)] if logprobs else None

    def _upload_streams(self, streams):
        """[B, 2] int64 on the device, each row's (seed, offset base): the base makes a launch's offset
        (the loop's round) the request's own, counted from the round it joined at (host_loop's
        offsets: own round * (cap + 1) + step, or own round for target steps). None without streams."""
        if streams is None:
            return None
        import cupy
        base = np.stack([streams.seeds, -streams.joined * self.per_round], axis=1).astype(np.int64)
        with self.stream:
            self._verify_streams = cupy.empty_like(base)   # each round's, written before its verify()
            self._offset_launch = kernel_runtime.Launch(self.buf.offset_streams, [
                ctypes.c_void_p(0), ("offset", ctypes.c_int64()),
                ctypes.c_void_p(self._verify_streams.data.ptr), ctypes.c_int32(self.B)])
            base = cupy.asarray(base)
        self._offset_launch.set(leading=(base.data.ptr,))
        return base

    def _verify_draws(self, offset: int) -> dict:
        """verify()'s random-number keywords for a round whose verify offset (the loop's) is `offset`."""
        if self._stream_base is None:
            return {"seed": self.seed, "offset": offset}
        # One buffer serves every round: round r + 1's launch follows round r's verify() in stream order.
        self._offset_launch(self.stream, -(-self.B // THREADS), THREADS, offset=offset)
        return {"streams": self._verify_streams}

    def finish(self, rows) -> None:
        """Finish these requests now (stop strings): on the host at once, on the device from the next
        round enqueued (rounds already enqueued may still compute for them; the host ignores that)."""
        rows = np.asarray(rows, np.int64)
        self.req.stop(rows)
        with self.stream:
            self.buf.dev["finished"][rows] = 1

    # -- rounds -------------------------------------------------------------------------------------
    def _enqueue(self, r: int):
        """Enqueue round r and an event the host waits on; its last kernel writes the report into host
        memory. Round r - 2's report, in the same slot, was read before this call.

        Round r + 1's gamma is chosen now (round_done of a drafting round r writes the next round's
        draft lengths). A target step (gamma 0) may follow a drafting round: its S = 1 feed is then
        written from the device's state (ngram_target_feed with G = 0; after a target step,
        target_step_done writes it). A drafting round may follow a target step only at round 1: the
        draft's first run (S = 2) catches up on the two tokens it has not seen then, not on more, so
        later target steps last to the call's end (automatic gamma's stop is final too)."""
        gamma = self.gammas[r]
        following = self.policy.next_gamma() if gamma or self.steps_after_drafts else 0
        self.gammas[r + 1] = following if gamma or r == 0 else 0
        self._compact_full_caches(gamma + 1)
        self.enqueued += 1
        report = self.buf.host_reports[r % 2].ctypes.data
        if r == 0 and self._round0_start is not None:
            self._round0_start.record(self.stream)
        if gamma == 0:
            if r > 0 and self.gammas[r - 1] > 0:   # the first target step after drafting rounds
                self.buf.ngram_feed_launch(self.stream, self.B, THREADS, G=0,
                                           feed=self.buf.target_steps[1].feed.data.ptr)
            self._enqueue_target_step(r, report)
        else:
            if r == 1 and self.gammas[0] == 0:   # after a first target step: draft lengths, first draft feed
                self.buf.prepare_round(self.stream, gamma)
            self._enqueue_speculative(r, gamma, report)
        self.buf.report_events[r % EVENTS].record(self.stream)

    def _enqueue_target_step(self, r: int, report: int):
        buf, L = self.buf, self.tc.length
        launch = buf.target_launch
        self.target.replay(buf.target_steps[1])
        self.tc.length += 1
        if buf.warps is not None:   # the thresholds / statistics of the rows target_step_done samples
            buf.row_warps(self.stream, buf.target_steps[1].logits.data.ptr, 1, self.temperature, buf.warps)
        buf.set_commit(launch.commit, 1, L)
        # Round r's first offset (host_loop's rule): r in target-only calls, no earlier round's in others.
        launch(self.stream, offset=(r * self.per_round) & 0xFFFFFFFF, L_run=L, report=report,
               lp_out=buf.logprobs_slot(r))

    def _enqueue_speculative(self, r: int, gamma: int, report: int):
        buf, stream, B = self.buf, self.stream, self.B
        base = r * self.per_round
        target_step = buf.target_step(self.target, gamma + 1)
        draft_tokens = buf.draft_tokens[:B * gamma].reshape(B, gamma)
        draft_logits = self.proposer.enqueue(self, base, gamma, target_step, draft_tokens)
        L = self.tc.length
        self.target.replay(target_step)
        self.tc.length += gamma + 1
        # When the target run is timed, its end event also starts verify()'s span (one event fewer).
        timed = self.dec.time_model_runs
        target_end = self.clock.last_end("model") if timed and self.target.run_span is not None else None
        with self.clock.span("verify", start=target_end) if timed else contextlib.nullcontext():
            res = verify(draft_tokens, draft_logits, target_step.logits, method=self.method,
                         temperature=self.temperature, **self._verify_draws(base + self.cap),
                         draft_lengths=buf.draft_len, warps=buf.warps, logprobs=buf.logprobs)
        if self.policy.expected:   # what auto gamma counts in place of the accepted drafts
            buf.expected_acceptance(stream, target_step.logits, gamma, self.temperature, r)
        done = buf.done_launch
        buf.set_commit(done.commit, gamma + 1, L)
        self._keep = res   # its buffer must outlive the launch
        done(stream, verify_out=res.packed.data.ptr, L_target=L, report=report, G=gamma, target_cols=gamma + 1,
             target_feed=target_step.feed.data.ptr, gamma_next=self.gammas[r + 1],
             verify_lp=res.logprobs.data.ptr if buf.logprobs else 0, lp_out=buf.logprobs_slot(r))

    def _wait(self, r: int):
        """Wait until round r's report is in host memory."""
        started = time.perf_counter()
        self.buf.report_events[r % EVENTS].synchronize()
        self.read_wait_s += time.perf_counter() - started

    def _report(self, r: int):
        """Round r's report (in host memory): (VerifyResult part, taken [B], finished [B])."""
        B, G = self.B, self.gammas[r]
        report = self.buf.host_reports[r % 2][:self.buf.report_size - (self.cap - G) * B]
        packed = 3 * B + B * (G + 1)
        return report, packed

    def _finishes_all(self, r: int) -> bool:
        """Whether round r (its report in host memory) left every request finished: its report's flags
        (the host's for rows refilled after it)."""
        report, packed = self._report(r)
        flags = report[packed + self.B:packed + 2 * self.B].astype(bool)
        return bool(np.where(self.joined <= r, flags, self.req.finished).all())

    def _read(self, r: int):
        """Wait for round r's report; apply it to the host's sequences."""
        self._wait(r)
        self.read += 1
        report, packed = self._report(r)
        report = report.copy()
        B, G = self.B, self.gammas[r]
        result = VerifyResult(report[:packed], B)
        errors.raise_if_any(result.error)
        req = self.req
        # Rows refilled after round r was enqueued report their old request's end: not theirs.
        fresh = self.joined <= r
        active = ~req.finished & fresh
        # The round's draft lengths as round_done found them (prompt lookup's depend on the data).
        draft_len = report[packed + 2 * B:packed + 3 * B].astype(np.int64) if G else np.zeros(B, np.int64)
        taken = np.where(fresh, report[packed:packed + B], 0)
        finished = np.where(fresh, report[packed + B:packed + 2 * B].astype(bool), req.finished)
        if (active & ~req.stopped & (taken <= 0)).any():   # >= 1 token where no error is reported
            raise RuntimeError(f"device round {r} emitted nothing for an unfinished request: report {report.tolist()}")
        taken = req.take(result.tokens, taken, finished)
        if self.logprobs is not None:
            lp = self.buf.host_logprobs[r % 2][:B * (G + 1)].reshape(B, G + 1)
            for b in np.flatnonzero(taken).tolist():
                self.logprobs[b].extend(float(x) for x in lp[b, :taken[b]])
        accepted = result.emitted - 1 if G else np.zeros(B, np.int64)
        expected = None
        if G and self.policy.expected:
            beta = self.buf.host_beta[r % 2][:B * G].reshape(B, G).astype(np.float64)
            expected = expected_accepted(beta, draft_len, accepted)
        rnd = Round(active, draft_len, accepted, taken, G, expected)
        seconds = None
        if getattr(self.policy, "cost", None) is not None:   # GPU time between two reports
            import cupy
            start = self.buf.report_events[(r - 1) % EVENTS] if r > 0 else self._round0_start
            seconds = cupy.cuda.get_elapsed_time(start, self.buf.report_events[r % EVENTS]) / 1e3
        self.policy.observe(rnd, seconds)
        return rnd

    def _compact_full_caches(self, need: int):
        """Before enqueuing a round that adds `need` columns to each cache: compact each cache that lacks
        room for it, on the device and in stream order, so that no round has to be read first.
        compact_plan right-aligns each row's real slots to a length no row can exceed: the longest
        sequence the host has read, plus cap + 1 tokens per round still unread, minus one (a cache holds
        at most its row's length minus one tokens). Then one gather moves the keys and values, and
        the next run's feed copy of the mask follows the new mask. Before a target step the draft's
        cache takes nothing (after a stop it never grows again): only the target's counts."""
        import cupy
        B = self.B
        drafting = self.dc is not None and self.gammas.get(self.enqueued, 0) > 0
        caches = (("target", self.tc),) + ((("draft", self.dc),) if drafting else ())
        full = [(role, cache) for role, cache in caches if cache.length + need > cache.capacity]
        if not full:
            return
        new_length = int(self.req.seq_len.max()) + self.per_round * (self.enqueued - self.read) - 1
        with self.stream:
            for role, cache in full:
                if new_length + need > cache.capacity:
                    raise RuntimeError(f"KV cache full: capacity {cache.capacity} cannot hold {new_length} "
                                       f"columns and {need} more")
                cols = cupy.empty((B, new_length), cupy.int64)
                self.buf.compact_plan((B,), (THREADS,), (self.masks[role], np.int32(cache.capacity),
                                                         np.int32(cache.length), np.int32(new_length), cols))
                cache.gather(cols)
                cache.length = new_length
            C = self.tc.capacity
            if self.dc is not None:
                self.buf.draft_steps[0].feed[4 * B:].reshape(B, C + 2)[:, :C] = self.masks["draft"]
            if self.buf.target_launch is not None and self.gammas.get(self.enqueued, 0) == 0:
                # the next round is a target step: its S = 1 feed (written by the step before) follows
                self.buf.target_steps[1].feed[2 * B:].reshape(B, C + 1)[:, :C] = self.masks["target"]
            # (drafting rounds write the target's feed from the mask each round)

    # -- continuous batching ----------------------------------------------------------------------
    @property
    def round(self) -> int:
        """The next round to be enqueued: the first that a row refilled now takes part in."""
        return self.enqueued

    def refill(self, rows, temperatures=None, truncated=False, warps=None) -> None:
        """Rows `rows` start the requests the host has just put in them (req.refill(), and
        streams.restart() at self.round): from round self.round on, on the device too. Enqueued
        behind the rounds in flight, with no wait: the rows' state, random streams and temperatures
        (temperatures: theirs, when the loop's temperature is per row), their prompts but the last
        token into both caches (prefill runs whose attention mask is the device's slot mask), then
        the next round's feeds. truncated: the call truncates (top-k / top-p / min-p), and warps is
        its truncation rebuilt for the rows' temperatures now (None where no row truncates)."""
        import cupy
        rows = np.asarray(rows, np.int64)
        req, buf, B, n = self.req, self.buf, self.B, len(rows)
        if req.seq.shape[1] > buf.P:
            raise ValueError(f"refilled sequences need {req.seq.shape[1]} columns, the device loop holds {buf.P}")
        self.joined[rows] = self.enqueued
        seq = np.full((n, buf.P), req.pad_id, np.int64)
        seq[:, :req.seq.shape[1]] = req.seq[rows]
        base = -self.joined[rows] * self.per_round
        seeds = self._seeds(rows)
        temps = np.zeros(n) if temperatures is None else np.asarray(temperatures, np.float64)
        if temperatures is not None and not (isinstance(self.temperature, cupy.ndarray)
                                             and self.temperature.dtype == cupy.float32):
            raise TypeError("refill() with temperatures needs the loop's temperature as [B] float32 on the device")
        # refill_rows's layout first (rows | seq | seq_len | limit | seed | base | temperature), then
        # what target-only rounds feed (last token, its position).
        packed = np.concatenate([rows, seq.ravel(), req.seq_len[rows], req.prompt_len[rows] + req.budget[rows],
                                 seeds, base, temps.view(np.int64), req.last_tokens()[rows],
                                 np.clip(req.seq_len[rows] - 1, 0, self.pos_limit)])
        with self.stream:
            up = self.dec.uploads.upload(packed, self.stream)
            buf.refill_launch(self.stream, n, THREADS, leading=(up.data.ptr, n),
                              streams=0 if self._stream_base is None else self._stream_base.data.ptr,
                              temps=0 if temperatures is None else self.temperature.data.ptr)
            if truncated:
                buf.set_warps(warps, self.stream)
            self._prefill_rows(rows)
            if self.cap == 0:   # the next target step's feed for these rows: their last token, their slots
                at_rows, last, pos = up[:n], up[-2 * n:-n], up[-n:]
                C = self.tc.capacity
                feed = buf.target_steps[1].feed
                feed[:B][at_rows] = last
                feed[B:2 * B][at_rows] = pos
                feed_mask = feed[2 * B:].reshape(B, C + 1)
                feed_mask[at_rows, :C] = self.masks["target"][at_rows]
                feed_mask[at_rows, C] = 1
            else:
                buf.prepare_round(self.stream, self.gammas[self.enqueued])

    def _seeds(self, rows) -> np.ndarray:
        """The seeds of these rows' requests (0 without per-request streams)."""
        return self._streams.seeds[rows] if self._streams is not None else np.zeros(len(rows), np.int64)

    def _prefill_rows(self, rows) -> None:
        """Every prompt but its last token of rows `rows` (their slot masks just cleared) into both
        caches, chunk by chunk as the decoder's prefill, the other rows' new columns holes."""
        req, only = self.req, np.zeros(self.B, bool)
        only[rows] = True
        runs = [(self.target, self.tc, "target")] + ([(self.draft, self.dc, "draft")] if self.dc is not None else [])
        for ids, new_mask, positions in req.prefill_chunks(np.zeros(self.B, np.int64), self.dec.prefill_chunk, only):
            self._compact_full_caches(new_mask.shape[1])
            for session, cache, role in runs:
                session.forward(cache, ids, new_mask, positions, device_mask=self.masks[role], prefill=True)

    def _can_run_ahead(self, r: int) -> bool:
        """Whether round r + 1 is needed whatever round r (in flight) emits, bar an EOS: some unfinished
        request would still have tokens to generate after round r's at most gamma + 1."""
        req = self.req
        return bool(((~req.finished) & (req.remaining > self.gammas[r] + 1)).any())

    def __iter__(self):
        r = 0
        if self.req.finished.all():
            return
        while True:
            if self.enqueued == r:   # the first round, or one that rows refilled after its read need
                self._enqueue(r)
            ahead = self._can_run_ahead(r)
            if ahead:
                self._enqueue(r + 1)
            else:
                # Round r may end the generation: wait for its report, and when its finished flags say
                # it did not, enqueue round r + 1 before the host applies round r (the GPU waits less).
                self._wait(r)
                if not self._finishes_all(r):
                    self._enqueue(r + 1)
            yield self._read(r)
            if self.req.finished.all():
                self.discarded += ahead
                return
            r += 1
