/* store.h - the store interface: one method table for the durable tiers
 * below RAM, so the engine and its flusher talk to "a store" and never to
 * a particular one. Implementations: the cold tier on disk (store_disk.c
 * over cold.c) and the metadata-only cold tier (store_meta.c over
 * cold_meta.c). A new tier (a remote one) is one more implementation and
 * one more line in store.c's table. docs/store-interface.md has the walk.
 *
 * The store also owns its directory: the lock the engine holds for its
 * life, the index path a reader looks for, and rebuilding a lost index. */
#ifndef KVT_STORE_H
#define KVT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "base/mem.h"
#include "kvtier.h"

/* ---------- what crosses the interface ---------- */

/* A token block to write: exact K then V of each layer. A store that
 * keeps no bytes (KVT_STORE_INLINE) reads only the keys and the shape;
 * layers may then be NULL. */
typedef struct kvt_store_rec {
  kvt_key key, parent, ns_seed;
  uint32_t pos, n_layers, dtype, bytes_each;
  const uint8_t *const *layers; /* [n_layers] pointers to K||V (2*bytes_each) */
} kvt_store_rec;

/* One asynchronous read of one layer; statuses as kvt_store_read_layer(). */
typedef struct kvt_store_read {
  kvt_key key;
  uint32_t layer;
  void *k_out, *v_out;
  size_t bytes_each;
  int status;                  /* out */
  void *batch;                 /* internal: the implementation's batch */
  struct kvt_store_read *next; /* internal */
} kvt_store_read;

/* A batch of reads knows how to wait for itself, so a caller may wait
 * after the store is gone (it finishes its reads before it closes).
 * Every implementation's batch starts with this. */
typedef struct kvt_store_batch {
  void (*wait)(struct kvt_store_batch *b); /* waits, then frees b */
  int (*done)(struct kvt_store_batch *b);  /* would wait() not wait? */
} kvt_store_batch;

typedef struct kvt_store_stats {
  uint64_t records;                /* live in the index */
  uint64_t live_bytes;             /* bytes of live records */
  uint64_t segments, segment_bytes, bytes_limit;
  uint64_t groups_written, records_written, bytes_written;
  uint64_t reads, read_bytes;
  uint64_t checksum_failures;      /* reads refused by a check (each also a miss) */
  uint64_t write_failures;
  uint64_t full_refusals;          /* records not written: the store is full */
  uint64_t evictions;              /* entries removed to make room */
  uint64_t reclaims;               /* segments reclaimed */
  uint64_t relocated;              /* referenced records written again by reclaims */
  uint64_t model_clock;            /* the learned order's model: accesses it has counted,
                                      a loaded state's included (0: no learned order) */
  uint64_t model_saved;            /* the clock of the model the store keeps (what an open
                                      now would start from; 0: none) */
  char backend[32];
  char why[160];
} kvt_store_stats;

/* Records recs[from..to) of a post settled: rc 0 durable, or why not. */
typedef void (*kvt_store_settled_fn)(void *arg, size_t from, size_t to, int rc);

/* What the store tells its owner, through arg. Which thread calls, and
 * under which lock, depends on KVT_STORE_INLINE (below). */
typedef struct kvt_store_hooks {
  void *arg;
  int (*keep)(void *arg, const kvt_key *key);     /* room is made: must key stay? */
  void (*lost)(void *arg, const kvt_key *key);    /* a kept block failed a check and left */
  void (*evicted)(void *arg, const kvt_key *key); /* key left to make room */
  void (*read_notify)(void *arg);                 /* a read batch finished */
  const int *backlog;          /* atomic, may be NULL: the writer has more work behind */
  /* The owner's id of the namespace with this seed, 0 unknown (may be
   * NULL): a block the store copies on its own is admitted under it. */
  uint32_t (*ns_of)(void *arg, const kvt_key *seed);
} kvt_store_hooks;

/* Everything a store may be opened with; each implementation reads what
 * concerns it. Filled by the engine from kvt_options. */
