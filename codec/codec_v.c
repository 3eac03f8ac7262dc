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

#include "codec/codec_impl.h"
#include "kvtier.h"

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

/* The `bits` bytes of a group of 8 codes as one little-endian word. */
static inline uint32_t group_word(const uint8_t *p, int bits) {
  uint32_t w = 0;
  for (int b = 0; b < bits; b++) w |= (uint32_t)p[b] << (8 * b);
  return w;
}

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

/* The stored f16 norm of a vector whose squares sum to ss; *inv = 1 / norm
 * as used (0 for a zero norm). */
static uint16_t norm_of(float ss, float *inv) {
  uint16_t n16 = kvt_f32_to_f16(sqrtf(ss));
  if ((n16 & 0x7C00) == 0x7C00) n16 = 0x7BFF;
  float nf = kvt_f16_to_f32(n16);
  *inv = nf > 0 ? 1.0f / nf : 0.0f;
  return n16;
}

/* Encode one vector of head_dim values already in x[0..vdim) (zero padded).
 * x is destroyed. Returns the stored f16 norm. */
static uint16_t encode_vec(const vq *q, float *x, uint8_t *codes) {
  int simd = kvt_codec_level > 0;
  float inv;
  uint16_t n16 = norm_of(simd ? sumsq_avx2(x, q->vdim) : sumsq_c(x, q->vdim), &inv);
  for (uint32_t i = 0; i < q->vdim; i++) x[i] = x[i] * q->sign[i];
  fwht(x, q->vdim);
  /* y = H(s x) has coordinates ~ N(0, |x|^2): y / |x| is what the
   * centroids of N(0,1) quantize (the normalised transform's sqrt(vdim)
   * cancels against the scale norm / sqrt(vdim)). */
  if (simd) pack_avx2(q, x, inv, codes);
  else pack_c(q, x, inv, codes);
  return n16;
}

/* ---------- AVX2: one whole vector in registers ----------
 * The kernels below run the float operations of the scalar code above in
 * the same order on a vector held in ng = vdim / 8 registers, instantiated
 * for constant (bits, ng) where it matters, so nothing goes through memory
 * between unpacking, the transform and the output. */

#define NG_REG_MAX 16 /* registers of the largest vector kept in them */

/* One vector, 8 floats a register. Passed by value between the inline
 * kernels, so it stays in registers (no pointer to it for the compiler or
 * a sanitizer to track). */
typedef struct vregs {
  __m256 r[NG_REG_MAX];
} vregs;

/* The butterflies h = 1, 2, 4 inside one register, as fwht_avx2. */
KVT_AVX2 static KVT_INLINE __m256 bfly8(__m256 v) {
  __m256 sw = _mm256_permute_ps(v, 0xB1);
  v = _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xAA);
  sw = _mm256_permute_ps(v, 0x4E);
  v = _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xCC);
  sw = _mm256_permute2f128_ps(v, v, 0x01);
  return _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xF0);
}

/* One butterfly stage h (in registers) over ng registers. */
KVT_AVX2 static KVT_INLINE vregs stage_regs(vregs x, uint32_t ng, uint32_t h) {
  KVT_UNROLL
  for (uint32_t i = 0; i < ng; i += 2 * h)
    KVT_UNROLL
    for (uint32_t j = i; j < i + h; j++) {
      __m256 a = x.r[j], b = x.r[j + h];
      x.r[j] = _mm256_add_ps(a, b);
      x.r[j + h] = _mm256_sub_ps(a, b);
    }
  return x;
}

/* fwht_c on ng registers: every stage in order, h = 8.. between registers. */
KVT_AVX2 static KVT_INLINE vregs fwht_regs(vregs x, uint32_t ng) {
  KVT_UNROLL
  for (uint32_t i = 0; i < ng; i++) x.r[i] = bfly8(x.r[i]);
  _Static_assert(NG_REG_MAX <= 16, "the stages below");
  const uint32_t hs[4] = {1, 2, 4, 8};
  KVT_UNROLL
  for (int k = 0; k < 4; k++)
    if (hs[k] < ng) x = stage_regs(x, ng, hs[k]);
  return x;
}

