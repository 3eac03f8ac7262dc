/* test_remote_redrop.c - a prefix drop and a put of the same blocks while
 * the drop removes them from the store (those removals run with the
 * engine lock let go): the blocks put again end up stored and found after
 * a reopen, diskless and with a local cold tier. The put runs inside the
 * drop's window (the engine's test hook), the remote writer held: no
 * timing. Writes cancelled by a drop are counted. Skips (77) without
 * redis-server. */
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine/internal.h"
#include "io/rcluster.h"
#include "rc_util.h"
#include "remote_fx.h"
#include "tiers/remote.h"

#define NB 8
#define CUT 3 /* the drop names the first CUT blocks; they are put again */

static char g_url[128];

typedef struct window {
  kvt_engine *e;
  kvt_remote *r;
  kvt_ns_id ns;
  kvt_shape sh;
  uint64_t salt;
  const uint32_t *tok;
  int diskless, ran;
} window;

/* Every block the engine queued has left its flusher: settled by the
 * local tier, or (diskless) waiting in the held remote writer's queue. */
static int handed_over(window *w) {
  pthread_mutex_lock(&w->e->lock);
  uint64_t pending = w->e->enqueued - w->e->completed;
  pthread_mutex_unlock(&w->e->lock);
  return pending == (w->diskless ? kvt_remote_test_queued(w->r) : 0);
}

/* The namespace's count of indexed blocks waiting for its drop. */
static uint64_t drop_waits(window *w) {
  pthread_mutex_lock(&w->e->lock);
  uint64_t n = kvt_ns_find(w->e, w->ns)->drop_waits;
  pthread_mutex_unlock(&w->e->lock);
  return n;
}

/* In the drop's window (its index work done, its store removals not yet):
 * the first CUT blocks put again and handed over as far as they go; each
 * waits for the drop, and is counted once (drop_done scans for them). */