typedef struct kvt_store_config {
  const char *dir;             /* the store directory; NULL for a metadata-only engine */
  int rdonly, nocreate, meta_only;
  uint64_t bytes_limit;        /* 0: a writer has no durable tier */
  uint64_t segment_bytes, map_bytes, group_bytes;
  int compress, zstd_level, evict_policy;
  uint32_t io_backend, io_depth;
  struct { uint32_t ops, kind; uint64_t after, count, seed; } fault; /* tests only */
  /* The remote tier (store_remote.c): a Redis Cluster below the local one. */
  const char *remote_url, *remote_password; /* url NULL: none */
  uint32_t remote_deadline_ms;
  uint64_t remote_queue_bytes;
  char *remote_err;            /* out, may be NULL: why the cluster refused */
  size_t remote_err_len;
} kvt_store_config;

/* Capabilities. KVT_STORE_PAYLOAD: it keeps the bytes (read_layer and
 * read_submit work). KVT_STORE_INLINE: a write is a cheap in-memory step
 * taken under the owner's lock as a block completes (no flusher, no
 * post/drain); its hooks are called from inside write() with the owner's
 * lock held. Without INLINE the store is written by one writer thread
 * (post/drain/evict_for), its other calls take any thread, and its hooks
 * are called with none of the owner's locks held. */
#define KVT_STORE_PAYLOAD 1u
#define KVT_STORE_INLINE 2u

/* ---------- the method table ---------- */

typedef struct kvt_store kvt_store;
struct kvt_hist; /* tiers/hist.h */

typedef struct kvt_store_methods {
  const char *name;
  unsigned caps;
  void (*close)(void *impl);
  void (*set_hooks)(void *impl, const kvt_store_hooks *h);
  /* Bytes a record of this shape takes, at most (room, group cuts). */
  uint64_t (*record_max)(void *impl, uint32_t n_layers, uint32_t bytes_each);
  /* Namespaces: persist one; call fn for each stored (stops at non-zero). */
  int (*ns_put)(void *impl, const kvt_key *seed, const uint8_t *enc, size_t len);
  int (*ns_each)(void *impl, int (*fn)(void *, const kvt_key *, const uint8_t *, size_t),
                 void *arg);
  /* Admission: should a block not stored yet be written? Counts the access. */
  int (*admit)(void *impl, const kvt_key *key, const kvt_key *parent, uint32_t depth,
               uint32_t ns, uint64_t rec_bytes);
  /* Write and wait: 0, or KVT_EFULL / an error with *written leading done. */
  int (*write)(void *impl, const kvt_store_rec *recs, size_t n, size_t *written);
  /* The flusher's calls (not INLINE): post without waiting, wait for a
   * staging buffer, choose victims for need bytes, wait for all posted. */
  int (*post)(void *impl, const kvt_store_rec *recs, size_t n, size_t *posted,
              kvt_store_settled_fn settled, void *arg);
  void (*wait_stage)(void *impl);
  int64_t (*evict_for)(void *impl, uint64_t need);
  int (*drain)(void *impl);
  /* Lookups: is key stored (0 or KVT_ENOTFOUND); how many of keys lead. */
  int (*find)(void *impl, const kvt_key *key);
  size_t (*prefix)(void *impl, const kvt_key *keys, size_t n);
  /* Reads (PAYLOAD): one layer now, or a batch (wait through the batch). */
  int (*read_layer)(void *impl, const kvt_key *key, uint32_t layer, void *k_out, void *v_out,
                    size_t bytes_each);
  int (*read_submit)(void *impl, kvt_store_read *reqs, size_t n, kvt_store_batch **out);
  /* Removal: one key; a namespace (root NULL) or root and what extends it. */
  int (*remove)(void *impl, const kvt_key *key);
  int (*drop)(void *impl, const kvt_key *seed, const kvt_key *root, uint32_t root_pos,
              uint64_t *dropped);
  void (*stats)(void *impl, kvt_store_stats *st);
  void (*hists)(void *impl, struct kvt_hist *read, struct kvt_hist *commit);
  int (*verify)(void *impl, int repair, uint64_t *checked, uint64_t *bad,
                void (*report)(void *, const kvt_key *, const char *), void *arg);
  /* drop, handing each(arg, keys, n) the keys it removes first (the
   * remote tier mirrors a local drop in the cluster). */
  int (*drop_each)(void *impl, const kvt_key *seed, const kvt_key *root, uint32_t root_pos,
                   uint64_t *dropped, void (*each)(void *, const kvt_key *, size_t), void *arg);
  /* Blocks durable here that the owner knows a drop of root reaches (its
   * RAM index): a store that cannot enumerate what extends root (a
   * diskless remote tier) removes them too. Best effort, called before
   * drop; returns how many it removed that drop will not count. */
  uint64_t (*drop_also)(void *impl, const kvt_key *keys, size_t n);
  /* A small state its owner keeps across restarts under name (the hot
   * tier's eviction model): get its length (0: none), put it. */
  size_t (*state_get)(void *impl, const char *name, uint8_t *out, size_t cap);
  int (*state_put)(void *impl, const char *name, const uint8_t *buf, size_t len);
} kvt_store_methods;