/* The word of group g of a vector of ng groups: 4 bytes loaded at once
 * but for the last group, whose extra bytes may be past the codes (the
 * bits above 8 * bits are never used). */
static inline uint32_t load_group(const uint8_t *codes, int bits, uint32_t g, uint32_t ng) {
  uint32_t w;
  if (g + 1 == ng && bits < 4) return group_word(codes + g * bits, bits);
  memcpy(&w, codes + g * bits, 4);
  return w;
}

/* The codes of a group's word, one per lane. */
KVT_AVX2 static KVT_INLINE __m256i codes_of(int bits, uint32_t w) {
  const __m256i shifts =
      _mm256_mullo_epi32(_mm256_set1_epi32(bits), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), shifts),
                          _mm256_set1_epi32((1 << bits) - 1));
}

/* Centroid of each lane's code: c[0..8) in clo, c[8..16) in chi (4-bit). */
KVT_AVX2 static KVT_INLINE __m256 lanes_of(int bits, __m256 clo, __m256 chi, __m256i code) {
  __m256 lo = _mm256_permutevar8x32_ps(clo, code);
  if (bits < 4) return lo;
  __m256 hi = _mm256_permutevar8x32_ps(chi, code);
  return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(code, 28))); /* bit 3 */
}

/* x = s . H(c * scale) for one vector (unpack_c, fwht, the signs). */
KVT_AVX2 static KVT_INLINE vregs vdec_regs(const vq *q, int bits, uint32_t ng, const uint8_t *codes,
                                           float scale) {
  const __m256 clo = _mm256_loadu_ps(q->c), chi = bits == 4 ? _mm256_loadu_ps(q->c + 8) : clo;
  const __m256 sc = _mm256_set1_ps(scale);
  vregs x;
  KVT_UNROLL
  for (uint32_t g = 0; g < ng; g++) {
    __m256i code = codes_of(bits, load_group(codes, bits, g, ng));
    x.r[g] = _mm256_mul_ps(lanes_of(bits, clo, chi, code), sc);
  }
  x = fwht_regs(x, ng);
  KVT_UNROLL
  for (uint32_t g = 0; g < ng; g++)
    x.r[g] = _mm256_mul_ps(x.r[g], _mm256_loadu_ps(q->sign + 8 * g));
  return x;
}

/* The first d values of x to dtype at out, as kvt_vec_from_f32_sat: from
 * the registers when d is all of them (head_dim a power of two). */
KVT_AVX2 static KVT_INLINE void store_regs(vregs x, uint32_t ng, uint32_t d, uint32_t dtype,
                                           uint8_t *out) {
  const size_t es = dtype == KVT_F32 ? 4 : 2;
  if (d == 8 * ng) {
    KVT_UNROLL
    for (uint32_t g = 0; g < ng; g++) kvt_st8(out + 8 * g * es, dtype, x.r[g]);
    return;
  }
  float t[NG_REG_MAX * 8];
  KVT_UNROLL
  for (uint32_t g = 0; g < ng; g++) _mm256_storeu_ps(t + 8 * g, x.r[g]);
  kvt_vec_from_f32_sat(t, dtype, d, out);
}

KVT_AVX2 static KVT_INLINE void v_decode_regs(const vq *q, int bits, uint32_t ng,
                                              const kvt_cshape *s, const uint8_t *body, void *out,
                                              uint32_t dtype) {
  const size_t n = (size_t)s->n_tokens * s->n_heads, es = kvt_dtype_size(dtype);
  const uint8_t *codes = body + 2 * n;
  for (size_t v = 0; v < n; v++) {
    /* v = s . H(c * norm / sqrt(vdim)) / sqrt(vdim) = s . H(c) * norm / vdim */
    float scale = _cvtsh_ss(kvt_rd16(body + 2 * v)) / (float)(8 * ng);
    vregs x = vdec_regs(q, bits, ng, codes + v * ng * bits, scale);
    store_regs(x, ng, s->head_dim, dtype, (uint8_t *)out + v * s->head_dim * es);
  }
}

