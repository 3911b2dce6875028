// Fused speculative-sampling verification: row checks, softmax statistics, acceptance, first
// rejection and residual/bonus sampling in ONE launch, for any batch size.
//
// Parallel decomposition. A grid of 256-thread blocks (by default as many as fit on the GPU at
// once; any number is correct) takes work items IN ORDER from an atomic ticket counter: a block
// takes the next ticket, runs that item, takes the next, until the tickets run out. Items are
// ordered request by request:
//   P1(b, row, slice)  one block reduces a vocabulary slice of one active row of request b, read
//                      once with 16-byte loads: NaN/+Inf (probabilities: also negative) checks,
//                      whose bits go in the slice's partial, and the row statistics: online softmax (max, sum exp;
//                      greedy rows: max and first argmax), for probabilities the sum of the valid
//                      entries (greedy rows: also the first argmax). Rows are the gamma+1 target
//                      rows then the gamma draft rows. It publishes its partial and bumps the
//                      request's counter (inactive rows only bump it). The sigmoid methods have no
//                      P1 items: their acceptance needs two token logits per position; and no
//                      ticket: none of their items waits for another, so each block strides over them.
//   P2(b, slice)       exact / probs / greedy: waits until every P1 item of request b is counted,
//                      combines the rows' partials, checks included (one warp per row, into shared
//                      memory, so the decisions below read no other global memory). Then
//                      warp 0 (one lane per draft position, ballot) finds the position n where
//                      verification stops: the first rejection, or the first position whose data
//                      is invalid (first_rejection(): only the rows a decision reads are
//                      validated). Sigmoid: warp 0 gathers the token logits and decides at once.
//                      Then an exponential race (argmax r_j / E_j, E_j ~ Exp(1) from Philox) over
//                      its slice of row n: r = max(0, p - q) for a rejection, r = p for the bonus
//                      token; the sigmoid methods check the rows at n in the same pass (they are
//                      the only rows they read in full).
//                      The last P2 block of request b (atomic counter) reduces the slice winners
//                      and writes accepted / emitted / tokens / error, then zeroes the request's
//                      counters.
// The walk order (exact, probabilities and greedy, when the plan asks: for large batches, where the
// grid is full and rows past a request's first rejection are wasted bandwidth): the P1 items run
// position by position across the batch, target row i and draft row i of every request, then the
// P2 items. A P1 item skips its row when its request is already known to have stopped before its
// position (it never waits: one handed out earlier reads its row, unused). Position i's counter
// counts its rows' slices and, for i > 0, position i - 1's decision to go on; whoever completes it
// decides position i (the first_rejection() rule for one position), publishing a stop or counting
// itself into position i + 1, and so on. P2 then reads the stop and combines only the rows at n.
// Items handed out after their request's stop is known (the later part of an oversubscribed grid)
// are what the walk saves; the decisions, one position after another, are what it costs.
// SS_MODE_MIN_P (min-p truncation alone, fused): a P1 slice of one register load group (small
// batches) is kept in registers while the row's slices agree on its maximum M (each publishes its
// own through an atomic max on order-preserving keys and counts itself in on a per-row counter,
// then waits for the row's count); then it sums exp((z - M) / T) over its entries with M - z <= span
// (verification/truncation.py's rule) from the registers, so the row is read once, as in plain exact. A longer slice
// (large batches give a block a whole row, and then no agreement is needed) keeps per warp a
// shared-memory list of the entries within the span of the warp's running maximum and sums the
// kept ones from it (scan_kept_lists). The wait relies on a row's slices holding consecutive
// tickets and the grid holding every slice of a row at once (a slice does not wait when the grid
// is smaller), and is bounded all the same (another kernel, MPS): a slice that stops waiting sums
// against the largest maximum it has seen. The row's last slice to finish combines its slices once
// (combine_kept: re-reading a slice whose sum used a smaller maximum, when that can matter) and
// leaves the row's statistics for P2, which reads them instead of combining.
// The race needs no prefix sum, so the residual is sampled by all slices in parallel and no
// [gamma, V] probability, ratio or residual matrix is ever written. Requests' row n was read
// moments before by P1, so its re-read hits L2 (the sigmoid methods read it only here).
//
// Progress does not depend on how many blocks are resident (another kernel on another stream,
// MPS, a grid larger than the GPU holds): the only unbounded waits are P2 items waiting for P1 items
// of the same request, which come earlier in the item order and so hold smaller tickets. A ticket is
// only ever held by a block that is running, and a P1 item never waits but for a bounded time
// (min-p's agreement), so every awaited item is in progress and finishes. Nothing waits for a P2
// item. The ticket counter, like the per-request counters, is left at zero (the block that takes the
// last ticket resets it), so a call needs no memset.
#include "codes.cuh"
#include "philox.cuh"
#include "block_reduce.cuh"
#include "load.cuh"
#include "handoff.cuh"
#include "warp_record.cuh"
#include "temperature.cuh"

#define SS_MODE_LOGITS 0
#define SS_MODE_PROBS 1
#define SS_MODE_SIGMOID 2
#define SS_MODE_SIGMOID_PAPER 3
// Softmax of logits truncated by top-k / top-p / min-p: the rows' statistics and thresholds come
// from warp_rows_kernel (warp_rows.cu), launched just before; there are no P1 items.
#define SS_MODE_WARPED 4
// Softmax of logits truncated by min-p alone, statistics fused into P1 (see the header).
#define SS_MODE_MIN_P 5
// How long a min-p slice waits for the rest of its row before going on with a provisional sum: polls
// 64 ns of sleep apart (the sleep is approximate: tens of microseconds in all).
#define SS_ROW_WAIT_POLLS 512
// Candidates per warp in a min-p slice of several load groups (shared memory: 32 KB per block).
#define SS_LIST 1024
// Loads in flight per thread in such a slice (float32: one fewer, for the registers).
#define SS_AHEAD 4

// Ints per P1 partial: the slice's statistics (m, s, arg) and its value-error bits (exact, probabilities,
// greedy; the truncated modes flag err [B]), one 16-byte word, so P2 combines a row's statistics and
// its checks in the same loads.
#define SS_PART 4

// Per P2 slice: the race's two winners (key, index), the paper residual's partial sum, and the
// sigmoid methods' row masses (bit 0: the target row n has an entry > -inf, bit 1: the draft row).
#define SS_CAND 6

#define SS_INF __int_as_float(0x7f800000)
#define SS_LOG2E 1.4426950408889634f

__device__ __forceinline__ SoftmaxStat load_stat(const int* p, int& bits) {
  const int4 w = __ldcg(reinterpret_cast<const int4*>(p));
  bits = w.w;
  return SoftmaxStat{__int_as_float(w.x), __int_as_float(w.y), w.z};
}
// A P1 partial: statistics and bits in one 16-byte store.
__device__ __forceinline__ void store_part(int* p, SoftmaxStat s, int bits) {
  *reinterpret_cast<int4*>(p) = make_int4(__float_as_int(s.m), __float_as_int(s.s), s.arg, bits);
}
// Statistics alone (min-p's partials: no bits; three stores hold fewer registers than a vector one).
__device__ __forceinline__ void store_stat(int* p, SoftmaxStat s) {
  p[0] = __float_as_int(s.m);
  p[1] = __float_as_int(s.s);
  p[2] = s.arg;
}

// The two sigmoid methods. SIGMOID: acceptance and residual from sigmoid((z - offset) / scale) per
// element (no softmax statistics), the bonus token exactly from softmax(z) (a race on z - log E,
// the same order as exp(z) / E). SIGMOID_PAPER: the paper's released code, as
// written: sigma'(z) = 0 below the clamp window, 1 above it, the sigmoid inside; the residual
// max(1e-5, max(0, sigma'p - sigma'q) / (1e-6 + sum)) and the bonus max(1e-5, z) (raw logits),
// each drawn in proportion to its weight. Neither needs row statistics: there are no P1 items; the
// race's own pass over row n (P2) checks the rows at n, takes the paper's residual sum, and races
// SIGMOID's bonus token on z / T - log E (no maximum needed).
__host__ __device__ constexpr bool is_sigmoid(int mode) {
  return mode == SS_MODE_SIGMOID || mode == SS_MODE_SIGMOID_PAPER;
}
// Modes whose rows are truncated: an entry z of row r weighs nothing when M_r - z > dmax_r.
__host__ __device__ constexpr bool is_truncated(int mode) {
  return mode == SS_MODE_WARPED || mode == SS_MODE_MIN_P;
}

