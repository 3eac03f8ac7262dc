/* engine.c - the engine: open/close, namespaces, the token-block index,
 * reference counting, hot-tier placement, prefix lookup and drops.
 * Sequences, reads and loads are in seq.c. Invariants and the lock order
 * are in internal.h and docs/concurrency.md. */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec/codec.h"
#include "engine/internal.h"
#include "io/io.h"

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
  static const char *const gbps[KVT_N_TIERS] = {"", "tier_load_gbps[HOT]", "tier_load_gbps[WARM]",
                                                "tier_load_gbps[COLD]"};
  static const char *const lat[KVT_N_TIERS] = {"", "tier_load_latency_us[HOT]",
                                               "tier_load_latency_us[WARM]",
                                               "tier_load_latency_us[COLD]"};
  if (o->flags & ~KVT_OPEN_ALL) return OPT_BAD("flags", "only KVT_OPEN_* bits", "0x%x", o->flags);
  if (o->max_seqs == 0 || o->max_seqs > (1u << 24))
    return OPT_BAD("max_seqs", "1..16777216", "%u", o->max_seqs);
  if (o->max_namespaces == 0 || o->max_namespaces > (1u << 16))
    return OPT_BAD("max_namespaces", "1..65536", "%u", o->max_namespaces);
  if (o->max_seq_blocks == 0 || o->max_seq_blocks > (1u << 28))
    return OPT_BAD("max_seq_blocks", "1..268435456", "%u", o->max_seq_blocks);
  if (o->max_load_reqs == 0 || o->max_load_reqs > (1u << 24))
    return OPT_BAD("max_load_reqs", "1..16777216", "%u", o->max_load_reqs);
  for (int i = 1; i < KVT_N_TIERS; i++) {
    if (!(o->tier_load_gbps[i] > 0) || !isfinite(o->tier_load_gbps[i]))
      return OPT_BAD(gbps[i], "finite and > 0", "%g", o->tier_load_gbps[i]);
    if (!(o->tier_load_latency_us[i] >= 0) || !isfinite(o->tier_load_latency_us[i]))
      return OPT_BAD(lat[i], "finite and >= 0", "%g", o->tier_load_latency_us[i]);
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

static void nsrec_free(kvt_engine *e, kvt_nsrec *ns);

/* ---------- open / close ---------- */

/* A writer has a cold tier when it is given a limit; a reader opens the
 * one the store has, so stat and fsck work beside a live writer. */
static int want_cold(const kvt_engine *e, const char *dir) {
  if (!kvt_rdonly(e)) return e->opt.tier_bytes_limit[KVT_TIER_COLD] > 0;
  char path[4200];
  if (snprintf(path, sizeof path, "%s/index", dir) >= (int)sizeof path) return 0;
  if (kvt_io_exists(path)) return 1;
  snprintf(path, sizeof path, "%s/segments", dir); /* its index lost: say so (KVT_EINDEX) */
  return kvt_io_exists(path);
}

/* A writer opened without a cold limit on a store that has a cold tier
 * would show an empty cache over the stored blocks: refused instead.
 * The store records no byte limit (only its segment size), so the caller
 * must say how much disk the tier may use. */
static int cold_limit_check(const kvt_engine *e, const char *dir, kvt_error_info *info) {
  if (!dir || kvt_rdonly(e) || kvt_meta_only(e) || e->opt.tier_bytes_limit[KVT_TIER_COLD] > 0)
    return 0;
  char path[4200];
  if (snprintf(path, sizeof path, "%s/index", dir) >= (int)sizeof path) return 0;
  if (!kvt_io_exists(path)) return 0;
  return kvt_err_fill(info, KVT_EOPTION, "kvt_engine_open", "tier_bytes_limit[KVT_TIER_COLD]",
                      "> 0 (the store has a cold tier; or open it with KVT_OPEN_RDONLY)", "0");
}

/* The detail of a failure to open the store directory. */
static int dir_error(const char *dir, int rc, kvt_error_info *info) {
  if (rc != KVT_ELOCKED)
    return kvt_err_fill(info, rc, "kvt_engine_open", "dir", NULL, "%s (%s)", dir, kvt_strerror(rc));
  if (kvt_io_dir_readers_only(dir))
    return kvt_err_fill(info, rc, "kvt_engine_open", "dir", "no reader holding the store shared",
                        "held shared by a read-only open of %s (one without write access to "
                        "its index lock file keeps writers out while it runs)", dir);
  int pid = kvt_io_lock_owner(dir);
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

int kvt_engine_open(const char *dir, const kvt_options *opt, kvt_engine **out) {
  return kvt_engine_open_info(dir, opt, out, NULL);
}

int kvt_engine_open_info(const char *dir, const kvt_options *opt, kvt_engine **out,
                         kvt_error_info *info) {
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
  if (dir) rc = kvt_io_dir_open(dir, !(o.flags & KVT_OPEN_NOCREATE), kvt_rdonly(e), &e->lock_fd);
  if (rc) dir_error(dir, rc, info);
  if (!rc) rc = cold_limit_check(e, dir, info);
  if (!rc && kvt_meta_only(e) && o.tier_bytes_limit[KVT_TIER_COLD] > 0) rc = kvt_mcold_start(e);
  else if (!rc && dir && !kvt_meta_only(e) && want_cold(e, dir)) rc = kvt_cold_start(e, dir);
  if (!rc && e->cold) rc = kvt_ns_load(e);
  if (rc && info && !info->code)
    kvt_err_fill(info, rc, "kvt_engine_open", "store", NULL, "%s (%s)",
                 dir ? dir : "(metadata-only)", kvt_strerror(rc));
  if (rc) {
    pthread_mutex_lock(&e->lock);
    if (e->cold) kvt_cold_stop(e);
    kvt_cold_meta_close(e->mcold);
    for (uint32_t i = 0; i < e->n_ns; i++)
      if (e->ns[i]) nsrec_free(e, e->ns[i]);
    pthread_mutex_unlock(&e->lock);
    kvt_io_dir_close(e->lock_fd);
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

static void nsrec_free(kvt_engine *e, kvt_nsrec *ns) {
  kvt_profile_free(ns->profile);
  kvt_predictor_free(ns->pred);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, ns->k_codec, 2 * (size_t)ns->desc.shape.n_layers);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, ns->strs, ns->strs_len);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, ns, sizeof *ns);
}

void kvt_engine_close(kvt_engine *e) {
  if (!e) return;
  pthread_mutex_lock(&e->lock);
  if (e->cold) kvt_cold_stop(e); /* drains the flush queue first */
  while (e->loads.next != &e->loads) kvt_load_free_locked(e->loads.next);
  while (e->seqs.next != &e->seqs) kvt_seq_free_locked(e->seqs.next);
  for (size_t i = 0; i < e->n_buckets; i++)
    while (e->buckets[i]) kvt_drop_tblk(e, e->buckets[i]);
  for (uint32_t i = 0; i < e->n_ns; i++)
    if (e->ns[i]) nsrec_free(e, e->ns[i]);
  kvt_cold_meta_close(e->mcold);
  e->mcold = NULL;
  assert(e->n_tblks == 0 && e->tier[KVT_TIER_HOT].bytes_used == 0);
  pthread_mutex_unlock(&e->lock);
  pthread_mutex_destroy(&e->lock);
  kvt_io_dir_close(e->lock_fd);
  kvt_io_event_close(e->event_fd); /* after the cold tier's readers stopped */
  kvt_err_table_fini(&e->err);
  free(e->buckets);
  free(e->ns);
  free(e->ns_gen);
  kvt_mem_fini(&e->mem);
  free(e);
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
  kvt_cold *cold = e->cold;
  kvt_cold_stats cs;
  if (e->mcold) kvt_cold_meta_stats(e->mcold, &cs);
  pthread_mutex_unlock(&e->lock);
  if (cold) kvt_cold_stats_get(cold, &cs);
  if (cold || e->mcold) {
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
  return kvt_cold_record_max(s->n_layers, (uint32_t)kvt_shape_block_bytes(s));
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

/* ---------- namespaces ---------- */

kvt_nsrec *kvt_ns_find(kvt_engine *e, kvt_ns_id id) {
  uint32_t slot = id & 0xFFFF;
  kvt_nsrec *ns = slot < e->n_ns ? e->ns[slot] : NULL;
  return ns && ns->id == id ? ns : NULL;
}

static int str_ok(const char *s, int required) {
  if (!s) return !required;
  size_t n = strlen(s);
  return (n > 0 || !required) && n <= KVT_MAX_ID_LEN;
}

#define DESC_BAD(field, expected, ...) \
  kvt_err_fill(info, KVT_EOPTION, "kvt_ns_register", (field), (expected), __VA_ARGS__)

static int ns_desc_check(const kvt_ns_desc *d, kvt_error_info *info) {
  if (!d->model_id || !d->weights_fingerprint)
    return kvt_err_fill(info, KVT_ENULL, "kvt_ns_register",
                        d->model_id ? "weights_fingerprint" : "model_id", "not NULL", "NULL");
  if (!str_ok(d->model_id, 1))
    return DESC_BAD("model_id", "1..255 bytes", "%zu bytes", strlen(d->model_id));
  if (!str_ok(d->weights_fingerprint, 1))
    return DESC_BAD("weights_fingerprint", "1..255 bytes", "%zu bytes",
                    strlen(d->weights_fingerprint));
  if (!str_ok(d->rope_scaling, 0))
    return DESC_BAD("rope_scaling", "at most 255 bytes", "%zu bytes", strlen(d->rope_scaling));
  if (d->tp_size == 0) return DESC_BAD("tp_size", ">= 1", "0");
  if (d->tp_rank >= d->tp_size)
    return DESC_BAD("tp_rank", "below tp_size", "%u (tp_size %u)", d->tp_rank, d->tp_size);
  if (!(d->rope_theta >= 0) || !isfinite(d->rope_theta))
    return DESC_BAD("rope_theta", "finite and >= 0", "%g", d->rope_theta);
  if (d->rope_dims > d->shape.head_dim)
    return DESC_BAD("rope_dims", "at most head_dim", "%u (head_dim %u)", d->rope_dims,
                    d->shape.head_dim);
  return kvt_shape_check_info(&d->shape, info, "kvt_ns_register");
}

static int same_identity(const kvt_ns_desc *a, const kvt_ns_desc *b) {
  const char *as = a->rope_scaling ? a->rope_scaling : "";
  const char *bs = b->rope_scaling ? b->rope_scaling : "";
  uint32_t ad = a->rope_dims ? a->rope_dims : a->shape.head_dim;
  uint32_t bd = b->rope_dims ? b->rope_dims : b->shape.head_dim;
  return strcmp(a->model_id, b->model_id) == 0 &&
         strcmp(a->weights_fingerprint, b->weights_fingerprint) == 0 &&
         memcmp(&a->rope_theta, &b->rope_theta, sizeof(double)) == 0 && ad == bd &&
         strcmp(as, bs) == 0 && a->tp_rank == b->tp_rank && a->tp_size == b->tp_size;
}

static kvt_nsrec *nsrec_new(kvt_engine *e, const kvt_ns_desc *d) {
  kvt_nsrec *ns = kvt_mem_calloc(&e->mem, KVT_MEM_OTHER, sizeof *ns);
  if (!ns) return NULL;
  const char *src[3] = {d->model_id, d->weights_fingerprint, d->rope_scaling ? d->rope_scaling : ""};
  size_t len[3], total = 0;
  for (int i = 0; i < 3; i++) total += (len[i] = strlen(src[i])) + 1;
  uint32_t L = d->shape.n_layers;
  ns->strs = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, total);
  ns->k_codec = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, 2 * (size_t)L);
  if (!ns->strs || !ns->k_codec) {
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, ns->strs, total);
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, ns->k_codec, 2 * (size_t)L);
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, ns, sizeof *ns);
    return NULL;
  }
  ns->v_codec = ns->k_codec + L;
  memset(ns->k_codec, KVT_CODEC_K8, L);
  memset(ns->v_codec, KVT_CODEC_V3, L);
  ns->strs_len = total;
  char *p = ns->strs, *dst[3];
  for (int i = 0; i < 3; i++) {
    memcpy(p, src[i], len[i] + 1);
    dst[i] = p;
    p += len[i] + 1;
  }
  ns->desc = *d;
  ns->desc.model_id = dst[0];
  ns->desc.weights_fingerprint = dst[1];
  ns->desc.rope_scaling = dst[2];
  if (ns->desc.rope_dims == 0) ns->desc.rope_dims = d->shape.head_dim;
  kvt_ns_seed_of(&ns->desc, &ns->seed);
  ns->bytes_each = kvt_shape_block_bytes(&d->shape);
  ns->lite = (kvt_shape_lite){d->shape.block_tokens, d->shape.n_kv_heads, d->shape.head_dim,
                              d->shape.dtype};
  ns->warm_seed = kvt_key_hash(&ns->seed);
  return ns;
}

