/* test_warm.c - the warm tier inside the engine, through the public API
 * (kvt_options.tier_bytes_limit[KVT_TIER_WARM] > 0): demotion of the least
 * recently used hot blocks, warm LRU drops and KVT_EFULL, blocks born warm,
 * byte accounting against the codec sizes, per-layer codecs, attention on
 * hot, warm and mixed blocks against a double-precision reference over
 * what gather returns, a random workload checked against a reference model
 * after every step, and threads reading blocks while they are demoted.
 * Warm reads are checked against each codec's error bound (see
 * tests/test_codec.c for the derivations), hot reads bit for bit. */
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

static uint64_t round64(uint64_t x) { return (x + 63) & ~(uint64_t)63; }

/* ------------------------------------------------------------ values */

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

static double gauss_r(uint64_t *st) {
  double u1 = ((double)(tu_rand_r(st) >> 11) + 0.5) * 0x1p-53;
  double u2 = ((double)(tu_rand_r(st) >> 11) + 0.5) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* ------------------------------------------------ warm error bounds */

/* Lloyd-Max distortion and largest centroid of N(0,1) at 2, 3, 4 bits. */
static const double lm_mse[5] = {0, 0, 0.1175, 0.03454, 0.009497};
static const double lm_cmax[5] = {0, 0, 1.5104, 2.1520, 2.7326};

static double out_round(uint32_t dt, double y) {
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
static int warm_ok(const kvt_shape *sh, const void *wk, const void *wv, const void *gk,
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

static size_t csize(int c, const kvt_shape *sh) {
  kvt_codec_shape cs = {sh->block_tokens, sh->n_kv_heads, sh->head_dim, 0, 0};
  return kvt_codec_size(c, &cs);
}

static uint64_t warm_cost(const costs *c, const kvt_shape *sh, int kc, int vc) {
  return c->desc + round64(csize(kc, sh) + csize(vc, sh));
}

/* The hot cost of a layer block, measured with one put in a probe engine;
 * the descriptor is what it charges beyond the 64-byte-rounded payload. */
static costs measure(const kvt_shape *sh) {
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

static void fx_open(fx *f, const kvt_shape *sh, uint64_t hot, uint64_t warm, uint32_t flags) {
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

static void fx_close(fx *f) {
  kvt_engine_close(f->e);
  tu_kv_free(&f->want);
  tu_kv_free(&f->got);
  tu_rmtree(f->dir);
}

/* Tokens of block b of "family" fam: families share nothing. */
static void block_tokens(uint32_t fam, uint32_t b, uint32_t bt, uint32_t *tok) {
  for (uint32_t i = 0; i < bt; i++) tok[i] = (uint32_t)tu_mix(((uint64_t)fam << 32) ^ (b * bt + i));
}

static void expect(fx *f, uint32_t layer, uint32_t block, const uint32_t *tok) {
  tu_kv_fill(&f->want, &f->sh, f->salt, layer, block, tok);
}

/* Append one block of tokens tok and put every layer not adopted. */
static void append_put(fx *f, kvt_seq *s, const uint32_t *tok) {
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
static int read_check(fx *f, kvt_seq *s, uint32_t b, uint32_t l, const uint32_t *tok, int kc,
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
static void gather_tiers(fx *f, kvt_seq *s, uint32_t layer, const uint32_t *toks, int kc, int vc,
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
static void check_total(const kvt_stats *st) {
  assert_int_equal(st->total_bytes, st->tier_bytes[KVT_TIER_HOT] + st->tier_bytes[KVT_TIER_WARM] +
                                        st->index_bytes + st->seq_bytes + st->other_bytes);
}

/* 1 layer, 2 KV heads, head_dim 64, 4 tokens a block. */
static kvt_shape shape1(uint32_t dtype, uint32_t layers) {
  return (kvt_shape){.n_layers = layers, .n_kv_heads = 2, .head_dim = 64, .dtype = dtype,
                     .block_tokens = 4};
}

/* ------------------------------------------------ demotion order */

/* A hot tier of 3 blocks: each put beyond it demotes exactly the least
 * recently used hot block (recency: put, append adoption, lookup, load;
 * not reads), and the warm bytes grow by the encoded size. */
static void test_demote_lru(void **state) {
  (void)state;
  kvt_shape sh = shape1(KVT_F16, 1);
  fx f;
  costs c = measure(&sh);
  fx_open(&f, &sh, 3 * c.hot + c.hot / 2, 64ull << 20, 0);
  enum { NB = 8 };
  uint32_t toks[NB * 4];
  for (uint32_t b = 0; b < NB; b++) block_tokens(1, b, 4, toks + 4 * b);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
  kvt_stats st;
  uint32_t tiers[NB];
  size_t n;
  for (uint32_t b = 0; b < 6; b++) {
    append_put(&f, s, toks + 4 * b);
    tu_stats(f.e, &st);
    uint32_t n_warm = b >= 3 ? b - 2 : 0;
    assert_int_equal(st.demotions, n_warm);
    assert_int_equal(st.tier_blocks[KVT_TIER_HOT], b + 1 - n_warm);
    assert_int_equal(st.tier_blocks[KVT_TIER_WARM], n_warm);
    assert_int_equal(st.tier_bytes[KVT_TIER_HOT], (b + 1 - n_warm) * f.c.hot);
    assert_int_equal(st.tier_bytes[KVT_TIER_WARM], n_warm * f.c.warm);
    assert_int_equal(st.evictions[KVT_TIER_HOT] + st.evictions[KVT_TIER_WARM], 0);
    check_total(&st);
    gather_tiers(&f, s, 0, toks, KVT_CODEC_K8, KVT_CODEC_V3, tiers, &n);
    assert_int_equal(n, b + 1);
    for (uint32_t i = 0; i <= b; i++)
      assert_int_equal(tiers[i], i < n_warm ? KVT_TIER_WARM : KVT_TIER_HOT);
  }
  /* Hot now: 3, 4, 5, with 3 the least recent. Reading it is not enough to
   * keep it (whether or not reads refresh recency, the lookup below does)... */
  for (int r = 0; r < 3; r++) read_check(&f, s, 3, 0, toks + 12, KVT_CODEC_K8, KVT_CODEC_V3);
  /* ...a lookup hit refreshes the blocks it finds (kvt_lookup), in chain
   * order: 0, 1, 2 (warm), then 3: hot recency becomes 4, 5, 3. */
  kvt_lookup_entry ent[NB];
  size_t found;
  assert_int_equal(kvt_lookup(f.e, f.ns, toks, 4 * 4, ent, NB, &found), 0);
  assert_int_equal(found, 4);
  for (uint32_t i = 0; i < 4; i++) assert_int_equal(ent[i].tier, i < 3 ? KVT_TIER_WARM : KVT_TIER_HOT);
  append_put(&f, s, toks + 4 * 6);
  gather_tiers(&f, s, 0, toks, KVT_CODEC_K8, KVT_CODEC_V3, tiers, &n);
  const uint32_t want7[] = {2, 2, 2, 1, 2, 1, 1};
  for (uint32_t i = 0; i < 7; i++) assert_int_equal(tiers[i], want7[i]);
  /* A lookup of blocks 0..6 touches them all in chain order: hot recency
   * becomes 3, 5, 6, so 3 goes next. */
  assert_int_equal(kvt_lookup(f.e, f.ns, toks, 4 * 7, NULL, 0, &found), 0);
  assert_int_equal(found, 7);
  append_put(&f, s, toks + 4 * 7);
  gather_tiers(&f, s, 0, toks, KVT_CODEC_K8, KVT_CODEC_V3, tiers, &n);
  const uint32_t want8[] = {2, 2, 2, 2, 2, 1, 1, 1};
  for (uint32_t i = 0; i < 8; i++) assert_int_equal(tiers[i], want8[i]);
  tu_stats(f.e, &st);
  assert_int_equal(st.demotions, 5);
  assert_int_equal(st.put_full, 0);
  kvt_seq_release(s);
  fx_close(&f);
}

/* ------------------------------------------------ warm LRU and EFULL */

/* Unreferenced blocks: hot 2, warm 4. Eight puts leave the last two hot,
 * the four before warm, and drop the first two (LRU) from warm. */
static void test_warm_drops_lru(void **state) {
  (void)state;
  kvt_shape sh = shape1(KVT_F32, 1);
  fx f;
  costs c = measure(&sh);
  fx_open(&f, &sh, 2 * c.hot + c.hot / 2, 4 * c.warm + c.warm / 2, 0);
  uint32_t toks[8][4];
  for (uint32_t b = 0; b < 8; b++) {
    block_tokens(100 + b, 0, 4, toks[b]);
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
    append_put(&f, s, toks[b]);
    kvt_seq_release(s);
    kvt_stats st;
    tu_stats(f.e, &st);
    assert_true(st.tier_bytes[KVT_TIER_HOT] <= st.tier_limit[KVT_TIER_HOT]);
    assert_true(st.tier_bytes[KVT_TIER_WARM] <= st.tier_limit[KVT_TIER_WARM]);
    assert_int_equal(st.demotions, b >= 2 ? b - 1 : 0);
    assert_int_equal(st.evictions[KVT_TIER_WARM], b >= 6 ? b - 5 : 0);
    assert_int_equal(st.evictions[KVT_TIER_HOT], 0);
    check_total(&st);
  }
  for (uint32_t b = 0; b < 8; b++) {
    kvt_lookup_entry ent;
    size_t found = 9;
    assert_int_equal(kvt_lookup(f.e, f.ns, toks[b], 4, &ent, 1, &found), 0);
    assert_int_equal(found, b >= 2);
    if (found) assert_int_equal(ent.tier, b >= 6 ? KVT_TIER_HOT : KVT_TIER_WARM);
  }
  fx_close(&f);
}

/* Referenced blocks fill hot (2) and warm (4): the next new block is
 * refused with KVT_EFULL, nothing changes, nothing is lost; a block that
 * is stored already is still shared; after a release there is room. */
static void test_warm_full(void **state) {
  (void)state;
  kvt_shape sh = shape1(KVT_BF16, 1);
  fx f;
  costs c = measure(&sh);
  fx_open(&f, &sh, 2 * c.hot + c.hot / 2, 4 * c.warm + c.warm / 2, 0);
  uint32_t toks[8 * 4];
  for (uint32_t b = 0; b < 8; b++) block_tokens(7, b, 4, toks + 4 * b);
  kvt_seq *s, *s2, *s3;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
  for (uint32_t b = 0; b < 6; b++) append_put(&f, s, toks + 4 * b);
  kvt_stats a, z;
  tu_stats(f.e, &a);
  assert_int_equal(a.tier_blocks[KVT_TIER_HOT], 2);
  assert_int_equal(a.tier_blocks[KVT_TIER_WARM], 4);
  assert_int_equal(kvt_seq_append(s, toks + 24, 4, NULL), 0);
  expect(&f, 0, 6, toks + 24);
  assert_int_equal(kvt_seq_put(s, 6, 0, &f.want.kv), KVT_EFULL);
  tu_stats(f.e, &z);
  assert_int_equal(z.put_full, a.put_full + 1);
  z.put_full = a.put_full;
  /* the append above added a token block: only the index grew */
  assert_int_equal(z.total_bytes - a.total_bytes, z.index_bytes - a.index_bytes);
  assert_int_equal(z.token_blocks, a.token_blocks + 1);
  z.index_bytes = a.index_bytes;
  z.total_bytes = a.total_bytes;
  z.token_blocks = a.token_blocks;
  tu_assert_stats_eq(&a, &z);
  int hot = 0;
  for (uint32_t b = 0; b < 6; b++)
    hot += read_check(&f, s, b, 0, toks + 4 * b, KVT_CODEC_K8, KVT_CODEC_V3) == KVT_TIER_HOT;
  assert_int_equal(hot, 2);
  assert_int_equal(kvt_seq_read(s, 6, 0, f.got.k, f.got.v, f.got.bytes), KVT_ENOTFOUND);
  /* a second sequence: a stored block is shared, a new one refused */
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s2), 0);
  kvt_append_info info;
  assert_int_equal(kvt_seq_append(s2, toks, 4, &info), 0);
  assert_int_equal(info.layers_present, 1);
  expect(&f, 0, 0, toks);
  assert_int_equal(kvt_seq_put(s2, 0, 0, &f.want.kv), 0); /* already held: nothing new */
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s3), 0);
  assert_int_equal(kvt_seq_append(s3, toks + 28, 4, NULL), 0);
  expect(&f, 0, 0, toks + 28);
  assert_int_equal(kvt_seq_put(s3, 0, 0, &f.want.kv), KVT_EFULL);
  /* releasing s frees blocks 1..5 (s2 keeps 0): now puts succeed */
  kvt_seq_release(s);
  assert_int_equal(kvt_seq_put(s3, 0, 0, &f.want.kv), 0);
  read_check(&f, s2, 0, 0, toks, KVT_CODEC_K8, KVT_CODEC_V3);
  tu_stats(f.e, &z);
  assert_true(z.tier_bytes[KVT_TIER_WARM] <= z.tier_limit[KVT_TIER_WARM]);
  assert_true(z.tier_bytes[KVT_TIER_HOT] <= z.tier_limit[KVT_TIER_HOT]);
  kvt_seq_release(s2);
  kvt_seq_release(s3);
  fx_close(&f);
}

/* ------------------------------------------------ born warm */

/* Hot limit 0: every block is encoded straight into warm, once however
 * many sequences reference it; the warm bytes are the encoded sizes
 * (codec sizes rounded to 64 plus the descriptor); a metadata-only engine
 * given the same puts accounts the same. */
static void born_warm_run(uint32_t dtype, uint32_t flags, kvt_stats *out) {
  kvt_shape sh = shape1(dtype, 2);
  fx f;
  fx_open(&f, &sh, 0, 64ull << 20, flags);
  int meta = (flags & KVT_OPEN_METADATA_ONLY) != 0;
  uint32_t a_tok[4 * 4], d_tok[4 * 4];
  for (uint32_t b = 0; b < 4; b++) block_tokens(3, b, 4, a_tok + 4 * b);
  memcpy(d_tok, a_tok, sizeof d_tok);
  block_tokens(4, 2, 4, d_tok + 8); /* d shares 2 blocks, then differs */
  block_tokens(4, 3, 4, d_tok + 12);
  kvt_seq *sa, *sb, *sc, *sd;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &sa), 0);
  assert_int_equal(kvt_seq_create(f.e, f.ns, &sb), 0);
  assert_int_equal(kvt_seq_create(f.e, f.ns, &sd), 0);
  kvt_kv nokv = {.dtype = dtype, .n_tokens = 4, .n_heads = 2, .head_dim = 64};
  for (uint32_t b = 0; b < 4; b++) {
    if (meta) {
      assert_int_equal(kvt_seq_append(sa, a_tok + 4 * b, 4, NULL), 0);
      for (uint32_t l = 0; l < 2; l++) assert_int_equal(kvt_seq_put(sa, b, l, &nokv), 0);
      assert_int_equal(kvt_seq_append(sb, a_tok + 4 * b, 4, NULL), 0);
      assert_int_equal(kvt_seq_append(sd, d_tok + 4 * b, 4, NULL), 0);
      for (uint32_t l = 0; l < 2; l++) assert_int_equal(kvt_seq_put(sd, b, l, &nokv), 0);
    } else {
      append_put(&f, sa, a_tok + 4 * b);
      append_put(&f, sb, a_tok + 4 * b); /* adopted at append; the puts share */
      append_put(&f, sd, d_tok + 4 * b);
    }
  }
  assert_int_equal(kvt_seq_fork(sa, UINT32_MAX, &sc), 0);
  kvt_stats st;
  tu_stats(f.e, &st);
  uint64_t distinct = 2 * (4 + 2); /* a's 4 blocks, d's last 2, both layers */
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT], 0);
  assert_int_equal(st.tier_bytes[KVT_TIER_HOT], 0);
  assert_int_equal(st.tier_blocks[KVT_TIER_WARM], distinct);
  assert_int_equal(st.tier_bytes[KVT_TIER_WARM], distinct * f.c.warm);
  assert_int_equal(st.demotions, 0); /* born warm, not demoted */
  assert_int_equal(st.logical_bytes, (4 * 2 * 4) * 2 * f.c.each); /* 4 seqs x 4 blocks x 2 layers */
  assert_int_equal(st.dedup_saved_bytes, (32 - distinct) * 2 * f.c.each);
  if (!meta) {
    check_total(&st);
    for (uint32_t b = 0; b < 4; b++)
      for (uint32_t l = 0; l < 2; l++) {
        assert_int_equal(read_check(&f, sc, b, l, a_tok + 4 * b, KVT_CODEC_K8, KVT_CODEC_V3),
                         KVT_TIER_WARM);
        assert_int_equal(read_check(&f, sd, b, l, d_tok + 4 * b, KVT_CODEC_K8, KVT_CODEC_V3),
                         KVT_TIER_WARM);
      }
    uint32_t tiers[4];
    size_t n;
    gather_tiers(&f, sb, 1, a_tok, KVT_CODEC_K8, KVT_CODEC_V3, tiers, &n);
    assert_int_equal(n, 4);
    for (uint32_t i = 0; i < 4; i++) assert_int_equal(tiers[i], KVT_TIER_WARM);
    tu_stats(f.e, &st);
    assert_int_equal(st.reads_exact, 0);
    assert_int_equal(st.reads_approx, st.reads);
  } else {
    size_t bytes = f.c.each * 4, n;
    float q[2 * 64] = {0}, o[2 * 64];
    assert_int_equal(kvt_seq_read(sa, 0, 0, f.got.k, f.got.v, f.got.bytes), KVT_ENOPAYLOAD);
    uint8_t *k = malloc(bytes), *v = malloc(bytes);
    assert_int_equal(kvt_seq_gather(sa, 0, k, v, &bytes, NULL, 0, &n), KVT_ENOPAYLOAD);
    free(k);
    free(v);
    assert_int_equal(kvt_seq_attend(sa, 0, q, 2, 0, o, NULL, NULL, 0, &n), KVT_ENOPAYLOAD);
  }
  if (out) *out = st;
  kvt_seq_release(sa);
  kvt_seq_release(sb);
  kvt_seq_release(sc);
  kvt_seq_release(sd);
  tu_stats(f.e, &st);
  assert_int_equal(st.tier_blocks[KVT_TIER_WARM], distinct); /* cached, unreferenced */
  fx_close(&f);
}

