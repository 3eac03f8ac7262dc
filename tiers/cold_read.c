/* cold_read.c - the cold tier's reads: one layer at once, checked
 * against the index and its checksum, and batches served by reader
 * threads that merge small adjacent slices. */
#include "tiers/cold_internal.h"

/* Read len bytes at off of segment id into a new aligned buffer. */
int cold_read_range(kvt_cold *c, uint32_t id, uint64_t off, uint32_t len, uint8_t **out) {
  int fd;
  int rc = cold_seg_hold(c, id, &fd);
  if (rc) return rc;
  uint8_t *buf = cold_buf_alloc(c, len);
  if (!buf) {
    cold_seg_release(c, id);
    return -ENOMEM;
  }
  kvt_io_req r = {.fd = fd, .op = KVT_IO_OP_READ, .buf = buf, .len = len, .off = off};
  uint64_t t0 = kvt_hist_now_ns();
  pthread_mutex_lock(&c->rd_lock);
  rc = kvt_io_run(c->rio, &r, 1);
  pthread_mutex_unlock(&c->rd_lock);
  if (!rc) kvt_hist_add(&c->h_read, kvt_hist_now_ns() - t0);
  cold_seg_release(c, id);
  if (rc) {
    cold_buf_free(c, buf, len);
    return rc == -EIO && r.res >= 0 ? KVT_ECORRUPT : rc; /* short: past the end */
  }
  *out = buf;
  return 0;
}

/* Is the slice at p what the index says of (key, layer) in this
 * generation? The checksum is seeded with exactly those. */
int cold_slice_ok(const uint8_t *p, const kvt_cold_entry *e, uint32_t layer, const kvt_cold_slice *s) {
  return kvt_hash64(p, s->stored_len, cold_slice_seed(&e->key, layer, e->seg_gen)) == s->checksum;
}

/* Decode a checked payload into K||V split across k_out and v_out; dz
 * decompresses (one thread at a time). */
static int decode_payload(kvt_cold *c, ZSTD_DCtx *dz, const uint8_t *p, const kvt_cold_slice *s,
                          uint32_t esize, void *k_out, void *v_out, size_t each) {
  return kvt_rec_payload_decode(c->mem, dz, p, s, esize, k_out, v_out, each);
}

/* decode_payload for a synchronous read (any thread). */
static int decode_sync(kvt_cold *c, const uint8_t *p, const kvt_cold_slice *s, uint32_t esize,
                       void *k_out, void *v_out, size_t each) {
  if (s->codec == KVT_COLD_CODEC_RAW) return decode_payload(c, NULL, p, s, esize, k_out, v_out, each);
  pthread_mutex_lock(&c->dz_lock);
  if (!c->dctx_sync) c->dctx_sync = ZSTD_createDCtx();
  int rc = decode_payload(c, c->dctx_sync, p, s, esize, k_out, v_out, each);
  pthread_mutex_unlock(&c->dz_lock);
  return rc;
}


/* A read of key at `seen` failed a check. If the index still points
 * there, the record is bad: its entry leaves the index (KVT_ECORRUPT).
 * If it points elsewhere now (a reclaim relocated it meanwhile, and the
 * old place may hold new bytes), 1: read again. Gone: KVT_ENOTFOUND. */
static int bad_or_moved(kvt_cold *c, const kvt_key *key, const kvt_cold_entry *seen) {
  MDB_txn *t;
  int rd = c->cfg.rdonly;
  if (mdb_txn_begin(c->env, NULL, rd ? MDB_RDONLY : 0, &t)) return KVT_ECORRUPT;
  kvt_cold_entry cur;
  int rc = cold_find_locked(c, t, key, &cur, NULL, 0);
  if (rc == KVT_ECORRUPT) rc = 0, cur = *seen; /* an unparsable entry: bad */
  if (!rc && (cur.seg != seen->seg || cur.seg_gen != seen->seg_gen || cur.offset != seen->offset))
    rc = 1;
  if (rc || rd) {
    mdb_txn_abort(t);
    return rc ? rc : KVT_ECORRUPT;
  }
  cold_txn_end(c, t, cold_remove_in(c, t, key)); /* not synced: if lost, the next failed check removes it */
  return KVT_ECORRUPT;
}

