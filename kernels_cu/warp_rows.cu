// Row statistics of truncated sampling (top-k, top-p, min-p) for verify_kernel's warped mode.
//
// The rule (specsample_cupy/verification/truncation.py states it for users; its NumPy reference is the CPU path):
// per row z at temperature T, M = max z and d = M - z in float32. top-k keeps d <= the k-th
// smallest d; top-p keeps d <= the smallest d whose cumulative mass (exp(-d / T), ascending d,
// within the top-k set) reaches top_p of that set's mass; min-p keeps d <= span = -T ln(min_p)
// (computed on the host). dmax is the smallest of the three; ties at a threshold are kept.
//
// Parallel decomposition. One cluster of WR_CLUSTER blocks (WR_THREADS threads each) per logit row
// (request b, row r: target rows 0..G, then draft rows 0..G-1, verify.cu's order). Block k copies
// vocabulary slice k of the row into its shared memory: the row is read from global memory once,
// and everything after works on shared memory, with the cluster's blocks exchanging through
// distributed shared memory (DSMEM) at cluster barriers:
//   1. the row maximum M and first argmax, and the NaN/+Inf check;
//   2. top-k and top-p: a select over d: first WR_BINS bins linear in d over all entries (spread
//      out, so shared-memory atomics rarely collide; masses in fixed point, see linear_fill), then
//      the entries of the linear bin chosen: gathered when they are few (the usual case) and
//      selected by rank (each thread counts the entries at or below its own; up to 2 WR_THREADS of
//      them) or sorted (up to WR_GATHER), else a radix select over the bits of d (non-negative
//      floats order like their bits; 11, 10 and 10 bits). Each histogram pass: every block
//      histograms its slice (count and/or mass), the cluster synchronises, block k sums chunk k of
//      the bins over the cluster (reduce-scatter: each bin crosses DSMEM once) and scans it, the
//      chunk totals are exchanged, and the first bin where the cumulative count / mass reaches the
//      target is taken from the lowest chunk that holds one. Sums run in rank order, so every block
//      computes the same thresholds. Two histogram buffers alternate, so a pass never overwrites
//      one a peer is still reading;
//   3. the kept mass E = sum over d <= dmax of exp((z - M) / T): from the top-p select when its
//      threshold is dmax, else one more pass, per block, then over ranks.
// Rank 0 writes the row's record (M / T, E, argmax, M, dmax); verify_kernel (SS_MODE_WARPED) reads
// it instead of computing statistics, and gives entries with M - z > dmax no probability.
// Greedy requests (temperature 0) need only M and the argmax; inactive rows are skipped whole.
// Two blocks per multiprocessor (shared memory allows two up to V = 151936 in float32). 512-thread
// blocks measured within 10 % of 256 either way (faster top-p at B = 1, slower top-k and float16).
#include <cooperative_groups.h>

#include "codes.cuh"
#include "block_reduce.cuh"
#include "load.cuh"
#include "warp_record.cuh"
#include "temperature.cuh"

namespace cg = cooperative_groups;

#define WR_CLUSTER 8
#define WR_THREADS 256
#define WR_WARPS (WR_THREADS / 32)
#define WR_BINS 2048          // the widest pass: 11 bits
#define WR_INF __int_as_float(0x7f800000)
#define WR_LOG2E 1.4426950408889634f
#define WR_GATHER 1024        // a linear bin with at most this many entries is gathered and sorted
#define WR_RANK_SLOTS 2       // up to WR_RANK_SLOTS x WR_THREADS gathered entries are selected by rank

struct WarpHist {
  unsigned count[WR_BINS];
  float mass[WR_BINS];   // the linear pass keeps fixed-point sums here (as unsigned), see linear_fill
  float far;             // the linear pass: this block's mass in the last bin, summed without atomics
};

// The bin a radix pass chose, and the count / mass of the (cluster's) entries in the bins below it.
struct Crossing {
  int bin;
  unsigned count_below;
  float mass_below, mass_bin;
  unsigned count_bin;
};

struct CountMass {
  unsigned c;
  float m;
};

struct MinInt {
  __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};
struct KeyRange {   // the smallest key reaching a target and the largest key, reduced together
  unsigned lo, hi;
};
struct MinMaxKeys {
  __device__ KeyRange operator()(KeyRange a, KeyRange b) const {
    return KeyRange{a.lo < b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi};
  }
};
struct HitLast {   // the first bin reaching a target and the last non-empty bin, reduced together
  int hit, last;
};
struct MinMaxBins {
  __device__ HitLast operator()(HitLast a, HitLast b) const {
    return HitLast{a.hit < b.hit ? a.hit : b.hit, a.last > b.last ? a.last : b.last};
  }
};

