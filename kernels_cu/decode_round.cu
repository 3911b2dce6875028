// The bookkeeping of a speculative decoding round on the device (specsample_cupy/decode/device_loop.py),
// so that the host can enqueue a whole round without reading anything back first. Between two model
// runs exactly one of these kernels runs; it also writes the next run's feeds (input_ids,
// position_ids, attention_mask, the buffers ONNX Runtime's captured graphs read).
//
// Layouts (int64 unless said): a run of S new columns over a cache of capacity C reads one feed
// buffer [ids B*S | positions B*S | mask B*(C+S)]. Each cache has a slot mask [B, C] (1 = slot holds
// a real token), the device twin of KVCache.mask: a run's new columns are appended at column L (a
// host-known count), a rollback turns the real slots past a row's keep-th into holes. seq [B, P]
// holds each row's tokens, seq_len [B] their count, limit [B] the count at which its budget ends.
//
// Target-only decoding is gamma = 0 of the same loop: a target run of S = 1, then target_step_done.
//
// dense (a launch argument): every new column is real, so that a row's cache is its token count and
// nothing else, as a model whose attention reads counts needs (GroupQueryAttention over a shared
// buffer: a run writes its S columns at the row's count, without a mask; a pad column would shift
// them, before the buffer's start at a count under S). Columns past a row's draft length, and a
// finished row's, are then real too (causal attention shows them only to later such columns, the
// rollback drops them, and a finished row's output is not read), and the first draft run of a round
// re-feeds the token before the newest instead of a pad, its slot rolled back first (the same key and
// value again; a one-token prompt's draft sees that token twice). The device loop sets it for batch 1,
// the only batch such models run at (sessions_static).
//
// Parallel decomposition of the round kernels: request rows own blocks (mask, feeds: one block scans a
// row of C slots in chunks of the block's width); the two sampling kernels give each row K blocks,
// one vocabulary slice each, whose last to finish decides the row (sample_row.cuh's
// sample_row_sliced: a counter per row, K from round_buffers); the blocks after those copy the run's
// new key/value columns from ONNX Runtime's present output into the cache (a grid-stride loop over
// rows x 4-byte words).
#include "sample_row.cuh"


struct Commit {  // copy `words` 4-byte words per row: present[r][src + w] -> cache[r][dst + w]
  const unsigned* present;
  unsigned* cache;
  int rows, words;
  long long present_pitch, cache_pitch, src, dst;
};

__device__ __forceinline__ void commit_columns(const Commit& c, int block, int blocks) {
  const long long total = (long long)c.rows * c.words;
  for (long long k = (long long)block * blockDim.x + threadIdx.x; k < total; k += (long long)blocks * blockDim.x) {
    const long long r = k / c.words, w = k - r * c.words;
    c.cache[r * c.cache_pitch + c.dst + w] = c.present[r * c.present_pitch + c.src + w];
  }
}

__device__ __forceinline__ long long clamp_id(int t, int vocab) { return t < 0 ? 0 : (t < vocab ? t : vocab - 1); }
__device__ __forceinline__ long long clamp_pos(long long p, long long limit) { return p < 0 ? 0 : (p < limit ? p : limit); }

// A row's sampling settings: the launch's temperature and Philox stream (seed, offset, request word
// b), or with per-request arrays (continuous batching: requests join rows between rounds) the row's
// own: temps[b], and streams[b] = (seed, offset base) with request word 0, the numbers a one-request
// call with that seed draws at offset base + offset (mod 2^32, as the host's offsets).
struct RowDraw {
  float temperature;
  unsigned long long seed;
  unsigned offset, request;
};

__device__ __forceinline__ RowDraw row_draw(int b, float temperature, unsigned long long seed, unsigned offset,
                                            const float* __restrict__ temps, const long long* __restrict__ streams) {
  RowDraw d = {temps ? temps[b] : temperature, seed, offset, (unsigned)b};
  if (streams) {
    d.seed = (unsigned long long)streams[2 * b];
    d.offset = (unsigned)(streams[2 * b + 1] + (long long)offset);
    d.request = 0;
  }
  return d;
}

