"""verify()'s device time against its P1 slicing: how many vocabulary slices each row is cut into
(PlanOptions.p1_sweeps) and so how many waves of the grid's resident blocks the P1 items fill.

The default plan cuts rows into as few items as the grid allows (at B = 64, gamma = 5, V = 151936:
one item per row, 704 items; an H200 holding four blocks per multiprocessor runs 528 at once, so
the items fill 1.33 waves). A memory-bound pass loses little
to a partial last wave (fewer blocks then get more bandwidth each); a pass bound by each block's own
speed (min-p's candidate lists) may lose up to a third. This prints, per dtype and p1_sweeps, the
slices per row, the waves and the median device µs (CUDA events, inputs rotated past L2), plain
exact next to min-p. --p2 also varies the P2 slicing (PlanOptions.p2_sweeps: sweeps per slice of the
emitted row, so how many blocks share its race; 0: the default), which at B = 1 decides how long the
race after the decision takes.

    python3 benchmarks/plan_sweep.py [--batch 64] [--vocab 151936] [--gamma 5] [--slices 0,2,3,4,6]
                                     [--p2 0] [--grid 0] [--methods exact,min_p] [--dtypes float32,float16] [--reps 30]
"""
import argparse

from specsample_cupy import verify
from specsample_cupy.bench.verify import device_seconds, make_inputs
from specsample_cupy.verification import kernel_launch as kernels
from specsample_cupy.verification.truncation import build_warps


def time_calls(cp, inputs, reps, **kw):
    """Median device seconds of verify() over `reps` calls queued behind a busy kernel."""
    for k in range(3):
        verify(*inputs.next(), method="exact", seed=1, offset=k, **kw).accepted.get()
    return device_seconds(cp, lambda k: verify(*inputs.next(), method="exact", seed=1, offset=k, **kw), reps,
                          per_call_s=400e-6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--slices", default="0,2,3,4,6", help="P1 slices per row to ask for (0: the default plan)")
    ap.add_argument("--p2", default="0", help="sweeps per P2 slice to ask for (0: the default plan)")
    ap.add_argument("--grid", default="0", help="blocks to launch (PlanOptions.grid; 0: the default plan's)")
    ap.add_argument("--methods", default="exact,min_p")
    ap.add_argument("--dtypes", default="float32,float16")
    args = ap.parse_args()
    import cupy as cp
    B, G, V = args.batch, args.gamma, args.vocab
    methods, modes = args.methods.split(","), []
    if "exact" in methods:
        modes.append(("exact", kernels.MODE_LOGITS, {}))
    if "min_p" in methods:   # the truncation is built once, as the decoding loop does
        modes.append(("min_p 0.05", kernels.MODE_MIN_P, {"warps": build_warps(cp, B, V, 1.0, min_p=0.05)}))
    print("| dtype | p1_sweeps | p2_sweeps | grid | method | slices per row | P1 items | waves | P2 slices "
          "| device µs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        inputs = make_inputs(cp, B, G, V, dtype)
        tokens, draft, target = inputs.next()
        per_row = -(-V // (kernels.THREADS * kernels.vec_width(dtype, V, draft, target)[1]))   # sweeps in a row
        for slices, p2, grid in ((int(s), int(p), int(g)) for s in args.slices.split(",")
                                 for p in args.p2.split(",") for g in args.grid.split(",")):
            sweeps = None if slices == 0 else -(-per_row // slices)
            plan = kernels.PlanOptions(p1_sweeps=sweeps, p2_sweeps=p2 or None, grid=grid or None)
            for name, mode, kw in modes:
                info = kernels.plan_info(tokens, draft, target, dtype_name=dtype, mode=mode, options=plan)
                items = B * (2 * G + 1) * info["S1"]
                seconds = time_calls(cp, inputs, args.reps, plan=plan, **kw)
                print(f"| {dtype} | {sweeps or 'auto'} | {p2 or 'auto'} | {grid or 'auto'} | {name} | {info['S1']} | "
                      f"{items} | {items / info['capacity']:.2f} | {info['S2']} | {seconds * 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    main()
