/* codec_v.c - value codecs: the PolyKV/TurboQuant scheme. Per (token, head)
 * vector: store its L2 norm (f16); flip signs by a seeded random +-1
 * diagonal, apply a fast Walsh-Hadamard transform over vdim (head_dim
 * padded to a power of two, >= 8) and map each coordinate, divided by
 * norm/sqrt(vdim), to the nearest Lloyd-Max centroid of N(0,1) with 2, 3 or
 * 4 bits. Body: norms f16[T][H], then codes[T][H][vdim/8 * bits]: groups of
 * 8 codes in `bits` bytes, code i at bits (bits * i), little-endian.
 * Scalar and AVX2 paths do the same float operations in the same order, so
 * they produce the same bytes. */
#include <math.h>
#include <string.h>

#include <immintrin.h>

#include "kvtier.h"
#include "tiers/codec_impl.h"

/* Lloyd-Max quantizers for a standard Gaussian (centroids ascending). */
static const float lm2[8] = {-1.5104f, -0.4528f, 0.4528f, 1.5104f}; /* padded: loaded 8 at a time */
static const float lm3[8] = {-2.1520f, -1.3440f, -0.7560f, -0.2451f,
                             0.2451f,  0.7560f,  1.3440f,  2.1520f};
static const float lm4[16] = {-2.7326f, -2.0690f, -1.6181f, -1.2562f, -0.9424f, -0.6568f,
                              -0.3881f, -0.1284f, 0.1284f,  0.3881f,  0.6568f,  0.9424f,
                              1.2562f,  1.6181f,  2.0690f,  2.7326f};

static const float *centroids(int bits) { return bits == 2 ? lm2 : bits == 3 ? lm3 : lm4; }

typedef struct vq {
  int bits, n_levels;
  uint32_t vdim;
  const float *c;
  float bound[15];              /* midpoints between centroids */
  float sign[KVT_MAX_HEAD_DIM]; /* the random diagonal */
} vq;

uint32_t kvt_codec_vdim(uint32_t head_dim) {
  uint32_t v = 8;
  while (v < head_dim) v <<= 1;
  return v;
}

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void vq_init(vq *q, int bits, const kvt_cshape *s) {
  q->bits = bits;
  q->n_levels = 1 << bits;
  q->vdim = kvt_codec_vdim(s->head_dim);
  q->c = centroids(bits);
  for (int i = 0; i + 1 < q->n_levels; i++) q->bound[i] = 0.5f * (q->c[i] + q->c[i + 1]);
  uint64_t st = s->seed, w = 0;
  for (uint32_t i = 0; i < q->vdim; i++) {
    if (i % 64 == 0) w = splitmix64(&st);
    q->sign[i] = (w >> (i % 64)) & 1 ? -1.0f : 1.0f;
  }
}

static size_t code_bytes(int bits, uint32_t vdim) { return (size_t)vdim / 8 * bits; }

size_t kvt_v_size(int bits, const kvt_cshape *s) {
  size_t n = (size_t)s->n_tokens * s->n_heads;
  return 2 * n + n * code_bytes(bits, kvt_codec_vdim(s->head_dim));
}

/* ---------- Walsh-Hadamard (unnormalised, in place) ---------- */

static void fwht_c(float *x, uint32_t n) {
  for (uint32_t h = 1; h < n; h <<= 1)
    for (uint32_t i = 0; i < n; i += 2 * h)
      for (uint32_t j = i; j < i + h; j++) {
        float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

/* Same butterflies, same order: h = 1, 2, 4 inside a register, then wider. */
KVT_AVX2 static void fwht_avx2(float *x, uint32_t n) {
  for (uint32_t i = 0; i < n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i), sw;
    sw = _mm256_permute_ps(v, 0xB1);
    v = _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xAA);
    sw = _mm256_permute_ps(v, 0x4E);
    v = _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xCC);
    sw = _mm256_permute2f128_ps(v, v, 0x01);
    v = _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xF0);
    _mm256_storeu_ps(x + i, v);
  }
  for (uint32_t h = 8; h < n; h <<= 1)
    for (uint32_t i = 0; i < n; i += 2 * h)
      for (uint32_t j = i; j < i + h; j += 8) {
        __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
        _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
      }
}

static void fwht(float *x, uint32_t n) {
  if (kvt_codec_level) fwht_avx2(x, n);
  else fwht_c(x, n);
}

/* ---------- sum of squares, in the lane order of the AVX2 path ---------- */

static float sumsq_c(const float *x, uint32_t n) {
  float s[8] = {0};
  for (uint32_t i = 0; i < n; i += 8)
    for (int j = 0; j < 8; j++) s[j] = s[j] + x[i + j] * x[i + j];
  float a0 = s[0] + s[4], a1 = s[1] + s[5], a2 = s[2] + s[6], a3 = s[3] + s[7];
  return (a0 + a2) + (a1 + a3);
}

