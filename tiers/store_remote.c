/* store_remote.c - the remote tier behind the store interface (store.h):
 * a Redis Cluster (remote.c) below an optional local cold tier (the
 * store the configuration would have opened without a remote URL).
 * Lookups and reads go local first, then remote; writes go to both, the
 * remote one in the background and best effort; a remote hit is queued
 * for the local tier and written by the flusher's thread with its next
 * post or drain (the local store has one writer). Without a local tier
 * (a diskless node) the remote tier is the durable one. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/key.h"
#include "tiers/hist.h"
#include "tiers/remote.h"
#include "tiers/remote_known.h"
#include "tiers/store_impl.h"

#define COPY_BYTES (64u << 20) /* remote hits waiting for the local tier, at most */
#define COPY_MAX 256u

typedef struct copy {
  kvt_key key;
  uint8_t *val;
  size_t len;
} copy;

typedef struct rstore {
  kvt_mem *mem;
  kvt_store *local; /* NULL: diskless */
  kvt_remote *r;
  int rdonly;
  kvt_store_hooks hooks;
  pthread_mutex_t cp_lock;
  copy cp[COPY_MAX];
  size_t n_cp;
  uint64_t cp_bytes;
  uint64_t copies; /* atomic: copies handed to the local tier */
  kvt_known known; /* blocks a lookup found in the cluster, for the appends after it */
} rstore;

/* ---------- copies of remote hits into the local tier ---------- */

static void copy_add(rstore *s, copy *c);

/* Queue the value of key (a remote hit just read) for the local tier. */
static void copy_queue(rstore *s, const kvt_key *key) {
  if (!s->local || s->rdonly) return;
  pthread_mutex_lock(&s->cp_lock);
  int have = s->n_cp >= COPY_MAX;
  for (size_t i = 0; i < s->n_cp && !have; i++) have = kvt_key_eq(&s->cp[i].key, key);
  pthread_mutex_unlock(&s->cp_lock);
  if (have || kvt_store_find(s->local, key) == 0) return;
  copy c = {.key = *key};
  if (kvt_remote_get(s->r, key, &c.val, &c.len)) return; /* from the cache */
  copy_add(s, &c);
}

/* Keep c (its value taken) for the local tier, or free it: no room. */
static void copy_add(rstore *s, copy *c) {
  pthread_mutex_lock(&s->cp_lock);
  int room = s->n_cp < COPY_MAX && s->cp_bytes + c->len <= COPY_BYTES;
  for (size_t i = 0; room && i < s->n_cp; i++) room = !kvt_key_eq(&s->cp[i].key, &c->key);
  if (room) {
    s->cp[s->n_cp++] = *c;
    s->cp_bytes += c->len;
  }
  pthread_mutex_unlock(&s->cp_lock);
  if (!room) kvt_mem_free(s->mem, KVT_MEM_OTHER, c->val, c->len);
}

/* A checked value as a record to write (its slices are raw K||V). */
static int copy_rec(const copy *c, kvt_store_rec *rec, const uint8_t **ptrs, kvt_cold_slice *sl) {
  kvt_cold_entry e;
  if (kvt_remote_check(&c->key, c->val, c->len, &e, sl)) return KVT_ECORRUPT;
  for (uint32_t l = 0; l < e.n_layers; l++) {
    if (sl[l].codec != KVT_COLD_CODEC_RAW) return KVT_ECORRUPT;
    ptrs[l] = c->val + sl[l].rel_off;
  }
  *rec = (kvt_store_rec){.key = c->key, .parent = e.parent, .ns_seed = e.ns_seed, .pos = e.pos,
                         .n_layers = e.n_layers, .dtype = e.dtype, .bytes_each = e.bytes_each,
                         .layers = ptrs};
  return 0;
}

/* The owner's namespace id of seed (0 without the hook: unknown). */
static uint32_t copy_ns(rstore *s, const kvt_key *seed) {
  return s->hooks.ns_of ? s->hooks.ns_of(s->hooks.arg, seed) : 0;
}

