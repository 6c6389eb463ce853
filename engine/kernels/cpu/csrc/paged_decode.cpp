// Paged decode attention on the CPU, reading the KV cache in place.
//
// The work is a list of segments: a segment is a set of query rows (one token each) that attend to the
// same tokens of the paged cache, given as a run of block ids and a token count (the segment starts on
// its first block's first slot). Plain decode is one segment per row over its whole context; cascade
// adds one segment per shared prefix, its members' queries stacked so that every K/V token is read once
// for all of them, and gives each row a segment of its own for the rest of its context.
//
// Two operators over the same work: paged_attention gives every (segment, member) pair its own normalised
// output and the log-sum-exp of its scaled scores per query head (partial results, for tests and the
// calibration); paged_decode gives every query row the exact softmax over all the tokens of all its
// segments: the partial results of a row (its shared prefixes', its own part's, and the context splits of
// each) are merged by log-sum-exp inside the call, so a cascade step is one call per layer like a plain one.
// decode_layer is a decode-only step's whole layer in one call: the new K/V written into the layer's pages
// (write_kv, also an operator of its own), then paged_decode.
//
// Work items are (segment, KV heads, context split), spread over torch's thread count with OpenMP. An
// item streams its tokens in tiles of 16 with an online softmax in fp32, asking for the lines of the tokens
// it reads next into L2 (Scout). Two tile routines: bf16 K/V on CPUs with AVX512-BF16 (head_dim 64 or 128)
// score a block of stacked queries at once with bf16 dot products on the transposed tile (run_item_bf16; for
// paged_prefill's compute-bound work the probabilities are rounded to bf16 too, two tokens per instruction);
// everything else widens the tile to fp32 in a small buffer (fp32 read in place) and scores one query at a
// time with AVX2 (run_item). An output with a single partial result gets it written directly; the
// others are merged in a second pass, in a fixed order (segment order, then split order). Splits have a
// fixed length, so a row's result never depends on what else is in the batch or on the thread count.
//
// Layouts (as the runner allocates them): q [rows, heads, head_dim] (last dim contiguous, any row and
// head strides), k_cache / v_cache [blocks, block_size, kv_heads, head_dim] (last dim contiguous).

// The lighter ATen headers, not ATen/ATen.h (which declares every operator): 18 s instead of 25 s to compile.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "simd.h"
#include "simd512.h"