static void test_born_warm(void **state) {
  (void)state;
  kvt_stats live, meta;
  born_warm_run(KVT_F16, 0, &live);
  born_warm_run(KVT_F16, KVT_OPEN_METADATA_ONLY, &meta);
  assert_int_equal(live.tier_bytes[KVT_TIER_WARM], meta.tier_bytes[KVT_TIER_WARM]);
  assert_int_equal(live.tier_blocks[KVT_TIER_WARM], meta.tier_blocks[KVT_TIER_WARM]);
  born_warm_run(KVT_F32, 0, NULL);
  born_warm_run(KVT_BF16, 0, NULL);
}

/* A demotion in a metadata-only engine accounts what a live one does:
 * the same puts (some refused), releases and forks give the same tiers. */
static void demote_run(uint32_t flags, kvt_stats *out) {
  kvt_shape sh = shape1(KVT_F32, 2);
  fx f;
  costs c = measure(&sh);
  fx_open(&f, &sh, 5 * c.hot, 7 * c.warm + 10, flags);
  kvt_seq *s, *s2;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
  kvt_kv nokv = {.dtype = KVT_F32, .n_tokens = 4, .n_heads = 2, .head_dim = 64};
  uint32_t tok[4];
  int n_full = 0;
  for (uint32_t b = 0; b < 12; b++) {
    if (b == 6) { /* keep 3 blocks, drop the references to the others */
      assert_int_equal(kvt_seq_fork(s, 3, &s2), 0);
      kvt_seq_release(s);
      s = s2;
    }
    kvt_append_info info;
    block_tokens(9, b, 4, tok);
    assert_int_equal(kvt_seq_append(s, tok, 4, &info), 0);
    for (uint32_t l = 0; l < 2; l++) {
      expect(&f, l, info.block, tok);
      int rc = kvt_seq_put(s, info.block, l, flags ? &nokv : &f.want.kv);
      assert_true(rc == 0 || rc == KVT_EFULL);
      n_full += rc != 0;
    }
  }
  assert_true(n_full > 0);
  tu_stats(f.e, out);
  kvt_seq_release(s);
  fx_close(&f);
}

