/* test_recall_determ.c - recall decides the same whatever the flusher's
 * pace (docs/policy.md, "Recall is deterministic"): a candidate whose token
 * block is still being written to the cold tier is waited for, not
 * skipped as unavailable, so a decoding loop gives the same recalls and
 * the same attention outputs whether every block was made durable at once
 * (kvt_sync after each put) or the flusher lags behind. */
#include <math.h>

#include "cold_util.h"

#define STEPS 96u
#define QH_PER_KV 2u
/* the second run's hot tier (test_ram_or_disk) */
#ifndef HOT_SMALL
#define HOT_SMALL (40u << 10)
#endif

/* xorshift64*: the same keys, values and queries in every run. */
static uint64_t rnd_next(uint64_t *x) {
  *x ^= *x >> 12;
  *x ^= *x << 25;
  *x ^= *x >> 27;
  return *x * 0x2545f4914f6cdd1dull;
}

static float rnd_f(uint64_t *x) { return (float)(rnd_next(x) >> 40) / (float)(1u << 24) - 0.5f; }

typedef struct run_out {
  uint64_t recalls, useful, unavailable, late, recall_bytes;
  uint64_t out_hash; /* FNV-1a over every attention output and lse, bit for bit */
  uint32_t retained[STEPS]; /* layer 0's retained blocks after each step */
} run_out;

static void hash_bytes(uint64_t *h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) *h = (*h ^ b[i]) * 0x100000001b3ull;
}

/* A decoding loop of STEPS 1-token blocks under snapkv at a quarter of the
 * cache with recall on; a query every few steps drifts back to an older
 * token's key, so recall fires. With sync, every block is durable before
 * its step's attention; without, the flusher writes them behind. The hot
 * tier holds everything: evicted blocks stay in RAM, unreferenced, and
 * whether a candidate is recalled depends only on its cold copy. */
static void run_hot(int sync, uint64_t hot_limit, run_out *o) {
  memset(o, 0, sizeof *o);
  o->out_hash = 0xcbf29ce484222325ull;
  char *dir = tu_tmpdir();
  kvt_options opt;
  cu_opts(&opt, KVT_BACKEND_PREAD);
  if (hot_limit) opt.tier_bytes_limit[KVT_TIER_HOT] = hot_limit;
  kvt_engine *e = tu_open(dir, &opt);
  kvt_shape sh = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 16, .dtype = KVT_F32,
                  .block_tokens = 1};
  kvt_ns_id ns = tu_register(e, "m", &sh);
  kvt_seq *s = NULL;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(kvt_policy_parse("snapkv", &p.scorer), 0);
  p.budget = 0.25;
  p.recall = 1;
  assert_int_equal(kvt_seq_set_policy(s, &p), 0);
  uint32_t HD = sh.n_kv_heads * sh.head_dim, H = sh.n_kv_heads * QH_PER_KV, D = sh.head_dim;
  float *keys = calloc((size_t)STEPS * sh.n_layers * HD, sizeof(float));
  float v[64], q[8 * 16], out[8 * 16], lse[8], mass[STEPS];
  assert_non_null(keys);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (uint32_t t = 0; t < STEPS; t++) {
    uint32_t tok = t + 1;
    assert_int_equal(kvt_seq_append(s, &tok, 1, NULL), 0);
    for (uint32_t l = 0; l < sh.n_layers; l++) {
      float *k = keys + ((size_t)t * sh.n_layers + l) * HD;
      for (uint32_t i = 0; i < HD; i++) {
        k[i] = 2.0f * rnd_f(&x);
        v[i] = rnd_f(&x);
      }
      kvt_kv kv = {.k = k, .v = v, .dtype = KVT_F32, .n_tokens = 1, .n_heads = sh.n_kv_heads,
                   .head_dim = D};
      assert_int_equal(kvt_seq_put(s, t, l, &kv), 0);
    }
    if (sync) assert_int_equal(kvt_sync(e), 0);
    uint32_t back = t > 8 && t % 3 == 0 ? (uint32_t)(rnd_next(&x) % (t - 4)) : t;
    kvt_seq_set_tokens(s, t + 1);
    for (uint32_t l = 0; l < sh.n_layers; l++) {
      const float *kb = keys + ((size_t)back * sh.n_layers + l) * HD;
      for (uint32_t h = 0; h < H; h++)
        for (uint32_t d = 0; d < D; d++)
          q[h * D + d] = (back == t ? 0 : 4.0f * kb[(h / QH_PER_KV) * D + d]) + rnd_f(&x);
      size_t n = 0;
      assert_int_equal(kvt_seq_attend(s, l, q, H, 0, out, lse, mass, STEPS, &n), 0);
      hash_bytes(&o->out_hash, out, (size_t)H * D * sizeof(float));
      hash_bytes(&o->out_hash, lse, H * sizeof(float));
      assert_int_equal(kvt_seq_observe(s, l, mass, n), 0);
      if (l == 0) o->retained[t] = (uint32_t)n;
    }
  }
  kvt_stats st;
  tu_stats(e, &st);
  o->recalls = st.recalls;
  o->useful = st.recall_useful;
  o->unavailable = st.recall_unavailable;
  o->late = st.recall_late;
  o->recall_bytes = st.recall_bytes;
  free(keys);
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

