/* test_recall_determ.c - recall decides the same whatever the flusher's
 * pace (docs/policy.md, "Recall is deterministic"): a candidate whose token
 * block is still being written to the cold tier is waited for, not
 * skipped as unavailable, so a decoding loop gives the same recalls and
 * the same attention outputs whether every block was made durable at once
 * (kvt_sync after each put) or the flusher lags behind. */
#include <math.h>

#include "recall_fx.h"

/* the second run's hot tier (test_ram_or_disk) */
#ifndef HOT_SMALL
#define HOT_SMALL (40u << 10)
#endif

/* A decoding loop of DR_STEPS 1-token blocks under snapkv at a quarter of
 * the cache with recall on (recall_fx.h). With sync, every block is
 * durable before its step's attention; without, the flusher writes them
 * behind. */
static void run(int sync, dr_out *o) {
  dr_cfg c = {.bt = 1, .head_dim = 16, .qh_per_kv = 2, .sync = sync};
  dr_run(&c, o);
}

static void assert_same(const dr_out *a, const dr_out *b) {
  assert_int_equal(a->recalls, b->recalls);
  assert_int_equal(a->useful, b->useful);
  assert_int_equal(a->unavailable, b->unavailable);
  assert_memory_equal(a->retained, b->retained, sizeof a->retained);
  assert_true(a->hash == b->hash);
}

/* Durable at once, or written behind by the flusher: the same recalls and
 * the same attention, bit for bit, run after run. */
static void test_runs_repeat(void **state) {
  (void)state;
  dr_out synced, behind1, behind2;
  run(1, &synced);
  run(0, &behind1);
  run(0, &behind2);
  fprintf(stderr, "recalls %llu (useful %llu, unavailable %llu) / %llu (%llu, %llu) / %llu\n",
          (unsigned long long)synced.recalls, (unsigned long long)synced.useful,
          (unsigned long long)synced.unavailable, (unsigned long long)behind1.recalls,
          (unsigned long long)behind1.useful, (unsigned long long)behind1.unavailable,
          (unsigned long long)behind2.recalls);
  assert_true(synced.recalls >= 8); /* the loop does exercise recall */
  assert_int_equal(synced.unavailable, 0);
  assert_int_equal(behind1.late + behind2.late, 0);
  assert_same(&synced, &behind1);
  assert_same(&synced, &behind2);
}

/* A recalled block comes back as the RAM copy the hot tier still keeps,
 * unreferenced, or read from the cold tier when the hot tier let it go:
 * which one depends, in a server, on how far the flusher got (a block
 * still queued is held in RAM, so the hot tier lets others go). Either way
 * it counts against the budget from its recall on (kvt_recall_reading),
 * so the puts between the recall and its install (the next step's) evict
 * the same blocks and the attention is the same. Both runs sync after
 * each put (no timing); the second's hot tier, a little over half the
 * blocks, lets most evicted blocks go and the recalls read them. Before,
 * a block on its way was not counted, the put did not evict for it, and
 * the next attention saw one block more: the outputs differed. */
static void test_ram_or_disk(void **state) {
  (void)state;
  dr_cfg c = {.bt = 1, .head_dim = 16, .qh_per_kv = 2, .sync = 1};
  dr_out ram, disk;
  dr_run(&c, &ram);
  c.hot = HOT_SMALL;
  dr_run(&c, &disk);
  fprintf(stderr, "recalls %llu (read %llu bytes) / %llu (read %llu bytes)\n",
          (unsigned long long)ram.recalls, (unsigned long long)ram.recall_bytes,
          (unsigned long long)disk.recalls, (unsigned long long)disk.recall_bytes);
  assert_true(ram.recalls >= 8);
  assert_int_equal(ram.recall_bytes, 0); /* every recalled block was still in RAM */
  assert_true(disk.recall_bytes > 0);    /* and here some were read */
  assert_same(&ram, &disk);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runs_repeat),
      cmocka_unit_test(test_ram_or_disk),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
