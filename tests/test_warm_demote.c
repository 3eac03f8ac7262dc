/* test_warm_demote.c - the warm tier inside the engine, through the public
 * API: demotion of the least recently used hot blocks to warm, warm LRU drops and KVT_EFULL.
 * Shared helpers and the fixture: warm_util.h. */
#include "warm_util.h"

/* ------------------------------------------------ demotion order */

/* Tiers of the blocks of (s, layer 0) as a fork of s gathers them: a
 * sequence that reads warm blocks is lossy from then on and appends under
 * a lineage of its own (docs/policy.md), and the lookups below must reach
 * every block s appends. A fork's references change no recency. */
static void fork_tiers(fx *f, kvt_seq *s, const uint32_t *toks, uint32_t *tiers, size_t *n) {
  kvt_seq *r = NULL;
  assert_int_equal(kvt_seq_fork(s, UINT32_MAX, &r), 0);
  gather_tiers(f, r, 0, toks, KVT_CODEC_K8, KVT_CODEC_V3, tiers, n);
  kvt_seq_release(r);
}

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
    fork_tiers(&f, s, toks, tiers, &n);
    assert_int_equal(n, b + 1);
    for (uint32_t i = 0; i <= b; i++)
      assert_int_equal(tiers[i], i < n_warm ? KVT_TIER_WARM : KVT_TIER_HOT);
  }
  /* Hot now: 3, 4, 5, with 3 the least recent. Reading it is not enough to
   * keep it (whether or not reads refresh recency, the lookup below does)... */
  kvt_seq *rd = NULL; /* a reader, as in fork_tiers */
  assert_int_equal(kvt_seq_fork(s, UINT32_MAX, &rd), 0);
  for (int r = 0; r < 3; r++) read_check(&f, rd, 3, 0, toks + 12, KVT_CODEC_K8, KVT_CODEC_V3);
  kvt_seq_release(rd);
  /* ...a lookup hit refreshes the blocks it finds (kvt_lookup), in chain
   * order: 0, 1, 2 (warm), then 3: hot recency becomes 4, 5, 3. */
  kvt_lookup_entry ent[NB];
  size_t found;
  assert_int_equal(kvt_lookup(f.e, f.ns, toks, 4 * 4, ent, NB, &found), 0);
  assert_int_equal(found, 4);
  for (uint32_t i = 0; i < 4; i++) assert_int_equal(ent[i].tier, i < 3 ? KVT_TIER_WARM : KVT_TIER_HOT);
  append_put(&f, s, toks + 4 * 6);
  fork_tiers(&f, s, toks, tiers, &n);
  const uint32_t want7[] = {2, 2, 2, 1, 2, 1, 1};
  for (uint32_t i = 0; i < 7; i++) assert_int_equal(tiers[i], want7[i]);
  /* A lookup of blocks 0..6 touches them all in chain order: hot recency
   * becomes 3, 5, 6, so 3 goes next. */
  assert_int_equal(kvt_lookup(f.e, f.ns, toks, 4 * 7, NULL, 0, &found), 0);
  assert_int_equal(found, 7);
  append_put(&f, s, toks + 4 * 7);
  fork_tiers(&f, s, toks, tiers, &n);
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

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_demote_lru),
      cmocka_unit_test(test_warm_drops_lru),
      cmocka_unit_test(test_warm_full),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
