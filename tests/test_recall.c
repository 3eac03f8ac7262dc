/* test_recall.c - recall from disk (docs/policy.md, "Recall"): a block the
 * policy evicted comes back from the cold tier, bit-exact, when a query
 * drifts to its keys; a block whose sketch bound cannot beat the weakest
 * retained block stays out; budgets hold after recall; and without a cold
 * copy nothing is recalled (counted as unavailable). */
#include <math.h>

#include "recall_fx.h"

/* A sequence of BLOCKS blocks under "recent" at budget 0.5 with recall on;
 * with a cold tier (durable after a sync) and a hot tier that holds the
 * retained blocks and one more, so what the policy evicted leaves RAM. */
static void fx_open_warm(fx *f, int cold, float hi, double warm) {
  f->dir = tu_tmpdir();
  f->sh = tu_shape_small(KVT_F32);
  f->hi = hi;
  kvt_options o;
  if (cold) cu_opts(&o, KVT_BACKEND_PREAD);
  else tu_opts(&o);
  size_t bb = kvt_shape_block_bytes(&f->sh);
  o.tier_bytes_limit[KVT_TIER_HOT] = (f->sh.n_layers * BLOCKS / 2 + 1) * (2 * bb + 256);
  if (warm > 0) o.tier_bytes_limit[KVT_TIER_WARM] = 16u << 20;
  f->e = tu_open(f->dir, &o);
  kvt_ns_id ns = tu_register(f->e, "m", &f->sh);
  assert_int_equal(kvt_seq_create(f->e, ns, &f->s), 0);
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(kvt_policy_parse("recent", &p.scorer), 0);
  p.budget = 0.5;
  p.recall = 1;
  p.warm = warm;
  if (warm == 0) assert_int_equal(kvt_seq_set_policy(f->s, &p), 0);
  fx_write_blocks(f, hi);
  if (cold) assert_int_equal(kvt_sync(f->e), 0);
  /* With a warm share, the policy comes once every block is written: the
   * oldest are demoted first and then leave, their warm copies kept in RAM. */
  if (warm > 0) assert_int_equal(kvt_seq_set_policy(f->s, &p), 0);
}

static void fx_open(fx *f, int cold, float hi) { fx_open_warm(f, cold, hi, 0); }

/* The retained blocks of layer 0, as a bit mask. */
static uint32_t retained_mask(fx *f) {
  kvt_gathered g[BLOCKS];
  size_t n = 0;
  assert_int_equal(kvt_seq_retained(f->s, 0, g, BLOCKS, &n), 0);
  uint32_t m = 0;
  for (size_t i = 0; i < n; i++) m |= 1u << g[i].block;
  return m;
}

static void assert_budgets(fx *f) {
  for (uint32_t l = 0; l < f->sh.n_layers; l++) {
    kvt_policy_info pi;
    assert_int_equal(kvt_seq_policy_info(f->s, l, &pi), 0);
    assert_true(pi.kept_bytes <= pi.budget_bytes);
    assert_int_equal(pi.over, 0);
  }
}

/* Layer 0 gathered: block TARGET's bytes are exactly what was put. */
static void assert_target_exact(fx *f) {
  size_t each = f->kv.bytes, bytes = BLOCKS * each, n = 0;
  uint8_t *k = malloc(bytes), *v = malloc(bytes);
  kvt_gathered g[BLOCKS];
  assert_non_null(k);
  assert_non_null(v);
  assert_int_equal(kvt_seq_gather(f->s, 0, k, v, &bytes, g, BLOCKS, &n), 0);
  fill(&f->kv, &f->sh, TARGET, 0, f->hi);
  size_t i = 0;
  while (i < n && g[i].block != TARGET) i++;
  assert_true(i < n);
  assert_int_equal(g[i].tier, KVT_TIER_HOT);
  assert_int_equal(g[i].exact, 1);
  assert_memory_equal(k + i * each, f->kv.k, each);
  assert_memory_equal(v + i * each, f->kv.v, each);
  free(k);
  free(v);
}

/* The query drifts to an evicted block whose keys match it: its sketch
 * bound beats the weakest retained block, it is read back from the cold
 * tier during the step, attention runs over it bit-exact, it mattered,
 * and the weakest left so the budget holds. */