/* The detail of KVT_ENSCONFLICT: the first field of the shape that differs. */
static int shape_conflict(kvt_engine *e, const kvt_shape *have, const kvt_shape *got) {
  static const char *const names[5] = {"shape.n_layers", "shape.n_kv_heads", "shape.head_dim",
                                       "shape.dtype", "shape.block_tokens"};
  const uint32_t h[5] = {have->n_layers, have->n_kv_heads, have->head_dim, have->dtype,
                         have->block_tokens};
  const uint32_t g[5] = {got->n_layers, got->n_kv_heads, got->head_dim, got->dtype,
                         got->block_tokens};
  int i = 0;
  while (i < 4 && h[i] == g[i]) i++;
  char want[96];
  snprintf(want, sizeof want, "%u, as the namespace is registered", h[i]);
  return KVT_ERR(e, KVT_ENSCONFLICT, "kvt_ns_register", names[i], want, "%u", g[i]);
}

/* Find or add namespace d, with the lock held; persist says whether to
 * write it to the cold tier (not when it was just read from there). */
static int ns_add_locked(kvt_engine *e, const kvt_ns_desc *d, int persist, kvt_ns_id *out) {
  for (uint32_t i = 0; i < e->n_ns; i++) {
    kvt_nsrec *ns = e->ns[i];
    if (!ns || !same_identity(&ns->desc, d)) continue;
    if (memcmp(&ns->desc.shape, &d->shape, sizeof d->shape))
      return shape_conflict(e, &ns->desc.shape, &d->shape);
    *out = ns->id;
    return 0;
  }
  uint32_t slot = 0;
  while (slot < e->n_ns && e->ns[slot]) slot++;
  if (slot >= e->opt.max_namespaces) return KVT_ELIMIT;
  kvt_nsrec *ns = nsrec_new(e, d);
  if (!ns) return -ENOMEM;
  if (persist && kvt_cold_on(e)) { /* persisted before anything of it can be */
    uint8_t enc[KVT_NS_ENCODE_MAX];
    size_t len = kvt_ns_encode(&ns->desc, enc, sizeof enc);
    int rc = kvt_cold_ns_put(e->cold, &ns->seed, enc, len);
    if (rc) {
      nsrec_free(e, ns);
      return rc;
    }
  }
  ns->id = slot | (uint32_t)e->ns_gen[slot] << 16;
  *out = ns->id;
  e->ns[slot] = ns;
  if (slot == e->n_ns) e->n_ns++;
  e->st.namespaces++;
  return 0;
}