namespace kvloop {
namespace {

// Tokens per tile: the tile's K and V (all of an item's heads, widened to fp32) stay in L1/L2 while every
// query of the item uses them.
constexpr int64_t kTile = 16;
// Work is counted in (token, KV head, member) triples: a stacked segment's token is read once but scored for
// every member, and the scoring, not the reading, is most of an item's time once the K/V sit in cache.
constexpr int64_t kMinWorkPerThread = 2048;  // about 50 us of work: below that, one thread
// Rows of a causal segment per item (paged_prefill): 64 rows of 3-query groups are 32 register blocks a tile.
constexpr int64_t kCausalRows = 64;

struct Item {
  int64_t seg, h0, h1, t0, t1;  // KV heads [h0, h1) over tokens [t0, t1) of the segment
  int64_t ws;                   // workspace offset of its partial results (-1: every member writes its output)
  int64_t seg_tokens, seg_rows;  // the segment's token and member counts
  int64_t j0, j1;                // its members [j0, j1) (all of them but in a causal segment's items)
};

// Where each (segment, member) pair's partial result goes: an output of its own (paged_attention) or its
// query row's (paged_decode), and how many partial results each output merges (1: written directly).
struct Dest {
  const int64_t* rows;
  const int64_t* parts;  // per output
  bool per_row;
  int64_t of(int64_t pair) const { return per_row ? rows[pair] : pair; }
};

// A partial result in the workspace: its item's offset and query count, and its member's first query.
struct Part {
  int64_t ws, m_count, m0;
};

struct Shape {
  bool causal;  // member j of a segment's m sees its first tokens - (m - 1 - j) tokens (paged_prefill)
  int64_t heads, kv_heads, group, d, block_size;
  int64_t q_row, q_head;               // q strides
  int64_t k_block, k_tok, k_head;      // k_cache strides
  int64_t v_block, v_tok, v_head;      // v_cache strides
};

// Per-thread buffers, sized for the largest stacked query set and head count of an item.
struct Scratch {
  std::vector<float> q, acc, top, sum, kbuf, vbuf, zeros, scores, probs;
  std::vector<uint32_t> qhi, qlo;  // the blocked bf16 path's queries as bf16 pairs (two halves)
  Scratch(int64_t m, int64_t heads, int64_t d)
      : q(m * d), acc(m * d), top(m), sum(m), kbuf(heads * kTile * d), vbuf(heads * kTile * d), zeros(d, 0.f),
        scores(kTile), probs(kTile), qhi((m * d + 1) / 2), qlo((m * d + 1) / 2) {}
};

void load_query(const at::Tensor& q, const Shape& sh, int64_t row, int64_t head, float scale, float* dst) {
  const int64_t off = row * sh.q_row + head * sh.q_head;
  switch (q.scalar_type()) {
    case at::kFloat: to_float(q.const_data_ptr<float>() + off, dst, sh.d); break;
    case at::kBFloat16: to_float(q.const_data_ptr<c10::BFloat16>() + off, dst, sh.d); break;
    default: to_float(q.const_data_ptr<c10::Half>() + off, dst, sh.d); break;
  }
  for (int64_t i = 0; i < sh.d; ++i) dst[i] *= scale;
}

// out = acc / sum, lse = top + log(sum); a segment without tokens gives zeros and -inf.
void finish(const float* acc, float top, float sum, int64_t d, float* out, float* lse) {
  if (sum == 0.f) {
    std::fill(out, out + d, 0.f);
    *lse = kNegInf;
    return;
  }
  const float inv = 1.f / sum;
  for (int64_t i = 0; i < d; ++i) out[i] = acc[i] * inv;
  *lse = top + std::log(sum);
}

// How many of the segment's tokens the item's member j (the segment's j0 + j) sees, and of those how many fall
// in the tile of n tokens from t0.
inline int64_t visible(const Shape& sh, const Item& it, int64_t j) {
  return sh.causal ? it.seg_tokens - (it.seg_rows - 1 - it.j0 - j) : it.seg_tokens;
}
inline int64_t live_in_tile(int64_t seen, int64_t t0, int64_t n) { return std::clamp<int64_t>(seen - t0, 0, n); }

// An item's queries, scaled, into sc.q (query m = (member j, KV head h0 + hl, query head gi of that KV head's
// group) = (j * nh + hl) * g + gi, so the queries of one member are its query heads h0 * g ... h1 * g - 1 in
// order), and its softmax state reset. Returns the query count.
int64_t begin_item(const Item& it, const at::Tensor& q, const Shape& sh, const int64_t* rows_ptr, const Dest& dst,
                   float scale, Scratch& sc) {
  const int64_t d = sh.d, g = sh.group, nh = it.h1 - it.h0;
  const int64_t p0 = rows_ptr[it.seg] + it.j0, m_count = (it.j1 - it.j0) * nh * g;
  for (int64_t m = 0; m < m_count; ++m)
    load_query(q, sh, dst.rows[p0 + m / (nh * g)], it.h0 * g + m % (nh * g), scale, sc.q.data() + m * d);
  std::fill(sc.acc.begin(), sc.acc.begin() + m_count * d, 0.f);
  std::fill(sc.top.begin(), sc.top.begin() + m_count, kNegInf);
  std::fill(sc.sum.begin(), sc.sum.begin() + m_count, 0.f);
  return m_count;
}

// An item's results: normalised into the outputs that have no other part, the rest into its workspace
// ([m_count * d acc][m_count top][m_count sum]) for merge_parts.
void end_item(const Item& it, int64_t m_count, const Shape& sh, const int64_t* rows_ptr, const Dest& dst,
              const Scratch& sc, float* out, float* lse, float* ws) {
  const int64_t d = sh.d, g = sh.group, nh = it.h1 - it.h0, p0 = rows_ptr[it.seg] + it.j0;
  float* w = it.ws < 0 ? nullptr : ws + it.ws;
  for (int64_t m = 0; m < m_count; ++m) {
    const int64_t dest = dst.of(p0 + m / (nh * g));
    if (dst.parts[dest] == 1) {
      const int64_t at = dest * sh.heads + it.h0 * g + m % (nh * g);  // (output, head)
      finish(sc.acc.data() + m * d, sc.top[m], sc.sum[m], d, out + at * d, lse + at);
      continue;
    }
    std::copy(sc.acc.begin() + m * d, sc.acc.begin() + (m + 1) * d, w + m * d);
    w[m_count * d + m] = sc.top[m];
    w[m_count * (d + 1) + m] = sc.sum[m];
  }
}

// An item's tokens, located tile by tile: each token's K / V at the item's first head, walking the segment's
// block table (not dividing per token).
template <typename KV>
struct TokenWalker {
  const int64_t* table;
  const KV *k, *v;
  const Shape& sh;
  int64_t h0, blk_index, slot;
  TokenWalker(const int64_t* table, const KV* k, const KV* v, const Shape& sh, const Item& it)
      : table(table), k(k), v(v), sh(sh), h0(it.h0), blk_index(it.t0 / sh.block_size), slot(it.t0 % sh.block_size) {}
  void locate(int64_t n, const KV** kt, const KV** vt) {
    for (int64_t t = 0; t < n; ++t, ++slot) {
      if (slot == sh.block_size) {
        slot = 0;
        ++blk_index;
      }
      const int64_t blk = table[blk_index];
      kt[t] = k + blk * sh.k_block + slot * sh.k_tok + h0 * sh.k_head;
      vt[t] = v + blk * sh.v_block + slot * sh.v_tok + h0 * sh.v_head;
    }
  }
};

// Asks for the K/V lines of an item's tokens kPrefetchAhead tokens before the item reads them, into L2 (not
// L1): prefetches into L1 stall once its few miss buffers are full, and the hardware prefetcher alone left
// the bf16 decode kernel waiting on memory most of the time (measured at 16 rows x 2,000 tokens: 1.7 ms per
// layer with L1 prefetches one tile ahead, 1.1 ms with these).
constexpr int64_t kPrefetchAhead = 32;

template <typename KV>
struct Scout {
  TokenWalker<KV> walker;
  int64_t at, end, kbytes, vbytes;
  Scout(const int64_t* table, const KV* k, const KV* v, const Shape& sh, const Item& it)
      : walker(table, k, v, sh, it), at(it.t0), end(it.t1),
        kbytes((it.h1 - it.h0) * sh.k_head * static_cast<int64_t>(sizeof(KV))),
        vbytes((it.h1 - it.h0) * sh.v_head * static_cast<int64_t>(sizeof(KV))) {
    ahead_of(it.t0);
  }
  // every token before t + kPrefetchAhead asked for
  void ahead_of(int64_t t) {
    const int64_t upto = std::min(t + kPrefetchAhead, end);
    const KV* kt[kTile];
    const KV* vt[kTile];
    while (at < upto) {
      const int64_t n = std::min(kTile, upto - at);
      walker.locate(n, kt, vt);
      for (int64_t i = 0; i < n; ++i) {
        prefetch_l2(kt[i], kbytes);
        prefetch_l2(vt[i], vbytes);
      }
      at += n;
    }
  }
};

// HD: head_dim as a compile-time constant (64, 128: every loop over it unrolls), or 0 for any other.
template <typename KV, int64_t HD>
void run_item(const Item& it, const at::Tensor& q, const KV* k, const KV* v, const Shape& sh, const int64_t* blocks,
              const int64_t* block_start, const int64_t* rows_ptr, const Dest& dst, float scale, float* out,
              float* lse, float* ws, Scratch& sc) {
  const int64_t d = HD ? HD : sh.d, g = sh.group, nh = it.h1 - it.h0;
  const int64_t members = it.j1 - it.j0;
  const int64_t m_count = begin_item(it, q, sh, rows_ptr, dst, scale, sc);
  TokenWalker<KV> walker(blocks + block_start[it.seg], k, v, sh, it);
  Scout<KV> scout(blocks + block_start[it.seg], k, v, sh, it);
  const KV* ktok[kTile];  // the tile's tokens' K / V at the item's first head
  const KV* vtok[kTile];
  const float* krow[kTile];
  const float* vrow[kTile];
  for (int64_t t0 = it.t0; t0 < it.t1; t0 += kTile) {
    const int64_t n = std::min(kTile, it.t1 - t0), n8 = (n + 7) / 8 * 8;
    walker.locate(n, ktok, vtok);
    // Widened (fp32: copied) token by token, all of the item's heads, in memory order: the reads stream
    // like one sequential scan (head by head they stride, and measured at about half the bandwidth).
    for (int64_t t = 0; t < n; ++t)
      for (int64_t hl = 0; hl < nh; ++hl) {
        to_float(ktok[t] + hl * sh.k_head, sc.kbuf.data() + (hl * kTile + t) * d, d);
        to_float(vtok[t] + hl * sh.v_head, sc.vbuf.data() + (hl * kTile + t) * d, d);
      }
    for (int64_t hl = 0; hl < nh; ++hl) {
      scout.ahead_of(t0 + kTile * (hl + 1) / nh);  // a share of the next tokens per head
      for (int64_t t = 0; t < n; ++t) {
        krow[t] = sc.kbuf.data() + (hl * kTile + t) * d;
        vrow[t] = sc.vbuf.data() + (hl * kTile + t) * d;
      }
      for (int64_t t = n; t < n8; ++t) krow[t] = sc.zeros.data();  // scored in groups of 8, then ignored
      for (int64_t j = 0; j < members; ++j) {
        const int64_t live = live_in_tile(visible(sh, it, j), t0, n), l8 = (live + 7) / 8 * 8;
        if (live == 0) continue;  // a causal member whose tokens end before this tile
        for (int64_t m = (j * nh + hl) * g; m < (j * nh + hl + 1) * g; ++m) {
          float* s = sc.scores.data();
          dots(sc.q.data() + m * d, krow, l8, d, s);
          const float prev = sc.top[m];
          const float top = std::max(prev, max_of(s, live));
          const float alpha = top == prev ? 1.f : std::exp(prev - top);  // prev = -inf: nothing to rescale
          const float tile_sum = exp_shifted(s, top, live, l8, sc.probs.data());
          sc.sum[m] = sc.sum[m] * alpha + tile_sum;
          sc.top[m] = top;
          scale_accumulate(sc.acc.data() + m * d, alpha, sc.probs.data(), vrow, live, d);
        }
      }
    }
  }

  end_item(it, m_count, sh, rows_ptr, dst, sc, out, lse, ws);
}

#ifdef KVLOOP_AVX512BF16
// The blocked path, for bf16 K/V where the CPU has AVX512-BF16. Per tile and KV head the tile's K is transposed
// once into 16-token columns of bf16 pairs; then each query's 16 scores take d / 2 dot-product instructions (bf16
// pairs, fp32 sums) and no horizontal sums, and each token's V is widened once for a block of queries whose
// accumulators stay in registers. Queries enter as two bf16 halves (hi + lo, lo skipped when zero, as for bf16
// queries with head_dim 64), so the scores match the fp32 path's to about 2^-16 relative.
constexpr int64_t kBlockQueries = 6;  // queries per register block at head_dim 64: 6 x 4 accumulators

template <int64_t HD>
struct Bf16Tile {
  static constexpr int64_t kWords = HD / 2;  // bf16 pairs per K row
  alignas(64) uint32_t kt[kWords][16];       // the tile's K, transposed: word w of token t at kt[w][t]
  alignas(64) float probs[kBlockQueries][16];
  // bf16 probabilities (paged_prefill): V as token pairs, (V[2i][16c + l], V[2i + 1][16c + l]) at vp[i][c][l],
  // and each query's probabilities as pairs of bf16
  alignas(64) uint32_t vp[8][HD / 16][16];
  alignas(64) uint32_t pw[kBlockQueries][8];
};

// The tile's V rows (n of them; a missing odd one reads as zeros) interleaved as token pairs into tile.vp.
template <int64_t HD>
inline void pair_values(Bf16Tile<HD>& tile, const c10::BFloat16* const* vrow, int64_t n) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                      37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t i = 0; 2 * i < n; ++i)
    for (int64_t h = 0; h < HD / 32; ++h) {
      const __m512i a = _mm512_loadu_si512(vrow[2 * i] + 32 * h);
      const __m512i b = 2 * i + 1 < n ? _mm512_loadu_si512(vrow[2 * i + 1] + 32 * h) : _mm512_setzero_si512();
      _mm512_store_si512(tile.vp[i][2 * h], _mm512_permutex2var_epi16(a, lo, b));
      _mm512_store_si512(tile.vp[i][2 * h + 1], _mm512_permutex2var_epi16(a, hi, b));
    }
}