// Order-preserving unsigned keys of floats (an atomic max over keys is a max over the floats); the
// key 0 lies below every float's, so a zeroed counter starts below any maximum.
__device__ __forceinline__ unsigned float_key(float f) {
  const unsigned u = __float_as_uint(f);
  return u ^ ((u >> 31) ? 0xffffffffu : 0x80000000u);
}
__device__ __forceinline__ float key_float(unsigned k) {
  return __uint_as_float(k ^ ((k >> 31) ? 0x80000000u : 0xffffffffu));
}

// How partial row statistics combine: rescaled sums of exponentials, or plain sums of
// probabilities (the sigmoid modes keep only the maximum: the no-mass check).
template <int MODE> struct RowCombine { typedef CombineStat type; };
template <> struct RowCombine<SS_MODE_PROBS> { typedef CombineSum type; };

// What P1 computes over a slice: softmax statistics, or max + first argmax (greedy rows).
enum ScanKind { SCAN_STATS, SCAN_ARGMAX };

struct Request {
  int L;         // draft tokens to verify, in [0, G]
  float inv_t;   // 1 / temperature (1 for greedy requests and bad temperatures)
  bool greedy;   // accept while the draft is the target's argmax; draft rows are not read
  int errs;
};

template <class T, class TOK, int VEC, int MODE>
struct Verifier {
  typedef typename T::storage S;
  typedef typename RowCombine<MODE>::type Combine;
  // 16-byte loads in flight per thread in P1 (fewer for 16-bit probabilities: they would spill).
  static constexpr int LOADS = VEC == 4 ? 8 : (MODE == SS_MODE_PROBS ? 2 : 4);

  const TOK* draft_tokens;
  const S* draft;   // null: one-hot drafts (a deterministic drafter, e.g. n-gram lookup; see below)
  const S* target;
  const int* lengths;
  const float* temps;
  float temp_scalar;
  bool greedy_all;
  unsigned long long seed;
  unsigned offset;
  const long long* streams;  // null, or [B, 2] per-request (seed, offset): see stream()
  float sig_offset, sig_inv_scale;
  unsigned race_purpose;
  int B, G, V, S1, C1, S2, C2, R;
  int *req_ctr, *fin_ctr, *err, *part, *cand;
  // The walk order (exact, probabilities, greedy, when the plan asks; see the header): per request
  // the stop (n + 1; 0: none yet), and per position the arrivals of its rows' slices plus the
  // previous position's decision to go on.
  bool walk;
  int *stop_n, *pos_cnt;
  __device__ __forceinline__ bool walking() const { return (MODE == SS_MODE_LOGITS || MODE == SS_MODE_PROBS) && walk; }
  SoftmaxStat* rows;  // shared: the combined statistics of every row of the current P2 request
  // Shared, after `rows`: their value-error bits (from the partials; exact, probabilities, greedy).
  __device__ __forceinline__ int* row_bits_sh() const { return reinterpret_cast<int*>(rows + R); }
  const float* record;  // SS_MODE_WARPED: warp_rows_kernel's record of every row (warp_record.cuh)
  const float* span;    // SS_MODE_MIN_P: [B] min-p spans (raw logit units, temperature included)
  unsigned* row_key;    // SS_MODE_MIN_P: [B * R] the row's maximum so far (float_key)
  int* row_cnt;         // SS_MODE_MIN_P: [B * R] the row's slices that have published their maximum
  bool row_wait;        // SS_MODE_MIN_P: the grid holds a row's slices at once, so a slice waits for them
  float* lists;         // SS_MODE_MIN_P: SS_WARPS lists of SS_LIST candidates (shared memory)
  int *accepted, *emitted, *error, *tokens;

  // Temperature rules (the same in specsample_cupy/verification/cpu_numpy.py): negative or non-finite, or 0 for
  // sigmoid (no greedy mode), is an error and the request is then checked at temperature 1;
  // 0 otherwise means greedy; greedy_all (method "greedy") makes every request greedy.
  __device__ __forceinline__ Request request(int b) const {
    Request rq;
    rq.errs = 0;
    bool bad_t;
    float t = request_temperature(temps, temp_scalar, b, bad_t);
    if (bad_t || (is_sigmoid(MODE) && t == 0.f)) {
      rq.errs |= SS_ERR_TEMPERATURE;
      t = 1.f;
    }
    rq.greedy = greedy_all || (!is_sigmoid(MODE) && t == 0.f);
    rq.inv_t = rq.greedy ? 1.f : 1.f / t;
    rq.L = lengths ? lengths[b] : G;
    if (rq.L < 0 || rq.L > G) { rq.errs |= SS_ERR_LENGTH; rq.L = min(max(rq.L, 0), G); }
    return rq;
  }

  // Rows read for request b: target rows 0..L, and draft rows 0..L-1 unless the request is greedy
  // or the drafts are one-hot (no draft rows: q(x_i) = 1, the residual is p without x_n).
  __device__ __forceinline__ bool row_active(const Request& rq, bool is_target, int i) const {
    return is_target ? i <= rq.L : (i < rq.L && !rq.greedy && draft != nullptr);
  }
  // sigma(z) of the sigmoid methods, z temperature-scaled (see is_sigmoid). It runs for every
  // element of a rejected position's two rows: fast exp2 and reciprocal (a few ulp), and for the
  // paper's clamps selects rather than branches.
  __device__ __forceinline__ float sigma(float z) const {
    const float t = (z - sig_offset) * sig_inv_scale;
    const float r = rcp_approx(1.f + ex2_approx(t * -SS_LOG2E));   // 0 / 1 in the far tails
    if constexpr (MODE == SS_MODE_SIGMOID_PAPER) return t < 0.f ? 0.f : (t > 1.f ? 1.f : r);
    return r;
  }

  // Request b's Philox numbers at one (position, purpose): keyed by the call's seed and offset at
  // request word b, or with per-request streams by (seed, offset) = streams[b] at request word 0,
  // so that a request draws the same numbers in any row of any batch (reference.Streams).
  __device__ __forceinline__ PhiloxStream stream(int b, unsigned position, unsigned purpose) const {
    if (streams != nullptr)
      return PhiloxStream((unsigned long long)__ldg(streams + 2 * b), (unsigned)__ldg(streams + 2 * b + 1), 0u,
                          position, purpose);
    return PhiloxStream(seed, offset, b, position, purpose);
  }

  __device__ const S* target_row(int b, int i) const { return target + ((long long)b * (G + 1) + i) * V; }
  __device__ const S* draft_row(int b, int i) const { return draft + ((long long)b * G + i) * V; }