int kvt_ns_register(kvt_engine *e, const kvt_ns_desc *d, kvt_ns_id *out) {
  if (!e || !d || !out) return KVT_ENULL;
  kvt_error_info info;
  int rc = ns_desc_check(d, &info);
  if (rc) return kvt_err_keep(&e->err, &info);
  if (kvt_rdonly(e)) return KVT_ERDONLY;
  pthread_mutex_lock(&e->lock);
  rc = ns_add_locked(e, d, 1, out);
  pthread_mutex_unlock(&e->lock);
  return rc;
}

/* kvt_cold_ns_each callback: a namespace the store already has. */
static int ns_load_one(void *arg, const kvt_key *seed, const uint8_t *enc, size_t len) {
  kvt_engine *e = arg;
  kvt_ns_desc d;
  char strs[3 * (KVT_MAX_ID_LEN + 1)];
  kvt_key check;
  kvt_ns_id id;
  if (kvt_ns_decode(enc, len, &d, strs) || ns_desc_check(&d, NULL)) return KVT_ECORRUPT;
  kvt_ns_seed_of(&d, &check);
  if (!kvt_key_eq(&check, seed)) return KVT_ECORRUPT;
  return ns_add_locked(e, &d, 0, &id);
}

int kvt_ns_load(kvt_engine *e) {
  pthread_mutex_lock(&e->lock);
  int rc = kvt_cold_ns_each(e->cold, ns_load_one, e);
  pthread_mutex_unlock(&e->lock);
  return rc;
}

int kvt_ns_get(kvt_engine *e, uint32_t index, kvt_ns_id *id, kvt_ns_desc *desc) {
  if (!e || !id || !desc) return KVT_ENULL;
  pthread_mutex_lock(&e->lock);
  uint32_t seen = 0;
  int rc = KVT_ENOTFOUND;
  for (uint32_t i = 0; i < e->n_ns && rc; i++) {
    if (!e->ns[i] || seen++ != index) continue;
    *id = e->ns[i]->id;
    *desc = e->ns[i]->desc;
    rc = 0;
  }
  pthread_mutex_unlock(&e->lock);
  return rc;
}

