// The kernel's AMX tile routine for the items that stack several rows' queries (a cascade group's shared prefix,
// and a prefill chunk's runs of rows: paged_prefill's causal segments): bf16 queries over bf16 K/V, head_dim 64,
// blocks a multiple of 16 tokens, on CPUs with AMX tiles.
//
// Why: such an item scores every token for members x group queries, and the bf16-pair routine (tile_bf16.h)
// spends its time on that arithmetic and on one query's softmax at a time. Here, per step of 32 tokens and
// KV head:
// - the scores of 16 queries at once as tile products S^T = K Q^T, one per 16 tokens: K's 16 rows loaded into a
//   tile straight from the paged cache (no transpose), the queries as a tile of bf16 pairs made once per item;
// - the online softmax over S^T's rows, 16 queries in the lanes of one vector (one max, one exp per token row), the
//   scale applied in the exponent; a causal run masks each lane past its own tokens;
// - the values as tile products O = P V over the step's 16 token pairs: the probabilities rounded to bf16 (as
//   SDPA's bf16 path and the pair routine's stacked items round them; their exp to 5e-5, exp512_for_bf16), V's
//   rows interleaved into token pairs (pair_values); the accumulators updated once per step.
// Scores are the tile unit's fp32 sums of exact bf16 products (the queries stay exact).
// It outruns the pair routine and stacked flash at every group size measured, and SDPA on prefill chunks
// (docs/engine_history.md).
//
// Tiles: 0-1 K (16 tokens x 32 dims each), 2-3 the queries (16 dim pairs x 16 queries each), 4 the scores
// (16 tokens x 16 queries); 5 P (16 queries x 16 token pairs); 6 a V chunk (16 token pairs x 16 dims); the four
// value chunks accumulate in 4, 2, 3 and 7 (16 queries x 16 dims each, the queries' tiles are reloaded).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "amx_state.h"
#include "paged_work.h"
#include "tile_bf16.h"

namespace kvloop {

constexpr int64_t kStackedTilesHeadDim = 64;

// Switched on by the CPU backend where oneDNN has AMX tiles; stays off where the build has none or the OS does not
// grant this process their state. Off, stacked items take tile_bf16.h. Returns the setting.
inline std::atomic<bool> stacked_tiles_on{false};

inline bool set_stacked_tiles(bool on) {
  stacked_tiles_on.store(on && amx_granted());
  return stacked_tiles_on.load();
}

// The shapes run_item_amx takes: head_dim 64, and tiles of 16 tokens that never cross a block (every item starts on
// a split of split_tokens or a block edge). The CPU backend asks the same (the op of this name) to price and route.
inline bool stacked_tiles_shape(int64_t head_dim, int64_t block_size, int64_t split_tokens) {
  return head_dim == kStackedTilesHeadDim && block_size % kTile == 0 && split_tokens % kTile == 0;
}

// Whether run_item_amx serves the stacked items of this call: switched on, bf16 queries and K/V, and its shapes.
inline bool stacked_tiles_apply(const at::Tensor& q, const at::Tensor& k_cache, const Shape& sh, int64_t split_tokens) {
  return stacked_tiles_on.load() && q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16 &&
         stacked_tiles_shape(sh.d, sh.block_size, split_tokens);
}

#ifdef KVLOOP_AMX
inline void load_attention_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

// 16 bf16 query values per lane pair: word r of query c = (q_c[2r], q_c[2r + 1]) at qt[r][c] (a B tile).
inline void query_tile(const float* q, const int64_t* ms, int64_t count, int64_t half, uint32_t* qt) {
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t c = 0; c < 16; ++c) {
      uint32_t word = 0;
      if (c < count) {
        const float* qc = q + ms[c] * kStackedTilesHeadDim + 32 * half + 2 * r;
        word = static_cast<uint32_t>(c10::BFloat16(qc[0]).x) | (static_cast<uint32_t>(c10::BFloat16(qc[1]).x) << 16);
      }
      qt[r * 16 + c] = word;
    }
}

