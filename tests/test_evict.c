/* test_evict.c - the eviction order of tiers/evict.c: plain LRU, and the
 * chain-aware order (only tails of prefix chains are candidates; tails as
 * written first). Unit cases, then a random forest checked against an
 * oracle of who is whose parent after every eviction. */
#include "testutil.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "tiers/cold_record.h"
#include "tiers/evict.h"

static kvt_key K(uint32_t i) {
  kvt_key k = {{0}};
  uint64_t h = tu_mix(i + 1); /* uniform, like real keys; never all zero */
  memcpy(k.b, &h, 8);
  memcpy(k.b + 8, &i, 4);
  return k;
}

static uint32_t id_of(const kvt_key *k) {
  uint32_t i;
  memcpy(&i, k->b + 8, 4);
  return i;
}

typedef struct fixture {
  kvt_mem m;
  kvt_evict *ev;
} fixture;

static void open_ev(fixture *f, int policy) {
  kvt_mem_init(&f->m, 0);
  assert_int_equal(kvt_evict_create(&f->m, KVT_MEM_INDEX, policy, &f->ev), 0);
}

static void close_ev(fixture *f) {
  kvt_evict_free(f->ev);
  assert_int_equal(kvt_mem_bytes(&f->m, KVT_MEM_INDEX), 0); /* everything given back */
  kvt_mem_fini(&f->m);
}

static void add(fixture *f, uint32_t id, int64_t parent) {
  kvt_key k = K(id), p = parent >= 0 ? K((uint32_t)parent) : (kvt_key){{0}};
  assert_int_equal(kvt_evict_add(f->ev, &k, parent >= 0 ? &p : NULL, 100), 0);
}

static uint32_t victim(fixture *f, int (*keep)(void *, const kvt_key *), void *arg) {
  kvt_key v;
  uint64_t bytes = 0;
  assert_int_equal(kvt_evict_victim(f->ev, keep, arg, &v, &bytes), 0);
  assert_int_equal(bytes, 100);
  return id_of(&v);
}

static void evict(fixture *f, uint32_t id) {
  kvt_key k = K(id);
  assert_int_equal(kvt_evict_remove(f->ev, &k, NULL), 0);
}

static void touch(fixture *f, uint32_t id) {
  kvt_key k = K(id);
  assert_int_equal(kvt_evict_touch(f->ev, &k), 1);
}

/* LRU: the least recently added or touched goes first, whatever the chains. */
static void test_lru_order(void **state) {
  (void)state;
  fixture f;
  open_ev(&f, KVT_EVICT_LRU);
  add(&f, 0, -1);
  add(&f, 1, 0);
  add(&f, 2, 1);
  touch(&f, 0);
  assert_int_equal(victim(&f, NULL, NULL), 1); /* a chain's middle: LRU does not care */
  evict(&f, 1);
  assert_int_equal(victim(&f, NULL, NULL), 2);
  evict(&f, 2);
  assert_int_equal(victim(&f, NULL, NULL), 0);
  assert_int_equal(kvt_evict_count(f.ev), 1);
  assert_int_equal(kvt_evict_bytes(f.ev), 100);
  close_ev(&f);
}

/* CHAIN: a root used long ago stays while any block extends it. */
static void test_chain_tails_first(void **state) {
  (void)state;
  fixture f;
  open_ev(&f, KVT_EVICT_CHAIN);
  add(&f, 0, -1); /* chain 0-1-2, then chain 3-4: every root older than its tails */
  add(&f, 1, 0);
  add(&f, 2, 1);
  add(&f, 3, -1);
  add(&f, 4, 3);
  assert_int_equal(victim(&f, NULL, NULL), 2); /* the oldest tail */
  evict(&f, 2);
  assert_int_equal(victim(&f, NULL, NULL), 4); /* tail as written (never used) first */
  evict(&f, 4);
  assert_int_equal(victim(&f, NULL, NULL), 1); /* 1 lost its child: a leaf now */
  evict(&f, 1);
  assert_int_equal(victim(&f, NULL, NULL), 0);
  evict(&f, 0);
  assert_int_equal(victim(&f, NULL, NULL), 3);
  evict(&f, 3);
  kvt_key v;
  assert_int_equal(kvt_evict_victim(f.ev, NULL, NULL, &v, NULL), KVT_ENOTFOUND);
  close_ev(&f);
}

/* Children added before their parent (the index loads in key order at
 * open, not parent first) still hold it back; so do children of a parent
 * removed and added again. */
