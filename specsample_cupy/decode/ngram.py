"""Prompt-lookup (n-gram) draft proposals: drafting without a draft model.

Each round, a request proposes the tokens that followed the most recent earlier occurrence of the
longest suffix of its own tokens (prompt and generated so far). propose_ngram() is the NumPy path
and the reference; propose_ngram_device() gives the same outputs on the GPU (kernels_cu/ngram.cu).

The rule, for request b with history h[0..n-1] (n = seq_len[b]):
  * Finished requests propose nothing.
  * For k = ngram_max down to ngram_min, skipping every k >= n: the suffix is h[n-k..n-1]; find the
    largest start s with s + k <= n - 1 (an earlier occurrence, not the suffix itself; it may
    overlap the suffix) and h[s..s+k-1] == h[n-k..n-1]. The first (largest) k with such an s wins;
    no k with a match: nothing is proposed.
  * The proposal is h[s+k .. min(s+k+gamma, n) - 1]: what followed the occurrence, cut at the end of
    the history (s + k <= n - 1, so at least one token is there).
  * Budget: it is cut to max(0, limit[b] - 1) tokens, limit[b] being how many tokens the request
    may still emit. A round with L drafts emits up to L + 1 tokens (the accepted drafts and the
    target's own token after them), so L <= limit - 1 keeps every round within the budget; with one
    token (or none) left the round is target-only. This is Requests.draft_lengths()'s cap.
  * EOS: it is cut just after its first token that is one of eos_ids (the EOS itself is proposed:
    a request stops there, so nothing after it can be accepted).
  * Outputs: draft_tokens [B, gamma] int32 (the proposal, then pad_id) and draft_len [B] int32.
    Token ids are cast to int32 (they index a vocabulary).

Both implementations find the match in one pass rather than one pass per k: for each candidate end
e <= n - 2 of an earlier occurrence, count c(e), how many tokens ending at e agree with the tokens
ending at n - 1 (at most ngram_max). An earlier occurrence of the k-token suffix ending at e exists
iff c(e) >= k, and its start s = e - k + 1 grows with e. So the winning k is min(max_e c(e),
ngram_max) when that is >= ngram_min, the winning s is the one of the largest e with c(e) >= k, and
the proposal starts at e + 1. (tests/test_ngram.py checks this against the rule's loops as written.)
"""
from __future__ import annotations

import ctypes
import functools
from numbers import Integral

import numpy as np

from specsample_cupy.runtime import kernel_runtime

THREADS = 256   # kernels_cu/ngram.cu's block (SS_THREADS)
NGRAM = "ngram"   # the drafter's name where a draft model directory would go (decoder, CLI)
_INT32 = np.iinfo(np.int32)


def check_ngram_range(ngram_min, ngram_max):
    """ValueError naming the argument unless 1 <= ngram_min <= ngram_max (ints)."""
    _check_args(0, ngram_min, ngram_max, 0)


def _check_args(gamma, ngram_min, ngram_max, pad_id):
    """ValueError naming the first argument out of range; the kernel assumes these hold."""
    for name, value in (("gamma", gamma), ("ngram_min", ngram_min), ("ngram_max", ngram_max), ("pad_id", pad_id)):
        if not isinstance(value, Integral) or isinstance(value, bool):
            raise ValueError(f"{name} must be an int, got {value!r}")
    if not 0 <= gamma <= _INT32.max:
        raise ValueError(f"gamma must be >= 0 (and fit int32), got {gamma}")
    if not 1 <= ngram_min <= ngram_max:
        raise ValueError(f"ngram_min must satisfy 1 <= ngram_min <= ngram_max, got ngram_min={ngram_min}, "
                         f"ngram_max={ngram_max}")
    if ngram_max > _INT32.max:
        raise ValueError(f"ngram_max must fit int32, got {ngram_max}")
    if not _INT32.min <= pad_id <= _INT32.max:
        raise ValueError(f"pad_id must fit int32 (draft_tokens is int32), got {pad_id}")


def _check_shapes(seq, seq_len, finished, limit, eos_ids):
    if seq.ndim != 2:
        raise ValueError(f"seq must be [B, P], got shape {seq.shape}")
    B = seq.shape[0]
    for name, a in (("seq_len", seq_len), ("finished", finished), ("limit", limit)):
        if a.shape != (B,):
            raise ValueError(f"{name} must be [B] = [{B}], got shape {a.shape}")
    if eos_ids.ndim != 1:
        raise ValueError(f"eos_ids must be 1-D, got shape {eos_ids.shape}")


# ---- NumPy path (the reference) ----

