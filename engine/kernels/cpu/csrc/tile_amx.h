// The kernel's AMX tile routine for the items that stack several rows' queries (a cascade group's shared prefix):
// bf16 queries over bf16 K/V, head_dim 64, blocks a multiple of 16 tokens, on CPUs with AMX tiles.
//
// Why: such an item scores every token for members x group queries, and the bf16-pair routine (tile_bf16.h)
// spends its time on that arithmetic and on one query's softmax at a time (10 members over a 2,000-token
// document: about 60% of a 48-row decode step). Here, per 16-token tile and KV head:
// - the scores of 16 queries at once as a tile product S^T = K Q^T: K's 16 rows loaded into a tile straight from
//   the paged cache (no transpose), the queries as a tile of bf16 pairs made once per item;
// - the online softmax over S^T's rows, 16 queries in the lanes of one vector (one max, one exp per token row);
// - the values as a tile product O = P V: the probabilities rounded to bf16 (as SDPA's bf16 path and the
//   pair routine's stacked items round them), V's rows interleaved into token pairs (pair_values).
// Scores are the tile unit's fp32 sums of exact bf16 products, scaled afterwards (the queries stay exact).
// Measured (Intel Xeon with AMX, 2 threads, 9 query heads over 3 KV heads, 30 layers' caches from memory, each
// member with a 50-token suffix of its own): 4 groups of 10 members over 2,000 tokens 30 ms against 55 for the
// pairs and 55 for flash (stacked_flash.h); 16 members over 1,950 tokens 10.6 against 20.3 and 17.4; 32 members
// 19.4 against 39.1 and 22.0; 4 members 4.5 against 7.2 and 6.7. A decode step of 40 rows on 4 documents plus 8
// unshared rows, whole engine step: 65-69 ms against 89.
//
// Tiles: 0-1 K (16 tokens x 32 dims each), 2-3 the queries (16 dim pairs x 16 queries each), 4 the scores
// (16 tokens x 16 queries); 5 P (16 queries x 16 tokens); 6 a V chunk (8 token pairs x 16 dims); the four
// value chunks accumulate in 4, 2, 3 and 7 (16 queries x 16 dims each, the queries' tiles are reloaded).
#pragma once

#include <atomic>
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

// Whether run_item_amx serves the stacked items of this call: switched on, bf16 queries and K/V, head_dim 64, and
// tiles of 16 tokens that never cross a block (every item starts on a split of split_tokens or a block edge).
inline bool stacked_tiles_apply(const at::Tensor& q, const at::Tensor& k_cache, const Shape& sh, int64_t split_tokens) {
  return stacked_tiles_on.load() && q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16 &&
         sh.d == kStackedTilesHeadDim && sh.block_size % kTile == 0 && split_tokens % kTile == 0;
}

#ifdef KVLOOP_AMX
inline void load_attention_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  cfg.colsb[5] = 32;  // P: 16 tokens of bf16 per query
  cfg.rows[6] = 8;    // a V chunk: 8 token pairs
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

