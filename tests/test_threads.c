/* test_threads.c - one engine, several threads of agents over a shared
 * system prompt plus private and pooled tokens, with an observer reading
 * stats, lookups and loads meanwhile: every byte read back is the byte put,
 * the counters add up afterwards, and the work is bounded (no deadlock). */
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
  NT = 4,    /* worker threads */
  SYS = 3,   /* system prompt blocks */
  MAXB = 8,  /* blocks per agent */
  NPOOL = 4, /* user prompts shared across threads */
  BT = 4,    /* block_tokens of tu_shape_small */
};

/* Threads may not use cmocka asserts: the first failure is recorded here
 * and the main thread fails on it. */
static atomic_int g_failed;
static char g_msg[512];

static int failed_at(int line, const char *what, int id) {
  if (atomic_exchange(&g_failed, 1) == 0)
    snprintf(g_msg, sizeof g_msg, "thread %d: line %d: %s", id, line, what);
  return -1;
}
#define CHECK(w, c)                                      \
  do {                                                   \
    if (!(c)) return failed_at(__LINE__, #c, (w)->id);   \
  } while (0)

typedef struct shared {
  kvt_engine *e;
  kvt_ns_id ns;
  kvt_shape sh;
  uint64_t salt, limit;
  uint32_t sys[BT * SYS];
  kvt_key sys_keys[SYS];
  uint32_t pool[NPOOL][BT * MAXB];
  uint64_t race_seed;
  atomic_int done;
  pthread_barrier_t start;
} shared;

typedef struct worker {
  pthread_t th;
  int id, n_agents;
  shared *sh;
  uint64_t rng;
  tu_kv want, got;
  uint8_t *gk, *gv;
  kvt_key *keys; /* every block key this worker appended */
  size_t n_keys, cap_keys;
  kvt_seq *kept; /* its last agent, alive at the end */
  uint32_t kept_tok[BT * MAXB], kept_nb, prev_tok[BT * MAXB];
} worker;

static uint32_t wrand(worker *w, uint32_t n) {
  return (uint32_t)(tu_rand_r(&w->rng) % n);
}

/* Compare the layer-l slice of block b in k/v with what was put. */
static int same_block(worker *w, const uint32_t *tok, uint32_t b, uint32_t l, const uint8_t *k,
                      const uint8_t *v) {
  tu_kv_fill(&w->want, &w->sh->sh, w->sh->salt, l, b, tok + BT * b);
  return !memcmp(k, w->want.k, w->want.bytes) && !memcmp(v, w->want.v, w->want.bytes);
}

static int append_put(worker *w, kvt_seq *s, const uint32_t *tok, uint32_t b) {
  const kvt_shape *sh = &w->sh->sh;
  kvt_append_info info;
  CHECK(w, kvt_seq_append(s, tok + BT * b, BT, &info) == 0);
  CHECK(w, info.block == b);
  CHECK(w, w->n_keys < w->cap_keys);
  w->keys[w->n_keys++] = info.key;
  int reput = info.layers_present == sh->n_layers && wrand(w, 4) == 0;
  if (info.layers_present == sh->n_layers && !reput) return 0;
  for (uint32_t l = 0; l < sh->n_layers; l++) {
    tu_kv_fill(&w->want, sh, w->sh->salt, l, b, tok + BT * b);
    CHECK(w, kvt_seq_put(s, b, l, &w->want.kv) == 0);
  }
  return 0;
}

static int check_gather(worker *w, kvt_seq *s, const uint32_t *tok, uint32_t nb) {
  const kvt_shape *sh = &w->sh->sh;
  kvt_gathered g[MAXB];
  for (uint32_t l = 0; l < sh->n_layers; l++) {
    size_t bytes = MAXB * w->want.bytes, n = 0;
    CHECK(w, kvt_seq_gather(s, l, w->gk, w->gv, &bytes, g, MAXB, &n) == 0);
    CHECK(w, n == nb && bytes == nb * w->want.bytes);
    for (uint32_t b = 0; b < nb; b++) {
      CHECK(w, g[b].block == b && g[b].token_pos == b * BT && g[b].exact == 1);
      CHECK(w, same_block(w, tok, b, l, w->gk + b * w->want.bytes, w->gv + b * w->want.bytes));
    }
  }
  uint32_t b = wrand(w, nb), l = wrand(w, sh->n_layers);
  CHECK(w, kvt_seq_read(s, b, l, w->got.k, w->got.v, w->got.bytes) == 0);
  CHECK(w, same_block(w, tok, b, l, w->got.k, w->got.v));
  return 0;
}

/* Tokens: the system prompt, then private, pooled or repeated blocks. */
static uint32_t agent_tokens(worker *w, uint32_t *tok) {
  uint32_t nb = SYS + 1 + wrand(w, MAXB - SYS), kind = wrand(w, 3);
  memcpy(tok, w->sh->sys, sizeof w->sh->sys);
  for (uint32_t i = BT * SYS; i < BT * MAXB; i++) {
    if (kind == 0) tok[i] = (uint32_t)tu_rand_r(&w->rng);
    else if (kind == 1) tok[i] = w->sh->pool[w->id % NPOOL][i];
    else tok[i] = w->prev_tok[i];
  }
  memcpy(w->prev_tok, tok, sizeof w->prev_tok);
  return nb;
}

static int agent(worker *w, int last) {
  shared *S = w->sh;
  uint32_t tok[BT * MAXB], nb = agent_tokens(w, tok);
  kvt_seq *s = NULL;
  size_t found;
  CHECK(w, kvt_seq_create(S->e, S->ns, &s) == 0);
  for (uint32_t b = 0; b < nb; b++)
    if (append_put(w, s, tok, b)) return -1;
  if (check_gather(w, s, tok, nb)) return -1;
  CHECK(w, kvt_lookup(S->e, S->ns, tok, BT * nb, NULL, 0, &found) == 0);
  CHECK(w, found == nb);
  if (!last) {
    kvt_seq_release(s);
    return 0;
  }
  w->kept = s;
  memcpy(w->kept_tok, tok, sizeof tok);
  w->kept_nb = nb;
  return 0;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  pthread_barrier_wait(&w->sh->start);
  for (int i = 0; i < w->n_agents && !atomic_load(&g_failed); i++)
    if (agent(w, i == w->n_agents - 1)) break;
  return NULL;
}

/* Load every layer of the system prompt's first block and compare. */
static int observe_load(worker *w, size_t found) {
  const kvt_shape *sh = &w->sh->sh;
  kvt_load_req req[8];
  kvt_load *ld;
  size_t ok;
  if (found == 0) return 0;
  CHECK(w, sh->n_layers <= 8);
  for (uint32_t l = 0; l < sh->n_layers; l++)
    req[l] = (kvt_load_req){.key = w->sh->sys_keys[0], .layer = l, .bytes_each = w->want.bytes,
                            .k_out = w->gk + 2 * l * w->want.bytes,
                            .v_out = w->gk + (2 * l + 1) * w->want.bytes};
  CHECK(w, kvt_load_submit(w->sh->e, w->sh->ns, req, sh->n_layers, &ld) == 0);
  CHECK(w, kvt_load_wait(ld, &ok) == 0 && ok == sh->n_layers);
  for (uint32_t l = 0; l < sh->n_layers; l++)
    CHECK(w, same_block(w, w->sh->sys, 0, l, req[l].k_out, req[l].v_out));
  return 0;
}

/* Stats, lookups, keys and loads while the workers run. */
static void *observer_main(void *arg) {
  worker *w = arg;
  shared *S = w->sh;
  size_t prev = 0;
  pthread_barrier_wait(&S->start);
  while (!atomic_load(&S->done) && !atomic_load(&g_failed)) {
    kvt_stats st;
    kvt_key keys[SYS];
    size_t found, nk;
    if (kvt_stats_get(S->e, &st) != 0) return (void *)(intptr_t)failed_at(__LINE__, "stats", w->id);
    if (st.tier_bytes[KVT_TIER_HOT] > S->limit || st.dedup_mismatches != 0 ||
        st.seqs > NT || st.evictions[KVT_TIER_HOT] != 0)
      return (void *)(intptr_t)failed_at(__LINE__, "stats out of bounds", w->id);
    if (kvt_lookup(S->e, S->ns, S->sys, BT * SYS, NULL, 0, &found) != 0 || found < prev ||
        found > SYS)
      return (void *)(intptr_t)failed_at(__LINE__, "system prompt lookup", w->id);
    prev = found;
    if (kvt_keys(S->e, S->ns, S->sys, BT * SYS, keys, SYS, &nk) != 0 || nk != SYS ||
        memcmp(keys, S->sys_keys, sizeof keys) != 0)
      return (void *)(intptr_t)failed_at(__LINE__, "keys", w->id);
    if (observe_load(w, found)) break;
  }
  return NULL;
}

static void worker_init(worker *w, shared *S, int id, int n_agents) {
  memset(w, 0, sizeof *w);
  w->id = id;
  w->sh = S;
  w->n_agents = n_agents;
  w->rng = tu_rand();
  tu_kv_alloc(&w->want, &S->sh);
  tu_kv_alloc(&w->got, &S->sh);
  w->gk = malloc(2 * MAXB * w->want.bytes);
  w->gv = malloc(MAXB * w->want.bytes);
  w->cap_keys = (size_t)n_agents * MAXB;
  w->keys = malloc(w->cap_keys * sizeof *w->keys);
  assert_true(w->gk && w->gv && w->keys);
  for (uint32_t i = 0; i < BT * MAXB; i++) w->prev_tok[i] = (uint32_t)tu_rand();
}

static void worker_free(worker *w) {
  tu_kv_free(&w->want);
  tu_kv_free(&w->got);
  free(w->gk);
  free(w->gv);
  free(w->keys);
}

static int key_cmp(const void *a, const void *b) {
  return memcmp(a, b, sizeof(kvt_key));
}

/* Distinct keys over all workers. */
static uint64_t distinct_keys(worker *w, int n) {
  size_t total = 0, k = 0;
  for (int i = 0; i < n; i++) total += w[i].n_keys;
  kvt_key *all = malloc((total + 1) * sizeof *all);
  assert_non_null(all);
  for (int i = 0; i < n; i++) {
    memcpy(all + k, w[i].keys, w[i].n_keys * sizeof *all);
    k += w[i].n_keys;
  }
  qsort(all, total, sizeof *all, key_cmp);
  uint64_t d = total > 0;
  for (size_t i = 1; i < total; i++) d += key_cmp(&all[i - 1], &all[i]) != 0;
  free(all);
  return d;
}

static void shared_open(shared *S, char **dir) {
  kvt_options o;
  size_t nk;
  memset(S, 0, sizeof *S);
  *dir = tu_tmpdir();
  tu_opts(&o);
  o.flags = KVT_OPEN_VERIFY_DEDUP;
  S->limit = o.tier_bytes_limit[KVT_TIER_HOT];
  S->e = tu_open(*dir, &o);
  S->sh = tu_shape_small(KVT_F16);
  S->ns = tu_register(S->e, "threads-model", &S->sh);
  S->salt = tu_salt("threads-model");
  for (size_t i = 0; i < BT * SYS; i++) S->sys[i] = (uint32_t)tu_rand();
  for (int p = 0; p < NPOOL; p++)
    for (size_t i = 0; i < BT * MAXB; i++) S->pool[p][i] = (uint32_t)tu_rand();
  S->race_seed = tu_rand();
  assert_int_equal(kvt_keys(S->e, S->ns, S->sys, BT * SYS, S->sys_keys, SYS, &nk), 0);
  assert_int_equal(pthread_barrier_init(&S->start, NULL, NT + 1), 0);
}

static void run_threads(shared *S, worker *w, worker *obs) {
  for (int i = 0; i < NT; i++)
    assert_int_equal(pthread_create(&w[i].th, NULL, worker_main, &w[i]), 0);
  assert_int_equal(pthread_create(&obs->th, NULL, observer_main, obs), 0);
  for (int i = 0; i < NT; i++) pthread_join(w[i].th, NULL);
  atomic_store(&S->done, 1);
  pthread_join(obs->th, NULL);
  if (atomic_load(&g_failed)) fprintf(stderr, "%s\n", g_msg);
  assert_false(atomic_load(&g_failed));
}

static void test_agents(void **state) {
  (void)state;
  shared *S = malloc(sizeof *S);
  worker w[NT], obs;
  char *dir;
  kvt_stats st;
  int n_agents = tu_stress() ? 3000 : 300;
  uint64_t held = 0;
  alarm(300); /* a deadlock fails here rather than at the ctest timeout */
  shared_open(S, &dir);
  for (int i = 0; i < NT; i++) worker_init(&w[i], S, i, n_agents);
  worker_init(&obs, S, NT, 1);
  run_threads(S, w, &obs);
  tu_stats(S->e, &st);
  for (int i = 0; i < NT; i++) held += w[i].kept_nb;
  assert_int_equal(st.seqs, NT);
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT], distinct_keys(w, NT) * S->sh.n_layers);
  assert_int_equal(st.logical_bytes, held * S->sh.n_layers * 2 * w[0].want.bytes);
  assert_int_equal(st.dedup_mismatches, 0);
  assert_int_equal(st.evictions[KVT_TIER_HOT], 0);
  for (int i = 0; i < NT; i++) {
    tu_assert_gather(w[i].kept, &S->sh, S->salt, w[i].kept_tok, w[i].kept_nb);
    kvt_seq_release(w[i].kept);
    worker_free(&w[i]);
  }
  worker_free(&obs);
  tu_stats(S->e, &st);
  assert_int_equal(st.seqs, 0);
  assert_int_equal(st.logical_bytes, 0);
  pthread_barrier_destroy(&S->start);
  kvt_engine_close(S->e);
  tu_rmtree(dir);
  free(S);
  alarm(0);
}

