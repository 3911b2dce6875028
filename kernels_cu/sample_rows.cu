// sample_tokens() for rows one block can scan (sample_row.cuh): one token per row from
// softmax(z / T), what verify_kernel returns with gamma = 0, up to float rounding, in one launch.
//
// Parallel decomposition: one 256-thread block per row, no hand-off between blocks.
//
// Random numbers: row b draws at Philox request word b with the call's seed and offset, or, with
// per-request streams ([B, 2] int64, verify()'s argument), with (seed, offset) = streams[b] at
// request word 0, the numbers of a one-row call with that seed and offset.
#include "sample_row.cuh"

template <class T, int VEC>
__global__ void __launch_bounds__(SS_THREADS) sample_rows_kernel(
    const typename T::storage* __restrict__ logits, int V, float temperature, unsigned long long seed,
    unsigned offset, unsigned purpose, const long long* __restrict__ streams, int* __restrict__ tokens) {
  const int b = blockIdx.x;
  const bool own = streams != nullptr;
  const int token = sample_row<T, VEC>(logits + (long long)b * V, V, temperature,
                                       own ? (unsigned long long)streams[2 * b] : seed,
                                       own ? (unsigned)streams[2 * b + 1] : offset, purpose, own ? 0u : (unsigned)b,
                                       nullptr);
  if (threadIdx.x == 0) tokens[b] = token;
}

// The instantiations verification/sampling.py launches (named here too so that an offline nvcc compiles them).
template __global__ void sample_rows_kernel<f32, 4>(const float*, int, float, unsigned long long, unsigned, unsigned, const long long*, int*);
template __global__ void sample_rows_kernel<f32, 1>(const float*, int, float, unsigned long long, unsigned, unsigned, const long long*, int*);
template __global__ void sample_rows_kernel<f16, 8>(const unsigned short*, int, float, unsigned long long, unsigned, unsigned, const long long*, int*);
template __global__ void sample_rows_kernel<f16, 1>(const unsigned short*, int, float, unsigned long long, unsigned, unsigned, const long long*, int*);
