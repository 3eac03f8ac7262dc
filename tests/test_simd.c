/* test_simd.c - the AVX2 codec kernels against the scalar ones, in volume:
 * 10^5 vectors per codec (10^6 with KVT_STRESS=1) encode to the same bytes
 * and decode to the same values at both kernel levels. The vectors are
 * drawn to sit where the two paths could part: value coordinates exactly on
 * a Lloyd-Max boundary (every boundary of every value codec, built from the
 * rotation's own sign stream, docs/format.md), norms exactly between two
 * f16 values and near the f16 overflow, key ties at half a step. A tie must
 * also give the code docs/format.md defines (boundaries *below* the value:
 * a tie goes to the lower code). The attention kernels (k_dots, v_accum)
 * agree with the scalar kernel within a stated bound. test_codec.c checks
 * the formats themselves on small shapes. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"

#define HDR 16 /* KVT_CODEC_HDR */
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static const int codecs[] = {KVT_CODEC_K8, KVT_CODEC_K8C, KVT_CODEC_K4,
                             KVT_CODEC_V2, KVT_CODEC_V3, KVT_CODEC_V4};

static int is_value(int c) { return c >= KVT_CODEC_V2; }
static int v_bits(int c) { return c - KVT_CODEC_V2 + 2; }

static double unif(void) { return ((double)(tu_rand() >> 11) + 0.5) * 0x1p-53; }
static double gauss(void) { return sqrt(-2.0 * log(unif())) * cos(2.0 * M_PI * unif()); }

/* ------------------------------------------- the format's own constants */

/* The centroids of docs/format.md as the library spells them (float
 * literals), and the boundaries as the format defines them: midpoints. */
static const float lm2[] = {-1.5104f, -0.4528f, 0.4528f, 1.5104f};
static const float lm3[] = {-2.1520f, -1.3440f, -0.7560f, -0.2451f,
                            0.2451f,  0.7560f,  1.3440f,  2.1520f};
static const float lm4[] = {-2.7326f, -2.0690f, -1.6181f, -1.2562f, -0.9424f, -0.6568f,
                            -0.3881f, -0.1284f, 0.1284f,  0.3881f,  0.6568f,  0.9424f,
                            1.2562f,  1.6181f,  2.0690f,  2.7326f};

static float v_bound(int bits, int i) {
  const float *c = bits == 2 ? lm2 : bits == 3 ? lm3 : lm4;
  volatile float sum = c[i] + c[i + 1]; /* two roundings, as the library: no contraction */
  return 0.5f * sum;
}

/* The rotation's sign of coordinate i (docs/format.md: bit i of the
 * splitmix64 stream seeded with the seed; set means -1). */
static float rot_sign(uint64_t seed, uint32_t i) {
  uint64_t st = seed, w = 0;
  for (uint32_t k = 0; k <= i / 64; k++) w = tu_rand_r(&st);
  return (w >> (i % 64)) & 1 ? -1.0f : 1.0f;
}

/* ------------------------------------------------ the vectors it draws */

enum { V_GAUSS, V_OUTLIER, V_TINY, V_ZERO, V_NORM_MID, V_NORM_HUGE, V_K_TIE, V_V_TIE, V_KINDS };

typedef struct draw {
  uint32_t dtype;
  int codec;
  kvt_codec_shape s;
  float sign[KVT_MAX_HEAD_DIM];
  uint32_t m;         /* coordinates the value ties are built on: a power of two <= head_dim */
  uint64_t ties[16];  /* value ties built, per boundary */
  uint64_t kinds[V_KINDS];
} draw;

static void put(void *buf, uint32_t dt, size_t i, float f) {
  if (dt == KVT_F32) {
    memcpy((char *)buf + 4 * i, &f, 4);
    return;
  }
  if (dt == KVT_F16 && fabsf(f) > 60000.0f) f = copysignf(60000.0f, f); /* stays finite */
  uint16_t h = dt == KVT_F16 ? tu_f32_to_f16(f) : tu_f32_to_bf16(f);
  memcpy((char *)buf + 2 * i, &h, 2);
}

/* A value tie on coordinate 0: after the sign flips, pairs (w_2i, w_2i+1)
 * that nearly cancel (their sums d_i add up to the boundary B) and squares
 * that add up to 1, every number a multiple of ulp(B) below the binade of
 * B's largest partial sum. Then every butterfly sum on the way to y_0 is
 * exact, y_0 = B, the norm rounds to f16 1.0, 1/norm = 1, and y_0 / norm
 * lands on the boundary itself. Returns 0 when this draw failed a check
 * (the caller draws another vector). */