// One block of NB queries (their indices in ms) against the tile held in `tile` (V rows vrow): query b sees the
// tile's first live[b] tokens, and the last query sees the most.
template <int64_t HD, int NB, bool BF16_PROBS>
inline __attribute__((always_inline)) void bf16_block(Bf16Tile<HD>& tile, const int64_t* ms, const int64_t* live,
                                                      const uint32_t* qhi, const uint32_t* qlo, bool any_lo,
                                                      const c10::BFloat16* const* vrow, Scratch& sc) {
  constexpr int64_t W = Bf16Tile<HD>::kWords, C = HD / 16;
  const int64_t n = live[NB - 1];
  if (n == 0) return;  // causal queries whose tokens all end before this tile
  // two accumulators per query (even and odd words): twice the independent chains to hide the dot's latency
  __m512 s[NB], s2[NB];
  for (int b = 0; b < NB; ++b) s[b] = s2[b] = _mm512_setzero_ps();
  for (int half = 0; half < (any_lo ? 2 : 1); ++half) {
    const uint32_t* qw = half == 0 ? qhi : qlo;
    for (int64_t w = 0; w < W; w += 2) {
      const __m512bh k0 = (__m512bh)_mm512_load_si512(tile.kt[w]);
      const __m512bh k1 = (__m512bh)_mm512_load_si512(tile.kt[w + 1]);
      for (int b = 0; b < NB; ++b) {
        const uint32_t* qb = qw + ms[b] * W + w;
        s[b] = _mm512_dpbf16_ps(s[b], k0, (__m512bh)_mm512_set1_epi32(static_cast<int>(qb[0])));
        s2[b] = _mm512_dpbf16_ps(s2[b], k1, (__m512bh)_mm512_set1_epi32(static_cast<int>(qb[1])));
      }
    }
  }
  for (int b = 0; b < NB; ++b) s[b] = _mm512_add_ps(s[b], s2[b]);
  __m512 alpha[NB];
  for (int b = 0; b < NB; ++b) {  // the online softmax, 16 scores at a time
    const int64_t m = ms[b];
    if (live[b] == 0) {  // nothing of this tile for this query: its state stays
      _mm512_store_ps(tile.probs[b], _mm512_setzero_ps());
      alpha[b] = _mm512_set1_ps(1.f);
      continue;
    }
    const __mmask16 seen = static_cast<__mmask16>((1u << live[b]) - 1);
    const float prev = sc.top[m];
    const float top = std::max(prev, _mm512_mask_reduce_max_ps(seen, s[b]));
    const float a = top == prev ? 1.f : std::exp(prev - top);  // prev = -inf: nothing to rescale
    const __m512 p = _mm512_maskz_mov_ps(seen, exp512_nonpositive(_mm512_sub_ps(s[b], _mm512_set1_ps(top))));
    _mm512_store_ps(tile.probs[b], p);
    sc.sum[m] = sc.sum[m] * a + _mm512_reduce_add_ps(p);
    sc.top[m] = top;
    alpha[b] = _mm512_set1_ps(a);
  }
  __m512 acc[NB][C];
  for (int b = 0; b < NB; ++b)
    for (int64_t c = 0; c < C; ++c) acc[b][c] = _mm512_mul_ps(_mm512_loadu_ps(sc.acc.data() + ms[b] * HD + 16 * c), alpha[b]);
  if constexpr (BF16_PROBS) {  // two tokens per instruction: V pairs against each query's probability pairs
    for (int b = 0; b < NB; ++b)
      _mm256_store_si256(reinterpret_cast<__m256i*>(tile.pw[b]),
                         (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(tile.probs[b])));
    for (int64_t i = 0; 2 * i < n; ++i)
      for (int64_t c = 0; c < C; ++c) {
        const __m512bh vw = (__m512bh)_mm512_load_si512(tile.vp[i][c]);
        for (int b = 0; b < NB; ++b)
          acc[b][c] = _mm512_dpbf16_ps(acc[b][c], vw, (__m512bh)_mm512_set1_epi32(static_cast<int>(tile.pw[b][i])));
      }
  } else {
    for (int64_t t = 0; t < n; ++t) {
      __m512 vv[C];
      for (int64_t c = 0; c < C; ++c) vv[c] = widen_bf16(vrow[t] + 16 * c);
      for (int b = 0; b < NB; ++b) {
        const __m512 p = _mm512_set1_ps(tile.probs[b][t]);
        for (int64_t c = 0; c < C; ++c) acc[b][c] = _mm512_fmadd_ps(p, vv[c], acc[b][c]);
      }
    }
  }
  for (int b = 0; b < NB; ++b)
    for (int64_t c = 0; c < C; ++c) _mm512_storeu_ps(sc.acc.data() + ms[b] * HD + 16 * c, acc[b][c]);
}

