/* evict.c - eviction order of token blocks (evict.h).
 *
 * Every tracked block is an entry in a chained hash table keyed by its
 * 128-bit key (uniform: its first 8 bytes are the hash). LRU keeps one
 * doubly linked list, least recent at the head. CHAIN keeps, per entry, the
 * number of tracked children, and binary min-heaps (by access tick) of the
 * entries that have none - the leaves, the only candidates - in two
 * segments: probation holds the tails as written (a leaf never used since
 * it was added and never given a child), the main segment every other
 * leaf. Probation goes first. Why: a request's last block is usually
 * partial, and the next turn of the conversation extends the prefix with
 * a different block at that position, so the written tail is almost never
 * asked for again (in the Mooncake conversation trace, under 1% of such
 * tails are reused against 15-28% of other blocks). A tail that is used,
 * or extended, joins the main segment; a parent whose last child went
 * joins it too (it was extended once), ordered by its last use.
 *
 * Invariant (CHAIN): an entry is in a heap iff its n_children is 0; the
 * heap is probation iff e->tail (CHAIN_LEAF: never). Children are counted
 * whatever the order of adds and removes: the children of a key that is
 * not tracked are counted in the orphan table, and move to the parent's
 * n_children when it is added (the index is loaded in key order, not
 * parent first; a parent may be removed and written again). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/evict.h"
#include "tiers/evict_guard.h"
#include "tiers/reuse_model.h"

/* LEARNED: the horizon of the reuse model is the tier's residence time,
 * measured over this many turnovers of its blocks (and never below
 * HORIZON_MIN accesses); the model remembers this many blocks the tier
 * does not hold. */
#define HORIZON_TURNOVERS 8
#define HORIZON_MIN 1024
#define HISTORY_SLOTS (1u << 17)
#define GUARD_SLOTS (1u << 14) /* the shadow LRU: tiers of up to 2^17 blocks compared in full */
#define SAMPLES 64 /* leaves looked at to choose a victim or judge a write */
#define CONFIDENCE_Z 2.0 /* standard errors by which a choice must beat LRU's */
#define SEASON_HORIZONS 2 /* the model's clock, in horizons, before it chooses victims */

typedef struct ev_ent {
  kvt_key key, parent;
  struct ev_ent *hnext;        /* hash chain */
  struct ev_ent *prev, *next;  /* LRU list */
  uint64_t bytes;
  uint64_t tick;               /* last use */
  uint64_t ord;                /* heap order: the tick of its last use */
  uint32_t n_children;         /* tracked entries whose parent this is (CHAIN) */
  int32_t heap_pos;            /* index in heap[!tail], -1 when not a leaf */
  uint8_t has_parent;
  uint8_t tail;                /* a tail as written: not used, no child since added */
  uint64_t looked;             /* tick of its last use when that was a look, else 0 */
  uint64_t tag;                /* the owner's mark (kvt_evict_set_tag), 0 if none */
  kvt_reuse_blk rb[];          /* LEARNED only: the block's history for the model */
} ev_ent;

/* Children tracked while their parent is not. */
typedef struct ev_orphan {
  kvt_key parent;
  uint32_t n;
  struct ev_orphan *next;
} ev_orphan;

typedef struct ev_heap {
  ev_ent **v;
  size_t n, cap;
} ev_heap;

struct kvt_evict {
  kvt_mem *m;
  int cat, policy;
  ev_ent **buckets;
  size_t n_buckets;            /* power of two */
  uint64_t count, bytes, tick;
  ev_ent lru;                  /* sentinel: lru.next is the least recent */
  ev_heap heap[2];             /* leaves: [0] probation (tails), [1] main */
  ev_orphan *orphans[256];     /* by parent key hash; few, but many at open */
  kvt_reuse *model;            /* LEARNED */
  kvt_guard *guard;            /* LEARNED: the model against a shadow LRU (evict_guard.h) */
  uint64_t rng;                /* LEARNED: which leaves to sample (fixed seed: replays repeat) */
  double win_accesses, win_adds; /* LEARNED: accesses and adds lately (set_horizon) */
  size_t ent_bytes;            /* one entry (LEARNED's carry the model's history) */
  int loading;                 /* kvt_evict_load: an add that is no access */
};

