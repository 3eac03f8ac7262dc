/* test_engine_learned.c - the learned order as the engine runs it by
 * default (kvt_options_init: KVT_EVICT_LEARNED): through kvt_engine_open's
 * own admission and eviction, a replay and a copy whose requests after T
 * are shuffled decide the same before T, and a restarted store starts
 * from the model it had (not cold). */
#include "testutil.h"
#include "cold_util.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conv_trace.h"
#include "engine/internal.h"
#include "tiers/cold.h"
#include "tiers/evict.h"
#include "tiers/reuse_model.h"

#define N_REQ 1600
#define BT 16 /* tokens a block */

static const kvt_shape SHAPE = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 16,
                                .dtype = KVT_F16, .block_tokens = BT};

/* One request as kvtier plan replays it: look up the leading run, then
 * append every block and put those no tier had. */
static void run_request(kvt_engine *e, kvt_ns_id ns, const ct_req *r, ct_step *out) {
  static uint32_t tok[CT_MAX_BLK * BT];
  ct_tokens(r, BT, tok);
  size_t found = ct_lookup(e, ns, r, BT, tok);
  ct_append_put(e, ns, &SHAPE, tok, r->n, 1);
  kvt_stats st;
  tu_stats(e, &st);
  *out = (ct_step){found, st.cold_records, st.evictions[KVT_TIER_COLD]};
}

/* Replay through a metadata-only engine with the default options but
 * for the limits: a hot tier smaller than one layer block (every block
 * goes to the cold tier, which holds 300 of them). */
static void replay(const ct_req *reqs, size_t n, ct_step *log) {
  kvt_ns_id ns;
  kvt_engine *e = ct_open_cold(&SHAPE, 300, -1, "engine-learned", &ns);
  for (size_t i = 0; i < n; i++) run_request(e, ns, &reqs[i], &log[i]);
  kvt_engine_close(e);
}

/* Every hit, record count and eviction count before T is the same
 * whatever comes after T. */
static void test_engine_no_future_leak(void **state) {
  (void)state;
  ct_no_future_leak(replay, N_REQ, "records");
}

/* ------------------------------------------------------------ restart */

static kvt_cold *cold_of(kvt_engine *e) { return e->store ? e->store->impl : NULL; }

/* Chains written and some looked up again, through the engine. */
static void use_store(kvt_engine *e, kvt_ns_id ns) {
  kvt_shape sh = SHAPE;
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  static uint32_t tok[4 * BT];
  for (uint32_t i = 0; i < 120; i++) {
    uint32_t c = i % 3 == 2 ? i - 2 : i; /* every third repeats an earlier chain */
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(e, ns, &s), 0);
    for (uint32_t k = 0; k < 4; k++) {
      for (uint32_t j = 0; j < BT; j++) tok[k * BT + j] = c * 1000 + k * BT + j;
      tu_append_put(s, &sh, 11, tok + k * BT, &kv);
    }
    kvt_seq_release(s);
  }
  assert_int_equal(kvt_sync(e), 0);
  tu_kv_free(&kv);
}

/* Default options: the cold and hot tiers run the learned order, and
 * their models are in the index across a restart. */
static void test_default_learned_restarts_warm(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD); /* no cold_evict set: the default */
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "engine-learned", &SHAPE);
  static uint8_t fresh[KVT_EVICT_MODEL_MAX], before[KVT_EVICT_MODEL_MAX], after[KVT_EVICT_MODEL_MAX];
  size_t n0 = kvt_cold_model_state(cold_of(e), fresh, sizeof fresh);
  assert_int_equal(n0, KVT_REUSE_STATE_BYTES); /* 0 unless the order is learned */
  use_store(e, ns);
  size_t n1 = kvt_cold_model_state(cold_of(e), before, sizeof before);
  assert_int_equal(n1, n0);
  assert_true(memcmp(fresh, before, n1) != 0); /* it learned something */
  static uint8_t hot_before[KVT_EVICT_MODEL_MAX], hot_after[KVT_EVICT_MODEL_MAX];
  assert_non_null(e->hot_ev);
  size_t h1 = kvt_evict_model_save(e->hot_ev, hot_before, sizeof hot_before);
  assert_int_equal(h1, n1);
  assert_true(memcmp(fresh, hot_before, h1) != 0);
  assert_true(memcmp(before, hot_before, h1) != 0); /* a model of its own */
  kvt_engine_close(e);

  e = tu_open(dir, &o);
  size_t n2 = kvt_cold_model_state(cold_of(e), after, sizeof after);
  assert_int_equal(n2, n1);
  assert_memory_equal(before, after, n1);
  size_t h2 = kvt_evict_model_save(e->hot_ev, hot_after, sizeof hot_after);
  assert_int_equal(h2, h1);
  assert_memory_equal(hot_before, hot_after, h1);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* The model's clock in a state as kvt_cold_model_state() gives it (its
 * bytes 16-23, little-endian: tiers/reuse_model.c), 0 for none. */