static void test_metadata_only_same_accounting(void **state) {
  (void)state;
  kvt_stats live, meta;
  demote_run(0, &live);
  demote_run(KVT_OPEN_METADATA_ONLY, &meta);
  for (int t = 0; t < KVT_N_TIERS; t++) {
    assert_int_equal(live.tier_blocks[t], meta.tier_blocks[t]);
    assert_int_equal(live.tier_bytes[t], meta.tier_bytes[t]);
    assert_int_equal(live.evictions[t], meta.evictions[t]);
  }
  assert_int_equal(live.demotions, meta.demotions);
  assert_int_equal(live.put_full, meta.put_full);
  assert_true(live.demotions > 0);
}

/* ------------------------------------------------ codecs per layer */

static void test_set_codec(void **state) {
  (void)state;
  kvt_shape sh = shape1(KVT_F16, 3);
  fx f;
  fx_open(&f, &sh, 0, 64ull << 20, 0);
  /* errors */
  assert_int_equal(kvt_ns_set_codec(NULL, f.ns, 0, KVT_CODEC_K8, KVT_CODEC_V3), KVT_ENULL);
  const int bad[][2] = {{KVT_CODEC_V3, KVT_CODEC_K8}, {KVT_CODEC_K8, KVT_CODEC_K8},
                        {KVT_CODEC_V2, KVT_CODEC_V3}, {0, 0}, /* one side alone: allowed */
                        {0, KVT_CODEC_K8},            {7, KVT_CODEC_V3},
                        {KVT_CODEC_K8, 7},            {-1, KVT_CODEC_V3}};
  for (size_t i = 0; i < N_OF(bad); i++)
    assert_int_equal(kvt_ns_set_codec(f.e, f.ns, 0, bad[i][0], bad[i][1]), KVT_EOPTION);
  assert_int_equal(kvt_ns_set_codec(f.e, f.ns, 3, KVT_CODEC_K8, KVT_CODEC_V3), KVT_ENOTFOUND);
  assert_int_equal(kvt_ns_set_codec(f.e, f.ns + 1, 0, KVT_CODEC_K8, KVT_CODEC_V3), KVT_ENOTFOUND);
  /* per layer, then all layers */
  const int kc[3] = {KVT_CODEC_K4, KVT_CODEC_K8C, KVT_CODEC_K8};
  const int vc[3] = {KVT_CODEC_V2, KVT_CODEC_V4, KVT_CODEC_V3};
  assert_int_equal(kvt_ns_set_codec(f.e, f.ns, 0, kc[0], vc[0]), 0);
  assert_int_equal(kvt_ns_set_codec(f.e, f.ns, 1, kc[1], vc[1]), 0);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
  uint32_t toks[2 * 4];
  block_tokens(11, 0, 4, toks);
  block_tokens(11, 1, 4, toks + 4);
  assert_int_equal(kvt_seq_append(s, toks, 4, NULL), 0);
  for (uint32_t l = 0; l < 3; l++) {
    kvt_stats a, z;
    tu_stats(f.e, &a);
    expect(&f, l, 0, toks);
    assert_int_equal(kvt_seq_put(s, 0, l, &f.want.kv), 0);
    tu_stats(f.e, &z);
    assert_int_equal(z.tier_bytes[KVT_TIER_WARM] - a.tier_bytes[KVT_TIER_WARM],
                     warm_cost(&f.c, &sh, kc[l], vc[l]));
  }
  assert_int_equal(kvt_ns_set_codec(f.e, f.ns, KVT_ALL_LAYERS, KVT_CODEC_K4, KVT_CODEC_V4), 0);
  assert_int_equal(kvt_seq_append(s, toks + 4, 4, NULL), 0);
  for (uint32_t l = 0; l < 3; l++) {
    kvt_stats a, z;
    tu_stats(f.e, &a);
    expect(&f, l, 1, toks + 4);
    assert_int_equal(kvt_seq_put(s, 1, l, &f.want.kv), 0);
    tu_stats(f.e, &z);
    assert_int_equal(z.tier_bytes[KVT_TIER_WARM] - a.tier_bytes[KVT_TIER_WARM],
                     warm_cost(&f.c, &sh, KVT_CODEC_K4, KVT_CODEC_V4));
  }
  /* blocks keep the codecs they were encoded with */
  for (uint32_t l = 0; l < 3; l++) {
    read_check(&f, s, 0, l, toks, kc[l], vc[l]);
    read_check(&f, s, 1, l, toks + 4, KVT_CODEC_K4, KVT_CODEC_V4);
  }
  kvt_seq_release(s);
  fx_close(&f);

  /* Demotion uses the codecs in force when it happens, not at the put. */
  kvt_shape sh1 = shape1(KVT_F32, 1);
  costs c = measure(&sh1);
  fx_open(&f, &sh1, 2 * c.hot, 64ull << 20, 0);
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
  uint32_t t3[3 * 4];
  for (uint32_t b = 0; b < 3; b++) block_tokens(12, b, 4, t3 + 4 * b);
  append_put(&f, s, t3);
  append_put(&f, s, t3 + 4);
  assert_int_equal(kvt_ns_set_codec(f.e, f.ns, 0, KVT_CODEC_K8C, KVT_CODEC_V2), 0);
  kvt_stats a, z;
  tu_stats(f.e, &a);
  append_put(&f, s, t3 + 8); /* demotes block 0, put before the change */
  tu_stats(f.e, &z);
  assert_int_equal(z.demotions, a.demotions + 1);
  assert_int_equal(z.tier_bytes[KVT_TIER_WARM] - a.tier_bytes[KVT_TIER_WARM],
                   warm_cost(&f.c, &sh1, KVT_CODEC_K8C, KVT_CODEC_V2));
  assert_int_equal(read_check(&f, s, 0, 0, t3, KVT_CODEC_K8C, KVT_CODEC_V2), KVT_TIER_WARM);
  kvt_seq_release(s);
  fx_close(&f);
}

