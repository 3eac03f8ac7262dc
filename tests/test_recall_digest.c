/* test_recall_digest.c - recall's decisions are pinned to the bit, so a
 * faster sketch scan (recall.c) must prove it decides the same. A decoding
 * loop with recall on (1- and 4-token blocks; 4 and 6 query heads; sinks,
 * a window and a delay) must give the recalls, retained counts and
 * attention outputs recorded with the scan as it is: one head after
 * another, every exp, kvt_policy_evictable() for each block. */
#include <math.h>

#include "cold_util.h"

#define STEPS 96u

/* xorshift64*: the same keys, values and queries in every run. */
static uint64_t rnd_next(uint64_t *x) {
  *x ^= *x >> 12;
  *x ^= *x << 25;
  *x ^= *x >> 27;
  return *x * 0x2545f4914f6cdd1dull;
}

static float rnd_f(uint64_t *x) { return (float)(rnd_next(x) >> 40) / (float)(1u << 24) - 0.5f; }

static void hash_bytes(uint64_t *h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) *h = (*h ^ b[i]) * 0x100000001b3ull;
}

typedef struct run_out {
  uint64_t recalls, useful, hash; /* hash: outputs, lse and retained counts */
} run_out;

/* STEPS blocks of bt tokens under snapkv at a quarter of the cache with
 * recall on, every block durable before its step's attention; a query
 * every few steps drifts back to an older block's keys, so recall fires. */
static void run(uint32_t bt, uint32_t qh_per_kv, uint32_t protect, run_out *o) {
  memset(o, 0, sizeof *o);
  o->hash = 0xcbf29ce484222325ull;
  char *dir = tu_tmpdir();
  kvt_options opt;
  cu_opts(&opt, KVT_BACKEND_PREAD);
  kvt_engine *e = tu_open(dir, &opt);
  kvt_shape sh = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 8, .dtype = KVT_F32,
                  .block_tokens = bt};
  kvt_ns_id ns = tu_register(e, "m", &sh);
  kvt_seq *s = NULL;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(kvt_policy_parse("snapkv", &p.scorer), 0);
  p.budget = 0.25;
  p.recall = 1;
  if (protect) { /* sinks, a window and a delay that keep blocks from leaving */
    p.sink_blocks = protect;
    p.window_blocks = 2 * protect;
    p.delay = protect;
  }
  assert_int_equal(kvt_seq_set_policy(s, &p), 0);
  uint32_t HD = sh.n_kv_heads * sh.head_dim, H = sh.n_kv_heads * qh_per_kv, D = sh.head_dim;
  size_t each = (size_t)bt * HD;
  float *keys = calloc((size_t)STEPS * sh.n_layers * each, sizeof(float));
  float *v = calloc(each, sizeof(float));
  float q[8 * 8], out[8 * 8], lse[8], mass[STEPS];
  uint32_t tok[4];
  assert_true(keys && v && H <= 8 && bt <= 4);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (uint32_t t = 0; t < STEPS; t++) {
    for (uint32_t i = 0; i < bt; i++) tok[i] = t * bt + i + 1;
    assert_int_equal(kvt_seq_append(s, tok, bt, NULL), 0);
    for (uint32_t l = 0; l < sh.n_layers; l++) {
      float *k = keys + ((size_t)t * sh.n_layers + l) * each;
      for (size_t i = 0; i < each; i++) {
        k[i] = 2.0f * rnd_f(&x);
        v[i] = rnd_f(&x);
      }
      kvt_kv kv = {.k = k, .v = v, .dtype = KVT_F32, .n_tokens = bt, .n_heads = sh.n_kv_heads,
                   .head_dim = D};
      assert_int_equal(kvt_seq_put(s, t, l, &kv), 0);
    }
    assert_int_equal(kvt_sync(e), 0);
    uint32_t back = t > 8 && t % 3 == 0 ? (uint32_t)(rnd_next(&x) % (t - 4)) : t;
    kvt_seq_set_tokens(s, (uint64_t)(t + 1) * bt);
    for (uint32_t l = 0; l < sh.n_layers; l++) {
      /* toward the first token of block `back` */
      const float *kb = keys + ((size_t)back * sh.n_layers + l) * each;
      for (uint32_t h = 0; h < H; h++)
        for (uint32_t d = 0; d < D; d++)
          q[h * D + d] = (back == t ? 0 : 4.0f * kb[(h / qh_per_kv) * D + d]) + rnd_f(&x);
      size_t n = 0;
      assert_int_equal(kvt_seq_attend(s, l, q, H, 0, out, lse, mass, STEPS, &n), 0);
      hash_bytes(&o->hash, out, (size_t)H * D * sizeof(float));
      hash_bytes(&o->hash, lse, H * sizeof(float));
      hash_bytes(&o->hash, &n, sizeof n);
      assert_int_equal(kvt_seq_observe(s, l, mass, n), 0);
    }
  }
  kvt_stats st;
  tu_stats(e, &st);
  o->recalls = st.recalls;
  o->useful = st.recall_useful;
  free(keys);
  free(v);
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

static void check(uint32_t bt, uint32_t qh_per_kv, uint32_t protect, uint64_t recalls,
                  uint64_t useful, uint64_t hash) {
  run_out o;
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