/* On the flusher's thread: admitted copies go to the local tier. The
 * local post copies the bytes into its own buffers before it returns. */
static void copies_write(rstore *s) {
  copy cp[COPY_MAX];
  pthread_mutex_lock(&s->cp_lock);
  size_t n = s->n_cp;
  memcpy(cp, s->cp, n * sizeof *cp);
  s->n_cp = 0;
  s->cp_bytes = 0;
  pthread_mutex_unlock(&s->cp_lock);
  size_t sl_sz = KVT_MAX_LAYERS * sizeof(kvt_cold_slice), p_sz = KVT_MAX_LAYERS * sizeof(uint8_t *);
  kvt_cold_slice *sl = n ? kvt_mem_alloc(s->mem, KVT_MEM_OTHER, sl_sz) : NULL;
  const uint8_t **ptrs = n ? kvt_mem_alloc(s->mem, KVT_MEM_OTHER, p_sz) : NULL;
  for (size_t i = 0; i < n; i++) {
    kvt_store_rec rec;
    size_t posted;
    if (sl && ptrs && !copy_rec(&cp[i], &rec, ptrs, sl) &&
        kvt_store_admit(s->local, &rec.key, &rec.parent, rec.pos, copy_ns(s, &rec.ns_seed), cp[i].len)) {
      if (kvt_store_post(s->local, &rec, 1, &posted, NULL, NULL) == 0 && posted)
        __atomic_add_fetch(&s->copies, 1, __ATOMIC_RELAXED);
    }
    kvt_mem_free(s->mem, KVT_MEM_OTHER, cp[i].val, cp[i].len);
  }
  kvt_mem_free(s->mem, KVT_MEM_OTHER, sl, sl_sz);
  kvt_mem_free(s->mem, KVT_MEM_OTHER, (void *)ptrs, p_sz);
}

/* ---------- the methods ---------- */

static void rs_close(void *impl) {
  rstore *s = impl;
  kvt_store_close(s->local); /* drains first */
  for (size_t i = 0; i < s->n_cp; i++) kvt_mem_free(s->mem, KVT_MEM_OTHER, s->cp[i].val, s->cp[i].len);
  kvt_remote_close(s->r);    /* writes what is queued, each batch within the deadline */
  kvt_known_close(&s->known);
  pthread_mutex_destroy(&s->cp_lock);
  kvt_mem_free(s->mem, KVT_MEM_OTHER, s, sizeof *s);
}

static void rs_set_hooks(void *impl, const kvt_store_hooks *h) {
  rstore *s = impl;
  s->hooks = *h;
  if (s->local) kvt_store_set_hooks(s->local, h);
}

static uint64_t rs_record_max(void *impl, uint32_t n_layers, uint32_t bytes_each) {
  rstore *s = impl;
  if (s->local) return kvt_store_record_max(s->local, n_layers, bytes_each);
  return kvt_rec_header_len(n_layers) + (uint64_t)n_layers * kvt_align4k(2 * (uint64_t)bytes_each);
}

static int rs_ns_put(void *impl, const kvt_key *seed, const uint8_t *enc, size_t len) {
  rstore *s = impl;
  int rc = s->local ? kvt_store_ns_put(s->local, seed, enc, len) : 0;
  if (!rc) rc = kvt_remote_ns_put(s->r, seed, enc, len);
  return rc;
}

/* Namespaces: the local tier's, then the cluster's it lacks. */
typedef struct ns_union {
  int (*fn)(void *, const kvt_key *, const uint8_t *, size_t);
  void *arg;
  kvt_key seen[KVT_REMOTE_NS_MAX];
  size_t n;
} ns_union;

static int ns_local(void *arg, const kvt_key *seed, const uint8_t *enc, size_t len) {
  ns_union *u = arg;
  if (u->n < KVT_REMOTE_NS_MAX) u->seen[u->n++] = *seed;
  return u->fn(u->arg, seed, enc, len);
}

