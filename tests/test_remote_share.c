/* test_remote_share.c - two engines in separate processes, each with its
 * own local directory, share a prefix through the remote tier (the ctest
 * fixture's Redis Cluster): a child (this program exec'd again) writes
 * it, the parent finds it by lookup and reads it bit-exact, and a third
 * engine that never registered the model finds its namespace in the
 * cluster. Skips (77) without redis-server. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rc_util.h"
#include "remote_fx.h"

#define NB 5

static char g_url[128], g_model[64];
static const char *g_self;

static void tokens_of(uint32_t *t, size_t n, const char *model) {
  uint64_t st = tu_salt(model);
  for (size_t i = 0; i < n; i++) t[i] = (uint32_t)(tu_rand_r(&st) % 50000);
}

static kvt_remote_options remote_opts(void) {
  return (kvt_remote_options){.size = sizeof(kvt_remote_options), .url = g_url,
                              .deadline_ms = 20000};
}

/* The child: write NB blocks of the model into dir and the cluster. Plain
 * checks (no cmocka here); the exit status says which step failed. */
static int child_put(const char *dir) {
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_COLD] = 256ull << 20;
  kvt_remote_options ro = remote_opts();
  kvt_engine *e;
  if (kvt_engine_open_remote(dir, &o, &ro, &e, NULL)) return 2;
  kvt_shape sh = tu_shape_small(KVT_F16);
  kvt_ns_desc d = tu_desc(g_model, &sh);
  kvt_ns_id ns;
  kvt_seq *s;
  if (kvt_ns_register(e, &d, &ns) || kvt_seq_create(e, ns, &s)) return 3;
  uint32_t tok[NB * 4];
  tokens_of(tok, NB * 4, g_model);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  for (uint32_t b = 0; b < NB; b++) {
    kvt_append_info info;
    if (kvt_seq_append(s, tok + 4 * b, 4, &info)) return 4;
    for (uint32_t l = 0; l < sh.n_layers; l++) {
      tu_kv_fill(&kv, &sh, tu_salt(g_model), l, b, tok + 4 * b);
      if (kvt_seq_put(s, b, l, &kv.kv)) return 5;
    }
  }
  if (kvt_sync(e)) return 6;
  kvt_seq_release(s);
  kvt_remote_stats rs = {.size = sizeof rs};
  if (kvt_remote_stats_get(e, &rs) || rs.write_failures || rs.write_dropped) return 7;
  kvt_engine_close(e); /* the remote writes finish before it returns */
  tu_kv_free(&kv);
  return 0;
}

static void run_child(const char *dir) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    execl(g_self, g_self, "put", dir, g_url, g_model, (char *)NULL);
    _exit(127);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
}

static kvt_engine *open_remote(const char *dir, uint64_t cold) {
  return rfx_open(dir, g_url, cold, remote_opts().deadline_ms);
}

static void test_two_processes(void **state) {
  (void)state;
  char *da = tu_tmpdir(), *db = tu_tmpdir();
  run_child(da);
  kvt_engine *e = open_remote(db, 256ull << 20);
  kvt_shape sh = tu_shape_small(KVT_F16);
  kvt_ns_id ns = tu_register(e, g_model, &sh);
  uint32_t tok[NB * 4];
  tokens_of(tok, NB * 4, g_model);
  kvt_lookup_entry ent[NB];
  size_t found = 0;
  assert_int_equal(kvt_lookup(e, ns, tok, NB * 4, ent, NB, &found), 0);
  assert_int_equal(found, NB); /* nothing local: all from the cluster */
  for (size_t i = 0; i < found; i++) assert_int_equal(ent[i].tier, KVT_TIER_COLD);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  for (uint32_t b = 0; b < NB; b++) {
    kvt_append_info info;
    assert_int_equal(kvt_seq_append(s, tok + 4 * b, 4, &info), 0);
    assert_int_equal(info.durable, 1);
    assert_int_equal(info.layers_present, 0);
  }
  for (uint32_t b = 0; b < NB; b++)
    for (uint32_t l = 0; l < sh.n_layers; l++) tu_assert_block(s, &sh, tu_salt(g_model), b, l, tok + 4 * b);
  kvt_remote_stats rs = {.size = sizeof rs};
  assert_int_equal(kvt_remote_stats_get(e, &rs), 0);
  assert_int_equal(rs.hits, NB);
  assert_int_equal(rs.checksum_failures, 0);
  assert_true(rs.bytes_in > 0);
  kvt_seq_release(s);
  kvt_engine_close(e);
  /* a third engine, never told of the model: its namespace comes from the cluster */
  char *dc = tu_tmpdir();
  e = open_remote(dc, 0);
  kvt_ns_desc d;
  kvt_ns_id id = UINT32_MAX;
  int have = 0;
  for (uint32_t i = 0; kvt_ns_get(e, i, &id, &d) == 0; i++)
    if (!strcmp(d.model_id, g_model)) {
      have = 1;
      break;
    }
  assert_true(have);
  assert_int_equal(kvt_lookup(e, id, tok, NB * 4, ent, NB, &found), 0);
  assert_int_equal(found, NB);
  kvt_engine_close(e);
  tu_rmtree(da);
  tu_rmtree(db);
  tu_rmtree(dc);
}

int main(int argc, char **argv) {
  if (argc == 5 && !strcmp(argv[1], "put")) {
    snprintf(g_url, sizeof g_url, "%s", argv[3]);
    snprintf(g_model, sizeof g_model, "%s", argv[4]);
    return child_put(argv[2]);
  }
  rcu_require_redis();
  g_self = "/proc/self/exe";
  snprintf(g_url, sizeof g_url, "redis://127.0.0.1:%d", rcu_base_port(7100));
  snprintf(g_model, sizeof g_model, "share-%llx", (unsigned long long)tu_seed());
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_processes),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
