/* test_evict_guard.c - the learned order's check against plain LRU
 * (tiers/evict_guard.c): a shadow LRU of sampled keys that finds the tier
 * behind it stops trusting the model, tries it again later, and ignores
 * keys outside its sample; wired into evict.c, a distrusted model admits
 * every write as CHAIN does, and the order feeds the guard its accesses.
 * And the model chooses no victim before its clock has run two horizons. */
#include "testutil.h"

#include <string.h>

#include "base/mem.h"
#include "tiers/evict.h"
#include "tiers/evict_guard.h"

/* A key in the guard's sample (top bits of its hash zero), or outside. */
static kvt_key key_of(uint64_t h, uint32_t i) {
  kvt_key k = {{0}};
  memcpy(k.b, &h, 8);
  memcpy(k.b + 8, &i, 4);
  return k;
}

static kvt_key K(uint32_t i, int sampled) {
  uint64_t h = tu_mix(i + 1);
  return key_of(sampled ? h >> KVT_GUARD_SAMPLE_SHIFT : h | (1ull << 63), i);
}

/* A key as the engine makes them: its hash decides whether it is sampled. */
static kvt_key N(uint32_t i) { return key_of(tu_mix(i + 1), i); }

/* A loop of 10 sampled keys in a tier of 800 blocks: the shadow (100
 * blocks) holds the loop and hits it from the second round on. The tier
 * reports tier_hit for every access after the first round. Returns the
 * guard after rounds rounds. */
static kvt_guard *feed_loop(kvt_mem *m, uint32_t rounds, int tier_hit) {
  kvt_guard *g;
  assert_int_equal(kvt_guard_create(m, KVT_MEM_INDEX, 1024, &g), 0);
  for (uint32_t r = 0; r < rounds; r++)
    for (uint32_t j = 0; j < 10; j++) {
      kvt_key k = K(j, 1);
      kvt_guard_access(g, &k, r > 0 && tier_hit, 800);
    }
  return g;
}

/* feed_loop on a fresh accounting m; the guard's stats into *st. */
static kvt_guard *loop_guard(kvt_mem *m, uint32_t rounds, int tier_hit, kvt_guard_stats *st) {
  kvt_mem_init(m, 0);
  kvt_guard *g = feed_loop(m, rounds, tier_hit);
  kvt_guard_stats_get(g, st);
  return g;
}

/* Sampled misses of the loop's keys until the guard's trust is
 * want_trusted, at most max of them; returns how many it took. */
static uint32_t miss_until(kvt_guard *g, int want_trusted, uint32_t max) {
  uint32_t n = 0;
  for (; kvt_guard_trusted(g) != want_trusted && n < max; n++) {
    kvt_key k = K(n % 10, 1);
    kvt_guard_access(g, &k, 0, 800);
  }
  return n;
}

/* A tier that misses what LRU hits is found behind it: distrusted. */
static void test_trips_when_behind(void **state) {
  (void)state;
  kvt_mem m;
  kvt_guard_stats st;
  kvt_guard *g = loop_guard(&m, 20, 0, &st);
  assert_int_equal(kvt_guard_trusted(g), 0);
  assert_int_equal(st.trips, 1);
  kvt_guard_free(g);
  assert_int_equal(kvt_mem_bytes(&m, KVT_MEM_INDEX), 0);
  kvt_mem_fini(&m);
}

/* A tier that hits as often as LRU stays trusted, over many windows. */
static void test_trusted_when_even(void **state) {
  (void)state;
  kvt_mem m;
  kvt_guard_stats st;
  kvt_guard *g = loop_guard(&m, 2000, 1, &st);
  assert_int_equal(kvt_guard_trusted(g), 1);
  assert_int_equal(st.trips, 0);
  assert_true(st.lru_hits > 0 && st.tier_hits == st.lru_hits);
  kvt_guard_free(g);
  kvt_mem_fini(&m);
}

/* Distrust lasts a while (at least 2048 sampled accesses), then the model
 * is tried again on fresh counts; found behind again, it waits longer. */
static void test_retries_and_backs_off(void **state) {
  (void)state;
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_guard *g = feed_loop(&m, 20, 0);
  assert_int_equal(kvt_guard_trusted(g), 0);
  uint32_t n = miss_until(g, 1, 100000);
  assert_int_equal(kvt_guard_trusted(g), 1);
  assert_true(n >= 2048);
  uint32_t first = n;
  kvt_guard_stats st;
  kvt_guard_stats_get(g, &st);
  assert_true(st.accesses == 0); /* a fresh trial */
  miss_until(g, 0, 1000);
  assert_int_equal(kvt_guard_trusted(g), 0);
  n = miss_until(g, 1, 100000);
  assert_int_equal(kvt_guard_trusted(g), 1);
  assert_true(n >= 2 * first - 1);
  kvt_guard_stats_get(g, &st);
  assert_int_equal(st.trips, 2);
  kvt_guard_free(g);
  kvt_mem_fini(&m);
}