/* The cluster is shared: a namespace this engine cannot take (another
 * version's encoding, no room left) is skipped, not an error of the open. */
static int ns_remote(void *arg, const kvt_key *seed, const uint8_t *enc, size_t len) {
  ns_union *u = arg;
  for (size_t i = 0; i < u->n; i++)
    if (kvt_key_eq(&u->seen[i], seed)) return 0;
  (void)u->fn(u->arg, seed, enc, len);
  return 0;
}

static int rs_ns_each(void *impl, int (*fn)(void *, const kvt_key *, const uint8_t *, size_t),
                      void *arg) {
  rstore *s = impl;
  ns_union *u = kvt_mem_calloc(s->mem, KVT_MEM_OTHER, sizeof *u);
  if (!u) return -ENOMEM;
  u->fn = fn;
  u->arg = arg;
  int rc = s->local ? kvt_store_ns_each(s->local, ns_local, u) : 0;
  if (!rc) rc = kvt_remote_ns_each(s->r, ns_remote, u);
  kvt_mem_free(s->mem, KVT_MEM_OTHER, u, sizeof *u);
  return rc;
}

static int rs_admit(void *impl, const kvt_key *key, const kvt_key *parent, uint32_t depth,
                    uint32_t ns, uint64_t rec_bytes) {
  rstore *s = impl;
  return s->local ? kvt_store_admit(s->local, key, parent, depth, ns, rec_bytes) : 1;
}

static int rs_post(void *impl, const kvt_store_rec *recs, size_t n, size_t *posted,
                   kvt_store_settled_fn settled, void *arg) {
  rstore *s = impl;
  if (s->rdonly) return KVT_ERDONLY;
  if (!s->local) { /* diskless: settled once written (or given up) remotely */
    *posted = n;
    kvt_remote_post(s->r, recs, n, KVT_REMOTE_WAIT | KVT_REMOTE_IN_PLACE, settled, arg);
    return 0;
  }
  copies_write(s);
  /* The cluster's copy is queued first (best effort: a full queue drops
   * it), copied while the caller still holds the payloads: once the
   * local post is made, its settled call may come at once from the
   * local tier's thread, and the engine count the blocks durable
   * (kvt_sync returns) and unpin their payloads. Queued after it, a copy
   * could read payloads no longer held, and a drain right after kvt_sync
   * could miss it (test_remote_redrop, 1 run in about 5 under load). */
  kvt_remote_post(s->r, recs, n, 0, NULL, NULL);
  return kvt_store_post(s->local, recs, n, posted, settled, arg);
}

/* rs_write's settled: counts the records the cluster stored (writer thread). */
static void count_stored(void *arg, size_t from, size_t to, int rc) {
  if (rc == 0) __atomic_add_fetch((size_t *)arg, to - from, __ATOMIC_RELEASE);
}

static int rs_write(void *impl, const kvt_store_rec *recs, size_t n, size_t *written) {
  rstore *s = impl;
  if (s->local) {
    int rc = kvt_store_write(s->local, recs, n, written);
    kvt_remote_post(s->r, recs, n, 0, NULL, NULL);
    return rc;
  }
  size_t posted, ok = 0;
  int rc = rs_post(impl, recs, n, &posted, count_stored, &ok);
  kvt_remote_drain(s->r);
  ok = __atomic_load_n(&ok, __ATOMIC_ACQUIRE);
  if (written) *written = rc ? 0 : ok;
  return rc ? rc : ok == n ? 0 : -EIO;
}

static void rs_wait_stage(void *impl) {
  rstore *s = impl;
  if (s->local) kvt_store_wait_stage(s->local);
}

static int64_t rs_evict_for(void *impl, uint64_t need) {
  rstore *s = impl;
  return s->local ? kvt_store_evict_for(s->local, need) : 0;
}

