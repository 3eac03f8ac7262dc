/* test_hot_order.c - the hot tier's eviction order (kvt_options.hot_evict,
 * engine/hot_order.c): learned by default, LRU selectable; a replay and a
 * copy whose requests after T are shuffled decide the same before T; the
 * order tracks exactly the indexed token blocks with a hot layer. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conv_trace.h"
#include "engine/internal.h"
#include "tiers/cold_record.h"
#include "tiers/evict.h"
#include "tiers/tier.h"

#define N_REQ 1600
#define BT 16 /* tokens a block */
#define CAP 300 /* token blocks the hot tier holds */

static const kvt_shape SHAPE = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 16,
                                .dtype = KVT_F16, .block_tokens = BT};

/* The order holds exactly the indexed token blocks with a hot layer. */
static void check_tracked(kvt_engine *e) {
  uint64_t with_hot = 0;
  for (size_t i = 0; i < e->n_buckets; i++)
    for (kvt_tblk *tb = e->buckets[i]; tb; tb = tb->hnext) {
      uint32_t n = 0;
      for (uint32_t l = 0; l < tb->n_layers; l++)
        n += tb->layers[l] && tb->layers[l]->tier == KVT_TIER_HOT;
      assert_int_equal(tb->n_hot, n);
      assert_int_equal(tb->hot_tracked, n > 0);
      if (n) assert_true(kvt_evict_has(e->hot_ev, &tb->key));
      with_hot += n > 0;
    }
  assert_int_equal(kvt_evict_count(e->hot_ev), with_hot);
}

/* One request as kvtier plan replays it: look up the leading run, then
 * append every block and put those no tier had. */
static void run_request(kvt_engine *e, kvt_ns_id ns, const ct_req *r, ct_step *out) {
  static uint32_t tok[CT_MAX_BLK * BT];
  ct_tokens(r, BT, tok);
  size_t found = ct_lookup(e, ns, r, BT, tok);
  ct_append_put(e, ns, &SHAPE, tok, r->n, 0); /* the hot tier evicts: every put fits */
  kvt_stats st;
  tu_stats(e, &st);
  *out = (ct_step){found, st.tier_blocks[KVT_TIER_HOT], st.evictions[KVT_TIER_HOT]};
}

/* Replay through a metadata-only engine with only a hot tier, of CAP
 * token blocks, evicting in order policy (-1: kvt_options_init's). */
static void replay(const ct_req *reqs, size_t n, int policy, ct_step *log) {
  kvt_options o;
  kvt_options_init(&o);
  if (policy >= 0) o.hot_evict = (uint32_t)policy;
  o.flags = KVT_OPEN_METADATA_ONLY;
  o.tier_bytes_limit[KVT_TIER_HOT] = CAP * SHAPE.n_layers * (kvt_lblk_desc_bytes() + 2048);
  kvt_engine *e = tu_open(NULL, &o);
  assert_true((e->hot_ev != NULL) == (o.hot_evict != KVT_EVICT_LRU));
  kvt_ns_id ns = tu_register(e, "hot-order", &SHAPE);
  for (size_t i = 0; i < n; i++) {
    run_request(e, ns, &reqs[i], &log[i]);
    if (e->hot_ev && i % 97 == 0) check_tracked(e);
  }
  if (e->hot_ev) check_tracked(e);
  kvt_engine_close(e);
}

static void replay_default(const ct_req *reqs, size_t n, ct_step *log) {
  replay(reqs, n, -1, log);
}

/* Every hit, block count and eviction count before T is the same
 * whatever comes after T. */
static void test_hot_no_future_leak(void **state) {
  (void)state;
  ct_no_future_leak(replay_default, N_REQ, "hot blocks");
}

static uint64_t total_hits(const ct_step *log, size_t n) {
  uint64_t h = 0;
  for (size_t i = 0; i < n; i++) h += log[i].found;
  return h;
}

/* The default is the learned order, and it decides: the same trace under
 * the LRU list finds other blocks. Learned never does worse than LRU on
 * it by more than noise (it falls back to CHAIN when behind). */
