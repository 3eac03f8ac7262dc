/* plan_belady.c - Belady's MIN for `kvtier plan`: one pass over the trace
 * backwards gives every block access the position of its block's next
 * access (the future); the replay keeps the stored blocks in a max-heap by
 * next use and gives up the farthest. See docs/capacity-planning.md. */
#include <stdlib.h>
#include <string.h>

#include "plan_belady.h"

#define NONE UINT32_MAX  /* no next use; no node */
#define ROOT UINT32_MAX  /* the parent of a request's first block */

struct plan_future {
  uint32_t *node;        /* per access position: its block (0 .. n_nodes-1) */
  uint32_t *next;        /* per access position: its block's next access, or NONE */
  uint64_t n_access;
  uint32_t n_nodes;
};

/* ---- blocks: a prefix chain of ids ------------------------------------- */

/* (parent block, id) -> block. The engine keys block i by a chained hash
 * of every token up to its end, so the same id after different prefixes is
 * a different block; interning the chain keeps exactly that identity
 * without hashing (no collisions). Open addressing over block numbers, the
 * (id, parent) of each block beside: 4 bytes a slot. */
typedef struct chains {
  uint32_t *slot;        /* a block, or NONE: empty */
  uint64_t mask;
  uint64_t *id;          /* per block */
  uint32_t *parent;      /* per block */
} chains;