static int rs_drain(void *impl) {
  rstore *s = impl;
  if (!s->local) {
    kvt_remote_drain(s->r);
    return 0;
  }
  if (!s->rdonly) copies_write(s);
  return kvt_store_drain(s->local);
}

/* The engine asks find as a block enters its index (kvt_seq_append, under
 * the engine lock): stored means durable, loaded rather than put. The
 * cluster is not asked: a round trip per appended block, queued on a
 * node behind the writer's SETs, was most of the time of a put of new
 * blocks, and a new block asked about is not there. A block a lookup
 * (prefix) of this process just found in the cluster is answered from
 * what that lookup learned (the lookup-then-append of a reused prefix);
 * any other is not stored as far as the engine is concerned: it is put
 * and written again, and its SET NX finds it there (write_exists). */
static int rs_find(void *impl, const kvt_key *key) {
  rstore *s = impl;
  if (s->local && kvt_store_find(s->local, key) == 0) return 0;
  return kvt_known_take(&s->known, key, kvt_hist_now_ns()) ? 0 : KVT_ENOTFOUND;
}

static size_t rs_prefix(void *impl, const kvt_key *keys, size_t n) {
  rstore *s = impl;
  size_t c = s->local ? kvt_store_prefix(s->local, keys, n) : 0;
  if (c == n) return c;
  /* Read before asking: an answer that crossed a removal (a forget came
   * meanwhile) is not remembered. */
  uint64_t gen = kvt_known_gen(&s->known);
  size_t r = kvt_remote_prefix(s->r, keys + c, n - c);
  kvt_known_add(&s->known, keys + c, r, gen, kvt_hist_now_ns());
  return c + r;
}

static int rs_read_layer(void *impl, const kvt_key *key, uint32_t layer, void *k_out,
                         void *v_out, size_t each) {
  rstore *s = impl;
  int rc = s->local ? kvt_store_read_layer(s->local, key, layer, k_out, v_out, each)
                    : KVT_ENOTFOUND;
  if (rc == 0) return 0;
  int rrc = kvt_remote_read_layer(s->r, key, layer, k_out, v_out, each);
  if (rrc) {
    kvt_known_forget(&s->known, key, 1); /* gone, or bad and deleted */
    return rc == KVT_ECORRUPT ? rc : KVT_ENOTFOUND;
  }
  copy_queue(s, key);
  return 0;
}

/* A read batch: the requests the local tier has go to its batch (copies,
 * statuses copied back at wait); the others were read from the cluster
 * at submit, synchronously (one GET per block, within the deadline).
 * Waiting touches no store: it may come after the store closed. */
typedef struct rbatch {
  kvt_store_batch base;  /* first: the engine waits through it */
  kvt_store_batch *local;
  kvt_store_read *orig, *sub;
  size_t *idx, n_sub, n;
  kvt_mem *mem;
} rbatch;

static void rb_wait(kvt_store_batch *b) {
  rbatch *rb = (rbatch *)b;
  kvt_store_read_wait(rb->local);
  for (size_t i = 0; i < rb->n_sub; i++) rb->orig[rb->idx[i]].status = rb->sub[i].status;
  kvt_mem_free(rb->mem, KVT_MEM_OTHER, rb->sub, rb->n * (sizeof *rb->sub + sizeof(size_t)));
  kvt_mem_free(rb->mem, KVT_MEM_OTHER, rb, sizeof *rb);
}

static int rb_done(kvt_store_batch *b) { return kvt_store_read_done(((rbatch *)b)->local); }

/* The requests of a batch the cluster serves: status LOAD_REMOTE until
 * then. One GET per block, pipelined (kvt_remote_get_many). */
#define LOAD_REMOTE 1

typedef struct remote_reads {
  rstore *s;
  kvt_store_read *reqs;
  size_t n;
} remote_reads;

