/* reuse_model.c - online logistic model of token-block reuse (reuse_model.h).
 *
 * A sample is one access of a block, described by bucketed features: how
 * often the block was accessed, the gap between its last two accesses
 * (in accesses, and relative to the horizon), the same gap of its chain's
 * parent (how fast the conversation or agent that owns the chain comes
 * back), its depth in the chain, its namespace, and three crosses. Each
 * (feature, bucket) pair hashes to one slot of a fixed weight table; the
 * prediction is the logistic of the sum of the active slots, and a label
 * moves each active slot by one SGD step. Buckets are logarithmic, so
 * nothing here depends on the scale of one workload.
 *
 * Labels come only from the past: a block's sample is labelled at its
 * next access (positive when that came within the horizon) or, once the
 * horizon has passed, when the owner lets the block go, when its history
 * slot is reused, or when a sweep over the history table finds it. */
#include <errno.h>
#include <math.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "tiers/cold_record.h"
#include "tiers/reuse_model.h"

#define LEARN_RATE 0.05f
#define WEIGHT_MAX 8.0f   /* keeps one slot from saturating the logistic */
#define SWEEP_PER_ACCESS 2 /* history slots checked for expired samples per access */
#define STATE_MAGIC "KVTRUSE1"
#define STATE_VERSION 1u

typedef struct hist_ent {
  kvt_key key;
  kvt_reuse_blk b;
  uint8_t used;
} hist_ent;

struct kvt_reuse {
  kvt_mem *m;
  int cat;
  uint64_t now, horizon, trained;
  float w[KVT_REUSE_WEIGHTS];
  hist_ent *hist;
  uint32_t n_hist;   /* power of two */
  uint32_t hand;     /* sweep position */
};

static uint32_t ilog2(uint64_t x) { return x ? 63u - (uint32_t)__builtin_clzll(x) : 0; }

static uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }

static uint64_t key_hash(const kvt_key *k) {
  uint64_t h;
  memcpy(&h, k->b, 8);
  return h;
}

int kvt_reuse_create(kvt_mem *m, int cat, uint32_t history_slots, kvt_reuse **out) {
  *out = NULL;
  uint32_t n = 1024;
  while (n < history_slots && n < (1u << 24)) n *= 2;
  kvt_reuse *r = kvt_mem_calloc(m, cat, sizeof *r);
  if (!r) return -ENOMEM;
  r->hist = kvt_mem_calloc(m, cat, (size_t)n * sizeof *r->hist);
  if (!r->hist) {
    kvt_mem_free(m, cat, r, sizeof *r);
    return -ENOMEM;
  }
  r->m = m;
  r->cat = cat;
  r->n_hist = n;
  r->horizon = 1024;
  *out = r;
  return 0;
}

void kvt_reuse_free(kvt_reuse *r) {
  if (!r) return;
  kvt_mem_free(r->m, r->cat, r->hist, (size_t)r->n_hist * sizeof *r->hist);
  kvt_mem_free(r->m, r->cat, r, sizeof *r);
}

void kvt_reuse_set_horizon(kvt_reuse *r, uint64_t h) { r->horizon = h ? h : 1; }
uint64_t kvt_reuse_horizon(const kvt_reuse *r) { return r->horizon; }
uint64_t kvt_reuse_now(const kvt_reuse *r) { return r->now; }
uint64_t kvt_reuse_trained(const kvt_reuse *r) { return r->trained; }

void kvt_reuse_blk_init(kvt_reuse_blk *b, uint32_t depth, uint32_t ns) {
  memset(b, 0, sizeof *b);
  b->depth = depth;
  b->ns = ns;
  b->p = 0.5f;
}

/* ---------- features ---------- */

static uint16_t slot(uint32_t feature, uint32_t bucket) {
  uint32_t x = feature * 0x9E3779B1u ^ (bucket + 0x7F4A7C15u) * 0x85EBCA77u;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 13;
  return (uint16_t)(x & (KVT_REUSE_WEIGHTS - 1));
}

static uint32_t hits_bucket(uint32_t hits) { return hits <= 3 ? hits : min_u32(3 + ilog2(hits / 4) + 1, 10); }

/* A gap in accesses: 0 none, else its binary order of magnitude. */
static uint32_t gap_bucket(uint64_t gap) { return gap ? 1 + min_u32(ilog2(gap), 40) : 0; }

/* A gap relative to the horizon: 0 none, 1 under 1/16 of it, ... */
static uint32_t rel_bucket(uint64_t gap, uint64_t horizon) {
  return gap ? 1 + min_u32(ilog2(1 + 16 * gap / horizon), 9) : 0;
}

static void features(const kvt_reuse *r, const kvt_reuse_blk *b, uint32_t chain_gap,
                     uint16_t f[KVT_REUSE_NFEAT]) {
  uint32_t hb = hits_bucket(b->hits), gr = rel_bucket(b->gap, r->horizon);
  uint32_t cr = rel_bucket(chain_gap, r->horizon), db = min_u32(ilog2((uint64_t)b->depth + 1), 15);
  f[0] = slot(0, 0); /* bias */
  f[1] = slot(1, hb);
  f[2] = slot(2, gap_bucket(b->gap));
  f[3] = slot(3, gr);
  f[4] = slot(4, gap_bucket(chain_gap));
  f[5] = slot(5, cr);
  f[6] = slot(6, db);
  f[7] = slot(7, b->ns & 0xffff);
  f[8] = slot(8, hb << 8 | gr);
  f[9] = slot(9, gr << 8 | cr);
}

