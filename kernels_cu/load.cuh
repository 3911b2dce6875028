// Reading logits: fp32/fp16/bf16 storage decoded to fp32, 16-byte vector loads, fast exp2, and
// the race's Exp(1) variates for a vector of consecutive vocabulary ids.
#pragma once
#include "philox.cuh"

__device__ __forceinline__ float ex2_approx(float x) {  // 2^x, ~2 ulp; 0 for -inf
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float rcp_approx(float x) {  // 1 / x, ~1 ulp; 0 for +inf
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// max(a, b), NaN when either is NaN (fmaxf drops a NaN): one instruction on sm_80+, so a running
// maximum also carries the NaN / +Inf check of every element it has seen.
__device__ __forceinline__ float max_nan(float a, float b) {
  float y;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
  return y;
}

struct f32 { typedef float storage; };
struct f16 { typedef unsigned short storage; };
struct bf16 { typedef unsigned short storage; };

template <class T> __device__ __forceinline__ float decode(typename T::storage v);
template <> __device__ __forceinline__ float decode<f32>(float v) { return v; }
template <> __device__ __forceinline__ float decode<f16>(unsigned short v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
  return f;
}
template <> __device__ __forceinline__ float decode<bf16>(unsigned short v) {
  return __uint_as_float(((unsigned)v) << 16);
}

// VEC consecutive elements starting at p (16-byte aligned when VEC > 1), as float.
template <class T, int VEC>
__device__ __forceinline__ void load_vec(const typename T::storage* p, float (&out)[VEC]) {
  if constexpr (VEC == 1) {
    out[0] = decode<T>(p[0]);
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (sizeof(typename T::storage) == 4) {
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k] = __uint_as_float(w[k]);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        out[2 * k] = decode<T>((unsigned short)(w[k] & 0xffffu));
        out[2 * k + 1] = decode<T>((unsigned short)(w[k] >> 16));
      }
    }
  }
}

// VEC race variates for indices base .. base+VEC-1 (base a multiple of VEC).
template <int VEC>
__device__ __forceinline__ void race_variates(const PhiloxStream& ps, int base, float (&e)[VEC]) {
  if constexpr (VEC == 1) {
    e[0] = race_exponential(ps.word((unsigned)base));
  } else {
#pragma unroll
    for (int g = 0; g < VEC / 4; ++g) {
      const uint4 w = ps.block((unsigned)(base >> 2) + g);
      e[4 * g] = race_exponential(w.x);
      e[4 * g + 1] = race_exponential(w.y);
      e[4 * g + 2] = race_exponential(w.z);
      e[4 * g + 3] = race_exponential(w.w);
    }
  }
}