static void test_codec_parse(void **state) {
  (void)state;
  const struct {
    const char *s;
    int k, v;
  } ok[] = {{"k8v3", KVT_CODEC_K8, KVT_CODEC_V3},   {"k8cv3", KVT_CODEC_K8C, KVT_CODEC_V3},
            {"k4v2", KVT_CODEC_K4, KVT_CODEC_V2},   {"k4v4", KVT_CODEC_K4, KVT_CODEC_V4},
            {"k8cv2", KVT_CODEC_K8C, KVT_CODEC_V2}, {"k8v4", KVT_CODEC_K8, KVT_CODEC_V4}};
  for (size_t i = 0; i < N_OF(ok); i++) {
    int k = -5, v = -5;
    assert_int_equal(kvt_codec_parse(ok[i].s, &k, &v), 0);
    assert_int_equal(k, ok[i].k);
    assert_int_equal(v, ok[i].v);
    char name[16];
    snprintf(name, sizeof name, "%s%s", kvt_codec_name(k), kvt_codec_name(v));
    assert_string_equal(name, ok[i].s); /* names round trip */
  }
  const char *bad[] = {"", "k8", "v3", "k8v5", "v3k8", "k8v3x", "K8V3", "k8 v3", "kv3", "k8v",
                       "k9v3", "k8k4", "v2v3", "k8cv", "k8cc v3", "k8v3v3", "x"};
  for (size_t i = 0; i < N_OF(bad); i++) {
    int k = -5, v = -5;
    int rc = kvt_codec_parse(bad[i], &k, &v);
    if (rc != KVT_EOPTION) fail_msg("kvt_codec_parse(\"%s\") = %d, expected KVT_EOPTION", bad[i], rc);
    assert_int_equal(k, -5); /* untouched on failure */
    assert_int_equal(v, -5);
  }
  int k, v;
  assert_int_equal(kvt_codec_parse(NULL, &k, &v), KVT_ENULL);
  assert_int_equal(kvt_codec_parse("k8v3", NULL, &v), KVT_ENULL);
  assert_int_equal(kvt_codec_parse("k8v3", &k, NULL), KVT_ENULL);
}

/* ------------------------------------------------ attention */

/* Softmax attention of q heads over n_tok tokens of K, V ([t][kvh][d],
 * f32) in double, GQA as the API says; mass[b] summed over heads per block
 * of bt tokens. */
static void ref_attend(const float *k, const float *v, size_t n_tok, uint32_t H, uint32_t D,
                       const float *q, uint32_t nq, double scale, uint32_t bt, double *out,
                       double *lse, double *mass) {
  double *sc = malloc((n_tok + 1) * sizeof *sc);
  assert_non_null(sc);
  uint32_t group = nq / H;
  memset(mass, 0, (n_tok / bt + 1) * sizeof *mass);
  for (uint32_t h = 0; h < nq; h++) {
    uint32_t kh = h / group;
    double m = -INFINITY, l = 0;
    for (size_t t = 0; t < n_tok; t++) {
      double dot = 0;
      for (uint32_t d = 0; d < D; d++) dot += (double)q[h * D + d] * k[(t * H + kh) * D + d];
      sc[t] = scale * dot;
      m = fmax(m, sc[t]);
    }
    for (size_t t = 0; t < n_tok; t++) l += sc[t] = exp(sc[t] - m);
    for (uint32_t d = 0; d < D; d++) out[h * D + d] = 0;
    for (size_t t = 0; t < n_tok; t++) {
      double p = sc[t] / l;
      mass[t / bt] += p;
      for (uint32_t d = 0; d < D; d++) out[h * D + d] += p * v[(t * H + kh) * D + d];
    }
    lse[h] = m + log(l);
  }
  free(sc);
}

/* Attend (s, layer) and compare with ref_attend over what gather returns.
 * Tolerance: outputs are convex combinations of the values, so errors are
 * measured against the largest |value| of the head; float sums over 64
 * dims and <= 48 tokens stay near 1e-5 of it; 1e-4 allowed. lse and the
 * block masses (each a sum of probabilities) likewise within 1e-4
 * (relative for lse). Returns how many of the gathered blocks were warm. */
static size_t attend_check(fx *f, kvt_seq *s, uint32_t layer, uint32_t nq, float scale,
                           uint64_t *rng) {
  const uint32_t H = f->sh.n_kv_heads, D = f->sh.head_dim, bt = f->sh.block_tokens;
  size_t nb = kvt_seq_blocks(s), bytes = nb * f->c.each, n = 0, n2 = 0;
  float *k = malloc(bytes + 4), *v = malloc(bytes + 4);
  kvt_gathered *g = calloc(nb + 1, sizeof *g);
  float *q = malloc(nq * D * 4), *out = malloc(nq * D * 4), *lse = malloc(nq * 4);
  float *mass = malloc((nb + 1) * 4);
  double *rout = malloc(nq * D * 8), *rlse = malloc(nq * 8), *rmass = malloc((nb + 1) * 8);
  assert_true(k && v && g && q && out && lse && mass && rout && rlse && rmass);
  assert_int_equal(kvt_seq_gather(s, layer, k, v, &bytes, g, nb + 1, &n), 0);
  for (uint32_t i = 0; i < nq * D; i++) q[i] = (float)(gauss_r(rng) * 1.5);
  kvt_stats a, z;
  tu_stats(f->e, &a);
  assert_int_equal(kvt_seq_attend(s, layer, q, nq, scale, out, lse, mass, nb + 1, &n2), 0);
  tu_stats(f->e, &z);
  assert_int_equal(z.attends, a.attends + 1);
  assert_int_equal(n2, n);
  double sc = scale == 0 ? 1.0 / sqrt((double)D) : scale;
  ref_attend(k, v, n * bt, H, D, q, nq, sc, bt, rout, rlse, rmass);
  uint32_t group = nq / H;
  for (uint32_t h = 0; h < nq; h++) {
    double vmax = 0;
    for (size_t t = 0; t < n * bt; t++)
      for (uint32_t d = 0; d < D; d++) vmax = fmax(vmax, fabs(v[(t * H + h / group) * D + d]));
    for (uint32_t d = 0; d < D; d++) {
      double e = fabs(out[h * D + d] - rout[h * D + d]);
      if (!(e <= 1e-4 * vmax))
        fail_msg("layer %u head %u dim %u: attend %.8g, reference %.8g (max |v| %.3g)", layer, h,
                 d, out[h * D + d], rout[h * D + d], vmax);
    }
    if (!(fabs(lse[h] - rlse[h]) <= 1e-4 * (1 + fabs(rlse[h]))))
      fail_msg("layer %u head %u: lse %.8g, reference %.8g", layer, h, lse[h], rlse[h]);
  }
  double total = 0;
  size_t warm = 0;
  for (size_t i = 0; i < n; i++) {
    total += mass[i];
    if (!(fabs(mass[i] - rmass[i]) <= 1e-4 * nq))
      fail_msg("layer %u block %zu: mass %.8g, reference %.8g", layer, i, mass[i], rmass[i]);
    warm += g[i].tier == KVT_TIER_WARM;
  }
  if (!(fabs(total - nq) <= 1e-4 * nq)) fail_msg("block masses sum to %.8g, not %u", total, nq);
  free(k);
  free(v);
  free(g);
  free(q);
  free(out);
  free(lse);
  free(mass);
  free(rout);
  free(rlse);
  free(rmass);
  return warm;
}

/* Attention over all-hot, all-warm and mixed retained blocks (mixed also
 * with several codecs in one layer), GQA groups of 1, 2 and 4, on a
 * sequence and on a fork sharing part of it. */
static void test_attend(void **state) {
  (void)state;
  uint64_t rng = tu_rand();
  kvt_shape sh = shape1(KVT_F32, 2);
  costs c = measure(&sh);
  const uint32_t nqs[] = {2, 4, 8};
  enum { HOT, WARM, MIXED, NCFG };
  for (int cfg = 0; cfg < NCFG; cfg++) {
    fx f;
    /* mixed: 3 hot blocks; 12 layer blocks put, so 9 are demoted */
    uint64_t hot = cfg == HOT ? 64ull << 20 : cfg == WARM ? 0 : 3 * c.hot;
    fx_open(&f, &sh, hot, 64ull << 20, 0);
    uint32_t toks[8 * 4], t2[8 * 4];
    for (uint32_t b = 0; b < 8; b++) block_tokens(20 + cfg, b, 4, toks + 4 * b);
    memcpy(t2, toks, sizeof t2);
    for (uint32_t b = 3; b < 8; b++) block_tokens(40 + cfg, b, 4, t2 + 4 * b);
    kvt_seq *s, *s2;
    assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
    for (uint32_t b = 0; b < 6; b++) {
      /* mixed: layer 1's warm blocks end up in two codec pairs besides
       * layer 0's default (demotion uses the codecs in force then) */
      if (cfg == MIXED && b == 2)
        assert_int_equal(kvt_ns_set_codec(f.e, f.ns, 1, KVT_CODEC_K8C, KVT_CODEC_V4), 0);
      if (cfg == MIXED && b == 4)
        assert_int_equal(kvt_ns_set_codec(f.e, f.ns, 1, KVT_CODEC_K4, KVT_CODEC_V2), 0);
      append_put(&f, s, toks + 4 * b);
    }
    for (uint32_t l = 0; l < 2; l++)
      for (size_t qi = 0; qi < N_OF(nqs); qi++)
        for (int si = 0; si < 2; si++) {
          size_t w = attend_check(&f, s, l, nqs[qi], si ? 0.3f : 0.0f, &rng);
          if (cfg == HOT) assert_int_equal(w, 0);
          if (cfg == WARM) assert_int_equal(w, 6);
          if (cfg == MIXED) assert_true(w > 0 && w < 6);
        }
    /* a fork sharing 3 blocks, then its own */
    assert_int_equal(kvt_seq_fork(s, 3, &s2), 0);
    for (uint32_t b = 3; b < 5; b++) append_put(&f, s2, t2 + 4 * b);
    for (uint32_t l = 0; l < 2; l++)
      for (size_t qi = 0; qi < N_OF(nqs); qi++) {
        size_t w = attend_check(&f, s2, l, nqs[qi], 0.0f, &rng);
        if (cfg == HOT) assert_int_equal(w, 0);
        if (cfg == WARM) assert_int_equal(w, 5);
        attend_check(&f, s, l, nqs[qi], 0.0f, &rng);
      }
    kvt_seq_release(s);
    kvt_seq_release(s2);
    fx_close(&f);
  }
}