// Inclusive prefix sum of one int per thread over the block; *total gets the block's sum.
__device__ __forceinline__ int block_scan(int v, int* total) {
  __shared__ int warp_sums[SS_WARPS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  int before = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < SS_WARPS; ++w) {
    before += w < warp ? warp_sums[w] : 0;
    sum += warp_sums[w];
  }
  __syncthreads();
  *total = sum;
  return v + before;
}

// Both slot masks of one row rolled back in one scan (KVCache.rollback): the target's slots
// [at, at + n) first take added[0..n) (its run's new columns), then the target's mask keeps only its
// first `keep` real slots, the draft's its first `keep_d`. The draft's result is also written to draft_copy (the next draft feed's mask).
// Returns the draft row's real slots afterwards. Called by the whole block. The two counts travel
// packed in one int (16 bits each: a chunk adds at most blockDim.x to either).
__device__ __forceinline__ long long roll_back_rows(long long* mask_t, long long* mask_d, long long* draft_copy, int C,
                                                    long long keep, long long keep_d, int at, int n,
                                                    const long long* added) {
  long long seen_t = 0, seen_d = 0;
  for (int c0 = 0; c0 < C; c0 += blockDim.x) {
    const int c = c0 + threadIdx.x;
    int real_t = 0, real_d = 0;
    if (c < C) {
      real_t = ((c >= at && c < at + n) ? added[c - at] : mask_t[c]) != 0;
      real_d = mask_d[c] != 0;
    }
    int total;
    const int ranks = block_scan(real_t | (real_d << 16), &total);
    if (c < C) {
      const long long kept_d = real_d && seen_d + (ranks >> 16) <= keep_d;
      mask_t[c] = real_t && seen_t + (ranks & 0xffff) <= keep;
      mask_d[c] = kept_d;
      draft_copy[c] = kept_d;
    }
    seen_t += total & 0xffff;
    seen_d += total >> 16;
  }
  return seen_d < keep_d ? seen_d : keep_d;
}

// The target's feed for request b's round of G drafts (S = G + 1 columns), by the whole block: the
// row's last token then its drafts (except the one at `skip`, which the sampling block writes; -1:
// none), their positions, and the mask: the target cache's slots, then the new columns up to the
// row's draft length dl (none for a finished row).
__device__ __forceinline__ void write_target_feed(int b, int B, int G, int skip, const int* __restrict__ draft_tokens,
                                                  int V, const long long* __restrict__ mask_t, int C,
                                                  const long long* __restrict__ seq, int seq_pitch, long long L,
                                                  int dl, bool live, int dense, long long pos_limit,
                                                  long long* __restrict__ feed) {
  const int S = G + 1;
  long long* mask = feed + 2LL * B * S + (long long)b * (C + S);
  for (int c = threadIdx.x; c < C; c += blockDim.x) mask[c] = mask_t[(long long)b * C + c];
  for (int j = threadIdx.x; j < S; j += blockDim.x) {
    if (j == 0) feed[b * S] = seq[(long long)b * seq_pitch + (L > 0 ? L - 1 : 0)];
    else if (j - 1 != skip) feed[b * S + j] = clamp_id(draft_tokens[b * G + j - 1], V);
    feed[(long long)B * S + b * S + j] = clamp_pos(L - 1 + j, pos_limit);
    mask[C + j] = dense || (j <= dl && live);
  }
}

