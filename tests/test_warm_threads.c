/* test_warm_threads.c - the warm tier inside the engine, through the public
 * API: threads reading blocks while they are demoted, loads while dropped.
 * Shared helpers and the fixture: warm_util.h. */
#include "warm_util.h"

/* The deadlock guard (alarm): a hang fails here rather than at the ctest
 * timeout. It bounds a hang, not a speed: under ThreadSanitizer the
 * encodes of the demotion race run many times slower (and a demotion whose
 * block a reader pinned meanwhile is redone, up to the putter's 2000
 * tries), so on a loaded 2-core machine test_read_while_demoted took over
 * 120 s; the guard stays below the TSan build's ctest TIMEOUT (1800). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define GUARD_S 900
#else
#define GUARD_S 120
#endif

/* ------------------------------------------------ threads */

/* Threads may not use cmocka asserts: the first failure is kept here and
 * the main thread fails on it. */
static atomic_int g_failed;
static char g_msg[512];

static int thread_fail(int line, const char *what, const char *detail) {
  if (atomic_exchange(&g_failed, 1) == 0)
    snprintf(g_msg, sizeof g_msg, "line %d: %s %s", line, what, detail ? detail : "");
  return -1;
}
#define TCHECK(c)                                                 \
  do {                                                            \
    if (!(c)) return thread_fail(__LINE__, #c, NULL);             \
  } while (0)

typedef struct tshared {
  kvt_engine *e;
  kvt_ns_id ns;
  kvt_shape sh;
  uint64_t salt;
  uint32_t fam[4 * 8];
  int iters;
  atomic_int efull, stop;
  atomic_long demoted_seen;
} tshared;

typedef struct tworker {
  pthread_t th;
  int id;
  tshared *sh;
  uint64_t rng;
  tu_kv want, got;
} tworker;

/* Exact, or within the warm bound (reads say nothing of the tier). */
static int same_or_warm(tworker *w, const void *k, const void *v, char *why, size_t n) {
  if (!memcmp(k, w->want.k, w->want.bytes) && !memcmp(v, w->want.v, w->want.bytes)) return 1;
  return warm_ok(&w->sh->sh, w->want.k, w->want.v, k, v, KVT_CODEC_K8, KVT_CODEC_V3, why, n);
}

static int put_retry(tworker *w, kvt_seq *s, uint32_t b, uint32_t l) {
  for (int tries = 0;; tries++) {
    int rc = kvt_seq_put(s, b, l, &w->want.kv);
    if (rc != KVT_EFULL) return rc;
    /* transient: every hot block pinned by other threads' copies */
    atomic_fetch_add(&w->sh->efull, 1);
    if (tries > 10000) return rc;
    sched_yield();
  }
}

static int worker_round(tworker *w) {
  tshared *S = w->sh;
  const kvt_shape *sh = &S->sh;
  uint32_t nb = 1 + (uint32_t)(tu_rand_r(&w->rng) % 6), shared = (uint32_t)(tu_rand_r(&w->rng) % 4);
  uint32_t tok[4 * 8];
  for (uint32_t i = 0; i < 4 * 8; i++)
    tok[i] = i < 4 * shared ? S->fam[i] : (uint32_t)tu_rand_r(&w->rng);
  kvt_seq *s;
  char why[256];
  TCHECK(kvt_seq_create(S->e, S->ns, &s) == 0);
  for (uint32_t b = 0; b < nb; b++) {
    TCHECK(kvt_seq_append(s, tok + 4 * b, 4, NULL) == 0);
    for (uint32_t l = 0; l < sh->n_layers; l++) {
      tu_kv_fill(&w->want, sh, S->salt, l, b, tok + 4 * b);
      int rc = put_retry(w, s, b, l);
      if (rc) {
        snprintf(why, sizeof why, "put returned %d", rc);
        return thread_fail(__LINE__, "put", why);
      }
    }
  }
  size_t each = kvt_shape_block_bytes(sh), bytes = nb * each, n;
  uint8_t *k = malloc(bytes), *v = malloc(bytes);
  kvt_gathered g[8];
  TCHECK(k && v);
  for (int rep = 0; rep < 3; rep++) {
    uint32_t l = (uint32_t)(tu_rand_r(&w->rng) % sh->n_layers);
    bytes = nb * each;
    TCHECK(kvt_seq_gather(s, l, k, v, &bytes, g, 8, &n) == 0);
    TCHECK(n == nb);
    for (uint32_t i = 0; i < n; i++) {
      tu_kv_fill(&w->want, sh, S->salt, l, i, tok + 4 * i);
      if (g[i].exact) {
        TCHECK(g[i].tier == KVT_TIER_HOT);
        if (memcmp(k + i * each, w->want.k, each) || memcmp(v + i * each, w->want.v, each))
          return thread_fail(__LINE__, "hot gathered block differs", NULL);
      } else {
        TCHECK(g[i].tier == KVT_TIER_WARM);
        atomic_fetch_add(&S->demoted_seen, 1);
        if (!warm_ok(sh, w->want.k, w->want.v, k + i * each, v + i * each, KVT_CODEC_K8,
                     KVT_CODEC_V3, why, sizeof why))
          return thread_fail(__LINE__, "warm gathered block", why);
      }
    }
    uint32_t b = (uint32_t)(tu_rand_r(&w->rng) % nb);
    tu_kv_fill(&w->want, sh, S->salt, l, b, tok + 4 * b);
    TCHECK(kvt_seq_read(s, b, l, w->got.k, w->got.v, each) == 0);
    if (!same_or_warm(w, w->got.k, w->got.v, why, sizeof why))
      return thread_fail(__LINE__, "read", why);
    /* attention: finite, masses sum to the heads, outputs bounded by the
     * values (convex combinations; warm values within c_max |v|) */
    enum { NQ = 4 };
    float q[NQ * 64], out[NQ * 64], lse[NQ], mass[8];
    for (int i = 0; i < NQ * 64; i++) q[i] = (float)gauss_r(&w->rng);
    size_t na;
    TCHECK(kvt_seq_attend(s, l, q, NQ, 0, out, lse, mass, 8, &na) == 0);
    TCHECK(na == nb);
    double total = 0;
    for (size_t i = 0; i < na; i++) total += mass[i];
    TCHECK(fabs(total - NQ) <= 1e-3 * NQ);
    for (int h = 0; h < NQ; h++) TCHECK(isfinite(lse[h]));
    for (int i = 0; i < NQ * 64; i++) TCHECK(isfinite(out[i]) && fabsf(out[i]) <= 2.0f * 2.152f * 8);
  }
  free(k);
  free(v);
  kvt_seq_release(s);
  return 0;
}

/* Sets the codecs (to the ones in force, so the bounds stay right) while
 * the workers demote: kvt_ns_set_codec() may run beside any other call. */
static void *codec_setter(void *arg) {
  tshared *S = arg;
  while (!atomic_load(&S->stop)) {
    if (kvt_ns_set_codec(S->e, S->ns, KVT_ALL_LAYERS, KVT_CODEC_K8, KVT_CODEC_V3)) {
      thread_fail(__LINE__, "kvt_ns_set_codec", NULL);
      break;
    }
    sched_yield();
  }
  return NULL;
}

static void *worker_main(void *arg) {
  tworker *w = arg;
  for (int i = 0; i < w->sh->iters && !atomic_load(&g_failed); i++)
    if (worker_round(w)) break;
  return NULL;
}

/* 4 threads put, gather, read and attend with demotion and warm drops
 * going on, and a fifth sets the namespace's codecs meanwhile; every block
 * read is exact or within the warm bound. */
static void test_threads(void **state) {
  (void)state;
  enum { NT = 4 };
  tshared S = {0};
  atomic_store(&g_failed, 0);
  S.sh = shape1(KVT_F32, 2);
  costs c = measure(&S.sh);
  char *dir = tu_tmpdir();
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = 6 * c.hot;
  /* enough for what 4 threads hold at once (<= 4 x 6 x 2 referenced), so
   * EFULL can only be the transient kind; less than all ever put, so
   * unreferenced warm blocks are dropped */
  o.tier_bytes_limit[KVT_TIER_WARM] = 64 * c.warm;
  S.e = tu_open(dir, &o);
  S.ns = tu_register(S.e, "warm-threads", &S.sh);
  S.salt = tu_salt("warm-threads");
  S.iters = tu_stress() ? 2000 : 120;
  for (int i = 0; i < 4 * 8; i++) S.fam[i] = (uint32_t)tu_rand();
  tworker w[NT];
  alarm(GUARD_S);
  for (int i = 0; i < NT; i++) {
    w[i] = (tworker){.id = i, .sh = &S, .rng = tu_rand()};
    tu_kv_alloc(&w[i].want, &S.sh);
    tu_kv_alloc(&w[i].got, &S.sh);
    assert_int_equal(pthread_create(&w[i].th, NULL, worker_main, &w[i]), 0);
  }
  pthread_t setter;
  assert_int_equal(pthread_create(&setter, NULL, codec_setter, &S), 0);
  for (int i = 0; i < NT; i++) assert_int_equal(pthread_join(w[i].th, NULL), 0);
  atomic_store(&S.stop, 1);
  assert_int_equal(pthread_join(setter, NULL), 0);
  alarm(0);
  if (atomic_load(&g_failed)) fail_msg("%s", g_msg);
  kvt_stats st;
  tu_stats(S.e, &st);
  fprintf(stderr, "warm threads: %llu puts, %llu demotions, %llu warm drops, %d transient EFULL, "
          "%ld warm blocks gathered\n", (unsigned long long)st.puts,
          (unsigned long long)st.demotions, (unsigned long long)st.evictions[KVT_TIER_WARM],
          atomic_load(&S.efull), atomic_load(&S.demoted_seen));
  assert_true(st.tier_bytes[KVT_TIER_HOT] <= st.tier_limit[KVT_TIER_HOT]);
  assert_true(st.tier_bytes[KVT_TIER_WARM] <= st.tier_limit[KVT_TIER_WARM]);
  assert_true(st.demotions > 0);
  assert_int_equal(st.seqs, 0);
  assert_int_equal(st.tier_blocks[KVT_TIER_WARM] + st.evictions[KVT_TIER_WARM], st.demotions);
  for (int i = 0; i < NT; i++) {
    tu_kv_free(&w[i].want);
    tu_kv_free(&w[i].got);
  }
  kvt_engine_close(S.e);
  tu_rmtree(dir);
}

/* A block is read (pinned, copied outside the lock) while another thread's
 * put demotes it. A pinned block must not change tier or be freed
 * (DESIGN.md section 2, docs/concurrency.md): the copy must see the block
 * whole, hot or warm. Large blocks make the encode, and so the window in
 * which the demoter has dropped the lock, long; the reader copies in a
 * tight loop. Under AddressSanitizer a freed payload read is reported; in
 * any build a torn copy fails the content check. Variant `drop`: the warm
 * tier cannot take the block and it is unreferenced (only loaded), so the
 * demoter drops it instead while a load holds it pinned. */
typedef struct race {
  kvt_engine *e;
  kvt_ns_id ns;
  kvt_shape sh;
  uint64_t salt;
  int drop;
  atomic_int phase; /* round number the putter may run; -1: stop */
  atomic_int done_round;
  tu_kv want, got, tmp;
} race;

static void *race_putter(void *arg) {
  race *R = arg;
  uint32_t tok[64];
  for (int round = 0;; round++) {
    int ph;
    while ((ph = atomic_load(&R->phase)) < round && ph != -1) sched_yield();
    if (ph == -1) break;
    /* a new block, released at once: it pushes the oldest hot one out */
    kvt_seq *s;
    for (uint32_t i = 0; i < R->sh.block_tokens; i++) tok[i] = 0x80000000u + (uint32_t)round * 64 + i;
    if (kvt_seq_create(R->e, R->ns, &s) || kvt_seq_append(s, tok, R->sh.block_tokens, NULL)) {
      thread_fail(__LINE__, "putter append", NULL);
      break;
    }
    tu_kv_fill(&R->tmp, &R->sh, R->salt, 0, 0, tok);
    int rc;
    /* EFULL: the only hot block was pinned by the reader when chosen (or
     * when the demoter came back to it): try again, so that it goes */
    for (int tries = 0; (rc = kvt_seq_put(s, 0, 0, &R->tmp.kv)) == KVT_EFULL && tries < 2000; tries++)
      sched_yield();
    kvt_seq_release(s);
    if (rc && rc != KVT_EFULL) {
      thread_fail(__LINE__, "putter put", NULL);
      break;
    }
    atomic_store(&R->done_round, round + 1);
  }
  return NULL;
}

static void race_run(int drop) {
  race R = {.drop = drop};
  atomic_store(&g_failed, 0);
  R.sh = (kvt_shape){.n_layers = 1, .n_kv_heads = 8, .head_dim = 128, .dtype = KVT_F32,
                     .block_tokens = 64};
  costs c = measure(&R.sh);
  char *dir = tu_tmpdir();
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = c.hot + c.hot / 2; /* one block */
  o.tier_bytes_limit[KVT_TIER_WARM] = drop ? 64 : 64ull << 20;
  R.e = tu_open(dir, &o);
  R.ns = tu_register(R.e, "warm-race", &R.sh);
  R.salt = tu_salt("warm-race");
  tu_kv_alloc(&R.want, &R.sh);
  tu_kv_alloc(&R.got, &R.sh);
  tu_kv_alloc(&R.tmp, &R.sh);
  atomic_store(&R.phase, -2);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, race_putter, &R), 0);
  alarm(GUARD_S);
  int rounds = tu_stress() ? 400 : 30, warm_seen = 0, dropped_seen = 0;
  uint32_t tok[64];
  char why[256], failure[512] = "";
  /* No cmocka assert while the putter runs: a failure stops it first. */
