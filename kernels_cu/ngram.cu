// Prompt-lookup (n-gram) draft proposals: specsample_cupy/decode/ngram.py states the rule, and its
// propose_ngram() is the reference these outputs equal.
//
// Parallel decomposition: one 256-thread block per request. The rule's loop over n-gram lengths k
// (longest first, then the most recent earlier occurrence) is a single scan: threads stride over the
// candidate ends e <= n - 2 of an earlier occurrence, and each counts c(e), how many tokens ending at
// e agree with those ending at n - 1 (at most ngram_max). The suffix of length k occurs earlier ending
// at e iff c(e) >= k, so the winner has the largest c (the longest n-gram), then the largest e (the
// most recent): one block-wide max-reduction over (c, e) packed into a 64-bit key. The proposal starts
// at e + 1; threads then take its positions, a block-wide min-reduction finds where the first EOS
// cuts it, and threads write the tokens and the padding. Nothing is shared between blocks.
#include "block_reduce.cuh"

// Per-request ints arrive in their caller's dtype (decode/ngram.py passes the element width), so the
// device state needs no conversion per call: 8 = int64, 4 = int32, 1 = bool/uint8.
__device__ __forceinline__ long long load_int(const void* p, int bytes, long long i) {
  if (bytes == 8) return static_cast<const long long*>(p)[i];
  if (bytes == 4) return static_cast<const int*>(p)[i];
  return static_cast<const unsigned char*>(p)[i];
}

struct MaxKey {
  __device__ long long operator()(long long a, long long b) const { return a > b ? a : b; }
};
struct MinInt {
  __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};

// The key of the most recent occurrence of the longest suffix of h[0..n-1] of at least ngram_min
// tokens: (c << 32) | e, or -1 where there is none. Called by the whole block.
__device__ __forceinline__ long long best_match(const long long* __restrict__ h, long long n, int ngram_min,
                                                int ngram_max, long long* scratch) {
  long long best = -1;
  for (long long e = threadIdx.x; e <= n - 2; e += blockDim.x) {
    int c = 0;   // c <= e keeps h[e - c] inside the row; then n - 1 - c > e - c too
    while (c < ngram_max && c <= e && h[e - c] == h[n - 1 - c]) ++c;
    if (c >= ngram_min) best = max(best, ((long long)c << 32) | e);   // e < P < 2^31
  }
  return block_reduce(best, MaxKey(), scratch);
}

// How much of the proposal h[start .. start + room - 1] stands: cut just after its first EOS.
// Called by the whole block.
__device__ __forceinline__ int cut_at_eos(const long long* __restrict__ h, long long start, int room,
                                          const void* __restrict__ eos, int eos_bytes, int n_eos, int* scratch) {
  int length = room;
  for (int t = threadIdx.x; t < room; t += blockDim.x) {
    const long long token = h[start + t];
    for (int i = 0; i < n_eos; ++i) {
      if (token == load_int(eos, eos_bytes, i)) {
        length = min(length, t + 1);   // a thread's positions rise: its first hit is its least
        break;
      }
    }
    if (length < room) break;
  }
  return block_reduce(length, MinInt(), scratch);
}

extern "C" __global__ void __launch_bounds__(SS_THREADS) ngram_propose(
    const long long* __restrict__ seq, long long seq_pitch, int P, const void* __restrict__ seq_len,
    int seq_len_bytes, const void* __restrict__ finished, int finished_bytes, const void* __restrict__ limit,
    int limit_bytes, const void* __restrict__ eos, int eos_bytes, int n_eos, int gamma, int ngram_min,
    int ngram_max, int pad_id, int* __restrict__ draft_tokens, long long out_pitch, int* __restrict__ draft_len,
    int limit_is_end) {
  __shared__ long long key_scratch[SS_WARPS];
  __shared__ int length_scratch[SS_WARPS];
  const int b = blockIdx.x;
  const long long* h = seq + b * seq_pitch;
  // Clamped rather than checked: the host does not read seq_len back (propose_ngram() raises).
  const long long n = min(max(load_int(seq_len, seq_len_bytes, b), 0ll), (long long)P);
  // Drafts the round may hold: at most gamma, and one fewer than the tokens the request may still
  // emit (the round's own target token is the last). Every branch below is uniform in the block.
  // limit_is_end: limit[b] is the length at which the budget ends (the device loop's state), not the
  // tokens left.
  const long long left = load_int(limit, limit_bytes, b) - (limit_is_end ? n : 0);
  long long room = min((long long)gamma, max(left - 1, 0ll));
  if (load_int(finished, finished_bytes, b) != 0) room = 0;
  int length = 0;
  long long start = 0;
  if (room > 0) {
    const long long key = best_match(h, n, ngram_min, ngram_max, key_scratch);
    if (key >= 0) {
      start = (key & 0xffffffffll) + 1;
      length = cut_at_eos(h, start, (int)min(room, n - start), eos, eos_bytes, n_eos, length_scratch);
    }
  }
  int* out = draft_tokens + b * out_pitch;
  for (int t = threadIdx.x; t < gamma; t += blockDim.x) out[t] = t < length ? (int)h[start + t] : pad_id;
  if (threadIdx.x == 0) draft_len[b] = length;
}