// BF16_PROBS (paged_prefill, compute-bound: many stacked queries per tile): probabilities rounded to bf16 for
// the value product, as SDPA's bf16 path rounds them, two tokens per instruction; decode keeps them in fp32.
template <int64_t HD, bool BF16_PROBS>
void run_item_bf16(const Item& it, const at::Tensor& q, const c10::BFloat16* k, const c10::BFloat16* v,
                   const Shape& sh, const int64_t* blocks, const int64_t* block_start, const int64_t* rows_ptr,
                   const Dest& dst, float scale, float* out, float* lse, float* ws, Scratch& sc) {
  using KV = c10::BFloat16;
  constexpr int64_t W = Bf16Tile<HD>::kWords;
  // at head_dim 128 a block of 6 needs 48 accumulators: blocks of 3 there
  constexpr int64_t QB = HD == 64 ? kBlockQueries : kBlockQueries / 2;
  const int64_t g = sh.group, nh = it.h1 - it.h0;
  const int64_t members = it.j1 - it.j0;
  const int64_t m_count = begin_item(it, q, sh, rows_ptr, dst, scale, sc);
  // the scaled queries as bf16 pairs, hi + lo
  uint32_t* qhi = sc.qhi.data();
  uint32_t* qlo = sc.qlo.data();
  bool any_lo = false;
  for (int64_t i = 0; i < m_count * HD; ++i) {
    const float x = sc.q[i];
    const c10::BFloat16 hi(x);
    const c10::BFloat16 lo(x - static_cast<float>(hi));
    reinterpret_cast<uint16_t*>(qhi)[i] = hi.x;
    reinterpret_cast<uint16_t*>(qlo)[i] = lo.x;
    any_lo |= (lo.x & 0x7fff) != 0;
  }
  TokenWalker<KV> walker(blocks + block_start[it.seg], k, v, sh, it);
  Scout<KV> scout(blocks + block_start[it.seg], k, v, sh, it);
  Bf16Tile<HD> tile;
  const KV* ktok[kTile];
  const KV* vtok[kTile];
  const KV* vrow[kTile];
  std::vector<int64_t> ms(members * g), live(members * g);  // a head's queries, and what each sees of a tile
  for (int64_t t0 = it.t0; t0 < it.t1; t0 += kTile) {
    const int64_t n = std::min(kTile, it.t1 - t0);
    walker.locate(n, ktok, vtok);
    for (int64_t hl = 0; hl < nh; ++hl) {
      for (int64_t blk = 0; blk < W / 16; ++blk) {
        __m512i r[16];
        for (int64_t t = 0; t < 16; ++t)
          r[t] = t < n ? _mm512_loadu_si512(reinterpret_cast<const uint32_t*>(ktok[t] + hl * sh.k_head) + 16 * blk)
                       : _mm512_setzero_si512();
        transpose16x16(r);
        for (int64_t j = 0; j < 16; ++j) _mm512_store_si512(tile.kt[16 * blk + j], r[j]);
      }
      for (int64_t t = 0; t < n; ++t) vrow[t] = vtok[t] + hl * sh.v_head;
      if constexpr (BF16_PROBS) pair_values(tile, vrow, n);
      scout.ahead_of(t0 + kTile * (hl + 1) / nh);
      int64_t count = 0;  // this head's queries: g per member
      for (int64_t j = 0; j < members; ++j)
        for (int64_t gi = 0; gi < g; ++gi) ms[count++] = (j * nh + hl) * g + gi;
      for (int64_t j = 0; j < members; ++j) {
        const int64_t seen = live_in_tile(visible(sh, it, j), t0, n);
        for (int64_t gi = 0; gi < g; ++gi) live[j * g + gi] = seen;
      }
      for (int64_t b0 = 0; b0 < count; b0 += QB) {
        const int64_t *bm = ms.data() + b0, *bl = live.data() + b0;
        switch (std::min(QB, count - b0)) {
          case 1: bf16_block<HD, 1, BF16_PROBS>(tile, bm, bl, qhi, qlo, any_lo, vrow, sc); break;
          case 2: bf16_block<HD, 2, BF16_PROBS>(tile, bm, bl, qhi, qlo, any_lo, vrow, sc); break;
          case 3: bf16_block<HD, 3, BF16_PROBS>(tile, bm, bl, qhi, qlo, any_lo, vrow, sc); break;
          case 4: bf16_block<HD, 4, BF16_PROBS>(tile, bm, bl, qhi, qlo, any_lo, vrow, sc); break;
          case 5: bf16_block<HD, 5, BF16_PROBS>(tile, bm, bl, qhi, qlo, any_lo, vrow, sc); break;
          default: bf16_block<HD, kBlockQueries, BF16_PROBS>(tile, bm, bl, qhi, qlo, any_lo, vrow, sc); break;
        }
      }
    }
  }
  end_item(it, m_count, sh, rows_ptr, dst, sc, out, lse, ws);
}
#endif

