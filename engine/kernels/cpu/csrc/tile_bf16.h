// The kernel's blocked tile routine for bf16 K/V on CPUs with AVX512-BF16 (simd512.h), head_dim 64 or 128.
#pragma once

#include "paged_work.h"
#include "simd512.h"

namespace kvloop {

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

// n V rows (a missing odd one reads as zeros) interleaved as token pairs: (V[2i][16c + l], V[2i + 1][16c + l]) at
// vp[i][c][l].
template <int64_t HD>
inline void pair_values(uint32_t (*vp)[HD / 16][16], const c10::BFloat16* const* vrow, int64_t n) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                      37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t i = 0; 2 * i < n; ++i)
    for (int64_t h = 0; h < HD / 32; ++h) {
      const __m512i a = _mm512_loadu_si512(vrow[2 * i] + 32 * h);
      const __m512i b = 2 * i + 1 < n ? _mm512_loadu_si512(vrow[2 * i + 1] + 32 * h) : _mm512_setzero_si512();
      _mm512_store_si512(vp[i][2 * h], _mm512_permutex2var_epi16(a, lo, b));
      _mm512_store_si512(vp[i][2 * h + 1], _mm512_permutex2var_epi16(a, hi, b));
    }
}

// The tile's V rows (n of them) as token pairs into tile.vp.
template <int64_t HD>
inline void pair_values(Bf16Tile<HD>& tile, const c10::BFloat16* const* vrow, int64_t n) {
  pair_values<HD>(tile.vp, vrow, n);
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
    for (int64_t c = 0; c < C; ++c)
      acc[b][c] = _mm512_mul_ps(_mm512_loadu_ps(sc.acc.data() + ms[b] * HD + 16 * c), alpha[b]);
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

// BF16_PROBS (paged_prefill, and a cascade group's shared prefix: compute-bound, many stacked queries per tile):
// probabilities rounded to bf16 for the value product, as SDPA's bf16 path rounds them, two tokens per
// instruction; a single row's decode keeps them in fp32 (bound by its reads; docs/engine_history.md).
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
  const int64_t count = members * g;  // queries per KV head: g per member
  std::vector<int64_t> ms(nh * count), live(count);  // each head's queries, and what each member's see of a tile
  for (int64_t hl = 0; hl < nh; ++hl)
    for (int64_t j = 0; j < members; ++j)
      for (int64_t gi = 0; gi < g; ++gi) ms[hl * count + j * g + gi] = (j * nh + hl) * g + gi;
  for (int64_t t0 = it.t0; t0 < it.t1; t0 += kTile) {
    const int64_t n = std::min(kTile, it.t1 - t0);
    walker.locate(n, ktok, vtok);
    for (int64_t j = 0; j < members; ++j) {
      const int64_t seen = live_in_tile(visible(sh, it, j), t0, n);
      for (int64_t gi = 0; gi < g; ++gi) live[j * g + gi] = seen;
    }
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
      for (int64_t b0 = 0; b0 < count; b0 += QB) {
        const int64_t *bm = ms.data() + hl * count + b0, *bl = live.data() + b0;
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

}  // namespace kvloop