KVT_AVX2 static float sumsq_avx2(const float *x, uint32_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (uint32_t i = 0; i < n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
  }
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_shuffle_ps(r, r, 1));
  return _mm_cvtss_f32(r);
}

/* ---------- quantize and pack one rotated vector ---------- */

static void pack_c(const vq *q, const float *y, float inv, uint8_t *out) {
  for (uint32_t g = 0; g < q->vdim; g += 8) {
    uint32_t word = 0;
    for (uint32_t i = 0; i < 8; i++) {
      float v = y[g + i] * inv;
      uint32_t code = 0;
      for (int b = 0; b + 1 < q->n_levels; b++) code += v > q->bound[b];
      word |= code << (q->bits * i);
    }
    for (int b = 0; b < q->bits; b++) *out++ = (uint8_t)(word >> (8 * b));
  }
}

KVT_AVX2 static void pack_avx2(const vq *q, const float *y, float inv, uint8_t *out) {
  const __m256 iv = _mm256_set1_ps(inv);
  const __m256i shifts = _mm256_mullo_epi32(_mm256_set1_epi32(q->bits),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (uint32_t g = 0; g < q->vdim; g += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(y + g), iv);
    __m256i code = _mm256_setzero_si256();
    for (int b = 0; b + 1 < q->n_levels; b++) /* a true compare is -1: subtract it */
      code = _mm256_sub_epi32(code, _mm256_castps_si256(
                                        _mm256_cmp_ps(v, _mm256_set1_ps(q->bound[b]), _CMP_GT_OQ)));
    __m256i w = _mm256_sllv_epi32(code, shifts);
    __m128i r = _mm_or_si128(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    r = _mm_or_si128(r, _mm_unpackhi_epi64(r, r));
    r = _mm_or_si128(r, _mm_srli_epi64(r, 32));
    uint32_t word = (uint32_t)_mm_cvtsi128_si32(r);
    for (int b = 0; b < q->bits; b++) *out++ = (uint8_t)(word >> (8 * b));
  }
}

/* Encode one vector of head_dim values already in x[0..vdim) (zero padded).
 * x is destroyed. Returns the stored f16 norm. */
static uint16_t encode_vec(const vq *q, float *x, uint8_t *codes) {
  int simd = kvt_codec_level > 0;
  float ss = simd ? sumsq_avx2(x, q->vdim) : sumsq_c(x, q->vdim);
  uint16_t n16 = kvt_f32_to_f16(sqrtf(ss));
  if ((n16 & 0x7C00) == 0x7C00) n16 = 0x7BFF;
  float nf = kvt_f16_to_f32(n16), inv = nf > 0 ? 1.0f / nf : 0.0f;
  for (uint32_t i = 0; i < q->vdim; i++) x[i] = x[i] * q->sign[i];
  fwht(x, q->vdim);
  /* y = H(s x) has coordinates ~ N(0, |x|^2): y / |x| is what the
   * centroids of N(0,1) quantize (the normalised transform's sqrt(vdim)
   * cancels against the scale norm / sqrt(vdim)). */
  if (simd) pack_avx2(q, x, inv, codes);
  else pack_c(q, x, inv, codes);
  return n16;
}

int kvt_v_encode(int bits, const kvt_cshape *s, const void *in, uint32_t dtype, uint8_t *body) {
  vq q;
  vq_init(&q, bits, s);
  const size_t n = (size_t)s->n_tokens * s->n_heads, es = kvt_dtype_size(dtype);
  const size_t cb = code_bytes(bits, q.vdim);
  uint8_t *codes = body + 2 * n;
  float x[KVT_MAX_HEAD_DIM];
  for (size_t v = 0; v < n; v++) {
    kvt_vec_to_f32((const uint8_t *)in + v * s->head_dim * es, dtype, s->head_dim, x);
    for (uint32_t i = s->head_dim; i < q.vdim; i++) x[i] = 0;
    kvt_wr16(body + 2 * v, encode_vec(&q, x, codes + v * cb));
  }
  return 0;
}

int kvt_v_check(int bits, const kvt_cshape *s, const uint8_t *body) {
  (void)bits; /* every code of 2, 3 or 4 bits names a centroid */
  size_t n = (size_t)s->n_tokens * s->n_heads;
  for (size_t v = 0; v < n; v++)
    if (!kvt_f16_ok(kvt_rd16(body + 2 * v))) return KVT_ECORRUPT;
  return 0;
}

/* ---------- unpack ---------- */

static uint32_t group_word(const uint8_t *p, int bits) {
  uint32_t w = 0;
  for (int b = 0; b < bits; b++) w |= (uint32_t)p[b] << (8 * b);
  return w;
}

/* y[i] = scale * centroid(code i) for one vector. */
static void unpack_c(const vq *q, const uint8_t *codes, float scale, float *y) {
  uint32_t mask = (uint32_t)q->n_levels - 1;
  for (uint32_t g = 0; g < q->vdim; g += 8, codes += q->bits) {
    uint32_t w = group_word(codes, q->bits);
    for (uint32_t i = 0; i < 8; i++) y[g + i] = scale * q->c[(w >> (q->bits * i)) & mask];
  }
}

KVT_AVX2 static __m256 centroid_lanes(const vq *q, __m256i code) {
  if (q->bits < 4) return _mm256_permutevar8x32_ps(_mm256_loadu_ps(q->c), code);
  __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(q->c), code);
  __m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(q->c + 8), code);
  __m256 use_hi = _mm256_castsi256_ps(_mm256_slli_epi32(code, 28)); /* bit 3 to the sign */
  return _mm256_blendv_ps(lo, hi, use_hi);
}

