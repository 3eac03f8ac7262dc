/* cold_write.c - the cold tier's write side: records built from token
 * blocks, segments chosen and group commits, and the write pipeline
 * (build, write, sync and index in three threads). */
#include "tiers/cold_internal.h"

/* ---------- records ---------- */

uint32_t cold_header_len(uint32_t n_layers) { return kvt_rec_header_len(n_layers); }

static uint32_t planes_overhead(uint32_t esize) { return kvt_rec_planes_overhead(esize); }

/* A slice on disk, at most. Byte planes are kept only when they save at
 * least 1/16 of the raw size (build_payload), which outweighs their
 * header once the raw size reaches 16 headers: from there a slice is
 * never longer than raw. Building planes may run a header's bytes past
 * that before the choice is made (STAGE_SLACK). */
static uint64_t slice_max(uint32_t bytes_each) {
  uint64_t raw = 2 * (uint64_t)bytes_each, oh = planes_overhead(8);
  return kvt_align4k(raw >= 16 * oh ? raw : raw + oh);
}
#define STAGE_SLACK 4096u

uint64_t kvt_cold_record_max(uint32_t n_layers, uint32_t bytes_each) {
  return cold_header_len(n_layers) + (uint64_t)n_layers * slice_max(bytes_each);
}

/* Grow a writer buffer; its bytes are counted like every other. */
static int ensure(kvt_cold *c, uint8_t **buf, size_t *cap, size_t need) {
  if (*cap >= need) return 0;
  size_t n = kvt_align4k(need + need / 2);
  void *p = cold_buf_alloc(c, n);
  if (!p) return -ENOMEM;
  cold_buf_free(c, *buf, *cap);
  *buf = p;
  *cap = n;
  return 0;
}

/* Byte plane p of the n elements (esize bytes each) at raw. */
static void plane_split(const uint8_t *raw, size_t n, uint32_t esize, uint32_t p, uint8_t *out) {
  if (esize == 2) {
    for (size_t i = 0; i < n; i++) {
      uint16_t w;
      memcpy(&w, raw + 2 * i, 2); /* raw may be any caller's buffer */
      out[i] = (uint8_t)(w >> 8 * p);
    }
    return;
  }
  for (size_t i = 0; i < n; i++) out[i] = raw[i * esize + p];
}

void kvt_cold_set_backlog(kvt_cold *c, const int *flag) { c->backlog = flag; }

/* Would compressing now slow writing down? The writer thread waits for
 * the chunk being built while more work waits behind it. */
static int starved(kvt_cold *c) {
  if (!__atomic_load_n(&c->writer_waiting, __ATOMIC_RELAXED)) return 0;
  return c->post_more || (c->backlog && __atomic_load_n(c->backlog, __ATOMIC_RELAXED));
}

/* Payload of one layer slice: raw K||V, or byte planes each zstd-compressed
 * when that saves at least 1/16 (a plane is tried on its first 4 KiB first,
 * so incompressible low-order bytes cost almost nothing). Not while the
 * writer starves (starved()): compressing would then make the tier slower
 * than writing raw, so the slice goes raw. Returns the payload length
 * written at dst; *codec says which. */
static size_t build_payload(kvt_cold *c, const uint8_t *raw, size_t raw_len, uint32_t esize,
                            uint8_t *dst, uint8_t *codec) {
  if (!c->cfg.compress || esize < 2 || starved(c)) {
    memcpy(dst, raw, raw_len);
    *codec = KVT_COLD_CODEC_RAW;
    return raw_len;
  }
  size_t n = raw_len / esize, off = planes_overhead(esize), saved = 0;
  kvt_le_put32(dst, esize);
  kvt_le_put32(dst + 4, (uint32_t)n);
  for (uint32_t p = 0; p < esize; p++) {
    uint8_t *pl = c->plane;
    plane_split(raw, n, esize, p, pl);
    size_t probe = n < 4096 ? n : 4096, z = 0;
    size_t zt = ZSTD_compressCCtx(c->cctx, pl + n, ZSTD_compressBound(4096), pl, probe,
                                  c->cfg.zstd_level);
    if (!ZSTD_isError(zt) && zt < probe - probe / 16) {
      z = ZSTD_compressCCtx(c->cctx, dst + off, n - n / 16, pl, n, c->cfg.zstd_level);
      if (ZSTD_isError(z)) z = 0; /* did not fit in n - n/16: not worth it */
    }
    uint8_t *ph = dst + 8 + 8 * p;
    if (z) {
      kvt_le_put32(ph, (uint32_t)z);
      ph[4] = 1;
      saved += n - z;
    } else {
      memcpy(dst + off, pl, n);
      z = n;
      kvt_le_put32(ph, (uint32_t)n);
      ph[4] = 0;
    }
    ph[5] = ph[6] = ph[7] = 0;
    off += z;
  }
  if (saved < raw_len / 16) { /* not worth a decode step */
    memcpy(dst, raw, raw_len);
    *codec = KVT_COLD_CODEC_RAW;
    return raw_len;
  }
  *codec = KVT_COLD_CODEC_PLANES;
  return off;
}

