/* codec_k.c - key codecs: int8 with one f16 scale per (token, head) (k8),
 * int8 with one f16 scale per (head, channel) over the block's tokens (k8c,
 * for keys with outlier channels, as KIVI does), and 4-bit with one scale
 * per (token, head) (k4). Bodies (after the 16-byte header):
 *   k8, k4: scales f16[T][H], then codes[T][H][row]
 *   k8c:    scales f16[H][D], then codes[T][H][D]
 * where row = D bytes for int8, and for 4-bit D rounded up to 8 codes in 4
 * bytes, each code (value + 8) in 1..15, code i at bits 4i (little-endian).
 *   k8b:    one u8 log2 scale for the whole block (codec_impl.h), then
 *           codes[T][H][D]; no header (a lean warm-tier form)
 * int8 codes are -127..127; -128 and a nibble of 0 are malformed. */
#include <math.h>
#include <string.h>

#include <immintrin.h>

#include "codec/codec_impl.h"
#include "kvtier.h"

static int is4(int id) { return id == KVT_CODEC_K4; }
static size_t row_bytes(int id, uint32_t d) { return is4(id) ? (d + 7) / 8 * 4 : d; }
static size_t n_scales(int id, const kvt_cshape *s) {
  return id == KVT_CODEC_K8C ? (size_t)s->n_heads * s->head_dim : (size_t)s->n_tokens * s->n_heads;
}

/* Bytes before the codes: f16 scales, or k8b's one u8 scale. */
static size_t scale_bytes(int id, const kvt_cshape *s) {
  return id == KVT_CODEC_K8B ? 1 : 2 * n_scales(id, s);
}

size_t kvt_k_size(int id, const kvt_cshape *s) {
  return scale_bytes(id, s) + (size_t)s->n_tokens * s->n_heads * row_bytes(id, s->head_dim);
}

/* ---------- kernels: absmax and quantize one vector ---------- */

/* The larger of two non-negative, non-NaN floats: what fmaxf and
 * _mm256_max_ps both give, without fmaxf's call into libm. */
static inline float max0(float a, float b) { return b > a ? b : a; }

static float absmax_c(const float *x, uint32_t n) {
  float m = 0;
  for (uint32_t i = 0; i < n; i++) m = max0(m, fabsf(x[i]));
  return m;
}

KVT_AVX2 static float hmax8(__m256 m) {
  __m128 r = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  r = _mm_max_ps(r, _mm_movehl_ps(r, r));
  return _mm_cvtss_f32(_mm_max_ss(r, _mm_shuffle_ps(r, r, 1)));
}

KVT_AVX2 static float absmax_avx2(const float *x, uint32_t n) {
  __m256 m = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  return max0(hmax8(m), absmax_c(x + i, n - i));
}

static float absmax(const float *x, uint32_t n) {
  return kvt_codec_level ? absmax_avx2(x, n) : absmax_c(x, n);
}

/* m[i] = max(m[i], |x[i]|): k8c's per-channel maxima */
KVT_AVX2 static void chan_max_avx2(float *m, const float *x, uint32_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(m + i, _mm256_max_ps(_mm256_loadu_ps(m + i),
                                          _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i))));
  for (; i < n; i++) m[i] = max0(m[i], fabsf(x[i]));
}

static void chan_max(float *m, const float *x, uint32_t n) {
  if (kvt_codec_level) chan_max_avx2(m, x, n);
  else
    for (uint32_t i = 0; i < n; i++) m[i] = max0(m[i], fabsf(x[i]));
}

/* q[i] = clamp(round_even(x[i] * inv[i or 0]), -lim, lim) */
static void quant_c(const float *x, const float *inv, int per_elem, uint32_t n, int lim, int32_t *q) {
  for (uint32_t i = 0; i < n; i++) {
    float v = nearbyintf(x[i] * inv[per_elem ? i : 0]);
    q[i] = (int32_t)(v < (float)-lim ? (float)-lim : v > (float)lim ? (float)lim : v);
  }
}

KVT_AVX2 static void quant_avx2(const float *x, const float *inv, int per_elem, uint32_t n, int lim,
                                int32_t *q) {
  const __m256 hi = _mm256_set1_ps((float)lim), lo = _mm256_set1_ps((float)-lim);
  __m256 iv = _mm256_set1_ps(inv[0]);
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if (per_elem) iv = _mm256_loadu_ps(inv + i);
    __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), iv),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    _mm256_storeu_si256((__m256i *)(q + i), _mm256_cvtps_epi32(v));
  }
  quant_c(x + i, per_elem ? inv + i : inv, per_elem, n - i, lim, q + i);
}