static int read_layer_once(kvt_cold *c, const kvt_key *key, uint32_t layer, void *k_out,
                           void *v_out, size_t bytes_each, int final);

/* A record that fails its check twice leaves the index (KVT_ECORRUPT);
 * one that moved while being read is read again where it is now. */
int kvt_cold_read_layer(kvt_cold *c, const kvt_key *key, uint32_t layer, void *k_out, void *v_out,
                        size_t bytes_each) {
  int rc = KVT_ENOTFOUND;
  for (int tries = 0; tries < 3; tries++) {
    rc = read_layer_once(c, key, layer, k_out, v_out, bytes_each, tries > 0);
    if (rc != 1) return rc;
  }
  return KVT_ENOTFOUND; /* kept moving: a miss */
}

/* One try: 0, an error, or 1 (read again: it moved, or it failed a check
 * and this was not the final try). */
static int read_layer_once(kvt_cold *c, const kvt_key *key, uint32_t layer, void *k_out,
                           void *v_out, size_t bytes_each, int final) {
  MDB_txn *t;
  kvt_cold_entry e = {0};
  kvt_cold_slice s = {0};
  int rc = mdb_err(mdb_txn_begin(c->env, NULL, MDB_RDONLY, &t));
  if (rc) return rc;
  rc = cold_find_locked(c, t, key, &e, &s, layer);
  mdb_txn_abort(t);
  if (rc && rc != KVT_ECORRUPT) return rc; /* an entry that does not parse: bad, below */
  if (!rc && cold_seg_trouble(c, e.seg)) return KVT_ENOTFOUND; /* file gone: a miss; fsck --repair */
  if (!rc && bytes_each != e.bytes_each) return KVT_EBUFSIZE;
  uint32_t len = (uint32_t)kvt_align4k(s.stored_len);
  uint8_t *buf = NULL;
  if (rc || s.rel_off + (uint64_t)len > e.rec_len) rc = KVT_ECORRUPT;
  else rc = cold_read_range(c, e.seg, e.offset + s.rel_off, len, &buf);
  if (!rc && !cold_slice_ok(buf, &e, layer, &s)) rc = KVT_ECORRUPT;
  if (!rc) rc = decode_sync(c, buf, &s, (uint32_t)kvt_dtype_size(e.dtype), k_out, v_out,
                            bytes_each);
  cold_buf_free(c, buf, len);
  if (rc == KVT_ECORRUPT) rc = final ? bad_or_moved(c, key, &e) : 1;
  pthread_mutex_lock(&c->st_lock);
  if (rc == KVT_ECORRUPT) c->st.checksum_failures++;
  if (!rc) {
    c->st.reads++;
    c->st.read_bytes += len;
  }
  pthread_mutex_unlock(&c->st_lock);
  return rc;
}

/* ---------- asynchronous reads ---------- */

struct kvt_cold_batch {
  kvt_store_batch base;        /* first: waited for through the store interface */
  pthread_mutex_t m;
  pthread_cond_t cv;
  size_t pending;
  void (*notify)(void *arg);   /* told once pending reaches 0 (the tier's read_notify) */
  void *notify_arg;
  kvt_mem *mem;                /* counted in (the engine's: it outlives the store) */
};

static void read_done(kvt_cold_read *r, int status) {
  kvt_cold_batch *b = r->batch;
  void (*notify)(void *) = b->notify; /* b may be freed once pending is 0 */
  void *arg = b->notify_arg;
  r->status = status;
  pthread_mutex_lock(&b->m);
  int last = --b->pending == 0;
  if (last) pthread_cond_signal(&b->cv);
  pthread_mutex_unlock(&b->m);
  if (last && notify) notify(arg);
}

void kvt_cold_set_read_notify(kvt_cold *c, void (*notify)(void *arg), void *arg) {
  c->read_notify = notify;
  c->read_notify_arg = arg;
}

