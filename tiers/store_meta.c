/* store_meta.c - the metadata-only cold tier (cold_meta.h) behind the
 * store interface (store.h). cold_meta is not thread-safe; a mutex of
 * its own here lets lookups come without the owner's lock. Its writes
 * are INLINE: taken under the owner's lock, hooks called from inside. */
#include <errno.h>
#include <pthread.h>

#include "tiers/cold.h"
#include "tiers/cold_meta.h"
#include "tiers/store_impl.h"

typedef struct meta_store {
  kvt_mem *mem;
  kvt_cold_meta *c;
  pthread_mutex_t mu;
} meta_store;

static void meta_close(void *impl) {
  meta_store *s = impl;
  kvt_cold_meta_close(s->c);
  pthread_mutex_destroy(&s->mu);
  kvt_mem_free(s->mem, KVT_MEM_INDEX, s, sizeof *s);
}

static void meta_set_hooks(void *impl, const kvt_store_hooks *h) {
  meta_store *s = impl;
  kvt_cold_meta_set_hooks(s->c, h->keep, h->evicted, h->arg);
}

static uint64_t meta_record_max(void *impl, uint32_t n_layers, uint32_t bytes_each) {
  (void)impl; /* charged what the record would take on disk */
  return kvt_cold_record_max(n_layers, bytes_each);
}

static int meta_admit(void *impl, const kvt_key *key, const kvt_key *parent, uint32_t depth,
                      uint32_t ns, uint64_t rec_bytes) {
  meta_store *s = impl;
  pthread_mutex_lock(&s->mu);
  int rc = kvt_cold_meta_admit(s->c, key, parent, depth, ns, rec_bytes);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static int meta_write(void *impl, const kvt_store_rec *recs, size_t n, size_t *written) {
  meta_store *s = impl;
  int rc = 0;
  size_t i = 0;
  pthread_mutex_lock(&s->mu);
  for (; i < n && !rc; i += rc == 0) {
    uint64_t bytes = kvt_cold_record_max(recs[i].n_layers, recs[i].bytes_each);
    rc = kvt_cold_meta_write(s->c, &recs[i].key, &recs[i].parent, &recs[i].ns_seed, bytes);
  }
  pthread_mutex_unlock(&s->mu);
  if (written) *written = i;
  return rc;
}

static int meta_find(void *impl, const kvt_key *key) {
  meta_store *s = impl;
  pthread_mutex_lock(&s->mu);
  int rc = kvt_cold_meta_find(s->c, key);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static size_t meta_prefix(void *impl, const kvt_key *keys, size_t n) {
  meta_store *s = impl;
  pthread_mutex_lock(&s->mu);
  size_t c = kvt_cold_meta_prefix(s->c, keys, n);
  pthread_mutex_unlock(&s->mu);
  return c;
}

static int meta_remove(void *impl, const kvt_key *key) {
  meta_store *s = impl;
  pthread_mutex_lock(&s->mu);
  int rc = kvt_cold_meta_remove(s->c, key);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* The metadata tier records no chains: a drop removes root alone (the
 * engine removes what extends it from RAM); it does record each block's
 * namespace, so a namespace drop (root NULL) removes every block of it. */
static int meta_drop(void *impl, const kvt_key *seed, const kvt_key *root, uint32_t root_pos,
                     uint64_t *dropped) {
  (void)root_pos;
  if (root) {
    if (meta_remove(impl, root) == 0 && dropped) *dropped = 1;
    return 0;
  }
  meta_store *s = impl;
  pthread_mutex_lock(&s->mu);
  int64_t n = kvt_cold_meta_drop_ns(s->c, seed);
  pthread_mutex_unlock(&s->mu);
  if (n < 0) return (int)n;
  if (dropped) *dropped = (uint64_t)n;
  return 0;
}

static void meta_stats(void *impl, kvt_store_stats *st) {
  meta_store *s = impl;
  pthread_mutex_lock(&s->mu);
  kvt_cold_meta_stats(s->c, st);
  pthread_mutex_unlock(&s->mu);
}

static const kvt_store_methods meta_methods = {
    .name = "metadata", .caps = KVT_STORE_INLINE, .close = meta_close,
    .set_hooks = meta_set_hooks, .record_max = meta_record_max, .admit = meta_admit,
    .write = meta_write, .find = meta_find, .prefix = meta_prefix, .remove = meta_remove,
    .drop = meta_drop, .stats = meta_stats};

static int meta_wants(const kvt_store_config *cfg) { return cfg->meta_only && cfg->bytes_limit > 0; }

static int meta_open(kvt_mem *m, const kvt_store_config *cfg, void **impl) {
  *impl = NULL;
  meta_store *s = kvt_mem_calloc(m, KVT_MEM_INDEX, sizeof *s);
  if (!s) return -ENOMEM;
  s->mem = m;
  int rc = kvt_cold_meta_open(m, cfg->bytes_limit, cfg->evict_policy, &s->c);
  if (rc) {
    kvt_mem_free(m, KVT_MEM_INDEX, s, sizeof *s);
    return rc;
  }
  pthread_mutex_init(&s->mu, NULL);
  *impl = s;
  return 0;
}

const kvt_store_impl kvt_store_meta = {&meta_methods, meta_wants, meta_open};
