/* test_codec.c - the warm tier's codecs (codec/codec.h) on their own:
 * the AVX2 and scalar kernels give the same bytes; round trips stay within
 * each codec's error bound (keys: half a quantization step; values: the
 * Lloyd-Max distortion of the bit width); encodings are deterministic;
 * every malformed payload is refused before anything is written; the
 * scalar f16/bf16 conversions agree with F16C and with an exact rounding
 * reference; attention on encoded data agrees with the decoded tensor.
 * Relies on the body layouts in the comments of codec/codec_k.c and
 * codec/codec_v.c (16-byte header, then f16 scales or norms, then codes). */
#include "testutil.h"

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"

#define HDR 16 /* KVT_CODEC_HDR: every encoding starts with it */

static const int all_codecs[] = {KVT_CODEC_K8, KVT_CODEC_K8C, KVT_CODEC_K4,
                                 KVT_CODEC_V2, KVT_CODEC_V3, KVT_CODEC_V4};
static const uint32_t dtypes[] = {KVT_F32, KVT_F16, KVT_BF16};
/* 96 is padded to 128 in the rotated domain; 12 and 100 are not multiples
 * of 8, so every kernel's scalar tail and the 4-bit row padding run. */
static const uint32_t dims[] = {8, 12, 64, 96, 100, 128};
static const struct {
  uint32_t t, h;
} shapes[] = {{16, 2}, {5, 3}};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static int is_value(int c) { return c >= KVT_CODEC_V2; }
static int k_lim(int c) { return c == KVT_CODEC_K4 ? 7 : 127; }
static int v_bits(int c) { return c - KVT_CODEC_V2 + 2; }
static const char *dt_name(uint32_t dt) {
  return dt == KVT_F32 ? "f32" : dt == KVT_F16 ? "f16" : "bf16";
}

/* ------------------------------------------------------------ context */

