/* recall_fx.h - the fixtures of the recall tests (test_recall*.c): BLOCKS
 * blocks whose keys put the TARGET block alone on channel CH, written
 * into one sequence, and a decoding step whose query drifts to it; and a
 * decoding loop of DR_STEPS random blocks whose queries drift back to
 * older blocks now and then (test_recall_determ, test_recall_digest). */
#ifndef KVT_RECALL_FX_H
#define KVT_RECALL_FX_H

#include <stdlib.h>
#include <string.h>

#include "cold_util.h"

#define BLOCKS 8u
#define TARGET 1u   /* the evicted block the query drifts to */
#define QH_PER_KV 2u
#define CH 3u       /* the key channel the query looks at */

/* Channel CH of block b's keys: the target hi; the other evicted blocks
 * (0..3, "recent" at budget 0.5) -1; the retained ones 0.5. */
static inline float chan(uint32_t b, float hi) {
  return b == TARGET ? hi : b < BLOCKS / 2 ? -1.0f : 0.5f;
}

static inline void fill(tu_kv *kv, const kvt_shape *sh, uint32_t b, uint32_t l, float hi) {
  float *k = kv->k, *v = kv->v;
  uint32_t H = sh->n_kv_heads, D = sh->head_dim;
  for (uint32_t t = 0; t < sh->block_tokens; t++)
    for (uint32_t h = 0; h < H; h++)
      for (uint32_t d = 0; d < D; d++) {
        size_t i = ((size_t)t * H + h) * D + d;
        k[i] = d == CH ? chan(b, hi) : 0.01f * (float)((b * 5 + t * 3 + h * 7 + d + l) % 7);
        v[i] = 0.1f * (float)(b + 1) + 0.001f * (float)i + (float)l;
      }
}

typedef struct fx {
  char *dir;
  kvt_engine *e;
  kvt_seq *s;
  kvt_shape sh;
  tu_kv kv;
  float hi;
  kvt_key target_key;
  kvt_ns_id ns;
} fx;

/* Append BLOCKS blocks to f->s, every layer filled (channel CH at hi). */
static inline void fx_write_blocks(fx *f, float hi) {
  tu_kv_alloc(&f->kv, &f->sh);
  uint32_t toks[16];
  for (uint32_t b = 0; b < BLOCKS; b++) {
    for (uint32_t t = 0; t < f->sh.block_tokens; t++) toks[t] = b * 100 + t + 1;
    kvt_append_info info;
    assert_int_equal(kvt_seq_append(f->s, toks, f->sh.block_tokens, &info), 0);
    if (b == TARGET) f->target_key = info.key;
    for (uint32_t l = 0; l < f->sh.n_layers; l++) {
      fill(&f->kv, &f->sh, b, l, hi);
      assert_int_equal(kvt_seq_put(f->s, b, l, &f->kv.kv), 0);
    }
  }
}

static inline void fx_close(fx *f) {
  tu_kv_free(&f->kv);
  kvt_seq_release(f->s);
  kvt_engine_close(f->e);
  tu_rmtree(f->dir);
}

/* One decoding step of layer 0: attention of a query on channel CH over
 * the retained blocks, then its observation (which decides recalls). */
static inline size_t step(fx *f) {
  uint32_t H = f->sh.n_kv_heads * QH_PER_KV, D = f->sh.head_dim;
  float q[8 * 16] = {0}, out[8 * 16], lse[8], mass[BLOCKS];
  for (uint32_t h = 0; h < H; h++) q[h * D + CH] = 2.0f;
  size_t n = 0;
  assert_int_equal(kvt_seq_attend(f->s, 0, q, H, 0, out, lse, mass, BLOCKS, &n), 0);
  assert_int_equal(kvt_seq_observe(f->s, 0, mass, n), 0);
  return n;
}

/* ---------------------------------------------------------- drift loop */

#define DR_STEPS 96u

/* xorshift64*: the same keys, values and queries in every run (the
 * drift loop's and test_recall_forks'). */
static inline uint64_t dr_rnd(uint64_t *x) {
  *x ^= *x >> 12;
  *x ^= *x << 25;
  *x ^= *x >> 27;
  return *x * 0x2545f4914f6cdd1dull;
}

static inline float dr_rnd_f(uint64_t *x) {
  return (float)(dr_rnd(x) >> 40) / (float)(1u << 24) - 0.5f;
}

/* FNV-1a, bit for bit. */
static inline void dr_hash(uint64_t *h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) *h = (*h ^ b[i]) * 0x100000001b3ull;
}

typedef struct dr_cfg {
  uint32_t bt, head_dim, qh_per_kv; /* tokens a block; query heads a KV head (2 KV heads) */
  uint32_t protect;                 /* sink blocks, twice as many window blocks, a delay */
  int sync;                         /* kvt_sync after each block's puts */
  int hash_n;                       /* the retained counts go into the hash too */
  uint64_t hot;                     /* the hot tier's byte limit (0: the default) */
} dr_cfg;

typedef struct dr_out {
  uint64_t recalls, useful, unavailable, late, recall_bytes;
  uint64_t hash;                /* FNV-1a over every attention output and lse (and n) */
  uint32_t retained[DR_STEPS];  /* layer 0's retained blocks after each step */
} dr_out;

typedef struct dr_loop {
  kvt_engine *e;
  kvt_seq *s;
  kvt_shape sh;
  float *keys, *v;              /* every block's keys; one block's values */
  size_t each;                  /* floats of one layer block's K */
  uint64_t x;                   /* the random state */
} dr_loop;

