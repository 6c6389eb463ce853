// AVX-512 primitives of the paged decode kernel's blocked path (bf16 K/V on CPUs with AVX512-BF16): a 16 x 16
// transpose of 32-bit words, exp over 16 lanes and bf16 widening. Defined only where the compiler targets
// AVX512F/BW + AVX512-BF16 (built with -march=native on the machine that runs it).
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <immintrin.h>

#include <cstdint>

#include "simd.h"

#define KVLOOP_AVX512BF16 1

namespace kvloop {

// r[i] holds row i's 16 words; afterwards r[j] holds column j (word j of every row, row i in lane i).
inline __attribute__((always_inline)) void transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // 32-bit interleave of row pairs
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // 64-bit interleave: each 128-bit lane now holds 4 rows' word k
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // 128-bit lane shuffles: gather the four 4-row groups of each word into one register
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

// exp(x) for x <= 0, as simd.h's exp_nonpositive over 16 lanes.
inline __attribute__((always_inline)) __m512 exp512_nonpositive(__m512 x) {
  using E = ExpConstants;
  x = _mm512_max_ps(x, _mm512_set1_ps(E::kMin));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(E::kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(E::kLn2Hi), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(E::kLn2Lo), r);
  __m512 p = _mm512_set1_ps(E::kTaylor[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(E::kTaylor[i]));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// exp(x) for x <= 0 where the result is rounded to bf16 next (probabilities for a bf16 value product): e^r by its
// Taylor series to r^4 (relative error below 5e-5, against bf16's rounding of up to 2^-9), one ln 2 term and a
// scalef: 9 instructions against exp512_nonpositive's 14. Inputs under -87 are clamped there, as there.
inline __attribute__((always_inline)) __m512 exp512_for_bf16(__m512 x) {
  using E = ExpConstants;
  x = _mm512_max_ps(x, _mm512_set1_ps(E::kMin));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(E::kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693147180559945f), x);
  __m512 p = _mm512_set1_ps(E::kTaylor[2]);
  for (int i = 3; i < 7; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(E::kTaylor[i]));
  return _mm512_scalef_ps(p, k);
}

// 16 bf16 values widened to fp32 (a bf16 is the top half of an fp32).
inline __attribute__((always_inline)) __m512 widen_bf16(const void* src) {
  const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

}  // namespace kvloop
#endif
