// Vector primitives of the paged decode kernel. AVX2 + FMA (+ F16C for fp16) where the compiler targets
// them (built with -march=native on the machine that runs it), plain loops elsewhere. Everything is
// computed in fp32: 16-bit values are widened on load (bf16 by a 16-bit shift, fp16 by F16C).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVLOOP_AVX2 1
#endif

// Forced inlining: the kernel instantiates these for a fixed head_dim, so their loops unroll completely.
#define KVLOOP_INLINE inline __attribute__((always_inline))

namespace kvloop {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline const char* isa() {
#if defined(KVLOOP_AVX2) && defined(__F16C__)
  return "avx2+fma+f16c";
#elif defined(KVLOOP_AVX2)
  return "avx2+fma";
#else
  return "scalar";
#endif
}

// ---- widening loads: n values of src -> fp32 dst --------------------------------------------------------

KVLOOP_INLINE void to_float(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

KVLOOP_INLINE void to_float(const c10::BFloat16* src, float* dst, int64_t n) {
  int64_t i = 0;
#ifdef KVLOOP_AVX2
  for (; i + 8 <= n; i += 8) {  // bf16 is the top half of an fp32: widen to 32 bits and shift
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

KVLOOP_INLINE void to_float(const c10::Half* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(KVLOOP_AVX2) && defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// Asks for the cache lines of [p, p + bytes) ahead of their use, into L2 (locality hint 1).
KVLOOP_INLINE void prefetch_l2(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 0, 1);
}

// ---- exp ------------------------------------------------------------------------------------------------

// exp(x) for x <= 0 (scores minus their running maximum): 2^k * e^r with k = round(x / ln 2) and
// |r| <= ln 2 / 2, e^r by its Taylor series to r^6 (relative error below 2e-7). Inputs under -87 are
// clamped there (e^-87 ~ 1.6e-38: nothing next to the maximum's weight of 1). The constants serve every
// vector width (simd512.h's too).
struct ExpConstants {
  static constexpr float kMin = -87.0f, kLog2e = 1.44269504088896341f;
  static constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln 2 split: k * kLn2Hi is exact
  static constexpr float kTaylor[7] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};  // r^6 .. 1
};

#ifdef KVLOOP_AVX2
KVLOOP_INLINE __m256 exp_nonpositive(__m256 x) {
  using E = ExpConstants;
  x = _mm256_max_ps(x, _mm256_set1_ps(E::kMin));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(E::kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(E::kLn2Hi), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(E::kLn2Lo), r);
  __m256 p = _mm256_set1_ps(E::kTaylor[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(E::kTaylor[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

KVLOOP_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

KVLOOP_INLINE float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The dot products of q with 8 rows (d a multiple of 8), as one vector: 8 accumulators reduced together
// (three rounds of horizontal adds) instead of one horizontal sum per row.
KVLOOP_INLINE __m256 dot8(const float* q, const float* const* rows, int64_t d) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t i = 0; i < d; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[0] + i), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[1] + i), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[2] + i), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[3] + i), a3);
    a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[4] + i), a4);
    a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[5] + i), a5);
    a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[6] + i), a6);
    a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[7] + i), a7);
  }
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  // each 128-bit half holds half of every sum: add the halves, rows 0-3 from s0123 and 4-7 from s4567
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}
#endif

// scores[t] = q . rows[t] for t < n8 (a multiple of 8; rows past the real ones point at zeros)
KVLOOP_INLINE void dots(const float* q, const float* const* rows, int64_t n8, int64_t d, float* scores) {
#ifdef KVLOOP_AVX2
  if (d % 8 == 0) {
    for (int64_t t = 0; t < n8; t += 8) _mm256_storeu_ps(scores + t, dot8(q, rows + t, d));
    return;
  }
#endif
  for (int64_t t = 0; t < n8; ++t) {
    float s = 0.f;
    for (int64_t i = 0; i < d; ++i) s += q[i] * rows[t][i];
    scores[t] = s;
  }
}

// p[t] = exp(s[t] - top) for t < n; p[t] = 0 for n <= t < n8. Returns the sum of p.
KVLOOP_INLINE float exp_shifted(const float* s, float top, int64_t n, int64_t n8, float* p) {
  int64_t t = 0;
  float sum = 0.f;
#ifdef KVLOOP_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 topv = _mm256_set1_ps(top);
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + t), topv));
    _mm256_storeu_ps(p + t, e);
    acc = _mm256_add_ps(acc, e);
  }
  sum = hsum(acc);
#endif
  for (; t < n; ++t) {
    p[t] = std::exp(s[t] - top);
    sum += p[t];
  }
  for (; t < n8; ++t) p[t] = 0.f;
  return sum;
}

KVLOOP_INLINE float max_of(const float* s, int64_t n) {
  int64_t t = 0;
  float top = kNegInf;
#ifdef KVLOOP_AVX2
  if (n >= 8) {
    __m256 m = _mm256_loadu_ps(s);
    for (t = 8; t + 8 <= n; t += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + t));
    top = hmax(m);
  }
#endif
  for (; t < n; ++t) top = s[t] > top ? s[t] : top;
  return top;
}

// acc = acc * alpha + sum_t p[t] * rows[t], for t < n (the value half of the online softmax)
KVLOOP_INLINE void scale_accumulate(float* acc, float alpha, const float* p, const float* const* rows, int64_t n,
                             int64_t d) {
  int64_t i = 0;
#ifdef KVLOOP_AVX2
  const __m256 al = _mm256_set1_ps(alpha);
  // Eight accumulators per pass (64 values): eight independent FMA chains keep both FMA units busy
  // (four would wait on the FMA latency).
  for (; i + 64 <= d; i += 64) {
    __m256 a[8];
    for (int j = 0; j < 8; ++j) a[j] = _mm256_mul_ps(_mm256_loadu_ps(acc + i + 8 * j), al);
    for (int64_t t = 0; t < n; ++t) {
      const __m256 pt = _mm256_broadcast_ss(p + t);
      const float* r = rows[t] + i;
      for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(r + 8 * j), a[j]);
    }
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(acc + i + 8 * j, a[j]);
  }
  for (; i + 32 <= d; i += 32) {
    __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + i), al);
    __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(acc + i + 8), al);
    __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(acc + i + 16), al);
    __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(acc + i + 24), al);
    for (int64_t t = 0; t < n; ++t) {
      const __m256 pt = _mm256_broadcast_ss(p + t);
      const float* r = rows[t] + i;
      a0 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(r), a0);
      a1 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(r + 8), a1);
      a2 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(r + 16), a2);
      a3 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(r + 24), a3);
    }
    _mm256_storeu_ps(acc + i, a0);
    _mm256_storeu_ps(acc + i + 8, a1);
    _mm256_storeu_ps(acc + i + 16, a2);
    _mm256_storeu_ps(acc + i + 24, a3);
  }
  for (; i + 8 <= d; i += 8) {
    __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + i), al);
    for (int64_t t = 0; t < n; ++t) a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + t), _mm256_loadu_ps(rows[t] + i), a);
    _mm256_storeu_ps(acc + i, a);
  }
#endif
  for (; i < d; ++i) {
    float a = acc[i] * alpha;
    for (int64_t t = 0; t < n; ++t) a += p[t] * rows[t][i];
    acc[i] = a;
  }
}

}  // namespace kvloop