static void put_in_window(void *arg) {
  window *w = arg;
  assert_int_equal(drop_waits(w), 0);
  rfx_put(w->e, w->ns, &w->sh, w->salt, w->tok, CUT, 0);
  assert_int_equal(drop_waits(w), CUT);
  for (int i = 0; i < 100000 && !handed_over(w); i++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  assert_true(handed_over(w));
  w->ran = 1;
}

/* Before: a block put again in the window was taken as durable (found in
 * the store the drop was about to clear, or its queued write cancelled
 * and settled 0), and kvt_sync said 0 while the store lost it. */
static void put_during_drop(uint64_t cold) {
  char model[64];
  snprintf(model, sizeof model, "redrop-%llx", (unsigned long long)tu_rand());
  window w = {.sh = tu_shape_small(KVT_F16), .salt = tu_salt(model), .diskless = cold == 0};
  uint32_t tok[NB * 4];
  for (size_t i = 0; i < NB * 4; i++) tok[i] = (uint32_t)tu_below(50000);
  w.tok = tok;
  char *d = tu_tmpdir();
  w.e = rfx_open(d, g_url, cold, 20000);
  w.ns = tu_register(w.e, model, &w.sh);
  rfx_put(w.e, w.ns, &w.sh, w.salt, tok, NB, 0);
  assert_int_equal(kvt_sync(w.e), 0);
  w.r = kvt_store_remote_of(w.e->store);
  assert_non_null(w.r);
  kvt_remote_drain(w.r); /* with a local tier the cluster's copy is written in the background */
  kvt_key keys[NB];
  size_t nk = 0;
  assert_int_equal(kvt_keys(w.e, w.ns, tok, NB * 4, keys, NB, &nk), 0);
  assert_int_equal(rfx_in_cluster(g_url, keys, NB), NB);
  kvt_remote_test_hold(w.r, 1, NULL, NULL);
  w.e->test_drop_window = put_in_window;
  w.e->test_drop_arg = &w;
  uint64_t dropped = 0;
  assert_int_equal(kvt_drop_prefix(w.e, w.ns, tok, CUT * 4, &dropped), 0);
  w.e->test_drop_window = NULL;
  assert_true(w.ran);
  assert_int_equal(drop_waits(&w), 0); /* all found and written */
  kvt_remote_test_hold(w.r, 0, NULL, NULL);
  assert_int_equal(kvt_sync(w.e), 0);
  kvt_remote_drain(w.r); /* with a local tier the cluster's copy is best effort: let it go */
  assert_int_equal(rfx_in_cluster(g_url, keys, CUT), CUT);           /* put again: stored */
  assert_int_equal(rfx_in_cluster(g_url, keys + CUT, NB - CUT), 0); /* what extended the cut: dropped */
  kvt_engine_close(w.e);
  kvt_engine *e = rfx_open(d, g_url, cold, 20000);
  kvt_ns_id ns = tu_register(e, model, &w.sh);
  kvt_lookup_entry ent[NB];
  size_t found = 0;
  assert_int_equal(kvt_lookup(e, ns, tok, NB * 4, ent, NB, &found), 0);
  assert_int_equal(found, CUT); /* durable where kvt_sync said so */
  kvt_engine_close(e);
  tu_rmtree(d);
}

static void test_put_during_drop_diskless(void **state) {
  (void)state;
  put_during_drop(0);
}

static void test_put_during_drop_cold(void **state) {
  (void)state;
  put_during_drop(256ull << 20);
}

/* Writes queued when their blocks are dropped are not sent, and counted
 * (kvt_remote_stats.write_cancelled): a diskless engine, its remote writer
 * held while the whole chain waits in its queue; the drop cancels the
 * writes of the blocks it names (what extends them goes once written,
 * not being in the index any more). */
static void test_cancelled_counted(void **state) {
  (void)state;
  char model[64];
  snprintf(model, sizeof model, "redrop-c-%llx", (unsigned long long)tu_rand());
  window w = {.sh = tu_shape_small(KVT_F16), .salt = tu_salt(model), .diskless = 1};
  uint32_t tok[NB * 4];
  for (size_t i = 0; i < NB * 4; i++) tok[i] = (uint32_t)tu_below(50000);
  char *d = tu_tmpdir();
  w.e = rfx_open(d, g_url, 0, 20000);
  w.ns = tu_register(w.e, model, &w.sh);
  w.r = kvt_store_remote_of(w.e->store);
  assert_non_null(w.r);
  kvt_remote_stats rs = {.size = sizeof rs};
  assert_int_equal(kvt_remote_stats_get(w.e, &rs), 0);
  assert_int_equal(rs.write_cancelled, 0);
  kvt_remote_test_hold(w.r, 1, NULL, NULL);
  rfx_put(w.e, w.ns, &w.sh, w.salt, tok, NB, 0);
  for (int i = 0; i < 100000 && kvt_remote_test_queued(w.r) < NB; i++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(kvt_remote_test_queued(w.r), NB);
  uint64_t dropped = 0;
  assert_int_equal(kvt_drop_prefix(w.e, w.ns, tok, CUT * 4, &dropped), 0);
  kvt_remote_test_hold(w.r, 0, NULL, NULL);
  kvt_remote_drain(w.r);
  assert_int_equal(kvt_remote_stats_get(w.e, &rs), 0);
  assert_int_equal(rs.write_cancelled, CUT);
  assert_int_equal(rs.writes + rs.write_exists, NB - CUT); /* sent, then removed */
  kvt_key keys[NB];
  size_t nk = 0;
  assert_int_equal(kvt_keys(w.e, w.ns, tok, NB * 4, keys, NB, &nk), 0);
  assert_int_equal(kvt_sync(w.e), 0);
  assert_int_equal(rfx_in_cluster(g_url, keys, NB), 0);
  kvt_engine_close(w.e);
  tu_rmtree(d);
}

int main(void) {
  rcu_require_redis();
  snprintf(g_url, sizeof g_url, "redis://127.0.0.1:%d", rcu_base_port(7100));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_put_during_drop_diskless),
      cmocka_unit_test(test_put_during_drop_cold),
      cmocka_unit_test(test_cancelled_counted),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
