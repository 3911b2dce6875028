"""The device loop's buffers and prebuilt launches (decode/device_loop.py drives them): the requests'
device state, the report slots in page-locked memory, and one kernel_runtime.Launch per round kernel of
kernels_cu/decode_round.cu with its pointers fixed, per (batch, capacity, pitch, largest gamma)."""
from __future__ import annotations

import ctypes

import numpy as np

from specsample_cupy.runtime import kernel_runtime
from specsample_cupy.runtime.pinned import host_array
from specsample_cupy.verification.load_width import vec_width
from specsample_cupy.verification.expected_accept import ExpectedAcceptance
from specsample_cupy.verification.truncation import off_warps
from specsample_cupy.verification.warp_rows_launch import RowWarps

THREADS = 256
ROW_LOADS = 4          # sample_row.cuh's SS_ROW_LOADS: row vectors in flight per thread
MAX_ROW_SLICES = 64    # blocks per sampled row at most


class _RowSlices(ctypes.Structure):
    """sample_row.cuh's RowSlices: K blocks per sampled row, their picks [B * K] (16 bytes each) and a
    counter per row."""
    _fields_ = [("picks", ctypes.c_void_p), ("arrived", ctypes.c_void_p), ("K", ctypes.c_int32)]


def row_slices(V: int, vec: int) -> int:
    """Blocks per sampled row: one per load round trip of a block (ROW_LOADS x THREADS x vec entries),
    so a long row is read in one round trip by many blocks instead of many by one."""
    return max(1, min(MAX_ROW_SLICES, -(-V // (ROW_LOADS * THREADS * vec))))


class _Commit(ctypes.Structure):
    """decode_round.cu's Commit: copy `words` 4-byte words per row, present[r][src:] -> cache[r][dst:]."""
    _fields_ = [("present", ctypes.c_void_p), ("cache", ctypes.c_void_p), ("rows", ctypes.c_int32),
                ("words", ctypes.c_int32), ("present_pitch", ctypes.c_int64), ("cache_pitch", ctypes.c_int64),
                ("src", ctypes.c_int64), ("dst", ctypes.c_int64)]


def _functions(tag: str, vec: int):
    """decode_round.cu's (draft_step_done, round_done, compact_plan, target_step_done, ngram_target_feed,
    offset_streams, refill_rows) as cupy.RawKernels for the current device."""
    names = (f"draft_step_done<{tag}, {vec}>", "round_done", "compact_plan", f"target_step_done<{tag}, {vec}>",
             "ngram_target_feed", "offset_streams", "refill_rows")
    return kernel_runtime.functions("decode_round.cu", names)


class _Launch:
    """One kernel's kernel_runtime.Launch with named slots, its Commit (passed by value, last) and grid.
    Per _RoundBuffers, so one decoder's generate() at a time uses it: values written with set() stay
    for later launches, and set_commit() edits the Commit in place between launches."""

    def __init__(self, kernel, names_and_slots, commit: _Commit, grid: int):
        self.commit = commit
        self.grid = grid
        self.launch = kernel_runtime.Launch(kernel, list(names_and_slots) + [("commit", commit)])

    def set(self, **values):
        self.launch.set(**values)

    def __call__(self, stream, **values):
        """Launch with `values` written into their slots first."""
        self.launch(stream, self.grid, THREADS, **values)


def _copy_blocks(rows: int, words: int) -> int:
    return max(1, min(64, -(-rows * words // (THREADS * 4))))


PITCH_ROUND = 64      # sequence pitches are rounded up so that repeated generate() calls share buffers
MAX_BUFFERS = 4       # _RoundBuffers kept per decoder
EVENTS = 4            # report events in a ring: round r's and r - 1's are both unrecorded-over at its read


class _RoundBuffers:
    """What the device loop keeps between generate() calls of one shape: the device state, the report
    slots and the prebuilt launches (their pointers fixed). Bound to the sessions' current plans
    (sessions_static), which it keeps alive. G: the largest gamma (0: target-only, no draft); with
    G > 0 and no draft session the drafts come from prompt lookup (ngram.cu) over the state's seq.

    The state is one int64 buffer, uploaded per generate() with one copy from pinned memory:
        seq [B, P] | seq_len [B] | limit [B] | finished [B] | eos [E] | mask_t [B, C] | mask_d [B, C]
    """

    def __init__(self, target, draft, B: int, C: int, P: int, G: int, E: int, stream):
        import cupy
        self.plans = (target._plan,) + ((draft._plan,) if draft is not None else ())
        self.B, self.C, self.P, self.G, self.E, self.V = B, C, P, G, E, target.vocab_size
        # decode_round.cu's dense columns: a model writing its cache at each row's count (shared buffer).
        self.dense = int(any(s.shared_buffer for s in ((target, draft) if draft is not None else (target,))))
        sizes = dict(seq=B * P, seq_len=B, limit=B, finished=B, eos=E, mask_t=B * C, mask_d=B * C)
        total = sum(sizes.values())
        self.host_state = host_array(total, np.int64)
        with stream:
            self.state = cupy.zeros(total, cupy.int64)
            self.draft_len = cupy.zeros(B, cupy.int32)
            self.draft_tokens = cupy.zeros(B * max(G, 1), cupy.int32)
            self.draft_logits = cupy.zeros(B * G * self.V if draft is not None else 0, target.logits_dtype)
            self.report_size = 3 * B + B * (G + 1) + 3 * B   # verify's output, taken, finished, draft_len
            self.first_report = cupy.zeros(self.report_size, cupy.int32)   # the set-up call's, unread
            self.no_verify = cupy.zeros(3 * B + B * (G + 1), cupy.int32)   # nothing emitted: prepares round 0
        self.dev, self.host, at = {}, {}, 0
        for name, size in sizes.items():
            self.dev[name], self.host[name] = self.state[at:at + size], self.host_state[at:at + size]
            at += size
        # Each round's last kernel writes its report straight into page-locked host memory (with unified
        # addressing its host address is valid on the device): no copy command per round.
        self.host_reports = host_array((2, self.report_size), np.int32)
        self.host_reports[...] = 0
        # Log-probabilities of each round's tokens (generate(logprobs=True)), beside the reports.
        self.host_logprobs = host_array((2, B * (G + 1)), np.float32)
        self.report_events = [cupy.cuda.Event(disable_timing=False) for _ in range(EVENTS)]
        self._dtype_name = target.logits_dtype.name   # float32 or float16 (call_loops.why_not_device_loop())
        tag, vec = vec_width(self._dtype_name, self.V)   # run outputs: allocation-aligned
        self.K = row_slices(self.V, vec)   # the sampling kernels' blocks per row (sample_row_sliced)
        with stream:
            self.row_picks = cupy.zeros(4 * B * self.K, cupy.int32)
            self.row_arrived = cupy.zeros(B, cupy.int32)   # zero between launches (the last block resets)
        self.slices = _RowSlices(self.row_picks.data.ptr, self.row_arrived.data.ptr, self.K)
        step_kernel, done_kernel, self.compact_plan, target_kernel, ngram_feed_kernel, self.offset_streams, \
            refill_kernel = _functions(tag, vec)
        self._target_kernels = (target_kernel, ngram_feed_kernel)   # enable_target_steps()
        c = ctypes   # refill_rows(packed, n, state, B, P, C, E, streams, temps): continuous batching's refills
        self.refill_launch = kernel_runtime.Launch(refill_kernel, [
            c.c_void_p(), c.c_int32(), c.c_void_p(self.state.data.ptr), c.c_int32(B), c.c_int32(P), c.c_int32(C),
            c.c_int32(E), ("streams", c.c_void_p()), ("temps", c.c_void_p())])
        self.target_steps = {}   # S -> the target's _Step
        self.step_launches = []
        # Per call (start()): the truncation (draft steps warp their rows by it), the warps of verify()
        # and of target steps (the truncation, or none truncating when logprobs need the statistics),
        # whether logprobs are written; and the launcher of warp_rows over sampled rows (first use).
        self.truncation, self.warps, self.logprobs, self.row_warps = None, None, False, None
        self.ngram_feed_launch = None   # prompt-lookup rounds, and target steps of drafting calls
        self.target_launch = None       # target steps: target-only buffers, or enable_target_steps()
        self.expected = self.host_beta = None   # expected_accept.cu's launches, at first use (expected_acceptance())
        if G == 0:
            self._build_target_only(target, target_kernel)
        elif draft is None:
            # Prompt lookup: round_done still rolls back a draft mask and writes a first draft feed;
            # both go to scratch (the state's mask_d, this feed), nothing reads them.
            with stream:
                self.scratch_feed0 = cupy.zeros(2 * B + B * (C + 2), cupy.int64)
            self._build_done(target, done_kernel, self.scratch_feed0)
            self._build_ngram_feed(ngram_feed_kernel)
        else:
            self.draft_steps = [draft._step(2)] + ([draft._step(1)] if G > 1 else [])
            self._build_speculative(target, draft, step_kernel, done_kernel)

    def enable_target_steps(self, target) -> None:
        """Let buffers of drafting rounds (G > 0) also run target steps (automatic gamma stops
        drafting mid-call): the target's S = 1 step and target_step_done's launch, and
        ngram_target_feed's launch, which writes that step's feed from the device's state after a
        drafting round (with G = 0: the row's last token, its position, the slot mask). Kept with the
        buffers; before start(), which sets their per-call fields."""
        if self.target_launch is None:
            self._build_target_only(target, self._target_kernels[0])
        if self.ngram_feed_launch is None:
            self._build_ngram_feed(self._target_kernels[1])

    def target_step(self, target, S: int):
        step = self.target_steps.get(S)
        if step is None:
            step = self.target_steps[S] = target._step(S)
        return step

    def _commit(self, session, step) -> _Commit:
        item = np.dtype(session.kv_dtype).itemsize
        row_words = session.head_dim * item // 4          # one column of one (tensor, row, head)
        C, S = self.C, step.steps
        # A shared buffer holds the run's columns already (at each row's count): nothing to copy.
        rows = 0 if session.shared_buffer else len(session.cache_names) * self.B * session.n_kv_heads
        return _Commit(step.present.data.ptr, session._plan.cache.data.ptr, rows, S * row_words,
                       (C + S) * row_words, C * row_words, C * row_words, 0)

    def set_commit(self, commit: _Commit, S: int, L: int):
        """Point a launch's commit at a run of S columns appended at cache column L."""
        row_words = commit.cache_pitch // self.C
        commit.words, commit.present_pitch = S * row_words, (self.C + S) * row_words
        commit.src, commit.dst = self.C * row_words, L * row_words

    def _build_target_only(self, target, kernel):
        c, B, dev = ctypes, self.B, self.dev
        step = self.target_step(target, 1)
        commit = self._commit(target, step)
        self.target_launch = _Launch(kernel, [
            ("logits", c.c_void_p(step.logits.data.ptr)), ("V", c.c_int32(self.V)), ("temperature", c.c_float()),
            ("seed", c.c_uint64()), ("offset", c.c_uint32(0)), ("temps", c.c_void_p(0)), ("streams", c.c_void_p(0)),
            ("feed", c.c_void_p(step.feed.data.ptr)),
            ("mask_t", c.c_void_p(dev["mask_t"].data.ptr)), ("C", c.c_int32(self.C)), ("L_run", c.c_int32(0)),
            ("seq", c.c_void_p(dev["seq"].data.ptr)), ("seq_pitch", c.c_int32(self.P)),
            ("seq_len", c.c_void_p(dev["seq_len"].data.ptr)), ("limit", c.c_void_p(dev["limit"].data.ptr)),
            ("finished", c.c_void_p(dev["finished"].data.ptr)), ("eos", c.c_void_p(dev["eos"].data.ptr)),
            ("n_eos", c.c_int32(self.E)), ("pad_id", c.c_int64()), ("pos_limit", c.c_int64()),
            ("report", c.c_void_p(0)), ("warp_record", c.c_void_p(0)), ("lp_out", c.c_void_p(0)),
            ("dense", c.c_int32(self.dense)), ("B", c.c_int32(B)), ("slices", self.slices)],
            commit, B * self.K + _copy_blocks(commit.rows, commit.words))

    def _build_speculative(self, target, draft, step_kernel, done_kernel):
        c = ctypes
        B, V, G, C, dev = self.B, self.V, self.G, self.C, self.dev
        self.step_launches = []
        for i in range(G):
            step = self.draft_steps[min(i, 1)]
            commit = self._commit(draft, step)
            self.step_launches.append(_Launch(step_kernel, [
                ("logits", c.c_void_p(step.logits.data.ptr)), ("S_run", c.c_int32(step.steps)), ("V", c.c_int32(V)),
                ("temperature", c.c_float()), ("seed", c.c_uint64()),
                ("offset", c.c_uint32(0)), ("temps", c.c_void_p(0)), ("streams", c.c_void_p(0)),
                ("draft_logits", c.c_void_p(self.draft_logits.data.ptr)),
                ("draft_tokens", c.c_void_p(self.draft_tokens.data.ptr)), ("step", c.c_int32(i)),
                ("G", c.c_int32(G)), ("run_feed", c.c_void_p(step.feed.data.ptr)),
                ("mask_d", c.c_void_p(dev["mask_d"].data.ptr)), ("C", c.c_int32(C)), ("L_run", c.c_int32(0)),
                ("next_feed", c.c_void_p(0)), ("next_is_target", c.c_int32(0)),
                ("mask_t", c.c_void_p(dev["mask_t"].data.ptr)), ("seq", c.c_void_p(dev["seq"].data.ptr)),
                ("seq_pitch", c.c_int32(self.P)), ("seq_len", c.c_void_p(dev["seq_len"].data.ptr)),
                ("finished", c.c_void_p(dev["finished"].data.ptr)),
                ("draft_len", c.c_void_p(self.draft_len.data.ptr)), ("pos_limit", c.c_int64()),
                ("warp_record", c.c_void_p(0)), ("dense", c.c_int32(self.dense)), ("B", c.c_int32(B)),
                ("slices", self.slices)],
                commit, B * self.K + B + _copy_blocks(commit.rows, commit.words)))
        self._build_done(target, done_kernel, self.draft_steps[0].feed)

    def _build_done(self, target, done_kernel, feed0):
        """round_done's launch; feed0: where it writes the next round's first draft feed."""
        c = ctypes
        B, G, C, dev = self.B, self.G, self.C, self.dev
        top = self.target_step(target, G + 1)
        commit = self._commit(target, top)
        self.done_launch = _Launch(done_kernel, [
            ("verify_out", c.c_void_p(0)), ("G", c.c_int32(G)),
            ("target_feed", c.c_void_p(top.feed.data.ptr)), ("target_cols", c.c_int32(G + 1)),
            ("mask_t", c.c_void_p(dev["mask_t"].data.ptr)), ("mask_d", c.c_void_p(dev["mask_d"].data.ptr)),
            ("C", c.c_int32(C)), ("L_target", c.c_int32(0)), ("seq", c.c_void_p(dev["seq"].data.ptr)),
            ("seq_pitch", c.c_int32(self.P)), ("seq_len", c.c_void_p(dev["seq_len"].data.ptr)),
            ("limit", c.c_void_p(dev["limit"].data.ptr)), ("finished", c.c_void_p(dev["finished"].data.ptr)),
            ("eos", c.c_void_p(dev["eos"].data.ptr)), ("n_eos", c.c_int32(self.E)),
            ("pad_id", c.c_int64()), ("draft_len", c.c_void_p(self.draft_len.data.ptr)),
            ("gamma_next", c.c_int32(G)), ("feed0", c.c_void_p(feed0.data.ptr)),
            ("pos_limit", c.c_int64()), ("report", c.c_void_p(0)), ("verify_lp", c.c_void_p(0)),
            ("lp_out", c.c_void_p(0)), ("dense", c.c_int32(self.dense)), ("B", c.c_int32(B))],
            commit, B + _copy_blocks(commit.rows, commit.words))

    def _build_ngram_feed(self, kernel):
        """ngram_target_feed's launch: the target's feed of a prompt-lookup round (G and feed per round)."""
        c, dev = ctypes, self.dev
        self.ngram_feed_launch = kernel_runtime.Launch(kernel, [
            ("draft_tokens", c.c_void_p(self.draft_tokens.data.ptr)), ("draft_len", c.c_void_p(self.draft_len.data.ptr)),
            ("G", c.c_int32(self.G)), ("V", c.c_int32(self.V)), ("mask_t", c.c_void_p(dev["mask_t"].data.ptr)),
            ("C", c.c_int32(self.C)), ("seq", c.c_void_p(dev["seq"].data.ptr)), ("seq_pitch", c.c_int32(self.P)),
            ("seq_len", c.c_void_p(dev["seq_len"].data.ptr)), ("finished", c.c_void_p(dev["finished"].data.ptr)),
            ("pos_limit", c.c_int64()), ("feed", c.c_void_p()), ("dense", c.c_int32(self.dense)),
            ("B", c.c_int32(self.B))])

    def start(self, req, caches, *, gamma, temperature, seed, pad_id, pos_limit, stream, warps=None,
              logprobs=False, stream_base=None):
        """One generate()'s initial state up in one copy, the per-call launch fields, and the first
        round's feeds: for speculative rounds the draft lengths and first draft feed (round_done with
        nothing emitted), for target steps the S = 1 feed (built here). warps: None, or the call's
        truncation (a Warps of [B] CuPy arrays): every sampled row is then warped first (warp_rows).
        logprobs: the rounds also write their tokens' log-probabilities (host_logprobs); target steps
        then need their rows' statistics, so they run warp_rows with or without truncation.
        temperature: a scalar, or [B] float32 on the device (each row's); stream_base: None, or [B, 2]
        int64 on the device, each row's (seed, offset base) (decode_round.cu's row_draw). Both are
        read by the kernels as they run: the caller keeps them alive and unchanged for the call."""
        import cupy
        host, B = self.host, self.B
        scalar, per_row = kernel_runtime.temperature_args(temperature)
        draws = dict(temperature=scalar, seed=seed & (2 ** 64 - 1), temps=per_row,
                     streams=0 if stream_base is None else stream_base.data.ptr)
        self.logprobs = logprobs
        self.set_warps(warps, stream)
        seq = host["seq"].reshape(B, self.P)
        seq[:, :req.seq.shape[1]] = req.seq
        seq[:, req.seq.shape[1]:] = pad_id
        host["seq_len"][:] = req.seq_len
        host["limit"][:] = req.prompt_len + req.budget
        host["finished"][:] = req.finished
        host["eos"][:] = req.eos_ids
        for name, cache in zip(("mask_t", "mask_d"), caches):
            if cache is None:
                continue
            mask = host[name].reshape(B, self.C)
            mask[:, :cache.length] = cache.mask
            mask[:, cache.length:] = 0
        cupy.cuda.runtime.memcpyAsync(self.state.data.ptr, self.host_state.ctypes.data, self.host_state.nbytes,
                                      1, stream.ptr)
        if self.target_launch is not None:
            self.target_launch.set(**draws, pad_id=pad_id, pos_limit=pos_limit)
        if self.G:
            for launch in self.step_launches:
                launch.set(**draws, pos_limit=pos_limit)
            if self.ngram_feed_launch is not None:
                self.ngram_feed_launch.set(pos_limit=pos_limit)
            self.done_launch.set(pad_id=pad_id, pos_limit=pos_limit)
        if gamma == 0:   # target-only, or a drafting call's first round as a target step: its S = 1 feed
            live = ~req.finished
            feed = np.zeros(2 * B + B * (self.C + 1), np.int64)
            feed[:B] = np.where(live, req.last_tokens(), pad_id)
            feed[B:2 * B] = np.clip(req.seq_len - 1, 0, pos_limit)
            mask = feed[2 * B:].reshape(B, self.C + 1)
            mask[:, :caches[0].length] = caches[0].mask
            mask[:, self.C] = live
            self.target_steps[1].feed.set(feed, stream=stream)
        else:
            self.prepare_round(stream, gamma)

    def prepare_round(self, stream, gamma: int) -> None:
        """round_done with nothing emitted: every row's draft length and first draft feed for a round
        of gamma drafts, from the state as it is (a call's start, or rows just refilled; rows already
        prepared get the same again; or after a call's first round was a target step: the draft has
        then not seen two tokens, which its S = 2 first run takes)."""
        done = self.done_launch
        done.commit.words = 0
        done(stream, verify_out=self.no_verify.data.ptr, L_target=0, target_cols=0, report=self.first_report.data.ptr,
             G=gamma, gamma_next=gamma, verify_lp=0, lp_out=0)

    def set_warps(self, warps, stream) -> None:
        """The call's truncation from now on (None: none; start(), and continuous batching's refills,
        whose new temperatures change min-p's span): verify()'s warps and the sampling kernels' warp
        record (warp_rows over the rows they sample). logprobs need the rows' statistics, so target
        steps then run warp_rows with nothing truncated."""
        import cupy
        self.truncation = warps
        if warps is None and self.logprobs:
            with stream:
                warps = off_warps(cupy, self.B)
        self.warps = warps   # verify()'s and the target steps' samplers' (built once per setting)
        # What the sampling kernels read: draft steps the truncation, target steps self.warps.
        steps = self.truncation is not None and self.step_launches
        targets = self.warps is not None and self.target_launch is not None
        if (steps or targets) and self.row_warps is None:
            self.row_warps = RowWarps(self._dtype_name, self.B, self.V, cupy.cuda.runtime.getDevice())
        record = self.row_warps.record.data.ptr if self.row_warps is not None else 0
        for launch in self.step_launches:
            launch.set(warp_record=record if steps else 0)
        if self.target_launch is not None:
            self.target_launch.set(warp_record=record if targets else 0)

    def prepare_expected(self, stream) -> None:
        """Load expected_accept.cu's kernels (a compile on a machine's first use) before any round is
        timed: a policy that counted that second in its first drafting round would stop drafting."""
        if self.expected is None:
            self.expected = ExpectedAcceptance(self._dtype_name, self.B, self.G, self.V, stream)
            self.host_beta = host_array((2, self.B * self.G), np.float32)

    def expected_acceptance(self, stream, target_logits, gamma: int, temperature, r: int) -> None:
        """Enqueue kernels_cu/expected_accept.cu over round r's rows (target_logits [B, gamma + 1, V], the
        draft's in draft_logits; temperature: a float > 0 or [B] float32 on the device): each draft
        position's acceptance probability into host_beta[r % 2][:B * gamma] ([B, gamma], read with
        the round's report; 0 past a row's draft_len)."""
        self.prepare_expected(stream)
        self.expected(stream, target_logits.data.ptr, self.draft_logits.data.ptr, self.B, gamma, temperature,
                      self.draft_len.data.ptr, self.host_beta[r % 2].ctypes.data)

    def logprobs_slot(self, r: int) -> int:
        """Where round r's kernels write its tokens' log-probabilities (0: not asked for)."""
        return self.host_logprobs[r % 2].ctypes.data if self.logprobs else 0


def round_buffers(decoder, B: int, C: int, P: int, G: int, E: int) -> _RoundBuffers:
    """The decoder's _RoundBuffers for this shape and the sessions' current plans (made on first use)."""
    kept = decoder._round_buffers
    draft = decoder.draft if G else None
    key = (B, C, P, G, E, id(decoder.target._plan), id(draft._plan) if draft is not None else None)
    buffers = kept.pop(key, None)
    if buffers is None:
        if len(kept) >= MAX_BUFFERS:
            kept.pop(next(iter(kept)))
        buffers = _RoundBuffers(decoder.target, draft, B, C, P, G, E, decoder.stream)
    kept[key] = buffers   # most recently used last
    return buffers
