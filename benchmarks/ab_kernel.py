"""Device time of `exact` at a few shapes for the kernel built with SPECSAMPLE_KERNEL_DEFINES
(run once per variant, in separate processes, and compare)."""
import os

import cupy as cp

from specsample_cupy import bench_verify as bv

label = os.environ.get("SPECSAMPLE_KERNEL_DEFINES") or "default"
cells = []
for B, G, V, dtype in ((1, 5, 32000, "float32"), (1, 5, 151936, "float32"), (1, 5, 256000, "float32"),
                       (64, 5, 151936, "float32"), (64, 5, 151936, "float16")):
    inputs = bv.make_inputs(cp, B, G, V, dtype)
    dev, _ = bv.time_method(cp, "exact", inputs, 40)
    cells.append(f"B={B} V={V} {dtype[-2:]}: {dev * 1e6:.1f}")
print(f"{label}: " + " | ".join(cells), flush=True)
