// Fused speculative-sampling verification: softmax statistics, acceptance, first rejection and
// residual/bonus sampling in ONE launch, for any batch size.
//
// Parallel decomposition. A persistent grid (no more blocks than fit on the GPU at once) walks a
// list of work items with a grid stride. Items are ordered request by request:
//   P1(b, row, slice)  one 256-thread block reduces a vocabulary slice of one row of request b to
//                      online-softmax statistics (max, sum exp, first argmax), read once with
//                      16-byte loads. Rows are the gamma+1 target rows then the gamma draft rows.
//                      It publishes its partial and bumps the request's counter.
//   P2(b, slice)       waits until every P1 item of request b is counted, combines the rows'
//                      partials (one warp per row, into shared memory), finds the first rejection
//                      n with warp 0 (one lane per draft position, ballot), then runs an
//                      exponential race (argmax r_j / E_j, E_j ~ Exp(1) from Philox) over its slice
//                      of row n: r = max(0, p - q) for a rejection, r = p for the bonus token.
//                      The last P2 block of request b (atomic counter) reduces the slice winners
//                      and writes accepted / emitted / tokens / error, then zeroes the counters.
// The race needs no prefix sum, so the residual is sampled by all slices in parallel and no
// [gamma, V] probability, ratio or residual matrix is ever written. A P2 item only waits on P1
// items that come earlier in the list and whose blocks are resident (grid <= occupancy), so the
// wait always ends. Requests' row n was read moments before by P1, so its re-read hits L2.
// MODE_SIGMOID has no P1 items: the paper's element-wise sigmoid needs no row statistics.
#include "philox.cuh"
#include "block_reduce.cuh"
#include "load.cuh"
#include "handoff.cuh"

#define SS_MODE_LOGITS 0
#define SS_MODE_PROBS 1
#define SS_MODE_SIGMOID 2

// Error codes, as in specsample_cupy/errors.py.
#define SS_ERR_TARGET 1
#define SS_ERR_DRAFT 2
#define SS_ERR_TOKEN 4
#define SS_ERR_NO_MASS 8
#define SS_ERR_LENGTH 16
#define SS_ERR_TEMPERATURE 32

#define SS_INF __int_as_float(0x7f800000)

__device__ __forceinline__ SoftmaxStat load_stat(const int* p) {
  SoftmaxStat s;
  s.m = __int_as_float(__ldcg(p));
  s.s = __int_as_float(__ldcg(p + 1));
  s.arg = __ldcg(p + 2);
  return s;
}
__device__ __forceinline__ void store_stat(int* p, SoftmaxStat s) {
  p[0] = __float_as_int(s.m);
  p[1] = __float_as_int(s.s);
  p[2] = s.arg;
}

struct Request {
  int L;         // draft tokens to verify, in [0, G]
  float inv_t;   // 1 / temperature (1 for greedy requests)
  bool greedy;   // temperature 0: accept while the draft is the target's argmax
  int errs;
};

template <class T, class TOK, int VEC, int MODE>
struct Verifier {
  typedef typename T::storage S;
  // 16-byte loads in flight per thread in P1 (fewer for 16-bit probabilities: they would spill).
  static constexpr int LOADS = VEC == 4 ? 8 : (MODE == SS_MODE_PROBS ? 2 : 4);

  const TOK* draft_tokens;
  const S* draft;
  const S* target;
  const int* lengths;
  const float* temps;
  float temp_scalar;
  unsigned long long seed;
  unsigned offset;
  float sig_offset, sig_inv_scale;
  unsigned race_purpose;
  int B, G, V, S1, C1, S2, C2, R;
  int *req_ctr, *fin_ctr, *err, *part, *cand;
  SoftmaxStat* rows;  // shared: the combined statistics of every row of the current P2 request
  int *accepted, *emitted, *error, *tokens;

  __device__ __forceinline__ Request request(int b) const {
    Request rq;
    rq.errs = 0;
    float t = temps ? temps[b] : temp_scalar;
    if (!(t >= 0.f && t < SS_INF)) { rq.errs |= SS_ERR_TEMPERATURE; t = 1.f; }
    rq.greedy = MODE != SS_MODE_SIGMOID && t == 0.f;
    rq.inv_t = t == 0.f ? 1.f : 1.f / t;
    rq.L = lengths ? lengths[b] : G;
    if (rq.L < 0 || rq.L > G) { rq.errs |= SS_ERR_LENGTH; rq.L = min(max(rq.L, 0), G); }
    return rq;
  }

