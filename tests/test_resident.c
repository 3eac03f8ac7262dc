/* test_resident.c - answers that used to be silently wrong: attention and
 * gathers over fewer blocks than the sequence references (blocks only in
 * the cold tier), kvt_sync() saying durable when a block never reached the
 * cold tier, KVT_EFULL with an empty warm tier, and a cold-tier error that
 * kvt_sync() reported once and then forgot. */
#include "cold_util.h"

#define BLOCKS 8u

/* Token ids of block b (block_tokens of them), distinct per (salt, b). */
static void block_tokens_of(const kvt_shape *sh, uint32_t salt, uint32_t b, uint32_t *tok) {
  for (uint32_t t = 0; t < sh->block_tokens; t++) tok[t] = salt * 100000u + b * 100u + t + 1;
}

static void fill_tokens(const kvt_shape *sh, uint32_t salt, uint32_t n, uint32_t *toks) {
  for (uint32_t b = 0; b < n; b++)
    block_tokens_of(sh, salt, b, toks + (size_t)b * sh->block_tokens);
}

/* Build n blocks of toks into s, every layer put. */
static void build(kvt_seq *s, const kvt_shape *sh, uint64_t salt, const uint32_t *toks,
                  uint32_t n) {
  tu_kv kv;
  tu_kv_alloc(&kv, sh);
  for (uint32_t b = 0; b < n; b++)
    tu_append_put(s, sh, salt, toks + (size_t)b * sh->block_tokens, &kv);
  tu_kv_free(&kv);
}

/* Every call that runs over the retained blocks of (s, layer) refuses with
 * KVT_ENOTRESIDENT and says how many blocks are not in RAM. */
static void assert_not_resident(kvt_seq *s, const kvt_shape *sh, uint32_t layer, size_t away) {
  size_t bb = kvt_shape_block_bytes(sh), n = 0, bytes = 0;
  uint8_t *k = malloc(bb * BLOCKS), *v = malloc(bb * BLOCKS);
  kvt_gathered g[BLOCKS];
  assert_true(k && v);
  assert_int_equal(kvt_seq_gather(s, layer, NULL, NULL, &bytes, NULL, 0, &n), KVT_ENOTRESIDENT);
  assert_int_equal(n, away);
  bytes = bb * BLOCKS;
  n = 0;
  assert_int_equal(kvt_seq_gather(s, layer, k, v, &bytes, g, BLOCKS, &n), KVT_ENOTRESIDENT);
  assert_int_equal(n, away);
  uint32_t H = sh->n_kv_heads, D = sh->head_dim;
  float q[64 * 4], out[64 * 4], mass[BLOCKS];
  for (uint32_t i = 0; i < H * D; i++) q[i] = 0.01f * (float)i;
  n = 0;
  assert_int_equal(kvt_seq_attend(s, layer, q, H, 0, out, NULL, mass, BLOCKS, &n),
                   KVT_ENOTRESIDENT);
  assert_int_equal(n, away);
  n = 0;
  memset(g, 0xff, sizeof g);
  assert_int_equal(kvt_seq_retained(s, layer, g, BLOCKS, &n), KVT_ENOTRESIDENT);
  assert_int_equal(n, away);
  for (size_t i = 0; i < away; i++) { /* the blocks to load, in order */
    assert_int_equal(g[i].tier, KVT_TIER_COLD);
    assert_int_equal(g[i].exact, 0);
    assert_true(i == 0 || g[i].block > g[i - 1].block);
  }
  free(k);
  free(v);
}

/* Attention over (s, layer) succeeds over exactly n blocks. */
static void assert_attends(kvt_seq *s, const kvt_shape *sh, uint32_t layer, size_t want) {
  uint32_t H = sh->n_kv_heads, D = sh->head_dim;
  float q[64 * 4], out[64 * 4], mass[BLOCKS];
  for (uint32_t i = 0; i < H * D; i++) q[i] = 0.01f * (float)i;
  size_t n = 0;
  assert_int_equal(kvt_seq_attend(s, layer, q, H, 0, out, NULL, mass, BLOCKS, &n), 0);
  assert_int_equal(n, want);
  n = 0;
  assert_int_equal(kvt_seq_retained(s, layer, NULL, 0, &n), 0);
  assert_int_equal(n, want);
}

/* Item 1a: a second process appends blocks it found stored, without
 * loading them: they are referenced, durable and not in RAM. */
