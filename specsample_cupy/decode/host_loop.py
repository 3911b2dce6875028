"""The host-driven decode loop: the reference on the CPU, and on CUDA for models that cannot run with
fixed bindings (device_loop needs CUDA graphs).

A speculative round: the draft proposes gamma tokens one run at a time (sampled with sample_tokens),
the target scores gamma + 1 positions in one run, verify() accepts a prefix and picks the next
token, the host appends what each request takes (Requests.append: EOS and budget cuts) and both
caches roll back to what they have seen of the accepted sequences. A round of gamma = 0 is a
target step: one run, one sampled token per request. The host reads one small result per round.
Each round's gamma is the policy's (gamma_policy), 0 included: automatic gamma may switch a call to
target steps at any round, and the draft's first run of a later drafting round catches up on every
token it has not seen (Requests.columns), however many.

Random numbers: round r's draft run i samples at Philox offset r * (cap + 1) + i and its verify()
at r * (cap + 1) + cap (cap: the policy's largest gamma); a target step at round r samples at
r * (cap + 1) (r in target-only decoding, cap 0), so that the target steps of a call whose automatic
gamma stopped drafting draw numbers no earlier round drew. The
device loop uses the same offsets, so both give the same tokens (up to float near-ties). With
per-request streams (RequestStreams, continuous batching) each request draws with its own seed at
those offsets counted from its own first round, as it would decoded alone (verify()'s `streams`).
"""
from __future__ import annotations

import contextlib
import time

import numpy as np

from specsample_cupy.decode.acceptance import expected_acceptance, expected_accepted
from specsample_cupy.decode.proposers import host_proposer
from specsample_cupy.decode.stats import Round
from specsample_cupy.runtime import errors
from specsample_cupy.verification.api import verify
from specsample_cupy.verification.expected_accept import DTYPES, ExpectedAcceptance
from specsample_cupy.verification.sampling import sample_result, sample_tokens
from specsample_cupy.verification.truncation import build_warps


def to_host(array) -> np.ndarray:
    return array.get() if hasattr(array, "get") else np.asarray(array)


class RequestStreams:
    """Per-request random streams: row b's request draws with seeds[b] and counts its rounds from
    joined[b], the loop round it started at, so its numbers depend neither on its row nor on the
    requests around it (continuous batching refills rows between rounds)."""

    def __init__(self, seeds):
        self.seeds = np.array(seeds, np.int64)
        self.joined = np.zeros(len(self.seeds), np.int64)

    def restart(self, rows, seeds, first_round: int):
        """Rows rows[k] start a new request with seed seeds[k] at loop round first_round."""
        self.seeds[rows] = seeds
        self.joined[rows] = first_round