/* A slice's checksum is seeded with what the index says it is (key, layer,
 * segment generation): a slice of another block, another layer or an older
 * life of the segment fails the check, though it carries no header. */
uint64_t cold_slice_seed(const kvt_key *key, uint32_t layer, uint64_t gen) {
  uint8_t b[28];
  memcpy(b, key->b, 16);
  kvt_le_put32(b + 16, layer);
  kvt_le_put64(b + 20, gen);
  return XXH3_64bits(b, sizeof b);
}

/* Build one record in the staging buffer dst: its header, then each
 * slice (a copy of the exact bytes, or byte planes). Copying costs less
 * than it saves: a group then goes to the device as one large write, where
 * writing each 64 KiB slice from its own buffer measured half as fast.
 * Fills e, sl (n_layers slices) and parts (n_layers + 1); returns the
 * record length (a multiple of 4096) and in *staged the bytes used. */
static uint32_t build_record(kvt_cold *c, const kvt_cold_rec *r, uint64_t gen, uint8_t *dst,
                             kvt_cold_entry *e, kvt_cold_slice *sl, part *parts, size_t *staged) {
  uint32_t hl = cold_header_len(r->n_layers), off = hl, raw = 2 * r->bytes_each;
  uint32_t esize = (uint32_t)kvt_dtype_size(r->dtype);
  size_t st = hl;
  parts[0] = (part){dst, hl};
  for (uint32_t l = 0; l < r->n_layers; l++) {
    uint8_t codec, *h = dst + st;
    size_t stored = build_payload(c, r->layers[l], raw, esize, h, &codec);
    memset(h + stored, 0, kvt_align4k(stored) - stored);
    parts[l + 1] = (part){h, (uint32_t)kvt_align4k(stored)};
    st += kvt_align4k(stored);
    sl[l] = (kvt_cold_slice){.rel_off = off, .stored_len = (uint32_t)stored, .raw_len = raw,
                             .codec = codec,
                             .checksum = kvt_hash64(parts[l + 1].buf, stored,
                                                    cold_slice_seed(&r->key, l, gen))};
    off += (uint32_t)kvt_align4k(stored);
  }
  *e = (kvt_cold_entry){.seg_gen = gen, .rec_len = off, .n_layers = r->n_layers,
                        .dtype = r->dtype, .bytes_each = r->bytes_each, .pos = r->pos,
                        .key = r->key, .parent = r->parent, .ns_seed = r->ns_seed};
  kvt_rec_header_put(dst, e, sl);
  *staged = st;
  return off;
}

/* ---------- writing ---------- */

static int key_indexed(kvt_cold *c, MDB_txn *t, const kvt_key *k) {
  MDB_val key = {16, (void *)k->b}, v;
  return mdb_get(t, c->db_blocks, &key, &v) == 0;
}

/* Whole segments still to be had: free ones and files the limit allows. */
uint64_t cold_spare_segs(const kvt_cold *c) {
  uint64_t spare = 0, cap = c->cfg.bytes_limit / c->cfg.segment_bytes;
  if (cap > c->max_segs) cap = c->max_segs;
  for (uint32_t id = 0; id < c->n_segs; id++) spare += c->segs[id].state == SEG_FREE && c->segs[id].have;
  return spare + (cap > c->n_segs ? cap - c->n_segs : 0);
}

/* A segment with room for len more bytes: the active one, else a free one
 * (its generation bumped: entries into its old life can no longer match),
 * else a new file while the limit allows, as long as `reserve` spare
 * segments are left. KVT_EFULL when there is none; -EMFILE and the like
 * when a new file could not be opened now. */
static int seg_for_locked(kvt_cold *c, uint64_t len, uint64_t reserve, uint32_t *sealed,
                          size_t *n_sealed) {
  if (c->active >= 0 && c->segs[c->active].used + len <= c->cfg.segment_bytes) return c->active;
  if (cold_spare_segs(c) <= reserve) return KVT_EFULL; /* the active one keeps its room for smaller records */
  if (c->active >= 0) {
    c->segs[c->active].state = SEG_FULL;
    sealed[(*n_sealed)++] = (uint32_t)c->active;
    c->active = -1;
  }
  for (uint32_t id = 0; id < c->n_segs; id++) {
    seg *s = &c->segs[id];
    if (s->state != SEG_FREE) continue;
    if (!s->have) { /* its file was lost: a new one, whose name is synced before use */
      if (cold_seg_open_locked(c, id, 1)) continue;
      c->segdir_dirty = 1;
    }
    s->gen++;
    s->used = 0;
    s->live = 0;
    s->state = SEG_OPEN;
    return c->active = (int)id;
  }
  uint32_t id = c->n_segs;
  c->n_segs++; /* first: the descriptor cache looks at segments below n_segs */
  int rc = cold_seg_open_locked(c, id, 1);
  if (rc) {
    c->n_segs--;
    return rc == KVT_ECORRUPT ? KVT_EFULL : rc; /* something else is in its place */
  }
  c->segdir_dirty = 1; /* its name is made durable before an entry points into it */
  seg *s = &c->segs[id];
  s->gen = 1;
  s->used = s->live = 0;
  s->state = SEG_OPEN;
  return c->active = (int)id;
}

