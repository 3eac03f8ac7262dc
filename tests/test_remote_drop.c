/* test_remote_drop.c - the remote tier's bookkeeping against the ctest
 * fixture's Redis Cluster: a prefix drop removes from the cluster the
 * root and every block that extends it (with a local cold tier after a
 * reopen, and diskless), not a sibling chain; a remote hit copied into
 * the local tier is admitted under its own namespace; a remove cancels
 * the queued writes of its keys and waits for a batch in flight, so no
 * write recreates a dropped block; the writer's batch spreads over the
 * masters. Skips (77) without redis-server. */
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/key.h"
#include "base/mem.h"
#include "engine/internal.h"
#include "io/rcluster.h"
#include "rc_util.h"
#include "remote_fx.h"
#include "tiers/remote.h"
#include "tiers/store.h"

#define NB 8
#define CUT 3 /* the drop names the first CUT blocks */

static char g_url[128];

/* ------------------------------------------------------------ drops */

typedef struct chain {
  char model[64];
  kvt_shape sh;
  uint64_t salt;
  uint32_t a[NB * 4], b[NB * 4]; /* two chains of one namespace, no block shared */
} chain;

static void chain_init(chain *c, const char *what) {
  snprintf(c->model, sizeof c->model, "drop-%s-%llx", what, (unsigned long long)tu_rand());
  c->sh = tu_shape_small(KVT_F16);
  c->salt = tu_salt(c->model);
  for (size_t i = 0; i < NB * 4; i++) {
    c->a[i] = (uint32_t)tu_below(50000);
    c->b[i] = 50000 + (uint32_t)tu_below(50000);
  }
}

static kvt_engine *open_remote(const char *dir, uint64_t cold) {
  return rfx_open(dir, g_url, cold, 20000);
}

static void put_chain(kvt_engine *e, kvt_ns_id ns, const chain *c, const uint32_t *tok) {
  rfx_put(e, ns, &c->sh, c->salt, tok, NB, 0);
}

/* How many of the chain's blocks the cluster holds. */
static int in_cluster(const kvt_key *keys) {
  return rfx_in_cluster(g_url, keys, NB);
}

static void keys_of(kvt_engine *e, kvt_ns_id ns, const uint32_t *tok, kvt_key *keys) {
  kvt_lookup_entry ent[NB];
  size_t found;
  assert_int_equal(kvt_lookup(e, ns, tok, NB * 4, ent, NB, &found), 0);
  assert_int_equal(found, NB);
  for (int i = 0; i < NB; i++) keys[i] = ent[i].key;
}

/* Write chains a and b, then drop a's first CUT blocks: all of a leaves
 * the cluster, b stays. cold: the local tier's limit (0: diskless);
 * reopen: drop from a fresh engine, so only the local tier knows the
 * blocks that extend the cut. */
static void drop_case(uint64_t cold, int reopen) {
  chain c;
  chain_init(&c, cold ? "cold" : "diskless");
  char *d = tu_tmpdir();
  kvt_engine *e = open_remote(d, cold);
  kvt_ns_id ns = tu_register(e, c.model, &c.sh);
  put_chain(e, ns, &c, c.a);
  put_chain(e, ns, &c, c.b);
  assert_int_equal(kvt_sync(e), 0);
  kvt_remote_drain(kvt_store_remote_of(e->store)); /* with a local tier: written in the background */
  kvt_key ka[NB], kb[NB];
  keys_of(e, ns, c.a, ka);
  keys_of(e, ns, c.b, kb);
  if (reopen) {
    kvt_engine_close(e);
    e = open_remote(d, cold);
    ns = tu_register(e, c.model, &c.sh);
  }
  assert_int_equal(in_cluster(ka), NB);
  assert_int_equal(in_cluster(kb), NB);
  uint64_t dropped = 0;
  assert_int_equal(kvt_drop_prefix(e, ns, c.a, CUT * 4, &dropped), 0);
  assert_int_equal(in_cluster(ka), 0); /* the cut, its root and all that extends it */
  assert_int_equal(in_cluster(kb), NB);
  assert_int_equal(dropped, NB);
  size_t found = 1;
  kvt_lookup_entry ent[NB];
  assert_int_equal(kvt_lookup(e, ns, c.a, NB * 4, ent, NB, &found), 0);
  assert_int_equal(found, 0);
  assert_int_equal(kvt_lookup(e, ns, c.b, NB * 4, ent, NB, &found), 0);
  assert_int_equal(found, NB);
  kvt_engine_close(e);
  tu_rmtree(d);
}

static void test_drop_cold_reopened(void **state) {
  (void)state;
  drop_case(256ull << 20, 1);
}