#define RCHECK(c)                                                               \
  do {                                                                          \
    if (!(c)) {                                                                 \
      snprintf(failure, sizeof failure, "round %d: %s (line %d)", round, #c, __LINE__); \
      goto stop;                                                                \
    }                                                                           \
  } while (0)
  for (int round = 0; round < rounds && !atomic_load(&g_failed); round++) {
    kvt_seq *s = NULL;
    for (uint32_t i = 0; i < R.sh.block_tokens; i++) tok[i] = (uint32_t)round * 64 + i;
    tu_kv_fill(&R.want, &R.sh, R.salt, 0, 0, tok);
    RCHECK(kvt_seq_create(R.e, R.ns, &s) == 0);
    kvt_append_info info;
    RCHECK(kvt_seq_append(s, tok, R.sh.block_tokens, &info) == 0);
    RCHECK(kvt_seq_put(s, 0, 0, &R.want.kv) == 0);
    if (drop) { /* only loads will pin it */
      kvt_seq_release(s);
      s = NULL;
    }
    atomic_store(&R.phase, round); /* the putter demotes (or drops) it now */
    for (int spins = 0;; spins++) {
      int fin = atomic_load(&R.done_round) > round;
      int rc;
      uint32_t tier = 0;
      if (drop) {
        kvt_load_req req = {.key = info.key, .layer = 0, .k_out = R.got.k, .v_out = R.got.v,
                            .bytes_each = R.got.bytes};
        kvt_load *ld;
        RCHECK(kvt_load_submit(R.e, R.ns, &req, 1, &ld) == 0);
        rc = kvt_load_wait(ld, NULL);
        tier = req.tier;
        if (rc == KVT_ENOTFOUND) {
          dropped_seen++;
          break;
        }
      } else {
        kvt_stats a, z;
        tu_stats(R.e, &a);
        rc = kvt_seq_read(s, 0, 0, R.got.k, R.got.v, R.got.bytes);
        tu_stats(R.e, &z);
        tier = z.reads_approx > a.reads_approx ? KVT_TIER_WARM : KVT_TIER_HOT;
      }
      RCHECK(rc == 0);
      int same = !memcmp(R.got.k, R.want.k, R.want.bytes) && !memcmp(R.got.v, R.want.v, R.want.bytes);
      if (!same && !warm_ok(&R.sh, R.want.k, R.want.v, R.got.k, R.got.v, KVT_CODEC_K8,
                            KVT_CODEC_V3, why, sizeof why)) {
        snprintf(failure, sizeof failure, "round %d: a block %s while being %s is neither exact "
                 "nor within the warm bound: %s", round, drop ? "loaded" : "read",
                 drop ? "dropped" : "demoted", why);
        goto stop;
      }
      if (tier == KVT_TIER_WARM) {
        warm_seen++;
        break;
      }
      if (fin && spins > 1000) break; /* the put demoted something else */
    }
    kvt_seq_release(s);
    while (atomic_load(&R.done_round) <= round && !atomic_load(&g_failed)) sched_yield();
  }
stop:
#undef RCHECK
  atomic_store(&R.phase, -1);
  assert_int_equal(pthread_join(th, NULL), 0);
  alarm(0);
  if (*failure) fail_msg("%s", failure);
  if (atomic_load(&g_failed)) fail_msg("%s", g_msg);
  fprintf(stderr, "demotion race (%s): %d rounds, %d ended warm, %d ended dropped\n",
          drop ? "drop" : "demote", rounds, warm_seen, dropped_seen);
  assert_true(drop ? dropped_seen > 0 : warm_seen > 0);
  tu_kv_free(&R.want);
  tu_kv_free(&R.got);
  tu_kv_free(&R.tmp);
  kvt_engine_close(R.e);
  tu_rmtree(dir);
}

static void test_read_while_demoted(void **state) {
  (void)state;
  race_run(0);
}

static void test_load_while_dropped(void **state) {
  (void)state;
  race_run(1);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_read_while_demoted),
      cmocka_unit_test(test_load_while_dropped),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
