"""Speculative decoding with a target/draft pair of ONNX decoders.

Each round: the draft proposes gamma tokens one at a time, the target scores all gamma+1 positions in
one run, verify() accepts a prefix of the drafts and picks the next token, and both KV caches roll back
to what they have seen of the accepted sequence. On the GPU the logits stay on the device; the only
device-to-host read of a round is verify()'s few integers per request.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specsample_cupy import decode_device, errors
from specsample_cupy.detokenize import TextAssembler
from specsample_cupy.sampling import sample_tokens
from specsample_cupy.sessions import DecoderSession, ModelSpec, array_module, check_pair, cuda_available
from specsample_cupy.sessions_static import StaticDecoderSession
from specsample_cupy.verify import VerifyResult, verify

METHODS = ("exact", "sigmoid", "baseline", "greedy", "target")


def default_model_dir(role: str) -> Path:
    """The embedded pair, models/stdlib-code/{target,draft}, next to the installed models package."""
    import models
    return Path(models.__file__).resolve().parent / "stdlib-code" / role


def _pick_device(device: str | None) -> str:
    if device is None:
        if cuda_available():
            return "cuda"
        warnings.warn("no CUDA device usable by CuPy and onnxruntime-gpu; decoding on the CPU", RuntimeWarning,
                      stacklevel=3)
        return "cpu"
    if device == "cuda" and not cuda_available():
        raise RuntimeError("device='cuda' needs CuPy, a CUDA device and onnxruntime-gpu's CUDAExecutionProvider")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    return device


def _to_host(array) -> np.ndarray:
    """Copy a small device array to the host; the decode loop calls this once per round."""
    return array.get() if hasattr(array, "get") else np.asarray(array)


def _put_column(dst, i: int, src):
    """dst[:, i] = src: dst [B, G, ...] C-contiguous, src [B, ...] with contiguous rows. On the GPU one
    strided copy (a runtime call) when the dtypes agree, rather than an elementwise kernel launch."""
    if isinstance(dst, np.ndarray) or dst.dtype != src.dtype or not dst.flags.c_contiguous \
            or (src.ndim > 1 and not src[0].flags.c_contiguous):
        dst[:, i] = src
        return
    import cupy
    row = src.itemsize * (src[0].size if src.ndim > 1 else 1)
    cupy.cuda.runtime.memcpy2DAsync(dst.data.ptr + i * dst.strides[1], dst.strides[0], src.data.ptr,
                                    src.strides[0], row, dst.shape[0], 3, cupy.cuda.get_current_stream().ptr)


@contextlib.contextmanager
def _timed_runs(sessions, clock, kind="model"):
    """Model time is the GPU time of the model runs alone: each session wraps its run call in the
    clock's `kind` span, so feeds, cache commits, sampling and idle gaps all count as overhead."""
    for session in sessions:
        session.run_span = functools.partial(clock.span, kind)
    try:
        yield
    finally:
        for session in sessions:
            session.run_span = None


@dataclass
class GenerationOutput:
    texts: list[str]               # generated text per prompt (special tokens skipped)
    token_ids: list[list[int]]     # generated ids per prompt, EOS included when one was produced
    stats: dict = field(default_factory=dict)