// One output's partial results for one item's worth of KV heads (h0 on, `queries` query heads), combined
// exactly: each weighted by exp(its maximum - the overall maximum), in the order given.
void merge_parts(const Part* parts, int64_t n, int64_t dest, int64_t h0, int64_t queries, const Shape& sh,
                 const float* ws, float* out, float* lse, std::vector<float>& acc) {
  const int64_t d = sh.d;
  acc.resize(d);
  for (int64_t qi = 0; qi < queries; ++qi) {
    float top = kNegInf;
    for (int64_t i = 0; i < n; ++i) top = std::max(top, ws[parts[i].ws + parts[i].m_count * d + parts[i].m0 + qi]);
    float sum = 0.f;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t i = 0; top != kNegInf && i < n; ++i) {  // all -inf: every part empty, zeros and -inf
      const float* w = ws + parts[i].ws;
      const int64_t m = parts[i].m0 + qi, mc = parts[i].m_count;
      const float part_top = w[mc * d + m];
      if (part_top == kNegInf) continue;  // an empty part weighs nothing
      const float weight = std::exp(part_top - top);
      sum += w[mc * (d + 1) + m] * weight;
      for (int64_t c = 0; c < d; ++c) acc[c] += w[m * d + c] * weight;
    }
    const int64_t at = dest * sh.heads + h0 * sh.group + qi;  // (output, head)
    finish(acc.data(), top, sum, d, out + at * d, lse + at);
  }
}

void check_index(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous() && t.device().is_cpu(), name,
              " must be a contiguous 1-d int64 CPU tensor");
}