static uint64_t key_hash(const kvt_key *k) {
  uint64_t h;
  memcpy(&h, k->b, 8);
  return h;
}

static int key_zero(const kvt_key *k) {
  static const kvt_key z;
  return memcmp(k->b, z.b, 16) == 0;
}

/* ---------- hash table ---------- */

static ev_ent *find(const kvt_evict *ev, const kvt_key *k) {
  ev_ent *e = ev->buckets[key_hash(k) & (ev->n_buckets - 1)];
  while (e && memcmp(e->key.b, k->b, 16)) e = e->hnext;
  return e;
}

/* Double the table at one entry a bucket; on allocation failure the chains
 * just grow longer. */
static void grow_table(kvt_evict *ev) {
  size_t n = ev->n_buckets * 2;
  ev_ent **nb = kvt_mem_calloc(ev->m, ev->cat, n * sizeof *nb);
  if (!nb) return;
  for (size_t i = 0; i < ev->n_buckets; i++) {
    for (ev_ent *e = ev->buckets[i], *next; e; e = next) {
      next = e->hnext;
      size_t h = key_hash(&e->key) & (n - 1);
      e->hnext = nb[h];
      nb[h] = e;
    }
  }
  kvt_mem_free(ev->m, ev->cat, ev->buckets, ev->n_buckets * sizeof *nb);
  ev->buckets = nb;
  ev->n_buckets = n;
}

static void unlink_hash(kvt_evict *ev, ev_ent *e) {
  ev_ent **pp = &ev->buckets[key_hash(&e->key) & (ev->n_buckets - 1)];
  while (*pp != e) pp = &(*pp)->hnext;
  *pp = e->hnext;
}

/* ---------- orphan counts (CHAIN) ---------- */

static ev_orphan **orphan_slot(kvt_evict *ev, const kvt_key *parent) {
  ev_orphan **pp = &ev->orphans[key_hash(parent) & 255];
  while (*pp && memcmp((*pp)->parent.b, parent->b, 16)) pp = &(*pp)->next;
  return pp;
}

/* Count d more (or fewer) untracked-parent children of parent. -ENOMEM
 * only when a new count cannot be stored (then that child just does not
 * hold its parent back: the parent may go first, never a wrong byte). */
static int orphan_add(kvt_evict *ev, const kvt_key *parent, int64_t d) {
  ev_orphan **pp = orphan_slot(ev, parent), *o = *pp;
  if (!o) {
    if (d <= 0) return 0;
    if (!(o = kvt_mem_calloc(ev->m, ev->cat, sizeof *o))) return -ENOMEM;
    o->parent = *parent;
    *pp = o;
  }
  o->n = d < 0 && (uint64_t)-d >= o->n ? 0 : (uint32_t)((int64_t)o->n + d);
  if (o->n == 0) {
    *pp = o->next;
    kvt_mem_free(ev->m, ev->cat, o, sizeof *o);
  }
  return 0;
}

/* Take parent's orphan count (it is being added). */
static uint32_t orphan_take(kvt_evict *ev, const kvt_key *parent) {
  ev_orphan **pp = orphan_slot(ev, parent), *o = *pp;
  if (!o) return 0;
  uint32_t n = o->n;
  *pp = o->next;
  kvt_mem_free(ev->m, ev->cat, o, sizeof *o);
  return n;
}

/* ---------- leaf heaps (CHAIN) ---------- */

static int older(const ev_ent *a, const ev_ent *b) { return a->ord < b->ord; }

static void heap_set(ev_heap *h, size_t i, ev_ent *e) {
  h->v[i] = e;
  e->heap_pos = (int32_t)i;
}