static void quant(const float *x, const float *inv, int per_elem, uint32_t n, int lim, int32_t *q) {
  if (kvt_codec_level) quant_avx2(x, inv, per_elem, n, lim, q);
  else quant_c(x, inv, per_elem, n, lim, q);
}

/* int8 codes straight to bytes: the same arithmetic as quant_c. */
KVT_AVX2 static void quant8_avx2(const float *x, const float *inv, int per_elem, uint32_t n,
                                 int8_t *out) {
  const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
  __m256 iv = _mm256_set1_ps(inv[0]);
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if (per_elem) iv = _mm256_loadu_ps(inv + i);
    __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), iv),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i w = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
    __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storel_epi64((__m128i *)(out + i), _mm_packs_epi16(p16, p16));
  }
  int32_t q[8];
  quant_c(x + i, per_elem ? inv + i : inv, per_elem, n - i, 127, q);
  for (uint32_t j = 0; i + j < n; j++) out[i + j] = (int8_t)q[j];
}

/* The stored f16 scale for absolute maximum m, and its inverse as used. */
static uint16_t scale_of(float m, int lim, float *inv) {
  uint16_t s = kvt_f32_to_f16(m / (float)lim);
  if ((s & 0x7C00) == 0x7C00) s = 0x7BFF; /* |K| beyond f16 range: clamp */
  float f = kvt_f16_to_f32(s);
  *inv = f > 0 ? 1.0f / f : 0.0f;
  return s;
}

static void store_row(int id, const int32_t *q, uint32_t d, uint8_t *out) {
  if (!is4(id)) {
    for (uint32_t i = 0; i < d; i++) out[i] = (uint8_t)(int8_t)q[i];
    return;
  }
  memset(out, 0x88, row_bytes(id, d)); /* padding codes encode 0 */
  for (uint32_t i = 0; i < d; i++) {
    uint8_t nib = (uint8_t)(q[i] + 8);
    out[i / 2] = (uint8_t)((i & 1) ? (out[i / 2] & 0x0F) | (nib << 4) : (out[i / 2] & 0xF0) | nib);
  }
}

static void quantize_row(int id, const float *x, const float *inv, int per_elem, uint32_t d,
                         int32_t *q, uint8_t *row) {
  if (!is4(id) && kvt_codec_level) {
    quant8_avx2(x, inv, per_elem, d, (int8_t *)row);
    return;
  }
  quant(x, inv, per_elem, d, is4(id) ? 7 : 127, q);
  store_row(id, q, d, row);
}

/* k8c: per head, the channel maxima over the block's tokens, then the codes. */
static int k8c_encode(const kvt_cshape *s, const void *in, uint32_t dtype, uint8_t *body) {
  const uint32_t T = s->n_tokens, H = s->n_heads, D = s->head_dim;
  const size_t es = kvt_dtype_size(dtype);
  uint8_t *codes = body + 2 * n_scales(KVT_CODEC_K8C, s);
  float x[KVT_MAX_HEAD_DIM], inv[KVT_MAX_HEAD_DIM], m[KVT_MAX_HEAD_DIM];
  int32_t q[KVT_MAX_HEAD_DIM];
  for (uint32_t h = 0; h < H; h++) {
    memset(m, 0, D * sizeof *m);
    for (uint32_t t = 0; t < T; t++) {
      if (kvt_vec_load((const uint8_t *)in + ((size_t)t * H + h) * D * es, dtype, D, x))
        return KVT_ENONFINITE;
      chan_max(m, x, D);
    }
    for (uint32_t d = 0; d < D; d++)
      kvt_wr16(body + 2 * ((size_t)h * D + d), scale_of(m[d], 127, &inv[d]));
    for (uint32_t t = 0; t < T; t++) {
      size_t v = (size_t)t * H + h;
      kvt_vec_to_f32((const uint8_t *)in + v * D * es, dtype, D, x);
      quantize_row(KVT_CODEC_K8C, x, inv, 1, D, q, codes + v * D);
    }
  }
  return 0;
}

