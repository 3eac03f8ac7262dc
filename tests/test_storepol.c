/* test_storepol.c - the learned admission and eviction order
 * (KVT_EVICT_LEARNED, tiers/evict.c + tiers/reuse_model.c): it never
 * learns from the future (a replay and a copy whose requests after T are
 * shuffled make the same decisions before T), and its model survives a
 * restart in the cold index (weights identical after close and reopen). */
#include "testutil.h"
#include "cold_util.h"

#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "engine/internal.h"
#include "tiers/cold.h"
#include "tiers/cold_meta.h"
#include "tiers/evict.h"
#include "tiers/reuse_model.h"

/* ---------------------------------------------------------------- trace */

#define N_REQ 2000
#define MAX_BLK 24
#define REC 4096 /* bytes of one record */

/* A request: a chain of block ids, hashed into keys as a prefix chain. */
typedef struct req {
  uint32_t n;
  uint64_t id[MAX_BLK];
} req;

/* Conversations: each request is a conversation's previous request plus
 * new blocks (or a first turn after a shared system block); some
 * conversations come back soon, some late, some never; a third of the
 * requests are one-off prompts, never continued (what admission
 * declines once it has learned so). */
static void make_trace(req *r, size_t n, uint64_t seed) {
  enum { CONVS = 150 };
  static req last[CONVS];
  memset(last, 0, sizeof last);
  uint64_t st = seed, next_id = 1000;
  for (size_t i = 0; i < n; i++) {
    if (tu_rand_r(&st) % 3 == 0) { /* a one-off */
      r[i].n = 1 + 4 + (uint32_t)(tu_rand_r(&st) % 8);
      r[i].id[0] = 1;
      for (uint32_t k = 1; k < r[i].n; k++) r[i].id[k] = next_id++;
      continue;
    }
    uint32_t c = (uint32_t)(tu_rand_r(&st) % CONVS);
    if (tu_rand_r(&st) % 4 == 0) c = (uint32_t)(tu_rand_r(&st) % 8); /* a few hot ones */
    req *l = &last[c];
    if (l->n == 0 || l->n + 4 > MAX_BLK) { /* a new conversation */
      l->n = 1;
      l->id[0] = 1; /* the shared system block */
    }
    uint32_t add = 1 + (uint32_t)(tu_rand_r(&st) % 4);
    for (uint32_t k = 0; k < add; k++) l->id[l->n++] = next_id++;
    r[i] = *l;
  }
}

static kvt_key chain_key(const kvt_key *parent, uint64_t id) {
  uint64_t h = tu_mix(id ^ (parent ? tu_mix(*(const uint64_t *)parent->b + 7) : 0x1234));
  kvt_key k = {{0}};
  memcpy(k.b, &h, 8);
  uint64_t h2 = tu_mix(h + 1);
  memcpy(k.b + 8, &h2, 8);
  return k;
}

/* --------------------------------------------------- decisions of a replay */

typedef struct log {
  uint64_t v[200000];  /* (kind << 62) | key bits */
  size_t n;
  kvt_key cur[MAX_BLK]; /* the request being written: referenced */
  uint32_t n_cur;
} log_t;

static void log_add(log_t *l, uint64_t kind, const kvt_key *k) {
  uint64_t h;
  memcpy(&h, k->b, 8);
  if (l->n < sizeof l->v / sizeof *l->v) l->v[l->n++] = kind << 62 | (h >> 2);
}

static int keep_cur(void *arg, const kvt_key *key) {
  log_t *l = arg;
  for (uint32_t i = 0; i < l->n_cur; i++)
    if (!memcmp(l->cur[i].b, key->b, 16)) return 1;
  return 0;
}

static void on_evicted(void *arg, const kvt_key *key) { log_add(arg, 2, key); }

/* Replay reqs through a learned metadata-only cold tier of cap records,
 * as kvtier plan does: look up the leading run, write the rest (each
 * asked admission first). Logs every decision; *at_t is the log length
 * when request t starts. */
