/* codec_k.c - key codecs: int8 with one f16 scale per (token, head) (k8),
 * int8 with one f16 scale per (head, channel) over the block's tokens (k8c,
 * for keys with outlier channels, as KIVI does), and 4-bit with one scale
 * per (token, head) (k4). Bodies (after the 16-byte header):
 *   k8, k4: scales f16[T][H], then codes[T][H][row]
 *   k8c:    scales f16[H][D], then codes[T][H][D]
 * where row = D bytes for int8, and for 4-bit D rounded up to 8 codes in 4
 * bytes, each code (value + 8) in 1..15, code i at bits 4i (little-endian).
 * int8 codes are -127..127; -128 and a nibble of 0 are malformed. */
#include <math.h>
#include <string.h>

#include <immintrin.h>

#include "kvtier.h"
#include "tiers/codec_impl.h"

static int is4(int id) { return id == KVT_CODEC_K4; }
static size_t row_bytes(int id, uint32_t d) { return is4(id) ? (d + 7) / 8 * 4 : d; }
static size_t n_scales(int id, const kvt_cshape *s) {
  return id == KVT_CODEC_K8C ? (size_t)s->n_heads * s->head_dim : (size_t)s->n_tokens * s->n_heads;
}

size_t kvt_k_size(int id, const kvt_cshape *s) {
  return 2 * n_scales(id, s) + (size_t)s->n_tokens * s->n_heads * row_bytes(id, s->head_dim);
}

/* ---------- kernels: absmax and quantize one vector ---------- */

static float absmax_c(const float *x, uint32_t n) {
  float m = 0;
  for (uint32_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
  return m;
}

KVT_AVX2 static float absmax_avx2(const float *x, uint32_t n) {
  __m256 m = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  float t[8], r = 0;
  _mm256_storeu_ps(t, m);
  for (int j = 0; j < 8; j++) r = fmaxf(r, t[j]);
  for (; i < n; i++) r = fmaxf(r, fabsf(x[i]));
  return r;
}

static float absmax(const float *x, uint32_t n) {
  return kvt_codec_level ? absmax_avx2(x, n) : absmax_c(x, n);
}

/* q[i] = clamp(round_even(x[i] * inv[i or 0]), -lim, lim) */
static void quant_c(const float *x, const float *inv, int per_elem, uint32_t n, int lim, int32_t *q) {
  for (uint32_t i = 0; i < n; i++) {
    float v = nearbyintf(x[i] * inv[per_elem ? i : 0]);
    q[i] = (int32_t)fminf(fmaxf(v, (float)-lim), (float)lim);
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

/* x[i] = c[i] * scale[i or 0] */
KVT_AVX2 static void deq8_avx2(const int8_t *c, const float *scale, int per_elem, uint32_t n,
                               float *x) {
  __m256 sc = _mm256_set1_ps(scale[0]);
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if (per_elem) sc = _mm256_loadu_ps(scale + i);
    __m256i ci = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(c + i)));
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_cvtepi32_ps(ci), sc));
  }
  for (; i < n; i++) x[i] = (float)c[i] * scale[per_elem ? i : 0];
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

int kvt_k_encode(int id, const kvt_cshape *s, const void *in, uint32_t dtype, uint8_t *body) {
  const uint32_t T = s->n_tokens, H = s->n_heads, D = s->head_dim;
  const size_t es = kvt_dtype_size(dtype), rb = row_bytes(id, D);
  const int lim = is4(id) ? 7 : 127;
  uint8_t *codes = body + 2 * n_scales(id, s);
  float x[KVT_MAX_HEAD_DIM], inv[KVT_MAX_HEAD_DIM];
  int32_t q[KVT_MAX_HEAD_DIM];
  if (id == KVT_CODEC_K8C) {
    for (uint32_t h = 0; h < H; h++) {
      float m[KVT_MAX_HEAD_DIM] = {0};
      for (uint32_t t = 0; t < T; t++) {
        kvt_vec_to_f32((const uint8_t *)in + ((size_t)t * H + h) * D * es, dtype, D, x);
        for (uint32_t d = 0; d < D; d++) m[d] = fmaxf(m[d], fabsf(x[d]));
      }
      for (uint32_t d = 0; d < D; d++)
        kvt_wr16(body + 2 * ((size_t)h * D + d), scale_of(m[d], lim, &inv[d]));
      for (uint32_t t = 0; t < T; t++) {
        size_t v = (size_t)t * H + h;
        kvt_vec_to_f32((const uint8_t *)in + v * D * es, dtype, D, x);
        quantize_row(id, x, inv, 1, D, q, codes + v * rb);
      }
    }
    return 0;
  }
  for (size_t v = 0; v < (size_t)T * H; v++) {
    kvt_vec_to_f32((const uint8_t *)in + v * D * es, dtype, D, x);
    kvt_wr16(body + 2 * v, scale_of(absmax(x, D), lim, &inv[0]));
    quantize_row(id, x, inv, 0, D, q, codes + v * rb);
  }
  return 0;
}

