// sample_tokens() for rows one block can scan: a token per row from softmax(z / T) by the exponential
// race of verify.cu's bonus path (argmax_j p_j / E_j, E_j ~ Exp(1) from the same Philox words), so it
// returns what verify_kernel returns with gamma = 0, up to float rounding, in one launch.
//
// Parallel decomposition: one 256-thread block per row. Pass 1 reduces the row's maximum and first
// argmax (the token itself at T = 0) and checks for NaN/+Inf; pass 2 races on exp((z - m) / T) / E_j.
// Dividing by the row's sum of exponentials would scale every key by the same positive number, so
// the winner does not need it and it is never computed. 16-byte loads when the rows are aligned
// (VEC > 1); pass 2 re-reads the row from L1/L2. No hand-off between blocks.
#include "philox.cuh"
#include "block_reduce.cuh"
#include "load.cuh"

template <class T, int VEC>
__global__ void __launch_bounds__(SS_THREADS) sample_rows_kernel(
    const typename T::storage* __restrict__ logits, int V, float temperature, unsigned long long seed,
    unsigned offset, unsigned purpose, int* __restrict__ tokens) {
  __shared__ SoftmaxStat red_stat[SS_WARPS];
  __shared__ RaceBest red_race[SS_WARPS];
  const int b = blockIdx.x;
  const typename T::storage* row = logits + (long long)b * V;
  SoftmaxStat st = {-__int_as_float(0x7f800000), 0.f, 0x7fffffff};
  bool bad = false;
  for (int base = threadIdx.x * VEC; base < V; base += SS_THREADS * VEC) {
    float z[VEC];
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
      const PhiloxStream ps(seed, offset, b, 0, purpose);
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
  if (threadIdx.x == 0) tokens[b] = token;
}

// The instantiations sampling.py launches (named here too so that an offline nvcc compiles them).
template __global__ void sample_rows_kernel<f32, 4>(const float*, int, float, unsigned long long, unsigned, unsigned, int*);
template __global__ void sample_rows_kernel<f32, 1>(const float*, int, float, unsigned long long, unsigned, unsigned, int*);
template __global__ void sample_rows_kernel<f16, 8>(const unsigned short*, int, float, unsigned long long, unsigned, unsigned, int*);
template __global__ void sample_rows_kernel<f16, 1>(const unsigned short*, int, float, unsigned long long, unsigned, unsigned, int*);