/* A block came: decode every request of it; queue it for the local tier. */
static void remote_got(void *arg, const kvt_key *key, const uint8_t *v, size_t len,
                       const kvt_cold_entry *e, const kvt_cold_slice *sl) {
  remote_reads *rr = arg;
  for (size_t i = 0; i < rr->n; i++) {
    kvt_store_read *q = &rr->reqs[i];
    if (q->status == LOAD_REMOTE && kvt_key_eq(&q->key, key))
      q->status = kvt_remote_decode(rr->s->mem, v, e, sl, q->layer, q->k_out, q->v_out, q->bytes_each)
                      ? KVT_ENOTFOUND : 0;
  }
  rstore *s = rr->s;
  if (!s->local || s->rdonly || kvt_store_find(s->local, key) == 0) return;
  copy c = {.key = *key, .len = len, .val = kvt_mem_alloc(s->mem, KVT_MEM_OTHER, len)};
  if (!c.val) return;
  memcpy(c.val, v, len);
  copy_add(s, &c);
}

static void rs_read_remote(rstore *s, kvt_store_read *reqs, size_t n) {
  kvt_key *keys = kvt_mem_alloc(s->mem, KVT_MEM_OTHER, n * sizeof *keys);
  size_t m = 0;
  for (size_t i = 0; keys && i < n; i++) {
    if (reqs[i].status != LOAD_REMOTE) continue;
    size_t j = 0;
    while (j < m && !kvt_key_eq(&keys[j], &reqs[i].key)) j++;
    if (j == m) keys[m++] = reqs[i].key;
  }
  remote_reads rr = {s, reqs, n};
  if (m) kvt_remote_get_many(s->r, keys, m, remote_got, &rr);
  kvt_mem_free(s->mem, KVT_MEM_OTHER, keys, n * sizeof *keys);
  for (size_t i = 0; i < n; i++)
    if (reqs[i].status == LOAD_REMOTE) {
      reqs[i].status = KVT_ENOTFOUND;
      kvt_known_forget(&s->known, &reqs[i].key, 1); /* gone, or bad and deleted */
    }
}

static int rs_read_submit(void *impl, kvt_store_read *reqs, size_t n, kvt_store_batch **out) {
  rstore *s = impl;
  size_t sub_sz = n * (sizeof(kvt_store_read) + sizeof(size_t));
  rbatch *rb = kvt_mem_calloc(s->mem, KVT_MEM_OTHER, sizeof *rb);
  kvt_store_read *sub = s->local ? kvt_mem_alloc(s->mem, KVT_MEM_OTHER, sub_sz) : NULL;
  if (!rb || (s->local && n && !sub)) {
    kvt_mem_free(s->mem, KVT_MEM_OTHER, rb, sizeof *rb);
    kvt_mem_free(s->mem, KVT_MEM_OTHER, sub, sub_sz);
    return -ENOMEM;
  }
  *rb = (rbatch){.base = {rb_wait, rb_done}, .orig = reqs, .sub = sub,
                 .idx = sub ? (size_t *)(sub + n) : NULL, .n = sub ? n : 0, .mem = s->mem};
  for (size_t i = 0; i < n; i++) {
    kvt_store_read *q = &reqs[i];
    if (s->local && kvt_store_find(s->local, &q->key) == 0) {
      q->status = 0; /* the local batch's, copied back at wait */
      rb->sub[rb->n_sub] = *q;
      rb->idx[rb->n_sub++] = i;
      continue;
    }
    q->status = LOAD_REMOTE;
  }
  rs_read_remote(s, reqs, n);
  if (rb->n_sub && kvt_store_read_submit(s->local, rb->sub, rb->n_sub, &rb->local)) {
    for (size_t i = 0; i < rb->n_sub; i++) /* could not batch: one by one now */
      rb->sub[i].status = rs_read_layer(impl, &rb->sub[i].key, rb->sub[i].layer,
                                        rb->sub[i].k_out, rb->sub[i].v_out, rb->sub[i].bytes_each);
  }
  if (!rb->local && s->hooks.read_notify) s->hooks.read_notify(s->hooks.arg);
  *out = &rb->base;
  return 0;
}

