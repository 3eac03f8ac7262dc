/* codec_impl.h - pieces the codec files share: header, conversion and the
 * kernel level. Not part of the tier interface. */
#ifndef KVT_CODEC_IMPL_H
#define KVT_CODEC_IMPL_H

#include <immintrin.h>

#include "codec/codec.h"

#define KVT_AVX2 __attribute__((target("avx2,fma,f16c")))
/* Kernels instantiated for a constant size (a whole vector in registers). */
#define KVT_INLINE inline __attribute__((always_inline))
#define KVT_NOINLINE __attribute__((noinline))
/* Loops over a vector's registers, unrolled in full so the vector stays
 * in registers. Not in sanitizer builds: unrolled and instrumented, these
 * kernels take clang minutes to compile (and the results are the same). */
#if defined(__SANITIZE_ADDRESS__)
#define KVT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define KVT_SANITIZED 1
#endif
#endif
#ifdef KVT_SANITIZED
#define KVT_UNROLL
#else
#define KVT_UNROLL _Pragma("GCC unroll 16")
#endif

/* 0 scalar, 1 AVX2: process-global (documented in kvtier.h), set from
 * cpuid when the library loads; only tests change it (kvt_codec_force). */
extern int kvt_codec_level;

/* Header: "KW", codec id, version, u16 heads, u16 head_dim, u32 tokens,
 * u32 low bits of the seed. */
void kvt_codec_put_hdr(uint8_t *out, int id, const kvt_cshape *s);
int kvt_codec_hdr_ok(const uint8_t *in, int id, const kvt_cshape *s);

/* The lean codecs' u8 scales (k8b's block scale, v2l..v4l's norms): code
 * c > 0 stands for 2^((c - 112) / 8), 0 for zero; 1/8 of an octave a step,
 * 2^-13.875 .. 2^17.875. Every byte is a valid finite scale. */
float kvt_lean_value(uint8_t c);
/* The smallest code whose value is >= x (0 for x <= 0); 256 past the range. */
int kvt_lean_code_up(float x);
/* The code nearest x in the log domain (0 for x <= 0, clamped to 1..255). */
uint8_t kvt_lean_code_near(float x);

/* One (token, head) vector of n values of dtype to f32 (scalar or F16C). */
void kvt_vec_to_f32(const void *in, uint32_t dtype, uint32_t n, float *out);
void kvt_vec_from_f32(const float *in, uint32_t dtype, uint32_t n, void *out);
/* The same, saturating f16 at +-65504: for decoded values, which may
 * overshoot the largest f16 by a rounding step. */
void kvt_vec_from_f32_sat(const float *in, uint32_t dtype, uint32_t n, void *out);
/* kvt_vec_to_f32, also saying whether any value is infinite or NaN (1):
 * encoders refuse those as they load them instead of in a pass of their own. */
int kvt_vec_load(const void *in, uint32_t dtype, uint32_t n, float *out);

/* f16 scale/norm stored little-endian; finite and >= 0 when valid. */
static inline uint16_t kvt_rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline void kvt_wr16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline int kvt_f16_ok(uint16_t h) { return (h & 0x8000) == 0 && (h & 0x7C00) != 0x7C00; }

/* 8 decoded (finite) values to dtype at out, as kvt_vec_from_f32_sat does:
 * f16 saturates at +-65504, bf16 rounds to nearest even. */
KVT_AVX2 static inline void kvt_st8(void *out, uint32_t dtype, __m256 v) {
  if (dtype == KVT_F32) {
    _mm256_storeu_ps(out, v);
  } else if (dtype == KVT_F16) {
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-65504.0f)), _mm256_set1_ps(65504.0f));
    _mm_storeu_si128(out, _mm256_cvtps_ph(v, 0));
  } else { /* x + 0x7FFF + (bit 16 of x), the high halves */
    __m256i x = _mm256_castps_si256(v), one = _mm256_set1_epi32(1);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
    x = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), odd);
    x = _mm256_srli_epi32(x, 16);
    __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    _mm_storeu_si128(out, h);
  }
}

/* per-family entry points, dispatched by codec.c. Encoders return
 * KVT_ENONFINITE at the first vector holding an infinity or NaN (what came
 * before it is written); checks return KVT_ECORRUPT; decoders trust their
 * input (checked, or the engine's own). */
size_t kvt_k_size(int id, const kvt_cshape *s);
int kvt_k_encode(int id, const kvt_cshape *s, const void *in, uint32_t dtype, uint8_t *body);
int kvt_k_check(int id, const kvt_cshape *s, const uint8_t *body);
void kvt_k_decode(int id, const kvt_cshape *s, const uint8_t *body, void *out, uint32_t dtype);
size_t kvt_v_size(int bits, const kvt_cshape *s);
/* The lean value codecs: u8 norms[T][H], then the codes of v2..v4. */
size_t kvt_vl_size(int bits, const kvt_cshape *s);
int kvt_vl_encode(int bits, const kvt_cshape *s, const void *in, uint32_t dtype, uint8_t *body);
void kvt_vl_decode(int bits, const kvt_cshape *s, const uint8_t *body, void *out, uint32_t dtype);
int kvt_v_encode(int bits, const kvt_cshape *s, const void *in, uint32_t dtype, uint8_t *body);
int kvt_v_check(int bits, const kvt_cshape *s, const uint8_t *body);
void kvt_v_decode(int bits, const kvt_cshape *s, const uint8_t *body, void *out, uint32_t dtype);

#endif
