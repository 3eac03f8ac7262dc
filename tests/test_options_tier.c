/* test_options_tier.c - kvt_options_tier_set/get(): a tier's options by
 * its id are the fields of kvt_options' per-tier arrays, kvt_engine_open()
 * applies them and checks them under the same rules, and a bad id, a short
 * or mislabelled struct, a newer caller's nonzero tail or a bad value is
 * refused with the options left as they were. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "testutil.h"

static kvt_tier_options tier_opts(uint64_t limit, double gbps, double lat) {
  kvt_tier_options t;
  memset(&t, 0, sizeof t);
  t.size = sizeof t;
  t.bytes_limit = limit;
  t.load_gbps = gbps;
  t.load_latency_us = lat;
  return t;
}

/* Set by id lands in the arrays; get by id reads them back. */
static void test_same_fields(void **state) {
  (void)state;
  kvt_options o;
  kvt_options_init(&o);
  kvt_tier_options t = tier_opts(3u << 20, 7.5, 2.25);
  assert_int_equal(kvt_options_tier_set(&o, KVT_TIER_WARM, &t, sizeof t), 0);
  assert_int_equal(o.tier_bytes_limit[KVT_TIER_WARM], 3u << 20);
  assert_true(o.tier_load_gbps[KVT_TIER_WARM] == 7.5);
  assert_true(o.tier_load_latency_us[KVT_TIER_WARM] == 2.25);
  o.tier_bytes_limit[KVT_TIER_COLD] = 5u << 20; /* the shorthand */
  for (uint32_t id = KVT_TIER_HOT; id <= KVT_TIER_COLD; id++) {
    kvt_tier_options g;
    memset(&g, 0xee, sizeof g);
    assert_int_equal(kvt_options_tier_get(&o, id, &g, sizeof g), 0);
    assert_int_equal(g.size, sizeof g);
    assert_int_equal(g.bytes_limit, o.tier_bytes_limit[id]);
    assert_true(g.load_gbps == o.tier_load_gbps[id]);
    assert_true(g.load_latency_us == o.tier_load_latency_us[id]);
  }
}

/* kvt_engine_open() uses what was set by id, and refuses a bad value in
 * the shorthand array by the rules of kvt_options_tier_set(). */
static void test_open_uses(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  tu_opts(&o);
  kvt_tier_options t = tier_opts(1u << 20, 2.0, 1.0);
  assert_int_equal(kvt_options_tier_set(&o, KVT_TIER_WARM, &t, sizeof t), 0);
  kvt_engine *e = tu_open(dir, &o);
  kvt_tier_stats st;
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_WARM, &st, sizeof st), 0);
  assert_int_equal(st.present, 1);
  assert_int_equal(st.limit, 1u << 20);
  kvt_engine_close(e);
  o.tier_load_gbps[KVT_TIER_COLD] = 0;
  kvt_error_info info;
  assert_int_equal(kvt_engine_open_info(dir, &o, &e, &info), KVT_EOPTION);
  assert_null(e);
  assert_string_equal(info.field, "tier_load_gbps[COLD]");
  t = tier_opts(0, 0, 1.0);
  assert_int_equal(kvt_options_tier_set(&o, KVT_TIER_COLD, &t, sizeof t), KVT_EOPTION);
  o.tier_load_gbps[KVT_TIER_COLD] = 1.0;
  o.tier_load_latency_us[KVT_TIER_HOT] = -1.0;
  assert_int_equal(kvt_engine_open_info(dir, &o, &e, &info), KVT_EOPTION);
  assert_string_equal(info.field, "tier_load_latency_us[HOT]");
  tu_rmtree(dir);
}

