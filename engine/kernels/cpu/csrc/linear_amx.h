// linear_bf16w.cpp's path for bf16 activations on CPUs with AMX tiles: y[M, N] (bf16) = x[M, K] (bf16) @ W^T
// (+ bias), W in linear_bf16w's packed layout ([N/16 blocks][K][16] bf16, slots in SLOT_OF_COL order), K even.
//
// Why: a decode step's linears read every weight once and multiply it by a few rows. The bf16 pairs
// (linear_dpbf16.h) spend one instruction per row per 16 columns and 2 k's, so past a few rows they are bound by
// arithmetic, and oneDNN's GEMM (which the layer took past 6 rows) reads the weights below the memory's pace.
// One tile product (TDPBF16PS) multiplies 16 rows by 16 columns over 32 k's: with it the reads set the pace at
// every decode-sized row count (measured: docs/engine_history.md).
//
// The packed layout holds a block's 16 weights of k and of k + 1 adjacently (64 bytes); one 16-bit permute puts
// them in the tile's pair order (column c's (k, k + 1) in word c), so each 32-k step of a block is 16 loads and
// permutes into a 1 KiB buffer, then one tile load. x's rows are loaded as they are (up to 16 rows a tile);
// a row count that leaves a partial tile after the first, or a K that is not a multiple of 32, goes through a
// zero-padded copy of x. Every output is the tile unit's fp32 sums over k in chunks of 32 in order, plus the
// fp32 bias, rounded once to bf16: what a row gets does not depend on the other rows, their count, or the thread
// count (threads split columns), so a row's result is the same in any batch.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstdint>

#include "amx_state.h"
#include "linear_dpbf16.h"  // pair_order: the permute from the packed (k, k + 1) to pair order, the tile's too

namespace kvloop::linear_amx {

#ifdef KVLOOP_AMX
constexpr int64_t kTileRows = 16;  // rows of x per tile
constexpr int64_t kTileK = 32;     // k's per tile product (16 pairs)
constexpr int64_t kMaxRowTiles = 4;  // rows per pass over the weights: 64; more rows take further passes
constexpr int kCTiles = 6;         // accumulator tiles 0-5; x's tile is 6, the weights' 7

// Block wb's k's [k0, k0 + 32) as a tile of 16 pairs x 16 columns; pairs at or past K (a last partial step) are 0.
inline void weight_tile(const uint16_t* wb, int64_t k0, int64_t K, __m512i order, uint32_t* buf) {
  const uint16_t* src = wb + k0 * 16;
  if (K - k0 >= kTileK) {
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r)
      _mm512_store_si512(buf + r * 16, _mm512_permutexvar_epi16(order, _mm512_loadu_si512(src + r * 32)));
    return;
  }
  const int64_t pairs = (K - k0) / 2;
  for (int64_t r = 0; r < 16; ++r)
    _mm512_store_si512(buf + r * 16, r < pairs ? _mm512_permutexvar_epi16(order, _mm512_loadu_si512(src + r * 32))
                                               : _mm512_setzero_si512());
}

// Tile numbers must be constants: a switch per call (each case one instruction; the tile product takes 16 cycles).
inline void zero_acc(int c) {
  switch (c) {
    case 0: _tile_zero(0); break;
    case 1: _tile_zero(1); break;
    case 2: _tile_zero(2); break;
    case 3: _tile_zero(3); break;
    case 4: _tile_zero(4); break;
    default: _tile_zero(5); break;
  }
}
inline void multiply_into(int c) {
  switch (c) {
    case 0: _tile_dpbf16ps(0, 6, 7); break;
    case 1: _tile_dpbf16ps(1, 6, 7); break;
    case 2: _tile_dpbf16ps(2, 6, 7); break;
    case 3: _tile_dpbf16ps(3, 6, 7); break;
    case 4: _tile_dpbf16ps(4, 6, 7); break;
    default: _tile_dpbf16ps(5, 6, 7); break;
  }
}
inline void store_acc(int c, float* dst) {
  switch (c) {
    case 0: _tile_stored(0, dst, 64); break;
    case 1: _tile_stored(1, dst, 64); break;
    case 2: _tile_stored(2, dst, 64); break;
    case 3: _tile_stored(3, dst, 64); break;
    case 4: _tile_stored(4, dst, 64); break;
    default: _tile_stored(5, dst, 64); break;
  }
}