// Both operators: per_row = false gives each (segment, member) pair its own output (paged_attention), true each
// query row the merge of all the pairs that name it (paged_decode; a row that none names gets zeros and -inf).
std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                             const at::Tensor& blocks, const at::Tensor& block_start,
                                             const at::Tensor& tokens, const at::Tensor& rows_ptr,
                                             const at::Tensor& rows, double scale, int64_t split_tokens,
                                             bool per_row, bool causal = false) {
  TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu() && v_cache.device().is_cpu(), "CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be [rows, heads, head_dim] with a contiguous last dim");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() && k_cache.stride(3) == 1 &&
                  v_cache.stride(3) == 1,
              "k_cache and v_cache must be [blocks, block_size, kv_heads, head_dim] with a contiguous last dim");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "k_cache and v_cache must share a dtype");
  for (const auto& t : {q, k_cache})
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf,
                "float32, bfloat16 or float16 expected, got ", t.scalar_type());
  TORCH_CHECK(split_tokens > 0, "split_tokens must be positive");
  for (const auto& [t, name] : {std::pair{blocks, "blocks"}, {block_start, "block_start"}, {tokens, "tokens"},
                                {rows_ptr, "rows_ptr"}, {rows, "rows"}})
    check_index(t, name);

  Shape sh{};
  sh.causal = causal;
  sh.heads = q.size(1);
  sh.kv_heads = k_cache.size(2);
  sh.d = q.size(2);
  sh.block_size = k_cache.size(1);
  TORCH_CHECK(k_cache.size(3) == sh.d, "q and the cache disagree on head_dim");
  TORCH_CHECK(sh.kv_heads > 0 && sh.heads % sh.kv_heads == 0, "query heads must be a multiple of KV heads");
  sh.group = sh.heads / sh.kv_heads;
  sh.q_row = q.stride(0);
  sh.q_head = q.stride(1);
  sh.k_block = k_cache.stride(0), sh.k_tok = k_cache.stride(1), sh.k_head = k_cache.stride(2);
  sh.v_block = v_cache.stride(0), sh.v_tok = v_cache.stride(1), sh.v_head = v_cache.stride(2);

  const int64_t segs = tokens.numel(), pairs = rows.numel(), num_blocks = k_cache.size(0);
  TORCH_CHECK(block_start.numel() == segs && rows_ptr.numel() == segs + 1, "one block_start and token count per "
              "segment, and segments + 1 row pointers");
  const int64_t* bl = blocks.const_data_ptr<int64_t>();
  const int64_t* bs = block_start.const_data_ptr<int64_t>();
  const int64_t* tk = tokens.const_data_ptr<int64_t>();
  const int64_t* rp = rows_ptr.const_data_ptr<int64_t>();
  const int64_t* rw = rows.const_data_ptr<int64_t>();
  TORCH_CHECK(rp[0] == 0 && rp[segs] == pairs, "rows_ptr must run from 0 to rows.numel()");
  for (int64_t p = 0; p < pairs; ++p) TORCH_CHECK(rw[p] >= 0 && rw[p] < q.size(0), "query row out of range");

  // Every index is checked before any thread reads it.
  int64_t base_items = 0;  // (segment, context split) pairs
  int64_t work = 0, largest = 0;              // the call's work, and its largest base item's (see kMinWorkPerThread)
  for (int64_t s = 0; s < segs; ++s) {
    const int64_t members = rp[s + 1] - rp[s], n = tk[s];
    TORCH_CHECK(members >= 0 && n >= 0, "segment ", s, ": negative size");
    TORCH_CHECK(!causal || n >= members, "causal segment ", s, ": fewer tokens than query rows");
    const int64_t used = (n + sh.block_size - 1) / sh.block_size;
    TORCH_CHECK(bs[s] >= 0 && bs[s] + used <= blocks.numel(), "segment ", s, ": blocks out of range");
    for (int64_t j = 0; j < used; ++j)
      TORCH_CHECK(bl[bs[s] + j] >= 0 && bl[bs[s] + j] < num_blocks, "segment ", s, ": block id out of range");
    if (members == 0) continue;
    base_items += std::max<int64_t>(1, (n + split_tokens - 1) / split_tokens);
    work += n * sh.kv_heads * members;
    largest = std::max(largest, std::min(n, split_tokens) * sh.kv_heads * members);
  }
  // An item reads all KV heads of its tokens (whole cache lines, in order) unless that leaves too few items
  // to keep every thread busy, or one item (a stacked segment's split) more than a thread's share of the work,
  // which the threads could not even out: then one KV head each. Either way the arithmetic is the same.
  const int64_t nt = at::get_num_threads();
  // Causal segments (prefill chunks: hundreds of stacked rows) are split by rows instead, one KV head an item:
  // no partial results to merge (measured 15% of a 512-row chunk's time over 2,000 tokens at 512-token splits).
  const int64_t per_item = !causal && base_items >= 4 * nt && largest * nt <= work ? sh.kv_heads : 1;
  auto splits_of = [&](int64_t n) { return causal ? 1 : std::max<int64_t>(1, (n + split_tokens - 1) / split_tokens); };

  // Partial results per output: a pair's context splits, and per row those of every pair naming it.
  const int64_t outputs = per_row ? q.size(0) : pairs;
  std::vector<int64_t> parts(outputs, 0);
  for (int64_t s = 0; s < segs; ++s)
    for (int64_t p = rp[s]; p < rp[s + 1]; ++p)
      parts[per_row ? rw[p] : p] += splits_of(tk[s]);
  const Dest dest{rw, parts.data(), per_row};
  // The merge pass: one task per (output of several parts, item's worth of KV heads), its parts in a run of
  // `part` (segment order, then split order: a fixed order, whatever the threads).
  const int64_t chunks = sh.kv_heads / per_item;
  std::vector<int64_t> part_base(outputs, -1);  // an output's first part; chunk c's from part_base + c * parts
  std::vector<std::pair<int64_t, int64_t>> merges;  // (output, chunk)
  int64_t n_parts = 0;
  for (int64_t o = 0; o < outputs; ++o) {
    if (parts[o] < 2) continue;
    part_base[o] = n_parts;
    n_parts += parts[o] * chunks;
    for (int64_t c = 0; c < chunks; ++c) merges.emplace_back(o, c);
  }
  std::vector<Part> part(n_parts);
  std::vector<int64_t> filled(n_parts > 0 ? outputs * chunks : 0, 0);

  std::vector<Item> items;
  int64_t ws_size = 0, item_members = 1;  // the most members of an item (the scratch's size)
  for (int64_t s = 0; s < segs; ++s) {
    const int64_t members = rp[s + 1] - rp[s], n = tk[s];
    if (members == 0) continue;
    const int64_t splits = splits_of(n);
    // a causal segment's rows in runs of at most kCausalRows, the last (most tokens) first
    const int64_t runs = causal ? (members + kCausalRows - 1) / kCausalRows : 1, run = (members + runs - 1) / runs;
    item_members = std::max(item_members, run);
    for (int64_t h = 0; h < sh.kv_heads; h += per_item) {
      for (int64_t i = 0; i < splits; ++i) {
        for (int64_t r = runs - 1; r >= 0; --r) {
          const int64_t j0 = r * run, j1 = std::min(members, j0 + run), m_count = (j1 - j0) * per_item * sh.group;
          bool merged = false;  // whether a member's output has other parts: the item then needs workspace
          for (int64_t j = j0; j < j1; ++j) merged |= parts[dest.of(rp[s] + j)] > 1;
          int64_t off = -1;
          if (merged) {
            off = ws_size;
            ws_size += m_count * (sh.d + 2);
            for (int64_t j = j0; j < j1; ++j) {
              const int64_t o = dest.of(rp[s] + j), c = h / per_item;
              if (parts[o] > 1)
                part[part_base[o] + c * parts[o] + filled[o * chunks + c]++] = {off, m_count,
                                                                                 (j - j0) * per_item * sh.group};
            }
          }
          const int64_t t0 = i * split_tokens, t1 = splits == 1 ? n : std::min(n, t0 + split_tokens);
          items.push_back({s, h, h + per_item, t0, t1, off, n, members, j0, j1});
        }
      }
    }
  }

  auto f32 = q.options().dtype(at::kFloat);
  at::Tensor out = at::empty({outputs, sh.heads, sh.d}, f32);
  at::Tensor lse = at::empty({outputs, sh.heads}, f32);
  at::Tensor workspace = at::empty({ws_size}, f32);
  float* o = out.data_ptr<float>();
  float* l = lse.data_ptr<float>();
  float* w = workspace.data_ptr<float>();
  for (int64_t r = 0; r < outputs; ++r)  // rows without a segment (paged_decode): zeros and -inf
    if (parts[r] == 0) {
      std::fill(o + r * sh.heads * sh.d, o + (r + 1) * sh.heads * sh.d, 0.f);
      std::fill(l + r * sh.heads, l + (r + 1) * sh.heads, kNegInf);
    }
  const float sc = static_cast<float>(scale);
  const int64_t n_items = static_cast<int64_t>(items.size()), n_merges = static_cast<int64_t>(merges.size());
  // A small call runs on one thread: waking the others costs more than it saves (and on a loaded machine a
  // barrier can wait a whole time slice for a descheduled thread).
  const int64_t useful = std::max<int64_t>(1, work / kMinWorkPerThread);
  const int threads =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({at::get_num_threads(), n_items, useful})));

  auto run = [&](auto kv_tag) {
    using KV = decltype(kv_tag);
    const KV* k = k_cache.const_data_ptr<KV>();
    const KV* v = v_cache.const_data_ptr<KV>();
    auto item = sh.d == 64 ? run_item<KV, 64> : sh.d == 128 ? run_item<KV, 128> : run_item<KV, 0>;
#ifdef KVLOOP_AVX512BF16
    if constexpr (std::is_same_v<KV, c10::BFloat16>) {
      if (sh.d == 64) item = causal ? run_item_bf16<64, true> : run_item_bf16<64, false>;
      if (sh.d == 128) item = causal ? run_item_bf16<128, true> : run_item_bf16<128, false>;
    }
#endif
#pragma omp parallel num_threads(threads)
    {
      Scratch scratch(item_members * per_item * sh.group, per_item, sh.d);
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < n_items; ++i) item(items[i], q, k, v, sh, bl, bs, rp, dest, sc, o, l, w, scratch);
      std::vector<float> acc;
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < n_merges; ++i) {
        const auto [out_index, c] = merges[i];
        merge_parts(part.data() + part_base[out_index] + c * parts[out_index], parts[out_index], out_index,
                    c * per_item, per_item * sh.group, sh, w, o, l, acc);
      }
    }
  };
  switch (k_cache.scalar_type()) {
    case at::kFloat: run(float{}); break;
    case at::kBFloat16: run(c10::BFloat16{}); break;
    default: run(c10::Half{}); break;
  }
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                                   const at::Tensor& v_cache, const at::Tensor& blocks,
                                                   const at::Tensor& block_start, const at::Tensor& tokens,
                                                   const at::Tensor& rows_ptr, const at::Tensor& rows, double scale,
                                                   int64_t split_tokens) {
  return attention(q, k_cache, v_cache, blocks, block_start, tokens, rows_ptr, rows, scale, split_tokens, false);
}

