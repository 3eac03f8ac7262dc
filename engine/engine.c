/* engine.c - the engine: options, open/close, stats, shapes and values.
 * Namespaces are in engine_ns.c, the token-block index in engine_index.c,
 * placement (ref/pin/demote/make room) in engine_place.c, prefix lookup
 * and drops in engine_lookup.c; sequences, reads and loads in seq.c.
 * Invariants and the lock order are in internal.h and docs/concurrency.md. */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "engine/internal.h"
#include "codec/codec.h"
#include "engine/options_tier.h"

/* ---------- options ---------- */

void kvt_options_init(kvt_options *opt) {
  if (!opt) return;
  *opt = (kvt_options){0};
  opt->tier_bytes_limit[KVT_TIER_HOT] = 1ull << 30;
  opt->max_seqs = 4096;
  opt->max_namespaces = 256;
  opt->max_seq_blocks = 1u << 20;
  opt->max_load_reqs = 65536;
  opt->cold_segment_bytes = 64ull << 20;
  opt->cold_group_bytes = 16ull << 20;
  opt->cold_index_bytes = 0; /* from the cold limit: kvt_cold_map_bytes() */
  opt->cold_admit_min_seen = 1;
  opt->cold_compress = 0; /* measured: saves 4-6% under load, reads slower (bench cold) */
  opt->io_backend = KVT_BACKEND_AUTO;
  opt->io_depth = 64;
  /* Learned: what kvtier plan replays by default, so its figures are what
   * the engine does (docs/capacity-planning.md); CHAIN and LRU stay
   * selectable. */
  opt->cold_evict = KVT_EVICT_LEARNED;
  opt->hot_evict = KVT_EVICT_LEARNED; /* the same order for the hot tier's idle blocks */
  /* Estimates for kvt_lookup(), from MEASURED.md: memcpy ~5 GB/s, warm
   * decode ~2 GB/s, cold O_DIRECT reads ~1 GB/s plus ~80 us latency. */
  const double gbps[KVT_N_TIERS] = {0, 5.0, 2.0, 1.0};
  const double lat[KVT_N_TIERS] = {0, 0.2, 1.0, 80.0};
  for (int i = 0; i < KVT_N_TIERS; i++) {
    opt->tier_load_gbps[i] = gbps[i];
    opt->tier_load_latency_us[i] = lat[i];
  }
}

#define KVT_OPEN_ALL (KVT_OPEN_RDONLY | KVT_OPEN_VERIFY_DEDUP | KVT_OPEN_METADATA_ONLY | \
                      KVT_OPEN_NOCREATE)

/* The detail of a refused option: its name, the rule, the value given. */
#define OPT_BAD(field, expected, ...) \
  kvt_err_fill(info, KVT_EOPTION, "kvt_engine_open", (field), (expected), __VA_ARGS__)

