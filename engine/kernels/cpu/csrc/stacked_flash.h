// Stacked flash: a cascade group's shared prefix through ATen's CPU flash attention instead of the kernel's tile
// routines, where that is faster. With AMX tiles, oneDNN's bf16 GEMMs inside ATen's flash attention score the
// group's stacked queries several times faster than the kernel's AVX512-BF16 dot products past a few members
// (docs/engine_history.md).
//
// ATen's kernel needs K and V as strided tensors, so it runs over runs of adjacent blocks (a view of the paged
// cache, no copy): a segment's tokens are cut into pieces, each one partial result of every member; a long run
// of adjacent blocks is a flash piece, the rest the kernel's context splits. A flash piece's results go where
// its items' would (end_item), so the merge pass treats them alike. Only bf16 queries over bf16 K/V (ATen's
// kernel wants one dtype; the fp32 paths, the exact ones, never come here), and only where switched on
// (set_stacked_flash: the CPU backend does where oneDNN has AMX tiles). Where the kernel's own AMX tile routine
// serves stacked items (tile_amx.h: head_dim 64) it outruns flash at every group size measured, and no piece is cut.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "paged_work.h"

namespace kvloop {

// A flash piece has at least this many members and this many (token, member) pairs: below that the call's fixed
// cost is more than the kernel's whole work on it.
constexpr int64_t kFlashMinMembers = 4;
constexpr int64_t kFlashMinWork = 8192;

inline std::atomic<bool> stacked_flash_on{false};

inline bool set_stacked_flash(bool on) { return stacked_flash_on.exchange(on); }

inline bool stacked_flash_applies(const at::Tensor& q, const at::Tensor& k_cache) {
  return stacked_flash_on.load() && q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16;
}

// Tokens [t0, t1) of a segment, one partial result of each member.
struct Piece {
  int64_t t0, t1;
  bool flash;
};

// A segment of n tokens through `table` (its block ids) cut into pieces: context splits of `split` tokens (0: one
// piece), and where `flash` allows, its runs of adjacent blocks long enough for a flash piece. A segment without
// tokens is one empty piece (zeros and -inf).
inline void cut_pieces(const int64_t* table, int64_t n, int64_t members, int64_t block_size, int64_t split,
                       bool flash, std::vector<Piece>& out) {
  auto splits = [&](int64_t a, int64_t b) {
    const int64_t step = split > 0 ? split : std::max<int64_t>(b - a, 1);
    for (int64_t t = a; t < b; t += step) out.push_back({t, std::min(b, t + step), false});
  };
  if (n == 0) {
    out.push_back({0, 0, false});
    return;
  }
  int64_t done = 0;  // tokens already in pieces
  if (flash && members >= kFlashMinMembers && n * members >= kFlashMinWork) {
    const int64_t used = (n + block_size - 1) / block_size;
    for (int64_t j = 0; j < used;) {
      int64_t k = j;
      while (k + 1 < used && table[k + 1] == table[k] + 1) ++k;
      const int64_t t0 = j * block_size, t1 = std::min(n, (k + 1) * block_size);
      if ((t1 - t0) * members >= kFlashMinWork) {
        splits(done, t0);
        out.push_back({t0, t1, true});
        done = t1;
      }
      j = k + 1;
    }
  }
  splits(done, n);
}

// One flash piece: its items (one per chunk of KV heads, in order) share a segment and a token range; one ATen
// call computes every head's partial result, then each item's go where the kernel's item would write them.
inline void run_flash_piece(const Item* items, int64_t n_items, const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const Shape& sh, const int64_t* blocks,
                            const int64_t* block_start, const int64_t* rows_ptr, const Dest& dst, double scale,
                            float* out, float* lse, float* ws) {
  const Item& first = items[0];
  const int64_t m = first.seg_rows, g = sh.group, d = sh.d, kvh = sh.kv_heads, len = first.t1 - first.t0;
  const int64_t n_blocks = (len + sh.block_size - 1) / sh.block_size;
  const int64_t b0 = blocks[block_start[first.seg] + first.t0 / sh.block_size];
  const at::Tensor rows = at::from_blob(const_cast<int64_t*>(dst.rows + rows_ptr[first.seg]), {m}, at::kLong);
  // queries stacked per KV head: row j's query head h * g + gi is row j * g + gi of KV head h
  const at::Tensor qs = q.index_select(0, rows).view({m, kvh, g, d}).permute({1, 0, 2, 3}).reshape({1, kvh, m * g, d});
  auto run_of = [&](const at::Tensor& cache) {  // [1, kvh, len, d], a view of the adjacent blocks
    return cache.narrow(0, b0, n_blocks).reshape({n_blocks * sh.block_size, kvh, d}).narrow(0, 0, len).permute(
        {1, 0, 2}).unsqueeze(0);
  };
  auto [o, l] = at::_scaled_dot_product_flash_attention_for_cpu(qs, run_of(k_cache), run_of(v_cache), 0.0, false,
                                                                 std::nullopt, scale);
  const at::Tensor of = o.to(at::kFloat).contiguous(), lf = l.to(at::kFloat).contiguous();
  const float* po = of.const_data_ptr<float>();
  const float* pl = lf.const_data_ptr<float>();
  for (int64_t c = 0; c < n_items; ++c) {
    const Item& it = items[c];
    const int64_t nh = it.h1 - it.h0, m_count = m * nh * g;
    Scratch sc(m_count, nh, d);
    for (int64_t j = 0; j < m; ++j)
      for (int64_t hl = 0; hl < nh; ++hl)
        for (int64_t gi = 0; gi < g; ++gi) {
          const int64_t mm = (j * nh + hl) * g + gi, src = (it.h0 + hl) * m * g + j * g + gi;
          std::copy(po + src * d, po + (src + 1) * d, sc.acc.begin() + mm * d);
          sc.top[mm] = pl[src];  // a normalised result: its log-sum-exp as the maximum, a sum of 1
          sc.sum[mm] = 1.f;
        }
    end_item(it, m_count, sh, rows_ptr, dst, sc, out, lse, ws);
  }
}

}  // namespace kvloop
