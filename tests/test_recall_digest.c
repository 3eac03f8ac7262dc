/* test_recall_digest.c - recall's decisions are pinned to the bit, so a
 * faster sketch scan (recall.c) must prove it decides the same. A decoding
 * loop with recall on (1- and 4-token blocks; 4 and 6 query heads; sinks,
 * a window and a delay) must give the recalls, retained counts and
 * attention outputs recorded with the scan as it is: one head after
 * another, every exp, kvt_policy_evictable() for each block. */
#include <math.h>

#include "recall_fx.h"

/* DR_STEPS blocks of bt tokens under snapkv at a quarter of the cache with
 * recall on, every block durable before its step's attention (recall_fx.h);
 * the retained counts go into the digest too. */
static void run(uint32_t bt, uint32_t qh_per_kv, uint32_t protect, dr_out *o) {
  dr_cfg c = {.bt = bt, .head_dim = 8, .qh_per_kv = qh_per_kv, .protect = protect, .sync = 1,
              .hash_n = 1};
  dr_run(&c, o);
}

static void check(uint32_t bt, uint32_t qh_per_kv, uint32_t protect, uint64_t recalls,
                  uint64_t useful, uint64_t hash) {
  dr_out o;
  run(bt, qh_per_kv, protect, &o);
  fprintf(stderr,
          "bt %u, %u query heads a KV head, protect %u: recalls %llu, useful %llu, digest "
          "0x%016llx\n",
          bt, qh_per_kv, protect, (unsigned long long)o.recalls, (unsigned long long)o.useful,
          (unsigned long long)o.hash);
  assert_true(o.recalls >= 4); /* the loop does exercise recall */
  assert_int_equal(o.recalls, recalls);
  assert_int_equal(o.useful, useful);
  assert_true(o.hash == hash);
}

/* Recorded with the scan of one head after another and an exp a sketch. */
static void test_digest_1token_4heads(void **state) {
  (void)state;
  check(1, 2, 0, 173, 143, 0x9a9af052beed2282ull);
}

static void test_digest_1token_6heads(void **state) {
  (void)state;
  check(1, 3, 0, 178, 154, 0x1dbb2983d49f5c2full);
}

static void test_digest_4token_4heads(void **state) {
  (void)state;
  check(4, 2, 0, 226, 183, 0x4aff9278f68d4495ull);
}

/* Sinks, a window and a scoring delay: the weakest retained blocks that
 * recall compares with are the evictable ones only. */
static void test_digest_protected(void **state) {
  (void)state;
  check(1, 2, 3, 100, 78, 0x61c61c6a6f465e0aull);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_digest_1token_4heads),
      cmocka_unit_test(test_digest_1token_6heads),
      cmocka_unit_test(test_digest_4token_4heads),
      cmocka_unit_test(test_digest_protected),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