static int options_check(const kvt_options *o, kvt_error_info *info) {
  if (o->flags & ~KVT_OPEN_ALL) return OPT_BAD("flags", "only KVT_OPEN_* bits", "0x%x", o->flags);
  if (o->max_seqs == 0 || o->max_seqs > (1u << 24))
    return OPT_BAD("max_seqs", "1..16777216", "%u", o->max_seqs);
  if (o->max_namespaces == 0 || o->max_namespaces > (1u << 16))
    return OPT_BAD("max_namespaces", "1..65536", "%u", o->max_namespaces);
  if (o->max_seq_blocks == 0 || o->max_seq_blocks > (1u << 28))
    return OPT_BAD("max_seq_blocks", "1..268435456", "%u", o->max_seq_blocks);
  if (o->max_load_reqs == 0 || o->max_load_reqs > (1u << 24))
    return OPT_BAD("max_load_reqs", "1..16777216", "%u", o->max_load_reqs);
  /* Each tier's options by its id, under the rules kvt_options_tier_set()
   * applies (a later tier's come the same way). */
  for (uint32_t t = KVT_TIER_HOT; t <= KVT_TIER_COLD; t++) {
    kvt_tier_options to;
    int rc = kvt_options_tier_get(o, t, &to, sizeof to);
    if (!rc) rc = kvt_tier_options_check(t, &to, info, "kvt_engine_open");
    if (rc) return rc;
  }
  if (o->tier_bytes_limit[KVT_TIER_NONE] != 0)
    return OPT_BAD("tier_bytes_limit[KVT_TIER_NONE]", "0", "%llu",
                   (unsigned long long)o->tier_bytes_limit[KVT_TIER_NONE]);
  if (o->io_backend > KVT_BACKEND_PREAD)
    return OPT_BAD("io_backend", "a KVT_BACKEND_* (0..2)", "%u", o->io_backend);
  if (o->io_depth == 0 || o->io_depth > 4096)
    return OPT_BAD("io_depth", "1..4096", "%u", o->io_depth);
  if (o->cold_compress > 1) return OPT_BAD("cold_compress", "0 or 1", "%u", o->cold_compress);
  if (o->cold_group_bytes == 0) return OPT_BAD("cold_group_bytes", "> 0", "0");
  if (o->cold_admit > KVT_ADMIT_PROMPT)
    return OPT_BAD("cold_admit", "KVT_ADMIT_ALL or KVT_ADMIT_PROMPT", "%u", o->cold_admit);
  if (o->cold_evict > KVT_EVICT_LEARNED)
    return OPT_BAD("cold_evict", "a KVT_EVICT_*", "%u", o->cold_evict);
  if (o->hot_evict > KVT_EVICT_LEARNED)
    return OPT_BAD("hot_evict", "a KVT_EVICT_*", "%u", o->hot_evict);
  /* a metadata-only cold tier has no segments or index map */
  if (o->tier_bytes_limit[KVT_TIER_COLD] && !(o->flags & KVT_OPEN_METADATA_ONLY)) {
    if (o->cold_segment_bytes < (1u << 20) || o->cold_segment_bytes % 4096)
      return OPT_BAD("cold_segment_bytes", ">= 1 MiB and a multiple of 4096", "%llu",
                     (unsigned long long)o->cold_segment_bytes);
    if (o->tier_bytes_limit[KVT_TIER_COLD] / 2 < o->cold_segment_bytes)
      return OPT_BAD("tier_bytes_limit[KVT_TIER_COLD]",
                     "at least two segments (2 * cold_segment_bytes)", "%llu",
                     (unsigned long long)o->tier_bytes_limit[KVT_TIER_COLD]);
    if (o->cold_index_bytes && o->cold_index_bytes < (1u << 20))
      return OPT_BAD("cold_index_bytes", "0 (sized from the cold limit) or >= 1 MiB", "%llu",
                     (unsigned long long)o->cold_index_bytes);
  }
  if (o->test_fault.kind > 5) return OPT_BAD("test_fault.kind", "0..5", "%u", o->test_fault.kind);
  return 0;
}


/* ---------- open / close ---------- */

/* A writer opened without a cold limit on a store that has a cold tier
 * would show an empty cache over the stored blocks: refused instead.
 * The store records no byte limit (only its segment size), so the caller
 * must say how much disk the tier may use. */
static int cold_limit_check(const kvt_engine *e, const char *dir, kvt_error_info *info) {
  if (!dir || kvt_rdonly(e) || kvt_meta_only(e) || e->opt.tier_bytes_limit[KVT_TIER_COLD] > 0)
    return 0;
  if (!kvt_store_has_index(dir)) return 0;
  return kvt_err_fill(info, KVT_EOPTION, "kvt_engine_open", "tier_bytes_limit[KVT_TIER_COLD]",
                      "> 0 (the store has a cold tier; or open it with KVT_OPEN_RDONLY)", "0");
}

