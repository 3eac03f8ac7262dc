/* test_known_cache.c - the keys a remote lookup found (tiers/remote_known.c):
 * what a lookup learned is believed only briefly, never after a removal
 * it may have crossed, and a take uses it up. No cluster needed. */
#include "testutil.h"

#include <string.h>

#include "tiers/remote_known.h"

static kvt_key key_of(uint64_t i) {
  kvt_key k;
  uint64_t h = i * 0x9e3779b97f4a7c15ull;
  for (size_t b = 0; b < sizeof k.b; b++) k.b[b] = (uint8_t)((h >> (8 * (b % 8))) ^ b);
  return k;
}

static void test_take_once(void **state) {
  (void)state;
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_known kn;
  assert_int_equal(kvt_known_open(&kn, &m), 0);
  kvt_key k[3] = {key_of(1), key_of(2), key_of(3)};
  kvt_known_add(&kn, k, 2, kvt_known_gen(&kn), 1000);
  assert_int_equal(kvt_known_take(&kn, &k[0], 2000), 1);
  assert_int_equal(kvt_known_take(&kn, &k[0], 2000), 0); /* used up */
  assert_int_equal(kvt_known_take(&kn, &k[2], 2000), 0); /* never found */
  assert_int_equal(kvt_known_take(&kn, &k[1], 2000), 1);
  kvt_known_close(&kn);
  assert_int_equal(kvt_mem_total(&m), 0);
  kvt_mem_fini(&m);
}

/* Past the TTL the cluster may have dropped or evicted it: not believed. */
static void test_too_old(void **state) {
  (void)state;
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_known kn;
  assert_int_equal(kvt_known_open(&kn, &m), 0);
  kvt_key k[2] = {key_of(7), key_of(8)};
  uint64_t t0 = 5000000000ull;
  kvt_known_add(&kn, k, 2, kvt_known_gen(&kn), t0);
  assert_int_equal(kvt_known_take(&kn, &k[0], t0 + KVT_KNOWN_TTL_NS - 1), 1);
  assert_int_equal(kvt_known_take(&kn, &k[1], t0 + KVT_KNOWN_TTL_NS), 0);
  kvt_known_close(&kn);
  kvt_mem_fini(&m);
}

/* A lookup whose answer crossed a removal (a forget between reading the
 * generation and adding) adds nothing, not even keys the removal did not
 * name; a forget removes what was added. */
static void test_crossed_removal(void **state) {
  (void)state;
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_known kn;
  assert_int_equal(kvt_known_open(&kn, &m), 0);
  kvt_key k[3] = {key_of(11), key_of(12), key_of(13)};
  uint64_t g = kvt_known_gen(&kn);
  kvt_known_forget(&kn, &k[0], 1); /* a drop's removal, while the lookup asked */
  kvt_known_add(&kn, k, 2, g, 100);
  assert_int_equal(kvt_known_take(&kn, &k[0], 200), 0);
  assert_int_equal(kvt_known_take(&kn, &k[1], 200), 0);
  kvt_known_add(&kn, k, 3, kvt_known_gen(&kn), 100);
  kvt_known_forget(&kn, &k[2], 1);
  assert_int_equal(kvt_known_take(&kn, &k[2], 200), 0);
  assert_int_equal(kvt_known_take(&kn, &k[0], 200), 1);
  kvt_known_close(&kn);
  kvt_mem_fini(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_take_once),
      cmocka_unit_test(test_too_old),
      cmocka_unit_test(test_crossed_removal),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