// The accumulated rows of one block plus the bias, rounded to bf16, into y (columns clipped to `cols`).
inline void write_rows(const float* acc, int64_t rows, uint16_t* y, int64_t ldy, const float* bias, int64_t cols) {
  const __mmask16 live = static_cast<__mmask16>(cols >= 16 ? 0xffff : (1u << cols) - 1);
  const __m512 bv = bias ? _mm512_maskz_loadu_ps(live, bias) : _mm512_setzero_ps();
  for (int64_t m = 0; m < rows; ++m) {
    const __m256bh out = _mm512_cvtneps_pbh(_mm512_add_ps(_mm512_load_ps(acc + m * 16), bv));
    _mm256_mask_storeu_epi16(y + m * ldy, live, (__m256i)out);
  }
}

// One thread's blocks [b0, b1) for rows [0, rows) of x (ldx elements apart, k's padded to kx, a multiple of 32):
// row tiles of tile_rows (all but a lone tile are 16), `per` blocks at a time, each (row tile, block) pair one
// accumulator tile; a block's weight tile is made once per 32-k step for every row tile.
inline void run_blocks(const uint16_t* x, int64_t ldx, int64_t kx, int64_t rows, int64_t tile_rows, int64_t K,
                       const uint16_t* w, int64_t n, const float* bias, uint16_t* y, int64_t b0, int64_t b1,
                       __m512i order) {
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int per = static_cast<int>(std::min<int64_t>(4, kCTiles / row_tiles));
  TileConfig cfg;
  for (int t = 0; t < 7; ++t) cfg.rows[t] = static_cast<uint8_t>(tile_rows), cfg.colsb[t] = 64;
  cfg.rows[7] = 16, cfg.colsb[7] = 64;
  _tile_loadconfig(&cfg);
  alignas(64) uint32_t wt[16 * 16];
  alignas(64) float acc[16 * 16];
  for (int64_t g = b0; g < b1; g += per) {
    const int nb = static_cast<int>(std::min<int64_t>(per, b1 - g));
    for (int c = 0; c < nb * row_tiles; ++c) zero_acc(c);
    for (int64_t k0 = 0; k0 < kx; k0 += kTileK) {
      if (row_tiles == 1) _tile_loadd(6, x + k0, ldx * 2);  // one row tile: x's tile once for every block
      for (int j = 0; j < nb; ++j) {
        weight_tile(w + (g + j) * K * 16, k0, K, order, wt);
        _tile_loadd(7, wt, 64);
        for (int64_t r = 0; r < row_tiles; ++r) {
          if (row_tiles > 1) _tile_loadd(6, x + r * kTileRows * ldx + k0, ldx * 2);
          multiply_into(static_cast<int>(r) * nb + j);
        }
      }
    }
    for (int j = 0; j < nb; ++j) {
      const int64_t col = (g + j) * 16;
      for (int64_t r = 0; r < row_tiles; ++r) {
        store_acc(static_cast<int>(r) * nb + j, acc);
        const int64_t live_rows = std::min<int64_t>(tile_rows, rows - r * kTileRows);
        write_rows(acc, live_rows, y + r * kTileRows * n + col, n, bias ? bias + col : nullptr, n - col);
      }
    }
  }
  _tile_release();
}

// x: [M, K] bf16 contiguous, K even; w: packed [blocks, K, 16] bf16; bias: [n] fp32 or null; y: [M, n] bf16.
// The process must hold the tile state (torch.cpu._init_amx(), kernels/cpu/amx.py).
inline void linear(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, int64_t blocks, int64_t n,
                   const float* bias, uint16_t* y, const int* slot_of_col) {
  const __m512i order = linear_dpbf16::pair_order(slot_of_col);
  const int64_t kx = (K + kTileK - 1) / kTileK * kTileK;
  // a lone tile of up to 16 rows loads x as it is (its tile has that many rows) where K fills whole steps
  at::Tensor padded;
  const uint16_t* xs = x;
  int64_t ldx = K;
  if (kx != K || M > kTileRows) {
    const int64_t mp = M <= kTileRows ? M : (M + kTileRows - 1) / kTileRows * kTileRows;
    if (kx != K || mp != M) {
      padded = at::zeros({mp, kx}, at::kBFloat16);
      uint16_t* dst = reinterpret_cast<uint16_t*>(padded.data_ptr());
      for (int64_t m = 0; m < M; ++m) std::copy(x + m * K, x + (m + 1) * K, dst + m * kx);
      xs = dst, ldx = kx;
    }
  }
  const int64_t tile_rows = std::min(M, kTileRows), pass = kMaxRowTiles * kTileRows;
  at::parallel_for(0, blocks, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t r0 = 0; r0 < M; r0 += pass)
      run_blocks(xs + r0 * ldx, ldx, kx, std::min(pass, M - r0), tile_rows, K, w, n, bias, y + r0 * n, b0, b1,
                 order);
  });
}
#endif

}  // namespace kvloop::linear_amx
