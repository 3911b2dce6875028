"""The decode loop on CUDA: rounds whose bookkeeping lives on the GPU (kernels_cu/decode_round.cu).

The device keeps its own copy of the requests' state (sequences, lengths, budgets, finished flags,
both caches' slot masks) and one small kernel between two model runs does what the host loop's
NumPy lines do (decode_host):

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
gamma, a round of gamma drafts uses their first B * gamma rows, and the policy's choice for round
r + 1 is made when round r is enqueued, from the reports read by then. A drafting call whose policy
may stop drafting (automatic gamma) also gets the target's S = 1 step on its buffers
(enable_target_steps): from the round the policy says 0, the call runs target steps, as a
target-only call does, to its end; its first round may be a single target step too (it times one).
A target step at round r samples at offset r * (cap + 1), decode_host's rule.

Truncated sampling (top_k / top_p / min_p): before each sampling kernel (draft_step_done,
target_step_done) warp_rows.cu computes the sampled rows' thresholds (kernels.RowWarps), and the
sampler races only over the kept entries; verify() gets the same truncation prebuilt (warps=).
Log-probabilities (generate(logprobs=True)): round_done copies verify()'s beside the report, and
target_step_done computes its token's from the row's warp_rows record.

A full cache is compacted on the device too (compact_plan), in stream order between two rounds, so
the masks never cross to the host and no compaction waits for a read.

Continuous batching (continuous.py) refills a finished request's row the same way: refill() enqueues
the newcomer's state (one upload and one kernel, refill_rows), its prompt's prefill runs (their
attention masks copied from the device's slot masks) and the next round's feeds behind the round in
flight; reports of rounds enqueued before a row's refill are not that row's (joined). Each row then
samples at its own temperature and from its request's random stream (decode_round.cu's row_draw).

Used on CUDA when the models run with fixed bindings (sessions_static) and their logits share a dtype
(float32/float16); otherwise decode_host runs. The samplers of draft_step_done and target_step_done
give each row one block (sample_row.cuh) at every vocabulary size: one pass over the row.
"""
from __future__ import annotations

import contextlib
import ctypes
import time

import numpy as np

from specsample_cupy.decode.gamma_policy import expected_accepted
from specsample_cupy.decode.ngram import propose_ngram_device
from specsample_cupy.decode.stats import Round
from specsample_cupy.runtime import errors, kernel_runtime
from specsample_cupy.runtime.pinned import host_array
from specsample_cupy.runtime.sessions_static import StaticDecoderSession
from specsample_cupy.verification import kernel_launch as kernels
from specsample_cupy.verification.api import VerifyResult, verify
from specsample_cupy.verification.expected_accept import ExpectedAcceptance
from specsample_cupy.verification.truncation import off_warps

THREADS = 256


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


def supported(target, draft, gamma_cap: int) -> str | None:
    """None when the loop can run on the device for these sessions (draft None: target-only, or
    prompt-lookup drafts) and the policy's largest gamma, else why not."""
    if gamma_cap + 1 > THREADS:
        return f"gamma over {THREADS - 1}"   # round_done reads a row's gamma + 1 tokens with one thread each
    sessions = (target,) if draft is None else (target, draft)
    if not all(isinstance(s, StaticDecoderSession) for s in sessions):
        return "a model without fixed bindings (cuda_graphs=False, or no position_ids input)"
    if any(s.logits_dtype != target.logits_dtype for s in sessions) or target.logits_dtype.char not in "fe":
        return "logits dtypes"
    for s in sessions:
        if (s.head_dim * np.dtype(s.kv_dtype).itemsize) % 4:
            return "KV rows not a multiple of 4 bytes"
    return None


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
        self._dtype_name = target.logits_dtype.name   # float32 or float16 (supported())
        tag, vec = kernels.vec_width(self._dtype_name, self.V)   # run outputs: allocation-aligned
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
            ("dense", c.c_int32(self.dense)), ("B", c.c_int32(B))],
            commit, B + _copy_blocks(commit.rows, commit.words))

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
                ("warp_record", c.c_void_p(0)), ("dense", c.c_int32(self.dense)), ("B", c.c_int32(B))],
                commit, 2 * B + _copy_blocks(commit.rows, commit.words)))
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
            self.row_warps = kernels.RowWarps(self._dtype_name, self.B, self.V, cupy.cuda.runtime.getDevice())
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


class DeviceCost:
    """AutoGamma's cost of a device round of gamma drafts: the model runs' GPU time measured by replaying
    the captured graphs (calibrate_model_costs), plus what the rounds read so far took beyond it
    (kernels, verify(), idle gaps; a gamma_policy.LineCost of those remainders), 0 before any round
    is read. cost(0) is the target's S = 1 run plus that remainder's guess, not a target step's own
    (target_step_done, no verify()): AutoGamma times a target step (measures_step)."""

    measures_step = True

    def __init__(self, model_s: dict):
        from specsample_cupy.decode.gamma_policy import LineCost
        self.model_s = model_s
        self.rest = LineCost(prior_ratio=0.05, jump=None)   # the models' slower paths are in model_s

    @property
    def model_s(self):
        """{gamma: model seconds of a round}, or None before calibration."""
        return self._model_s

    @model_s.setter
    def model_s(self, value):
        self._model_s = value
        self._model = {}   # gammas (dtype, bytes) -> (model seconds, gammas as floats): asked after every round

    @property
    def fitted(self) -> bool:
        """Whether the model costs are calibrated (the rest is 0 until rounds are read)."""
        return self.model_s is not None

    settled = fitted   # replays of captured graphs: no slow first run to wait out

    def observe(self, gamma: int, seconds: float):
        self.rest.observe(gamma, seconds - self.model_s[gamma])

    def state(self):
        return self.rest.state()

    def load(self, state):
        self.rest.load(state)

    def __call__(self, gammas):
        key = (gammas.dtype.str, gammas.tobytes()) if isinstance(gammas, np.ndarray) else tuple(gammas)
        known = self._model.get(key)
        if known is None:
            g = np.asarray(gammas)
            known = self._model[key] = (np.array([self.model_s[int(x)] for x in g.tolist()]), g.astype(np.float64))
        model, g = known
        return model + np.maximum(self.rest(g), 0.0) if self.rest.fitted else model


