"""How fast can one streaming pass over B = 64's logit rows also build a mass histogram? The question
behind top-p's large-batch goal (2.5x the plain exact kernel): a layout that reads each row from DRAM
twice (a histogram pass, then the crossing bin's entries) is within the goal only if the first pass,
with one shared-memory atomic per entry, still runs at DRAM speed.

    python3 benchmarks/histogram_pass_rate.py [--batch 64] [--vocab 151936] [--gamma 5] [--json F]

Rows as bench verify's (target logits N(0, 4); (2 gamma + 1) rows per request), rotated past L2. One
block of 256 threads per row slice; each block reads its slice once with 16-byte loads, four in flight
per thread. Modes, device us (CUDA events, median of 20):
  stats   running maximum and online sum (the plain kernel's first pass: the floor)
  count   stats + one 32-bit shared atomic per entry (bin count), 2048 bins linear in d = M - z
  mass    stats + one 32-bit shared atomic per entry (fixed-point mass relative to the bin's top)
  mass_w  mass with one histogram per warp (fewer collisions in the crowded bins near the mode)
  both    count and mass (two atomics per entry: the cluster kernel's linear pass)
binned_range 0.5: only entries with d below half the rows' widest range are binned (about half of them).
Each block adds its histogram into a per-row global one at the end (one atomic per non-empty bin; `both`
adds its counts)."""
import argparse
import itertools
import json

import numpy as np

SOURCE = r"""
#include <cuda_fp16.h>
#define THREADS 256
#define BINS 2048
template <int FP16>
__device__ __forceinline__ void load_vec(const void* p, long i, float* v) {   // 4 floats / 8 halves at entry i
  if (FP16) {
    const uint4 w = *reinterpret_cast<const uint4*>(reinterpret_cast<const __half*>(p) + i);
    const __half2* h = reinterpret_cast<const __half2*>(&w);
#pragma unroll
    for (int k = 0; k < 4; ++k) { float2 f = __half22float2(h[k]); v[2 * k] = f.x; v[2 * k + 1] = f.y; }
  } else {
    const float4 w = *reinterpret_cast<const float4*>(reinterpret_cast<const float*>(p) + i);
    v[0] = w.x; v[1] = w.y; v[2] = w.z; v[3] = w.w;
  }
}

template <int FP16, int MODE>   // MODE 0 stats, 1 count, 2 mass, 3 mass per warp, 4 count + mass
__global__ void __launch_bounds__(THREADS) hist_pass(const void* x, int V, int slices, const float* rowmax,
                                                     float bins_per_unit, unsigned* ghist, float* gsum) {
  constexpr int VEC = FP16 ? 8 : 4;
  constexpr int NH = MODE == 3 ? THREADS / 32 : (MODE == 4 ? 2 : 1);
  extern __shared__ unsigned hist[];
  const int row = blockIdx.x / slices, s = blockIdx.x % slices;
  const long len = ((long)V / slices) / VEC * VEC;
  const long lo = (long)row * V + s * len;
  const long hi = s == slices - 1 ? (long)row * V + V : lo + len;
  if (MODE) for (int j = threadIdx.x; j < NH * BINS; j += THREADS) hist[j] = 0u;
  __syncthreads();
  const float M = rowmax[row];
  unsigned* h = hist + (MODE == 3 ? (threadIdx.x / 32) * BINS : 0);
  float m = -1e30f, sum = 0.f;
  constexpr int LOADS = 4;
  for (long base = lo; base < hi; base += (long)LOADS * THREADS * VEC) {
    float v[LOADS][VEC];
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
      const long i = base + ((long)u * THREADS + threadIdx.x) * VEC;
      if (i < hi) load_vec<FP16>(x, i, v[u]);
      else for (int k = 0; k < VEC; ++k) v[u][k] = -1e30f;
    }
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
      float gm = m;
#pragma unroll
      for (int k = 0; k < VEC; ++k) gm = fmaxf(gm, v[u][k]);
      sum *= exp2f((m - gm) * 1.4426950408889634f);
      m = gm;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        sum += exp2f((v[u][k] - m) * 1.4426950408889634f);
        if (MODE) {
          const float f = (M - v[u][k]) * bins_per_unit;
          if (f >= 0.f && f < (float)BINS) {
            const int j = (int)f;
            if (MODE == 1 || MODE == 4) atomicAdd(&h[j], 1u);
            if (MODE >= 2) {
              const float q = exp2f(((float)j - f) * (1.4426950408889634f / bins_per_unit));
              atomicAdd(&h[j + (MODE == 4 ? BINS : 0)], __float2uint_rn(q * 65536.f));
            }
          }
        }
      }
    }
  }
  if (threadIdx.x == 0) atomicAdd(&gsum[row], sum * 1e-30f + m * 0.f);   // keep the stats live
  if (MODE) {
    __syncthreads();
    for (int j = threadIdx.x; j < BINS; j += THREADS) {
      unsigned t = 0;
      for (int w = 0; w < (MODE == 3 ? NH : 1); ++w) t += hist[w * BINS + j];   // count + mass: the counts
      if (t) atomicAdd(&ghist[(long)row * BINS + j], t);
    }
  }
}
"""
MODES = ("stats", "count", "mass", "mass_w", "both")
BINS = 2048