static int seg_for(kvt_cold *c, uint64_t len, uint64_t reserve, uint32_t *sealed,
                   size_t *n_sealed) {
  pthread_mutex_lock(&c->st_lock); /* readers look up descriptors */
  int id = seg_for_locked(c, len, reserve, sealed, n_sealed);
  pthread_mutex_unlock(&c->st_lock);
  return id;
}

int cold_find_locked(kvt_cold *c, MDB_txn *t, const kvt_key *key, kvt_cold_entry *e,
                       kvt_cold_slice *one, uint32_t layer);

/* The segment a reclaim relocates records out of. */
int cold_in_victim(const kvt_cold_entry *e, const victim *v) {
  return e->seg == v->id && e->seg_gen == v->gen;
}

/* Live bytes of the indexed records of pl, and of the victim copies they
 * replace, counted (sign 1) or uncounted (-1). */
static void add_live(kvt_cold *c, const placed *pl, size_t np, const victim *vic, int sign,
                     uint64_t *pending) {
  pthread_mutex_lock(&c->st_lock);
  if (pending) { /* the records stop counting as posted as they count as live */
    c->pending_bytes -= *pending;
    *pending = 0;
  }
  for (size_t i = 0; i < np; i++) {
    if (pl[i].dead) continue;
    uint64_t d = (uint64_t)(int64_t)sign;
    c->segs[pl[i].seg].live += d * pl[i].e.rec_len;
    c->st.live_bytes += d * pl[i].e.rec_len;
    if (vic) {
      c->segs[vic->id].live -= d * pl[i].old_len;
      c->st.live_bytes -= d * pl[i].old_len;
    }
  }
  pthread_mutex_unlock(&c->st_lock);
}

/* Index the placed records and save the touched segments in one
 * transaction, then sync the environment once. A relocated record (vic)
 * replaces its entry only while that still points into the victim: a
 * block dropped meanwhile stays dropped. */
static int commit_group(kvt_cold *c, placed *pl, size_t n, kvt_cold_slice *const *sl,
                        const uint32_t *touched, size_t n_touched, const victim *vic,
                        uint64_t *pending) {
  MDB_txn *t;
  int rc = mdb_err(mdb_txn_begin(c->env, NULL, 0, &t));
  if (rc) return rc;
  size_t val_cap = 0; /* one value buffer, for the largest entry */
  for (size_t i = 0; i < n; i++)
    if (cold_entry_len(pl[i].e.n_layers) > val_cap) val_cap = cold_entry_len(pl[i].e.n_layers);
  uint8_t *val = val_cap ? kvt_mem_alloc(c->mem, KVT_MEM_OTHER, val_cap) : NULL;
  if (val_cap && !val) rc = -ENOMEM;
  for (size_t i = 0; i < n && !rc; i++) {
    if (vic) {
      kvt_cold_entry old;
      int r = cold_find_locked(c, t, &pl[i].e.key, &old, NULL, 0);
      pl[i].dead = r || !cold_in_victim(&old, vic);
      pl[i].old_len = r ? 0 : old.rec_len;
      if (pl[i].dead) continue;
    }
    size_t vl = cold_entry_len(pl[i].e.n_layers);
    cold_put_entry(val, &pl[i].e);
    for (uint32_t l = 0; l < pl[i].e.n_layers; l++)
      cold_put_slice(val + ENTRY_FIXED + SLICE_ENTRY * l, &sl[i][l]);
    MDB_val k = {16, (void *)pl[i].e.key.b}, v = {vl, val};
    rc = mdb_err(mdb_put(t, c->db_blocks, &k, &v, 0));
  }
  kvt_mem_free(c->mem, KVT_MEM_OTHER, val, val_cap);
  if (rc) {
    mdb_txn_abort(t);
    return rc;
  }
  add_live(c, pl, n, vic, 1, pending); /* the segment rows below carry it */
  for (size_t i = 0; i < n_touched && !rc; i++) rc = cold_seg_save(c, t, touched[i]);
  if (!rc && vic) rc = cold_seg_save(c, t, vic->id);
  if (!rc) rc = mdb_err(mdb_txn_commit(t));
  else mdb_txn_abort(t);
  if (rc) {
    add_live(c, pl, n, vic, -1, NULL); /* not indexed: not live; its pages are never rewritten */
    return rc;
  }
  return mdb_err(mdb_env_sync(c->env, 1));
}

static void add_touched(uint32_t *touched, size_t *n, uint32_t id) {
  for (size_t i = 0; i < *n; i++)
    if (touched[i] == id) return;
  touched[(*n)++] = id;
}

/* ---------- the write pipeline ----------
 *
 * cold_post_chunks cuts records into chunks of at most cfg.group_bytes, and
 * each chunk goes through three threads in turn:
 *   the flusher (the caller) places it and builds its records in one of
 *     two staging buffers;
 *   the writer thread writes it (wio);
 *   the committer thread fdatasyncs the segments it touched (sio),
 *     commits its index entries (commit_group), and tells the caller
 *     (settled) whether its records are durable.
 * Each stage takes chunks in order, so while chunk k is being written,
 * chunk k+1 is built and chunk k-1 is synced and indexed. The durability
 * order of every chunk is as before: written, synced, then indexed. Once
 * a chunk fails, no later chunk is indexed (their pages are skipped
 * forever) until the pipeline has drained. cold_post_chunks returns once its
 * chunks are built: the records' bytes are in the staging buffers, and
 * the caller's next records are built while these are written. Whatever
 * needs the segment table to hold still (reclaiming) drains first. */