def calibrate_model_costs(decoder, buf: _RoundBuffers, gammas, replays: int = 5) -> dict:
    """GPU seconds of a round's model runs for each gamma (the draft's S = 2 run, gamma - 1 S = 1 runs,
    the target's S = gamma + 1 run; gamma = 0: a target-only step's S = 1 run), from replays of each
    captured graph between CUDA events. Runs before a call's first round writes any feed (the feeds
    are zeroed first: every id in range), and kept per plan by the decoder."""
    import cupy
    key = (buf.plans, tuple(gammas))
    kept = decoder._model_costs.get(key)
    if kept is not None:
        return kept
    stream = decoder.stream
    runs = {}
    if decoder.draft is not None:   # prompt lookup: no draft runs (its kernel is in the remainder)
        runs[("draft", 2)] = (decoder.draft, buf.draft_steps[0])
        if len(buf.draft_steps) > 1:
            runs[("draft", 1)] = (decoder.draft, buf.draft_steps[1])
    for g in [0, *gammas]:
        runs[("target", g + 1)] = (decoder.target, buf.target_step(decoder.target, g + 1))
    seconds = {}
    with stream:
        for key_run, (session, step) in runs.items():
            step.feed.fill(0)
            session.replay(step)   # the first replay captures the graph
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for _ in range(replays):
                session.replay(step)
            end.record(stream)
            end.synchronize()
            seconds[key_run] = cupy.cuda.get_elapsed_time(start, end) / 1e3 / replays
    costs = {g: seconds.get(("draft", 2), 0.0) + (g - 1) * seconds.get(("draft", 1), 0.0) + seconds[("target", g + 1)]
             for g in gammas}
    costs[0] = seconds[("target", 1)]
    decoder._model_costs[key] = costs
    return costs


class DeviceRounds:
    """The rounds of one generate() call, with the state on the device (module docstring).

    Iterating yields a decode_stats.Round per round as the host reads it, after the host's copy of the
    sequences (req) has taken the round's tokens. draft_cache None: target-only (gamma = 0).

    Continuous batching (continuous.py) gives finished rows new requests between rounds: refill()
    enqueues the newcomers' state and prefill behind the rounds in flight, so the loop never
    drains; streams, a decode_host.RequestStreams, keys each row's random numbers by its request
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
        # generate(logprobs=True): per request, one log-probability per token taken (as decode_host's).
        self.logprobs = [[] for _ in range(B)] if logprobs else None

    def _upload_streams(self, streams):
        """[B, 2] int64 on the device, each row's (seed, offset base): the base makes a launch's offset
        (the loop's round) the request's own, counted from the round it joined at (decode_host's
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
        # Round r's first offset (decode_host's rule): r in target-only calls, no earlier round's in others.
        launch(self.stream, offset=(r * self.per_round) & 0xFFFFFFFF, L_run=L, report=report,
               lp_out=buf.logprobs_slot(r))

    def _enqueue_speculative(self, r: int, gamma: int, report: int):
        buf, stream, B = self.buf, self.stream, self.B
        base = r * self.per_round
        target_step = buf.target_step(self.target, gamma + 1)
        draft_tokens = buf.draft_tokens[:B * gamma].reshape(B, gamma)
        if self.draft is None:   # prompt lookup: proposals from the device's sequences, then the target's feed
            dev = buf.dev
            propose_ngram_device(dev["seq"].reshape(B, buf.P), dev["seq_len"], dev["finished"], dev["limit"],
                                 dev["eos"], draft_tokens, buf.draft_len, gamma=gamma, ngram_min=self.dec.ngram[0],
                                 ngram_max=self.dec.ngram[1], limit_is_end=True)
            buf.ngram_feed_launch(stream, B, THREADS, G=gamma, feed=target_step.feed.data.ptr)
        for i in range(gamma if self.draft is not None else 0):
            launch = buf.step_launches[i]
            step = buf.draft_steps[min(i, 1)]
            L = self.dc.length
            self.draft.replay(step)
            self.dc.length += step.steps
            if buf.truncation is not None:   # drafts come from the truncated draft distribution
                buf.row_warps(stream, step.logits.data.ptr, step.steps, self.temperature, buf.truncation)
            last = i == gamma - 1
            buf.set_commit(launch.commit, step.steps, L)
            launch(stream, offset=(base + i) & 0xFFFFFFFF, L_run=L, G=gamma, next_is_target=int(last),
                   next_feed=(target_step if last else buf.draft_steps[1]).feed.data.ptr)
        L = self.tc.length
        self.target.replay(target_step)
        self.tc.length += gamma + 1
        # When the target run is timed, its end event also starts verify()'s span (one event fewer).
        timed = self.dec.time_model_runs
        target_end = self.clock.last_end("model") if timed and self.target.run_span is not None else None
        vocab = buf.V
        # Prompt lookup's drafts are one-hot (verify() reads no draft rows).
        draft_logits = buf.draft_logits[:B * gamma * vocab].reshape(B, gamma, vocab) if self.draft is not None else None
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
                session.forward(cache, ids, new_mask, positions, device_mask=self.masks[role])

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