/* k8b: the block's absolute maximum, its scale rounded up to a u8 code (so
 * no key is clipped), then the codes as k8's with that one scale. */
static int k8b_encode(const kvt_cshape *s, const void *in, uint32_t dtype, uint8_t *body) {
  const uint32_t D = s->head_dim;
  const size_t es = kvt_dtype_size(dtype), n = (size_t)s->n_tokens * s->n_heads;
  float x[KVT_MAX_HEAD_DIM], m = 0, inv;
  int32_t q[KVT_MAX_HEAD_DIM];
  for (size_t v = 0; v < n; v++) {
    if (kvt_vec_load((const uint8_t *)in + v * D * es, dtype, D, x)) return KVT_ENONFINITE;
    m = max0(m, absmax(x, D));
  }
  int c = kvt_lean_code_up(m / 127.0f);
  if (c > 255) return KVT_ENONFINITE; /* beyond the scale's range */
  float sc = kvt_lean_value((uint8_t)c);
  inv = sc > 0 ? 1.0f / sc : 0.0f;
  body[0] = (uint8_t)c;
  for (size_t v = 0; v < n; v++) {
    kvt_vec_to_f32((const uint8_t *)in + v * D * es, dtype, D, x);
    quantize_row(KVT_CODEC_K8, x, &inv, 0, D, q, body + 1 + v * D);
  }
  return 0;
}

int kvt_k_encode(int id, const kvt_cshape *s, const void *in, uint32_t dtype, uint8_t *body) {
  if (id == KVT_CODEC_K8C) return k8c_encode(s, in, dtype, body);
  if (id == KVT_CODEC_K8B) return k8b_encode(s, in, dtype, body);
  const uint32_t D = s->head_dim;
  const size_t es = kvt_dtype_size(dtype), rb = row_bytes(id, D);
  uint8_t *codes = body + 2 * n_scales(id, s);
  float x[KVT_MAX_HEAD_DIM], inv;
  int32_t q[KVT_MAX_HEAD_DIM];
  for (size_t v = 0; v < (size_t)s->n_tokens * s->n_heads; v++) {
    if (kvt_vec_load((const uint8_t *)in + v * D * es, dtype, D, x)) return KVT_ENONFINITE;
    kvt_wr16(body + 2 * v, scale_of(absmax(x, D), is4(id) ? 7 : 127, &inv));
    quantize_row(id, x, &inv, 0, D, q, codes + v * rb);
  }
  return 0;
}

/* Any code byte that is invalid: -128 (k8, k8c), a zero nibble (k4). */
static int codes_bad_c(int id, const uint8_t *c, size_t n) {
  unsigned bad = 0;
  if (is4(id))
    for (size_t i = 0; i < n; i++) bad |= (c[i] & 0x0F) == 0 || (c[i] & 0xF0) == 0;
  else
    for (size_t i = 0; i < n; i++) bad |= c[i] == 0x80;
  return bad != 0;
}

KVT_AVX2 static int codes_bad_avx2(int id, const uint8_t *c, size_t n) {
  const __m256i z = _mm256_setzero_si256(), lo = _mm256_set1_epi8(0x0F);
  const __m256i hi = _mm256_set1_epi8((char)0xF0), m80 = _mm256_set1_epi8((char)0x80);
  __m256i bad = z;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(c + i));
    if (is4(id))
      bad = _mm256_or_si256(bad, _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, lo), z),
                                                 _mm256_cmpeq_epi8(_mm256_and_si256(v, hi), z)));
    else
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi8(v, m80));
  }
  return !_mm256_testz_si256(bad, bad) || codes_bad_c(id, c + i, n - i);
}

int kvt_k_check(int id, const kvt_cshape *s, const uint8_t *body) {
  size_t ns = n_scales(id, s), nc = (size_t)s->n_tokens * s->n_heads * row_bytes(id, s->head_dim);
  unsigned bad = 0;
  if (id != KVT_CODEC_K8B) /* k8b: every u8 scale is valid */
    for (size_t i = 0; i < ns; i++) bad |= !kvt_f16_ok(kvt_rd16(body + 2 * i));
  if (bad) return KVT_ECORRUPT;
  const uint8_t *c = body + scale_bytes(id, s);
  bad = kvt_codec_level > 0 ? codes_bad_avx2(id, c, nc) : codes_bad_c(id, c, nc);
  return bad ? KVT_ECORRUPT : 0;
}

