"""Latency floors for the B = 1 verification shape, timed like `bench verify` (events around each call,
calls queued behind a busy kernel): what a launch, one read of the rows, and each grid-wide hand-off
cost on their own, so the exact kernel's time can be split into the parts a redesign can remove.

    python benchmarks/floor_b1.py
"""
import statistics

import cupy as cp

from specsample_cupy import bench_verify as bv

SRC = r"""
extern "C" __global__ void empty_kernel() {}

// Each block reduces a contiguous slice of n floats to a max, 16-byte loads; `phases` hand-offs:
// phase 1 publishes partials and (if phases == 2) every block waits until all have published,
// then re-reduces the partials (as a statistics pass followed by a race would); the last block
// to finish writes the result and resets the counters.
extern "C" __global__ void __launch_bounds__(256) read_reduce(const float4* __restrict__ x, long long n4,
        float* partial, unsigned int* counters, float* out, int phases) {
    __shared__ float red[8];
    __shared__ bool last;
    long long per = (n4 + gridDim.x - 1) / gridDim.x;
    long long lo = per * blockIdx.x, hi = min(n4, lo + per);
    float m = -3.4e38f;
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float4 v = x[i];
        m = fmaxf(m, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
    }
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; ++w) m = fmaxf(m, red[w]);
        partial[blockIdx.x] = m;
    }
    if (phases == 2) {
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(&counters[0], 1u);
            while (atomicAdd(&counters[0], 0u) < gridDim.x) { }
            __threadfence();
        }
        __syncthreads();
        float r = -3.4e38f;
        for (int i = threadIdx.x; i < gridDim.x; i += blockDim.x) r = fmaxf(r, ((volatile float*)partial)[i]);
        for (int o = 16; o; o >>= 1) r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, o));
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = r;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < 8; ++w) r = fmaxf(r, red[w]);
            partial[gridDim.x + blockIdx.x] = r;
        }
    }
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&counters[1], 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        __threadfence();
        float r = -3.4e38f;
        for (int i = 0; i < gridDim.x; ++i) r = fmaxf(r, ((volatile float*)partial)[(phases - 1) * gridDim.x + i]);
        *out = r;
        counters[0] = 0; counters[1] = 0;
    }
}
"""


def timed(fn, reps=200):
    stream = cp.cuda.get_current_stream()
    for _ in range(10):
        fn()
    starts = [cp.cuda.Event() for _ in range(reps)]
    ends = [cp.cuda.Event() for _ in range(reps)]
    bv.hold_device(cp, 0.02)
    for s, e in zip(starts, ends):
        s.record(stream)
        fn()
        e.record(stream)
    ends[-1].synchronize()
    return statistics.median(cp.cuda.get_elapsed_time(s, e) for s, e in zip(starts, ends)) * 1e3


def main():
    mod = cp.RawModule(code=SRC)
    empty, rr = mod.get_function("empty_kernel"), mod.get_function("read_reduce")
    partial = cp.zeros(4096, cp.float32)
    counters = cp.zeros(2, cp.uint32)
    out = cp.zeros(1, cp.float32)
    print(f"empty <<<1,32>>>     {timed(lambda: empty((1,), (32,), ())):6.2f} us")
    print(f"empty <<<528,256>>>  {timed(lambda: empty((528,), (256,), ())):6.2f} us")
    for V in (32000, 256000):
        x = cp.random.standard_normal(11 * V, dtype=cp.float32)
        n4 = cp.int64(x.size // 4)
        for grid in (132, 264, 528):
            for phases in (1, 2):
                us = timed(lambda: rr((grid,), (256,), (x, n4, partial, counters, out, cp.int32(phases))))
                ok = float(out[0]) == float(x.max())
                print(f"read 11 rows V={V:6d} grid={grid:3d} hand-offs={phases}: {us:6.2f} us  "
                      f"{'ok' if ok else 'WRONG'}", flush=True)


if __name__ == "__main__":
    main()