// After draft run `step` of G: sample its token, keep its logits for verify(), commit its key/value
// columns and mask, and write the next run's feeds (the next draft run's, S = 1, or after the last
// step the target's, S = G + 1: the row's last token, then its G drafts).
// Blocks 0..B*K-1 sample (K slices a row; the only part that needs the token), the next B do each
// row's mask and feed work meanwhile, the rest copy key/value columns. warp_record: null, or
// [B, SS_RECORD] from warp_rows.cu over the rows sampled (top-k / top-p / min-p: the draft samples the
// truncated draft).
template <class T, int VEC>
__global__ void __launch_bounds__(SS_THREADS) draft_step_done(
    const typename T::storage* __restrict__ logits, int S_run, int V, float temperature,
    unsigned long long seed, unsigned offset, const float* __restrict__ temps, const long long* __restrict__ streams,
    typename T::storage* __restrict__ draft_logits,
    int* __restrict__ draft_tokens, int step, int G, const long long* __restrict__ run_feed,
    long long* __restrict__ mask_d, int C, int L_run, long long* __restrict__ next_feed, int next_is_target,
    const long long* __restrict__ mask_t, const long long* __restrict__ seq, int seq_pitch,
    const long long* __restrict__ seq_len, const long long* __restrict__ finished, const int* __restrict__ draft_len,
    long long pos_limit, const float* __restrict__ warp_record, int dense, int B, RowSlices slices, Commit commit) {
  const int S = next_is_target ? G + 1 : 1;  // the next run's columns
  const int samplers = B * slices.K;
  if ((int)blockIdx.x >= samplers + B) {
    commit_columns(commit, blockIdx.x - samplers - B, gridDim.x - samplers - B);
    return;
  }
  if ((int)blockIdx.x < samplers) {
    const int b = blockIdx.x / slices.K, k = blockIdx.x - b * slices.K;
    const RowDraw d = row_draw(b, temperature, seed, offset, temps, streams);
    const int token = sample_row_sliced<T, VEC>(slices, b, k, logits + ((long long)b * S_run + S_run - 1) * V, V,
                                                d.temperature, d.seed, d.offset, SS_PURPOSE_SAMPLE, d.request,
                                                draft_logits + ((long long)b * G + step) * V,
                                                warp_record ? warp_record + (long long)b * SS_RECORD : nullptr);
    if (token != SS_NOT_LAST && threadIdx.x == 0) {
      draft_tokens[b * G + step] = token;
      next_feed[next_is_target ? b * S + step + 1 : b] = clamp_id(token, V);
    }
    return;
  }
  const int b = blockIdx.x - samplers;
  const long long* added = run_feed + 2LL * B * S_run + (long long)b * (C + S_run) + C;
  long long* row_mask = mask_d + (long long)b * C;
  long long* next_mask = next_feed + 2LL * B * S + (long long)b * (C + S);
  const long long L = seq_len[b];
  const int dl = draft_len[b];
  if (!next_is_target) {  // the next draft run feeds this token at position L + step
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      long long v = row_mask[c];
      if (c >= L_run && c < L_run + S_run) row_mask[c] = v = added[c - L_run];
      next_mask[c] = v;
    }
    if (threadIdx.x == 0) {
      next_feed[B + b] = clamp_pos(L + step, pos_limit);
      next_mask[C] = dense || step + 1 < dl;
    }
    return;
  }
  if ((int)threadIdx.x < S_run) row_mask[L_run + threadIdx.x] = added[threadIdx.x];
  write_target_feed(b, B, G, step, draft_tokens, V, mask_t, C, seq, seq_pitch, L, dl, !finished[b], dense,
                    pos_limit, next_feed);
}

// Prompt-lookup rounds (no draft model): after ngram_propose (kernels_cu/ngram.cu) has written the
// round's drafts [B, G] and draft lengths from the sequences, write the target's S = G + 1 feed.
// One block per request.
__global__ void __launch_bounds__(SS_THREADS) ngram_target_feed(
    const int* __restrict__ draft_tokens, const int* __restrict__ draft_len, int G, int V,
    const long long* __restrict__ mask_t, int C, const long long* __restrict__ seq, int seq_pitch,
    const long long* __restrict__ seq_len, const long long* __restrict__ finished, long long pos_limit,
    long long* __restrict__ feed, int dense, int B) {
  const int b = blockIdx.x;
  write_target_feed(b, B, G, -1, draft_tokens, V, mask_t, C, seq, seq_pitch, seq_len[b], draft_len[b],
                    !finished[b], dense, pos_limit, feed);
}