static int value_tie(draw *d, float *x, int b) {
  const int bits = v_bits(d->codec);
  const float B = v_bound(bits, b);
  const uint32_t m = d->m, pairs = m / 2;
  double E = 2.0; /* every |partial sum| stays below E, a power of two above |B| */
  while (E <= fabs(B)) E *= 2;
  const double u = E * 0x1p-24; /* every number a multiple of u is exact below E */
  double w[KVT_MAX_HEAD_DIM], dsum = 0, sq = 0;
  for (uint32_t i = 0; i < pairs; i++) { /* the d_i: B spread over the pairs */
    double di = i + 1 < pairs ? round((double)B / pairs * (0.5 + unif()) / u) * u : (double)B - dsum;
    dsum += di;
    w[2 * i + 1] = di; /* holds d_i until the pair is built */
  }
  const double r = 1.0 / sqrt((double)m);
  for (uint32_t i = 0; i < pairs; i++) {
    double di = w[2 * i + 1], a;
    if (i + 1 < pairs) {
      a = round(r * (0.85 + 0.1 * unif()) * (tu_below(2) ? 1 : -1) / u) * u;
    } else { /* the last pair takes what the squares still need: a^2 + (d-a)^2 = rest */
      double rest = 1.0 - sq, disc = 2 * rest - di * di;
      if (disc <= 0) return 0;
      a = round((di + sqrt(disc)) / 2 / u) * u;
    }
    w[2 * i] = a;
    w[2 * i + 1] = di - a;
    sq += a * a + (di - a) * (di - a);
  }
  if (fabs(sqrt(sq) - 1.0) > 0x1p-14) return 0; /* the f16 norm must be exactly 1 */
  /* the partial sums of the butterflies on coordinate 0, in their order */
  double part[KVT_MAX_HEAD_DIM];
  for (uint32_t i = 0; i < m; i++) part[i] = w[i];
  for (uint32_t h = 1; h < m; h <<= 1)
    for (uint32_t i = 0; i < m; i += 2 * h) {
      part[i] += part[i + h];
      if (!(fabs(part[i]) < E) || (double)(float)part[i] != part[i]) return 0;
    }
  if (part[0] != (double)B) return 0;
  for (uint32_t i = 0; i < m; i++) {
    if (!(fabs(w[i]) < E) || (double)(float)w[i] != w[i]) return 0;
    x[i] = d->sign[i] * (float)w[i];
  }
  for (uint32_t i = m; i < d->s.head_dim; i++) x[i] = 0.0f;
  d->ties[b]++;
  return 1;
}

/* A vector whose norm, computed in float, is within an ulp or two of the
 * midpoint between two f16 values (or of 65504 and beyond, with huge): a
 * sum of squares taken in another order, or fused, rounds the norm the
 * other way. Gaussian directions; f32 input so nothing rounds them. */
static void norm_edge(const draw *d, float *x, int huge) {
  const uint32_t n = d->s.head_dim;
  double ss = 0, t[KVT_MAX_HEAD_DIM];
  for (uint32_t i = 0; i < n; i++) {
    t[i] = gauss();
    ss += t[i] * t[i];
  }
  double target;
  if (huge) {
    target = 65504.0 * (0.999 + 0.01 * unif());
  } else { /* a normal f16 h and the midpoint to the next one */
    uint16_t h = (uint16_t)(0x0400 + tu_below(0x7BFF - 0x0400));
    target = 0.5 * ((double)tu_f16_to_f32(h) + (double)tu_f16_to_f32((uint16_t)(h + 1)));
  }
  double c = target / sqrt(ss);
  for (uint32_t i = 0; i < n; i++) x[i] = (float)(t[i] * c);
}

/* Key ties: a vector whose absmax maps to the top code exactly (a power
 * of two scale) and whose other values sit half a step between codes. */
static void key_tie(const draw *d, float *x) {
  const int lim = d->codec == KVT_CODEC_K4 ? 7 : 127;
  const float sc = ldexpf(1.0f, (int)tu_below(20) - 10);
  for (uint32_t i = 0; i < d->s.head_dim; i++)
    x[i] = i == 0 ? lim * sc : ((float)((int)tu_below(2 * lim) - lim) + 0.5f) * sc;
}

