/* codec_impl.h - pieces the codec files share: header, conversion and the
 * kernel level. Not part of the tier interface. */
#ifndef KVT_CODEC_IMPL_H
#define KVT_CODEC_IMPL_H

#include "tiers/codec.h"

#define KVT_AVX2 __attribute__((target("avx2,fma,f16c")))
/* Kernels instantiated for a constant size (a whole vector in registers). */
#define KVT_INLINE inline __attribute__((always_inline))

extern int kvt_codec_level; /* 0 scalar, 1 AVX2 (set by kvt_codec_force / cpuid) */

/* Header: "KW", codec id, version, u16 heads, u16 head_dim, u32 tokens,
 * u32 low bits of the seed. */
void kvt_codec_put_hdr(uint8_t *out, int id, const kvt_cshape *s);
int kvt_codec_hdr_ok(const uint8_t *in, int id, const kvt_cshape *s);

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

/* per-family entry points, dispatched by codec.c. Encoders return
 * KVT_ENONFINITE at the first vector holding an infinity or NaN (what came
 * before it is written); checks return KVT_ECORRUPT; decoders trust their
 * input (checked, or the engine's own). */
size_t kvt_k_size(int id, const kvt_cshape *s);
int kvt_k_encode(int id, const kvt_cshape *s, const void *in, uint32_t dtype, uint8_t *body);
int kvt_k_check(int id, const kvt_cshape *s, const uint8_t *body);
void kvt_k_decode(int id, const kvt_cshape *s, const uint8_t *body, void *out, uint32_t dtype);
size_t kvt_v_size(int bits, const kvt_cshape *s);
int kvt_v_encode(int bits, const kvt_cshape *s, const void *in, uint32_t dtype, uint8_t *body);
int kvt_v_check(int bits, const kvt_cshape *s, const uint8_t *body);
void kvt_v_decode(int bits, const kvt_cshape *s, const uint8_t *body, void *out, uint32_t dtype);

#endif
