// Expected acceptance of each draft position for automatic gamma (gamma_policy.py):
//   beta[b, i] = sum_x min(p(x), q(x)),  p = softmax(target[b, i] / T_b),  q = softmax(draft[b, i] / T_b),
// the probability that exact verification accepts draft i of request b (sampled from q), given that
// it reaches it: one minus the total variation distance of the two rows. Reference:
// gamma_policy.expected_acceptance().
//
// Parallel decomposition: one block per (request b, draft position i < G), grid B * G. The block
// reads target row (b, i) and draft row (b, i) twice, VEC entries per load: first both rows'
// online-softmax statistics (block-reduced), then the sum of the minima (block-reduced). Positions
// i >= draft_len[b] write 0. The rows are the ones verify() has just read in the same round (in L2 at
// the batch sizes whose rounds the models' cost sets), and the kernel runs only where the round
// costs milliseconds (auto gamma with exact sampling), so a block per row pair is enough.
// out: [B, G] float32, written where the host reads the round's report.
#include "block_reduce.cuh"
#include "load.cuh"

template <class T, int VEC>
__global__ void __launch_bounds__(SS_THREADS) expected_accept(
    const typename T::storage* __restrict__ target,   // [B, G + 1, V]
    const typename T::storage* __restrict__ draft,    // [B, G, V]
    int G, int V, float temperature, const float* __restrict__ temperatures,   // [B] or null
    const int* __restrict__ draft_len, float* __restrict__ out) {
  __shared__ SoftmaxStat stats[SS_WARPS];
  __shared__ float sums[SS_WARPS];
  const int b = blockIdx.x / G, i = blockIdx.x - b * G;
  if (i >= draft_len[b]) {
    if (threadIdx.x == 0) out[blockIdx.x] = 0.0f;
    return;
  }
  const typename T::storage* t = target + ((long long)b * (G + 1) + i) * V;
  const typename T::storage* d = draft + ((long long)b * G + i) * V;
  // Logits in log2 units at the row's temperature: p(x) = 2^(z2(x) - m) / s.
  const float scale = 1.4426950408889634f / (temperatures ? temperatures[b] : temperature);

  const float neg_inf = -__int_as_float(0x7f800000);
  SoftmaxStat st = {neg_inf, 0.0f, 0}, sd = {neg_inf, 0.0f, 0};
  for (int j = threadIdx.x * VEC; j < V; j += SS_THREADS * VEC) {
    float x[VEC], y[VEC];
    load_vec<T, VEC>(t + j, x);
    load_vec<T, VEC>(d + j, y);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float zx = x[k] * scale, zy = y[k] * scale;
      if (zx > st.m) { st.s = st.s * ex2_approx(st.m - zx) + 1.0f; st.m = zx; }
      else if (zx > neg_inf) st.s += ex2_approx(zx - st.m);
      if (zy > sd.m) { sd.s = sd.s * ex2_approx(sd.m - zy) + 1.0f; sd.m = zy; }
      else if (zy > neg_inf) sd.s += ex2_approx(zy - sd.m);
    }
  }
  // combine() rescales with natural exponentials: the statistics are in log2 units, so convert.
  st.m *= 0.6931471805599453f;
  sd.m *= 0.6931471805599453f;
  st = block_reduce(st, CombineStat(), stats);
  sd = block_reduce(sd, CombineStat(), stats);
  const float mt = st.m * 1.4426950408889634f, md = sd.m * 1.4426950408889634f;
  const float rt = 1.0f / st.s, rd = 1.0f / sd.s;

  float acc = 0.0f;
  for (int j = threadIdx.x * VEC; j < V; j += SS_THREADS * VEC) {
    float x[VEC], y[VEC];
    load_vec<T, VEC>(t + j, x);
    load_vec<T, VEC>(d + j, y);
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      acc += fminf(ex2_approx(x[k] * scale - mt) * rt, ex2_approx(y[k] * scale - md) * rd);
  }
  acc = block_reduce(acc, AddFloat(), sums);
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

// The instantiations decode_device.py launches (named here too so that an offline nvcc compiles them).
#define SS_EXPECTED_ACCEPT(T, VEC)                                                                               \
  template __global__ void expected_accept<T, VEC>(const T::storage*, const T::storage*, int, int, float,      \
                                                   const float*, const int*, float*);
SS_EXPECTED_ACCEPT(f32, 4)
SS_EXPECTED_ACCEPT(f32, 1)
SS_EXPECTED_ACCEPT(f16, 8)
SS_EXPECTED_ACCEPT(f16, 1)