// A stacked item (several members) through the tiles, a cascade group's shared prefix or a causal segment's run of
// rows (paged_prefill: each lane masked past the tokens its query sees; a block of 16 queries that sees none of a
// step's tokens skips it); the item's partial results as run_item_bf16 gives them. Tokens go 32 a step (two K
// tiles): one softmax pass, a full tile of bf16 probabilities and one update of the accumulators per step.
inline void run_item_amx(const Item& it, const at::Tensor& q, const c10::BFloat16* k, const c10::BFloat16* v,
                         const Shape& sh, const int64_t* blocks, const int64_t* block_start, const int64_t* rows_ptr,
                         const Dest& dst, float scale, float* out, float* lse, float* ws, Scratch& sc) {
  using KV = c10::BFloat16;
  constexpr int64_t HD = kStackedTilesHeadDim, kStep = 2 * kTile;
  const int64_t g = sh.group, nh = it.h1 - it.h0, members = it.j1 - it.j0;
  const int64_t m_count = begin_item(it, q, sh, rows_ptr, dst, 1.f, sc);  // unscaled: bf16 values, exact
  const int64_t count = members * g, nblk = (count + 15) / 16, states = nh * nblk;
  std::vector<int64_t> ms(nh * count);
  for (int64_t hl = 0; hl < nh; ++hl)
    for (int64_t j = 0; j < members; ++j)
      for (int64_t gi = 0; gi < g; ++gi) ms[hl * count + j * g + gi] = (j * nh + hl) * g + gi;
  // per (head, block of 16 queries): the queries' two tiles, and the softmax state of its 16 lanes (scaled scores)
  std::vector<uint32_t> qt(states * 2 * 256);
  std::vector<float> top(states * 16, kNegInf), sum(states * 16, 0.f), acc(states * 16 * HD, 0.f);
  for (int64_t hl = 0; hl < nh; ++hl)
    for (int64_t b = 0; b < nblk; ++b)
      for (int64_t half = 0; half < 2; ++half)
        query_tile(sc.q.data(), ms.data() + hl * count + 16 * b, std::min<int64_t>(16, count - 16 * b), half,
                   qt.data() + ((hl * nblk + b) * 2 + half) * 256);
  // A causal item: the tokens each lane's query sees (every KV head's alike), and per block the fewest and the
  // most; its tokens end where its last member's do.
  const bool causal = sh.causal;
  const int64_t t_end = causal ? visible(sh, it, members - 1) : it.t1;
  std::vector<int32_t> vis(causal ? nblk * 16 : 0, INT32_MAX);
  std::vector<int64_t> vis_lo(causal ? nblk : 0), vis_hi(causal ? nblk : 0);
  for (int64_t b = 0; causal && b < nblk; ++b) {
    const int64_t live = std::min<int64_t>(16, count - 16 * b);
    for (int64_t c = 0; c < live; ++c) vis[16 * b + c] = static_cast<int32_t>(visible(sh, it, (16 * b + c) / g));
    vis_lo[b] = vis[16 * b];
    vis_hi[b] = vis[16 * b + live - 1];
  }
  load_attention_tiles();
  TokenWalker<KV> walker(blocks + block_start[it.seg], k, v, sh, it);
  Scout<KV> scout(blocks + block_start[it.seg], k, v, sh, it);
  alignas(64) uint32_t vp[kTile][HD / 16][16];  // the step's V as token pairs: zeros past a partial step's tokens
  alignas(64) float s[kStep][16];    // S^T: token rows, query lanes (raw scores)
  alignas(64) uint32_t p[16][16];    // P as a tile: query rows, 16 words of token pairs
  alignas(64) float o[4][16][16];    // the value chunks: query rows, 16 dims
  __mmask16 seen[kStep];             // per token row: the lanes that see it (causal)
  const KV* ktok[kStep];
  const KV* vtok[kStep];
  const KV* vrow[kStep];
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t t0 = it.t0; t0 < t_end; t0 += kStep) {
    const int64_t n = std::min(kStep, t_end - t0);
    walker.locate(n, ktok, vtok);
    for (int64_t hl = 0; hl < nh; ++hl) {
      for (int64_t t = 0; t < n; ++t) vrow[t] = vtok[t] + hl * sh.v_head;
      if (n < kStep) std::fill(&vp[0][0][0], &vp[0][0][0] + kTile * (HD / 16) * 16, 0u);
      pair_values<HD>(vp, vrow, n);
      scout.ahead_of(t0 + kStep * (hl + 1) / nh);
      for (int64_t b = 0; b < nblk; ++b) {
        if (causal && t0 >= vis_hi[b]) continue;  // every query of the block sees only earlier tokens
        const bool masked = causal && t0 + n > vis_lo[b];
        if (masked) {
          const __m512i vv = _mm512_loadu_si512(vis.data() + 16 * b);
          for (int64_t t = 0; t < n; ++t) seen[t] = _mm512_cmpgt_epi32_mask(vv, _mm512_set1_epi32(t0 + t));
        }
        const int64_t st = hl * nblk + b;
        // S^T = K Q^T for each 16-token half of the step: K's rows straight from the paged cache (a half's 16
        // slots lie in one block, k_tok apart)
        _tile_loadd(2, qt.data() + (st * 2) * 256, 64);
        _tile_loadd(3, qt.data() + (st * 2 + 1) * 256, 64);
        for (int64_t h0 = 0; h0 < n; h0 += kTile) {
          const KV* kp = ktok[h0] + hl * sh.k_head;
          _tile_loadd(0, kp, sh.k_tok * sizeof(KV));
          _tile_loadd(1, kp + 32, sh.k_tok * sizeof(KV));
          _tile_zero(4);
          _tile_dpbf16ps(4, 0, 2);
          _tile_dpbf16ps(4, 1, 3);
          _tile_stored(4, s[h0], 64);
        }
        // the online softmax over the step's tokens, 16 queries a vector, the scale applied in the exponent
        // (scale > 0: the scaled maximum is the scaled raw maximum); a missing or unseen token weighs 0
        const __m512 old_top = _mm512_loadu_ps(top.data() + st * 16);
        __m512 raw_top = _mm512_set1_ps(kNegInf);
        for (int64_t t = 0; t < n; ++t)
          raw_top = masked ? _mm512_mask_max_ps(raw_top, seen[t], raw_top, _mm512_load_ps(s[t]))
                           : _mm512_max_ps(raw_top, _mm512_load_ps(s[t]));
        const __m512 new_top = _mm512_max_ps(old_top, _mm512_mul_ps(raw_top, scale_v));
        const __m512 alpha = exp512_nonpositive(_mm512_sub_ps(old_top, new_top));  // -inf before: 0 (nothing held)
        __m512 total = _mm512_mul_ps(_mm512_loadu_ps(sum.data() + st * 16), alpha);
        __m512i r[16];
        for (int64_t i = 0; i < kTile; ++i) {  // token pairs: word (2i, 2i + 1) of every query
          __m512 pe = _mm512_setzero_ps(), po = _mm512_setzero_ps();
          if (2 * i < n) pe = exp512_for_bf16(_mm512_fmsub_ps(_mm512_load_ps(s[2 * i]), scale_v, new_top));
          if (2 * i + 1 < n) po = exp512_for_bf16(_mm512_fmsub_ps(_mm512_load_ps(s[2 * i + 1]), scale_v, new_top));
          if (masked) {  // the exp's floor would give 1e-38 for them
            if (2 * i < n) pe = _mm512_maskz_mov_ps(seen[2 * i], pe);
            if (2 * i + 1 < n) po = _mm512_maskz_mov_ps(seen[2 * i + 1], po);
          }
          total = _mm512_add_ps(total, _mm512_add_ps(pe, po));
          const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(pe));
          const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(po));
          r[i] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
        }
        _mm512_storeu_ps(top.data() + st * 16, new_top);
        _mm512_storeu_ps(sum.data() + st * 16, total);
        transpose16x16(r);  // row c: query c's 16 words
        for (int64_t c = 0; c < 16; ++c) _mm512_store_si512(p[c], r[c]);
        // O = P V, four chunks of 16 dims, each over the step's 16 token pairs
        _tile_loadd(5, p, 64);
        _tile_zero(4);
        _tile_zero(2);
        _tile_zero(3);
        _tile_zero(7);
        _tile_loadd(6, vp[0][0], (HD / 16) * 64);
        _tile_dpbf16ps(4, 5, 6);
        _tile_loadd(6, vp[0][1], (HD / 16) * 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_loadd(6, vp[0][2], (HD / 16) * 64);
        _tile_dpbf16ps(3, 5, 6);
        _tile_loadd(6, vp[0][3], (HD / 16) * 64);
        _tile_dpbf16ps(7, 5, 6);
        _tile_stored(4, o[0], 64);
        _tile_stored(2, o[1], 64);
        _tile_stored(3, o[2], 64);
        _tile_stored(7, o[3], 64);
        alignas(64) float a[16];
        _mm512_store_ps(a, alpha);
        const int64_t live = std::min<int64_t>(16, count - 16 * b);
        float* acc_b = acc.data() + st * 16 * HD;
        for (int64_t c = 0; c < live; ++c) {
          const __m512 ac = _mm512_set1_ps(a[c]);
          for (int64_t d = 0; d < 4; ++d) {
            float* dst_acc = acc_b + c * HD + 16 * d;
            _mm512_storeu_ps(dst_acc, _mm512_fmadd_ps(_mm512_loadu_ps(dst_acc), ac, _mm512_load_ps(o[d][c])));
          }
        }
      }
    }
  }
  _tile_release();
  // the lanes' states into the item's queries, for end_item
  for (int64_t hl = 0; hl < nh; ++hl)
    for (int64_t b = 0; b < nblk; ++b)
      for (int64_t c = 0; c < std::min<int64_t>(16, count - 16 * b); ++c) {
        const int64_t st = hl * nblk + b, m = ms[hl * count + 16 * b + c];
        sc.top[m] = top[st * 16 + c];
        sc.sum[m] = sum[st * 16 + c];
        std::copy(acc.begin() + (st * 16 + c) * HD, acc.begin() + (st * 16 + c + 1) * HD, sc.acc.begin() + m * HD);
      }
  end_item(it, m_count, sh, rows_ptr, dst, sc, out, lse, ws);
}
#endif

}  // namespace kvloop