static void test_drift_recalls_exact(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 1, 8.0f);
  assert_int_equal(retained_mask(&f), 0xf0u); /* the newest half */
  kvt_stats st0, st;
  tu_stats(f.e, &st0);
  assert_true(st0.sketch_bytes > 0);
  assert_int_equal(step(&f), BLOCKS / 2);
  tu_stats(f.e, &st);
  assert_int_equal(st.recalls, 1);
  assert_int_equal(st.recall_unavailable, 0);
  assert_int_equal(step(&f), BLOCKS / 2); /* installs it, evicts the weakest, attends */
  assert_int_equal(retained_mask(&f), (1u << TARGET) | 0xe0u);
  tu_stats(f.e, &st);
  assert_int_equal(st.recalls, 1); /* once back, nothing else beats the weakest */
  assert_int_equal(st.recall_useful, 1);
  assert_int_equal(st.recall_bytes, 2 * f.kv.bytes); /* read from disk, not found in RAM */
  assert_true(st.cold_reads > st0.cold_reads);
  assert_target_exact(&f);
  assert_budgets(&f);
  fx_close(&f);
}

/* With a warm share, the evicted target's layer block is still in the warm
 * tier, unreferenced, when the query drifts to it: recall re-references
 * that copy instead of reading the disk, and then makes it hot with the
 * exact bytes from the cold tier (it used to stay warm, approximate). The
 * scorer ("recent") may demote it again once observed: that is ranking. */
static void test_recall_warm_copy_exact(void **state) {
  (void)state;
  fx f;
  fx_open_warm(&f, 1, 8.0f, 0.5);
  assert_true((retained_mask(&f) & (1u << TARGET)) == 0);
  kvt_policy_info pi0, pi;
  assert_int_equal(kvt_seq_policy_info(f.s, 0, &pi0), 0);
  assert_true(pi0.warm_tokens > 0);
  step(&f); /* decides the recall; the copy is in RAM, retained at once */
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_true(st.recalls >= 1);
  assert_true(retained_mask(&f) & (1u << TARGET));
  assert_target_exact(&f);
  assert_int_equal(kvt_seq_policy_info(f.s, 0, &pi), 0);
  assert_true(pi.promotions_exact > pi0.promotions_exact);
  assert_budgets(&f);
  fx_close(&f);
}

/* The evicted block's keys only weakly match the query: its bound stays
 * below every retained block's mass; nothing is read. */
static void test_weak_bound_not_recalled(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 1, 0.25f);
  kvt_stats st0, st;
  tu_stats(f.e, &st0);
  for (int i = 0; i < 3; i++) assert_int_equal(step(&f), BLOCKS / 2);
  tu_stats(f.e, &st);
  assert_int_equal(st.recalls, 0);
  assert_int_equal(st.recall_unavailable, 0);
  assert_int_equal(st.cold_reads, st0.cold_reads);
  assert_int_equal(retained_mask(&f), 0xf0u);
  assert_budgets(&f);
  fx_close(&f);
}

/* Recall while the sequence grows: every layer's budget holds at every
 * step, the recalled block in it. */
static void test_budgets_hold(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 1, 8.0f);
  for (int i = 0; i < 4; i++) {
    step(&f);
    assert_budgets(&f);
  }
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.recalls, 1);
  assert_true(retained_mask(&f) & (1u << TARGET));
  /* a new block: the budget grows by half a block, the recalled one is
   * still retained by nothing but the scorer now */
  uint32_t toks[16];
  for (uint32_t t = 0; t < f.sh.block_tokens; t++) toks[t] = 999 + t;
  assert_int_equal(kvt_seq_append(f.s, toks, f.sh.block_tokens, NULL), 0);
  for (uint32_t l = 0; l < f.sh.n_layers; l++) {
    fill(&f.kv, &f.sh, BLOCKS, l, f.hi);
    assert_int_equal(kvt_seq_put(f.s, BLOCKS, l, &f.kv.kv), 0);
  }
  assert_budgets(&f);
  step(&f);
  assert_budgets(&f);
  fx_close(&f);
}

/* No cold tier: the bound wins but there is nothing exact to read; the
 * block stays out and the attempt is counted. */
static void test_no_cold_copy(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0, 8.0f);
  for (int i = 0; i < 2; i++) assert_int_equal(step(&f), BLOCKS / 2);
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.recalls, 0);
  assert_true(st.recall_unavailable >= 1);
  assert_int_equal(st.recall_bytes, 0);
  assert_int_equal(retained_mask(&f), 0xf0u);
  assert_budgets(&f);
  fx_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_drift_recalls_exact),
      cmocka_unit_test(test_recall_warm_copy_exact),
      cmocka_unit_test(test_weak_bound_not_recalled),
      cmocka_unit_test(test_budgets_hold),
      cmocka_unit_test(test_no_cold_copy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