/* Every worker races to put the very same new blocks at the same moment:
 * one copy each survives, and every thread reads the right bytes. */
static int race_round(worker *w, const uint32_t *tok) {
  shared *S = w->sh;
  kvt_seq *s;
  CHECK(w, kvt_seq_create(S->e, S->ns, &s) == 0);
  for (uint32_t b = 0; b < MAXB; b++) {
    kvt_append_info info;
    CHECK(w, kvt_seq_append(s, tok + BT * b, BT, &info) == 0);
    CHECK(w, w->n_keys < w->cap_keys);
    w->keys[w->n_keys++] = info.key;
    for (uint32_t l = 0; l < S->sh.n_layers; l++) {
      tu_kv_fill(&w->want, &S->sh, S->salt, l, b, tok + BT * b);
      CHECK(w, kvt_seq_put(s, b, l, &w->want.kv) == 0);
    }
  }
  int rc = check_gather(w, s, tok, MAXB);
  kvt_seq_release(s);
  return rc;
}

/* Every round starts at a barrier on new tokens that all threads derive
 * alike; a failed thread keeps meeting the barrier. */
static void *racer_main(void *arg) {
  worker *w = arg;
  uint32_t tok[BT * MAXB];
  for (int r = 0; r < w->n_agents; r++) {
    for (uint32_t i = 0; i < BT * MAXB; i++)
      tok[i] = (uint32_t)tu_mix(w->sh->race_seed + (uint64_t)r * BT * MAXB + i);
    pthread_barrier_wait(&w->sh->start);
    if (!atomic_load(&g_failed)) race_round(w, tok);
  }
  return NULL;
}

