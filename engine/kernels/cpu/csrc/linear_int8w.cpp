// y[M, N] = (x[M, K] @ Q[N, K]^T) * scale[N] + bias: weight-only int8 (one symmetric fp32 scale per output
// channel) computed the way llama.cpp's Q8_0 dot product is: each row of x is quantized to int8 in blocks of
// QK = 32 k's (symmetric, one fp32 scale per block), each block's x.Q dot product is exact int32 arithmetic,
// and the fp32 part is one FMA per block, (block's int32 sum) * (x's block scale), then the weight's scale.
// Small-batch decode is bound by the bytes of weights it reads (a quarter of fp32's); int8 x int8 products
// keep the arithmetic well below that, where widening the weights to fp32 did not (docs/engine_history.md).
//
// Weight layout (made by kernels/cpu/linear_int8w.py `pack`): [ceil(N/4) groups][K/32 blocks][4][32] int8,
// N padded with zero rows: for one block, a group's 4 output channels are 4 consecutive 32-byte loads, and
// the whole matrix is read front to back. K must be a multiple of 32 (the operator refuses others).
//
// Exactness. For one output, lane l (0-7) of a block holds the int32 sum of the 4 products at k = 4l..4l+3
// (exact: |x_q|, |w| <= 127, `quantize` never gives -128, so no int16 pair sum saturates). Per lane, over the
// blocks in order: acc_l = fma(float(sum_l), x_scale_b, acc_l) (float(sum_l) is exact). Then the fixed tree
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), times the weight's scale, plus the bias as one fma. Every output
// takes these steps whatever M, its place in a tile or the thread count (threads split output groups, never
// K), so a row's result does not depend on the batch it is in; the portable path (linear_int8w_scalar, also
// the whole kernel where AVX2 is not targeted) takes the same steps with explicit std::fma, so it gives the
// same bits. No fp32 expression here is a separate multiply and add that a compiler could contract.
// Quantizing x: amax = max |x| over the block, scale = amax / 127, q = nearbyint(x * (127 / amax)) (ties to
// even; q = 0 where amax is 0). Inputs are expected to be finite.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "linear_operands.h"
#include "simd.h"  // KVLOOP_AVX2 (AVX2 + FMA targeted), intrinsics

namespace {

constexpr int64_t QK = 32;   // k's per block: one activation scale each, one AVX2 register of int8
constexpr int64_t COLS = 4;  // output channels per packed group
constexpr int LANES = 8;     // partial sums per output: an AVX2 register of int32 / fp32
constexpr int MAX_ROWS = 2;  // rows of x per tile: 2 x 4 accumulators, the weights loaded once for both
// Weights are read this many bytes ahead (8 blocks of a group): the hardware prefetcher stops at 4 KiB pages,
// and at batch 1 the kernel is bound by streaming them (measured ~10-20% faster at 1-2 KiB, one thread).
constexpr int64_t PREFETCH_BYTES = 1024;

// Rows of x quantized per block: q [M][K] int8, aq = |q| (the unsigned operand of the int8 product), scale
// [M][K/32] fp32.
struct QuantizedX {
  int8_t* q;
  uint8_t* aq;
  float* scale;
  int64_t K;

  const int8_t* q_at(int64_t row, int64_t block) const { return q + row * K + block * QK; }
  const uint8_t* aq_at(int64_t row, int64_t block) const { return aq + row * K + block * QK; }
  float scale_at(int64_t row, int64_t block) const { return scale[row * (K / QK) + block]; }
};

// ---- quantizing a block of x ------------------------------------------------------------------------------

// amax < a ? a : amax keeps amax when a is NaN, as _mm256_max_ps(a, amax) does.
inline float block_amax_scalar(const float* x) {
  float amax = 0.f;
  for (int64_t i = 0; i < QK; ++i) {
    const float a = std::fabs(x[i]);
    amax = amax < a ? a : amax;
  }
  return amax;
}

inline void quantize_block_scalar(const float* x, int8_t* q, uint8_t* aq, float* scale) {
  const float amax = block_amax_scalar(x);
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  *scale = amax / 127.f;
  for (int64_t i = 0; i < QK; ++i) {
    const int v = static_cast<int>(std::nearbyint(x[i] * inv));
    q[i] = static_cast<int8_t>(v);
    aq[i] = static_cast<uint8_t>(v < 0 ? -v : v);
  }
}

#ifdef KVLOOP_AVX2
inline void quantize_block_avx2(const float* x, int8_t* q, uint8_t* aq, float* scale) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax = _mm256_max_ps(_mm256_and_ps(v[i], abs_mask), amax);
  }
  // max is exact and, without NaNs, order-free: any reduction gives the scalar loop's value
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float a = _mm_cvtss_f32(m);
  const float inv = a > 0.f ? 127.f / a : 0.f;
  *scale = a / 127.f;
  const __m256 vinv = _mm256_set1_ps(inv);
  __m256i n[4];
  for (int i = 0; i < 4; ++i)
    n[i] = _mm256_cvtps_epi32(
        _mm256_round_ps(_mm256_mul_ps(v[i], vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  // int32 -> int8 (in [-127, 127], no saturation); the packs interleave 128-bit lanes, the permute restores order
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
  const __m256i qv = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), qv);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(aq), _mm256_abs_epi8(qv));
}
#endif

