/* test_remote_tier.c - the remote tier through the engine API while the
 * cluster changes under it, on a cluster of its own (3 masters + 3
 * replicas, ctest fixture redis_cluster_tier): a slot migrated mid-run
 * (ASK, then MOVED), a master stopped (SIGSTOP), blocks evicted by
 * maxmemory-policy (counted apart from plain misses), and a master killed
 * (SIGKILL) then replaced by its replica. Each engine call must return -
 * misses, never errors - within a loose bound (5 deadlines: a hang, not a
 * speed, fails it); waits for the cluster are bounded polls. Skips (77)
 * without redis-server. */
#include "testutil.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/rcluster.h"
#include "rc_util.h"
#include "remote_fx.h"
#include "tiers/remote.h"

#define NB 24
#define NODES 6
#define DEADLINE_MS 4000u      /* the reader's: a node silent 2 s is failed */
#define BOUND_MS (5 * DEADLINE_MS)
#define POLL_MS 60000u         /* waits for the cluster, at most */

static char g_url[256];
static const char *g_dir;
static int g_port;

/* ------------------------------------------------------------ time */

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void nap_ms(unsigned ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ admin */

static int node_alive(int port) {
  pid_t pid = rcu_node_pid(g_dir, port);
  return pid > 0 && kill(pid, 0) == 0;
}

/* One admin command on port; the reply (caller frees) or NULL. */
static redisReply *admin(int port, const char *fmt, ...) {
  redisContext *a = rcu_admin(port, NULL);
  if (!a) return NULL;
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(a, fmt, ap);
  va_end(ap);
  redisFree(a);
  return r;
}

/* "field:value" of an INFO reply, as a number; -1 if absent. */
static long long info_num(const char *info, const char *field) {
  char pat[64];
  snprintf(pat, sizeof pat, "\n%s:", field);
  const char *p = strstr(info, pat);
  return p ? atoll(p + strlen(pat)) : -1;
}

/* Every live node says cluster_state:ok (bounded). */
static void wait_cluster_ok(void) {
  uint64_t end = now_ms() + POLL_MS;
  for (;;) {
    int ok = 1;
    for (int p = g_port; p < g_port + NODES && ok; p++) {
      if (!node_alive(p)) continue;
      redisReply *r = admin(p, "CLUSTER INFO");
      ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
      if (r) freeReplyObject(r);
    }
    if (ok) return;
    assert_true(now_ms() < end);
    nap_ms(100);
  }
}

/* The live masters (ROLE). */
static int masters_load(node_info *m) {
  int n = 0;
  for (int p = g_port; p < g_port + NODES; p++) {
    if (!node_alive(p)) continue;
    redisReply *r = admin(p, "ROLE");
    int master = r && r->type == REDIS_REPLY_ARRAY && !strcmp(r->element[0]->str, "master");
    if (r) freeReplyObject(r);
    if (!master) continue;
    r = admin(p, "CLUSTER MYID");
    assert_non_null(r);
    m[n].port = p;
    snprintf(m[n].id, sizeof m[n].id, "%s", r->str);
    n++;
    freeReplyObject(r);
  }
  return n;
}

/* The port of the master serving slot, as a live node's CLUSTER SLOTS says. */
static int slot_owner(uint16_t slot) {
  int any = g_port;
  while (any < g_port + NODES && !node_alive(any)) any++;
  redisReply *s = admin(any, "CLUSTER SLOTS");
  assert_non_null(s);
  int owner = -1;
  for (size_t i = 0; i < s->elements; i++) {
    redisReply *e = s->element[i];
    if (slot >= e->element[0]->integer && slot <= e->element[1]->integer)
      owner = (int)e->element[2]->element[1]->integer;
  }
  freeReplyObject(s);
  assert_true(owner > 0);
  return owner;
}

static uint16_t block_slot(const kvt_key *k) {
  char name[KVT_REMOTE_KEY_MAX];
  size_t n = kvt_remote_block_key(k, name);
  return kvt_rc_slot(name, n);
}

/* Every master's writes acknowledged by its replica (offsets), so a
 * failover loses nothing this test wrote. */
static void wait_replicated(void) {
  node_info m[NODES];
  int n = masters_load(m);
  uint64_t end = now_ms() + POLL_MS;
  for (int i = 0; i < n; i++) {
    for (;;) {
      redisReply *r = admin(m[i].port, "INFO replication");
      assert_non_null(r);
      long long want = info_num(r->str, "master_repl_offset");
      const char *s0 = strstr(r->str, "slave0:");
      const char *off = s0 ? strstr(s0, "offset=") : NULL;
      long long have = off ? atoll(off + 7) : -1;
      freeReplyObject(r);
      if (want >= 0 && have >= want) break;
      assert_true(now_ms() < end);
      nap_ms(50);
    }
  }
}

/* The state every case starts from: nodes running, no memory limit,
 * replicas allowed to fail over, the cluster ok. */
static void cluster_reset(void) {
  for (int p = g_port; p < g_port + NODES; p++) {
    pid_t pid = rcu_node_pid(g_dir, p);
    if (pid <= 0 || kill(pid, 0) != 0) continue;
    kill(pid, SIGCONT);
    rcu_admin_ok(p, "CONFIG SET maxmemory 0");
    rcu_admin_ok(p, "CONFIG SET maxmemory-policy noeviction");
    rcu_admin_ok(p, "CONFIG SET cluster-replica-no-failover no");
  }
  wait_cluster_ok();
}

/* ------------------------------------------------------------ engines */

typedef struct run {
  char model[64];
  kvt_shape sh;
  uint64_t salt;
  uint32_t tok[NB * 4];
} run;

static void run_init(run *x, const char *what, uint32_t base) {
  snprintf(x->model, sizeof x->model, "tier-%s-%llx", what, (unsigned long long)tu_rand());
  x->sh = tu_shape_small(KVT_F16);
  x->salt = tu_salt(x->model);
  for (size_t i = 0; i < NB * 4; i++) x->tok[i] = base + (uint32_t)tu_below(50000);
}

static kvt_engine *open_remote(const char *dir, uint32_t deadline_ms) {
  return rfx_open(dir, g_url, 0, deadline_ms); /* diskless, the cluster is the durable tier */
}

/* A writer engine stores the run's NB blocks; kvt_sync's result. */
static int put_run(const run *x) {
  char *d = tu_tmpdir();
  kvt_engine *e = open_remote(d, 20000);
  kvt_ns_id ns = tu_register(e, x->model, &x->sh);
  int rc = rfx_put(e, ns, &x->sh, x->salt, x->tok, NB, 1);
  kvt_engine_close(e);
  tu_rmtree(d);
  return rc;
}

/* The run's block keys, from an engine with RAM only (the keys are a
 * function of the namespace and the tokens, not of the tier). */
static void keys_of(const run *x, kvt_key *keys) {
  char *d = tu_tmpdir();
  kvt_options o;
  tu_opts(&o);
  kvt_engine *e = tu_open(d, &o);
  kvt_ns_id ns = tu_register(e, x->model, &x->sh);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  tu_kv kv;
  tu_kv_alloc(&kv, &x->sh);
  for (uint32_t b = 0; b < NB; b++) tu_append_put(s, &x->sh, x->salt, x->tok + 4 * b, &kv);
  kvt_lookup_entry ent[NB];
  size_t found;
  assert_int_equal(kvt_lookup(e, ns, x->tok, NB * 4, ent, NB, &found), 0);
  assert_int_equal(found, NB);
  for (int b = 0; b < NB; b++) keys[b] = ent[b].key;
  kvt_seq_release(s);
  tu_kv_free(&kv);
  kvt_engine_close(e);
  tu_rmtree(d);
}

/* A timed lookup: 0 returned, within the bound; blocks found. */
static size_t lookup_run(kvt_engine *e, kvt_ns_id ns, const run *x) {
  kvt_lookup_entry ent[NB];
  size_t found = 0;
  uint64_t t0 = now_ms();
  assert_int_equal(kvt_lookup(e, ns, x->tok, NB * 4, ent, NB, &found), 0);
  assert_true(now_ms() - t0 <= BOUND_MS);
  return found;
}

/* Load every layer of every block (timed): each request is a hit,
 * bit-exact, or KVT_ENOTFOUND - nothing else. ok[b]: block b loaded
 * whole. Returns the blocks loaded whole. */
static int load_run(kvt_engine *e, kvt_ns_id ns, const run *x, const kvt_key *keys, int *ok) {
  uint32_t L = x->sh.n_layers;
  size_t nr = (size_t)NB * L;
  kvt_load_req *req = calloc(nr, sizeof *req);
  tu_kv *got = calloc(nr, sizeof *got), want;
  assert_non_null(req);
  assert_non_null(got);
  tu_kv_alloc(&want, &x->sh);
  for (uint32_t b = 0; b < NB; b++)
    for (uint32_t l = 0; l < L; l++) {
      size_t i = (size_t)b * L + l;
      tu_kv_alloc(&got[i], &x->sh);
      req[i] = (kvt_load_req){.key = keys[b], .layer = l, .k_out = got[i].k, .v_out = got[i].v,
                              .bytes_each = got[i].bytes};
    }
  uint64_t t0 = now_ms();
  kvt_load *ld;
  assert_int_equal(kvt_load_submit(e, ns, req, nr, &ld), 0);
  size_t n_ok = 0;
  int rc = kvt_load_wait(ld, &n_ok);
  assert_true(now_ms() - t0 <= BOUND_MS);
  assert_true(rc == 0 || rc == KVT_ENOTFOUND);
  int whole = 0;
  for (uint32_t b = 0; b < NB; b++) {
    ok[b] = 1;
    for (uint32_t l = 0; l < L; l++) {
      size_t i = (size_t)b * L + l;
      if (req[i].status != 0) fprintf(stderr, "block %u layer %u: %d\n", b, l, req[i].status);
      assert_true(req[i].status == 0 || req[i].status == KVT_ENOTFOUND);
      if (req[i].status) {
        ok[b] = 0;
        continue;
      }
      tu_kv_fill(&want, &x->sh, x->salt, l, b, x->tok + 4 * b);
      assert_memory_equal(got[i].k, want.k, want.bytes);
      assert_memory_equal(got[i].v, want.v, want.bytes);
    }
    whole += ok[b];
  }
  for (size_t i = 0; i < nr; i++) tu_kv_free(&got[i]);
  tu_kv_free(&want);
  free(got);
  free(req);
  return whole;
}

/* Poll until every block is found and loads whole (bounded). */
static void wait_all_hits(kvt_engine *e, kvt_ns_id ns, const run *x, const kvt_key *keys) {
  uint64_t end = now_ms() + POLL_MS;
  int ok[NB];
  while (lookup_run(e, ns, x) != NB || load_run(e, ns, x, keys, ok) != NB) {
    assert_true(now_ms() < end);
    nap_ms(200);
  }
}

static kvt_remote_stats rstats(kvt_engine *e) {
  kvt_remote_stats rs = {.size = sizeof rs};
  assert_int_equal(kvt_remote_stats_get(e, &rs), 0);
  return rs;
}

/* A case: run x stored, run y (tokens apart) only made, their keys; an
 * engine on the cluster in a new directory d, x's namespace nx. */
typedef struct tcase {
  run x, y;
  kvt_key kx[NB], ky[NB];
  char *d;
  kvt_engine *e;
  kvt_ns_id nx;
} tcase;

/* The cluster reset, then the case (wy NULL: no run y). */
static void case_start(tcase *c, const char *wx, const char *wy) {
  cluster_reset();
  run_init(&c->x, wx, 0);
  keys_of(&c->x, c->kx);
  assert_int_equal(put_run(&c->x), 0);
  c->d = tu_tmpdir();
  c->e = open_remote(c->d, DEADLINE_MS);
  c->nx = tu_register(c->e, c->x.model, &c->x.sh);
  if (!wy) return;
  run_init(&c->y, wy, 60000);
  keys_of(&c->y, c->ky);
}

static void case_end(tcase *c) {
  kvt_engine_close(c->e);
  tu_rmtree(c->d);
}

/* The master serving the last of keys[NB]: on[b] says which blocks it
 * serves (some, not all), *n_on how many, *first the first; its pid. */
static pid_t victim_pick(const kvt_key *keys, int *victim, int *on, int *n_on, int *first) {
  *victim = slot_owner(block_slot(&keys[NB - 1]));
  *n_on = 0, *first = -1;
  for (int b = 0; b < NB; b++) {
    on[b] = slot_owner(block_slot(&keys[b])) == *victim;
    *n_on += on[b];
    if (on[b] && *first < 0) *first = b;
  }
  assert_true(*n_on > 0 && *n_on < NB);
  pid_t pid = rcu_node_pid(g_dir, *victim);
  assert_true(pid > 0);
  return pid;
}

/* ------------------------------------------------------------ migration */

/* Move every key of slot still on src to dst. */
static void migrate_rest(int src, int dst, uint16_t slot) {
  for (;;) {
    redisReply *r = admin(src, "CLUSTER GETKEYSINSLOT %d 100", (int)slot);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    size_t n = r->elements;
    for (size_t i = 0; i < n; i++)
      rcu_admin_ok(src, "MIGRATE 127.0.0.1 %d %b 0 5000", dst, r->element[i]->str,
                   r->element[i]->len);
    freeReplyObject(r);
    if (!n) break;
  }
}

static int key_on(int port, const kvt_key *k, int asking) {
  char name[KVT_REMOTE_KEY_MAX];
  size_t n = kvt_remote_block_key(k, name);
  redisContext *a = rcu_admin(port, NULL);
  assert_non_null(a);
  if (asking) freeReplyObject(redisCommand(a, "ASKING"));
  redisReply *r = redisCommand(a, "EXISTS %b", name, n);
  assert_non_null(r);
  int on = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
  freeReplyObject(r);
  redisFree(a);
  return on;
}

/* Slot a (a stored block's) and slot b (a block not written yet) are
 * migrated while an engine reads and writes: mid-migration the stored
 * block is served through ASK (it moved, its slot did not yet) and the
 * new block is written to the target through ASK; once the slots are
 * assigned, every block loads bit-exact through MOVED. */
static void test_slot_migration(void **state) {
  (void)state;
  tcase c;
  case_start(&c, "mig-a", "mig-b");
  kvt_ns_id nsb = tu_register(c.e, c.y.model, &c.y.sh);
  int ok[NB];
  assert_int_equal(lookup_run(c.e, c.nx, &c.x), NB);
  assert_int_equal(load_run(c.e, c.nx, &c.x, c.kx, ok), NB);
  /* pick a block of each run whose slots differ, each with another master as target */
  node_info m[NODES];
  assert_int_equal(masters_load(m), 3);
  uint16_t sa = block_slot(&c.kx[NB / 2]), sb = block_slot(&c.ky[NB / 2]);
  assert_int_not_equal(sa, sb);
  int src_a = slot_owner(sa), src_b = slot_owner(sb), dst_a = -1, dst_b = -1;
  const char *id_a = NULL, *id_b = NULL, *sid_a = NULL, *sid_b = NULL;
  for (int i = 0; i < 3; i++) {
    if (m[i].port == src_a) sid_a = m[i].id;
    if (m[i].port == src_b) sid_b = m[i].id;
  }
  for (int i = 0; i < 3; i++) {
    if (dst_a < 0 && m[i].port != src_a) dst_a = m[i].port, id_a = m[i].id;
    if (dst_b < 0 && m[i].port != src_b) dst_b = m[i].port, id_b = m[i].id;
  }
  assert_non_null(sid_a);
  assert_non_null(sid_b);
  rcu_admin_ok(dst_a, "CLUSTER SETSLOT %d IMPORTING %s", (int)sa, sid_a);
  rcu_admin_ok(src_a, "CLUSTER SETSLOT %d MIGRATING %s", (int)sa, id_a);
  rcu_admin_ok(dst_b, "CLUSTER SETSLOT %d IMPORTING %s", (int)sb, sid_b);
  rcu_admin_ok(src_b, "CLUSTER SETSLOT %d MIGRATING %s", (int)sb, id_b);
  char name[KVT_REMOTE_KEY_MAX];
  size_t nlen = kvt_remote_block_key(&c.kx[NB / 2], name);
  rcu_admin_ok(src_a, "MIGRATE 127.0.0.1 %d %b 0 5000", dst_a, name, nlen);
  assert_false(key_on(src_a, &c.kx[NB / 2], 0)); /* moved: the source answers ASK */
  /* mid-migration: run a is all there, run b is written */
  assert_int_equal(lookup_run(c.e, c.nx, &c.x), NB);
  assert_int_equal(load_run(c.e, c.nx, &c.x, c.kx, ok), NB);
  assert_int_equal(put_run(&c.y), 0);
  assert_true(key_on(dst_b, &c.ky[NB / 2], 1)); /* written where the ASK pointed */
  assert_false(key_on(src_b, &c.ky[NB / 2], 0));
  assert_int_equal(lookup_run(c.e, nsb, &c.y), NB);
  assert_int_equal(load_run(c.e, nsb, &c.y, c.ky, ok), NB);
  /* finish both migrations: every master learns the new owners */
  migrate_rest(src_a, dst_a, sa);
  migrate_rest(src_b, dst_b, sb);
  for (int i = 0; i < 3; i++) {
    rcu_admin_ok(m[i].port, "CLUSTER SETSLOT %d NODE %s", (int)sa, id_a);
    rcu_admin_ok(m[i].port, "CLUSTER SETSLOT %d NODE %s", (int)sb, id_b);
  }
  assert_int_equal(slot_owner(sa), dst_a);
  assert_int_equal(lookup_run(c.e, c.nx, &c.x), NB);
  assert_int_equal(load_run(c.e, c.nx, &c.x, c.kx, ok), NB);
  assert_int_equal(lookup_run(c.e, nsb, &c.y), NB);
  assert_int_equal(load_run(c.e, nsb, &c.y, c.ky, ok), NB);
  kvt_remote_stats rs = rstats(c.e);
  assert_int_equal(rs.checksum_failures, 0);
  assert_int_equal(rs.timeouts, 0);
  case_end(&c);
}

/* ------------------------------------------------------------ SIGSTOP */

/* A master stopped (its replica told not to take over, so the stop is a
 * pure stall): calls return within the bound, its blocks are misses, the
 * others load; after SIGCONT every block loads bit-exact again. */
static void test_sigstop(void **state) {
  (void)state;
  tcase c;
  case_start(&c, "stop", NULL);
  int ok[NB], stopped[NB], n_stopped, first, victim;
  assert_int_equal(lookup_run(c.e, c.nx, &c.x), NB);
  assert_int_equal(load_run(c.e, c.nx, &c.x, c.kx, ok), NB);
  pid_t pid = victim_pick(c.kx, &victim, stopped, &n_stopped, &first);
  for (int p = g_port; p < g_port + NODES; p++)
    rcu_admin_ok(p, "CONFIG SET cluster-replica-no-failover yes");
  assert_int_equal(kill(pid, SIGSTOP), 0);
  /* stalled: lookups stop at its first block, loads miss its blocks */
  assert_int_equal(lookup_run(c.e, c.nx, &c.x), (size_t)first);
  assert_int_equal(load_run(c.e, c.nx, &c.x, c.kx, ok), NB - n_stopped);
  for (int b = 0; b < NB; b++) assert_int_equal(ok[b], !stopped[b]);
  kvt_remote_stats rs = rstats(c.e);
  assert_true(rs.timeouts > 0);
  assert_int_equal(rs.checksum_failures, 0);
  assert_int_equal(rs.evictions_noticed, 0); /* unreachable is not evicted */
  assert_int_equal(kill(pid, SIGCONT), 0);
  wait_all_hits(c.e, c.nx, &c.x, c.kx);
  case_end(&c);
  cluster_reset();
}

/* ------------------------------------------------------------ evictions */

/* Blocks a lookup saw, then evicted by maxmemory-policy before the load:
 * misses counted as evictions noticed. Blocks never stored are plain
 * misses, and a lookup that finds nothing notices nothing. */
static void test_evictions_noticed(void **state) {
  (void)state;
  tcase c;
  case_start(&c, "evict", "never");
  kvt_ns_id nn = tu_register(c.e, c.y.model, &c.y.sh);
  assert_int_equal(lookup_run(c.e, c.nx, &c.x), NB); /* EXISTS: all there */
  int ok[NB];
  assert_int_equal(load_run(c.e, nn, &c.y, c.ky, ok), 0);
  kvt_remote_stats r0 = rstats(c.e);
  assert_int_equal(r0.evictions_noticed, 0);
  assert_true(r0.misses >= NB);
  /* squeeze every master below its own footprint: allkeys-lru evicts all */
  node_info m[NODES];
  int nm = masters_load(m);
  for (int i = 0; i < nm; i++) {
    rcu_admin_ok(m[i].port, "CONFIG SET maxmemory-policy allkeys-lru");
    rcu_admin_ok(m[i].port, "CONFIG SET maxmemory 1");
  }
  uint64_t end = now_ms() + POLL_MS;
  for (int i = 0; i < nm; i++) {
    for (;;) {
      redisReply *r = admin(m[i].port, "DBSIZE");
      assert_non_null(r);
      long long n = r->integer;
      freeReplyObject(r);
      if (n == 0) break;
      assert_true(now_ms() < end);
      freeReplyObject(admin(m[i].port, "GET kvt-test-nudge")); /* a command runs eviction */
      nap_ms(50);
    }
  }
  assert_int_equal(load_run(c.e, c.nx, &c.x, c.kx, ok), 0);
  kvt_remote_stats r1 = rstats(c.e);
  assert_int_equal(r1.evictions_noticed, NB);
  assert_true(r1.misses >= r0.misses + NB);
  assert_int_equal(r1.checksum_failures, 0);
  /* known gone now: plain misses from here on */
  assert_int_equal(lookup_run(c.e, c.nx, &c.x), 0);
  assert_int_equal(load_run(c.e, c.nx, &c.x, c.kx, ok), 0);
  assert_int_equal(load_run(c.e, nn, &c.y, c.ky, ok), 0);
  kvt_remote_stats r2 = rstats(c.e);
  assert_int_equal(r2.evictions_noticed, NB);
  assert_true(r2.misses > r1.misses);
  case_end(&c);
  cluster_reset();
}

/* ------------------------------------------------------------ failover */

/* A master killed (SIGKILL) with a replica: at once its blocks are misses
 * and the rest load; once the replica took over (the client learns it
 * from a refused connection and a fresh CLUSTER SLOTS), every block loads
 * bit-exact again - each was on the replica before the kill - and new
 * blocks are written. Last: the node stays dead. */
static void test_failover(void **state) {
  (void)state;
  tcase c;
  case_start(&c, "fail", "after");
  wait_replicated(); /* before the kill: the replica has every block */
  int ok[NB], dead[NB], n_dead, first, victim;
  assert_int_equal(lookup_run(c.e, c.nx, &c.x), NB);
  assert_int_equal(load_run(c.e, c.nx, &c.x, c.kx, ok), NB);
  pid_t pid = victim_pick(c.kx, &victim, dead, &n_dead, &first);
  assert_int_equal(kill(pid, SIGKILL), 0);
  rfx_wait_gone(pid);
  /* failing over (it takes the cluster node timeout, 2 s, at least) */
  assert_int_equal(lookup_run(c.e, c.nx, &c.x), (size_t)first);
  assert_int_equal(load_run(c.e, c.nx, &c.x, c.kx, ok), NB - n_dead);
  for (int b = 0; b < NB; b++) assert_int_equal(ok[b], !dead[b]);
  /* the replica takes over: hits resume, bit-exact */
  wait_cluster_ok();
  wait_all_hits(c.e, c.nx, &c.x, c.kx);
  assert_int_not_equal(slot_owner(block_slot(&c.kx[NB - 1])), victim);
  kvt_remote_stats rs = rstats(c.e);
  assert_int_equal(rs.checksum_failures, 0);
  assert_int_equal(rs.evictions_noticed, 0);
  /* and new blocks land */
  assert_int_equal(put_run(&c.y), 0);
  kvt_ns_id nsy = tu_register(c.e, c.y.model, &c.y.sh);
  assert_int_equal(lookup_run(c.e, nsy, &c.y), NB);
  assert_int_equal(load_run(c.e, nsy, &c.y, c.ky, ok), NB);
  case_end(&c);
}

int main(void) {
  rcu_require_redis();
  g_port = rcu_base_port(7130);
  g_dir = rfx_cluster_dir();
  snprintf(g_url, sizeof g_url, "redis://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", g_port,
           g_port + 1, g_port + 2);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slot_migration),
      cmocka_unit_test(test_sigstop),
      cmocka_unit_test(test_evictions_noticed),
      cmocka_unit_test(test_failover), /* last: a node stays dead */
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
