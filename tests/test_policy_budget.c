/* test_policy_budget.c - byte budgets hold at every step: every scorer,
 * with the caller's tail counted, under forks and shared blocks, with
 * warm blocks counted at their encoded size; protected blocks (sinks,
 * window, scoring delay) never leave; the scorers rank as documented;
 * bad arguments are refused. Budgets are checked two ways: against
 * kvt_seq_policy_info() and against bytes recomputed here from the
 * retained list. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXB 128

typedef struct fx {
  char *dir;
  kvt_engine *e;
  kvt_shape sh;
  kvt_ns_id ns;
  uint64_t salt;
  tu_kv kv;
  uint32_t tok[MAXB * 4];
} fx;

static void fx_open_with(fx *f, const kvt_options *o) {
  f->dir = tu_tmpdir();
  f->e = tu_open(f->dir, o);
  f->sh = tu_shape_small(KVT_F32);
  f->ns = tu_register(f->e, "budget-model", &f->sh);
  f->salt = tu_salt("budget-model");
  tu_kv_alloc(&f->kv, &f->sh);
  for (size_t i = 0; i < sizeof f->tok / sizeof f->tok[0]; i++) f->tok[i] = (uint32_t)tu_rand();
}

static void fx_open(fx *f) { fx_open_with(f, NULL); }

static void fx_close(fx *f) {
  tu_kv_free(&f->kv);
  kvt_engine_close(f->e);
  tu_rmtree(f->dir);
}

/* K and V of one token of one layer at f16: what the budget counts. */
static uint64_t tok_bytes(const kvt_shape *sh) { return 2ull * sh->n_kv_heads * sh->head_dim * 2; }

static size_t retained(kvt_seq *s, uint32_t layer, kvt_gathered *g) {
  size_t n;
  assert_int_equal(kvt_seq_retained(s, layer, g, MAXB, &n), 0);
  return n;
}

/* The bytes the budget counts for (s, layer), recomputed from the
 * retained list: hot blocks at f16 size, warm ones at their codecs'
 * encoded size, the tail at f16 size. */
static uint64_t kept_bytes(fx *f, kvt_seq *s, uint32_t layer, uint64_t tokens, int k_codec,
                           int v_codec) {
  kvt_gathered g[MAXB];
  size_t n = retained(s, layer, g);
  uint32_t bt = f->sh.block_tokens;
  uint64_t tb = tok_bytes(&f->sh), kept = (tokens - (uint64_t)kvt_seq_blocks(s) * bt) * tb;
  kvt_codec_shape cs = {.n_tokens = bt, .n_heads = f->sh.n_kv_heads, .head_dim = f->sh.head_dim};
  for (size_t i = 0; i < n; i++)
    kept += g[i].tier == KVT_TIER_HOT ? bt * tb
                                      : kvt_codec_size(k_codec, &cs) + kvt_codec_size(v_codec, &cs);
  return kept;
}

/* Budget of (s, layer) holds, or the layer is over only because what is
 * left is protected: sinks, window and blocks in their delay. */
static void check_layer(fx *f, kvt_seq *s, uint32_t layer, uint64_t tokens, const kvt_policy *asked,
                        int k_codec, int v_codec) {
  kvt_policy resolved, *p = &resolved;
  assert_int_equal(kvt_seq_get_policy(s, p), 0);
  assert_int_equal(p->scorer, asked->scorer);
  assert_true(p->budget == asked->budget);
  assert_true(p->sink_blocks != KVT_POLICY_DEFAULT && p->window_blocks != KVT_POLICY_DEFAULT &&
              p->delay != KVT_POLICY_DEFAULT);
  kvt_policy_info pi;
  assert_int_equal(kvt_seq_policy_info(s, layer, &pi), 0);
  uint64_t kept = kept_bytes(f, s, layer, tokens, k_codec, v_codec);
  assert_int_equal(pi.kept_bytes, kept);
  assert_int_equal(pi.tokens, tokens);
  assert_int_equal(pi.full_bytes, tokens * tok_bytes(&f->sh));
  assert_int_equal(pi.budget_bytes, (uint64_t)floor(p->budget * (double)pi.full_bytes));
  if (!pi.over) {
    assert_true(pi.kept_bytes <= pi.budget_bytes);
    return;
  }
  assert_true(pi.kept_bytes > pi.budget_bytes);
  kvt_gathered g[MAXB];
  size_t n = retained(s, layer, g);
  uint32_t nb = kvt_seq_blocks(s), sinks = p->sink_blocks, win = p->window_blocks;
  for (size_t i = 0; i < n; i++) {
    double sum;
    float last;
    uint32_t obs;
    assert_int_equal(kvt_seq_block_mass(s, g[i].block, layer, &sum, &last, &obs), 0);
    int prot = g[i].block < sinks || g[i].block + win >= nb || obs < p->delay;
    if (!prot)
      fprintf(stderr, "scorer %u budget %g layer %u: block %u of %u (observed %u) left over budget\n",
              p->scorer, p->budget, layer, g[i].block, nb, obs);
    assert_true(prot); /* over budget with an evictable block left: a bug */
  }
}

