/* test_reuse_fresh.c - the reuse model's class of new content
 * (tiers/reuse_model.h): a block first written under a parent accessed
 * only once is classed apart from one written after a prefix that came
 * back, so a workload where the first are never reused and the second
 * are ranks them apart; and a state saved with the six classes of the
 * earlier version is refused as another version, not misread. */
#define XXH_INLINE_ALL /* header only: the tests link no libxxhash */
#include <xxhash.h>

#include "testutil.h"

#include <string.h>

#include "base/mem.h"
#include "tiers/reuse_model.h"

/* NULL parent (a chain head, or nothing known of it): not new content;
 * a parent accessed once: new content; twice: a prefix that came back. */
static void test_fresh_from_parent(void **state) {
  (void)state;
  kvt_reuse_blk p, b;
  kvt_reuse_blk_init(&b, 0, 0, NULL);
  assert_int_equal(b.fresh, 0);
  kvt_reuse_blk_init(&p, 0, 0, NULL);
  p.hits = 1;
  kvt_reuse_blk_init(&b, 1, 0, &p);
  assert_int_equal(b.fresh, 1);
  p.hits = 2;
  kvt_reuse_blk_init(&b, 1, 0, &p);
  assert_int_equal(b.fresh, 0);
}

/* New content never comes back; a block written after a reused prefix
 * comes back 8 accesses later. Once the table is refreshed, a block of
 * the first kind just written is surely worth less than one of the
 * second (more than two standard errors apart). */
static void test_fresh_ranks_apart(void **state) {
  (void)state;
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_reuse *r;
  assert_int_equal(kvt_reuse_create(&m, KVT_MEM_INDEX, 1024, &r), 0);
  kvt_reuse_set_horizon(r, 64);
  kvt_reuse_blk once, twice;
  kvt_reuse_blk_init(&once, 0, 0, NULL);
  once.hits = 1;
  kvt_reuse_blk_init(&twice, 0, 0, NULL);
  twice.hits = 2;
  enum { ROUNDS = 1500, LAG = 8 };
  kvt_reuse_blk pend[LAG];
  for (uint32_t i = 0; i < ROUNDS; i++) {
    kvt_reuse_blk n;
    kvt_reuse_blk_init(&n, 1, 0, &once); /* new content: accessed once, never again */
    kvt_reuse_access(r, &n);
    if (i >= LAG) kvt_reuse_access(r, &pend[i % LAG]); /* the second access, LAG rounds on */
    kvt_reuse_blk_init(&pend[i % LAG], 1, 0, &twice);
    kvt_reuse_access(r, &pend[i % LAG]);
  }
  kvt_reuse_blk a, b;
  kvt_reuse_blk_init(&a, 1, 0, &once);
  kvt_reuse_blk_init(&b, 1, 0, &twice);
  kvt_reuse_access(r, &a);
  kvt_reuse_access(r, &b);
  double sa, sb, da = kvt_reuse_density(r, &a, &sa), db = kvt_reuse_density(r, &b, &sb);
  print_message("density: new content %.5f (se %.5f), after a reused prefix %.5f (se %.5f)\n", da, sa,
                db, sb);
  assert_true(db - da > 2 * (sa + sb));
  kvt_reuse_free(r);
  assert_int_equal(kvt_mem_bytes(&m, KVT_MEM_INDEX), 0);
}

/* A state of version 2 (six classes) is another version; a state's clock
 * is read without a model only when the state checks as load checks it. */
static void test_old_version_refused(void **state) {
  (void)state;
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_reuse *r;
  assert_int_equal(kvt_reuse_create(&m, KVT_MEM_INDEX, 1024, &r), 0);
  kvt_reuse_blk b;
  kvt_reuse_blk_init(&b, 1, 0, NULL);
  for (int i = 0; i < 5; i++) kvt_reuse_access(r, &b);
  uint8_t s[KVT_REUSE_STATE_BYTES];
  kvt_reuse_save(r, s);
  uint64_t clock = 0;
  assert_int_equal(kvt_reuse_state_clock(s, sizeof s, &clock), 0);
  assert_int_equal(clock, kvt_reuse_now(r));
  assert_int_equal(clock, 5);
  assert_int_equal(kvt_reuse_load(r, s, sizeof s), 0);
  assert_int_equal(kvt_reuse_state_clock(s, sizeof s - 1, &clock), KVT_ECORRUPT);
  s[40] ^= 1; /* a count: the checksum no longer matches */
  assert_int_equal(kvt_reuse_state_clock(s, sizeof s, &clock), KVT_ECORRUPT);
  assert_int_equal(kvt_reuse_load(r, s, sizeof s), KVT_ECORRUPT);
  s[40] ^= 1;
  uint8_t bad[KVT_REUSE_STATE_BYTES]; /* a count out of range, the checksum made to match */
  memcpy(bad, s, sizeof bad);
  const float neg = -1.0f;
  memcpy(bad + 32, &neg, 4); /* the first class's count (little-endian here) */
  uint64_t sum = XXH3_64bits(bad + 32, sizeof bad - 32);
  for (int i = 0; i < 8; i++) bad[24 + i] = (uint8_t)(sum >> (8 * i));
  assert_int_equal(kvt_reuse_state_clock(bad, sizeof bad, &clock), KVT_ECORRUPT);
  assert_int_equal(kvt_reuse_load(r, bad, sizeof bad), KVT_ECORRUPT);
  s[8] = 2; /* version, little-endian u32 */
  assert_int_equal(kvt_reuse_load(r, s, sizeof s), KVT_EVERSION);
  clock = 99;
  assert_int_equal(kvt_reuse_state_clock(s, sizeof s, &clock), KVT_EVERSION);
  assert_int_equal(clock, 99); /* untouched */
  kvt_reuse_free(r);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fresh_from_parent),
      cmocka_unit_test(test_fresh_ranks_apart),
      cmocka_unit_test(test_old_version_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