typedef struct chunk {
  placed *pl;
  kvt_cold_slice **sl;
  uint32_t *touched;
  size_t cap;                 /* pl and sl have room for cap records, touched 2 cap + 2 */
  size_t np, n_touched;
  size_t n_held;              /* touched[0..n_held) are held (cold_seg_hold) until chunk_free */
  kvt_io_req *w;              /* the writes, from stage buffer `buf` */
  size_t nw, w_cap;
  int buf;                    /* staging buffer held, or -1 */
  size_t from, upto;          /* records of the call settled once this commits */
  kvt_cold_settled_fn settled; /* told of [from, upto) when it commits */
  void *settled_arg;
  const victim *vic;
  uint64_t bytes;             /* of its records, in pending_bytes until settled */
  int rc;
  int inherited;              /* rc is an earlier chunk's failure */
  int told_only;              /* records not written, told of in order with rc as it is */
  uint64_t t0_ns;             /* its write started (h_commit) */
  struct chunk *next;
} chunk;


/* The chunk's records are settled: indexed or never to be. */
static void pending_less(kvt_cold *c, chunk *k) {
  pthread_mutex_lock(&c->st_lock);
  c->pending_bytes -= k->bytes;
  pthread_mutex_unlock(&c->st_lock);
  k->bytes = 0;
}

/* A placed record's slices (n_layers + 1: never a zero-size allocation)
 * and parts (n_layers + 1), counted in c->mem. */
static size_t sl_bytes(uint32_t n_layers) { return (n_layers + (size_t)1) * sizeof(kvt_cold_slice); }
static size_t parts_bytes(uint32_t n_layers) { return (n_layers + (size_t)1) * sizeof(part); }

static void chunk_free(kvt_cold *c, chunk *k) {
  if (!k) return;
  kvt_mem *m = c->mem;
  for (size_t i = 0; i < k->n_held; i++) cold_seg_release(c, k->touched[i]);
  for (size_t i = 0; k->sl && i < k->np; i++) {
    kvt_mem_free(m, KVT_MEM_OTHER, k->sl[i], sl_bytes(k->pl[i].e.n_layers));
    kvt_mem_free(m, KVT_MEM_OTHER, k->pl[i].parts, parts_bytes(k->pl[i].e.n_layers));
  }
  kvt_mem_free(m, KVT_MEM_OTHER, k->pl, k->cap * sizeof *k->pl);
  kvt_mem_free(m, KVT_MEM_OTHER, k->sl, k->cap * sizeof *k->sl);
  kvt_mem_free(m, KVT_MEM_OTHER, k->touched, (2 * k->cap + 2) * sizeof *k->touched);
  kvt_mem_free(m, KVT_MEM_OTHER, k->w, k->w_cap * sizeof *k->w);
  kvt_mem_free(m, KVT_MEM_OTHER, k, sizeof *k);
}

/* With cq_lock held. */
static void q_push(chunk **head, chunk **tail, chunk *k) {
  k->next = NULL;
  if (*tail) (*tail)->next = k;
  else *head = k;
  *tail = k;
}

static chunk *q_pop(chunk **head, chunk **tail) {
  chunk *k = *head;
  *head = k->next;
  if (!*head) *tail = NULL;
  return k;
}

/* A free staging buffer (waiting for the writer to release one). */
static int stage_get(kvt_cold *c) {
  pthread_mutex_lock(&c->cq_lock);
  while (c->stage_busy[0] && c->stage_busy[1]) pthread_cond_wait(&c->cq_cv, &c->cq_lock);
  int i = c->stage_busy[0] ? 1 : 0;
  c->stage_busy[i] = 1;
  pthread_mutex_unlock(&c->cq_lock);
  return i;
}

void kvt_cold_wait_stage(kvt_cold *c) {
  pthread_mutex_lock(&c->cq_lock);
  while (c->stage_busy[0] && c->stage_busy[1]) pthread_cond_wait(&c->cq_cv, &c->cq_lock);
  pthread_mutex_unlock(&c->cq_lock);
}

/* With cq_lock held. */
static void stage_put(kvt_cold *c, chunk *k) {
  if (k->buf < 0) return;
  c->stage_busy[k->buf] = 0;
  k->buf = -1;
  pthread_cond_broadcast(&c->cq_cv);
}

/* fsync segments/ when a segment file was created since it last was: a
 * name not yet durable can vanish in a power loss with the file's synced
 * contents, so no index entry may point into the file before. */
static int segdir_sync(kvt_cold *c) {
  pthread_mutex_lock(&c->st_lock);
  int dirty = c->segdir_dirty;
  c->segdir_dirty = 0;
  pthread_mutex_unlock(&c->st_lock);
  if (!dirty) return 0;
  char path[4200];
  snprintf(path, sizeof path, "%s/segments", c->dir);
  int rc = kvt_io_fsync_dir(path);
  if (rc) {
    pthread_mutex_lock(&c->st_lock);
    c->segdir_dirty = 1;
    pthread_mutex_unlock(&c->st_lock);
  }
  return rc;
}