template <bool Portable>
void quantize_row(const float* x, int64_t K, int8_t* q, uint8_t* aq, float* scale) {
  for (int64_t b = 0; b < K / QK; ++b) {
#ifdef KVLOOP_AVX2
    if (!Portable) {
      quantize_block_avx2(x + b * QK, q + b * QK, aq + b * QK, scale + b);
      continue;
    }
#endif
    quantize_block_scalar(x + b * QK, q + b * QK, aq + b * QK, scale + b);
  }
}

// ---- the dot products -------------------------------------------------------------------------------------

// An output: its 8 lane sums reduced by the fixed tree, times the weight's scale, plus the bias (one fma).
inline float finish(const float lane[LANES], float scale, const float* bias) {
  const float t0 = lane[0] + lane[4], t1 = lane[1] + lane[5], t2 = lane[2] + lane[6], t3 = lane[3] + lane[7];
  const float sum = (t0 + t2) + (t1 + t3);
  return bias ? std::fma(sum, scale, *bias) : sum * scale;
}

// Where a tile's outputs go: y's row 0 at `y` (row stride ldy), the group's channels from `col` on, `cols`
// of them valid.
struct Out {
  float* y;
  int64_t ldy;
  const float* scale;
  const float* bias;
  int64_t col;
  int64_t cols;

  void store(int r, int c, const float lane[LANES]) const {
    if (c < cols) y[r * ldy + col + c] = finish(lane, scale[col + c], bias ? bias + col + c : nullptr);
  }
};

// MR rows (from row0) x one group's 4 channels over all K/32 blocks. w: the group's packed weights.
template <int MR>
void tile_scalar(const QuantizedX& xq, int64_t row0, const int8_t* w, const Out& out) {
  float acc[MR][COLS][LANES] = {};
  const int64_t blocks = xq.K / QK;
  for (int64_t b = 0; b < blocks; ++b) {
    const int8_t* wb = w + b * COLS * QK;
    for (int r = 0; r < MR; ++r) {
      const int8_t* q = xq.q_at(row0 + r, b);
      const float s = xq.scale_at(row0 + r, b);
      for (int c = 0; c < COLS; ++c)
        for (int l = 0; l < LANES; ++l) {
          int32_t sum = 0;
          for (int j = 4 * l; j < 4 * l + 4; ++j) sum += int32_t{q[j]} * int32_t{wb[c * QK + j]};
          acc[r][c][l] = std::fma(static_cast<float>(sum), s, acc[r][c][l]);
        }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < COLS; ++c) out.store(r, c, acc[r][c]);
}

#ifdef KVLOOP_AVX2
template <int MR>
void tile_avx2(const QuantizedX& xq, int64_t row0, const int8_t* w, const Out& out) {
  __m256 acc[MR][COLS];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < COLS; ++c) acc[r][c] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t blocks = xq.K / QK;
  for (int64_t b = 0; b < blocks; ++b) {
    const int8_t* wb = w + b * COLS * QK;
    _mm_prefetch(reinterpret_cast<const char*>(wb + PREFETCH_BYTES), _MM_HINT_T0);  // a block is two lines
    _mm_prefetch(reinterpret_cast<const char*>(wb + PREFETCH_BYTES + 64), _MM_HINT_T0);
    __m256i wv[COLS];
#pragma GCC unroll 4
    for (int c = 0; c < COLS; ++c) wv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + c * QK));
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q_at(row0 + r, b)));
      const __m256i aq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.aq_at(row0 + r, b)));
      const __m256 s = _mm256_set1_ps(xq.scale_at(row0 + r, b));
#pragma GCC unroll 4
      for (int c = 0; c < COLS; ++c) {
        // |x| * (w with x's sign) = x * w; pairs summed to int16, then fours to int32 (lane l: k = 4l..4l+3)
        const __m256i pairs = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(wv[c], q));
        const __m256i fours = _mm256_madd_epi16(pairs, ones);
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fours), s, acc[r][c]);
      }
    }
  }
  alignas(32) float lane[LANES];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < COLS; ++c) {
      _mm256_store_ps(lane, acc[r][c]);
      out.store(r, c, lane);
    }
}
#endif

template <bool Portable, int MR>
void tile(const QuantizedX& xq, int64_t row0, const int8_t* w, const Out& out) {
#ifdef KVLOOP_AVX2
  if (!Portable) return tile_avx2<MR>(xq, row0, w, out);
#endif
  tile_scalar<MR>(xq, row0, w, out);
}

