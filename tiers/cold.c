/* cold.c - the cold tier (cold.h): the shell - the segment table and its
 * descriptor cache, open and close, namespaces, stats; the LMDB index is in
 * cold_index.c, writing in cold_write.c, reads in cold_read.c, reclaiming
 * and the eviction order in cold_reclaim.c (private state: cold_internal.h). */
#include "tiers/cold_internal.h"

/* ---------- segment table ----------
 * Its states and the function making each transition: cold_internal.h,
 * above enum seg_state. */

static void seg_row(const seg *s, uint8_t row[32]) {
  kvt_le_put64(row, s->gen);
  kvt_le_put64(row + 8, s->used);
  kvt_le_put64(row + 16, s->live);
  kvt_le_put32(row + 24, s->state);
  kvt_le_put32(row + 28, 0);
}

int cold_seg_save(kvt_cold *c, MDB_txn *t, uint32_t id) {
  uint8_t k[4], row[32];
  kvt_le_put32(k, id);
  pthread_mutex_lock(&c->st_lock);
  seg_row(&c->segs[id], row);
  pthread_mutex_unlock(&c->st_lock);
  MDB_val key = {4, k}, val = {32, row};
  return mdb_err(mdb_put(t, c->db_segs, &key, &val, 0));
}

static void seg_path(const kvt_cold *c, uint32_t id, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/segments/seg-%08u", c->dir, id);
}

/* ---------- segment descriptors: a bounded cache ----------
 * A store may have more segments than the process may open files, so a
 * segment's descriptor is opened when it is first needed and closed again,
 * least recently used first, once more than fd_max are open and it has no
 * holder. Whoever puts a descriptor into an I/O request holds it
 * (cold_seg_hold .. cold_seg_release) until the request is over, so it is never
 * closed, and its number never reused, under a read or write. */

/* Close idle descriptors, least recently used first, until at most
 * `most` are open (fewer than that when they are all held). st_lock held. */
static void fd_trim(kvt_cold *c, uint32_t most) {
  while (c->fd_open > most) {
    int best = -1;
    for (uint32_t id = 0; id < c->n_segs; id++) {
      const seg *s = &c->segs[id];
      if (s->fd >= 0 && !s->users && (best < 0 || s->tick < c->segs[best].tick)) best = (int)id;
    }
    if (best < 0) return;
    kvt_io_close(c->wio ? c->wio : c->rio, c->segs[best].fd);
    c->segs[best].fd = -1;
    c->fd_open--;
  }
}

/* Errors that say nothing of the file, only of this moment. */
int cold_transient(int rc) { return rc == -EMFILE || rc == -ENFILE || rc == -ENOMEM || rc == -EINTR; }

/* Open segment id's file into the cache when it is not open. A file that
 * is missing or not a regular file (a directory, a FIFO, a symbolic link)
 * is remembered in err and is KVT_ECORRUPT: its records are misses.
 * Returns 0, KVT_ECORRUPT or a cold_transient -errno. st_lock held. */
int cold_seg_open_locked(kvt_cold *c, uint32_t id, int create) {
  seg *s = &c->segs[id];
  if (s->fd >= 0) return 0;
  char path[4200];
  int direct, fd = -1;
  seg_path(c, id, path, sizeof path);
  kvt_io *io = c->wio ? c->wio : c->rio;
  fd_trim(c, c->fd_max ? c->fd_max - 1 : 0);
  int rc = kvt_io_open_regular(io, path, create, c->cfg.rdonly, &fd, &direct);
  if (rc == -EMFILE || rc == -ENFILE) { /* the process's other files: give back all idle ones */
    fd_trim(c, 0);
    rc = kvt_io_open_regular(io, path, create, c->cfg.rdonly, &fd, &direct);
  }
  if (rc) {
    if (cold_transient(rc)) return rc;
    s->err = rc;
    return KVT_ECORRUPT;
  }
  s->fd = fd;
  s->err = 0;
  s->have = 1;
  s->tick = ++c->fd_tick;
  c->fd_open++;
  return 0;
}

static int seg_open_file(kvt_cold *c, uint32_t id, int create) {
  pthread_mutex_lock(&c->st_lock);
  int rc = cold_seg_open_locked(c, id, create);
  pthread_mutex_unlock(&c->st_lock);
  return rc;
}