static uint64_t model_clock(kvt_engine *e) {
  static uint8_t st[KVT_EVICT_MODEL_MAX];
  size_t n = kvt_cold_model_state(cold_of(e), st, sizeof st);
  uint64_t v = 0;
  for (int i = 7; n >= 24 && i >= 0; i--) v = v << 8 | st[16 + i];
  return v;
}

static void tier_stats(kvt_engine *e, uint32_t tier, kvt_tier_stats *t) {
  assert_int_equal(kvt_stats_tier(e, tier, t, sizeof *t), 0);
  assert_int_equal(t->filled, sizeof *t);
}

/* kvt_stats_tier reports each learned model's clock and that of the copy
 * the store keeps: none in a new store, the model's own once a close has
 * written it, and what a read-only engine or one running another order
 * finds there (they run no learned model of their own in that tier). */
static void test_stats_report_models(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "engine-learned", &SHAPE);
  kvt_tier_stats hot, cold;
  tier_stats(e, KVT_TIER_HOT, &hot);
  tier_stats(e, KVT_TIER_COLD, &cold);
  assert_int_equal(hot.model_saved_accesses, 0);
  assert_int_equal(cold.model_saved_accesses, 0);
  use_store(e, ns);
  uint64_t cold_clock = model_clock(e), hot_clock = kvt_evict_model_clock(e->hot_ev);
  assert_true(cold_clock > 0 && hot_clock > 0);
  assert_true(cold_clock < KVT_EVICT_MODEL_SAVE_EVERY); /* none written before the close */
  tier_stats(e, KVT_TIER_HOT, &hot);
  tier_stats(e, KVT_TIER_COLD, &cold);
  assert_int_equal(hot.model_accesses, hot_clock);
  assert_int_equal(cold.model_accesses, cold_clock);
  assert_int_equal(hot.model_saved_accesses, 0);
  assert_int_equal(cold.model_saved_accesses, 0);
  kvt_engine_close(e);

  e = tu_open(dir, &o);
  tier_stats(e, KVT_TIER_HOT, &hot);
  tier_stats(e, KVT_TIER_COLD, &cold);
  print_message("after a restart: hot model %llu (kept %llu), cold %llu (kept %llu)\n",
                (unsigned long long)hot.model_accesses,
                (unsigned long long)hot.model_saved_accesses,
                (unsigned long long)cold.model_accesses,
                (unsigned long long)cold.model_saved_accesses);
  assert_int_equal(hot.model_accesses, hot_clock);
  assert_int_equal(hot.model_saved_accesses, hot_clock);
  assert_int_equal(cold.model_accesses, cold_clock);
  assert_int_equal(cold.model_saved_accesses, cold_clock);
  kvt_engine_close(e);

  kvt_options ro = o;
  ro.flags |= KVT_OPEN_RDONLY;
  e = tu_open(dir, &ro);
  tier_stats(e, KVT_TIER_COLD, &cold);
  tier_stats(e, KVT_TIER_HOT, &hot);
  assert_int_equal(cold.model_accesses, 0); /* a read-only store runs no order */
  assert_int_equal(cold.model_saved_accesses, cold_clock);
  assert_int_equal(hot.model_saved_accesses, hot_clock);
  kvt_engine_close(e);

  kvt_options chain = o;
  chain.cold_evict = KVT_EVICT_CHAIN;
  chain.hot_evict = KVT_EVICT_CHAIN;
  e = tu_open(dir, &chain);
  tier_stats(e, KVT_TIER_COLD, &cold);
  tier_stats(e, KVT_TIER_HOT, &hot);
  assert_int_equal(cold.model_accesses, 0);
  assert_int_equal(hot.model_accesses, 0);
  assert_int_equal(cold.model_saved_accesses, cold_clock); /* kept, not overwritten */
  assert_int_equal(hot.model_saved_accesses, hot_clock);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* Wait until every block of s is durable: its group was handed over. */
static int wait_durable(const kvt_seq *s, uint32_t n) {
  for (int i = 0; i < 20000; i++) {
    if (kvt_seq_durable(s) == n) return 0;
    usleep(1000);
  }
  return -1;
}

/* The child: learns until both models have counted three saves' worth
 * of accesses, then reports both clocks and is killed with SIGKILL. With
 * sync it calls kvt_sync first; without, it writes one more chain and
 * waits until the flusher has handed it over. It reports the clocks
 * before that chain (what must be kept but for fewer than a save's worth)
 * and when killed (what cannot have been kept). No cmocka asserts: it
 * exits with a code. */