  // Invalid values seen by any lane: one atomic per warp, only when it happens. (No block-wide
  // vote: the barriers that follow order it before this block's counter update.)
  __device__ __forceinline__ void flag_bad(bool bad, int* word, int code) const {
    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) atomicOr(word, code);
  }

  // One P1 load group of this thread: LOADS loads of VEC entries, STEP apart from `base`; entries
  // at or past the slice's end `hi` are `pad`.
  __device__ __forceinline__ void load_group(const S* row, int base, int hi, float pad, float (&v)[LOADS][VEC]) const {
    constexpr int STEP = SS_THREADS * VEC;
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
      if (base + u * STEP < hi) {
        load_vec<T, VEC>(row + base + u * STEP, v[u]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[u][e] = pad;
      }
    }
  }

  // ---- P1: checks and statistics of one vocabulary slice of one row --------------------------
  // Per element: a NaN-propagating max (so the NaN/+Inf check is one test per group of loads),
  // and for sampling rows one FFMA + ex2 + add (exp(x / T - m) = 2^(x c - m c) with
  // c = log2(e) / T); greedy rows track the first argmax and skip the exponentials. The running
  // maximum is kept in raw logit units and scaled at the end.
  // Probabilities: a range check and a sum of the valid entries (greedy rows: also the argmax).
  template <int KIND>
  __device__ __forceinline__ void scan_slice(const S* row, int lo, int hi, float inv_t, SoftmaxStat& st, bool& bad) const {
    constexpr int STEP = SS_THREADS * VEC;
    const float c = inv_t * SS_LOG2E;
    float m = -SS_INF;
    for (int base = lo + threadIdx.x * VEC; base < hi; base += LOADS * STEP) {
      float v[LOADS][VEC];
      if (base + (LOADS - 1) * STEP < hi) {   // the whole group in the slice: no padding to set
#pragma unroll
        for (int u = 0; u < LOADS; ++u) load_vec<T, VEC>(row + base + u * STEP, v[u]);
      } else {
        load_group(row, base, hi, MODE == SS_MODE_PROBS ? 0.f : -SS_INF, v);
      }
      float gm = -SS_INF;
      int garg = 0x7fffffff;
      if constexpr (MODE == SS_MODE_PROBS) {
#pragma unroll
        for (int u = 0; u < LOADS; ++u)
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const bool ok = v[u][e] >= 0.f && v[u][e] < SS_INF;
            bad |= !ok;
            st.s += ok ? v[u][e] : 0.f;
            if constexpr (KIND == SCAN_ARGMAX) {
              if (v[u][e] > gm) { gm = v[u][e]; garg = base + u * STEP + e; }
            }
          }
        if constexpr (KIND == SCAN_ARGMAX) {
          if (gm > m) { m = gm; st.arg = garg; }
        }
      } else {
        if constexpr (KIND == SCAN_ARGMAX) {
#pragma unroll
          for (int u = 0; u < LOADS; ++u)
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
              bad |= !(v[u][e] < SS_INF);
              if (v[u][e] > gm) { gm = v[u][e]; garg = base + u * STEP + e; }
            }
        } else {
          // The group's maximum, NaN if any entry is; one chain per load, so they overlap.
          float um[LOADS];
#pragma unroll
          for (int u = 0; u < LOADS; ++u) {
            um[u] = v[u][0];
#pragma unroll
            for (int e = 1; e < VEC; ++e) um[u] = max_nan(um[u], v[u][e]);
          }
#pragma unroll
          for (int u = 0; u < LOADS; ++u) gm = max_nan(gm, um[u]);
        }
        // Statistics and checks: one NaN/+Inf test per group (a NaN maximum fails `gm > m`, so m
        // stays a number; the request is flagged and its statistics are never used).
        if constexpr (KIND != SCAN_ARGMAX) bad |= !(gm < SS_INF);
        if constexpr (KIND == SCAN_ARGMAX) {
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
    // Logits: the maximum in temperature-scaled units; probabilities: the largest value (greedy
    // rows; -inf otherwise). A row with no entry > -inf keeps m = -inf: no mass.
    st.m = MODE == SS_MODE_PROBS ? m : m * inv_t;
  }

  // ---- P1 of SS_MODE_MIN_P: the kept mass of one slice under the row's final maximum ----------
  // The slice is one load group (the plan sizes C1 so), held in registers across the row's
  // agreement on M (see the header). Partial: [M used (raw), kept mass against it, slice max (raw)].
  // The row's maximum M, given this slice's ms (block-uniform): with one slice per row, ms; else
  // the row's slices agree on it (see the header).
  __device__ __forceinline__ float agree_row_max(long long row_id, float ms, int* sh) const {
    if (S1 == 1) return ms;
    if (threadIdx.x == 0) {
      atomicMax(row_key + row_id, float_key(ms));
      publish_add(row_cnt + row_id, 1);
      if (row_wait) {
        for (int polls = 0; polls < SS_ROW_WAIT_POLLS && poll(row_cnt + row_id) < S1; ++polls) __nanosleep(64);
        __threadfence();
      }
      sh[0] = (int)*(volatile unsigned*)(row_key + row_id);
    }
    __syncthreads();
    return key_float((unsigned)sh[0]);
  }

  // Thread 0 publishes the slice's partial [M used, kept mass k, slice max ms]; the row's last slice
  // to finish combines the row once, for every P2 block, and leaves the result in the row's first
  // partial (P2 reads only that one). One slice per row: the partial is already the row's.
  __device__ __forceinline__ void publish_kept(int b, int r, int lo, const Request& rq, float M, float ms, float k,
                                               int* sh) const {
    const long long row_id = (long long)b * R + r;
    if (S1 == 1) {
      if (threadIdx.x == 0) store_stat(part + row_id * SS_PART, SoftmaxStat{M * rq.inv_t, k, __float_as_int(M)});
      return;
    }
    if (threadIdx.x == 0) {
      int* p = part + (row_id * S1 + (lo / C1)) * SS_PART;
      p[0] = __float_as_int(M); p[1] = __float_as_int(k); p[2] = __float_as_int(ms);
      sh[1] = publish_add(row_cnt + row_id, 1) == 2 * S1 - 1;   // the row's last slice to finish?
    }
    __syncthreads();
    if (sh[1] && threadIdx.x < 32) {
      const SoftmaxStat st = combine_kept(b, r, rq, threadIdx.x);
      if (threadIdx.x == 0) store_stat(part + row_id * S1 * SS_PART, st);
    }
  }

  // A slice of one load group (C1 <= LOADS * STEP): held in registers across the agreement.
  __device__ __forceinline__ void scan_kept(const S* row, int b, int r, int lo, int hi, const Request& rq,
                                            float* fred, int* sh, bool& bad) const {
    float v[LOADS][VEC];
    load_group(row, lo + threadIdx.x * VEC, hi, -SS_INF, v);
    float gm = -SS_INF;
#pragma unroll
    for (int u = 0; u < LOADS; ++u)
#pragma unroll
      for (int e = 0; e < VEC; ++e) gm = max_nan(gm, v[u][e]);
    bad |= !(gm < SS_INF);
    // A NaN flags the request (its statistics are never used); the maximum ignores it.
    const float ms = block_reduce(gm == gm ? gm : -SS_INF, MaxFloat(), fred);
    const float M = agree_row_max((long long)b * R + r, ms, sh);
    const float sp = __ldg(span + b);
    const float c = rq.inv_t * SS_LOG2E, mc = M * c;
    float k = 0.f;
#pragma unroll
    for (int u = 0; u < LOADS; ++u)
#pragma unroll
      for (int e = 0; e < VEC; ++e) k += M - v[u][e] <= sp ? ex2_approx(fmaf(v[u][e], c, -mc)) : 0.f;
    k = block_reduce(k, AddFloat(), fred);
    publish_kept(b, r, lo, rq, M, ms, k, sh);
  }

  // A slice of several load groups: each warp keeps, in its own shared-memory list, the entries
  // within the span of a running maximum (a superset of the kept set: the row's maximum is at least
  // any of them), appending by ballot with no atomics and no block barrier per group. The bound is
  // the larger of the thread's own running maximum and the warp's, which is refreshed once per
  // AHEAD steps (one shuffle reduction per group of loads, not per load); one vote per step skips
  // the appends when no lane of the warp holds a candidate, as for most steps once the maximum is
  // near the row's. A list about to overflow is compacted against the warp's maximum; if that does
  // not free enough room the warp stops listing and re-reads its own entries once M is known. Then
  // the kept mass is a pass over the lists.
  __device__ __forceinline__ void scan_kept_lists(const S* row, int b, int r, int lo, int hi, const Request& rq,
                                                  float* fred, int* sh, bool& bad) const {
    constexpr int STEP = SS_THREADS * VEC;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned below = (1u << lane) - 1u;
    const float sp = __ldg(span + b);
    float* list = lists + warp * SS_LIST;
    int n = 0;              // warp-uniform: entries in this warp's list
    // Warp-uniform: the list overflowed; re-read at the end. min-p off for this request (span +inf)
    // keeps every entry: no list, one re-read.
    bool spilled = !(sp < SS_INF);
    float tm = -SS_INF;     // this thread's running maximum (NaN ignored)
    float wm = -SS_INF;     // warp-uniform: the warp's running maximum as of the last refresh
    // One 16-byte load per step, AHEAD steps in flight (raw words, decoded when listed).
    constexpr int AHEAD = sizeof(S) == 4 ? SS_AHEAD - 1 : SS_AHEAD;   // float32: four spill (8 bytes)
    RawVec<T, VEC> raw[AHEAD];
    const int first = lo + threadIdx.x * VEC;
    const int steps = (hi - lo + STEP - 1) / STEP;   // the same for every thread of the block
#pragma unroll
    for (int k = 0; k < AHEAD; ++k) {
      if (first + k * STEP < hi) raw[k].load(row + first + k * STEP);
      else raw[k].set_neg_inf();
    }
    for (int s0 = 0; s0 < steps; s0 += AHEAD) {
      wm = warp_reduce(tm, MaxFloat());
#pragma unroll
      for (int k = 0; k < AHEAD; ++k) {
        const int step = s0 + k;
        if (step >= steps) break;
        constexpr int ROOM = 32 * VEC;   // the most one step can add
        if (!spilled && n + ROOM > SS_LIST) {   // compact against the maximum so far
          wm = warp_reduce(tm, MaxFloat());
          __syncwarp();
          int kept = 0;
          for (int x0 = 0; x0 < n; x0 += 32) {
            const float z = x0 + lane < n ? list[x0 + lane] : -SS_INF;
            const bool keep = x0 + lane < n && wm - z <= sp;
            const unsigned m = __ballot_sync(0xffffffffu, keep);
            __syncwarp();
            if (keep) list[kept + __popc(m & below)] = z;
            kept += __popc(m);
          }
          n = kept;
          spilled = n + ROOM > SS_LIST;
          __syncwarp();
        }
        float cur[VEC];
        raw[k].decode_to(cur);
        const int ahead = first + (step + AHEAD) * STEP;
        if (ahead < hi) raw[k].load(row + ahead);
        else raw[k].set_neg_inf();
        float gm = cur[0];
#pragma unroll
        for (int e = 1; e < VEC; ++e) gm = max_nan(gm, cur[e]);
        bad |= !(gm < SS_INF);
        tm = fmaxf(tm, gm == gm ? gm : -SS_INF);
        const float bound = fmaxf(wm, tm);   // at most the row's maximum
        if (!spilled && __any_sync(0xffffffffu, bound - gm <= sp)) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const bool keep = bound - cur[e] <= sp;
            const unsigned m = __ballot_sync(0xffffffffu, keep);
            if (keep) list[n + __popc(m & below)] = cur[e];
            n += __popc(m);
          }
        }
      }
    }
    __syncwarp();
    const float ms = block_reduce(tm, MaxFloat(), fred);
    const float M = agree_row_max((long long)b * R + r, ms, sh);
    const float c = rq.inv_t * SS_LOG2E, mc = M * c;
    float k = 0.f;
    if (!spilled) {
      for (int x = lane; x < n; x += 32) {
        const float z = list[x];
        if (M - z <= sp) k += ex2_approx(fmaf(z, c, -mc));
      }
    } else {   // this warp's own entries, again
      for (int base = lo + threadIdx.x * VEC; base < hi; base += STEP) {
        float z[VEC];
        load_vec<T, VEC>(row + base, z);
#pragma unroll
        for (int e = 0; e < VEC; ++e) k += M - z[e] <= sp ? ex2_approx(fmaf(z[e], c, -mc)) : 0.f;
      }
    }
    k = block_reduce(k, AddFloat(), fred);
    publish_kept(b, r, lo, rq, M, ms, k, sh);
  }

  __device__ __forceinline__ void phase1(int b, int r, int s, SoftmaxStat* red, int* sh) const {
    const Request rq = request(b);
    const bool is_target = r <= G;
    const int i = is_target ? r : r - G - 1;
    bool active = row_active(rq, is_target, i);
    if (walking() && active && i > 0) active = !stopped_before(b, i, sh);
    if (active) {
      SoftmaxStat st = {-SS_INF, 0.f, 0x7fffffff};
      bool bad = false;
      const int lo = s * C1, hi = min(V, lo + C1);
      const S* row = is_target ? target_row(b, i) : draft_row(b, i);
      if constexpr (MODE == SS_MODE_MIN_P) {
        if (rq.greedy) scan_slice<SCAN_ARGMAX>(row, lo, hi, rq.inv_t, st, bad);
        else if (C1 <= LOADS * SS_THREADS * VEC) scan_kept(row, b, r, lo, hi, rq, reinterpret_cast<float*>(red), sh, bad);
        else scan_kept_lists(row, b, r, lo, hi, rq, reinterpret_cast<float*>(red), sh, bad);
      } else if (rq.greedy) {
        scan_slice<SCAN_ARGMAX>(row, lo, hi, rq.inv_t, st, bad);
      } else {
        scan_slice<SCAN_STATS>(row, lo, hi, rq.inv_t, st, bad);
      }
      // Per row, in the slice's partial beside its statistics (the truncated modes: per request, as
      // warp_rows.cu does: they validate every row).
      const int code = is_target ? SS_ERR_TARGET : SS_ERR_DRAFT;
      if constexpr (is_truncated(MODE)) flag_bad(bad, err + b, code);
      if (MODE != SS_MODE_MIN_P || rq.greedy) {
        const int bits = !is_truncated(MODE) && __syncthreads_or(bad) ? code : 0;
        st = block_reduce(st, Combine(), red);
        if (threadIdx.x == 0) store_part(part + ((long long)(b * R + r) * S1 + s) * SS_PART, st, bits);
      }
      if (walking()) arrive_at_position(b, i, rq, sh);
    }
    // Only thread 0 wrote; its fence publishes the partial before the count that announces it. A
    // skipped row wrote nothing, so its count needs no fence (and no reply).
    if (threadIdx.x == 0) {
      if (active) publish_add(req_ctr + b, 1);
      else atomicAdd(req_ctr + b, 1);
    }
  }

  // ---- The walk order: positions decided as their rows arrive ---------------------------------
  // Whether request b's verification is known to have stopped before position i (no wait: an item
  // handed out before the stop is published reads its row, which no decision then uses).
  __device__ __forceinline__ bool stopped_before(int b, int i, int* sh) const {
    if (threadIdx.x == 0) sh[0] = __ldcg(stop_n + b);
    __syncthreads();
    const int stop = sh[0];
    return stop != 0 && stop - 1 < i;
  }

  // After this item's partial: position i's counter counts its rows' slices (target row i, draft row
  // i where it is read) and, for i > 0, the previous position's decision to go on; whoever completes
  // it decides the position.
  __device__ __forceinline__ void arrive_at_position(int b, int i, const Request& rq, int* sh) const {
    const int full = position_rows(rq, i) * S1 + (i > 0 ? 1 : 0);
    if (threadIdx.x == 0) sh[2] = publish_add(pos_cnt + (long long)b * (G + 1) + i, 1) == full - 1;
    __syncthreads();
    if (sh[2]) decide_from(b, i, rq, sh);
  }
  __device__ __forceinline__ int position_rows(const Request& rq, int i) const {
    return 1 + (row_active(rq, false, i) ? 1 : 0);
  }

  // Decides position i, as first_rejection() would (an id outside [0, V), invalid rows, a rejection:
  // stop, published in stop_n), and on going on counts itself into position i + 1, deciding that one
  // too when its rows are all in; and so on. Position L (the bonus row) has nothing to decide.
  __device__ __forceinline__ void decide_from(int b, int i, const Request& rq, int* sh) const {
    for (int p = i;; ++p) {
      const int warp = threadIdx.x >> 5;
      if (warp < position_rows(rq, p)) combine_row(b, warp == 0 ? p : G + 1 + p, threadIdx.x & 31);
      __syncthreads();
      if (threadIdx.x == 0) {
        bool next = false;
        if (p < rq.L) {
          const Gathered g = gather(b, p, rq);
          if (!g.in_range || position_bits(rq, p) != 0 || !accepts(b, p, g, rq)) {
            stop_n[b] = p + 1;
            __threadfence();
          } else {
            const int full = position_rows(rq, p + 1) * S1 + 1;
            next = publish_add(pos_cnt + (long long)b * (G + 1) + p + 1, 1) == full - 1;
          }
        }
        sh[2] = next;
      }
      __syncthreads();
      if (!sh[2]) return;
    }
  }

  // P2 in the walk order: the stop n is known once every P1 item of b is counted; only the rows
  // at n are combined. Every id among the first L drafts is range-checked (first_rejection's rule).
  __device__ __forceinline__ void walk_outcome(int b, const Request& rq, int* s_n, int* s_err) const {
    wait_rows(b);
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      const int stop = __ldcg(stop_n + b);
      const int n = stop ? stop - 1 : rq.L;
      combine_row(b, n, lane);
      if (row_active(rq, false, n)) combine_row(b, G + 1 + n, lane);
      int errs = rq.errs;
      for (int i = lane; i < rq.L; i += 32) {
        const long long x = (long long)draft_tokens[(long long)b * G + i];
        if (x < 0 || x >= V) errs |= SS_ERR_TOKEN;
      }
      errs = __reduce_or_sync(0xffffffffu, errs);
      if (lane == 0) { *s_n = n; *s_err = errs; }
    }
  }

  // Wait until every P1 item of request b is counted (they hold smaller tickets: see the header).
  __device__ __forceinline__ void wait_rows(int b) const {
    if (threadIdx.x < 32) warp_wait_at_least(req_ctr + b, R * S1);
  }

  // SS_MODE_MIN_P, one warp: row r's statistics from its slices' partials [M used, kept mass, slice
  // max]. M is the largest M used (every slice's is at least its own maximum, and the slice holding
  // the row's maximum used exactly that). A slice that used M contributes its sum; one whose maximum
  // lies beyond the span below M contributes nothing; any other (it stopped waiting for its row
  // early) is re-read here by the whole warp. st.arg carries M raw, for the kept tests.
  __device__ __forceinline__ SoftmaxStat combine_kept(int b, int r, const Request& rq, int lane) const {
    const int* rp = part + (long long)(b * R + r) * S1 * SS_PART;
    float M = -SS_INF;
    for (int k = lane; k < S1; k += 32) M = fmaxf(M, __int_as_float(__ldcg(rp + SS_PART * k)));
    M = warp_reduce(M, MaxFloat());
    const float sp = __ldg(span + b);
    const float c = rq.inv_t * SS_LOG2E, mc = M * c;
    const S* row = r <= G ? target_row(b, r) : draft_row(b, r - G - 1);
    float sum = 0.f;
    for (int k0 = 0; k0 < S1; k0 += 32) {
      const int k = k0 + lane;
      bool again = false;
      if (k < S1) {
        const float used = __int_as_float(__ldcg(rp + SS_PART * k)), ms = __int_as_float(__ldcg(rp + SS_PART * k + 2));
        if (used == M) sum += __int_as_float(__ldcg(rp + SS_PART * k + 1));
        else again = !(M - ms > sp);
      }
      for (unsigned m = __ballot_sync(0xffffffffu, again); m; m &= m - 1) {
        const int lo = (k0 + __ffs(m) - 1) * C1, hi = min(V, lo + C1);
        for (int x = lo + lane; x < hi; x += 32) {
          const float z = decode<T>(row[x]);
          if (M - z <= sp) sum += ex2_approx(fmaf(z, c, -mc));
        }
      }
    }
    SoftmaxStat st;
    st.m = M * rq.inv_t;
    st.s = warp_reduce(sum, AddFloat());
    st.arg = __float_as_int(M);
    return st;
  }

  // After the wait: combine each active row's slice statistics into shared memory. Sets *no_mass
  // when an active row has no probability mass (logits, sigmoid: no entry > -inf; probabilities:
  // the valid entries sum to 0).
  __device__ __forceinline__ void combine_rows(int b, const Request& rq, int* no_mass) const {
    if constexpr (MODE == SS_MODE_LOGITS || MODE == SS_MODE_PROBS) combine_rows_grouped(b, rq, no_mass);
    else combine_rows_by_warp(b, rq, no_mass);
  }

  // Exact and probabilities: a group of `width` lanes per row, as narrow as lets the block take
  // every row of the request in one pass (R <= 8: a warp each; <= 16: half-warps; else quarters),
  // so all the rows' partial loads are in flight at once: one L2 round trip and one shuffle tree
  // on the decision's path, where a warp per row took one per row it held (3 rows of 11 took two).
  __device__ __forceinline__ void combine_rows_grouped(int b, const Request& rq, int* no_mass) const {
    const int width = R <= SS_WARPS ? 32 : (R <= 2 * SS_WARPS ? 16 : 8);
    const int groups = SS_THREADS / width, sub = threadIdx.x % width;
    for (int r0 = 0; r0 < R; r0 += groups) {   // the same trip count in every thread: the shuffles
      const int r = r0 + threadIdx.x / width;  // below are warp-wide
      const bool is_target = r <= G;
      const bool active = r < R && row_active(rq, is_target, is_target ? r : r - G - 1);
      SoftmaxStat st = {-SS_INF, 0.f, 0x7fffffff};
      int bits = 0;
      if (active) {
        const int* rp = part + (long long)(b * R + r) * S1 * SS_PART;
#pragma unroll 4
        for (int k = sub; k < S1; k += width) {
          int kb;
          st = Combine()(st, load_stat(rp + SS_PART * k, kb));
          bits |= kb;
        }
      }
      for (int o = width >> 1; o > 0; o >>= 1) {   // xor offsets below width stay in the group
        const SoftmaxStat w = {__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o),
                               __shfl_xor_sync(0xffffffffu, st.arg, o)};
        st = Combine()(st, w);
        bits |= __shfl_xor_sync(0xffffffffu, bits, o);
      }
      if (active && sub == 0) {
        rows[r] = st;
        row_bits_sh()[r] = bits;
        if (MODE == SS_MODE_PROBS ? !(st.s > 0.f) : st.m == -SS_INF) *no_mass = 1;
      }
    }
  }

  // The other modes: one warp per row.
  __device__ __forceinline__ void combine_rows_by_warp(int b, const Request& rq, int* no_mass) const {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = warp; r < R; r += SS_WARPS) {
      const bool is_target = r <= G;
      const int i = is_target ? r : r - G - 1;
      if (!row_active(rq, is_target, i)) continue;
      SoftmaxStat st = {-SS_INF, 0.f, 0x7fffffff};
      if constexpr (MODE == SS_MODE_WARPED) {
        const float* rec = record + (long long)(b * R + r) * SS_RECORD;
        st.m = __ldcg(rec + SS_REC_M);
        st.s = __ldcg(rec + SS_REC_S);
        st.arg = __float_as_int(__ldcg(rec + SS_REC_ARG));
      } else if (MODE == SS_MODE_MIN_P && !rq.greedy) {
        int unused;
        if (lane == 0) st = load_stat(part + (long long)(b * R + r) * S1 * SS_PART, unused);   // combine_kept's, by P1
      } else {
        int bits;
        st = slices_stat(b, r, lane, bits);
        if (lane == 0) row_bits_sh()[r] = bits;
      }
      if (lane == 0) {
        rows[r] = st;
        if (MODE == SS_MODE_PROBS ? !(st.s > 0.f) : st.m == -SS_INF) *no_mass = 1;
      }
    }
  }

  // One warp: row r's statistics and value-error bits from its P1 slices' partials (every lane gets them).
  // combine_rows_grouped keeps its own copy of this loop: one helper of any group width for both made
  // exact at B = 1 0.1-1.3 % slower in all 16 points measured (H100, four alternated runs).
  __device__ __forceinline__ SoftmaxStat slices_stat(int b, int r, int lane, int& bits) const {
    SoftmaxStat st = {-SS_INF, 0.f, 0x7fffffff};
    bits = 0;
    const int* rp = part + (long long)(b * R + r) * S1 * SS_PART;
    for (int k = lane; k < S1; k += 32) {
      int kb;
      st = Combine()(st, load_stat(rp + SS_PART * k, kb));
      bits |= kb;
    }
    bits = __reduce_or_sync(0xffffffffu, bits);
    return warp_reduce(st, Combine());
  }
  // One warp: row r's statistics and bits into shared memory (the walk order's rows at one position).
  __device__ __forceinline__ void combine_row(int b, int r, int lane) const {
    int bits;
    const SoftmaxStat st = slices_stat(b, r, lane, bits);
    if (lane == 0) { rows[r] = st; row_bits_sh()[r] = bits; }
  }

  // Waits for request b's P1 items and combines its rows; sh[4] = no mass. Every thread calls it.
  __device__ __forceinline__ void gather_rows(int b, const Request& rq, int* sh) const {
    wait_rows(b);
    if (threadIdx.x == 0) sh[4] = 0;
    __syncthreads();
    combine_rows(b, rq, sh + 4);
    __syncthreads();
  }

  // ---- P2: acceptance and the race over one slice of the emitted row -------------------------
  // c = log2(e) / T, mc = log2(e) * m (m in scaled units), as in scan_slice.
  __device__ __forceinline__ float weight(float v, float inv_t, float c, float mc, float inv_s) const {
    if constexpr (MODE == SS_MODE_LOGITS || is_truncated(MODE)) return ex2_approx(fmaf(v, c, -mc)) * inv_s;
    else if constexpr (MODE == SS_MODE_PROBS) return v * inv_s;
    else return sigma(v * inv_t);
  }

  // What the acceptance test of draft position i needs from the inputs alone (no statistics),
  // so warp 0 can load it while the rows are still being reduced.
  struct Gathered {
    int x;
    float z, y, u;  // temperature-scaled target and draft logit at x, acceptance uniform
    float zr, yr;   // the same logits unscaled (SS_MODE_WARPED: the truncation test)
    bool in_range;
  };

  // The truncated modes: row r of request b keeps raw value z iff M - z <= dmax (verification/truncation.py's rule).
  __device__ __forceinline__ void row_limit(int b, int r, float& M, float& dmax) const {
    if constexpr (MODE == SS_MODE_WARPED) {
      const float* rec = record + (long long)(b * R + r) * SS_RECORD;
      M = __ldcg(rec + SS_REC_MAX);
      dmax = __ldcg(rec + SS_REC_DMAX);
    } else {
      M = __int_as_float(rows[r].arg);   // combine_kept's M
      dmax = __ldg(span + b);
    }
  }
  __device__ __forceinline__ bool kept(int b, int r, float v) const {
    float M, dmax;
    row_limit(b, r, M, dmax);
    return M - v <= dmax;
  }

  __device__ __forceinline__ Gathered gather(int b, int i, const Request& rq) const {
    Gathered g = {0, 0.f, 0.f, 0.f, 0.f, 0.f, false};
    // The id is loaded before the request's length is known (every id of the first G is in memory),
    // so the two loads overlap: for the sigmoid methods this is the chain to the decision.
    const long long x = i < G ? (long long)draft_tokens[(long long)b * G + i] : -1;
    if (i < rq.L) {
      g.in_range = x >= 0 && x < V;
      if (g.in_range) {
        g.x = (int)x;
        g.zr = decode<T>(target_row(b, i)[x]);
        g.z = g.zr * rq.inv_t;
        if (!rq.greedy && draft) {
          g.yr = decode<T>(draft_row(b, i)[x]);
          g.y = g.yr * rq.inv_t;
        }
        g.u = acceptance_uniform(stream(b, 0, SS_PURPOSE_ACCEPT).word(i));
      }
    }
    return g;
  }

  // Is the gathered draft token accepted? u q(x) <= p(x) and p(x) > 0 (greedy: x is the argmax).
  __device__ __forceinline__ bool accepts(int b, int i, const Gathered& g, const Request& rq) const {
    if constexpr (is_sigmoid(MODE)) {
      const float p = sigma(g.z), q = sigma(g.y);
      return p > 0.f && g.u * q <= p;
    } else {
      const SoftmaxStat sp = rows[i];
      if (rq.greedy) return g.x == sp.arg;
      float p = MODE == SS_MODE_PROBS ? g.z / sp.s : expf(g.z - sp.m) / sp.s;
      if (is_truncated(MODE) && !kept(b, i, g.zr)) p = 0.f;
      if (!draft) return p > 0.f && g.u <= p;   // one-hot draft: q(x) = 1
      const SoftmaxStat sq = rows[G + 1 + i];
      float q = MODE == SS_MODE_PROBS ? g.y / sq.s : expf(g.y - sq.m) / sq.s;
      if (is_truncated(MODE) && !kept(b, G + 1 + i, g.yr)) q = 0.f;
      return p > 0.f && g.u * q <= p;
    }
  }

  // The value and no-mass codes of row r (exact, probabilities, greedy; after the row is combined
  // into shared memory): P1's flags and the combined statistics.
  __device__ __forceinline__ int row_bits(int r) const {
    const SoftmaxStat st = rows[r];
    const bool no_mass = MODE == SS_MODE_PROBS ? !(st.s > 0.f) : st.m == -SS_INF;
    return row_bits_sh()[r] | (no_mass ? SS_ERR_NO_MASS : 0);
  }
  // The codes of the rows at position i: target row i, and draft row i where it is read.
  __device__ __forceinline__ int position_bits(const Request& rq, int i) const {
    return row_bits(i) | (row_active(rq, false, i) ? row_bits(G + 1 + i) : 0);
  }

  // Warp 0: the position n where verification stops (or L) and request-level errors. It stops at
  // the first position with a draft id outside [0, V), invalid data where it reads (exact,
  // probabilities, greedy: the position's rows, whose statistics need them whole; sigmoid: the two
  // token logits, NaN or +Inf), or a rejection; only the rows at n are read after it (the residual
  // or the bonus row), and only the rows a decision reads are validated (verification/cpu_numpy.py's rule; the
  // truncated modes validate every row: warp_rows.cu reads them all). `first` holds this lane's
  // gathered position `lane` (positions 32.. are gathered here). Every id among the first L drafts
  // is range-checked, also past n.
  __device__ __forceinline__ void first_rejection(int b, const Request& rq, const Gathered& first,
                                                  int* s_n, int* s_err) const {
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    int n = rq.L, errs = rq.errs;
    for (int base = 0; base < rq.L; base += 32) {
      const int i = base + lane;
      bool stop = false;
      if (i < rq.L) {
        if (n == rq.L) {  // warp-uniform: no stop yet
          const Gathered g = base == 0 ? first : gather(b, i, rq);
          if (!g.in_range) { errs |= SS_ERR_TOKEN; stop = true; }
          else if constexpr (is_sigmoid(MODE)) stop = !(g.zr < SS_INF) || !(g.yr < SS_INF) || !accepts(b, i, g, rq);
          else if constexpr (is_truncated(MODE)) stop = !accepts(b, i, g, rq);
          else stop = position_bits(rq, i) != 0 || !accepts(b, i, g, rq);
        } else {
          const long long x = (long long)draft_tokens[(long long)b * G + i];
          if (x < 0 || x >= V) errs |= SS_ERR_TOKEN;
        }
      }
      const unsigned m = __ballot_sync(0xffffffffu, stop);
      if (m && n == rq.L) n = base + __ffs(m) - 1;
    }
    errs = __reduce_or_sync(0xffffffffu, errs);
    if (lane == 0) { *s_n = n; *s_err = errs; }
  }

  __device__ __forceinline__ void phase2(int b, int s, RaceSlice* red, int* sh) const {
    const Request rq = request(b);
    if (walking()) {
      walk_outcome(b, rq, sh + 0, sh + 1);
    } else {
      Gathered first = {0, 0.f, 0.f, 0.f, 0.f, 0.f, false};
      if (threadIdx.x < 32) first = gather(b, threadIdx.x, rq);
      // The sigmoid methods have no P1 items: acceptance needs the token logits alone, and the rows
      // at n are checked here, in the race's own pass over them.
      if constexpr (!is_sigmoid(MODE)) gather_rows(b, rq, sh);
      first_rejection(b, rq, first, sh + 0, sh + 1);
    }
    __syncthreads();
    const int n = sh[0];
    const bool bonus = n >= rq.L;
    int errs = sh[1];
    if constexpr (is_truncated(MODE)) errs |= __ldcg(err + b) | (sh[4] ? SS_ERR_NO_MASS : 0);
    else if constexpr (!is_sigmoid(MODE)) errs |= position_bits(rq, n);

    // Keys start below every key (SIGMOID's bonus race keys are logarithms, negative too).
    RaceBest res = {-SS_INF, 0x7fffffff}, pb = {-SS_INF, 0x7fffffff};
    float rsum = 0.f;   // SIGMOID_PAPER at a rejection: this slice's part of the residual's sum
    bool bad_p = false, bad_q = false, mass_p = false, mass_q = false;   // the sigmoid methods' checks
    const bool onehot = !is_sigmoid(MODE) && !draft;
    const bool read_q = !bonus && !onehot;
    // The sigmoid methods read the rows at n even for a request already in error: their codes are
    // the request's (the rule does not depend on other codes).
    if ((!errs || is_sigmoid(MODE)) && !rq.greedy) {
      const S* zrow = target_row(b, n);
      // One-hot drafts: no draft row; the residual max(0, p - onehot(x_n)) is p with x_n removed.
      const int xn = bonus || !onehot ? -1 : (int)draft_tokens[(long long)b * G + n];
      const S* yrow = read_q ? draft_row(b, n) : zrow;
      SoftmaxStat sp = {0.f, 1.f, 0}, sq = {0.f, 1.f, 0};
      if constexpr (!is_sigmoid(MODE)) {
        sp = rows[n];
        if (read_q) sq = rows[G + 1 + n];
      }
      const float inv_sp = 1.f / sp.s, inv_sq = 1.f / sq.s;
      const float c = rq.inv_t * SS_LOG2E;
      const float mcp = sp.m * SS_LOG2E, mcq = sq.m * SS_LOG2E;
      // The truncated modes: entries beyond a row's truncation weigh nothing (M - z > dmax).
      float maxp = 0.f, dmaxp = SS_INF, maxq = 0.f, dmaxq = SS_INF;
      if constexpr (is_truncated(MODE)) {
        row_limit(b, n, maxp, dmaxp);
        if (read_q) row_limit(b, G + 1 + n, maxq, dmaxq);
      }
      const int lo = s * C2, hi = min(V, lo + C2);
      for (int base = lo + threadIdx.x * VEC; base < hi; base += SS_THREADS * VEC) {
        float z[VEC], y[VEC], e[VEC];
        load_vec<T, VEC>(zrow + base, z);
        if (read_q) load_vec<T, VEC>(yrow + base, y);
        // The stream is named here rather than once before the loop: with per-request streams a
        // register-resident copy beside b pushes the 64-register modes into spills.
        race_variates<VEC>(stream(b, n, race_purpose), base, e);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          if constexpr (is_sigmoid(MODE)) {   // the row checks, here (see is_sigmoid)
            bad_p |= !(z[k] < SS_INF);
            mass_p |= z[k] > -SS_INF;
            if (read_q) { bad_q |= !(y[k] < SS_INF); mass_q |= y[k] > -SS_INF; }
          }
          float kr, kp;   // race keys: the residual's (or the bonus row's), and p's (the fallback)
          if constexpr (MODE == SS_MODE_SIGMOID_PAPER) {
            // Bonus: weight max(1e-5, z). Rejection: r = max(0, sigma'p - sigma'q), summed for the
            // normaliser; the keys r / E (res) and 1 / E (pb: the 1e-5 floor's) are weighed against
            // each other in finish(), once the whole row's sum is known.
            if (bonus) {
              kr = kp = __fdividef(fmaxf(z[k] * rq.inv_t, 1e-5f), e[k]);
            } else {
              const float r = fmaxf(sigma(z[k] * rq.inv_t) - sigma(y[k] * rq.inv_t), 0.f);
              rsum += r;
              kr = r > 0.f ? __fdividef(r, e[k]) : -1.f;
              kp = __fdividef(1.f, e[k]);
            }
          } else if (MODE == SS_MODE_SIGMOID && bonus) {
            // softmax(z / T) without its maximum: argmax exp(z / T) / E = argmax z / T - log E (the
            // same order; -inf entries never win), as sample_row.cuh races.
            kr = kp = z[k] > -SS_INF ? fmaf(z[k], rq.inv_t, -__logf(e[k])) : -SS_INF;
          } else {
            float wp, wq;
            if constexpr (MODE == SS_MODE_SIGMOID) {
              wp = sigma(z[k] * rq.inv_t);
              wq = sigma(y[k] * rq.inv_t);
            } else {
              wp = weight(z[k], rq.inv_t, c, mcp, inv_sp);
              wq = read_q ? weight(y[k], rq.inv_t, c, mcq, inv_sq) : (base + k == xn ? 1.f : 0.f);
              if constexpr (is_truncated(MODE)) {
                if (maxp - z[k] > dmaxp) wp = 0.f;
                if (read_q && maxq - y[k] > dmaxq) wq = 0.f;
              }
            }
            kr = wp - wq > 0.f ? __fdividef(wp - wq, e[k]) : -1.f;
            kp = wp > 0.f ? __fdividef(wp, e[k]) : -1.f;
          }
          if (kr > res.key) { res.key = kr; res.idx = base + k; }
          if (kp > pb.key) { pb.key = kp; pb.idx = base + k; }
        }
      }
    }
    int checks = 0;   // the sigmoid methods: this slice's masses (bit 0 target, bit 1 draft)
    if constexpr (is_sigmoid(MODE)) {
      flag_bad(bad_p, err + b, SS_ERR_TARGET);
      flag_bad(bad_q, err + b, SS_ERR_DRAFT);
      checks = (__syncthreads_or(mass_p) ? 1 : 0) | (__syncthreads_or(mass_q) ? 2 : 0);
    }
    const RacePair won = block_reduce(RacePair{res, pb}, BetterPair(), reinterpret_cast<RacePair*>(red));
    // The residual's sum is wanted at a rejection only (bonus and n are the same for the whole block).
    const bool paper_rejects = MODE == SS_MODE_SIGMOID_PAPER && !bonus;
    if (paper_rejects) rsum = block_reduce(rsum, AddFloat(), reinterpret_cast<float*>(red));
    if (threadIdx.x == 0) {
      int* c = cand + ((long long)b * S2 + s) * SS_CAND;
      c[0] = __float_as_int(won.res.key); c[1] = won.res.idx;
      c[2] = __float_as_int(won.pb.key); c[3] = won.pb.idx;
      if (paper_rejects) c[4] = __float_as_int(rsum);
      if (is_sigmoid(MODE)) c[5] = checks;
      sh[2] = publish_add(fin_ctr + b, 1) == S2 - 1;
    }
    __syncthreads();
    if (!sh[2]) return;
    finish(b, rq, n, errs, read_q, red, sh);
  }

  // Last P2 block of request b: reduce the slices' winners and write the outputs. errs: the codes
  // known before the race (the sigmoid methods add their row checks, made in the race's pass).
  __device__ __forceinline__ void finish(int b, const Request& rq, int n, int errs, bool read_q, RaceSlice* red,
                                         int* sh) const {
    RaceSlice acc = {{{-SS_INF, 0x7fffffff}, {-SS_INF, 0x7fffffff}}, 0.f, 0};
    const bool paper_rejects = MODE == SS_MODE_SIGMOID_PAPER && n < rq.L;
    for (int k = threadIdx.x; k < S2; k += SS_THREADS) {
      const int* c = cand + ((long long)b * S2 + k) * SS_CAND;
      acc.won.res = better(acc.won.res, RaceBest{__int_as_float(__ldcg(c)), __ldcg(c + 1)});
      acc.won.pb = better(acc.won.pb, RaceBest{__int_as_float(__ldcg(c + 2)), __ldcg(c + 3)});
      if (paper_rejects) acc.rsum += __int_as_float(__ldcg(c + 4));
      if (is_sigmoid(MODE)) acc.checks |= __ldcg(c + 5);
    }
    acc = block_reduce(acc, CombineRaceSlice(), red);
    RaceBest res = acc.won.res;
    const RaceBest pb = acc.won.pb;
    const int checks = acc.checks;   // the sigmoid methods: the rows at n, masses over every slice
    // SIGMOID_PAPER at a rejection: weights max(1e-5, r / (1e-6 + sum r)), so the winner is the
    // residual's (largest r / E, scaled by the normaliser) or the floor's (largest 1e-5 / E),
    // whichever key is larger: the maximum of a maximum is the larger of the two maxima.
    if (paper_rejects && res.key * (1.f / (1e-6f + acc.rsum)) < 1e-5f * pb.key) res = pb;
    if constexpr (is_sigmoid(MODE)) {   // the rows at n: their values (P2's flags) and masses
      if (!rq.greedy) {
        errs |= __ldcg(err + b);
        if (!(checks & 1) || (read_q && !(checks & 2))) errs |= SS_ERR_NO_MASS;
      }
    }
    if (threadIdx.x == 0) {
      int token = -1;
      if (!errs) {
        if (rq.greedy) token = rows[n].arg;
        else if (MODE == SS_MODE_SIGMOID && n >= rq.L) token = res.key > -SS_INF ? res.idx : -1;
        else token = res.key > 0.f ? res.idx : (pb.key > 0.f ? pb.idx : -1);
        if (token < 0) errs |= SS_ERR_NO_MASS;  // no positive weight in row n (float underflow)
      }
      sh[3] = token;
      sh[1] = errs;
      accepted[b] = errs ? -1 : n;
      emitted[b] = errs ? 0 : n + 1;
      error[b] = errs;
      fin_ctr[b] = 0;
      req_ctr[b] = 0;
      err[b] = 0;
      if (walking()) stop_n[b] = 0;
    }
    if (walking()) {
      for (int i = threadIdx.x; i <= G; i += SS_THREADS) pos_cnt[(long long)b * (G + 1) + i] = 0;
    }
    if constexpr (MODE == SS_MODE_MIN_P) {   // every P1 item of b is done with them (they counted in)
      for (int r = threadIdx.x; r < R; r += SS_THREADS) { row_key[(long long)b * R + r] = 0u; row_cnt[(long long)b * R + r] = 0; }
    }
    __syncthreads();
    for (int i = threadIdx.x; i <= G; i += SS_THREADS) {
      int t = -1;
      if (!sh[1]) t = i < n ? (int)draft_tokens[(long long)b * G + i] : (i == n ? sh[3] : -1);
      tokens[(long long)b * (G + 1) + i] = t;
    }
  }
};