int kvt_cold_read_done(kvt_cold_batch *b) {
  if (!b) return 1;
  pthread_mutex_lock(&b->m);
  int done = b->pending == 0;
  pthread_mutex_unlock(&b->m);
  return done;
}

/* The reader serves requests in spans: small slices that follow each
 * other on disk (the layers of a block, the blocks of a prefix: one
 * record after another, a 4 KiB header between) share one read, since
 * the device runs out of operations per second long before bandwidth on
 * them. Slices of 64 KiB and more are read one by one, many in flight:
 * merging those measured slower here. */
#define READER_SLOTS 256           /* requests looked up and in flight */
#define SPAN_SMALL (64u << 10)     /* slices shorter than this are merged */
#define SPAN_MAX (256u << 10)      /* bytes one merged read covers, at most */
#define SPAN_GAP (4u << 10)        /* bytes read through between two slices */

struct span;

/* One request: where its slice is, and the span that reads it. */
typedef struct inflight {
  kvt_cold_read *r;
  kvt_cold_entry e;
  kvt_cold_slice s;
  int fd;
  uint64_t off;                /* of the slice in the segment */
  uint32_t len;                /* 4 KiB aligned */
  struct span *sp;
  struct inflight *sp_next;    /* the span's next request */
} inflight;

/* A read buffer, kept while the reader is busy: fresh pages fault in at
 * under 1 GB/s here. At most one per read in flight. */
typedef struct rbuf {
  uint8_t *p;
  size_t cap;
} rbuf;

/* One read (resubmitted for its rest when short) and the requests it
 * serves, in disk order. */
typedef struct span {
  kvt_io_req io;
  uint64_t start, got;         /* where the span starts; bytes read so far */
  rbuf b;
  inflight *first, *last;
  uint64_t t0_ns;              /* first submitted (h_read) */
  struct span *next;           /* free list / ready queue */
} span;

/* The entry the reader looked up last, in the read transaction under
 * way: loads come a block's layers at a time, so most requests find
 * their key here instead of in the B-tree. */
typedef struct last_entry {
  int have;
  kvt_key key;
  MDB_val v;                   /* valid until the transaction ends */
  kvt_cold_entry e;
} last_entry;

static int find_cached(kvt_cold *c, MDB_txn *t, last_entry *le, const kvt_key *key,
                       kvt_cold_entry *e, kvt_cold_slice *one, uint32_t layer) {
  if (!le->have || memcmp(le->key.b, key->b, 16) != 0) {
    MDB_val k = {16, (void *)key->b};
    le->have = 0;
    int rc = mdb_get(t, c->db_blocks, &k, &le->v);
    if (rc) return mdb_err(rc);
    rc = cold_get_entry(key, &le->v, &le->e);
    if (rc) return rc;
    le->have = 1;
    le->key = *key;
  }
  *e = le->e;
  if (layer >= e->n_layers) return KVT_ENOTFOUND;
  cold_get_slice(cold_entry_slice(&le->v, layer), one);
  return 0;
}

/* Look a request up; 1 when it is to be read, else completed at once. */
static int read_lookup(kvt_cold *c, MDB_txn *t, last_entry *le, kvt_cold_read *r, inflight *f) {
  int rc = find_cached(c, t, le, &r->key, &f->e, &f->s, r->layer);
  f->len = (uint32_t)kvt_align4k(f->s.stored_len);
  f->fd = -1;
  if (!rc && r->bytes_each != f->e.bytes_each) rc = KVT_EBUFSIZE;
  if (!rc && f->s.rel_off + (uint64_t)f->len > f->e.rec_len) rc = KVT_ECORRUPT;
  if (!rc && cold_seg_trouble(c, f->e.seg)) rc = KVT_ENOTFOUND; /* file gone: a miss; fsck --repair */
  if (!rc) rc = cold_seg_hold(c, f->e.seg, &f->fd); /* released by read_finish */
  if (rc) {
    if (rc == KVT_ECORRUPT) {
      pthread_mutex_lock(&c->st_lock);
      c->st.checksum_failures++;
      pthread_mutex_unlock(&c->st_lock);
    }
    read_done(r, rc);
    return 0;
  }
  f->r = r;
  f->off = f->e.offset + f->s.rel_off;
  f->sp = NULL;
  f->sp_next = NULL;
  return 1;
}