/* Code i of a row as an integer. */
static inline int code_at(int id, const uint8_t *row, uint32_t i) {
  if (!is4(id)) return (int8_t)row[i];
  return ((row[i / 2] >> ((i & 1) * 4)) & 0x0F) - 8;
}

static void dequant_row(int id, const uint8_t *row, const float *scale, int per_elem, uint32_t d,
                        float *x) {
  for (uint32_t i = 0; i < d; i++) x[i] = (float)code_at(id, row, i) * scale[per_elem ? i : 0];
}

static void k_decode_c(int id, const kvt_cshape *s, const uint8_t *body, void *out,
                       uint32_t dtype) {
  const uint32_t T = s->n_tokens, H = s->n_heads, D = s->head_dim;
  const size_t es = kvt_dtype_size(dtype), rb = row_bytes(id, D);
  const uint8_t *codes = body + scale_bytes(id, s);
  const int per_ch = id == KVT_CODEC_K8C, blk = id == KVT_CODEC_K8B;
  float x[KVT_MAX_HEAD_DIM], sc[KVT_MAX_HEAD_DIM];
  for (uint32_t h = 0; h < H; h++) {
    if (per_ch)
      for (uint32_t d = 0; d < D; d++) sc[d] = kvt_f16_to_f32(kvt_rd16(body + 2 * ((size_t)h * D + d)));
    for (uint32_t t = 0; t < T; t++) {
      size_t v = (size_t)t * H + h;
      if (blk) sc[0] = kvt_lean_value(body[0]);
      else if (!per_ch) sc[0] = kvt_f16_to_f32(kvt_rd16(body + 2 * v));
      dequant_row(id, codes + v * rb, sc, per_ch, D, x);
      kvt_vec_from_f32_sat(x, dtype, D, (uint8_t *)out + v * D * es);
    }
  }
}

/* ---------- AVX2: codes to floats in registers, 8 lanes at a time ---------- */

/* Codes i..i+7 of a row (i a multiple of 8; a k4 row holds whole groups). */
KVT_AVX2 static KVT_INLINE __m256 k_lanes(int four, const uint8_t *row, uint32_t i) {
  if (!four)
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + i))));
  uint32_t w;
  memcpy(&w, row + i / 2, 4);
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  __m256i c = _mm256_srlv_epi32(_mm256_set1_epi32((int)w), shifts);
  c = _mm256_sub_epi32(_mm256_and_si256(c, _mm256_set1_epi32(15)), _mm256_set1_epi32(8));
  return _mm256_cvtepi32_ps(c);
}

/* One row scaled by sc (a row scale broadcast, or k8c's channel scales as
 * f16 at sc16) to dtype: the arithmetic of dequant_row in one pass, the
 * lanes past the last multiple of 8 by dequant_row itself. */
KVT_AVX2 static KVT_INLINE void k_row_avx2(int id, const uint8_t *row, float sc,
                                           const uint8_t *sc16, uint32_t d, uint32_t dtype,
                                           uint8_t *out) {
  const size_t es = dtype == KVT_F32 ? 4 : 2;
  __m256 s = _mm256_set1_ps(sc);
  uint32_t i = 0;
  for (; i + 8 <= d; i += 8) {
    if (sc16) s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc16 + 2 * i)));
    kvt_st8(out + i * es, dtype, _mm256_mul_ps(k_lanes(is4(id), row, i), s));
  }
  if (i == d) return;
  float x[8], scv[8];
  for (uint32_t j = 0; j < d - i; j++)
    scv[j] = sc16 ? kvt_f16_to_f32(kvt_rd16(sc16 + 2 * (i + j))) : sc;
  for (uint32_t j = 0; j < d - i; j++) x[j] = (float)code_at(id, row, i + j) * scv[j];
  kvt_vec_from_f32_sat(x, dtype, d - i, out + i * es);
}

/* k8 to f16, the common case, 16 codes a step. code * scale is exact in
 * f32 (7 + 11 bits), so when 127 * scale <= 65504 no value needs the
 * saturation of kvt_st8 and it is left out. */
