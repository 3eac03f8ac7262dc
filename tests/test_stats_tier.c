/* test_stats_tier.c - kvt_stats_tier(): a tier's counters by its id agree
 * with kvt_stats for hot, warm and the durable store (disk and metadata),
 * a short struct is filled only up to the size passed, and an id the
 * library does not know, or a size below the filled field, is refused
 * with nothing written. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cold_util.h"

static void put_blocks(kvt_engine *e, uint32_t n) {
  kvt_shape sh = tu_shape_small(KVT_F32);
  kvt_ns_desc d = tu_desc("stats-tier", &sh);
  kvt_ns_id ns;
  assert_int_equal(kvt_ns_register(e, &d, &ns), 0);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  for (uint32_t b = 0; b < n; b++) {
    uint32_t tok[4] = {10 + 4 * b, 11 + 4 * b, 12 + 4 * b, 13 + 4 * b};
    assert_int_equal(cu_append_put(s, &sh, 7, tok, &kv, NULL), 0);
  }
  assert_int_equal(kvt_sync(e), 0);
  tu_kv_free(&kv);
  kvt_seq_release(s);
}

static void test_ram_tiers(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_WARM] = 1u << 20;
  kvt_engine *e = tu_open(dir, &o);
  put_blocks(e, 3);
  kvt_stats st;
  assert_int_equal(kvt_stats_get(e, &st), 0);
  kvt_tier_stats t;
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_HOT, &t, sizeof t), 0);
  assert_int_equal(t.filled, sizeof t);
  assert_int_equal(t.tier, KVT_TIER_HOT);
  assert_int_equal(t.present, 1);
  assert_string_equal(t.name, "hot");
  assert_true(t.blocks > 0);
  assert_int_equal(t.blocks, st.tier_blocks[KVT_TIER_HOT]);
  assert_int_equal(t.bytes, st.tier_bytes[KVT_TIER_HOT]);
  assert_int_equal(t.limit, st.tier_limit[KVT_TIER_HOT]);
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_WARM, &t, sizeof t), 0);
  assert_string_equal(t.name, "warm");
  assert_int_equal(t.present, 1);
  assert_int_equal(t.limit, 1u << 20);
  /* No durable tier: known, not present, all zero. */
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_COLD, &t, sizeof t), 0);
  assert_int_equal(t.present, 0);
  assert_int_equal(t.blocks, 0);
  assert_string_equal(t.name, "");
  kvt_engine_close(e);
  tu_rmtree(dir);
}

static void test_store_tier(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  kvt_engine *e = tu_open(dir, &o);
  put_blocks(e, 3);
  kvt_stats st;
  assert_int_equal(kvt_stats_get(e, &st), 0);
  kvt_tier_stats t;
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_COLD, &t, sizeof t), 0);
  assert_int_equal(t.present, 1);
  assert_string_equal(t.name, "disk");
  assert_int_equal(t.blocks, 3);
  assert_int_equal(t.blocks, st.cold_records);
  assert_int_equal(t.bytes, st.tier_bytes[KVT_TIER_COLD]);
  assert_int_equal(t.limit, st.tier_limit[KVT_TIER_COLD]);
  assert_int_equal(t.write_bytes, st.cold_write_bytes);
  assert_true(t.write_bytes > 0);
  kvt_engine_close(e);
  /* The metadata-only store behind the same id. */
  tu_opts(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  o.tier_bytes_limit[KVT_TIER_COLD] = 1u << 30;
  assert_int_equal(kvt_engine_open(NULL, &o, &e), 0);
  put_blocks(e, 2);
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_COLD, &t, sizeof t), 0);
  assert_int_equal(t.present, 1);
  assert_string_equal(t.name, "metadata");
  assert_int_equal(t.blocks, 2);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* An older caller's shorter struct: nothing written past its size. */
static void test_sizes_and_ids(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  tu_opts(&o);
  kvt_engine *e = tu_open(dir, &o);
  put_blocks(e, 1);
  unsigned char buf[sizeof(kvt_tier_stats) + 16];
  size_t cut = offsetof(kvt_tier_stats, blocks);
  memset(buf, 0xab, sizeof buf);
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_HOT, (kvt_tier_stats *)buf, cut), 0);
  kvt_tier_stats t;
  memcpy(&t, buf, sizeof t);
  assert_int_equal(t.filled, cut);
  assert_string_equal(t.name, "hot");
  for (size_t i = cut; i < sizeof buf; i++) assert_int_equal(buf[i], 0xab);
  /* A newer caller's longer struct: its tail stays as it was. */
  memset(buf, 0xcd, sizeof buf);
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_HOT, (kvt_tier_stats *)buf, sizeof buf), 0);
  memcpy(&t, buf, sizeof t);
  assert_int_equal(t.filled, sizeof t);
  for (size_t i = sizeof t; i < sizeof buf; i++) assert_int_equal(buf[i], 0xcd);
  /* Refusals leave *st untouched. */
  memset(buf, 0xab, sizeof buf);
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_NONE, (kvt_tier_stats *)buf, sizeof buf), KVT_ENOTFOUND);
  assert_int_equal(kvt_stats_tier(e, KVT_N_TIERS, (kvt_tier_stats *)buf, sizeof buf), KVT_ENOTFOUND);
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_HOT, (kvt_tier_stats *)buf, 4), KVT_EBUFSIZE);
  for (size_t i = 0; i < sizeof buf; i++) assert_int_equal(buf[i], 0xab);
  assert_int_equal(kvt_stats_tier(NULL, KVT_TIER_HOT, &t, sizeof t), KVT_ENULL);
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_HOT, NULL, sizeof t), KVT_ENULL);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ram_tiers),
      cmocka_unit_test(test_store_tier),
      cmocka_unit_test(test_sizes_and_ids),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