/* What the loops are at, printed with any failure. */
static char ctx[200];
#define SETCTX(...) snprintf(ctx, sizeof ctx, __VA_ARGS__)
#define CHECK(c)                                                        \
  do {                                                                  \
    if (!(c)) fail_msg("%s: failed: %s (line %d)", ctx, #c, __LINE__);  \
  } while (0)
#define CHECK_EQ(a, b)                                                  \
  do {                                                                  \
    long long a_ = (long long)(a), b_ = (long long)(b);                 \
    if (a_ != b_)                                                       \
      fail_msg("%s: %s == %lld, expected %lld (line %d)", ctx, #a, a_, b_, __LINE__); \
  } while (0)

static void check_same(const void *a, const void *b, size_t n, const char *what) {
  const uint8_t *x = a, *y = b;
  for (size_t i = 0; i < n; i++)
    if (x[i] != y[i])
      fail_msg("%s: %s differ at byte %zu of %zu (0x%02x vs 0x%02x)", ctx, what, i, n, x[i], y[i]);
}

/* Every test leaves the kernel choice automatic, even when it fails. */
static int restore_level(void **state) {
  (void)state;
  kvt_codec_force(-1);
  return 0;
}

/* ------------------------------------------------------------ values */

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static float ld(const void *buf, uint32_t dt, size_t i) {
  if (dt == KVT_F32) {
    float f;
    memcpy(&f, (const char *)buf + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, (const char *)buf + 2 * i, 2);
  return dt == KVT_F16 ? tu_f16_to_f32(h) : tu_bf16_to_f32(h);
}

/* Store f in dtype (the test's own converters) and return what is stored. */
static float st(void *buf, uint32_t dt, size_t i, float f) {
  if (dt == KVT_F32) {
    memcpy((char *)buf + 4 * i, &f, 4);
    return f;
  }
  uint16_t h = dt == KVT_F16 ? tu_f32_to_f16(f) : tu_f32_to_bf16(f);
  memcpy((char *)buf + 2 * i, &h, 2);
  return ld(buf, dt, i);
}

static double unif(void) { return ((double)(tu_rand() >> 11) + 0.5) * 0x1p-53; }
static double gauss(void) { return sqrt(-2.0 * log(unif())) * cos(2.0 * M_PI * unif()); }

static float rd16f(const uint8_t *p) { return tu_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Fill n_vec vectors of d values into buf (dtype dt); x gets the stored
 * values as f32. Gaussian with a per-vector scale from 1e-3 to 1e3 and now
 * and then an outlier channel. With edges, some vectors are the cases the
 * kernels round or clamp specially: exact rounding ties, zeros, -0, tiny
 * values whose scale is an f16 subnormal or 0, and (f32, bf16) magnitudes
 * beyond the f16 range of the scales (not with edges == 2). */
static void gen(void *buf, float *x, uint32_t dt, size_t n_vec, uint32_t d, int edges) {
  for (size_t v = 0; v < n_vec; v++) {
    float *xv = x + v * d;
    size_t o = v * d;
    uint32_t kind = edges ? tu_below(10) : 9;
    if (edges == 2 && kind == 6) kind = 9;
    double sc = pow(10.0, -3.0 + 6.0 * unif());
    for (uint32_t i = 0; i < d; i++) {
      float f;
      switch (kind) {
      case 0: f = i == 0 ? 127.0f : (float)((int)tu_below(254) - 127) + 0.5f; break; /* k8 ties */
      case 1: f = i == 0 ? -7.0f : (float)((int)tu_below(14) - 7) + 0.5f; break;    /* k4 ties */
      case 2: f = 0.0f; break;
      case 3: f = (i & 1) ? -0.0f : 0.0f; break;
      case 4: f = (float)(gauss() * 1e-7); break;
      case 5: f = (float)(gauss() * 1e-5); break;
      case 6: f = dt == KVT_F16 ? (float)(gauss() * 2e4) : (float)(gauss() * 1e12); break;
      case 7: f = (float)((i % 3) - 1.0); break; /* exact small integers, ties in V */
      default: f = (float)(gauss() * sc); break;
      }
      if (kind >= 8 && tu_below(16) == 0) f *= 30.0f; /* an outlier */
      if (dt == KVT_F16 && fabsf(f) > 60000.0f) f = copysignf(60000.0f, f);
      xv[i] = st(buf, dt, o + i, f);
    }
  }
}

typedef struct bufs {
  void *in, *dec, *dec2;
  float *x, *y;
  uint8_t *enc, *enc2;
  size_t n, len;
} bufs;

static void bufs_alloc(bufs *b, const kvt_codec_shape *s, int codec) {
  b->n = (size_t)s->n_tokens * s->n_heads * s->head_dim;
  b->len = kvt_codec_size(codec, s);
  CHECK(b->len > HDR);
  b->in = malloc(b->n * 4);
  b->dec = malloc(b->n * 4);
  b->dec2 = malloc(b->n * 4);
  b->x = malloc(b->n * 4);
  b->y = malloc(b->n * 4);
  b->enc = malloc(b->len + 64);
  b->enc2 = malloc(b->len + 64);
  assert_true(b->in && b->dec && b->dec2 && b->x && b->y && b->enc && b->enc2);
}

static void bufs_free(bufs *b) {
  free(b->in);
  free(b->dec);
  free(b->dec2);
  free(b->x);
  free(b->y);
  free(b->enc);
  free(b->enc2);
}

static void encode_ok(int c, const kvt_codec_shape *s, const void *in, uint32_t dt, uint8_t *out,
                      size_t len) {
  memset(out, 0xEE, len + 64);
  int64_t r = kvt_codec_encode(c, s, in, dt, out, len + 64);
  CHECK_EQ(r, (long long)len);
  for (size_t i = len; i < len + 64; i++) CHECK(out[i] == 0xEE); /* nothing past the size */
  CHECK_EQ(kvt_codec_check(c, s, out, len), 0);
}

static void decode_ok(int c, const kvt_codec_shape *s, const uint8_t *enc, size_t len, void *out,
                      uint32_t dt) {
  CHECK_EQ(kvt_codec_decode(c, s, enc, len, out, dt), 0);
}

/* ------------------------------------------------- SIMD equals scalar */

static void test_simd_matches_scalar(void **state) {
  (void)state;
  if (!kvt_codec_simd()) {
    fprintf(stderr, "skip: this CPU has no AVX2/FMA/F16C, so only the scalar kernels exist\n");
    tu_skip_mark();
    skip();
  }
  long combos = 0;
  for (size_t ci = 0; ci < N_OF(all_codecs); ci++)
    for (size_t di = 0; di < N_OF(dtypes); di++)
      for (size_t hi = 0; hi < N_OF(dims); hi++)
        for (size_t si = 0; si < N_OF(shapes); si++) {
          int c = all_codecs[ci];
          uint32_t dt = dtypes[di];
          kvt_codec_shape s = {shapes[si].t, shapes[si].h, dims[hi], 0, tu_rand()};
          SETCTX("simd=scalar %s %s T=%u H=%u D=%u", kvt_codec_name(c), dt_name(dt), s.n_tokens,
                 s.n_heads, s.head_dim);
          bufs b;
          bufs_alloc(&b, &s, c);
          gen(b.in, b.x, dt, (size_t)s.n_tokens * s.n_heads, s.head_dim, 1);
          uint32_t odt = dt == KVT_F32 ? KVT_F16 : KVT_F32; /* a second output dtype */
          for (int lvl = 0; lvl < 2; lvl++) {
            kvt_codec_force(lvl);
            uint8_t *enc = lvl ? b.enc2 : b.enc;
            void *dec = lvl ? b.dec2 : b.dec;
            encode_ok(c, &s, b.in, dt, enc, b.len);
            decode_ok(c, &s, enc, b.len, dec, dt);
            decode_ok(c, &s, enc, b.len, lvl ? b.y : b.x, odt);
          }
          kvt_codec_force(-1);
          check_same(b.enc, b.enc2, b.len, "scalar and AVX2 encodings");
          check_same(b.dec, b.dec2, b.n * kvt_dtype_size(dt), "scalar and AVX2 decodes");
          check_same(b.x, b.y, b.n * kvt_dtype_size(odt), "scalar and AVX2 decodes (2nd dtype)");
          bufs_free(&b);
          combos++;
        }
  fprintf(stderr, "simd=scalar: %ld combinations byte-identical\n", combos);
}

/* ------------------------------------------------- key error bounds */

/* Half an ulp of |y| once rounded to dtype: the last rounding a decode into
 * dtype adds (f16: 11 significant bits, 2^-25 absolute in its subnormals;
 * bf16: 8 significant bits). */
static double out_round(uint32_t dt, double y) {
  y = fabs(y);
  if (dt == KVT_F16) return y * 0x1p-11 + 0x1p-25;
  if (dt == KVT_BF16) return y * 0x1p-8 + 0x1p-133;
  return 0;
}

/* For each element: |x - x'| <= s/2 + max(0, m - lim*s) + 2e-5*s + r(x').
 * s is the stored f16 scale and m the absolute maximum it was chosen for:
 * codes are round(x / s) clamped to +-lim, so an element is off by at most
 * half a step unless clamped; clamping happens only when f16 rounding made
 * s < m / lim, and then costs at most m - lim*s. 2e-5*s covers x * (1/s)
 * computed in float (two roundings of 2^-24 at |x/s| <= 128 move it by
 * < 2e-5 of a step, which can flip a tie); code * s is exact in float (7 +
 * 11 significant bits); r is the rounding into the output dtype. The scale
 * itself must be m / lim rounded to f16: within half an f16 ulp. */
static void check_k_bound(int c, const kvt_codec_shape *s, const float *x, const uint8_t *enc,
                          const void *dec, uint32_t odt, double *worst) {
  const uint32_t T = s->n_tokens, H = s->n_heads, D = s->head_dim;
  const int lim = k_lim(c);
  const uint8_t *body = enc + HDR;
  for (uint32_t h = 0; h < H; h++)
    for (uint32_t t = 0; t < T; t++)
      for (uint32_t d = 0; d < D; d++) {
        size_t i = ((size_t)t * H + h) * D + d;
        double m = 0, sc;
        if (c == KVT_CODEC_K8C) {
          for (uint32_t u = 0; u < T; u++) m = fmax(m, fabs(x[((size_t)u * H + h) * D + d]));
          sc = rd16f(body + 2 * ((size_t)h * D + d));
        } else {
          for (uint32_t e = 0; e < D; e++) m = fmax(m, fabs(x[((size_t)t * H + h) * D + e]));
          sc = rd16f(body + 2 * ((size_t)t * H + h));
        }
        double ideal = m / lim;
        CHECK(sc >= 0 && fabs(sc - ideal) <= fmax(ideal * 0x1p-11, 0x1p-25) * (1 + 1e-6));
        double y = ld(dec, odt, i);
        double bound = sc / 2 + fmax(0.0, m - lim * sc) + 2e-5 * sc + out_round(odt, y);
        double err = fabs(x[i] - y);
        if (!(err <= bound))
          fail_msg("%s: element t=%u h=%u d=%u: x=%.9g decoded %.9g, error %.3g > bound %.3g "
                   "(scale %.6g, absmax %.6g)", ctx, t, h, d, x[i], y, err, bound, sc, m);
        if (m - lim * sc <= 0 && sc > 0) *worst = fmax(*worst, err / bound);
      }
}

static void test_k_error_bound(void **state) {
  (void)state;
  const int kc[] = {KVT_CODEC_K8, KVT_CODEC_K8C, KVT_CODEC_K4};
  for (size_t ci = 0; ci < N_OF(kc); ci++) {
    double worst = 0;
    for (size_t di = 0; di < N_OF(dtypes); di++)
      for (size_t hi = 0; hi < N_OF(dims); hi++)
        for (size_t si = 0; si < N_OF(shapes); si++)
          for (int rep = 0; rep < 3; rep++) {
            int c = kc[ci];
            uint32_t dt = dtypes[di];
            kvt_codec_shape s = {shapes[si].t, shapes[si].h, dims[hi], 0, tu_rand()};
            SETCTX("k bound %s %s T=%u H=%u D=%u", kvt_codec_name(c), dt_name(dt), s.n_tokens,
                   s.n_heads, s.head_dim);
            bufs b;
            bufs_alloc(&b, &s, c);
            /* edges but none beyond the f16 range of the scales */
            gen(b.in, b.x, dt, (size_t)s.n_tokens * s.n_heads, s.head_dim, rep ? 0 : 2);
            encode_ok(c, &s, b.in, dt, b.enc, b.len);
            decode_ok(c, &s, b.enc, b.len, b.dec, dt);
            check_k_bound(c, &s, b.x, b.enc, b.dec, dt, &worst);
            decode_ok(c, &s, b.enc, b.len, b.dec2, KVT_F32);
            check_k_bound(c, &s, b.x, b.enc, b.dec2, KVT_F32, &worst);
            bufs_free(&b);
          }
    fprintf(stderr, "k bound %s: largest error %.4f of its bound\n", kvt_codec_name(kc[ci]), worst);
    /* The bound is not vacuous: where no clamping happens, random data
     * comes close to half a step. */
    CHECK(worst > 0.5);
  }
}

/* Values at the edge of the f16 range, in an f16 tensor, must decode to
 * finite f16 values (and keys stay within the bound): f16(65504 / 127)
 * rounds up to 516 and 127 * 516 = 65532 would round to +inf in f16;
 * decoding into f16 saturates at +-65504 instead (kvtier.h). */
static void test_f16_range_edge(void **state) {
  (void)state;
  char bad[512] = "";
  for (size_t ci = 0; ci < N_OF(all_codecs); ci++) {
    int c = all_codecs[ci];
    kvt_codec_shape s = {4, 1, 64, 0, tu_rand()};
    SETCTX("f16 range edge %s", kvt_codec_name(c));
    bufs b;
    bufs_alloc(&b, &s, c);
    for (uint32_t t = 0; t < 4; t++)
      for (uint32_t d = 0; d < 64; d++) {
        size_t i = (size_t)t * 64 + d;
        float f = t == 0 ? 65504.0f                       /* all at the maximum */
                  : t == 1 ? (d & 1 ? -65504.0f : 65504.0f) /* alternating */
                  : t == 2 ? (d == 5 ? 65504.0f : 0.0f)     /* one-hot */
                           : (float)(gauss() * 20000.0);
        f = fminf(fmaxf(f, -65504.0f), 65504.0f); /* finite in f16 */
        b.x[i] = st(b.in, KVT_F16, i, f);
      }
    encode_ok(c, &s, b.in, KVT_F16, b.enc, b.len);
    decode_ok(c, &s, b.enc, b.len, b.dec, KVT_F16);
    int n_inf = 0;
    size_t first = 0;
    for (size_t i = b.n; i-- > 0;)
      if (!isfinite(ld(b.dec, KVT_F16, i))) n_inf++, first = i;
    if (n_inf) {
      fprintf(stderr, "%s: %d of %zu decoded f16 values are infinite (first: token %zu dim %zu, "
              "input %g)\n", ctx, n_inf, b.n, first / 64, first % 64, b.x[first]);
      snprintf(bad + strlen(bad), sizeof bad - strlen(bad), " %s", kvt_codec_name(c));
    } else if (!is_value(c)) {
      double worst = 0;
      check_k_bound(c, &s, b.x, b.enc, b.dec, KVT_F16, &worst);
    }
    bufs_free(&b);
  }
  if (*bad) fail_msg("f16 tensors at the edge of the f16 range decode to infinity with:%s", bad);
}

/* A tensor holding NaN or infinity has no encoding: kvt_codec_encode
 * refuses it with KVT_ENONFINITE (kvtier.h), at both kernel levels (the
 * kernels would disagree on it: fmaxf and _mm256_max_ps treat a NaN
 * differently), wherever the value sits (in a SIMD lane group or the tail). */
static void test_nonfinite_input(void **state) {
  (void)state;
  if (!kvt_codec_simd()) {
    fprintf(stderr, "skip: this CPU has no AVX2/FMA/F16C, so only the scalar kernels exist\n");
    tu_skip_mark();
    skip();
  }
  char bad[512] = "";
  for (size_t ci = 0; ci < N_OF(all_codecs); ci++)
    for (size_t di = 0; di < N_OF(dtypes); di++)
      for (int kind = 0; kind < TU_N_NONFINITE; kind++) {
        int c = all_codecs[ci];
        uint32_t dt = dtypes[di];
        kvt_codec_shape s = {2, 2, 64, 0, tu_rand()};
        SETCTX("non-finite %s %s kind %d", kvt_codec_name(c), dt_name(dt), kind);
        bufs b;
        bufs_alloc(&b, &s, c);
        gen(b.in, b.x, dt, 4, 64, 0);
        /* early in a SIMD lane group, and in the scalar tail position */
        tu_set_nonfinite(b.in, dt, 3, kind);
        tu_set_nonfinite(b.in, dt, 64 + 17, kind);
        int64_t r[2];
        for (int lvl = 0; lvl < 2; lvl++) {
          kvt_codec_force(lvl);
          uint8_t *enc = lvl ? b.enc2 : b.enc;
          memset(enc, 0, b.len);
          r[lvl] = kvt_codec_encode(c, &s, b.in, dt, enc, b.len);
        }
        kvt_codec_force(-1);
        if (r[0] != KVT_ENONFINITE || r[1] != KVT_ENONFINITE) {
          fprintf(stderr, "%s: scalar returned %lld, AVX2 %lld\n", ctx, (long long)r[0],
                  (long long)r[1]);
          if (!strstr(bad, kvt_codec_name(c)))
            snprintf(bad + strlen(bad), sizeof bad - strlen(bad), " %s", kvt_codec_name(c));
        }
        bufs_free(&b);
      }
  if (*bad) fail_msg("non-finite input not refused with KVT_ENONFINITE by:%s", bad);
}

/* ------------------------------------------------- value distortion */

/* Lloyd-Max distortion of the standard Gaussian at 2, 3 and 4 bits (Max
 * 1960): the normalized MSE a rotated vector's coordinates get. */
static const double lloyd_max[5] = {0, 0, 0.1175, 0.03454, 0.009497};

/* Gaussian vectors of dimension D: normalized MSE sum |x - x'|^2 / sum |x|^2
 * and mean |x'|^2 / |x|^2. */
static void v_stats(int c, uint32_t dt, uint32_t D, uint32_t n_vec, int scaled, double *nmse,
                    double *norm2) {
  kvt_codec_shape s = {n_vec / 8, 8, D, 0, tu_rand()};
  bufs b;
  bufs_alloc(&b, &s, c);
  size_t nv = (size_t)s.n_tokens * s.n_heads;
  for (size_t v = 0; v < nv; v++) {
    double sc = scaled ? pow(10.0, -2.0 + 3.0 * unif()) : 1.0;
    for (uint32_t i = 0; i < D; i++) b.x[v * D + i] = st(b.in, dt, v * D + i, (float)(gauss() * sc));
  }
  encode_ok(c, &s, b.in, dt, b.enc, b.len);
  decode_ok(c, &s, b.enc, b.len, b.dec, dt);
  double se = 0, sx = 0, r2 = 0;
  for (size_t v = 0; v < nv; v++) {
    double e = 0, xx = 0, yy = 0;
    for (uint32_t i = 0; i < D; i++) {
      double x = b.x[v * D + i], y = ld(b.dec, dt, v * D + i);
      CHECK(isfinite(y));
      e += (x - y) * (x - y);
      xx += x * x;
      yy += y * y;
    }
    /* aggregate over vectors of equal weight whatever their scale */
    se += e / xx;
    sx += 1;
    r2 += yy / xx;
  }
  *nmse = se / sx;
  *norm2 = r2 / (double)nv;
  bufs_free(&b);
}

/* head_dim 128 (no padding): the normalized MSE is the Lloyd-Max
 * distortion of the coordinates of a rotated vector divided by its norm.
 * Those are not exactly Gaussian: they are sqrt(128) times a coordinate of
 * a uniform unit vector, whose tails are lighter, so the Gaussian
 * quantizer's overload error is a little smaller; with the norm stored
 * (to f16, 2^-11 relative) the distortion comes out slightly below theory.
 * [0.90, 1.05] of theory: 4096 vectors x 128 coordinates give a relative
 * standard error near 0.3%, so the window is wide statistically and still
 * catches a wrong centroid, boundary, scale or rotation (any of which moves
 * the MSE by far more than 5%). The mean |x'|^2/|x|^2 is 1 - D for a
 * Lloyd-Max quantizer (centroid condition: E[c u] = E[c^2]); within 0.02.
 * Other dims: the padded coordinates (96 -> 128) only remove error; small
 * rotations (8, 12 -> 16) are further from Gaussian; all stay below 1.10 D
 * and above 0.5 D. */
static void test_v_distortion(void **state) {
  (void)state;
  const int vc[] = {KVT_CODEC_V2, KVT_CODEC_V3, KVT_CODEC_V4};
  for (size_t ci = 0; ci < N_OF(vc); ci++)
    for (size_t di = 0; di < N_OF(dtypes); di++) {
      int c = vc[ci];
      uint32_t dt = dtypes[di];
      double th = lloyd_max[v_bits(c)], nmse, n2;
      for (int scaled = 0; scaled < 2; scaled++) {
        SETCTX("v distortion %s %s D=128 %s", kvt_codec_name(c), dt_name(dt),
               scaled ? "scales 1e-2..10" : "unit");
        v_stats(c, dt, 128, 4096, scaled, &nmse, &n2);
        fprintf(stderr, "%s: nmse %.5f = %.4f x theory, mean |x'|^2/|x|^2 %.4f (1 - D = %.4f)\n",
                ctx, nmse, nmse / th, n2, 1 - th);
        CHECK(nmse >= 0.90 * th && nmse <= 1.05 * th);
        CHECK(fabs(n2 - (1 - th)) <= 0.02);
      }
      for (size_t hi = 0; hi < N_OF(dims); hi++) {
        if (dims[hi] == 128) continue;
        SETCTX("v distortion %s %s D=%u", kvt_codec_name(c), dt_name(dt), dims[hi]);
        v_stats(c, dt, dims[hi], 1024, 0, &nmse, &n2);
        if (di == 0)
          fprintf(stderr, "%s: nmse %.5f = %.4f x theory\n", ctx, nmse, nmse / th);
        CHECK(nmse >= 0.5 * th && nmse <= 1.10 * th);
      }
    }
}

/* ------------------------------------------------- determinism */

static void test_determinism(void **state) {
  (void)state;
  for (size_t ci = 0; ci < N_OF(all_codecs); ci++)
    for (size_t di = 0; di < N_OF(dtypes); di++)
      for (size_t hi = 0; hi < N_OF(dims); hi++) {
        int c = all_codecs[ci];
        uint32_t dt = dtypes[di];
        kvt_codec_shape s = {8, 2, dims[hi], 0, tu_rand()};
        SETCTX("determinism %s %s D=%u", kvt_codec_name(c), dt_name(dt), s.head_dim);
        bufs b;
        bufs_alloc(&b, &s, c);
        gen(b.in, b.x, dt, 16, s.head_dim, 1);
        encode_ok(c, &s, b.in, dt, b.enc, b.len);
        encode_ok(c, &s, b.in, dt, b.enc2, b.len);
        check_same(b.enc, b.enc2, b.len, "two encodings of the same input");
        decode_ok(c, &s, b.enc, b.len, b.dec, dt);
        decode_ok(c, &s, b.enc, b.len, b.dec2, dt);
        check_same(b.dec, b.dec2, b.n * kvt_dtype_size(dt), "two decodes");
        /* Another seed: the same K body (the seed only rotates values),
         * another V body. With head_dim 8 (vdim 8) a seed picks one of 256
         * sign patterns, so two may coincide: there, one of 8 other seeds
         * must differ (failure probability 2^-64). */
        int differ = 0;
        for (int k = 1; k <= 8; k++) {
          kvt_codec_shape s2 = s;
          s2.seed = s.seed + (uint64_t)k * 0x9E3779B97F4A7C15ull;
          encode_ok(c, &s2, b.in, dt, b.enc2, b.len);
          int d = memcmp(b.enc + HDR, b.enc2 + HDR, b.len - HDR) != 0;
          if (!is_value(c)) CHECK(!d);
          else if (s.head_dim >= 64) CHECK(d);
          differ += d;
          /* An encoding is refused under a seed it was not made with. */
          CHECK_EQ(kvt_codec_check(c, &s, b.enc2, b.len), KVT_ECORRUPT);
        }
        if (is_value(c)) CHECK(differ > 0);
        bufs_free(&b);
      }
}

/* ------------------------------------------------- malformed payloads */

/* Expect check and decode to refuse enc[0..len) under shape s and codec c,
 * and the decode to leave its output untouched. */
static void refused(int c, const kvt_codec_shape *s, const uint8_t *enc, size_t len,
                    const char *what) {
  static uint8_t canary[1 << 16], out[1 << 16];
  size_t n = (size_t)s->n_tokens * s->n_heads * s->head_dim * 4;
  if (n > sizeof out || s->n_tokens == 0 || s->n_heads == 0 || s->head_dim == 0) n = sizeof out;
  memset(canary, 0xA5, n);
  memcpy(out, canary, n);
  int rc = kvt_codec_check(c, s, enc, len);
  if (rc != KVT_ECORRUPT) fail_msg("%s: %s: check returned %d, expected KVT_ECORRUPT", ctx, what, rc);
  for (size_t di = 0; di < N_OF(dtypes); di++) {
    rc = kvt_codec_decode(c, s, enc, len, out, dtypes[di]);
    if (rc != KVT_ECORRUPT)
      fail_msg("%s: %s: decode returned %d, expected KVT_ECORRUPT", ctx, what, rc);
    if (memcmp(out, canary, n) != 0) fail_msg("%s: %s: refused decode wrote its output", ctx, what);
  }
}

static void accepted(int c, const kvt_codec_shape *s, const uint8_t *enc, size_t len,
                     const char *what) {
  static float out[1 << 14];
  int rc = kvt_codec_check(c, s, enc, len);
  if (rc != 0) fail_msg("%s: %s: check returned %d, expected 0", ctx, what, rc);
  size_t n = (size_t)s->n_tokens * s->n_heads * s->head_dim;
  assert_true(n <= N_OF(out));
  CHECK_EQ(kvt_codec_decode(c, s, enc, len, out, KVT_F32), 0);
  for (size_t i = 0; i < n; i++) CHECK(isfinite(out[i]));
}

/* Scales (K) or norms (V): where they are and how many. */
static size_t n_scales(int c, const kvt_codec_shape *s) {
  return c == KVT_CODEC_K8C ? (size_t)s->n_heads * s->head_dim
                            : (size_t)s->n_tokens * s->n_heads;
}

static void test_corrupt(void **state) {
  (void)state;
  static const uint16_t bad_f16[] = {0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE00,
                                     0x7FFF, 0x8000, 0xBC00, 0x8001, 0xFBFF};
  static const uint16_t good_f16[] = {0x0000, 0x0001, 0x3C00, 0x7BFF, 0x03FF};
  static const uint8_t xors[] = {0x01, 0x80, 0xFF};
  const uint32_t cdims[] = {8, 12, 96};
  for (size_t ci = 0; ci < N_OF(all_codecs); ci++)
    for (size_t hi = 0; hi < N_OF(cdims); hi++) {
      int c = all_codecs[ci];
      kvt_codec_shape s = {5, 3, cdims[hi], 0, tu_rand()};
      SETCTX("corrupt %s D=%u", kvt_codec_name(c), s.head_dim);
      bufs b;
      bufs_alloc(&b, &s, c);
      gen(b.in, b.x, KVT_F16, 15, s.head_dim, 0);
      encode_ok(c, &s, b.in, KVT_F16, b.enc, b.len);
      accepted(c, &s, b.enc, b.len, "the valid encoding");
      uint8_t *m = b.enc2;
      char what[96];
      /* every header byte, altered */
      for (int i = 0; i < HDR; i++)
        for (size_t xi = 0; xi < N_OF(xors); xi++) {
          memcpy(m, b.enc, b.len);
          m[i] ^= xors[xi];
          snprintf(what, sizeof what, "header byte %d ^ 0x%02x", i, xors[xi]);
          refused(c, &s, m, b.len, what);
        }
      /* lengths: truncated, extended (the bytes exist), NULL */
      const size_t lens[] = {0, 1, HDR - 1, HDR, b.len - 1, b.len + 1, b.len + 64};
      memcpy(m, b.enc, b.len);
      memset(m + b.len, 0, 64);
      for (size_t li = 0; li < N_OF(lens); li++) {
        snprintf(what, sizeof what, "length %zu of %zu", lens[li], b.len);
        refused(c, &s, m, lens[li], what);
      }
      refused(c, &s, NULL, b.len, "NULL payload");
      /* another codec id, valid or not */
      const int ids[] = {0, 1, 2, 3, 4, 5, 6, 7, 255, -1};
      for (size_t k = 0; k < N_OF(ids); k++) {
        if (ids[k] == c) continue;
        snprintf(what, sizeof what, "read as codec %d", ids[k]);
        refused(ids[k], &s, b.enc, b.len, what);
      }
      /* another shape or seed (swapping T and H keeps the size) */
      kvt_codec_shape w[] = {s, s, s, s, s, s, s, s, s, s, s, s};
      w[0].n_tokens++;
      w[1].n_tokens--;
      w[2].n_heads++;
      w[3].n_heads--;
      w[4].head_dim++;
      w[5].head_dim--;
      w[6].n_tokens = s.n_heads, w[6].n_heads = s.n_tokens;
      w[7].seed ^= 1;
      w[8].seed += 0x10000;
      w[9].n_tokens = 0;
      w[10].head_dim = KVT_MAX_HEAD_DIM + 1;
      w[11].n_heads = 0;
      for (size_t k = 0; k < N_OF(w); k++) {
        snprintf(what, sizeof what, "wrong shape or seed #%zu", k);
        refused(c, &w[k], b.enc, b.len, what);
      }
      /* scales and norms: +-inf, NaN, negative (-0 included) refused;
       * 0, subnormal and the maximum accepted */
      size_t ns = n_scales(c, &s);
      size_t at[3] = {0, ns - 1, tu_below((uint32_t)ns)};
      for (int k = 0; k < 3; k++) {
        for (size_t vi = 0; vi < N_OF(bad_f16); vi++) {
          memcpy(m, b.enc, b.len);
          m[HDR + 2 * at[k]] = (uint8_t)bad_f16[vi];
          m[HDR + 2 * at[k] + 1] = (uint8_t)(bad_f16[vi] >> 8);
          snprintf(what, sizeof what, "scale %zu = 0x%04x", at[k], bad_f16[vi]);
          refused(c, &s, m, b.len, what);
        }
        for (size_t vi = 0; vi < N_OF(good_f16); vi++) {
          memcpy(m, b.enc, b.len);
          m[HDR + 2 * at[k]] = (uint8_t)good_f16[vi];
          m[HDR + 2 * at[k] + 1] = (uint8_t)(good_f16[vi] >> 8);
          snprintf(what, sizeof what, "scale %zu = 0x%04x", at[k], good_f16[vi]);
          accepted(c, &s, m, b.len, what);
        }
      }
      /* codes */
      size_t c0 = HDR + 2 * ns, nc = b.len - c0;
      size_t cat[3] = {c0, b.len - 1, c0 + tu_below((uint32_t)nc)};
      for (int k = 0; k < 3; k++) {
        memcpy(m, b.enc, b.len);
        if (c == KVT_CODEC_K8 || c == KVT_CODEC_K8C) {
          m[cat[k]] = 0x80;
          snprintf(what, sizeof what, "int8 code -128 at byte %zu", cat[k]);
          refused(c, &s, m, b.len, what);
          m[cat[k]] = 0x81;
          accepted(c, &s, m, b.len, "int8 code -127");
          m[cat[k]] = 0x7F;
          accepted(c, &s, m, b.len, "int8 code 127");
        } else if (c == KVT_CODEC_K4) {
          for (int hiw = 0; hiw < 2; hiw++) {
            memcpy(m, b.enc, b.len);
            m[cat[k]] &= hiw ? 0x0F : 0xF0;
            snprintf(what, sizeof what, "zero %s nibble at byte %zu", hiw ? "high" : "low", cat[k]);
            refused(c, &s, m, b.len, what);
          }
          m[cat[k]] = 0x1F;
          accepted(c, &s, m, b.len, "nibbles -7 and +7");
        } else { /* every V code names a centroid: garbage codes are valid */
          for (size_t i = c0; i < b.len; i++) m[i] = (uint8_t)tu_rand();
          accepted(c, &s, m, b.len, "random V codes");
        }
      }
      /* 4-bit padding nibbles (head_dim 12: 4 codes of padding per row) */
      if (c == KVT_CODEC_K4 && s.head_dim % 8) {
        size_t rb = (s.head_dim + 7) / 8 * 4;
        memcpy(m, b.enc, b.len);
        m[c0 + rb - 1] &= 0x0F;
        refused(c, &s, m, b.len, "zero padding nibble");
      }
      /* output arguments */
      memset(b.dec, 0x5A, b.n * 4);
      memcpy(b.dec2, b.dec, b.n * 4);
      CHECK_EQ(kvt_codec_decode(c, &s, b.enc, b.len, NULL, KVT_F32), KVT_ENULL);
      CHECK_EQ(kvt_codec_decode(c, &s, b.enc, b.len, b.dec, 0), KVT_EDTYPE);
      CHECK_EQ(kvt_codec_decode(c, &s, b.enc, b.len, b.dec, 4), KVT_EDTYPE);
      CHECK(memcmp(b.dec, b.dec2, b.n * 4) == 0);
      bufs_free(&b);
    }
}

static void test_encode_args(void **state) {
  (void)state;
  kvt_codec_shape s = {4, 2, 16, 0, 7};
  float in[4 * 2 * 16] = {0};
  uint8_t out[2048];
  SETCTX("encode arguments");
  for (size_t ci = 0; ci < N_OF(all_codecs); ci++) {
    int c = all_codecs[ci];
    size_t len = kvt_codec_size(c, &s);
    CHECK(len > HDR && len <= sizeof out);
    CHECK_EQ(kvt_codec_encode(c, &s, in, KVT_F32, out, len), (long long)len);
    CHECK_EQ(kvt_codec_encode(c, &s, in, KVT_F32, out, len - 1), KVT_EBUFSIZE);
    CHECK_EQ(kvt_codec_encode(c, &s, NULL, KVT_F32, out, len), KVT_ENULL);
    CHECK_EQ(kvt_codec_encode(c, &s, in, KVT_F32, NULL, len), KVT_ENULL);
    CHECK_EQ(kvt_codec_encode(c, &s, in, 0, out, len), KVT_EDTYPE);
    CHECK_EQ(kvt_codec_encode(c, &s, in, 4, out, len), KVT_EDTYPE);
    CHECK_EQ(kvt_codec_encode(c, NULL, in, KVT_F32, out, len), KVT_ESHAPE);
    CHECK_EQ(kvt_codec_size(c, NULL), 0);
    kvt_codec_shape bad[] = {s, s, s, s, s, s};
    bad[0].n_tokens = 0;
    bad[1].n_tokens = KVT_MAX_BLOCK_TOKENS + 1;
    bad[2].n_heads = 0;
    bad[3].n_heads = KVT_MAX_HEADS + 1;
    bad[4].head_dim = 0;
    bad[5].head_dim = KVT_MAX_HEAD_DIM + 1;
    for (size_t k = 0; k < N_OF(bad); k++) {
      CHECK_EQ(kvt_codec_size(c, &bad[k]), 0);
      CHECK_EQ(kvt_codec_encode(c, &bad[k], in, KVT_F32, out, sizeof out), KVT_ESHAPE);
    }
    /* the largest shape is sized without overflow */
    kvt_codec_shape big = {KVT_MAX_BLOCK_TOKENS, KVT_MAX_HEADS, KVT_MAX_HEAD_DIM, 0, 0};
    CHECK(kvt_codec_size(c, &big) > (size_t)KVT_MAX_BLOCK_TOKENS * KVT_MAX_HEADS);
  }
  const int unknown[] = {0, 11, -1, 1000};
  for (size_t k = 0; k < N_OF(unknown); k++) {
    CHECK_EQ(kvt_codec_size(unknown[k], &s), 0);
    CHECK_EQ(kvt_codec_encode(unknown[k], &s, in, KVT_F32, out, sizeof out), KVT_EOPTION);
    CHECK(kvt_codec_name(unknown[k]) == NULL);
  }
  /* names and parsing */
  for (size_t ci = 0; ci < N_OF(all_codecs); ci++) {
    const char *nm = kvt_codec_name(all_codecs[ci]);
    CHECK(nm != NULL);
    const kvt_codec *cd = kvt_codec_by_name(nm);
    CHECK(cd && cd->id == all_codecs[ci] && cd->is_value == is_value(all_codecs[ci]));
  }
  /* sizes grow with the bits */
  CHECK(kvt_codec_size(KVT_CODEC_V2, &s) < kvt_codec_size(KVT_CODEC_V3, &s));
  CHECK(kvt_codec_size(KVT_CODEC_V3, &s) < kvt_codec_size(KVT_CODEC_V4, &s));
  CHECK(kvt_codec_size(KVT_CODEC_K4, &s) < kvt_codec_size(KVT_CODEC_K8, &s));
}

/* ------------------------------------------------- scalar conversions */

/* The hardware conversions, 4 values at a time (a zero-padded tail). */
__attribute__((target("f16c,avx"))) static void f16c_from_f32(const float *in, uint16_t *out,
                                                              size_t n) {
  for (size_t i = 0; i < n; i += 4) {
    size_t k = n - i < 4 ? n - i : 4;
    float t[4] = {0};
    uint16_t o[8];
    memcpy(t, in + i, k * 4);
    _mm_storeu_si128((__m128i *)o, _mm_cvtps_ph(_mm_loadu_ps(t), 0)); /* 0: nearest even */
    memcpy(out + i, o, k * 2);
  }
}

__attribute__((target("f16c,avx"))) static void f16c_to_f32(const uint16_t *in, float *out,
                                                            size_t n) {
  for (size_t i = 0; i < n; i += 4) {
    size_t k = n - i < 4 ? n - i : 4;
    uint16_t t[8] = {0};
    float o[4];
    memcpy(t, in + i, k * 2);
    _mm_storeu_ps(o, _mm_cvtph_ps(_mm_loadu_si128((const __m128i *)t)));
    memcpy(out + i, o, k * 4);
  }
}

/* bf16 by the definition: the nearer of the two bf16 neighbours, ties to
 * the even one, with the value past the largest finite one being 2^128
 * (+inf); NaN quieted keeping its sign and top payload bits. Exact: every
 * quantity is a double. */
static uint16_t ref_bf16(float f) {
  uint32_t x = f2u(f);
  if (isnan(f)) return (uint16_t)((x >> 16) | 0x40);
  uint32_t lo = x & 0xFFFF0000u, sign = x & 0x80000000u;
  if ((x & 0xFFFF) == 0) return (uint16_t)(x >> 16);
  uint32_t hi = lo + 0x10000; /* next magnitude; 0x7F800000 is inf */
  double a = fabs((double)f), dl = fabs((double)u2f(lo));
  double dh = (hi & 0x7FFFFFFF) == 0x7F800000u ? 0x1p128 : fabs((double)u2f(hi));
  double el = a - dl, eh = dh - a;
  uint32_t r = el < eh ? lo : eh < el ? hi : ((lo >> 16) & 1) ? hi : lo;
  return (uint16_t)((r | sign) >> 16);
}

/* Inputs that exercise f16 rounding: random bits, random values in and
 * around the f16 range, every f16 value, the midpoints between neighbours
 * (ties) and the floats next to them, subnormals and the overflow edge. */
static size_t conv_inputs(float *v, size_t cap) {
  size_t n = 0;
  const float edges[] = {0.0f, -0.0f, 65504.0f, 65519.996f, 65520.0f, 65536.0f, -65520.0f,
                         0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x1.8p-24f, 0x1p-14f,
                         0x1.ffcp-15f, 0x1.ffep-15f, 3.4028235e38f, -3.4028235e38f,
                         INFINITY, -INFINITY, NAN, -NAN, 1e-45f, 1.1754942e-38f};
  for (size_t i = 0; i < N_OF(edges); i++) v[n++] = edges[i];
  const uint32_t nans[] = {0x7F800001u, 0x7FBFFFFFu, 0xFF800001u, 0x7FC00001u, 0x7FFFE000u,
                           0x7F802000u};
  for (size_t i = 0; i < N_OF(nans); i++) v[n++] = u2f(nans[i]);
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7C00) == 0x7C00) continue;
    float a = tu_f16_to_f32((uint16_t)h), b = tu_f16_to_f32((uint16_t)(h + 1));
    if ((h & 0x7FFF) == 0x7BFF) b = copysignf(65536.0f, a);
    float mid = (float)(((double)a + (double)b) / 2); /* exact: 12 bits */
    v[n++] = a;
    v[n++] = mid;
    v[n++] = nextafterf(mid, INFINITY);
    v[n++] = nextafterf(mid, -INFINITY);
  }
  while (n < cap / 2) v[n++] = u2f((uint32_t)tu_rand());
  while (n < cap) { /* exponents from 2^-27 to 2^17 */
    uint32_t e = 100 + tu_below(45), r = (uint32_t)tu_rand();
    v[n++] = u2f((r & 0x807FFFFFu) | e << 23);
  }
  return n;
}

static void test_conversions(void **state) {
  (void)state;
  __builtin_cpu_init();
  int f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  size_t cap = tu_stress() ? (64u << 20) : (4u << 20);
  float *v = malloc(cap * 4), *back = malloc(cap * 4);
  uint16_t *h = malloc(cap * 2), *h2 = malloc(cap * 2);
  assert_true(v && back && h && h2);
  size_t n = conv_inputs(v, cap);
  SETCTX("conversions");
  /* f32 -> f16 */
  if (f16c) {
    f16c_from_f32(v, h, n);
    for (size_t i = 0; i < n; i++) {
      uint16_t mine = kvt_f32_to_f16(v[i]);
      if (mine != h[i])
        fail_msg("kvt_f32_to_f16(%a = 0x%08x) = 0x%04x, F16C gives 0x%04x", v[i], f2u(v[i]), mine,
                 h[i]);
    }
    /* f16 -> f32, every value */
    for (uint32_t i = 0; i < 0x10000; i++) h[i] = (uint16_t)i;
    f16c_to_f32(h, back, 0x10000);
    /* NaN: F16C quiets a signaling NaN (sets bit 22), the scalar code
     * keeps it signaling; otherwise sign and payload agree. Tensors never
     * hold NaN (puts refuse it, scales and norms are checked), so only the
     * NaN-ness, sign and payload are required to match. */
    int snan_differ = 0;
    for (uint32_t i = 0; i < 0x10000; i++) {
      uint32_t mine = f2u(kvt_f16_to_f32((uint16_t)i)), hw = f2u(back[i]);
      if ((i & 0x7C00) == 0x7C00 && (i & 0x3FF)) {
        CHECK((mine | 0x400000u) == hw);
        snan_differ += mine != hw;
      } else if (mine != hw) {
        fail_msg("kvt_f16_to_f32(0x%04x) = 0x%08x, F16C gives 0x%08x", i, mine, hw);
      }
    }
    if (snan_differ)
      fprintf(stderr, "note: kvt_f16_to_f32 keeps %d signaling NaNs signaling; F16C quiets them\n",
              snan_differ);
  } else {
    fprintf(stderr, "skip: no F16C on this CPU; f16 checked against the test's converter only\n");
    tu_skip_mark();
  }
  /* against the test's own converters (no hardware needed) */
  for (size_t i = 0; i < n; i++) {
    uint16_t mine = kvt_f32_to_f16(v[i]), ref = tu_f32_to_f16(v[i]);
    if (isnan(v[i])) CHECK((mine & 0x7C00) == 0x7C00 && (mine & 0x3FF) && (mine & 0x8000) == (ref & 0x8000));
    else if (mine != ref) fail_msg("kvt_f32_to_f16(%a) = 0x%04x, expected 0x%04x", v[i], mine, ref);
  }
  /* f32 -> bf16 against the exact reference; bf16 -> f32 for every value */
  for (size_t i = 0; i < n; i++) {
    uint16_t mine = kvt_f32_to_bf16(v[i]), ref = ref_bf16(v[i]);
    if (mine != ref)
      fail_msg("kvt_f32_to_bf16(%a = 0x%08x) = 0x%04x, expected 0x%04x", v[i], f2u(v[i]), mine, ref);
  }
  for (uint32_t i = 0; i < 0x10000; i++) CHECK(f2u(kvt_bf16_to_f32((uint16_t)i)) == i << 16);
  /* The bulk conversions agree at both kernel levels (finite values: what
   * tensors hold). */
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (isfinite(v[i])) v[m++] = v[i];
  for (int lvl = 0; lvl < 1 + kvt_codec_simd(); lvl++) {
    kvt_codec_force(lvl);
    kvt_from_f32(v, KVT_F16, m, h2);
    for (size_t i = 0; i < m; i++) CHECK(h2[i] == kvt_f32_to_f16(v[i]));
    kvt_to_f32(h2, KVT_F16, m, back);
    for (size_t i = 0; i < m; i++) CHECK(f2u(back[i]) == f2u(kvt_f16_to_f32(h2[i])));
    kvt_from_f32(v, KVT_BF16, m, h2);
    for (size_t i = 0; i < m; i++) CHECK(h2[i] == kvt_f32_to_bf16(v[i]));
  }
  kvt_codec_force(-1);
  fprintf(stderr, "conversions: %zu values, F16C %s\n", n, f16c ? "compared" : "absent");
  free(v);
  free(back);
  free(h);
  free(h2);
}

/* ------------------------------------------------- attention primitives */

/* k_dots equals q . k' over the decoded keys: the library sums D products
 * in float (and folds the scale in once), so it may differ by D + 2
 * roundings of 2^-24 of sum |q_d k'_d|; allowed 1e-6 * D of it (16x).
 * v_accum + v_unrotate equals sum_t p_t v'_t over the decoded values: each
 * coordinate of either side is a sum of T weighted terms and log2(vdim)
 * butterfly stages, every term bounded by p_t |v_t| c_max (|v'_t,d| <=
 * norm_t * c_max), so both are within (T + log2 vdim) 2^-24 of sum_t p_t
 * |v_t| c_max; allowed 4x that. */
static void test_attention_primitives(void **state) {
  (void)state;
  static const double cmax[5] = {0, 0, 1.5104, 2.1520, 2.7326};
  for (int lvl = 0; lvl < 1 + kvt_codec_simd(); lvl++)
    for (size_t ci = 0; ci < N_OF(all_codecs); ci++)
      for (size_t hi = 0; hi < N_OF(dims); hi++)
        for (size_t si = 0; si < N_OF(shapes); si++) {
          int c = all_codecs[ci];
          kvt_codec_force(lvl);
          kvt_codec_shape s = {shapes[si].t, shapes[si].h, dims[hi], 0, tu_rand()};
          const uint32_t T = s.n_tokens, H = s.n_heads, D = s.head_dim;
          SETCTX("attention primitives level %d %s T=%u H=%u D=%u", lvl, kvt_codec_name(c), T, H, D);
          bufs b;
          bufs_alloc(&b, &s, c);
          gen(b.in, b.x, KVT_F32, (size_t)T * H, D, 0);
          encode_ok(c, &s, b.in, KVT_F32, b.enc, b.len);
          decode_ok(c, &s, b.enc, b.len, b.dec, KVT_F32);
          const float *y = b.dec;
          float q[KVT_MAX_HEAD_DIM], p[64], scores[64], acc[KVT_MAX_HEAD_DIM], out[KVT_MAX_HEAD_DIM];
          for (uint32_t h = 0; h < H; h++) {
            for (uint32_t i = 0; i < D; i++) q[i] = (float)gauss();
            double psum = 0;
            for (uint32_t t = 0; t < T; t++) psum += p[t] = tu_below(5) ? (float)unif() : 0.0f;
            for (uint32_t t = 0; t < T; t++) p[t] = (float)(p[t] / (psum + 1e-9));
            if (!is_value(c)) {
              kvt_codec_k_dots(c, &s, b.enc, h, q, scores);
              for (uint32_t t = 0; t < T; t++) {
                const float *k = y + ((size_t)t * H + h) * D;
                double ref = 0, mag = 0;
                for (uint32_t d = 0; d < D; d++) {
                  ref += (double)q[d] * k[d];
                  mag += fabs((double)q[d] * k[d]);
                }
                if (!(fabs(scores[t] - ref) <= 1e-6 * D * mag + 1e-30))
                  fail_msg("%s: head %u token %u: dot %.9g, decoded %.9g", ctx, h, t, scores[t], ref);
              }
            } else {
              uint32_t vdim = kvt_codec_vdim(D);
              CHECK(vdim >= D && vdim >= 8 && (vdim & (vdim - 1)) == 0 && vdim < 2 * D + 8);
              memset(acc, 0, sizeof acc);
              kvt_codec_v_accum(c, &s, b.enc, h, p, acc);
              kvt_codec_v_unrotate(&s, acc, out);
              double mag = 0;
              for (uint32_t t = 0; t < T; t++) {
                double nn = 0;
                for (uint32_t d = 0; d < D; d++) {
                  double xv = b.x[((size_t)t * H + h) * D + d];
                  nn += xv * xv;
                }
                mag += p[t] * sqrt(nn) * cmax[v_bits(c)];
              }
              double tol = 4 * (T + log2((double)vdim) + 2) * 0x1p-24 * mag + 1e-30;
              for (uint32_t d = 0; d < D; d++) {
                double ref = 0;
                for (uint32_t t = 0; t < T; t++) ref += (double)p[t] * y[((size_t)t * H + h) * D + d];
                if (!(fabs(out[d] - ref) <= tol))
                  fail_msg("%s: head %u dim %u: in place %.9g, decoded %.9g (tol %.3g)", ctx, h, d,
                           out[d], ref, tol);
              }
            }
          }
          bufs_free(&b);
        }
  kvt_codec_force(-1);
}

/* The GQA forms (kvt_codec_k_dots_n, kvt_codec_v_accum_n: up to
 * KVT_CODEC_GQA queries sharing a KV head, strided scores and weights) give
 * each query exactly what the one-query calls give it, at either kernel
 * level; kvt_codec_decode_trusted decodes a valid payload as
 * kvt_codec_decode does. */
static void test_gqa_primitives(void **state) {
  (void)state;
  enum { G = KVT_CODEC_GQA, STRIDE = 70 }; /* > every T here: columns don't overlap */
  for (int lvl = 0; lvl < 1 + kvt_codec_simd(); lvl++)
    for (size_t ci = 0; ci < N_OF(all_codecs); ci++)
      for (size_t hi = 0; hi < N_OF(dims); hi++)
        for (size_t si = 0; si < N_OF(shapes); si++) {
          int c = all_codecs[ci];
          kvt_codec_force(lvl);
          kvt_codec_shape s = {shapes[si].t, shapes[si].h, dims[hi], 0, tu_rand()};
          const uint32_t T = s.n_tokens, H = s.n_heads, D = s.head_dim, vdim = kvt_codec_vdim(D);
          SETCTX("gqa primitives level %d %s T=%u H=%u D=%u", lvl, kvt_codec_name(c), T, H, D);
          bufs b;
          bufs_alloc(&b, &s, c);
          gen(b.in, b.x, KVT_F32, (size_t)T * H, D, 0);
          encode_ok(c, &s, b.in, KVT_F32, b.enc, b.len);
          decode_ok(c, &s, b.enc, b.len, b.dec, KVT_F16);
          memset(b.dec2, 0x5A, b.n * 2);
          kvt_codec_decode_trusted(c, &s, b.enc, b.dec2, KVT_F16);
          check_same(b.dec, b.dec2, b.n * 2, "trusted and checked decodes");
          static float q[G * KVT_MAX_HEAD_DIM], p[G * STRIDE], sc[G * STRIDE], one[STRIDE];
          static float acc[G * KVT_MAX_HEAD_DIM], acc1[KVT_MAX_HEAD_DIM];
          for (uint32_t h = 0; h < H; h++)
            for (uint32_t gn = 1; gn <= G; gn++) {
              for (uint32_t i = 0; i < gn * D; i++) q[i] = (float)gauss();
              for (uint32_t i = 0; i < gn * STRIDE; i++) p[i] = tu_below(4) ? (float)unif() : 0.0f;
              if (!is_value(c)) {
                kvt_codec_k_dots_n(c, &s, b.enc, h, q, gn, sc, STRIDE);
                for (uint32_t j = 0; j < gn; j++) {
                  kvt_codec_k_dots(c, &s, b.enc, h, q + j * D, one);
                  check_same(one, sc + j * STRIDE, T * sizeof(float), "k_dots_n and k_dots");
                }
                continue;
              }
              memset(acc, 0, gn * vdim * sizeof(float));
              kvt_codec_v_accum_n(c, &s, b.enc, h, p, STRIDE, gn, acc);
              for (uint32_t j = 0; j < gn; j++) {
                memset(acc1, 0, sizeof acc1);
                kvt_codec_v_accum(c, &s, b.enc, h, p + j * STRIDE, acc1);
                check_same(acc1, acc + j * vdim, vdim * sizeof(float), "v_accum_n and v_accum");
              }
            }
          bufs_free(&b);
        }
  kvt_codec_force(-1);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_encode_args, restore_level),
      cmocka_unit_test_teardown(test_simd_matches_scalar, restore_level),
      cmocka_unit_test_teardown(test_k_error_bound, restore_level),
      cmocka_unit_test_teardown(test_f16_range_edge, restore_level),
      cmocka_unit_test_teardown(test_nonfinite_input, restore_level),
      cmocka_unit_test_teardown(test_v_distortion, restore_level),
      cmocka_unit_test_teardown(test_determinism, restore_level),
      cmocka_unit_test_teardown(test_corrupt, restore_level),
      cmocka_unit_test_teardown(test_conversions, restore_level),
      cmocka_unit_test_teardown(test_attention_primitives, restore_level),
      cmocka_unit_test_teardown(test_gqa_primitives, restore_level),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
