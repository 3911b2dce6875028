"""verify(): the verification step of speculative sampling, on CuPy (GPU kernels) or NumPy (CPU reference)."""
import numpy as np

from specsample_cupy.runtime.philox import PURPOSE_RESIDUAL
from specsample_cupy.verification.inputs import FLOAT_DTYPES  # noqa: F401  (api.FLOAT_DTYPES, where it always was)
from specsample_cupy.verification.inputs import (array_module_of, as_float, bf16_to_f32, check_seed, check_shapes,
                                                 check_streams, float_dtype_name)
from specsample_cupy.verification.result import VerifyResult  # noqa: F401  (api.VerifyResult)
from specsample_cupy.verification.truncation import (MinPWarps, check_warps, make_warps, off_warps, per_request,
                                                     warp_request_rows)

# "sigmoid-paper" is method="sigmoid" with sigmoid_variant="paper" (one name for tables and the CLI).
METHODS = ("exact", "sigmoid", "sigmoid-paper", "baseline", "greedy")
SAMPLING_ONLY = ("sigmoid", "sigmoid-paper", "baseline")   # no greedy mode: temperature must be > 0
ONEHOT_METHODS = ("exact", "greedy")                        # accept draft_logits=None (one-hot drafts)
WARP_METHODS = ("exact", "greedy")                          # accept top_k / top_p / min_p
# The paper's released code: sigmoid((z + 10000) / 20000).
SIGMOID_OFFSET, SIGMOID_SCALE = -10000.0, 20000.0
# method="sigmoid": "softmax-bonus" (the default: the bonus token exactly from softmax) or "paper"
# (the paper's released code as written); cpu_numpy.reference_verify states both rules.
SIGMOID_VARIANTS = ("softmax-bonus", "paper")