static uint64_t span_end(const span *sp) { return sp->last->off + sp->last->len; }

/* Can f join span sp: both small, f follows on disk, close enough, cold_fits? */
static int span_joins(const span *sp, const inflight *f) {
  uint64_t end = span_end(sp);
  return f->len < SPAN_SMALL && sp->first->len < SPAN_SMALL && f->fd == sp->io.fd &&
         f->off >= end && f->off - end <= SPAN_GAP && f->off + f->len - sp->start <= SPAN_MAX;
}

/* Check and decode one request its span read (res: what the read gave it). */
static void read_finish(kvt_cold *c, ZSTD_DCtx *dz, inflight *f, int res) {
  kvt_cold_read *r = f->r;
  cold_seg_release(c, f->e.seg); /* the read is over */
  f->fd = -1;
  const uint8_t *p = res ? NULL : f->sp->b.p + (f->off - f->sp->start);
  int rc = res;
  if (!rc && !cold_slice_ok(p, &f->e, r->layer, &f->s)) rc = KVT_ECORRUPT;
  if (!rc) rc = decode_payload(c, dz, p, &f->s, (uint32_t)kvt_dtype_size(f->e.dtype),
                               r->k_out, r->v_out, r->bytes_each);
  if (rc == KVT_ECORRUPT) { /* bad: removed; moved meanwhile: a miss (not read again here) */
    rc = bad_or_moved(c, &r->key, &f->e);
    if (rc == 1) rc = KVT_ENOTFOUND;
  }
  pthread_mutex_lock(&c->st_lock);
  if (rc == KVT_ECORRUPT) c->st.checksum_failures++;
  if (!rc) {
    c->st.reads++;
    c->st.read_bytes += f->len;
  }
  pthread_mutex_unlock(&c->st_lock);
  f->r = NULL;
  read_done(r, rc);
}

/* A read of span sp is over (io.res). Finishes the requests it covered
 * in full (all of them on an error: -errno, nothing removed; at end of
 * file, the rest: what lies past it is bad). Returns 1 when every request
 * is finished, 0 when the rest is set up to be read (a short read:
 * resubmitted from where it stopped, as kvt_io_run() does). *n_fin counts
 * the requests finished. */
static int span_done(kvt_cold *c, ZSTD_DCtx *dz, span *sp, size_t *n_fin) {
  int32_t res = sp->io.res;
  uint64_t total = span_end(sp) - sp->start;
  if (res > 0) sp->got += (uint64_t)res;
  int eof = res == 0 && sp->got < total;
  for (inflight *f = sp->first; f; f = sp->first) {
    uint64_t f_end = f->off + f->len - sp->start;
    if (res >= 0 && f_end > sp->got && !eof) break; /* to be read yet */
    sp->first = f->sp_next;
    read_finish(c, dz, f, res < 0 ? res : f_end <= sp->got ? 0 : KVT_ECORRUPT);
    (*n_fin)++;
  }
  if (!sp->first) {
    sp->last = NULL;
    return 1;
  }
  sp->io.off = sp->start + sp->got;
  sp->io.buf = sp->b.p + sp->got;
  sp->io.len = (uint32_t)(total - sp->got);
  return 0;
}

/* Did sp's read just complete with every byte it asked for (not short,
 * not failed)? */
static int span_read_whole(const span *sp) {
  return sp->io.res > 0 && sp->got + (uint64_t)sp->io.res >= span_end(sp) - sp->start;
}

/* A buffer for sp's read from the pool (grown when too small). */
static int span_buf(kvt_cold *c, span *sp, rbuf *pool, size_t *n_pool) {
  size_t len = span_end(sp) - sp->start;
  sp->b = *n_pool ? pool[--*n_pool] : (rbuf){0};
  if (sp->b.cap >= len) return 0;
  size_t cap = len < (64u << 10) ? 64u << 10 : len;
  uint8_t *p = cold_buf_alloc(c, cap);
  if (!p) {
    pool[(*n_pool)++] = sp->b; /* keep what there was */
    sp->b = (rbuf){0};
    return -ENOMEM;
  }
  cold_buf_free(c, sp->b.p, sp->b.cap);
  sp->b = (rbuf){p, cap};
  return 0;
}