class HostRounds:
    """Iterating runs rounds until every request has finished, yielding a decode_stats.Round each."""

    def __init__(self, dec, req, target_cache, draft_cache, *, policy, method, temperature, seed, clock,
                 truncation=None, logprobs=False, streams: RequestStreams | None = None):
        """truncation: top_k / top_p / min_p for sample_tokens() and verify() (both models' rows),
        validated by the caller; logprobs: collect each taken token's log-probability in
        self.logprobs (one list per request); temperature: a scalar, or [B] of the loop's array
        module; streams: per-request random streams (seed is then unused)."""
        self.dec, self.req, self.tc = dec, req, target_cache
        self.policy, self.method, self.seed, self.clock = policy, method, seed, clock
        self.truncation = dict(truncation or {})
        self.temperature = temperature   # after req and truncation: it builds the warps
        self.logprobs = [[] for _ in range(req.batch)] if logprobs else None
        self.streams = streams
        self.round = 0   # the round the loop runs next
        self.per_round = policy.cap + 1
        policy.begin(int(np.max(req.remaining, initial=0)), probe_steps=2)   # automatic gamma's (gamma_policy)
        self.read_wait_s = 0.0
        self.discarded = 0
        self._expected = None   # expected_accept.cu's launches, at first use (_expected_acceptance)
        # Who drafts: the draft model or prompt lookup (proposers.py), behind one interface.
        self.proposer = host_proposer(dec, draft_cache, req.batch, policy.cap)

    @property
    def temperature(self):
        return self._temperature

    @temperature.setter
    def temperature(self, value):
        """Every draft step and verify() of a round sample at these temperatures, so the truncation's
        Warps are built here, once per setting (continuous batching sets new ones at each refill:
        min-p's span depends on them), rather than by each call."""
        self._temperature = value
        self.truncation_kw = self._warps_for(value)

    def _warps_for(self, temperature) -> dict:
        """sample_tokens() / verify()'s truncation keyword for these temperatures ({} when off)."""
        if not self.truncation:
            return {}
        with self.dec._on_stream():   # the uploads on the stream the loop's calls run on
            warps = build_warps(self.dec.xp, self.req.batch, self.dec.target.vocab_size, temperature,
                                **self.truncation)
        return {} if warps is None else {"warps": warps}

    def finish(self, rows) -> None:
        self.req.stop(rows)

    def __iter__(self):
        while not self.req.finished.all():
            r = self.round
            started = time.perf_counter()
            gamma = self.policy.next_gamma()
            active = ~self.req.finished
            ran = 0
            if gamma == 0:
                taken = self._target_step(r)
                rnd = Round(active, np.zeros(self.req.batch, np.int64), np.zeros(self.req.batch, np.int64), taken, 0)
            else:
                draft_len, accepted, taken, expected = self._speculative_round(r, gamma)
                rnd = Round(active, draft_len, accepted, taken, gamma, expected)
                ran = int(draft_len.max(initial=0))   # the runs it had: the longest proposal's
            self.policy.observe(rnd, time.perf_counter() - started, ran)
            self.round = r + 1   # before the yield: rows refilled meanwhile start at the next round
            yield rnd

    def _draws(self, r: int, step: int | None = None) -> dict:
        """The random-number keywords of sample_tokens() / verify() for round r: draft run `step` or
        verify() (step = cap) of a speculative round, or a target step (step None); offsets as the
        module docstring says."""
        step = 0 if step is None else step   # a target step: its round's first offset
        if self.streams is None:
            return {"seed": self.seed, "offset": r * self.per_round + step}
        offsets = (r - self.streams.joined) * self.per_round + step
        return {"streams": self.dec.xp.asarray(np.stack([self.streams.seeds, offsets], axis=1))}

    def _read(self, res):
        """The round's one device-to-host read: the verification's result, log-probabilities included."""
        started = time.perf_counter()
        result = res.to_host()
        self.read_wait_s += time.perf_counter() - started
        errors.raise_if_any(result.error)
        return result

    def _expected_acceptance(self, draft_logits, target_logits, draft_len, lengths) -> np.ndarray:
        """[B, gamma] float64: each draft position's acceptance probability (draft_len on the host,
        lengths its device copy). On the GPU kernels_cu/expected_accept.cu, the device loop's, where it
        reads the rows in place (model drafts: the draft's logits are the target's dtype); else
        acceptance.expected_acceptance."""
        xp = self.dec.xp
        if xp is not np and draft_logits.dtype == target_logits.dtype and draft_logits.dtype.name in DTYPES:
            import cupy
            if self._expected is None:
                self._expected = ExpectedAcceptance(draft_logits.dtype.name, self.req.batch, self.policy.cap,
                                                    draft_logits.shape[2], cupy.cuda.get_current_stream())
            if self._expected.fits(draft_logits, target_logits):
                return self._expected.to_host(cupy.cuda.get_current_stream(), draft_logits, target_logits,
                                              self.temperature, lengths)
        return expected_acceptance(xp, draft_logits, target_logits, self.temperature, draft_len)

    def _sample_draft(self, r: int):
        """The proposer's sampler for round r: draft position i's tokens from the draft's logits [B, V]."""
        def sample(logits, i: int, out=None):
            with self.clock.span("sampling"):
                return sample_tokens(logits, temperature=self.temperature, **self._draws(r, i), _out=out,
                                     **self.truncation_kw)
        return sample

    def _speculative_round(self, r: int, gamma: int):
        dec, req, clock = self.dec, self.req, self.clock
        batch = req.batch

        # 1. The proposer drafts up to gamma tokens per request: the draft model, one run each (its first
        #    run catches up on the tokens it has not seen), or prompt lookup (one-hot drafts, no logits).
        draft_tokens, draft_len, draft_logits = self.proposer.propose(req, gamma, self._sample_draft(r))
        gamma = draft_tokens.shape[1]

        # 2. The target scores gamma+1 positions in one run: the last emitted token, then the drafts.
        ids = np.zeros((batch, gamma + 1), np.int64)
        ids[:, 0] = req.last_tokens()
        column = np.arange(gamma + 1)[None, :]
        mask = (column <= draft_len[:, None]) & ~req.finished[:, None]
        target_logits = dec.target.forward(self.tc, ids, mask, req.seq_len[:, None] - 1 + column, draft_tokens)

        # 3. Verify: accept a prefix of each request's drafts, then sample the corrected (or bonus) token.
        lengths = dec.upload(draft_len.astype(np.int32))   # before the span: it times verify() alone
        with clock.span("verify") if dec.time_model_runs else contextlib.nullcontext():
            res = verify(draft_tokens, draft_logits, target_logits, method=self.method,
                         temperature=self.temperature, **self._draws(r, self.policy.cap),
                         draft_lengths=lengths, logprobs=self.logprobs is not None, **self.truncation_kw)
        result = self._read(res)
        expected = None
        if self.policy.expected:   # what auto gamma counts in place of the accepted drafts
            beta = self._expected_acceptance(draft_logits, target_logits, draft_len, lengths)
            expected = expected_accepted(beta, draft_len, result.emitted - 1)

        # 4. Append the accepted tokens; roll the target's cache and the proposer back to what they have
        #    seen of the new sequences.
        taken = req.append(result.tokens, result.emitted)
        self._keep_logprobs(result, taken)
        self.tc.rollback(req.seq_len - 1)
        self.proposer.update(req)
        return draft_len, result.emitted - 1, taken, expected

    def _target_step(self, r: int):
        """One target run, one sampled token per unfinished request."""
        req = self.req
        ids, mask, positions = req.columns(self.tc.n_real, req.seq_len, rows=~req.finished)
        logits = self.dec.target.forward(self.tc, ids, mask, positions)[:, -1]
        res = None
        with self.clock.span("sampling"):
            if self.logprobs is None:
                tokens = to_host(sample_tokens(logits, temperature=self.temperature, **self._draws(r),
                                               **self.truncation_kw))
            else:   # what sample_tokens() draws, with log-probabilities (one read for both)
                res = sample_result(logits, temperature=self.temperature, logprobs=True, **self._draws(r),
                                    **self.truncation_kw).to_host()
                tokens = res.tokens[:, 0]
        bad = ~req.finished & (tokens < 0)
        if bad.any():   # the GPU sampler's answer for a row with NaN/+Inf logits or no finite one
            raise ValueError(f"target logits hold NaN/+Inf or have no finite value in request(s) "
                             f"{np.flatnonzero(bad).tolist()}")
        taken = req.append(tokens[:, None], np.ones(req.batch, np.int64))
        if res is not None:
            self._keep_logprobs(res, taken)
        self.tc.rollback(req.seq_len - 1)   # drops nothing; lets finished rows' holes be compacted away
        return taken

    def _keep_logprobs(self, res, taken):
        """Each request's log-probabilities of the tokens it took this round (EOS and budget cuts);
        res: the round's result, on the host."""
        if self.logprobs is None:
            return
        lp = res.logprobs
        for b in np.flatnonzero(taken).tolist():
            self.logprobs[b].extend(float(x) for x in lp[b, :taken[b]])
