// One token from one row of logits: the exponential race of verify.cu's bonus path (argmax_j
// p_j / E_j, E_j ~ Exp(1) from the same Philox words), so it returns what verify_kernel returns with
// gamma = 0, up to float rounding.
//
// One pass over the row. With p_j = exp(z_j / T) / Z, argmax_j p_j / E_j is argmax_j of
// z_j - T log E_j (times T > 0, minus T log Z: the same order), so neither the row's maximum nor
// its sum is needed, and no key overflows however small T is. At T = 0 the pass takes the first
// argmax instead. NaN/+Inf anywhere in the row gives -1, a row with no finite logit (no mass) -2.
// 16-byte loads when the row is aligned (VEC > 1). copy_to, when not null, receives the row as read
// (same storage). warp, when not null, is the row's record from warp_rows.cu (top-k / top-p /
// min-p): entries with M - z > dmax take no part in the race, as verify_kernel's warped mode gives
// them no probability.
//
// Parallel decomposition. pick_in_slice(): one block scans a slice [begin, end) of the row (LOADS
// 16-byte loads in flight per thread) and reduces it to one RowPick (best key and its index, ties to
// the smaller index; whether a bad value was seen). Every entry's key depends on its index only, so
// any slicing picks the same token. sample_row(): one block, the whole row. sample_row_sliced(): K
// blocks per row, one slice each (a slice of a long row is one load round trip; one block would make
// ~V / (LOADS x 256 x VEC) dependent trips, ~20 µs at V = 151936); each publishes its pick, and the
// row's last block to arrive (a counter per row, reset by that block) combines the K picks.
#pragma once
#include "philox.cuh"
#include "block_reduce.cuh"
#include "load.cuh"
#include "warp_record.cuh"

#define SS_ROW_LOADS 4          // row vectors in flight per thread (round_buffers.ROW_LOADS)
#define SS_NOT_LAST (-3)        // sample_row_sliced() in a block that is not its row's last

struct RowPick {   // the best entry of a slice: key (the race's, or the logit at T = 0), index, bad
  float key;
  int idx, bad, pad;
};

__device__ __forceinline__ RowPick better_pick(RowPick a, RowPick b) {
  RowPick r = (a.key > b.key || (a.key == b.key && a.idx < b.idx)) ? a : b;
  r.bad = a.bad | b.bad;
  return r;
}
struct BetterPick {
  __device__ RowPick operator()(RowPick a, RowPick b) const { return better_pick(a, b); }
};

// The token a row's combined pick stands for: -1 bad values, -2 no mass, else the index.
__device__ __forceinline__ int picked_token(const RowPick& p, int V) { return p.bad ? -1 : (p.idx < V ? p.idx : -2); }