/* Other vdims: the same operations through memory. */
KVT_AVX2 static void v_decode_mem(const vq *q, const kvt_cshape *s, const uint8_t *body, void *out,
                                  uint32_t dtype) {
  const size_t n = (size_t)s->n_tokens * s->n_heads, es = kvt_dtype_size(dtype);
  const uint32_t ng = q->vdim / 8;
  const uint8_t *codes = body + 2 * n;
  const __m256 clo = _mm256_loadu_ps(q->c), chi = q->bits == 4 ? _mm256_loadu_ps(q->c + 8) : clo;
  float y[KVT_MAX_HEAD_DIM];
  for (size_t v = 0; v < n; v++, codes += ng * q->bits) {
    const __m256 sc = _mm256_set1_ps(_cvtsh_ss(kvt_rd16(body + 2 * v)) / (float)q->vdim);
    for (uint32_t g = 0; g < ng; g++) {
      __m256i code = codes_of(q->bits, load_group(codes, q->bits, g, ng));
      _mm256_storeu_ps(y + 8 * g, _mm256_mul_ps(lanes_of(q->bits, clo, chi, code), sc));
    }
    fwht_avx2(y, q->vdim);
    for (uint32_t i = 0; i < s->head_dim; i++) y[i] = y[i] * q->sign[i];
    kvt_vec_from_f32_sat(y, dtype, s->head_dim, (uint8_t *)out + v * s->head_dim * es);
  }
}

/* One function per constant (bits, ng), chosen from a table: a single
 * function holding every instance is slow to compile and to optimise. */
typedef void vdec_fn(const vq *q, const kvt_cshape *s, const uint8_t *body, void *out, uint32_t dt);
#define VDEC(b, n)                                                                               \
  KVT_AVX2 KVT_NOINLINE static void vdec_##b##_##n(const vq *q, const kvt_cshape *s,            \
                                                   const uint8_t *body, void *out, uint32_t dt) { \
    v_decode_regs(q, b, n, s, body, out, dt);                                                    \
  }
VDEC(2, 8)
VDEC(3, 8)
VDEC(4, 8)
VDEC(2, 16)
VDEC(3, 16)
VDEC(4, 16)
static vdec_fn *const vdec_fns[3][2] = {
    {vdec_2_8, vdec_2_16}, {vdec_3_8, vdec_3_16}, {vdec_4_8, vdec_4_16}};

KVT_AVX2 static void v_decode_avx2(const vq *q, const kvt_cshape *s, const uint8_t *body, void *out,
                                   uint32_t dtype) {
  const uint32_t ng = q->vdim / 8;
  if (ng == 8 || ng == 16) vdec_fns[q->bits - 2][ng == 16](q, s, body, out, dtype);
  else v_decode_mem(q, s, body, out, dtype);
}

/* Vector load for the encoder: d values of dtype, zero padded to 8 ng;
 * nonzero when any is infinite or NaN (tested in f32, where every dtype's
 * infinities and NaNs are all-ones exponents). */
KVT_AVX2 static KVT_INLINE vregs vload_regs(const uint8_t *in, uint32_t dtype, uint32_t d,
                                            uint32_t ng, int *nonfinite) {
  const size_t es = dtype == KVT_F32 ? 4 : 2;
  vregs x;
  if (d != 8 * ng) { /* through memory: head_dim not a power of two */
    float t[NG_REG_MAX * 8] = {0};
    *nonfinite = kvt_vec_load(in, dtype, d, t);
    KVT_UNROLL
    for (uint32_t g = 0; g < ng; g++) x.r[g] = _mm256_loadu_ps(t + 8 * g);
    return x;
  }
  const __m256i e = _mm256_set1_epi32(0x7F800000);
  __m256i bad = _mm256_setzero_si256();
  KVT_UNROLL
  for (uint32_t g = 0; g < ng; g++) {
    const uint8_t *p = in + 8 * g * es;
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (dtype == KVT_F16) x.r[g] = _mm256_cvtph_ps(h);
    else if (dtype == KVT_F32) x.r[g] = _mm256_loadu_ps((const float *)p);
    else x.r[g] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    __m256i u = _mm256_and_si256(_mm256_castps_si256(x.r[g]), e);
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(u, e));
  }
  *nonfinite = !_mm256_testz_si256(bad, bad);
  return x;
}

