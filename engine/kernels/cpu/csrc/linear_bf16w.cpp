// y[M, N] = x[M, K] (fp32) @ W[N, K]^T (bf16) + bias, fp32 accumulation: a linear layer for CPUs without
// native bf16 arithmetic. Small-batch decode is bound by the bytes of weights it reads; bf16 weights halve
// them, and widening bf16 to fp32 is a 16-bit shift, so the arithmetic stays fp32 (FMA) at no extra cost.
//
// Weight layout (made by kernels/cpu/linear_bf16w.py `pack`): [N/16 blocks][K][16] bf16, N padded with zero
// rows. For one k a block's 16 output columns are one 32-byte load. Within the 16 the columns are stored
// in the order SLOT_OF_COL, so that interleaving with zeros per 128-bit lane (unpacklo/unpackhi) yields
// columns 0-7 and 8-15 as fp32 in natural order: one load and two shuffles per 16 weights.
//
// The tiles, the walk over them, the thread split and the argument checks are linear_tiles.h's: every
// output is one fp32 FMA chain over k in order, bias added last (no scale), so a row's result does not
// depend on the batch it is in.

#include <torch/library.h>

#include <cstdint>
#include <cstring>

#include "linear_amx.h"
#include "linear_dpbf16.h"
#include "linear_tiles.h"

namespace {

using kvloop::linear_tiles::BLOCK;

// Column c of a block sits at slot SLOT_OF_COL[c] (the permutation is its own inverse).
constexpr int SLOT_OF_COL[BLOCK] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};

struct Bf16Weights {
  using Weight = uint16_t;  // bf16 bits
  static constexpr at::ScalarType kDtype = at::kBFloat16;
  static constexpr const char* kDtypeName = "bfloat16";
  static constexpr const char* kName = "linear_bf16w";

#ifdef KVLOOP_AVX2
  // bf16 is the top half of an fp32: interleaving zeros below each 16-bit value widens it, per 128-bit lane.
  static KVLOOP_INLINE void widen16(const Weight* p, __m256& lo, __m256& hi) {
    const __m256i zero = _mm256_setzero_si256();
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, raw));
    hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, raw));
  }
#endif

  static float widen1(const Weight* p, int col) {
    const uint32_t bits = static_cast<uint32_t>(p[SLOT_OF_COL[col]]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
};

// x: [M, K] fp32; packed: [ceil(N/16), K, 16] bf16 from `pack`; bias: [N] fp32 or None. Returns [M, N] fp32.
at::Tensor linear_bf16w(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                        const c10::optional<at::Tensor>& bias) {
  return kvloop::linear_tiles::linear<Bf16Weights>(x, packed, at::Tensor(), n, bias);
}

// Whether linear_bf16w_bf16 multiplies in AMX tiles: switched on by linear_bf16w.py where oneDNN has AMX tiles;
// stays off where the build has none or the OS does not grant this process their state. Returns the setting.
bool use_tiles = false;

bool linear_bf16w_set_tiles(bool on) {
  use_tiles = on && kvloop::amx_granted();
  return use_tiles;
}

// x: [M, K] bf16 (a bf16 model's activations); packed as above; bias: [N] fp32 or None. Returns [M, N] bf16: the
// fp32 result (plus bias) rounded to nearest even. With AMX tiles switched on (linear_amx.h) 16 rows x 16 columns
// x 32 k's per instruction; else with AVX512-BF16 (linear_dpbf16.h) two products per lane and instruction;
// elsewhere, or for an odd K, the fp32 tiles over the widened x (the same values up to the order of the fp32
// sums).
at::Tensor linear_bf16w_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                             const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "x must be a 2-D bfloat16 tensor");
#ifdef KVLOOP_AVX512BF16
  const int64_t K = x.size(1);
  if (K % 2 == 0) {
    kvloop::linear_tiles::check_packed(x, packed, n, at::kBFloat16, "bfloat16", "linear_bf16w_bf16");
    const int64_t M = x.size(0), blocks = packed.size(0);
    const auto o = kvloop::linear_operands::prepare(x, packed, at::Tensor(), n, bias);
    if (o.done) return o.y.to(at::kBFloat16);  // no work: the bias per row (fp32), or zeros
    auto run = kvloop::linear_dpbf16::linear;
#ifdef KVLOOP_AMX
    if (use_tiles) run = kvloop::linear_amx::linear;
#endif
    run(reinterpret_cast<const uint16_t*>(o.x.data_ptr()), M, K, static_cast<const uint16_t*>(o.w.data_ptr()), blocks,
        n, o.bias.defined() ? o.bias.data_ptr<float>() : nullptr, reinterpret_cast<uint16_t*>(o.y.data_ptr()),
        SLOT_OF_COL);
    return o.y;
  }
#endif
  return linear_bf16w(x.to(at::kFloat), packed, n, bias).to(at::kBFloat16);
}

// Whether linear_bf16w_bf16 multiplies in bf16 pairs (built for AVX512-BF16) rather than through the fp32 tiles.
bool linear_bf16w_native() {
#ifdef KVLOOP_AVX512BF16
  return true;
#else
  return false;
#endif
}

}  // namespace

// A fragment: the namespace itself is declared by paged_decode.cpp's library (either may load first).
TORCH_LIBRARY_FRAGMENT(kvloop_cpu, m) {
  m.def("linear_bf16w(Tensor x, Tensor packed, int n, Tensor? bias) -> Tensor");
  m.def("linear_bf16w_bf16(Tensor x, Tensor packed, int n, Tensor? bias) -> Tensor");
  m.def("linear_bf16w_native() -> bool", &linear_bf16w_native);
  m.def("linear_bf16w_set_tiles(bool on) -> bool", &linear_bf16w_set_tiles);
  m.def("linear_bf16w_tiles() -> bool", [] { return use_tiles; });
}

TORCH_LIBRARY_IMPL(kvloop_cpu, CPU, m) {
  m.impl("linear_bf16w", &linear_bf16w);
  m.impl("linear_bf16w_bf16", &linear_bf16w_bf16);
}
