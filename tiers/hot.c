/* hot.c - the hot tier and the accounting every tier shares (tier.h).
 * A block's cost in a tier is exactly what it allocated: its descriptor
 * (rounded to 64 bytes) plus its payload in that tier's form. */
#include <assert.h>
#include <stddef.h>

#include "kvtier.h"
#include "tiers/tier.h"

void kvt_tier_init(kvt_tier_state *t, int tier, const char *name, int mem_cat,
                   uint64_t bytes_limit) {
  *t = (kvt_tier_state){.name = name, .tier = tier, .mem_cat = mem_cat,
                        .bytes_limit = bytes_limit};
  t->lru.lru_next = t->lru.lru_prev = &t->lru;
  t->all.all_next = t->all.all_prev = &t->all;
}

uint64_t kvt_tier_evictable(const kvt_tier_state *t) {
  assert(t->lru_pinned_bytes <= t->lru_bytes);
  return t->lru_bytes - t->lru_pinned_bytes;
}

int kvt_tier_can_fit(const kvt_tier_state *t, uint64_t cost) {
  uint64_t keep = t->bytes_used - kvt_tier_evictable(t);
  return cost <= t->bytes_limit && keep <= t->bytes_limit - cost;
}

static void all_push(kvt_tier_state *t, kvt_lblk *b) {
  b->all_prev = t->all.all_prev;
  b->all_next = &t->all;
  t->all.all_prev->all_next = b;
  t->all.all_prev = b;
}

static void all_remove(kvt_lblk *b) {
  b->all_prev->all_next = b->all_next;
  b->all_next->all_prev = b->all_prev;
  b->all_prev = b->all_next = NULL;
}

void kvt_tier_account(kvt_tier_state *t, kvt_lblk *b) {
  b->tier = (uint8_t)t->tier;
  t->bytes_used += b->cost;
  t->blocks++;
  t->moves++;
  all_push(t, b);
  if (t->moved) t->moved(t->moved_arg, b, 1);
}

void kvt_tier_unaccount(kvt_tier_state *t, kvt_lblk *b) {
  assert(b->tier == t->tier && !b->on_lru && t->bytes_used >= b->cost && t->blocks > 0);
  if (t->moved) t->moved(t->moved_arg, b, 0);
  t->bytes_used -= b->cost;
  t->blocks--;
  t->moves++;
  all_remove(b);
  b->tier = KVT_TIER_NONE;
}

kvt_lblk *kvt_tier_oldest(kvt_tier_state *t) {
  for (kvt_lblk *b = t->all.all_next; b != &t->all; b = b->all_next)
    if (b->pins == 0 && !b->busy) return b;
  return NULL;
}

void kvt_tier_lru_push(kvt_tier_state *t, kvt_lblk *b) {
  assert(!b->on_lru && b->refs == 0);
  b->lru_prev = t->lru.lru_prev;
  b->lru_next = &t->lru;
  t->lru.lru_prev->lru_next = b;
  t->lru.lru_prev = b;
  b->on_lru = 1;
  t->lru_bytes += b->cost;
  if (b->pins) t->lru_pinned_bytes += b->cost;
}

void kvt_tier_lru_remove(kvt_tier_state *t, kvt_lblk *b) {
  assert(b->on_lru);
  b->lru_prev->lru_next = b->lru_next;
  b->lru_next->lru_prev = b->lru_prev;
  b->lru_prev = b->lru_next = NULL;
  b->on_lru = 0;
  t->lru_bytes -= b->cost;
  if (b->pins) t->lru_pinned_bytes -= b->cost;
}

void kvt_tier_lru_touch(kvt_tier_state *t, kvt_lblk *b) {
  all_remove(b);
  all_push(t, b);
  if (!b->on_lru) return;
  kvt_tier_lru_remove(t, b);
  kvt_tier_lru_push(t, b);
}

kvt_lblk *kvt_tier_lru_victim(kvt_tier_state *t) {
  for (kvt_lblk *b = t->lru.lru_next; b != &t->lru; b = b->lru_next)
    if (b->pins == 0) return b;
  return NULL;
}

void kvt_tier_pin(kvt_tier_state *t, kvt_lblk *b) {
  if (b->pins++ == 0 && b->on_lru) t->lru_pinned_bytes += b->cost;
}

void kvt_tier_unpin(kvt_tier_state *t, kvt_lblk *b) {
  assert(b->pins > 0);
  if (--b->pins == 0 && b->on_lru) t->lru_pinned_bytes -= b->cost;
}

uint64_t kvt_lblk_desc_bytes(void) { return kvt_mem_round(sizeof(kvt_lblk)); }

/* Payloads of a page or more are page-aligned, so the cold tier can write
 * them with O_DIRECT straight from here, without a copy. */
static size_t payload_align(uint64_t bytes) { return bytes >= 4096 ? 4096 : 64; }

int kvt_hot_init(kvt_mem *m, kvt_lblk *b, uint64_t payload_bytes, int with_payload) {
  size_t align = payload_align(payload_bytes);
  *b = (kvt_lblk){.payload_bytes = payload_bytes,
                  .payload_alloc = kvt_mem_round_to(payload_bytes, align)};
  if (with_payload && !(b->payload = align == 4096 ? kvt_mem_page_alloc(m, KVT_MEM_HOT, b->payload_alloc)
                                                   : kvt_mem_alloc_align(m, KVT_MEM_HOT, align, payload_bytes)))
    return -1;
  /* Metadata-only: the payload is notional but charged the same, so a
   * replay sees the limits a live store would. */
  b->cost = kvt_lblk_desc_bytes() + b->payload_alloc;
  return 0;
}

kvt_lblk *kvt_hot_alloc(kvt_mem *m, uint64_t payload_bytes, int with_payload) {
  kvt_lblk *b = kvt_mem_alloc_aligned(m, KVT_MEM_HOT, sizeof(kvt_lblk));
  if (!b) return NULL;
  if (kvt_hot_init(m, b, payload_bytes, with_payload)) {
    kvt_mem_free(m, KVT_MEM_HOT, b, kvt_lblk_desc_bytes());
    return NULL;
  }
  return b;
}

void kvt_payload_free(kvt_mem *m, int mem_cat, kvt_lblk *b) {
  if (!b->payload) return;
  if (mem_cat == KVT_MEM_HOT && b->payload_bytes >= 4096) /* a hot page buffer: reused */
    kvt_mem_page_free(m, mem_cat, b->payload, b->payload_alloc);
  else
    kvt_mem_free(m, mem_cat, b->payload, b->payload_alloc);
  b->payload = NULL;
}

void kvt_lblk_free(kvt_mem *m, int mem_cat, kvt_lblk *b) {
  if (!b) return;
  kvt_payload_free(m, mem_cat, b);
  kvt_mem_free(m, mem_cat, b, kvt_lblk_desc_bytes());
}
