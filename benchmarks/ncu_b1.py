"""A few exact verify() calls at B = 1, gamma = 5, for `ncu` (kernel durations without launch or
event overheads):
    ncu --metrics gpu__time_duration.sum -k regex:verify python3 benchmarks/ncu_b1.py
"""
import cupy as cp

from specsample_cupy import bench_verify as bv
from specsample_cupy import verify

for V in (32000, 256000):
    tokens, draft, target = bv.make_inputs(cp, 1, 5, V, "float32")[0]
    for _ in range(3):
        verify(tokens, draft, target).tokens.get()
