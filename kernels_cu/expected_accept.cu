// Expected acceptance of each draft position for automatic gamma (decode/gamma_policy.py):
//   beta[b, i] = sum_x min(p(x), q(x)),  p = softmax(target[b, i] / T_b),  q = softmax(draft[b, i] / T_b),
// the probability that exact verification accepts draft i of request b (sampled from q), given that
// it reaches it: one minus the total variation distance of the two rows. Reference:
// acceptance.expected_acceptance().
//
// Parallel decomposition: row pair (b, i) (target row i and draft row i of request b, i < G) is cut
// into S vocabulary slices of `span` entries; both kernels run one block per (row pair, slice), grid
// B * G * S, reading VEC entries per load.
//   expected_stats: each block writes both rows' online-softmax statistics over its slice.
//   expected_sum:   each block combines the S statistics of its row pair (the rows' maxima and
//                   normalisers), sums min(p, q) over its slice and publishes the sum; the row pair's
//                   last block to finish (a counter per pair) adds the S sums in slice order and
//                   writes out[b * G + i] (0 where i >= draft_len[b]), then resets the counter.
// The rows are the ones verify() has just read in the same round (in L2 at small batches).
#include "block_reduce.cuh"
#include "load.cuh"

__device__ __forceinline__ float row_scale(float temperature, const float* temperatures, int b) {
  return 1.4426950408889634f / (temperatures ? temperatures[b] : temperature);   // logits in log2 units
}

// Online softmax in log2 units, skipping -inf.
__device__ __forceinline__ void online_add(SoftmaxStat& st, float z) {
  if (z > st.m) {
    st.s = st.s * ex2_approx(st.m - z) + 1.0f;
    st.m = z;
  } else if (z > -__int_as_float(0x7f800000)) {
    st.s += ex2_approx(z - st.m);
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(SS_THREADS) expected_stats(
    const typename T::storage* __restrict__ target,   // [B, G + 1, V]
    const typename T::storage* __restrict__ draft,    // [B, G, V]
    int G, int V, int S, int span, float temperature, const float* __restrict__ temperatures,   // [B] or null
    const int* __restrict__ draft_len, float4* __restrict__ stats) {   // [B * G * S] x 2 (target, draft)
  __shared__ SoftmaxStat scratch[SS_WARPS];
  const int pair = blockIdx.x / S, slice = blockIdx.x - pair * S;
  const int b = pair / G, i = pair - b * G;
  if (i >= draft_len[b]) return;
  const typename T::storage* t = target + ((long long)b * (G + 1) + i) * V;
  const typename T::storage* d = draft + ((long long)b * G + i) * V;
  const float scale = row_scale(temperature, temperatures, b);
  const int end = min(V, (slice + 1) * span);
  const float neg_inf = -__int_as_float(0x7f800000);
  SoftmaxStat st = {neg_inf, 0.0f, 0}, sd = {neg_inf, 0.0f, 0};
  for (int j = slice * span + threadIdx.x * VEC; j < end; j += SS_THREADS * VEC) {
    float x[VEC], y[VEC];
    load_vec<T, VEC>(t + j, x);
    load_vec<T, VEC>(d + j, y);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      online_add(st, x[k] * scale);
      online_add(sd, y[k] * scale);
    }
  }
  // combine() rescales with natural exponentials: maxima to natural units and back.
  st.m *= 0.6931471805599453f;
  sd.m *= 0.6931471805599453f;
  st = block_reduce(st, CombineStat(), scratch);
  sd = block_reduce(sd, CombineStat(), scratch);
  if (threadIdx.x == 0) {
    stats[2 * blockIdx.x] = make_float4(st.m * 1.4426950408889634f, st.s, 0.0f, 0.0f);
    stats[2 * blockIdx.x + 1] = make_float4(sd.m * 1.4426950408889634f, sd.s, 0.0f, 0.0f);
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(SS_THREADS) expected_sum(
    const typename T::storage* __restrict__ target, const typename T::storage* __restrict__ draft,
    int G, int V, int S, int span, float temperature, const float* __restrict__ temperatures,
    const int* __restrict__ draft_len, const float4* __restrict__ stats, float* __restrict__ partial,   // [B * G * S]
    unsigned* __restrict__ arrived, float* __restrict__ out) {   // [B * G] counters (0 between calls), [B, G]
  __shared__ float sums[SS_WARPS];
  __shared__ float row[4];   // mt, 1 / st, md, 1 / sd
  __shared__ bool last;
  const int pair = blockIdx.x / S, slice = blockIdx.x - pair * S;
  const int b = pair / G, i = pair - b * G;
  if (i >= draft_len[b]) {
    if (slice == 0 && threadIdx.x == 0) out[pair] = 0.0f;
    return;
  }
  if (threadIdx.x < 2) {   // thread 0 the target row's statistics, thread 1 the draft row's
    float m = -__int_as_float(0x7f800000), s = 0.0f;
    for (int k = 0; k < S; ++k) {
      const float4 v = stats[2 * (pair * S + k) + threadIdx.x];
      if (v.y == 0.0f) continue;   // a slice of -inf entries only
      if (v.x > m) {
        s = s * ex2_approx(m - v.x) + v.y;
        m = v.x;
      } else {
        s += v.y * ex2_approx(v.x - m);
      }
    }
    row[2 * threadIdx.x] = m;
    row[2 * threadIdx.x + 1] = 1.0f / s;
  }
  __syncthreads();
  const float mt = row[0], rt = row[1], md = row[2], rd = row[3];
  const typename T::storage* t = target + ((long long)b * (G + 1) + i) * V;
  const typename T::storage* d = draft + ((long long)b * G + i) * V;
  const float scale = row_scale(temperature, temperatures, b);
  const int end = min(V, (slice + 1) * span);
  float acc = 0.0f;
  for (int j = slice * span + threadIdx.x * VEC; j < end; j += SS_THREADS * VEC) {
    float x[VEC], y[VEC];
    load_vec<T, VEC>(t + j, x);
    load_vec<T, VEC>(d + j, y);
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      acc += fminf(ex2_approx(x[k] * scale - mt) * rt, ex2_approx(y[k] * scale - md) * rd);
  }
  acc = block_reduce(acc, AddFloat(), sums);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = acc;
    __threadfence();   // the sum is visible before the arrival that counts it
    last = atomicAdd(&arrived[pair], 1u) == (unsigned)(S - 1);
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    __threadfence();
    float total = 0.0f;
    for (int k = 0; k < S; ++k) total += __ldcg(&partial[pair * S + k]);
    out[pair] = total;
    arrived[pair] = 0u;   // ready for the next call (stream order)
  }
}

// The instantiations verification/expected_accept.py launches (named here too so that an offline nvcc compiles them).
#define SS_EXPECTED_ACCEPT(T, VEC)                                                                               \
  template __global__ void expected_stats<T, VEC>(const T::storage*, const T::storage*, int, int, int, int,     \
                                                  float, const float*, const int*, float4*);                    \
  template __global__ void expected_sum<T, VEC>(const T::storage*, const T::storage*, int, int, int, int,       \
                                                float, const float*, const int*, const float4*, float*,         \
                                                unsigned*, float*);
SS_EXPECTED_ACCEPT(f32, 4)
SS_EXPECTED_ACCEPT(f32, 1)
SS_EXPECTED_ACCEPT(f16, 8)
SS_EXPECTED_ACCEPT(f16, 1)