/* The reader goes idle (or stops): the pool's buffers go. */
static void pool_trim(kvt_cold *c, rbuf *pool, size_t *n_pool) {
  for (size_t i = 0; i < *n_pool; i++) {
    cold_buf_free(c, pool[i].p, pool[i].cap);
  }
  *n_pool = 0;
}

/* What one reader thread keeps between rounds. */
typedef struct reader {
  kvt_cold *c;
  kvt_io *aio;
  ZSTD_DCtx *dz;
  inflight *slots;            /* [READER_SLOTS]: requests looked up */
  span *spans;                /* [READER_SLOTS] */
  rbuf pool[READER_SLOTS];    /* span buffers kept for reuse */
  kvt_io_req *start[READER_SLOTS], *done[READER_SLOTS];
  size_t n_req, n_io, n_pool, depth;
  span *free_sp, *ready, **ready_tail; /* ready: spans to start, in order */
} reader;

/* Wait for requests; take as many as there are free slots. NULL with
 * nothing in flight and nothing queued: the reader stops. *stop is set
 * then. */
static kvt_cold_read *reader_take(reader *rd, int *stop) {
  kvt_cold *c = rd->c;
  *stop = 0;
  pthread_mutex_lock(&c->rq_lock);
  if (!c->rq_head && !rd->n_req) {
    pthread_mutex_unlock(&c->rq_lock);
    pool_trim(c, rd->pool, &rd->n_pool);
    pthread_mutex_lock(&c->rq_lock);
  }
  while (!c->rq_head && !rd->n_req && !c->reader_stop) pthread_cond_wait(&c->rq_cv, &c->rq_lock);
  if (!c->rq_head && !rd->n_req && c->reader_stop) {
    pthread_mutex_unlock(&c->rq_lock);
    *stop = 1;
    return NULL;
  }
  kvt_cold_read *take = NULL, **tail = &take;
  for (size_t room = READER_SLOTS - rd->n_req; c->rq_head && room; room--) {
    kvt_cold_read *r = c->rq_head;
    c->rq_head = r->next;
    r->next = NULL;
    *tail = r;
    tail = &r->next;
  }
  if (!c->rq_head) c->rq_tail = NULL;
  pthread_mutex_unlock(&c->rq_lock);
  return take;
}

/* Look the requests up, then group them into spans, in request order. */
static void reader_group(reader *rd, kvt_cold_read *take) {
  kvt_cold *c = rd->c;
  MDB_txn *t = NULL;
  int rc = mdb_err(mdb_txn_begin(c->env, NULL, MDB_RDONLY, &t));
  span *cur = NULL;
  last_entry le = {0};
  for (kvt_cold_read *r = take, *next; r; r = next) {
    next = r->next;
    if (rc) {
      read_done(r, rc);
      continue;
    }
    size_t i = 0;
    while (rd->slots[i].r) i++;
    inflight *f = &rd->slots[i];
    if (!read_lookup(c, t, &le, r, f)) continue;
    rd->n_req++;
    if (cur && span_joins(cur, f)) {
      cur->last->sp_next = f;
    } else {
      cur = rd->free_sp; /* there is one: spans in use <= requests in flight */
      rd->free_sp = cur->next;
      cur->next = NULL;
      cur->io = (kvt_io_req){.fd = f->fd, .op = KVT_IO_OP_READ, .off = f->off, .user = cur};
      cur->start = f->off;
      cur->got = 0;
      cur->b = (rbuf){0};
      cur->first = f;
      *rd->ready_tail = cur;
      rd->ready_tail = &cur->next;
    }
    cur->last = f;
    f->sp = cur;
  }
  if (t) mdb_txn_abort(t);
}

/* Start what the ring takes; the rest waits for completions. Returns how
 * many of rd->start to submit. */
