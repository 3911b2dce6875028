"""Small verify() calls over every mode and dtype, for compute-sanitizer (memcheck / racecheck /
synccheck): clean requests, bad requests (NaN, all -Inf rows, ids out of range, bad lengths and
temperatures), and the default plan next to an oversubscribed and a one-block grid, every row at
once and in the walk order.

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_verify.py [--lineinfo] [METHOD [DTYPE]]
--lineinfo compiles the kernels with line information (source lines in the reports).
Exits non-zero if a result differs from the NumPy reference (tokens, accepted, emitted, error).
"""
import argparse
import sys

import cupy as cp
import numpy as np

from specsample_cupy import sample_tokens, verify
from specsample_cupy.verification.kernel_launch import PlanOptions

ap = argparse.ArgumentParser()
ap.add_argument("method", nargs="?")
ap.add_argument("dtype", nargs="?")
ap.add_argument("--lineinfo", action="store_true", help="compile with --generate-line-info")
args = ap.parse_args()
plans = [PlanOptions(lineinfo=args.lineinfo), PlanOptions(lineinfo=args.lineinfo, grid=1),
         PlanOptions(lineinfo=args.lineinfo, p1_sweeps=1, p2_sweeps=1, grid=1000),
         PlanOptions(lineinfo=args.lineinfo, p1_sweeps=16),   # long P1 slices (min-p: candidate lists)
         # the walk order (exact, probabilities, greedy; the other modes ignore it)
         PlanOptions(lineinfo=args.lineinfo, walk=True), PlanOptions(lineinfo=args.lineinfo, walk=True, grid=1),
         PlanOptions(lineinfo=args.lineinfo, walk=True, p1_sweeps=1, p2_sweeps=1, grid=1000)]
rng = np.random.default_rng(0)
bad = 0
for V in (37, 1024):
    for dtype in ("float32", "float16"):
        for method, probs in (("exact", False), ("exact", True), ("sigmoid", False), ("sigmoid-paper", False),
                              ("greedy", False), ("greedy", True), ("exact-onehot", False),
                              ("exact-warped", False), ("exact-min-p", False)):
            if (args.method and method != args.method) or (args.dtype and dtype != args.dtype):
                continue
            B, G = 6, 4
            target = rng.normal(size=(B, G + 1, V)).astype(np.float32)
            draft = (0.8 * target[:, :G] + 0.3 * rng.normal(size=(B, G, V))).astype(np.float32)
            if probs:
                target = np.exp(target) / np.exp(target).sum(-1, keepdims=True)
                draft = np.exp(draft) / np.exp(draft).sum(-1, keepdims=True)
            tokens = rng.integers(0, V, (B, G)).astype(np.int32)
            lengths = np.array([0, 2, 4, 4, 4, 5], np.int32)      # request 5: LENGTH
            target[3, 1, 5] = np.nan                               # TARGET_VALUES
            draft[4] = 0.0 if probs else -np.inf                   # NO_MASS (draft rows; greedy: none)
            tokens[2, 3] = V                                       # TOKEN_RANGE
            t16, d16 = target.astype(dtype), draft.astype(dtype)
            # The sigmoid methods with a steep sigmoid, so rejections (and their residual paths) happen.
            kw = dict(sigmoid_offset=0.0, sigmoid_scale=1.0) if method.startswith("sigmoid") else {}
            onehot = method == "exact-onehot"     # draft_logits=None: no draft rows read
            call = "exact" if method.startswith("exact") else method
            if method == "exact-warped":        # truncation: warp_rows.cu, then the warped mode
                kw = dict(top_k=5, top_p=0.9, min_p=0.05)
            if method == "exact-min-p":         # min-p alone: fused into verify.cu's P1
                kw = dict(min_p=np.float32([0.05, 0.3, 0.0, 0.1, 0.5, 0.2]))
            cpu = verify(tokens, None if onehot else d16.astype(np.float32), t16.astype(np.float32), method=call,
                         probs=probs, seed=1, draft_lengths=lengths, **kw)
            for plan in plans:
                gpu = verify(cp.asarray(tokens), None if onehot else cp.asarray(d16), cp.asarray(t16), method=call,
                             probs=probs,
                             seed=1, draft_lengths=cp.asarray(lengths), plan=plan,
                             **{k: cp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()})
                mismatch = any((getattr(gpu, f).get() != getattr(cpu, f)).any()
                               for f in ("tokens", "accepted", "emitted", "error"))
                print(f"V={V} {dtype} {method} probs={probs} grid={plan.grid}: {'MISMATCH' if mismatch else 'ok'}",
                      flush=True)
                bad += int(mismatch)
logits = rng.normal(size=(5, 300)).astype(np.float32)
bad += int((sample_tokens(cp.asarray(logits), seed=2).get() != sample_tokens(logits, seed=2)).any())
cp.cuda.Device().synchronize()
print(f"sanitize_verify: {bad} mismatching cases")
sys.exit(1 if bad else 0)
