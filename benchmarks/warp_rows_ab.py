"""warp_rows_kernel (kernels_cu/warp_rows.cu) of another git revision beside the working tree's, in one
process on the same inputs: device µs of each (median of REPS calls, CUDA events, queued behind a busy
kernel, inputs rotated past L2) and whether their row records agree; prints a table and writes JSON.

    python3 benchmarks/warp_rows_ab.py [--rev HEAD~1 | --other DIR] [--batch 1,64] [--dtype float32,float16]
                                       [--vocab 151936] [--gamma 5] [--reps 20] [--json F]

Each truncation is built once (build_warps), as the decoding loop does. The rows are bench verify's
(target logits N(0, 4)). The other revision's sources (warp_rows.cu and what it includes) come from
`git show REV:kernels_cu/...`, or from the folder --other (a copy of that revision's kernels_cu/, where
the tree travels without its git history: `mkdir -p .ab && git archive REV kernels_cu | tar -x -C .ab`,
then --other .ab/kernels_cu); the rest of the code from the working tree, so the two kernels take the
same arguments only between revisions that did not change them."""
import argparse
import json
import subprocess
from pathlib import Path

import numpy as np

SPECS = ({"top_p": 0.9}, {"top_k": 50}, {"min_p": 0.05}, {"top_k": 1000, "top_p": 0.95})


def git_reader(rev):
    return lambda name: subprocess.run(["git", "show", f"{rev}:kernels_cu/{name}"], capture_output=True, text=True,
                                       check=True).stdout


def folder_reader(folder):
    return lambda name: Path(folder, name).read_text()


def main():
    import cupy as cp

    from specsample_cupy.bench.verify import device_seconds, make_inputs
    from specsample_cupy.runtime.kernel_runtime import kernel_source
    from specsample_cupy.verification.warp_rows_launch import WARP_RECORD, WarpRows, vec_width
    from specsample_cupy.verification.truncation import build_warps

    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default="HEAD~1", help="the other revision, read with git")
    ap.add_argument("--other", help="the other revision's kernels_cu/ folder (instead of --rev)")
    ap.add_argument("--batch", default="1,64")
    ap.add_argument("--dtype", default="float32,float16")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    G, V = args.gamma, args.vocab
    label = args.other or args.rev   # the other revision's name in the table
    other = folder_reader(args.other) if args.other else git_reader(args.rev)
    sources = {label: kernel_source("warp_rows.cu", read=other), "tree": kernel_source("warp_rows.cu")}
    device = cp.cuda.Device().id
    stream = cp.cuda.get_current_stream()
    rows = []
    for dtype in args.dtype.split(","):
        tag, vec = vec_width(dtype, V)
        name = f"warp_rows_kernel<{tag}, {vec}>"
        kernels = {key: cp.RawModule(code=src, options=("--std=c++17",), name_expressions=[name]).get_function(name)
                   for key, src in sources.items()}
        for B in map(int, args.batch.split(",")):
            ring = make_inputs(cp, B, G, V, dtype)
            for spec in SPECS:
                warps = build_warps(cp, B, V, 1.0, **spec)
                err = cp.zeros(B, cp.int32)
                times, records = {}, {}
                for key, kern in kernels.items():
                    # verify()'s own launcher (warp_rows_launch.WarpRows), with this revision's kernel
                    record = cp.zeros(B * (2 * G + 1) * WARP_RECORD, cp.float32)
                    launch = WarpRows(tag, vec, B, G, V, device, err.data.ptr, record, kernel=kern)

                    def call(k, launch=launch, inputs=None):
                        _, draft, target = inputs or ring.next()
                        launch(stream, (draft.data.ptr, target.data.ptr, 0, 0, 1.0, 0), warps)
                    call(0)
                    times[key] = device_seconds(cp, call, args.reps, per_call_s=B * 25e-6) * 1e6
                    call(0, inputs=ring[0])
                    records[key] = record.get().reshape(-1, WARP_RECORD)
                old, new = records[label], records["tree"]
                row = {"dtype": dtype, "B": B, "spec": spec, "rev_us": round(times[label], 2),
                       "tree_us": round(times["tree"], 2), "rows": len(old),
                       "thresholds_equal": int((old[:, 4] == new[:, 4]).sum()),
                       "mass_rel_diff_max": float(np.max(np.abs(old[:, 1] - new[:, 1]) /
                                                         np.maximum(np.abs(old[:, 1]), 1e-30)))}
                rows.append(row)
    print(f"| dtype | B | truncation | {label} µs | tree µs | tree / {label} | thresholds equal |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        spec = ",".join(f"{k}={v}" for k, v in r["spec"].items())
        print(f"| {r['dtype']} | {r['B']} | {spec} | {r['rev_us']:.1f} | {r['tree_us']:.1f} | "
              f"{r['tree_us'] / r['rev_us']:.2f} | {r['thresholds_equal']}/{r['rows']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rev": label, "gamma": G, "V": V, "reps": args.reps, "rows": rows}, f,
                      separators=(",", ":"))


if __name__ == "__main__":
    main()