struct kvt_store {
  const kvt_store_methods *m;
  void *impl;
  kvt_mem *mem;
};

/* ---------- opening ---------- */

/* Open the durable tier cfg asks for: the first implementation in
 * store.c's table that wants cfg. *out is NULL (and 0 returned) when none
 * does (no cold limit, no dir, a reader of a store without one). Errors
 * as the implementation's open (KVT_EVERSION, KVT_ECORRUPT, KVT_EINDEX,
 * KVT_EOPTION, -errno). */
int kvt_store_open(kvt_mem *m, const kvt_store_config *cfg, kvt_store **out);
void kvt_store_close(kvt_store *s); /* drains first; accepts NULL */

/* The directory: taken shared by readers, exclusive by a writer, held
 * until kvt_store_unlock. 0, KVT_ELOCKED, -errno. */
int kvt_store_lock(const char *dir, int create, int rdonly, int *lock_fd);
void kvt_store_unlock(int lock_fd);
/* Who holds the lock that refused us: 1 when only readers hold it
 * shared; else 0 and *pid the writer (0 unknown). */
int kvt_store_lock_holder(const char *dir, int *pid);
/* Has dir a durable tier's index? */
int kvt_store_has_index(const char *dir);
/* Rebuild a lost index from the segment files, the lock held meanwhile. */
int kvt_store_rebuild(const char *dir, uint64_t segment_bytes, kvt_rebuild_result *res,
                      void (*report)(void *arg, const char *what), void *arg);
/* The on-disk record size of a token block (the disk format's). */
uint64_t kvt_store_record_bytes(uint32_t n_layers, uint32_t bytes_each);

/* ---------- calls (a method a store lacks is a no-op or KVT_ENOTFOUND) ---------- */

static inline unsigned kvt_store_caps(const kvt_store *s) { return s ? s->m->caps : 0; }