/* sumsq_avx2 on registers: the same lanes, the same reduction. */
KVT_AVX2 static KVT_INLINE float sumsq_regs(vregs x, uint32_t ng) {
  __m256 acc = _mm256_setzero_ps();
  KVT_UNROLL
  for (uint32_t g = 0; g < ng; g++) acc = _mm256_add_ps(acc, _mm256_mul_ps(x.r[g], x.r[g]));
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  return _mm_cvtss_f32(_mm_add_ss(r, _mm_shuffle_ps(r, r, 1)));
}

/* The positive boundaries' bits, P_k below, one per register. */
typedef struct vbounds {
  __m256i p[8];
} vbounds;

/* pack_c's codes by compares on |v| against the positive boundaries:
 * they are symmetric (bound[L/2-1-k] = -bound[L/2-1+k] exactly, and
 * bound[L/2-1] = +0), so with a = the bits of |v| (ordered as the floats),
 *   v >= +0:  code = L/2-1 + #{k : a > P_k}
 *   v <= -0:  code = L/2-1 - #{k >= 1 : a >= P_k} = (L/2-1 + #{k : a+1 > P_k}) ^ (L-1)
 * with P_k the bits of bound[L/2-1+k]. NaN is made -inf first: no boundary
 * is below either, code 0, as pack_c's compares give it. */
KVT_AVX2 static KVT_INLINE __m256i code_lanes(int bits, __m256 v, vbounds P) {
  const int L = 1 << bits;
  __m256i u = _mm256_castps_si256(_mm256_max_ps(v, _mm256_set1_ps(-INFINITY)));
  __m256i neg = _mm256_srai_epi32(u, 31);
  __m256i a = _mm256_sub_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), neg);
  __m256i cnt = _mm256_set1_epi32(L / 2 - 1);
  KVT_UNROLL
  for (int k = 0; k < L / 2; k++) cnt = _mm256_sub_epi32(cnt, _mm256_cmpgt_epi32(a, P.p[k]));
  return _mm256_xor_si256(cnt, _mm256_and_si256(neg, _mm256_set1_epi32(L - 1)));
}

/* Four groups of codes (one per lane of c0..c3) packed as pack_c does,
 * 4 * bits bytes at out; writes up to 8 - 2 * bits bytes beyond them.
 * Bytes, then pairs (multiply-add by 1, 2^bits), then quads (1, 2^2bits),
 * then each group's two halves joined in its 64-bit lane. */
KVT_AVX2 static KVT_INLINE void pack4(int bits, __m256i c0, __m256i c1, __m256i c2, __m256i c3,
                                      uint8_t *out) {
  __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(c0, c1), _mm256_packs_epi32(c2, c3));
  b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)); /* group order */
  __m256i w = _mm256_maddubs_epi16(b, _mm256_set1_epi16((short)(1 | (1 << bits) << 8)));
  w = _mm256_madd_epi16(w, _mm256_set1_epi32(1 | (1 << 2 * bits) << 16));
  w = _mm256_add_epi64(w, _mm256_srli_epi64(w, 32 - 4 * bits));
  /* bytes 0..bits-1 of each 64-bit lane; -1 (top bit set) gives 0 */
  const __m256i pick =
      bits == 2 ? _mm256_setr_epi8(0, 1, 8, 9, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1,
                                   8, 9, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1)
      : bits == 3
          ? _mm256_setr_epi8(0, 1, 2, 8, 9, 10, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 2, 8,
                             9, 10, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1)
          : _mm256_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 2, 3,
                             8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1);
  w = _mm256_shuffle_epi8(w, pick);
  _mm_storel_epi64((__m128i *)out, _mm256_castsi256_si128(w));
  _mm_storel_epi64((__m128i *)(out + 2 * bits), _mm256_extracti128_si256(w, 1));
}