/* One decoding step of s at `tokens`: length, hints, an observation of
 * every layer (random masses), and the budget checked after each. */
static void step(fx *f, kvt_seq *s, uint64_t tokens, const kvt_policy *p, uint64_t *rng) {
  assert_int_equal(kvt_seq_set_tokens(s, tokens), 0);
  uint32_t nb = kvt_seq_blocks(s);
  for (uint32_t l = 0; l < f->sh.n_layers; l++) {
    check_layer(f, s, l, tokens, p, 0, 0);
    float h[MAXB], m[MAXB];
    for (uint32_t b = 0; b < nb; b++) h[b] = (float)(tu_rand_r(rng) % 1000);
    assert_int_equal(kvt_seq_hint(s, l, h, nb), 0);
    kvt_gathered g[MAXB];
    size_t n = retained(s, l, g);
    for (size_t i = 0; i < n; i++) m[i] = (float)(tu_rand_r(rng) % 1000) / 1000.0f;
    assert_int_equal(kvt_seq_observe(s, l, m, n), 0);
    check_layer(f, s, l, tokens, p, 0, 0);
  }
}

/* Decode `blocks` blocks token by token: the tail grows, then the block
 * is appended and put (the put applies the policy too). */
static void decode(fx *f, kvt_seq *s, uint32_t from, uint32_t blocks, const kvt_policy *p,
                   uint64_t *rng) {
  uint32_t bt = f->sh.block_tokens;
  for (uint32_t b = from; b < from + blocks; b++) {
    for (uint32_t t = 1; t <= bt; t++) step(f, s, (uint64_t)b * bt + t, p, rng);
    tu_append_put(s, &f->sh, f->salt, f->tok + (size_t)b * bt, &f->kv);
    for (uint32_t l = 0; l < f->sh.n_layers; l++)
      check_layer(f, s, l, (uint64_t)(b + 1) * bt, p, 0, 0);
  }
}

static void test_budget_every_step_every_scorer(void **state) {
  (void)state;
  const char *names[] = {"recent", "sink-recent", "h2o", "snapkv", "tova", "external"};
  const double budgets[] = {0.1, 0.3, 0.6};
  uint64_t rng = tu_seed();
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    for (size_t j = 0; j < 3; j++) {
      fx f;
      fx_open(&f);
      kvt_policy p;
      kvt_policy_init(&p);
      assert_int_equal(kvt_policy_parse(names[i], &p.scorer), 0);
      p.budget = budgets[j];
      if (j == 2) { /* protection, explicitly */
        p.sink_blocks = 1;
        p.window_blocks = 2;
        p.delay = 2;
      }
      kvt_seq *s, *other, *c;
      assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
      assert_int_equal(kvt_seq_set_policy(s, &p), 0);
      /* another sequence shares every block, with nothing evicted */
      assert_int_equal(kvt_seq_create(f.e, f.ns, &other), 0);
      decode(&f, s, 0, 12, &p, &rng);
      for (uint32_t b = 0; b < 20; b++)
        tu_append_put(other, &f.sh, f.salt, f.tok + (size_t)b * f.sh.block_tokens, &f.kv);
      /* a fork goes on on its own, the parent too */
      assert_int_equal(kvt_seq_fork(s, UINT32_MAX, &c), 0);
      decode(&f, c, 12, 8, &p, &rng);
      decode(&f, s, 12, 8, &p, &rng);
      kvt_gathered g[MAXB];
      assert_int_equal(retained(other, 0, g), 20); /* shared blocks stay for it */
      tu_assert_gather(other, &f.sh, f.salt, f.tok, 20);
      if (budgets[j] < 0.5) assert_true(retained(s, 0, g) < 20);
      kvt_seq_release(c);
      kvt_seq_release(s);
      kvt_seq_release(other);
      fx_close(&f);
    }
}

