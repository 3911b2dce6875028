// Counter-based Philox4x32-10 (Salmon et al., SC'11), bit-identical to specsample_cupy/runtime/philox.py.
// key = (seed lo, seed hi); counter = (index >> 2, purpose << 16 | position, request, offset);
// the random word is lane (index & 3) of the result.
#pragma once
// SS_PURPOSE_* (the purpose field of the counter) are generated from specsample_cupy/runtime/philox.py.
#include "codes.cuh"

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, unsigned k0, unsigned k1) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    const unsigned hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const unsigned hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
  }
  return c;
}

struct PhiloxStream {  // the fixed part of the counter for one (request, position, purpose)
  unsigned k0, k1, c1, c2, c3;
  __device__ PhiloxStream(unsigned long long seed, unsigned offset, unsigned request,
                          unsigned position, unsigned purpose)
      : k0((unsigned)seed), k1((unsigned)(seed >> 32)), c1((purpose << 16) | position),
        c2(request), c3(offset) {}
  // The four words for indices 4*group .. 4*group+3.
  __device__ __forceinline__ uint4 block(unsigned group) const {
    return philox4x32_10(make_uint4(group, c1, c2, c3), k0, k1);
  }
  __device__ __forceinline__ unsigned word(unsigned index) const {
    const uint4 w = block(index >> 2);
    const unsigned lane = index & 3u;
    return lane == 0 ? w.x : lane == 1 ? w.y : lane == 2 ? w.z : w.w;
  }
};

// [0, 1) with 24 random bits: exact in float32, identical to acceptance_uniform() in runtime/philox.py.
__device__ __forceinline__ float acceptance_uniform(unsigned bits) {
  return (float)(bits >> 8) * 5.9604644775390625e-08f;  // 2^-24
}

// Exp(1) = -log(U), U = ((bits >> 9) + 0.5) * 2^-23 in (0, 1): never 0, never infinite.
__device__ __forceinline__ float race_exponential(unsigned bits) {
  return -__logf(((float)(bits >> 9) + 0.5f) * 1.1920928955078125e-07f);  // 2^-23
}
