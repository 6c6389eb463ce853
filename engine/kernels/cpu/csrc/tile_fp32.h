// The kernel's portable tile routine: each tile of an item's tokens widened to fp32 (fp32 read in place), then
// every query scored against it one at a time (simd.h: AVX2 + FMA where present).
#pragma once

#include "paged_work.h"

namespace kvloop {

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

}  // namespace kvloop