static float predict(const kvt_reuse *r, const uint16_t f[KVT_REUSE_NFEAT]) {
  float z = 0;
  for (int i = 0; i < KVT_REUSE_NFEAT; i++) z += r->w[f[i]];
  return 1.0f / (1.0f + expf(-z));
}

static void train(kvt_reuse *r, const uint16_t f[KVT_REUSE_NFEAT], int label) {
  float g = LEARN_RATE * ((float)label - predict(r, f));
  for (int i = 0; i < KVT_REUSE_NFEAT; i++) {
    float w = r->w[f[i]] + g;
    r->w[f[i]] = w > WEIGHT_MAX ? WEIGHT_MAX : w < -WEIGHT_MAX ? -WEIGHT_MAX : w;
  }
  r->trained++;
}

void kvt_reuse_expire(kvt_reuse *r, kvt_reuse_blk *b) {
  if (b->pending && r->now - b->last > r->horizon) {
    train(r, b->feat, 0);
    b->pending = 0;
  }
}

/* A few history slots a time: samples of blocks nobody asked for again. */
static void sweep(kvt_reuse *r) {
  for (int i = 0; i < SWEEP_PER_ACCESS; i++) {
    hist_ent *h = &r->hist[r->hand++ & (r->n_hist - 1)];
    if (h->used) kvt_reuse_expire(r, &h->b);
  }
}

float kvt_reuse_access(kvt_reuse *r, kvt_reuse_blk *b, uint32_t chain_gap) {
  uint64_t gap = b->hits ? r->now - b->last : 0;
  if (b->pending) train(r, b->feat, gap <= r->horizon);
  b->gap = gap > UINT32_MAX ? UINT32_MAX : (uint32_t)gap;
  if (b->hits < UINT32_MAX) b->hits++;
  b->last = r->now;
  features(r, b, chain_gap, b->feat);
  b->p = predict(r, b->feat);
  b->pending = 1;
  r->now++;
  sweep(r);
  return b->p;
}

/* ---------- history of blocks not held ---------- */

static hist_ent *hist_slot(const kvt_reuse *r, const kvt_key *key) {
  return &r->hist[key_hash(key) & (r->n_hist - 1)];
}

void kvt_reuse_forget(kvt_reuse *r, const kvt_key *key, const kvt_reuse_blk *b) {
  hist_ent *h = hist_slot(r, key);
  if (h->used && memcmp(h->key.b, key->b, 16)) kvt_reuse_expire(r, &h->b); /* label, then drop */
  h->key = *key;
  h->b = *b;
  h->used = 1;
  kvt_reuse_expire(r, &h->b);
}

int kvt_reuse_recall(kvt_reuse *r, const kvt_key *key, kvt_reuse_blk *b) {
  hist_ent *h = hist_slot(r, key);
  if (!h->used || memcmp(h->key.b, key->b, 16)) return 0;
  *b = h->b;
  h->used = 0;
  return 1;
}

const kvt_reuse_blk *kvt_reuse_peek(const kvt_reuse *r, const kvt_key *key) {
  const hist_ent *h = hist_slot(r, key);
  return h->used && !memcmp(h->key.b, key->b, 16) ? &h->b : NULL;
}

/* ---------- persistent state ---------- */

/* Layout: magic[8], version u32, weights u32, clock u64, XXH3 of the
 * weights u64, then the weights as IEEE-754 binary32, little-endian. */
void kvt_reuse_save(const kvt_reuse *r, uint8_t out[KVT_REUSE_STATE_BYTES]) {
  memcpy(out, STATE_MAGIC, 8);
  kvt_le_put32(out + 8, STATE_VERSION);
  kvt_le_put32(out + 12, KVT_REUSE_WEIGHTS);
  kvt_le_put64(out + 16, r->now);
  for (int i = 0; i < KVT_REUSE_WEIGHTS; i++) {
    uint32_t u;
    memcpy(&u, &r->w[i], 4);
    kvt_le_put32(out + 32 + 4 * i, u);
  }
  kvt_le_put64(out + 24, XXH3_64bits(out + 32, 4 * KVT_REUSE_WEIGHTS));
}

int kvt_reuse_load(kvt_reuse *r, const uint8_t *in, size_t len) {
  if (len < 16 || memcmp(in, STATE_MAGIC, 8)) return KVT_ECORRUPT;
  if (kvt_le_get32(in + 8) != STATE_VERSION) return KVT_EVERSION;
  if (len != KVT_REUSE_STATE_BYTES || kvt_le_get32(in + 12) != KVT_REUSE_WEIGHTS ||
      kvt_le_get64(in + 24) != XXH3_64bits(in + 32, 4 * KVT_REUSE_WEIGHTS))
    return KVT_ECORRUPT;
  float w[KVT_REUSE_WEIGHTS];
  for (int i = 0; i < KVT_REUSE_WEIGHTS; i++) {
    uint32_t u = kvt_le_get32(in + 32 + 4 * i);
    memcpy(&w[i], &u, 4);
    if (!isfinite(w[i]) || fabsf(w[i]) > WEIGHT_MAX) return KVT_ECORRUPT;
  }
  memcpy(r->w, w, sizeof w);
  r->now = kvt_le_get64(in + 16);
  return 0;
}