KVT_AVX2 static KVT_INLINE void k8_row_f16(const uint8_t *row, float sc, uint32_t d, uint8_t *out) {
  if (d % 16 || 127.0f * sc > 65504.0f) {
    k_row_avx2(KVT_CODEC_K8, row, sc, NULL, d, KVT_F16, out);
    return;
  }
  const __m256 s = _mm256_set1_ps(sc);
  for (uint32_t i = 0; i < d; i += 16) {
    __m128i b = _mm_loadu_si128((const __m128i *)(row + i));
    __m256 lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
    __m256 hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), s);
    __m256i h = _mm256_set_m128i(_mm256_cvtps_ph(hi, 0), _mm256_cvtps_ph(lo, 0));
    _mm256_storeu_si256((__m256i *)(out + 2 * i), h);
  }
}

/* Vectors in storage order, so the output is written sequentially. */
KVT_AVX2 static void k_decode_avx2(int id, const kvt_cshape *s, const uint8_t *body, void *out,
                                   uint32_t dtype) {
  const uint32_t H = s->n_heads, D = s->head_dim;
  const size_t es = kvt_dtype_size(dtype), rb = row_bytes(id, D), n = (size_t)s->n_tokens * H;
  const uint8_t *codes = body + scale_bytes(id, s);
  for (size_t v = 0; v < n; v++) {
    uint8_t *o = (uint8_t *)out + v * D * es;
    if (id == KVT_CODEC_K8B && dtype == KVT_F16)
      k8_row_f16(codes + v * rb, kvt_lean_value(body[0]), D, o);
    else if (id == KVT_CODEC_K8B)
      k_row_avx2(KVT_CODEC_K8, codes + v * rb, kvt_lean_value(body[0]), NULL, D, dtype, o);
    else if (id == KVT_CODEC_K8C)
      k_row_avx2(KVT_CODEC_K8C, codes + v * rb, 0, body + 2 * (v % H) * D, D, dtype, o);
    else if (dtype == KVT_F16 && !is4(id))
      k8_row_f16(codes + v * rb, _cvtsh_ss(kvt_rd16(body + 2 * v)), D, o);
    else
      k_row_avx2(id, codes + v * rb, _cvtsh_ss(kvt_rd16(body + 2 * v)), NULL, D, dtype, o);
  }
}

void kvt_k_decode(int id, const kvt_cshape *s, const uint8_t *body, void *out, uint32_t dtype) {
  if (kvt_codec_level > 0) k_decode_avx2(id, s, body, out, dtype);
  else k_decode_c(id, s, body, out, dtype);
}

/* ---------- attention: q . k on the codes ---------- */

/* scores[j * stride + t] = qs_j . codes_t for GN queries at once (query j
 * at qs + j * qst): each row converted once, one accumulator per query
 * (the order of gn = 1). */
KVT_AVX2 static KVT_INLINE void dots_avx2(int id, const kvt_cshape *s, const uint8_t *codes,
                                          uint32_t h, const float *qs, uint32_t qst, uint32_t GN,
                                          float *scores, size_t stride) {
  const uint32_t D = s->head_dim, Dv = is4(id) ? (D + 7) / 8 * 8 : D / 8 * 8;
  const size_t rb = row_bytes(id, D);
  for (uint32_t t = 0; t < s->n_tokens; t++) {
    const uint8_t *row = codes + ((size_t)t * s->n_heads + h) * rb;
    __m256 acc[KVT_CODEC_GQA];
    KVT_UNROLL
    for (uint32_t j = 0; j < GN; j++) acc[j] = _mm256_setzero_ps();
    for (uint32_t d = 0; d < Dv; d += 8) {
      __m256 k = k_lanes(is4(id), row, d);
      KVT_UNROLL
      for (uint32_t j = 0; j < GN; j++)
        acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(qs + j * qst + d), k, acc[j]);
    }
    KVT_UNROLL
    for (uint32_t j = 0; j < GN; j++) {
      __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc[j]), _mm256_extractf128_ps(acc[j], 1));
      r = _mm_add_ps(r, _mm_movehl_ps(r, r));
      float sum = _mm_cvtss_f32(_mm_add_ss(r, _mm_shuffle_ps(r, r, 1)));
      for (uint32_t d = Dv; d < D; d++) sum += qs[j * qst + d] * (float)code_at(id, row, d);
      scores[j * stride + t] = sum;
    }
  }
}