/* Keys outside the sample are not replayed: no access is counted. */
static void test_ignores_unsampled(void **state) {
  (void)state;
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_guard *g;
  assert_int_equal(kvt_guard_create(&m, KVT_MEM_INDEX, 0, &g), 0);
  for (uint32_t r = 0; r < 50; r++)
    for (uint32_t j = 0; j < 10; j++) {
      kvt_key k = K(j, 0);
      kvt_guard_access(g, &k, 0, 800);
    }
  kvt_guard_stats st;
  kvt_guard_stats_get(g, &st);
  assert_true(st.accesses == 0);
  assert_int_equal(kvt_guard_trusted(g), 1);
  kvt_guard_free(g);
  kvt_mem_fini(&m);
}

/* ---------- wired into the learned order ---------- */

/* One access of key in a tier of cap single-block chains: used if held,
 * else written where the order admits it (the least wanted going). */
static void access_one(kvt_evict *ev, const kvt_key *key, const kvt_key *parent, uint64_t cap) {
  if (kvt_evict_touch(ev, key)) return;
  if (!kvt_evict_admit(ev, key, parent, parent != NULL, 1, kvt_evict_count(ev) >= cap)) return;
  while (kvt_evict_count(ev) >= cap) {
    kvt_key v;
    assert_int_equal(kvt_evict_victim(ev, NULL, NULL, &v, NULL), 0);
    assert_int_equal(kvt_evict_remove(ev, &v, NULL), 0);
  }
  assert_int_equal(kvt_evict_add(ev, key, parent, 1), 0);
}

/* Hot blocks come back in turn while chains of two blocks used once
 * stream between them: the model learns that new content (the second
 * block of a chain seen once) is worth less than any hot block and
 * declines it once the tier is full; a chain head it writes (declining
 * it would turn its whole request away), and a block past a prefix that
 * came back. Distrusted, it declines nothing, as CHAIN. */
static void test_distrusted_admits_all(void **state) {
  (void)state;
  enum { HOT = 100, ROUNDS = 200 };
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_evict *ev;
  assert_int_equal(kvt_evict_create(&m, KVT_MEM_INDEX, KVT_EVICT_LEARNED, &ev), 0);
  uint32_t scan_id = 1u << 20;
  for (uint32_t i = 0; i < ROUNDS; i++)
    for (uint32_t h = 0; h < HOT; h++) {
      kvt_key hot = N(h), head = N(scan_id), once = N(scan_id + 1);
      scan_id += 2;
      access_one(ev, &hot, NULL, HOT + 1);
      if (i < 2) continue; /* the hot blocks are in first */
      access_one(ev, &head, NULL, HOT + 1);
      access_one(ev, &once, &head, HOT + 1);
    }
  kvt_guard *g = kvt_evict_guard(ev);
  assert_non_null(g);
  kvt_guard_stats st;
  kvt_guard_stats_get(g, &st);
  assert_true(st.accesses > 1000 && st.tier_hits > 0); /* the order reports its accesses */
  assert_int_equal(kvt_guard_trusted(g), 1);           /* here the model beats LRU */
  /* New content: the model declines it (the tier is full); its chain
   * head, on its first access too, it writes. */
  kvt_key head = K(scan_id, 0), fresh = K(scan_id + 1, 0), head2 = K(scan_id + 2, 0),
          fresh2 = K(scan_id + 3, 0);
  access_one(ev, &head, NULL, HOT + 1);
  assert_true(kvt_evict_has(ev, &head));
  assert_int_equal(kvt_evict_admit(ev, &fresh, &head, 1, 1, 1), 0);
  /* Asked for again, it is no new content any more (it came back). */
  assert_int_equal(kvt_evict_admit(ev, &fresh, &head, 1, 1, 1), 1);
  /* A block stored before (loaded at open, its past unknown), hit once
   * since: the block after it is not new content either. */
  kvt_key old = K(scan_id + 5, 0), after_old = K(scan_id + 6, 0);
  assert_int_equal(kvt_evict_load(ev, &old, NULL, 1), 0);
  assert_int_equal(kvt_evict_touch(ev, &old), 1);
  assert_int_equal(kvt_evict_admit(ev, &after_old, &old, 1, 1, 1), 1);
  /* A first access past a prefix that came back (a hot block): written. */
  kvt_key hot0 = N(0), past = K(scan_id + 4, 0);
  assert_true(kvt_evict_has(ev, &hot0));
  assert_int_equal(kvt_evict_admit(ev, &past, &hot0, 1, 1, 1), 1);
  access_one(ev, &head2, NULL, HOT + 1);
  /* The guard finds the tier behind LRU (a loop the tier is said to miss). */
  for (uint32_t n = 0; kvt_guard_trusted(g) && n < 10000; n++) {
    kvt_key k = K((1u << 28) + n % 10, 1);
    kvt_guard_access(g, &k, 0, HOT + 1);
  }
  assert_int_equal(kvt_guard_trusted(g), 0);
  assert_true(kvt_evict_has(ev, &head2));
  assert_int_equal(kvt_evict_admit(ev, &fresh2, &head2, 1, 1, 1), 1);
  kvt_evict_free(ev);
  assert_int_equal(kvt_mem_bytes(&m, KVT_MEM_INDEX), 0);
  kvt_mem_fini(&m);
}