/* encode_vec on registers, for ng a multiple of 4. */
KVT_AVX2 static KVT_INLINE uint16_t venc_regs(const vq *q, int bits, uint32_t ng, vbounds P,
                                              vregs x, uint8_t *codes) {
  float inv;
  uint16_t n16 = norm_of(sumsq_regs(x, ng), &inv);
  KVT_UNROLL
  for (uint32_t g = 0; g < ng; g++)
    x.r[g] = _mm256_mul_ps(x.r[g], _mm256_loadu_ps(q->sign + 8 * g));
  x = fwht_regs(x, ng);
  const __m256 iv = _mm256_set1_ps(inv);
  uint8_t stage[NG_REG_MAX * 4 + 8]; /* room for pack4's overrun */
  KVT_UNROLL
  for (uint32_t g = 0; g < ng; g += 4)
    pack4(bits, code_lanes(bits, _mm256_mul_ps(x.r[g], iv), P),
          code_lanes(bits, _mm256_mul_ps(x.r[g + 1], iv), P),
          code_lanes(bits, _mm256_mul_ps(x.r[g + 2], iv), P),
          code_lanes(bits, _mm256_mul_ps(x.r[g + 3], iv), P), stage + g * bits);
  memcpy(codes, stage, (size_t)ng * bits);
  return n16;
}

KVT_AVX2 static KVT_INLINE int v_encode_regs(const vq *q, int bits, uint32_t ng,
                                             const kvt_cshape *s, const void *in, uint32_t dtype,
                                             uint8_t *body) {
  const size_t n = (size_t)s->n_tokens * s->n_heads, es = kvt_dtype_size(dtype);
  uint8_t *codes = body + 2 * n;
  vbounds P;
  for (int k = 0; k < q->n_levels / 2; k++) {
    int32_t b;
    memcpy(&b, &q->bound[q->n_levels / 2 - 1 + k], 4);
    P.p[k] = _mm256_set1_epi32(b);
  }
  for (size_t v = 0; v < n; v++) {
    int bad;
    vregs x = vload_regs((const uint8_t *)in + v * s->head_dim * es, dtype, s->head_dim, ng, &bad);
    if (bad) return KVT_ENONFINITE;
    kvt_wr16(body + 2 * v, venc_regs(q, bits, ng, P, x, codes + v * ng * bits));
  }
  return 0;
}

typedef int venc_fn(const vq *q, const kvt_cshape *s, const void *in, uint32_t dt, uint8_t *body);
#define VENC(b, n)                                                                            \
  KVT_AVX2 KVT_NOINLINE static int venc_##b##_##n(const vq *q, const kvt_cshape *s,          \
                                                  const void *in, uint32_t dt, uint8_t *body) { \
    return v_encode_regs(q, b, n, s, in, dt, body);                                           \
  }
VENC(2, 8)
VENC(3, 8)
VENC(4, 8)
VENC(2, 16)
VENC(3, 16)
VENC(4, 16)
/* vdim 64 or 128 (others: encode_vec, through memory) */
static venc_fn *const venc_fns[3][2] = {
    {venc_2_8, venc_2_16}, {venc_3_8, venc_3_16}, {venc_4_8, venc_4_16}};

/* ---------- encode, check, decode ---------- */

int kvt_v_encode(int bits, const kvt_cshape *s, const void *in, uint32_t dtype, uint8_t *body) {
  vq q;
  vq_init(&q, bits, s);
  if (kvt_codec_level > 0 && (q.vdim == 64 || q.vdim == 128))
    return venc_fns[bits - 2][q.vdim == 128](&q, s, in, dtype, body);
  const size_t n = (size_t)s->n_tokens * s->n_heads, es = kvt_dtype_size(dtype);
  const size_t cb = code_bytes(bits, q.vdim);
  uint8_t *codes = body + 2 * n;
  float x[KVT_MAX_HEAD_DIM];
  for (size_t v = 0; v < n; v++) {
    if (kvt_vec_load((const uint8_t *)in + v * s->head_dim * es, dtype, s->head_dim, x))
      return KVT_ENONFINITE;
    for (uint32_t i = s->head_dim; i < q.vdim; i++) x[i] = 0;
    kvt_wr16(body + 2 * v, encode_vec(&q, x, codes + v * cb));
  }
  return 0;
}

