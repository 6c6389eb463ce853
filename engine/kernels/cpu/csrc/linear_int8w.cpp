// y[M, N] = (x[M, K] (fp32) @ Q[N, K]^T (int8)) * scale[N] + bias: weight-only int8 with one symmetric fp32
// scale per output channel. Small-batch decode is bound by the bytes of weights it reads; int8 weights are a
// quarter of fp32's. Widening int8 to fp32 is exact (sign-extend, then convert), so the products and sums are
// fp32 FMA, and the scale is applied once per output, after the sum.
//
// Weight layout (made by kernels/cpu/linear_int8w.py `pack`): [N/16 blocks][K][16] int8, N padded with zero
// rows. For one k a block's 16 output columns are 16 contiguous bytes: two 8-byte sign-extending loads give
// columns 0-7 and 8-15 as int32, in natural order.
//
// The tiles, the walk over them, the thread split and the argument checks are linear_tiles.h's, shared with
// the bf16 kernel: every output is one fp32 FMA chain over k in order, then times its scale, then plus its
// bias, so a row's result does not depend on the batch it is in.

#include <torch/library.h>

#include <cstdint>

#include "linear_tiles.h"

namespace {

struct Int8Weights {
  using Weight = int8_t;
  static constexpr at::ScalarType kDtype = at::kChar;
  static constexpr const char* kDtypeName = "int8";
  static constexpr const char* kName = "linear_int8w";

#ifdef KVLOOP_AVX2
  // Two 8-byte sign-extending loads, each converted: columns 0-7 and 8-15 in natural order.
  static KVLOOP_INLINE void widen16(const Weight* p, __m256& lo, __m256& hi) {
    lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))));
  }
#endif

  static float widen1(const Weight* p, int col) { return static_cast<float>(p[col]); }
};

// x: [M, K] fp32; packed: [ceil(N/16), K, 16] int8 from `pack`; scale: [N] fp32; bias: [N] fp32 or None.
// Returns [M, N] fp32.
at::Tensor linear_int8w(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale, int64_t n,
                        const c10::optional<at::Tensor>& bias) {
  return kvloop::linear_tiles::linear<Int8Weights>(x, packed, scale, n, bias);
}

}  // namespace

// A fragment: the namespace itself is declared by paged_decode.cpp's library (any of them may load first).
TORCH_LIBRARY_FRAGMENT(kvloop_cpu, m) {
  m.def("linear_int8w(Tensor x, Tensor packed, Tensor scale, int n, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvloop_cpu, CPU, m) { m.impl("linear_int8w", &linear_int8w); }
