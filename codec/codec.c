/* codec.c - the codec registry and its public names (kvt_codec_name,
 * kvt_codec_parse), the 16-byte header, dtype conversion and the choice
 * between scalar and AVX2/F16C kernels (cpuid, once). */
#include <math.h>
#include <string.h>

#include "codec/codec_impl.h"
#include "kvtier.h"

#include <cpuid.h>
#include <immintrin.h>

static const kvt_codec codecs[KVT_CODEC_MAX + 1] = {
  [KVT_CODEC_K8] = {KVT_CODEC_K8, "k8", 0, 8},
  [KVT_CODEC_K8C] = {KVT_CODEC_K8C, "k8c", 0, 8},
  [KVT_CODEC_K4] = {KVT_CODEC_K4, "k4", 0, 4},
  [KVT_CODEC_V2] = {KVT_CODEC_V2, "v2", 1, 2},
  [KVT_CODEC_V3] = {KVT_CODEC_V3, "v3", 1, 3},
  [KVT_CODEC_V4] = {KVT_CODEC_V4, "v4", 1, 4},
  [KVT_CODEC_K8B] = {KVT_CODEC_K8B, "k8b", 0, 8, 1},
  [KVT_CODEC_V2L] = {KVT_CODEC_V2L, "v2l", 1, 2, 1},
  [KVT_CODEC_V3L] = {KVT_CODEC_V3L, "v3l", 1, 3, 1},
  [KVT_CODEC_V4L] = {KVT_CODEC_V4L, "v4l", 1, 4, 1},
};

const kvt_codec *kvt_codec_get(int id) {
  return (id >= 1 && id <= KVT_CODEC_MAX) ? &codecs[id] : NULL;
}

const kvt_codec *kvt_codec_by_name(const char *name) {
  for (int i = 1; name && i <= KVT_CODEC_MAX; i++)
    if (strcmp(codecs[i].name, name) == 0) return &codecs[i];
  return NULL;
}

const char *kvt_codec_name(int codec) {
  const kvt_codec *c = kvt_codec_get(codec);
  return c ? c->name : NULL;
}

int kvt_codec_parse(const char *name, int *k_codec, int *v_codec) {
  if (!name || !k_codec || !v_codec) return KVT_ENULL;
  const char *v = strchr(name, 'v');
  char kname[8];
  if (!v || (size_t)(v - name) >= sizeof kname) return KVT_EOPTION;
  memcpy(kname, name, (size_t)(v - name));
  kname[v - name] = 0;
  const kvt_codec *kc = kvt_codec_by_name(kname), *vc = kvt_codec_by_name(v);
  if (!kc || !vc || kc->is_value || !vc->is_value) return KVT_EOPTION;
  *k_codec = kc->id;
  *v_codec = vc->id;
  return 0;
}

/* ---------- kernel level ---------- */

int kvt_codec_level = -1;

/* Decided once when the library is loaded, so no call races to set it. */
__attribute__((constructor)) static void level_ctor(void) { kvt_codec_force(-1); }

/* AVX2, FMA and F16C, asked of cpuid directly: clang 14 does not know
 * __builtin_cpu_supports("f16c"). */
int kvt_codec_simd(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  int fma = (c >> 12) & 1, f16c = (c >> 29) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  if (!osxsave || !avx || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0)); /* the OS saves YMM state */
  (void)hi;
  return ((b >> 5) & 1) && fma && f16c && (lo & 6) == 6;
}

void kvt_codec_force(int level) {
  int simd = kvt_codec_simd();
  kvt_codec_level = level < 0 ? simd : (level > 0 && simd);
}

static void level_init(void) {
  if (kvt_codec_level < 0) kvt_codec_force(-1);
}

/* ---------- scalar conversions ---------- */