int kvt_v_check(int bits, const kvt_cshape *s, const uint8_t *body) {
  (void)bits; /* every code of 2, 3 or 4 bits names a centroid */
  size_t n = (size_t)s->n_tokens * s->n_heads;
  unsigned bad = 0;
  for (size_t v = 0; v < n; v++) bad |= !kvt_f16_ok(kvt_rd16(body + 2 * v));
  return bad ? KVT_ECORRUPT : 0;
}

/* y[i] = scale * centroid(code i) for one vector. */
static void unpack_c(const vq *q, const uint8_t *codes, float scale, float *y) {
  uint32_t mask = (uint32_t)q->n_levels - 1;
  for (uint32_t g = 0; g < q->vdim; g += 8, codes += q->bits) {
    uint32_t w = group_word(codes, q->bits);
    for (uint32_t i = 0; i < 8; i++) y[g + i] = scale * q->c[(w >> (q->bits * i)) & mask];
  }
}

void kvt_v_decode(int bits, const kvt_cshape *s, const uint8_t *body, void *out, uint32_t dtype) {
  vq q;
  vq_init(&q, bits, s);
  if (kvt_codec_level > 0) {
    v_decode_avx2(&q, s, body, out, dtype);
    return;
  }
  const size_t n = (size_t)s->n_tokens * s->n_heads, es = kvt_dtype_size(dtype);
  const size_t cb = code_bytes(bits, q.vdim);
  const uint8_t *codes = body + 2 * n;
  float y[KVT_MAX_HEAD_DIM];
  for (size_t v = 0; v < n; v++) {
    /* v = s . H(c * norm / sqrt(vdim)) / sqrt(vdim) = s . H(c) * norm / vdim */
    float scale = kvt_f16_to_f32(kvt_rd16(body + 2 * v)) / (float)q.vdim;
    unpack_c(&q, codes + v * cb, scale, y);
    fwht(y, q.vdim);
    for (uint32_t i = 0; i < s->head_dim; i++) y[i] = y[i] * q.sign[i];
    kvt_vec_from_f32_sat(y, dtype, s->head_dim, (uint8_t *)out + v * s->head_dim * es);
  }
}

/* ---------- lean forms: u8 log2 norms, no header ---------- */

size_t kvt_vl_size(int bits, const kvt_cshape *s) {
  size_t n = (size_t)s->n_tokens * s->n_heads;
  return n + n * code_bytes(bits, kvt_codec_vdim(s->head_dim));
}

/* The vectors go through kvt_v_encode a few heads of one token at a time
 * (the rotation does not depend on the head or token), each f16 norm then
 * rounded to the nearest u8 code: the codes are those of v2..v4. */
#define VL_HEADS 16u
int kvt_vl_encode(int bits, const kvt_cshape *s, const void *in, uint32_t dtype, uint8_t *body) {
  const uint32_t H = s->n_heads;
  const size_t n = (size_t)s->n_tokens * H, es = kvt_dtype_size(dtype);
  const size_t cb = code_bytes(bits, kvt_codec_vdim(s->head_dim));
  uint8_t tmp[VL_HEADS * (2 + KVT_MAX_HEAD_DIM / 2)]; /* cb <= vdim / 2 */
  for (uint32_t t = 0; t < s->n_tokens; t++)
    for (uint32_t h0 = 0; h0 < H; h0 += VL_HEADS) {
      uint32_t hc = H - h0 < VL_HEADS ? H - h0 : VL_HEADS;
      size_t v = (size_t)t * H + h0;
      kvt_cshape one = {.n_tokens = 1, .n_heads = hc, .head_dim = s->head_dim, .seed = s->seed};
      int rc = kvt_v_encode(bits, &one, (const uint8_t *)in + v * s->head_dim * es, dtype, tmp);
      if (rc) return rc;
      for (uint32_t j = 0; j < hc; j++) body[v + j] = kvt_lean_code_near(kvt_f16_to_f32(kvt_rd16(tmp + 2 * j)));
      memcpy(body + n + v * cb, tmp + 2 * hc, hc * cb);
    }
  return 0;
}