// Every block ends on exactly one ticket past the last item; the block holding the very last ticket
// is the last to touch the counter, and leaves it at zero for the next launch. Where every item has
// a block of its own (`one_each`: small batches) a block takes one ticket only, so the one holding
// ticket gridDim.x - 1 is the last to touch the counter: the block's exit then waits for no round
// trip past the last item, and the last block's exit ends the kernel (2-6 % at B = 1, H100).
__device__ __forceinline__ bool past_last_item(long long item, long long total, unsigned* ticket, bool one_each) {
  const long long last = one_each ? gridDim.x - 1 : total + gridDim.x - 1;
  if (threadIdx.x == 0 && item == last) atomicExch(ticket, 0u);
  return item >= total;
}

template <class T, class TOK, int VEC, int MODE>
__global__ void __launch_bounds__(SS_THREADS, (MODE == SS_MODE_PROBS || MODE == SS_MODE_WARPED) ? 3 : 4) verify_kernel(
    const TOK* draft_tokens, const typename T::storage* draft, const typename T::storage* target,
    const int* lengths, const float* temps, float temp_scalar, int greedy_all,
    unsigned long long seed, const long long* seed_ptr, unsigned long long offset, const long long* offset_ptr,
    const long long* streams, float sig_offset, float sig_scale, unsigned race_purpose,
    int B, int G, int V, int S1, int C1, int S2, int C2, int lag_requests, int walk,
    int* ws, long long part_off, long long cand_off, const float* record, int* out) {
  __shared__ SoftmaxStat red_stat[SS_WARPS];
  __shared__ RaceSlice red_race[SS_WARPS];
  __shared__ int sh[6];  // n, errors, last-block flag, token, no mass, ticket
  extern __shared__ int dynamic_smem[];  // R SoftmaxStat: the combined rows in P2
  Verifier<T, TOK, VEC, MODE> v;
  v.draft_tokens = draft_tokens; v.draft = draft; v.target = target;
  v.lengths = lengths; v.temps = temps; v.temp_scalar = temp_scalar; v.greedy_all = greedy_all != 0;
  v.seed = seed_ptr ? (unsigned long long)*seed_ptr : seed;
  v.offset = (unsigned)(offset_ptr ? (unsigned long long)*offset_ptr : offset);
  v.streams = streams;
  v.sig_offset = sig_offset; v.sig_inv_scale = 1.f / sig_scale; v.race_purpose = race_purpose;
  v.B = B; v.G = G; v.V = V; v.S1 = S1; v.C1 = C1; v.S2 = S2; v.C2 = C2;
  v.R = 2 * G + 1;
  const int R = v.R;
  v.req_ctr = ws; v.fin_ctr = ws + B; v.err = ws + 2 * B;
  v.part = ws + part_off; v.cand = ws + cand_off;   // part_off: a multiple of SS_PART (16-byte words)
  v.rows = reinterpret_cast<SoftmaxStat*>(dynamic_smem);
  v.lists = reinterpret_cast<float*>(dynamic_smem + ((4 * R + 3) & ~3));   // after the rows, 16-byte aligned
  v.record = record;
  // SS_MODE_MIN_P: `record` is the [B] spans; the per-row counters follow the ticket.
  v.span = record;
  v.row_key = reinterpret_cast<unsigned*>(ws + 3 * B + 1);
  v.row_cnt = ws + 3 * B + 1 + B * R;
  v.row_wait = (int)gridDim.x >= S1;
  v.walk = walk != 0;   // the walk order's counters follow the ticket (no min-p ones)
  v.stop_n = ws + 3 * B + 1;
  v.pos_cnt = v.stop_n + B;
  v.accepted = out; v.emitted = out + B; v.error = out + 2 * B; v.tokens = out + 3 * B;
  unsigned* ticket = reinterpret_cast<unsigned*>(ws + 3 * B);

  // Item order. The walk order (exact, probabilities, greedy; the plan's choice): position by
  // position across the batch (target row i and draft row i of request 0, of request 1, ...;
  // position G: target rows only), then every request's P2 items; a P1 item skips its row when its
  // request is known to have stopped before it.
  const long long p1 = (long long)B * R * S1, total = p1 + (long long)B * S2;
  // The sigmoid methods: P2 items only, none waits for another, so no ticket: any assignment makes
  // progress, and each block strides over the items (one fewer atomic round trip before the gather).
  if constexpr (is_sigmoid(MODE)) {
    for (long long item = blockIdx.x; item < total; item += gridDim.x) {
      v.phase2((int)(item / S2), (int)(item % S2), red_race, sh);
      __syncthreads();  // shared flags are reused by the next item
    }
    return;
  }
  const bool one_each = total <= (long long)gridDim.x;
  if (v.walking()) {
    const long long per_pos = 2LL * B * S1;
    for (;;) {
      const long long item = take_ticket(ticket, sh + 5);
      if (past_last_item(item, total, ticket, one_each)) return;
      if (item < p1) {
        const int i = (int)(item / per_pos);
        const int per_req = i < G ? 2 * S1 : S1;
        const int j = (int)(item - i * per_pos);
        const int k = j % per_req;
        v.phase1(j / per_req, k < S1 ? i : G + 1 + i, k % S1, red_stat, sh);
      } else {
        v.phase2((int)((item - p1) / S2), (int)((item - p1) % S2), red_race, sh);
      }
      if (one_each) return;
      __syncthreads();  // shared flags and the ticket slot are reused by the next item
    }
  }
  // Otherwise group g holds the P1 items of request g, then the P2 items of request g - lag. The
  // lag (in requests, about a wave of the grid) lets a request's rows finish before blocks reach
  // its P2 items, so they rarely wait; every P2 item still follows its request's P1 items.
  const long long A = (long long)R * S1;
  const int lag = min(lag_requests, B);
  const long long region_a = lag * A, region_b = (B - lag) * (A + S2);
  for (;;) {
    const long long item = take_ticket(ticket, sh + 5);
    if (past_last_item(item, total, ticket, one_each)) return;
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
    if (first_phase) v.phase1(b, (int)(k / S1), (int)(k % S1), red_stat, sh);
    else v.phase2(b, (int)k, red_race, sh);
    if (one_each) return;
    __syncthreads();  // shared flags and the ticket slot are reused by the next item
  }
}