/* snapkv at a quarter of the cache with recall on. */
static inline void dr_open(dr_loop *L, const dr_cfg *c, const char *dir) {
  kvt_options opt;
  cu_opts(&opt, KVT_BACKEND_PREAD);
  if (c->hot) opt.tier_bytes_limit[KVT_TIER_HOT] = c->hot;
  L->e = tu_open(dir, &opt);
  L->sh = (kvt_shape){.n_layers = 2, .n_kv_heads = 2, .head_dim = c->head_dim,
                      .dtype = KVT_F32, .block_tokens = c->bt};
  kvt_ns_id ns = tu_register(L->e, "m", &L->sh);
  assert_int_equal(kvt_seq_create(L->e, ns, &L->s), 0);
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(kvt_policy_parse("snapkv", &p.scorer), 0);
  p.budget = 0.25;
  p.recall = 1;
  if (c->protect) { /* sinks, a window and a delay that keep blocks from leaving */
    p.sink_blocks = c->protect;
    p.window_blocks = 2 * c->protect;
    p.delay = c->protect;
  }
  assert_int_equal(kvt_seq_set_policy(L->s, &p), 0);
  L->each = (size_t)c->bt * L->sh.n_kv_heads * L->sh.head_dim;
  L->keys = calloc((size_t)DR_STEPS * L->sh.n_layers * L->each, sizeof(float));
  L->v = calloc(L->each, sizeof(float));
  assert_true(L->keys && L->v && c->bt <= 4);
  L->x = 0x9e3779b97f4a7c15ull;
}

/* Block t appended, every layer put with random keys and values. */
static inline void dr_put(dr_loop *L, uint32_t t) {
  uint32_t bt = L->sh.block_tokens, tok[4];
  for (uint32_t i = 0; i < bt; i++) tok[i] = t * bt + i + 1;
  assert_int_equal(kvt_seq_append(L->s, tok, bt, NULL), 0);
  for (uint32_t l = 0; l < L->sh.n_layers; l++) {
    float *k = L->keys + ((size_t)t * L->sh.n_layers + l) * L->each;
    for (size_t i = 0; i < L->each; i++) {
      k[i] = 2.0f * dr_rnd_f(&L->x);
      L->v[i] = dr_rnd_f(&L->x);
    }
    kvt_kv kv = {.k = k, .v = L->v, .dtype = KVT_F32, .n_tokens = bt,
                 .n_heads = L->sh.n_kv_heads, .head_dim = L->sh.head_dim};
    assert_int_equal(kvt_seq_put(L->s, t, l, &kv), 0);
  }
}

/* Step t's attention in every layer, a query toward the first token of
 * block `back` (none when back is t), then its observation. */
static inline void dr_attend(dr_loop *L, const dr_cfg *c, uint32_t t, uint32_t back, dr_out *o) {
  uint32_t D = L->sh.head_dim, H = L->sh.n_kv_heads * c->qh_per_kv;
  float q[8 * 16], out[8 * 16], lse[8], mass[DR_STEPS];
  assert_true(H <= 8 && D <= 16);
  for (uint32_t l = 0; l < L->sh.n_layers; l++) {
    const float *kb = L->keys + ((size_t)back * L->sh.n_layers + l) * L->each;
    for (uint32_t h = 0; h < H; h++)
      for (uint32_t d = 0; d < D; d++)
        q[h * D + d] = (back == t ? 0 : 4.0f * kb[(h / c->qh_per_kv) * D + d]) + dr_rnd_f(&L->x);
    size_t n = 0;
    assert_int_equal(kvt_seq_attend(L->s, l, q, H, 0, out, lse, mass, DR_STEPS, &n), 0);
    dr_hash(&o->hash, out, (size_t)H * D * sizeof(float));
    dr_hash(&o->hash, lse, H * sizeof(float));
    if (c->hash_n) dr_hash(&o->hash, &n, sizeof n);
    assert_int_equal(kvt_seq_observe(L->s, l, mass, n), 0);
    if (l == 0) o->retained[t] = (uint32_t)n;
  }
}

/* DR_STEPS blocks of c->bt tokens; a query every few steps drifts back to
 * an older block's keys, so recall fires. The hot tier holds everything:
 * evicted blocks stay in RAM, unreferenced, and whether a candidate is
 * recalled depends only on its cold copy. */
static inline void dr_run(const dr_cfg *c, dr_out *o) {
  memset(o, 0, sizeof *o);
  o->hash = 0xcbf29ce484222325ull;
  char *dir = tu_tmpdir();
  dr_loop L;
  dr_open(&L, c, dir);
  for (uint32_t t = 0; t < DR_STEPS; t++) {
    dr_put(&L, t);
    if (c->sync) assert_int_equal(kvt_sync(L.e), 0);
    uint32_t back = t > 8 && t % 3 == 0 ? (uint32_t)(dr_rnd(&L.x) % (t - 4)) : t;
    kvt_seq_set_tokens(L.s, (uint64_t)(t + 1) * c->bt);
    dr_attend(&L, c, t, back, o);
  }
  kvt_stats st;
  tu_stats(L.e, &st);
  o->recalls = st.recalls;
  o->useful = st.recall_useful;
  o->unavailable = st.recall_unavailable;
  o->late = st.recall_late;
  o->recall_bytes = st.recall_bytes;
  free(L.keys);
  free(L.v);
  kvt_seq_release(L.s);
  kvt_engine_close(L.e);
  tu_rmtree(dir);
}

#endif