void kvt_vl_decode(int bits, const kvt_cshape *s, const uint8_t *body, void *out, uint32_t dtype) {
  vq q;
  vq_init(&q, bits, s);
  const size_t n = (size_t)s->n_tokens * s->n_heads, es = kvt_dtype_size(dtype);
  const size_t cb = code_bytes(bits, q.vdim);
  float y[KVT_MAX_HEAD_DIM];
  for (size_t v = 0; v < n; v++) {
    unpack_c(&q, body + n + v * cb, kvt_lean_value(body[v]) / (float)q.vdim, y);
    fwht(y, q.vdim);
    for (uint32_t i = 0; i < s->head_dim; i++) y[i] = y[i] * q.sign[i];
    kvt_vec_from_f32_sat(y, dtype, s->head_dim, (uint8_t *)out + v * s->head_dim * es);
  }
}

/* ---------- attention: sum_t p_t v_t, rotated once per head ---------- */

/* Tokens of a block go through the AVX2 kernel in tiles: the weights of a
 * tile's tokens (those not zero for every query) and their code rows. */
#define V_TILE 32u

/* acc_j[8c, 8c + 8 NC) += sum_i w[i][j] * centroids(rows[i] groups c..),
 * for GN queries; the NC * GN sums stay in registers across the tile. */
KVT_AVX2 static KVT_INLINE void vacc_chunk(const vq *q, int bits, uint32_t GN, uint32_t NC,
                                           uint32_t c, const uint8_t *const *rows, const float *w,
                                           uint32_t nt, float *acc) {
  const uint32_t ng = q->vdim / 8;
  const __m256 clo = _mm256_loadu_ps(q->c), chi = bits == 4 ? _mm256_loadu_ps(q->c + 8) : clo;
  __m256 o[KVT_CODEC_GQA][2], cv[2];
  KVT_UNROLL
  for (uint32_t j = 0; j < GN; j++)
    KVT_UNROLL
    for (uint32_t k = 0; k < NC; k++) o[j][k] = _mm256_loadu_ps(acc + j * q->vdim + 8 * (c + k));
  for (uint32_t i = 0; i < nt; i++) {
    KVT_UNROLL
    for (uint32_t k = 0; k < NC; k++)
      cv[k] = lanes_of(bits, clo, chi, codes_of(bits, load_group(rows[i], bits, c + k, ng)));
    KVT_UNROLL
    for (uint32_t j = 0; j < GN; j++) {
      __m256 wv = _mm256_broadcast_ss(w + i * KVT_CODEC_GQA + j);
      KVT_UNROLL
      for (uint32_t k = 0; k < NC; k++) o[j][k] = _mm256_fmadd_ps(wv, cv[k], o[j][k]);
    }
  }
  KVT_UNROLL
  for (uint32_t j = 0; j < GN; j++)
    KVT_UNROLL
    for (uint32_t k = 0; k < NC; k++) _mm256_storeu_ps(acc + j * q->vdim + 8 * (c + k), o[j][k]);
}

KVT_AVX2 static KVT_INLINE void vacc_tile(const vq *q, int bits, uint32_t GN,
                                          const uint8_t *const *rows, const float *w, uint32_t nt,
                                          float *acc) {
  const uint32_t ng = q->vdim / 8;
  if (ng == 1) {
    vacc_chunk(q, bits, GN, 1, 0, rows, w, nt, acc);
    return;
  }
  for (uint32_t c = 0; c < ng; c += 2) vacc_chunk(q, bits, GN, 2, c, rows, w, nt, acc);
}