float kvt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0x1F) bits = sign | 0x7F800000u | (man << 13);
  else if (exp != 0) bits = sign | ((exp + 112) << 23) | (man << 13);
  else if (man == 0) bits = sign;
  else { /* subnormal: normalise */
    int e = -1;
    do {
      man <<= 1;
      e++;
    } while (!(man & 0x400));
    bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Round to nearest even, as F16C's _mm256_cvtps_ph(.., 0) does. */
uint16_t kvt_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7FFFFFFF;
  if (ax >= 0x7F800000) return (uint16_t)(sign | 0x7C00 | (ax > 0x7F800000 ? 0x200 | ((ax >> 13) & 0x3FF) : 0));
  if (ax >= 0x477FF000) return (uint16_t)(sign | 0x7C00); /* rounds to inf */
  if (ax < 0x38800000) { /* subnormal or zero in f16 */
    if (ax < 0x33000000) return (uint16_t)sign;
    uint32_t e = ax >> 23, m = (ax & 0x7FFFFF) | 0x800000, shift = 126 - e;
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((ax - 0x38000000) >> 13), rem = ax & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

float kvt_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t kvt_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
  x += 0x7FFF + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

KVT_AVX2 static void f16_to_f32_avx2(const uint16_t *in, uint32_t n, float *out) {
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
  for (; i < n; i++) out[i] = kvt_f16_to_f32(in[i]);
}

/* Decoded values may overshoot the largest f16 by a rounding step (a
 * scale rounded up, a rotated vector's error): saturate, never infinity. */
static float sat16(float x) { return x > 65504.0f ? 65504.0f : x < -65504.0f ? -65504.0f : x; }

KVT_AVX2 static void f32_to_f16_avx2(const float *in, uint32_t n, uint16_t *out, int sat) {
  const __m256 hi = _mm256_set1_ps(sat ? 65504.0f : INFINITY), lo = _mm256_set1_ps(sat ? -65504.0f : -INFINITY);
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(in + i);
    if (sat) v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(v, 0));
  }
  for (; i < n; i++) out[i] = kvt_f32_to_f16(sat ? sat16(in[i]) : in[i]);
}

void kvt_vec_to_f32(const void *in, uint32_t dtype, uint32_t n, float *out) {
  const uint16_t *h = in;
  if (dtype == KVT_F32) memcpy(out, in, (size_t)n * 4);
  else if (dtype == KVT_F16 && kvt_codec_level > 0) f16_to_f32_avx2(h, n, out);
  else if (dtype == KVT_F16) for (uint32_t i = 0; i < n; i++) out[i] = kvt_f16_to_f32(h[i]);
  else for (uint32_t i = 0; i < n; i++) out[i] = kvt_bf16_to_f32(h[i]);
}

/* Infinity and NaN are all-ones exponents, in every dtype once in f32. */
static int any_nonfinite(const float *x, uint32_t n) {
  unsigned bad = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, x + i, 4);
    bad |= (u & 0x7F800000u) == 0x7F800000u;
  }
  return bad != 0;
}

/* f16 to f32 with the exponent test on the loaded halves: one pass. */
KVT_AVX2 static int f16_load_avx2(const uint16_t *in, uint32_t n, float *out) {
  const __m128i e = _mm_set1_epi16(0x7C00);
  __m128i bad = _mm_setzero_si128();
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(in + i));
    bad = _mm_or_si128(bad, _mm_cmpeq_epi16(_mm_and_si128(h, e), e));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  int b = !_mm_testz_si128(bad, bad);
  for (; i < n; i++) out[i] = kvt_f16_to_f32(in[i]);
  return b;
}

int kvt_vec_load(const void *in, uint32_t dtype, uint32_t n, float *out) {
  if (dtype == KVT_F16 && kvt_codec_level > 0 && n >= 8) {
    int bad = f16_load_avx2(in, n, out);
    return bad | any_nonfinite(out + n / 8 * 8, n % 8);
  }
  kvt_vec_to_f32(in, dtype, n, out);
  return any_nonfinite(out, n);
}

