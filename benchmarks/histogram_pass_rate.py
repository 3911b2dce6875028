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
  window  count with the row maximum unknown: bins below the block's first loads' maximum + 4, entries
          above listed (a large-batch top-p kernel's first pass)
  list    the entries of 11 bins near top-p 0.9's crossing listed in shared memory (ballots), the mass of
          the entries above them summed (its second pass); list_only: the list alone; list_vec:
          the list alone, each 16-byte vector tested at once against the bins' range
binned_range 0.5: only entries with d below half the rows' widest range are binned (about half of them).
Each block adds its histogram into a per-row global one at the end (one atomic per non-empty bin; `both`
adds its counts)."""
import argparse
import itertools
import json

import numpy as np

SOURCE = r"""
#include "load.cuh"
#define THREADS 256
#define BINS 2048
#define CAP 4096   // the list's capacity (modes 5 to 8)
#define LOG2E 1.4426950408889634f

// Appends the warp's entries with take set to the list (ballot: one shared atomic per warp).
__device__ __forceinline__ void list_append(bool take, float v, float* list, unsigned* len) {
  const unsigned ballot = __ballot_sync(0xffffffffu, take);
  if (!ballot) return;
  unsigned at = 0u;
  if ((threadIdx.x & 31) == 0) at = atomicAdd(len, __popc(ballot));
  at = __shfl_sync(0xffffffffu, at, 0) + __popc(ballot & ((1u << (threadIdx.x & 31)) - 1u));
  if (take && at < CAP) list[at] = v;
}

// MODE: 0 stats, 1 count, 2 mass, 3 mass per warp, 4 count + mass, 5 window, 6 list, 7 list only,
// 8 list by vectors (MODES below). T: f32 or f16 (load.cuh).
template <class T, int MODE>
__global__ void __launch_bounds__(THREADS) hist_pass(const typename T::storage* x, int V, int slices,
                                                     const float* rowmax, float bins_per_unit, int ja, int jb,
                                                     unsigned* ghist, float* gsum) {
  constexpr int VEC = 16 / sizeof(typename T::storage);
  constexpr int NH = MODE == 3 ? THREADS / 32 : (MODE == 4 ? 2 : 1);
  extern __shared__ unsigned hist[];
  const int row = blockIdx.x / slices, s = blockIdx.x % slices;
  const long len = ((long)V / slices) / VEC * VEC;
  const long lo = (long)row * V + s * len;
  const long hi = s == slices - 1 ? (long)row * V + V : lo + len;
  __shared__ unsigned list_len;
  if (threadIdx.x == 0) list_len = 0u;
  if (MODE) for (int j = threadIdx.x; j < NH * BINS; j += THREADS) hist[j] = 0u;
  __syncthreads();
  __shared__ float warp_max[THREADS / 32];
  float* list = reinterpret_cast<float*>(hist + BINS);
  float M = rowmax[row];   // MODE 5: the margin above the block's first loads' maximum
  if (MODE == 5) {
    float v0[VEC], m0 = -1e30f;
    const long i = lo + (long)threadIdx.x * VEC;
    if (i < hi) { load_vec<T, VEC>(x + i, v0); for (int k = 0; k < VEC; ++k) m0 = fmaxf(m0, v0[k]); }
    for (int o = 16; o; o >>= 1) m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, o));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = m0;
    __syncthreads();
    for (int w = 0; w < THREADS / 32; ++w) m0 = fmaxf(m0, warp_max[w]);
    M = m0 + M;   // the window's top
  }
  float above = 0.f;
  // MODE 8: the z range of bins [ja, jb) widened by a bin either side (the vector test must not miss)
  const float zlo = M - (float)(jb + 1) / bins_per_unit, zhi = M - (float)(ja - 1) / bins_per_unit;
  unsigned* h = hist + (MODE == 3 ? (threadIdx.x / 32) * BINS : 0);
  float m = -1e30f, sum = 0.f;
  constexpr int LOADS = 4;
  for (long base = lo; base < hi; base += (long)LOADS * THREADS * VEC) {
    float v[LOADS][VEC];
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
      const long i = base + ((long)u * THREADS + threadIdx.x) * VEC;
      if (i < hi) load_vec<T, VEC>(x + i, v[u]);
      else for (int k = 0; k < VEC; ++k) v[u][k] = -1e30f;
    }
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
      float gm = m;