static void run(int sync, run_out *o) { run_hot(sync, 0, o); }

static void assert_same(const run_out *a, const run_out *b) {
  assert_int_equal(a->recalls, b->recalls);
  assert_int_equal(a->useful, b->useful);
  assert_int_equal(a->unavailable, b->unavailable);
  assert_memory_equal(a->retained, b->retained, sizeof a->retained);
  assert_true(a->out_hash == b->out_hash);
}

/* Durable at once, or written behind by the flusher: the same recalls and
 * the same attention, bit for bit, run after run. */
static void test_runs_repeat(void **state) {
  (void)state;
  run_out synced, behind1, behind2;
  run(1, &synced);
  run(0, &behind1);
  run(0, &behind2);
  fprintf(stderr, "recalls %llu (useful %llu, unavailable %llu) / %llu (%llu, %llu) / %llu\n",
          (unsigned long long)synced.recalls, (unsigned long long)synced.useful,
          (unsigned long long)synced.unavailable, (unsigned long long)behind1.recalls,
          (unsigned long long)behind1.useful, (unsigned long long)behind1.unavailable,
          (unsigned long long)behind2.recalls);
  assert_true(synced.recalls >= 8); /* the loop does exercise recall */
  assert_int_equal(synced.unavailable, 0);
  assert_int_equal(behind1.late + behind2.late, 0);
  assert_same(&synced, &behind1);
  assert_same(&synced, &behind2);
}

/* A recalled block comes back as the RAM copy the hot tier still keeps,
 * unreferenced, or read from the cold tier when the hot tier let it go:
 * which one depends, in a server, on how far the flusher got (a block
 * still queued is held in RAM, so the hot tier lets others go). Either way
 * it counts against the budget from its recall on (kvt_recall_reading),
 * so the puts between the recall and its install (the next step's) evict
 * the same blocks and the attention is the same. Both runs sync after
 * each put (no timing); the second's hot tier, a little over half the
 * blocks, lets most evicted blocks go and the recalls read them. Before,
 * a block on its way was not counted, the put did not evict for it, and
 * the next attention saw one block more: the outputs differed. */
static void test_ram_or_disk(void **state) {
  (void)state;
  run_out ram, disk;
  run_hot(1, 0, &ram);
  run_hot(1, HOT_SMALL, &disk);
  fprintf(stderr, "recalls %llu (read %llu bytes) / %llu (read %llu bytes)\n",
          (unsigned long long)ram.recalls, (unsigned long long)ram.recall_bytes,
          (unsigned long long)disk.recalls, (unsigned long long)disk.recall_bytes);
  assert_true(ram.recalls >= 8);
  assert_int_equal(ram.recall_bytes, 0);     /* every recalled block was still in RAM */
  assert_true(disk.recall_bytes > 0);        /* and here some were read */
  assert_same(&ram, &disk);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runs_repeat),
      cmocka_unit_test(test_ram_or_disk),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