static void test_drop_diskless(void **state) {
  (void)state;
  drop_case(0, 0);
}

/* ------------------------------------------------------------ copies */

#define NL 3
#define EACH 6000

typedef struct ns_probe {
  kvt_key seed[8];
  int n;
} ns_probe;

static uint32_t probe_ns_of(void *arg, const kvt_key *seed) {
  ns_probe *p = arg;
  if (p->n < 8) p->seed[p->n++] = *seed;
  return 5;
}

/* A block only the cluster has, read through a store with a local cold
 * tier: the copy written locally is admitted under the namespace the
 * owner names for the record's seed (before: namespace 0, unasked). */
static void test_copy_namespace(void **state) {
  (void)state;
  kvt_mem m;
  kvt_mem_init(&m, 0);
  static uint8_t kv[NL][2 * EACH];
  const uint8_t *ptr[NL];
  for (int l = 0; l < NL; l++) {
    for (size_t i = 0; i < 2 * EACH; i++) kv[l][i] = (uint8_t)tu_rand();
    ptr[l] = kv[l];
  }
  kvt_store_rec rec = {.key = rfx_key(0), .parent = rfx_key(0), .ns_seed = rfx_key(0), .pos = 0,
                       .n_layers = NL, .dtype = KVT_F16, .bytes_each = EACH, .layers = ptr};
  /* a diskless writer puts it in the cluster */
  kvt_store *w = NULL;
  kvt_store_config wc = {.remote_url = g_url, .remote_deadline_ms = 20000};
  assert_int_equal(kvt_store_open(&m, &wc, &w), 0);
  size_t written = 0;
  assert_int_equal(kvt_store_write(w, &rec, 1, &written), 0);
  assert_int_equal(written, 1);
  kvt_store_close(w);
  /* a store with a local tier reads it: a remote hit, copied locally */
  char *d = tu_tmpdir();
  kvt_store_config c = {.dir = d, .bytes_limit = 256ull << 20, .segment_bytes = 64ull << 20,
                        .group_bytes = 16ull << 20, .zstd_level = 1, .io_depth = 64,
                        .remote_url = g_url, .remote_deadline_ms = 20000};
  kvt_store *s = NULL;
  assert_int_equal(kvt_store_open(&m, &c, &s), 0);
  ns_probe probe = {0};
  kvt_store_set_hooks(s, &(kvt_store_hooks){.arg = &probe, .ns_of = probe_ns_of});
  static uint8_t k[EACH], v[EACH];
  assert_int_equal(kvt_store_read_layer(s, &rec.key, 1, k, v, EACH), 0);
  assert_memory_equal(k, kv[1], EACH);
  assert_memory_equal(v, kv[1] + EACH, EACH);
  assert_int_equal(kvt_store_drain(s), 0); /* the flusher's turn: copies are written */
  kvt_remote_counts rc;
  assert_int_equal(kvt_store_remote_counts(s, &rc, NULL), 0);
  assert_int_equal(rc.local_copies, 1);
  assert_int_equal(probe.n, 1);
  assert_true(kvt_key_eq(&probe.seed[0], &rec.ns_seed));
  kvt_store_close(s);
  tu_rmtree(d);
  assert_int_equal(kvt_mem_total(&m), 0);
  kvt_mem_fini(&m);
}

/* ------------------------------------------------------------ queued writes */

#define NQ NB

typedef struct qcase {
  kvt_mem m;
  kvt_remote *r;
  kvt_key keys[NQ];
  size_t settled, settled_bad;
  int removed;                /* the remover thread is done (atomic) */
} qcase;

static void q_settled(void *arg, size_t from, size_t to, int rc) {
  qcase *q = arg;
  __atomic_add_fetch(rc ? &q->settled_bad : &q->settled, to - from, __ATOMIC_RELAXED);
}

/* Open a remote tier with its writer held (hold) and post NQ blocks. */
static void q_open(qcase *q, int hold) {
  memset(q, 0, sizeof *q);
  kvt_mem_init(&q->m, 0);
  kvt_remote_cfg cfg = {.url = g_url, .deadline_ms = 20000};
  char err[256] = "";
  int rc = kvt_remote_open(&q->m, &cfg, &q->r, err, sizeof err);
  if (rc) fprintf(stderr, "open: %s\n", err);
  assert_int_equal(rc, 0);
  kvt_remote_test_hold(q->r, hold, NULL, NULL);
  static uint8_t kv[NL][2 * 512];
  const uint8_t *ptr[NL];
  for (int l = 0; l < NL; l++) {
    for (size_t i = 0; i < sizeof kv[l]; i++) kv[l][i] = (uint8_t)tu_rand();
    ptr[l] = kv[l];
  }
  kvt_store_rec recs[NQ];
  for (int i = 0; i < NQ; i++) {
    q->keys[i] = rfx_key(0);
    recs[i] = (kvt_store_rec){.key = q->keys[i], .parent = rfx_key(0), .ns_seed = rfx_key(0),
                              .pos = (uint32_t)i, .n_layers = NL, .dtype = KVT_F16,
                              .bytes_each = 512, .layers = ptr};
  }
  assert_int_equal(kvt_remote_post(q->r, recs, NQ, 1, q_settled, q), NQ);
}

