/* test_warm_attend.c - the warm tier inside the engine, through the public
 * API: attention on hot, warm and mixed blocks against a double-precision
 * reference over what gather returns; its errors and counters.
 * Shared helpers and the fixture: warm_util.h. */
#include "warm_util.h"

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

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attend),
      cmocka_unit_test(test_attend_errors),
      cmocka_unit_test(test_attend_counts_calls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