static int draw_vec(draw *d, float *x, int kind) {
  const uint32_t n = d->s.head_dim;
  switch (kind) {
  case V_V_TIE:
    return value_tie(d, x, (int)tu_below((1u << v_bits(d->codec)) - 1));
  case V_NORM_MID:
  case V_NORM_HUGE:
    norm_edge(d, x, kind == V_NORM_HUGE);
    return 1;
  case V_K_TIE:
    key_tie(d, x);
    return 1;
  case V_ZERO:
    for (uint32_t i = 0; i < n; i++) x[i] = tu_below(2) ? 0.0f : -0.0f;
    return 1;
  default: {
    double sc = kind == V_TINY ? 1e-6 : pow(10.0, -3.0 + 6.0 * unif());
    for (uint32_t i = 0; i < n; i++) {
      x[i] = (float)(gauss() * sc);
      if (kind == V_OUTLIER && tu_below(16) == 0) x[i] *= 40.0f;
    }
    return 1;
  }
  }
}

/* Which kinds a chunk of this codec and dtype draws: the value kinds need
 * f32 input (a rounding to f16 would move them off their edge). */
static int pick_kind(const draw *d) {
  for (;;) {
    int k = (int)tu_below(V_KINDS);
    if ((k == V_V_TIE || k == V_NORM_MID || k == V_NORM_HUGE) &&
        (!is_value(d->codec) || d->dtype != KVT_F32))
      continue;
    if (k == V_K_TIE && is_value(d->codec)) continue;
    return k;
  }
}

/* --------------------------------------------------- one chunk, both ways */

typedef struct chunk {
  size_t n_vec, n, len;
  void *in;
  float *x;
  int *tie_bound; /* per vector: the boundary index of a value tie, or -1 */
  uint8_t *enc[2];
  void *dec[2];
} chunk;

static void chunk_alloc(chunk *c, const kvt_codec_shape *s, int codec) {
  c->n_vec = (size_t)s->n_tokens * s->n_heads;
  c->n = c->n_vec * s->head_dim;
  c->len = kvt_codec_size(codec, s);
  c->in = malloc(c->n * 4);
  c->x = malloc(s->head_dim * sizeof(float));
  c->tie_bound = malloc(c->n_vec * sizeof(int));
  for (int l = 0; l < 2; l++) {
    c->enc[l] = malloc(c->len);
    c->dec[l] = malloc(c->n * 4);
    assert_non_null(c->enc[l]);
    assert_non_null(c->dec[l]);
  }
  assert_non_null(c->in);
  assert_non_null(c->x);
  assert_non_null(c->tie_bound);
}

static void chunk_free(chunk *c) {
  free(c->in);
  free(c->x);
  free(c->tie_bound);
  for (int l = 0; l < 2; l++) {
    free(c->enc[l]);
    free(c->dec[l]);
  }
}

static void fill(draw *d, chunk *c) {
  const uint32_t n = d->s.head_dim;
  for (size_t v = 0; v < c->n_vec; v++) {
    int kind = pick_kind(d), got;
    while (!(got = draw_vec(d, c->x, kind))) kind = pick_kind(d);
    c->tie_bound[v] = -1;
    d->kinds[kind]++;
    for (uint32_t i = 0; i < n; i++) put(c->in, d->dtype, v * n + i, c->x[i]);
    if (kind == V_V_TIE) {
      /* recover the boundary: coordinate 0 after the flips sums to it */
      double y0 = 0;
      for (uint32_t i = 0; i < d->m; i++) y0 += (double)(d->sign[i] * c->x[i]);
      const int bits = v_bits(d->codec);
      for (int b = 0; b + 1 < (1 << bits); b++)
        if ((double)v_bound(bits, b) == y0) c->tie_bound[v] = b;
      assert_true(c->tie_bound[v] >= 0);
    }
  }
}

/* Code i of vector v of a value encoding (docs/format.md). */
static int v_code(const chunk *c, const kvt_codec_shape *s, int bits, size_t v, uint32_t i) {
  const size_t per = kvt_codec_vdim(s->head_dim) / 8 * (size_t)bits;
  const uint8_t *p = c->enc[0] + HDR + 2 * c->n_vec + v * per + (size_t)(i / 8) * bits;
  uint32_t word = 0;
  for (int b = 0; b < bits; b++) word |= (uint32_t)p[b] << (8 * b);
  return (int)(word >> (bits * (i % 8))) & ((1 << bits) - 1);
}

static void first_diff(const void *a, const void *b, size_t n, const char *what, const draw *d) {
  const uint8_t *x = a, *y = b;
  for (size_t i = 0; i < n; i++)
    if (x[i] != y[i])
      fail_msg("%s dtype %u T=%u H=%u D=%u seed %llu: %s differ at byte %zu of %zu",
               kvt_codec_name(d->codec), d->dtype, d->s.n_tokens, d->s.n_heads, d->s.head_dim, (unsigned long long)d->s.seed, what, i, n);
}

