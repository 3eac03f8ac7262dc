/* test_engine_learned.c - the learned order as the engine runs it by
 * default (kvt_options_init: KVT_EVICT_LEARNED): through kvt_engine_open's
 * own admission and eviction, a replay and a copy whose requests after T
 * are shuffled decide the same before T, and a restarted store starts
 * from the model it had (not cold). */
#include "testutil.h"
#include "cold_util.h"

#include <stdlib.h>
#include <string.h>

#include "conv_trace.h"
#include "engine/internal.h"
#include "tiers/cold.h"
#include "tiers/evict.h"
#include "tiers/reuse_model.h"

#define N_REQ 1600
#define BT 16 /* tokens a block */

static const kvt_shape SHAPE = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 16,
                                .dtype = KVT_F16, .block_tokens = BT};

/* What a request saw and left: its hit, then the cold tier's records and
 * evictions after it (admissions declined show in the records). */
typedef struct step {
  uint64_t found, records, evictions;
} step;

/* One request as kvtier plan replays it: look up the leading run, then
 * append every block and put those no tier had. */
static void run_request(kvt_engine *e, kvt_ns_id ns, const ct_req *r, step *out) {
  static uint32_t tok[CT_MAX_BLK * BT];
  memset(tok, 0, sizeof tok);
  for (uint32_t i = 0; i < r->n; i++) {
    tok[i * BT] = (uint32_t)r->id[i];
    tok[i * BT + 1] = (uint32_t)(r->id[i] >> 32);
  }
  kvt_lookup_entry ent[CT_MAX_BLK];
  size_t found = 0;
  assert_int_equal(kvt_lookup(e, ns, tok, (size_t)r->n * BT, ent, r->n, &found), 0);
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, ns, &q), 0);
  kvt_kv kv = {.dtype = SHAPE.dtype, .n_tokens = BT, .n_heads = SHAPE.n_kv_heads,
               .head_dim = SHAPE.head_dim};
  for (uint32_t i = 0; i < r->n; i++) {
    kvt_append_info info;
    assert_int_equal(kvt_seq_append(q, tok + i * BT, BT, &info), 0);
    if (info.durable || info.layers_present == SHAPE.n_layers) continue;
    for (uint32_t l = 0; l < SHAPE.n_layers; l++) {
      int rc = kvt_seq_put(q, i, l, &kv);
      if (rc != KVT_EFULL) assert_int_equal(rc, 0);
    }
  }
  kvt_seq_release(q);
  kvt_stats st;
  tu_stats(e, &st);
  *out = (step){found, st.cold_records, st.evictions[KVT_TIER_COLD]};
}

/* Replay through a metadata-only engine with the default options but
 * for the limits: a hot tier smaller than one layer block (every block
 * goes to the cold tier, which holds cap of them). */
static void replay(const ct_req *reqs, size_t n, uint64_t cap, step *log) {
  kvt_options o;
  kvt_options_init(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  o.tier_bytes_limit[KVT_TIER_HOT] = 1;
  o.tier_bytes_limit[KVT_TIER_COLD] = cap * kvt_cold_record_bytes(&SHAPE);
  kvt_engine *e = tu_open(NULL, &o);
  kvt_ns_id ns = tu_register(e, "engine-learned", &SHAPE);
  for (size_t i = 0; i < n; i++) run_request(e, ns, &reqs[i], &log[i]);
  kvt_engine_close(e);
}

/* Every hit, record count and eviction count before T is the same
 * whatever comes after T. */
static void test_engine_no_future_leak(void **state) {
  (void)state;
  static ct_req a[N_REQ], b[N_REQ];
  static step la[N_REQ], lb[N_REQ];
  ct_make_trace(a, N_REQ, 1234);
  memcpy(b, a, sizeof a);
  const size_t t = N_REQ / 2;
  uint64_t st = 99;
  for (size_t i = N_REQ - 1; i > t; i--) {
    size_t j = t + (size_t)(tu_rand_r(&st) % (i - t + 1));
    ct_req x = b[i];
    b[i] = b[j];
    b[j] = x;
  }
  replay(a, N_REQ, 300, la);
  replay(b, N_REQ, 300, lb);
  uint64_t hits = 0;
  for (size_t i = 0; i < t; i++) hits += la[i].found;
  fprintf(stderr, "before T: %llu block hits, %llu records, %llu evictions\n",
          (unsigned long long)hits, (unsigned long long)la[t - 1].records,
          (unsigned long long)la[t - 1].evictions);
  /* The tier filled and evicted before T, and requests hit it. */
  assert_true(hits > 200 && la[t - 1].evictions > 200);
  for (size_t i = 0; i < t; i++)
    if (memcmp(&la[i], &lb[i], sizeof la[i]))
      fail_msg("request %zu of %zu before T: found %llu/%llu records %llu/%llu", i, t,
               (unsigned long long)la[i].found, (unsigned long long)lb[i].found,
               (unsigned long long)la[i].records, (unsigned long long)lb[i].records);
  /* The shuffle changed what came after T: the test can see a difference. */
  assert_true(memcmp(la + t, lb + t, (N_REQ - t) * sizeof *la) != 0);
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

/* Default options: the cold tier runs the learned order, and its model
 * is in the index across a restart. */
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
  kvt_engine_close(e);

  e = tu_open(dir, &o);
  size_t n2 = kvt_cold_model_state(cold_of(e), after, sizeof after);
  assert_int_equal(n2, n1);
  assert_memory_equal(before, after, n1);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_engine_no_future_leak),
      cmocka_unit_test(test_default_learned_restarts_warm),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