/* The detail of a failure to open the store directory. */
static int dir_error(const char *dir, int rc, kvt_error_info *info) {
  if (rc != KVT_ELOCKED)
    return kvt_err_fill(info, rc, "kvt_engine_open", "dir", NULL, "%s (%s)", dir, kvt_strerror(rc));
  int pid;
  if (kvt_store_lock_holder(dir, &pid))
    return kvt_err_fill(info, rc, "kvt_engine_open", "dir", "no reader holding the store shared",
                        "held shared by a read-only open of %s (one without write access to "
                        "its index lock file keeps writers out while it runs)", dir);
  if (pid == (int)getpid())
    return kvt_err_fill(info, rc, "kvt_engine_open", "LOCK",
                        "no other writer (close the other engine first)",
                        "held by this process: another kvt_engine has %s open for writing", dir);
  if (pid > 0)
    return kvt_err_fill(info, rc, "kvt_engine_open", "LOCK", "no other writer",
                        "held by process %d, which has %s open for writing", pid, dir);
  return kvt_err_fill(info, rc, "kvt_engine_open", "LOCK", "no other writer",
                      "held by another writer of %s", dir);
}

/* The durable tier below RAM that the options and the directory call for
 * (tiers/store.c picks the implementation), or none. */
static int store_open(kvt_engine *e, const char *dir, const kvt_remote_options *ro,
                      kvt_error_info *info) {
  const kvt_options *o = &e->opt;
  kvt_store_config c = {.dir = dir, .rdonly = kvt_rdonly(e), .meta_only = kvt_meta_only(e),
                        .nocreate = (o->flags & KVT_OPEN_NOCREATE) != 0,
                        .bytes_limit = o->tier_bytes_limit[KVT_TIER_COLD],
                        .segment_bytes = o->cold_segment_bytes,
                        .map_bytes = o->cold_index_bytes, .group_bytes = o->cold_group_bytes,
                        .compress = (int)o->cold_compress, .zstd_level = 1,
                        .evict_policy = (int)o->cold_evict, .io_backend = o->io_backend,
                        .io_depth = o->io_depth};
  c.fault.ops = o->test_fault.ops;
  c.fault.kind = o->test_fault.kind;
  c.fault.after = o->test_fault.after;
  c.fault.count = o->test_fault.count;
  c.fault.seed = o->test_fault.seed;
  char why[256] = "";
  if (ro && ro->url) { /* the remote tier (tiers/store_remote.c) */
    c.remote_url = ro->url;
    c.remote_password = ro->password;
    c.remote_deadline_ms = ro->deadline_ms;
    c.remote_queue_bytes = ro->queue_bytes;
    c.remote_err = why;
    c.remote_err_len = sizeof why;
  }
  int rc = kvt_store_open(&e->mem, &c, &e->store);
  if (rc && why[0]) kvt_err_fill(info, rc, "kvt_engine_open", "remote url", NULL, "%s", why);
  if (!rc) kvt_hot_order_restore(e); /* the hot tier's model, kept in the store */
  return rc;
}

int kvt_engine_open(const char *dir, const kvt_options *opt, kvt_engine **out) {
  return kvt_engine_open_info(dir, opt, out, NULL);
}

static int engine_open(const char *dir, const kvt_options *opt, const kvt_remote_options *ro,
                       kvt_engine **out, kvt_error_info *info);

int kvt_engine_open_info(const char *dir, const kvt_options *opt, kvt_engine **out,
                         kvt_error_info *info) {
  return engine_open(dir, opt, NULL, out, info);
}

