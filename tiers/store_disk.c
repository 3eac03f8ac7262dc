/* store_disk.c - the cold tier on disk (cold.h) behind the store
 * interface (store.h): adapters from the method table to kvt_cold_*, and
 * the choice of when a directory has such a tier. */
#include <stdio.h>

#include "tiers/cold.h"
#include "tiers/store_impl.h"

static void disk_close(void *impl) { kvt_cold_close(impl); }

static void disk_set_hooks(void *impl, const kvt_store_hooks *h) {
  kvt_cold *c = impl;
  kvt_cold_set_read_notify(c, h->read_notify, h->arg);
  if (h->keep) kvt_cold_set_keep(c, h->keep, h->arg);
  if (h->lost) kvt_cold_set_lost(c, h->lost);
  if (h->backlog) kvt_cold_set_backlog(c, h->backlog);
}

static uint64_t disk_record_max(void *impl, uint32_t n_layers, uint32_t bytes_each) {
  (void)impl;
  return kvt_cold_record_max(n_layers, bytes_each);
}

static int disk_ns_put(void *impl, const kvt_key *seed, const uint8_t *enc, size_t len) {
  return kvt_cold_ns_put(impl, seed, enc, len);
}

static int disk_ns_each(void *impl, int (*fn)(void *, const kvt_key *, const uint8_t *, size_t),
                        void *arg) {
  return kvt_cold_ns_each(impl, fn, arg);
}

static int disk_admit(void *impl, const kvt_key *key, const kvt_key *parent, uint32_t depth,
                      uint32_t ns, uint64_t rec_bytes) {
  return kvt_cold_admit(impl, key, parent, depth, ns, rec_bytes);
}

static int disk_write(void *impl, const kvt_store_rec *recs, size_t n, size_t *written) {
  return kvt_cold_write(impl, recs, n, written);
}

static int disk_post(void *impl, const kvt_store_rec *recs, size_t n, size_t *posted,
                     kvt_store_settled_fn settled, void *arg) {
  return kvt_cold_post(impl, recs, n, posted, settled, arg);
}

static void disk_wait_stage(void *impl) { kvt_cold_wait_stage(impl); }
static int64_t disk_evict_for(void *impl, uint64_t need) { return kvt_cold_evict_for(impl, need); }
static int disk_drain(void *impl) { return kvt_cold_drain(impl); }
static int disk_find(void *impl, const kvt_key *key) { return kvt_cold_find(impl, key, NULL); }

static size_t disk_prefix(void *impl, const kvt_key *keys, size_t n) {
  return kvt_cold_prefix(impl, keys, n);
}

static int disk_read_layer(void *impl, const kvt_key *key, uint32_t layer, void *k_out,
                           void *v_out, size_t each) {
  return kvt_cold_read_layer(impl, key, layer, k_out, v_out, each);
}

static int disk_read_submit(void *impl, kvt_store_read *reqs, size_t n, kvt_store_batch **out) {
  kvt_cold_batch *b;
  int rc = kvt_cold_read_submit(impl, reqs, n, &b);
  *out = rc ? NULL : (kvt_store_batch *)b; /* a cold batch starts with its kvt_store_batch */
  return rc;
}

static int disk_remove(void *impl, const kvt_key *key) { return kvt_cold_remove(impl, key); }

static int disk_drop(void *impl, const kvt_key *seed, const kvt_key *root, uint32_t root_pos,
                     uint64_t *dropped) {
  return kvt_cold_drop(impl, seed, root, root_pos, dropped);
}

static int disk_drop_each(void *impl, const kvt_key *seed, const kvt_key *root, uint32_t root_pos,
                          uint64_t *dropped, void (*each)(void *, const kvt_key *, size_t),
                          void *arg) {
  return kvt_cold_drop_each(impl, seed, root, root_pos, dropped, each, arg);
}

static void disk_stats(void *impl, kvt_store_stats *st) { kvt_cold_stats_get(impl, st); }

static void disk_hists(void *impl, struct kvt_hist *read, struct kvt_hist *commit) {
  kvt_cold_hists(impl, read, commit);
}

static int disk_verify(void *impl, int repair, uint64_t *checked, uint64_t *bad,
                       void (*report)(void *, const kvt_key *, const char *), void *arg) {
  return kvt_cold_verify(impl, repair, checked, bad, report, arg);
}

static size_t disk_state_get(void *impl, const char *name, uint8_t *out, size_t cap) {
  return kvt_cold_state_get(impl, name, out, cap);
}

static int disk_state_put(void *impl, const char *name, const uint8_t *buf, size_t len) {
  return kvt_cold_state_put(impl, name, buf, len);
}

static const kvt_store_methods disk_methods = {
    .name = "disk", .caps = KVT_STORE_PAYLOAD, .close = disk_close,
    .set_hooks = disk_set_hooks, .record_max = disk_record_max, .ns_put = disk_ns_put,
    .ns_each = disk_ns_each, .admit = disk_admit, .write = disk_write, .post = disk_post,
    .wait_stage = disk_wait_stage, .evict_for = disk_evict_for, .drain = disk_drain,
    .find = disk_find, .prefix = disk_prefix, .read_layer = disk_read_layer,
    .read_submit = disk_read_submit, .remove = disk_remove, .drop = disk_drop,
    .stats = disk_stats, .hists = disk_hists, .verify = disk_verify,
    .drop_each = disk_drop_each, .state_get = disk_state_get, .state_put = disk_state_put};

/* A writer has a cold tier when it is given a limit; a reader opens the
 * one the store has, so stat and fsck work beside a live writer. */
static int disk_wants(const kvt_store_config *cfg) {
  if (cfg->meta_only || !cfg->dir) return 0;
  if (!cfg->rdonly) return cfg->bytes_limit > 0;
  if (kvt_store_has_index(cfg->dir)) return 1;
  char path[4200]; /* its index lost: open it to say so (KVT_EINDEX) */
  if (snprintf(path, sizeof path, "%s/segments", cfg->dir) >= (int)sizeof path) return 0;
  return kvt_io_exists(path);
}

static void disk_config(const kvt_store_config *s, kvt_cold_config *c) {
  *c = (kvt_cold_config){.dir = s->dir, .rdonly = s->rdonly, .bytes_limit = s->bytes_limit,
                         .segment_bytes = s->segment_bytes,
                         .map_bytes = s->map_bytes ? s->map_bytes
                                                   : kvt_cold_map_bytes(s->bytes_limit),
                         .group_bytes = s->group_bytes, .compress = s->compress,
                         .zstd_level = s->zstd_level};
  c->evict_policy = s->evict_policy;
  c->nocreate = s->nocreate;
  c->io.backend = (int)s->io_backend;
  c->io.depth = s->io_depth;
  c->io.fault = (kvt_io_fault){.ops = s->fault.ops, .kind = s->fault.kind,
                               .after = s->fault.after, .count = s->fault.count,
                               .seed = s->fault.seed};
}

static int disk_open(kvt_mem *m, const kvt_store_config *cfg, void **impl) {
  kvt_cold_config cc;
  disk_config(cfg, &cc);
  kvt_cold *c = NULL;
  int rc = kvt_cold_open(m, &cc, &c);
  *impl = c;
  return rc;
}

const kvt_store_impl kvt_store_disk = {&disk_methods, disk_wants, disk_open};
