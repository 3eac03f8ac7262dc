/* test_fork.c - kvt_seq_fork shares, never copies: a fork adds sequence
 * state only, parent and child read the same bytes, each then grows on its
 * own, and either can outlive the other. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

typedef struct fx {
  char *dir;
  kvt_engine *e;
  kvt_shape sh;
  kvt_ns_id ns;
  uint64_t salt;
  uint64_t payload;
  tu_kv kv;
} fx;

static void fx_open(fx *f) {
  f->dir = tu_tmpdir();
  f->e = tu_open(f->dir, NULL);
  f->sh = tu_shape_small(KVT_BF16);
  f->ns = tu_register(f->e, "fork-model", &f->sh);
  f->salt = tu_salt("fork-model");
  f->payload = 2 * kvt_shape_block_bytes(&f->sh);
  tu_kv_alloc(&f->kv, &f->sh);
}

static void fx_close(fx *f) {
  kvt_stats st;
  tu_stats(f->e, &st);
  assert_int_equal(st.seqs, 0);
  assert_int_equal(st.logical_bytes, 0);
  tu_kv_free(&f->kv);
  kvt_engine_close(f->e);
  tu_rmtree(f->dir);
}

static void random_tokens(uint32_t *t, size_t n) {
  for (size_t i = 0; i < n; i++) t[i] = (uint32_t)tu_rand();
}

static kvt_seq *parent_of(fx *f, const uint32_t *tok, uint32_t nb) {
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(f->e, f->ns, &s), 0);
  for (uint32_t b = 0; b < nb; b++) tu_append_put(s, &f->sh, f->salt, tok + 4 * b, &f->kv);
  return s;
}

static kvt_seq *fork_of(kvt_seq *p, uint32_t n) {
  kvt_seq *c = NULL;
  assert_int_equal(kvt_seq_fork(p, n, &c), 0);
  assert_non_null(c);
  return c;
}

/* Forking adds a sequence and references; the tier is untouched. */
static void test_fork_copies_nothing(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  uint32_t tok[12];
  random_tokens(tok, 12);
  kvt_seq *p = parent_of(&f, tok, 3), *c;
  kvt_stats s0, s1;
  tu_stats(f.e, &s0);
  c = fork_of(p, UINT32_MAX);
  tu_stats(f.e, &s1);
  assert_int_equal(kvt_seq_blocks(c), 3);
  for (int t = 0; t < KVT_N_TIERS; t++) {
    assert_int_equal(s1.tier_bytes[t], s0.tier_bytes[t]);
    assert_int_equal(s1.tier_blocks[t], s0.tier_blocks[t]);
  }
  assert_int_equal(s1.index_bytes, s0.index_bytes);
  assert_int_equal(s1.puts, s0.puts);
  assert_true(s1.seq_bytes > s0.seq_bytes);
  assert_int_equal(s1.seqs, s0.seqs + 1);
  assert_int_equal(s1.logical_bytes, 2 * s0.logical_bytes);
  assert_int_equal(s1.dedup_saved_bytes, s0.logical_bytes);
  tu_assert_gather(p, &f.sh, f.salt, tok, 3);
  tu_assert_gather(c, &f.sh, f.salt, tok, 3);
  kvt_seq_release(c);
  kvt_seq_release(p);
  fx_close(&f);
}

/* After a fork, parent and child append different blocks. */
static void test_child_grows_alone(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  uint32_t tp[16], tc[16];
  random_tokens(tp, 16);
  memcpy(tc, tp, sizeof tc);
  random_tokens(tc + 8, 8);
  kvt_seq *p = parent_of(&f, tp, 2), *c = fork_of(p, UINT32_MAX);
  kvt_stats st;
  for (uint32_t b = 2; b < 4; b++) {
    assert_int_equal(tu_append_put(c, &f.sh, f.salt, tc + 4 * b, &f.kv), 0);
    assert_int_equal(kvt_seq_blocks(p), 2);
    tu_assert_gather(p, &f.sh, f.salt, tp, 2);
  }
  assert_int_equal(tu_append_put(p, &f.sh, f.salt, tp + 8, &f.kv), 0);
  assert_int_equal(kvt_seq_blocks(c), 4);
  assert_int_equal(kvt_seq_blocks(p), 3);
  tu_assert_gather(c, &f.sh, f.salt, tc, 4);
  tu_assert_gather(p, &f.sh, f.salt, tp, 3);
  tu_stats(f.e, &st);
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT], 5 * f.sh.n_layers);
  assert_int_equal(st.logical_bytes, 7 * f.sh.n_layers * f.payload);
  kvt_seq_release(p);
  kvt_seq_release(c);
  fx_close(&f);
}

/* A fork of the first n blocks sees only those; re-appending the parent's
 * next block adopts it, appending another stores anew. */
