"""The floor under `exact` at B = 1, gamma = 5: device time of the least work any exact verifier
must do, measured the way `bench verify` measures (CUDA events, calls queued behind a busy kernel,
inputs rotated through more than twice the L2 so every call reads from HBM).

  empty      one empty block: the events' and the launch's own cost.
  read+1     read every logit of the 2 gamma + 1 rows once (16-byte loads, 8 in flight per
             thread), reduce them to one number per block (an exp2 per logit, as the softmax
             statistics take), then one grid-wide hand-off: the last block to arrive combines the
             partials and writes the result. Any exact method needs at least this (the softmax
             normalisers of every row), and then a second dependent step (acceptance, then the
             residual race over row n) that this probe leaves out.
  exact      verify(method="exact") on the same inputs, for comparison.
Each kernel is timed at several grid sizes; the table gives the best.
Usage (GPU): python3 benchmarks/probe_b1_floor.py [JSON_OUT]"""
import json
import sys

import cupy as cp
import numpy as np

from specsample_cupy.bench import result_json, verify as bv

SOURCE = r"""
extern "C" __global__ void empty() {}

// Sum over a 256-thread block; thread 0 gets the total.
__device__ float block_sum(float s, float* warp_sum) {
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = s;
  __syncthreads();
  float t = 0.f;
  if (threadIdx.x == 0)
    for (int w = 0; w < 8; ++w) t += warp_sum[w];
  return t;
}

// Parallel decomposition: a grid-stride loop of 16-byte loads over the two logit arrays seen as one
// range; each block reduces its share to one float, publishes it, and the last block to arrive
// (one atomic counter) sums the partials and resets the counter.
extern "C" __global__ void __launch_bounds__(256) read_plus_one(
    const float4* __restrict__ a, long long na, const float4* __restrict__ b, long long nb,
    float* partial, unsigned* counter, float* out) {
  const long long n = na + nb, stride = (long long)gridDim.x * 256;
  float s = 0.f;
  for (long long base = (long long)blockIdx.x * 256 + threadIdx.x; base < n; base += 8 * stride) {
    float4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const long long k = base + u * stride;
      v[u] = k < na ? __ldg(a + k) : (k < n ? __ldg(b + (k - na)) : make_float4(-1e30f, -1e30f, -1e30f, -1e30f));
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) s += exp2f(v[u].x) + exp2f(v[u].y) + exp2f(v[u].z) + exp2f(v[u].w);
  }
  __shared__ float warp_sum[8];
  __shared__ bool last;
  const float block_total = block_sum(s, warp_sum);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = block_total;
    __threadfence();
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  float t = 0.f;
  for (int k = threadIdx.x; k < gridDim.x; k += 256) t += *(volatile float*)(partial + k);
  t = block_sum(t, warp_sum);
  if (threadIdx.x == 0) {
    *out = t;
    *counter = 0;
  }
}
"""


def time_calls(call, reps=40):
    for _ in range(3):
        call(0)
    return bv.device_seconds(cp, call, reps) * 1e6


def main():
    module = cp.RawModule(code=SOURCE)
    empty, read_plus_one = module.get_function("empty"), module.get_function("read_plus_one")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    partial, counter, out = cp.zeros(8 * sms * 8, cp.float32), cp.zeros(1, cp.uint32), cp.zeros(1, cp.float32)
    empty_us = time_calls(lambda k: empty((1,), (1,), ()))
    report = {"device": result_json.gpu_name(0), "empty_kernel_us": empty_us,
              "B": 1, "gamma": 5, "dtype": "float32", "rows": []}
    print(f"empty kernel: {empty_us:.2f} us")
    print("V, dtype float32, B=1, gamma=5: read+1 best (grid) | all grids | exact")
    for V in (32000, 151936, 256000):
        inputs = bv.make_inputs(cp, 1, 5, V, "float32")
        results = {}
        for grid in (sms, 2 * sms, 4 * sms, 8 * sms):
            def call(k, grid=grid):
                _, draft, target = inputs[k % len(inputs)]
                read_plus_one((grid,), (256,), (target, np.int64(target.size // 4), draft, np.int64(draft.size // 4),
                                                partial, counter, out))
            results[grid] = time_calls(call)
        exact = bv.time_method(cp, "exact", inputs, 40)[0] * 1e6
        best = min(results, key=results.get)
        cells = " ".join(f"{g}:{t:.2f}" for g, t in results.items())
        print(f"V={V}: read+1 {results[best]:.2f} us (grid {best}) | {cells} | exact {exact:.2f} us")
        report["rows"].append({"V": V, "read_plus_one_us": results[best], "read_plus_one_grid": best,
                               "read_plus_one_by_grid_us": results, "exact_us": exact,
                               "bytes": (2 * 5 + 1) * V * 4})
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