/* One access in two orders at once, a learned one and CHAIN, which hold
 * the same blocks until their victims first differ: used if held, else
 * written and then used once (so it leaves the tails as written). 0 while
 * they agree; 1 at the first eviction where they do not. */
static int access_both(kvt_evict *const ev[2], const kvt_key *key, uint64_t cap) {
  int held = kvt_evict_touch(ev[0], key);
  if (held != kvt_evict_touch(ev[1], key)) return 1;
  if (held) return 0;
  while (kvt_evict_count(ev[0]) >= cap) {
    kvt_key v[2];
    for (int i = 0; i < 2; i++) {
      assert_int_equal(kvt_evict_victim(ev[i], NULL, NULL, &v[i], NULL), 0);
      assert_int_equal(kvt_evict_remove(ev[i], &v[i], NULL), 0);
    }
    if (memcmp(&v[0], &v[1], sizeof v[0])) return 1;
  }
  for (int i = 0; i < 2; i++) {
    assert_int_equal(kvt_evict_admit(ev[i], key, NULL, 0, 1, kvt_evict_count(ev[i]) >= cap), 1);
    assert_int_equal(kvt_evict_add(ev[i], key, NULL, 1), 0);
    assert_int_equal(kvt_evict_touch(ev[i], key), 1);
  }
  return 0;
}

/* A loop of blocks that come back a little later than LRU keeps them,
 * between blocks used twice and never again: the learned order keeps the
 * loop and gives up the others instead of LRU's leaf - but not before
 * its clock has run two horizons (the tier's residence time). Until then
 * it gives up CHAIN's victim, though full and evicting. */
static void test_departs_once_seasoned(void **state) {
  (void)state;
  enum { CAP = 2000, LOOP = 1200, STEPS = 20000 };
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_evict *ev[2];
  assert_int_equal(kvt_evict_create(&m, KVT_MEM_INDEX, KVT_EVICT_LEARNED, &ev[0]), 0);
  assert_int_equal(kvt_evict_create(&m, KVT_MEM_INDEX, KVT_EVICT_CHAIN, &ev[1]), 0);
  assert_int_equal(kvt_evict_seasoned(ev[1]), 0); /* CHAIN has no model */
  int differ = 0, unseasoned_full = 0, seasoned_at_split = 0;
  uint32_t step = 0;
  for (; step < STEPS && !differ; step++) {
    kvt_key loop = N(step % LOOP), once = N((1u << 24) + step);
    int seasoned = kvt_evict_seasoned(ev[0]);
    if (!seasoned && kvt_evict_count(ev[0]) >= CAP) unseasoned_full++;
    differ = access_both(ev, &loop, CAP) || access_both(ev, &once, CAP);
    if (differ) seasoned_at_split = seasoned;
  }
  assert_true(differ);            /* the learned order does depart */
  assert_true(unseasoned_full > 100); /* full for a while before it may */
  assert_true(seasoned_at_split); /* and it departs only once seasoned */
  for (int i = 0; i < 2; i++) kvt_evict_free(ev[i]);
  assert_int_equal(kvt_mem_bytes(&m, KVT_MEM_INDEX), 0);
  kvt_mem_fini(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_trips_when_behind),
      cmocka_unit_test(test_trusted_when_even),
      cmocka_unit_test(test_retries_and_backs_off),
      cmocka_unit_test(test_ignores_unsampled),
      cmocka_unit_test(test_distrusted_admits_all),
      cmocka_unit_test(test_departs_once_seasoned),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
