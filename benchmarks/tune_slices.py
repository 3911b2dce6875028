"""Device time of the exact kernel over the work-item size cap and the P2 lag (env knobs)."""
import os

import cupy as cp

from specsample_cupy import bench_verify as bv
from specsample_cupy import kernels


def measure(inputs, B, G, V, dtype, cap, lag):
    os.environ["SPECSAMPLE_MAX_SWEEPS"] = str(cap)
    os.environ["SPECSAMPLE_LAG_WAVES"] = str(lag)
    kernels._plans.clear()
    dev, _ = bv.time_method(cp, "exact", inputs, 30)
    return dev, bv.must_read_bytes("exact", B, G, V, cp.dtype(dtype).itemsize) / dev / 1e9


for B, G, V, dtype in ((1, 5, 151936, "float32"), (1, 5, 256000, "float32")):
    inputs = bv.make_inputs(cp, B, G, V, dtype)
    dev, gbps = measure(inputs, B, G, V, dtype, 64, 1)
    print(f"B={B} V={V} {dtype}: {dev * 1e6:.1f} us", flush=True)
for B, G, V, dtype in ((64, 5, 151936, "float32"), (64, 5, 151936, "float16")):
    inputs = bv.make_inputs(cp, B, G, V, dtype)
    for cap in (32, 64, 128, 256):
        cells = []
        for lag in (0, 1, 2, 4):
            dev, gbps = measure(inputs, B, G, V, dtype, cap, lag)
            cells.append(f"lag {lag}: {dev * 1e6:.0f} us {gbps:.0f} GB/s")
        print(f"B={B} V={V} {dtype} cap {cap}:", " | ".join(cells), flush=True)