static void test_attend_errors(void **state) {
  (void)state;
  kvt_shape sh = shape1(KVT_F32, 2);
  fx f;
  fx_open(&f, &sh, 64ull << 20, 64ull << 20, 0);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
  enum { NQ = 4, D = 64 };
  float q[NQ * D], out[NQ * D], canary[NQ * D], lse[NQ], mass[4];
  for (int i = 0; i < NQ * D; i++) q[i] = (float)(i % 7) - 3.0f;
  memset(canary, 0x5A, sizeof canary);
  size_t n = 99;
  /* nothing retained: zeros and -inf */
  memcpy(out, canary, sizeof out);
  for (int h = 0; h < NQ; h++) lse[h] = 5;
  assert_int_equal(kvt_seq_attend(s, 0, q, NQ, 0, out, lse, mass, 4, &n), 0);
  assert_int_equal(n, 0);
  for (int i = 0; i < NQ * D; i++) assert_true(out[i] == 0.0f);
  for (int h = 0; h < NQ; h++) assert_true(isinf(lse[h]) && lse[h] < 0);
  /* a block appended, layer 0 put, layer 1 not: layer 1 retains nothing */
  uint32_t tok[4];
  block_tokens(50, 0, 4, tok);
  assert_int_equal(kvt_seq_append(s, tok, 4, NULL), 0);
  expect(&f, 0, 0, tok);
  assert_int_equal(kvt_seq_put(s, 0, 0, &f.want.kv), 0);
  memcpy(out, canary, sizeof out);
  assert_int_equal(kvt_seq_attend(s, 1, q, NQ, 0, out, lse, NULL, 0, &n), 0);
  assert_int_equal(n, 0);
  for (int i = 0; i < NQ * D; i++) assert_true(out[i] == 0.0f);
  /* errors: nothing computed */
  memcpy(out, canary, sizeof out);
  assert_int_equal(kvt_seq_attend(s, 0, q, 3, 0, out, lse, mass, 4, &n), KVT_ECOUNT);
  assert_int_equal(kvt_seq_attend(s, 0, q, 0, 0, out, lse, mass, 4, &n), KVT_ECOUNT);
  assert_int_equal(kvt_seq_attend(s, 0, q, KVT_MAX_HEADS * 64 + 2, 0, out, lse, mass, 4, &n),
                   KVT_ECOUNT);
  assert_int_equal(kvt_seq_attend(s, 2, q, NQ, 0, out, lse, mass, 4, &n), KVT_ENOTFOUND);
  assert_int_equal(kvt_seq_attend(s, 0, NULL, NQ, 0, out, lse, mass, 4, &n), KVT_ENULL);
  assert_int_equal(kvt_seq_attend(s, 0, q, NQ, 0, NULL, lse, mass, 4, &n), KVT_ENULL);
  assert_int_equal(kvt_seq_attend(s, 0, q, NQ, 0, out, lse, mass, 4, NULL), KVT_ENULL);
  assert_int_equal(kvt_seq_attend(NULL, 0, q, NQ, 0, out, lse, mass, 4, &n), KVT_ENULL);
  n = 99;
  assert_int_equal(kvt_seq_attend(s, 0, q, NQ, 0, out, lse, mass, 0, &n), KVT_EBUFSIZE);
  assert_int_equal(n, 1);
  assert_memory_equal(out, canary, sizeof out);
  /* block_mass NULL needs no room; lse NULL is fine */
  assert_int_equal(kvt_seq_attend(s, 0, q, NQ, 0, out, NULL, NULL, 0, &n), 0);
  assert_int_equal(n, 1);
  for (int i = 0; i < NQ * D; i++) assert_true(isfinite(out[i]));
  kvt_seq_release(s);
  fx_close(&f);
}

/* kvt_stats.attends counts kvt_seq_attend() calls, as the header says:
 * including a successful call over nothing retained. */
static void test_attend_counts_calls(void **state) {
  (void)state;
  kvt_shape sh = shape1(KVT_F32, 1);
  fx f;
  fx_open(&f, &sh, 64ull << 20, 64ull << 20, 0);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
  float q[2 * 64] = {0}, out[2 * 64];
  size_t n;
  kvt_stats a, z;
  tu_stats(f.e, &a);
  assert_int_equal(kvt_seq_attend(s, 0, q, 2, 0, out, NULL, NULL, 0, &n), 0);
  tu_stats(f.e, &z);
  assert_int_equal(z.attends, a.attends + 1);
  kvt_seq_release(s);
  fx_close(&f);
}

/* ------------------------------------------------ random workload */

enum {
  MAXB = 6,    /* token blocks per sequence */
  MAXS = 4,    /* live sequences */
  NFAM = 3,    /* prefix families */
  NL = 2,      /* layers */
  MAXE = 4096, /* model entries */
};

typedef struct mseq {
  kvt_seq *s;
  uint32_t tok[4 * MAXB];
  uint32_t nb, na;
  kvt_key key[MAXB];
  uint8_t held[MAXB][NL];
} mseq;

typedef struct ment {
  kvt_key key;
  uint32_t layer, refs;
} ment;

typedef struct model {
  fx f;
  uint64_t hot_limit, warm_limit;
  uint32_t fam[NFAM][4 * MAXB];
  mseq seq[MAXS];
  ment ent[MAXE];
  size_t n_ent;
  uint64_t new_stores;                   /* puts that stored a new block */
  uint64_t n_full, n_ok, n_warm_reads, n_hot_reads;
} model;

static ment *ent_find(model *m, const kvt_key *k, uint32_t l) {
  for (size_t i = 0; i < m->n_ent; i++)
    if (m->ent[i].layer == l && !memcmp(&m->ent[i].key, k, sizeof *k)) return &m->ent[i];
  return NULL;
}

static void hold(model *m, mseq *q, uint32_t b, uint32_t l) {
  assert_false(q->held[b][l]);
  q->held[b][l] = 1;
  ment *en = ent_find(m, &q->key[b], l);
  if (!en) {
    assert_true(m->n_ent < MAXE);
    en = &m->ent[m->n_ent++];
    *en = (ment){.key = q->key[b], .layer = l};
  }
  en->refs++;
}

static void unhold_all(model *m, mseq *q) {
  for (uint32_t b = 0; b < q->na; b++)
    for (uint32_t l = 0; l < NL; l++) {
      if (!q->held[b][l]) continue;
      ment *en = ent_find(m, &q->key[b], l);
      assert_non_null(en);
      if (--en->refs == 0) *en = m->ent[--m->n_ent];
    }
}

static uint64_t total_refs(const model *m) {
  uint64_t n = 0;
  for (size_t i = 0; i < m->n_ent; i++) n += m->ent[i].refs;
  return n;
}

static void check_invariants(model *m) {
  kvt_stats st;
  tu_stats(m->f.e, &st);
  const costs *c = &m->f.c;
  uint64_t live = 0;
  for (int i = 0; i < MAXS; i++) live += m->seq[i].s != NULL;
  assert_int_equal(st.seqs, live);
  assert_int_equal(st.tier_limit[KVT_TIER_HOT], m->hot_limit);
  assert_int_equal(st.tier_limit[KVT_TIER_WARM], m->warm_limit);
  assert_true(st.tier_bytes[KVT_TIER_HOT] <= m->hot_limit);
  assert_true(st.tier_bytes[KVT_TIER_WARM] <= m->warm_limit);
  assert_int_equal(st.tier_bytes[KVT_TIER_HOT], st.tier_blocks[KVT_TIER_HOT] * c->hot);
  assert_int_equal(st.tier_bytes[KVT_TIER_WARM], st.tier_blocks[KVT_TIER_WARM] * c->warm);
  assert_true(st.tier_blocks[KVT_TIER_HOT] + st.tier_blocks[KVT_TIER_WARM] >= m->n_ent);
  /* every warm block came from a demotion; every hot one from a put */
  assert_int_equal(st.tier_blocks[KVT_TIER_WARM] + st.evictions[KVT_TIER_WARM], st.demotions);
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT] + st.demotions + st.evictions[KVT_TIER_HOT],
                   m->new_stores);
  assert_int_equal(st.logical_bytes, total_refs(m) * 2 * c->each);
  assert_int_equal(st.dedup_saved_bytes, (total_refs(m) - m->n_ent) * 2 * c->each);
  assert_int_equal(st.reads, st.reads_exact + st.reads_approx);
  check_total(&st);
}

static void m_read(model *m, mseq *q, uint32_t b, uint32_t l) {
  if (!q->held[b][l]) {
    assert_int_equal(kvt_seq_read(q->s, b, l, m->f.got.k, m->f.got.v, m->f.got.bytes),
                     KVT_ENOTFOUND);
    return;
  }
  if (read_check(&m->f, q->s, b, l, q->tok + 4 * b, KVT_CODEC_K8, KVT_CODEC_V3) == KVT_TIER_HOT)
    m->n_hot_reads++;
  else
    m->n_warm_reads++;
}