static size_t reader_ready(reader *rd) {
  kvt_cold *c = rd->c;
  size_t n_start = 0;
  while (rd->ready && rd->n_io + n_start < rd->depth) {
    span *sp = rd->ready;
    rd->ready = sp->next;
    if (!rd->ready) rd->ready_tail = &rd->ready;
    sp->next = NULL;
    if (!sp->b.p) { /* a new span (a resubmitted one has its buffer) */
      if (span_buf(c, sp, rd->pool, &rd->n_pool)) { /* nothing to read into */
        size_t fin = 0;
        sp->io.res = -ENOMEM;
        span_done(c, rd->dz, sp, &fin); /* fails them all */
        rd->n_req -= fin;
        sp->next = rd->free_sp;
        rd->free_sp = sp;
        continue;
      }
      sp->io.len = (uint32_t)(span_end(sp) - sp->start);
      sp->io.buf = sp->b.p;
      sp->t0_ns = kvt_hist_now_ns();
    }
    rd->start[n_start++] = &sp->io;
  }
  return n_start;
}

/* Submit n_start reads and reap what completed into rd->done; returns how
 * many did. */
static size_t reader_io(reader *rd, size_t n_start) {
  kvt_cold *c = rd->c;
  int rc = n_start ? kvt_io_submit(rd->aio, rd->start, n_start) : 0;
  if (!rc) rd->n_io += n_start;
  size_t n_done = 0;
  if (rc) { /* none started: each fails as a read error would */
    for (size_t i = 0; i < n_start; i++) rd->start[i]->res = rc;
    memcpy(rd->done, rd->start, n_start * sizeof *rd->start);
    n_done = n_start;
  } else if (rd->n_io) {
    pthread_mutex_lock(&c->rq_lock);
    int more = c->rq_head != NULL && rd->n_req < READER_SLOTS;
    pthread_mutex_unlock(&c->rq_lock);
    /* A failed reap (EINTR and the like) leaves the reads in flight: their
     * buffers stay allocated until the kernel is done with them. */
    kvt_io_reap(rd->aio, more ? 0 : 1, rd->done, READER_SLOTS, &n_done);
    rd->n_io -= n_done;
  }
  return n_done;
}

/* Finish the n_done completed spans. */
static void reader_complete(reader *rd, size_t n_done) {
  kvt_cold *c = rd->c;
  for (size_t i = 0; i < n_done; i++) {
    span *sp = rd->done[i]->user;
    if (span_read_whole(sp)) /* counted before its requests are told */
      kvt_hist_add(&c->h_read, kvt_hist_now_ns() - sp->t0_ns);
    size_t fin = 0;
    int over = span_done(c, rd->dz, sp, &fin);
    rd->n_req -= fin;
    if (over) { /* its buffer back to the pool, itself to the free list */
      rd->pool[rd->n_pool++] = sp->b;
      sp->b = (rbuf){0};
      sp->next = rd->free_sp;
      rd->free_sp = sp;
    } else { /* short: the rest goes first */
      sp->next = rd->ready;
      if (!rd->ready) rd->ready_tail = &sp->next;
      rd->ready = sp;
    }
  }
}