static void replay(const req *reqs, size_t n, size_t t, uint64_t cap, log_t *l, size_t *at_t) {
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_cold_meta *c;
  assert_int_equal(kvt_cold_meta_open(&m, cap * REC, KVT_EVICT_LEARNED, &c), 0);
  kvt_cold_meta_set_hooks(c, keep_cur, on_evicted, l);
  l->n = 0;
  for (size_t i = 0; i < n; i++) {
    if (i == t) *at_t = l->n;
    const req *r = &reqs[i];
    kvt_key keys[MAX_BLK];
    for (uint32_t k = 0; k < r->n; k++) keys[k] = chain_key(k ? &keys[k - 1] : NULL, r->id[k]);
    memcpy(l->cur, keys, sizeof keys);
    l->n_cur = r->n;
    size_t hit = kvt_cold_meta_prefix(c, keys, r->n);
    for (uint32_t k = (uint32_t)hit; k < r->n; k++) {
      const kvt_key *parent = k ? &keys[k - 1] : NULL;
      if (kvt_cold_meta_find(c, &keys[k]) == 0) continue; /* stored past a miss */
      int ok = kvt_cold_meta_admit(c, &keys[k], parent, k, 1, REC);
      log_add(l, (uint64_t)ok, &keys[k]); /* 1 admitted, 0 declined */
      if (ok) kvt_cold_meta_write(c, &keys[k], parent, NULL, REC);
    }
  }
  kvt_cold_meta_close(c);
  assert_int_equal(kvt_mem_bytes(&m, KVT_MEM_INDEX), 0);
}

static void count_kinds(const log_t *l, size_t upto, size_t out[3]) {
  out[0] = out[1] = out[2] = 0;
  for (size_t i = 0; i < upto; i++) out[l->v[i] >> 62]++;
}

/* Every decision before T is the same whatever comes after T. */
static void test_no_future_leak(void **state) {
  (void)state;
  static req a[N_REQ], b[N_REQ];
  static log_t la, lb;
  make_trace(a, N_REQ, 42);
  memcpy(b, a, sizeof a);
  const size_t t = N_REQ / 2;
  uint64_t st = 7;
  for (size_t i = N_REQ - 1; i > t; i--) { /* shuffle b's requests t.. */
    size_t j = t + (size_t)(tu_rand_r(&st) % (i - t + 1));
    req x = b[i];
    b[i] = b[j];
    b[j] = x;
  }
  size_t at_a = 0, at_b = 0;
  replay(a, N_REQ, t, 400, &la, &at_a);
  replay(b, N_REQ, t, 400, &lb, &at_b);
  size_t k[3];
  count_kinds(&la, at_a, k);
  fprintf(stderr, "before T: %zu declined, %zu admitted, %zu evicted\n", k[0], k[1], k[2]);
  assert_true(k[0] > 50 && k[1] > 50 && k[2] > 50); /* every kind was decided */
  assert_int_equal(at_a, at_b);
  for (size_t i = 0; i < at_a; i++)
    if (la.v[i] != lb.v[i]) fail_msg("decision %zu of %zu before T differs", i, at_a);
  /* The shuffle changed what came after T: the test can see a difference. */
  assert_true(la.n != lb.n || memcmp(la.v, lb.v, la.n * sizeof *la.v) != 0);
}

/* ------------------------------------------------------------ restart */

static void train_model(kvt_cold *c) {
  /* Blocks asked for again soon (reused) and blocks never asked again,
   * past the horizon: both labels. */
  kvt_key prev = {{0}};
  for (uint32_t i = 0; i < 6000; i++) {
    uint64_t id = i % 3 == 0 ? (i % 60) : 100000 + i;
    kvt_key k = chain_key(i % 3 == 0 ? NULL : &prev, id);
    kvt_cold_admit(c, &k, i % 3 == 0 ? NULL : &prev, i % 3, 1, REC);
    prev = k;
  }
}

