/* warm_util.h - what the test_warm_*.c programs share: value helpers,
 * each codec's error bound (tests/test_codec.c derives them), the byte
 * costs of warm blocks, and a fixture engine with a warm tier. Reads are
 * checked against the bounds when warm, bit for bit when hot. */
#ifndef KVT_WARM_UTIL_H
#define KVT_WARM_UTIL_H

#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static inline uint64_t round64(uint64_t x) { return (x + 63) & ~(uint64_t)63; }

/* ------------------------------------------------------------ values */

static inline float ld(const void *buf, uint32_t dt, size_t i) {
  if (dt == KVT_F32) {
    float f;
    memcpy(&f, (const char *)buf + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, (const char *)buf + 2 * i, 2);
  return dt == KVT_F16 ? tu_f16_to_f32(h) : tu_bf16_to_f32(h);
}

static inline double gauss_r(uint64_t *st) {
  double u1 = ((double)(tu_rand_r(st) >> 11) + 0.5) * 0x1p-53;
  double u2 = ((double)(tu_rand_r(st) >> 11) + 0.5) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* ------------------------------------------------ warm error bounds */

/* Lloyd-Max distortion and largest centroid of N(0,1) at 2, 3, 4 bits. */
static const double lm_mse[5] = {0, 0, 0.1175, 0.03454, 0.009497};
static const double lm_cmax[5] = {0, 0, 1.5104, 2.1520, 2.7326};

static inline double out_round(uint32_t dt, double y) {
  y = fabs(y);
  if (dt == KVT_F16) return y * 0x1p-11 + 0x1p-25;
  if (dt == KVT_BF16) return y * 0x1p-8 + 0x1p-133;
  return 0;
}

/* Does (gk, gv) hold (wk, wv) of shape sh after a round trip through the
 * key codec kc and the value codec vc? 1 if so; else 0 and why.
 * Keys, per element (tests/test_codec.c derives it with the stored scale;
 * here the scale is only known to be absmax/lim rounded to f16, within
 * 2^-11 relative or 2^-25 absolute): |x - x'| <= s_hi/2 + m 2^-11 +
 * lim 2^-25 + 2e-5 s_hi + rounding into the dtype.
 * Values: per block, sum |x - x'|^2 / sum |x|^2 <= 2 x the Lloyd-Max
 * distortion (a block of this file holds >= 8 vectors of 64 coordinates:
 * its relative standard error is under 10%, so 2x is over 10 sigma), and
 * every decoded coordinate |x'_d| <= c_max * |x| (1 + 2^-10) (the decode is
 * norm * H(c) / vdim, the norm within 2^-11 of |x|). */
static inline int warm_ok(const kvt_shape *sh, const void *wk, const void *wv, const void *gk,
                   const void *gv, int kc, int vc, char *why, size_t why_len) {
  const uint32_t T = sh->block_tokens, H = sh->n_kv_heads, D = sh->head_dim, dt = sh->dtype;
  const int lim = kc == KVT_CODEC_K4 ? 7 : 127;
  for (uint32_t t = 0; t < T; t++)
    for (uint32_t h = 0; h < H; h++)
      for (uint32_t d = 0; d < D; d++) {
        size_t i = ((size_t)t * H + h) * D + d;
        double m = 0;
        if (kc == KVT_CODEC_K8C)
          for (uint32_t u = 0; u < T; u++) m = fmax(m, fabs(ld(wk, dt, ((size_t)u * H + h) * D + d)));
        else
          for (uint32_t e = 0; e < D; e++) m = fmax(m, fabs(ld(wk, dt, ((size_t)t * H + h) * D + e)));
        double s_hi = m / lim * (1 + 0x1p-11) + 0x1p-25;
        double x = ld(wk, dt, i), y = ld(gk, dt, i);
        double bound = s_hi / 2 + m * 0x1p-11 + lim * 0x1p-25 + 2e-5 * s_hi + out_round(dt, y);
        if (!(fabs(x - y) <= bound)) {
          snprintf(why, why_len, "K[t=%u h=%u d=%u] = %.7g read %.7g: error %.3g > bound %.3g (%s)",
                   t, h, d, x, y, fabs(x - y), bound, kvt_codec_name(kc));
          return 0;
        }
      }
  int bits = vc - KVT_CODEC_V2 + 2;
  double se = 0, sx = 0;
  for (size_t v = 0; v < (size_t)T * H; v++) {
    double nx = 0;
    for (uint32_t d = 0; d < D; d++) nx += (double)ld(wv, dt, v * D + d) * ld(wv, dt, v * D + d);
    double cap = lm_cmax[bits] * sqrt(nx) * (1 + 0x1p-10);
    for (uint32_t d = 0; d < D; d++) {
      double x = ld(wv, dt, v * D + d), y = ld(gv, dt, v * D + d);
      if (!(fabs(y) <= cap + out_round(dt, cap))) {
        snprintf(why, why_len, "V[%zu][%u] read %.7g beyond c_max |v| = %.7g (%s)", v, d, y, cap,
                 kvt_codec_name(vc));
        return 0;
      }
      se += (x - y) * (x - y);
    }
    sx += nx;
  }
  if (!(se <= 2 * lm_mse[bits] * sx)) {
    snprintf(why, why_len, "V normalized MSE %.5f > 2 x %.5f (%s)", se / sx, lm_mse[bits],
             kvt_codec_name(vc));
    return 0;
  }
  return 1;
}

/* ------------------------------------------------------------ fixture */

typedef struct costs {
  uint64_t hot;  /* tier bytes of one hot layer block (measured) */
  uint64_t desc; /* of which the descriptor */
  uint64_t warm; /* expected tier bytes of one warm layer block (K8 + V3) */
  size_t each;   /* K (= V) bytes of a layer block */
} costs;

static inline size_t csize(int c, const kvt_shape *sh) {
  kvt_codec_shape cs = {sh->block_tokens, sh->n_kv_heads, sh->head_dim, 0, 0};
  return kvt_codec_size(c, &cs);
}

static inline uint64_t warm_cost(const costs *c, const kvt_shape *sh, int kc, int vc) {
  return c->desc + round64(csize(kc, sh) + csize(vc, sh));
}

/* The hot cost of a layer block, measured with one put in a probe engine;
 * the descriptor is what it charges beyond the 64-byte-rounded payload. */
static inline costs measure(const kvt_shape *sh) {
  costs c = {.each = kvt_shape_block_bytes(sh)};
  char *dir = tu_tmpdir();
  kvt_options o;
  tu_opts(&o);
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "warm-probe", sh);
  kvt_seq *s;
  tu_kv kv;
  tu_kv_alloc(&kv, sh);
  uint32_t tok[KVT_MAX_BLOCK_TOKENS];
  for (uint32_t i = 0; i < sh->block_tokens; i++) tok[i] = 7 + i;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  assert_int_equal(kvt_seq_append(s, tok, sh->block_tokens, NULL), 0);
  kvt_stats a, b;
  tu_stats(e, &a);
  tu_kv_fill(&kv, sh, 1, 0, 0, tok);
  assert_int_equal(kvt_seq_put(s, 0, 0, &kv.kv), 0);
  tu_stats(e, &b);
  c.hot = b.tier_bytes[KVT_TIER_HOT] - a.tier_bytes[KVT_TIER_HOT];
  assert_true(c.hot > round64(2 * c.each));
  c.desc = c.hot - round64(2 * c.each);
  assert_true(c.desc % 64 == 0 && c.desc <= 1024);
  c.warm = warm_cost(&c, sh, KVT_CODEC_K8, KVT_CODEC_V3);
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_kv_free(&kv);
  tu_rmtree(dir);
  return c;
}

typedef struct fx {
  char *dir;
  kvt_engine *e;
  kvt_ns_id ns;
  kvt_shape sh;
  uint64_t salt;
  costs c;
  tu_kv want, got;
} fx;

static inline void fx_open(fx *f, const kvt_shape *sh, uint64_t hot, uint64_t warm, uint32_t flags) {
  memset(f, 0, sizeof *f);
  f->sh = *sh;
  f->c = measure(sh);
  f->dir = tu_tmpdir();
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = hot;
  o.tier_bytes_limit[KVT_TIER_WARM] = warm;
  o.flags = flags;
  f->e = tu_open(f->dir, &o);
  f->ns = tu_register(f->e, "warm-model", sh);
  f->salt = tu_salt("warm-model");
  tu_kv_alloc(&f->want, sh);
  tu_kv_alloc(&f->got, sh);
}

static inline void fx_close(fx *f) {
  kvt_engine_close(f->e);
  tu_kv_free(&f->want);
  tu_kv_free(&f->got);
  tu_rmtree(f->dir);
}

/* Tokens of block b of "family" fam: families share nothing. */
static inline void block_tokens(uint32_t fam, uint32_t b, uint32_t bt, uint32_t *tok) {
  for (uint32_t i = 0; i < bt; i++) tok[i] = (uint32_t)tu_mix(((uint64_t)fam << 32) ^ (b * bt + i));
}

static inline void expect(fx *f, uint32_t layer, uint32_t block, const uint32_t *tok) {
  tu_kv_fill(&f->want, &f->sh, f->salt, layer, block, tok);
}

/* Append one block of tokens tok and put every layer not adopted. */
static inline void append_put(fx *f, kvt_seq *s, const uint32_t *tok) {
  kvt_append_info info;
  assert_int_equal(kvt_seq_append(s, tok, f->sh.block_tokens, &info), 0);
  for (uint32_t l = 0; l < f->sh.n_layers; l++) {
    expect(f, l, info.block, tok);
    assert_int_equal(kvt_seq_put(s, info.block, l, &f->want.kv), 0);
  }
}

/* Read (s, b, l) and check it: bit-exact when the stats count an exact
 * read, within the codecs' bound when they count an approximate one.
 * Returns the tier the stats imply. */
static inline int read_check(fx *f, kvt_seq *s, uint32_t b, uint32_t l, const uint32_t *tok, int kc,
                      int vc) {
  kvt_stats a, z;
  expect(f, l, b, tok);
  memset(f->got.k, 0x5A, f->got.bytes);
  memset(f->got.v, 0x5A, f->got.bytes);
  tu_stats(f->e, &a);
  assert_int_equal(kvt_seq_read(s, b, l, f->got.k, f->got.v, f->got.bytes), 0);
  tu_stats(f->e, &z);
  assert_int_equal(z.reads, a.reads + 1);
  assert_int_equal(z.reads_exact + z.reads_approx, a.reads_exact + a.reads_approx + 1);
  if (z.reads_exact > a.reads_exact) {
    assert_memory_equal(f->got.k, f->want.k, f->want.bytes);
    assert_memory_equal(f->got.v, f->want.v, f->want.bytes);
    return KVT_TIER_HOT;
  }
  char why[256];
  if (!warm_ok(&f->sh, f->want.k, f->want.v, f->got.k, f->got.v, kc, vc, why, sizeof why))
    fail_msg("block %u layer %u (warm): %s", b, l, why);
  /* quantized: not the exact bytes */
  assert_true(memcmp(f->got.k, f->want.k, f->want.bytes) != 0);
  return KVT_TIER_WARM;
}

/* Tiers of the blocks of (s, layer) as gather reports them; checks each
 * gathered block's content and the read counters. n_out = blocks. */
static inline void gather_tiers(fx *f, kvt_seq *s, uint32_t layer, const uint32_t *toks, int kc, int vc,
                         uint32_t *tiers, size_t *n_out) {
  size_t each = f->c.each, nb = kvt_seq_blocks(s), bytes = nb * each, n = 0;
  uint8_t *k = malloc(bytes + 1), *v = malloc(bytes + 1);
  kvt_gathered *g = calloc(nb + 1, sizeof *g);
  assert_true(k && v && g);
  kvt_stats a, z;
  tu_stats(f->e, &a);
  assert_int_equal(kvt_seq_gather(s, layer, k, v, &bytes, g, nb + 1, &n), 0);
  tu_stats(f->e, &z);
  assert_int_equal(bytes, n * each);
  uint64_t hot = 0;
  for (size_t i = 0; i < n; i++) {
    assert_true(g[i].tier == KVT_TIER_HOT || g[i].tier == KVT_TIER_WARM);
    assert_int_equal(g[i].exact, g[i].tier == KVT_TIER_HOT);
    assert_int_equal(g[i].token_pos, g[i].block * f->sh.block_tokens);
    if (i) assert_true(g[i].block > g[i - 1].block);
    const uint32_t *tok = toks + (size_t)g[i].block * f->sh.block_tokens;
    expect(f, layer, g[i].block, tok);
    if (g[i].exact) {
      assert_memory_equal(k + i * each, f->want.k, each);
      assert_memory_equal(v + i * each, f->want.v, each);
      hot++;
    } else {
      char why[256];
      if (!warm_ok(&f->sh, f->want.k, f->want.v, k + i * each, v + i * each, kc, vc, why, sizeof why))
        fail_msg("gathered block %u layer %u (warm): %s", g[i].block, layer, why);
    }
    if (tiers) tiers[i] = g[i].tier;
  }
  assert_int_equal(z.reads - a.reads, n);
  assert_int_equal(z.reads_exact - a.reads_exact, hot);
  assert_int_equal(z.reads_approx - a.reads_approx, n - hot);
  *n_out = n;
  free(k);
  free(v);
  free(g);
}

/* Every byte the engine holds is in one category. */
static inline void check_total(const kvt_stats *st) {
  assert_int_equal(st->total_bytes, st->tier_bytes[KVT_TIER_HOT] + st->tier_bytes[KVT_TIER_WARM] +
                                        st->index_bytes + st->seq_bytes + st->other_bytes);
}

/* 1 layer, 2 KV heads, head_dim 64, 4 tokens a block. */
static inline kvt_shape shape1(uint32_t dtype, uint32_t layers) {
  return (kvt_shape){.n_layers = layers, .n_kv_heads = 2, .head_dim = 64, .dtype = dtype,
                     .block_tokens = 4};
}

#endif