def propose_ngram(seq, seq_len, finished, limit, eos_ids, *, gamma, ngram_min=1, ngram_max=4, pad_id=0):
    """Draft proposals by prompt lookup (the module's rule), on NumPy arrays.

    seq [B, P] int64: each request's history, left-aligned, padded; seq_len [B]: its length
    (0..P); finished [B] bool; limit [B] int: tokens the request may still emit; eos_ids: 1-D ids.
    Returns (draft_tokens [B, gamma] int32, padded with pad_id; draft_len [B] int32).
    """
    _check_args(gamma, ngram_min, ngram_max, pad_id)
    seq = np.asarray(seq, np.int64)
    seq_len, limit = np.asarray(seq_len, np.int64), np.asarray(limit, np.int64)
    finished, eos_ids = np.asarray(finished, bool), np.asarray(eos_ids, np.int64)
    _check_shapes(seq, seq_len, finished, limit, eos_ids)
    if ((seq_len < 0) | (seq_len > seq.shape[1])).any():
        raise ValueError(f"seq_len must lie in 0..P = 0..{seq.shape[1]}")
    # The match only matters where something may be proposed (the kernel skips the others too).
    room = np.where(finished, 0, np.minimum(gamma, np.maximum(limit - 1, 0)))
    start = _proposal_starts(seq, np.where(room > 0, seq_len, 0), ngram_min, ngram_max)
    room = np.where(start >= 0, np.minimum(room, seq_len - start), 0)
    return _cut_and_pad(seq, start, room, eos_ids, gamma, pad_id)


def _common_suffix(seq, n, ngram_max):
    """c[b, e] for e in 0..P-2: how many tokens ending at e agree with those ending at n[b] - 1, at
    most ngram_max; 0 where e > n[b] - 2 (not an earlier occurrence's end)."""
    B, P = seq.shape
    ends = np.arange(max(P - 1, 0))
    rows = np.arange(B)[:, None]
    agree = ends[None, :] <= (n - 2)[:, None]
    count = np.zeros((B, ends.size), np.int64)
    for j in range(min(ngram_max, ends.size)):   # c(e) <= e + 1 <= P - 1
        at = ends - j
        tail = np.maximum(n - 1 - j, 0)[:, None]   # where it matters, n - 1 - j > e - j >= 0
        agree &= (at >= 0)[None, :] & (seq[rows, np.maximum(at, 0)[None, :]] == seq[rows, tail])
        if not agree.any():
            break
        count += agree
    return count


def _proposal_starts(seq, n, ngram_min, ngram_max):
    """[B] int64: where each request's proposal starts in its history (the winning occurrence's end
    + 1), or -1 where no k in ngram_min..ngram_max matches. n [B]: history lengths (0: skip)."""
    count = _common_suffix(seq, n, ngram_max)
    k = count.max(axis=1, initial=0)              # the longest matching n-gram (<= ngram_max)
    k = np.where(k >= ngram_min, k, 0)
    ends = np.arange(count.shape[1])
    latest = np.where((count >= k[:, None]) & (k > 0)[:, None], ends[None, :], -1).max(axis=1, initial=-1)
    return np.where(latest >= 0, latest + 1, -1)


def _cut_and_pad(seq, start, room, eos_ids, gamma, pad_id):
    """The proposals seq[b, start[b]:start[b] + room[b]], each cut just after its first EOS, as
    (draft_tokens [B, gamma] int32 padded with pad_id, draft_len [B] int32)."""
    B, P = seq.shape
    pos = np.arange(gamma)[None, :]
    inside = pos < room[:, None]
    tokens = np.zeros((B, gamma), np.int64)
    if P:   # else nothing is proposed: no history to read
        tokens = seq[np.arange(B)[:, None], np.clip(start[:, None] + pos, 0, P - 1)]
    is_eos = inside & np.isin(tokens, eos_ids)
    length = np.minimum(room, np.where(is_eos, pos + 1, gamma).min(axis=1, initial=gamma))
    draft = np.where(pos < length[:, None], tokens, pad_id).astype(np.int32)
    return draft, length.astype(np.int32)


# ---- CuPy path (kernels_cu/ngram.cu) ----