int kvt_ns_shape(kvt_engine *e, kvt_ns_id id, kvt_shape *out) {
  if (!e || !out) return KVT_ENULL;
  pthread_mutex_lock(&e->lock);
  kvt_nsrec *ns = kvt_ns_find(e, id);
  if (ns) *out = ns->desc.shape;
  pthread_mutex_unlock(&e->lock);
  return ns ? 0 : KVT_ENOTFOUND;
}

int kvt_ns_seed(kvt_engine *e, kvt_ns_id id, kvt_key *out) {
  if (!e || !out) return KVT_ENULL;
  pthread_mutex_lock(&e->lock);
  kvt_nsrec *ns = kvt_ns_find(e, id);
  if (ns) *out = ns->seed;
  pthread_mutex_unlock(&e->lock);
  return ns ? 0 : KVT_ENOTFOUND;
}

int kvt_ns_set_codec(kvt_engine *e, kvt_ns_id id, uint32_t layer, int k_codec, int v_codec) {
  if (!e) return KVT_ENULL;
  const kvt_codec *kc = kvt_codec_get(k_codec), *vc = kvt_codec_get(v_codec);
  /* KVT_CODEC_NONE keeps that side exact; one side at least is quantized */
  if (k_codec == KVT_CODEC_NONE && v_codec == KVT_CODEC_NONE)
    return KVT_ERR(e, KVT_EOPTION, "kvt_ns_set_codec", "k_codec and v_codec",
                   "at least one quantized side", "both KVT_CODEC_NONE");
  if (k_codec != KVT_CODEC_NONE && (!kc || kc->is_value))
    return KVT_ERR(e, KVT_EOPTION, "kvt_ns_set_codec", "k_codec",
                   "KVT_CODEC_NONE or a key codec (K8, K8C, K4)", "%d", k_codec);
  if (v_codec != KVT_CODEC_NONE && (!vc || !vc->is_value))
    return KVT_ERR(e, KVT_EOPTION, "kvt_ns_set_codec", "v_codec",
                   "KVT_CODEC_NONE or a value codec (V2, V3, V4)", "%d", v_codec);
  pthread_mutex_lock(&e->lock);
  kvt_nsrec *ns = kvt_ns_find(e, id);
  int rc = 0;
  if (!ns || (layer != KVT_ALL_LAYERS && layer >= ns->desc.shape.n_layers)) {
    rc = KVT_ENOTFOUND;
  } else {
    uint32_t l0 = layer == KVT_ALL_LAYERS ? 0 : layer;
    uint32_t l1 = layer == KVT_ALL_LAYERS ? ns->desc.shape.n_layers : layer + 1;
    for (uint32_t l = l0; l < l1; l++) {
      ns->k_codec[l] = (uint8_t)k_codec;
      ns->v_codec[l] = (uint8_t)v_codec;
    }
  }
  pthread_mutex_unlock(&e->lock);
  return rc;
}

/* Seed and block size of a namespace, read under the lock; namespaces are
 * immutable until dropped, so the copies stay right for the caller. */
static int ns_chain_params(kvt_engine *e, kvt_ns_id id, kvt_key *seed, uint32_t *bt) {
  pthread_mutex_lock(&e->lock);
  kvt_nsrec *ns = kvt_ns_find(e, id);
  if (ns) {
    *seed = ns->seed;
    *bt = ns->desc.shape.block_tokens;
  }
  pthread_mutex_unlock(&e->lock);
  return ns ? 0 : KVT_ENOTFOUND;
}

int kvt_keys(kvt_engine *e, kvt_ns_id id, const uint32_t *tokens, size_t n_tokens, kvt_key *keys,
             size_t max_keys, size_t *n_keys) {
  if (!e || !n_keys || (n_tokens && !tokens)) return KVT_ENULL;
  kvt_key seed;
  uint32_t bt;
  int rc = ns_chain_params(e, id, &seed, &bt);
  if (rc) return rc;
  size_t n = n_tokens / bt;
  *n_keys = n;
  if (n > max_keys)
    return KVT_ERR(e, KVT_ECOUNT, "kvt_keys", "max_keys", "at least n_tokens / block_tokens",
                   "%zu (%zu keys needed)", max_keys, n);
  if (n && !keys) return KVT_ENULL;
  for (size_t i = 0; i < n; i++)
    kvt_key_next(&seed, i ? &keys[i - 1] : NULL, tokens + i * bt, bt, &keys[i]);
  return 0;
}

int kvt_ns_drop(kvt_engine *e, kvt_ns_id id) {
  if (!e) return KVT_ENULL;
  if (kvt_rdonly(e)) return KVT_ERDONLY;
  pthread_mutex_lock(&e->lock);
  kvt_nsrec *ns = kvt_ns_find(e, id);
  int rc = !ns ? KVT_ENOTFOUND : (ns->n_seqs || ns->n_loads) ? KVT_EBUSY : 0;
  if (!rc) {
    for (size_t i = 0; i < e->n_buckets; i++) {
      kvt_tblk **pp = &e->buckets[i];
      while (*pp) {
        if ((*pp)->ns == ns) kvt_drop_tblk(e, *pp); /* unlinks *pp */
        else pp = &(*pp)->hnext;
      }
    }
    e->ns[id & 0xFFFF] = NULL;
    e->ns_gen[id & 0xFFFF]++;
    kvt_key seed = ns->seed;
    nsrec_free(e, ns);
    e->st.namespaces--;
    if (kvt_cold_on(e)) rc = kvt_cold_drop(e->cold, &seed, NULL, 0, NULL);
  }
  pthread_mutex_unlock(&e->lock);
  return rc;
}

/* ---------- the index ---------- */

kvt_tblk *kvt_index_find(kvt_engine *e, const kvt_key *k) {
  kvt_tblk *tb = e->buckets[kvt_key_hash(k) & (e->n_buckets - 1)];
  while (tb && !kvt_key_eq(&tb->key, k)) tb = tb->hnext;
  return tb;
}

/* Double the table when it averages more than one entry a bucket. When
 * the allocation fails the chains just grow longer: nothing is lost. */