// After verify(): append each request's emitted tokens (up to its first EOS and its budget), commit
// the target run's key/value columns and mask, roll both caches back to the new length minus one,
// set the next round's draft lengths, write the next round's first draft feed (S = 2: the tokens the
// draft has not seen, right-aligned, 1 or 2 of them) and the host's report.
//   verify_out [accepted B | emitted B | error B | tokens B*(G+1)] (VerifyResult.packed)
//   report     verify_out, then [taken B | finished B | draft_len B] (this round's draft lengths)
// With target_cols = 0 and every emitted count 0 it only prepares the first round.
// verify_lp / lp_out: null, or verify()'s log-probabilities [B, G + 1] and where they go beside the
// report (page-locked host memory), copied by the same threads that read the tokens.
// Blocks 0..B-1: one request row each (its G + 1 tokens are read and checked against the EOS ids by
// as many threads at once); blocks B..: key/value column copies. G + 1 <= blockDim.x.
// (Min. 1 block per SM: otherwise ptxas squeezes it into 32 registers and spills; it runs B blocks.)
__global__ void __launch_bounds__(SS_THREADS, 1) round_done(
    const int* __restrict__ verify_out, int G, const long long* __restrict__ target_feed, int target_cols,
    long long* __restrict__ mask_t, long long* __restrict__ mask_d, int C, int L_target,
    long long* __restrict__ seq, int seq_pitch, long long* __restrict__ seq_len, const long long* __restrict__ limit,
    long long* __restrict__ finished, const long long* __restrict__ eos, int n_eos, long long pad_id,
    int* __restrict__ draft_len, int gamma_next, long long* __restrict__ feed0, long long pos_limit,
    int* __restrict__ report, const float* __restrict__ verify_lp, float* __restrict__ lp_out, int dense, int B,
    Commit commit) {
  if ((int)blockIdx.x >= B) {
    commit_columns(commit, blockIdx.x - B, gridDim.x - B);
    return;
  }
  __shared__ int s_token[SS_THREADS], s_stop[SS_THREADS];
  __shared__ int s_taken, s_done;
  const int b = blockIdx.x, j = threadIdx.x;
  const int* tokens = verify_out + 3 * B + b * (G + 1);
  const long long L0 = seq_len[b], room = limit[b] - L0;
  const int error = verify_out[2 * B + b], emitted = verify_out[B + b];
  const bool was_done = finished[b] != 0;
  if (j <= G) {
    const int t = tokens[j];
    bool is_eos = false;
    for (int e = 0; e < n_eos; ++e) is_eos |= eos[e] == t;
    s_token[j] = t;
    s_stop[j] = is_eos;
    report[3 * B + b * (G + 1) + j] = t;
    if (lp_out) lp_out[b * (G + 1) + j] = verify_lp[b * (G + 1) + j];
  }
  __syncthreads();
  if (j == 0) {
    int taken = 0;
    bool hit_eos = false;
    if (!was_done) {
      const int n = error ? 0 : emitted;
      while (taken < n && taken < room && !hit_eos) hit_eos = s_stop[taken++];
    }
    const int done = was_done || hit_eos || room - taken <= 0;
    s_taken = taken;
    s_done = done;
    seq_len[b] = L0 + taken;
    finished[b] = done;
    report[b] = verify_out[b];
    report[B + b] = emitted;
    report[2 * B + b] = error;
    report[3 * B + B * (G + 1) + b] = taken;
    report[4 * B + B * (G + 1) + b] = done;
    report[5 * B + B * (G + 1) + b] = draft_len[b];  // this round's drafts (prompt lookup: data-dependent)
  }
  __syncthreads();
  const int taken = s_taken, done = s_done;
  if (j < taken) seq[(long long)b * seq_pitch + L0 + j] = s_token[j];
  const long long L = L0 + taken;
  const int S_t = G + 1;
  long long* next_mask = feed0 + 4LL * B + (long long)b * (C + 2);
  // dense: the draft keeps one token fewer, which its first run re-feeds (no pad column).
  const long long keep_d = dense && L >= 2 ? L - 2 : L - 1;
  const long long seen = roll_back_rows(mask_t + (long long)b * C, mask_d + (long long)b * C, next_mask, C, L - 1,
                                        keep_d, L_target, target_cols,
                                        target_feed + 2LL * B * S_t + (long long)b * (C + S_t) + C);
  const long long room_next = limit[b] - L - 1;
  const int dl = done ? 0 : (int)(room_next < gamma_next ? room_next : gamma_next);
  if (j == 0) draft_len[b] = dl;
  if (j < 2) {  // the seq writes above are this block's own; block_scan's barriers ordered them
    const long long src = L - 2 + j;
    const bool real = dense || (dl > 0 && src >= seen);
    feed0[b * 2 + j] = real ? seq[(long long)b * seq_pitch + (src > 0 ? src : 0)] : pad_id;
    feed0[2 * B + b * 2 + j] = clamp_pos(src, pos_limit);
    next_mask[C + j] = real;
  }
}