static void test_chain_any_order(void **state) {
  (void)state;
  for (int policy = KVT_EVICT_CHAIN; policy <= KVT_EVICT_CHAIN_LEAF; policy++) {
    if (policy == KVT_EVICT_LRU) continue;
    fixture f;
    open_ev(&f, policy);
    add(&f, 1, 0); /* chain 0-1-2 loaded as 1, 0, 2 */
    add(&f, 0, -1);
    add(&f, 2, 1);
    assert_int_equal(victim(&f, NULL, NULL), 2); /* the tail, not the head */
    evict(&f, 2);
    assert_int_equal(victim(&f, NULL, NULL), 1);
    evict(&f, 1);
    assert_int_equal(victim(&f, NULL, NULL), 0);
    evict(&f, 0);
    /* P=10 with child 11; P removed and written again; child 12; 11 goes:
     * 12 still extends P, so P is no candidate */
    add(&f, 10, -1);
    add(&f, 11, 10);
    evict(&f, 10);
    add(&f, 10, -1);
    add(&f, 12, 10);
    evict(&f, 11);
    assert_int_equal(victim(&f, NULL, NULL), 12);
    evict(&f, 12);
    assert_int_equal(victim(&f, NULL, NULL), 10);
    evict(&f, 10);
    assert_int_equal(kvt_evict_count(f.ev), 0);
    close_ev(&f); /* orphan counts given back too */
  }
}

/* A tail as written goes before an older leaf that was used; without the
 * probation segment (CHAIN_LEAF) recency alone decides. */
static void test_chain_probation(void **state) {
  (void)state;
  for (int leafonly = 0; leafonly < 2; leafonly++) {
    fixture f;
    open_ev(&f, leafonly ? KVT_EVICT_CHAIN_LEAF : KVT_EVICT_CHAIN);
    add(&f, 0, -1);
    touch(&f, 0); /* used again: no tail as written */
    add(&f, 1, -1);
    assert_int_equal(victim(&f, NULL, NULL), leafonly ? 0 : 1);
    touch(&f, 1);
    assert_int_equal(victim(&f, NULL, NULL), 0); /* both used: the older */
    close_ev(&f);
  }
}

static int keep_set(void *arg, const kvt_key *k) {
  const uint8_t *kept = arg;
  return kept[id_of(k)];
}

/* Kept blocks are skipped and stay where they were; all kept: none. */
static void test_keep(void **state) {
  (void)state;
  for (int policy = 0; policy < 3; policy++) {
    fixture f;
    open_ev(&f, policy);
    uint8_t kept[8] = {0};
    for (uint32_t i = 0; i < 4; i++) add(&f, i, -1);
    kept[0] = kept[1] = 1;
    assert_int_equal(victim(&f, keep_set, kept), 2);
    kept[0] = 0;
    assert_int_equal(victim(&f, keep_set, kept), 0); /* skipping moved nothing */
    memset(kept, 1, sizeof kept);
    kvt_key v;
    assert_int_equal(kvt_evict_victim(f.ev, keep_set, kept, &v, NULL), KVT_ENOTFOUND);
    /* adding a tracked key touches it */
    kvt_key k = K(0);
    assert_int_equal(kvt_evict_add(f.ev, &k, NULL, 100), -EEXIST);
    assert_int_equal(kvt_evict_count(f.ev), 4);
    assert_true(kvt_evict_has(f.ev, &k));
    assert_int_equal(kvt_evict_remove(f.ev, &k, NULL), 0);
    assert_int_equal(kvt_evict_remove(f.ev, &k, NULL), KVT_ENOTFOUND);
    assert_false(kvt_evict_has(f.ev, &k));
    close_ev(&f);
  }
}

/* Random forests, random uses, random kept sets: every victim of CHAIN
 * is a leaf (no tracked block names it as parent) whenever some leaf is
 * not kept, and never a kept block. The oracle is a plain parent array. */
