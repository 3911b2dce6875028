"""Speculative rounds whose bookkeeping lives on the GPU (kernels_cu/decode_round.cu).

The host-driven round (decoder.SpeculativeDecoder._speculative_round) builds every run's feeds from
the host's view of the sequences, so the GPU waits while the host turns a round's result into the
next round's first feed. Here the device keeps its own copy of that state (sequences, lengths, budgets,
finished flags, both caches' slot masks) and one small kernel between two model runs does the work
of the host's NumPy lines:

    draft run i      (a captured graph: S = 2 for i = 0, the tokens the draft has not seen; else S = 1)
    draft_step_done  sample the draft token, keep its logits row, commit the run's KV columns and
                     mask, write the next run's feeds (the next draft run's, or the target's)
    target run       (S = gamma + 1)
    verify()
    round_done       append the emitted tokens (EOS, budget), commit the target's columns, roll
                     both masks back, next round's draft lengths and first draft feed, a report

So the host enqueues whole rounds without reading anything, and reads each round's report (a few
ints per request, written by round_done into page-locked host memory) one round late: while the GPU
runs round r + 1 the host applies round r's tokens to its own copy of the sequences. It enqueues
round r + 1 before reading round r only when round r cannot end the generation by the budget alone
(an EOS still can: that round's work is then discarded, counted in stats["discarded_rounds"]).

A full cache is compacted on the device too (compact_plan), in stream order between two rounds, so
the masks never cross to the host and no compaction waits for a read.

Used for the speculative methods with fixed gamma on CUDA when both models run with fixed
bindings (sessions_static), their logits share a dtype (float32/float16) and the vocabulary fits
one block's row sampler; otherwise the host-driven round runs.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools

import numpy as np

from specsample_cupy import errors
from specsample_cupy.sampling import ROW_SAMPLER_MAX_V
from specsample_cupy.sessions_static import StaticDecoderSession
from specsample_cupy.verify import VerifyResult, verify

THREADS = 256


class _Commit(ctypes.Structure):
    """decode_round.cu's Commit: copy `words` 4-byte words per row, present[r][src:] -> cache[r][dst:]."""
    _fields_ = [("present", ctypes.c_void_p), ("cache", ctypes.c_void_p), ("rows", ctypes.c_int32),
                ("words", ctypes.c_int32), ("present_pitch", ctypes.c_int64), ("cache_pitch", ctypes.c_int64),
                ("src", ctypes.c_int64), ("dst", ctypes.c_int64)]


@functools.lru_cache(maxsize=None)
def _functions(device_id: int, tag: str, vec: int):
    """decode_round.cu's (draft_step_done<tag, vec>, round_done, compact_plan) as cupy.RawKernels."""
    import cupy
    from specsample_cupy import kernels
    names = (f"draft_step_done<{tag}, {vec}>", "round_done", "compact_plan")
    module = cupy.RawModule(code=kernels.kernel_source("decode_round.cu"), options=("--std=c++17",),
                            name_expressions=names)
    return tuple(module.get_function(name) for name in names)


def supported(target, draft, adaptive_gamma: bool, gamma: int) -> str | None:
    """None when the pair can decode with device rounds, else why not."""
    if adaptive_gamma:
        return "adaptive gamma"
    if gamma + 1 > THREADS:
        return f"gamma over {THREADS - 1}"   # round_done reads a row's gamma + 1 tokens with one thread each
    if not (isinstance(target, StaticDecoderSession) and isinstance(draft, StaticDecoderSession)):
        return "a model without CUDA graphs"
    if target.logits_dtype != draft.logits_dtype or target.logits_dtype.char not in "fe":
        return "logits dtypes"
    if target.vocab_size > ROW_SAMPLER_MAX_V:
        return f"vocabulary over {ROW_SAMPLER_MAX_V}"
    for s in (target, draft):
        if (s.head_dim * np.dtype(s.kv_dtype).itemsize) % 4:
            return "KV rows not a multiple of 4 bytes"
    return None