// After a target step (gamma = 0: the target's S = 1 run over its S = 1 feed): sample each unfinished
// request's token (sample_tokens' Philox stream, so the host loop's tokens), append it (EOS, budget),
// commit the run's key/value column and mask, write the next step's feed in place (the same buffer:
// ids [B] | positions [B] | mask [B, C + 1]) and the host's report in round_done's layout with G = 0:
//   report [accepted B | emitted B | error B | tokens B | taken B | finished B]
// A row whose logits hold NaN/+Inf or no finite value takes nothing and reports its error code.
// Nothing to roll back: the cache holds every token but the newest, as a step leaves it.
// Blocks 0..B*K-1: K per request row (each samples a slice; the row's last to finish decides and
// writes, in thread 0; a finished row's first block alone); the rest: key/value column copies.
// warp_record: as draft_step_done's. lp_out: null, or where the token's log-probability goes
// (page-locked host memory, [B]): (z - M) / T - log E from the row's warp record (needed then; greedy
// rows: at temperature 1), -inf for a row that takes nothing.
// (Min. 1 block per SM, as round_done: otherwise ptxas holds it to 80 registers and spills.)
template <class T, int VEC>
__global__ void __launch_bounds__(SS_THREADS, 1) target_step_done(
    const typename T::storage* __restrict__ logits, int V, float temperature, unsigned long long seed,
    unsigned offset, const float* __restrict__ temps, const long long* __restrict__ streams, long long* __restrict__ feed, long long* __restrict__ mask_t, int C, int L_run,
    long long* __restrict__ seq, int seq_pitch, long long* __restrict__ seq_len, const long long* __restrict__ limit,
    long long* __restrict__ finished, const long long* __restrict__ eos, int n_eos, long long pad_id,
    long long pos_limit, int* __restrict__ report, const float* __restrict__ warp_record, float* __restrict__ lp_out,
    int dense, int B, RowSlices slices, Commit commit) {
  const int samplers = B * slices.K;
  if ((int)blockIdx.x >= samplers) {
    commit_columns(commit, blockIdx.x - samplers, gridDim.x - samplers);
    return;
  }
  const int b = blockIdx.x / slices.K, k = blockIdx.x - b * slices.K;
  // The same in every block of the row (this kernel writes finished[b] only after all of them have
  // arrived), so the branch is uniform and a finished row's counter is untouched.
  const bool was_done = finished[b] != 0;
  if (was_done && k != 0) return;
  const RowDraw d = row_draw(b, temperature, seed, offset, temps, streams);
  const int token = was_done ? -1 : sample_row_sliced<T, VEC>(slices, b, k, logits + (long long)b * V, V,
                                                              d.temperature, d.seed, d.offset, SS_PURPOSE_SAMPLE,
                                                              d.request, nullptr,
                                                              warp_record ? warp_record + (long long)b * SS_RECORD
                                                                          : nullptr);
  if (token == SS_NOT_LAST || threadIdx.x != 0) return;
  const long long L0 = seq_len[b];
  const int error = was_done ? 0 : (token == -1 ? SS_ERR_TARGET : (token < 0 ? SS_ERR_NO_MASS : 0));
  bool is_eos = false;
  for (int e = 0; e < n_eos; ++e) is_eos |= eos[e] == token;
  const int taken = !was_done && !error && limit[b] - L0 > 0;
  const int done = was_done || error || (taken && is_eos) || limit[b] - L0 - taken <= 0;
  if (taken) seq[(long long)b * seq_pitch + L0] = token;
  const long long L = L0 + taken;
  seq_len[b] = L;
  finished[b] = done;
  long long* feed_mask = feed + 2LL * B + (long long)b * (C + 1);
  const long long added = feed_mask[C];  // the run's new column: real for rows that were live
  mask_t[(long long)b * C + L_run] = added;
  feed_mask[L_run] = added;
  feed_mask[C] = dense || !done;
  feed[b] = done ? pad_id : token;
  feed[B + b] = clamp_pos(L - 1, pos_limit);
  report[b] = 0;
  report[B + b] = !was_done && !error;
  report[2 * B + b] = error;
  report[3 * B + b] = was_done ? -1 : token;
  report[4 * B + b] = taken;
  report[5 * B + b] = done;
  if (lp_out) {
    const float* rec = warp_record + (long long)b * SS_RECORD;
    const float inv_t = d.temperature == 0.f ? 1.f : 1.f / d.temperature;
    lp_out[b] = taken ? (decode<T>(logits[(long long)b * V + token]) - rec[SS_REC_MAX]) * inv_t - logf(rec[SS_REC_S])
                      : -__int_as_float(0x7f800000);
  }
}

