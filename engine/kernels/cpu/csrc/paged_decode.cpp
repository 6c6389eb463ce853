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
// paged_prefill is paged_decode over causal segments (a prefill chunk whose K/V are in the cache already: its
// j-th of m rows sees the segment's tokens but its last m - 1 - j). decode_layer is a decode-only step's whole
// layer in one call: the new K/V written into the layer's pages (write_kv), then paged_decode.
//
// Work items are (segment, KV heads, context split; a causal segment's are (segment, KV head, run of 64 rows)
// instead, nothing to merge), spread over torch's thread count with OpenMP. An
// item streams its tokens in tiles of 16 with an online softmax in fp32, asking for the lines of the tokens
// it reads next into L2 (Scout). Two tile routines: bf16 K/V on CPUs with AVX512-BF16 (head_dim 64 or 128)
// score a block of stacked queries at once with bf16 dot products on the transposed tile (run_item_bf16; for
// paged_prefill's compute-bound work, and for the items that stack several rows' queries (a cascade group's
// shared prefix), the probabilities are rounded to bf16 too, two tokens per instruction; a single row's item
// is bound by its reads and keeps them in fp32);
// everything else widens the tile to fp32 in a small buffer (fp32 read in place) and scores one query at a
// time with AVX2 (run_item). An output with a single partial result gets it written directly; the
// others are merged in a second pass, in a fixed order (segment order, then split order). Splits have a
// fixed length, so a row's result never depends on what else is in the batch or on the thread count.
//
// This file builds the work list and merges the partial results; paged_work.h holds the items and their token
// walk, tile_fp32.h and tile_bf16.h the two tile routines, tile_amx.h the AMX one (where it is switched on, CPUs with
// AMX tiles: stacked items and causal runs of bf16 queries over bf16 K/V, head_dim 64), stacked_flash.h the pieces
// of a large group's shared prefix that go through ATen's flash attention instead where the AMX one cannot.
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

#include "paged_work.h"
#include "stacked_flash.h"
#include "tile_amx.h"
#include "tile_bf16.h"
#include "tile_fp32.h"

namespace kvloop {
namespace {

// Work is counted in (token, KV head, member) triples: a stacked segment's token is read once but scored for
// every member, and the scoring, not the reading, is most of an item's time once the K/V sit in cache.
constexpr int64_t kMinWorkPerThread = 2048;  // about 50 us of work: below that, one thread
// Rows of a causal segment per item (paged_prefill): 64 rows of 3-query groups are 32 register blocks a tile.
constexpr int64_t kCausalRows = 64;

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
  for (int64_t s = 0; s < segs; ++s) {
    const int64_t members = rp[s + 1] - rp[s], n = tk[s];
    TORCH_CHECK(members >= 0 && n >= 0, "segment ", s, ": negative size");
    TORCH_CHECK(!causal || n >= members, "causal segment ", s, ": fewer tokens than query rows");
    const int64_t used = (n + sh.block_size - 1) / sh.block_size;
    TORCH_CHECK(bs[s] >= 0 && bs[s] + used <= blocks.numel(), "segment ", s, ": blocks out of range");
    for (int64_t j = 0; j < used; ++j)
      TORCH_CHECK(bl[bs[s] + j] >= 0 && bl[bs[s] + j] < num_blocks, "segment ", s, ": block id out of range");
  }
  // Each segment's tokens in pieces, each piece one partial result of every member: context splits (a causal
  // segment's whole context is one piece: its items are runs of rows instead, see below), and where stacked
  // flash applies, the long runs of adjacent blocks that go through it.
  // where the AMX tile routine serves stacked items it outruns flash at every group size measured (tile_amx.h); it
  // serves a causal segment's runs of rows too (a causal piece starts at token 0, on a block edge)
  const bool tiles = stacked_tiles_apply(q, k_cache, sh, split_tokens);
  const bool flash = !causal && per_row && stacked_flash_applies(q, k_cache) && !tiles;
  std::vector<int64_t> piece_ptr{0};
  std::vector<Piece> pieces;
  int64_t base_items = 0;         // pieces the kernel's items compute
  int64_t work = 0, largest = 0;  // the items' work, and the largest base item's (see kMinWorkPerThread)
  for (int64_t s = 0; s < segs; ++s) {
    const int64_t members = rp[s + 1] - rp[s];
    if (members > 0) {
      const size_t first = pieces.size();
      cut_pieces(bl + bs[s], tk[s], members, sh.block_size, causal ? 0 : split_tokens, flash, pieces);
      for (size_t i = first; i < pieces.size(); ++i) {
        if (pieces[i].flash) continue;
        const int64_t len = pieces[i].t1 - pieces[i].t0;
        base_items += 1;
        work += len * sh.kv_heads * members;
        largest = std::max(largest, len * sh.kv_heads * members);
      }
    }
    piece_ptr.push_back(static_cast<int64_t>(pieces.size()));
  }
  // An item reads all KV heads of its tokens (whole cache lines, in order) unless that leaves too few items
  // to keep every thread busy, or one item (a stacked segment's split) more than a thread's share of the work,
  // which the threads could not even out: then one KV head each. Either way the arithmetic is the same.
  const int64_t nt = at::get_num_threads();
  // Causal segments (prefill chunks: hundreds of stacked rows) are split by rows instead, one KV head an item:
  // no partial results to merge (a sizeable share of a chunk's time: docs/engine_history.md).
  const int64_t per_item = !causal && base_items >= 4 * nt && largest * nt <= work ? sh.kv_heads : 1;