static void sift_up(ev_heap *h, size_t i) {
  ev_ent *e = h->v[i];
  while (i > 0 && older(e, h->v[(i - 1) / 2])) {
    heap_set(h, i, h->v[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  heap_set(h, i, e);
}

static void sift_down(ev_heap *h, size_t i) {
  ev_ent *e = h->v[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && older(h->v[c + 1], h->v[c])) c++;
    if (!older(h->v[c], e)) break;
    heap_set(h, i, h->v[c]);
    i = c;
  }
  heap_set(h, i, e);
}

static int heap_push(kvt_evict *ev, ev_heap *h, ev_ent *e) {
  if (h->n == h->cap) {
    size_t nc = h->cap ? 2 * h->cap : 256;
    ev_ent **nv = kvt_mem_alloc(ev->m, ev->cat, nc * sizeof *nv);
    if (!nv) return -ENOMEM;
    if (h->n) memcpy(nv, h->v, h->n * sizeof *nv);
    kvt_mem_free(ev->m, ev->cat, h->v, h->cap * sizeof *nv);
    h->v = nv;
    h->cap = nc;
  }
  heap_set(h, h->n++, e);
  sift_up(h, h->n - 1);
  return 0;
}

static void heap_del(ev_heap *h, ev_ent *e) {
  size_t i = (size_t)e->heap_pos;
  e->heap_pos = -1;
  ev_ent *last = h->v[--h->n];
  if (i == h->n) return;
  heap_set(h, i, last);
  sift_up(h, i);
  sift_down(h, (size_t)last->heap_pos);
}

static ev_heap *heap_of(kvt_evict *ev, const ev_ent *e) { return &ev->heap[!e->tail]; }

/* Leaf e was used: its tick grew, and it is no tail any more. */
static void leaf_update(kvt_evict *ev, ev_ent *e, int was_tail) {
  if (e->heap_pos < 0) return;
  if (was_tail != e->tail) {
    heap_del(&ev->heap[!was_tail], e);
    /* Out of memory here only makes e no candidate until its last child
     * goes (the LRU fallback still sees it): never a wrong eviction. */
    heap_push(ev, heap_of(ev, e), e);
  } else { /* a learned key may fall as well as rise */
    sift_up(heap_of(ev, e), (size_t)e->heap_pos);
    sift_down(heap_of(ev, e), (size_t)e->heap_pos);
  }
}

/* ---------- LRU list ---------- */

static void lru_unlink(ev_ent *e) {
  e->prev->next = e->next;
  e->next->prev = e->prev;
}

static void lru_append(kvt_evict *ev, ev_ent *e) {
  e->prev = ev->lru.prev;
  e->next = &ev->lru;
  ev->lru.prev->next = e;
  ev->lru.prev = e;
}

/* ---------- interface ---------- */

int kvt_evict_create(kvt_mem *m, int cat, int policy, kvt_evict **out) {
  *out = NULL;
  if (policy != KVT_EVICT_CHAIN && policy != KVT_EVICT_LRU && policy != KVT_EVICT_CHAIN_LEAF &&
      policy != KVT_EVICT_LEARNED)
    return KVT_EOPTION;
  kvt_evict *ev = kvt_mem_calloc(m, cat, sizeof *ev);
  if (!ev) return -ENOMEM;
  ev->m = m;
  ev->cat = cat;
  ev->policy = policy;
  ev->ent_bytes = sizeof(ev_ent) + (policy == KVT_EVICT_LEARNED ? sizeof(kvt_reuse_blk) : 0);
  ev->n_buckets = 1024;
  ev->buckets = kvt_mem_calloc(m, cat, ev->n_buckets * sizeof *ev->buckets);
  if (ev->buckets && policy == KVT_EVICT_LEARNED &&
      (kvt_reuse_create(m, cat, HISTORY_SLOTS, &ev->model) ||
       kvt_guard_create(m, cat, GUARD_SLOTS, &ev->guard))) {
    kvt_reuse_free(ev->model);
    kvt_mem_free(m, cat, ev->buckets, ev->n_buckets * sizeof *ev->buckets);
    ev->buckets = NULL;
  }
  if (!ev->buckets) {
    kvt_mem_free(m, cat, ev, sizeof *ev);
    return -ENOMEM;
  }
  ev->lru.next = ev->lru.prev = &ev->lru;
  ev->rng = 0x9E3779B97F4A7C15ull;
  *out = ev;
  return 0;
}

void kvt_evict_free(kvt_evict *ev) {
  if (!ev) return;
  for (size_t i = 0; i < ev->n_buckets; i++) {
    for (ev_ent *e = ev->buckets[i], *next; e; e = next) {
      next = e->hnext;
      kvt_mem_free(ev->m, ev->cat, e, ev->ent_bytes);
    }
  }
  for (int i = 0; i < 2; i++) kvt_mem_free(ev->m, ev->cat, ev->heap[i].v, ev->heap[i].cap * sizeof(ev_ent *));
  for (int i = 0; i < 256; i++)
    for (ev_orphan *o = ev->orphans[i], *next; o; o = next) {
      next = o->next;
      kvt_mem_free(ev->m, ev->cat, o, sizeof *o);
    }
  kvt_mem_free(ev->m, ev->cat, ev->buckets, ev->n_buckets * sizeof *ev->buckets);
  kvt_reuse_free(ev->model);
  kvt_guard_free(ev->guard);
  kvt_mem_free(ev->m, ev->cat, ev, sizeof *ev);
}

static int chained(const kvt_evict *ev) { return ev->policy != KVT_EVICT_LRU; }

/* ---------- LEARNED ---------- */

static int learned(const kvt_evict *ev) { return ev->model != NULL; }

/* The horizon is how long the tier keeps a block: its residence time by
 * Little's law, the blocks it holds over the blocks it adds per access,
 * counted over the last few turnovers of the tier (the counts halve
 * past HORIZON_TURNOVERS of them). Never below HORIZON_MIN accesses. */
static void set_horizon(kvt_evict *ev) {
  double held = (double)(ev->count > HORIZON_MIN ? ev->count : HORIZON_MIN);
  double h = ev->win_adds > 0 ? held * ev->win_accesses / ev->win_adds : held;
  kvt_reuse_set_horizon(ev->model, h < HORIZON_MIN ? HORIZON_MIN : (uint64_t)h);
}

/* Accesses to the tier and blocks it added, for the horizon. */
static void count_access(kvt_evict *ev, double accesses, double adds) {
  ev->win_accesses += accesses;
  ev->win_adds += adds;
  if (ev->win_accesses > HORIZON_TURNOVERS * (double)(ev->count > HORIZON_MIN ? ev->count : HORIZON_MIN)) {
    ev->win_accesses *= 0.5;
    ev->win_adds *= 0.5;
  }
}

/* The history of key's chain parent, held or remembered (NULL: none). */
static const kvt_reuse_blk *parent_hist(const kvt_evict *ev, const kvt_key *parent) {
  if (!parent || key_zero(parent)) return NULL;
  const ev_ent *p = find(ev, parent);
  return p ? p->rb : kvt_reuse_peek(ev->model, parent);
}

static uint64_t rng_next(kvt_evict *ev) {
  uint64_t x = ev->rng;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return ev->rng = x;
}

/* A leaf and what it is worth: density and its standard error. */
typedef struct ev_pick {
  ev_ent *e;
  double d, se;
} ev_pick;

/* Is the model sure that a is worth less than b (by more than Z standard
 * errors of the difference)? */
static int surely_less(const ev_pick *a, const ev_pick *b) {
  return b->d - a->d > CONFIDENCE_Z * sqrt(a->se * a->se + b->se * b->se);
}

/* The leaf to give up among SAMPLES leaves not kept: the least dense,
 * unless the model is not sure it is worth less than the least recently
 * used leaf, which then goes (what CHAIN would do: with little learned,
 * or a workload where nothing tells blocks apart, the order is CHAIN's).
 * e NULL: none found. */
static ev_pick sample_leaves(kvt_evict *ev, int (*keep)(void *, const kvt_key *), void *arg) {
  ev_heap *h = &ev->heap[1];
  ev_pick best = {0}, lru = {0};
  for (int i = 0; h->n && i <= SAMPLES; i++) {
    ev_pick p = {.e = h->v[i == 0 ? 0 : rng_next(ev) % h->n]};
    p.d = kvt_reuse_density(ev->model, p.e->rb, &p.se);
    if (best.e && (p.d > best.d || (p.d == best.d && p.e->tick >= best.e->tick))) continue;
    if (keep && keep(arg, &p.e->key)) continue;
    best = p;
    if (i == 0) lru = p; /* the heap's top: the least recently used leaf */
  }
  return lru.e && best.e != lru.e && !surely_less(&best, &lru) ? lru : best;
}

static int sampled_victim(kvt_evict *ev, int (*keep)(void *, const kvt_key *), void *arg, ev_ent **out) {
  ev_pick p = sample_leaves(ev, keep, arg);
  if (!p.e) return KVT_ENOTFOUND;
  *out = p.e;
  return 0;
}

/* Has the model run long enough to choose a victim? A leaf's worth is
 * its chance of a use within a horizon past its age, and the leaves a
 * full tier gives up are about a horizon old: until the model's clock has
 * run two horizons, none of the accesses it counted is old enough to have
 * shown a use that far out, so it would rate a block whose next use comes
 * later than anything it has yet seen as worthless, and give it up before
 * LRU's leaf. Until then the victim is CHAIN's. (Without this, where a
 * horizon is a large part of a replay - 20M tokens on the synthetic trace
 * of the Mooncake release - the order fell 0.07 points of hit rate below
 * LRU; with it, 0.02, CHAIN's figure: docs/capacity-planning.md.)
 * Admission is not gated: it weighs a block at age 0. A model loaded at
 * open brings its clock: a restarted tier that had run that long decides
 * at once. */
int kvt_evict_seasoned(const kvt_evict *ev) {
  return learned(ev) && kvt_reuse_now(ev->model) >= SEASON_HORIZONS * kvt_reuse_horizon(ev->model);
}

static void learned_access(kvt_evict *ev, ev_ent *e) {
  count_access(ev, 1, 0);
  set_horizon(ev);
  kvt_reuse_access(ev->model, e->rb);
}

/* Is this touch of e the append (or find) that follows its lookup? A
 * look is pending for as many of the tier's uses as it holds blocks: a
 * lookup finds at most that many, so the append of each comes within
 * them when a server looks a prompt up and then appends it, with room
 * for other requests' uses in between (threads interleave, and the cold
 * tier's committer adds blocks meanwhile). A touch past that, a tier's
 * worth of uses later (by then LRU would have let the block go), is a
 * use of its own: a lookup no append followed does not hide the block's
 * next use for long. */
static int after_look(kvt_evict *ev, ev_ent *e, int look) {
  int again = !look && e->looked && ev->tick - e->looked < ev->count;
  e->looked = look ? ev->tick + 1 : 0; /* the tick use() gives this look */
  return again;
}

/* look: a lookup's use; a touch right after one is the same use (only
 * its recency is refreshed, so LRU and CHAIN order as before). */
static void use(kvt_evict *ev, ev_ent *e, int look) {
  int again = after_look(ev, e, look);
  e->ord = e->tick = ++ev->tick;
  if (learned(ev) && !again) {
    kvt_guard_access(ev->guard, &e->key, 1, ev->count);
    learned_access(ev, e);
  }
  lru_unlink(e);
  lru_append(ev, e);
  int was_tail = e->tail;
  e->tail = 0;
  if (chained(ev)) leaf_update(ev, e, was_tail);
}

int kvt_evict_add(kvt_evict *ev, const kvt_key *key, const kvt_key *parent, uint64_t bytes) {
  if (kvt_evict_touch(ev, key)) return -EEXIST;
  ev_ent *e = kvt_mem_calloc(ev->m, ev->cat, ev->ent_bytes);
  if (!e) return -ENOMEM;
  e->key = *key;
  e->has_parent = parent && !key_zero(parent);
  if (e->has_parent) e->parent = *parent;
  e->bytes = bytes;
  e->tick = e->ord = ++ev->tick;
  e->heap_pos = -1;
  /* CHAIN_LEAF: no probation. LEARNED keeps it: whether a block is the
   * request's last is not known when it is written, only after. */
  e->tail = ev->policy == KVT_EVICT_CHAIN || ev->policy == KVT_EVICT_LEARNED;
  int known = learned(ev) && kvt_reuse_recall(ev->model, key, e->rb);
  if (learned(ev) && !known) {
    const kvt_reuse_blk *ph = e->has_parent ? parent_hist(ev, &e->parent) : NULL;
    kvt_reuse_blk_init(e->rb, ph ? ph->depth + 1 : 0, ph ? ph->ns : 0, ph);
  }
  if (learned(ev) && !ev->loading) count_access(ev, 0, 1);
  if (learned(ev) && e->rb->staged) { /* its access was counted by kvt_evict_admit */
    e->rb->staged = 0;
  } else if (learned(ev) && ev->loading) { /* stored before: not accessed now */
    if (!known) { /* a put-back keeps its age */
      e->rb->last = kvt_reuse_now(ev->model);
      e->rb->stored = 1; /* its past is unknown: not a prefix seen once */
    }
  } else if (learned(ev)) {
    learned_access(ev, e);
  }
  if (chained(ev)) {
    e->n_children = orphan_take(ev, key); /* children added before it */
    if (e->n_children) e->tail = 0;       /* extended already */
  }
  if (chained(ev) && !e->n_children && heap_push(ev, heap_of(ev, e), e)) {
    kvt_mem_free(ev->m, ev->cat, e, ev->ent_bytes);
    return -ENOMEM; /* (no children: no orphan count was taken) */
  }
  if (chained(ev) && e->has_parent) { /* the parent is no tail now */
    ev_ent *p = find(ev, &e->parent);
    if (p && p->n_children++ == 0 && p->heap_pos >= 0) heap_del(heap_of(ev, p), p);
    if (p) p->tail = 0;
    if (!p) orphan_add(ev, &e->parent, 1);
  }
  if (ev->count >= ev->n_buckets) grow_table(ev);
  size_t h = key_hash(key) & (ev->n_buckets - 1);
  e->hnext = ev->buckets[h];
  ev->buckets[h] = e;
  lru_append(ev, e);
  ev->count++;
  ev->bytes += bytes;
  return 0;
}

int kvt_evict_load(kvt_evict *ev, const kvt_key *key, const kvt_key *parent, uint64_t bytes) {
  ev->loading = 1;
  int rc = kvt_evict_add(ev, key, parent, bytes);
  ev->loading = 0;
  return rc;
}

int kvt_evict_touch(kvt_evict *ev, const kvt_key *key) {
  ev_ent *e = find(ev, key);
  if (!e) return 0;
  use(ev, e, 0);
  return 1;
}

int kvt_evict_look(kvt_evict *ev, const kvt_key *key) {
  ev_ent *e = find(ev, key);
  if (!e) return 0;
  use(ev, e, 1);
  return 1;
}

int kvt_evict_has(const kvt_evict *ev, const kvt_key *key) { return find(ev, key) != NULL; }

int kvt_evict_remove(kvt_evict *ev, const kvt_key *key, uint64_t *bytes) {
  ev_ent *e = find(ev, key);
  if (!e) return KVT_ENOTFOUND;
  if (bytes) *bytes = e->bytes;
  unlink_hash(ev, e);
  lru_unlink(e);
  if (e->heap_pos >= 0) heap_del(heap_of(ev, e), e);
  if (chained(ev) && e->has_parent) { /* the parent may become a leaf */
    ev_ent *p = find(ev, &e->parent);
    if (p && p->n_children > 0 && --p->n_children == 0) heap_push(ev, heap_of(ev, p), p);
    if (!p) orphan_add(ev, &e->parent, -1);
  }
  if (chained(ev) && e->n_children) orphan_add(ev, key, e->n_children); /* they stay */
  if (learned(ev)) kvt_reuse_forget(ev->model, key, e->rb); /* its past, for a later write */
  ev->count--;
  ev->bytes -= e->bytes;
  kvt_mem_free(ev->m, ev->cat, e, ev->ent_bytes);
  return 0;
}

int kvt_evict_set_tag(kvt_evict *ev, const kvt_key *key, uint64_t tag) {
  ev_ent *e = find(ev, key);
  if (!e) return KVT_ENOTFOUND;
  e->tag = tag;
  return 0;
}

/* The keys are gathered first: removing one may move others (a parent
 * whose last child went joins a heap), never while the table is walked. */
int64_t kvt_evict_remove_tagged(kvt_evict *ev, uint64_t tag, uint64_t *bytes) {
  if (bytes) *bytes = 0;
  size_t n = 0;
  for (size_t i = 0; i < ev->n_buckets; i++)
    for (const ev_ent *e = ev->buckets[i]; e; e = e->hnext) n += e->tag == tag;
  if (!n) return 0;
  kvt_key *keys = kvt_mem_alloc(ev->m, ev->cat, n * sizeof *keys);
  if (!keys) return -ENOMEM;
  size_t k = 0;
  for (size_t i = 0; i < ev->n_buckets; i++)
    for (const ev_ent *e = ev->buckets[i]; e; e = e->hnext)
      if (e->tag == tag) keys[k++] = e->key;
  for (k = 0; k < n; k++) {
    uint64_t b = 0;
    kvt_evict_remove(ev, &keys[k], &b);
    if (bytes) *bytes += b;
  }
  kvt_mem_free(ev->m, ev->cat, keys, n * sizeof *keys);
  return (int64_t)n;
}

static int lru_victim(kvt_evict *ev, int (*keep)(void *, const kvt_key *), void *arg, ev_ent **out) {
  for (ev_ent *e = ev->lru.next; e != &ev->lru; e = e->next) {
    if (keep && keep(arg, &e->key)) continue;
    *out = e;
    return 0;
  }
  return KVT_ENOTFOUND;
}

/* Oldest leaf of heap h not kept. Kept ones are popped while searching
 * and pushed back after, so they stay where they were. */
static int heap_victim(kvt_evict *ev, ev_heap *h, int (*keep)(void *, const kvt_key *), void *arg,
                       ev_ent **out) {
  ev_ent *skipped[64];
  size_t n_skip = 0;
  int rc = KVT_ENOTFOUND;
  while (h->n > 0) {
    ev_ent *e = h->v[0];
    if (!keep || !keep(arg, &e->key)) {
      *out = e;
      rc = 0;
      break;
    }
    if (n_skip == sizeof skipped / sizeof *skipped) { /* many kept: scan the rest */
      for (size_t i = 1; i < h->n && rc; i++)
        if (!keep(arg, &h->v[i]->key)) {
          *out = h->v[i];
          rc = 0;
        }
      break;
    }
    heap_del(h, e);
    skipped[n_skip++] = e;
  }
  for (size_t i = 0; i < n_skip; i++) heap_push(ev, h, skipped[i]); /* room: they were just there */
  return rc;
}

int kvt_evict_victim(kvt_evict *ev, int (*keep)(void *, const kvt_key *), void *arg, kvt_key *out,
                     uint64_t *bytes) {
  ev_ent *e = NULL;
  int rc;
  if (!chained(ev)) {
    rc = lru_victim(ev, keep, arg, &e);
  } else {
    rc = heap_victim(ev, &ev->heap[0], keep, arg, &e); /* tails as written */
    /* The model decides once it has seen enough, and only while it is
     * not behind a shadow LRU. */
    if (rc && kvt_evict_seasoned(ev) && kvt_guard_trusted(ev->guard))
      rc = sampled_victim(ev, keep, arg, &e);
    if (rc) rc = heap_victim(ev, &ev->heap[1], keep, arg, &e);
    /* Only non-leaves are left, all kept children: fall back to recency. */
    if (rc) rc = lru_victim(ev, keep, arg, &e);
  }
  if (rc) return rc;
  *out = e->key;
  if (bytes) *bytes = e->bytes;
  return 0;
}

struct kvt_guard *kvt_evict_guard(kvt_evict *ev) { return ev->guard; }
uint64_t kvt_evict_count(const kvt_evict *ev) { return ev->count; }
uint64_t kvt_evict_bytes(const kvt_evict *ev) { return ev->bytes; }

int kvt_evict_admit(kvt_evict *ev, const kvt_key *key, const kvt_key *parent, uint32_t depth,
                    uint32_t ns, int full) {
  if (!learned(ev) || find(ev, key)) return 1; /* (tracked: the write is a touch) */
  kvt_reuse_blk b;
  const kvt_reuse_blk *ph = parent_hist(ev, parent);
  if (!kvt_reuse_recall(ev->model, key, &b)) kvt_reuse_blk_init(&b, depth, ns, ph);
  b.depth = depth;
  b.ns = ns;
  count_access(ev, 1, 0);
  set_horizon(ev);
  kvt_reuse_access(ev->model, &b);
  kvt_guard_access(ev->guard, key, 0, ev->count);
  int admit = 1;
  if (!kvt_guard_trusted(ev->guard)) {
    /* behind LRU lately: every write goes in, as under CHAIN */
  } else if (full && parent && !key_zero(parent) && !find(ev, parent) && !(ph && ph->staged)) {
    admit = 0; /* its prefix is not stored: no lookup could reach it */
  } else if (full && kvt_reuse_new_content(&b)) {
    /* New content must be worth as much as the leaf it would displace.
     * (Tails as written go first, but the one there is mostly the tail
     * of the request being written, still referenced.) Only new content:
     * a declined block takes the rest of its request with it (no lookup
     * reaches past it), so a block past a prefix that came back - a
     * chain known to return, whose next turn rereads it - or a chain
     * head - the whole request - is not declined. On another trace of
     * the Mooncake release declining those too cost 1-2 points of hit
     * rate (docs/capacity-planning.md). */
    ev_pick v = sample_leaves(ev, NULL, NULL), w = {.e = NULL};
    w.d = kvt_reuse_density(ev->model, &b, &w.se);
    if (v.e) admit = !surely_less(&w, &v);
  }
  b.staged = (uint8_t)admit;
  kvt_reuse_forget(ev->model, key, &b);
  return admit;
}

size_t kvt_evict_model_save(const kvt_evict *ev, uint8_t *out, size_t cap) {
  if (!learned(ev) || cap < KVT_REUSE_STATE_BYTES) return 0;
  kvt_reuse_save(ev->model, out);
  return KVT_REUSE_STATE_BYTES;
}

uint64_t kvt_evict_model_clock(const kvt_evict *ev) {
  return learned(ev) ? kvt_reuse_now(ev->model) : 0;
}

int kvt_evict_model_state_clock(const uint8_t *in, size_t len, uint64_t *clock) {
  return kvt_reuse_state_clock(in, len, clock);
}

int kvt_evict_model_load(kvt_evict *ev, const uint8_t *in, size_t len) {
  if (!learned(ev)) return KVT_EOPTION;
  return kvt_reuse_load(ev->model, in, len);
}
_Static_assert(KVT_REUSE_STATE_BYTES <= KVT_EVICT_MODEL_MAX, "evict.h: model state size");