// A full cache's compaction plan, without the host: row b's real slots among its first `length`, in
// order, go to [new_length - n_b, new_length) (right-aligned like left padding; new_length >= every
// n_b, from the host's sequence lengths). cols [B, new_length] gets each new slot's source column (0
// for the holes in front), and the mask becomes the compacted one. One block per row; the gather
// itself is a CuPy copy (StaticKVCache.gather).
__global__ void __launch_bounds__(SS_THREADS) compact_plan(long long* __restrict__ mask, int C, int length,
                                                          int new_length, long long* __restrict__ cols) {
  const int b = blockIdx.x;
  long long* row = mask + (long long)b * C;
  long long* out = cols + (long long)b * new_length;
  int n = 0;
  for (int c0 = 0; c0 < length; c0 += blockDim.x) {  // count, so that ranks can be right-aligned
    const int c = c0 + threadIdx.x;
    int total;
    block_scan(c < length && row[c] != 0, &total);
    n += total;
  }
  const int first = new_length - n;
  for (int j = threadIdx.x; j < first; j += blockDim.x) out[j] = 0;
  int seen = 0;
  for (int c0 = 0; c0 < length; c0 += blockDim.x) {
    const int c = c0 + threadIdx.x;
    const int real = c < length && row[c] != 0;
    int total;
    const int rank = seen + block_scan(real, &total) - 1;
    if (real) out[first + rank] = c;
    seen += total;
  }
  __syncthreads();  // every read of the old mask is done
  for (int c = threadIdx.x; c < C; c += blockDim.x) row[c] = c >= first && c < new_length;
}