// The cluster's work on one row once every block holds its slice (see the header).
// The kernel's shared memory, at file scope so that RowSelect addresses it directly (32-bit shared
// addresses, no pointers held in registers).
__shared__ WarpHist wr_hist[2];           // two histogram buffers, alternating by pass
__shared__ CountMass wr_scan[WR_WARPS];
__shared__ int wr_red[WR_WARPS];
__shared__ KeyRange wr_red_keys[WR_WARPS];
__shared__ float wr_rank_mass;   // gather_select by rank: the mass of the keys <= the threshold
__shared__ HitLast wr_red_bins[WR_WARPS];
__shared__ float wr_sum_red[WR_WARPS];
// Read by the peers within a pass: this block's chunk total, its chunk's crossing [0] and last
// non-empty bin [1], and whether it has them; the number of candidates it gathered.
__shared__ CountMass wr_chunk_total;
__shared__ Crossing wr_cross[2];
__shared__ int wr_flags[2];
__shared__ int wr_list_len;
extern __shared__ __align__(16) float wr_vals[];   // C entries: this block's slice of the row, decoded

struct RowSelect {
  int n;               // the length of this block's slice (wr_vals)
  int C;               // the longest slice (the same in every block of the cluster)
  float M, c, mc;      // row maximum; log2(e) / T; M * c
  float dtop;          // the largest finite d of the row (M - its smallest finite entry)
  int pass;

  // exp((z - M) / T), as verify_kernel weighs an entry.
  __device__ __forceinline__ float mass_of(float v) const { return ex2_approx(fmaf(v, c, -mc)); }

