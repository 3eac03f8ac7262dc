/* test_remote_known.c - a block the cluster already has, found by a
 * lookup and then put: the append takes it as durable from what the lookup
 * found, so it is written nowhere - not again to the cluster, not to the
 * local cold tier of the engine putting it (test_remote_find: without the
 * lookup it is put and SET NX finds it).
 * Skips (77) without redis-server. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

#include "rc_util.h"
#include "remote_fx.h"

#define NB 8

static char g_url[128];

static void test_put_known_block(void **state) {
  (void)state;
  char model[64];
  snprintf(model, sizeof model, "known-%llx", (unsigned long long)tu_rand());
  kvt_shape sh = tu_shape_small(KVT_F16);
  uint64_t salt = tu_salt(model);
  uint32_t tok[NB * 4];
  for (size_t i = 0; i < NB * 4; i++) tok[i] = (uint32_t)tu_below(50000);
  /* a diskless engine stores the chain in the cluster */
  char *da = tu_tmpdir();
  kvt_engine *a = rfx_open(da, g_url, 0, 20000);
  assert_int_equal(rfx_put(a, tu_register(a, model, &sh), &sh, salt, tok, NB, 1), 0);
  kvt_engine_close(a);
  /* another, with a local cold tier, looks it up and puts the same chain */
  char *db = tu_tmpdir();
  kvt_engine *e = rfx_open(db, g_url, 256ull << 20, 20000);
  kvt_ns_id ns = tu_register(e, model, &sh);
  kvt_lookup_entry ent[NB];
  size_t found = 0;
  assert_int_equal(kvt_lookup(e, ns, tok, NB * 4, ent, NB, &found), 0);
  assert_int_equal(found, NB);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  for (uint32_t b = 0; b < NB; b++) tu_append_put(s, &sh, salt, tok + 4 * b, &kv);
  tu_kv_free(&kv);
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(s), NB); /* durable: the cluster has it */
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 0);    /* not written locally */
  kvt_remote_stats rs = {.size = sizeof rs};
  assert_int_equal(kvt_remote_stats_get(e, &rs), 0);
  assert_int_equal(rs.writes + rs.write_exists, 0); /* nor sent again */
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_rmtree(da);
  tu_rmtree(db);
}

int main(void) {
  rcu_require_redis();
  snprintf(g_url, sizeof g_url, "redis://127.0.0.1:%d", rcu_base_port(7100));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_put_known_block),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