static void index_grow(kvt_engine *e) {
  size_t n = e->n_buckets * 2;
  kvt_tblk **nb = kvt_mem_calloc(&e->mem, KVT_MEM_INDEX, n * sizeof *nb);
  if (!nb) return;
  for (size_t i = 0; i < e->n_buckets; i++) {
    kvt_tblk *tb = e->buckets[i];
    while (tb) {
      kvt_tblk *next = tb->hnext;
      size_t h = kvt_key_hash(&tb->key) & (n - 1);
      tb->hnext = nb[h];
      nb[h] = tb;
      tb = next;
    }
  }
  kvt_mem_free(&e->mem, KVT_MEM_INDEX, e->buckets, e->n_buckets * sizeof *nb);
  e->buckets = nb;
  e->n_buckets = n;
}

void kvt_index_insert(kvt_engine *e, kvt_tblk *tb) {
  assert(!tb->indexed && !kvt_index_find(e, &tb->key));
  if (e->n_tblks >= e->n_buckets) index_grow(e);
  size_t h = kvt_key_hash(&tb->key) & (e->n_buckets - 1);
  tb->hnext = e->buckets[h];
  e->buckets[h] = tb;
  tb->indexed = 1;
}

void kvt_index_remove(kvt_engine *e, kvt_tblk *tb) {
  if (!tb->indexed) return;
  kvt_tblk **pp = &e->buckets[kvt_key_hash(&tb->key) & (e->n_buckets - 1)];
  while (*pp != tb) pp = &(*pp)->hnext;
  *pp = tb->hnext;
  tb->hnext = NULL;
  tb->indexed = 0;
}

static size_t tblk_size(uint32_t n_layers) {
  return sizeof(kvt_tblk) + (size_t)n_layers * sizeof(kvt_lblk *);
}

kvt_tblk *kvt_tblk_alloc(kvt_engine *e, kvt_nsrec *ns, const kvt_key *key, const kvt_key *parent,
                         uint32_t pos) {
  uint32_t L = ns->desc.shape.n_layers;
  kvt_tblk *tb = kvt_mem_calloc(&e->mem, KVT_MEM_INDEX, tblk_size(L));
  if (!tb) return NULL;
  tb->key = *key;
  if (parent) tb->parent = *parent;
  tb->ns = ns;
  tb->pos = pos;
  tb->n_layers = L;
  return tb;
}

void kvt_tblk_maybe_free(kvt_engine *e, kvt_tblk *tb) {
  if (tb->n_present || tb->seq_refs) return;
  if (tb->indexed) {
    kvt_index_remove(e, tb);
    e->n_tblks--;
  }
  kvt_mem_free(&e->mem, KVT_MEM_INDEX, tb, tblk_size(tb->n_layers));
}

/* ---------- layer blocks ---------- */

static void lblk_destroy(kvt_engine *e, kvt_lblk *b) {
  kvt_tier_state *t = &e->tier[b->tier];
  kvt_tblk *tb = b->tb;
  assert(b->refs == 0 && b->pins == 0 && tb->layers[b->layer] == b);
  tb->layers[b->layer] = NULL;
  tb->n_present--;
  if (b->tier == KVT_TIER_COLD) { /* a descriptor only: its bytes are on disk */
    kvt_lblk_free(&e->mem, KVT_MEM_INDEX, b);
  } else {
    if (b->on_lru) kvt_tier_lru_remove(t, b);
    kvt_tier_unaccount(t, b);
    kvt_lblk_free(&e->mem, t->mem_cat, b);
  }
  kvt_tblk_maybe_free(e, tb);
}

/* A referenced block whose token block is durable leaves RAM: its payload
 * goes, its descriptor stays (sequences point to it) with tier COLD, and
 * reads of it go to the cold tier. */
static void to_cold(kvt_engine *e, kvt_lblk *b) {
  kvt_tier_state *t = &e->tier[b->tier];
  assert(b->refs > 0 && b->pins == 0 && !b->on_lru && b->tb->cold);
  kvt_tier_unaccount(t, b);
  kvt_payload_free(&e->mem, t->mem_cat, b);
  kvt_mem_move(&e->mem, t->mem_cat, KVT_MEM_INDEX, kvt_lblk_desc_bytes());
  b->tier = KVT_TIER_COLD;
  b->cost = 0;
  t->evictions++;
}

/* Oldest referenced block of t that may leave RAM for the cold tier. */
static kvt_lblk *durable_victim(kvt_tier_state *t) {
  for (kvt_lblk *b = t->all.all_next; b != &t->all; b = b->all_next)
    if (b->pins == 0 && !b->busy && b->refs > 0 && b->tb->cold) return b;
  return NULL;
}

void kvt_lblk_ref(kvt_engine *e, kvt_lblk *b) {
  if (b->refs++ == 0) {
    if (b->on_lru) kvt_tier_lru_remove(&e->tier[b->tier], b);
  } else {
    e->st.dedup_saved_bytes += b->payload_bytes;
  }
  e->st.logical_bytes += b->payload_bytes;
}

/* The last reference gone: cached for reuse (LRU), or freed when its token
 * block was dropped and it is no longer pinned. */
static void lblk_idle(kvt_engine *e, kvt_lblk *b) {
  if (b->held && !b->tb->queued) { /* nobody needs it written any more */
    b->held = 0;
    kvt_tier_unpin(&e->tier[b->tier], b);
  }
  if (!b->tb->indexed || b->tier == KVT_TIER_COLD) {
    if (b->pins == 0) lblk_destroy(e, b);
  } else {
    kvt_tier_lru_push(&e->tier[b->tier], b);
  }
}

void kvt_lblk_unref(kvt_engine *e, kvt_lblk *b) {
  assert(b->refs > 0);
  e->st.logical_bytes -= b->payload_bytes;
  if (--b->refs > 0) e->st.dedup_saved_bytes -= b->payload_bytes;
  else lblk_idle(e, b);
}