static void from_f32(const float *in, uint32_t dtype, uint32_t n, void *out, int sat) {
  uint16_t *h = out;
  if (dtype == KVT_F32) memcpy(out, in, (size_t)n * 4);
  else if (dtype == KVT_F16 && kvt_codec_level > 0) f32_to_f16_avx2(in, n, h, sat);
  else if (dtype == KVT_F16) for (uint32_t i = 0; i < n; i++) h[i] = kvt_f32_to_f16(sat ? sat16(in[i]) : in[i]);
  else for (uint32_t i = 0; i < n; i++) h[i] = kvt_f32_to_bf16(in[i]);
}

void kvt_vec_from_f32(const float *in, uint32_t dtype, uint32_t n, void *out) {
  from_f32(in, dtype, n, out, 0);
}

void kvt_vec_from_f32_sat(const float *in, uint32_t dtype, uint32_t n, void *out) {
  from_f32(in, dtype, n, out, 1);
}

void kvt_to_f32(const void *in, uint32_t dtype, size_t n, float *out) {
  level_init();
  kvt_vec_to_f32(in, dtype, (uint32_t)n, out);
}

void kvt_from_f32(const float *in, uint32_t dtype, size_t n, void *out) {
  level_init();
  kvt_vec_from_f32(in, dtype, (uint32_t)n, out);
}

/* ---------- lean scales ---------- */

/* 2^(f / 8), f = 0..7, to the nearest float. */
static const float frac8[8] = {1.0f,        1.09050773f, 1.18920712f, 1.29683955f,
                               1.41421356f, 1.54221083f, 1.68179283f, 1.83400809f};

float kvt_lean_value(uint8_t c) {
  return c ? ldexpf(frac8[c & 7], (int)(c >> 3) - 14) : 0.0f; /* c - 112 = 8 (c/8 - 14) + c%8 */
}

/* log2f gives the neighbourhood; the comparisons make the answer exact
 * (and the same on every machine). */
int kvt_lean_code_up(float x) {
  if (!(x > 0)) return 0;
  int c = (int)ceilf(8.0f * log2f(x)) + 112;
  if (c < 1) c = 1;
  if (c > 256) c = 256;
  while (c <= 255 && kvt_lean_value((uint8_t)c) < x) c++;
  while (c > 1 && c <= 256 && kvt_lean_value((uint8_t)(c - 1)) >= x) c--;
  return c;
}

uint8_t kvt_lean_code_near(float x) {
  if (!(x > 0)) return 0;
  int c = kvt_lean_code_up(x);
  if (c > 255) return 255;
  if (c > 1) { /* the lower neighbour when x is below their geometric midpoint */
    double lo = kvt_lean_value((uint8_t)(c - 1)), hi = kvt_lean_value((uint8_t)c);
    if ((double)x * x < lo * hi) c--;
  }
  return (uint8_t)c;
}

/* ---------- header ---------- */

void kvt_codec_put_hdr(uint8_t *out, int id, const kvt_cshape *s) {
  out[0] = 'K';
  out[1] = 'W';
  out[2] = (uint8_t)id;
  out[3] = KVT_CODEC_VERSION;
  kvt_wr16(out + 4, (uint16_t)s->n_heads);
  kvt_wr16(out + 6, (uint16_t)s->head_dim);
  uint64_t z = s->seed * 0x9E3779B97F4A7C15ull; /* every bit of the seed counts */
  uint32_t t = s->n_tokens, sd = (uint32_t)((z ^ (z >> 29)) * 0xBF58476D1CE4E5B9ull >> 32);
  memcpy(out + 8, &t, 4);
  memcpy(out + 12, &sd, 4);
}

int kvt_codec_hdr_ok(const uint8_t *in, int id, const kvt_cshape *s) {
  uint8_t want[KVT_CODEC_HDR];
  kvt_codec_put_hdr(want, id, s);
  return memcmp(in, want, KVT_CODEC_HDR) == 0;
}