static int rs_remove(void *impl, const kvt_key *key) {
  rstore *s = impl;
  int rc = s->local ? kvt_store_remove(s->local, key) : KVT_ENOTFOUND;
  kvt_known_forget(&s->known, key, 1);
  int rrc = s->rdonly ? KVT_ENOTFOUND : kvt_remote_remove(s->r, key);
  kvt_known_forget(&s->known, key, 1); /* and a lookup that ran meanwhile */
  if (rc != 0 && rc != KVT_ENOTFOUND) return rc; /* a local failure is not hidden by the cluster's */
  return rc == 0 || rrc == 0 ? 0 : rc;
}

/* Keys a drop removes, gathered for the cluster. */
typedef struct keyvec {
  kvt_mem *mem;
  kvt_key *k;
  size_t n, cap;
  int oom;
} keyvec;

static void keys_add(void *arg, const kvt_key *keys, size_t n) {
  keyvec *v = arg;
  if (v->n + n > v->cap) {
    size_t cap = (v->n + n) * 2;
    kvt_key *k = kvt_mem_alloc(v->mem, KVT_MEM_OTHER, cap * sizeof *k);
    if (!k) {
      v->oom = 1;
      return;
    }
    if (v->n) memcpy(k, v->k, v->n * sizeof *k);
    kvt_mem_free(v->mem, KVT_MEM_OTHER, v->k, v->cap * sizeof *k);
    v->k = k;
    v->cap = cap;
  }
  memcpy(v->k + v->n, keys, n * sizeof *keys);
  v->n += n;
}

/* A prefix drop (root set) removes from the cluster what it removes
 * locally - root and every block the local tier has that extends it -
 * with pipelined DELs. (The cluster cannot say which blocks extend root:
 * a diskless engine names the ones it knows through drop_also.) A
 * namespace drop (root NULL) stays local: other processes share it. */
static int rs_drop(void *impl, const kvt_key *seed, const kvt_key *root, uint32_t root_pos,
                   uint64_t *dropped) {
  rstore *s = impl;
  if (!root || s->rdonly) return s->local ? kvt_store_drop(s->local, seed, root, root_pos, dropped) : 0;
  keyvec v = {.mem = s->mem};
  keys_add(&v, root, 1);
  int rc = s->local ? kvt_store_drop_each(s->local, seed, root, root_pos, dropped, keys_add, &v) : 0;
  if (v.k) kvt_known_forget(&s->known, v.k, v.n);
  uint64_t gone = v.n ? kvt_remote_remove_many(s->r, v.k, v.n) : 0;
  if (v.k) kvt_known_forget(&s->known, v.k, v.n); /* and a lookup that ran meanwhile */
  if (!s->local && dropped) *dropped += gone;
  kvt_mem_free(s->mem, KVT_MEM_OTHER, v.k, v.cap * sizeof *v.k);
  return rc;
}

static uint64_t rs_drop_also(void *impl, const kvt_key *keys, size_t n) {
  rstore *s = impl;
  if (s->local || s->rdonly) return 0; /* the local drop names them (drop_each) */
  kvt_known_forget(&s->known, keys, n);
  uint64_t gone = kvt_remote_remove_many(s->r, keys, n);
  kvt_known_forget(&s->known, keys, n); /* and a lookup that ran meanwhile */
  return gone;
}

static void rs_stats(void *impl, kvt_store_stats *st) {
  rstore *s = impl;
  if (s->local) kvt_store_stats_get(s->local, st);
  else memset(st, 0, sizeof *st);
  size_t n = strlen(st->backend);
  snprintf(st->backend + n, sizeof st->backend - n, "%sremote", n ? "+" : "");
}

static void rs_hists(void *impl, struct kvt_hist *read, struct kvt_hist *commit) {
  rstore *s = impl;
  if (s->local) kvt_store_hists(s->local, read, commit);
}