/* Every block any sequence holds reads back. */
static void verify_all(model *m) {
  for (int i = 0; i < MAXS; i++) {
    mseq *q = &m->seq[i];
    if (!q->s) continue;
    for (uint32_t b = 0; b < q->na; b++)
      for (uint32_t l = 0; l < NL; l++)
        if (q->held[b][l]) m_read(m, q, b, l);
  }
}

/* Referenced blocks that are warm now (gather tells the tier). */
static uint64_t referenced_warm(model *m) {
  kvt_key seen[MAXS * MAXB * NL];
  uint32_t seen_l[MAXS * MAXB * NL], n_seen = 0;
  for (int i = 0; i < MAXS; i++) {
    mseq *q = &m->seq[i];
    if (!q->s) continue;
    for (uint32_t l = 0; l < NL; l++) {
      uint32_t tiers[MAXB];
      size_t n, j = 0;
      gather_tiers(&m->f, q->s, l, q->tok, KVT_CODEC_K8, KVT_CODEC_V3, tiers, &n);
      for (uint32_t b = 0; b < q->na; b++) {
        if (!q->held[b][l]) continue;
        assert_true(j < n);
        if (tiers[j++] != KVT_TIER_WARM) continue;
        uint32_t k = 0;
        while (k < n_seen && !(seen_l[k] == l && !memcmp(&seen[k], &q->key[b], sizeof(kvt_key)))) k++;
        if (k == n_seen) {
          seen[n_seen] = q->key[b];
          seen_l[n_seen++] = l;
        }
      }
      assert_int_equal(j, n);
    }
  }
  return n_seen;
}

static void m_create(model *m, mseq *q) {
  uint32_t f = tu_below(NFAM), shared = tu_below(MAXB + 1);
  memset(q, 0, sizeof *q);
  memcpy(q->tok, m->fam[f], sizeof q->tok);
  for (uint32_t i = 4 * shared; i < 4 * MAXB; i++) q->tok[i] = (uint32_t)tu_rand();
  q->nb = 1 + tu_below(MAXB);
  assert_int_equal(kvt_seq_create(m->f.e, m->f.ns, &q->s), 0);
}

/* Append; find out by reading which layers were adopted (referenced ones
 * must be; cached ones may be) and check them. */
static void m_append(model *m, mseq *q) {
  kvt_append_info info;
  uint32_t b = q->na, adopted = 0;
  assert_int_equal(kvt_seq_append(q->s, q->tok + 4 * b, 4, &info), 0);
  assert_int_equal(info.block, b);
  q->key[b] = info.key;
  q->na++;
  for (uint32_t l = 0; l < NL; l++) {
    int rc = kvt_seq_read(q->s, b, l, m->f.got.k, m->f.got.v, m->f.got.bytes);
    if (rc == KVT_ENOTFOUND) {
      assert_null(ent_find(m, &info.key, l));
      continue;
    }
    assert_int_equal(rc, 0);
    hold(m, q, b, l);
    m_read(m, q, b, l);
    adopted++;
  }
  assert_int_equal(adopted, info.layers_present);
}

static void m_put(model *m, mseq *q) {
  uint32_t b = tu_below(q->na), l = tu_below(NL);
  int again = q->held[b][l];
  expect(&m->f, l, b, q->tok + 4 * b);
  kvt_stats a, z;
  tu_stats(m->f.e, &a);
  int rc = kvt_seq_put(q->s, b, l, &m->f.want.kv);
  tu_stats(m->f.e, &z);
  if (rc == KVT_EFULL) {
    /* only when warm cannot take a referenced victim */
    assert_false(again);
    assert_int_equal(z.put_full, a.put_full + 1);
    assert_true((referenced_warm(m) + 1) * m->f.c.warm > m->warm_limit);
    verify_all(m); /* nothing lost */
    m->n_full++;
    return;
  }
  assert_int_equal(rc, 0);
  assert_int_equal(z.puts, a.puts + 1);
  uint64_t hit = z.dedup_hits - a.dedup_hits;
  assert_true(hit <= 1);
  if (again || ent_find(m, &q->key[b], l)) assert_int_equal(hit, 1);
  m->new_stores += !hit;
  if (!again) hold(m, q, b, l);
  m->n_ok++;
}

static void m_gather(model *m, mseq *q) {
  uint32_t l = tu_below(NL), tiers[MAXB], want = 0;
  size_t n;
  gather_tiers(&m->f, q->s, l, q->tok, KVT_CODEC_K8, KVT_CODEC_V3, tiers, &n);
  for (uint32_t b = 0; b < q->na; b++) want += q->held[b][l];
  assert_int_equal(n, want);
}

static void m_release(model *m, mseq *q) {
  unhold_all(m, q);
  kvt_seq_release(q->s);
  q->s = NULL;
}

/* Look up a family prefix and load what was found (touches recency). */
static void m_lookup(model *m) {
  const uint32_t *tok = m->fam[tu_below(NFAM)];
  kvt_key keys[MAXB];
  kvt_lookup_entry ent[MAXB];
  size_t nk, n;
  assert_int_equal(kvt_keys(m->f.e, m->f.ns, tok, 4 * MAXB, keys, MAXB, &nk), 0);
  assert_int_equal(kvt_lookup(m->f.e, m->f.ns, tok, 4 * MAXB, ent, MAXB, &n), 0);
  assert_true(n <= nk);
  size_t guaranteed = 0;
  while (guaranteed < nk && ent_find(m, &keys[guaranteed], 0) && ent_find(m, &keys[guaranteed], 1))
    guaranteed++;
  assert_true(n >= guaranteed);
  if (!n) return;
  size_t each = m->f.c.each;
  kvt_load_req req[MAXB * NL];
  uint8_t *buf = malloc(2 * MAXB * NL * each);
  assert_non_null(buf);
  for (uint32_t b = 0; b < n; b++)
    for (uint32_t l = 0; l < NL; l++) {
      size_t r = b * NL + l;
      req[r] = (kvt_load_req){.key = keys[b], .layer = l, .k_out = buf + 2 * r * each,
                              .v_out = buf + (2 * r + 1) * each, .bytes_each = each};
    }
  kvt_load *ld;
  size_t ok;
  assert_int_equal(kvt_load_submit(m->f.e, m->f.ns, req, n * NL, &ld), 0);
  assert_int_equal(kvt_load_wait(ld, &ok), 0);
  assert_int_equal(ok, n * NL);
  for (uint32_t b = 0; b < n; b++) {
    uint32_t slowest = KVT_TIER_HOT;
    for (uint32_t l = 0; l < NL; l++) {
      kvt_load_req *r = &req[b * NL + l];
      expect(&m->f, l, b, tok + 4 * b);
      if (r->tier > slowest) slowest = r->tier;
      if (r->tier == KVT_TIER_HOT) {
        assert_memory_equal(r->k_out, m->f.want.k, each);
        assert_memory_equal(r->v_out, m->f.want.v, each);
      } else {
        char why[256];
        assert_int_equal(r->tier, KVT_TIER_WARM);
        if (!warm_ok(&m->f.sh, m->f.want.k, m->f.want.v, r->k_out, r->v_out, KVT_CODEC_K8,
                     KVT_CODEC_V3, why, sizeof why))
          fail_msg("loaded block %u layer %u (warm): %s", b, l, why);
      }
    }
    assert_int_equal(ent[b].tier, slowest);
  }
  free(buf);
}

static void m_step(model *m) {
  mseq *q = &m->seq[tu_below(MAXS)];
  uint32_t r = tu_below(100);
  if (!q->s) m_create(m, q);
  else if (r < 8) m_release(m, q);
  else if (r < 30 && q->na < q->nb) m_append(m, q);
  else if (r < 70 && q->na) m_put(m, q);
  else if (r < 82 && q->na) m_read(m, q, tu_below(q->na), tu_below(NL));
  else if (r < 92 && q->na) m_gather(m, q);
  else m_lookup(m);
  check_invariants(m);
}

static void test_random_workload(void **state) {
  (void)state;
  model *m = calloc(1, sizeof *m);
  assert_non_null(m);
  kvt_shape sh = shape1(KVT_F16, NL);
  costs c = measure(&sh);
  /* about 14 layer blocks fit; the live sequences hold ~20 on average */
  m->hot_limit = 4 * c.hot + c.hot / 2;
  m->warm_limit = 10 * c.warm + c.warm / 2;
  fx_open(&m->f, &sh, m->hot_limit, m->warm_limit, 0);
  for (int f = 0; f < NFAM; f++)
    for (int i = 0; i < 4 * MAXB; i++) m->fam[f][i] = (uint32_t)tu_rand();
  int steps = tu_stress() ? 200000 : 4000;
  for (int i = 0; i < steps; i++) {
    m_step(m);
    if (i % 500 == 0) verify_all(m);
  }
  verify_all(m);
  kvt_stats st;
  tu_stats(m->f.e, &st);
  fprintf(stderr, "warm workload: %d steps, %llu puts ok, %llu EFULL, %llu demotions, %llu warm "
          "drops, %llu hot drops, reads %llu exact / %llu approx\n", steps,
          (unsigned long long)m->n_ok, (unsigned long long)m->n_full,
          (unsigned long long)st.demotions, (unsigned long long)st.evictions[KVT_TIER_WARM],
          (unsigned long long)st.evictions[KVT_TIER_HOT], (unsigned long long)m->n_hot_reads,
          (unsigned long long)m->n_warm_reads);
  /* the run exercised what it is about */
  assert_true(m->n_full > 0);
  assert_true(st.demotions > 0 && st.evictions[KVT_TIER_WARM] > 0);
  assert_true(m->n_warm_reads > 0 && m->n_hot_reads > 0);
  for (int i = 0; i < MAXS; i++)
    if (m->seq[i].s) m_release(m, &m->seq[i]);
  check_invariants(m);
  assert_int_equal(total_refs(m), 0);
  fx_close(&m->f);
  free(m);
}

