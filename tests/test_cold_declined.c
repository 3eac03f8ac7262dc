/* test_cold_declined.c - kvt_tier_stats.declined: the cold tier's
 * admission declines (KVT_EVICT_LEARNED on a full tier) are counted, and
 * nothing else is. */
#include "testutil.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conv_trace.h"

#define N_REQ 1600
#define MAX_BLK 13
#define BT 16

static const kvt_shape SHAPE = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 16,
                                .dtype = KVT_F16, .block_tokens = BT};

/* Requests: a shared head, then chains that come back (a few) or never
 * (most): blocks worth writing and blocks not, once the tier is full. */
static void request(kvt_engine *e, kvt_ns_id ns, uint64_t *st, uint64_t *next_id) {
  static uint32_t tok[MAX_BLK * BT];
  memset(tok, 0, sizeof tok);
  uint32_t n = 2 + (uint32_t)(tu_rand_r(st) % (MAX_BLK - 2));
  int again = tu_rand_r(st) % 4 == 0;
  uint64_t base = again ? 1 + tu_rand_r(st) % 16 : (*next_id)++;
  for (uint32_t i = 0; i < n; i++) {
    tok[i * BT] = i == 0 ? 1 : (uint32_t)(base * 64 + i);
    tok[i * BT + 1] = again ? 7 : 9;
  }
  ct_append_put(e, ns, &SHAPE, tok, n, 1);
}

/* The cold tier's declines after a replay under policy. */
static uint64_t declines(uint32_t policy) {
  kvt_ns_id ns;
  kvt_engine *e = ct_open_cold(&SHAPE, 100, (int)policy, "declined", &ns);
  uint64_t st = 4242, next_id = 100;
  kvt_tier_stats ts;
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_COLD, &ts, sizeof ts), 0);
  assert_int_equal(ts.declined, 0);
  for (int i = 0; i < N_REQ; i++) request(e, ns, &st, &next_id);
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_COLD, &ts, sizeof ts), 0);
  assert_int_equal(ts.filled, sizeof ts);
  /* A caller built before the field: it is not written. */
  kvt_tier_stats old;
  memset(&old, 0xAB, sizeof old);
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_COLD, &old, offsetof(kvt_tier_stats, declined)), 0);
  assert_int_equal(old.filled, offsetof(kvt_tier_stats, declined));
  assert_int_equal(old.declined, 0xABABABABABABABABull);
  /* RAM tiers keep what a sequence put: nothing declined. */
  kvt_tier_stats hot;
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_HOT, &hot, sizeof hot), 0);
  assert_int_equal(hot.declined, 0);
  kvt_engine_close(e);
  return ts.declined;
}

/* The learned order declines writes once the tier is full; CHAIN and LRU
 * never do. */
static void test_declines_counted(void **state) {
  (void)state;
  uint64_t learned = declines(KVT_EVICT_LEARNED);
  uint64_t chain = declines(KVT_EVICT_CHAIN), lru = declines(KVT_EVICT_LRU);
  fprintf(stderr, "declines: learned %llu, chain %llu, lru %llu\n", (unsigned long long)learned,
          (unsigned long long)chain, (unsigned long long)lru);
  assert_true(learned > 0);
  assert_int_equal(chain, 0);
  assert_int_equal(lru, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_declines_counted),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
