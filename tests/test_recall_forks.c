/* test_recall_forks.c - budgets hold under forks and shared blocks while
 * blocks move between all three tiers: a parent and a fork share a prefix
 * of 1-token blocks, both with a warm share and recall on, in an engine
 * whose hot tier is small (blocks leave RAM for the cold tier and come
 * back by recall and attention); after every observation every layer of
 * both sequences keeps at most its budget, counted by the policy. */
#include <math.h>

#include "recall_fx.h"

#define STEPS 80u
#define FORK_AT 40u

typedef struct seqst {
  kvt_seq *s;
  float *keys; /* [STEPS][L][HD] */
  uint32_t n;  /* blocks */
} seqst;

static const kvt_shape SH = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 16, .dtype = KVT_F32,
                             .block_tokens = 1};

static void grow(seqst *q, uint32_t tok, uint64_t *x) {
  uint32_t HD = SH.n_kv_heads * SH.head_dim;
  float v[64];
  assert_int_equal(kvt_seq_append(q->s, &tok, 1, NULL), 0);
  for (uint32_t l = 0; l < SH.n_layers; l++) {
    float *k = q->keys + ((size_t)q->n * SH.n_layers + l) * HD;
    for (uint32_t i = 0; i < HD; i++) {
      k[i] = 2.0f * dr_rnd_f(x);
      v[i] = dr_rnd_f(x);
    }
    kvt_kv kv = {.k = k, .v = v, .dtype = KVT_F32, .n_tokens = 1, .n_heads = SH.n_kv_heads,
                 .head_dim = SH.head_dim};
    assert_int_equal(kvt_seq_put(q->s, q->n, l, &kv), 0);
  }
  q->n++;
  assert_int_equal(kvt_seq_set_tokens(q->s, q->n), 0);
}

/* One step of every layer: a query that every few steps drifts back to an
 * older token's key, attention, observation; then the budgets. */
static void fork_step(seqst *q, uint32_t t, uint64_t *x, uint64_t *over) {
  uint32_t HD = SH.n_kv_heads * SH.head_dim, H = SH.n_kv_heads * QH_PER_KV, D = SH.head_dim;
  float qv[8 * 16], out[8 * 16], lse[8], mass[STEPS];
  uint32_t back = q->n > 8 && t % 3 == 0 ? (uint32_t)(dr_rnd(x) % (q->n - 4)) : q->n;
  for (uint32_t l = 0; l < SH.n_layers; l++) {
    const float *kb = back < q->n ? q->keys + ((size_t)back * SH.n_layers + l) * HD : NULL;
    for (uint32_t h = 0; h < H; h++)
      for (uint32_t d = 0; d < D; d++)
        qv[h * D + d] = (kb ? 4.0f * kb[(h / QH_PER_KV) * D + d] : 0) + dr_rnd_f(x);
    size_t n = 0;
    assert_int_equal(kvt_seq_attend(q->s, l, qv, H, 0, out, lse, mass, STEPS, &n), 0);
    assert_int_equal(kvt_seq_observe(q->s, l, mass, n), 0);
  }
  for (uint32_t l = 0; l < SH.n_layers; l++) {
    kvt_policy_info pi;
    assert_int_equal(kvt_seq_policy_info(q->s, l, &pi), 0);
    *over += pi.over;
    assert_true(pi.kept_bytes <= pi.budget_bytes);
  }
}

static void test_forks_recall_budgets(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  /* the hot tier holds about a third of the layer blocks of both */
  o.tier_bytes_limit[KVT_TIER_HOT] = 60u * (2 * kvt_shape_block_bytes(&SH) + 256);
  o.tier_bytes_limit[KVT_TIER_WARM] = 16u << 20;
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "m", &SH);
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(kvt_policy_parse("snapkv", &p.scorer), 0);
  p.budget = 0.25;
  p.warm = 0.5;
  p.recall = 1;
  seqst a = {0}, b = {0};
  a.keys = calloc((size_t)STEPS * SH.n_layers * 32, sizeof(float));
  b.keys = calloc((size_t)STEPS * SH.n_layers * 32, sizeof(float));
  assert_non_null(a.keys);
  assert_non_null(b.keys);
  assert_int_equal(kvt_seq_create(e, ns, &a.s), 0);
  assert_int_equal(kvt_seq_set_policy(a.s, &p), 0);
  uint64_t x = 0x243f6a8885a308d3ull, over = 0;
  for (uint32_t t = 0; t < STEPS; t++) {
    if (t == FORK_AT) { /* the fork shares every block so far, and its keys */
      assert_int_equal(kvt_seq_fork(a.s, UINT32_MAX, &b.s), 0);
      p.budget = 0.3;
      assert_int_equal(kvt_seq_set_policy(b.s, &p), 0);
      memcpy(b.keys, a.keys, (size_t)a.n * SH.n_layers * 32 * sizeof(float));
      b.n = a.n;
    }
    grow(&a, 1000 + t, &x);
    fork_step(&a, t, &x, &over);
    if (b.s) {
      grow(&b, 5000 + t, &x); /* other tokens than the parent's */
      fork_step(&b, t, &x, &over);
    }
  }
  kvt_stats st;
  tu_stats(e, &st);
  fprintf(stderr, "recalls %llu, promotions %llu, demotions %llu, cold reads %llu, over %llu\n",
          (unsigned long long)st.recalls, (unsigned long long)st.promotions,
          (unsigned long long)st.demotions, (unsigned long long)st.cold_reads,
          (unsigned long long)over);
  assert_int_equal(over, 0);      /* never over: protected blocks fit */
  assert_true(st.recalls > 0);    /* blocks came back by recall, */
  assert_true(st.cold_reads > 0); /* read from the cold tier, */
  assert_true(st.demotions > 0);  /* and moved hot -> warm */
  assert_true(st.tier_bytes[KVT_TIER_HOT] <= o.tier_bytes_limit[KVT_TIER_HOT]);
  kvt_seq_release(b.s);
  kvt_seq_release(a.s);
  kvt_engine_close(e);
  free(a.keys);
  free(b.keys);
  tu_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forks_recall_budgets),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