/* ------------------------------------------------ threads */

/* Threads may not use cmocka asserts: the first failure is kept here and
 * the main thread fails on it. */
static atomic_int g_failed;
static char g_msg[512];

static int thread_fail(int line, const char *what, const char *detail) {
  if (atomic_exchange(&g_failed, 1) == 0)
    snprintf(g_msg, sizeof g_msg, "line %d: %s %s", line, what, detail ? detail : "");
  return -1;
}
#define TCHECK(c)                                                 \
  do {                                                            \
    if (!(c)) return thread_fail(__LINE__, #c, NULL);             \
  } while (0)

typedef struct tshared {
  kvt_engine *e;
  kvt_ns_id ns;
  kvt_shape sh;
  uint64_t salt;
  uint32_t fam[4 * 8];
  int iters;
  atomic_int efull, stop;
  atomic_long demoted_seen;
} tshared;

typedef struct tworker {
  pthread_t th;
  int id;
  tshared *sh;
  uint64_t rng;
  tu_kv want, got;
} tworker;

/* Exact, or within the warm bound (reads say nothing of the tier). */
static int same_or_warm(tworker *w, const void *k, const void *v, char *why, size_t n) {
  if (!memcmp(k, w->want.k, w->want.bytes) && !memcmp(v, w->want.v, w->want.bytes)) return 1;
  return warm_ok(&w->sh->sh, w->want.k, w->want.v, k, v, KVT_CODEC_K8, KVT_CODEC_V3, why, n);
}

static int put_retry(tworker *w, kvt_seq *s, uint32_t b, uint32_t l) {
  for (int tries = 0;; tries++) {
    int rc = kvt_seq_put(s, b, l, &w->want.kv);
    if (rc != KVT_EFULL) return rc;
    /* transient: every hot block pinned by other threads' copies */
    atomic_fetch_add(&w->sh->efull, 1);
    if (tries > 10000) return rc;
    sched_yield();
  }
}

static int worker_round(tworker *w) {
  tshared *S = w->sh;
  const kvt_shape *sh = &S->sh;
  uint32_t nb = 1 + (uint32_t)(tu_rand_r(&w->rng) % 6), shared = (uint32_t)(tu_rand_r(&w->rng) % 4);
  uint32_t tok[4 * 8];
  for (uint32_t i = 0; i < 4 * 8; i++)
    tok[i] = i < 4 * shared ? S->fam[i] : (uint32_t)tu_rand_r(&w->rng);
  kvt_seq *s;
  char why[256];
  TCHECK(kvt_seq_create(S->e, S->ns, &s) == 0);
  for (uint32_t b = 0; b < nb; b++) {
    TCHECK(kvt_seq_append(s, tok + 4 * b, 4, NULL) == 0);
    for (uint32_t l = 0; l < sh->n_layers; l++) {
      tu_kv_fill(&w->want, sh, S->salt, l, b, tok + 4 * b);
      int rc = put_retry(w, s, b, l);
      if (rc) {
        snprintf(why, sizeof why, "put returned %d", rc);
        return thread_fail(__LINE__, "put", why);
      }
    }
  }
  size_t each = kvt_shape_block_bytes(sh), bytes = nb * each, n;
  uint8_t *k = malloc(bytes), *v = malloc(bytes);
  kvt_gathered g[8];
  TCHECK(k && v);
  for (int rep = 0; rep < 3; rep++) {
    uint32_t l = (uint32_t)(tu_rand_r(&w->rng) % sh->n_layers);
    bytes = nb * each;
    TCHECK(kvt_seq_gather(s, l, k, v, &bytes, g, 8, &n) == 0);
    TCHECK(n == nb);
    for (uint32_t i = 0; i < n; i++) {
      tu_kv_fill(&w->want, sh, S->salt, l, i, tok + 4 * i);
      if (g[i].exact) {
        TCHECK(g[i].tier == KVT_TIER_HOT);
        if (memcmp(k + i * each, w->want.k, each) || memcmp(v + i * each, w->want.v, each))
          return thread_fail(__LINE__, "hot gathered block differs", NULL);
      } else {
        TCHECK(g[i].tier == KVT_TIER_WARM);
        atomic_fetch_add(&S->demoted_seen, 1);
        if (!warm_ok(sh, w->want.k, w->want.v, k + i * each, v + i * each, KVT_CODEC_K8,
                     KVT_CODEC_V3, why, sizeof why))
          return thread_fail(__LINE__, "warm gathered block", why);
      }
    }
    uint32_t b = (uint32_t)(tu_rand_r(&w->rng) % nb);
    tu_kv_fill(&w->want, sh, S->salt, l, b, tok + 4 * b);
    TCHECK(kvt_seq_read(s, b, l, w->got.k, w->got.v, each) == 0);
    if (!same_or_warm(w, w->got.k, w->got.v, why, sizeof why))
      return thread_fail(__LINE__, "read", why);
    /* attention: finite, masses sum to the heads, outputs bounded by the
     * values (convex combinations; warm values within c_max |v|) */
    enum { NQ = 4 };
    float q[NQ * 64], out[NQ * 64], lse[NQ], mass[8];
    for (int i = 0; i < NQ * 64; i++) q[i] = (float)gauss_r(&w->rng);
    size_t na;
    TCHECK(kvt_seq_attend(s, l, q, NQ, 0, out, lse, mass, 8, &na) == 0);
    TCHECK(na == nb);
    double total = 0;
    for (size_t i = 0; i < na; i++) total += mass[i];
    TCHECK(fabs(total - NQ) <= 1e-3 * NQ);
    for (int h = 0; h < NQ; h++) TCHECK(isfinite(lse[h]));
    for (int i = 0; i < NQ * 64; i++) TCHECK(isfinite(out[i]) && fabsf(out[i]) <= 2.0f * 2.152f * 8);
  }
  free(k);
  free(v);
  kvt_seq_release(s);
  return 0;
}

/* Sets the codecs (to the ones in force, so the bounds stay right) while
 * the workers demote: kvt_ns_set_codec() may run beside any other call. */
static void *codec_setter(void *arg) {
  tshared *S = arg;
  while (!atomic_load(&S->stop)) {
    if (kvt_ns_set_codec(S->e, S->ns, KVT_ALL_LAYERS, KVT_CODEC_K8, KVT_CODEC_V3)) {
      thread_fail(__LINE__, "kvt_ns_set_codec", NULL);
      break;
    }
    sched_yield();
  }
  return NULL;
}

static void *worker_main(void *arg) {
  tworker *w = arg;
  for (int i = 0; i < w->sh->iters && !atomic_load(&g_failed); i++)
    if (worker_round(w)) break;
  return NULL;
}

/* 4 threads put, gather, read and attend with demotion and warm drops
 * going on, and a fifth sets the namespace's codecs meanwhile; every block
 * read is exact or within the warm bound. */
static void test_threads(void **state) {
  (void)state;
  enum { NT = 4 };
  tshared S = {0};
  atomic_store(&g_failed, 0);
  S.sh = shape1(KVT_F32, 2);
  costs c = measure(&S.sh);
  char *dir = tu_tmpdir();
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = 6 * c.hot;
  /* enough for what 4 threads hold at once (<= 4 x 6 x 2 referenced), so
   * EFULL can only be the transient kind; less than all ever put, so
   * unreferenced warm blocks are dropped */
  o.tier_bytes_limit[KVT_TIER_WARM] = 64 * c.warm;
  S.e = tu_open(dir, &o);
  S.ns = tu_register(S.e, "warm-threads", &S.sh);
  S.salt = tu_salt("warm-threads");
  S.iters = tu_stress() ? 2000 : 120;
  for (int i = 0; i < 4 * 8; i++) S.fam[i] = (uint32_t)tu_rand();
  tworker w[NT];
  alarm(120); /* a deadlock fails here rather than at the ctest timeout */
  for (int i = 0; i < NT; i++) {
    w[i] = (tworker){.id = i, .sh = &S, .rng = tu_rand()};
    tu_kv_alloc(&w[i].want, &S.sh);
    tu_kv_alloc(&w[i].got, &S.sh);
    assert_int_equal(pthread_create(&w[i].th, NULL, worker_main, &w[i]), 0);
  }
  pthread_t setter;
  assert_int_equal(pthread_create(&setter, NULL, codec_setter, &S), 0);
  for (int i = 0; i < NT; i++) assert_int_equal(pthread_join(w[i].th, NULL), 0);
  atomic_store(&S.stop, 1);
  assert_int_equal(pthread_join(setter, NULL), 0);
  alarm(0);
  if (atomic_load(&g_failed)) fail_msg("%s", g_msg);
  kvt_stats st;
  tu_stats(S.e, &st);
  fprintf(stderr, "warm threads: %llu puts, %llu demotions, %llu warm drops, %d transient EFULL, "
          "%ld warm blocks gathered\n", (unsigned long long)st.puts,
          (unsigned long long)st.demotions, (unsigned long long)st.evictions[KVT_TIER_WARM],
          atomic_load(&S.efull), atomic_load(&S.demoted_seen));
  assert_true(st.tier_bytes[KVT_TIER_HOT] <= st.tier_limit[KVT_TIER_HOT]);
  assert_true(st.tier_bytes[KVT_TIER_WARM] <= st.tier_limit[KVT_TIER_WARM]);
  assert_true(st.demotions > 0);
  assert_int_equal(st.seqs, 0);
  assert_int_equal(st.tier_blocks[KVT_TIER_WARM] + st.evictions[KVT_TIER_WARM], st.demotions);
  for (int i = 0; i < NT; i++) {
    tu_kv_free(&w[i].want);
    tu_kv_free(&w[i].got);
  }
  kvt_engine_close(S.e);
  tu_rmtree(dir);
}

/* A block is read (pinned, copied outside the lock) while another thread's
 * put demotes it. A pinned block must not change tier or be freed
 * (DESIGN.md section 2, docs/concurrency.md): the copy must see the block
 * whole, hot or warm. Large blocks make the encode, and so the window in
 * which the demoter has dropped the lock, long; the reader copies in a
 * tight loop. Under AddressSanitizer a freed payload read is reported; in
 * any build a torn copy fails the content check. Variant `drop`: the warm
 * tier cannot take the block and it is unreferenced (only loaded), so the
 * demoter drops it instead while a load holds it pinned. */
typedef struct race {
  kvt_engine *e;
  kvt_ns_id ns;
  kvt_shape sh;
  uint64_t salt;
  int drop;
  atomic_int phase; /* round number the putter may run; -1: stop */
  atomic_int done_round;
  tu_kv want, got, tmp;
} race;

static void *race_putter(void *arg) {
  race *R = arg;
  uint32_t tok[64];
  for (int round = 0;; round++) {
    int ph;
    while ((ph = atomic_load(&R->phase)) < round && ph != -1) sched_yield();
    if (ph == -1) break;
    /* a new block, released at once: it pushes the oldest hot one out */
    kvt_seq *s;
    for (uint32_t i = 0; i < R->sh.block_tokens; i++) tok[i] = 0x80000000u + (uint32_t)round * 64 + i;
    if (kvt_seq_create(R->e, R->ns, &s) || kvt_seq_append(s, tok, R->sh.block_tokens, NULL)) {
      thread_fail(__LINE__, "putter append", NULL);
      break;
    }
    tu_kv_fill(&R->tmp, &R->sh, R->salt, 0, 0, tok);
    int rc;
    /* EFULL: the only hot block was pinned by the reader when chosen (or
     * when the demoter came back to it): try again, so that it goes */
    for (int tries = 0; (rc = kvt_seq_put(s, 0, 0, &R->tmp.kv)) == KVT_EFULL && tries < 2000; tries++)
      sched_yield();
    kvt_seq_release(s);
    if (rc && rc != KVT_EFULL) {
      thread_fail(__LINE__, "putter put", NULL);
      break;
    }
    atomic_store(&R->done_round, round + 1);
  }
  return NULL;
}

static void race_run(int drop) {
  race R = {.drop = drop};
  atomic_store(&g_failed, 0);
  R.sh = (kvt_shape){.n_layers = 1, .n_kv_heads = 8, .head_dim = 128, .dtype = KVT_F32,
                     .block_tokens = 64};
  costs c = measure(&R.sh);
  char *dir = tu_tmpdir();
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = c.hot + c.hot / 2; /* one block */
  o.tier_bytes_limit[KVT_TIER_WARM] = drop ? 64 : 64ull << 20;
  R.e = tu_open(dir, &o);
  R.ns = tu_register(R.e, "warm-race", &R.sh);
  R.salt = tu_salt("warm-race");
  tu_kv_alloc(&R.want, &R.sh);
  tu_kv_alloc(&R.got, &R.sh);
  tu_kv_alloc(&R.tmp, &R.sh);
  atomic_store(&R.phase, -2);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, race_putter, &R), 0);
  alarm(120);
  int rounds = tu_stress() ? 400 : 30, warm_seen = 0, dropped_seen = 0;
  uint32_t tok[64];
  char why[256], failure[512] = "";
  /* No cmocka assert while the putter runs: a failure stops it first. */
