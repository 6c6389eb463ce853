// The register-tiled linear kernel of linear_bf16w.cpp, generic over the narrow weight type (linear_int8w.cpp
// multiplies int8 by int8 in loops of its own):
// y[M, N] = epilogue(x[M, K] (fp32) @ W[N, K]^T), W packed as [N/16 blocks][K][16] of a narrow weight type
// (N padded with zero rows), fp32 arithmetic throughout.
//
// A kernel supplies its weight Format, a struct with
//   Weight                          the packed element type
//   kDtype, kDtypeName, kName       the packed tensor's ATen dtype, that dtype in messages, the operator's name
//   widen16(p, lo, hi)   (AVX2)     one k's 16 weights of a block (at p) as fp32: columns 0-7 and 8-15
//   widen1(p, col)                  column `col` of the 16 weights at p as fp32 (the scalar fallback)
// and everything else is here: tiles of up to 6 rows x 4 blocks over the whole K with the accumulators in
// registers, the walk over rows and blocks, the thread split over blocks, and the operator's argument checks.
//
// Every output is one fp32 FMA chain over k = 0..K-1 in order, started at 0, then the Epilogue (times its
// scale, plus its bias): the same operations whatever M, the row's place in a tile, or the thread count
// (threads split columns, never K). So a row's result does not depend on the batch it is in, and the scalar
// fallback (std::fma in the same order) gives the same sums as the AVX2 path. (Where the compiler targets
// FMA it fuses the epilogue's `sum * scale + bias` into one rounding, so a scaled output with a bias may
// differ in its last bits between an AVX2 build and a scalar one; within a build every row is the same.)
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "linear_operands.h"
#include "simd.h"  // KVLOOP_AVX2 (AVX2 + FMA targeted), intrinsics

namespace kvloop::linear_tiles {

constexpr int64_t BLOCK = 16;  // output columns per packed block (two AVX2 registers)
constexpr int MAX_ROWS = 6;    // rows of x per register tile: 6 rows x 16 columns = 12 accumulators
constexpr int MAX_BLOCKS = 4;  // blocks per tile for one row: 4 x 16 columns = 8 independent FMA chains

// What becomes of an output's fp32 sum: times its scale, then plus its bias (either may be absent). The
// pointers index output columns; `at` moves them on to a later column.
struct Epilogue {
  const float* scale;
  const float* bias;

  Epilogue at(int64_t col) const { return {scale ? scale + col : nullptr, bias ? bias + col : nullptr}; }

  float operator()(float sum, int64_t c) const {
    const float v = scale ? sum * scale[c] : sum;
    return bias ? v + bias[c] : v;
  }
};

// Stores a tile's 16-column row through the epilogue into y, clipped to the `cols` valid columns. Not
// vectorised on purpose: one code path for every row keeps the epilogue's rounding the same.
inline void store_row(float* y, const float* acc16, const Epilogue& out, int64_t cols) {
  for (int64_t c = 0; c < cols; ++c) y[c] = out(acc16[c], c);
}

#ifdef KVLOOP_AVX2
// MR rows x NB blocks of output over the whole K; accumulators live in registers.
template <class F, int MR, int NB>
void tile(const float* x, int64_t ldx, const typename F::Weight* w, int64_t K, float* y, int64_t ldy,
          Epilogue out, int64_t cols) {
  __m256 acc[MR][NB][2];
  for (int m = 0; m < MR; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b][0] = acc[m][b][1] = _mm256_setzero_ps();
  const int64_t block_stride = K * BLOCK;
  for (int64_t k = 0; k < K; ++k) {
    __m256 lo[NB], hi[NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) F::widen16(w + b * block_stride + k * BLOCK, lo[b], hi[b]);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m256 xv = _mm256_broadcast_ss(x + m * ldx + k);
#pragma GCC unroll 8
      for (int b = 0; b < NB; ++b) {
        acc[m][b][0] = _mm256_fmadd_ps(xv, lo[b], acc[m][b][0]);
        acc[m][b][1] = _mm256_fmadd_ps(xv, hi[b], acc[m][b][1]);
      }
    }
  }
  // Spill the tile once through constant-index stores (fully unrolled, so the accumulators stay in
  // registers inside the k loop), then copy out the valid columns through the epilogue.
  alignas(32) float buf[MR][NB * BLOCK];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) {
      _mm256_store_ps(&buf[m][b * BLOCK], acc[m][b][0]);
      _mm256_store_ps(&buf[m][b * BLOCK + 8], acc[m][b][1]);
    }
  const int64_t c = std::min<int64_t>(NB * BLOCK, cols);
  for (int m = 0; m < MR; ++m) store_row(y + m * ldy, buf[m], out, c);
}
#else
// Portable fallback: the same per-output FMA chain, so the same bits as the AVX2 path.
template <class F, int MR, int NB>
void tile(const float* x, int64_t ldx, const typename F::Weight* w, int64_t K, float* y, int64_t ldy,
          Epilogue out, int64_t cols) {
  for (int m = 0; m < MR; ++m)
    for (int b = 0; b < NB; ++b) {
      const int64_t c = std::min<int64_t>(BLOCK, cols - b * BLOCK);
      if (c <= 0) break;
      float acc[BLOCK] = {};
      const typename F::Weight* wb = w + b * K * BLOCK;
      for (int64_t k = 0; k < K; ++k) {
        const float xv = x[m * ldx + k];
        for (int j = 0; j < BLOCK; ++j) acc[j] = std::fma(xv, F::widen1(wb + k * BLOCK, j), acc[j]);
      }
      store_row(y + m * ldy + b * BLOCK, acc, out.at(b * BLOCK), c);
    }
}
#endif