static int shape_ok(const kvt_cshape *s) {
  return s && s->n_tokens >= 1 && s->n_tokens <= KVT_MAX_BLOCK_TOKENS && s->n_heads >= 1 &&
         s->n_heads <= KVT_MAX_HEADS && s->head_dim >= 1 && s->head_dim <= KVT_MAX_HEAD_DIM;
}

/* ---------- dispatch ---------- */

size_t kvt_codec_size(int id, const kvt_cshape *s) {
  const kvt_codec *c = kvt_codec_get(id);
  if (!c || !shape_ok(s)) return 0;
  if (c->lean) return c->is_value ? kvt_vl_size(c->bits, s) : kvt_k_size(id, s);
  return KVT_CODEC_HDR + (c->is_value ? kvt_v_size(c->bits, s) : kvt_k_size(id, s));
}

int64_t kvt_codec_encode(int id, const kvt_cshape *s, const void *in, uint32_t dtype,
                         uint8_t *out, size_t out_len) {
  const kvt_codec *c = kvt_codec_get(id);
  size_t need = kvt_codec_size(id, s);
  if (!c) return KVT_EOPTION;
  if (!need) return KVT_ESHAPE;
  if (!in || !out) return KVT_ENULL;
  if (kvt_dtype_size(dtype) == 0) return KVT_EDTYPE;
  if (out_len < need) return KVT_EBUFSIZE;
  level_init();
  /* NaN and infinity have no code: the encoders refuse them as they load
   * each vector (rather than in a pass of their own over the input). The
   * header goes last, so a refused buffer never looks like an encoding. */
  uint8_t *body = c->lean ? out : out + KVT_CODEC_HDR;
  int rc = c->is_value ? (c->lean ? kvt_vl_encode(c->bits, s, in, dtype, body)
                                  : kvt_v_encode(c->bits, s, in, dtype, body))
                       : kvt_k_encode(id, s, in, dtype, body);
  if (rc) return rc;
  if (!c->lean) kvt_codec_put_hdr(out, id, s);
  return (int64_t)need;
}

int kvt_codec_check(int id, const kvt_cshape *s, const uint8_t *in, size_t in_len) {
  const kvt_codec *c = kvt_codec_get(id);
  level_init();
  size_t need = kvt_codec_size(id, s);
  if (!c || !need || !in || in_len != need) return KVT_ECORRUPT;
  if (c->lean) /* no header; every norm byte and value code is valid */
    return c->is_value ? 0 : kvt_k_check(id, s, in);
  if (!kvt_codec_hdr_ok(in, id, s)) return KVT_ECORRUPT;
  return c->is_value ? kvt_v_check(c->bits, s, in + KVT_CODEC_HDR)
                     : kvt_k_check(id, s, in + KVT_CODEC_HDR);
}

int kvt_codec_decode(int id, const kvt_cshape *s, const uint8_t *in, size_t in_len, void *out,
                     uint32_t dtype) {
  if (kvt_dtype_size(dtype) == 0) return KVT_EDTYPE;
  if (!out) return KVT_ENULL;
  int rc = kvt_codec_check(id, s, in, in_len);
  if (!rc) kvt_codec_decode_trusted(id, s, in, out, dtype);
  return rc;
}

void kvt_codec_decode_trusted(int id, const kvt_cshape *s, const uint8_t *in, void *out,
                              uint32_t dtype) {
  const kvt_codec *c = kvt_codec_get(id);
  level_init();
  const uint8_t *body = c->lean ? in : in + KVT_CODEC_HDR;
  if (c->is_value && c->lean) kvt_vl_decode(c->bits, s, body, out, dtype);
  else if (c->is_value) kvt_v_decode(c->bits, s, body, out, dtype);
  else kvt_k_decode(id, s, body, out, dtype);
}
