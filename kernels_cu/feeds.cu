// Token ids from the sampler and verify() (int32) into a model's int64 input_ids, on the device.
//
// Parallel decomposition: one thread per token of a [rows, cols] block, rows and columns at the
// given pitches: dst[r * dst_pitch + c] = src[r * src_pitch + c]. A negative id (a request whose
// logits were not finite; verify() reports it) is fed as 0, never as an out-of-range index to the
// model's embedding lookup.
extern "C" __global__ void widen_ids(const int* __restrict__ src, int src_pitch, long long* __restrict__ dst,
                                     int dst_pitch, int rows, int cols, int vocab) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= rows * cols) return;
  const int r = k / cols, c = k - r * cols;
  const int t = src[r * src_pitch + c];
  dst[(long long)r * dst_pitch + c] = t < 0 ? 0 : (t < vocab ? t : vocab - 1);
}