void kvt_lblk_pin(kvt_engine *e, kvt_lblk *b) { kvt_tier_pin(&e->tier[b->tier], b); }

void kvt_lblk_unpin(kvt_engine *e, kvt_lblk *b) {
  kvt_tier_unpin(&e->tier[b->tier], b);
  if (b->pins == 0 && b->refs == 0 && (!b->tb->indexed || b->tier == KVT_TIER_COLD))
    lblk_destroy(e, b);
}

/* Without a cold tier: drop unreferenced blocks of t, least recent first,
 * until cost fits, checking first so that a refusal changes nothing.
 * With one: also let durable referenced blocks leave RAM, and wait for the
 * flusher when what pins the tier is waiting to be written. */
int kvt_tier_drop_for(kvt_engine *e, kvt_tier_state *t, uint64_t cost) {
  if (!kvt_cold_any(e) && !kvt_tier_can_fit(t, cost)) return KVT_EFULL;
  if (cost > t->bytes_limit) return KVT_EFULL;
  while (t->bytes_used + cost > t->bytes_limit) {
    kvt_lblk *v = kvt_tier_lru_victim(t);
    if (v) {
      t->evictions++;
      lblk_destroy(e, v);
    } else if ((v = durable_victim(t))) {
      to_cold(e, v);
    } else if (kvt_cold_on(e) && kvt_cold_pending(e)) {
      kvt_cold_wait_room(e);
    } else {
      return KVT_EFULL;
    }
  }
  return 0;
}

/* Move hot block b to the warm tier. Encodes outside the lock while b is
 * pinned and marked busy (so no other thread demotes it too). */
static int demote(kvt_engine *e, kvt_lblk *b) {
  kvt_tier_state *hot = &e->tier[KVT_TIER_HOT], *warm = &e->tier[KVT_TIER_WARM];
  kvt_nsrec *ns = b->tb->ns;
  uint32_t l = b->layer;
  int kc = ns->k_codec[l], vc = ns->v_codec[l]; /* kvt_ns_set_codec() writes them locked */
  kvt_warm_form f;
  b->busy = 1;
  kvt_lblk_pin(e, b);
  pthread_mutex_unlock(&e->lock);
  const uint8_t *k = b->payload, *v = k ? k + ns->bytes_each : NULL;
  int rc = kvt_warm_encode(&e->mem, &ns->lite, k, v, kc, vc, kvt_layer_seed(ns, l), &f);
  pthread_mutex_lock(&e->lock);
  b->busy = 0;
  kvt_tier_unpin(hot, b); /* not kvt_lblk_unpin: b is still needed here */
  if (b->refs == 0 && b->pins == 0 && !b->tb->indexed) { /* dropped while we encoded */
    if (f.payload) kvt_mem_free(&e->mem, KVT_MEM_WARM, f.payload, f.alloc);
    lblk_destroy(e, b);
    return rc;
  }
  if (b->pins > 0) { /* a reader pinned it meanwhile and may be copying it */
    if (f.payload) kvt_mem_free(&e->mem, KVT_MEM_WARM, f.payload, f.alloc);
    return rc;
  }
  uint64_t cost = kvt_lblk_desc_bytes() + f.alloc;
  if (!rc) rc = kvt_tier_drop_for(e, warm, cost);
  if (rc) {
    if (f.payload) kvt_mem_free(&e->mem, KVT_MEM_WARM, f.payload, f.alloc);
    /* Warm cannot take it: an unreferenced block is dropped instead. */
    if (rc == KVT_EFULL && b->refs == 0) {
      hot->evictions++;
      lblk_destroy(e, b);
      return 0;
    }
    return rc;
  }
  int listed = b->on_lru;
  if (listed) kvt_tier_lru_remove(hot, b);
  kvt_tier_unaccount(hot, b);
  kvt_payload_free(&e->mem, KVT_MEM_HOT, b);
  kvt_mem_move(&e->mem, KVT_MEM_HOT, KVT_MEM_WARM, kvt_lblk_desc_bytes());
  b->payload = f.payload;
  b->payload_alloc = f.alloc;
  b->k_len = f.k_len;
  b->k_codec = f.k_codec;
  b->v_codec = f.v_codec;
  b->checked = f.checked;
  b->cost = cost;
  kvt_tier_account(warm, b);
  if (listed) kvt_tier_lru_push(warm, b);
  e->st.demotions++;
  return 0;
}

/* Oldest hot block held for the cold tier whose token block is not queued
 * (not complete in the hot tier), pinned by nothing else; or NULL. */
static kvt_lblk *held_victim(kvt_tier_state *t) {
  for (kvt_lblk *b = t->all.all_next; b != &t->all; b = b->all_next)
    if (b->held && b->pins == 1 && !b->busy && !b->tb->queued) return b;
  return NULL;
}

int kvt_hot_make_room(kvt_engine *e, uint64_t cost) {
  kvt_tier_state *hot = &e->tier[KVT_TIER_HOT];
  if (!kvt_warm_on(e)) return kvt_tier_drop_for(e, hot, cost);
  if (cost > hot->bytes_limit) return KVT_EFULL;
  while (hot->bytes_used + cost > hot->bytes_limit) {
    kvt_lblk *v = kvt_tier_oldest(hot);
    if (!v && kvt_cold_on(e) && kvt_cold_pending(e)) { /* what is written lets go */
      kvt_cold_wait_room(e);
      continue;
    }
    if (!v && (v = held_victim(hot))) {
      /* The hot tier cannot hold its token block whole, so it can never be
       * written exactly: it goes warm, and kvt_sync says so. */
      v->held = 0;
      kvt_tier_unpin(hot, v);
      v->tb->cold_err = KVT_ENOTDURABLE;
    }
    if (!v) return KVT_EFULL; /* everything left is pinned or being moved */
    int rc = demote(e, v);
    if (rc) return rc;
  }
  return 0;
}