std::tuple<at::Tensor, at::Tensor> paged_decode(const at::Tensor& q, const at::Tensor& k_cache,
                                                const at::Tensor& v_cache, const at::Tensor& blocks,
                                                const at::Tensor& block_start, const at::Tensor& tokens,
                                                const at::Tensor& rows_ptr, const at::Tensor& rows, double scale,
                                                int64_t split_tokens) {
  return attention(q, k_cache, v_cache, blocks, block_start, tokens, rows_ptr, rows, scale, split_tokens, true);
}

// paged_decode with causal segments: a segment's rows are consecutive positions ending at its last token (a
// prefill chunk whose K/V are already in the cache), so member j of m sees its first tokens - (m - 1 - j).
std::tuple<at::Tensor, at::Tensor> paged_prefill(const at::Tensor& q, const at::Tensor& k_cache,
                                                 const at::Tensor& v_cache, const at::Tensor& blocks,
                                                 const at::Tensor& block_start, const at::Tensor& tokens,
                                                 const at::Tensor& rows_ptr, const at::Tensor& rows, double scale,
                                                 int64_t split_tokens) {
  return attention(q, k_cache, v_cache, blocks, block_start, tokens, rows_ptr, rows, scale, split_tokens, true,
                   true);
}

// The step's new K/V rows into their slots (slot = block * block_size + offset), converted to the cache's
// dtype as Tensor.to converts (round to nearest even): k, v [N, kv_heads, head_dim], last dim contiguous.
template <typename Src, typename Dst>
void write_rows(const at::Tensor& src, const at::Tensor& cache, const int64_t* slots, int64_t n) {
  const Src* in = src.const_data_ptr<Src>();
  Dst* out = cache.data_ptr<Dst>();
  const int64_t heads = src.size(1), d = src.size(2), bs = cache.size(1);
  for (int64_t i = 0; i < n; ++i) {
    Dst* row = out + (slots[i] / bs) * cache.stride(0) + (slots[i] % bs) * cache.stride(1);
    for (int64_t h = 0; h < heads; ++h) {
      const Src* from = in + i * src.stride(0) + h * src.stride(1);
      Dst* to = row + h * cache.stride(2);
      for (int64_t j = 0; j < d; ++j) to[j] = static_cast<Dst>(static_cast<float>(from[j]));
    }
  }
}

template <typename Src>
void write_kv_rows(const at::Tensor& src, const at::Tensor& cache, const int64_t* slots, int64_t n) {
  switch (cache.scalar_type()) {
    case at::kFloat: write_rows<Src, float>(src, cache, slots, n); break;
    case at::kBFloat16: write_rows<Src, c10::BFloat16>(src, cache, slots, n); break;
    default: write_rows<Src, c10::Half>(src, cache, slots, n); break;
  }
}

void write_kv(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache, const at::Tensor& v_cache,
              const at::Tensor& slots) {
  check_index(slots, "slots");
  const int64_t n = slots.numel();
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes() && k.size(0) == n && k.stride(2) == 1 && v.stride(2) == 1,
              "k and v must be [N, kv_heads, head_dim] (a contiguous last dim), one row per slot");
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "k and v must share a dtype");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() && k_cache.stride(3) == 1 &&
                  v_cache.stride(3) == 1 && k_cache.scalar_type() == v_cache.scalar_type(),
              "k_cache and v_cache must be [blocks, block_size, kv_heads, head_dim] of one dtype");
  TORCH_CHECK(k_cache.size(2) == k.size(1) && k_cache.size(3) == k.size(2), "K/V rows and the cache disagree");
  const int64_t* sl = slots.const_data_ptr<int64_t>();
  const int64_t capacity = k_cache.size(0) * k_cache.size(1);
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(sl[i] >= 0 && sl[i] < capacity, "slot out of range");
  for (const auto& [src, cache] : {std::pair{k, k_cache}, {v, v_cache}}) {
    switch (src.scalar_type()) {
      case at::kFloat: write_kv_rows<float>(src, cache, sl, n); break;
      case at::kBFloat16: write_kv_rows<c10::BFloat16>(src, cache, sl, n); break;
      case at::kHalf: write_kv_rows<c10::Half>(src, cache, sl, n); break;
      default: TORCH_CHECK(false, "float32, bfloat16 or float16 K/V expected, got ", src.scalar_type());
    }
  }
}