/* The disk store's own tier behind the engine's store interface. */
static kvt_cold *cold_of(kvt_engine *e) { return e->store ? e->store->impl : NULL; }

static void test_weights_survive_restart(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  o.tier_bytes_limit[KVT_TIER_COLD] = 64ull << 20;
  o.cold_evict = KVT_EVICT_LEARNED;
  kvt_engine *e = tu_open(dir, &o);
  assert_non_null(cold_of(e));
  static uint8_t before[KVT_EVICT_MODEL_MAX], after[KVT_EVICT_MODEL_MAX], fresh[KVT_EVICT_MODEL_MAX];
  size_t n0 = kvt_cold_model_state(cold_of(e), fresh, sizeof fresh);
  assert_int_equal(n0, KVT_REUSE_STATE_BYTES);
  train_model(cold_of(e));
  size_t n1 = kvt_cold_model_state(cold_of(e), before, sizeof before);
  assert_int_equal(n1, KVT_REUSE_STATE_BYTES);
  /* Training moved the weights (else the comparison below proves nothing). */
  assert_true(memcmp(fresh + 32, before + 32, n1 - 32) != 0);
  kvt_engine_close(e);

  e = tu_open(dir, &o);
  size_t n2 = kvt_cold_model_state(cold_of(e), after, sizeof after);
  assert_int_equal(n2, n1);
  assert_memory_equal(before, after, n1); /* weights, clock and checksum */
  kvt_engine_close(e);

  /* A record that does not check is ignored: the model starts afresh
   * (and the store opens). */
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_evict *ev;
  assert_int_equal(kvt_evict_create(&m, KVT_MEM_INDEX, KVT_EVICT_LEARNED, &ev), 0);
  after[40] ^= 1;
  assert_int_equal(kvt_evict_model_load(ev, after, n1), KVT_ECORRUPT);
  after[40] ^= 1;
  after[8] ^= 1; /* version */
  assert_int_equal(kvt_evict_model_load(ev, after, n1), KVT_EVERSION);
  after[8] ^= 1;
  assert_int_equal(kvt_evict_model_load(ev, after, n1 - 1), KVT_ECORRUPT);
  assert_int_equal(kvt_evict_model_load(ev, after, n1), 0);
  kvt_evict_free(ev);
  tu_rmtree(dir);
}

/* The learned order on a store on disk: chains written and some asked for
 * again, in a cold tier that holds a third of them. Writes keep
 * succeeding while it declines and evicts, and what stays is sound. */
static void test_live_cold_learned(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  tu_opts(&o);
  kvt_shape sh = {.n_layers = 1, .n_kv_heads = 4, .head_dim = 64, .dtype = KVT_F16,
                  .block_tokens = 64}; /* 64 KiB of K+V a block */
  o.tier_bytes_limit[KVT_TIER_HOT] = 4u << 20;
  o.tier_bytes_limit[KVT_TIER_COLD] = 6u << 20;
  o.cold_segment_bytes = 1u << 20;
  o.cold_group_bytes = 256u << 10;
  o.cold_evict = KVT_EVICT_LEARNED;
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "live-learned", &sh);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  enum { CHAINS = 96, LEN = 6 };
  static uint32_t toks[LEN * 64];
  for (uint32_t i = 0; i < CHAINS; i++) {
    uint32_t c = i % 3 == 2 ? i - 2 : i; /* every third request repeats an earlier chain */
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
  assert_true(st.evictions[KVT_TIER_COLD] > 0);
  kvt_engine_close(e);
  e = tu_open(dir, &o);
  ns = tu_register(e, "live-learned", &sh);
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.bad, 0);
  tu_stats(e, &st);
  assert_true(st.cold_records > 0 && st.cold_records < CHAINS * LEN);
  tu_kv_free(&kv);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_future_leak),
      cmocka_unit_test(test_weights_survive_restart),
      cmocka_unit_test(test_live_cold_learned),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