int kvt_k_check(int id, const kvt_cshape *s, const uint8_t *body) {
  size_t ns = n_scales(id, s), nc = (size_t)s->n_tokens * s->n_heads * row_bytes(id, s->head_dim);
  for (size_t i = 0; i < ns; i++)
    if (!kvt_f16_ok(kvt_rd16(body + 2 * i))) return KVT_ECORRUPT;
  const uint8_t *c = body + 2 * ns;
  unsigned bad = 0;
  if (is4(id))
    for (size_t i = 0; i < nc; i++) bad |= (c[i] & 0x0F) == 0 || (c[i] & 0xF0) == 0;
  else
    for (size_t i = 0; i < nc; i++) bad |= c[i] == 0x80;
  return bad ? KVT_ECORRUPT : 0;
}

/* Code i of a row as an integer. */
static inline int code_at(int id, const uint8_t *row, uint32_t i) {
  if (!is4(id)) return (int8_t)row[i];
  return ((row[i / 2] >> ((i & 1) * 4)) & 0x0F) - 8;
}

static void dequant_row(int id, const uint8_t *row, const float *scale, int per_elem, uint32_t d,
                        float *x) {
  if (!is4(id) && kvt_codec_level) {
    deq8_avx2((const int8_t *)row, scale, per_elem, d, x);
    return;
  }
  for (uint32_t i = 0; i < d; i++) x[i] = (float)code_at(id, row, i) * scale[per_elem ? i : 0];
}

void kvt_k_decode(int id, const kvt_cshape *s, const uint8_t *body, void *out, uint32_t dtype) {
  const uint32_t T = s->n_tokens, H = s->n_heads, D = s->head_dim;
  const size_t es = kvt_dtype_size(dtype), rb = row_bytes(id, D);
  const uint8_t *codes = body + 2 * n_scales(id, s);
  const int per_ch = id == KVT_CODEC_K8C;
  float x[KVT_MAX_HEAD_DIM], sc[KVT_MAX_HEAD_DIM];
  for (uint32_t h = 0; h < H; h++) {
    if (per_ch)
      for (uint32_t d = 0; d < D; d++) sc[d] = kvt_f16_to_f32(kvt_rd16(body + 2 * ((size_t)h * D + d)));
    for (uint32_t t = 0; t < T; t++) {
      size_t v = (size_t)t * H + h;
      if (!per_ch) sc[0] = kvt_f16_to_f32(kvt_rd16(body + 2 * v));
      dequant_row(id, codes + v * rb, sc, per_ch, D, x);
      kvt_vec_from_f32_sat(x, dtype, D, (uint8_t *)out + v * D * es);
    }
  }
}

/* ---------- attention: q . k on the codes ---------- */

KVT_AVX2 static float dot8_avx2(const float *q, const int8_t *c, uint32_t n) {
  __m256 acc = _mm256_setzero_ps();
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i ci = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(c + i)));
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_cvtepi32_ps(ci), acc);
  }
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_shuffle_ps(r, r, 1));
  float sum = _mm_cvtss_f32(r);
  for (; i < n; i++) sum += q[i] * (float)c[i];
  return sum;
}

void kvt_codec_k_dots(int id, const kvt_cshape *s, const uint8_t *enc, uint32_t h, const float *q,
                      float *scores) {
  const uint32_t T = s->n_tokens, H = s->n_heads, D = s->head_dim;
  const uint8_t *body = enc + KVT_CODEC_HDR, *codes = body + 2 * n_scales(id, s);
  const size_t rb = row_bytes(id, D);
  float qs[KVT_MAX_HEAD_DIM];
  for (uint32_t d = 0; d < D; d++) /* k8c: fold the channel scales into q once */
    qs[d] = id == KVT_CODEC_K8C ? q[d] * kvt_f16_to_f32(kvt_rd16(body + 2 * ((size_t)h * D + d))) : q[d];
  for (uint32_t t = 0; t < T; t++) {
    size_t v = (size_t)t * H + h;
    const uint8_t *row = codes + v * rb;
    float dot = 0;
    if (!is4(id) && kvt_codec_level) dot = dot8_avx2(qs, (const int8_t *)row, D);
    else
      for (uint32_t d = 0; d < D; d++) dot += qs[d] * (float)code_at(id, row, d);
    scores[t] = id == KVT_CODEC_K8C ? dot : dot * kvt_f16_to_f32(kvt_rd16(body + 2 * v));
  }
}