/* Warm blocks count at their encoded size, so the same budget retains
 * more of them than of hot ones. */
static void test_warm_counts_encoded(void **state) {
  (void)state;
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = 1; /* every put is encoded into warm */
  o.tier_bytes_limit[KVT_TIER_WARM] = 64u << 20;
  fx f;
  fx_open_with(&f, &o);
  assert_int_equal(kvt_ns_set_codec(f.e, f.ns, KVT_ALL_LAYERS, KVT_CODEC_K8, KVT_CODEC_V3), 0);
  kvt_policy p;
  kvt_policy_init(&p);
  p.scorer = KVT_SCORER_RECENT;
  p.budget = 0.25;
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
  assert_int_equal(kvt_seq_set_policy(s, &p), 0);
  for (uint32_t b = 0; b < 40; b++)
    tu_append_put(s, &f.sh, f.salt, f.tok + (size_t)b * f.sh.block_tokens, &f.kv);
  kvt_gathered g[MAXB];
  size_t n = retained(s, 0, g);
  assert_true(n > 10); /* hot at f16 would keep exactly 10 of 40 */
  for (size_t i = 0; i < n; i++) assert_int_equal(g[i].tier, KVT_TIER_WARM);
  kvt_policy_info pi;
  assert_int_equal(kvt_seq_policy_info(s, 0, &pi), 0);
  assert_int_equal(pi.kept_bytes,
                   kept_bytes(&f, s, 0, 40ull * f.sh.block_tokens, KVT_CODEC_K8, KVT_CODEC_V3));
  assert_true(pi.kept_bytes <= pi.budget_bytes);
  assert_false(pi.over);
  kvt_seq_release(s);
  fx_close(&f);
}

/* The observation-based scorers keep what their rule names. */
static void test_scorers_rank(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  struct {
    uint32_t scorer;
    uint32_t keep[2]; /* the two blocks of 8 that stay at a budget of 2 */
  } cases[] = {
      {KVT_SCORER_TOVA, {2, 6}},     /* the last observation's heaviest */
      {KVT_SCORER_H2O, {1, 4}},      /* the most accumulated */
      /* the best mean over the window, max-pooled over a block each side
       * (4-token blocks): 0, 1 and 2 all score block 1's 3; ties go to
       * the newer */
      {KVT_SCORER_SNAPKV, {1, 2}},
      {KVT_SCORER_EXTERNAL, {0, 7}}, /* the caller's hints */
  };
  /* two observations: blocks 1 and 4 heavy first, then 2 and 6 */
  float m1[8] = {0, 5, 0, 0, 4, 0, 0, 0}, m2[8] = {0, 1, 3, 0, 1, 0, 2, 0};
  float hints[8] = {9, 0, 0, 0, 0, 0, 0, 8};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
    kvt_policy p;
    kvt_policy_init(&p);
    p.scorer = cases[c].scorer; /* budget 1: observes (private state), keeps all */
    assert_int_equal(kvt_seq_set_policy(s, &p), 0);
    for (uint32_t b = 0; b < 8; b++)
      tu_append_put(s, &f.sh, f.salt, f.tok + (size_t)b * f.sh.block_tokens, &f.kv);
    for (uint32_t l = 0; l < f.sh.n_layers; l++) {
      assert_int_equal(kvt_seq_observe(s, l, m1, 8), 0);
      assert_int_equal(kvt_seq_observe(s, l, m2, 8), 0);
      assert_int_equal(kvt_seq_hint(s, l, hints, 8), 0);
    }
    p.budget = 0.25;
    assert_int_equal(kvt_seq_set_policy(s, &p), 0);
    for (uint32_t l = 0; l < f.sh.n_layers; l++) {
      kvt_gathered g[MAXB];
      assert_int_equal(retained(s, l, g), 2);
      assert_int_equal(g[0].block, cases[c].keep[0]);
      assert_int_equal(g[1].block, cases[c].keep[1]);
    }
    kvt_seq_release(s);
  }
  fx_close(&f);
}