/* Committer: sync what the chunk wrote, then index it. */
static int chunk_commit(kvt_cold *c, chunk *k) {
  int rc = 0;
  if (k->np == 0 && k->n_touched == 0) return 0; /* a marker: settles in order */
  for (size_t i = 0; !rc && i < k->n_touched; i++) {
    pthread_mutex_lock(&c->st_lock);
    int fd = c->segs[k->touched[i]].state != SEG_FREE ? c->segs[k->touched[i]].fd : -1;
    pthread_mutex_unlock(&c->st_lock);
    if (fd >= 0) rc = kvt_io_sync(c->sio, fd);
  }
  if (!rc) rc = segdir_sync(c);
  if (!rc) rc = commit_group(c, k->pl, k->np, k->sl, k->touched, k->n_touched, k->vic, &k->bytes);
  pthread_mutex_lock(&c->st_lock);
  if (!rc) {
    c->st.groups_written += k->np > 0;
    c->st.records_written += k->np;
    for (size_t i = 0; i < k->np; i++) c->st.bytes_written += k->pl[i].e.rec_len;
  }
  pthread_mutex_unlock(&c->st_lock);
  if (!rc && !k->vic) cold_evict_track(c, k->pl, k->np); /* relocated ones keep their place */
  if (!rc && k->np) kvt_hist_add(&c->h_commit, kvt_hist_now_ns() - k->t0_ns);
  if (!rc && k->np) cold_model_checkpoint(c); /* after the group's figures: not part of them */
  return rc;
}

static void *writer_main(void *arg) {
  kvt_cold *c = arg;
  pthread_mutex_lock(&c->cq_lock);
  for (;;) {
    if (!c->wq_head) __atomic_store_n(&c->writer_waiting, 1, __ATOMIC_RELAXED);
    while (!c->wq_head && !c->cq_stop) pthread_cond_wait(&c->cq_cv, &c->cq_lock);
    if (!c->wq_head) break;
    __atomic_store_n(&c->writer_waiting, 0, __ATOMIC_RELAXED);
    chunk *k = q_pop(&c->wq_head, &c->wq_tail);
    int failed = c->wq_failed ? c->wq_failed : c->cq_failed;
    pthread_mutex_unlock(&c->cq_lock);
    if (!k->told_only) {
      k->inherited = failed != 0;
      k->t0_ns = kvt_hist_now_ns();
      k->rc = failed ? failed : k->nw ? kvt_io_run(c->wio, k->w, k->nw) : 0;
    }
    pthread_mutex_lock(&c->cq_lock);
    stage_put(c, k);
    /* Later chunks are not written; the committer fails this one and what
     * follows in order (the chunks before it still commit). */
    if (k->rc && !k->told_only && !c->wq_failed) c->wq_failed = k->rc;
    q_push(&c->cq_head, &c->cq_tail, k);
    pthread_cond_broadcast(&c->cq_cv);
  }
  pthread_mutex_unlock(&c->cq_lock);
  return NULL;
}

static void *committer_main(void *arg) {
  kvt_cold *c = arg;
  pthread_mutex_lock(&c->cq_lock);
  for (;;) {
    while (!c->cq_head && !c->cq_stop) pthread_cond_wait(&c->cq_cv, &c->cq_lock);
    if (!c->cq_head) break;
    chunk *k = q_pop(&c->cq_head, &c->cq_tail);
    int failed = c->cq_failed;
    pthread_mutex_unlock(&c->cq_lock);
    if (!k->rc) {
      k->inherited = failed != 0;
      k->rc = failed ? failed : chunk_commit(c, k);
    } else if (failed && !k->told_only) {
      k->inherited = 1; /* written after the failure that is told first */
    }
    if (k->rc && !k->inherited) { /* counted once, where it happened */
      pthread_mutex_lock(&c->st_lock);
      c->st.write_failures++;
      pthread_mutex_unlock(&c->st_lock);
    }
    pending_less(c, k); /* indexed (live now) or never to be */
    if (k->rc && !k->told_only) { /* before telling: what the caller posts next must see it */
      pthread_mutex_lock(&c->cq_lock);
      if (!c->cq_failed) c->cq_failed = k->rc;
      pthread_mutex_unlock(&c->cq_lock);
    }
    if (k->settled && k->upto > k->from) k->settled(k->settled_arg, k->from, k->upto, k->rc);
    pthread_mutex_lock(&c->cq_lock);
    chunk_free(c, k);
    c->in_flight--;
    pthread_cond_broadcast(&c->cq_cv);
  }
  pthread_mutex_unlock(&c->cq_lock);
  return NULL;
}

int cold_committer_start(kvt_cold *c) {
  int rc = -pthread_create(&c->writer, NULL, writer_main, c);
  if (rc) return rc;
  c->writer_on = 1;
  rc = -pthread_create(&c->committer, NULL, committer_main, c);
  if (!rc) c->committer_on = 1;
  return rc;
}