class _Requests:
    """Host-side state of a batch: each row's sequence (prompt then generated tokens, left-aligned),
    its token budget, and whether it has finished (EOS or budget)."""

    def __init__(self, prompt_ids: list[list[int]], budgets: np.ndarray, pad_id: int, eos_ids, extra: int):
        self.batch = len(prompt_ids)
        self.prompt_len = np.array([len(p) for p in prompt_ids], np.int64)
        self.seq = np.full((self.batch, int((self.prompt_len + budgets).max()) + extra), pad_id, np.int64)
        for b, ids in enumerate(prompt_ids):
            self.seq[b, :len(ids)] = ids
        self.seq_len = self.prompt_len.copy()
        self.budget = budgets.astype(np.int64)
        self.finished = self.budget <= 0
        self.pad_id, self.eos_ids = pad_id, np.array(sorted(eos_ids), np.int64)
        self._eos_set = {int(t) for t in eos_ids}

    @property
    def remaining(self) -> np.ndarray:
        return self.budget - (self.seq_len - self.prompt_len)

    def last_tokens(self) -> np.ndarray:
        return self.seq[np.arange(self.batch), self.seq_len - 1]

    def columns(self, n_cached: np.ndarray, upto: np.ndarray, rows: np.ndarray):
        """Input columns that feed row b its tokens seq[b, n_cached[b]:upto[b]] (rows where `rows` is set),
        right-aligned like left padding; other slots are holes. Returns host (ids, mask, positions) [B, S]."""
        need = np.where(rows, upto - n_cached, 0)
        steps = max(int(need.max(initial=0)), 1)
        src = upto[:, None] - steps + np.arange(steps)[None, :]   # index in the sequence of each column
        mask = rows[:, None] & (src >= n_cached[:, None])
        src = np.clip(src, 0, None)
        ids = np.where(mask, self.seq[np.arange(self.batch)[:, None], src], self.pad_id)
        return ids, mask, src

    def append(self, tokens: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Append the first counts[b] of tokens[b] to unfinished rows, stopping after an EOS or at the budget.
        Returns how many tokens each row took."""
        if self.batch <= 16:
            return self._append_rows(tokens, counts)
        k = np.arange(tokens.shape[1])[None, :]
        valid = (k < np.where(self.finished, 0, counts)[:, None])
        is_eos = valid & np.isin(tokens, self.eos_ids)
        upto_eos = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1) + 1, valid.sum(axis=1))
        n_new = np.minimum(upto_eos, self.remaining)
        take = k < n_new[:, None]
        rows, cols = np.nonzero(take)
        self.seq[rows, self.seq_len[rows] + cols] = tokens[rows, cols]
        self.seq_len += n_new
        self.finished |= (is_eos & take).any(axis=1) | (self.remaining <= 0)
        return n_new

    def _append_rows(self, tokens: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """append() one row at a time: for a few rows, plain Python beats a dozen NumPy calls (this runs
        between a round's read and the next round's first launch, while the GPU waits)."""
        eos = self._eos_set
        remaining = (self.budget - (self.seq_len - self.prompt_len)).tolist()
        n_new = np.zeros(self.batch, np.int64)
        for b, count in enumerate(np.asarray(counts).tolist()):
            if self.finished[b]:
                continue
            row = tokens[b, :max(min(count, remaining[b]), 0)].tolist()
            n = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
            if n:
                start = int(self.seq_len[b])
                self.seq[b, start:start + n] = row[:n]
                self.seq_len[b] += n
                n_new[b] = n
            if (n and row[n - 1] in eos) or remaining[b] - n <= 0:
                self.finished[b] = True
        return n_new

    def draft_lengths(self, gamma: int) -> np.ndarray:
        """Drafts each row proposes this round: no more than it may still emit beyond the round's
        corrected token; 0 for finished rows."""
        return np.where(self.finished, 0, np.minimum(gamma, self.remaining - 1))

    def take(self, tokens: np.ndarray, taken: np.ndarray, finished: np.ndarray) -> np.ndarray:
        """Apply decisions made elsewhere (decode_device's round_done, which follows append()'s rules):
        row b takes tokens[b, :taken[b]]; `finished` is the new finished flags."""
        for b in np.flatnonzero(taken):
            start, n = int(self.seq_len[b]), int(taken[b])
            self.seq[b, start:start + n] = tokens[b, :n]
        self.seq_len += taken
        self.finished = np.asarray(finished, bool).copy()
        return taken

    def generated(self, b: int) -> list[int]:
        return self.seq[b, self.prompt_len[b]:self.seq_len[b]].tolist()


class _Clock:
    """Time spent in model runs and in verify(): CUDA events on the stream (read after the loop, so no
    extra syncs), perf_counter on the CPU."""

    def __init__(self, stream, pool: list):
        self.stream = stream
        self._events = {"model": [], "prefill": [], "verify": [], "sampling": []}
        self._seconds = {"model": 0.0, "prefill": 0.0, "verify": 0.0, "sampling": 0.0}
        self._pool, self._used = pool, 0   # events are reused across generate() calls: creating one costs µs

    def _event(self):
        import cupy
        if self._used == len(self._pool):
            self._pool.append(cupy.cuda.Event())
        self._used += 1
        return self._pool[self._used - 1]

    @contextlib.contextmanager
    def span(self, kind: str, start=None):
        """Time the GPU work enqueued inside the block. `start`: an event already recorded right before
        it (the end of the previous span, with nothing enqueued since), used instead of a new one."""
        if self.stream is None:
            started = time.perf_counter()
            yield
            self._seconds[kind] += time.perf_counter() - started
            return
        if start is None:
            start = self._event()
            start.record(self.stream)
        end = self._event()
        yield
        end.record(self.stream)
        self._events[kind].append((start, end))

    def last_end(self, kind: str):
        """The end event of the latest span of `kind` on the GPU, or None."""
        spans = self._events[kind] if self.stream is not None else ()
        return spans[-1][1] if spans else None

    def seconds(self, kind: str) -> float:
        if self.stream is not None:
            import cupy
            self.stream.synchronize()
            self._seconds[kind] += sum(cupy.cuda.get_elapsed_time(s, e) for s, e in self._events[kind]) / 1e3
            self._events[kind].clear()
        return self._seconds[kind]


class SpeculativeDecoder:
    """Generate text with a target model, speculatively proposed by a smaller draft model.

    Args:
        target, draft: model directories (optimum decoder-with-past export with config.json and
            tokenizer.json); default: the embedded pair models/stdlib-code/{target,draft}.
        device: "cuda" (CuPy + onnxruntime-gpu; logits and caches stay on the GPU) or "cpu" (NumPy);
            default "cuda" when usable, else "cpu" with a RuntimeWarning.
        kv_slack: rolled-back cache columns tolerated before the cache is compacted (see KVCache).
        prefill_chunk: prompt tokens per model run while prefilling (bounds the prefill's logits buffer).
        cuda_graphs: on CUDA, run each model with fixed bindings over a full-capacity cache and let ONNX
            Runtime replay its runs as CUDA graphs (sessions_static) when the model allows it (a graph
            without CPU nodes, a position_ids input); other models, or False, rebind every run.
        device_rounds: with CUDA graphs, keep the speculative rounds' bookkeeping on the GPU
            (decode_device) where the pair allows it; False builds every feed on the host.

    Raises ValueError when the pair is incompatible (vocabulary or tokenizer differ) or a model is not a
    decoder-with-past export.

    Example:
        >>> dec = SpeculativeDecoder("out/target", "out/draft", device="cpu")
        >>> out = dec.generate(["def add(a, b):"], max_new_tokens=32, gamma=4, temperature=0)
        >>> out.texts[0], out.stats["acceptance_rate"]
    """

    # CUDA events around every model run and verify() give stats["model_time_s"] and the verify time;
    # they take GPU time of their own (a few µs per run), so a benchmark of the wall alone may turn
    # them off (those stats are then None; the prefill's few runs stay timed:
    # stats["prefill_model_time_s"]).
    time_model_runs = True

    def __init__(self, target=None, draft=None, device: str | None = None, *, kv_slack: int = 32,
                 prefill_chunk: int = 256, device_id: int = 0, cuda_graphs: bool = True,
                 device_rounds: bool = True):
        self.target_spec = ModelSpec.from_dir(target if target is not None else default_model_dir("target"))
        self.draft_spec = ModelSpec.from_dir(draft if draft is not None else default_model_dir("draft"))
        check_pair(self.target_spec, self.draft_spec)
        self._use_device(device, device_id)
        self.target = self._open(self.target_spec, "target", device_id, cuda_graphs)
        self.draft = self._open(self.draft_spec, "draft", device_id, cuda_graphs)
        self.tokenizer = self.target_spec.tokenizer
        contexts = [c for c in (self.target_spec.context_length, self.draft_spec.context_length) if c]
        self.context_length = min(contexts) if contexts else None
        self.kv_slack, self.prefill_chunk = kv_slack, prefill_chunk
        self.device_rounds = device_rounds

    def _on_stream(self):
        return self.stream if self.stream is not None else contextlib.nullcontext()

    def _upload(self, host: np.ndarray):
        """A small host array on the device, copied asynchronously from page-locked memory (a copy from
        pageable memory may wait for the stream's earlier work)."""
        if self.stream is None:
            return host
        import cupy
        if self._staging is None or self._staging[0].nbytes < host.nbytes:
            size = max(host.nbytes, 4096)
            pinned = np.frombuffer(cupy.cuda.alloc_pinned_memory(size), np.uint8, size)   # keeps it alive
            self._staging = (pinned, cupy.empty(size, cupy.uint8))
        pinned, device = self._staging
        pinned[:host.nbytes] = np.ascontiguousarray(host).view(np.uint8).ravel()
        # The previous round's copy from this staging memory finished before that round's result was read.
        cupy.cuda.runtime.memcpyAsync(device.data.ptr, pinned.ctypes.data, host.nbytes, 1, self.stream.ptr)
        return device[:host.nbytes].view(host.dtype).reshape(host.shape)

    def _open(self, spec, role, device_id, cuda_graphs):
        """A StaticDecoderSession (fixed bindings, CUDA-graph replay) where the device and the model allow
        it, else a DecoderSession; self.cuda_graphs[role] says which, or why not."""
        if self.device == "cuda" and cuda_graphs:
            try:
                session = StaticDecoderSession(spec, self.device, self.stream, device_id)
                self.cuda_graphs[role] = True
                return session
            except Exception as e:   # noqa: BLE001 - e.g. ONNX Runtime cannot capture a graph with CPU nodes
                self.cuda_graphs[role] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        else:
            self.cuda_graphs[role] = "off" if self.device == "cuda" else "cpu"
        return DecoderSession(spec, self.device, self.stream, device_id)

    def encode_prompts(self, prompts) -> list[list[int]]:
        prompt_ids = [self.target_spec.encode(p) for p in prompts]
        for i, ids in enumerate(prompt_ids):
            if self.context_length and len(ids) >= self.context_length:
                raise ValueError(f"prompt {i} has {len(ids)} tokens; the models' context holds "
                                 f"{self.context_length}, leaving no room to generate")
        return prompt_ids

    def _use_device(self, device, device_id):
        """Pick the device; on CUDA, the one non-default stream every session and array shares."""
        self.device = _pick_device(device)
        self.xp = array_module(self.device)
        self.cuda_graphs = {}   # role -> True, or why the model runs without CUDA graphs
        self._events, self._staging, self._read_wait_s = [], None, 0.0   # the loop's reusable pieces
        self._round_buffers = {}   # decode_device's buffers and launches, per shape
        self.stream = None
        if self.device == "cuda":
            import cupy
            cupy.cuda.Device(device_id).use()
            self.stream = cupy.cuda.Stream(non_blocking=True)

    def generate(self, prompts, max_new_tokens: int = 64, gamma: int = 5, method: str = "exact",
                 temperature: float = 1.0, seed: int = 0, adaptive_gamma: bool = False, gamma_min: int = 1,
                 gamma_max: int = 16, on_tokens=None) -> GenerationOutput:
        """Continue each prompt by up to max_new_tokens tokens (fewer after an EOS).

        Args:
            prompts: a string or a list of B strings (any lengths; batched with left padding).
            gamma: draft tokens proposed per round; 0 (or method="target") decodes with the target alone.
            method: "exact", "sigmoid", "baseline" or "greedy" (see verify()), or "target".
            temperature: sampling temperature of both models; 0 is greedy.
            seed: keys the random numbers; the same seed gives the same tokens on CPU and GPU (up to
                float near-ties).
            adaptive_gamma: after each round gamma += 2 if every request accepted all its drafts, else
                gamma -= 1, clipped to [gamma_min, gamma_max] (Hugging Face's heuristic).
            on_tokens: optional callback(request_index, new_ids) called as tokens are accepted.

        Returns GenerationOutput(texts, token_ids, stats); stats holds rounds, proposed, accepted,
        acceptance_rate (accepted / proposed drafts), mean_accepted_per_round (per request),
        generated_tokens, tokens_per_s, verify_time_per_round_s, model_time_s (draft and target runs:
        on CUDA the GPU time between events around each ONNX Runtime run call alone),
        prefill_model_time_s (the prompts' runs, part of model_time_s and timed even when
        time_model_runs is off),
        wall_s (from the call until the texts are ready; reading the CUDA events for these stats comes
        after), host_overhead_per_round_s (wall time outside model runs and verify, per round: feeds,
        cache commits, sampling, bookkeeping and every GPU idle gap), sampling_time_s (the draft's and
        target-only sampling, part of that overhead; 0 with device rounds, whose sampling is fused into
        the bookkeeping kernels) and read_wait_per_round_s.
        """
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if not (np.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
        if method in ("sigmoid", "baseline") and temperature == 0:
            raise ValueError(f"method={method!r} needs temperature > 0; use method='greedy'")
        if max_new_tokens < 0 or gamma < 0:
            raise ValueError("max_new_tokens and gamma must be >= 0")
        if adaptive_gamma and not 1 <= gamma_min <= gamma_max:
            raise ValueError(f"need 1 <= gamma_min <= gamma_max, got {gamma_min}, {gamma_max}")
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts:
            raise ValueError("no prompts given")
        speculative = method != "target" and gamma > 0
        # Without a position_ids input a model numbers tokens by cache column, so the cache may hold no
        # holes: one request per call (no padding, no ragged acceptance) and compaction after every rollback.
        sessions = (self.target, self.draft) if speculative else (self.target,)
        implicit_positions = not all(getattr(s, "has_position_ids", True) for s in sessions)
        if implicit_positions and len(prompts) > 1:
            raise ValueError("a model of the pair has no position_ids input, so it cannot decode a batch with "
                             "padding and ragged acceptance exactly; pass one prompt per call")
        kv_slack = 0 if implicit_positions else self.kv_slack

        wall_start = time.perf_counter()
        run_host_start = self.target.run_host_s + self.draft.run_host_s
        initial_gamma = gamma
        if speculative and adaptive_gamma:
            gamma = int(np.clip(gamma, gamma_min, gamma_max))
        gamma_cap = max(gamma, gamma_max) if (speculative and adaptive_gamma) else gamma
        temperature = 0.0 if method == "greedy" else float(temperature)
        prompt_ids = self.encode_prompts(prompts)
        budgets = np.array([min(max_new_tokens, (self.context_length or 1 << 62) - len(p)) for p in prompt_ids])
        req = _Requests(prompt_ids, budgets, self.target_spec.pad_token_id, self.target_spec.eos_token_ids,
                        extra=gamma_cap + 2)
        capacity = req.seq.shape[1] + gamma_cap + 2 + kv_slack
        clock = _Clock(self.stream, self._events)
        self._read_wait_s = 0.0
        offsets = itertools.count()   # target-only: a fresh Philox offset for every sampling call
        totals = {"rounds": 0, "proposed": 0, "accepted": 0, "request_rounds": 0}
        # Speculative round r draws with offsets r * per_round + i (draft run i) and r * per_round + gamma_cap
        # (verify), on either path, so that both give the same tokens.
        per_round = gamma_cap + 1
        why_not_device = self._why_not_device_rounds(speculative, adaptive_gamma, gamma)
        discarded = 0

        # With device rounds the host waits on the GPU between reads: texts are decoded then, piece by
        # piece where the tokenizer allows it, and a request's text is finished once it finishes.
        assembler = TextAssembler(self.tokenizer, req.batch, incremental=speculative and why_not_device is None)

        def count(active, n_new, draft_len=None, accepted=None):
            totals["rounds"] += 1
            totals["request_rounds"] += int(active.sum())
            if draft_len is not None:
                totals["proposed"] += int(draft_len.sum())
                totals["accepted"] += int(accepted[active].sum())
            for b in np.flatnonzero(n_new).tolist():
                new_ids = req.seq[b, req.seq_len[b] - n_new[b]:req.seq_len[b]].tolist()
                assembler.add(b, new_ids)
                if on_tokens is not None:
                    on_tokens(b, new_ids)
            if not req.finished.all():
                for b in np.flatnonzero(active & req.finished).tolist():
                    assembler.text(b)

        with self._on_stream(), _timed_runs(sessions, clock, "prefill"):
            target_cache = self.target.new_cache(req.batch, capacity, kv_slack)
            runs = [(self.target, target_cache)]
            if speculative:
                draft_cache = self.draft.new_cache(req.batch, capacity, kv_slack)
                runs.append((self.draft, draft_cache))
            self._prefill(runs, req)
        timing = _timed_runs(sessions, clock) if self.time_model_runs else contextlib.nullcontext()
        with self._on_stream(), timing:
            if speculative and why_not_device is None:
                rounds = decode_device.DeviceRounds(
                    self, req, target_cache, draft_cache, gamma=gamma, gamma_cap=gamma_cap, method=method,
                    temperature=temperature, seed=seed, clock=clock, offsets_per_round=per_round)
                for active, draft_len, accepted, n_new in rounds:
                    count(active, n_new, draft_len, accepted)
                discarded = rounds.discarded
            elif speculative:
                draft_tokens_buf = self.xp.zeros(req.batch * gamma_cap, np.int32)
                draft_logits_buf = self.xp.zeros(req.batch * gamma_cap * self.target.vocab_size,
                                                 self.target.logits_dtype)
                # The draft sampler's output, reused: each result is copied into draft_tokens before the
                # next call (on the CPU sample_tokens allocates).
                sample_out = self.xp.empty(4 * req.batch, np.int32) if self.stream is not None else None
                while not req.finished.all():
                    active = ~req.finished
                    draft_len, accepted, n_new = self._speculative_round(
                        req, target_cache, draft_cache, draft_tokens_buf, draft_logits_buf, sample_out, gamma,
                        method, temperature, seed, totals["rounds"] * per_round, gamma_cap, clock)
                    count(active, n_new, draft_len, accepted)
                    if adaptive_gamma and (draft_len > 0).any():
                        all_accepted = (accepted[draft_len > 0] == draft_len[draft_len > 0]).all()
                        gamma = int(np.clip(gamma + 2 if all_accepted else gamma - 1, gamma_min, gamma_max))
            else:
                while not req.finished.all():
                    active = ~req.finished
                    count(active, self._target_step(req, target_cache, temperature, seed, offsets, clock))
            if self.stream is not None:
                self.stream.synchronize()   # a discarded round may still run

        token_ids = [req.generated(b) for b in range(req.batch)]
        texts = [assembler.text(b) for b in range(req.batch)]
        wall_s = time.perf_counter() - wall_start   # the stats' own readout below is not decoding time
        prefill_s, verify_s, sampling_s = (clock.seconds(k) for k in ("prefill", "verify", "sampling"))
        model_s = clock.seconds("model") + prefill_s
        run_host_s = self.target.run_host_s + self.draft.run_host_s - run_host_start
        rounds = max(totals["rounds"], 1)
        generated = sum(len(t) for t in token_ids)
        stats = {
            "method": method if speculative else "target", "device": self.device, "batch": req.batch,
            "gamma": initial_gamma if speculative else 0, "final_gamma": gamma if speculative else 0,
            "rounds": totals["rounds"],
            "proposed": totals["proposed"], "accepted": totals["accepted"],
            "acceptance_rate": totals["accepted"] / totals["proposed"] if totals["proposed"] else 0.0,
            "mean_accepted_per_round": totals["accepted"] / max(totals["request_rounds"], 1),
            "generated_tokens": generated, "tokens_per_s": generated / wall_s if wall_s > 0 else 0.0,
            "verify_time_per_round_s": verify_s / rounds if self.time_model_runs else None, "wall_s": wall_s,
            "model_time_s": model_s if self.time_model_runs else None,
            "prefill_model_time_s": prefill_s,
            "host_overhead_per_round_s": max(wall_s - model_s - verify_s, 0.0) / rounds if self.time_model_runs
            else None,
            # Wall time outside ONNX Runtime's run calls (feeds, bindings, sampling, verify, the read).
            "model_run_host_s": run_host_s,
            "loop_overhead_per_round_s": max(wall_s - run_host_s, 0.0) / rounds,
            "sampling_time_s": sampling_s,
            # Host time blocked in the round's read of verify()'s result: the GPU was still busy.
            "read_wait_per_round_s": self._read_wait_s / rounds,
            "kv_compactions": target_cache.compactions + (draft_cache.compactions if speculative else 0),
            "cuda_graphs": dict(self.cuda_graphs),
            # True, or why the rounds' feeds were built on the host (decode_device).
            "device_rounds": True if why_not_device is None else why_not_device,
            # Rounds enqueued ahead of a read that then found every request finished (by an EOS).
            "discarded_rounds": discarded,
        }
        return GenerationOutput(texts, token_ids, stats)

    def _why_not_device_rounds(self, speculative: bool, adaptive_gamma: bool, gamma: int) -> str | None:
        """None when this generate() runs device rounds (decode_device), else why it does not."""
        if self.device != "cuda":
            return "cpu"
        if not getattr(self, "device_rounds", True):
            return "off"
        if not speculative:
            return "target only"
        return decode_device.supported(self.target, self.draft, adaptive_gamma, gamma)

    def _prefill(self, runs, req: _Requests):
        """Feed each prompt but its last token to every (session, cache) of `runs`, chunk by chunk; every
        round starts by feeding the last token so far. The caches start empty and take the same columns,
        so each chunk's feeds are built once, and the models' runs alternate."""
        first_cache = runs[0][1]
        while True:
            n_real = first_cache.n_real
            upto = np.minimum(req.seq_len - 1, n_real + self.prefill_chunk)
            rows = upto > n_real
            if not rows.any():
                return
            columns = req.columns(n_real, upto, rows=rows)
            for session, cache in runs:
                session.forward(cache, *columns)

    def _speculative_round(self, req, target_cache, draft_cache, draft_tokens_buf, draft_logits_buf, sample_out,
                           gamma, method, temperature, seed, offset_base, gamma_cap, clock):
        batch = req.batch
        draft_len = req.draft_lengths(gamma)
        gamma = int(draft_len.max(initial=0))
        vocab = self.target.vocab_size
        draft_tokens = draft_tokens_buf[:batch * gamma].reshape(batch, gamma)
        draft_logits = draft_logits_buf[:batch * gamma * vocab].reshape(batch, gamma, vocab)
        no_ids = np.zeros((batch, 1), np.int64)   # placeholders for ids that come from the device

        # 1. The draft proposes gamma tokens, one run each. Its first run catches up on the tokens it has not
        #    seen: the last emitted one and, after a fully accepted round, the last draft token too.
        for i in range(gamma):
            if i == 0:
                ids, mask, positions = req.columns(draft_cache.n_real, req.seq_len, rows=draft_len > 0)
                on_device = None
            else:
                ids, mask, positions = no_ids, (i < draft_len)[:, None], (req.seq_len + i - 1)[:, None]
                on_device = draft_tokens[:, i - 1:i]
            logits = self.draft.forward(draft_cache, ids, mask, positions, on_device)[:, -1]
            _put_column(draft_logits, i, logits)
            with clock.span("sampling"):
                _put_column(draft_tokens, i, sample_tokens(logits, temperature=temperature, seed=seed,
                                                           offset=offset_base + i, _out=sample_out))

        # 2. The target scores gamma+1 positions in one run: the last emitted token, then the drafts.
        ids = np.zeros((batch, gamma + 1), np.int64)
        ids[:, 0] = req.last_tokens()
        column = np.arange(gamma + 1)[None, :]
        mask = (column <= draft_len[:, None]) & ~req.finished[:, None]
        target_logits = self.target.forward(target_cache, ids, mask, req.seq_len[:, None] - 1 + column,
                                            draft_tokens)

        # 3. Verify: accept a prefix of each request's drafts, then sample the corrected (or bonus) token.
        lengths = self._upload(draft_len.astype(np.int32))   # before the span: it times verify() alone
        with clock.span("verify") if self.time_model_runs else contextlib.nullcontext():
            res = verify(draft_tokens, draft_logits, target_logits, method=method, temperature=temperature,
                         seed=seed, offset=offset_base + gamma_cap, draft_lengths=lengths)
        read_start = time.perf_counter()
        result = VerifyResult(_to_host(res.packed), batch)   # the round's one device-to-host read
        self._read_wait_s += time.perf_counter() - read_start
        errors.raise_if_any(result.error)
        emitted, tokens = result.emitted, result.tokens

        # 4. Append the accepted tokens; roll both caches back to what they have seen of the new sequences.
        n_new = req.append(tokens, emitted)
        target_cache.rollback(req.seq_len - 1)
        draft_cache.rollback(req.seq_len - 1)
        return draft_len, emitted - 1, n_new

    def _target_step(self, req, target_cache, temperature, seed, offsets, clock):
        """Target-only decoding (the reference): one run, one sampled token per request."""
        ids, mask, positions = req.columns(target_cache.n_real, req.seq_len, rows=~req.finished)
        logits = self.target.forward(target_cache, ids, mask, positions)[:, -1]
        with clock.span("sampling"):
            tokens = sample_tokens(logits, temperature=temperature, seed=seed, offset=next(offsets))
        n_new = req.append(_to_host(tokens)[:, None], np.ones(req.batch, np.int64))
        target_cache.rollback(req.seq_len - 1)   # drops nothing; lets finished rows' holes be compacted away
        return n_new