static void test_racing_puts(void **state) {
  (void)state;
  shared *S = malloc(sizeof *S);
  worker w[NT];
  char *dir;
  kvt_stats st;
  int rounds = tu_stress() ? 2000 : 100;
  alarm(300);
  shared_open(S, &dir);
  pthread_barrier_destroy(&S->start);
  assert_int_equal(pthread_barrier_init(&S->start, NULL, NT), 0);
  for (int i = 0; i < NT; i++) {
    worker_init(&w[i], S, i, rounds);
    assert_int_equal(pthread_create(&w[i].th, NULL, racer_main, &w[i]), 0);
  }
  for (int i = 0; i < NT; i++) pthread_join(w[i].th, NULL);
  if (atomic_load(&g_failed)) fprintf(stderr, "%s\n", g_msg);
  assert_false(atomic_load(&g_failed));
  tu_stats(S->e, &st);
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT], distinct_keys(w, NT) * S->sh.n_layers);
  assert_int_equal(st.puts, (uint64_t)NT * rounds * MAXB * S->sh.n_layers);
  assert_int_equal(st.dedup_mismatches, 0);
  assert_int_equal(st.seqs, 0);
  for (int i = 0; i < NT; i++) worker_free(&w[i]);
  pthread_barrier_destroy(&S->start);
  kvt_engine_close(S->e);
  tu_rmtree(dir);
  free(S);
  alarm(0);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_agents),
      cmocka_unit_test(test_racing_puts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