/* The descriptor of segment id, held open until cold_seg_release(). A reader
 * beside a live writer opens the segments the writer created after the
 * reader's open when it first needs them. 0, KVT_ECORRUPT (no such
 * segment, or no usable file) or a cold_transient -errno (-EMFILE). */
int cold_seg_hold(kvt_cold *c, uint32_t id, int *fd) {
  *fd = -1;
  if (id >= c->max_segs) return KVT_ECORRUPT;
  pthread_mutex_lock(&c->st_lock);
  int rc = id < c->n_segs || c->cfg.rdonly ? cold_seg_open_locked(c, id, 0) : KVT_ECORRUPT;
  if (!rc) {
    seg *s = &c->segs[id];
    s->users++;
    s->tick = ++c->fd_tick;
    *fd = s->fd;
    if (id >= c->n_segs) c->n_segs = id + 1;
  }
  pthread_mutex_unlock(&c->st_lock);
  return rc;
}

void cold_seg_release(kvt_cold *c, uint32_t id) {
  pthread_mutex_lock(&c->st_lock);
  if (c->segs[id].users) c->segs[id].users--;
  if (c->fd_open > c->fd_max) fd_trim(c, c->fd_max);
  pthread_mutex_unlock(&c->st_lock);
}

/* Why segment id cannot be read, in words, or NULL when it can be. */
const char *cold_seg_trouble(kvt_cold *c, uint32_t id) {
  pthread_mutex_lock(&c->st_lock);
  int err = id < c->max_segs ? c->segs[id].err : 0;
  pthread_mutex_unlock(&c->st_lock);
  switch (err) {
  case 0: return NULL;
  case -ENOENT: return "is missing";
  case -ELOOP: return "is a symbolic link";
  case -EISDIR: return "is a directory";
  case -EINVAL: return "is not a regular file";
  case -EACCES: return "is not readable (permission denied)";
  default: return "cannot be opened";
  }
}

static int kvt_io_exists_seg(const kvt_cold *c, uint32_t id) {
  char path[4200];
  seg_path(c, id, path, sizeof path);
  return kvt_io_exists(path);
}

/* ---------- open / close ---------- */


static int meta_get64(kvt_cold *c, MDB_txn *t, const char *name, uint64_t *v) {
  MDB_val key = {strlen(name), (void *)name}, val;
  int rc = mdb_get(t, c->db_meta, &key, &val);
  if (rc) return mdb_err(rc);
  if (val.mv_size != 8) return KVT_ECORRUPT;
  *v = kvt_le_get64(val.mv_data);
  return 0;
}

static int meta_put64(kvt_cold *c, MDB_txn *t, const char *name, uint64_t v) {
  uint8_t b[8];
  kvt_le_put64(b, v);
  MDB_val key = {strlen(name), (void *)name}, val = {8, b};
  return mdb_err(mdb_put(t, c->db_meta, &key, &val, 0));
}

/* Format version and segment size: created on first open, checked after. */
static int meta_init(kvt_cold *c, MDB_txn *t) {
  uint64_t ver, segb;
  int rc = meta_get64(c, t, "format", &ver);
  if (rc == KVT_ENOTFOUND) {
    if (c->cfg.rdonly) return KVT_ECORRUPT;
    rc = meta_put64(c, t, "format", FORMAT_VERSION);
    if (!rc) rc = meta_put64(c, t, "segment_bytes", c->cfg.segment_bytes);
    return rc;
  }
  if (rc) return rc;
  if (ver != FORMAT_VERSION) return KVT_EVERSION;
  rc = meta_get64(c, t, "segment_bytes", &segb);
  if (rc) return rc == KVT_ENOTFOUND ? KVT_ECORRUPT : rc;
  if (segb < KVT_IO_ALIGN || segb % KVT_IO_ALIGN) return KVT_ECORRUPT;
  c->cfg.segment_bytes = segb; /* a property of the store, not of this open */
  return 0;
}

/* Load the segment table; a segment's append point is the larger of what
 * the index committed and the file's size, so pages written by a group
 * that never committed are never written again. */
