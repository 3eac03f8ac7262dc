/* reuse_model.c - online model of token-block reuse (reuse_model.h).
 *
 * Blocks fall into classes by how often they were accessed. Per class
 * the model counts accesses and, for each access whose block was accessed
 * again, the distance (in accesses to the tier) to that next access, in
 * logarithmic buckets. That is an estimate of the distribution of the
 * time to a block's next use, learned from what the tier saw, in the
 * order it saw it: a distance is counted when the second access happens,
 * never before. Buckets are logarithmic, so nothing here depends on the
 * scale of one workload.
 *
 * The rank of a block is its hit density, as in Least Hit Density
 * (Beckmann et al., NSDI 2018) with the horizon of Learning Relaxed
 * Belady (Song et al., NSDI 2020): given that a block of class c has not
 * been used for a accesses, the chance it is used within the next M (the
 * horizon: how long the tier keeps a block, measured by the owner),
 * divided by the space-time it would hold until that use or until M has
 * passed. Keeping the blocks of highest density maximizes the hits a
 * tier of fixed size gets per unit of its space; a new block worth less
 * than the block it would displace is better not written. The densities
 * are tabulated per class and age bucket, refreshed every few thousand
 * accesses, each with its standard error (from the number of reuses it
 * rests on) so the owner can tell a real difference from noise. */
#include <errno.h>
#include <math.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "tiers/cold_record.h"
#include "tiers/reuse_model.h"

#define C KVT_REUSE_CLASSES
#define B KVT_REUSE_BUCKETS
#define PRIOR 16.0   /* pseudo-accesses of the all-class distribution in each class */
#define REFRESH 2048 /* accesses between two refreshes of the density table */
#define DECAY_AT (1u << 20) /* counts halve past this many accesses: a drifting workload */
#define STATE_MAGIC "KVTRUSE1"
#define STATE_VERSION 3u /* 1: the logistic model's weights; 2: six classes */

typedef struct hist_ent {
  kvt_key key;
  kvt_reuse_blk b;
  uint8_t used;
} hist_ent;

struct kvt_reuse {
  kvt_mem *m;
  int cat;
  uint64_t now, horizon, trained, refreshed;
  float n[C];       /* accesses counted per class */
  float d[C][B];    /* of them, next access at a distance in the bucket */
  float dens[C][B]; /* hit density per class and age bucket (refresh) */
  float rse[C][B];  /* its relative standard error (1 / sqrt(1 + reuses it rests on)) */
  hist_ent *hist;
  uint32_t n_hist;  /* power of two */
};

static uint32_t ilog2(uint64_t x) { return x ? 63u - (uint32_t)__builtin_clzll(x) : 0; }

static uint64_t key_hash(const kvt_key *k) {
  uint64_t h;
  memcpy(&h, k->b, 8);
  return h;
}

/* Bucket of a distance or age: two an octave ([1,1.5) [1.5,2) [2,3) ...). */
static uint32_t bucket(uint64_t x) {
  if (x < 2) return 0;
  uint32_t o = ilog2(x), b = 2 * o + (uint32_t)((x >> (o - 1)) & 1);
  return b < B ? b : B - 1;
}

static double bucket_lo(uint32_t b) { return ldexp(1.0 + 0.5 * (b & 1), (int)(b / 2)); }

static uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }

int kvt_reuse_new_content(const kvt_reuse_blk *b) { return b->hits == 1 && b->fresh; }

/* The class: accesses seen (1, 2, 3, 4, 5-8, more). Measured on the
 * Mooncake conversation trace, where the share of accesses followed by
 * another grows from 24% for a block's first to 91% past its sixth. Also
 * tried there as classes, and dropped because they did not raise the hit
 * rate: the block's depth in its chain, the gap between its last two
 * accesses, the turn of its conversation.
 * A block's first access is split in two by its chain parent's accesses
 * when it was written: a parent accessed once means the prefix is new
 * content (a conversation's new turn past its first new block, or a new
 * conversation), and on the conversation trace those come back later and
 * more rarely than the first block written after a prefix that was hit.
 * This split raised the hit rate on both halves of that trace, replayed
 * apart, at 1M and 3M tokens (docs/learned-order-log.md). */