  __device__ const S* target_row(int b, int i) const { return target + ((long long)b * (G + 1) + i) * V; }
  __device__ const S* draft_row(int b, int i) const { return draft + ((long long)b * G + i) * V; }

  // Invalid values seen by any lane: one atomic per warp, only when it happens. (No block-wide
  // vote: the barriers that follow order it before this block's counter update.)
  __device__ __forceinline__ void flag_bad(bool bad, int b, int code) const {
    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) atomicOr(err + b, code);
  }

  // ---- P1: statistics of one vocabulary slice of one row -------------------------------------
  // Per element: one compare for NaN/+Inf, a max, and for sampling rows one FFMA + ex2 + add
  // (exp(x / T - m) = 2^(x c - m c) with c = log2(e) / T); greedy rows track the first argmax and
  // skip the exponentials. The running maximum is kept in raw logit units and scaled at the end.
  template <bool ARGMAX>
  __device__ __forceinline__ void scan_slice(const S* row, int lo, int hi, float inv_t, SoftmaxStat& st, bool& bad) const {
    constexpr int STEP = SS_THREADS * VEC;
    const float c = inv_t * 1.4426950408889634f;
    float m = -SS_INF;
    for (int base = lo + threadIdx.x * VEC; base < hi; base += LOADS * STEP) {
      float v[LOADS][VEC];
#pragma unroll
      for (int u = 0; u < LOADS; ++u) {
        if (base + u * STEP < hi) {
          load_vec<T, VEC>(row + base + u * STEP, v[u]);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) v[u][e] = MODE == SS_MODE_PROBS ? 0.f : -SS_INF;
        }
      }
      if constexpr (MODE == SS_MODE_PROBS) {
#pragma unroll
        for (int u = 0; u < LOADS; ++u)
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            bad |= !(v[u][e] >= 0.f && v[u][e] < SS_INF);
            st.s += v[u][e];
          }
      } else {
        float gm = -SS_INF;
        int garg = 0x7fffffff;
#pragma unroll
        for (int u = 0; u < LOADS; ++u)
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            bad |= !(v[u][e] < SS_INF);
            if constexpr (ARGMAX) {
              if (v[u][e] > gm) { gm = v[u][e]; garg = base + u * STEP + e; }
            } else {
              gm = fmaxf(gm, v[u][e]);
            }
          }
        if constexpr (ARGMAX) {
          if (gm > m) { m = gm; st.arg = garg; }
        } else {
          if (gm > m) {
            st.s *= ex2_approx((m - gm) * c);
            m = gm;
          }
          if (m != -SS_INF) {
            const float mc = m * c;
#pragma unroll
            for (int u = 0; u < LOADS; ++u)
#pragma unroll
              for (int e = 0; e < VEC; ++e) st.s += ex2_approx(fmaf(v[u][e], c, -mc));
          }
        }
      }
    }
    if constexpr (MODE != SS_MODE_PROBS) st.m = m * inv_t;
  }

  __device__ __forceinline__ void phase1(int b, int r, int s, SoftmaxStat* red) const {
    const Request rq = request(b);
    const bool is_target = r <= G;
    const int i = is_target ? r : r - G - 1;
    const bool active = is_target ? i <= rq.L : (i < rq.L && !rq.greedy);
    if (active) {
      SoftmaxStat st = {MODE == SS_MODE_PROBS ? 0.f : -SS_INF, 0.f, 0x7fffffff};
      bool bad = false;
      const int lo = s * C1, hi = min(V, lo + C1);
      const S* row = is_target ? target_row(b, i) : draft_row(b, i);
      if (rq.greedy) scan_slice<true>(row, lo, hi, rq.inv_t, st, bad);
      else scan_slice<false>(row, lo, hi, rq.inv_t, st, bad);
      flag_bad(bad, b, is_target ? SS_ERR_TARGET : SS_ERR_DRAFT);
      st = block_reduce(st, CombineStat(), red);
      if (threadIdx.x == 0) store_stat(part + ((long long)(b * R + r) * S1 + s) * 3, st);
    }
    // Only thread 0 wrote; its fence publishes the partial before the count that announces it.
    if (threadIdx.x == 0) {
      publish_add(req_ctr + b, 1);
    }
  }

  // P2, after the wait: combine each active row's slice statistics into shared memory, one warp
  // per row. Returns (via *no_mass) whether an active row has no probability mass.
  __device__ __forceinline__ void combine_rows(int b, const Request& rq, int* no_mass) const {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = warp; r < R; r += SS_WARPS) {
      const bool is_target = r <= G;
      const int i = is_target ? r : r - G - 1;
      if (!(is_target ? i <= rq.L : (i < rq.L && !rq.greedy))) continue;
      SoftmaxStat st = {MODE == SS_MODE_PROBS ? 0.f : -SS_INF, 0.f, 0x7fffffff};
      const int* rp = part + (long long)(b * R + r) * S1 * 3;
      for (int k = lane; k < S1; k += 32) st = combine(st, load_stat(rp + 3 * k));
      st = warp_reduce(st, CombineStat());
      if (lane == 0) {
        rows[r] = st;
        if (MODE == SS_MODE_PROBS ? !(st.s > 0.f) : st.m == -SS_INF) *no_mass = 1;
      }
    }
  }

  // ---- P2: acceptance and the race over one slice of the emitted row -------------------------
  // c = log2(e) / T, mc = log2(e) * m (m in scaled units), as in scan_slice.
  __device__ __forceinline__ float weight(float v, float inv_t, float c, float mc, float inv_s) const {
    if constexpr (MODE == SS_MODE_LOGITS) return ex2_approx(fmaf(v, c, -mc)) * inv_s;
    else if constexpr (MODE == SS_MODE_PROBS) return v * inv_s;
    else return 1.f / (1.f + __expf(-(v * inv_t - sig_offset) * sig_inv_scale));
  }

  // What the acceptance test of draft position i needs from the inputs alone (no statistics),
  // so warp 0 can load it while the rows are still being reduced.
  struct Gathered {
    int x;
    float z, y, u;  // temperature-scaled target and draft logit at x, acceptance uniform
    bool in_range;
  };

  __device__ __forceinline__ Gathered gather(int b, int i, const Request& rq) const {
    Gathered g = {0, 0.f, 0.f, 0.f, false};
    if (i < rq.L) {
      const long long x = (long long)draft_tokens[(long long)b * G + i];
      g.in_range = x >= 0 && x < V;
      if (g.in_range) {
        g.x = (int)x;
        g.z = decode<T>(target_row(b, i)[x]) * rq.inv_t;
        if (!rq.greedy) g.y = decode<T>(draft_row(b, i)[x]) * rq.inv_t;
        g.u = acceptance_uniform(PhiloxStream(seed, offset, b, 0, SS_PURPOSE_ACCEPT).word(i));
      }
    }
    return g;
  }

  // Is the gathered draft token accepted? u q(x) <= p(x) and p(x) > 0 (greedy: x is the argmax).
  __device__ __forceinline__ bool accepts(int b, int i, const Gathered& g, const Request& rq) const {
    if constexpr (MODE == SS_MODE_SIGMOID) {
      const float p = 1.f / (1.f + expf(-(g.z - sig_offset) * sig_inv_scale));
      const float q = 1.f / (1.f + expf(-(g.y - sig_offset) * sig_inv_scale));
      return p > 0.f && g.u * q <= p;
    } else {
      const SoftmaxStat sp = rows[i];
      if (rq.greedy) return g.x == sp.arg;
      const SoftmaxStat sq = rows[G + 1 + i];
      const float p = MODE == SS_MODE_PROBS ? g.z / sp.s : expf(g.z - sp.m) / sp.s;
      const float q = MODE == SS_MODE_PROBS ? g.y / sq.s : expf(g.y - sq.m) / sq.s;
      return p > 0.f && g.u * q <= p;
    }
  }

  // Warp 0: first rejected position (or L) and request-level errors. `first` holds this lane's
  // gathered position `lane` (positions 32.. are gathered here).
  __device__ __forceinline__ void first_rejection(int b, const Request& rq, const Gathered& first,
                                                  int* s_n, int* s_err) const {
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    int n = rq.L, errs = rq.errs;
    for (int base = 0; base < rq.L; base += 32) {
      const int i = base + lane;
      bool reject = false;
      if (i < rq.L) {
        const Gathered g = base == 0 ? first : gather(b, i, rq);
        if (!g.in_range) { errs |= SS_ERR_TOKEN; reject = true; }
        else reject = !accepts(b, i, g, rq);
      }
      errs = __reduce_or_sync(0xffffffffu, errs);
      const unsigned m = __ballot_sync(0xffffffffu, reject);
      if (m) { n = base + __ffs(m) - 1; break; }
    }
    if (lane == 0) { *s_n = n; *s_err = errs; }
  }

  __device__ __forceinline__ void phase2(int b, int s, RaceBest* red, int* sh) const {
    const Request rq = request(b);
    Gathered first = {0, 0.f, 0.f, 0.f, false};
    if (threadIdx.x < 32) first = gather(b, threadIdx.x, rq);
    if constexpr (MODE != SS_MODE_SIGMOID) {
      // Warp 0 spins in lock-step (lane 0 reads, the value is broadcast) so the warp reaches the
      // barrier converged; a lone spinning lane would let its warp arrive at the barrier split.
      if (threadIdx.x < 32) {
        const int items = R * S1;
        int ready;
        do {
          ready = __shfl_sync(0xffffffffu, threadIdx.x == 0 ? poll(req_ctr + b) : 0, 0);
          if (ready < items) __nanosleep(32);
        } while (ready < items);
#ifndef SS_FAST_HANDOFF
        __threadfence();
#endif
      }
      if (threadIdx.x == 0) sh[4] = 0;
      __syncthreads();
      combine_rows(b, rq, sh + 4);
      __syncthreads();
    }
    first_rejection(b, rq, first, sh + 0, sh + 1);
    __syncthreads();
    const int n = sh[0];
    const int errs = sh[1] | (MODE != SS_MODE_SIGMOID ? __ldcg(err + b) | (sh[4] ? SS_ERR_NO_MASS : 0) : 0);

    RaceBest res = {-1.f, 0x7fffffff}, pb = {-1.f, 0x7fffffff};
    bool bad = false;
    if (!errs && !rq.greedy) {
      const bool bonus = n >= rq.L;
      const S* zrow = target_row(b, n);
      const S* yrow = bonus ? zrow : draft_row(b, n);
      SoftmaxStat sp = {0.f, 1.f, 0}, sq = {0.f, 1.f, 0};
      if constexpr (MODE != SS_MODE_SIGMOID) {
        sp = rows[n];
        if (!bonus) sq = rows[G + 1 + n];
      }
      const float inv_sp = 1.f / sp.s, inv_sq = 1.f / sq.s;
      const float c = rq.inv_t * 1.4426950408889634f;
      const float mcp = sp.m * 1.4426950408889634f, mcq = sq.m * 1.4426950408889634f;
      const PhiloxStream ps(seed, offset, b, n, race_purpose);
      const int lo = s * C2, hi = min(V, lo + C2);
      for (int base = lo + threadIdx.x * VEC; base < hi; base += SS_THREADS * VEC) {
        float z[VEC], y[VEC], e[VEC];
        load_vec<T, VEC>(zrow + base, z);
        if (!bonus) load_vec<T, VEC>(yrow + base, y);
        race_variates<VEC>(ps, base, e);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          if constexpr (MODE == SS_MODE_SIGMOID) {
            bad |= (z[k] != z[k]) || (z[k] == SS_INF);
            if (!bonus) bad |= (y[k] != y[k]) || (y[k] == SS_INF);
          }
          const float wp = weight(z[k], rq.inv_t, c, mcp, inv_sp);
          const float wq = bonus ? 0.f : weight(y[k], rq.inv_t, c, mcq, inv_sq);
          const float kr = wp - wq > 0.f ? __fdividef(wp - wq, e[k]) : -1.f;
          const float kp = wp > 0.f ? __fdividef(wp, e[k]) : -1.f;
          if (kr > res.key) { res.key = kr; res.idx = base + k; }
          if (kp > pb.key) { pb.key = kp; pb.idx = base + k; }
        }
      }
    }
    if constexpr (MODE == SS_MODE_SIGMOID) flag_bad(bad, b, SS_ERR_TARGET);
    res = block_reduce(res, BetterRace(), red);
    pb = block_reduce(pb, BetterRace(), red);
    if (threadIdx.x == 0) {
      int* c = cand + ((long long)b * S2 + s) * 4;
      c[0] = __float_as_int(res.key); c[1] = res.idx;
      c[2] = __float_as_int(pb.key); c[3] = pb.idx;
      sh[2] = publish_add(fin_ctr + b, 1) == S2 - 1;
    }
    __syncthreads();
    if (!sh[2]) return;
    finish(b, rq, n, red, sh);
  }

  // Last P2 block of request b: reduce the slices' winners and write the outputs.
  __device__ __forceinline__ void finish(int b, const Request& rq, int n, RaceBest* red, int* sh) const {
    RaceBest res = {-1.f, 0x7fffffff}, pb = {-1.f, 0x7fffffff};
    for (int k = threadIdx.x; k < S2; k += SS_THREADS) {
      const int* c = cand + ((long long)b * S2 + k) * 4;
      res = better(res, RaceBest{__int_as_float(__ldcg(c)), __ldcg(c + 1)});
      pb = better(pb, RaceBest{__int_as_float(__ldcg(c + 2)), __ldcg(c + 3)});
    }
    res = block_reduce(res, BetterRace(), red);
    pb = block_reduce(pb, BetterRace(), red);
    if (threadIdx.x == 0) {
      int errs = sh[1] | __ldcg(err + b) | (MODE != SS_MODE_SIGMOID && sh[4] ? SS_ERR_NO_MASS : 0);
      int token = -1;
      if (!errs) {
        if (rq.greedy) token = rows[n].arg;
        else token = res.key > 0.f ? res.idx : (pb.key > 0.f ? pb.idx : -1);
        if (token < 0) errs |= SS_ERR_NO_MASS;
      }
      sh[3] = token;
      sh[1] = errs;
      accepted[b] = errs ? -1 : n;
      emitted[b] = errs ? 0 : n + 1;
      error[b] = errs;
      fin_ctr[b] = 0;
      req_ctr[b] = 0;
      err[b] = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i <= G; i += SS_THREADS) {
      int t = -1;
      if (!sh[1]) t = i < n ? (int)draft_tokens[(long long)b * G + i] : (i == n ? sh[3] : -1);
      tokens[(long long)b * (G + 1) + i] = t;
    }
  }
};