static inline void kvt_store_set_hooks(kvt_store *s, const kvt_store_hooks *h) {
  if (s->m->set_hooks) s->m->set_hooks(s->impl, h);
}
static inline uint64_t kvt_store_record_max(kvt_store *s, uint32_t n_layers, uint32_t each) {
  return s->m->record_max(s->impl, n_layers, each);
}
static inline int kvt_store_ns_put(kvt_store *s, const kvt_key *seed, const uint8_t *enc,
                                   size_t len) {
  return s->m->ns_put ? s->m->ns_put(s->impl, seed, enc, len) : 0;
}
static inline int kvt_store_ns_each(kvt_store *s,
                                    int (*fn)(void *, const kvt_key *, const uint8_t *, size_t),
                                    void *arg) {
  return s->m->ns_each ? s->m->ns_each(s->impl, fn, arg) : 0;
}
static inline int kvt_store_admit(kvt_store *s, const kvt_key *key, const kvt_key *parent,
                                  uint32_t depth, uint32_t ns, uint64_t rec_bytes) {
  return s->m->admit ? s->m->admit(s->impl, key, parent, depth, ns, rec_bytes) : 1;
}
static inline int kvt_store_write(kvt_store *s, const kvt_store_rec *recs, size_t n,
                                  size_t *written) {
  return s->m->write(s->impl, recs, n, written);
}
static inline int kvt_store_post(kvt_store *s, const kvt_store_rec *recs, size_t n,
                                 size_t *posted, kvt_store_settled_fn settled, void *arg) {
  return s->m->post(s->impl, recs, n, posted, settled, arg);
}
static inline void kvt_store_wait_stage(kvt_store *s) {
  if (s->m->wait_stage) s->m->wait_stage(s->impl);
}
static inline int64_t kvt_store_evict_for(kvt_store *s, uint64_t need) {
  return s->m->evict_for ? s->m->evict_for(s->impl, need) : 0;
}
static inline int kvt_store_drain(kvt_store *s) {
  return s->m->drain ? s->m->drain(s->impl) : 0;
}
static inline int kvt_store_find(kvt_store *s, const kvt_key *key) {
  return s->m->find(s->impl, key);
}
static inline size_t kvt_store_prefix(kvt_store *s, const kvt_key *keys, size_t n) {
  return s->m->prefix(s->impl, keys, n);
}
static inline int kvt_store_read_layer(kvt_store *s, const kvt_key *key, uint32_t layer,
                                       void *k_out, void *v_out, size_t each) {
  if (!s || !s->m->read_layer) return KVT_ENOTFOUND;
  return s->m->read_layer(s->impl, key, layer, k_out, v_out, each);
}
/* 0 and *out a batch; or an error, *out NULL, nothing submitted. */
static inline int kvt_store_read_submit(kvt_store *s, kvt_store_read *reqs, size_t n,
                                        kvt_store_batch **out) {
  *out = NULL;
  if (!s || !s->m->read_submit) return KVT_ENOTFOUND;
  return s->m->read_submit(s->impl, reqs, n, out);
}
static inline void kvt_store_read_wait(kvt_store_batch *b) { /* frees b; accepts NULL */
  if (b) b->wait(b);
}
static inline int kvt_store_read_done(kvt_store_batch *b) { return !b || b->done(b); }
static inline int kvt_store_remove(kvt_store *s, const kvt_key *key) {
  return s->m->remove ? s->m->remove(s->impl, key) : KVT_ENOTFOUND;
}
static inline int kvt_store_drop(kvt_store *s, const kvt_key *seed, const kvt_key *root,
                                 uint32_t root_pos, uint64_t *dropped) {
  if (dropped) *dropped = 0;
  return s->m->drop ? s->m->drop(s->impl, seed, root, root_pos, dropped) : 0;
}
/* kvt_store_drop telling each(arg, keys, n) what it removes, when the
 * store can (else a plain drop, each not called). */
static inline int kvt_store_drop_each(kvt_store *s, const kvt_key *seed, const kvt_key *root,
                                      uint32_t root_pos, uint64_t *dropped,
                                      void (*each)(void *, const kvt_key *, size_t), void *arg) {
  if (!s->m->drop_each) return kvt_store_drop(s, seed, root, root_pos, dropped);
  if (dropped) *dropped = 0;
  return s->m->drop_each(s->impl, seed, root, root_pos, dropped, each, arg);
}
static inline size_t kvt_store_state_get(kvt_store *s, const char *name, uint8_t *out,
                                         size_t cap) {
  return s && s->m->state_get ? s->m->state_get(s->impl, name, out, cap) : 0;
}
static inline int kvt_store_state_put(kvt_store *s, const char *name, const uint8_t *buf,
                                      size_t len) {
  return s && s->m->state_put ? s->m->state_put(s->impl, name, buf, len) : KVT_ENOTFOUND;
}
static inline uint64_t kvt_store_drop_also(kvt_store *s, const kvt_key *keys, size_t n) {
  return s->m->drop_also && n ? s->m->drop_also(s->impl, keys, n) : 0;
}
static inline void kvt_store_stats_get(kvt_store *s, kvt_store_stats *st) {
  s->m->stats(s->impl, st);
}
static inline void kvt_store_hists(kvt_store *s, struct kvt_hist *read, struct kvt_hist *commit) {
  if (s->m->hists) s->m->hists(s->impl, read, commit);
}
static inline int kvt_store_verify(kvt_store *s, int repair, uint64_t *checked, uint64_t *bad,
                                   void (*report)(void *, const kvt_key *, const char *),
                                   void *arg) {
  if (!s->m->verify) return KVT_ENOTFOUND;
  return s->m->verify(s->impl, repair, checked, bad, report, arg);
}

#endif
