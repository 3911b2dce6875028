"""Speculative decoding with a target/draft pair of ONNX decoders: SpeculativeDecoder.generate().

A call: set-up (encode the prompts, the requests' state, the caches), prefill (every prompt but its
last token through both models), rounds (device_loop on CUDA, host_loop on the CPU and for
models without CUDA graphs: propose gamma drafts, score gamma + 1 positions, verify, take the
accepted tokens, roll the caches back; gamma = 0 is a target-only step), statistics
(decode_stats). Logits stay on the device; a round's one read is a few integers per request.
generate_stream() decodes a queue of requests with continuous batching (continuous.py).
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from specsample_cupy.decode import stats as decode_stats
from specsample_cupy.decode.call_loops import call_rounds, call_sessions, new_caches
from specsample_cupy.decode.call_args import METHODS  # noqa: F401  (decoder.METHODS, where it always was)
from specsample_cupy.decode.call_args import check_call, check_truncation, resolve_temperature, token_id_prompts
from specsample_cupy.decode.decoder_device import default_model_dir  # noqa: F401  (decoder.default_model_dir)
from specsample_cupy.decode.decoder_device import open_session, opened_folder, pick_device as _pick_device
from specsample_cupy.decode.detokenize import TextAssembler
from specsample_cupy.decode.gamma_policy import REPROBE, make_policy
from specsample_cupy.decode.ngram import NGRAM, check_ngram_range
from specsample_cupy.decode.one_at_a_time import generate_each, one_prompt_reason
from specsample_cupy.decode.request_state import Requests
from specsample_cupy.decode.stats import Clock, Totals, timed_runs
from specsample_cupy.decode.stop_strings import StopStrings, check_stop_strings
from specsample_cupy.runtime.model_folder import ModelSpec, check_pair
from specsample_cupy.runtime.ort_session import array_module
from specsample_cupy.runtime.pinned import PinnedRing
from specsample_cupy.verification.seeds import random_base_seed, resolve_seeds

# upload()'s slots: one is reused only after its copy ran (a few rounds later: at once).
UPLOAD_SLOTS = 8


@dataclass
class GenerationOutput:
    texts: list[str]               # generated text per prompt (special tokens skipped)
    token_ids: list[list[int]]     # generated ids per prompt, EOS included when one was produced
    finish_reasons: list[str] = field(default_factory=list)   # per prompt: length | eos | context | stop
    stats: dict = field(default_factory=dict)
    logprobs: list[list[float]] | None = None   # generate(logprobs=True): one per generated token


class SpeculativeDecoder:
    """Generate text with a target model, speculatively proposed by a smaller draft model.

    Args:
        target, draft: model folders (`specsample convert` output, optimum or ONNX Runtime GenAI builder
            exports: README "Your own models"); default: the embedded pair models/stdlib-code/{target,draft}.
            draft="ngram": no draft model; each round proposes what followed the most recent earlier
            occurrence of the request's last ngram_max..ngram_min tokens (prompt lookup,
            specsample_cupy/decode/ngram.py), verified exactly as one-hot drafts (verify() with
            draft_logits=None). On the device loop the proposals are a kernel over the device's
            sequences (kernels_cu/ngram.cu), no host round-trip.
        ngram_min, ngram_max: the suffix lengths prompt lookup tries, longest first.
        device: "cuda" (CuPy + onnxruntime-gpu; logits and caches stay on the GPU) or "cpu" (NumPy);
            default "cuda" when usable, else "cpu" with a RuntimeWarning.
        kv_slack: rolled-back cache columns tolerated before the cache is compacted (see KVCache).
        prefill_chunk: prompt tokens per model run while prefilling (bounds the prefill's logits buffer).
        cuda_graphs: on CUDA, run each model with fixed bindings over a full-capacity cache
            (sessions_static) when it has a position_ids input and no use_cache_branch input, and let
            ONNX Runtime replay its runs as CUDA graphs when its graph has no CPU nodes; other models,
            or False, rebind every run (sessions.DecoderSession).
        device_rounds: with fixed bindings, decode with the device loop (device_loop: every method,
            target-only too, bookkeeping on the GPU); False runs the host loop (host_loop), which
            is also what runs on the CPU and for models that rebind every run.
        cpu_threads: on the CPU, the threads each model run may use (None: ONNX Runtime's default,
            every core). Processes sharing a machine should split its cores between them.
        batch_layout: open a builder folder (whose graph decodes one prompt per call) through its
            conversion, made once into a cache folder (convert/cache.py), which batches; False: as it comes.

    One generate() at a time: a decoder keeps per-call buffers, so a second call from another thread
    while one runs raises RuntimeError (use one decoder per thread).

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
    ngram = None   # (ngram_min, ngram_max) when draft="ngram"

    def __init__(self, target=None, draft=None, device: str | None = None, *, kv_slack: int = 32,
                 prefill_chunk: int = 256, device_id: int = 0, cuda_graphs: bool = True,
                 device_rounds: bool = True, ngram_min: int = 1, ngram_max: int = 4,
                 cpu_threads: int | None = None, batch_layout: bool = False):
        self.cpu_threads = cpu_threads
        self.target_spec = ModelSpec.from_dir(opened_folder(target, "target", batch_layout))
        self.ngram = None
        if isinstance(draft, str) and draft == NGRAM:
            check_ngram_range(ngram_min, ngram_max)
            self.ngram, self.draft_spec = (ngram_min, ngram_max), None
        else:
            self.draft_spec = ModelSpec.from_dir(opened_folder(draft, "draft", batch_layout))
            check_pair(self.target_spec, self.draft_spec)
        self._use_device(device, device_id)
        self.target = open_session(self, self.target_spec, "target", device_id, cuda_graphs)
        self.draft = None if self.ngram else open_session(self, self.draft_spec, "draft", device_id, cuda_graphs)
        self.tokenizer = self.target_spec.tokenizer
        specs = (self.target_spec,) if self.ngram else (self.target_spec, self.draft_spec)
        contexts = [s.context_length for s in specs if s.context_length]
        self.context_length = min(contexts) if contexts else None
        self.kv_slack, self.prefill_chunk = kv_slack, prefill_chunk
        self.device_rounds = device_rounds

    def _on_stream(self):
        return self.stream if self.stream is not None else contextlib.nullcontext()

    def upload(self, host: np.ndarray):
        """A small host array on the device, for the work enqueued after it on the decoder's stream:
        copied asynchronously from page-locked memory (pinned.PinnedRing; a copy from pageable memory
        may wait for the stream's earlier work). On the CPU, the array itself."""
        if self.stream is None:
            return host
        return self.uploads.upload(host, self.stream)

    def encode_prompts(self, prompts) -> list[list[int]]:
        """Token ids per prompt. An empty prompt starts from the model's BOS token, or is refused
        (ValueError) when the model has none."""
        return self.check_prompt_ids([self.target_spec.encode(p) for p in prompts])

    def check_prompt_ids(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        """The prompts' ids, an empty one given the model's BOS token (ValueError without one, or for a
        prompt that leaves the context no room to generate)."""
        bos = self.target_spec.bos_token_id
        for i, ids in enumerate(prompt_ids):
            if not ids:
                if bos is None:
                    raise ValueError(f"prompt {i} is empty and the model has no BOS token to start from")
                ids.append(int(bos))
            if self.context_length and len(ids) >= self.context_length:
                raise ValueError(f"prompt {i} has {len(ids)} tokens; the models' context holds "
                                 f"{self.context_length}, leaving no room to generate")
        return prompt_ids

    def _use_device(self, device, device_id):
        """Pick the device; on CUDA, the one non-default stream every session and array shares."""
        self.device = _pick_device(device)
        self.xp = array_module(self.device)
        self.cuda_graphs = {}   # role -> True, or why the model runs without CUDA graphs
        self._events = []   # the loops' reusable CUDA events
        self.uploads = PinnedRing(UPLOAD_SLOTS)   # upload()'s page-locked slots, shared by both loops
        self._round_buffers = {}   # device_loop's buffers and launches, per shape
        self._model_costs = {}     # device_loop's calibrated per-round model costs, per plan
        self._auto_memory = {}     # gamma="auto": what calls measured, per (method, temperature, batch)
        self._busy = threading.Lock()   # held by the generate() that runs
        self.device_rounds = True
        self.stream = None
        if self.device == "cuda":
            import cupy
            cupy.cuda.Device(device_id).use()
            self.stream = cupy.cuda.Stream(non_blocking=True)

    def generate(self, prompts=None, max_new_tokens: int = 64, gamma: int | str = 5, method: str = "exact",
                 temperature: float | None = None, seed: int | None = 0, adaptive_gamma: bool = False,
                 gamma_min: int = 1, gamma_max: int = 12, ignore_eos: bool = False, on_tokens=None, on_round=None,
                 stop=(), top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                 logprobs: bool = False, seeds=None, prompt_ids=None, settings=None) -> GenerationOutput:
        """Continue each prompt by up to max_new_tokens tokens (fewer after an EOS or the context's end).

        Args:
            settings: a specsample_cupy.SamplingSettings holding the sampling arguments below (method,
                gamma and its bounds, temperature, seed, truncation, stop, max_new_tokens, logprobs,
                ignore_eos); given, it replaces them (the keyword arguments are the same settings
                spelled out).
            prompts: a string or a list of B strings (any lengths; batched with left padding; a pair that
                decodes one prompt per call runs them one after another: decode/one_at_a_time.py).
            prompt_ids: instead of prompts, the prompts as token ids: a list of B lists of ints (or one
                list of ints); ids outside the vocabulary are a ValueError.
            gamma: draft tokens proposed per round; 0 (or method="target") decodes with the target alone;
                "auto" picks each round's gamma in [gamma_min, gamma_max] that maximises expected tokens
                per second from the measured acceptance and per-run costs (gamma_policy.AutoGamma),
                starting from what earlier calls with the same method, temperature and batch size
                measured; when those say target-only decoding is faster, the call runs target-only
                (stats["auto_target_only"]), speculating again every gamma_policy.REPROBE-th call.
            method: "exact", "sigmoid", "sigmoid-paper", "baseline" or "greedy" (see verify()), or
                "target".
            temperature: sampling temperature of both models; 0 is greedy; None (the default): 1, or 0
                for method "greedy", which refuses any other value (ValueError; call_args.py says why).
            seed: the call's base seed: request i draws from its own random stream, keyed by
                seeds.request_seed(seed, i) (request 0 by seed itself), so identical prompts draw
                independent samples and a request's tokens do not depend on the others of the call (up
                to float near-ties of batched model runs; method "baseline" draws from one generator for
                the call). None draws a base seed from the operating system. stats["seed"] holds the
                base and stats["seeds"] each request's seed: generate([prompt], seed=stats["seeds"][i])
                reproduces request i alone. The same seeds give the same tokens on CPU and GPU (up to
                float near-ties).
            seeds: optional, one entry per request: its own seed (an int, which wins over the derived
                one), or None to derive it from seed and its index.
            adaptive_gamma: after each round gamma += 2 if every request accepted all its drafts, else
                gamma -= 1, clipped to [gamma_min, gamma_max] (Hugging Face's heuristic).
            ignore_eos: generate exactly max_new_tokens per request (benchmarks: equal work).
            on_tokens: optional callback(request_index, new_ids) called as tokens are taken.
            on_round: optional callback(round: decode_stats.Round, requests: Requests) after each round
                the host reads; it may return request indices to finish now (finish_reason "stop").
            stop: a string or strings; a request whose generated text contains one ends there
                (finish_reason "stop"; its text is cut before the stop string, its token_ids end with
                the token that completed it; specsample_cupy/decode/stop_strings.py).
            top_k, top_p, min_p: truncated sampling of both models (verify()'s rule: Hugging Face's
                order, ties kept; None = off); methods "exact", "greedy" and "target".
            logprobs: also return out.logprobs, per request the log-probability of each generated
                token under the (truncated) target distribution it was drawn from (greedy: log
                softmax at temperature 1).

        Returns GenerationOutput(texts, token_ids, finish_reasons, stats); stats holds rounds, proposed,
        accepted, acceptance_rate (accepted / proposed drafts), mean_accepted_per_round (per request),
        gamma / final_gamma / mean_gamma, generated_tokens, tokens_per_s, wall_s (from the call until
        the texts are ready), model_time_s and verify_time_s (GPU time of the model runs and verify()
        alone, CUDA events; None when time_model_runs is off), prefill_model_time_s,
        verify_times_s (each round's), host_overhead_per_round_s (wall - model - verify, per round),
        loop ("device" or "host"), device_rounds (True, or why the host loop ran), discarded_rounds,
        read_wait_per_round_s, kv_compactions, cuda_graphs, seed and seeds.
        """
        if settings is not None:
            return self.generate(prompts, on_tokens=on_tokens, on_round=on_round, seeds=seeds, prompt_ids=prompt_ids,
                                 **settings.generate_kwargs())
        policy_mode = "auto" if gamma == "auto" else ("adaptive" if adaptive_gamma else "fixed")
        gamma_arg, gamma = gamma, (4 if gamma == "auto" else gamma)
        self._check(method, temperature, max_new_tokens, gamma)
        temperature = resolve_temperature(method, temperature)
        truncation = self._check_truncation(method, temperature, logprobs, top_k=top_k, top_p=top_p, min_p=min_p)
        stops = check_stop_strings(stop)
        if (prompts is None) == (prompt_ids is None):
            raise ValueError("pass prompts (text) or prompt_ids (token ids), one of them")
        if prompt_ids is not None:
            prompts = self.check_prompt_ids(token_id_prompts(prompt_ids, self.target.vocab_size))
        else:
            prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts:
            raise ValueError("no prompts given")
        base_seed, request_seeds = resolve_seeds(seed, seeds, len(prompts))
        if method == "baseline" and gamma > 0:
            request_seeds = None   # verify()'s baseline draws from one generator for the call, not per request
        speculative = method != "target" and gamma > 0
        reason = one_prompt_reason(self, speculative) if len(prompts) > 1 else None
        if reason is not None:   # a pair that decodes one prompt per call: each prompt a call of its own
            return GenerationOutput(*generate_each(
                self, prompts, encoded=prompt_ids is not None, base_seed=base_seed, request_seeds=request_seeds,
                reason=reason, on_tokens=on_tokens, on_round=on_round,
                kwargs=dict(max_new_tokens=max_new_tokens, gamma=gamma_arg, method=method, temperature=temperature,
                            adaptive_gamma=adaptive_gamma, gamma_min=gamma_min, gamma_max=gamma_max,
                            ignore_eos=ignore_eos, stop=stop, top_k=top_k, top_p=top_p, min_p=min_p,
                            logprobs=logprobs)))
        # Automatic gamma starts from what earlier calls of this kind measured, and may run target-only.
        memory = self._auto_memory.setdefault((method, float(temperature), len(prompts)), {"calls": 0}) \
            if policy_mode == "auto" and speculative else None
        if memory is not None:
            memory["calls"] += 1
            speculative = not memory.get("target_only") or memory["calls"] % REPROBE == 0
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("this SpeculativeDecoder is already generating (in another thread): a decoder "
                               "runs one generate() at a time; use one decoder per thread")
        try:
            wall_start = time.perf_counter()
            # Set-up: the requests' state, the gamma policy, both caches.
            policy = make_policy(gamma if speculative else 0, policy_mode, gamma_min, gamma_max,
                                 temperature=0.0 if method == "greedy" else temperature,
                                 expected=method == "exact" and not truncation and self.draft is not None)
            req = self._requests(prompts, max_new_tokens, policy.cap, ignore_eos, encoded=prompt_ids is not None)
            sessions = call_sessions(self, speculative)
            clock = Clock(self.stream, self._events)
            with self._on_stream():
                caches = new_caches(self, req, sessions, policy.cap)
                # Prefill: every prompt but its last token, through every model of the call.
                with timed_runs(sessions, clock, "prefill"):
                    self._prefill(list(zip(sessions, caches)), req)
                # Rounds, until every request has finished.
                rounds, why_not_device = call_rounds(self, req, caches, policy, method, temperature, base_seed,
                                                     request_seeds, clock,
                                                     (memory or {}).get("state") if speculative else None,
                                                     truncation, logprobs)
                assembler = TextAssembler(self.tokenizer, req.batch, incremental=why_not_device is None)
                stopper = StopStrings(stops, self.tokenizer, req.batch) if stops else None
                totals = Totals()
                with timed_runs(sessions, clock) if self.time_model_runs else contextlib.nullcontext():
                    for rnd in rounds:
                        totals.add(rnd)
                        self._deliver(rnd, req, assembler, on_tokens)
                        finish = list(on_round(rnd, req) or ()) if on_round is not None else []
                        if stopper is not None:
                            finish += stopper.after_round(rnd, assembler.current)
                        if finish:
                            rounds.finish(finish)
                if self.stream is not None:
                    self.stream.synchronize()   # a discarded round may still run
            if memory is not None and speculative:
                memory.update(state=policy.state(), target_only=policy.prefers_target_only())
            texts = [assembler.text(b) for b in range(req.batch)]
            token_ids = [req.generated(b) for b in range(req.batch)]
            if stopper is not None:
                stopper.cut(texts, token_ids)
            kept_logprobs = [lp[:len(ids)] for lp, ids in zip(rounds.logprobs, token_ids)] if logprobs else None
            wall_s = time.perf_counter() - wall_start   # the stats' own readout below is not decoding time
            stats = decode_stats.stats(
                method=method, speculative=speculative, device=self.device, req=req, totals=totals, clock=clock,
                timed=self.time_model_runs, wall_s=wall_s, loop="device" if why_not_device is None else "host",
                extra={"device_rounds": True if why_not_device is None else why_not_device,
                       "auto_target_only": memory is not None and not speculative,
                       "discarded_rounds": rounds.discarded, "gamma_mode": policy_mode,
                       "read_wait_per_round_s": rounds.read_wait_s / max(totals.rounds, 1),
                       "kv_compactions": sum(c.compactions for c in caches), "cuda_graphs": dict(self.cuda_graphs),
                       "seed": base_seed, "seeds": request_seeds})
            return GenerationOutput(texts, token_ids, [req.finish_reason(b) for b in range(req.batch)], stats,
                                    kept_logprobs)
        finally:
            self._busy.release()

    def generate_stream(self, requests, batch_size: int = 8, gamma: int = 5, method: str = "exact",
                        ignore_eos: bool = False, stop=(), top_k: int | None = None, top_p: float | None = None,
                        min_p: float | None = None, logprobs: bool = False, seed: int | None = 0, settings=None):
        """Continuous batching: decode a queue of requests with at most batch_size in flight, a finished
        request's row taking the next one between rounds (specsample_cupy/decode/continuous.py).

        Args:
            requests: prompts (str) or continuous.StreamRequest(prompt, max_new_tokens, temperature,
                seed), each with its own settings; a request without a seed gets the one generate()
                would give it at its index: seeds.request_seed(seed, index).
            gamma: a fixed gamma (an int >= 0; 0 or method="target" decodes with the target alone);
                "auto" and adaptive gamma are refused (ValueError).
            method: as generate(), except "baseline" (ValueError: its numbers follow no request).
            ignore_eos, stop, top_k, top_p, min_p: as generate(), for every request.
            logprobs: as generate(): each FinishedRequest's .logprobs, one per token of its token_ids.
            seed: the call's base seed (None: drawn from the operating system; .stats["seed"]).
            settings: a specsample_cupy.SamplingSettings in place of the arguments above but batch_size.

        Returns an iterator (continuous.StreamResults) of continuous.FinishedRequest(index, text,
        token_ids, finish_reason, stats, logprobs), one per request as it finishes (index: its position in
        `requests`); its .stats counts the call's rounds and refills so far, and says which loop ran
        ("loop": "device" on CUDA with CUDA graphs, as generate(), else "host"). Each request gets the
        tokens generate([prompt], max_new_tokens, gamma, method, temperature, seed=its seed, ...) gives
        it alone (its seed: FinishedRequest.stats["seed"]) (up to float near-ties of batched model runs): its
        random numbers are its own
        (verify()'s streams). Arguments are checked at the call; the decoder is busy (RuntimeError
        for another call) until the iterator is exhausted or closed.

        Example:
            >>> reqs = [StreamRequest("def f(x):", max_new_tokens=n, seed=n) for n in (16, 64, 200)]
            >>> for out in dec.generate_stream(reqs, batch_size=2, gamma=4):
            ...     print(out.index, out.finish_reason, out.text)
        """
        from specsample_cupy.decode.continuous import decode_stream
        if settings is not None:
            return self.generate_stream(requests, batch_size, **settings.stream_kwargs())
        truncation = {"top_k": top_k, "top_p": top_p, "min_p": min_p}
        return decode_stream(self, requests, batch_size, gamma=gamma, method=method, ignore_eos=ignore_eos,
                             stop=stop, truncation=truncation, logprobs=logprobs,
                             seed=random_base_seed() if seed is None else seed)

    def _check(self, method, temperature, max_new_tokens, gamma):
        """ValueError for a bad method, gamma or budget (call_args.check_call); the temperature is
        resolved apart (call_args.resolve_temperature)."""
        check_call(method, max_new_tokens, gamma, ngram=bool(self.ngram))

    def _check_truncation(self, method, temperature, logprobs, **truncation):
        """The active top_k / top_p / min_p (validated by verify()'s rules), as keyword arguments."""
        return check_truncation(method, temperature, logprobs, self.target.vocab_size, **truncation)

    def _requests(self, prompts, max_new_tokens, gamma_cap, ignore_eos, encoded: bool = False) -> Requests:
        """encoded: prompts are token ids, already checked."""
        prompt_ids = prompts if encoded else self.encode_prompts(prompts)
        context = self.context_length or 1 << 62
        budgets = np.array([min(max_new_tokens, context - len(p)) for p in prompt_ids])
        eos = () if ignore_eos else self.target_spec.eos_token_ids
        return Requests(prompt_ids, budgets, self.target_spec.pad_token_id, eos, extra=gamma_cap + 2,
                        max_new_tokens=max_new_tokens)

    def _deliver(self, rnd, req, assembler, on_tokens):
        """Hand a round's new tokens to the text assembler and the caller's callback; finish the texts
        of requests that the round finished."""
        for b in np.flatnonzero(rnd.taken).tolist():
            n = int(rnd.taken[b])
            new_ids = req.seq[b, req.seq_len[b] - n:req.seq_len[b]].tolist()
            assembler.add(b, new_ids)
            if on_tokens is not None:
                on_tokens(b, new_ids)
        if not req.finished.all():
            for b in np.flatnonzero(rnd.active & req.finished).tolist():
                assembler.text(b)

    def _prefill(self, runs, req: Requests, only=None):
        """Feed each prompt but its last token to every (session, cache) of `runs`, chunk by chunk; every
        round starts by feeding the last token so far. The caches start empty and take the same columns,
        so each chunk's feeds are built once, and the models' runs alternate. only: [B] bool, the rows
        to prefill (rows that start over while the others keep their caches); default all."""
        for columns in req.prefill_chunks(runs[0][1].n_real, self.prefill_chunk, only):
            for session, cache in runs:
                session.forward(cache, *columns, prefill=True)