class _Launch:
    """One kernel's prebuilt parameter block, with named slots."""

    def __init__(self, func, names_and_slots, commit: _Commit, grid: int):
        from specsample_cupy import kernels
        self.slots = dict(names_and_slots)
        self.commit = commit
        self.grid = grid
        self.call = kernels.PrebuiltLaunch(func, [slot for _, slot in names_and_slots] + [commit])

    def set(self, **values):
        for name, value in values.items():
            self.slots[name].value = value

    def __call__(self, stream):
        self.call(stream, self.grid, THREADS)


def _copy_blocks(rows: int, words: int) -> int:
    return max(1, min(64, -(-rows * words // (THREADS * 4))))


PITCH_ROUND = 64      # sequence pitches are rounded up so that repeated generate() calls share buffers
MAX_BUFFERS = 4       # _RoundBuffers kept per decoder


class _RoundBuffers:
    """What device rounds keep between generate() calls of one shape: the device state, the report
    slots and the prebuilt launches (their pointers fixed). Bound to the sessions' current plans
    (sessions_static), which it keeps alive.

    The state is one int64 buffer, uploaded per generate() with one copy from pinned memory:
        seq [B, P] | seq_len [B] | limit [B] | finished [B] | eos [E] | mask_t [B, C] | mask_d [B, C]
    """

    def __init__(self, target, draft, B: int, C: int, P: int, G: int, E: int, stream):
        import cupy
        self.plans = (target._plan, draft._plan)
        self.B, self.C, self.P, self.G, self.E, self.V = B, C, P, G, E, target.vocab_size
        sizes = dict(seq=B * P, seq_len=B, limit=B, finished=B, eos=E, mask_t=B * C, mask_d=B * C)
        total = sum(sizes.values())
        pinned = cupy.cuda.alloc_pinned_memory(total * 8)
        self._pinned_state = pinned
        self.host_state = np.frombuffer(pinned, np.int64, total)
        with stream:
            self.state = cupy.zeros(total, cupy.int64)
            self.draft_len = cupy.zeros(B, cupy.int32)
            self.draft_tokens = cupy.zeros((B, G), cupy.int32)
            self.draft_logits = cupy.zeros((B, G, self.V), target.logits_dtype)
            self.report_size = 3 * B + B * (G + 1) + 2 * B
            self.first_report = cupy.zeros(self.report_size, cupy.int32)   # the set-up call's, unread
            self.no_verify = cupy.zeros(3 * B + B * (G + 1), cupy.int32)   # nothing emitted: prepares round 0
        self.dev, self.host, at = {}, {}, 0
        for name, size in sizes.items():
            self.dev[name], self.host[name] = self.state[at:at + size], self.host_state[at:at + size]
            at += size
        # round_done writes each round's report straight into page-locked host memory (with unified
        # addressing its host address is valid on the device): no copy command per round.
        pinned = cupy.cuda.alloc_pinned_memory(2 * self.report_size * 4)
        self._pinned_reports = pinned
        self.host_reports = np.frombuffer(pinned, np.int32, 2 * self.report_size).reshape(2, self.report_size)
        self.host_reports[...] = 0
        self.report_events = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]
        self.draft_steps = [draft._step(2)] + ([draft._step(1)] if G > 1 else [])
        self.target_step = target._step(G + 1)
        self._build_launches(target, draft)

    def _commit(self, session, step) -> _Commit:
        item = np.dtype(session.kv_dtype).itemsize
        row_words = session.head_dim * item // 4          # one column of one (tensor, row, head)
        C, S = self.C, step.steps
        rows = len(session.cache_names) * self.B * session.n_kv_heads
        return _Commit(step.present.data.ptr, session._plan.cache.data.ptr, rows, S * row_words,
                       (C + S) * row_words, C * row_words, C * row_words, 0)

    def _build_launches(self, target, draft):
        c = ctypes
        B, V, G, C, dev = self.B, self.V, self.G, self.C, self.dev
        tag = "f32" if target.logits_dtype.char == "f" else "f16"
        vec = 16 // target.logits_dtype.itemsize
        if V % vec:
            vec = 1
        step_kernel, done_kernel, self.compact_plan = _functions(draft.device_id, tag, vec)
        self.step_launches = []
        for i in range(G):
            step = self.draft_steps[min(i, 1)]
            nxt = self.target_step if i == G - 1 else self.draft_steps[1]
            commit = self._commit(draft, step)
            self.step_launches.append(_Launch(step_kernel.kernel.ptr, [
                ("logits", c.c_void_p(step.logits.data.ptr)), ("S_run", c.c_int32(step.steps)), ("V", c.c_int32(V)),
                ("temperature", c.c_float()), ("seed", c.c_uint64()),
                ("offset", c.c_uint32(0)), ("draft_logits", c.c_void_p(self.draft_logits.data.ptr)),
                ("draft_tokens", c.c_void_p(self.draft_tokens.data.ptr)), ("step", c.c_int32(i)),
                ("G", c.c_int32(G)), ("run_feed", c.c_void_p(step.feed.data.ptr)),
                ("mask_d", c.c_void_p(dev["mask_d"].data.ptr)), ("C", c.c_int32(C)), ("L_run", c.c_int32(0)),
                ("next_feed", c.c_void_p(nxt.feed.data.ptr)), ("next_is_target", c.c_int32(i == G - 1)),
                ("mask_t", c.c_void_p(dev["mask_t"].data.ptr)), ("seq", c.c_void_p(dev["seq"].data.ptr)),
                ("seq_pitch", c.c_int32(self.P)), ("seq_len", c.c_void_p(dev["seq_len"].data.ptr)),
                ("finished", c.c_void_p(dev["finished"].data.ptr)),
                ("draft_len", c.c_void_p(self.draft_len.data.ptr)), ("pos_limit", c.c_int64()), ("B", c.c_int32(B))],
                commit, 2 * B + _copy_blocks(commit.rows, commit.words)))
        commit = self._commit(target, self.target_step)
        self.done_words = commit.words
        self.done_launch = _Launch(done_kernel.kernel.ptr, [
            ("verify_out", c.c_void_p(0)), ("G", c.c_int32(G)),
            ("target_feed", c.c_void_p(self.target_step.feed.data.ptr)), ("target_cols", c.c_int32(G + 1)),
            ("mask_t", c.c_void_p(dev["mask_t"].data.ptr)), ("mask_d", c.c_void_p(dev["mask_d"].data.ptr)),
            ("C", c.c_int32(C)), ("L_target", c.c_int32(0)), ("seq", c.c_void_p(dev["seq"].data.ptr)),
            ("seq_pitch", c.c_int32(self.P)), ("seq_len", c.c_void_p(dev["seq_len"].data.ptr)),
            ("limit", c.c_void_p(dev["limit"].data.ptr)), ("finished", c.c_void_p(dev["finished"].data.ptr)),
            ("eos", c.c_void_p(dev["eos"].data.ptr)), ("n_eos", c.c_int32(self.E)),
            ("pad_id", c.c_int64()), ("draft_len", c.c_void_p(self.draft_len.data.ptr)),
            ("gamma_next", c.c_int32(G)), ("feed0", c.c_void_p(self.draft_steps[0].feed.data.ptr)),
            ("pos_limit", c.c_int64()), ("report", c.c_void_p(0)), ("B", c.c_int32(B))],
            commit, B + _copy_blocks(commit.rows, commit.words))

    def start(self, req, caches, *, temperature, seed, pad_id, pos_limit, stream):
        """One generate()'s initial state up in one copy, the per-call launch fields, and the first
        round's draft lengths and feed (round_done with nothing emitted)."""
        import cupy
        host, B = self.host, self.B
        seq = host["seq"].reshape(B, self.P)
        seq[:, :req.seq.shape[1]] = req.seq
        seq[:, req.seq.shape[1]:] = pad_id
        host["seq_len"][:] = req.seq_len
        host["limit"][:] = req.prompt_len + req.budget
        host["finished"][:] = req.finished
        host["eos"][:] = req.eos_ids
        for name, cache in zip(("mask_t", "mask_d"), caches):
            mask = host[name].reshape(B, self.C)
            mask[:, :cache.length] = cache.mask
            mask[:, cache.length:] = 0
        cupy.cuda.runtime.memcpyAsync(self.state.data.ptr, self.host_state.ctypes.data, self.host_state.nbytes,
                                      1, stream.ptr)
        for launch in self.step_launches:
            launch.set(temperature=temperature, seed=seed & (2 ** 64 - 1), pos_limit=pos_limit)
        done = self.done_launch
        done.set(pad_id=pad_id, pos_limit=pos_limit, verify_out=self.no_verify.data.ptr, target_cols=0,
                 report=self.first_report.data.ptr)
        done.commit.words = 0
        done(stream)
        done.set(target_cols=self.G + 1)
        done.commit.words = self.done_words


def round_buffers(decoder, B: int, C: int, P: int, G: int, E: int) -> _RoundBuffers:
    """The decoder's _RoundBuffers for this shape and the sessions' current plans (made on first use)."""
    kept = decoder._round_buffers
    key = (B, C, P, G, E, id(decoder.target._plan), id(decoder.draft._plan))
    buffers = kept.pop(key, None)
    if buffers is None:
        if len(kept) >= MAX_BUFFERS:
            kept.pop(next(iter(kept)))
        buffers = _RoundBuffers(decoder.target, decoder.draft, B, C, P, G, E, decoder.stream)
    kept[key] = buffers   # most recently used last
    return buffers


class DeviceRounds:
    """The speculative rounds of one generate() call, with the state on the device (module docstring).

    Iterating yields, per round as the host reads it, (active [B], draft_len [B], accepted [B], taken [B])
    host arrays (active: the rows unfinished before the round), after the host's copy of the sequences
    (req) has taken the round's tokens.
    """

    def __init__(self, decoder, req, target_cache, draft_cache, *, gamma, gamma_cap, method, temperature,
                 seed, clock, offsets_per_round):
        if target_cache.capacity != draft_cache.capacity:
            raise ValueError("device rounds need both caches at the same capacity")
        self.dec, self.req, self.clock = decoder, req, clock
        self.target, self.draft = decoder.target, decoder.draft
        self.tc, self.dc = target_cache, draft_cache
        self.gamma, self.method, self.temperature, self.seed = gamma, method, temperature, seed
        self.offsets_per_round, self.gamma_cap = offsets_per_round, gamma_cap
        self.stream = decoder.stream
        self.discarded = 0
        self._unread = 0   # rounds enqueued whose reports the host has not read
        self.B = B = req.batch
        P = -(-req.seq.shape[1] // PITCH_ROUND) * PITCH_ROUND
        buf = self.buf = round_buffers(decoder, B, target_cache.capacity, P, gamma, int(req.eos_ids.size))
        self.draft_steps, self.target_step = buf.draft_steps, buf.target_step
        self.step_launches, self.done_launch = buf.step_launches, buf.done_launch
        self.draft_tokens, self.draft_logits, self.draft_len = buf.draft_tokens, buf.draft_logits, buf.draft_len
        self.host_reports, self.report_events = buf.host_reports, buf.report_events
        self.report_size, self.masks = buf.report_size, {"target": buf.dev["mask_t"].reshape(B, -1),
                                                         "draft": buf.dev["mask_d"].reshape(B, -1)}
        limit = decoder.context_length
        buf.start(req, (target_cache, draft_cache), temperature=temperature, seed=seed, pad_id=req.pad_id,
                  pos_limit=(limit or np.iinfo(np.int64).max) - 1, stream=self.stream)

    # -- rounds -------------------------------------------------------------------------------------
    def _enqueue(self, r: int):
        """Enqueue round r: gamma draft runs, the target run, verify(), round_done (which writes the report
        into host memory) and an event the host waits on. Round r - 2's report, in the same slot, was read
        before this call."""
        self._compact_full_caches()
        self._unread += 1
        stream, G = self.stream, self.gamma
        base = r * self.offsets_per_round
        for i, launch in enumerate(self.step_launches):
            step = self.draft_steps[min(i, 1)]
            L = self.dc.length
            self.draft.replay(step)
            self.dc.length += step.steps
            launch.slots["offset"].value = (base + i) & 0xFFFFFFFF
            launch.slots["L_run"].value = L
            launch.commit.dst = L * (launch.commit.cache_pitch // self.dc.capacity)
            launch(stream)
        L = self.tc.length
        self.target.replay(self.target_step)
        self.tc.length += G + 1
        # When the target run is timed, its end event also starts verify()'s span (one event fewer).
        timed = self.dec.time_model_runs
        target_end = self.clock.last_end("model") if timed and self.target.run_span is not None else None
        with self.clock.span("verify", start=target_end) if timed else contextlib.nullcontext():
            res = verify(self.draft_tokens, self.draft_logits, self.target_step.logits, method=self.method,
                         temperature=self.temperature, seed=self.seed, offset=base + self.gamma_cap,
                         draft_lengths=self.draft_len)
        slot = r % 2
        done = self.done_launch
        done.slots["verify_out"].value = res.packed.data.ptr
        done.slots["L_target"].value = L
        done.slots["report"].value = self.host_reports[slot].ctypes.data
        done.commit.dst = L * (done.commit.cache_pitch // self.tc.capacity)
        self._keep = res   # its buffer must outlive the launch
        done(stream)
        self.report_events[slot].record(stream)

    def _wait(self, r: int):
        """Wait until round r's report is in host memory."""
        import time
        started = time.perf_counter()
        self.report_events[r % 2].synchronize()
        self.dec._read_wait_s += time.perf_counter() - started

    def _finishes_all(self, r: int) -> bool:
        """Whether round r (its report in host memory) left every request finished: its report's flags."""
        return bool(self.host_reports[r % 2][-self.B:].all())

    def _read(self, r: int):
        """Wait for round r's report; apply it to the host's sequences."""
        slot, B, G = r % 2, self.B, self.gamma
        self._wait(r)
        self._unread -= 1
        report = self.host_reports[slot].copy()
        packed = 3 * B + B * (G + 1)
        result = VerifyResult(report[:packed], B)
        errors.raise_if_any(result.error)
        req = self.req
        active = ~req.finished
        draft_len = req.draft_lengths(G)   # what round_done set for this round
        taken, finished = report[packed:packed + B], report[packed + B:].astype(bool)
        if (active & (taken <= 0)).any():   # verify() emits >= 1 token where it reports no error
            raise RuntimeError(f"device round {r} emitted nothing for an unfinished request: report {report.tolist()}")
        req.take(result.tokens, taken, finished)
        return active, draft_len, result.emitted - 1, taken

    def _compact_full_caches(self):
        """Before enqueuing a round: compact each cache that lacks room for it, on the device and in
        stream order, so that no round has to be read first. compact_plan right-aligns each row's real
        slots to a length no row can exceed: the longest sequence the host has read, plus gamma + 1
        tokens per round still unread, minus one (a cache holds at most its row's length minus one
        tokens). Then one gather moves the keys and values, and the next draft feed's copy of the draft
        mask follows the draft's new mask."""
        import cupy
        need, B = self.gamma + 1, self.B
        full = [(role, cache) for role, cache in (("target", self.tc), ("draft", self.dc))
                if cache.length + need > cache.capacity]
        if not full:
            return
        new_length = int(self.req.seq_len.max()) + need * self._unread - 1
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
            C = self.dc.capacity
            self.draft_steps[0].feed[4 * B:].reshape(B, C + 2)[:, :C] = self.masks["draft"]

    def _can_run_ahead(self) -> bool:
        """Whether round r + 1 is needed whatever round r (in flight) emits, bar an EOS: some unfinished
        request would still have tokens to generate after round r's at most gamma + 1."""
        req = self.req
        return bool(((~req.finished) & (req.remaining > self.gamma + 1)).any())

    def __iter__(self):
        r = 0
        if self.req.finished.all():
            return
        self._enqueue(0)
        while True:
            ahead = self._can_run_ahead()
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
