/* evict_guard.h - the learned order's check against plain LRU: a shadow
 * LRU cache of a sample of the keys (one in eight, by key hash), sized at
 * the same share of what the tier holds, sees the tier's accesses beside
 * it. While the tier hits the sampled keys less often than the shadow
 * does, by more than noise, the learned order is not trusted: evict.c
 * then decides as CHAIN does (no sampled victims, every write admitted)
 * for a while, and tries the model again. So on a workload where the
 * model is wrong, the tier is not left worse than recency.
 * Memory is fixed at create. Not thread-safe: the owner serializes calls. */
#ifndef KVT_EVICT_GUARD_H
#define KVT_EVICT_GUARD_H

#include <stdint.h>

#include "base/mem.h"
#include "kvtier.h"

#define KVT_GUARD_SAMPLE_SHIFT 3 /* one key in 2^3 is replayed in the shadow */

typedef struct kvt_guard kvt_guard;

/* A guard whose shadow holds at most slots keys (rounded up to a power
 * of two, 256 at least; it covers tiers of up to 8 x slots blocks, a
 * larger tier is compared with a shadow of that size). 0 or -ENOMEM. */
int kvt_guard_create(kvt_mem *m, int cat, uint32_t slots, kvt_guard **out);
void kvt_guard_free(kvt_guard *g); /* accepts NULL */

/* One access of key by the tier: hit says whether the tier held it, held
 * how many blocks the tier holds now (the shadow holds an eighth). Keys
 * outside the sample are ignored (one hash test). */
void kvt_guard_access(kvt_guard *g, const kvt_key *key, int hit, uint64_t held);
/* 1: the learned order decides; 0: it is behind LRU lately, decide as
 * CHAIN does. */
int kvt_guard_trusted(const kvt_guard *g);

/* What it measured (tests, reports): the tier's and the shadow's hits on
 * sampled accesses since the current trial began, and how many times the
 * model was found behind LRU. */
typedef struct kvt_guard_stats {
  double tier_hits, lru_hits, accesses;
  uint64_t trips;
} kvt_guard_stats;
void kvt_guard_stats_get(const kvt_guard *g, kvt_guard_stats *st);

#endif
