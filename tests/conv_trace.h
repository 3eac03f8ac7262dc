/* conv_trace.h - a made-up request trace for the tests of the learned
 * eviction orders (cold tier: test_engine_learned; hot tier:
 * test_hot_order): conversations coming back soon, late or never, a few
 * hot ones, and a third of one-off prompts after a shared system block:
 * blocks reused and blocks never reused, for the model to tell apart.
 * Also the replay of one request as kvtier plan does it (look up, append,
 * put what no tier has), and the shuffle after T of the no-future-leak
 * tests; test_cold_declined and test_metrics put through it too, into
 * the same engine (ct_open_cold). */
#ifndef KVT_CONV_TRACE_H
#define KVT_CONV_TRACE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define CT_MAX_BLK 24 /* token blocks a request, at most */

typedef struct ct_req {
  uint32_t n;
  uint64_t id[CT_MAX_BLK]; /* block ids, 1 the shared system block */
} ct_req;

/* n requests from seed (the same seed, the same trace). */
static inline void ct_make_trace(ct_req *r, size_t n, uint64_t seed) {
  enum { CONVS = 120 };
  static ct_req last[CONVS];
  memset(last, 0, sizeof last);
  uint64_t st = seed, next_id = 1000;
  for (size_t i = 0; i < n; i++) {
    if (tu_rand_r(&st) % 3 == 0) {
      r[i].n = 1 + 4 + (uint32_t)(tu_rand_r(&st) % 8);
      r[i].id[0] = 1;
      for (uint32_t k = 1; k < r[i].n; k++) r[i].id[k] = next_id++;
      continue;
    }
    uint32_t c = (uint32_t)(tu_rand_r(&st) % CONVS);
    if (tu_rand_r(&st) % 4 == 0) c = (uint32_t)(tu_rand_r(&st) % 8);
    ct_req *l = &last[c];
    if (l->n == 0 || l->n + 4 > CT_MAX_BLK) {
      l->n = 1;
      l->id[0] = 1;
    }
    uint32_t add = 1 + (uint32_t)(tu_rand_r(&st) % 4);
    for (uint32_t k = 0; k < add; k++) l->id[l->n++] = next_id++;
    r[i] = *l;
  }
}

/* The tokens of r's blocks, bt a block: the id's halves in the first two. */
static inline void ct_tokens(const ct_req *r, uint32_t bt, uint32_t *tok) {
  memset(tok, 0, (size_t)CT_MAX_BLK * bt * sizeof *tok);
  for (uint32_t i = 0; i < r->n; i++) {
    tok[i * bt] = (uint32_t)r->id[i];
    tok[i * bt + 1] = (uint32_t)(r->id[i] >> 32);
  }
}

/* Token blocks of r's leading run that a lookup finds. */
static inline size_t ct_lookup(kvt_engine *e, kvt_ns_id ns, const ct_req *r, uint32_t bt,
                               const uint32_t *tok) {
  kvt_lookup_entry ent[CT_MAX_BLK];
  size_t found = 0;
  assert_int_equal(kvt_lookup(e, ns, tok, (size_t)r->n * bt, ent, r->n, &found), 0);
  return found;
}

/* A metadata-only engine whose hot tier is smaller than one layer block
 * (every block goes to the cold tier) and whose cold tier holds cap
 * records, given up in order policy (-1: kvt_options_init's); *ns: a
 * namespace model of shape sh. */
static inline kvt_engine *ct_open_cold(const kvt_shape *sh, uint64_t cap, int policy,
                                       const char *model, kvt_ns_id *ns) {
  kvt_options o;
  kvt_options_init(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  if (policy >= 0) o.cold_evict = (uint32_t)policy;
  o.tier_bytes_limit[KVT_TIER_HOT] = 1;
  o.tier_bytes_limit[KVT_TIER_COLD] = cap * kvt_cold_record_bytes(sh);
  kvt_engine *e = tu_open(NULL, &o);
  *ns = tu_register(e, model, sh);
  return e;
}

/* A sequence of ns appends n blocks of tok and puts every layer of those
 * neither durable nor complete already; full_ok: a put may find every
 * tier full (KVT_EFULL), else it must succeed. */
static inline void ct_append_put(kvt_engine *e, kvt_ns_id ns, const kvt_shape *sh,
                                 const uint32_t *tok, uint32_t n, int full_ok) {
  uint32_t bt = sh->block_tokens;
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, ns, &q), 0);
  kvt_kv kv = {.dtype = sh->dtype, .n_tokens = bt, .n_heads = sh->n_kv_heads,
               .head_dim = sh->head_dim};
  for (uint32_t i = 0; i < n; i++) {
    kvt_append_info info;
    assert_int_equal(kvt_seq_append(q, tok + i * bt, bt, &info), 0);
    if (info.durable || info.layers_present == sh->n_layers) continue;
    for (uint32_t l = 0; l < sh->n_layers; l++) {
      int rc = kvt_seq_put(q, i, l, &kv);
      if (!full_ok || rc != KVT_EFULL) assert_int_equal(rc, 0);
    }
  }
  kvt_seq_release(q);
}

/* b: a copy of a[0..n) whose requests after t are shuffled (seed). */
static inline void ct_shuffle_after(const ct_req *a, ct_req *b, size_t n, size_t t,
                                    uint64_t seed) {
  memcpy(b, a, n * sizeof *a);
  uint64_t st = seed;
  for (size_t i = n - 1; i > t; i--) {
    size_t j = t + (size_t)(tu_rand_r(&st) % (i - t + 1));
    ct_req x = b[i];
    b[i] = b[j];
    b[j] = x;
  }
}

/* What a replayed request saw and left: its hit, then what the tier under
 * test held (cold records, hot layer blocks) and its evictions after it. */
typedef struct ct_step {
  uint64_t found, held, evictions;
} ct_step;

typedef void (*ct_replay_fn)(const ct_req *reqs, size_t n, ct_step *log);

/* Every hit, held count and eviction count before T (n / 2) is the same
 * whatever comes after T: a replay of trace 1234 and of a copy shuffled
 * after T (seed 99) through replay; held names what log.held counts. */
static inline void ct_no_future_leak(ct_replay_fn replay, size_t n, const char *held) {
  ct_req *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  ct_step *la = calloc(n, sizeof *la), *lb = calloc(n, sizeof *lb);
  assert_true(a && b && la && lb);
  ct_make_trace(a, n, 1234);
  const size_t t = n / 2;
  ct_shuffle_after(a, b, n, t, 99);
  replay(a, n, la);
  replay(b, n, lb);
  uint64_t hits = 0;
  for (size_t i = 0; i < t; i++) hits += la[i].found;
  fprintf(stderr, "before T: %llu block hits, %llu %s, %llu evictions\n",
          (unsigned long long)hits, (unsigned long long)la[t - 1].held, held,
          (unsigned long long)la[t - 1].evictions);
  /* The tier filled and evicted before T, and requests hit it. */
  assert_true(hits > 200 && la[t - 1].evictions > 200);
  for (size_t i = 0; i < t; i++)
    if (memcmp(&la[i], &lb[i], sizeof la[i]))
      fail_msg("request %zu of %zu before T: found %llu/%llu %s %llu/%llu", i, t,
               (unsigned long long)la[i].found, (unsigned long long)lb[i].found, held,
               (unsigned long long)la[i].held, (unsigned long long)lb[i].held);
  /* The shuffle changed what came after T: the test can see a difference. */
  assert_true(memcmp(la + t, lb + t, (n - t) * sizeof *la) != 0);
  free(a);
  free(b);
  free(la);
  free(lb);
}

#endif