static uint64_t mix(uint64_t x)
{
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint32_t intern(chains *c, uint32_t parent, uint64_t id, uint32_t *n_nodes)
{
  uint64_t h = mix(id ^ mix((uint64_t)parent + 0x9e3779b97f4a7c15ull)) & c->mask;
  for (;; h = (h + 1) & c->mask) { /* the table is at most half full: this ends */
    uint32_t b = c->slot[h];
    if (b == NONE) {
      b = c->slot[h] = (*n_nodes)++;
      c->id[b] = id;
      c->parent[b] = parent;
      return b;
    }
    if (c->id[b] == id && c->parent[b] == parent) return b;
  }
}

static int resolve_nodes(const plan_trace *t, plan_future *f)
{
  uint64_t size = 2;
  while (size < 2 * f->n_access) size *= 2;
  size_t n = f->n_access ? f->n_access : 1;
  chains c = {.slot = malloc(size * sizeof *c.slot), .mask = size - 1,
              .id = malloc(n * sizeof *c.id), .parent = malloc(n * sizeof *c.parent)};
  int rc = c.slot && c.id && c.parent ? 0 : -1;
  if (!rc) memset(c.slot, 0xff, size * sizeof *c.slot); /* every slot NONE */
  for (size_t r = 0; !rc && r < t->n; r++) {
    const plan_req *q = &t->reqs[r];
    uint32_t parent = ROOT;
    for (uint32_t i = 0; i < q->n_blocks; i++) {
      parent = intern(&c, parent, t->ids[q->first + i], &f->n_nodes);
      f->node[q->first + i] = parent;
    }
  }
  free(c.slot);
  free(c.id);
  free(c.parent);
  return rc;
}

/* Backwards over the accesses: the last access seen of each block is the
 * next one of the access before it. */
static int resolve_next(plan_future *f)
{
  uint32_t *last = malloc((f->n_nodes ? f->n_nodes : 1) * sizeof *last);
  if (!last) return -1;
  memset(last, 0xff, (size_t)f->n_nodes * sizeof *last);
  for (uint64_t p = f->n_access; p-- > 0;) {
    f->next[p] = last[f->node[p]];
    last[f->node[p]] = (uint32_t)p;
  }
  free(last);
  return 0;
}

/* Access position = index in t->ids: requests lie there one after another
 * in the order plan replays them. */
static int check_layout(const plan_trace *t)
{
  uint64_t pos = 0;
  for (size_t r = 0; r < t->n; r++) {
    if (t->reqs[r].first != pos) return -1;
    pos += t->reqs[r].n_blocks;
  }
  return pos == t->n_ids ? 0 : -1;
}

int plan_future_build(const plan_trace *t, plan_future **out)
{
  *out = NULL;
  if (t->n_ids > PLAN_BELADY_MAX_ACCESSES || check_layout(t)) return -1;
  plan_future *f = calloc(1, sizeof *f);
  if (!f) return -1;
  f->n_access = t->n_ids;
  size_t n = f->n_access ? f->n_access : 1;
  f->node = malloc(n * sizeof *f->node);
  f->next = malloc(n * sizeof *f->next);
  if (!f->node || !f->next || resolve_nodes(t, f) || resolve_next(f)) {
    plan_future_free(f);
    return -1;
  }
  *out = f;
  return 0;
}

void plan_future_free(plan_future *f)
{
  if (!f) return;
  free(f->node);
  free(f->next);
  free(f);
}

uint64_t plan_future_blocks(const plan_future *f)
{
  return f->n_nodes;
}

/* ---- the replay ------------------------------------------------------------ */

/* A max-heap of (next use << 32 | block). Entries go stale when their
 * block is accessed again (a new entry carries the new next use) or
 * evicted; a stale entry is dropped when it reaches the top. Each access
 * pushes at most one entry, so the heap never holds more than the trace
 * has accesses. */
typedef struct heap {
  uint64_t *v;
  uint64_t n;
} heap;

static void heap_push(heap *h, uint64_t x)
{
  uint64_t i = h->n++;
  while (i > 0 && h->v[(i - 1) / 2] < x) {
    h->v[i] = h->v[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->v[i] = x;
}

static void heap_pop(heap *h)
{
  uint64_t x = h->v[--h->n], i = 0;
  for (;;) {
    uint64_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && h->v[c + 1] > h->v[c]) c++;
    if (h->v[c] <= x) break;
    h->v[i] = h->v[c];
    i = c;
  }
  if (h->n) h->v[i] = x;
}

typedef struct store {
  heap h;
  uint32_t *next_of;     /* per block: its next use while stored, else unused */
  uint8_t *stored;
  uint64_t count, cap;
} store;

#define ENTRY(next, node) ((uint64_t)(next) << 32 | (node))

/* The stored block used farthest in the future, as its heap entry. */
static uint64_t store_farthest(store *s)
{
  for (;;) {
    uint64_t top = s->h.v[0];
    uint32_t node = (uint32_t)top, next = (uint32_t)(top >> 32);
    if (s->stored[node] && s->next_of[node] == next) return top;
    heap_pop(&s->h);
  }
}

static void store_keep(store *s, uint32_t node, uint32_t next)
{
  s->next_of[node] = next;
  heap_push(&s->h, ENTRY(next, node));
}

/* One access of block node, next used at position next (NONE: never). */
static void store_access(store *s, uint32_t node, uint32_t next, plan_belady_stats *st)
{
  st->accesses++;
  if (s->stored[node]) {
    st->block_hits++;
    store_keep(s, node, next);
    return;
  }
  /* Bypass: never used again, or no room at all (capacity 0). */
  if (next == NONE || s->cap == 0) {
    st->bypasses++;
    return;
  }
  if (s->count == s->cap) {
    uint64_t top = store_farthest(s);
    if ((uint32_t)(top >> 32) < next) { /* every stored block is used sooner */
      st->bypasses++;
      return;
    }
    s->stored[(uint32_t)top] = 0;
    heap_pop(&s->h);
    s->count--;
    st->evictions++;
  }
  s->stored[node] = 1;
  s->count++;
  store_keep(s, node, next);
}

/* Input tokens of block i of a request of len tokens (as plan counts). */
static uint64_t block_tokens(uint32_t i, uint32_t len)
{
  uint64_t start = (uint64_t)i * PLAN_BLOCK_TOKENS;
  if (start >= len) return 0;
  return len - start < PLAN_BLOCK_TOKENS ? len - start : PLAN_BLOCK_TOKENS;
}

int plan_belady_replay(const plan_trace *t, const plan_future *f, uint64_t cap_blocks,
                       plan_belady_stats *st)
{
  memset(st, 0, sizeof *st);
  store s = {.cap = cap_blocks};
  size_t nodes = f->n_nodes ? f->n_nodes : 1;
  s.h.v = malloc((f->n_access ? f->n_access : 1) * sizeof *s.h.v);
  s.next_of = malloc(nodes * sizeof *s.next_of);
  s.stored = calloc(nodes, 1);
  int rc = s.h.v && s.next_of && s.stored ? 0 : -1;
  for (size_t r = 0; !rc && r < t->n; r++) {
    const plan_req *q = &t->reqs[r];
    /* The lookup: the leading run of stored blocks, before any access. */
    for (uint32_t i = 0; i < q->n_blocks && s.stored[f->node[q->first + i]]; i++) {
      st->hit_blocks++;
      st->hit_tokens += block_tokens(i, q->input_len);
    }
    for (uint32_t i = 0; i < q->n_blocks; i++)
      store_access(&s, f->node[q->first + i], f->next[q->first + i], st);
  }
  free(s.h.v);
  free(s.next_of);
  free(s.stored);
  return rc;
}