  // Exclusive block-wide scan of (count, mass) in thread order, and the block total.
  __device__ CountMass exclusive_scan(CountMass x, CountMass& total) const {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    CountMass inc = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned cu = __shfl_up_sync(0xffffffffu, inc.c, o);
      const float mu = __shfl_up_sync(0xffffffffu, inc.m, o);
      if (lane >= o) { inc.c += cu; inc.m += mu; }
    }
    if (lane == 31) wr_scan[warp] = inc;
    __syncthreads();
    CountMass before = {0u, 0.f};
    total = CountMass{0u, 0.f};
#pragma unroll
    for (int w = 0; w < WR_WARPS; ++w) {
      const CountMass s = wr_scan[w];
      if (w < warp) { before.c += s.c; before.m += s.m; }
      total.c += s.c; total.m += s.m;
    }
    __syncthreads();
    return CountMass{before.c + inc.c - x.c, before.m + inc.m - x.m};
  }

  // Linear bins over d in [0, dtop] (the first level: entries spread over the bins, so the
  // shared-memory atomics rarely collide), monotone in d.
  __device__ __forceinline__ int linear_bin(float d, float scale) const {
    const float f = d * scale;
    return f < (float)(WR_BINS - 1) ? (int)f : WR_BINS - 1;
  }

  // The linear level's histogram of the entries with key <= limit (key = bits of d = M - z).
  // Float atomics on shared memory are compare-and-swap loops, so masses go in fixed point through
  // native integer atomics: an entry of bin j < WR_BINS - 1 has f = d * scale = j + t, t in [0, 1),
  // and mass 2^(-f A) = 2^(-j A) (1 - u), u = 1 - 2^(-t A) < A ln 2, where A is the bin width in
  // log2 units (<= 40 / WR_BINS, see select). The bin sums its count n and U = sum of round(u q),
  // q = 2^S, and its mass is 2^(-j A) (n - U / q): u to ~1e-9 by three terms of its series and the
  // rounding at 1 / (2 q) keep each entry's mass within float32 rounding of exp2's. S keeps U below
  // 2^32 even for a whole slice in one bin. The last bin (f >= WR_BINS - 1: up to dtop, and -inf
  // entries) sums its counts and masses in registers, then once over the block.
  __device__ void linear_fill(WarpHist& h, unsigned limit, float scale, bool want_mass, float A, float q) {
    const float a_ln2 = A * 0.6931471805599453f;
    float far = 0.f;
    unsigned far_n = 0u;   // the last bin's entries, counted here and added once per thread
    // FILL_LOADS entries per thread per step, loaded together (independent reads in flight).
    constexpr int FILL_LOADS = 4;
    for (int base = 0; base < n; base += FILL_LOADS * WR_THREADS) {
      float vs[FILL_LOADS];
#pragma unroll
      for (int u = 0; u < FILL_LOADS; ++u) {
        const int i = base + u * WR_THREADS + (int)threadIdx.x;
        vs[u] = i < n ? wr_vals[i] : 0.f;
      }
#pragma unroll
      for (int u = 0; u < FILL_LOADS; ++u) {
        const float v = vs[u];
        const float d = M - v;
        if (base + u * WR_THREADS + (int)threadIdx.x >= n || __float_as_uint(d) > limit) continue;
        const float f = d * scale;
        if (f < (float)(WR_BINS - 1)) {   // linear_bin's test
          const int j = (int)f;
          atomicAdd(&h.count[j], 1u);
          if (want_mass) {
            const float y = (f - (float)j) * a_ln2;                        // t A ln 2, exact t
            const float u1 = y * fmaf(y, fmaf(y, 1.f / 6.f, -0.5f), 1.f);  // 1 - e^-y
            atomicAdd(reinterpret_cast<unsigned*>(&h.mass[j]), __float2uint_rn(u1 * q));
          }
        } else {
          ++far_n;
          if (want_mass) far += mass_of(v);
        }
      }
    }
    if (far_n) atomicAdd(&h.count[WR_BINS - 1], far_n);
    if (want_mass) {
      far = block_reduce<WR_WARPS>(far, AddFloat(), wr_sum_red);
      if (threadIdx.x == 0) h.far = far;
    }
  }

  // One pass over the entries with key <= limit: shift < 0 bins them linearly (WR_BINS bins,
  // `scale`, linear_fill; A and q are its fixed-point parameters); else it keeps those in linear bin
  // `lin` whose key bits above shift + width equal prefix, binned by the next `width` bits. Returns
  // the first bin whose cumulative count (by_mass: mass) reaches the target, or, when float rounding
  // leaves none reaching it, the last non-empty bin. by_mass with frac > 0 first sets target_mass to
  // frac x the pass's total mass. Masses are histogrammed only when want_mass.
  __device__ Crossing pass_once(unsigned prefix, int shift, int width, unsigned limit, float scale, int lin,
                                bool by_mass, bool want_mass, float frac, unsigned target_count,
                                float& target_mass, float A = 0.f, float q = 0.f) {
    WarpHist& h = wr_hist[pass++ & 1];
    const int nbins = shift < 0 ? WR_BINS : 1 << width;
    for (int i = threadIdx.x; i < nbins; i += WR_THREADS) { h.count[i] = 0u; h.mass[i] = 0.f; }
    __syncthreads();
    if (shift < 0) {
      linear_fill(h, limit, scale, want_mass, A, q);
    } else {
      // Radix passes (crowded linear bins only): few entries, float atomics.
      const unsigned mask = (unsigned)nbins - 1u;
      const int top = shift + width;
      for (int i = threadIdx.x; i < n; i += WR_THREADS) {
        const float v = wr_vals[i];
        const float d = M - v;
        const unsigned key = __float_as_uint(d);
        if (key > limit || (lin >= 0 && linear_bin(d, scale) != lin) || (top < 32 && (key >> top) != prefix)) continue;
        const unsigned bin = (key >> shift) & mask;
        atomicAdd(&h.count[bin], 1u);
        if (want_mass) atomicAdd(&h.mass[bin], mass_of(v));
      }
    }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    // Reduce-scatter: block `rank` sums its chunk of the bins over the cluster (one bin per thread),
    // so each histogram entry crosses DSMEM once.
    const int rank = (int)cluster.block_rank();
    const int chunk = nbins / WR_CLUSTER;
    const int mybin = rank * chunk + threadIdx.x;
    CountMass mine = {0u, 0.f};
    if ((int)threadIdx.x < chunk) {
      if (shift < 0 && want_mass) {   // fixed point (linear_fill)
        unsigned long long U = 0ull;
        float far = 0.f;
#pragma unroll
        for (int r = 0; r < WR_CLUSTER; ++r) {
          const WarpHist* peer = cluster.map_shared_rank(&h, r);
          mine.c += peer->count[mybin];
          U += __float_as_uint(peer->mass[mybin]);
          if (mybin == WR_BINS - 1) far += peer->far;
        }
        mine.m = mybin == WR_BINS - 1 ? far : exp2f(-(float)mybin * A) * ((float)mine.c - (float)U / q);
      } else {
#pragma unroll
        for (int r = 0; r < WR_CLUSTER; ++r) {
          const WarpHist* peer = cluster.map_shared_rank(&h, r);
          mine.c += peer->count[mybin];
          if (want_mass) mine.m += peer->mass[mybin];
        }
      }
    }
    CountMass chunk_sum;
    const CountMass below_in_chunk = exclusive_scan(mine, chunk_sum);
    if (threadIdx.x == 0) wr_chunk_total = chunk_sum;
    cluster.sync();
    // Every block: the chunks' totals in rank order (identical everywhere), the target, and the
    // cumulative count / mass before this block's chunk.
    CountMass total = {0u, 0.f}, before_chunk = {0u, 0.f};
#pragma unroll
    for (int r = 0; r < WR_CLUSTER; ++r) {
      const CountMass t = *cluster.map_shared_rank(&wr_chunk_total, r);
      if (r < rank) { before_chunk.c += t.c; before_chunk.m += t.m; }
      total.c += t.c; total.m += t.m;
    }
    if (by_mass && frac > 0.f) target_mass = frac * total.m;
    // This chunk's first bin reaching the target, and its last non-empty bin (the fallback).
    const Crossing here = {mybin, before_chunk.c + below_in_chunk.c, before_chunk.m + below_in_chunk.m, mine.m,
                           mine.c};
    const bool reach = (int)threadIdx.x < chunk && mine.c > 0u &&
        (by_mass ? here.mass_below + mine.m >= target_mass : here.count_below + mine.c >= target_count);
    const HitLast hl = block_reduce<WR_WARPS>(
        HitLast{reach ? mybin : 0x7fffffff, (int)threadIdx.x < chunk && mine.c > 0u ? mybin : -1}, MinMaxBins(),
        wr_red_bins);
    if (reach && mybin == hl.hit) wr_cross[0] = here;
    if (hl.last >= 0 && mybin == hl.last) wr_cross[1] = here;
    if (threadIdx.x == 0) { wr_flags[0] = hl.hit != 0x7fffffff; wr_flags[1] = hl.last >= 0; }
    cluster.sync();
    // The lowest rank with a hit has the crossing; without one, the highest non-empty bin. Lane r
    // reads rank r's flags (the ranks' reads overlap instead of following one another).
    const int lane = threadIdx.x & 31;
    const bool f0 = lane < WR_CLUSTER && *cluster.map_shared_rank(&wr_flags[0], lane);
    const bool f1 = lane < WR_CLUSTER && *cluster.map_shared_rank(&wr_flags[1], lane);
    const unsigned hits = __ballot_sync(0xffffffffu, f0), lasts = __ballot_sync(0xffffffffu, f1);
    if (hits) return cluster.map_shared_rank(wr_cross, __ffs(hits) - 1)[0];
    if (lasts) return cluster.map_shared_rank(wr_cross, 31 - __clz(lasts))[1];
    return Crossing{WR_BINS - 1, total.c, total.m, 0.f, 0u};
  }

  // The linear level's bin `lin` holds few entries (<= WR_GATHER over the cluster): every block
  // gathers them all (each block lists its own, and every reader copies the lists of all peers at
  // once, one DSMEM round trip per WR_THREADS entries), then finds the smallest key K whose count /
  // mass of entries with key <= K, after the bins below (target_* already net of them), reaches the
  // target (none reaching, by float rounding: the largest key). Up to WR_RANK_SLOTS x WR_THREADS
  // entries by rank: each thread counts, for each of its entries, the entries with a key <= its key
  // (no sort, three block barriers); more, by a bitonic sort and a scan in sorted order. (On bench
  // verify's rows the crossing bin holds ~150-300 entries: one slot sent some rows to the sort.)
  __device__ unsigned gather_select(unsigned limit, float scale, int lin, bool by_mass, unsigned target_count,
                                    float target_mass, float mass_below, float* mass_le) {
    cg::cluster_group cluster = cg::this_cluster();
    WarpHist& mine = wr_hist[pass++ & 1];   // this block's candidates: keys in count[], masses in mass[]
    WarpHist& all = wr_hist[pass++ & 1];    // every block's, gathered
    if (threadIdx.x == 0) { wr_list_len = 0; wr_rank_mass = 0.f; }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    // GATHER_LOADS entries per thread per step: their loads and tests are independent, so they
    // overlap instead of each waiting for the previous one's ballot.
    constexpr int GATHER_LOADS = 4;
    for (int base = 0; base < n; base += GATHER_LOADS * WR_THREADS) {
      float v[GATHER_LOADS];
      unsigned key[GATHER_LOADS];
      bool take[GATHER_LOADS];
#pragma unroll
      for (int u = 0; u < GATHER_LOADS; ++u) {
        const int i = base + u * WR_THREADS + (int)threadIdx.x;
        v[u] = i < n ? wr_vals[i] : 0.f;
        const float d = M - v[u];
        key[u] = __float_as_uint(d);
        take[u] = i < n && key[u] <= limit && linear_bin(d, scale) == lin;
      }
#pragma unroll
      for (int u = 0; u < GATHER_LOADS; ++u) {
        const unsigned ballot = __ballot_sync(0xffffffffu, take[u]);
        if (!ballot) continue;   // the usual case: the bin holds few of the slice's entries
        int at = 0;
        if (lane == 0) at = atomicAdd(&wr_list_len, __popc(ballot));
        at = __shfl_sync(0xffffffffu, at, 0) + __popc(ballot & ((1u << lane) - 1u));
        if (take[u]) { mine.count[at] = key[u]; mine.mass[at] = mass_of(v[u]); }
      }
    }
    cluster.sync();
    // The peers' list lengths, read at once (lane r reads rank r's), and where each list starts.
    const int len_r = lane < WR_CLUSTER ? *cluster.map_shared_rank(&wr_list_len, lane) : 0;
    int start[WR_CLUSTER + 1];
    start[0] = 0;
#pragma unroll
    for (int r = 0; r < WR_CLUSTER; ++r) start[r + 1] = start[r] + __shfl_sync(0xffffffffu, len_r, r);
    const int total = start[WR_CLUSTER];
    const bool by_rank = total <= WR_RANK_SLOTS * WR_THREADS;
    int N = 1;
    while (N < total) N <<= 1;
    for (int k = threadIdx.x; k < total; k += WR_THREADS) {
      int r = 0, from = 0;   // the rank whose list holds entry k, and where that list starts
#pragma unroll
      for (int q = 1; q < WR_CLUSTER; ++q)
        if (k >= start[q]) { r = q; from = start[q]; }
      const WarpHist* peer = cluster.map_shared_rank(&mine, r);
      all.count[k] = peer->count[k - from];
      all.mass[k] = peer->mass[k - from];
    }
    if (!by_rank)
      for (int k = total + (int)threadIdx.x; k < N; k += WR_THREADS) { all.count[k] = 0xffffffffu; all.mass[k] = 0.f; }
    cluster.sync();   // every peer has copied this block's list: the buffers are free again after this
    if (by_rank) {
      // Thread t holds entries t and t + WR_THREADS (WR_RANK_SLOTS of them), counted in one loop.
      unsigned my_key[WR_RANK_SLOTS], c_le[WR_RANK_SLOTS];
      float m_le[WR_RANK_SLOTS];
#pragma unroll
      for (int s = 0; s < WR_RANK_SLOTS; ++s) {
        const int i = threadIdx.x + s * WR_THREADS;
        my_key[s] = i < total ? all.count[i] : 0xffffffffu;
        c_le[s] = 0u;
        m_le[s] = 0.f;
      }
      const int slots = total > WR_THREADS ? WR_RANK_SLOTS : 1;
      for (int j = 0; j < total; ++j) {   // the same j in every thread: broadcast reads
        const unsigned k = all.count[j];
        const float m = all.mass[j];
#pragma unroll
        for (int s = 0; s < WR_RANK_SLOTS; ++s) {
          if (s < slots) {
            const bool le = k <= my_key[s];
            c_le[s] += le;
            m_le[s] += le ? m : 0.f;
          }
        }
      }
      // K: the smallest key reaching the target; else the largest key. Keys are floats' bits of
      // d >= 0, so unsigned order is their order; the min and max are taken together.
      KeyRange mine_kr = {0xffffffffu, 0u};
#pragma unroll
      for (int s = 0; s < WR_RANK_SLOTS; ++s) {
        const bool present = threadIdx.x + s * WR_THREADS < total;
        const bool reach = present && (by_mass ? m_le[s] >= target_mass : c_le[s] >= target_count);
        mine_kr = MinMaxKeys()(mine_kr, KeyRange{reach ? my_key[s] : 0xffffffffu, present ? my_key[s] : 0u});
      }
      const KeyRange kr = block_reduce<WR_WARPS>(mine_kr, MinMaxKeys(), wr_red_keys);
      const unsigned K = kr.lo != 0xffffffffu ? kr.lo : kr.hi;
#pragma unroll
      for (int s = 0; s < WR_RANK_SLOTS; ++s)   // every holder of K wrote the same sum
        if (threadIdx.x + s * WR_THREADS < total && my_key[s] == K) wr_rank_mass = m_le[s];
      __syncthreads();
      *mass_le = mass_below + wr_rank_mass;
      return K;
    }
    // Bitonic sort of (key, mass) by key, ascending.
    for (int size = 2; size <= N; size <<= 1) {
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        for (int i = threadIdx.x; i < N; i += WR_THREADS) {
          const int j = i ^ stride;
          if (j > i) {
            const unsigned a = all.count[i], b = all.count[j];
            if ((a > b) == ((i & size) == 0)) {
              all.count[i] = b; all.count[j] = a;
              const float t = all.mass[i]; all.mass[i] = all.mass[j]; all.mass[j] = t;
            }
          }
        }
        __syncthreads();
      }
    }
    // Scan in sorted order: each thread takes WR_GATHER / WR_THREADS consecutive entries.
    constexpr int PER = WR_GATHER / WR_THREADS;
    const int first = threadIdx.x * PER;
    CountMass own = {0u, 0.f};
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      if (first + j < total) { own.c += 1u; own.m += all.mass[first + j]; }
    }
    CountMass sum;
    CountMass cum = exclusive_scan(own, sum);
    int hit = 0x7fffffff;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      if (first + j < total) {
        cum.c += 1u; cum.m += all.mass[first + j];
        const bool reach = by_mass ? cum.m >= target_mass : cum.c >= target_count;
        if (reach && hit == 0x7fffffff) hit = first + j;
      }
    }
    hit = block_reduce<WR_WARPS>(hit, MinInt(), wr_red);
    if (hit == 0x7fffffff) hit = total - 1;   // rounding left the target unreached: keep the whole bin
    const unsigned K = all.count[hit];
    // The mass of every key <= K (ties past `hit` included), for the top-p set within top-k.
    float m = 0.f;
    for (int k = threadIdx.x; k < total; k += WR_THREADS) m += all.count[k] <= K ? all.mass[k] : 0.f;
    m = block_reduce<WR_WARPS>(m, AddFloat(), wr_sum_red);
    *mass_le = mass_below + m;
    return K;
  }

  // First a linear level over all the entries, then three radix passes (11, 10, 10 bits) over the
  // entries of the linear bin it chose only: few entries, so collisions there cost little.
  __device__ unsigned select(unsigned limit, bool by_mass, bool want_mass, float frac, unsigned target_count,
                             float* mass_le) {
    const bool with_mass = want_mass || by_mass;
    float span = fminf(dtop, __uint_as_float(limit));
    // With masses, the linear bins stop at d c = 40 (mass 2^-40 of the maximum's): the top-p
    // crossing lies below unless top_p is within ~V 2^-40 of 1, and then the last bin (summed
    // exactly) holds it.
    if (with_mass) span = fminf(span, 40.f / c);
    const float scale = span > 0.f ? (float)WR_BINS / span : 0.f;
    float A = 0.f, q = 1.f;
    if (with_mass && scale > 0.f) {
      A = c / scale;
      // 2^S with C (A ln 2 q + 1/2) < 4e9 < 2^32: a whole slice in one bin cannot overflow U.
      const float cap = (4.0e9f / (float)C - 0.5f) / fmaxf(A * 0.6931472f, 1e-30f);
      q = exp2f(fminf(30.f, floorf(log2f(cap))));
    }
    float target_mass = 0.f;
    Crossing x = pass_once(0u, -1, 0, limit, scale, -1, by_mass, with_mass, frac, target_count, target_mass, A, q);
    const int lin = x.bin;
    target_count -= x.count_below;
    target_mass -= x.mass_below;
    float mass_below = x.mass_below;
    if (x.count_bin <= WR_GATHER) return gather_select(limit, scale, lin, by_mass, target_count, target_mass,
                                                        mass_below, mass_le);
    const int shifts[3] = {20, 10, 0}, widths[3] = {11, 10, 10};
    unsigned prefix = 0u;
#pragma unroll
    for (int p = 0; p < 3; ++p) {
      x = pass_once(prefix, shifts[p], widths[p], limit, scale, lin, by_mass, with_mass, 0.f,
                    target_count, target_mass);
      prefix = (prefix << widths[p]) | (unsigned)x.bin;
      target_count -= x.count_below;
      target_mass -= x.mass_below;
      mass_below += x.mass_below;
    }
    *mass_le = mass_below + x.mass_bin;
    return prefix;
  }
};

