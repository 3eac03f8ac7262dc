/* stats_tier.c - kvt_stats_tier(): one tier's counters by its id, in a
 * struct the caller sizes, so a tier added later reports itself without
 * changing kvt_stats (docs/store-interface.md, "The public ABI"). */
#include <stdio.h>
#include <string.h>

#include "engine/internal.h"
#include "tiers/evict.h"

/* The durable tier: whatever store is open behind KVT_TIER_COLD. */
static void store_counters(kvt_engine *e, kvt_tier_stats *t) {
  kvt_store *store = e->store; /* closed only by kvt_engine_close */
  if (!store) return;
  kvt_store_stats cs;
  kvt_store_stats_get(store, &cs);
  t->present = 1;
  snprintf(t->name, sizeof t->name, "%s", store->m->name);
  t->blocks = cs.records;
  t->bytes = cs.live_bytes;
  t->limit = cs.bytes_limit;
  t->evictions = cs.evictions;
  t->reads = cs.reads;
  t->read_bytes = cs.read_bytes;
  t->write_bytes = cs.bytes_written;
  t->checksum_failures = cs.checksum_failures;
  t->write_failures = cs.write_failures;
  t->model_accesses = cs.model_clock;
  t->model_saved_accesses = cs.model_saved;
}

int kvt_stats_tier(kvt_engine *e, uint32_t tier, kvt_tier_stats *st, size_t size) {
  if (!e || !st) return KVT_ENULL;
  if (size < sizeof st->filled) return KVT_EBUFSIZE;
  if (tier != KVT_TIER_HOT && tier != KVT_TIER_WARM && tier != KVT_TIER_COLD)
    return KVT_ENOTFOUND;
  kvt_tier_stats t = {.tier = tier};
  if (tier == KVT_TIER_COLD) {
    store_counters(e, &t);
    pthread_mutex_lock(&e->lock);
    t.declined = e->tc.cold_declined; /* the engine asks, the store answers */
    pthread_mutex_unlock(&e->lock);
  } else {
    pthread_mutex_lock(&e->lock);
    const kvt_tier_state *ts = &e->tier[tier];
    t.present = ts->bytes_limit > 0 || ts->blocks > 0;
    snprintf(t.name, sizeof t.name, "%s", tier == KVT_TIER_HOT ? "hot" : "warm");
    t.blocks = ts->blocks;
    t.bytes = ts->bytes_used;
    t.limit = ts->bytes_limit;
    t.evictions = ts->evictions;
    if (tier == KVT_TIER_HOT) { /* the hot tier's model, kept in the store */
      t.model_accesses = e->hot_ev ? kvt_evict_model_clock(e->hot_ev) : 0;
      t.model_saved_accesses = e->hot_model_saved;
    }
    pthread_mutex_unlock(&e->lock);
  }
  size_t n = size < sizeof t ? size : sizeof t;
  t.filled = n;
  memcpy(st, &t, n);
  return 0;
}