int kvt_publish(kvt_engine *e, kvt_tblk *tb, uint32_t layer, kvt_lblk *b, int tier) {
  assert(!tb->layers[layer]);
  b->tb = tb;
  b->layer = layer;
  kvt_tier_account(&e->tier[tier], b);
  tb->layers[layer] = b;
  tb->n_present++;
  /* Held unless the rule rules it out for now (output under
   * KVT_ADMIT_PROMPT); a block short of min_seen is held, to be written
   * if it is seen again while referenced. */
  int maybe = e->opt.cold_admit != KVT_ADMIT_PROMPT || tb->prompt;
  if (kvt_cold_on(e) && !tb->cold && tier == KVT_TIER_HOT && b->payload && maybe) {
    b->held = 1; /* keep the exact bytes until they are written */
    kvt_lblk_pin(e, b);
  }
  if (kvt_cold_on(e) && !tb->cold && tier == KVT_TIER_WARM && kvt_cold_admissible(e, tb))
    tb->cold_err = KVT_ENOTDURABLE; /* born warm: no exact copy to write */
  kvt_cold_consider(e, tb);
  return 0;
}

int kvt_born_cold(const kvt_engine *e, size_t each) {
  return e->mcold && !kvt_warm_on(e) &&
         kvt_lblk_desc_bytes() + kvt_mem_round(2 * each) > e->tier[KVT_TIER_HOT].bytes_limit;
}

void kvt_publish_cold(kvt_engine *e, kvt_tblk *tb, uint32_t layer, kvt_lblk *b) {
  assert(!tb->layers[layer] && !b->payload);
  b->tb = tb;
  b->layer = layer;
  b->tier = KVT_TIER_COLD;
  b->cost = 0; /* nothing in RAM: like a block that left for the cold tier */
  kvt_mem_move(&e->mem, KVT_MEM_HOT, KVT_MEM_INDEX, kvt_lblk_desc_bytes());
  tb->layers[layer] = b;
  tb->n_present++;
  kvt_cold_consider(e, tb);
}

int kvt_lblk_copy_out(const kvt_nsrec *ns, const kvt_lblk *b, void *k_out, void *v_out) {
  size_t each = ns->bytes_each;
  if (b->tier == KVT_TIER_COLD) return KVT_ENOTFOUND; /* the caller reads the cold tier */
  if (b->tier == KVT_TIER_WARM)
    return kvt_warm_decode(&ns->lite, b, kvt_layer_seed(ns, b->layer), k_out, v_out);
  memcpy(k_out, b->payload, each);
  memcpy(v_out, b->payload + each, each);
  return 0;
}

/* Remove tb from the index with every layer it holds: layers nobody holds
 * are freed now, the others when their last reference or pin goes. */
void kvt_drop_tblk(kvt_engine *e, kvt_tblk *tb) {
  if (tb->indexed) {
    kvt_index_remove(e, tb);
    e->n_tblks--;
  }
  tb->seq_refs++; /* keep tb alive while its layers go */
  for (uint32_t l = 0; l < tb->n_layers; l++) {
    kvt_lblk *b = tb->layers[l];
    if (b && b->refs == 0 && b->pins == 0) lblk_destroy(e, b);
  }
  tb->seq_refs--;
  kvt_tblk_maybe_free(e, tb);
}

/* ---------- prefix lookup and drop ---------- */

#define KEY_BATCH 64

static double est_load_us(const kvt_engine *e, int tier, uint64_t bytes) {
  return e->opt.tier_load_latency_us[tier] + (double)bytes / (e->opt.tier_load_gbps[tier] * 1e3);
}

/* Is tb stored in every layer? Then touch its idle layers and describe it. */
static void lookup_entry(kvt_lookup_entry *ent, const kvt_key *key, int tier, double us) {
  if (!ent) return;
  ent->key = *key;
  ent->tier = (uint32_t)tier;
  ent->pad = 0;
  ent->est_load_us = us;
}

/* Is tb stored in every layer (in RAM, or durable in the cold tier)? Then
 * touch its idle layers and describe it. */
static int lookup_hit(kvt_engine *e, kvt_tblk *tb, kvt_lookup_entry *ent) {
  if (!tb || !tb->indexed || (tb->n_present != tb->n_layers && !tb->cold)) return 0;
  int slowest = KVT_TIER_HOT;
  double us = 0;
  uint64_t each2 = 2 * (uint64_t)tb->ns->bytes_each;
  for (uint32_t l = 0; l < tb->n_layers; l++) {
    kvt_lblk *b = tb->layers[l];
    int tier = b ? b->tier : KVT_TIER_COLD;
    if (b && tier != KVT_TIER_COLD) kvt_tier_lru_touch(&e->tier[tier], b);
    if (tier > slowest) slowest = tier;
    us += est_load_us(e, tier, each2);
  }
  e->tc.hits[slowest]++;
  lookup_entry(ent, &tb->key, slowest, us);
  return 1;
}

