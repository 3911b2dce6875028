"""Which loop runs a generate() call, and the caches it runs on: the device loop (device_loop.py) where
the device, the sessions and the gamma cap allow it, else the host loop (host_loop.py), each given a
cache per model of one capacity."""
from __future__ import annotations

import numpy as np

from specsample_cupy.decode.device_loop import DeviceCost, DeviceRounds
from specsample_cupy.decode.host_loop import HostRounds, RequestStreams
from specsample_cupy.decode.round_buffers import THREADS
from specsample_cupy.runtime.sessions_static import StaticDecoderSession
from specsample_cupy.verification.seeds import as_int64


def call_sessions(dec, speculative: bool) -> tuple:
    """The models a call runs: the target, and the draft model when the call drafts with one."""
    return (dec.target, dec.draft) if speculative and dec.draft is not None else (dec.target,)


def numbers_by_column(sessions) -> bool:
    """Whether a model of `sessions` has no position_ids input, so numbers its tokens by cache column:
    its cache may hold no holes (one request per call, compaction after every rollback)."""
    return not all(getattr(s, "has_position_ids", True) for s in sessions)


def new_caches(dec, req, sessions, gamma_cap, columns: int | None = None):
    """One cache per session, of one capacity: every token a request may hold (columns; default
    the width of req's sequences, which already leave a round's gamma_cap + 2 columns beyond the
    budget) and room beyond them: the slack of rolled-back columns tolerated before a compaction,
    and at least the two rounds of gamma_cap + 1 columns the device loop may have in flight
    (device_loop's compaction keeps that room). Counting a round once, not twice, keeps an
    automatic gamma's cache (gamma_cap 12) the size of a fixed gamma's after rounding
    (sessions_static.CAPACITY_ROUND): a static cache's every run attends over its whole capacity.
    A pair that numbers tokens by cache column (numbers_by_column) gets no slack; its callers give it
    one request per call (one_at_a_time.py; continuous batching refuses it)."""
    kv_slack = 0 if numbers_by_column(sessions) else dec.kv_slack
    capacity = (req.seq.shape[1] if columns is None else columns) + max(kv_slack, 2 * (gamma_cap + 1))
    return [s.new_cache(req.batch, capacity, kv_slack) for s in sessions]


def call_rounds(dec, req, caches, policy, method, temperature, seed, request_seeds, clock, auto_state=None,
                truncation=None, logprobs=False):
    """The loop that runs this call's rounds, and None or why it is not the device loop.
    request_seeds: each request's seed, keying its own random stream (host_loop.RequestStreams;
    every request joins at round 0), or None: the call's seed, each request drawing by its row
    (method "baseline", whose numbers come from one generator). auto_state: what earlier calls of
    this kind measured, for an automatic gamma policy."""
    target_cache, draft_cache = caches[0], (caches[1] if len(caches) > 1 else None)
    speculative = policy.cap > 0
    why_not = why_not_device_loop(dec, speculative, policy.cap)
    if why_not is not None and any(getattr(s, "shared_buffer", False) for s in (dec.target, dec.draft) if s):
        raise ValueError(f"the GroupQueryAttention layout (convert --attention gqa) decodes on the device loop "
                         f"only, which this call cannot use: {why_not}")
    temperature = 0.0 if method == "greedy" else float(temperature)
    method = method if speculative else "target"
    streams = None if request_seeds is None else RequestStreams(as_int64(request_seeds))
    if why_not is None:
        if getattr(policy, "cost", None) is not None:
            policy.cost = DeviceCost(None)   # calibrated by DeviceRounds, which then chooses
            if auto_state is not None:
                policy.load(auto_state)
        warps = None
        if truncation:   # built once for the call, on the decoder's stream
            import cupy
            from specsample_cupy.verification.truncation import build_warps
            with dec._on_stream():
                warps = build_warps(cupy, req.batch, dec.target.vocab_size, temperature, **truncation)
        return DeviceRounds(dec, req, target_cache, draft_cache, policy=policy, method=method,
                            temperature=temperature, seed=seed, clock=clock, warps=warps,
                            logprobs=logprobs, streams=streams), None
    if auto_state is not None:
        policy.load(auto_state)
        policy.choose()
    return HostRounds(dec, req, target_cache, draft_cache, policy=policy, method=method,
                      temperature=temperature, seed=seed, clock=clock, truncation=truncation,
                      logprobs=logprobs, streams=streams), why_not


def why_not_device_loop(dec, speculative: bool, gamma_cap: int) -> str | None:
    """None when this call runs the device loop (device_loop.py), else why it does not."""
    if dec.device != "cuda":
        return "cpu"
    if not dec.device_rounds:
        return "off"
    if gamma_cap + 1 > THREADS:
        return f"gamma over {THREADS - 1}"   # round_done reads a row's gamma + 1 tokens with one thread each
    sessions = call_sessions(dec, speculative)   # no draft model: target-only, or prompt-lookup drafts
    if not all(isinstance(s, StaticDecoderSession) for s in sessions):
        return "a model without fixed bindings (cuda_graphs=False, or no position_ids input)"
    if any(s.logits_dtype != dec.target.logits_dtype for s in sessions) or dec.target.logits_dtype.char not in "fe":
        return "logits dtypes"
    for s in sessions:
        if (s.head_dim * np.dtype(s.kv_dtype).itemsize) % 4:
            return "KV rows not a multiple of 4 bytes"
    return None
