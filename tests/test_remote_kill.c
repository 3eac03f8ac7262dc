/* test_remote_kill.c - a master of the cluster killed (SIGKILL, no
 * replica) while an engine serves from the remote tier: its blocks become
 * misses (lookups stop before them, loads say KVT_ENOTFOUND), the other
 * masters' blocks still load bit-exact, new blocks are still accepted,
 * and no call returns an error. Runs on a cluster of its own (ctest
 * fixture redis_cluster_kill), since the kill is for good. Skips (77)
 * without redis-server. */
#include "testutil.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/rcluster.h"
#include "rc_util.h"
#include "remote_fx.h"
#include "tiers/remote.h"

#define NB 24

static char g_url[128], g_model[64];
static const char *g_dir;
static int g_port;

static kvt_engine *open_remote(const char *dir) {
  return rfx_open(dir, g_url, 0, 20000);
}

/* Write NB blocks (diskless: the cluster is the only durable tier);
 * kvt_sync's result. */
static int put_blocks(kvt_engine *e, kvt_ns_id ns, const kvt_shape *sh, const uint32_t *tok,
                      uint64_t salt) {
  return rfx_put(e, ns, sh, salt, tok, NB, 1);
}

/* The port of the master serving block key k. */
static int port_of(kvt_rc *rc, const kvt_key *k) {
  char name[KVT_REMOTE_KEY_MAX], who[64];
  size_t n = kvt_remote_block_key(k, name);
  assert_int_equal(kvt_rc_slot_node(rc, kvt_rc_slot(name, n), who, sizeof who), 0);
  return atoi(strchr(who, ':') + 1);
}

static void test_master_killed(void **state) {
  (void)state;
  char *dw = tu_tmpdir(), *dr = tu_tmpdir();
  kvt_shape sh = tu_shape_small(KVT_F16);
  uint64_t salt = tu_salt(g_model);
  uint32_t tok[NB * 4];
  for (size_t i = 0; i < NB * 4; i++) tok[i] = (uint32_t)tu_below(50000);
  kvt_engine *w = open_remote(dw);
  assert_int_equal(put_blocks(w, tu_register(w, g_model, &sh), &sh, tok, salt), 0);
  kvt_remote_stats rs = {.size = sizeof rs};
  assert_int_equal(kvt_remote_stats_get(w, &rs), 0);
  assert_int_equal(rs.writes, NB);
  kvt_engine_close(w);

  kvt_engine *e = open_remote(dr);
  kvt_ns_id ns = tu_register(e, g_model, &sh);
  kvt_lookup_entry ent[NB];
  size_t found;
  assert_int_equal(kvt_lookup(e, ns, tok, NB * 4, ent, NB, &found), 0);
  assert_int_equal(found, NB);
  /* which blocks the victim serves */
  int victim = g_port + 2, first_dead = -1, n_dead = 0;
  kvt_rc_config cfg = {.url = g_url, .deadline_ms = 20000};
  kvt_rc *rc;
  assert_int_equal(kvt_rc_open(&cfg, &rc, NULL, 0), 0);
  int dead[NB];
  for (int b = 0; b < NB; b++) {
    dead[b] = port_of(rc, &ent[b].key) == victim;
    n_dead += dead[b];
    if (dead[b] && first_dead < 0) first_dead = b;
  }
  kvt_rc_close(rc);
  assert_true(n_dead > 0 && n_dead < NB);
  kvt_key keys[NB];
  for (int b = 0; b < NB; b++) keys[b] = ent[b].key;

  pid_t pid = rcu_node_pid(g_dir, victim);
  assert_true(pid > 0);
  assert_int_equal(kill(pid, SIGKILL), 0);
  rfx_wait_gone(pid);

  /* lookups stop at the first block the dead master held: a miss */
  assert_int_equal(kvt_lookup(e, ns, tok, NB * 4, ent, NB, &found), 0);
  assert_int_equal(found, (size_t)first_dead);
  /* loads: the dead master's blocks miss, the others are exact */
  kvt_load_req req[NB];
  tu_kv got[NB], want;
  tu_kv_alloc(&want, &sh);
  for (int b = 0; b < NB; b++) {
    tu_kv_alloc(&got[b], &sh);
    req[b] = (kvt_load_req){.key = keys[b], .layer = 1, .k_out = got[b].k, .v_out = got[b].v,
                            .bytes_each = got[b].bytes};
  }
  kvt_load *ld;
  assert_int_equal(kvt_load_submit(e, ns, req, NB, &ld), 0);
  size_t ok = 0;
  assert_int_equal(kvt_load_wait(ld, &ok), KVT_ENOTFOUND); /* the first miss, per request */
  assert_int_equal(ok, (size_t)(NB - n_dead));
  for (int b = 0; b < NB; b++) {
    assert_int_equal(req[b].status, dead[b] ? KVT_ENOTFOUND : 0);
    if (dead[b]) continue;
    tu_kv_fill(&want, &sh, salt, 1, (uint32_t)b, tok + 4 * b);
    assert_memory_equal(got[b].k, want.k, want.bytes);
    assert_memory_equal(got[b].v, want.v, want.bytes);
  }
  assert_int_equal(kvt_remote_stats_get(e, &rs), 0);
  assert_true(rs.misses >= (uint64_t)n_dead);
  assert_int_equal(rs.hits, NB - n_dead);
  assert_int_equal(rs.checksum_failures, 0);
  /* still serving: new blocks are accepted, those for the dead master
   * are counted as failed writes, not reported as errors */
  uint32_t tok2[NB * 4];
  for (size_t i = 0; i < NB * 4; i++) tok2[i] = (uint32_t)tu_below(50000) + 60000;
  int src = put_blocks(e, ns, &sh, tok2, salt);
  assert_int_equal(kvt_remote_stats_get(e, &rs), 0);
  assert_true(rs.write_failures > 0);
  assert_true(rs.writes > 0);
  /* diskless, a block the cluster did not store is not durable: kvt_sync
   * says so (and the block stays in RAM), it never claims otherwise */
  assert_int_equal(src, -EIO);
  for (int b = 0; b < NB; b++) tu_kv_free(&got[b]);
  tu_kv_free(&want);
  kvt_engine_close(e);
  tu_rmtree(dw);
  tu_rmtree(dr);
}

int main(void) {
  rcu_require_redis();
  g_port = rcu_base_port(7120);
  g_dir = rfx_cluster_dir();
  snprintf(g_url, sizeof g_url, "redis://127.0.0.1:%d", g_port);
  snprintf(g_model, sizeof g_model, "kill-%llx", (unsigned long long)tu_seed());
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_master_killed),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