int kvt_lookup(kvt_engine *e, kvt_ns_id id, const uint32_t *tokens, size_t n_tokens,
               kvt_lookup_entry *out, size_t max_out, size_t *n_found) {
  if (!e || !n_found || (n_tokens && !tokens) || (max_out && !out)) return KVT_ENULL;
  *n_found = 0;
  kvt_key seed, keys[KEY_BATCH];
  uint32_t bt;
  int rc = ns_chain_params(e, id, &seed, &bt);
  if (rc) return rc;
  kvt_shape sh;
  kvt_ns_shape(e, id, &sh);
  double cold_us = sh.n_layers * est_load_us(e, KVT_TIER_COLD, 2 * (uint64_t)kvt_shape_block_bytes(&sh));
  size_t n = n_tokens / bt, found = 0, found_cold = 0;
  int miss = 0;
  for (size_t i0 = 0; i0 < n && !miss; i0 += KEY_BATCH) {
    size_t m = n - i0 < KEY_BATCH ? n - i0 : KEY_BATCH, j = 0;
    for (size_t k = 0; k < m; k++)
      kvt_key_next(&seed, k ? &keys[k - 1] : (i0 ? &keys[KEY_BATCH - 1] : NULL),
                   tokens + (i0 + k) * bt, bt, &keys[k]);
    while (j < m && !miss) {
      pthread_mutex_lock(&e->lock);
      for (; j < m; j++, found++)
        if (!lookup_hit(e, kvt_index_find(e, &keys[j]), found < max_out ? &out[found] : NULL)) break;
      pthread_mutex_unlock(&e->lock);
      if (j == m) break;
      /* Not in RAM: the cold tier may have this block and more. */
      size_t c = 0;
      if (e->cold) {
        c = kvt_cold_prefix(e->cold, keys + j, m - j);
      } else if (e->mcold) {
        pthread_mutex_lock(&e->lock);
        c = kvt_cold_meta_prefix(e->mcold, keys + j, m - j);
        pthread_mutex_unlock(&e->lock);
      }
      for (size_t k = 0; k < c; k++, found++)
        lookup_entry(found < max_out ? &out[found] : NULL, &keys[j + k], KVT_TIER_COLD, cold_us);
      j += c;
      found_cold += c;
      miss = c == 0;
    }
  }
  pthread_mutex_lock(&e->lock);
  e->st.lookups++;
  e->st.lookup_blocks_hit += found;
  e->st.lookup_blocks_miss += n - found;
  e->tc.hits[KVT_TIER_COLD] += found_cold;
  pthread_mutex_unlock(&e->lock);
  *n_found = found;
  return 0;
}

static int cmp_pos(const void *a, const void *b) {
  uint32_t x = (*(kvt_tblk *const *)a)->pos, y = (*(kvt_tblk *const *)b)->pos;
  return (x > y) - (x < y);
}

/* Token blocks of ns that extend the block `last`, in chain order. The
 * caller frees *out (n entries, counted in KVT_MEM_OTHER). */
static int descendants(kvt_engine *e, kvt_tblk *last, kvt_tblk ***out, size_t *n_out,
                       size_t *cap_out) {
  size_t cap = 0, n = 0;
  for (size_t i = 0; i < e->n_buckets; i++)
    for (kvt_tblk *tb = e->buckets[i]; tb; tb = tb->hnext)
      cap += (tb->ns == last->ns && tb->pos > last->pos);
  *out = NULL;
  *n_out = 0;
  *cap_out = cap;
  if (!cap) return 0;
  kvt_tblk **c = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, cap * sizeof *c);
  if (!c) return -ENOMEM;
  size_t m = 0;
  for (size_t i = 0; i < e->n_buckets; i++)
    for (kvt_tblk *tb = e->buckets[i]; tb; tb = tb->hnext)
      if (tb->ns == last->ns && tb->pos > last->pos) c[m++] = tb;
  qsort(c, m, sizeof *c, cmp_pos);
  /* A block descends from last iff its parent does (or is last); in chain
   * order every parent is decided before its children. A block whose
   * parent left the index is not reached: no lookup can reach it either. */
  last->mark = 1;
  for (size_t i = 0; i < m; i++) {
    kvt_tblk *p = kvt_index_find(e, &c[i]->parent);
    if (p && p->mark) {
      c[i]->mark = 1;
      c[n++] = c[i];
    }
  }
  for (size_t i = 0; i < n; i++) c[i]->mark = 0;
  last->mark = 0;
  *out = c;
  *n_out = n;
  return 0;
}

int kvt_drop_prefix(kvt_engine *e, kvt_ns_id id, const uint32_t *tokens, size_t n_tokens,
                    uint64_t *dropped) {
  if (!e || !tokens) return KVT_ENULL;
  if (dropped) *dropped = 0;
  if (kvt_rdonly(e)) return KVT_ERDONLY;
  kvt_key seed, prev, cur;
  uint32_t bt;
  int rc = ns_chain_params(e, id, &seed, &bt);
  if (rc) return rc;
  size_t n = n_tokens / bt;
  if (n == 0)
    return KVT_ERR(e, KVT_ECOUNT, "kvt_drop_prefix", "n_tokens", "at least one block",
                   "%zu (block_tokens %u)", n_tokens, bt);
  kvt_key_next(&seed, NULL, tokens, bt, &cur);
  for (size_t i = 1; i < n; i++) {
    prev = cur;
    kvt_key_next(&seed, &prev, tokens + i * bt, bt, &cur);
  }
  pthread_mutex_lock(&e->lock);
  /* Find what extends the prefix first, so that a failure changes nothing.
   * A token block durable in the cold tier is counted by the cold drop. */
  kvt_tblk *last = kvt_index_find(e, &cur), **d = NULL;
  size_t nd = 0, cap = 0;
  if (last) rc = descendants(e, last, &d, &nd, &cap);
  uint64_t count = 0;
  if (!rc) {
    for (size_t i = 0; i < nd; i++) {
      count += !d[i]->cold;
      kvt_drop_tblk(e, d[i]);
    }
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, d, cap * sizeof *d);
    for (size_t i = 0; i < n; i++) {
      kvt_key_next(&seed, i ? &prev : NULL, tokens + i * bt, bt, &cur);
      prev = cur;
      kvt_tblk *tb = kvt_index_find(e, &cur);
      if (tb) {
        count += !tb->cold;
        kvt_drop_tblk(e, tb);
      }
      if (kvt_cold_on(e) && i + 1 < n) count += kvt_cold_remove(e->cold, &cur) == 0;
      if (e->mcold) count += kvt_cold_meta_remove(e->mcold, &cur) == 0; /* not what extends it */
    }
  }
  pthread_mutex_unlock(&e->lock);
  if (!rc && kvt_cold_on(e)) { /* the last block and all that extends it, durably */
    uint64_t cold_n = 0;
    rc = kvt_cold_drop(e->cold, &seed, &cur, (uint32_t)(n - 1), &cold_n);
    count += cold_n;
  }
  if (dropped) *dropped = count;
  return rc;
}