  // Partial results per output: a pair's pieces, and per row those of every pair naming it.
  const int64_t outputs = per_row ? q.size(0) : pairs;
  std::vector<int64_t> parts(outputs, 0);
  for (int64_t s = 0; s < segs; ++s)
    for (int64_t p = rp[s]; p < rp[s + 1]; ++p)
      parts[per_row ? rw[p] : p] += piece_ptr[s + 1] - piece_ptr[s];
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

  // A flash piece's items (one per chunk of KV heads) sit side by side, piece by piece: one ATen call runs them all.
  std::vector<int64_t> flash_slot(pieces.size(), -1);
  int64_t n_flash = 0;
  for (size_t i = 0; i < pieces.size(); ++i)
    if (pieces[i].flash) flash_slot[i] = n_flash++;
  std::vector<Item> items, flash_items(n_flash * chunks);
  int64_t ws_size = 0, item_members = 1;  // the most members of an item (the scratch's size)
  for (int64_t s = 0; s < segs; ++s) {
    const int64_t members = rp[s + 1] - rp[s], n = tk[s];
    if (members == 0) continue;
    // a causal segment's rows in runs of at most kCausalRows, the last (most tokens) first
    const int64_t runs = causal ? (members + kCausalRows - 1) / kCausalRows : 1, run = (members + runs - 1) / runs;
    item_members = std::max(item_members, run);
    for (int64_t h = 0; h < sh.kv_heads; h += per_item) {
      for (int64_t i = piece_ptr[s]; i < piece_ptr[s + 1]; ++i) {
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
          const Item item{s, h, h + per_item, pieces[i].t0, pieces[i].t1, off, n, members, j0, j1};
          if (pieces[i].flash)
            flash_items[flash_slot[i] * chunks + h / per_item] = item;
          else
            items.push_back(item);
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
  // Flash pieces first: one ATen call each, every KV head at once, its results written as its items' would be.
  for (int64_t i = 0; i < n_flash; ++i)
    run_flash_piece(flash_items.data() + i * chunks, chunks, q, k_cache, v_cache, sh, bl, bs, rp, dest, scale, o, l,
                    w);
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
    auto stacked = item;  // an item of several members (a cascade group's shared prefix) or a causal one
#ifdef KVLOOP_AVX512BF16
    if constexpr (std::is_same_v<KV, c10::BFloat16>) {
      if (sh.d == 64) {
        stacked = run_item_bf16<64, true>;
        item = causal ? stacked : run_item_bf16<64, false>;
      }
      if (sh.d == 128) {
        stacked = run_item_bf16<128, true>;
        item = causal ? stacked : run_item_bf16<128, false>;
      }
#ifdef KVLOOP_AMX
      if (tiles) stacked = run_item_amx;
#endif
    }
#endif
#pragma omp parallel num_threads(threads)
    {
      Scratch scratch(item_members * per_item * sh.group, per_item, sh.d);
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < n_items; ++i)
        (items[i].j1 - items[i].j0 > 1 ? stacked : item)(items[i], q, k, v, sh, bl, bs, rp, dest, sc, o, l, w, scratch);
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

// Whether bf16 K/V take the blocked routine (tile_bf16.h): what the backend routes and prices by.
bool blocked_bf16() {
#ifdef KVLOOP_AVX512BF16
  return true;
#else
  return false;
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
  m.def(
      "decode_layer(Tensor q, Tensor k, Tensor v, Tensor(a!) kv_cache, int layer, Tensor slots, Tensor blocks, "
      "Tensor block_start, Tensor tokens, Tensor rows_ptr, Tensor rows, float scale, int split_tokens) -> Tensor");
  m.def(
      "bind_decode_step(Tensor kv_cache, Tensor slots, Tensor blocks, Tensor block_start, Tensor tokens, "
      "Tensor rows_ptr, Tensor rows, float scale, int split_tokens) -> ()",
      &kvloop::bind_decode_step);
  m.def("unbind_decode_step() -> ()", &kvloop::unbind_decode_step);
  m.def("simd() -> str", &kvloop::simd);
  m.def("blocked_bf16() -> bool", &kvloop::blocked_bf16);
  m.def("set_stacked_flash(bool on) -> bool", &kvloop::set_stacked_flash);
  m.def("set_stacked_tiles(bool on) -> bool", &kvloop::set_stacked_tiles);
  m.def("stacked_tiles() -> bool", [] { return kvloop::stacked_tiles_on.load(); });
  m.def("stacked_tiles_shape(int head_dim, int block_size, int split_tokens) -> bool", &kvloop::stacked_tiles_shape);
}

TORCH_LIBRARY_IMPL(kvloop_cpu, CPU, m) {
  m.impl("paged_attention", &kvloop::paged_attention);
  m.impl("paged_decode", &kvloop::paged_decode);
  m.impl("paged_prefill", &kvloop::paged_prefill);
  m.impl("decode_layer", &kvloop::decode_layer);
}

// The operator is defined from Python (runner/compiled_step.py); an implementation may be registered before its
// definition, so either may be loaded first.
TORCH_LIBRARY_IMPL(kvloop_step, CPU, m) { m.impl("attention", &kvloop::step_attention); }