template <class F>
using TileFn = void (*)(const float*, int64_t, const typename F::Weight*, int64_t, float*, int64_t, Epilogue,
                        int64_t);

// Blocks per tile for `rows` rows: as many as keep the accumulators within the 16 AVX2 registers.
constexpr int blocks_for_rows(int rows) { return std::max(1, std::min(MAX_BLOCKS, MAX_ROWS / rows)); }

// Instantiates only the shapes that fit the registers: a count above blocks_for_rows(MR) never arrives, and
// its case maps to a valid shape just so that it compiles.
template <class F, int MR>
TileFn<F> tile_for_blocks(int nb) {
  switch (nb) {
    case 1: return tile<F, MR, 1>;
    case 2: return tile<F, MR, (blocks_for_rows(MR) >= 2 ? 2 : 1)>;
    case 3: return tile<F, MR, (blocks_for_rows(MR) >= 3 ? 3 : 1)>;
    default: return tile<F, MR, blocks_for_rows(MR)>;
  }
}

// The tile kernel for `rows` x `nb` blocks; nb never exceeds blocks_for_rows(rows).
template <class F>
TileFn<F> tile_kernel(int rows, int nb) {
  switch (rows) {
    case 1: return tile_for_blocks<F, 1>(nb);
    case 2: return tile_for_blocks<F, 2>(nb);
    case 3: return tile_for_blocks<F, 3>(nb);
    case 4: return tile_for_blocks<F, 4>(nb);
    case 5: return tile_for_blocks<F, 5>(nb);
    default: return tile_for_blocks<F, 6>(nb);
  }
}

// One thread's share: columns of blocks [b0, b1) for all M rows. Rows go in chunks that keep x in L2
// (weights are re-read once per chunk: only for large M, where the arithmetic dominates anyway); within
// a chunk, each group of blocks is reused from cache by every row tile.
template <class F>
void run_blocks(const float* x, int64_t M, int64_t K, const typename F::Weight* w, int64_t N, const Epilogue& out,
                float* y, int64_t b0, int64_t b1) {
  const int64_t chunk_rows = std::max<int64_t>(MAX_ROWS, (256 * 1024 / (4 * K)) / MAX_ROWS * MAX_ROWS);
  for (int64_t r0 = 0; r0 < M; r0 += chunk_rows) {
    const int64_t r1 = std::min(M, r0 + chunk_rows);
    for (int64_t g = b0; g < b1; g += MAX_BLOCKS) {
      const int64_t g1 = std::min(b1, g + MAX_BLOCKS);
      for (int64_t r = r0; r < r1; r += MAX_ROWS) {
        const int rows = static_cast<int>(std::min<int64_t>(MAX_ROWS, r1 - r));
        const int per_tile = blocks_for_rows(rows);
        for (int64_t b = g; b < g1; b += per_tile) {
          const int nb = static_cast<int>(std::min<int64_t>(per_tile, g1 - b));
          tile_kernel<F>(rows, nb)(x + r * K, K, w + b * K * BLOCK, K, y + r * N + b * BLOCK, N, out.at(b * BLOCK),
                                   N - b * BLOCK);
        }
      }
    }
  }
}

// The packed weight against a 2-D x (whose dtype the caller checked) and n, for operator `name`.
inline void check_packed(const at::Tensor& x, const at::Tensor& packed, int64_t n, at::ScalarType dtype,
                         const char* dtype_name, const char* name) {
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == dtype && packed.size(2) == BLOCK,
              "packed must be a [N/16, K, 16] ", dtype_name, " tensor");
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), name, " is a CPU kernel");
  const int64_t K = x.size(1), blocks = packed.size(0);
  TORCH_CHECK(packed.size(1) == K, "x has ", K, " features, the weight ", packed.size(1));
  TORCH_CHECK(n > (blocks - 1) * BLOCK && n <= blocks * BLOCK, "n=", n, " does not match ", blocks, " blocks");
}

// The operator. x: [M, K] fp32; packed: [ceil(N/16), K, 16] of F's dtype; scale: [N] (any float dtype), or
// an undefined tensor for none; bias: [N] or None. Returns [M, N] fp32.
template <class F>
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale, int64_t n,
                  const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be a 2-D float32 tensor");
  check_packed(x, packed, n, F::kDtype, F::kDtypeName, F::kName);
  const int64_t M = x.size(0), K = x.size(1), blocks = packed.size(0);
  const auto o = linear_operands::prepare(x, packed, scale, n, bias);
  if (o.done) return o.y;
  const float* xp = o.x.data_ptr<float>();
  const auto* wp = static_cast<const typename F::Weight*>(o.w.data_ptr());
  const Epilogue out{o.scale.defined() ? o.scale.data_ptr<float>() : nullptr,
                     o.bias.defined() ? o.bias.data_ptr<float>() : nullptr};
  float* yp = o.y.data_ptr<float>();
  // Threads take contiguous ranges of blocks (at::parallel_for splits evenly over torch's thread count).
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) { run_blocks<F>(xp, M, K, wp, n, out, yp, b0, b1); });
  return o.y;
}

}  // namespace kvloop::linear_tiles