/* Chain c (4 blocks of its own tokens) in a new sequence, left open. */
static kvt_seq *put_chain(kvt_engine *e, kvt_ns_id ns, uint32_t c, tu_kv *kv) {
  static uint32_t tok[BT];
  kvt_shape sh = SHAPE;
  kvt_seq *s;
  if (kvt_seq_create(e, ns, &s)) _exit(3);
  for (uint32_t k = 0; k < 4; k++) {
    for (uint32_t j = 0; j < BT; j++) tok[j] = c * 1000 + k * BT + j;
    tu_append_put(s, &sh, 11, tok, kv);
  }
  return s;
}

static void killed_writer(const char *dir, const kvt_options *o, int sync, int fd) {
  kvt_ns_desc d = tu_desc("engine-learned", &SHAPE);
  kvt_ns_id ns;
  kvt_shape sh = SHAPE;
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_engine *e;
  if (kvt_engine_open(dir, o, &e) || kvt_ns_register(e, &d, &ns)) _exit(2);
  const uint64_t enough = 3 * KVT_EVICT_MODEL_SAVE_EVERY;
  uint32_t c = 0;
  for (; c < 100000 && (model_clock(e) < enough ||
                        kvt_evict_model_clock(e->hot_ev) < enough); c++)
    kvt_seq_release(put_chain(e, ns, c, &kv));
  if (sync && kvt_sync(e)) _exit(4); /* it writes the hot tier's model when due */
  uint64_t clock[2] = {model_clock(e), kvt_evict_model_clock(e->hot_ev)};
  if (!sync && wait_durable(put_chain(e, ns, c, &kv), 4)) /* the flusher's own checkpoint */
    _exit(7);
  uint64_t clocks[4] = {clock[0], clock[1], model_clock(e), kvt_evict_model_clock(e->hot_ev)};
  if (write(fd, clocks, sizeof clocks) != sizeof clocks) _exit(5);
  kill(getpid(), SIGKILL);
  _exit(6);
}

/* A writer killed with SIGKILL after it has learned a while restarts with
 * models that had counted all but fewer than KVT_EVICT_MODEL_SAVE_EVERY
 * of its accesses: the cold tier's saved beside the group commits, the
 * hot tier's by kvt_sync and by the flusher before it hands a group over,
 * not at close only (before, both started from nothing). */
static void model_survives_kill(int sync) {
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  kvt_engine *e = tu_open(dir, &o); /* the namespace first, in a clean open */
  tu_register(e, "engine-learned", &SHAPE);
  kvt_engine_close(e);
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fd[0]);
    killed_writer(dir, &o, sync, fd[1]);
  }
  close(fd[1]);
  uint64_t killed[4] = {0}, killed_at, hot_killed_at;
  assert_int_equal(read(fd[0], killed, sizeof killed), sizeof killed);
  killed_at = killed[0];
  hot_killed_at = killed[1];
  close(fd[0]);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  assert_true(killed_at >= 3 * KVT_EVICT_MODEL_SAVE_EVERY);
  assert_true(hot_killed_at >= 3 * KVT_EVICT_MODEL_SAVE_EVERY);
  e = tu_open(dir, &o);
  uint64_t restarted = model_clock(e), hot_restarted = kvt_evict_model_clock(e->hot_ev);
  print_message("%s: model clock %llu before the kill (%llu at it), %llu after the restart; "
                "hot tier's %llu (%llu), %llu\n", sync ? "kvt_sync" : "no kvt_sync",
                (unsigned long long)killed_at, (unsigned long long)killed[2],
                (unsigned long long)restarted, (unsigned long long)hot_killed_at,
                (unsigned long long)killed[3], (unsigned long long)hot_restarted);
  /* Without kvt_sync, accesses after the first clocks (the last chain's,
   * and the cold tier's of blocks still queued then) may be in a model. */
  assert_true(restarted <= killed[2]);
  assert_true(killed_at < restarted + KVT_EVICT_MODEL_SAVE_EVERY);
  assert_true(hot_restarted <= killed[3]);
  assert_true(hot_killed_at < hot_restarted + KVT_EVICT_MODEL_SAVE_EVERY);
  kvt_tier_stats hot, cold;
  tier_stats(e, KVT_TIER_HOT, &hot);
  tier_stats(e, KVT_TIER_COLD, &cold);
  assert_int_equal(cold.model_saved_accesses, restarted);
  assert_int_equal(hot.model_saved_accesses, hot_restarted);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

static void test_model_survives_kill(void **state) {
  (void)state;
  model_survives_kill(1);
}

static void test_model_survives_kill_without_sync(void **state) {
  (void)state;
  model_survives_kill(0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_engine_no_future_leak),
      cmocka_unit_test(test_default_learned_restarts_warm),
      cmocka_unit_test(test_model_survives_kill),
      cmocka_unit_test(test_model_survives_kill_without_sync),
      cmocka_unit_test(test_stats_report_models),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