static void run_chunk(draw *d, chunk *c) {
  fill(d, c);
  const uint32_t odt = d->dtype == KVT_F32 ? KVT_F16 : KVT_F32;
  for (int l = 0; l < 2; l++) {
    kvt_codec_force(l);
    assert_int_equal(kvt_codec_encode(d->codec, &d->s, c->in, d->dtype, c->enc[l], c->len),
                     (int64_t)c->len);
  }
  first_diff(c->enc[0], c->enc[1], c->len, "scalar and AVX2 encodings", d);
  const uint32_t dts[2] = {d->dtype, odt};
  for (int k = 0; k < 2; k++) {
    for (int l = 0; l < 2; l++) {
      kvt_codec_force(l);
      assert_int_equal(kvt_codec_decode(d->codec, &d->s, c->enc[0], c->len, c->dec[l], dts[k]), 0);
    }
    first_diff(c->dec[0], c->dec[1], c->n * kvt_dtype_size(dts[k]), "scalar and AVX2 decodes", d);
  }
  kvt_codec_force(-1);
  if (!is_value(d->codec)) return;
  const int bits = v_bits(d->codec);
  for (size_t v = 0; v < c->n_vec; v++)
    if (c->tie_bound[v] >= 0 && v_code(c, &d->s, bits, v, 0) != c->tie_bound[v])
      fail_msg("%s: a coordinate exactly on boundary %d got code %d, the format says %d",
               kvt_codec_name(d->codec), c->tie_bound[v], v_code(c, &d->s, bits, v, 0),
               c->tie_bound[v]);
}

static void draw_shape(draw *d, int codec) {
  static const uint32_t dims[] = {8, 12, 16, 40, 64, 96, 100, 128}; /* both AVX2 encode paths */
  static const uint32_t dtypes[] = {KVT_F32, KVT_F32, KVT_F16, KVT_BF16};
  d->codec = codec;
  d->dtype = dtypes[tu_below(N_OF(dtypes))];
  uint32_t D = dims[tu_below(N_OF(dims))];
  d->s = (kvt_codec_shape){(uint32_t)(64 + tu_below(200)), 8, D, 0, tu_rand()};
  d->m = 1;
  while (d->m * 2 <= D) d->m *= 2;
  for (uint32_t i = 0; i < kvt_codec_vdim(D); i++) d->sign[i] = rot_sign(d->s.seed, i);
}

static void test_volume(void **state) {
  (void)state;
  const uint64_t want = tu_stress() ? 1000000 : 100000;
  for (size_t ci = 0; ci < N_OF(codecs); ci++) {
    draw d;
    memset(&d, 0, sizeof d);
    uint64_t vecs = 0;
    while (vecs < want) {
      draw_shape(&d, codecs[ci]);
      chunk c;
      chunk_alloc(&c, &d.s, d.codec);
      run_chunk(&d, &c);
      vecs += c.n_vec;
      chunk_free(&c);
    }
    fprintf(stderr, "%s: %llu vectors byte-identical at both levels", kvt_codec_name(codecs[ci]),
            (unsigned long long)vecs);
    if (is_value(codecs[ci])) {
      const int nb = (1 << v_bits(codecs[ci])) - 1;
      fprintf(stderr, "; ties per boundary:");
      for (int b = 0; b < nb; b++) {
        fprintf(stderr, " %llu", (unsigned long long)d.ties[b]);
        assert_true(d.ties[b] >= 20); /* every boundary was hit, and often */
      }
      fprintf(stderr, "; norms at an f16 midpoint %llu, near overflow %llu",
              (unsigned long long)d.kinds[V_NORM_MID], (unsigned long long)d.kinds[V_NORM_HUGE]);
      assert_true(d.kinds[V_NORM_MID] >= 1000);
    } else {
      fprintf(stderr, "; key ties %llu", (unsigned long long)d.kinds[V_K_TIE]);
      assert_true(d.kinds[V_K_TIE] >= 1000);
    }
    fprintf(stderr, "\n");
  }
}

/* ------------------------------------------------- attention kernels */

/* k_dots and v_accum at the AVX2 level against the scalar level on the
 * same encoding. The two sum in other orders, so they may differ, but by
 * no more than (terms + 4) units of 2^-24 of the sum of the terms'
 * magnitudes: the bound for a sum reordered plus a few roundings per term
 * (stated relative to sum |term|, as the result itself may cancel). */