int kvt_engine_open_remote(const char *dir, const kvt_options *opt, const kvt_remote_options *ro,
                           kvt_engine **out, kvt_error_info *info) {
  if (info) memset(info, 0, sizeof *info);
  /* The first version's size is the least a caller may pass; fields a
   * newer caller appends are ignored, fields an older one lacks read 0. */
  const size_t v1 = offsetof(kvt_remote_options, queue_bytes) + sizeof ro->queue_bytes;
  if (ro && ro->size < v1)
    return kvt_err_fill(info, KVT_EOPTION, "kvt_engine_open_remote", "ro->size",
                        ">= the first kvt_remote_options' size", "%u", ro->size);
  kvt_remote_options r;
  memset(&r, 0, sizeof r);
  if (ro) memcpy(&r, ro, ro->size < sizeof r ? ro->size : sizeof r);
  r.size = sizeof r;
  if (ro && r.url && opt && (opt->flags & KVT_OPEN_METADATA_ONLY))
    return kvt_err_fill(info, KVT_EOPTION, "kvt_engine_open_remote", "ro->url",
                        "none with KVT_OPEN_METADATA_ONLY (no bytes to share)", "a URL");
  return engine_open(dir, opt, ro ? &r : NULL, out, info);
}

static int engine_open(const char *dir, const kvt_options *opt, const kvt_remote_options *ro,
                       kvt_engine **out, kvt_error_info *info) {
  if (info) memset(info, 0, sizeof *info);
  if (!out) return kvt_err_fill(info, KVT_ENULL, "kvt_engine_open", "out", "not NULL", "NULL");
  *out = NULL;
  kvt_options o;
  if (opt) o = *opt;
  else kvt_options_init(&o);
  if (!dir && !(o.flags & KVT_OPEN_METADATA_ONLY))
    return kvt_err_fill(info, KVT_ENULL, "kvt_engine_open", "dir",
                        "a directory (NULL only with KVT_OPEN_METADATA_ONLY)", "NULL");
  int rc = options_check(&o, info);
  if (rc) return rc;

  kvt_mem mem;
  kvt_mem_init(&mem, o.test_fail_alloc_after);
  kvt_engine *e = kvt_mem_calloc(&mem, KVT_MEM_OTHER, sizeof *e);
  if (!e) return kvt_err_fill(info, -ENOMEM, "kvt_engine_open", "memory", NULL, "%s",
                              kvt_strerror(-ENOMEM));
  e->opt = o;
  e->mem = mem; /* counters copied: the engine allocation itself is counted */
  pthread_mutex_init(&e->mem.pool_lock, NULL); /* a copied mutex is not a mutex */
  kvt_mem_pool_cap(&e->mem, o.tier_bytes_limit[KVT_TIER_HOT] / 8 < (64u << 20)
                                ? o.tier_bytes_limit[KVT_TIER_HOT] / 8 : (64u << 20));
  e->lock_fd = -1;
  e->event_fd = -1;
  kvt_err_table_init(&e->err);
  e->seqs.next = e->seqs.prev = &e->seqs;
  e->loads.next = e->loads.prev = &e->loads;
  static const char *const names[KVT_N_TIERS] = {"none", "hot", "warm", "cold"};
  for (int t = 0; t < KVT_N_TIERS; t++)
    kvt_tier_init(&e->tier[t], t, names[t], t == KVT_TIER_WARM ? KVT_MEM_WARM : KVT_MEM_HOT,
                  o.tier_bytes_limit[t]);
  e->n_buckets = 1024;
  e->buckets = kvt_mem_calloc(&e->mem, KVT_MEM_INDEX, e->n_buckets * sizeof *e->buckets);
  e->ns = kvt_mem_calloc(&e->mem, KVT_MEM_OTHER, o.max_namespaces * sizeof *e->ns);
  e->ns_gen = kvt_mem_calloc(&e->mem, KVT_MEM_OTHER, o.max_namespaces * sizeof *e->ns_gen);
  if (!e->buckets || !e->ns || !e->ns_gen) {
    rc = -ENOMEM;
    goto fail;
  }
  rc = pthread_mutex_init(&e->lock, NULL);
  if (rc) {
    rc = -rc;
    goto fail;
  }
  if (dir) rc = kvt_store_lock(dir, !(o.flags & KVT_OPEN_NOCREATE), kvt_rdonly(e), &e->lock_fd);
  if (rc) dir_error(dir, rc, info);
  if (!rc) rc = cold_limit_check(e, dir, info);
  if (!rc) rc = kvt_hot_order_open(e);
  if (!rc) rc = store_open(e, dir, ro, info);
  if (!rc) rc = kvt_flush_start(e);
  if (!rc && e->store) rc = kvt_ns_load(e);
  if (rc && info && !info->code)
    kvt_err_fill(info, rc, "kvt_engine_open", "store", NULL, "%s (%s)",
                 dir ? dir : "(metadata-only)", kvt_strerror(rc));
  if (rc) {
    pthread_mutex_lock(&e->lock);
    kvt_flush_stop(e);
    for (uint32_t i = 0; i < e->n_ns; i++)
      if (e->ns[i]) kvt_nsrec_free(e, e->ns[i]);
    kvt_hot_order_close(e);
    pthread_mutex_unlock(&e->lock);
    kvt_store_unlock(e->lock_fd);
    pthread_mutex_destroy(&e->lock);
    goto fail;
  }
  *out = e;
  return 0;
fail:
  if (rc == -ENOMEM && info && !info->code)
    kvt_err_fill(info, rc, "kvt_engine_open", "memory", NULL, "%s", kvt_strerror(rc));
  kvt_err_table_fini(&e->err);
  kvt_mem_free(&e->mem, KVT_MEM_INDEX, e->buckets, e->n_buckets * sizeof *e->buckets);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, e->ns, o.max_namespaces * sizeof *e->ns);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, e->ns_gen, o.max_namespaces * sizeof *e->ns_gen);
  kvt_mem_fini(&e->mem);
  free(e);
  return rc;
}

