/* test_policy.c - the policy layer's basics: kvt_seq_observe() feeds
 * per-block state, a byte budget keeps what fits per layer with the
 * scorer's choice, evicted blocks leave attention and gathers of that
 * sequence only, forks inherit the policy, bad arguments are refused. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct fx {
  char *dir;
  kvt_engine *e;
  kvt_shape sh;
  kvt_ns_id ns;
  uint64_t salt;
  tu_kv kv;
  uint32_t tok[64 * 4];
} fx;

static void fx_open(fx *f) {
  f->dir = tu_tmpdir();
  f->e = tu_open(f->dir, NULL);
  f->sh = tu_shape_small(KVT_F32);
  f->ns = tu_register(f->e, "policy-model", &f->sh);
  f->salt = tu_salt("policy-model");
  tu_kv_alloc(&f->kv, &f->sh);
  for (size_t i = 0; i < sizeof f->tok / sizeof f->tok[0]; i++) f->tok[i] = (uint32_t)tu_rand();
}

static void fx_close(fx *f) {
  tu_kv_free(&f->kv);
  kvt_engine_close(f->e);
  tu_rmtree(f->dir);
}

static kvt_seq *seq_of(fx *f, uint32_t nb, const kvt_policy *p) {
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(f->e, f->ns, &s), 0);
  if (p) assert_int_equal(kvt_seq_set_policy(s, p), 0);
  for (uint32_t b = 0; b < nb; b++) tu_append_put(s, &f->sh, f->salt, f->tok + 4 * b, &f->kv);
  return s;
}

static size_t retained(kvt_seq *s, uint32_t layer, uint32_t *idx) {
  kvt_gathered g[64];
  size_t n;
  assert_int_equal(kvt_seq_retained(s, layer, g, 64, &n), 0);
  for (size_t i = 0; idx && i < n; i++) idx[i] = g[i].block;
  return n;
}

static void test_parse_and_defaults(void **state) {
  (void)state;
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(p.scorer, KVT_SCORER_FULL);
  assert_true(p.budget == 1.0);
  assert_int_equal(p.sink_blocks, KVT_POLICY_DEFAULT);
  const char *names[] = {"full", "recent", "sink-recent", "h2o", "snapkv",
                         "tova", "external", "learned", "auto"};
  const uint32_t n_names = sizeof names / sizeof names[0];
  for (uint32_t i = 0; i < n_names; i++) {
    uint32_t id = 99;
    assert_int_equal(kvt_policy_parse(names[i], &id), 0);
    assert_int_equal(id, i);
    assert_string_equal(kvt_policy_name(i), names[i]);
  }
  uint32_t id;
  assert_int_equal(kvt_policy_parse("lru", &id), KVT_EOPTION);
  assert_int_equal(kvt_policy_parse(NULL, &id), KVT_ENULL);
  assert_null(kvt_policy_name(n_names));
}

static void test_bad_arguments(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  kvt_seq *s = seq_of(&f, 3, NULL);
  kvt_policy p;
  kvt_policy_init(&p);
  p.budget = 0;
  assert_int_equal(kvt_seq_set_policy(s, &p), KVT_EOPTION);
  p.budget = NAN;
  assert_int_equal(kvt_seq_set_policy(s, &p), KVT_EOPTION);
  p.budget = 1.5;
  assert_int_equal(kvt_seq_set_policy(s, &p), KVT_EOPTION);
  p.budget = 0.5;
  p.scorer = 99;
  assert_int_equal(kvt_seq_set_policy(s, &p), KVT_EOPTION);
  p.scorer = KVT_SCORER_RECENT;
  p.window_blocks = (1u << 20) + 1;
  assert_int_equal(kvt_seq_set_policy(s, &p), KVT_EOPTION);
  p.window_blocks = KVT_POLICY_DEFAULT;
  p.scorer = KVT_SCORER_LEARNED; /* no predictor loaded */
  assert_int_equal(kvt_seq_set_policy(s, &p), KVT_EOPTION);
  assert_int_equal(retained(s, 0, NULL), 3); /* nothing changed */
  float mass[3] = {1, 2, 3};
  assert_int_equal(kvt_seq_observe(s, 0, mass, 2), KVT_ECOUNT);
  assert_int_equal(kvt_seq_observe(s, f.sh.n_layers, mass, 3), KVT_ENOTFOUND);
  assert_int_equal(kvt_seq_observe(s, 0, NULL, 3), KVT_ENULL);
  mass[1] = -1;
  assert_int_equal(kvt_seq_observe(s, 0, mass, 3), KVT_EOPTION);
  mass[1] = INFINITY;
  assert_int_equal(kvt_seq_observe(s, 0, mass, 3), KVT_EOPTION);
  double sum;
  float last;
  uint32_t obs;
  assert_int_equal(kvt_seq_block_mass(s, 1, 0, &sum, &last, &obs), 0);
  assert_int_equal(obs, 0); /* refused observations record nothing */
  assert_int_equal(kvt_seq_block_mass(s, 3, 0, &sum, &last, &obs), KVT_ENOTFOUND);
  kvt_gathered g[1];
  size_t n;
  assert_int_equal(kvt_seq_retained(s, 0, g, 1, &n), KVT_EBUFSIZE);
  assert_int_equal(n, 3);
  kvt_seq_release(s);
  fx_close(&f);
}