static int rs_verify(void *impl, int repair, uint64_t *checked, uint64_t *bad,
                     void (*report)(void *, const kvt_key *, const char *), void *arg) {
  rstore *s = impl;
  if (!s->local) return KVT_ENOTFOUND;
  return kvt_store_verify(s->local, repair, checked, bad, report, arg);
}

/* The owner's state stays local: it is one node's, not the cluster's. */
static size_t rs_state_get(void *impl, const char *name, uint8_t *out, size_t cap) {
  rstore *s = impl;
  return kvt_store_state_get(s->local, name, out, cap);
}

static int rs_state_put(void *impl, const char *name, const uint8_t *buf, size_t len) {
  rstore *s = impl;
  return kvt_store_state_put(s->local, name, buf, len);
}

static const kvt_store_methods remote_methods = {
    .name = "remote", .caps = KVT_STORE_PAYLOAD, .close = rs_close,
    .set_hooks = rs_set_hooks, .record_max = rs_record_max, .ns_put = rs_ns_put,
    .ns_each = rs_ns_each, .admit = rs_admit, .write = rs_write, .post = rs_post,
    .wait_stage = rs_wait_stage, .evict_for = rs_evict_for, .drain = rs_drain,
    .find = rs_find, .prefix = rs_prefix, .read_layer = rs_read_layer,
    .read_submit = rs_read_submit, .remove = rs_remove, .drop = rs_drop,
    .stats = rs_stats, .hists = rs_hists, .verify = rs_verify, .drop_also = rs_drop_also,
    .state_get = rs_state_get, .state_put = rs_state_put};

static int rs_wants(const kvt_store_config *cfg) { return cfg->remote_url != NULL; }

static int rs_open(kvt_mem *m, const kvt_store_config *cfg, void **impl) {
  *impl = NULL;
  if (cfg->meta_only) return KVT_EOPTION; /* a metadata-only engine keeps no bytes to share */
  rstore *s = kvt_mem_calloc(m, KVT_MEM_OTHER, sizeof *s);
  if (!s) return -ENOMEM;
  *s = (rstore){.mem = m, .rdonly = cfg->rdonly};
  pthread_mutex_init(&s->cp_lock, NULL);
  int krc = kvt_known_open(&s->known, m);
  kvt_store_config lc = *cfg;
  lc.remote_url = NULL;
  int rc = krc ? krc : kvt_store_open(m, &lc, &s->local); /* the local tier, or none */
  if (!rc && s->local && (kvt_store_caps(s->local) & KVT_STORE_INLINE)) rc = KVT_EOPTION;
  kvt_remote_cfg rcfg = {.url = cfg->remote_url, .password = cfg->remote_password,
                         .deadline_ms = cfg->remote_deadline_ms,
                         .queue_bytes = cfg->remote_queue_bytes, .rdonly = cfg->rdonly};
  if (!rc) rc = kvt_remote_open(m, &rcfg, &s->r, cfg->remote_err, cfg->remote_err_len);
  if (rc) {
    kvt_store_close(s->local);
    kvt_known_close(&s->known);
    pthread_mutex_destroy(&s->cp_lock);
    kvt_mem_free(m, KVT_MEM_OTHER, s, sizeof *s);
    return rc;
  }
  *impl = s;
  return 0;
}

const kvt_store_impl kvt_store_remote = {&remote_methods, rs_wants, rs_open};

int kvt_store_remote_counts(kvt_store *st, kvt_remote_counts *c, kvt_rc_stats *rc) {
  if (!st || st->m != &remote_methods) return KVT_ENOTFOUND;
  rstore *s = st->impl;
  kvt_remote_counts_get(s->r, c, rc);
  c->local_copies = __atomic_load_n(&s->copies, __ATOMIC_RELAXED);
  return 0;
}

kvt_remote *kvt_store_remote_of(kvt_store *st) {
  return st && st->m == &remote_methods ? ((rstore *)st->impl)->r : NULL;
}
