/* codec.h - the warm tier's codecs: quantized forms of one K or V tensor
 * of a layer block, [n_tokens][n_heads][head_dim], behind one interface.
 *
 * Every encoded buffer starts with a 16-byte header (codec, version, shape,
 * rotation seed) so a decoder can refuse what it was not given; the layout
 * of each codec's body is in docs/format.md ("Warm encodings"). Each codec
 * has a scalar reference and an AVX2/F16C kernel chosen at run time; both
 * produce identical bytes (tests/test_codec.c). */
#ifndef KVT_CODEC_H
#define KVT_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h" /* the codec ids are public: kvt_codec_id */

#define KVT_CODEC_MAX 10

#define KVT_CODEC_HDR 16
#define KVT_CODEC_VERSION 1

typedef kvt_codec_shape kvt_cshape; /* public: kvtier.h */

typedef struct kvt_codec {
  int id;
  const char *name;
  int is_value;        /* 1: a V codec (rotated), 0: a K codec */
  int bits;            /* bits per code */
  int lean;            /* 1: no header, u8 log2 scales (K8B, V2L..V4L) */
} kvt_codec;

const kvt_codec *kvt_codec_get(int id);
const kvt_codec *kvt_codec_by_name(const char *name);
/* kvt_codec_size/encode/check/decode are public: see kvtier.h. */

/* kvt_codec_decode without its checks, for a payload known well formed
 * (the warm tier's own encodings in RAM): the shape and id are the ones it
 * was encoded with. A malformed payload decodes to garbage, never outside
 * out or in. */
void kvt_codec_decode_trusted(int id, const kvt_cshape *s, const uint8_t *in, void *out,
                              uint32_t dtype);

/* Kernels: 0 = scalar reference, 1 = AVX2/F16C. kvt_codec_simd() says what
 * the CPU allows; tests force each to compare them. */
int kvt_codec_simd(void);
void kvt_codec_force(int level); /* -1 = automatic */

/* ---- attention on encoded data (used by the engine's attend call) ---- */

/* Rotated-domain head dim: head_dim rounded up to a power of two, >= 8. */
uint32_t kvt_codec_vdim(uint32_t head_dim);

/* scores[t] = dot(q, k[t][h]) for one head h of an encoded K tensor,
 * without materialising k. q has head_dim floats. */
void kvt_codec_k_dots(int id, const kvt_cshape *s, const uint8_t *enc, uint32_t h,
                      const float *q, float *scores);

/* acc[0..vdim) += sum_t p[t] * (norm_t / vdim) * centroid(code_t), the
 * rotated-domain accumulation for head h of an encoded V tensor (the
 * inverse rotation below is unnormalised: hence vdim, not sqrt(vdim)). */
void kvt_codec_v_accum(int id, const kvt_cshape *s, const uint8_t *enc, uint32_t h,
                       const float *p, float *acc);

/* The same for the gn <= KVT_CODEC_GQA query heads of a GQA group sharing
 * KV head h, reading its codes once for all of them: query j is q + j *
 * head_dim, its scores go to scores + j * stride, its weights come from
 * p + j * stride, its accumulator is acc + j * vdim. Query j's results are
 * those of kvt_codec_k_dots / v_accum on it alone, bit for bit. */
#define KVT_CODEC_GQA 4u
void kvt_codec_k_dots_n(int id, const kvt_cshape *s, const uint8_t *enc, uint32_t h,
                        const float *q, uint32_t gn, float *scores, size_t stride);
void kvt_codec_v_accum_n(int id, const kvt_cshape *s, const uint8_t *enc, uint32_t h,
                         const float *p, size_t stride, uint32_t gn, float *acc);

/* out[0..head_dim) = inverse rotation of acc (vdim floats, destroyed). */
void kvt_codec_v_unrotate(const kvt_cshape *s, float *acc, float *out);

/* Scalar conversions shared with the engine. */
float kvt_f16_to_f32(uint16_t h);
uint16_t kvt_f32_to_f16(float f);
float kvt_bf16_to_f32(uint16_t h);
uint16_t kvt_f32_to_bf16(float f);
/* n values of dtype at in[] as f32. */
void kvt_to_f32(const void *in, uint32_t dtype, size_t n, float *out);
void kvt_from_f32(const float *in, uint32_t dtype, size_t n, void *out);

#endif