void kvt_nsrec_free(kvt_engine *e, kvt_nsrec *ns) {
  kvt_profile_free(ns->profile);
  kvt_predictor_free(ns->pred);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, ns->k_codec, 2 * (size_t)ns->desc.shape.n_layers);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, ns->strs, ns->strs_len);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, ns, sizeof *ns);
}

void kvt_engine_close(kvt_engine *e) {
  if (!e) return;
  kvt_hot_order_checkpoint(e, KVT_CKPT_WAIT); /* while the store is open */
  pthread_mutex_lock(&e->lock);
  kvt_flush_stop(e); /* drains the flush queue first, closes the store */
  while (e->loads.next != &e->loads) kvt_load_free_locked(e->loads.next);
  while (e->seqs.next != &e->seqs) kvt_seq_free_locked(e->seqs.next);
  for (size_t i = 0; i < e->n_buckets; i++)
    while (e->buckets[i]) kvt_drop_tblk(e, e->buckets[i]);
  kvt_hot_order_close(e); /* no token block is indexed now */
  for (uint32_t i = 0; i < e->n_ns; i++)
    if (e->ns[i]) kvt_nsrec_free(e, e->ns[i]);
  assert(e->n_tblks == 0 && e->tier[KVT_TIER_HOT].bytes_used == 0);
  pthread_mutex_unlock(&e->lock);
  pthread_mutex_destroy(&e->lock);
  kvt_store_unlock(e->lock_fd);
  kvt_event_close(e); /* after the store's readers stopped */
  kvt_err_table_fini(&e->err);
  kvt_mem_free(&e->mem, KVT_MEM_INDEX, e->buckets, e->n_buckets * sizeof *e->buckets);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, e->ns, e->opt.max_namespaces * sizeof *e->ns);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, e->ns_gen, e->opt.max_namespaces * sizeof *e->ns_gen);
  kvt_mem_fini(&e->mem);
  free(e); /* holds the accounting itself: the one allocation it cannot count */
}

