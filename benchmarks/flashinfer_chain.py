"""FlashInfer's chain speculative-sampling kernel beside `exact`, on the same inputs and GPU.

ChainSpeculativeSampling (FlashInfer's include/flashinfer/sampling.cuh; one block per request) takes
probabilities; `exact` is timed from the same probabilities (verify(probs=True)) and from the logits
they came from. Device µs: median of CUDA events over --reps calls queued behind a busy kernel, inputs
rotated past twice the L2; wall µs: median of call + synchronize. gamma = 5; random draft ids, ids
sampled from the draft, drafts equal to the target. Both kernels' mean accepted drafts (one call)
check that they read the same inputs.

Build the wrapper once (nvcc; FlashInfer's and curand's headers):
    pip download flashinfer-python --no-deps -d fi && unzip -q -o 'fi/*.whl' 'flashinfer/data/include/*' -d fi
    python3 benchmarks/flashinfer_chain.py --build libchain.so -I fi/flashinfer/data/include [-I CURAND_INCLUDE]
Run (GPU): python3 benchmarks/flashinfer_chain.py --lib libchain.so [--batch 1,64] [--vocab 151936]
               [--dtype float32,float16] [--reps 30] [--json FILE]
"""
import argparse
import ctypes
import json
import subprocess
import tempfile
from pathlib import Path


G = 5
DRAFTS = ("random", "sampled", "accepted")

# One C function per dtype around FlashInfer's host launcher (seed and offset as scalars).
WRAPPER = r"""
#include <cuda_fp16.h>
#include <flashinfer/sampling.cuh>
#define CHAIN(NAME, T)                                                                               \
  extern "C" int NAME(T* draft, int* ids, T* target, int* out, int* accepted, int* emitted,      \
                      unsigned B, unsigned G, unsigned V, unsigned long long seed,                \
                      unsigned long long offset, void* stream) {                                  \
    return (int)flashinfer::sampling::ChainSpeculativeSampling<T, int>(                           \
        draft, ids, target, out, accepted, emitted, B, G, V, false, nullptr, seed, nullptr,       \
        offset, (cudaStream_t)stream);                                                            \
  }
CHAIN(chain_float32, float)
CHAIN(chain_float16, half)
"""


def build(lib, includes):
    """Compile WRAPPER into the shared library `lib` (sm_90, CUDA runtime linked statically)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "chain.cu"
        src.write_text(WRAPPER)
        cmd = ["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-Xlinker", "-s",
               *(f"-I{d}" for d in includes), str(src), "-o", str(lib)]
        subprocess.run(cmd, check=True)


class Chain:
    """FlashInfer's kernel on CuPy arrays: call(tokens, draft_probs, target_probs, offset) on the
    current stream; mean_emitted() reads the per-request count it adds to."""

    def __init__(self, cp, lib, dtype, B, V):
        self.fn = getattr(ctypes.CDLL(str(Path(lib).resolve())), f"chain_{dtype}")
        self.fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_uint] * 3 + [ctypes.c_ulonglong] * 2 + [ctypes.c_void_p]
        self.fn.restype = ctypes.c_int
        self.cp, self.B, self.V = cp, B, V
        self.out = cp.zeros((B, G + 1), cp.int32)
        self.counts = cp.zeros((2, B), cp.int32)

    def __call__(self, tokens, draft, target, offset):
        err = self.fn(draft.data.ptr, tokens.data.ptr, target.data.ptr, self.out.data.ptr, self.counts[0].data.ptr,
                      self.counts[1].data.ptr, self.B, G, self.V, 1, offset, self.cp.cuda.get_current_stream().ptr)
        if err:
            raise RuntimeError(f"ChainSpeculativeSampling returned CUDA error {err}")

    def mean_emitted(self, inputs):
        """FlashInfer's mean accepted drafts (its `emitted` count: the prefix before the first
        rejection) over one call on `inputs`."""
        self.counts.fill(0)
        self(*inputs, 0)
        return float(self.counts[1].mean())


def prob_ring(cp, ring, dtype):
    """The ring with both models' logits replaced by their softmax (computed in float32), same tokens."""
    from specsample_cupy.bench.verify import InputRing
    from specsample_cupy.verification.baseline import _softmax

    def probs(z):
        return _softmax(z.astype(cp.float32), cp).astype(dtype)
    return InputRing([(t, probs(d), probs(tg)) for t, d, tg in ring], ring.rotate_bytes)


