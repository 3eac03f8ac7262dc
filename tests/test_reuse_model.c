/* test_reuse_model.c - what the learned order (KVT_EVICT_LEARNED: the
 * reuse model of tiers/reuse_model.c in tiers/evict.c) decides: with
 * nothing learned it gives up blocks as CHAIN does (least recently used
 * leaf); once it has seen a workload where reused chains mix with chains
 * used once, it keeps the reused ones where LRU and CHAIN lose them all. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

#include "base/mem.h"
#include "tiers/cold_meta.h"
#include "tiers/evict.h"
#include "tiers/reuse_model.h"

#define REC 4096 /* bytes of one record */

static kvt_key K(uint32_t i) {
  kvt_key k = {{0}};
  uint64_t h = tu_mix(i + 1);
  memcpy(k.b, &h, 8);
  memcpy(k.b + 8, &i, 4);
  return k;
}

/* Nothing learned yet: every density is the same, and the model is not
 * sure of any difference, so the victim is the least recently used leaf. */
static void test_unsure_is_lru(void **state) {
  (void)state;
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_evict *ev;
  assert_int_equal(kvt_evict_create(&m, KVT_MEM_INDEX, KVT_EVICT_LEARNED, &ev), 0);
  enum { N = 200 };
  for (uint32_t i = 0; i < N; i++) {
    kvt_key k = K(i);
    assert_int_equal(kvt_evict_add(ev, &k, NULL, 100), 0);
  }
  /* Use them all (out of probation) in a scrambled order: 7 * i mod N. */
  for (uint32_t i = 0; i < N; i++) {
    kvt_key k = K(7 * i % N);
    assert_int_equal(kvt_evict_touch(ev, &k), 1);
  }
  for (uint32_t i = 0; i < 20; i++) {
    kvt_key v, want = K(7 * i % N);
    assert_int_equal(kvt_evict_victim(ev, NULL, NULL, &v, NULL), 0);
    assert_memory_equal(v.b, want.b, 16);
    assert_int_equal(kvt_evict_remove(ev, &v, NULL), 0);
  }
  kvt_evict_free(ev);
  assert_int_equal(kvt_mem_bytes(&m, KVT_MEM_INDEX), 0);
}

/* The request being written is referenced: not evicted under it (the
 * engine's sequences hold their blocks). */
typedef struct cur {
  kvt_key k[8];
  uint32_t n;
} cur_t;

static int keep_cur(void *arg, const kvt_key *key) {
  const cur_t *c = arg;
  for (uint32_t i = 0; i < c->n; i++)
    if (!memcmp(c->k[i].b, key->b, 16)) return 1;
  return 0;
}

/* Hot chains come back, in turn, after more accesses than the tier holds
 * blocks, because chains used once stream in between. LRU and CHAIN keep
 * whatever came last and never hit a hot chain; the learned order sees
 * that blocks used once are not used again, stops writing them, and
 * keeps the hot chains (they fit). Returns the hot requests' hit blocks
 * over the second half of the replay. */
static uint64_t replay_scan_mix(int policy) {
  enum { HOT = 20, LEN = 4, SCANS = 3, CAP = 120, ROUNDS = 3000 };
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_cold_meta *c;
  assert_int_equal(kvt_cold_meta_open(&m, (uint64_t)CAP * REC, policy, &c), 0);
  static cur_t cur;
  kvt_cold_meta_set_hooks(c, keep_cur, NULL, &cur);
  uint64_t hits = 0;
  uint32_t scan_id = 1u << 20;
  for (uint32_t i = 0; i < ROUNDS; i++) {
    for (uint32_t s = 0; s <= SCANS; s++) {
      uint32_t base = s == 0 ? (i % HOT) * LEN : (scan_id += LEN);
      kvt_key keys[LEN];
      for (uint32_t k = 0; k < LEN; k++) cur.k[k] = keys[k] = K(base + k);
      cur.n = LEN;
      size_t hit = kvt_cold_meta_prefix(c, keys, LEN);
      if (s == 0 && i >= ROUNDS / 2) hits += hit;
      for (uint32_t k = (uint32_t)hit; k < LEN; k++) {
        const kvt_key *parent = k ? &keys[k - 1] : NULL;
        if (kvt_cold_meta_find(c, &keys[k]) == 0) continue;
        if (kvt_cold_meta_admit(c, &keys[k], parent, k, 1, REC))
          kvt_cold_meta_write(c, &keys[k], parent, NULL, REC);
      }
    }
  }
  kvt_cold_meta_close(c);
  assert_int_equal(kvt_mem_bytes(&m, KVT_MEM_INDEX), 0);
  kvt_mem_fini(&m);
  return hits;
}

static void test_keeps_reused_chains(void **state) {
  (void)state;
  uint64_t lru = replay_scan_mix(KVT_EVICT_LRU), chain = replay_scan_mix(KVT_EVICT_CHAIN),
           learned = replay_scan_mix(KVT_EVICT_LEARNED), most = 1500 * 4;
  fprintf(stderr, "hot blocks hit, second half: lru %llu, chain %llu, learned %llu of %llu\n",
          (unsigned long long)lru, (unsigned long long)chain, (unsigned long long)learned,
          (unsigned long long)most);
  assert_true(lru < most / 10 && chain < most / 10); /* the scans push them out */
  assert_true(learned > most / 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unsure_is_lru),
      cmocka_unit_test(test_keeps_reused_chains),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
