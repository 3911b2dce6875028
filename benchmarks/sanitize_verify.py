"""Small verify() calls over every mode and dtype, for compute-sanitizer (memcheck / racecheck).

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_verify.py [METHOD [DTYPE]]
Exits non-zero if a result differs from the NumPy reference.
"""
import sys

import cupy as cp
import numpy as np

from specsample_cupy import sample_tokens, verify

only_method = sys.argv[1] if len(sys.argv) > 1 else None
only_dtype = sys.argv[2] if len(sys.argv) > 2 else None
rng = np.random.default_rng(0)
bad = 0
for V in (37, 1024):
    for dtype in ("float32", "float16"):
        for method, probs in (("exact", False), ("exact", True), ("sigmoid", False), ("greedy", False)):
            if (only_method and method != only_method) or (only_dtype and dtype != only_dtype):
                continue
            B, G = 3, 4
            target = rng.normal(size=(B, G + 1, V)).astype(np.float32)
            draft = (0.8 * target[:, :G] + 0.3 * rng.normal(size=(B, G, V))).astype(np.float32)
            if probs:
                target = np.exp(target) / np.exp(target).sum(-1, keepdims=True)
                draft = np.exp(draft) / np.exp(draft).sum(-1, keepdims=True)
            tokens = rng.integers(0, V, (B, G)).astype(np.int32)
            lengths = np.array([0, 2, 4], np.int32)
            t16, d16 = target.astype(dtype), draft.astype(dtype)
            gpu = verify(cp.asarray(tokens), cp.asarray(d16), cp.asarray(t16), method=method, probs=probs,
                         seed=1, draft_lengths=cp.asarray(lengths))
            cpu = verify(tokens, d16.astype(np.float32), t16.astype(np.float32), method=method,
                         probs=probs, seed=1, draft_lengths=lengths)
            mismatch = (gpu.tokens.get() != cpu.tokens).any()
            print(f"V={V} {dtype} {method} probs={probs}: {'MISMATCH' if mismatch else 'ok'}", flush=True)
            bad += int(mismatch)
logits = rng.normal(size=(5, 300)).astype(np.float32)
bad += int((sample_tokens(cp.asarray(logits), seed=2).get() != sample_tokens(logits, seed=2)).any())
cp.cuda.Device().synchronize()
print(f"sanitize_verify: {bad} mismatching cases")
sys.exit(1 if bad else 0)