#pragma unroll
      for (int k = 0; k < VEC; ++k) gm = fmaxf(gm, v[u][k]);
      sum *= exp2f((m - gm) * LOG2E);
      m = gm;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        sum += exp2f((v[u][k] - m) * LOG2E);
        if (MODE == 6 || MODE == 7) {   // list the entries of bins [ja, jb); 6: sum the mass of those above them
          const float f = (M - v[u][k]) * bins_per_unit;
          list_append(f >= 0.f && (int)f >= ja && (int)f < jb, v[u][k], list, &list_len);
          if (MODE == 6 && f >= 0.f && (int)f < ja) above += exp2f((v[u][k] - M) * LOG2E);
        } else if (MODE == 5 && M - v[u][k] < 0.f) {   // above the window: listed
          const unsigned at = atomicAdd(&list_len, 1u);
          if (at < CAP) list[at] = v[u][k];
        } else if (MODE && MODE <= 5) {
          const float f = (M - v[u][k]) * bins_per_unit;
          if (f >= 0.f && f < (float)BINS) {
            const int j = (int)f;
            if (MODE == 1 || MODE == 4 || MODE == 5) atomicAdd(&h[j], 1u);
            if (MODE >= 2 && MODE <= 4) {
              const float q = exp2f(((float)j - f) * (LOG2E / bins_per_unit));
              atomicAdd(&h[j + (MODE == 4 ? BINS : 0)], __float2uint_rn(q * 65536.f));
            }
          }
        }
      }
      if (MODE == 8) {   // list only, a 16-byte vector tested at once: entries one by one where it may hit
        float vmx = v[u][0], vmn = v[u][0];
#pragma unroll
        for (int k = 1; k < VEC; ++k) { vmx = fmaxf(vmx, v[u][k]); vmn = fminf(vmn, v[u][k]); }
        if (__any_sync(0xffffffffu, vmx > zlo && vmn < zhi)) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const float f = (M - v[u][k]) * bins_per_unit;
            list_append(f >= 0.f && (int)f >= ja && (int)f < jb, v[u][k], list, &list_len);
          }
        }
      }
    }
  }
  if (threadIdx.x == 0) atomicAdd(&gsum[row], sum * 1e-30f + m * 0.f);   // keep the stats live
  if (MODE == 6) {
    for (int o = 16; o; o >>= 1) above += __shfl_xor_sync(0xffffffffu, above, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(&gsum[row], above);
  }
  __syncthreads();
  if (MODE >= 5 && threadIdx.x == 0) atomicAdd(&ghist[(long)row * BINS + (MODE == 5 ? BINS - 1 : 0)], list_len);
  if (MODE >= 1 && MODE <= 5) {
    for (int j = threadIdx.x; j < BINS; j += THREADS) {
      unsigned t = 0;
      for (int w = 0; w < (MODE == 3 ? NH : 1); ++w) t += hist[w * BINS + j];   // count + mass: the counts
      if (t) atomicAdd(&ghist[(long)row * BINS + j], t);
    }
  }
}
"""
MODES = ("stats", "count", "mass", "mass_w", "both", "window", "list", "list_only", "list_vec")
BINS = 2048


TYPES = {"float32": "f32", "float16": "f16"}


def compile_module(cp):
    """SOURCE with the project's kernels_cu/ headers inlined, every (dtype, mode) instantiated."""
    from importlib import resources

    from specsample_cupy.kernel_runtime import kernel_source
    root = resources.files("kernels_cu")
    code = kernel_source("histogram_pass.cu", read=lambda name: SOURCE if name == "histogram_pass.cu"
                         else root.joinpath(name).read_text())
    names = [f"hist_pass<{t},{m}>" for t in TYPES.values() for m in range(len(MODES))]
    return cp.RawModule(code=code, options=("-std=c++17",), name_expressions=names)


def launcher(cp, mod, dtype, mode, slices, V, rows):
    """call(x, rowmax, bins_per_unit, ghist, gsum, ja=0, jb=0): one pass of MODES[mode] over x [rows, V]
    (float32 or float16, C-contiguous, V a multiple of 8), adding each row's bin counts / masses into
    ghist [rows, BINS] (window: rowmax holds the margins, and the last bin also adds the entries above the
    window; list: bin 0 adds the entries listed, gsum the mass above bin ja)."""
    kern = mod.get_function(f"hist_pass<{TYPES[np.dtype(dtype).name]},{mode}>")
    # histograms (per warp: 8; count + mass: 2), or BINS + CAP (window and lists: the list after the bins)
    smem = ({3: 8, 4: 2}.get(mode, 1) if mode < 5 else 3) * BINS * 4 if mode else 0
    if smem > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = smem
    return lambda x, rowmax, bpu, ghist, gsum, ja=0, jb=0: kern((rows * slices,), (256,), (
        x, np.int32(V), np.int32(slices), rowmax, np.float32(bpu), np.int32(ja), np.int32(jb), ghist, gsum),
        shared_mem=smem)


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
        margin = [cp.full(R, 4.0, cp.float32)] * 2
        ja = int(7.0 * bpu)   # list: 11 bins near top-p 0.9's crossing on these rows (d ~ 7.2)
        ghist = cp.zeros((R, BINS), cp.uint32)
        gsum = cp.zeros(R, cp.float32)
        nbytes = R * V * sets[0].itemsize
        for mode, mname in enumerate(MODES):
            for slices, binned in itertools.product(map(int, args.slices.split(",")), (1.0, 0.5)):
                if binned < 1 and mname in ("stats", "window", "list", "list_only", "list_vec"):
                    continue
                run = launcher(cp, mod, dtype, mode, slices, V, R)
                first = margin if mname == "window" else rowmax
                call = lambda k: run(sets[k % 2], first[k % 2], bpu / binned, ghist, gsum, ja, ja + 11)
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
            columns = ["dtype", "mode", "slices", "binned_range", "device_us", "entries_per_cycle_per_sm"]
            json.dump(dict(batch=args.batch, vocab=V, gamma=args.gamma, columns=columns,
                           rows=[[r[c] for c in columns] for r in results]), f, separators=(",", ":"))


if __name__ == "__main__":
    main()