template <class T, class TOK, int VEC, int MODE>
__global__ void __launch_bounds__(SS_THREADS, MODE == SS_MODE_PROBS ? 3 : 4) verify_kernel(
    const TOK* draft_tokens, const typename T::storage* draft, const typename T::storage* target,
    const int* lengths, const float* temps, float temp_scalar,
    unsigned long long seed, const long long* seed_ptr, unsigned long long offset, const long long* offset_ptr,
    float sig_offset, float sig_scale, unsigned race_purpose,
    int B, int G, int V, int S1, int C1, int S2, int C2, int lag_requests,
    int* ws, long long part_off, long long cand_off, int* out) {
  __shared__ SoftmaxStat red_stat[SS_WARPS];
  __shared__ RaceBest red_race[SS_WARPS];
  __shared__ int sh[5];
  extern __shared__ int dynamic_smem[];  // R SoftmaxStat: the combined rows in P2
  Verifier<T, TOK, VEC, MODE> v;
  v.draft_tokens = draft_tokens; v.draft = draft; v.target = target;
  v.lengths = lengths; v.temps = temps; v.temp_scalar = temp_scalar;
  v.seed = seed_ptr ? (unsigned long long)*seed_ptr : seed;
  v.offset = (unsigned)(offset_ptr ? (unsigned long long)*offset_ptr : offset);
  v.sig_offset = sig_offset; v.sig_inv_scale = 1.f / sig_scale; v.race_purpose = race_purpose;
  v.B = B; v.G = G; v.V = V; v.S1 = S1; v.C1 = C1; v.S2 = S2; v.C2 = C2;
  v.R = MODE == SS_MODE_SIGMOID ? 0 : 2 * G + 1;
  const int R = v.R;
  v.req_ctr = ws; v.fin_ctr = ws + B; v.err = ws + 2 * B;
  v.part = ws + part_off; v.cand = ws + cand_off;
  v.rows = reinterpret_cast<SoftmaxStat*>(dynamic_smem);
  v.accepted = out; v.emitted = out + B; v.error = out + 2 * B; v.tokens = out + 3 * B;

  // Item order: group g holds the P1 items of request g, then the P2 items of request g - lag.
  // The lag (in requests, about a wave of the grid) lets a request's rows finish before blocks
  // reach its P2 items, so they rarely wait; every P2 item still follows its request's P1 items.
  const long long A = (long long)R * S1;
  const int lag = min(lag_requests, B);
  const long long region_a = lag * A, region_b = (B - lag) * (A + S2), total = region_a + region_b + (long long)lag * S2;
  for (long long item = blockIdx.x; item < total; item += gridDim.x) {
    int b;
    long long k;
    bool first_phase;
    if (item < region_a) {
      b = (int)(item / A); k = item % A; first_phase = true;
    } else if (item < region_a + region_b) {
      const long long t = item - region_a;
      const int g = lag + (int)(t / (A + S2));
      k = t % (A + S2);
      first_phase = k < A;
      if (first_phase) b = g;
      else { b = g - lag; k -= A; }
    } else {
      const long long t = item - region_a - region_b;
      b = B + (int)(t / S2) - lag; k = t % S2; first_phase = false;
    }
    if (first_phase) v.phase1(b, (int)(k / S1), (int)(k % S1), red_stat);
    else v.phase2(b, (int)k, red_race, sh);
    __syncthreads();  // shared flags are reused by the next item
  }
}