/* Let the writer go, wait for it: every block settled (0) and none in
 * the cluster. */
static void q_close(qcase *q) {
  kvt_remote_test_hold(q->r, 0, NULL, NULL);
  kvt_remote_drain(q->r);
  assert_int_equal(rfx_in_cluster(g_url, q->keys, NQ), 0); /* no SET after the DEL */
  assert_int_equal(q->settled + q->settled_bad, NQ);
  kvt_remote_close(q->r);
  assert_int_equal(kvt_mem_total(&q->m), 0);
  kvt_mem_fini(&q->m);
}

/* Writes still queued when their blocks are removed (a prefix drop) are
 * not sent: before, the writer SET them after the DEL and the dropped
 * blocks were back in the cluster. */
static void test_remove_cancels_queued(void **state) {
  (void)state;
  qcase q;
  q_open(&q, 1);
  assert_int_equal(kvt_remote_remove_many(q.r, q.keys, NQ), 0); /* none there yet */
  q_close(&q);
}

static void *q_remove(void *arg) {
  qcase *q = arg;
  kvt_remote_remove_many(q->r, q->keys, NQ);
  __atomic_store_n(&q->removed, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void q_pause(void) {
  struct timespec ts = {0, 1000000};
  nanosleep(&ts, NULL);
}

/* A batch already taken by the writer (on its way to the cluster) when
 * its blocks are removed: the remove waits until the batch is answered,
 * then DELs. Before, the DEL could reach a node first. The writer is
 * held between taking and sending; the remover runs until it either
 * finished or waits for that batch, then the writer goes. */
static void test_remove_waits_in_flight(void **state) {
  (void)state;
  qcase q;
  q_open(&q, 2);
  int busy = 0;
  for (int i = 0; i < 100000 && !busy; i++) {
    kvt_remote_test_hold(q.r, -1, &busy, NULL);
    if (!busy) q_pause();
  }
  assert_true(busy); /* the batch is taken, not sent */
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, q_remove, &q), 0);
  uint64_t waited = 0;
  for (int i = 0; i < 100000 && !waited && !__atomic_load_n(&q.removed, __ATOMIC_ACQUIRE); i++) {
    kvt_remote_test_hold(q.r, -1, NULL, &waited);
    if (!waited) q_pause();
  }
  kvt_remote_test_hold(q.r, 0, NULL, NULL);
  pthread_join(t, NULL);
  q_close(&q);
  assert_int_equal(waited, 1); /* it did wait for the batch */
}

/* ------------------------------------------------------------ batches */

#define SP_A 7                /* values queued first, all for one master */
#define SP_N (SP_A + 2)       /* then one for each of two others */
#define SP_EACH (256u << 10)  /* 4 layers of 2 x 256 KiB: values of 2 MiB and a header */

/* The master of a block's key, "host:port" into who, through client rc. */
static void sp_master(kvt_rc *rc, const kvt_key *k, char *who, size_t len) {
  char ks[KVT_REMOTE_KEY_MAX];
  size_t n = kvt_remote_block_key(k, ks);
  assert_int_equal(kvt_rc_slot_node(rc, kvt_rc_slot(ks, n), who, len), 0);
}

/* SP_N keys: SP_A on one master, then one on each of two others. */
static void sp_keys(kvt_rc *rc, kvt_key *keys, char (*who)[160]) {
  int n = 0;
  for (int tries = 0; n < SP_N && tries < 100000; tries++) {
    kvt_key k = rfx_key(0);
    char w[160];
    sp_master(rc, &k, w, sizeof w);
    int on_first = n > 0 && !strcmp(w, who[0]);
    if (n < SP_A ? n > 0 && !on_first : on_first || (n > SP_A && !strcmp(w, who[SP_A])))
      continue;
    snprintf(who[n], sizeof who[n], "%s", w);
    keys[n++] = k;
  }
  assert_int_equal(n, SP_N);
}

static void sp_settled(void *arg, size_t from, size_t to, int rc) {
  if (!rc) __atomic_add_fetch((size_t *)arg, to - from, __ATOMIC_RELAXED);
}