#define N_NODES 3000
static void test_chain_random_forest(void **state) {
  (void)state;
  for (int policy = 0; policy < 3; policy += 2) { /* CHAIN, CHAIN_LEAF */
    fixture f;
    open_ev(&f, policy);
    static int32_t parent[N_NODES];
    static uint8_t in[N_NODES], kept[N_NODES];
    memset(in, 0, sizeof in);
    uint32_t n = 0, n_in = 0;
    for (uint32_t step = 0; step < 6 * N_NODES; step++) {
      uint32_t op = tu_below(10);
      if (op < 5 && n < N_NODES) { /* extend a stored block, or start a chain */
        int32_t p = n && tu_below(4) ? (int32_t)tu_below(n) : -1;
        if (p >= 0 && !in[p]) p = -1; /* written parent first, as the tiers do */
        parent[n] = p;
        add(&f, n, p);
        in[n++] = 1;
        n_in++;
      } else if (op < 7 && n) {
        uint32_t i = tu_below(n);
        if (in[i]) touch(&f, i);
      } else if (n_in) {
        memset(kept, 0, sizeof kept);
        for (uint32_t i = 0; i < n; i++) kept[i] = in[i] && tu_below(8) == 0;
        /* oracle: is there a stored leaf that is not kept? */
        static uint8_t has_child[N_NODES];
        memset(has_child, 0, sizeof has_child);
        for (uint32_t i = 0; i < n; i++)
          if (in[i] && parent[i] >= 0 && in[parent[i]]) has_child[parent[i]] = 1;
        int free_leaf = 0;
        for (uint32_t i = 0; i < n && !free_leaf; i++) free_leaf = in[i] && !has_child[i] && !kept[i];
        kvt_key v;
        int rc = kvt_evict_victim(f.ev, keep_set, kept, &v, NULL);
        if (rc) {
          assert_int_equal(rc, KVT_ENOTFOUND);
          for (uint32_t i = 0; i < n; i++) assert_false(in[i] && !kept[i]);
          continue;
        }
        uint32_t id = id_of(&v);
        assert_true(id < n && in[id] && !kept[id]);
        if (free_leaf) assert_false(has_child[id]);
        evict(&f, id);
        in[id] = 0;
        n_in--;
      }
    }
    assert_int_equal(kvt_evict_count(f.ev), n_in);
    close_ev(&f);
  }
}

/* ---- the cold tier on disk ------------------------------------------------- */

/* Chains written once each into a cold tier that holds a third of them.
 * The eviction order invalidates blocks before segments are reclaimed:
 * writes keep succeeding, the index stays consistent with the records,
 * and (CHAIN) what is stored is mostly usable prefixes: the blocks that
 * lookups can reach are nearly all the blocks stored. (Here LRU keeps more
 * records: each chain is written once and never used again, so LRU frees
 * whole segments in write order, while tails first leaves holes in every
 * segment. Reuse, as in real traces, is what tails first is for.) */
static uint64_t live_run(int policy, uint64_t *records) {
  char *dir = tu_tmpdir();
  kvt_options o;
  tu_opts(&o);
  kvt_shape sh = {.n_layers = 1, .n_kv_heads = 4, .head_dim = 64, .dtype = KVT_F16,
                  .block_tokens = 64}; /* 64 KiB of K+V a block */
  o.tier_bytes_limit[KVT_TIER_HOT] = 4u << 20;
  o.tier_bytes_limit[KVT_TIER_COLD] = 6u << 20;
  o.cold_segment_bytes = 1u << 20;
  o.cold_group_bytes = 256u << 10;
  o.cold_evict = (uint32_t)policy;
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "live-evict", &sh);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  enum { CHAINS = 48, LEN = 6 };
  static uint32_t toks[LEN * 64];
  for (uint32_t c = 0; c < CHAINS; c++) {
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(e, ns, &s), 0);
    for (uint32_t b = 0; b < LEN; b++) {
      for (uint32_t t = 0; t < 64; t++) toks[b * 64 + t] = c * 1000 + b * 64 + t;
      tu_append_put(s, &sh, 7, toks + b * 64, &kv);
    }
    kvt_seq_release(s);
    assert_int_equal(kvt_sync(e), 0);
  }
  kvt_stats st;
  tu_stats(e, &st);
  uint64_t evicted = st.evictions[KVT_TIER_COLD];
  assert_true(evicted > 0);
  kvt_engine_close(e); /* lookups from an empty RAM: the cold tier alone */
  e = tu_open(dir, &o);
  ns = tu_register(e, "live-evict", &sh);
  uint64_t reachable = 0;
  for (uint32_t c = 0; c < CHAINS; c++) {
    for (uint32_t b = 0; b < LEN; b++)
      for (uint32_t t = 0; t < 64; t++) toks[b * 64 + t] = c * 1000 + b * 64 + t;
    size_t found = 0;
    assert_int_equal(kvt_lookup(e, ns, toks, LEN * 64, NULL, 0, &found), 0);
    reachable += found;
  }
  tu_stats(e, &st);
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.bad, 0);
  assert_true(st.cold_records > 0 && st.cold_records < CHAINS * LEN);
  *records = st.cold_records;
  print_message("%s: %llu records, %llu reachable by lookups, %llu evicted\n",
                policy == KVT_EVICT_LRU ? "lru" : "chain", (unsigned long long)st.cold_records,
                (unsigned long long)reachable, (unsigned long long)evicted);
  tu_kv_free(&kv);
  kvt_engine_close(e);
  tu_rmtree(dir);
  return reachable;
}

