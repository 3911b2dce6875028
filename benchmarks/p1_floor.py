"""verify()'s P1 items at small batches: the plan sized by occupancy alone (PlanOptions(min_sweeps=1))
against the default (a floor of kernels.MIN_ITEM_ELEMENTS elements per P1 item where such items leave
half the grid free), plain exact (and min-p 0.05 at gamma = 5, B = 1 and 4), gamma 1/3/5/8, B 1..16,
V 32000/151936, float32/float16; three alternating medians of 20 calls each (CUDA events, inputs
rotated past L2), their middle one; prints a table and writes compact JSON.

    python3 benchmarks/p1_floor.py OUT.json
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cupy as cp  # noqa: E402
from plan_sweep import time_calls  # noqa: E402

from specsample_cupy.bench.verify import make_inputs  # noqa: E402
from specsample_cupy.verification import kernel_launch as kernels  # noqa: E402
from specsample_cupy.verification.truncation import build_warps  # noqa: E402

OLD = kernels.PlanOptions(min_sweeps=1)
rows = []
print("| dtype | V | gamma | B | pass | S1 old->new | old us | new us | new/old |")
for dtype in ("float32", "float16"):
    for V in (32000, 151936):
        for G in (1, 3, 5, 8):
            for B in (1, 2, 4, 8, 16):
                inputs = make_inputs(cp, B, G, V, dtype)
                tokens, draft, target = inputs.next()
                passes = [("plain", kernels.MODE_LOGITS, {})]
                if G == 5 and B in (1, 4):
                    passes.append(("min_p", kernels.MODE_MIN_P, {"warps": build_warps(cp, B, V, 1.0, min_p=0.05)}))
                for name, mode, kw in passes:
                    s_old = kernels.plan_info(tokens, draft, target, dtype_name=dtype, mode=mode, options=OLD)["S1"]
                    s_new = kernels.plan_info(tokens, draft, target, dtype_name=dtype, mode=mode, options=None)["S1"]
                    old, new = [], []
                    for _ in range(3):
                        old.append(time_calls(cp, inputs, 20, plan=OLD, **kw))
                        new.append(time_calls(cp, inputs, 20, **kw))
                    o, n = sorted(old)[1] * 1e6, sorted(new)[1] * 1e6
                    rows.append([dtype, V, G, B, name, s_old, s_new, round(o, 2), round(n, 2)])
                    print(f"| {dtype} | {V} | {G} | {B} | {name} | {s_old}->{s_new} | {o:.1f} | {n:.1f} | "
                          f"{n / o:.3f} |", flush=True)
json.dump({"cols": ["dtype", "V", "gamma", "B", "pass", "S1_old", "S1_new", "old_us", "new_us"], "rows": rows},
          open(sys.argv[1], "w"), separators=(",", ":"))