int kvt_stats_get(kvt_engine *e, kvt_stats *st) {
  if (!e || !st) return KVT_ENULL;
  pthread_mutex_lock(&e->lock);
  *st = e->st;
  for (int t = 0; t < KVT_N_TIERS; t++) {
    st->tier_blocks[t] = e->tier[t].blocks;
    st->tier_bytes[t] = e->tier[t].bytes_used;
    st->tier_limit[t] = e->tier[t].bytes_limit;
    st->evictions[t] = e->tier[t].evictions;
  }
  st->index_bytes = kvt_mem_bytes(&e->mem, KVT_MEM_INDEX);
  st->seq_bytes = kvt_mem_bytes(&e->mem, KVT_MEM_SEQ);
  st->other_bytes = kvt_mem_bytes(&e->mem, KVT_MEM_OTHER);
  st->total_bytes = kvt_mem_total(&e->mem);
  st->token_blocks = e->n_tblks;
  kvt_store *store = e->store; /* closed only by kvt_engine_close */
  kvt_store_stats cs;
  pthread_mutex_unlock(&e->lock);
  if (store) kvt_store_stats_get(store, &cs);
  if (store) {
    st->cold_records = cs.records;
    st->cold_reads = cs.reads;
    st->cold_read_bytes = cs.read_bytes;
    st->cold_write_bytes = cs.bytes_written;
    st->cold_checksum_failures = cs.checksum_failures;
    st->cold_write_failures = cs.write_failures;
    st->cold_segments = cs.segments;
    st->cold_segment_bytes = cs.segment_bytes;
    st->tier_bytes[KVT_TIER_COLD] = cs.live_bytes;
    st->tier_blocks[KVT_TIER_COLD] = cs.records;
    st->tier_limit[KVT_TIER_COLD] = cs.bytes_limit;
    st->evictions[KVT_TIER_COLD] = cs.evictions;
    st->cold_reclaims = cs.reclaims;
    st->cold_relocated = cs.relocated;
    snprintf(st->io_backend, sizeof st->io_backend, "%s", cs.backend);
    snprintf(st->io_why, sizeof st->io_why, "%s", cs.why);
  }
  return 0;
}

/* ---------- shapes and values ---------- */

uint64_t kvt_cold_record_bytes(const kvt_shape *s) {
  if (!s || kvt_shape_check(s)) return 0;
  return kvt_store_record_bytes(s->n_layers, (uint32_t)kvt_shape_block_bytes(s));
}

int kvt_shape_check(const kvt_shape *s) { return kvt_shape_check_info(s, NULL, NULL); }

#define SHAPE_BAD(code, field, expected, ...) \
  kvt_err_fill(info, (code), call, (field), (expected), __VA_ARGS__)

int kvt_shape_check_info(const kvt_shape *s, kvt_error_info *info, const char *call) {
  if (kvt_dtype_size(s->dtype) == 0)
    return SHAPE_BAD(KVT_EDTYPE, "shape.dtype", "KVT_F32 (1), KVT_F16 (2) or KVT_BF16 (3)", "%u",
                     s->dtype);
  if (s->n_layers == 0 || s->n_layers > KVT_MAX_LAYERS)
    return SHAPE_BAD(KVT_ESHAPE, "shape.n_layers", "1..1024", "%u", s->n_layers);
  if (s->n_kv_heads == 0 || s->n_kv_heads > KVT_MAX_HEADS)
    return SHAPE_BAD(KVT_ESHAPE, "shape.n_kv_heads", "1..1024", "%u", s->n_kv_heads);
  if (s->head_dim == 0 || s->head_dim > KVT_MAX_HEAD_DIM)
    return SHAPE_BAD(KVT_ESHAPE, "shape.head_dim", "1..1024", "%u", s->head_dim);
  uint32_t bt = s->block_tokens;
  if (bt == 0 || bt > KVT_MAX_BLOCK_TOKENS || (bt & (bt - 1)))
    return SHAPE_BAD(KVT_ESHAPE, "shape.block_tokens", "a power of two in 1..4096", "%u", bt);
  if (2 * (uint64_t)kvt_shape_block_bytes(s) > KVT_MAX_BLOCK_BYTES)
    return SHAPE_BAD(KVT_ESHAPE, "shape (K plus V of one layer block)", "at most 256 MiB",
                     "%llu bytes", 2 * (unsigned long long)kvt_shape_block_bytes(s));
  return 0;
}