/* Every refusal of set leaves the options as they were. */
static void test_set_refusals(void **state) {
  (void)state;
  kvt_options o, before;
  kvt_options_init(&o);
  before = o;
  kvt_tier_options t = tier_opts(1u << 20, 1.0, 1.0);
  assert_int_equal(kvt_options_tier_set(&o, KVT_TIER_NONE, &t, sizeof t), KVT_ENOTFOUND);
  assert_int_equal(kvt_options_tier_set(&o, KVT_N_TIERS, &t, sizeof t), KVT_ENOTFOUND);
  assert_int_equal(kvt_options_tier_set(&o, UINT32_MAX, &t, sizeof t), KVT_ENOTFOUND);
  size_t short_size = offsetof(kvt_tier_options, load_latency_us);
  t.size = short_size;
  assert_int_equal(kvt_options_tier_set(&o, KVT_TIER_HOT, &t, short_size), KVT_EBUFSIZE);
  t.size = sizeof t + 8; /* the field and the argument disagree */
  assert_int_equal(kvt_options_tier_set(&o, KVT_TIER_HOT, &t, sizeof t), KVT_EOPTION);
  t = tier_opts(1u << 20, NAN, 1.0);
  assert_int_equal(kvt_options_tier_set(&o, KVT_TIER_HOT, &t, sizeof t), KVT_EOPTION);
  t = tier_opts(1u << 20, 1.0, -0.5);
  assert_int_equal(kvt_options_tier_set(&o, KVT_TIER_HOT, &t, sizeof t), KVT_EOPTION);
  t = tier_opts(1u << 20, 1.0, INFINITY);
  assert_int_equal(kvt_options_tier_set(&o, KVT_TIER_HOT, &t, sizeof t), KVT_EOPTION);
  /* A newer caller's struct: a field this library does not know, set. */
  unsigned char big[sizeof(kvt_tier_options) + 16];
  memset(big, 0, sizeof big);
  t = tier_opts(1u << 20, 1.0, 1.0);
  t.size = sizeof big;
  memcpy(big, &t, sizeof t);
  big[sizeof t + 3] = 1;
  assert_int_equal(kvt_options_tier_set(&o, KVT_TIER_HOT, (kvt_tier_options *)big, sizeof big),
                   KVT_EOPTION);
  /* A size past any struct's (4096 bytes): refused before its tail is read. */
  static unsigned char huge[8192];
  t.size = sizeof huge;
  memcpy(huge, &t, sizeof t);
  assert_int_equal(kvt_options_tier_set(&o, KVT_TIER_HOT, (kvt_tier_options *)huge, sizeof huge),
                   KVT_EOPTION);
  assert_int_equal(kvt_options_tier_set(NULL, KVT_TIER_HOT, &t, sizeof t), KVT_ENULL);
  assert_int_equal(kvt_options_tier_set(&o, KVT_TIER_HOT, NULL, sizeof t), KVT_ENULL);
  assert_memory_equal(&o, &before, sizeof o);
  /* The same struct with its unknown tail zero is accepted. */
  big[sizeof t + 3] = 0;
  assert_int_equal(kvt_options_tier_set(&o, KVT_TIER_HOT, (kvt_tier_options *)big, sizeof big), 0);
  assert_int_equal(o.tier_bytes_limit[KVT_TIER_HOT], 1u << 20);
}

/* get writes no byte past the size passed, and refuses with *to untouched. */
static void test_get_sizes(void **state) {
  (void)state;
  kvt_options o;
  kvt_options_init(&o);
  unsigned char buf[sizeof(kvt_tier_options) + 16];
  size_t cut = offsetof(kvt_tier_options, load_gbps);
  memset(buf, 0xab, sizeof buf);
  assert_int_equal(kvt_options_tier_get(&o, KVT_TIER_HOT, (kvt_tier_options *)buf, cut), 0);
  kvt_tier_options t;
  memcpy(&t, buf, sizeof t);
  assert_int_equal(t.size, cut);
  assert_int_equal(t.bytes_limit, o.tier_bytes_limit[KVT_TIER_HOT]);
  for (size_t i = cut; i < sizeof buf; i++) assert_int_equal(buf[i], 0xab);
  memset(buf, 0xcd, sizeof buf);
  assert_int_equal(kvt_options_tier_get(&o, KVT_TIER_HOT, (kvt_tier_options *)buf, sizeof buf), 0);
  memcpy(&t, buf, sizeof t);
  assert_int_equal(t.size, sizeof t);
  for (size_t i = sizeof t; i < sizeof buf; i++) assert_int_equal(buf[i], 0xcd);
  memset(buf, 0xab, sizeof buf);
  assert_int_equal(kvt_options_tier_get(&o, KVT_TIER_NONE, (kvt_tier_options *)buf, sizeof buf),
                   KVT_ENOTFOUND);
  assert_int_equal(kvt_options_tier_get(&o, 4, (kvt_tier_options *)buf, sizeof buf), KVT_ENOTFOUND);
  assert_int_equal(kvt_options_tier_get(&o, KVT_TIER_HOT, (kvt_tier_options *)buf, 4),
                   KVT_EBUFSIZE);
  for (size_t i = 0; i < sizeof buf; i++) assert_int_equal(buf[i], 0xab);
  assert_int_equal(kvt_options_tier_get(NULL, KVT_TIER_HOT, &t, sizeof t), KVT_ENULL);
  assert_int_equal(kvt_options_tier_get(&o, KVT_TIER_HOT, NULL, sizeof t), KVT_ENULL);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_fields),
      cmocka_unit_test(test_open_uses),
      cmocka_unit_test(test_set_refusals),
      cmocka_unit_test(test_get_sizes),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