static void test_second_process_not_resident(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  kvt_shape sh = tu_shape_small(KVT_F16);
  uint64_t salt = tu_salt("m");
  uint32_t toks[BLOCKS * 4];
  fill_tokens(&sh, 1, BLOCKS, toks);

  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "m", &sh);
  kvt_seq *s = NULL;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  build(s, &sh, salt, toks, BLOCKS);
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(s), BLOCKS);
  kvt_seq_release(s);
  kvt_engine_close(e);

  e = tu_open(dir, &o);
  ns = tu_register(e, "m", &sh);
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  for (uint32_t b = 0; b < BLOCKS; b++) {
    kvt_append_info info;
    assert_int_equal(kvt_seq_append(s, toks + b * sh.block_tokens, sh.block_tokens, &info), 0);
    assert_int_equal(info.durable, 1);
    assert_int_equal(info.layers_present, 0);
  }
  assert_not_resident(s, &sh, 0, BLOCKS);
  /* Loading and putting layer 0 of the first half leaves the rest out. */
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  for (uint32_t b = 0; b < BLOCKS / 2; b++) {
    tu_kv_fill(&kv, &sh, salt, 0, b, toks + b * sh.block_tokens);
    assert_int_equal(kvt_seq_put(s, b, 0, &kv.kv), 0);
  }
  assert_not_resident(s, &sh, 0, BLOCKS / 2);
  assert_not_resident(s, &sh, 1, BLOCKS);
  for (uint32_t b = 0; b < BLOCKS; b++)
    for (uint32_t l = 0; l < sh.n_layers; l++) {
      tu_kv_fill(&kv, &sh, salt, l, b, toks + b * sh.block_tokens);
      assert_int_equal(kvt_seq_put(s, b, l, &kv.kv), 0);
    }
  tu_kv_free(&kv);
  tu_assert_gather(s, &sh, salt, toks, BLOCKS);
  assert_attends(s, &sh, 0, BLOCKS);
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* Item 1b: one process, a cold tier and a hot tier of a few blocks: blocks
 * leave RAM once written. Attention refuses; reading a block back (from
 * the cold tier) and putting it gives it a RAM copy again. */
static void test_small_hot_not_resident(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  kvt_shape sh = tu_shape_small(KVT_F16);
  size_t bb = kvt_shape_block_bytes(&sh);
  o.tier_bytes_limit[KVT_TIER_HOT] = (BLOCKS + 2) * (2 * bb + 256); /* 10 of 32 layer blocks */
  uint64_t salt = tu_salt("m");
  uint32_t toks[BLOCKS * 4];
  fill_tokens(&sh, 2, BLOCKS, toks);
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "m", &sh);
  kvt_seq *s = NULL;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  build(s, &sh, salt, toks, BLOCKS);
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(s), BLOCKS);
  kvt_gathered g[BLOCKS];
  size_t away = 0;
  assert_int_equal(kvt_seq_retained(s, 0, g, BLOCKS, &away), KVT_ENOTRESIDENT);
  assert_true(away > 0 && away <= BLOCKS);
  assert_not_resident(s, &sh, 0, away);
  /* What a caller does: read what is away, put it. A put may push out an
   * older block of the layer, so again until none is away: the hot tier
   * holds the layer (10 blocks), so each round leaves fewer away. */
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  int rc = KVT_ENOTRESIDENT;
  for (int round = 0; rc == KVT_ENOTRESIDENT && round < (int)BLOCKS; round++) {
    for (size_t i = 0; i < away; i++) {
      assert_int_equal(kvt_seq_read(s, g[i].block, 0, kv.k, kv.v, kv.bytes), 0);
      assert_int_equal(kvt_seq_put(s, g[i].block, 0, &kv.kv), 0);
    }
    rc = kvt_seq_retained(s, 0, g, BLOCKS, &away);
  }
  assert_int_equal(rc, 0);
  tu_kv_free(&kv);
  assert_attends(s, &sh, 0, BLOCKS);
  for (uint32_t b = 0; b < BLOCKS; b++)
    tu_assert_block(s, &sh, salt, b, 0, toks + b * sh.block_tokens);
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* What a policy evicts on purpose is not an error, even once the token
 * block is durable. */
static void test_policy_left_is_no_error(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  kvt_shape sh = tu_shape_small(KVT_F16);
  uint64_t salt = tu_salt("m");
  uint32_t toks[BLOCKS * 4];
  fill_tokens(&sh, 3, BLOCKS, toks);
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "m", &sh);
  kvt_seq *s = NULL;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  kvt_policy p;
  kvt_policy_init(&p);
  p.scorer = KVT_SCORER_RECENT;
  p.budget = 0.5;
  assert_int_equal(kvt_seq_set_policy(s, &p), 0);
  build(s, &sh, salt, toks, BLOCKS);
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(s), BLOCKS);
  for (uint32_t l = 0; l < sh.n_layers; l++) assert_attends(s, &sh, l, BLOCKS / 2);
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* Item 3: a hot tier of a few layer blocks (or none), a warm tier and a
 * cold tier: every put succeeds while the warm tier has room (blocks held
 * for the cold tier are waited for when written soon, else demoted).
 * kvt_sync then says durable only when every block is. Returns its code. */