static int segs_load(kvt_cold *c, MDB_txn *t) {
  MDB_cursor *cur = NULL;
  int rc = mdb_err(mdb_cursor_open(t, c->db_segs, &cur));
  if (rc) return rc;
  MDB_val k, v;
  for (int op = MDB_FIRST; !(rc = mdb_cursor_get(cur, &k, &v, op)); op = MDB_NEXT) {
    if (k.mv_size != 4 || v.mv_size != 32) {
      rc = KVT_ECORRUPT;
      break;
    }
    uint32_t id = kvt_le_get32(k.mv_data);
    if (id >= c->max_segs) {
      rc = KVT_ECORRUPT;
      break;
    }
    const uint8_t *r = v.mv_data;
    seg *s = &c->segs[id];
    s->gen = kvt_le_get64(r);
    s->used = kvt_le_get64(r + 8);
    s->live = kvt_le_get64(r + 16);
    s->state = kvt_le_get32(r + 24);
    if (id >= c->n_segs) c->n_segs = id + 1;
  }
  mdb_cursor_close(cur);
  if (rc != MDB_NOTFOUND) return rc > 0 || rc < -30000 ? mdb_err(rc) : rc;
  for (uint32_t id = 0; id < c->n_segs; id++) {
    seg *s = &c->segs[id];
    if (s->state == SEG_FREE && !kvt_io_exists_seg(c, id)) continue;
    rc = seg_open_file(c, id, 0);
    if (cold_transient(rc)) return rc;
    uint64_t size = 0;
    /* Missing or unusable: its entries are misses (kvt_cold_verify names
     * it, and repairing frees it); never appended to again. */
    if (rc && s->state == SEG_OPEN) s->state = SEG_FULL;
    if (!rc) rc = kvt_io_file_size(s->fd, &size);
    if (rc && rc != KVT_ECORRUPT) return rc;
    if (kvt_align4k(size) > s->used) s->used = kvt_align4k(size);
    if (s->state == SEG_OPEN && c->active < 0 && !c->cfg.rdonly) c->active = (int)id;
    else if (s->state == SEG_OPEN && !c->cfg.rdonly) /* sealed, the row not saved: */
      s->state = SEG_FULL;                            /* reclaimable, not stranded */
    c->st.live_bytes += s->live;
  }
  return 0;
}

static int open_dbs(kvt_cold *c) {
  MDB_txn *t;
  int rc = mdb_err(mdb_txn_begin(c->env, NULL, c->cfg.rdonly ? MDB_RDONLY : 0, &t));
  if (rc) return rc;
  unsigned fl = c->cfg.rdonly ? 0 : MDB_CREATE;
  rc = mdb_err(mdb_dbi_open(t, "meta", fl, &c->db_meta));
  if (!rc) rc = mdb_err(mdb_dbi_open(t, "ns", fl, &c->db_ns));
  if (!rc) rc = mdb_err(mdb_dbi_open(t, "blocks", fl, &c->db_blocks));
  if (!rc) rc = mdb_err(mdb_dbi_open(t, "segs", fl, &c->db_segs));
  if (rc == KVT_ENOTFOUND) rc = KVT_ECORRUPT; /* read-only and never created */
  if (!rc) rc = meta_init(c, t);
  if (!rc) rc = segs_load(c, t);
  if (rc) {
    mdb_txn_abort(t);
    return rc;
  }
  /* Committing (even a read-only transaction) keeps the database handles;
   * aborting would close them. */
  rc = mdb_err(mdb_txn_commit(t));
  if (rc || c->cfg.rdonly) return rc;
  return rc ? rc : mdb_err(mdb_env_sync(c->env, 1));
}

/* The LMDB map: at least twice the index already stored plus 64 MiB (room
 * for the copy-on-write pages of any transaction), and for a writer at
 * least what it was configured with. A reader needs no more: it maps by
 * what is stored, not by the map size a writer once recorded (which LMDB
 * only ever raises), so it works under a virtual-memory limit. A writer
 * growing the index past a reader's map while it is open makes the
 * reader's next transaction fail (MDB_MAP_RESIZED, -EIO): rare, and it
 * reopens. */