// draft [B, G, V]; target: request b's G + 1 rows start at target + b * tpitch ((G + 1) V for verify's
// [B, G + 1, V]; the device loop's samplers pass G = 0 and the last column of a [B, S, V] run output,
// tpitch = S V). record: [B (2G + 1), SS_RECORD] in verify.cu's row order.
template <class T, int VEC>
__global__ void __cluster_dims__(WR_CLUSTER, 1, 1) __launch_bounds__(WR_THREADS, 2) warp_rows_kernel(
    const typename T::storage* __restrict__ draft, const typename T::storage* __restrict__ target,
    const int* __restrict__ lengths, const float* __restrict__ temps, float temp_scalar, int greedy_all,
    const int* __restrict__ top_k, const float* __restrict__ top_p, const float* __restrict__ span,
    int B, int G, int V, int C, long long tpitch, int* __restrict__ err, float* __restrict__ record) {
  __shared__ RaceBest best_red[WR_WARPS];
  __shared__ RaceBest block_best;   // read by the peers: this block's maximum and first argmax
  __shared__ int block_bad;
  __shared__ float block_low;
  __shared__ float block_mass;

  cg::cluster_group cluster = cg::this_cluster();
  const int R = 2 * G + 1;
  const int row = blockIdx.x / WR_CLUSTER, rank = (int)cluster.block_rank();
  const int b = row / R, r = row % R;
  const bool is_target = r <= G;
  const int i = is_target ? r : r - G - 1;
  // The request's temperature and length by verify_kernel's rules (its request()).
  bool bad_t;
  const float t = request_temperature(temps, temp_scalar, b, bad_t);
  const bool greedy = greedy_all || t == 0.f;
  const float inv_t = greedy ? 1.f : 1.f / t;
  int L = lengths ? lengths[b] : G;
  L = min(max(L, 0), G);
  const bool active = is_target ? i <= L : (i < L && !greedy && draft != nullptr);
  if (!active) return;   // the whole cluster leaves together, before any cluster barrier
  const typename T::storage* src = (is_target ? target + (long long)b * tpitch + (long long)i * V
                                              : draft + ((long long)b * G + i) * V);
  const int lo = rank * C;
  const int n = max(0, min(C, V - lo));

  // 1. Copy the slice (LOADS loads of VEC entries in flight per thread; VEC > 1: 16-byte loads, the
  // host checks the alignment, and V and C are multiples of VEC, so a vector is wholly in the slice
  // or wholly past it); maximum, first argmax, smallest finite entry, NaN/+Inf check.
  constexpr int LOADS = VEC == 1 ? 8 : 32 / VEC;
  constexpr int STEP = WR_THREADS * VEC;
  RaceBest best = {-WR_INF, 0x7fffffff};
  float low = WR_INF;
  bool bad = false;
  for (int base = threadIdx.x * VEC; base < n; base += LOADS * STEP) {
    float v[LOADS][VEC];
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
      const int k = base + u * STEP;
      if (k < n) {
        load_vec<T, VEC>(src + lo + k, v[u]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[u][e] = -WR_INF;
      }
    }
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
      const int k0 = base + u * STEP;
      if (k0 < n) {
        if constexpr (VEC == 1) {
          wr_vals[k0] = v[u][0];
        } else {
#pragma unroll
          for (int e = 0; e < VEC; e += 4)
            *reinterpret_cast<float4*>(wr_vals + k0 + e) = make_float4(v[u][e], v[u][e + 1], v[u][e + 2], v[u][e + 3]);
        }
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int k = k0 + e;
        bad |= !(v[u][e] < WR_INF);
        if (v[u][e] > best.key) { best.key = v[u][e]; best.idx = lo + k; }
        if (v[u][e] > -WR_INF) low = fminf(low, v[u][e]);
      }
    }
  }
  best = block_reduce<WR_WARPS>(best, BetterRace(), best_red);
  low = -block_reduce<WR_WARPS>(-low, MaxFloat(), wr_sum_red);
  const int any_bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) { block_best = best; block_bad = any_bad; block_low = low; }
  if (any_bad && threadIdx.x == 0) atomicOr(err + b, is_target ? SS_ERR_TARGET : SS_ERR_DRAFT);
  cluster.sync();
  RaceBest top = {-WR_INF, 0x7fffffff};
  int row_bad = 0;
  float row_low = WR_INF;
  for (int k = 0; k < WR_CLUSTER; ++k) {
    top = better(top, *cluster.map_shared_rank(&block_best, k));
    row_bad |= *cluster.map_shared_rank(&block_bad, k);
    row_low = fminf(row_low, *cluster.map_shared_rank(&block_low, k));
  }
  const float M = top.key;
  float dmax = WR_INF, mass = 1.f;
  bool mass_known = false;
  // 2. Thresholds, for sampled rows with mass and valid values (bad rows are errors anyway). Greedy
  // rows keep everything; their mass (at temperature 1) serves the log-probabilities.
  const bool has_mass = !row_bad && M > -WR_INF;
  const bool warp = !greedy && has_mass;
  RowSelect sel;
  sel.n = n; sel.C = C; sel.M = M;
  sel.c = inv_t * WR_LOG2E; sel.mc = M * sel.c;
  sel.dtop = row_low < WR_INF ? M - row_low : 0.f;
  sel.pass = 0;
  if (warp) {
    const int k = top_k[b];
    const float p = top_p[b];
    dmax = span[b];
    unsigned limit = 0xffffffffu;
    if (k > 0 && k < V) {
      float mass_k;
      limit = sel.select(0xffffffffu, false, false, 0.f, (unsigned)k, &mass_k);
      dmax = fminf(dmax, __uint_as_float(limit));
    }
    if (p < 1.f) {
      float mass_le;
      const float kp = __uint_as_float(sel.select(limit, true, true, p, 0u, &mass_le));
      if (kp <= dmax) {   // top-p sets dmax (its key is within the top-k set): its mass is E
        dmax = kp;
        mass = mass_le;
        mass_known = true;
      }
    }
  }
  // Every block of the cluster has the same mass_known, so all take the same branch.
  if (has_mass && !mass_known) {
    // 3. The kept mass.
    // MASS_LOADS entries per thread per step, with their own sums: independent reads and exps.
    constexpr int MASS_LOADS = 4;
    float parts[MASS_LOADS] = {};
    for (int base = 0; base < n; base += MASS_LOADS * WR_THREADS) {
#pragma unroll
      for (int u = 0; u < MASS_LOADS; ++u) {
        const int k2 = base + u * WR_THREADS + (int)threadIdx.x;
        const float v = k2 < n ? wr_vals[k2] : -WR_INF;
        if (M - v <= dmax) parts[u] += sel.mass_of(v);
      }
    }
    float part = 0.f;
#pragma unroll
    for (int u = 0; u < MASS_LOADS; ++u) part += parts[u];
    part = block_reduce<WR_WARPS>(part, AddFloat(), wr_sum_red);
    if (threadIdx.x == 0) block_mass = part;
    cluster.sync();
    if (rank == 0 && threadIdx.x == 0) {
      mass = 0.f;
      for (int q = 0; q < WR_CLUSTER; ++q) mass += *cluster.map_shared_rank(&block_mass, q);
    }
  }
  if (rank == 0 && threadIdx.x == 0) {
    float* rec = record + (long long)row * SS_RECORD;
    rec[SS_REC_M] = M * inv_t;
    rec[SS_REC_S] = mass;
    rec[SS_REC_ARG] = __int_as_float(top.idx);
    rec[SS_REC_MAX] = M;
    rec[SS_REC_DMAX] = dmax;
  }
  cluster.sync();   // no block leaves while a peer may still read its shared memory
}