/* Both threads are idle by now: kvt_cold_close drained the pipeline. */
void cold_committer_stop(kvt_cold *c) {
  if (!c->writer_on && !c->committer_on) return;
  pthread_mutex_lock(&c->cq_lock);
  c->cq_stop = 1;
  pthread_cond_broadcast(&c->cq_cv);
  pthread_mutex_unlock(&c->cq_lock);
  if (c->writer_on) pthread_join(c->writer, NULL);
  if (c->committer_on) pthread_join(c->committer, NULL);
  c->writer_on = c->committer_on = 0;
}

/* Staging buffer buf (held) can take need bytes. Sized for a whole group
 * the first time, and the other one too while it is free: grown (and its
 * pages touched) once, not chunk by chunk on the write path. */
static int stage_ensure(kvt_cold *c, int buf, size_t need) {
  size_t want = need > c->cfg.group_bytes ? need : c->cfg.group_bytes;
  if (c->stage_cap[buf] >= need) return 0;
  int rc = ensure(c, &c->stage[buf], &c->stage_cap[buf], want);
  pthread_mutex_lock(&c->cq_lock);
  int other = !c->stage_busy[!buf];
  if (other) c->stage_busy[!buf] = 1;
  pthread_mutex_unlock(&c->cq_lock);
  if (other) {
    if (!rc && c->stage_cap[!buf] < want) rc = ensure(c, &c->stage[!buf], &c->stage_cap[!buf], want);
    pthread_mutex_lock(&c->cq_lock);
    c->stage_busy[!buf] = 0;
    pthread_cond_broadcast(&c->cq_cv);
    pthread_mutex_unlock(&c->cq_lock);
  }
  return rc;
}

/* How many of recs[0..n) go in one chunk (at least one), and the staging
 * and plane bytes they need. */
static size_t chunk_count(kvt_cold *c, const kvt_cold_rec *recs, size_t n, size_t *stage_need,
                          size_t *plane_need) {
  size_t m = 0;
  *stage_need = *plane_need = 0;
  while (m < n) { /* the chunk's records */
    uint64_t max = kvt_cold_record_max(recs[m].n_layers, recs[m].bytes_each);
    if (m && *stage_need + max > c->cfg.group_bytes) break;
    *stage_need += max;
    size_t pn = 2 * (size_t)recs[m].bytes_each + ZSTD_compressBound(4096);
    if (pn > *plane_need) *plane_need = pn;
    m++;
  }
  return m;
}

/* Record r placed in segment id: its slices and parts allocated, built at
 * dst in staging (*staged bytes), the segment's use and pending bytes
 * counted. */
static int chunk_place(kvt_cold *c, chunk *k, const kvt_cold_rec *r, int id, uint8_t *dst,
                       size_t *staged) {
  size_t np = k->np;
  placed *p = &k->pl[np];
  k->sl[np] = kvt_mem_alloc(c->mem, KVT_MEM_OTHER, sl_bytes(r->n_layers));
  p->parts = kvt_mem_alloc(c->mem, KVT_MEM_OTHER, parts_bytes(r->n_layers));
  if (!k->sl[np] || !p->parts) {
    kvt_mem_free(c->mem, KVT_MEM_OTHER, k->sl[np], sl_bytes(r->n_layers));
    kvt_mem_free(c->mem, KVT_MEM_OTHER, p->parts, parts_bytes(r->n_layers));
    return -ENOMEM;
  }
  seg *s = &c->segs[id];
  p->seg = (uint32_t)id;
  p->off = s->used;
  uint32_t len = build_record(c, r, s->gen, dst, &p->e, k->sl[np], p->parts, staged);
  p->e.seg = (uint32_t)id;
  p->e.offset = p->off;
  pthread_mutex_lock(&c->st_lock); /* the committer saves segment rows */
  s->used += len;
  c->pending_bytes += len;
  pthread_mutex_unlock(&c->st_lock);
  k->bytes += len;
  add_touched(k->touched, &k->n_touched, (uint32_t)id);
  k->np = np + 1;
  return 0;
}

/* Place and build recs[0..m) into chunk k from stage on, skipping the
 * indexed ones (without a victim). *used: records looked at; *full: no
 * room for recs[*used]; *n_parts: pieces to write. */
static int chunk_fill(kvt_cold *c, chunk *k, const kvt_cold_rec *recs, size_t m, size_t n,
                      uint8_t *stage, uint32_t *sealed, size_t *n_sealed, size_t *used, int *full,
                      size_t *n_parts) {
  MDB_txn *rt = NULL;
  int rc = mdb_err(mdb_txn_begin(c->env, NULL, MDB_RDONLY, &rt));
  size_t stage_off = 0, i = 0;
  for (; i < m && !rc; i++) {
    if (!k->vic && key_indexed(c, rt, &recs[i].key)) continue;
    uint64_t max = kvt_cold_record_max(recs[i].n_layers, recs[i].bytes_each);
    if (max > c->cfg.segment_bytes) {
      rc = KVT_EOPTION; /* a record must fit a segment */
      break;
    }
    int id = seg_for(c, max, k->vic ? 0 : 1, sealed, n_sealed);
    if (id < 0 && id != KVT_EFULL) {
      rc = id;
      break;
    }
    if (id < 0) {
      pthread_mutex_lock(&c->st_lock);
      c->st.full_refusals += n - i;
      pthread_mutex_unlock(&c->st_lock);
      *full = 1;
      break;
    }
    size_t staged;
    rc = chunk_place(c, k, &recs[i], id, stage + stage_off, &staged);
    if (rc) break;
    stage_off += staged;
    *n_parts += recs[i].n_layers + 1;
  }
  *used = i;
  if (rt) mdb_txn_abort(rt);
  return rc;
}