KVT_AVX2 static __m256i group_codes(const vq *q, const uint8_t *p, __m256i shifts, __m256i mask) {
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)group_word(p, q->bits)), shifts),
                          mask);
}

KVT_AVX2 static void unpack_avx2(const vq *q, const uint8_t *codes, float scale, float *y) {
  const __m256i shifts = _mm256_mullo_epi32(_mm256_set1_epi32(q->bits),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i mask = _mm256_set1_epi32(q->n_levels - 1);
  const __m256 sc = _mm256_set1_ps(scale);
  for (uint32_t g = 0; g < q->vdim; g += 8, codes += q->bits)
    _mm256_storeu_ps(y + g, _mm256_mul_ps(centroid_lanes(q, group_codes(q, codes, shifts, mask)), sc));
}

/* acc[i] += w * centroid(code i) */
KVT_AVX2 static void accum_avx2(const vq *q, const uint8_t *codes, float w, float *acc) {
  const __m256i shifts = _mm256_mullo_epi32(_mm256_set1_epi32(q->bits),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i mask = _mm256_set1_epi32(q->n_levels - 1);
  const __m256 wv = _mm256_set1_ps(w);
  for (uint32_t g = 0; g < q->vdim; g += 8, codes += q->bits) {
    __m256 c = centroid_lanes(q, group_codes(q, codes, shifts, mask));
    _mm256_storeu_ps(acc + g, _mm256_fmadd_ps(c, wv, _mm256_loadu_ps(acc + g)));
  }
}

void kvt_v_decode(int bits, const kvt_cshape *s, const uint8_t *body, void *out, uint32_t dtype) {
  vq q;
  vq_init(&q, bits, s);
  const size_t n = (size_t)s->n_tokens * s->n_heads, es = kvt_dtype_size(dtype);
  const size_t cb = code_bytes(bits, q.vdim);
  const uint8_t *codes = body + 2 * n;
  float y[KVT_MAX_HEAD_DIM];
  for (size_t v = 0; v < n; v++) {
    /* v = s . H(c * norm / sqrt(vdim)) / sqrt(vdim) = s . H(c) * norm / vdim */
    float scale = kvt_f16_to_f32(kvt_rd16(body + 2 * v)) / (float)q.vdim;
    if (kvt_codec_level) unpack_avx2(&q, codes + v * cb, scale, y);
    else unpack_c(&q, codes + v * cb, scale, y);
    fwht(y, q.vdim);
    for (uint32_t i = 0; i < s->head_dim; i++) y[i] = y[i] * q.sign[i];
    kvt_vec_from_f32_sat(y, dtype, s->head_dim, (uint8_t *)out + v * s->head_dim * es);
  }
}

/* ---------- attention: sum_t p_t v_t, rotated once per head ---------- */

void kvt_codec_v_accum(int id, const kvt_cshape *s, const uint8_t *enc, uint32_t h, const float *p,
                       float *acc) {
  const kvt_codec *c = kvt_codec_get(id);
  vq q;
  q.bits = c->bits;
  q.n_levels = 1 << c->bits;
  q.vdim = kvt_codec_vdim(s->head_dim);
  q.c = centroids(c->bits);
  const uint8_t *body = enc + KVT_CODEC_HDR;
  const size_t n = (size_t)s->n_tokens * s->n_heads, cb = code_bytes(q.bits, q.vdim);
  float y[KVT_MAX_HEAD_DIM];
  for (uint32_t t = 0; t < s->n_tokens; t++) {
    size_t v = (size_t)t * s->n_heads + h;
    float w = p[t] * kvt_f16_to_f32(kvt_rd16(body + 2 * v)) / (float)q.vdim;
    if (w == 0) continue;
    if (kvt_codec_level) {
      accum_avx2(&q, body + 2 * n + v * cb, w, acc);
    } else {
      unpack_c(&q, body + 2 * n + v * cb, w, y);
      for (uint32_t i = 0; i < q.vdim; i++) acc[i] += y[i];
    }
  }
}

void kvt_codec_v_unrotate(const kvt_cshape *s, float *acc, float *out) {
  vq q;
  vq_init(&q, 3, s);
  fwht(acc, q.vdim);
  for (uint32_t i = 0; i < s->head_dim; i++) out[i] = acc[i] * q.sign[i];
}