/* Constant bits and GN, one function each: the sums stay in registers. */
typedef void vacc_fn(const vq *q, const uint8_t *const *rows, const float *w, uint32_t nt,
                     float *acc);
#define VACC(b, g)                                                                          \
  KVT_AVX2 KVT_NOINLINE static void vacc_##b##_##g(const vq *q, const uint8_t *const *rows, \
                                                   const float *w, uint32_t nt, float *acc) { \
    vacc_tile(q, b, g, rows, w, nt, acc);                                                   \
  }
VACC(2, 1)
VACC(2, 2)
VACC(2, 3)
VACC(2, 4)
VACC(3, 1)
VACC(3, 2)
VACC(3, 3)
VACC(3, 4)
VACC(4, 1)
VACC(4, 2)
VACC(4, 3)
VACC(4, 4)
static vacc_fn *const vacc_fns[3][KVT_CODEC_GQA] = {{vacc_2_1, vacc_2_2, vacc_2_3, vacc_2_4},
                                                    {vacc_3_1, vacc_3_2, vacc_3_3, vacc_3_4},
                                                    {vacc_4_1, vacc_4_2, vacc_4_3, vacc_4_4}};

void kvt_codec_v_accum_n(int id, const kvt_cshape *s, const uint8_t *enc, uint32_t h,
                         const float *p, size_t stride, uint32_t gn, float *acc) {
  const kvt_codec *c = kvt_codec_get(id);
  if (gn == 0) return;
  vq q;
  q.bits = c->bits;
  q.n_levels = 1 << c->bits;
  q.vdim = kvt_codec_vdim(s->head_dim);
  q.c = centroids(c->bits);
  const int lean = c->lean; /* no header, u8 norms */
  const uint8_t *body = lean ? enc : enc + KVT_CODEC_HDR;
  const size_t n = (size_t)s->n_tokens * s->n_heads, cb = code_bytes(q.bits, q.vdim);
  const uint8_t *rows[V_TILE];
  float w[V_TILE * KVT_CODEC_GQA], y[KVT_MAX_HEAD_DIM];
  for (uint32_t t0 = 0; t0 < s->n_tokens; t0 += V_TILE) {
    uint32_t nt = 0;
    for (uint32_t t = t0; t < s->n_tokens && t < t0 + V_TILE; t++) {
      size_t v = (size_t)t * s->n_heads + h;
      float nrm = (lean ? kvt_lean_value(body[v]) : kvt_f16_to_f32(kvt_rd16(body + 2 * v))) /
                  (float)q.vdim,
            any = 0;
      for (uint32_t j = 0; j < gn; j++)
        any += (w[nt * KVT_CODEC_GQA + j] = p[j * stride + t] * nrm);
      if (any == 0) continue; /* (weights are >= 0) */
      rows[nt++] = body + (lean ? 1 : 2) * n + v * cb;
    }
    if (kvt_codec_level > 0) {
      vacc_fns[q.bits - 2][gn - 1](&q, rows, w, nt, acc);
      continue;
    }
    for (uint32_t i = 0; i < nt; i++)
      for (uint32_t j = 0; j < gn; j++) {
        unpack_c(&q, rows[i], w[i * KVT_CODEC_GQA + j], y);
        for (uint32_t d = 0; d < q.vdim; d++) acc[j * q.vdim + d] += y[d];
      }
  }
}

void kvt_codec_v_accum(int id, const kvt_cshape *s, const uint8_t *enc, uint32_t h, const float *p,
                       float *acc) {
  kvt_codec_v_accum_n(id, s, enc, h, p, 0, 1, acc);
}

void kvt_codec_v_unrotate(const kvt_cshape *s, float *acc, float *out) {
  vq q;
  vq_init(&q, 3, s);
  fwht(acc, q.vdim);
  for (uint32_t i = 0; i < s->head_dim; i++) out[i] = acc[i] * q.sign[i];
}
