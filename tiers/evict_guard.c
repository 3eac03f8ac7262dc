/* evict_guard.c - a sampled shadow LRU beside the learned order
 * (evict_guard.h). The idea is set dueling's, as adaptive caches use it:
 * a small cache of a sample of the keys, run by the rule to beat, tells
 * on the live stream how the tier would do under that rule. Sampling by
 * key hash keeps each sampled key's whole history, so the shadow's hit
 * ratio on its sample estimates LRU's at the scaled size.
 *
 * The shadow is a chained hash table over a fixed array of entries, with
 * a doubly linked recency list through the same entries (indices, not
 * pointers: the array is the only allocation besides the bucket heads). */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "tiers/evict_guard.h"

#define NIL UINT32_MAX
#define WINDOW_MIN 2048   /* sampled accesses a trial and a comparison span, at least */
#define WINDOW_PER_SLOT 32 /* ... and per block the shadow holds (a few turnovers) */
#define TRIP_Z 3.0        /* standard deviations by which LRU must lead */
#define TRIP_MIN_HITS 16  /* and at least this many shadow hits first */
#define BACKOFF_MAX 16    /* distrust lasts at most this many windows */

typedef struct g_ent {
  kvt_key key;
  uint32_t hnext, prev, next;
} g_ent;

struct kvt_guard {
  kvt_mem *m;
  int cat;
  g_ent *e;
  uint32_t *heads;
  uint32_t n;                /* entries = buckets, a power of two */
  uint32_t free, lru, mru;   /* free list (by hnext), least and most recent */
  uint32_t count, cap;
  double tier_hits, lru_hits, acc;
  int trusted;
  uint64_t distrust_left, backoff, trial, trips;
};

static uint64_t key_hash(const kvt_key *k) {
  uint64_t h;
  memcpy(&h, k->b, 8);
  return h;
}

int kvt_guard_create(kvt_mem *m, int cat, uint32_t slots, kvt_guard **out) {
  *out = NULL;
  uint32_t n = 256;
  while (n < slots && n < (1u << 24)) n *= 2;
  kvt_guard *g = kvt_mem_calloc(m, cat, sizeof *g);
  if (!g) return -ENOMEM;
  g->e = kvt_mem_calloc(m, cat, (size_t)n * sizeof *g->e);
  g->heads = kvt_mem_alloc(m, cat, (size_t)n * sizeof *g->heads);
  if (!g->e || !g->heads) {
    kvt_mem_free(m, cat, g->e, (size_t)n * sizeof *g->e);
    kvt_mem_free(m, cat, g->heads, (size_t)n * sizeof *g->heads);
    kvt_mem_free(m, cat, g, sizeof *g);
    return -ENOMEM;
  }
  g->m = m;
  g->cat = cat;
  g->n = n;
  for (uint32_t i = 0; i < n; i++) {
    g->heads[i] = NIL;
    g->e[i].hnext = i + 1 < n ? i + 1 : NIL;
  }
  g->free = 0;
  g->lru = g->mru = NIL;
  g->cap = 1;
  g->trusted = 1;
  *out = g;
  return 0;
}

void kvt_guard_free(kvt_guard *g) {
  if (!g) return;
  kvt_mem_free(g->m, g->cat, g->e, (size_t)g->n * sizeof *g->e);
  kvt_mem_free(g->m, g->cat, g->heads, (size_t)g->n * sizeof *g->heads);
  kvt_mem_free(g->m, g->cat, g, sizeof *g);
}

int kvt_guard_trusted(const kvt_guard *g) { return g->trusted; }

void kvt_guard_stats_get(const kvt_guard *g, kvt_guard_stats *st) {
  st->tier_hits = g->tier_hits;
  st->lru_hits = g->lru_hits;
  st->accesses = g->acc;
  st->trips = g->trips;
}

/* ---------- the shadow LRU ---------- */

static uint32_t find(const kvt_guard *g, const kvt_key *k) {
  uint32_t i = g->heads[key_hash(k) & (g->n - 1)];
  while (i != NIL && memcmp(g->e[i].key.b, k->b, 16)) i = g->e[i].hnext;
  return i;
}