static void *reader_main(void *arg) {
  struct reader_ctx *rx = arg;
  kvt_cold *c = rx->c;
  reader rd = {.c = c, .aio = c->aio[rx->i], .dz = c->dctx_async[rx->i]};
  rd.slots = kvt_mem_calloc(c->mem, KVT_MEM_OTHER, READER_SLOTS * sizeof *rd.slots);
  rd.spans = kvt_mem_calloc(c->mem, KVT_MEM_OTHER, READER_SLOTS * sizeof *rd.spans);
  rd.depth = c->cfg.io.depth ? c->cfg.io.depth : 64;
  rd.depth = (rd.depth + c->n_readers - 1) / c->n_readers; /* the depth is shared: more in
                                                              flight measured slower here */
  if (rd.depth > READER_SLOTS) rd.depth = READER_SLOTS;
  rd.ready_tail = &rd.ready;
  for (size_t i = 0; rd.spans && i < READER_SLOTS; i++) {
    rd.spans[i].next = rd.free_sp;
    rd.free_sp = &rd.spans[i];
  }
  for (;;) {
    int stop;
    kvt_cold_read *take = reader_take(&rd, &stop);
    if (stop) break;
    if (take && (!rd.slots || !rd.spans)) { /* no memory for the reader: fail them */
      for (kvt_cold_read *r = take, *next; r; r = next) {
        next = r->next;
        read_done(r, -ENOMEM);
      }
      continue;
    }
    if (take) reader_group(&rd, take);
    reader_complete(&rd, reader_io(&rd, reader_ready(&rd)));
  }
  pool_trim(c, rd.pool, &rd.n_pool);
  kvt_mem_free(c->mem, KVT_MEM_OTHER, rd.slots, READER_SLOTS * sizeof *rd.slots);
  kvt_mem_free(c->mem, KVT_MEM_OTHER, rd.spans, READER_SLOTS * sizeof *rd.spans);
  return NULL;
}

int cold_reader_start(kvt_cold *c) {
  pthread_mutex_init(&c->rq_lock, NULL);
  pthread_cond_init(&c->rq_cv, NULL);
  int rc = 0;
  for (unsigned i = 0; !rc && i < c->n_readers; i++) {
    c->rctx[i] = (struct reader_ctx){.c = c, .i = i};
    rc = -pthread_create(&c->rctx[i].th, NULL, reader_main, &c->rctx[i]);
    if (!rc) c->readers_on++;
  }
  return rc;
}

void cold_reader_stop(kvt_cold *c) {
  if (!c->readers_on) return;
  pthread_mutex_lock(&c->rq_lock);
  c->reader_stop = 1;
  pthread_cond_broadcast(&c->rq_cv);
  pthread_mutex_unlock(&c->rq_lock);
  for (unsigned i = 0; i < c->readers_on; i++) pthread_join(c->rctx[i].th, NULL);
  pthread_mutex_destroy(&c->rq_lock);
  pthread_cond_destroy(&c->rq_cv);
  c->readers_on = 0;
}

static void batch_wait(kvt_store_batch *b) { kvt_cold_read_wait((kvt_cold_batch *)b); }
static int batch_done(kvt_store_batch *b) { return kvt_cold_read_done((kvt_cold_batch *)b); }

int kvt_cold_read_submit(kvt_cold *c, kvt_cold_read *reqs, size_t n, kvt_cold_batch **out) {
  *out = NULL;
  if (n == 0) return KVT_ECOUNT;
  kvt_cold_batch *b = kvt_mem_alloc(c->mem, KVT_MEM_OTHER, sizeof *b);
  if (!b) return -ENOMEM;
  b->mem = c->mem;
  b->base = (kvt_store_batch){.wait = batch_wait, .done = batch_done};
  pthread_mutex_init(&b->m, NULL);
  pthread_cond_init(&b->cv, NULL);
  b->pending = n;
  b->notify = c->read_notify;
  b->notify_arg = c->read_notify_arg;
  for (size_t i = 0; i < n; i++) {
    reqs[i].batch = b;
    reqs[i].status = 1; /* pending */
    reqs[i].next = i + 1 < n ? &reqs[i + 1] : NULL;
  }
  pthread_mutex_lock(&c->rq_lock);
  if (c->rq_tail) c->rq_tail->next = &reqs[0];
  else c->rq_head = &reqs[0];
  c->rq_tail = &reqs[n - 1];
  pthread_cond_broadcast(&c->rq_cv); /* every reader: a batch may need more than one */
  pthread_mutex_unlock(&c->rq_lock);
  *out = b;
  return 0;
}

void kvt_cold_read_wait(kvt_cold_batch *b) {
  if (!b) return;
  pthread_mutex_lock(&b->m);
  while (b->pending) pthread_cond_wait(&b->cv, &b->m);
  pthread_mutex_unlock(&b->m);
  pthread_mutex_destroy(&b->m);
  pthread_cond_destroy(&b->cv);
  kvt_mem_free(b->mem, KVT_MEM_OTHER, b, sizeof *b);
}