static void test_fork_prefix(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  uint32_t tok[16], other[4];
  random_tokens(tok, 16);
  random_tokens(other, 4);
  kvt_seq *p = parent_of(&f, tok, 4), *c1, *c0, *cn;
  kvt_stats s0, s1;
  tu_stats(f.e, &s0);
  c1 = fork_of(p, 1);
  c0 = fork_of(p, 0);
  cn = fork_of(p, 4);
  assert_int_equal(kvt_seq_blocks(c1), 1);
  assert_int_equal(kvt_seq_blocks(c0), 0);
  assert_int_equal(kvt_seq_blocks(cn), 4);
  tu_stats(f.e, &s1);
  assert_int_equal(s1.logical_bytes, s0.logical_bytes + 5 * f.sh.n_layers * f.payload);
  tu_assert_gather(c1, &f.sh, f.salt, tok, 1);
  tu_assert_gather(c0, &f.sh, f.salt, tok, 0);
  tu_assert_gather(cn, &f.sh, f.salt, tok, 4);
  assert_int_equal(tu_append_put(c1, &f.sh, f.salt, tok + 4, &f.kv), f.sh.n_layers);
  assert_int_equal(tu_append_put(c0, &f.sh, f.salt, other, &f.kv), 0);
  tu_stats(f.e, &s1);
  assert_int_equal(s1.tier_blocks[KVT_TIER_HOT], s0.tier_blocks[KVT_TIER_HOT] + f.sh.n_layers);
  tu_assert_gather(c1, &f.sh, f.salt, tok, 2);
  tu_assert_gather(c0, &f.sh, f.salt, other, 1);
  tu_assert_gather(p, &f.sh, f.salt, tok, 4);
  kvt_seq_release(c1);
  kvt_seq_release(c0);
  kvt_seq_release(cn);
  kvt_seq_release(p);
  fx_close(&f);
}

/* The child keeps the blocks readable after the parent is gone. */
static void test_release_parent(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  uint32_t tok[12];
  random_tokens(tok, 12);
  kvt_seq *p = parent_of(&f, tok, 3), *c = fork_of(p, 2);
  kvt_stats s0, s1;
  tu_stats(f.e, &s0);
  kvt_seq_release(p);
  tu_stats(f.e, &s1);
  assert_int_equal(s1.seqs, s0.seqs - 1);
  assert_int_equal(s1.logical_bytes, 2 * f.sh.n_layers * f.payload);
  assert_int_equal(s1.dedup_saved_bytes, 0);
  assert_true(s1.seq_bytes < s0.seq_bytes);
  tu_assert_gather(c, &f.sh, f.salt, tok, 2);
  for (uint32_t l = 0; l < f.sh.n_layers; l++) tu_assert_block(c, &f.sh, f.salt, 1, l, tok + 4);
  kvt_seq_release(c);
  fx_close(&f);
}

/* A layer the parent appended but never put is the child's to put; the
 * parent's later put of the same data then stores nothing new. */
static void test_fork_with_unput_layers(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  uint32_t tok[8];
  random_tokens(tok, 8);
  kvt_seq *p = parent_of(&f, tok, 1), *c;
  kvt_stats s0, s1;
  assert_int_equal(kvt_seq_append(p, tok + 4, 4, NULL), 0);
  c = fork_of(p, UINT32_MAX);
  assert_int_equal(kvt_seq_blocks(c), 2);
  for (uint32_t l = 0; l < f.sh.n_layers; l++) {
    tu_kv_fill(&f.kv, &f.sh, f.salt, l, 1, tok + 4);
    assert_int_equal(kvt_seq_put(c, 1, l, &f.kv.kv), 0);
  }
  tu_stats(f.e, &s0);
  for (uint32_t l = 0; l < f.sh.n_layers; l++) {
    tu_kv_fill(&f.kv, &f.sh, f.salt, l, 1, tok + 4);
    assert_int_equal(kvt_seq_put(p, 1, l, &f.kv.kv), 0);
  }
  tu_stats(f.e, &s1);
  assert_int_equal(s1.tier_blocks[KVT_TIER_HOT], s0.tier_blocks[KVT_TIER_HOT]);
  assert_int_equal(s1.tier_bytes[KVT_TIER_HOT], s0.tier_bytes[KVT_TIER_HOT]);
  assert_int_equal(s1.dedup_hits, s0.dedup_hits + f.sh.n_layers);
  tu_assert_gather(p, &f.sh, f.salt, tok, 2);
  tu_assert_gather(c, &f.sh, f.salt, tok, 2);
  kvt_seq_release(p);
  kvt_seq_release(c);
  fx_close(&f);
}

/* A chain of forks released in random order: each survivor reads exact. */
static void test_fork_chain(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  enum { N = 6 };
  uint32_t tok[4 * (N + 1)];
  kvt_seq *s[N];
  int alive[N];
  random_tokens(tok, sizeof tok / sizeof tok[0]);
  s[0] = parent_of(&f, tok, 1);
  for (int i = 1; i < N; i++) {
    s[i] = fork_of(s[i - 1], UINT32_MAX);
    tu_append_put(s[i], &f.sh, f.salt, tok + 4 * i, &f.kv);
  }
  for (int i = 0; i < N; i++) alive[i] = 1;
  for (int left = N; left > 0; left--) {
    int k = (int)tu_below(N);
    while (!alive[k]) k = (k + 1) % N;
    kvt_seq_release(s[k]);
    alive[k] = 0;
    for (int i = 0; i < N; i++)
      if (alive[i]) tu_assert_gather(s[i], &f.sh, f.salt, tok, (uint32_t)i + 1);
  }
  fx_close(&f);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fork_copies_nothing),
      cmocka_unit_test(test_child_grows_alone),
      cmocka_unit_test(test_fork_prefix),
      cmocka_unit_test(test_release_parent),
      cmocka_unit_test(test_fork_with_unput_layers),
      cmocka_unit_test(test_fork_chain),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
