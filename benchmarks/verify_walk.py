"""Exact verification in its two item orders (kernels_cu/verify.cu): every row at once, and the walk
that decides position after position and skips the rows past each request's first rejection.

Device µs per call (median of CUDA events over --reps calls queued behind a busy kernel, inputs
rotated past L2; bench verify's harness), gamma = 5, per dtype, V and B, on three kinds of drafts:
  random    uniformly random draft tokens (most requests reject at position 0);
  sampled   draft tokens sampled from q = softmax(draft logits), draft = 0.8 target + noise (the
            bench's logits; acceptance about what a fair draft model gets);
  accepted  draft logits equal to the target's (every draft accepted: the walk's worst case).
Each row also gives the mean accepted count. The walk is timed once per --sweeps value (PlanOptions.p1_sweeps:
sweeps of THREADS * VEC elements per P1 item, 0: the plan's); columns walk_c<sweeps>_us.

    python3 benchmarks/verify_walk.py [--batch 1,8,16,32,64] [--vocab 32000,151936] [--reps 30]
                                      [--sweeps 0] [--json FILE]
"""
import argparse
import json

import numpy as np

from specsample_cupy import verify
from specsample_cupy.bench import result_json
from specsample_cupy.bench.verify import device_seconds, drafts_ring
from specsample_cupy.verification import kernel_launch as kernels

G = 5
DRAFTS = ("random", "sampled", "accepted")


def measure(cp, ring, walk, reps, sweeps=0):
    plan = kernels.PlanOptions(walk=walk, p1_sweeps=sweeps or None)

    def call(k):
        return verify(*ring.next(), method="exact", seed=1, offset=k, plan=plan)
    accepted = float(np.mean([call(k).accepted.get().mean() for k in range(3)]))
    return device_seconds(cp, call, reps, per_call_s=400e-6) * 1e6, accepted


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="1,8,16,32,64")
    ap.add_argument("--vocab", default="32000,151936")
    ap.add_argument("--dtype", default="float32,float16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--sweeps", default="0", help="sweeps per P1 item to time the walk at (0: the plan's)")
    ap.add_argument("--json")
    args = ap.parse_args()
    import cupy as cp
    gpu = result_json.gpu_name()
    rows = []
    print(f"exact verification, gamma = {G}, {gpu}: device µs per call, all rows vs walk")
    walks = [int(c) for c in args.sweeps.split(",")]
    print("| dtype | V | B | drafts | mean accepted | all rows | "
          + " | ".join(f"walk, {c or 'plan'} sweeps" for c in walks) + " | all rows / walk |")
    print("|---|---|---|---|---|---|" + "---|" * (len(walks) + 1))
    for dtype in args.dtype.split(","):
        for V in (int(v) for v in args.vocab.split(",")):
            for B in (int(b) for b in args.batch.split(",")):
                for drafts in DRAFTS:
                    ring = drafts_ring(cp, B, G, V, dtype, drafts)
                    all_rows, accepted = measure(cp, ring, False, args.reps)
                    times = [measure(cp, ring, True, args.reps, c)[0] for c in walks]
                    row = dict(dtype=dtype, V=V, B=B, gamma=G, drafts=drafts, mean_accepted=round(accepted, 3),
                               all_rows_us=round(all_rows, 2))
                    row.update({f"walk_c{c}_us": round(t, 2) for c, t in zip(walks, times)})
                    rows.append(row)
                    print(f"| {dtype} | {V} | {B} | {drafts} | {accepted:.2f} | {all_rows:.1f} | "
                          + " | ".join(f"{t:.1f}" for t in times) + f" | {all_rows / min(times):.2f} |", flush=True)
                    del ring
                    cp.get_default_memory_pool().free_all_blocks()
    if args.json:   # one list per row under `columns`: the file stays small
        columns = list(rows[0])
        with open(args.json, "w") as f:
            json.dump(dict(gpu=gpu, gamma=G, reps=args.reps, unit="device µs per call", columns=columns,
                           rows=[[r[c] for c in columns] for r in rows]), f, separators=(",", ":"))


if __name__ == "__main__":
    main()
