/* test_remote_find.c - the remote store's find (asked as a block is
 * appended) sends nothing to the cluster: it answers from the local tier
 * and from what a lookup (prefix) of this process just found; a block put
 * again that the cluster has is written once and reads bit-exact. Against
 * the ctest fixture's Redis Cluster; skips (77) without redis-server. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/key.h"
#include "base/mem.h"
#include "io/rcluster.h"
#include "rc_util.h"
#include "remote_fx.h"
#include "tiers/remote.h"
#include "tiers/store.h"

#define NB 4
#define NL 2
#define EACH 5000

static char g_url[128];
static uint64_t g_run; /* keys unique to this run: a cluster may outlive it */

static kvt_store *store_open(kvt_mem *m) {
  kvt_store *s = NULL;
  kvt_store_config c = {.remote_url = g_url, .remote_deadline_ms = 20000};
  assert_int_equal(kvt_store_open(m, &c, &s), 0);
  assert_non_null(s);
  return s;
}

/* Commands the store's reading client has sent so far. */
static uint64_t commands(kvt_store *s) {
  kvt_remote_counts n;
  kvt_rc_stats rc;
  assert_int_equal(kvt_store_remote_counts(s, &n, &rc), 0);
  return rc.commands;
}

static void test_find_asks_nothing(void **state) {
  (void)state;
  kvt_mem m1, m2;
  kvt_mem_init(&m1, 0);
  kvt_mem_init(&m2, 0);
  kvt_store *a = store_open(&m1), *b = store_open(&m2);
  static uint8_t kv[NB][NL][2 * EACH];
  const uint8_t *ptr[NB][NL];
  kvt_store_rec recs[NB];
  kvt_key keys[NB];
  for (uint32_t i = 0; i < NB; i++) {
    keys[i] = rfx_key(g_run);
    for (uint32_t l = 0; l < NL; l++) {
      for (size_t j = 0; j < 2 * EACH; j++) kv[i][l][j] = (uint8_t)tu_rand();
      ptr[i][l] = kv[i][l];
    }
    recs[i] = (kvt_store_rec){.key = keys[i], .parent = i ? keys[i - 1] : rfx_key(g_run),
                              .ns_seed = rfx_key(g_run), .pos = i, .n_layers = NL,
                              .dtype = KVT_F16, .bytes_each = EACH, .layers = ptr[i]};
  }
  size_t posted = 0;
  assert_int_equal(kvt_store_post(a, recs, NB, &posted, NULL, NULL), 0);
  assert_int_equal(kvt_store_drain(a), 0);
  /* in the cluster, not learned by b: not stored for an append, no round trip */
  uint64_t c0 = commands(b);
  for (uint32_t i = 0; i < NB; i++) assert_int_equal(kvt_store_find(b, &keys[i]), KVT_ENOTFOUND);
  assert_int_equal(commands(b), c0);
  /* a lookup finds them; the appends after it know, without asking again */
  assert_int_equal(kvt_store_prefix(b, keys, NB), NB);
  uint64_t c1 = commands(b);
  assert_true(c1 > c0);
  for (uint32_t i = 0; i < NB; i++) assert_int_equal(kvt_store_find(b, &keys[i]), 0);
  assert_int_equal(commands(b), c1);
  /* one append per lookup: taken */
  assert_int_equal(kvt_store_find(b, &keys[0]), KVT_ENOTFOUND);
  /* a block removed after the lookup is not answered stored */
  assert_int_equal(kvt_store_prefix(b, keys, NB), NB);
  assert_int_equal(kvt_store_remove(b, &keys[1]), 0);
  assert_int_equal(kvt_store_find(b, &keys[1]), KVT_ENOTFOUND);
  assert_int_equal(kvt_store_find(b, &keys[2]), 0);
  /* put again by b: the cluster has all but the removed one (SET NX) */
  assert_int_equal(kvt_store_post(b, recs, NB, &posted, NULL, NULL), 0);
  assert_int_equal(kvt_store_drain(b), 0);
  kvt_remote_counts n;
  assert_int_equal(kvt_store_remote_counts(b, &n, NULL), 0);
  assert_int_equal(n.write_exists, NB - 1);
  assert_int_equal(n.writes, 1);
  assert_int_equal(n.write_failures, 0);
  for (uint32_t i = 0; i < NB; i++) rfx_assert_layers(a, &keys[i], ptr[i], NL, EACH);
  rfx_close_stores(a, &m1, b, &m2);
}

/* Engines: a block another engine stored, appended without a lookup, is
 * put (not durable at append), written once, and reads bit-exact; after a
 * lookup it is durable at append and loaded. */
static void test_engine_append(void **state) {
  (void)state;
  char model[64];
  snprintf(model, sizeof model, "find-%016llx", (unsigned long long)g_run);
  kvt_shape sh = tu_shape_small(KVT_F16);
  uint64_t salt = tu_salt(model);
  uint32_t tok[NB * 4];
  for (uint32_t i = 0; i < NB * 4; i++) tok[i] = (uint32_t)(tu_rand() % 50000);
  char *da = tu_tmpdir(), *db = tu_tmpdir(), *dc = tu_tmpdir();
  kvt_engine *e = rfx_open(da, g_url, 0, 20000);
  assert_int_equal(rfx_put(e, tu_register(e, model, &sh), &sh, salt, tok, NB, 1), 0);
  kvt_engine_close(e);
  e = rfx_open(db, g_url, 0, 20000);
  kvt_ns_id ns = tu_register(e, model, &sh);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  for (uint32_t b = 0; b < NB; b++) {
    kvt_append_info info;
    assert_int_equal(kvt_seq_append(s, tok + 4 * b, 4, &info), 0);
    assert_int_equal(info.durable, 0);
    for (uint32_t l = 0; l < sh.n_layers; l++) {
      tu_kv_fill(&kv, &sh, salt, l, b, tok + 4 * b);
      assert_int_equal(kvt_seq_put(s, b, l, &kv.kv), 0);
    }
  }
  assert_int_equal(kvt_sync(e), 0);
  kvt_remote_stats rs = {.size = sizeof rs};
  assert_int_equal(kvt_remote_stats_get(e, &rs), 0);
  assert_int_equal(rs.write_exists, NB);
  assert_int_equal(rs.writes, 0);
  assert_int_equal(rs.write_failures, 0);
  kvt_seq_release(s);
  tu_kv_free(&kv);
  kvt_engine_close(e);
  e = rfx_open(dc, g_url, 0, 20000);
  ns = tu_register(e, model, &sh);
  kvt_lookup_entry ent[NB];
  size_t found = 0;
  assert_int_equal(kvt_lookup(e, ns, tok, NB * 4, ent, NB, &found), 0);
  assert_int_equal(found, NB);
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  for (uint32_t b = 0; b < NB; b++) {
    kvt_append_info info;
    assert_int_equal(kvt_seq_append(s, tok + 4 * b, 4, &info), 0);
    assert_int_equal(info.durable, 1);
  }
  for (uint32_t b = 0; b < NB; b++)
    for (uint32_t l = 0; l < sh.n_layers; l++) tu_assert_block(s, &sh, salt, b, l, tok + 4 * b);
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_rmtree(da);
  tu_rmtree(db);
  tu_rmtree(dc);
}

int main(void) {
  rcu_require_redis();
  snprintf(g_url, sizeof g_url, "redis://127.0.0.1:%d", rcu_base_port(7100));
  g_run = tu_seed() * 0x9e3779b97f4a7c15ull;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_find_asks_nothing),
      cmocka_unit_test(test_engine_append),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