// Log-probabilities of verify's emitted tokens under the (truncated) target distributions they were
// drawn from, from the same rows' records: log p(x) = (z_x - M) / T - log E (greedy requests: at
// temperature 1, untruncated); -inf past a request's emitted tokens and for requests with errors.
// One thread per (request, position); out is verify's [accepted B | emitted B | error B | tokens].
template <class T>
__global__ void __launch_bounds__(SS_THREADS) emitted_logprobs_kernel(
    const typename T::storage* __restrict__ target, const float* __restrict__ record, const int* __restrict__ out,
    const float* __restrict__ temps, float temp_scalar, int greedy_all, int B, int G, int V,
    float* __restrict__ logprobs) {
  const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= (long long)B * (G + 1)) return;
  const int b = (int)(k / (G + 1)), j = (int)(k % (G + 1));
  float lp = -WR_INF;
  const int token = out[3 * B + k];
  if (j < out[B + b] && token >= 0 && token < V) {
    bool bad_t;
    const float t = request_temperature(temps, temp_scalar, b, bad_t);
    const float inv_t = greedy_all || t == 0.f ? 1.f : 1.f / t;
    const float* rec = record + ((long long)b * (2 * G + 1) + j) * SS_RECORD;
    const float z = decode<T>(target[((long long)b * (G + 1) + j) * V + token]);
    if (rec[SS_REC_MAX] - z <= rec[SS_REC_DMAX])
      lp = (z - rec[SS_REC_MAX]) * inv_t - logf(rec[SS_REC_S]);
  }
  logprobs[k] = lp;
}

// The instantiations verification/kernel_launch.py launches (named here too so that an offline nvcc compiles them).
#define WR_ARGS(S) const S*, const S*, const int*, const float*, float, int, const int*, const float*, \
    const float*, int, int, int, int, long long, int*, float*
template __global__ void warp_rows_kernel<f32, 1>(WR_ARGS(float));
template __global__ void warp_rows_kernel<f32, 4>(WR_ARGS(float));
template __global__ void warp_rows_kernel<f16, 1>(WR_ARGS(unsigned short));
template __global__ void warp_rows_kernel<f16, 8>(WR_ARGS(unsigned short));
template __global__ void warp_rows_kernel<bf16, 1>(WR_ARGS(unsigned short));
template __global__ void warp_rows_kernel<bf16, 8>(WR_ARGS(unsigned short));
#define LP_ARGS(S) const S*, const float*, const int*, const float*, float, int, int, int, int, float*
template __global__ void emitted_logprobs_kernel<f32>(LP_ARGS(float));
template __global__ void emitted_logprobs_kernel<f16>(LP_ARGS(unsigned short));
template __global__ void emitted_logprobs_kernel<bf16>(LP_ARGS(unsigned short));