static int puts_with_warm(uint64_t hot, uint32_t n_layers) {
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  o.tier_bytes_limit[KVT_TIER_HOT] = hot;
  o.tier_bytes_limit[KVT_TIER_WARM] = 64ull << 20;
  o.tier_bytes_limit[KVT_TIER_COLD] = 64ull << 20;
  kvt_shape sh = {.n_layers = n_layers, .n_kv_heads = 8, .head_dim = 64, .dtype = KVT_F16,
                  .block_tokens = 16}; /* 32 KiB a layer block */
  uint64_t salt = tu_salt("w");
  uint32_t toks[BLOCKS * 16];
  fill_tokens(&sh, 4, BLOCKS, toks);
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "w", &sh);
  kvt_seq *s = NULL;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  for (uint32_t b = 0; b < BLOCKS; b++) {
    assert_int_equal(kvt_seq_append(s, toks + b * sh.block_tokens, sh.block_tokens, NULL), 0);
    for (uint32_t l = 0; l < sh.n_layers; l++) {
      tu_kv_fill(&kv, &sh, salt, l, b, toks + b * sh.block_tokens);
      int rc = kvt_seq_put(s, b, l, &kv.kv);
      if (rc) fprintf(stderr, "hot %llu: put of block %u, layer %u: %s\n",
                      (unsigned long long)hot, b, l, kvt_strerror(rc));
      assert_int_equal(rc, 0);
    }
  }
  tu_kv_free(&kv);
  int rc = kvt_sync(e);
  uint32_t durable = kvt_seq_durable(s);
  if (rc == 0) assert_int_equal(durable, BLOCKS);
  else assert_true(rc == KVT_ENOTDURABLE && durable < BLOCKS);
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_rmtree(dir);
  return rc;
}

static void test_efull_with_warm_room(void **state) {
  (void)state;
  const uint64_t hots[] = {32u << 10, 64u << 10, 128u << 10, 256u << 10, 1u << 20};
  for (size_t i = 0; i < sizeof hots / sizeof hots[0]; i++) {
    puts_with_warm(hots[i], 16); /* a token block of 16 layers: 512 KiB */
    int rc = puts_with_warm(hots[i], 4);
    if (hots[i] >= (256u << 10)) assert_int_equal(rc, 0); /* 4 layers fit: all durable */
  }
}

/* Item 2: a hot tier below one layer block, so blocks are born warm and
 * no exact copy exists to write: kvt_sync says so (every time, while they
 * are referenced), the watermark stays at 0, and a second process finds
 * nothing. */
static void test_born_warm_not_durable(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  o.tier_bytes_limit[KVT_TIER_HOT] = 1;
  o.tier_bytes_limit[KVT_TIER_WARM] = 64ull << 20;
  kvt_shape sh = tu_shape_small(KVT_F16);
  uint64_t salt = tu_salt("m");
  uint32_t toks[BLOCKS * 4];
  fill_tokens(&sh, 5, BLOCKS, toks);
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "m", &sh);
  kvt_seq *s = NULL;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  build(s, &sh, salt, toks, BLOCKS);
  assert_int_equal(kvt_sync(e), KVT_ENOTDURABLE);
  assert_int_equal(kvt_sync(e), KVT_ENOTDURABLE);
  assert_int_equal(kvt_seq_durable(s), 0);
  kvt_seq_release(s);
  assert_int_equal(kvt_sync(e), 0); /* nothing referenced is left undurable */
  kvt_engine_close(e);
  e = tu_open(dir, &o);
  ns = tu_register(e, "m", &sh);
  size_t found = 1;
  assert_int_equal(kvt_lookup(e, ns, toks, BLOCKS * sh.block_tokens, NULL, 0, &found), 0);
  assert_int_equal(found, 0);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* Item 4: a cold tier too small for a sequence: kvt_sync reports
 * KVT_EFULL every time while the sequence is not durable, and 0 once the
 * sequence that cannot be written is released. */
static void test_cold_full_stays_reported(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  o.tier_bytes_limit[KVT_TIER_COLD] = 3 * o.cold_segment_bytes;
  kvt_shape sh = tu_shape_small(KVT_BF16);
  uint64_t salt = tu_salt("full");
  const uint32_t na = 150; /* records of ~20 KiB: ~100 fit in two segments */
  uint32_t *toks = malloc(na * sh.block_tokens * sizeof *toks);
  assert_non_null(toks);
  fill_tokens(&sh, 6, na, toks);
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "full", &sh);
  kvt_seq *s = NULL;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  build(s, &sh, salt, toks, na);
  assert_int_equal(kvt_sync(e), KVT_EFULL);
  assert_true(kvt_seq_durable(s) < na);
  assert_int_equal(kvt_sync(e), KVT_EFULL); /* not forgotten */
  assert_int_equal(kvt_sync(e), KVT_EFULL);
  kvt_seq_release(s);
  assert_int_equal(kvt_sync(e), 0);
  kvt_engine_close(e);
  free(toks);
  tu_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_second_process_not_resident),
      cmocka_unit_test(test_small_hot_not_resident),
      cmocka_unit_test(test_policy_left_is_no_error),
      cmocka_unit_test(test_efull_with_warm_room),
      cmocka_unit_test(test_born_warm_not_durable),
      cmocka_unit_test(test_cold_full_stays_reported),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