class _Proposer:
    """ngram.cu's kernel through a kernel_runtime.Launch, one per device, shared by every thread
    (every call writes all of its slots, under the Launch's lock)."""

    def __init__(self):
        kernel, = kernel_runtime.functions("ngram.cu", ("ngram_propose",))
        c = ctypes
        self.launch = kernel_runtime.Launch(kernel, [
            c.c_void_p(), c.c_int64(), c.c_int32(),                    # seq, row pitch, P
            c.c_void_p(), c.c_int32(), c.c_void_p(), c.c_int32(),      # seq_len, its width; finished, its width
            c.c_void_p(), c.c_int32(), c.c_void_p(), c.c_int32(),      # limit, its width; eos, its width
            c.c_int32(), c.c_int32(), c.c_int32(), c.c_int32(), c.c_int32(),   # n_eos, gamma, ngram_min/max, pad
            c.c_void_p(), c.c_int64(), c.c_void_p(),                   # draft_tokens, row pitch, draft_len
            c.c_int32()])                                               # limit_is_end


@functools.lru_cache(maxsize=None)
def _proposer(device_id):
    return _Proposer()


def _device_ints(a, kinds, widths, cupy):
    """An int array as the kernel reads it (its element width passed along): contiguous arrays of
    the given dtype kinds and widths in bytes are read in place; anything else is first converted
    to int64 (one small copy)."""
    if a.dtype.kind not in kinds or a.dtype.itemsize not in widths or not a.flags.c_contiguous:
        a = cupy.ascontiguousarray(a, dtype=cupy.int64)
    return a


def _check_outputs(draft_tokens, draft_len, B, gamma):
    """The caller's buffers as the kernel writes them: int32, rows of unit column stride."""
    if (draft_tokens.dtype != np.int32 or draft_tokens.shape != (B, gamma)
            or (gamma > 1 and draft_tokens.strides[1] != 4)):
        raise ValueError(f"draft_tokens must be [B, gamma] = [{B}, {gamma}] int32 with unit column stride, got "
                         f"{draft_tokens.dtype} {draft_tokens.shape}, strides {draft_tokens.strides}")
    if draft_len.dtype != np.int32 or draft_len.shape != (B,) or not draft_len.flags.c_contiguous:
        raise ValueError(f"draft_len must be [B] = [{B}] contiguous int32, got {draft_len.dtype} {draft_len.shape}")


def propose_ngram_device(seq, seq_len, finished, limit, eos_ids, draft_tokens, draft_len, *, gamma,
                         ngram_min=1, ngram_max=4, pad_id=0, limit_is_end=False):
    """propose_ngram() on CuPy arrays: one kernel launch on the current stream, no host sync.

    seq [B, P] int64 with unit column stride (any row pitch); seq_len, limit [B] and eos_ids (1-D)
    int32 or int64; finished [B] bool or an int of 1, 4 or 8 bytes (nonzero: finished). These are
    read in place when contiguous; others are converted to int64 first (an allocation per call).
    draft_tokens [B, gamma] int32 (unit column stride, any row pitch) and draft_len [B] int32
    (contiguous): the caller's buffers, fully written by the kernel and returned.
    seq_len is not validated on the device (that would need a sync): values outside 0..P are
    clamped there, where propose_ngram() raises.
    limit_is_end: limit[b] is the sequence length at which request b's budget ends (the device
    loop's state) rather than the tokens it may still emit.
    """
    import cupy
    _check_args(gamma, ngram_min, ngram_max, pad_id)
    _check_shapes(seq, seq_len, finished, limit, eos_ids)
    B, P = seq.shape
    if seq.dtype != np.int64 or (P > 1 and seq.strides[1] != 8):
        raise ValueError(f"seq must be int64 with unit column stride, got {seq.dtype}, strides {seq.strides}")
    if P > _INT32.max:
        raise ValueError(f"seq's P must fit int32, got {P}")
    _check_outputs(draft_tokens, draft_len, B, gamma)
    seq_len, limit, eos_ids = (_device_ints(a, "i", (4, 8), cupy) for a in (seq_len, limit, eos_ids))
    finished = _device_ints(finished, "biu", (1, 4, 8), cupy)   # only zero or not matters
    if B == 0:
        return draft_tokens, draft_len
    stream = cupy.cuda.get_current_stream()
    seq_pitch = seq.strides[0] // 8 if B > 1 else P
    out_pitch = draft_tokens.strides[0] // 4 if B > 1 else gamma
    _proposer(cupy.cuda.runtime.getDevice()).launch(stream, B, THREADS, leading=(
        seq.data.ptr, seq_pitch, P, seq_len.data.ptr, seq_len.itemsize, finished.data.ptr, finished.itemsize,
        limit.data.ptr, limit.itemsize, eos_ids.data.ptr, eos_ids.itemsize, eos_ids.size, gamma, ngram_min,
        ngram_max, pad_id, draft_tokens.data.ptr, out_pitch, draft_len.data.ptr, int(bool(limit_is_end))))
    return draft_tokens, draft_len