static uint8_t class_of(const kvt_reuse_blk *b) {
  if (kvt_reuse_new_content(b)) return C - 1;
  uint32_t h = b->hits <= 4 ? b->hits - 1 : b->hits <= 8 ? 4 : 5; /* hits >= 1 here */
  return (uint8_t)min_u32(h, C - 2);
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

void kvt_reuse_blk_init(kvt_reuse_blk *b, uint32_t depth, uint32_t ns, const kvt_reuse_blk *parent) {
  memset(b, 0, sizeof *b);
  b->depth = depth;
  b->ns = ns;
  b->fresh = parent && parent->hits <= 1 && !parent->stored;
}

/* ---------- densities ---------- */

/* Density at age a of a class with n accesses and distance counts d[],
 * horizon h: expected hits in (a, a+h] over expected space-time held
 * (until the hit, or h). Distances spread evenly within a bucket.
 * *support: the reuses it rests on. */
static double density(const float *d, double n, double a, double h, double *support) {
  double gone = 0, hits = 0, life = 0;
  for (uint32_t b = 0; b < B; b++) {
    double lo = bucket_lo(b), hi = b + 1 < B ? bucket_lo(b + 1) : 2 * lo, w = hi - lo;
    if (!(d[b] > 0)) continue;
    if (a > lo) gone += d[b] * fmin(1.0, (a - lo) / w);
    double ol = fmax(lo, a), oh = fmin(hi, a + h);
    if (oh <= ol) continue;
    double f = d[b] * (oh - ol) / w;
    hits += f;
    life += f * (0.5 * (ol + oh) - a);
  }
  double surv = n - gone;
  if (surv < hits) surv = hits;
  life += (surv - hits) * h;
  *support = hits;
  return life > 0 ? hits / life : 0;
}

/* Recompute the table: each class's counts, shrunk towards all classes'
 * (a class with few samples ranks as the average block). */
static void refresh(kvt_reuse *r) {
  double all_n = 0, all_d[B] = {0};
  for (int c = 0; c < C; c++) {
    all_n += r->n[c];
    for (int b = 0; b < B; b++) all_d[b] += r->d[c][b];
  }
  for (int c = 0; c < C; c++) {
    float dc[B];
    double nc = r->n[c] + (all_n > 0 ? PRIOR : 0);
    for (int b = 0; b < B; b++) dc[b] = (float)(r->d[c][b] + (all_n > 0 ? PRIOR * all_d[b] / all_n : 0));
    for (uint32_t a = 0; a < B; a++) {
      double sup;
      r->dens[c][a] = (float)density(dc, nc, a ? bucket_lo(a) : 0, (double)r->horizon, &sup);
      r->rse[c][a] = (float)(1.0 / sqrt(sup + 1.0));
    }
  }
  r->refreshed = r->now;
}

static void decay(kvt_reuse *r) {
  double all = 0;
  for (int c = 0; c < C; c++) all += r->n[c];
  if (all < DECAY_AT) return;
  for (int c = 0; c < C; c++) {
    r->n[c] *= 0.5f;
    for (int b = 0; b < B; b++) r->d[c][b] *= 0.5f;
  }
}

void kvt_reuse_access(kvt_reuse *r, kvt_reuse_blk *b) {
  if (b->hits) {
    r->d[b->cls][bucket(r->now - b->last)] += 1;
    r->trained++;
  }
  if (b->hits < UINT32_MAX) b->hits++;
  b->last = r->now;
  b->cls = class_of(b);
  r->n[b->cls] += 1;
  r->now++;
  if (r->now - r->refreshed >= REFRESH) {
    decay(r);
    refresh(r);
  }
}

double kvt_reuse_density(const kvt_reuse *r, const kvt_reuse_blk *b, double *se) {
  uint32_t c = b->cls < C ? b->cls : 0, a = bucket(r->now - b->last);
  if (se) *se = (double)r->dens[c][a] * r->rse[c][a];
  return r->dens[c][a];
}

/* ---------- history of blocks not held ---------- */

static hist_ent *hist_slot(const kvt_reuse *r, const kvt_key *key) {
  return &r->hist[key_hash(key) & (r->n_hist - 1)];
}

void kvt_reuse_forget(kvt_reuse *r, const kvt_key *key, const kvt_reuse_blk *b) {
  hist_ent *h = hist_slot(r, key);
  h->key = *key;
  h->b = *b;
  h->used = 1;
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

/* Layout: magic[8], version u32, classes << 16 | buckets u32, clock u64,
 * XXH3 of what follows u64; then per class its access count and its
 * distance counts, IEEE-754 binary32, little-endian. */
static void put_f32(uint8_t *p, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  kvt_le_put32(p, u);
}

static float get_f32(const uint8_t *p) {
  uint32_t u = kvt_le_get32(p);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#define SHAPE ((uint32_t)C << 16 | (uint32_t)B)
#define BODY (4 * C * (B + 1))

void kvt_reuse_save(const kvt_reuse *r, uint8_t out[KVT_REUSE_STATE_BYTES]) {
  memcpy(out, STATE_MAGIC, 8);
  kvt_le_put32(out + 8, STATE_VERSION);
  kvt_le_put32(out + 12, SHAPE);
  kvt_le_put64(out + 16, r->now);
  uint8_t *p = out + 32;
  for (int c = 0; c < C; c++) {
    put_f32(p, r->n[c]);
    p += 4;
    for (int b = 0; b < B; b++, p += 4) put_f32(p, r->d[c][b]);
  }
  kvt_le_put64(out + 24, XXH3_64bits(out + 32, BODY));
}

/* A saved state, checked whole (header, checksum, every count) into n
 * and d: 0, KVT_EVERSION, KVT_ECORRUPT. */
static int state_parse(const uint8_t *in, size_t len, float n[C], float d[C][B]) {
  if (len < 16 || memcmp(in, STATE_MAGIC, 8)) return KVT_ECORRUPT;
  if (kvt_le_get32(in + 8) != STATE_VERSION) return KVT_EVERSION;
  if (len != KVT_REUSE_STATE_BYTES || kvt_le_get32(in + 12) != SHAPE ||
      kvt_le_get64(in + 24) != XXH3_64bits(in + 32, BODY))
    return KVT_ECORRUPT;
  const uint8_t *p = in + 32;
  for (int c = 0; c < C; c++) {
    n[c] = get_f32(p);
    p += 4;
    if (!isfinite(n[c]) || n[c] < 0 || n[c] > 4.0 * DECAY_AT) return KVT_ECORRUPT;
    for (int b = 0; b < B; b++, p += 4) {
      d[c][b] = get_f32(p);
      if (!isfinite(d[c][b]) || d[c][b] < 0 || d[c][b] > 4.0 * DECAY_AT) return KVT_ECORRUPT;
    }
  }
  return 0;
}

int kvt_reuse_state_clock(const uint8_t *in, size_t len, uint64_t *clock) {
  float n[C], d[C][B];
  int rc = state_parse(in, len, n, d);
  if (!rc) *clock = kvt_le_get64(in + 16);
  return rc;
}

int kvt_reuse_load(kvt_reuse *r, const uint8_t *in, size_t len) {
  float n[C], d[C][B]; /* checked whole before anything is replaced */
  int rc = state_parse(in, len, n, d);
  if (rc) return rc;
  memcpy(r->n, n, sizeof n);
  memcpy(r->d, d, sizeof d);
  r->now = kvt_le_get64(in + 16);
  refresh(r);
  return 0;
}
