// The paged attention kernel's work (paged_decode.cpp): its items, where their results go, the per-thread
// scratch, loading an item's queries and writing its results, and walking (and prefetching) an item's tokens
// through the paged cache. The tile routines (tile_fp32.h, tile_bf16.h) compute over these.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace kvloop {

// Tokens per tile: the tile's K and V (all of an item's heads, widened to fp32) stay in L1/L2 while every
// query of the item uses them.
constexpr int64_t kTile = 16;

struct Item {
  int64_t seg, h0, h1, t0, t1;   // KV heads [h0, h1) over tokens [t0, t1) of the segment
  int64_t ws;                    // workspace offset of its partial results (-1: every member writes its output)
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

inline void load_query(const at::Tensor& q, const Shape& sh, int64_t row, int64_t head, float scale, float* dst) {
  const int64_t off = row * sh.q_row + head * sh.q_head;
  switch (q.scalar_type()) {
    case at::kFloat: to_float(q.const_data_ptr<float>() + off, dst, sh.d); break;
    case at::kBFloat16: to_float(q.const_data_ptr<c10::BFloat16>() + off, dst, sh.d); break;
    default: to_float(q.const_data_ptr<c10::Half>() + off, dst, sh.d); break;
  }
  for (int64_t i = 0; i < sh.d; ++i) dst[i] *= scale;
}

// out = acc / sum, lse = top + log(sum); a segment without tokens gives zeros and -inf.
inline void finish(const float* acc, float top, float sum, int64_t d, float* out, float* lse) {
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
inline int64_t begin_item(const Item& it, const at::Tensor& q, const Shape& sh, const int64_t* rows_ptr,
                          const Dest& dst, float scale, Scratch& sc) {
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
inline void end_item(const Item& it, int64_t m_count, const Shape& sh, const int64_t* rows_ptr, const Dest& dst,
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
// the bf16 decode kernel waiting on memory most of the time (docs/engine_history.md).
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

}  // namespace kvloop
