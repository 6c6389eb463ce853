// linear_bf16w.cpp's path for bf16 activations on CPUs with AVX512-BF16: y[M, N] (bf16) = x[M, K] (bf16) @ W^T
// (+ bias), W in linear_bf16w's packed layout ([N/16 blocks][K][16] bf16, slots in SLOT_OF_COL order).
//
// Why: the fp32 tiles (linear_tiles.h) widen every weight and spend two 8-lane FMAs per 16 products, so past a
// few rows they are bound by arithmetic, and oneDNN's bf16 GEMM overtakes them at 8-12 rows
// (docs/engine_history.md). One vdpbf16ps multiplies 16 pairs of bf16 into 16 fp32 sums:
// half the instructions per product, no widening. A bf16 model's activations are bf16 already, so nothing is
// rounded that was not rounded before; products of two bf16 are exact in fp32 and the sums stay fp32.
//
// A block's 16 weights of k and of k + 1 are adjacent (64 bytes): one load and one 16-bit permute put them in
// vdpbf16ps's pair order (column c's (k, k + 1) in lane c), undoing SLOT_OF_COL on the way. Each output is one
// chain over the k pairs in order, started at 0, then the fp32 bias, then rounded to bf16 (nearest even): the
// same operations whatever M, the row's tile or the thread count, so a row's result does not depend on its
// batch. K must be even (the pairs); the operator falls back to the fp32 tiles otherwise.
#pragma once

#include "linear_tiles.h"
#include "simd512.h"

namespace kvloop::linear_dpbf16 {

#ifdef KVLOOP_AVX512BF16
using linear_tiles::BLOCK;

constexpr int MAX_ROWS = 8;       // rows of x per register tile
constexpr int MAX_ACC = 24;       // accumulators per tile (of 32 zmm: the rest hold weights and a broadcast)
constexpr int MAX_BLOCKS = 8;     // blocks per tile for one row: 8 chains to hide vdpbf16ps's latency

constexpr int blocks_for_rows(int rows) { return std::max(1, std::min(MAX_BLOCKS, MAX_ACC / rows)); }

// Word 2c of the result is k's column c, word 2c + 1 is k + 1's: the load holds k's 16 slots, then k + 1's.
inline __m512i pair_order(const int* slot_of_col) {
  alignas(64) int16_t idx[32];
  for (int c = 0; c < 16; ++c) {
    idx[2 * c] = static_cast<int16_t>(slot_of_col[c]);
    idx[2 * c + 1] = static_cast<int16_t>(16 + slot_of_col[c]);
  }
  return _mm512_load_si512(idx);
}

// MR rows x NB blocks over the whole K (even); accumulators in registers; bf16 results clipped to `cols`.
template <int MR, int NB>
void tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t K, uint16_t* y, int64_t ldy,
          const float* bias, int64_t cols, __m512i order) {
  __m512 acc[MR][NB];
  for (int m = 0; m < MR; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_setzero_ps();
  const int64_t block_stride = K * BLOCK;
  for (int64_t k = 0; k < K; k += 2) {
    __m512bh wv[NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b)
      wv[b] = (__m512bh)_mm512_permutexvar_epi16(order, _mm512_loadu_si512(w + b * block_stride + k * BLOCK));
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * ldx + k, sizeof pair);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 8
      for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], wv[b], xv);
    }
  }
#pragma GCC unroll 8
  for (int b = 0; b < NB; ++b) {
    const int64_t c = std::min<int64_t>(BLOCK, cols - b * BLOCK);
    if (c <= 0) break;
    const __mmask16 live = static_cast<__mmask16>((1u << c) - 1);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(live, bias + b * BLOCK) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m256bh out = _mm512_cvtneps_pbh(bias ? _mm512_add_ps(acc[m][b], bv) : acc[m][b]);
      _mm256_mask_storeu_epi16(y + m * ldy + b * BLOCK, live, (__m256i)out);
    }
  }
}

using TileFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, uint16_t*, int64_t, const float*, int64_t,
                        __m512i);

// Only the shapes within the registers are instantiated; a larger count maps to a valid shape to compile.
template <int MR>
TileFn tile_for_blocks(int nb) {
  constexpr int top = blocks_for_rows(MR);
  switch (nb) {
    case 1: return tile<MR, 1>;
    case 2: return tile<MR, (top >= 2 ? 2 : 1)>;
    case 3: return tile<MR, (top >= 3 ? 3 : 1)>;
    case 4: return tile<MR, (top >= 4 ? 4 : 1)>;
    case 5: return tile<MR, (top >= 5 ? 5 : 1)>;
    case 6: return tile<MR, (top >= 6 ? 6 : 1)>;
    case 7: return tile<MR, (top >= 7 ? 7 : 1)>;
    default: return tile<MR, top>;
  }
}

inline TileFn tile_kernel(int rows, int nb) {
  switch (rows) {
    case 1: return tile_for_blocks<1>(nb);
    case 2: return tile_for_blocks<2>(nb);
    case 3: return tile_for_blocks<3>(nb);
    case 4: return tile_for_blocks<4>(nb);
    case 5: return tile_for_blocks<5>(nb);
    case 6: return tile_for_blocks<6>(nb);
    case 7: return tile_for_blocks<7>(nb);
    default: return tile_for_blocks<8>(nb);
  }
}

// One thread's blocks [b0, b1) for all M rows. Rows go in chunks that keep x in L2; within a chunk each group
// of blocks is read from memory once and reused from cache by every row tile. Rows split into equal tiles
// (12 rows: 6 + 6, not 8 + 4), so that every tile keeps as many chains as it can.
inline void run_blocks(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, int64_t N, const float* bias,
                       uint16_t* y, int64_t b0, int64_t b1, __m512i order) {
  const int64_t chunk_rows = std::max<int64_t>(MAX_ROWS, (512 * 1024 / (2 * K)) / MAX_ROWS * MAX_ROWS);
  for (int64_t r0 = 0; r0 < M; r0 += chunk_rows) {
    const int64_t r1 = std::min(M, r0 + chunk_rows);
    const int64_t tiles = (r1 - r0 + MAX_ROWS - 1) / MAX_ROWS;
    const int64_t per_tile = (r1 - r0 + tiles - 1) / tiles;
    const int group = blocks_for_rows(static_cast<int>(per_tile));
    for (int64_t g = b0; g < b1; g += group) {
      const int nb = static_cast<int>(std::min<int64_t>(group, b1 - g));
      for (int64_t r = r0; r < r1; r += per_tile) {
        const int rows = static_cast<int>(std::min<int64_t>(per_tile, r1 - r));
        tile_kernel(rows, nb)(x + r * K, K, w + g * K * BLOCK, K, y + r * N + g * BLOCK, N,
                              bias ? bias + g * BLOCK : nullptr, N - g * BLOCK, order);
      }
    }
  }
}

// x: [M, K] bf16 contiguous, K even; w: packed [blocks, K, 16] bf16; bias: [n] fp32 or null; y: [M, n] bf16.
inline void linear(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, int64_t blocks, int64_t n,
                   const float* bias, uint16_t* y, const int* slot_of_col) {
  const __m512i order = pair_order(slot_of_col);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) { run_blocks(x, M, K, w, n, bias, y, b0, b1, order); });
}
#endif

}  // namespace kvloop::linear_dpbf16