static void test_live_cold_order(void **state) {
  (void)state;
  uint64_t rec_chain, rec_lru;
  uint64_t reach_chain = live_run(KVT_EVICT_CHAIN, &rec_chain);
  uint64_t reach_lru = live_run(KVT_EVICT_LRU, &rec_lru);
  assert_true(reach_chain <= rec_chain && reach_lru <= rec_lru);
  /* Tails go first, so what stays is prefixes. Not all of it: reclaiming
   * a segment also drops the unreferenced blocks the order had not chosen
   * yet, which may be a chain's head (which segment that is depends on how
   * the flusher grouped the writes: timing). Seen: at most one chain's
   * worth (LEN blocks) unreachable; allow two. */
  assert_true(reach_chain + 2 * 6 >= rec_chain);
}

static void look(fixture *f, uint32_t id) {
  kvt_key k = K(id);
  assert_int_equal(kvt_evict_look(f->ev, &k), 1);
}

/* The learned model's clock: accesses it counted (its saved state). */
static uint64_t model_clock(fixture *f) {
  uint8_t st[KVT_EVICT_MODEL_MAX];
  assert_true(kvt_evict_model_save(f->ev, st, sizeof st) > 24);
  return kvt_le_get64(st + 16);
}

/* A lookup and the touch after it (the append, or the find, of the block
 * it found) are one use for the learned model: counted twice, every hit
 * would teach it a reuse at distance zero. Recency is still refreshed by
 * the touch, in every order. */
static void test_look_then_touch(void **state) {
  (void)state;
  fixture f;
  open_ev(&f, KVT_EVICT_LEARNED);
  add(&f, 1, -1);
  assert_int_equal(model_clock(&f), 1);
  look(&f, 1);
  touch(&f, 1); /* the append after the lookup */
  assert_int_equal(model_clock(&f), 2);
  touch(&f, 1); /* a use of its own */
  look(&f, 1);
  look(&f, 1); /* two lookups: two uses */
  touch(&f, 1);
  assert_int_equal(model_clock(&f), 5);
  /* A lookup its append did not follow lapses after as many uses as the
   * tier holds blocks (here 2): the block's next touch after that is a
   * use of its own, not hidden. */
  look(&f, 1); /* a lookup alone */
  add(&f, 2, -1); /* another request's write */
  look(&f, 2); /* the next request's lookup */
  touch(&f, 2); /* its append: the same use */
  assert_int_equal(model_clock(&f), 8);
  touch(&f, 1); /* a use of 1, long after its lookup */
  assert_int_equal(model_clock(&f), 9);
  /* Requests interleaved (threads, or the cold tier's committer adding
   * meanwhile): another request's use and lookup between a lookup and
   * its append do not make the append a use of its own. */
  add(&f, 3, -1);
  look(&f, 1);
  touch(&f, 2); /* another request's append */
  look(&f, 3);  /* and a third one's lookup */
  touch(&f, 1); /* the append after the first lookup: the same use */
  assert_int_equal(model_clock(&f), 13);
  close_ev(&f);
  open_ev(&f, KVT_EVICT_LRU);
  add(&f, 1, -1);
  add(&f, 2, -1);
  add(&f, 3, -1);
  look(&f, 1);
  look(&f, 2);
  touch(&f, 1); /* after a lookup: recency refreshed all the same */
  assert_int_equal(victim(&f, NULL, NULL), 3);
  evict(&f, 3);
  assert_int_equal(victim(&f, NULL, NULL), 2);
  close_ev(&f);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lru_order),
      cmocka_unit_test(test_chain_tails_first),
      cmocka_unit_test(test_chain_probation),
      cmocka_unit_test(test_chain_any_order),
      cmocka_unit_test(test_keep),
      cmocka_unit_test(test_chain_random_forest),
      cmocka_unit_test(test_live_cold_order),
      cmocka_unit_test(test_look_then_touch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