/* One write per piece of k's records; pieces adjacent both in memory and
 * on disk merge. */
static int chunk_writes(chunk *k, kvt_cold *c, size_t n_parts) {
  if (!(k->w = kvt_mem_calloc(c->mem, KVT_MEM_OTHER, (n_parts + 1) * sizeof *k->w))) return -ENOMEM;
  k->w_cap = n_parts + 1;
  for (size_t j = 0; j < k->np; j++) {
    uint64_t off = k->pl[j].off;
    int fd = c->segs[k->pl[j].seg].fd;
    for (uint32_t l = 0; l <= k->pl[j].e.n_layers; l++) {
      const part *pt = &k->pl[j].parts[l];
      kvt_io_req *last = k->nw ? &k->w[k->nw - 1] : NULL;
      if (last && last->fd == fd && last->off + last->len == off &&
          (const uint8_t *)last->buf + last->len == pt->buf && (uint64_t)last->len + pt->len < (1u << 30)) {
        last->len += pt->len;
      } else {
        k->w[k->nw++] = (kvt_io_req){.fd = fd, .op = KVT_IO_OP_WRITE, .buf = (void *)pt->buf,
                                     .len = pt->len, .off = off};
      }
      off += pt->len;
    }
  }
  return 0;
}

/* A chunk for m (>= 1) records holding staging buffer buf; NULL without
 * memory. */
static chunk *chunk_new(kvt_cold *c, size_t m, int buf, const victim *vic) {
  kvt_mem *mem = c->mem;
  chunk *k = kvt_mem_calloc(mem, KVT_MEM_OTHER, sizeof *k);
  if (!k) return NULL;
  k->buf = buf;
  k->cap = m;
  k->pl = kvt_mem_calloc(mem, KVT_MEM_OTHER, m * sizeof *k->pl);
  k->sl = kvt_mem_calloc(mem, KVT_MEM_OTHER, m * sizeof *k->sl);
  k->touched = kvt_mem_calloc(mem, KVT_MEM_OTHER, (2 * m + 2) * sizeof *k->touched);
  k->vic = vic;
  return k;
}

/* Place and build records from recs[0] on, up to group_bytes of them (at
 * least one), in staging buffer `buf`, and list their writes. *used:
 * records looked at (placed, or skipped as indexed); *full: the tier had
 * no room for recs[*used]. Returns 0 with *out the chunk (NULL when there
 * is nothing to write), or an error (nothing of it will be indexed). The
 * chunk holds buf until written; without a chunk, buf is released. */
static int chunk_build(kvt_cold *c, const kvt_cold_rec *recs, size_t n, const victim *vic,
                       int buf, chunk **out, size_t *used, int *full) {
  *out = NULL;
  *used = 0;
  *full = 0;
  size_t stage_need, plane_need, n_sealed = 0, n_parts = 0;
  size_t m = chunk_count(c, recs, n, &stage_need, &plane_need);
  c->post_more = m < n;
  chunk *k = chunk_new(c, m, buf, vic);
  uint32_t *sealed = kvt_mem_calloc(c->mem, KVT_MEM_OTHER, (m + 1) * sizeof *sealed);
  int rc = k && sealed ? 0 : -ENOMEM;
  if (!rc && (!k->pl || !k->sl || !k->touched)) rc = -ENOMEM;
  if (!rc) rc = stage_ensure(c, buf, stage_need + STAGE_SLACK);
  if (!rc) rc = ensure(c, &c->plane, &c->plane_cap, plane_need);
  if (!rc) rc = chunk_fill(c, k, recs, m, n, c->stage[buf], sealed, &n_sealed, used, full, &n_parts);
  for (size_t j = 0; k && j < n_sealed; j++) add_touched(k->touched, &k->n_touched, sealed[j]);
  kvt_mem_free(c->mem, KVT_MEM_OTHER, sealed, (m + 1) * sizeof *sealed);
  /* The descriptors the writer and committer use stay open until then. */
  for (size_t j = 0; !rc && k && j < k->n_touched; j++) {
    int fd;
    rc = cold_seg_hold(c, k->touched[j], &fd);
    if (!rc) k->n_held++;
  }
  if (!rc) rc = chunk_writes(k, c, n_parts);
  if (rc || (k->np == 0 && k->n_touched == 0)) {
    if (k) {
      k->buf = -1;
      pending_less(c, k);
    }
    chunk_free(c, k);
    pthread_mutex_lock(&c->cq_lock);
    c->stage_busy[buf] = 0;
    pthread_cond_broadcast(&c->cq_cv);
    pthread_mutex_unlock(&c->cq_lock);
    return rc;
  }
  *out = k;
  return 0;
}

