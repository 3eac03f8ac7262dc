/* cold_meta.c - the metadata-only cold tier (cold_meta.h): byte accounting
 * under a limit around the eviction order of evict.c, which also serves as
 * the index (it tracks every stored key). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/cold_meta.h"
#include "tiers/evict.h"

struct kvt_cold_meta {
  kvt_mem *m;
  kvt_evict *ev;
  uint64_t bytes_limit;
  int (*keep)(void *arg, const kvt_key *key);
  void (*evicted)(void *arg, const kvt_key *key);
  void *arg;
  uint64_t written, bytes_written, evictions, refusals;
};

int kvt_cold_meta_open(kvt_mem *m, uint64_t bytes_limit, int policy, kvt_cold_meta **out) {
  *out = NULL;
  kvt_cold_meta *c = kvt_mem_calloc(m, KVT_MEM_INDEX, sizeof *c);
  if (!c) return -ENOMEM;
  c->m = m;
  c->bytes_limit = bytes_limit;
  int rc = kvt_evict_create(m, KVT_MEM_INDEX, policy, &c->ev);
  if (rc) {
    kvt_mem_free(m, KVT_MEM_INDEX, c, sizeof *c);
    return rc;
  }
  *out = c;
  return 0;
}

void kvt_cold_meta_close(kvt_cold_meta *c) {
  if (!c) return;
  kvt_evict_free(c->ev);
  kvt_mem_free(c->m, KVT_MEM_INDEX, c, sizeof *c);
}

void kvt_cold_meta_set_hooks(kvt_cold_meta *c, int (*keep)(void *, const kvt_key *),
                             void (*evicted)(void *, const kvt_key *), void *arg) {
  c->keep = keep;
  c->evicted = evicted;
  c->arg = arg;
}

/* A namespace's mark on its blocks: its seed's first 8 bytes (seeds are
 * hashes), never 0, which marks none. */
static uint64_t ns_tag(const kvt_key *seed) {
  uint64_t t;
  memcpy(&t, seed->b, 8);
  return t ? t : 1;
}

int kvt_cold_meta_write(kvt_cold_meta *c, const kvt_key *key, const kvt_key *parent,
                        const kvt_key *ns_seed, uint64_t rec_bytes) {
  if (kvt_evict_touch(c->ev, key)) return 0;
  if (rec_bytes > c->bytes_limit) {
    c->refusals++;
    return KVT_EFULL;
  }
  while (kvt_evict_bytes(c->ev) + rec_bytes > c->bytes_limit) {
    kvt_key victim;
    if (kvt_evict_victim(c->ev, c->keep, c->arg, &victim, NULL)) {
      c->refusals++; /* what is left is referenced: nothing more can go */
      return KVT_EFULL;
    }
    kvt_evict_remove(c->ev, &victim, NULL);
    c->evictions++;
    if (c->evicted) c->evicted(c->arg, &victim);
  }
  int rc = kvt_evict_add(c->ev, key, parent, rec_bytes);
  if (rc) return rc;
  if (ns_seed) kvt_evict_set_tag(c->ev, key, ns_tag(ns_seed));
  c->written++;
  c->bytes_written += rec_bytes;
  return 0;
}

int kvt_cold_meta_admit(kvt_cold_meta *c, const kvt_key *key, const kvt_key *parent,
                        uint32_t depth, uint32_t ns, uint64_t rec_bytes) {
  if (kvt_evict_has(c->ev, key)) return 1;
  int full = kvt_evict_bytes(c->ev) + rec_bytes > c->bytes_limit;
  return kvt_evict_admit(c->ev, key, parent, depth, ns, full);
}

int kvt_cold_meta_find(kvt_cold_meta *c, const kvt_key *key) {
  return kvt_evict_touch(c->ev, key) ? 0 : KVT_ENOTFOUND;
}

size_t kvt_cold_meta_prefix(kvt_cold_meta *c, const kvt_key *keys, size_t n) {
  size_t i = 0;
  while (i < n && kvt_evict_look(c->ev, &keys[i])) i++;
  return i;
}

int kvt_cold_meta_remove(kvt_cold_meta *c, const kvt_key *key) {
  return kvt_evict_remove(c->ev, key, NULL);
}

int64_t kvt_cold_meta_drop_ns(kvt_cold_meta *c, const kvt_key *ns_seed) {
  return kvt_evict_remove_tagged(c->ev, ns_tag(ns_seed), NULL);
}

void kvt_cold_meta_stats(const kvt_cold_meta *c, kvt_cold_stats *st) {
  *st = (kvt_cold_stats){0};
  st->records = kvt_evict_count(c->ev);
  st->live_bytes = kvt_evict_bytes(c->ev);
  st->bytes_limit = c->bytes_limit;
  st->records_written = c->written;
  st->bytes_written = c->bytes_written;
  st->evictions = c->evictions;
  st->full_refusals = c->refusals;
  st->model_clock = kvt_evict_model_clock(c->ev); /* kept nowhere: model_saved 0 */
  snprintf(st->backend, sizeof st->backend, "metadata");
  snprintf(st->why, sizeof st->why, "metadata-only engine: an in-memory index, no files");
}