template <class T, int VEC>
__device__ __forceinline__ RowPick pick_in_slice(const typename T::storage* __restrict__ row, int begin, int end, float temperature,
                                 unsigned long long seed, unsigned offset, unsigned purpose, unsigned request,
                                 typename T::storage* __restrict__ copy_to, const float* __restrict__ warp) {
  __shared__ RowPick red[SS_WARPS];
  const bool greedy = temperature == 0.f;
  const PhiloxStream ps(seed, offset, request, 0, purpose);
  RowPick best = {-__int_as_float(0x7f800000), 0x7fffffff, 0, 0};
  bool bad = false;
  // Truncation: keep z iff M - z <= dmax; without a record every entry is kept (dmax = +inf).
  const float w_max = warp ? warp[SS_REC_MAX] : 0.f;
  const float w_dmax = warp ? warp[SS_REC_DMAX] : __int_as_float(0x7f800000);
  // LOADS row vectors in flight per thread: a slice of LOADS x SWEEP entries then costs one load
  // round trip. Each thread still visits its indices in increasing order (ties: the first wins).
  constexpr int LOADS = SS_ROW_LOADS, SWEEP = SS_THREADS * VEC;
  for (int base0 = begin + threadIdx.x * VEC; base0 < end; base0 += LOADS * SWEEP) {
    float z[LOADS][VEC];
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
      const int base = base0 + u * SWEEP;
      if (base >= end) continue;
      if (copy_to != nullptr) {
        if constexpr (VEC == 1) {
          copy_to[base] = row[base];
        } else {
          *reinterpret_cast<uint4*>(copy_to + base) = *reinterpret_cast<const uint4*>(row + base);
        }
      }
      load_vec<T, VEC>(row + base, z[u]);
    }
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
      const int base = base0 + u * SWEEP;
      if (base >= end) continue;
#pragma unroll
      for (int k = 0; k < VEC; ++k) bad |= !(z[u][k] < __int_as_float(0x7f800000));
      if (greedy) {
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          if (z[u][k] > best.key) { best.key = z[u][k]; best.idx = base + k; }
      } else {
        float e[VEC];
        race_variates<VEC>(ps, base, e);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float key = fmaf(-temperature, __logf(e[k]), z[u][k]);   // T * log(p_j / E_j) + const
          if (key > best.key && w_max - z[u][k] <= w_dmax) { best.key = key; best.idx = base + k; }
        }
      }
    }
  }
  best.bad = __syncthreads_or(bad);
  return block_reduce(best, BetterPick(), red);  // every thread gets the block's pick
}

// The whole row by one block (every thread must call it; every thread gets the token).
template <class T, int VEC>
__device__ int sample_row(const typename T::storage* __restrict__ row, int V, float temperature,
                          unsigned long long seed, unsigned offset, unsigned purpose, unsigned request,
                          typename T::storage* __restrict__ copy_to, const float* __restrict__ warp = nullptr) {
  return picked_token(pick_in_slice<T, VEC>(row, 0, V, temperature, seed, offset, purpose, request, copy_to, warp), V);
}

// Row b's slices: K per row, the picks [B * K] and a counter per row (zero between launches).
struct RowSlices {
  RowPick* picks;
  int* arrived;
  int K;
};

// Slice k of row b (of K, 16-byte aligned). Every thread of the block must call it. Returns the row's
// token in every thread of the row's last block to finish, SS_NOT_LAST in the others.
template <class T, int VEC>
__device__ __forceinline__ int sample_row_sliced(const RowSlices rs, int b, int k, const typename T::storage* __restrict__ row, int V,
                                 float temperature, unsigned long long seed, unsigned offset, unsigned purpose,
                                 unsigned request, typename T::storage* __restrict__ copy_to,
                                 const float* __restrict__ warp) {
  __shared__ int s_last, s_token;
  const int span = ((V + rs.K - 1) / rs.K + VEC - 1) / VEC * VEC;
  const int begin = min(V, k * span), end = min(V, begin + span);
  const RowPick mine = pick_in_slice<T, VEC>(row, begin, end, temperature, seed, offset, purpose, request, copy_to,
                                             warp);
  if (rs.K == 1) return picked_token(mine, V);
  if (threadIdx.x == 0) {
    rs.picks[(long long)b * rs.K + k] = mine;
    __threadfence();  // the pick is visible before the count that announces it
    s_last = atomicAdd(rs.arrived + b, 1) == rs.K - 1;
  }
  __syncthreads();
  if (!s_last) return SS_NOT_LAST;
  __threadfence();
  if (threadIdx.x < 32) {
    RowPick p = {-__int_as_float(0x7f800000), 0x7fffffff, 0, 0};
    for (int j = threadIdx.x; j < rs.K; j += 32) {
      const int4 w = __ldcg(reinterpret_cast<const int4*>(rs.picks + (long long)b * rs.K + j));
      p = better_pick(p, RowPick{__int_as_float(w.x), w.y, w.z, 0});
    }
    p = warp_reduce(p, BetterPick());
    if (threadIdx.x == 0) {
      s_token = picked_token(p, V);
      rs.arrived[b] = 0;  // for the next launch (stream order)
    }
  }
  __syncthreads();
  return s_token;
}