def verify(draft_tokens, draft_logits, target_logits, *, method="exact", temperature=1.0, seed=0,
           offset=0, draft_lengths=None, probs=False, sigmoid_offset=SIGMOID_OFFSET,
           sigmoid_scale=SIGMOID_SCALE, sigmoid_variant="softmax-bonus", logits_dtype=None, plan=None,
           top_k=None, top_p=None, min_p=None, warps=None, logprobs=False, streams=None,
           _race_purpose=PURPOSE_RESIDUAL):
    """Verify gamma draft tokens per request against the target model.

    Args:
        draft_tokens: [B, gamma] int32/int64, the draft's proposals.
        draft_logits: [B, gamma, V] float32/float16/bfloat16, the draft's logits at those positions
            (float64 is converted to float32: a copy, the kernels compute in float32);
            or None for a deterministic drafter (e.g. n-gram lookup): the draft distribution is
            one-hot at the proposed token, so x_i is accepted iff u_i <= p_i(x_i), a rejection
            at n samples p_n without x_n (renormalised), and only the gamma + 1 target rows are
            read. Methods "exact" and "greedy" only.
        target_logits: [B, gamma+1, V], same dtype, the target's logits (one more position).
        method: "exact" (fused kernel, exact in distribution), "sigmoid" / "sigmoid-paper" (the
            latter is sigmoid_variant="paper") (the paper's element-wise
            sigmoid in place of softmax; approximate), "baseline" (op-by-op, as Hugging Face
            assisted generation), "greedy" (accept while the draft is the target's argmax).
        temperature: scalar or [B] float array; divides both models' logits (see "Temperature 0").
        seed, offset: key the Philox random numbers (ints, or one-element int64 CuPy arrays so a
            captured CUDA graph can be replayed with new values; call verify() once with the same
            shapes on the same stream before capturing, so its launch plan and workspace exist).
            Use a new offset every step. Request b draws at Philox request word b, so its numbers
            depend on its row (see streams). seed=None: a seed drawn from the operating system (each
            call: not reproducible).
        streams: None, or per-request random streams: a [B, 2] int64 array of the logits' module,
            streams[b] = (seed_b, offset_b). Request b then draws exactly the numbers that a call
            with one request (row 0), seed=seed_b and offset=offset_b draws (Philox key seed_b,
            offset word offset_b mod 2^32, request word 0), whatever its row and the other rows;
            seed and offset are ignored. A request that keeps its own seed and counts its own steps
            in offset_b gets the same tokens decoded alone or in any batch (continuous batching
            refills rows with new requests between rounds). The kernels read it when they run
            (CUDA-graph replays see new values). Not with method "baseline" (ValueError), whose
            numbers come from a stateful generator.
        draft_lengths: None or [B] int array; request b verifies only its first draft_lengths[b]
            drafts (0..gamma), later positions are ignored.
        probs: the two arrays already hold probabilities (temperature must be the scalar 1).
        sigmoid_offset, sigmoid_scale: p~ = sigmoid((z - offset) / scale) for method="sigmoid".
        sigmoid_variant: method="sigmoid" only. Both accept draft i while u * q~(x_i) <= p~(x_i)
            (no softmax statistics). "softmax-bonus" (default):
            at the first rejection sample from max(0, p~ - q~) (normalised), and when every draft
            is accepted draw the bonus token exactly from softmax(z / T). "paper": the paper's
            released code (speculative_sampling_fp32_sigmoid.cu) as written: p~ is 0 below and 1
            above the window (z - offset) / scale in [0, 1]; a rejection samples in proportion to
            max(1e-5, max(0, p~ - q~) / (1e-6 + its sum)), the bonus token in proportion to
            max(1e-5, z / T) (the raw logits, not a softmax). Both are approximations: with the
            default offset and scale p~ / q~ is within a few 1e-4 of 1, so nearly every draft is
            accepted and the output follows the draft's distribution, not the target's.
        logits_dtype: "bfloat16" to read uint16 arrays as bfloat16 (CuPy has no bfloat16 dtype).
        plan: None or a specsample_cupy.kernels.PlanOptions: explicit launch-plan parameters of the
            CuPy kernels (tuning, tests, line info for compute-sanitizer); the result does not
            depend on them except through the vocabulary slicing's float rounding. Ignored by
            NumPy inputs and by method="baseline".
        top_k, top_p, min_p: None, a scalar or a [B] array each; truncated sampling of both models'
            rows of request b (one-hot drafts: the target's rows only), in Hugging Face's order:
            temperature, top-k, top-p (mass within the top-k set), min-p. With M = max z and
            d = float32(M - z) per row, an entry is kept iff d <= dmax, the smallest of: the k-th
            smallest d (top_k: int >= 0, 0 or >= V = off); the first d, ascending, at which the
            cumulative softmax(z / T) mass over the top-k set reaches top_p of it (top_p in (0, 1],
            1 = off); float32(-T ln(min_p)) (min_p in [0, 1], 0 = off: p >= min_p * p_max).
            Ties at a threshold are kept. Exactness then holds for the warped distributions
            (softmax(z / T) over the kept entries, renormalised). Greedy requests ignore them.
            Methods "exact" and "greedy" with logits only (active warps with probs=True or
            another method raise ValueError); a bad value raises ValueError naming the argument.
            specsample_cupy/verification/truncation.py states the rule in full.
        warps: (advanced) None, or the truncation prebuilt by specsample_cupy.warps.build_warps(xp, B,
            V, temperature, top_k=..., top_p=..., min_p=...) with this call's B, V and temperature:
            the same result as passing those top_k / top_p / min_p, without validating and (CuPy)
            uploading them again on every call of a loop. Not with top_k / top_p / min_p
            (ValueError). Only its arrays' module, shape and dtype are checked, not that it was built
            for this temperature (min-p's span includes it).
        logprobs: also return VerifyResult.logprobs [B, gamma+1] float32, the log-probability of each
            emitted token under the target distribution it was drawn from (truncated, at the request's
            temperature; greedy requests: log softmax at temperature 1), -inf padding like tokens.
            Methods "exact" and "greedy". On CuPy it runs kernels_cu/warp_rows.cu for the rows'
            statistics, as truncation does.

    Returns:
        VerifyResult(accepted [B], tokens [B, gamma+1], emitted [B], error [B]), int32 arrays of
        the input's module. CuPy: enqueued on the current stream with no host synchronisation.

    Bad requests (the same for every method, on NumPy and on CuPy). A value problem in one request
    never raises and never yields a token: verify() returns, for every request b, error[b] = the OR
    of the specsample_cupy.errors codes below (0 when none), computed identically by the CPU
    reference and the kernels; a request with error[b] != 0 has accepted[b] = -1, emitted[b] = 0
    and tokens[b] all -1, and the other requests are unaffected. VerifyResult.check() (or
    errors.raise_if_any(result.error) on a host copy) raises ValueError naming the requests.
    With L = draft_lengths[b] clamped to [0, gamma], the rows checked ("active") are the target
    rows 0..L and, unless the request is greedy, the draft rows 0..L-1; nothing else is read.
        TARGET_VALUES / DRAFT_VALUES: an active row holds NaN or +Inf (probs=True: NaN, a
            negative value or +Inf).
        NO_MASS: an active row has no entry > -Inf (probs=True: no entry in (0, +Inf)); also when
            the final race finds no positive weight (float underflow of a sigmoid row).
        TOKEN_RANGE: one of draft_tokens[b, :L] is outside [0, V).
        LENGTH: draft_lengths[b] is outside [0, gamma] (the request is checked with L clamped).
        TEMPERATURE: a per-request temperature[b] is negative or not finite, or is 0 for
            "sigmoid" or "baseline" (no greedy mode); the request is checked at temperature 1.
    Argument errors raise at once on both backends: ValueError/TypeError naming the argument for
    shapes, dtypes, gamma mismatches, a bad scalar temperature (negative, not finite, or 0 for
    "sigmoid"/"baseline"), probs=True with a temperature other than the scalar 1, bad seed/offset
    or bad draft_lengths shape.

    Temperature 0. "exact": a scalar 0 makes every request greedy, temperature[b] = 0 request b
    (accept while the draft is the target's argmax, emit the target's argmax; its draft rows are
    not read). "greedy": every request is greedy whatever its temperature (a per-request value
    must still be finite and >= 0, else TEMPERATURE). "sigmoid", "baseline": a scalar 0 raises
    ValueError; temperature[b] = 0 sets TEMPERATURE for request b.

    Example:
        >>> res = verify(tok, q_logits, p_logits, temperature=0.8, seed=1, offset=step)
        >>> new_tokens = res.tokens[b, :res.emitted[b]]
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    method_arg = method
    if method == "sigmoid-paper":
        method, sigmoid_variant = "sigmoid", "paper"
    onehot = draft_logits is None
    # float64 logits (NumPy's default) are taken as float32, what the kernels and the reference compute in.
    draft_logits, target_logits = (a.astype(np.float32) if a is not None and a.dtype == np.float64 else a
                                   for a in (draft_logits, target_logits))
    if seed is None:
        from specsample_cupy.verification.seeds import random_base_seed
        seed = random_base_seed()
    if onehot and method not in ONEHOT_METHODS:
        raise ValueError(f"draft_logits=None (one-hot drafts) works with methods {ONEHOT_METHODS}, not {method!r}")
    xp = array_module_of(draft_tokens, target_logits) if onehot else array_module_of(draft_tokens, draft_logits, target_logits)
    check_shapes(draft_tokens, draft_logits, target_logits)
    dtype_name = float_dtype_name(target_logits, "target_logits", logits_dtype)
    if not onehot and float_dtype_name(draft_logits, "draft_logits", logits_dtype) != dtype_name:
        raise TypeError(f"draft_logits ({draft_logits.dtype}) and target_logits ({target_logits.dtype}) "
                        "must have the same dtype")
    B, G = draft_tokens.shape
    temps, temp_scalar = per_request(temperature, xp, B, "temperature", np.float32)
    if temps is None and not (np.isfinite(temp_scalar) and temp_scalar >= 0):
        raise ValueError(f"temperature must be finite and >= 0, got {temp_scalar}")
    lengths = None
    if draft_lengths is not None:
        lengths, scalar = per_request(draft_lengths, xp, B, "draft_lengths", np.int32)
        if lengths is None:
            raise TypeError("draft_lengths must be a [B] integer array")
    if probs and (temps is not None or temp_scalar != 1 or method == "sigmoid"):
        raise ValueError("probs=True needs temperature=1 and a method other than 'sigmoid'")
    if method in ("sigmoid", "baseline") and temps is None and temp_scalar == 0:
        raise ValueError(f"method={method!r} needs temperature > 0; use method='greedy'")
    if not sigmoid_scale > 0:
        raise ValueError(f"sigmoid_scale must be > 0, got {sigmoid_scale}")
    if sigmoid_variant not in SIGMOID_VARIANTS:
        raise ValueError(f"sigmoid_variant must be one of {SIGMOID_VARIANTS}, got {sigmoid_variant!r}")
    for arg, v in (("seed", seed), ("offset", offset)):
        check_seed(arg, v, xp)
    streams = check_streams(streams, xp, B, method)
    if warps is None:
        warps = make_warps(xp, B, target_logits.shape[2], temps, temp_scalar, top_k, top_p, min_p)
    elif top_k is not None or top_p is not None or min_p is not None:
        raise ValueError("pass top_k/top_p/min_p or prebuilt warps, not both")
    else:
        check_warps(warps, xp, B)
    if warps is not None and (probs or method not in WARP_METHODS):
        raise ValueError(f"top_k/top_p/min_p work with methods {WARP_METHODS} on logits, "
                         f"not method={method_arg!r}" + (" with probs=True" if probs else ""))
    if logprobs and method not in WARP_METHODS + ("greedy",):
        raise ValueError(f"logprobs=True works with methods {WARP_METHODS}, not method={method_arg!r}")
    if logprobs and probs:
        raise ValueError("logprobs=True needs logits (probs=False)")
    if plan is not None:
        from specsample_cupy.verification.kernel_launch import PlanOptions
        if not isinstance(plan, PlanOptions):
            raise TypeError(f"plan must be None or a specsample_cupy.kernels.PlanOptions, got {type(plan).__name__}")
    if method == "sigmoid":
        mode = "sigmoid-paper" if sigmoid_variant == "paper" else "sigmoid"
    else:
        mode = "probs" if probs else "logits"

    if draft_tokens.dtype.char not in "il":
        draft_tokens = draft_tokens.astype(xp.int64)
    draft_tokens, draft_logits, target_logits = (
        a if a is None or a.flags.c_contiguous else xp.ascontiguousarray(a)
        for a in (draft_tokens, draft_logits, target_logits))
    run = _verify_cpu if xp is np else _verify_gpu
    return run(draft_tokens, draft_logits, target_logits, lengths, temps, temp_scalar, dtype_name, method, mode,
               seed, offset, sigmoid_offset, sigmoid_scale, _race_purpose, plan, warps=warps, logprobs=logprobs,
               streams=streams)


def _onehot_rows(draft_tokens, target, mode):
    """One-hot drafts as rows the reference reads like any draft: logits 0 at x_i and -inf elsewhere
    (softmax at any temperature is exactly one-hot), or probabilities 1 and 0. Out-of-range ids are
    clipped here; they still set TOKEN_RANGE."""
    B, G = draft_tokens.shape
    V = target.shape[2]
    rows = np.full((B, G, V), 0.0 if mode == "probs" else -np.inf, np.float32)
    x = np.clip(draft_tokens, 0, V - 1)
    rows[np.arange(B)[:, None], np.arange(G)[None, :], x] = 1.0 if mode == "probs" else 0.0
    return rows


def _verify_cpu(draft_tokens, draft, target, lengths, temps, temp_scalar, dtype_name, method, mode,
                seed, offset, sigmoid_offset, sigmoid_scale, race_purpose, plan, warps=None, logprobs=False,
                streams=None):
    from specsample_cupy.verification.cpu_numpy import reference_verify
    B, G = draft_tokens.shape
    target = as_float(target, dtype_name)
    draft = None if draft is None else as_float(draft, dtype_name)
    lengths = np.full(B, G, np.int64) if lengths is None else lengths.astype(np.int64)
    temps = np.full(B, temp_scalar, np.float64) if temps is None else temps.astype(np.float64)
    if warps is not None and method != "greedy":
        # Warp the rows the reference may read (target 0..L, draft 0..L-1), then verify as usual:
        # exactness for the warped distributions is the plain rule applied to them.
        L = np.clip(lengths, 0, G)[:, None]
        target = warp_request_rows(target, temps, warps, np.arange(G + 1)[None, :] <= L)
        if draft is not None:
            draft = warp_request_rows(draft, temps, warps, np.arange(G)[None, :] < L)
    if draft is None:
        draft = _onehot_rows(draft_tokens, target, mode)
    if method == "baseline":
        from specsample_cupy.verification.baseline import baseline_verify
        return VerifyResult.from_arrays(np, *baseline_verify(
            draft_tokens, draft, target, lengths, temps, probs=mode == "probs", seed=seed))
    accepted, tokens, emitted, err = reference_verify(
        draft_tokens, draft, target, lengths, temps, mode=mode, seed=int(seed), offset=int(offset),
        race_purpose=race_purpose, sigmoid_offset=sigmoid_offset, sigmoid_scale=sigmoid_scale,
        greedy_all=method == "greedy", streams=streams,
        # Truncated sampling (and log-probabilities: the GPU reads them from the truncation's row
        # records) reads every active row, so it validates them all; else only the rows decided on.
        read_rows="all" if logprobs or (warps is not None and method != "greedy") else "decided")
    res = VerifyResult.from_arrays(np, accepted, tokens, emitted, err)
    if logprobs:
        greedy = (temps == 0) if method != "greedy" else np.ones(B, bool)
        res._logprobs = _emitted_logprobs(target, res.tokens, res.emitted, temps, greedy).ravel()
    return res


def _emitted_logprobs(target, tokens, emitted, temps, greedy):
    """[B, G+1] float32: log softmax(target[b, j] / T_b)[tokens[b, j]] for j < emitted[b] (greedy
    requests at T = 1), -inf elsewhere; target already truncated (-inf outside the kept set)."""
    B, G1 = tokens.shape
    out = np.full((B, G1), -np.inf, np.float32)
    b, j = np.nonzero(np.arange(G1)[None, :] < emitted[:, None])
    if b.size:
        t = np.where(greedy, 1.0, temps)[b][:, None]
        rows = target[b, j].astype(np.float64) / t
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            top = rows.max(-1, keepdims=True)
            lse = top[:, 0] + np.log(np.exp(rows - top).sum(-1))
        out[b, j] = rows[np.arange(b.size), tokens[b, j]] - lse
    return out


def _verify_gpu(draft_tokens, draft, target, lengths, temps, temp_scalar, dtype_name, method, mode,
                seed, offset, sigmoid_offset, sigmoid_scale, race_purpose, plan, warps=None, logprobs=False,
                streams=None):
    import cupy
    if method == "greedy":
        warps = None        # the argmax is always kept: greedy verification is unchanged
    B, G = draft_tokens.shape
    if logprobs and warps is None:   # the rows' statistics come from warp_rows.cu, with nothing truncated
        warps = off_warps(cupy, B)
    B, G = draft_tokens.shape
    if method == "baseline":
        from specsample_cupy.verification.baseline import baseline_verify
        lengths = cupy.full(B, G, cupy.int32) if lengths is None else lengths
        temps = cupy.full(B, temp_scalar, cupy.float32) if temps is None else temps
        if dtype_name == "bfloat16":
            draft, target = (bf16_to_f32(a) for a in (draft, target))
        return VerifyResult.from_arrays(cupy, *baseline_verify(draft_tokens, draft, target, lengths, temps,
                                                               probs=mode == "probs", seed=int(seed), xp=cupy))
    from specsample_cupy.verification import kernel_launch as kernels
    kmode = {"logits": kernels.MODE_LOGITS, "probs": kernels.MODE_PROBS, "sigmoid": kernels.MODE_SIGMOID,
             "sigmoid-paper": kernels.MODE_SIGMOID_PAPER}[mode]
    if warps is not None:
        # min-p alone is fused into the verifier's own pass (no log-probabilities: those come with
        # warp_rows.cu's row records); any other truncation runs warp_rows.cu first.
        kmode = kernels.MODE_MIN_P if isinstance(warps, MinPWarps) and not logprobs else kernels.MODE_WARPED
    out = lp = joint = None
    if logprobs:   # one allocation [result | log-probabilities]: a host loop reads both with one copy
        size = 3 * B + B * (G + 1)   # VerifyResult's layout
        joint = cupy.empty(size + B * (G + 1), cupy.int32)
        out, lp = joint[:size], joint[size:].view(cupy.float32)
    out = kernels.launch(draft_tokens, draft, target, dtype_name=dtype_name, lengths=lengths, temps=temps,
                         temp_scalar=temp_scalar, seed=seed, offset=offset, mode=kmode,
                         sigmoid_offset=sigmoid_offset, sigmoid_scale=sigmoid_scale, race_purpose=race_purpose,
                         greedy=method == "greedy", options=plan, warps=warps, streams=streams, out=out,
                         logprobs=lp)
    # launch() allocates its own output when `out` is not its size: then the two are apart.
    together = joint is not None and out.data.ptr == joint.data.ptr
    return VerifyResult(out, B, lp, joint if together else None)