def timed(cp, call, reps):
    """(median device µs from bench verify's events, median wall µs of call + synchronize)."""
    from specsample_cupy.bench.verify import device_seconds, wall_seconds
    for k in range(3):
        call(k)
    device = device_seconds(cp, call, reps, per_call_s=400e-6)
    stream = cp.cuda.get_current_stream()
    return device * 1e6, wall_seconds(lambda k: (call(k), stream.synchronize()), reps) * 1e6


def measure(cp, lib, dtype, B, V, drafts, reps):
    from specsample_cupy import verify
    from specsample_cupy.bench.verify import drafts_ring
    logits = drafts_ring(cp, B, G, V, dtype, drafts)
    probs = prob_ring(cp, logits, dtype)
    chain = Chain(cp, lib, dtype, B, V)
    row = dict(dtype=dtype, V=V, B=B, drafts=drafts)
    row["flashinfer_accepted"] = round(chain.mean_emitted(probs[0]), 3)
    row["exact_accepted"] = round(float(verify(*probs[0], probs=True, seed=1).accepted.get().mean()), 3)
    for name, call in (("flashinfer", lambda k: chain(*probs.next(), k)),
                       ("exact_probs", lambda k: verify(*probs.next(), probs=True, seed=1, offset=k)),
                       ("exact_logits", lambda k: verify(*logits.next(), seed=1, offset=k))):
        row[f"{name}_us"], row[f"{name}_wall_us"] = (round(x, 2) for x in timed(cp, call, reps))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", metavar="LIB", help="compile the wrapper library LIB and exit")
    ap.add_argument("-I", dest="includes", action="append", default=[], help="include directory (--build)")
    ap.add_argument("--lib", help="the wrapper library to time")
    ap.add_argument("--batch", default="1,64")
    ap.add_argument("--vocab", default="151936")
    ap.add_argument("--dtype", default="float32,float16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.build:
        build(args.build, args.includes)
        return
    if not args.lib:
        ap.error("--lib (or --build) is required")
    import cupy as cp

    from specsample_cupy.bench import result_json
    gpu = result_json.gpu_name()
    print(f"gamma = {G}, {gpu}: device µs per call (wall µs); mean accepted FlashInfer / exact")
    print("| dtype | V | B | drafts | accepted | FlashInfer chain (probs) | exact (probs) | exact (logits) "
          "| FlashInfer / exact (probs) | FlashInfer / exact (logits) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for dtype in args.dtype.split(","):
        for V in (int(v) for v in args.vocab.split(",")):
            for B in (int(b) for b in args.batch.split(",")):
                for drafts in DRAFTS:
                    r = measure(cp, args.lib, dtype, B, V, drafts, args.reps)
                    rows.append(r)
                    print(f"| {dtype} | {V} | {B} | {drafts} | {r['flashinfer_accepted']:.2f} / "
                          f"{r['exact_accepted']:.2f} | {r['flashinfer_us']:.1f} ({r['flashinfer_wall_us']:.0f}) | "
                          f"{r['exact_probs_us']:.1f} ({r['exact_probs_wall_us']:.0f}) | "
                          f"{r['exact_logits_us']:.1f} ({r['exact_logits_wall_us']:.0f}) | "
                          f"{r['flashinfer_us'] / r['exact_probs_us']:.2f} | "
                          f"{r['flashinfer_us'] / r['exact_logits_us']:.2f} |", flush=True)
                    cp.get_default_memory_pool().free_all_blocks()
    if args.json:   # one list per row under `columns`: the file stays small
        columns = list(rows[0])
        out = dict(device=gpu, gamma=G, reps=args.reps, columns=columns, rows=[[r[c] for c in columns] for r in rows])
        Path(args.json).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