static void test_hot_default_learned(void **state) {
  (void)state;
  kvt_options o;
  kvt_options_init(&o);
  assert_int_equal(o.hot_evict, KVT_EVICT_LEARNED);
  static ct_req a[N_REQ];
  static ct_step ld[N_REQ], ll[N_REQ], lr[N_REQ];
  ct_make_trace(a, N_REQ, 777);
  replay(a, N_REQ, -1, ld);
  replay(a, N_REQ, KVT_EVICT_LEARNED, ll);
  replay(a, N_REQ, KVT_EVICT_LRU, lr);
  assert_memory_equal(ld, ll, sizeof ld);
  uint64_t hl = total_hits(ll, N_REQ), hr = total_hits(lr, N_REQ);
  fprintf(stderr, "block hits: learned %llu, LRU %llu\n", (unsigned long long)hl,
          (unsigned long long)hr);
  assert_true(memcmp(ll, lr, sizeof ll) != 0);
  assert_true(hl >= hr - hr / 50);
}

/* The hot order's model clock: accesses it counted. */
static uint64_t hot_clock(kvt_engine *e) {
  uint8_t st[KVT_EVICT_MODEL_MAX];
  assert_true(kvt_evict_model_save(e->hot_ev, st, sizeof st) > 24);
  return kvt_le_get64(st + 16);
}

/* A lookup and the append after it are one use of a hot block; a lookup
 * no append followed, once the next request's lookup has come, hides
 * nothing: the block's next append is a use of its own. */
static void test_hot_lookup_alone(void **state) {
  (void)state;
  kvt_options o;
  kvt_options_init(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  o.tier_bytes_limit[KVT_TIER_HOT] = CAP * SHAPE.n_layers * (kvt_lblk_desc_bytes() + 2048);
  kvt_engine *e = tu_open(NULL, &o);
  kvt_ns_id ns = tu_register(e, "hot-look", &SHAPE);
  static uint32_t ta[CT_MAX_BLK * BT], tb[CT_MAX_BLK * BT];
  ct_req a = {.n = 2, .id = {11, 12}}, b = {.n = 1, .id = {21}};
  ct_tokens(&a, BT, ta);
  ct_tokens(&b, BT, tb);
  ct_append_put(e, ns, &SHAPE, ta, a.n, 0);
  uint64_t c0 = hot_clock(e);
  assert_int_equal(ct_lookup(e, ns, &a, BT, ta), 2);
  ct_append_put(e, ns, &SHAPE, ta, a.n, 0); /* its append: the same uses */
  assert_int_equal(hot_clock(e), c0 + 2);
  assert_int_equal(ct_lookup(e, ns, &a, BT, ta), 2); /* a lookup alone */
  ct_append_put(e, ns, &SHAPE, tb, b.n, 0);          /* another request */
  assert_int_equal(ct_lookup(e, ns, &b, BT, tb), 1);
  ct_append_put(e, ns, &SHAPE, tb, b.n, 0);
  uint64_t c1 = hot_clock(e);
  ct_append_put(e, ns, &SHAPE, ta, a.n, 0); /* a's blocks used again */
  assert_int_equal(hot_clock(e), c1 + 2);
  kvt_engine_close(e);
}

/* hot_evict takes the KVT_EVICT_* values only. */
static void test_hot_evict_option(void **state) {
  (void)state;
  kvt_options o;
  kvt_options_init(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  o.hot_evict = KVT_EVICT_LEARNED + 1;
  kvt_engine *e = NULL;
  assert_int_equal(kvt_engine_open(NULL, &o, &e), KVT_EOPTION);
  assert_null(e);
  o.hot_evict = KVT_EVICT_CHAIN;
  e = tu_open(NULL, &o);
  assert_non_null(e->hot_ev);
  kvt_engine_close(e);
  o.tier_bytes_limit[KVT_TIER_HOT] = 0; /* no hot tier: no order to keep */
  o.hot_evict = KVT_EVICT_LEARNED;
  e = tu_open(NULL, &o);
  assert_null(e->hot_ev);
  kvt_engine_close(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hot_no_future_leak),
      cmocka_unit_test(test_hot_default_learned),
      cmocka_unit_test(test_hot_evict_option),
      cmocka_unit_test(test_hot_lookup_alone),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