/* Hand chunk k to the writer (a chunk with no writes goes through it too,
 * so that everything settles in order). */
static void chunk_post(kvt_cold *c, chunk *k) {
  pthread_mutex_lock(&c->cq_lock);
  c->in_flight++;
  q_push(&c->wq_head, &c->wq_tail, k);
  pthread_cond_broadcast(&c->cq_cv);
  pthread_mutex_unlock(&c->cq_lock);
}

int kvt_cold_drain(kvt_cold *c) {
  if (!c->committer_on) return 0;
  pthread_mutex_lock(&c->cq_lock);
  while (c->in_flight) pthread_cond_wait(&c->cq_cv, &c->cq_lock);
  int rc = c->cq_failed;
  c->cq_failed = c->wq_failed = 0;
  pthread_mutex_unlock(&c->cq_lock);
  return rc;
}

/* Build and post records as chunks of at most group_bytes, placed in
 * order (the pipeline above). New records (vic NULL) skip keys already
 * indexed and leave one spare segment for relocations; relocated ones
 * (from segment vic) may use it. Every record of recs[0..*posted) will be
 * told of through settled, in order, after everything posted before:
 * those that could not be written or posted with the reason (a chunk
 * that only tells). *posted is n unless memory for that ran out (then
 * the pipeline has drained). Returns 0 when all were written or posted;
 * KVT_EFULL (no room for a record), an error from building, or -ENOMEM.
 * After a failure the pipeline drains before going on. */
int cold_post_chunks(kvt_cold *c, const kvt_cold_rec *recs, size_t n, const victim *vic,
                       size_t *posted, kvt_cold_settled_fn settled, void *arg) {
  *posted = 0;
  pthread_mutex_lock(&c->cq_lock);
  int failed = c->cq_failed | c->wq_failed;
  pthread_mutex_unlock(&c->cq_lock);
  if (failed) kvt_cold_drain(c); /* told to its callers already: start afresh */
  size_t at = 0, told = 0; /* told: records posted or settled so far */
  int rc = 0, full = 0;
  while (at < n && !rc && !full) {
    pthread_mutex_lock(&c->cq_lock);
    failed = c->cq_failed ? c->cq_failed : c->wq_failed; /* the rest would not be indexed */
    pthread_mutex_unlock(&c->cq_lock);
    if (failed) break;
    chunk *k;
    size_t used;
    rc = chunk_build(c, recs + at, n - at, vic, stage_get(c), &k, &used, &full);
    if (rc) break;
    at += used;
    pthread_mutex_lock(&c->cq_lock);
    int idle = c->in_flight == 0 && !c->cq_failed && !c->wq_failed;
    pthread_mutex_unlock(&c->cq_lock);
    if (!k && idle) { /* nothing to write, nothing before it: settled already */
      if (settled && at > told) settled(arg, told, at, 0);
      told = at;
      continue;
    }
    if (!k && !(k = kvt_mem_calloc(c->mem, KVT_MEM_OTHER, sizeof *k))) { /* settles once what came before does */
      rc = -ENOMEM;
      break;
    }
    if (!k->pl) k->buf = -1;
    k->from = told;
    k->upto = told = at;
    k->settled = settled;
    k->settled_arg = arg;
    chunk_post(c, k);
  }
  if (!rc && full) rc = KVT_EFULL;
  if (rc) {
    pthread_mutex_lock(&c->st_lock);
    c->st.write_failures++;
    pthread_mutex_unlock(&c->st_lock);
  }
  if (told < n) { /* the rest are told of in order too, after what went before */
    chunk *k = kvt_mem_calloc(c->mem, KVT_MEM_OTHER, sizeof *k);
    if (k) {
      *k = (chunk){.buf = -1, .from = told, .upto = n, .settled = settled, .settled_arg = arg,
                   .rc = rc ? rc : failed ? failed : KVT_EFULL, .inherited = 1, .told_only = 1};
      chunk_post(c, k);
      told = n;
    } else {
      kvt_cold_drain(c); /* so that the caller's telling of the rest comes after */
      if (!rc) rc = -ENOMEM;
    }
  }
  *posted = told;
  return rc;
}

/* A synchronous write: post, then wait until all of it settled. */
typedef struct sync_count {
  kvt_cold_settled_fn settled;
  void *arg;
  size_t indexed;             /* leading records indexed */
  int rc;                     /* the first failure told */
} sync_count;

static void sync_settled(void *arg, size_t from, size_t to, int rc) {
  sync_count *sc = arg;
  if (!rc && from == sc->indexed) sc->indexed = to;
  if (rc && !sc->rc) sc->rc = rc;
  if (sc->settled) sc->settled(sc->arg, from, to, rc);
}

int cold_write_sync(kvt_cold *c, const kvt_cold_rec *recs, size_t n, const victim *vic,
                      size_t *written) {
  sync_count sc = {0};
  size_t posted;
  int rc = cold_post_chunks(c, recs, n, vic, &posted, sync_settled, &sc);
  int drc = kvt_cold_drain(c);
  if (!rc) rc = sc.rc ? sc.rc : drc;
  if (!rc && sc.indexed < n) rc = KVT_EFULL;
  if (written) *written = sc.indexed;
  return rc;
}
