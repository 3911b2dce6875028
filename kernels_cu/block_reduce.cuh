// Block-wide reductions (256-thread blocks unless told): warp shuffles, then one shared-memory round.
#pragma once

#define SS_THREADS 256
#define SS_WARPS (SS_THREADS / 32)

// Online-softmax statistics of a slice: running maximum m, sum of exp(x - m), first argmax.
struct SoftmaxStat {
  float m, s;
  int arg;
};

__device__ __forceinline__ SoftmaxStat combine(SoftmaxStat a, SoftmaxStat b) {
  SoftmaxStat r;
  r.m = fmaxf(a.m, b.m);
  // exp(-inf - finite) is 0; an all -inf pair keeps s = 0 without forming (-inf) - (-inf).
  const float sa = a.m == r.m ? a.s : a.s * __expf(a.m - r.m);
  const float sb = b.m == r.m ? b.s : b.s * __expf(b.m - r.m);
  r.s = sa + sb;
  r.arg = (a.m > b.m || (a.m == b.m && a.arg < b.arg)) ? a.arg : b.arg;
  return r;
}

// Sums of probabilities (already normalisable weights: no rescaling), with the largest value and
// its first index.
__device__ __forceinline__ SoftmaxStat combine_sum(SoftmaxStat a, SoftmaxStat b) {
  SoftmaxStat r;
  r.m = fmaxf(a.m, b.m);
  r.s = a.s + b.s;
  r.arg = (a.m > b.m || (a.m == b.m && a.arg < b.arg)) ? a.arg : b.arg;
  return r;
}

// A race candidate: larger key wins, equal keys go to the lower index.
struct RaceBest {
  float key;
  int idx;
};

__device__ __forceinline__ RaceBest better(RaceBest a, RaceBest b) {
  return (a.key > b.key || (a.key == b.key && a.idx < b.idx)) ? a : b;
}

template <class V, class Op>
__device__ __forceinline__ V warp_reduce(V v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    V w;
    const unsigned* src = reinterpret_cast<const unsigned*>(&v);
    unsigned* dst = reinterpret_cast<unsigned*>(&w);
#pragma unroll
    for (int k = 0; k < (int)(sizeof(V) / 4); ++k) dst[k] = __shfl_xor_sync(0xffffffffu, src[k], o);
    v = op(v, w);
  }
  return v;
}

// Every thread gets the block's result. `scratch` must hold WARPS values (the block's warps); it
// is reusable after the call returns (the trailing barrier protects it).
template <int WARPS = SS_WARPS, class V, class Op>
__device__ __forceinline__ V block_reduce(V v, Op op, V* scratch) {
  v = warp_reduce(v, op);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  V r = scratch[0];
#pragma unroll
  for (int w = 1; w < WARPS; ++w) r = op(r, scratch[w]);
  __syncthreads();
  return r;
}

struct CombineStat {
  __device__ SoftmaxStat operator()(SoftmaxStat a, SoftmaxStat b) const { return combine(a, b); }
};
struct CombineSum {
  __device__ SoftmaxStat operator()(SoftmaxStat a, SoftmaxStat b) const { return combine_sum(a, b); }
};
struct BetterRace {
  __device__ RaceBest operator()(RaceBest a, RaceBest b) const { return better(a, b); }
};
// The race's two winners (the residual's or bonus row's, and p's: the fallback), reduced together:
// one round of shared memory and barriers where each took one.
struct RacePair {
  RaceBest res, pb;
};
struct BetterPair {
  __device__ RacePair operator()(RacePair a, RacePair b) const {
    return RacePair{better(a.res, b.res), better(a.pb, b.pb)};
  }
};
// The last P2 block's reduction over the slices: both winners, SIGMOID_PAPER's residual sum and the
// sigmoid methods' masses (OR), in one round. (In a slice's own reduction the two extra words push
// the sigmoid methods past 64 registers: there they keep their own rounds.)
struct RaceSlice {
  RacePair won;
  float rsum;
  int checks;
};
struct CombineRaceSlice {
  __device__ RaceSlice operator()(RaceSlice a, RaceSlice b) const {
    return RaceSlice{BetterPair()(a.won, b.won), a.rsum + b.rsum, a.checks | b.checks};
  }
};
struct MaxFloat {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct AddFloat {
  __device__ float operator()(float a, float b) const { return a + b; }
};
