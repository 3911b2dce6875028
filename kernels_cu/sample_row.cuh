// One token from one row of logits, sampled by one whole block: the exponential race of
// verify.cu's bonus path (argmax_j p_j / E_j, E_j ~ Exp(1) from the same Philox words), so it
// returns what verify_kernel returns with gamma = 0, up to float rounding.
//
// Pass 1 reduces the row's maximum and first argmax (the token itself at T = 0) and checks for
// NaN/+Inf; pass 2 races on exp((z - m) / T) / E_j. Dividing by the row's sum of exponentials
// would scale every key by the same positive number, so the winner does not need it and it is
// never computed. 16-byte loads when the row is aligned (VEC > 1); pass 2 re-reads the row from
// L1/L2. Every thread of the block must call it; every thread gets the token (-1 for a row with
// NaN/+Inf or no finite logit). copy_to, when not null, receives the row as read (same storage).
#pragma once
#include "philox.cuh"
#include "block_reduce.cuh"
#include "load.cuh"

template <class T, int VEC>
__device__ int sample_row(const typename T::storage* __restrict__ row, int V, float temperature,
                          unsigned long long seed, unsigned offset, unsigned purpose, unsigned request,
                          typename T::storage* __restrict__ copy_to) {
  __shared__ SoftmaxStat red_stat[SS_WARPS];
  __shared__ RaceBest red_race[SS_WARPS];
  SoftmaxStat st = {-__int_as_float(0x7f800000), 0.f, 0x7fffffff};
  bool bad = false;
  for (int base = threadIdx.x * VEC; base < V; base += SS_THREADS * VEC) {
    float z[VEC];
    if (copy_to != nullptr) {
      if constexpr (VEC == 1) {
        copy_to[base] = row[base];
      } else {
        *reinterpret_cast<uint4*>(copy_to + base) = *reinterpret_cast<const uint4*>(row + base);
      }
    }
    load_vec<T, VEC>(row + base, z);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      bad |= !(z[e] < __int_as_float(0x7f800000));
      if (z[e] > st.m) { st.m = z[e]; st.arg = base + e; }
    }
  }
  st = block_reduce(st, CombineStat(), red_stat);  // s stays 0: the maximum and first argmax
  bad = __syncthreads_or(bad);
  int token = -1;
  if (!bad && st.m != -__int_as_float(0x7f800000)) {
    if (temperature == 0.f) {
      token = st.arg;
    } else {
      const float c = 1.4426950408889634f / temperature, mc = st.m * c;
      const PhiloxStream ps(seed, offset, request, 0, purpose);
      RaceBest best = {-1.f, 0x7fffffff};
      for (int base = threadIdx.x * VEC; base < V; base += SS_THREADS * VEC) {
        float z[VEC], e[VEC];
        load_vec<T, VEC>(row + base, z);
        race_variates<VEC>(ps, base, e);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float w = ex2_approx(fmaf(z[k], c, -mc));
          const float key = w > 0.f ? __fdividef(w, e[k]) : -1.f;
          if (key > best.key) { best.key = key; best.idx = base + k; }
        }
      }
      best = block_reduce(best, BetterRace(), red_race);
      token = best.key > 0.f ? best.idx : -1;
    }
  }
  return token;  // the same in every thread: both reductions give every thread the block's result
}
