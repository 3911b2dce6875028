"""Proposers: what drafts each speculative round's tokens, behind one small interface (as Hugging Face's
CandidateGenerator and vLLM's proposers), so that the loops never ask which kind they have and a new
proposer is one class here.

    proposal = proposer.propose(req, gamma, sample)   # up to gamma tokens per request
    ... the target scores them, verify() accepts a prefix, the request state takes the tokens ...
    proposer.update(req)                              # after acceptance: forget what was rejected

A Proposal holds tokens [B, g] int32 on the loop's device (g: the longest proposal, 0 for a plain
target step), lengths [B] int64 on the host (request b's drafts: tokens[b, :lengths[b]]), and logits
[B, g, V] (the draft's distributions, for verify()) or None for one-hot drafts (verify()'s
draft_logits=None). `sample(logits, i)` draws position i's tokens from a draft model's logits [B, V]
with the round's temperature, truncation and random numbers (the loop owns those).

The host loop (host_loop.HostRounds) uses these; the device loop (device_loop.DeviceRounds) has the same
two kinds with the same rules, enqueued on the GPU (device_proposers.py: the draft's captured graphs,
ngram.propose_ngram_device). A new proposer is a class in each.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from specsample_cupy.decode.ngram import propose_ngram


class Proposal(NamedTuple):
    tokens: object           # [B, g] int32, the loop's array module
    lengths: np.ndarray      # [B] int64, host
    logits: object | None    # [B, g, V] or None (one-hot drafts)


class Proposer(Protocol):
    def propose(self, req, gamma: int, sample) -> Proposal:
        """Up to gamma draft tokens per unfinished request (the request state `req` bounds them)."""

    def update(self, req) -> None:
        """After a round's acceptance: `req` holds the sequences as accepted."""


class DraftModelProposer:
    """A draft model proposes gamma tokens, one run each, sampled from its logits. Its first run of a
    round catches up on the tokens it has not seen (the last emitted one and, after a fully accepted
    round, the last draft token too; after target steps, every token since its last run)."""

    def __init__(self, dec, cache, batch: int, cap: int):
        """dec: the SpeculativeDecoder (its draft session, array module, stream); cache: the draft's KV
        cache; cap: the most drafts a round proposes (the buffers' size)."""
        self.draft, self.cache = dec.draft, cache
        self.vocab = dec.target.vocab_size
        xp = dec.xp
        self.tokens_buf = xp.zeros(batch * cap, np.int32) if cap else None
        self.logits_buf = xp.zeros(batch * cap * self.vocab, dec.target.logits_dtype) if cap else None
        # The sampler's output, reused: copied into the tokens before the next call.
        self.sample_out = xp.empty(4 * batch, np.int32) if cap and dec.stream is not None else None

    def propose(self, req, gamma: int, sample) -> Proposal:
        batch, vocab = req.batch, self.vocab
        lengths = req.draft_lengths(gamma)
        gamma = int(lengths.max(initial=0))
        tokens = self.tokens_buf[:batch * gamma].reshape(batch, gamma)
        logits_all = self.logits_buf[:batch * gamma * vocab].reshape(batch, gamma, vocab)
        no_ids = np.zeros((batch, 1), np.int64)   # placeholders for ids that come from the device
        for i in range(gamma):
            if i == 0:
                ids, mask, positions = req.columns(self.cache.n_real, req.seq_len, rows=lengths > 0)
                on_device = None
            else:
                ids, mask, positions = no_ids, (i < lengths)[:, None], (req.seq_len + i - 1)[:, None]
                on_device = tokens[:, i - 1:i]
            logits = self.draft.forward(self.cache, ids, mask, positions, on_device)[:, -1]
            put_column(logits_all, i, logits)
            put_column(tokens, i, sample(logits, i, self.sample_out))
        return Proposal(tokens, lengths, logits_all)

    def update(self, req) -> None:
        self.cache.rollback(req.seq_len - 1)   # back to what it has seen of the accepted sequences


class NgramProposer:
    """Prompt lookup (ngram.propose_ngram): each request's latest n-gram, matched earlier in its own
    tokens, proposes what followed it (one-hot drafts: no model, no logits)."""

    def __init__(self, dec):
        self.ngram_min, self.ngram_max = dec.ngram
        self.upload = dec.upload

    def propose(self, req, gamma: int, sample) -> Proposal:
        tokens, lengths = propose_ngram(req.seq, req.seq_len, req.finished, req.remaining, req.eos_ids,
                                        gamma=gamma, ngram_min=self.ngram_min, ngram_max=self.ngram_max)
        lengths = lengths.astype(np.int64)
        g = int(lengths.max(initial=0))
        return Proposal(self.upload(np.ascontiguousarray(tokens[:, :g])), lengths, None)

    def update(self, req) -> None:
        pass   # it reads the accepted sequences afresh each round


def host_proposer(dec, draft_cache, batch: int, cap: int) -> Proposer:
    """The host loop's proposer for decoder `dec`: its draft model's, or prompt lookup's (draft="ngram")."""
    if dec.draft is None:
        return NgramProposer(dec)
    return DraftModelProposer(dec, draft_cache, batch, cap)


def put_column(dst, i: int, src):
    """dst[:, i] = src: dst [B, G, ...] C-contiguous, src [B, ...] with contiguous rows. On the GPU one
    strided copy when the dtypes agree, rather than an elementwise kernel launch."""
    if isinstance(dst, np.ndarray) or dst.dtype != src.dtype or not dst.flags.c_contiguous \
            or (src.ndim > 1 and not src[0].flags.c_contiguous):
        dst[:, i] = src
        return
    import cupy
    row = src.itemsize * (src[0].size if src.ndim > 1 else 1)
    cupy.cuda.runtime.memcpy2DAsync(dst.data.ptr + i * dst.strides[1], dst.strides[0], src.data.ptr,
                                    src.strides[0], row, dst.shape[0], 3, cupy.cuda.get_current_stream().ptr)