static void test_observe_accumulates(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  kvt_seq *s = seq_of(&f, 3, NULL);
  float m1[3] = {0.5f, 0.25f, 0.25f}, m2[3] = {1.5f, 0, 0.5f};
  assert_int_equal(kvt_seq_observe(s, 2, m1, 3), 0);
  assert_int_equal(kvt_seq_observe(s, 2, m2, 3), 0);
  double sum;
  float last;
  uint32_t obs;
  assert_int_equal(kvt_seq_block_mass(s, 0, 2, &sum, &last, &obs), 0);
  assert_true(sum == 2.0 && last == 1.5f && obs == 2);
  assert_int_equal(kvt_seq_block_mass(s, 1, 2, &sum, &last, &obs), 0);
  assert_true(sum == 0.25 && last == 0 && obs == 2);
  assert_int_equal(kvt_seq_block_mass(s, 0, 1, &sum, &last, &obs), 0);
  assert_int_equal(obs, 0); /* per layer */
  kvt_seq_release(s);
  fx_close(&f);
}

/* recent and sink-recent keep what fits share * the full cache's bytes per layer, the ones
 * their scorer names; what leaves is gone from attend and gather of this
 * sequence, not from another sequence sharing it. */
static void test_budget_recent_and_sink(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  kvt_seq *full = seq_of(&f, 10, NULL);
  kvt_policy p;
  kvt_policy_init(&p);
  p.scorer = KVT_SCORER_RECENT;
  p.budget = 0.3;
  kvt_seq *r = seq_of(&f, 10, &p);
  uint32_t idx[64];
  for (uint32_t l = 0; l < f.sh.n_layers; l++) {
    assert_int_equal(retained(r, l, idx), 3);
    assert_int_equal(idx[0], 7);
    assert_int_equal(idx[2], 9);
  }
  p.scorer = KVT_SCORER_SINK_RECENT;
  p.sink_blocks = 2;
  p.budget = 0.6; /* sinks are never evicted, even at 2 blocks (1.2 fit) */
  kvt_seq *sk = seq_of(&f, 10, &p);
  assert_int_equal(retained(sk, 1, idx), 6);
  assert_int_equal(idx[0], 0);
  assert_int_equal(idx[1], 1);
  assert_int_equal(idx[2], 6);
  assert_int_equal(idx[5], 9);
  /* gather and attend see the same 6; the full sequence still sees 10 */
  size_t bytes, n;
  assert_int_equal(kvt_seq_gather(sk, 1, NULL, NULL, &bytes, NULL, 0, &n), 0);
  assert_int_equal(n, 6);
  float q[2 * 16] = {0}, out[2 * 16], mass[16], total = 0;
  assert_int_equal(kvt_seq_attend(sk, 1, q, 2, 0, out, NULL, mass, 16, &n), 0);
  assert_int_equal(n, 6);
  for (int i = 0; i < 6; i++) total += mass[i];
  assert_true(fabsf(total - 2.0f) < 1e-4f); /* two query heads, each summing to 1 */
  assert_int_equal(retained(full, 1, NULL), 10);
  tu_assert_gather(full, &f.sh, f.salt, f.tok, 10);
  /* set_policy applies at once; a fork inherits it */
  p.scorer = KVT_SCORER_RECENT;
  p.sink_blocks = KVT_POLICY_DEFAULT; /* none for recent */
  p.budget = 0.1;
  assert_int_equal(kvt_seq_set_policy(full, &p), 0);
  assert_int_equal(retained(full, 0, idx), 1);
  assert_int_equal(idx[0], 9);
  kvt_seq *c;
  assert_int_equal(kvt_seq_fork(full, UINT32_MAX, &c), 0);
  tu_append_put(c, &f.sh, f.salt, f.tok + 40, &f.kv);
  assert_int_equal(retained(c, 0, idx), 1); /* 0.1 * 11 blocks: the newest, protected */
  assert_int_equal(idx[0], 10);
  kvt_seq_release(c);
  kvt_seq_release(full);
  kvt_seq_release(r);
  kvt_seq_release(sk);
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.logical_bytes, 0); /* every reference returned */
  fx_close(&f);
}

/* h2o keeps the blocks that received the most observed mass. */
static void test_h2o_keeps_heavy_hitters(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  kvt_seq *s = seq_of(&f, 6, NULL);
  float m[6] = {0.1f, 3.0f, 0.2f, 2.0f, 0.1f, 0.1f};
  for (uint32_t l = 0; l < f.sh.n_layers; l++) assert_int_equal(kvt_seq_observe(s, l, m, 6), 0);
  kvt_policy p;
  kvt_policy_init(&p);
  p.scorer = KVT_SCORER_H2O;
  p.budget = 0.5;
  p.window_blocks = 1; /* the newest is protected */
  assert_int_equal(kvt_seq_set_policy(s, &p), 0);
  uint32_t idx[8];
  assert_int_equal(retained(s, 0, idx), 3);
  assert_int_equal(idx[0], 1);
  assert_int_equal(idx[1], 3);
  assert_int_equal(idx[2], 5);
  /* without the window (the default) the lighter newest block goes */
  p.window_blocks = KVT_POLICY_DEFAULT;
  kvt_seq *s2 = seq_of(&f, 6, NULL);
  for (uint32_t l = 0; l < f.sh.n_layers; l++) assert_int_equal(kvt_seq_observe(s2, l, m, 6), 0);
  assert_int_equal(kvt_seq_set_policy(s2, &p), 0);
  assert_int_equal(retained(s2, 0, idx), 3);
  assert_int_equal(idx[0], 1);
  assert_int_equal(idx[1], 2);
  assert_int_equal(idx[2], 3);
  kvt_seq_release(s2);
  kvt_seq_release(s);
  fx_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_and_defaults),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_observe_accumulates),
      cmocka_unit_test(test_budget_recent_and_sink),
      cmocka_unit_test(test_h2o_keeps_heavy_hitters),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