/* The writer's batch spreads over the masters: SP_A values of 2 MiB for
 * one master queued, then one for each of the two others. A batch is
 * WRITE_WINDOWS windows per master, a window 8 MiB over the masters (3:
 * 2.67 MiB, one value of 2 MiB in flight per master): it takes five of
 * the first master's (10.5 MiB of 10.67) and the other two; the first
 * master's last two wait. Before, a batch was the first 8 MiB of the
 * queue: three values, all for the first master, and the other masters
 * sat idle until it had stored them. */
static void test_batch_spread(void **state) {
  (void)state;
  kvt_rc_config ccfg = {.url = g_url, .deadline_ms = 20000};
  kvt_rc *rc;
  assert_int_equal(kvt_rc_open(&ccfg, &rc, NULL, 0), 0);
  kvt_key keys[SP_N], got[SP_N];
  char who[SP_N][160], gw[160];
  sp_keys(rc, keys, who);
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_remote_cfg cfg = {.url = g_url, .deadline_ms = 20000};
  kvt_remote *r;
  assert_int_equal(kvt_remote_open(&m, &cfg, &r, NULL, 0), 0);
  kvt_remote_test_hold(r, 1, NULL, NULL); /* all queued before it takes any */
  static uint8_t kv[2 * SP_EACH];
  const uint8_t *ptr[4] = {kv, kv, kv, kv};
  kvt_store_rec recs[SP_N];
  for (int i = 0; i < SP_N; i++)
    recs[i] = (kvt_store_rec){.key = keys[i], .parent = rfx_key(0), .ns_seed = rfx_key(0),
                              .n_layers = 4, .dtype = KVT_F16, .bytes_each = SP_EACH, .layers = ptr};
  size_t stored = 0;
  assert_int_equal(kvt_remote_post(r, recs, SP_N, KVT_REMOTE_WAIT, sp_settled, &stored), SP_N);
  kvt_remote_test_hold(r, 2, NULL, NULL); /* it takes one batch and holds it */
  int busy = 0;
  for (int i = 0; i < 100000 && !busy; i++) {
    kvt_remote_test_hold(r, -1, &busy, NULL);
    if (!busy) q_pause();
  }
  assert_true(busy);
  size_t n = kvt_remote_test_flight(r, got, SP_N);
  int per[3] = {0}; /* the first master, the second, the third */
  for (size_t i = 0; i < n && i < SP_N; i++) {
    sp_master(rc, &got[i], gw, sizeof gw);
    per[!strcmp(gw, who[0]) ? 0 : !strcmp(gw, who[SP_A]) ? 1 : 2]++;
  }
  assert_int_equal(n, 7);
  assert_int_equal(per[0], 5); /* its share: as many as fit in WRITE_WINDOWS windows */
  assert_int_equal(per[1], 1);
  assert_int_equal(per[2], 1);
  assert_int_equal(kvt_remote_test_queued(r), 2);
  kvt_remote_test_hold(r, 1, NULL, NULL); /* it sends that batch and takes no other */
  for (int i = 0; i < 100000 && busy; i++) {
    kvt_remote_test_hold(r, -1, &busy, NULL);
    if (busy) q_pause();
  }
  assert_false(busy);
  kvt_remote_test_hold(r, 2, NULL, NULL); /* the next batch: the two left, in their order */
  for (int i = 0; i < 100000 && !busy; i++) {
    kvt_remote_test_hold(r, -1, &busy, NULL);
    if (!busy) q_pause();
  }
  assert_true(busy);
  assert_int_equal(kvt_remote_test_flight(r, got, SP_N), 2);
  assert_memory_equal(&got[0], &keys[SP_A - 2], sizeof *got);
  assert_memory_equal(&got[1], &keys[SP_A - 1], sizeof *got);
  kvt_remote_test_hold(r, 0, NULL, NULL);
  kvt_remote_drain(r);
  assert_int_equal(stored, SP_N); /* those left for the next batch were sent too */
  assert_int_equal(rfx_in_cluster(g_url, keys, SP_N), SP_N);
  assert_int_equal(kvt_remote_remove_many(r, keys, SP_N), SP_N);
  kvt_remote_close(r);
  kvt_rc_close(rc);
  assert_int_equal(kvt_mem_total(&m), 0);
  kvt_mem_fini(&m);
}

int main(void) {
  rcu_require_redis();
  snprintf(g_url, sizeof g_url, "redis://127.0.0.1:%d", rcu_base_port(7100));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_drop_cold_reopened),
      cmocka_unit_test(test_drop_diskless),
      cmocka_unit_test(test_copy_namespace),
      cmocka_unit_test(test_remove_cancels_queued),
      cmocka_unit_test(test_remove_waits_in_flight),
      cmocka_unit_test(test_batch_spread),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