#define RCHECK(c)                                                               \
  do {                                                                          \
    if (!(c)) {                                                                 \
      snprintf(failure, sizeof failure, "round %d: %s (line %d)", round, #c, __LINE__); \
      goto stop;                                                                \
    }                                                                           \
  } while (0)
  for (int round = 0; round < rounds && !atomic_load(&g_failed); round++) {
    kvt_seq *s = NULL;
    for (uint32_t i = 0; i < R.sh.block_tokens; i++) tok[i] = (uint32_t)round * 64 + i;
    tu_kv_fill(&R.want, &R.sh, R.salt, 0, 0, tok);
    RCHECK(kvt_seq_create(R.e, R.ns, &s) == 0);
    kvt_append_info info;
    RCHECK(kvt_seq_append(s, tok, R.sh.block_tokens, &info) == 0);
    RCHECK(kvt_seq_put(s, 0, 0, &R.want.kv) == 0);
    if (drop) { /* only loads will pin it */
      kvt_seq_release(s);
      s = NULL;
    }
    atomic_store(&R.phase, round); /* the putter demotes (or drops) it now */
    for (int spins = 0;; spins++) {
      int fin = atomic_load(&R.done_round) > round;
      int rc;
      uint32_t tier = 0;
      if (drop) {
        kvt_load_req req = {.key = info.key, .layer = 0, .k_out = R.got.k, .v_out = R.got.v,
                            .bytes_each = R.got.bytes};
        kvt_load *ld;
        RCHECK(kvt_load_submit(R.e, R.ns, &req, 1, &ld) == 0);
        rc = kvt_load_wait(ld, NULL);
        tier = req.tier;
        if (rc == KVT_ENOTFOUND) {
          dropped_seen++;
          break;
        }
      } else {
        kvt_stats a, z;
        tu_stats(R.e, &a);
        rc = kvt_seq_read(s, 0, 0, R.got.k, R.got.v, R.got.bytes);
        tu_stats(R.e, &z);
        tier = z.reads_approx > a.reads_approx ? KVT_TIER_WARM : KVT_TIER_HOT;
      }
      RCHECK(rc == 0);
      int same = !memcmp(R.got.k, R.want.k, R.want.bytes) && !memcmp(R.got.v, R.want.v, R.want.bytes);
      if (!same && !warm_ok(&R.sh, R.want.k, R.want.v, R.got.k, R.got.v, KVT_CODEC_K8,
                            KVT_CODEC_V3, why, sizeof why)) {
        snprintf(failure, sizeof failure, "round %d: a block %s while being %s is neither exact "
                 "nor within the warm bound: %s", round, drop ? "loaded" : "read",
                 drop ? "dropped" : "demoted", why);
        goto stop;
      }
      if (tier == KVT_TIER_WARM) {
        warm_seen++;
        break;
      }
      if (fin && spins > 1000) break; /* the put demoted something else */
    }
    kvt_seq_release(s);
    while (atomic_load(&R.done_round) <= round && !atomic_load(&g_failed)) sched_yield();
  }
stop:
#undef RCHECK
  atomic_store(&R.phase, -1);
  assert_int_equal(pthread_join(th, NULL), 0);
  alarm(0);
  if (*failure) fail_msg("%s", failure);
  if (atomic_load(&g_failed)) fail_msg("%s", g_msg);
  fprintf(stderr, "demotion race (%s): %d rounds, %d ended warm, %d ended dropped\n",
          drop ? "drop" : "demote", rounds, warm_seen, dropped_seen);
  assert_true(drop ? dropped_seen > 0 : warm_seen > 0);
  tu_kv_free(&R.want);
  tu_kv_free(&R.got);
  tu_kv_free(&R.tmp);
  kvt_engine_close(R.e);
  tu_rmtree(dir);
}

static void test_read_while_demoted(void **state) {
  (void)state;
  race_run(0);
}

static void test_load_while_dropped(void **state) {
  (void)state;
  race_run(1);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_codec_parse),
      cmocka_unit_test(test_demote_lru),
      cmocka_unit_test(test_warm_drops_lru),
      cmocka_unit_test(test_warm_full),
      cmocka_unit_test(test_born_warm),
      cmocka_unit_test(test_metadata_only_same_accounting),
      cmocka_unit_test(test_set_codec),
      cmocka_unit_test(test_attend),
      cmocka_unit_test(test_attend_errors),
      cmocka_unit_test(test_attend_counts_calls),
      cmocka_unit_test(test_random_workload),
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_read_while_demoted),
      cmocka_unit_test(test_load_while_dropped),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
