"""Device time of kernels_cu/expected_accept.cu (auto gamma's expected acceptance: two launches of one
block per draft position and vocabulary slice) beside verify(method="exact") on the same rows, measured
as `bench verify` measures (CUDA events, calls queued behind a busy kernel). In the decode loop the kernel follows verify() on the rows
verify() has just read: "reused" times both on one input set (in the L2 where it fits: B * (2 gamma
+ 1) rows), "rotated" on input sets rotated through twice the L2 (read from HBM), for comparison.
Usage (GPU): python3 benchmarks/expected_accept.py [JSON_OUT]"""
import json
import sys

import cupy as cp
import numpy as np

from specsample_cupy.bench import result_json, verify as bv
from specsample_cupy.verification.expected_accept import ExpectedAcceptance


def expected_call(B, G, V, dtype):
    stream = cp.cuda.get_current_stream()
    run = ExpectedAcceptance(np.dtype(dtype).name, B, G, V, stream)
    lens = cp.full(B, G, cp.int32)
    out = cp.empty(B * G, cp.float32)

    def call(inputs):
        _, draft, target = inputs
        run(stream, target.data.ptr, draft.data.ptr, B, G, 1.0, lens.data.ptr, out.data.ptr)
    return call


def main(path=None):
    rows = []
    print("| dtype | V | B | γ | inputs | expected_accept µs | verify exact µs | ratio |\n|---|---|---|---|---|---|---|---|")
    for dtype in (np.float32, np.float16):
        for V in (32000, 151936):
            for B in (1, 4, 16):
                for G in (3, 5):
                    for where in ("reused", "rotated"):
                        ring = bv.make_inputs(cp, B, G, V, dtype, rotate_bytes=None if where == "rotated" else 1)
                        ea = expected_call(B, G, V, dtype)
                        for k in range(3):
                            ea(ring[k % len(ring)])
                            bv.call_verify("exact", ring[k % len(ring)], seed=1, offset=k)
                        t_ea = bv.device_seconds(cp, lambda k: ea(bv._next_input(ring, k)), 50)
                        t_v = bv.device_seconds(cp, lambda k: bv.call_verify("exact", bv._next_input(ring, k), seed=1,
                                                                             offset=k), 50)
                        row = {"dtype": np.dtype(dtype).name, "V": V, "B": B, "gamma": G, "inputs": where,
                               "expected_accept_us": round(t_ea * 1e6, 2), "verify_exact_us": round(t_v * 1e6, 2)}
                        rows.append(row)
                        print(f"| {row['dtype']} | {V} | {B} | {G} | {where} | {row['expected_accept_us']:.1f} | "
                              f"{row['verify_exact_us']:.1f} | {t_ea / t_v:.2f} |", flush=True)
    if path:
        with open(path, "w") as f:
            f.write(json.dumps({"device": result_json.gpu_name(0), "rows": rows},
                               separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
