"""Where the host time of one verify() call goes (cProfile over many un-synchronised calls)."""
import cProfile
import pstats
import sys
import time

import cupy as cp

from specsample_cupy import verify

B, G, V = 1, 5, 32000
tokens = cp.zeros((B, G), cp.int32)
draft = cp.random.standard_normal((B, G, V), dtype=cp.float32)
target = cp.random.standard_normal((B, G + 1, V), dtype=cp.float32)
method = sys.argv[1] if len(sys.argv) > 1 else "exact"
for k in range(20):
    verify(tokens, draft, target, method=method, offset=k)
cp.cuda.Device().synchronize()
n = 2000
t0 = time.perf_counter()
for k in range(n):
    verify(tokens, draft, target, method=method, offset=k)
t1 = time.perf_counter()
cp.cuda.Device().synchronize()
print(f"{method}: host time per call {1e6 * (t1 - t0) / n:.1f} us (enqueue only)")
prof = cProfile.Profile()
prof.enable()
for k in range(n):
    verify(tokens, draft, target, method=method, offset=k)
prof.disable()
cp.cuda.Device().synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(14)
from specsample_cupy import kernels
print("direct driver launch:", all(p.func is not None for p in kernels._plans.values()))
