"""Device time of the exact kernel for several caps on the sweeps per work item."""
import os

import cupy as cp

from specsample_cupy import bench_verify as bv
from specsample_cupy import kernels

for B, G, V, dtype in ((1, 5, 151936, "float32"), (64, 5, 151936, "float32"), (64, 5, 151936, "float16")):
    inputs = bv.make_inputs(cp, B, G, V, dtype)
    cells = []
    for cap in (8, 16, 32, 64, 128):
        os.environ["SPECSAMPLE_MAX_SWEEPS"] = str(cap)
        kernels._plans.clear()
        dev, wall = bv.time_method(cp, "exact", inputs, 30)
        gbps = bv.must_read_bytes("exact", B, G, V, cp.dtype(dtype).itemsize) / dev / 1e9
        cells.append(f"cap {cap}: {dev * 1e6:.1f} us {gbps:.0f} GB/s")
    print(f"B={B} V={V} {dtype}:", " | ".join(cells), flush=True)