// One thread's share: output groups [g0, g1) for all M rows. Rows go in chunks whose quantized x stays in L2
// (the weights are re-read once per chunk: only for large M); within a chunk a group's weights (4 x K bytes)
// stay in L1 while every row of the chunk passes over them.
template <bool Portable>
void run_groups(const QuantizedX& xq, int64_t M, const int8_t* w, int64_t n, const float* scale, const float* bias,
                float* y, int64_t g0, int64_t g1) {
  const int64_t K = xq.K;
  const int64_t chunk_rows = std::max<int64_t>(MAX_ROWS, (128 * 1024 / (2 * K + 4 * K / QK)) / MAX_ROWS * MAX_ROWS);
  for (int64_t r0 = 0; r0 < M; r0 += chunk_rows) {
    const int64_t r1 = std::min(M, r0 + chunk_rows);
    for (int64_t g = g0; g < g1; ++g) {
      const int8_t* wg = w + g * COLS * K;
      int64_t r = r0;
      for (; r + MAX_ROWS <= r1; r += MAX_ROWS)
        tile<Portable, MAX_ROWS>(xq, r, wg, Out{y + r * n, n, scale, bias, g * COLS, n - g * COLS});
      for (; r < r1; ++r) tile<Portable, 1>(xq, r, wg, Out{y + r * n, n, scale, bias, g * COLS, n - g * COLS});
    }
  }
}

// x: [M, K] fp32 (K a multiple of 32); packed: [ceil(N/4), K/32, 4, 32] int8 from `pack`; scale: [N] (any float
// dtype); bias: [N] or None. Returns [M, N] fp32.
template <bool Portable>
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale, int64_t n,
                  const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be a 2-D float32 tensor");
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kChar && packed.size(2) == COLS &&
                  packed.size(3) == QK,
              "packed must be a [N/4, K/32, 4, 32] int8 tensor");
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "linear_int8w is a CPU kernel");
  const int64_t M = x.size(0), K = x.size(1), groups = packed.size(0);
  TORCH_CHECK(K % QK == 0, "linear_int8w needs K a multiple of ", QK, " (x has ", K, " features)");
  TORCH_CHECK(packed.size(1) * QK == K, "x has ", K, " features, the weight ", packed.size(1) * QK);
  TORCH_CHECK(n > (groups - 1) * COLS && n <= groups * COLS, "n=", n, " does not match ", groups, " groups of 4");
  TORCH_CHECK(scale.defined(), "linear_int8w needs the channel scales");
  const auto o = kvloop::linear_operands::prepare(x, packed, scale, n, bias);
  if (o.done) return o.y;

  // x quantized: q and |q| (K bytes each per row) and the block scales; on the stack for a few rows
  const int64_t row_bytes = 2 * K + 4 * (K / QK);
  constexpr int64_t kStackBytes = 16 * 1024;
  alignas(64) uint8_t stack[kStackBytes];
  at::Tensor heap;
  uint8_t* buf = stack;
  if (M * row_bytes > kStackBytes) {
    heap = at::empty({M * row_bytes}, x.options().dtype(at::kByte));
    buf = heap.data_ptr<uint8_t>();
  }
  const QuantizedX xq{reinterpret_cast<int8_t*>(buf), buf + M * K, reinterpret_cast<float*>(buf + 2 * M * K), K};
  const float* xp = o.x.data_ptr<float>();
  auto quantize_rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      quantize_row<Portable>(xp + r * K, K, xq.q + r * K, xq.aq + r * K, xq.scale + r * (K / QK));
  };
  if (M >= 16)  // rows are independent: which thread quantizes one does not change it
    at::parallel_for(0, M, 8, quantize_rows);
  else
    quantize_rows(0, M);

  const auto* wp = static_cast<const int8_t*>(o.w.data_ptr());
  const float* sp = o.scale.data_ptr<float>();
  const float* bp = o.bias.defined() ? o.bias.data_ptr<float>() : nullptr;
  float* yp = o.y.data_ptr<float>();
  // Threads take contiguous ranges of groups (at::parallel_for splits evenly over torch's thread count).
  at::parallel_for(0, groups, 1,
                   [&](int64_t g0, int64_t g1) { run_groups<Portable>(xq, M, wp, n, sp, bp, yp, g0, g1); });
  return o.y;
}

at::Tensor linear_int8w(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale, int64_t n,
                        const c10::optional<at::Tensor>& bias) {
  return linear<false>(x, packed, scale, n, bias);
}

// The portable path whatever the build targets: the tests check it gives linear_int8w's bits.
at::Tensor linear_int8w_scalar(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale, int64_t n,
                               const c10::optional<at::Tensor>& bias) {
  return linear<true>(x, packed, scale, n, bias);
}

}  // namespace

// A fragment: the namespace itself is declared by paged_decode.cpp's library (any of them may load first).
TORCH_LIBRARY_FRAGMENT(kvloop_cpu, m) {
  m.def("linear_int8w(Tensor x, Tensor packed, Tensor scale, int n, Tensor? bias) -> Tensor");
  m.def("linear_int8w_scalar(Tensor x, Tensor packed, Tensor scale, int n, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvloop_cpu, CPU, m) {
  m.impl("linear_int8w", &linear_int8w);
  m.impl("linear_int8w_scalar", &linear_int8w_scalar);
}