static uint64_t map_size(const kvt_cold *c, const char *index_dir) {
  char dp[4300];
  snprintf(dp, sizeof dp, "%s/data.mdb", index_dir);
  uint64_t used = 0;
  if (kvt_io_path_size(dp, &used)) used = 0;
  uint64_t floor = kvt_cold_map_bytes(0) + 2 * used;
  floor = (floor + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
  return c->cfg.rdonly || c->cfg.map_bytes < floor ? floor : c->cfg.map_bytes;
}

static int open_env(kvt_cold *c) {
  char path[4200];
  snprintf(path, sizeof path, "%s/index", c->dir);
  if (!c->cfg.rdonly && c->cfg.nocreate && !kvt_io_exists(path)) return -ENOENT; /* not a store */
  if (!c->cfg.rdonly) {
    int rc = kvt_io_mkdir(path);
    if (!rc) {
      char sp[4200];
      snprintf(sp, sizeof sp, "%s/segments", c->dir);
      rc = kvt_io_mkdir(sp);
    }
    if (rc) return rc;
  } else if (!kvt_io_exists(path)) {
    return -ENOENT;
  }
  if (!c->cfg.rdonly) { /* LMDB writes its lock file through a mapping of a sparse file */
    char lp[4300];
    snprintf(lp, sizeof lp, "%s/lock.mdb", path);
    int rc = kvt_io_prealloc(lp, LOCK_FILE_BYTES);
    if (rc) return rc;
  }
  int rc = mdb_err(mdb_env_create(&c->env));
  if (rc) return rc;
  mdb_env_set_maxdbs(c->env, 4);
  mdb_env_set_mapsize(c->env, map_size(c, path));
  /* MDB_NOMETASYNC, not MDB_NOSYNC: a commit fdatasyncs its pages before
   * it writes the meta page that points at them (with MDB_NOSYNC a power
   * loss could keep the new meta page and lose the pages), and the meta page
   * is made durable by the mdb_env_sync(force) that follows every commit. */
  unsigned flags = MDB_NOTLS | MDB_NOMETASYNC | (c->cfg.rdonly ? MDB_RDONLY : 0);
  char lp[4300];
  snprintf(lp, sizeof lp, "%s/lock.mdb", path);
  if (c->cfg.rdonly && kvt_io_exists(lp) && !kvt_io_writable(lp)) {
    /* A reader that cannot register its snapshots in lock.mdb (another
     * user's store, a read-only mount) would not stop a writer from
     * reusing the pages it reads: it holds a shared lock on the store
     * instead, so that no writer runs while it is open (KVT_ELOCKED
     * while one does), and opens LMDB without its lock file. */
    rc = kvt_io_dir_share(c->dir, &c->share_fd);
    if (rc) return rc;
    flags |= MDB_NOLOCK;
  }
  rc = mdb_err(mdb_env_open(c->env, path, flags, 0644));
  if (!rc) {
    int stale;
    mdb_reader_check(c->env, &stale); /* readers left by killed processes */
  }
  /* New names durable: index/data.mdb in index/, index/ and segments/ in
   * the store directory (a power loss may drop a name never fsynced). */
  if (!rc && !c->cfg.rdonly) rc = kvt_io_fsync_dir(path);
  if (!rc && !c->cfg.rdonly) rc = kvt_io_fsync_dir(c->dir);
  return rc;
}

static int config_check(const kvt_cold_config *cfg) {
  if (!cfg->dir) return KVT_ENULL;
  if (cfg->segment_bytes < (1u << 20) || cfg->segment_bytes % KVT_IO_ALIGN) return KVT_EOPTION;
  if (cfg->bytes_limit / 2 < cfg->segment_bytes && !cfg->rdonly) return KVT_EOPTION; /* + a spare */
  if (!cfg->rdonly && cfg->map_bytes < (1u << 20)) return KVT_EOPTION;
  if (cfg->group_bytes == 0 && !cfg->rdonly) return KVT_EOPTION;
  if (cfg->zstd_level < -5 || cfg->zstd_level > 19) return KVT_EOPTION;
  if (strlen(cfg->dir) >= 4000) return -ENAMETOOLONG;
  return 0;
}

int kvt_cold_open(kvt_mem *m, const kvt_cold_config *cfg, kvt_cold **out) {
  *out = NULL;
  int rc = config_check(cfg);
  if (rc) return rc;
  kvt_cold *c = kvt_mem_calloc(m, KVT_MEM_OTHER, sizeof *c);
  if (!c) return -ENOMEM;
  c->mem = m;
  c->cfg = *cfg;
  snprintf(c->dir, sizeof c->dir, "%s", cfg->dir);
  c->cfg.dir = c->dir;
  c->active = -1;
  c->share_fd = -1;
  c->max_segs = MAX_SEGS;
  /* A quarter of the descriptors the process may open (the rest are the
   * caller's, LMDB's, the rings'), between 4 and 1024. */
  uint64_t nofile = kvt_io_nofile_limit() / 4;
  c->fd_max = nofile < 4 ? 4 : nofile > 1024 ? 1024 : (uint32_t)nofile;
  c->writer_waiting = 1; /* until the writer thread has something */
  pthread_mutex_init(&c->rd_lock, NULL);
  pthread_mutex_init(&c->st_lock, NULL);
  pthread_mutex_init(&c->cq_lock, NULL);
  pthread_mutex_init(&c->gone_lock, NULL);
  pthread_mutex_init(&c->dz_lock, NULL);
  pthread_cond_init(&c->cq_cv, NULL);
  c->segs = kvt_mem_calloc(m, KVT_MEM_OTHER, c->max_segs * sizeof *c->segs);
  if (!c->segs) rc = -ENOMEM;
  for (uint32_t i = 0; !rc && i < c->max_segs; i++) c->segs[i].fd = -1;
  if (!rc) rc = kvt_io_create(&cfg->io, &c->rio);
  if (!rc && !cfg->rdonly) rc = kvt_io_create(&cfg->io, &c->wio);
  if (!rc && !cfg->rdonly) rc = kvt_io_create(&cfg->io, &c->sio);
  if (!rc && !cfg->rdonly && !(c->cctx = ZSTD_createCCtx())) rc = -ENOMEM;
  /* Two readers where two CPUs are; one under a read fault plan, so that
   * tests count its read calls in one place. */
  c->n_readers = sysconf(_SC_NPROCESSORS_ONLN) > 1 ? READERS_MAX : 1;
  if (cfg->io.fault.kind && (cfg->io.fault.ops & (1u << KVT_IO_OP_READ))) c->n_readers = 1;
  for (unsigned i = 0; !rc && i < c->n_readers; i++) {
    rc = kvt_io_create(&cfg->io, &c->aio[i]);
    if (!rc && !(c->dctx_async[i] = ZSTD_createDCtx())) rc = -ENOMEM;
  }
  if (!rc) rc = kvt_cold_index_check(c->dir);
  if (!rc) rc = open_env(c);
  if (!rc) rc = open_dbs(c);
  if (rc == KVT_ECORRUPT) rc = KVT_EINDEX; /* everything open reads so far is the index */
  if (!rc && !cfg->rdonly) rc = kvt_cold_ns_files_backfill(c);
  if (!rc) rc = cold_reader_start(c);
  if (!rc && !cfg->rdonly) rc = cold_committer_start(c);
  if (!rc) rc = cold_evict_start(c);
  if (rc) {
    kvt_cold_close(c);
    return rc;
  }
  snprintf(c->st.backend, sizeof c->st.backend, "%s", kvt_io_backend_name(c->rio));
  snprintf(c->st.why, sizeof c->st.why, "%s", kvt_io_why(c->rio));
  *out = c;
  return 0;
}

void kvt_cold_close(kvt_cold *c) {
  if (!c) return;
  if (c->committer_on) kvt_cold_drain(c); /* what was posted settles first */
  cold_committer_stop(c);
  cold_reader_stop(c);
  cold_evict_stop(c);
  for (uint32_t i = 0; c->segs && i < c->max_segs; i++)
    if (c->segs[i].fd >= 0) kvt_io_close(c->wio ? c->wio : c->rio, c->segs[i].fd);
  if (c->env) {
    if (!c->cfg.rdonly) mdb_env_sync(c->env, 1);
    mdb_env_close(c->env);
  }
  kvt_io_dir_unshare(c->share_fd);
  kvt_io_destroy(c->wio);
  kvt_io_destroy(c->sio);
  kvt_io_destroy(c->rio);
  for (unsigned i = 0; i < READERS_MAX; i++) kvt_io_destroy(c->aio[i]);
  ZSTD_freeCCtx(c->cctx);
  ZSTD_freeDCtx(c->dctx_sync);
  for (unsigned i = 0; i < READERS_MAX; i++) ZSTD_freeDCtx(c->dctx_async[i]);
  pthread_mutex_destroy(&c->dz_lock);
  cold_buf_free(c, c->stage[0], c->stage_cap[0]);
  cold_buf_free(c, c->stage[1], c->stage_cap[1]);
  cold_buf_free(c, c->plane, c->plane_cap);
  if (c->segs) kvt_mem_free(c->mem, KVT_MEM_OTHER, c->segs, c->max_segs * sizeof *c->segs);
  pthread_mutex_destroy(&c->rd_lock);
  pthread_mutex_destroy(&c->st_lock);
  pthread_mutex_destroy(&c->cq_lock);
  pthread_mutex_destroy(&c->gone_lock);
  cold_index_fini(c);
  pthread_cond_destroy(&c->cq_cv);
  kvt_mem_free(c->mem, KVT_MEM_OTHER, c, sizeof *c);
}

/* ---------- namespaces ---------- */

int kvt_cold_ns_put(kvt_cold *c, const kvt_key *seed, const uint8_t *enc, size_t len) {
  if (c->cfg.rdonly) return KVT_ERDONLY;
  MDB_txn *t;
  int rc = kvt_cold_ns_file_put(c->dir, seed, enc, len); /* a copy the index can be rebuilt with */
  if (rc) return rc;
  rc = mdb_err(mdb_txn_begin(c->env, NULL, 0, &t));
  if (rc) return rc;
  MDB_val k = {16, (void *)seed->b}, v = {len, (void *)enc};
  rc = mdb_err(mdb_put(t, c->db_ns, &k, &v, 0));
  if (rc) {
    mdb_txn_abort(t);
    return rc;
  }
  rc = mdb_err(mdb_txn_commit(t));
  return rc ? rc : mdb_err(mdb_env_sync(c->env, 1));
}

/* ---------- records of the meta table that only rank or help ---------- */

size_t cold_meta_get(kvt_cold *c, const char *key, uint8_t *out, size_t cap) {
  MDB_txn *t;
  if (mdb_txn_begin(c->env, NULL, MDB_RDONLY, &t)) return 0;
  MDB_val k = {strlen(key), (void *)key}, v;
  size_t n = 0;
  if (!mdb_get(t, c->db_meta, &k, &v) && v.mv_size <= cap) {
    memcpy(out, v.mv_data, v.mv_size);
    n = v.mv_size;
  }
  mdb_txn_abort(t);
  return n;
}

int cold_meta_put(kvt_cold *c, const char *key, const uint8_t *buf, size_t len) {
  if (c->cfg.rdonly) return KVT_ERDONLY;
  MDB_txn *t;
  int rc = mdb_err(mdb_txn_begin(c->env, NULL, 0, &t));
  if (rc) return rc;
  MDB_val k = {strlen(key), (void *)key}, v = {len, (void *)buf};
  rc = mdb_err(mdb_put(t, c->db_meta, &k, &v, 0));
  if (rc) {
    mdb_txn_abort(t);
    return rc;
  }
  return mdb_err(mdb_txn_commit(t));
}

/* The owner's state: key "owner." name. */
static int state_key(const char *name, char *key, size_t cap) {
  int n = snprintf(key, cap, "owner.%s", name);
  return n > 0 && (size_t)n < cap ? 0 : -1;
}

size_t kvt_cold_state_get(kvt_cold *c, const char *name, uint8_t *out, size_t cap) {
  char key[64];
  return state_key(name, key, sizeof key) ? 0 : cold_meta_get(c, key, out, cap);
}

int kvt_cold_state_put(kvt_cold *c, const char *name, const uint8_t *buf, size_t len) {
  char key[64];
  return state_key(name, key, sizeof key) ? KVT_EOPTION : cold_meta_put(c, key, buf, len);
}

int kvt_cold_ns_each(kvt_cold *c, int (*fn)(void *, const kvt_key *, const uint8_t *, size_t),
                     void *arg) {
  MDB_txn *t;
  MDB_cursor *cur = NULL;
  int rc = mdb_err(mdb_txn_begin(c->env, NULL, MDB_RDONLY, &t));
  if (rc) return rc;
  rc = mdb_err(mdb_cursor_open(t, c->db_ns, &cur));
  MDB_val k, v;
  for (int op = MDB_FIRST; !rc && !(rc = mdb_cursor_get(cur, &k, &v, op)); op = MDB_NEXT) {
    if (k.mv_size != 16) {
      rc = KVT_ECORRUPT;
      break;
    }
    kvt_key seed;
    memcpy(seed.b, k.mv_data, 16);
    rc = fn(arg, &seed, v.mv_data, v.mv_size);
  }
  if (rc == MDB_NOTFOUND) rc = 0;
  else if (rc > 0) rc = mdb_err(rc);
  if (cur) mdb_cursor_close(cur); /* read-only txns do not free their cursors */
  mdb_txn_abort(t);
  return rc;
}

void kvt_cold_stats_get(kvt_cold *c, kvt_cold_stats *st) {
  MDB_txn *t;
  MDB_stat ms = {0};
  if (!mdb_txn_begin(c->env, NULL, MDB_RDONLY, &t)) {
    mdb_stat(t, c->db_blocks, &ms);
    mdb_txn_abort(t);
  }
  pthread_mutex_lock(&c->st_lock);
  *st = c->st;
  st->evictions = c->evictions + c->ev_evictions;
  st->reclaims = c->reclaims;
  st->relocated = c->relocated;
  st->records = ms.ms_entries;
  st->segments = c->n_segs;
  st->segment_bytes = c->cfg.segment_bytes;
  st->bytes_limit = c->cfg.bytes_limit;
  pthread_mutex_unlock(&c->st_lock);
  cold_model_stats(c, st); /* ev_lock is a leaf: not under st_lock */
}

void kvt_cold_hists(kvt_cold *c, kvt_hist *read, kvt_hist *commit) {
  kvt_hist_read(&c->h_read, read);
  kvt_hist_read(&c->h_commit, commit);
}

/* ---------- the record format, for rebuilding the index (cold_rebuild.c) ---------- */

uint32_t kvt_cold_header_len(uint32_t n_layers) { return cold_header_len(n_layers); }

int kvt_cold_header_parse(const uint8_t *h, size_t avail, kvt_cold_entry *e) {
  if (avail < REC_FIXED || memcmp(h, REC_MAGIC, 8)) return KVT_ECORRUPT;
  uint32_t n_layers = kvt_le_get32(h + 76);
  if (n_layers == 0 || n_layers > KVT_MAX_LAYERS) return KVT_ECORRUPT;
  uint32_t hl = cold_header_len(n_layers);
  size_t tab = REC_FIXED + (size_t)SLICE_ENTRY * n_layers;
  if (kvt_le_get32(h + 8) != hl || avail < hl || kvt_le_get64(h + tab) != XXH3_64bits(h, tab))
    return KVT_ECORRUPT;
  e->rec_len = kvt_le_get32(h + 12);
  if (e->rec_len < hl || e->rec_len % KVT_IO_ALIGN) return KVT_ECORRUPT;
  e->seg_gen = kvt_le_get64(h + 16);
  memcpy(e->key.b, h + 24, 16);
  memcpy(e->parent.b, h + 40, 16);
  memcpy(e->ns_seed.b, h + 56, 16);
  e->pos = kvt_le_get32(h + 72);
  e->n_layers = n_layers;
  e->dtype = kvt_le_get32(h + 80);
  e->bytes_each = kvt_le_get32(h + 84);
  return 0;
}

int kvt_cold_record_slice_ok(const uint8_t *rec, const kvt_cold_entry *e, uint32_t layer) {
  kvt_cold_slice s;
  cold_get_slice(rec + REC_FIXED + (size_t)SLICE_ENTRY * layer, &s);
  uint64_t len = kvt_align4k(s.stored_len);
  if (s.rel_off < cold_header_len(e->n_layers) || s.rel_off % KVT_IO_ALIGN ||
      s.rel_off + len > e->rec_len || s.raw_len != 2 * (uint64_t)e->bytes_each ||
      s.codec > KVT_COLD_CODEC_PLANES)
    return 0;
  return cold_slice_ok(rec + s.rel_off, e, layer, &s);
}

const char *kvt_cold_dir(const kvt_cold *c) { return c->dir; }

size_t kvt_cold_entry_encode(uint8_t *out, const kvt_cold_entry *e, const uint8_t *table) {
  cold_put_entry(out, e);
  memcpy(out + ENTRY_FIXED, table, (size_t)SLICE_ENTRY * e->n_layers);
  return cold_entry_len(e->n_layers);
}

void kvt_cold_seg_encode(uint8_t row[32], uint64_t gen, uint64_t used, uint64_t live, int full) {
  seg s = {.gen = gen, .used = used, .live = live, .state = full ? SEG_FULL : SEG_FREE};
  seg_row(&s, row);
}

uint64_t kvt_cold_format_version(void) { return FORMAT_VERSION; }

uint64_t kvt_cold_map_bytes(uint64_t cold_bytes) {
  const uint64_t floor = 64ull << 20, mib = 1ull << 20;
  uint64_t m = cold_bytes / 16;
  if (m < floor) m = floor;
  return m > UINT64_MAX - mib ? UINT64_MAX / mib * mib : (m + mib - 1) / mib * mib;
}