static void list_unlink(kvt_guard *g, uint32_t i) {
  g_ent *x = &g->e[i];
  if (x->prev != NIL) g->e[x->prev].next = x->next; else g->lru = x->next;
  if (x->next != NIL) g->e[x->next].prev = x->prev; else g->mru = x->prev;
}

static void list_append(kvt_guard *g, uint32_t i) {
  g_ent *x = &g->e[i];
  x->prev = g->mru;
  x->next = NIL;
  if (g->mru != NIL) g->e[g->mru].next = i; else g->lru = i;
  g->mru = i;
}

static void drop_lru(kvt_guard *g) {
  uint32_t i = g->lru;
  list_unlink(g, i);
  uint32_t *pp = &g->heads[key_hash(&g->e[i].key) & (g->n - 1)];
  while (*pp != i) pp = &g->e[*pp].hnext;
  *pp = g->e[i].hnext;
  g->e[i].hnext = g->free;
  g->free = i;
  g->count--;
}

/* The shadow's answer for one sampled access: 1 hit, 0 miss (then the
 * key is inserted, the least recent going while over the size). */
static int shadow_access(kvt_guard *g, const kvt_key *k) {
  uint32_t i = find(g, k);
  if (i != NIL) {
    list_unlink(g, i);
    list_append(g, i);
    return 1;
  }
  while (g->count >= g->cap) drop_lru(g);
  i = g->free;
  g->free = g->e[i].hnext;
  g->e[i].key = *k;
  uint32_t *head = &g->heads[key_hash(k) & (g->n - 1)];
  g->e[i].hnext = *head;
  *head = i;
  list_append(g, i);
  g->count++;
  return 0;
}

/* ---------- the comparison ---------- */

static uint64_t window(const kvt_guard *g) {
  uint64_t w = (uint64_t)WINDOW_PER_SLOT * g->cap;
  return w < WINDOW_MIN ? WINDOW_MIN : w;
}

static void reset_counts(kvt_guard *g) { g->tier_hits = g->lru_hits = g->acc = 0; }

/* Is the shadow ahead of the tier by more than noise? The two counts are
 * of the same accesses; sqrt of their sum is the scale of their
 * difference when both are Poisson-like. */
static int lru_ahead(const kvt_guard *g) {
  double d = g->lru_hits - g->tier_hits;
  return g->lru_hits >= TRIP_MIN_HITS && d > TRIP_Z * sqrt(g->lru_hits + g->tier_hits);
}

static void judge(kvt_guard *g) {
  uint64_t w = window(g);
  if (!g->trusted) {
    if (--g->distrust_left == 0) { /* try the model again, on fresh counts */
      g->trusted = 1;
      g->trial = 0;
      reset_counts(g);
    }
    return;
  }
  if (lru_ahead(g)) {
    g->trusted = 0;
    g->trips++;
    g->backoff = g->backoff ? g->backoff * 2 : 1; /* a model wrong again waits longer */
    if (g->backoff > BACKOFF_MAX) g->backoff = BACKOFF_MAX;
    g->distrust_left = g->backoff * w;
    reset_counts(g);
    return;
  }
  if (++g->trial >= w) g->backoff = 0; /* a whole window not behind: forgive */
  if (g->acc >= 2.0 * (double)w) {    /* compare what happened lately */
    g->tier_hits *= 0.5;
    g->lru_hits *= 0.5;
    g->acc *= 0.5;
  }
}

void kvt_guard_access(kvt_guard *g, const kvt_key *key, int hit, uint64_t held) {
  if (key_hash(key) >> (64 - KVT_GUARD_SAMPLE_SHIFT)) return; /* not sampled */
  uint64_t cap = (held + (1u << KVT_GUARD_SAMPLE_SHIFT) - 1) >> KVT_GUARD_SAMPLE_SHIFT;
  g->cap = cap < 1 ? 1 : cap > g->n ? g->n : (uint32_t)cap;
  while (g->count > g->cap) drop_lru(g);
  int lru_hit = shadow_access(g, key);
  g->acc += 1;
  g->tier_hits += hit != 0;
  g->lru_hits += lru_hit;
  judge(g);
}
