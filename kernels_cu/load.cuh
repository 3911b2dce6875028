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
struct f16 { typedef unsigned short storage; static constexpr unsigned short neg_inf_bits = 0xfc00; };
struct bf16 { typedef unsigned short storage; static constexpr unsigned short neg_inf_bits = 0xff80; };

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

// VEC consecutive elements as loaded (one 16-byte word when VEC > 1), decoded later: a load in
// flight holds four registers whatever the dtype.
template <class T, int VEC>
struct RawVec {
  uint4 w;
  __device__ __forceinline__ void load(const typename T::storage* p) { w = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void set_neg_inf() {   // every element -inf
    unsigned x = 0xff800000u;
    if constexpr (sizeof(typename T::storage) == 2) x = T::neg_inf_bits | ((unsigned)T::neg_inf_bits << 16);
    w = make_uint4(x, x, x, x);
  }
  __device__ __forceinline__ void decode_to(float (&out)[VEC]) const {
    const unsigned k4[4] = {w.x, w.y, w.z, w.w};
    if constexpr (sizeof(typename T::storage) == 4) {
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k] = __uint_as_float(k4[k]);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        out[2 * k] = decode<T>((unsigned short)(k4[k] & 0xffffu));
        out[2 * k + 1] = decode<T>((unsigned short)(k4[k] >> 16));
      }
    }
  }
};
template <class T>
struct RawVec<T, 1> {
  typename T::storage w;
  __device__ __forceinline__ void load(const typename T::storage* p) { w = p[0]; }
  __device__ __forceinline__ void set_neg_inf() {
    if constexpr (sizeof(typename T::storage) == 4) w = __uint_as_float(0xff800000u);
    else w = (typename T::storage)T::neg_inf_bits;
  }
  __device__ __forceinline__ void decode_to(float (&out)[1]) const { out[0] = decode<T>(w); }
};

// VEC consecutive elements starting at p (16-byte aligned when VEC > 1), as float.
template <class T, int VEC>
__device__ __forceinline__ void load_vec(const typename T::storage* p, float (&out)[VEC]) {
  RawVec<T, VEC> raw;
  raw.load(p);
  raw.decode_to(out);
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