// One layer of a decode-only step in one call (the per-layer op overhead is a large part of a small step):
// its new K/V written into kv_cache[layer] ([layers, 2, blocks, block_size, kv_heads, head_dim]), then
// paged_decode over it; the output in q's dtype.
at::Tensor decode_layer(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kv_cache,
                        int64_t layer, const at::Tensor& slots, const at::Tensor& blocks,
                        const at::Tensor& block_start, const at::Tensor& tokens, const at::Tensor& rows_ptr,
                        const at::Tensor& rows, double scale, int64_t split_tokens) {
  TORCH_CHECK(kv_cache.dim() == 6 && kv_cache.size(1) == 2, "kv_cache must be [layers, 2, blocks, ...]");
  TORCH_CHECK(layer >= 0 && layer < kv_cache.size(0), "layer out of range");
  const at::Tensor pages = kv_cache.select(0, layer);
  const at::Tensor k_cache = pages.select(0, 0), v_cache = pages.select(0, 1);
  write_kv(k, v, k_cache, v_cache, slots);
  at::Tensor out = std::get<0>(
      attention(q, k_cache, v_cache, blocks, block_start, tokens, rows_ptr, rows, scale, split_tokens, true));
  return q.scalar_type() == at::kFloat ? out : out.to(q.scalar_type());
}

// The compiled step (runner/compiled_step.py) calls each layer's attention as kvloop_step::attention(q, k, v,
// layer), an operator defined in Python whose Python kernel calls back into decode_layer. For a decode-only step
// of the CPU backend that crossing (dispatcher -> Python -> pybind -> here, 30 times a step) is a measurable part
// of a batch-1 step, so its arguments after `layer` are bound here for the step (per thread, as the Python
// binding is) and the operator's CPU kernel below calls decode_layer directly.
struct BoundStep {
  bool bound = false;
  at::Tensor kv_cache, slots, blocks, block_start, tokens, rows_ptr, rows;
  double scale = 0;
  int64_t split_tokens = 0;
};
thread_local BoundStep bound_step;

void bind_decode_step(const at::Tensor& kv_cache, const at::Tensor& slots, const at::Tensor& blocks,
                      const at::Tensor& block_start, const at::Tensor& tokens, const at::Tensor& rows_ptr,
                      const at::Tensor& rows, double scale, int64_t split_tokens) {
  bound_step = {true, kv_cache, slots, blocks, block_start, tokens, rows_ptr, rows, scale, split_tokens};
}

void unbind_decode_step() { bound_step = {}; }  // drops the tensors: the step's cache and work list

// kvloop_step::attention on CPU tensors: the bound step's decode_layer, else (no step bound: prefill or mixed
// steps, the torch backend) the operator's Python kernel. A backend's own kernel hides the
// CompositeExplicitAutograd one from that backend's slot, but the dispatcher keeps it in the Undefined slot
// too, which an empty key set (what the alias key converts to) reaches.
at::Tensor step_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t layer) {
  const BoundStep& s = bound_step;
  if (s.bound)
    return decode_layer(q, k, v, s.kv_cache, layer, s.slots, s.blocks, s.block_start, s.tokens, s.rows_ptr, s.rows,
                        s.scale, s.split_tokens);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("kvloop_step::attention", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t)>();
  return op.redispatch(c10::DispatchKeySet(c10::DispatchKey::CompositeExplicitAutograd), q, k, v, layer);
}

std::string simd() {
#ifdef KVLOOP_AVX512BF16
  return std::string(isa()) + ", avx512bf16 for bf16 K/V";
#else
  return isa();
#endif
}

}  // namespace
}  // namespace kvloop

TORCH_LIBRARY(kvloop_cpu, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor blocks, Tensor block_start, "
      "Tensor tokens, Tensor rows_ptr, Tensor rows, float scale, int split_tokens) -> (Tensor, Tensor)");
  m.def(
      "paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor blocks, Tensor block_start, "
      "Tensor tokens, Tensor rows_ptr, Tensor rows, float scale, int split_tokens) -> (Tensor, Tensor)");
  m.def(
      "paged_prefill(Tensor q, Tensor k_cache, Tensor v_cache, Tensor blocks, Tensor block_start, "
      "Tensor tokens, Tensor rows_ptr, Tensor rows, float scale, int split_tokens) -> (Tensor, Tensor)");
  m.def("write_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slots) -> ()");
  m.def(
      "decode_layer(Tensor q, Tensor k, Tensor v, Tensor(a!) kv_cache, int layer, Tensor slots, Tensor blocks, "
      "Tensor block_start, Tensor tokens, Tensor rows_ptr, Tensor rows, float scale, int split_tokens) -> Tensor");
  m.def(
      "bind_decode_step(Tensor kv_cache, Tensor slots, Tensor blocks, Tensor block_start, Tensor tokens, "
      "Tensor rows_ptr, Tensor rows, float scale, int split_tokens) -> ()",
      &kvloop::bind_decode_step);
  m.def("unbind_decode_step() -> ()", &kvloop::unbind_decode_step);
  m.def("simd() -> str", &kvloop::simd);
}

TORCH_LIBRARY_IMPL(kvloop_cpu, CPU, m) {
  m.impl("paged_attention", &kvloop::paged_attention);
  m.impl("paged_decode", &kvloop::paged_decode);
  m.impl("paged_prefill", &kvloop::paged_prefill);
  m.impl("write_kv", &kvloop::write_kv);
  m.impl("decode_layer", &kvloop::decode_layer);
}

// The operator is defined from Python (runner/compiled_step.py); an implementation may be registered before its
// definition, so either may be loaded first.
TORCH_LIBRARY_IMPL(kvloop_step, CPU, m) { m.impl("attention", &kvloop::step_attention); }