def compile_module(cp):
    names = [f"hist_pass<{f},{m}>" for f in (0, 1) for m in range(len(MODES))]
    return cp.RawModule(code=SOURCE, options=("-std=c++17",), name_expressions=names)


def launcher(cp, mod, dtype, mode, slices, V, rows):
    """call(x, rowmax, bins_per_unit, ghist, gsum): one pass of MODES[mode] over x [rows, V] (float32 or
    float16, C-contiguous, V a multiple of 8), adding each row's bin counts / masses into ghist [rows, BINS]."""
    kern = mod.get_function(f"hist_pass<{int(np.dtype(dtype) == np.float16)},{mode}>")
    smem = ({3: 8, 4: 2}.get(mode, 1) if mode else 0) * BINS * 4
    if smem > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = smem
    return lambda x, rowmax, bpu, ghist, gsum: kern((rows * slices,), (256,), (
        x, np.int32(V), np.int32(slices), rowmax, np.float32(bpu), ghist, gsum), shared_mem=smem)


def main():
    import cupy as cp

    from specsample_cupy.bench_verify import device_seconds

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--slices", default="1,2,4")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    mod = compile_module(cp)
    R, V = args.batch * (2 * args.gamma + 1), args.vocab
    sm = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    clock_hz = cp.cuda.Device().attributes["ClockRate"] * 1e3
    rs = cp.random.RandomState(0)
    results = []
    for dtype in ("float32", "float16"):
        sets = [(rs.standard_normal((R, V), dtype=cp.float32) * 2).astype(dtype) for _ in range(2)]
        rowmax = [x.max(axis=1).astype(cp.float32) for x in sets]
        dtop = max(float((m - x.min(axis=1).astype(cp.float32)).max()) for m, x in zip(rowmax, sets))
        bpu = BINS / (dtop + 1e-3)
        ghist = cp.zeros((R, BINS), cp.uint32)
        gsum = cp.zeros(R, cp.float32)
        nbytes = R * V * sets[0].itemsize
        for mode, mname in enumerate(MODES):
            for slices, binned in itertools.product(map(int, args.slices.split(",")), (1.0, 0.5)):
                if binned < 1 and not mode:
                    continue
                run = launcher(cp, mod, dtype, mode, slices, V, R)
                call = lambda k: run(sets[k % 2], rowmax[k % 2], bpu / binned, ghist, gsum)
                call(0)
                cp.cuda.Device().synchronize()
                sec = device_seconds(cp, call, args.reps, per_call_s=1e-3)
                row = dict(dtype=dtype, mode=mname, slices=slices, binned_range=binned, blocks=R * slices,
                           device_us=round(sec * 1e6, 1), gbps=round(nbytes / sec / 1e9),
                           entries_per_cycle_per_sm=round(R * V / (sec * clock_hz * sm), 2))
                results.append(row)
                print(row, flush=True)
        del sets
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(batch=args.batch, vocab=V, gamma=args.gamma, rows=results), f, separators=(",", ":"))


if __name__ == "__main__":
    main()