// verify()'s per-request streams for one round: out[b] = (seed, offset base + offset) from
// base[b] = (seed, offset base) (row_draw()'s), so that the host uploads nothing per round.
// One thread per request.
__global__ void offset_streams(const long long* __restrict__ base, long long offset, long long* __restrict__ out,
                               int B) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  out[2 * b] = base[2 * b];
  out[2 * b + 1] = base[2 * b + 1] + offset;
}

// Continuous batching: the device state of n rows that take new requests (DeviceRounds.refill()), from
// one upload `packed` (int64): rows [n] | seq [n, P] | seq_len [n] | limit [n] | seed [n] | offset base
// [n] (the row's new request's Philox stream) | temperature [n] (float64 bits). state is the loop's
// state buffer (seq [B, P] | seq_len [B] | limit [B] | finished [B] | eos [E] | mask_t [B, C] | mask_d
// [B, C]); each row's slot masks are cleared (its prompt is prefilled next). streams ([B, 2], or null)
// and temps ([B] float32, or null) are the rows' own stream bases and temperatures. One kernel in place
// of a scatter per array. One block per refilled row; its threads stride over the row's P sequence
// columns and each mask's C slots. Nothing is shared between blocks (the rows are distinct).
__global__ void __launch_bounds__(SS_THREADS) refill_rows(const long long* __restrict__ packed, int n,
                                                         long long* __restrict__ state, int B, int P, int C, int E,
                                                         long long* __restrict__ streams, float* __restrict__ temps) {
  const int k = blockIdx.x;
  const long long b = packed[k];
  const long long* seq = packed + n;
  const long long* tail = seq + (long long)n * P;   // seq_len | limit | seed | base | temperature, n each
  long long* row = state + b * P;
  for (int j = threadIdx.x; j < P; j += blockDim.x) row[j] = seq[(long long)k * P + j];
  long long* mask_t = state + (long long)B * P + 3LL * B + E;
  long long* mask_d = mask_t + (long long)B * C;
  for (int j = threadIdx.x; j < C; j += blockDim.x) {
    mask_t[b * C + j] = 0;
    mask_d[b * C + j] = 0;
  }
  if (threadIdx.x == 0) {
    long long* seq_len = state + (long long)B * P;
    seq_len[b] = tail[k];
    seq_len[B + b] = tail[n + k];      // limit
    seq_len[2 * B + b] = 0;            // finished
    if (streams) {
      streams[2 * b] = tail[2 * n + k];
      streams[2 * b + 1] = tail[3 * n + k];
    }
    if (temps) temps[b] = (float)__longlong_as_double(tail[4 * n + k]);
  }
}

// The instantiations decode/device_loop.py launches (named here too so that an offline nvcc compiles them).
#define SS_DRAFT_STEP_DONE(T, VEC)                                                                              \
  template __global__ void draft_step_done<T, VEC>(                                                             \
      const T::storage*, int, int, float, unsigned long long, unsigned, const float*, const long long*,         \
      T::storage*, int*, int, int,                                                                              \
      const long long*, long long*, int, int, long long*, int, const long long*, const long long*, int,         \
      const long long*, const long long*, const int*, long long, const float*, int, int, RowSlices, Commit);
SS_DRAFT_STEP_DONE(f32, 4)
SS_DRAFT_STEP_DONE(f32, 1)
SS_DRAFT_STEP_DONE(f16, 8)
SS_DRAFT_STEP_DONE(f16, 1)

#define SS_TARGET_STEP_DONE(T, VEC)                                                                             \
  template __global__ void target_step_done<T, VEC>(                                                            \
      const T::storage*, int, float, unsigned long long, unsigned, const float*, const long long*, long long*,  \
      long long*, int, int, long long*,                                                                         \
      int, long long*, const long long*, long long*, const long long*, int, long long, long long, int*, const float*, \
      float*, int, int, RowSlices, Commit);
SS_TARGET_STEP_DONE(f32, 4)
SS_TARGET_STEP_DONE(f32, 1)
SS_TARGET_STEP_DONE(f16, 8)
SS_TARGET_STEP_DONE(f16, 1)