/* A block in its scoring delay is not evicted, whatever it scores. */
static void test_delay_protects(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  kvt_policy p;
  kvt_policy_init(&p);
  p.scorer = KVT_SCORER_H2O;
  p.budget = 0.3;
  p.delay = 3;
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
  assert_int_equal(kvt_seq_set_policy(s, &p), 0);
  for (uint32_t b = 0; b < 10; b++)
    tu_append_put(s, &f.sh, f.salt, f.tok + (size_t)b * f.sh.block_tokens, &f.kv);
  kvt_gathered g[MAXB];
  assert_int_equal(retained(s, 0, g), 10); /* nothing observed: all in their delay */
  kvt_policy_info pi;
  assert_int_equal(kvt_seq_policy_info(s, 0, &pi), 0);
  assert_true(pi.over);
  float m[10];
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < 10; i++) m[i] = (float)i; /* the older, the lighter */
    assert_int_equal(kvt_seq_observe(s, 0, m, 10 - 0), 0);
  }
  /* after the third observation they may go: 3 of 10 fit */
  assert_int_equal(retained(s, 0, g), 3);
  assert_int_equal(g[0].block, 7);
  assert_int_equal(retained(s, 1, g), 10); /* layer 1 never observed */
  kvt_seq_release(s);
  fx_close(&f);
}

static void test_bad_arguments(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
  for (uint32_t b = 0; b < 3; b++)
    tu_append_put(s, &f.sh, f.salt, f.tok + (size_t)b * f.sh.block_tokens, &f.kv);
  uint32_t bt = f.sh.block_tokens;
  assert_int_equal(kvt_seq_set_tokens(s, 3 * bt - 1), KVT_ECOUNT);
  assert_int_equal(kvt_seq_set_tokens(s, 4 * bt + 1), KVT_ECOUNT);
  assert_int_equal(kvt_seq_set_tokens(s, 4 * bt), 0);
  assert_int_equal(kvt_seq_set_tokens(NULL, 4), KVT_ENULL);
  float h[3] = {1, 2, 3};
  assert_int_equal(kvt_seq_hint(s, 0, h, 2), KVT_ECOUNT);
  assert_int_equal(kvt_seq_hint(s, f.sh.n_layers, h, 3), KVT_ENOTFOUND);
  h[1] = NAN;
  assert_int_equal(kvt_seq_hint(s, 0, h, 3), KVT_EOPTION);
  kvt_policy_info pi;
  assert_int_equal(kvt_seq_policy_info(s, f.sh.n_layers, &pi), KVT_ENOTFOUND);
  assert_int_equal(kvt_seq_policy_info(s, 0, NULL), KVT_ENULL);
  assert_int_equal(kvt_seq_policy_info(s, 0, &pi), 0); /* "full": everything, in budget */
  assert_int_equal(pi.kept_bytes, pi.full_bytes);
  assert_false(pi.over);
  kvt_policy p;
  kvt_policy_init(&p);
  p.scorer = KVT_SCORER_LEARNED;
  p.budget = 0.5;
  assert_int_equal(kvt_seq_set_policy(s, &p), KVT_EOPTION); /* no predictor loaded */
  assert_int_equal(kvt_ns_load_predictor(f.e, f.ns, NULL), KVT_ENULL);
  assert_int_equal(kvt_ns_load_profile(f.e, f.ns, NULL), KVT_ENULL);
  kvt_seq_release(s);
  fx_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_budget_every_step_every_scorer),
      cmocka_unit_test(test_warm_counts_encoded),
      cmocka_unit_test(test_scorers_rank),
      cmocka_unit_test(test_delay_protects),
      cmocka_unit_test(test_bad_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