static void test_attention_kernels(void **state) {
  (void)state;
  const uint64_t want = tu_stress() ? 200000 : 20000;
  for (size_t ci = 0; ci < N_OF(codecs); ci++) {
    uint64_t vecs = 0;
    double worst = 0; /* largest |diff| / bound seen */
    while (vecs < want) {
      draw d;
      memset(&d, 0, sizeof d);
      draw_shape(&d, codecs[ci]);
      d.dtype = KVT_F32;
      const uint32_t T = d.s.n_tokens, H = d.s.n_heads, D = d.s.head_dim;
      const uint32_t vd = kvt_codec_vdim(D);
      chunk c;
      chunk_alloc(&c, &d.s, d.codec);
      fill(&d, &c);
      assert_int_equal(kvt_codec_encode(d.codec, &d.s, c.in, KVT_F32, c.enc[0], c.len),
                       (int64_t)c.len);
      assert_int_equal(kvt_codec_decode(d.codec, &d.s, c.enc[0], c.len, c.dec[0], KVT_F32), 0);
      const float *y = c.dec[0];
      float *q = malloc(D * 4), *p = malloc(T * 4), *sc[2], acc[2][KVT_MAX_HEAD_DIM];
      sc[0] = malloc(T * 4);
      sc[1] = malloc(T * 4);
      assert_true(q && p && sc[0] && sc[1]);
      for (uint32_t h = 0; h < H; h++) {
        for (uint32_t i = 0; i < D; i++) q[i] = (float)gauss();
        for (uint32_t t = 0; t < T; t++) p[t] = (float)unif() / T;
        for (int l = 0; l < 2; l++) {
          kvt_codec_force(l);
          if (!is_value(d.codec)) {
            kvt_codec_k_dots(d.codec, &d.s, c.enc[0], h, q, sc[l]);
          } else {
            memset(acc[l], 0, sizeof acc[l]);
            kvt_codec_v_accum(d.codec, &d.s, c.enc[0], h, p, acc[l]);
          }
        }
        kvt_codec_force(-1);
        if (!is_value(d.codec)) {
          for (uint32_t t = 0; t < T; t++) {
            double mag = 0;
            for (uint32_t i = 0; i < D; i++) mag += fabs((double)q[i] * y[((size_t)t * H + h) * D + i]);
            double bound = (D + 4) * 0x1p-24 * mag, diff = fabs((double)sc[0][t] - sc[1][t]);
            if (!(diff <= bound))
              fail_msg("%s head %u token %u: scalar %.9g, AVX2 %.9g, bound %.3g",
                       kvt_codec_name(d.codec), h, t, sc[0][t], sc[1][t], bound);
            if (bound > 0 && diff / bound > worst) worst = diff / bound;
          }
        } else {
          /* each rotated coordinate sums T terms p_t (norm_t / vdim) c, |c| <= 2.7326
           * (the stored f16 norms: docs/format.md) */
          double mag = 0;
          for (uint32_t t = 0; t < T; t++) {
            const uint8_t *nb = c.enc[0] + HDR + 2 * ((size_t)t * H + h);
            mag += p[t] * tu_f16_to_f32((uint16_t)(nb[0] | nb[1] << 8)) * 2.7326 / vd;
          }
          double bound = (T + 4) * 0x1p-24 * mag + 1e-37;
          for (uint32_t i = 0; i < vd; i++) {
            double diff = fabs((double)acc[0][i] - acc[1][i]);
            if (!(diff <= bound))
              fail_msg("%s head %u coord %u: scalar %.9g, AVX2 %.9g, bound %.3g",
                       kvt_codec_name(d.codec), h, i, acc[0][i], acc[1][i], bound);
            if (diff / bound > worst) worst = diff / bound;
          }
        }
      }
      vecs += c.n_vec;
      free(q);
      free(p);
      free(sc[0]);
      free(sc[1]);
      chunk_free(&c);
    }
    fprintf(stderr, "%s attention: %llu vectors, largest difference %.3f of the bound\n",
            kvt_codec_name(codecs[ci]), (unsigned long long)vecs, worst);
  }
}

static int restore_level(void **state) {
  (void)state;
  kvt_codec_force(-1);
  return 0;
}

int main(void) {
  if (!kvt_codec_simd()) {
    fprintf(stderr, "skipped: this CPU has no AVX2/F16C, so only the scalar kernels exist\n");
    return 77; /* ctest: Skipped */
  }
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_volume, restore_level),
      cmocka_unit_test_teardown(test_attention_kernels, restore_level),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