// A stacked item (several members) through the tiles; the item's partial results as run_item_bf16 gives them.
inline void run_item_amx(const Item& it, const at::Tensor& q, const c10::BFloat16* k, const c10::BFloat16* v,
                         const Shape& sh, const int64_t* blocks, const int64_t* block_start, const int64_t* rows_ptr,
                         const Dest& dst, float scale, float* out, float* lse, float* ws, Scratch& sc) {
  using KV = c10::BFloat16;
  constexpr int64_t HD = kStackedTilesHeadDim;
  const int64_t g = sh.group, nh = it.h1 - it.h0, members = it.j1 - it.j0;
  const int64_t m_count = begin_item(it, q, sh, rows_ptr, dst, 1.f, sc);  // unscaled: bf16 values, exact
  const int64_t count = members * g, nblk = (count + 15) / 16, states = nh * nblk;
  std::vector<int64_t> ms(nh * count);
  for (int64_t hl = 0; hl < nh; ++hl)
    for (int64_t j = 0; j < members; ++j)
      for (int64_t gi = 0; gi < g; ++gi) ms[hl * count + j * g + gi] = (j * nh + hl) * g + gi;
  // per (head, block of 16 queries): the queries' two tiles, and the softmax state of its 16 lanes
  std::vector<uint32_t> qt(states * 2 * 256);
  std::vector<float> top(states * 16, kNegInf), sum(states * 16, 0.f), acc(states * 16 * HD, 0.f);
  for (int64_t hl = 0; hl < nh; ++hl)
    for (int64_t b = 0; b < nblk; ++b)
      for (int64_t half = 0; half < 2; ++half)
        query_tile(sc.q.data(), ms.data() + hl * count + 16 * b, std::min<int64_t>(16, count - 16 * b), half,
                   qt.data() + ((hl * nblk + b) * 2 + half) * 256);
  load_attention_tiles();
  TokenWalker<KV> walker(blocks + block_start[it.seg], k, v, sh, it);
  Scout<KV> scout(blocks + block_start[it.seg], k, v, sh, it);
  Bf16Tile<HD> tile{};  // its V pairs: zeros past a partial tile's tokens
  alignas(64) float s[16][16];       // S^T, then P^T: token rows, query lanes
  alignas(64) uint32_t p[16][16];    // P as a tile: query rows, 8 words of token pairs (first 32 bytes)
  alignas(64) float o[4][16][16];    // the value chunks: query rows, 16 dims
  const KV* ktok[kTile];
  const KV* vtok[kTile];
  const KV* vrow[kTile];
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t t0 = it.t0; t0 < it.t1; t0 += kTile) {
    const int64_t n = std::min(kTile, it.t1 - t0);
    walker.locate(n, ktok, vtok);
    for (int64_t hl = 0; hl < nh; ++hl) {
      const KV* kp = ktok[0] + hl * sh.k_head;  // the tile's 16 slots lie in one block, k_tok apart
      _tile_loadd(0, kp, sh.k_tok * sizeof(KV));
      _tile_loadd(1, kp + 32, sh.k_tok * sizeof(KV));
      for (int64_t t = 0; t < n; ++t) vrow[t] = vtok[t] + hl * sh.v_head;
      if (n < kTile) std::fill(&tile.vp[0][0][0], &tile.vp[0][0][0] + 8 * (HD / 16) * 16, 0u);
      pair_values(tile, vrow, n);
      scout.ahead_of(t0 + kTile * (hl + 1) / nh);
      for (int64_t b = 0; b < nblk; ++b) {
        const int64_t st = hl * nblk + b;
        _tile_loadd(2, qt.data() + (st * 2) * 256, 64);
        _tile_loadd(3, qt.data() + (st * 2 + 1) * 256, 64);
        _tile_zero(4);
        _tile_dpbf16ps(4, 0, 2);
        _tile_dpbf16ps(4, 1, 3);
        _tile_stored(4, s, 64);
        // the online softmax, 16 queries a vector; a partial tile's missing tokens weigh 0
        const __m512 old_top = _mm512_loadu_ps(top.data() + st * 16);
        __m512 tile_top = _mm512_set1_ps(kNegInf);
        for (int64_t t = 0; t < n; ++t) {
          const __m512 x = _mm512_mul_ps(_mm512_load_ps(s[t]), scale_v);
          _mm512_store_ps(s[t], x);
          tile_top = _mm512_max_ps(tile_top, x);
        }
        const __m512 new_top = _mm512_max_ps(old_top, tile_top);
        const __m512 alpha = exp512_nonpositive(_mm512_sub_ps(old_top, new_top));  // -inf before: 0 (nothing held)
        __m512 total = _mm512_mul_ps(_mm512_loadu_ps(sum.data() + st * 16), alpha);
        __m512i r[16];
        for (int64_t i = 0; i < 8; ++i) {  // token pairs: word (2i, 2i + 1) of every query
          __m512 pe = _mm512_setzero_ps(), po = _mm512_setzero_ps();
          if (2 * i < n) pe = exp512_nonpositive(_mm512_sub_ps(_mm512_load_ps(s[2 * i]), new_top));
          if (2 * i + 1 < n) po = exp512_nonpositive(_mm512_sub_ps(_mm512_load_ps(s[2 * i + 1]), new_top));
          total = _mm512_add_ps(total, _mm512_add_ps(pe, po));
          const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(pe));
          const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(po));
          r[i] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
          r[i + 8] = _mm512_setzero_si512();
        }
        _mm512_storeu_ps(top.data() + st * 16, new_top);
        _mm512_storeu_ps(sum.data() + st * 16, total);
        transpose16x16(r);  // row c: query c's 8 words
        for (int64_t c = 0; c < 16; ++c) _mm512_store_si512(p[c], r[c]);
        _tile_loadd(5, p, 64);
        _tile_zero(4);
        _tile_zero(2);
        _tile_zero(3);
        _tile_zero(7);
        _tile_loadd(6, tile.vp[0][0], (HD / 16) * 64);
        _tile_dpbf16ps(4, 5, 6);
        _tile_loadd(6, tile.vp[0][1], (HD / 16) * 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_loadd(6, tile.vp[0][2], (HD / 16) * 64);
        _tile_dpbf16ps(3, 5, 6);
        _tile_loadd(6, tile.vp[0][3], (HD / 16) * 64);
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
