/* cold_meta.h - the cold tier of a metadata-only engine: an in-memory
 * index of token-block records (key, parent, on-disk size) under a byte
 * limit, evicted in the order of tiers/evict.h, with no files, no LMDB
 * and no syncs. `kvtier plan` replays traces through it, and through the
 * same eviction code the cold tier on disk runs. Not thread-safe: the
 * engine calls it with its lock held. */
#ifndef KVT_COLD_META_H
#define KVT_COLD_META_H

#include <stddef.h>
#include <stdint.h>

#include "base/mem.h"
#include "kvtier.h"
#include "tiers/cold.h"

typedef struct kvt_cold_meta kvt_cold_meta;

/* 0; KVT_EOPTION (policy); -ENOMEM. */
int kvt_cold_meta_open(kvt_mem *m, uint64_t bytes_limit, int policy, kvt_cold_meta **out);
void kvt_cold_meta_close(kvt_cold_meta *c); /* accepts NULL */

/* Blocks for which keep(arg, key) returns 1 (still referenced) are never
 * evicted; evict(arg, key) is told of each block that was. Both are
 * called with the caller's lock held. */
void kvt_cold_meta_set_hooks(kvt_cold_meta *c, int (*keep)(void *arg, const kvt_key *key),
                             void (*evicted)(void *arg, const kvt_key *key), void *arg);

/* Write one record of rec_bytes, of the namespace whose seed is ns_seed
 * (NULL: none; kvt_cold_meta_drop_ns): evicts blocks, in policy order,
 * until it fits. 0 (also when key is stored already: it is touched);
 * KVT_EFULL (larger than the limit, or everything left is kept; blocks
 * evicted before that stay evicted, as on disk); -ENOMEM. */
int kvt_cold_meta_write(kvt_cold_meta *c, const kvt_key *key, const kvt_key *parent,
                        const kvt_key *ns_seed, uint64_t rec_bytes);
/* Should key (not stored), at depth of its chain in namespace ns, be
 * written now? The eviction order's admission (kvt_evict_admit): always 1
 * but under KVT_EVICT_LEARNED with the tier full. Counts the access. */
int kvt_cold_meta_admit(kvt_cold_meta *c, const kvt_key *key, const kvt_key *parent,
                        uint32_t depth, uint32_t ns, uint64_t rec_bytes);
/* Is key stored? A hit is a use (touched). 0 or KVT_ENOTFOUND. */
int kvt_cold_meta_find(kvt_cold_meta *c, const kvt_key *key);
/* How many of keys[0..n), from the first, are stored; each one a use. */
size_t kvt_cold_meta_prefix(kvt_cold_meta *c, const kvt_key *keys, size_t n);
/* Forget key (a drop). 0 or KVT_ENOTFOUND. */
int kvt_cold_meta_remove(kvt_cold_meta *c, const kvt_key *key);
/* Forget every block written with ns_seed (a namespace dropped): how
 * many, or -ENOMEM (then none is). */
int64_t kvt_cold_meta_drop_ns(kvt_cold_meta *c, const kvt_key *ns_seed);

/* records, live_bytes, bytes_limit, records_written, bytes_written,
 * evictions, full_refusals; the rest zero, backend "metadata". */
void kvt_cold_meta_stats(const kvt_cold_meta *c, kvt_cold_stats *st);

#endif
