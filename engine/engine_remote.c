/* engine_remote.c - the remote tier's counters through the public API
 * (kvt_remote_stats_get); the tier itself is a store (tiers/store_remote.c). */
#include <stddef.h>
#include <string.h>

#include "engine/internal.h"
#include "tiers/remote.h"

int kvt_remote_stats_get(kvt_engine *e, kvt_remote_stats *st) {
  if (!e || !st) return KVT_ENULL;
  if (st->size < offsetof(kvt_remote_stats, misses)) return KVT_EOPTION;
  kvt_remote_counts c;
  if (kvt_store_remote_counts(e->store, &c, NULL)) return KVT_ENOTFOUND;
  kvt_remote_stats out = {.size = st->size, .hits = c.hits, .misses = c.misses,
                          .timeouts = c.timeouts, .checksum_failures = c.checksum_failures,
                          .deleted = c.deleted, .bytes_in = c.bytes_in, .bytes_out = c.bytes_out,
                          .writes = c.writes, .write_exists = c.write_exists,
                          .write_dropped = c.write_dropped, .write_failures = c.write_failures,
                          .local_copies = c.local_copies,
                          .evictions_noticed = c.evictions,
                          .write_cancelled = c.write_cancelled};
  size_t n = st->size < sizeof out ? st->size : sizeof out;
  memcpy(st, &out, n);
  return 0;
}