KVT_AVX2 static KVT_INLINE void dots_avx2_g(int id, const kvt_cshape *s, const uint8_t *codes,
                                            uint32_t h, const float *qs, uint32_t qst, uint32_t gn,
                                            float *scores, size_t stride) {
  switch (gn) {
  case 1: dots_avx2(id, s, codes, h, qs, qst, 1, scores, stride); break;
  case 2: dots_avx2(id, s, codes, h, qs, qst, 2, scores, stride); break;
  case 3: dots_avx2(id, s, codes, h, qs, qst, 3, scores, stride); break;
  default: dots_avx2(id, s, codes, h, qs, qst, 4, scores, stride); break;
  }
}

/* Constant GN and code width: the accumulators stay in registers. */
KVT_AVX2 static void dots_avx2_n(int id, const kvt_cshape *s, const uint8_t *codes, uint32_t h,
                                 const float *qs, uint32_t qst, uint32_t gn, float *scores,
                                 size_t stride) {
  if (is4(id)) dots_avx2_g(KVT_CODEC_K4, s, codes, h, qs, qst, gn, scores, stride);
  else dots_avx2_g(KVT_CODEC_K8, s, codes, h, qs, qst, gn, scores, stride);
}

static void dots_c(int id, const kvt_cshape *s, const uint8_t *codes, uint32_t h, const float *qs,
                   uint32_t qst, uint32_t gn, float *scores, size_t stride) {
  const uint32_t D = s->head_dim;
  const size_t rb = row_bytes(id, D);
  for (uint32_t t = 0; t < s->n_tokens; t++) {
    const uint8_t *row = codes + ((size_t)t * s->n_heads + h) * rb;
    for (uint32_t j = 0; j < gn; j++) {
      float dot = 0;
      for (uint32_t d = 0; d < D; d++) dot += qs[j * qst + d] * (float)code_at(id, row, d);
      scores[j * stride + t] = dot;
    }
  }
}

void kvt_codec_k_dots_n(int id, const kvt_cshape *s, const uint8_t *enc, uint32_t h,
                        const float *q, uint32_t gn, float *scores, size_t stride) {
  const uint32_t T = s->n_tokens, D = s->head_dim, Dp = (D + 7) / 8 * 8;
  const int blk = id == KVT_CODEC_K8B; /* lean: no header, one scale */
  const uint8_t *body = blk ? enc : enc + KVT_CODEC_HDR, *codes = body + scale_bytes(id, s);
  float qs[KVT_CODEC_GQA * KVT_MAX_HEAD_DIM]; /* query j at j * Dp, zero padded */
  if (gn == 0) return;
  const float *qv = q;
  uint32_t qst = D;
  if (id == KVT_CODEC_K8C || (is4(id) && D != Dp)) { /* k8c: fold the channel scales into q */
    for (uint32_t j = 0; j < gn; j++) {
      float *qj = qs + j * Dp;
      for (uint32_t d = 0; d < D; d++) {
        const uint8_t *sc = body + 2 * ((size_t)h * D + d);
        qj[d] = id == KVT_CODEC_K8C ? q[j * D + d] * kvt_f16_to_f32(kvt_rd16(sc)) : q[j * D + d];
      }
      for (uint32_t d = D; d < Dp; d++) qj[d] = 0; /* k4's padding codes */
    }
    qv = qs;
    qst = Dp;
  }
  if (kvt_codec_level > 0) dots_avx2_n(id, s, codes, h, qv, qst, gn, scores, stride);
  else dots_c(id, s, codes, h, qv, qst, gn, scores, stride);
  if (id == KVT_CODEC_K8C) return;
  if (blk) {
    float sc = kvt_lean_value(body[0]);
    for (uint32_t j = 0; j < gn; j++)
      for (uint32_t t = 0; t < T; t++) scores[j * stride + t] *= sc;
    return;
  }
  for (uint32_t t = 0; t < T; t++) {
    float sc = kvt_f16_to_f32(kvt_rd16(body + 2 * ((size_t)t * s->n_heads + h)));
    for (uint32_t j = 0; j < gn; j++) scores[j * stride + t] *= sc;
  }
}

void kvt_codec_k_dots(int id, const kvt_cshape *s, const uint8_t *enc, uint32_t h, const float *q,
                      float *scores) {
  kvt_codec_k_dots_n(id, s, enc, h, q, 1, scores, 0);
}
