// One token from one row of logits, sampled by one whole block: the exponential race of
// verify.cu's bonus path (argmax_j p_j / E_j, E_j ~ Exp(1) from the same Philox words), so it
// returns what verify_kernel returns with gamma = 0, up to float rounding.
//
// One pass over the row. With p_j = exp(z_j / T) / Z, argmax_j p_j / E_j is argmax_j of
// z_j - T log E_j (times T > 0, minus T log Z: the same order), so neither the row's maximum nor
// its sum is needed, and no key overflows however small T is. At T = 0 the pass takes the first
// argmax instead. NaN/+Inf anywhere in the row gives -1, a row with no finite logit (no mass) -2. 16-byte loads when
// the row is aligned (VEC > 1). Every thread of the block must call it; every thread gets the
// token. copy_to, when not null, receives the row as read (same storage). warp, when not null, is
// the row's record from warp_rows.cu (top-k / top-p / min-p): entries with M - z > dmax take no part
// in the race, as verify_kernel's warped mode gives them no probability.
#pragma once
#include "philox.cuh"
#include "block_reduce.cuh"
#include "load.cuh"
#include "warp_record.cuh"

template <class T, int VEC>
__device__ int sample_row(const typename T::storage* __restrict__ row, int V, float temperature,
                          unsigned long long seed, unsigned offset, unsigned purpose, unsigned request,
                          typename T::storage* __restrict__ copy_to, const float* __restrict__ warp = nullptr) {
  __shared__ SoftmaxStat red_stat[SS_WARPS];
  __shared__ RaceBest red_race[SS_WARPS];
  const bool greedy = temperature == 0.f;
  const PhiloxStream ps(seed, offset, request, 0, purpose);
  SoftmaxStat st = {-__int_as_float(0x7f800000), 0.f, 0x7fffffff};
  RaceBest best = {-__int_as_float(0x7f800000), 0x7fffffff};
  bool bad = false;
  // Truncation: keep z iff M - z <= dmax; without a record every entry is kept (dmax = +inf).
  const float w_max = warp ? warp[SS_REC_MAX] : 0.f;
  const float w_dmax = warp ? warp[SS_REC_DMAX] : __int_as_float(0x7f800000);
  // LOADS row vectors in flight per thread: a row of a few thousand logits then costs one load
  // round trip, not one per sweep. Each thread still visits its indices in increasing order.
  constexpr int LOADS = 4, SWEEP = SS_THREADS * VEC;
  for (int base0 = threadIdx.x * VEC; base0 < V; base0 += LOADS * SWEEP) {
    float z[LOADS][VEC];
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
      const int base = base0 + u * SWEEP;
      if (base >= V) continue;
      if (copy_to != nullptr) {
        if constexpr (VEC == 1) {
          copy_to[base] = row[base];
        } else {
          *reinterpret_cast<uint4*>(copy_to + base) = *reinterpret_cast<const uint4*>(row + base);
        }
      }
      load_vec<T, VEC>(row + base, z[u]);
    }
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
      const int base = base0 + u * SWEEP;
      if (base >= V) continue;
#pragma unroll
      for (int k = 0; k < VEC; ++k) bad |= !(z[u][k] < __int_as_float(0x7f800000));
      if (greedy) {
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          if (z[u][k] > st.m) { st.m = z[u][k]; st.arg = base + k; }
      } else {
        float e[VEC];
        race_variates<VEC>(ps, base, e);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float key = fmaf(-temperature, __logf(e[k]), z[u][k]);   // T * log(p_j / E_j) + const
          if (key > best.key && w_max - z[u][k] <= w_dmax) { best.key = key; best.idx = base + k; }
        }
      }
    }
  }
  if (__syncthreads_or(bad)) return -1;  // the same answer in every thread
  if (greedy) {
    st = block_reduce(st, CombineStat(), red_stat);  // s stays 0: the maximum and first argmax
    return st.m != -__int_as_float(0x7f800000) ? st.arg : -2;
  }
  best = block_reduce(best, BetterRace(), red_race);
  return best.idx < V ? best.idx : -2;  // every thread gets the block's result
}
