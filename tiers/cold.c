/* cold.c - the cold tier (cold.h): records in segment files, the LMDB
 * index, group commit, verified reads. The byte layouts live in
 * docs/format.md ("Cold tier") and in the put_/get_ helpers below, which
 * are the only code that knows them. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

#include "base/hash.h"
#include "tiers/cold.h"
#include "tiers/cold_record.h"
#include "tiers/cold_scan.h"
#include "tiers/evict.h"
#include "tiers/hist.h"

#define FORMAT_VERSION 1u
#define READERS_MAX 2u   /* reader threads: checking and copying keep one core busy at disk speed */
#define REC_MAGIC KVT_REC_MAGIC
#define REC_FIXED KVT_REC_FIXED
#define SLICE_ENTRY KVT_REC_SLICE
#define ENTRY_FIXED KVT_REC_ENTRY_FIXED
#define MAX_SEGS 65536u
#define LOCK_FILE_BYTES (64u << 10) /* LMDB's lock file, allocated up front: room for ~1000 readers */

enum seg_state { SEG_FREE = 0, SEG_OPEN = 1, SEG_FULL = 2 };

typedef struct seg {
  int fd;                      /* -1 when not open (the descriptor cache: seg_hold) */
  uint64_t gen;                /* bumped whenever the file is reused */
  uint64_t used;               /* bytes appended so far (never rewritten) */
  uint64_t live;               /* bytes of records the index points to */
  uint32_t state;
  uint32_t users;              /* holders of fd (seg_hold), which stays open meanwhile */
  uint64_t tick;               /* last hold, for closing the least recently used */
  int have;                    /* the file is there (opened once, or created) */
  int err;                     /* why it could not be opened (-errno), or 0 */
} seg;

typedef struct carry {
  kvt_cold_rec rec;
  uint8_t *raw;                /* all layers' K||V */
  const uint8_t **layers;
} carry;

struct kvt_cold {
  kvt_mem *mem;
  int (*keep)(void *arg, const kvt_key *key); /* re-insert on reclaim? */
  void (*lost)(void *arg, const kvt_key *key); /* a kept block found bad (keep_arg) */
  void *keep_arg;
  uint64_t evictions, reclaims, relocated;
  kvt_cold_config cfg;
  char dir[4096];
  MDB_env *env;
  MDB_dbi db_meta, db_ns, db_blocks, db_segs;
  kvt_io *wio;                 /* the writer's (flusher thread) */
  kvt_io *rio;                 /* synchronous reads, under rd_lock */
  kvt_io *sio;                 /* the committer's data syncs */
  /* the write pipeline (see post_chunks): chunks built by the flusher,
   * written by the writer thread, synced and indexed by the committer;
   * one lock and condition for both queues and the staging buffers */
  pthread_t writer, committer;
  int writer_on, committer_on, cq_stop;
  int cq_failed;               /* a chunk failed to commit (set by the committer, in order) */
  int wq_failed;               /* a chunk failed to be written (the writer's: it skips the rest) */
  pthread_mutex_t cq_lock;
  pthread_cond_t cq_cv;
  struct chunk *wq_head, *wq_tail;        /* built, to be written */
  struct chunk *cq_head, *cq_tail;        /* written, to be synced and indexed */
  size_t in_flight;                       /* chunks posted and not settled */
  uint64_t pending_bytes;                 /* their records' bytes (st_lock) */
  /* Keys chosen for removal whose removal has not committed: found by
   * nobody (kvt_cold_find, kvt_cold_prefix), so no caller is told a block
   * is durable that is about to go. Added before keep() is asked. */
  /* What remove_in changed in memory in the write transaction under way
   * (one at a time: LMDB's writer lock), undone if it does not commit. */
  struct undo_rec *undo;
  size_t undo_n, undo_cap;
  pthread_mutex_t gone_lock;
  kvt_key *gone_v;                        /* sorted */
  size_t gone_n, gone_cap;
  uint8_t *stage[2];                      /* staging buffers, one per chunk in flight */
  size_t stage_cap[2];
  int stage_busy[2];
  pthread_mutex_t rd_lock;
  /* asynchronous reads: reader threads, each with its own ring (aio) and
   * zstd context, serve one queue */
  kvt_io *aio[READERS_MAX];
  ZSTD_DCtx *dctx_async[READERS_MAX];
  struct reader_ctx {
    kvt_cold *c;
    unsigned i;
    pthread_t th;
  } rctx[READERS_MAX];
  unsigned n_readers, readers_on;
  int reader_stop;
  pthread_mutex_t rq_lock;
  pthread_cond_t rq_cv;
  kvt_cold_read *rq_head, *rq_tail;
  pthread_mutex_t st_lock;     /* stats and the segment table's counters */
  seg *segs;                   /* [max_segs] */
  uint32_t n_segs, max_segs;
  uint32_t fd_open, fd_max;    /* segment descriptors open; idle ones closed above fd_max */
  uint64_t fd_tick;
  int active;                  /* segment being appended, or -1 */
  int segdir_dirty;            /* a segment file created since segments/ was fsynced (st_lock) */
  int share_fd;                /* a reader's shared store lock (MDB_NOLOCK), or -1 */
  ZSTD_CCtx *cctx;             /* writer */
  ZSTD_DCtx *dctx_sync;        /* synchronous reads' (dz_lock), made when first needed */
  pthread_mutex_t dz_lock;
  int writer_waiting;          /* the writer thread has nothing to write (atomic) */
  const int *backlog;          /* the caller's: work waits behind this post (atomic) */
  int post_more;               /* records of this post come after the chunk being built */
  uint8_t *plane;              /* writer's scratch for one byte plane */
  size_t plane_cap;
  kvt_cold_stats st;
  kvt_evict *ev;               /* eviction order of the indexed blocks (a writer's) */
  pthread_mutex_t ev_lock;     /* ev; a leaf: nothing is taken while it is held (the
                                  engine lock may be held around it: kvt_cold_admit) */
  uint64_t ev_evictions;       /* blocks invalidated by the order */
  int ev_on;                   /* ev_lock initialized */
  void (*read_notify)(void *arg); /* a read batch finished (kvt_cold_set_read_notify) */
  void *read_notify_arg;
  kvt_hist h_read;             /* one read of a segment file, submitted to complete */
  kvt_hist h_commit;           /* one group: write started to indexed */
};

static int evict_start(kvt_cold *c);
static void evict_stop(kvt_cold *c);
static void evict_touch(kvt_cold *c, const kvt_key *key);
static void evict_forget(kvt_cold *c, const kvt_key *key);

/* Little-endian fields: kvt_le_* in tiers/cold_record.h. */

static int mdb_err(int rc) {
  if (rc == 0) return 0;
  if (rc == MDB_NOTFOUND) return KVT_ENOTFOUND;
  if (rc == MDB_MAP_FULL) return -ENOSPC;
  if (rc == MDB_VERSION_MISMATCH || rc == MDB_INVALID || rc == MDB_CORRUPTED) return KVT_ECORRUPT;
  return rc > 0 ? -rc : -EIO;
}

/* ---------- index entry: key -> where the record is ---------- */

/* The byte layouts are cold_record.c's; these name them for the code below. */
static size_t entry_len(uint32_t n_layers) { return kvt_rec_entry_len(n_layers); }
static void put_slice(uint8_t *p, const kvt_cold_slice *s) { kvt_rec_slice_put(p, s); }
static void get_slice(const uint8_t *p, kvt_cold_slice *s) { kvt_rec_slice_get(p, s); }
static void put_entry(uint8_t *p, const kvt_cold_entry *e) { kvt_rec_entry_put(p, e); }

/* Parse an index value; KVT_ECORRUPT when it is not one. */
static int get_entry(const kvt_key *key, const MDB_val *v, kvt_cold_entry *e) {
  return kvt_rec_entry_get(key, v->mv_data, v->mv_size, e);
}

static const uint8_t *entry_slice(const MDB_val *v, uint32_t layer) {
  return (const uint8_t *)v->mv_data + ENTRY_FIXED + (size_t)SLICE_ENTRY * layer;
}

/* Room for one more element of size elem in *v (n used, *cap allocated). */
static int grow(void *v, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return 0;
  size_t nc = *cap ? 2 * *cap : 64;
  void *p = realloc(*(void **)v, nc * elem);
  if (!p) return -ENOMEM;
  *(void **)v = p;
  *cap = nc;
  return 0;
}

/* Call fn for every entry of the blocks index, in key order, inside one
 * read-only transaction; e is NULL when the entry does not parse. Stops at
 * fn's first non-zero return and returns it. */
typedef int (*entry_fn)(void *arg, const kvt_key *key, const MDB_val *v, const kvt_cold_entry *e);

static int each_entry(kvt_cold *c, entry_fn fn, void *arg) {
  MDB_txn *t;
  MDB_cursor *cur = NULL;
  int rc = mdb_err(mdb_txn_begin(c->env, NULL, MDB_RDONLY, &t));
  if (rc) return rc;
  rc = mdb_err(mdb_cursor_open(t, c->db_blocks, &cur));
  MDB_val k, v;
  for (int op = MDB_FIRST; !rc && !mdb_cursor_get(cur, &k, &v, op); op = MDB_NEXT) {
    kvt_key key = {{0}};
    kvt_cold_entry e;
    if (k.mv_size == 16) memcpy(key.b, k.mv_data, 16);
    int ok = k.mv_size == 16 && get_entry(&key, &v, &e) == 0;
    rc = fn(arg, &key, &v, ok ? &e : NULL);
  }
  if (cur) mdb_cursor_close(cur); /* read-only txns do not free their cursors */
  mdb_txn_abort(t);
  return rc;
}

/* ---------- segment table ---------- */

static void seg_row(const seg *s, uint8_t row[32]) {
  kvt_le_put64(row, s->gen);
  kvt_le_put64(row + 8, s->used);
  kvt_le_put64(row + 16, s->live);
  kvt_le_put32(row + 24, s->state);
  kvt_le_put32(row + 28, 0);
}

static int seg_save(kvt_cold *c, MDB_txn *t, uint32_t id) {
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
 * (seg_hold .. seg_release) until the request is over, so it is never
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
static int transient(int rc) { return rc == -EMFILE || rc == -ENFILE || rc == -ENOMEM || rc == -EINTR; }

/* Open segment id's file into the cache when it is not open. A file that
 * is missing or not a regular file (a directory, a FIFO, a symbolic link)
 * is remembered in err and is KVT_ECORRUPT: its records are misses.
 * Returns 0, KVT_ECORRUPT or a transient -errno. st_lock held. */
static int seg_open_locked(kvt_cold *c, uint32_t id, int create) {
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
    if (transient(rc)) return rc;
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
  int rc = seg_open_locked(c, id, create);
  pthread_mutex_unlock(&c->st_lock);
  return rc;
}

/* The descriptor of segment id, held open until seg_release(). A reader
 * beside a live writer opens the segments the writer created after the
 * reader's open when it first needs them. 0, KVT_ECORRUPT (no such
 * segment, or no usable file) or a transient -errno (-EMFILE). */
static int seg_hold(kvt_cold *c, uint32_t id, int *fd) {
  *fd = -1;
  if (id >= c->max_segs) return KVT_ECORRUPT;
  pthread_mutex_lock(&c->st_lock);
  int rc = id < c->n_segs || c->cfg.rdonly ? seg_open_locked(c, id, 0) : KVT_ECORRUPT;
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

static void seg_release(kvt_cold *c, uint32_t id) {
  pthread_mutex_lock(&c->st_lock);
  if (c->segs[id].users) c->segs[id].users--;
  if (c->fd_open > c->fd_max) fd_trim(c, c->fd_max);
  pthread_mutex_unlock(&c->st_lock);
}

/* Why segment id cannot be read, in words, or NULL when it can be. */
static const char *seg_trouble(kvt_cold *c, uint32_t id) {
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

static int reader_start(kvt_cold *c);
static void reader_stop(kvt_cold *c);
static int committer_start(kvt_cold *c);
static void committer_stop(kvt_cold *c);

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
    if (transient(rc)) return rc;
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
  if (!rc) rc = reader_start(c);
  if (!rc && !cfg->rdonly) rc = committer_start(c);
  if (!rc) rc = evict_start(c);
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
  committer_stop(c);
  reader_stop(c);
  evict_stop(c);
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
  kvt_io_buf_free(c->stage[0]);
  kvt_io_buf_free(c->stage[1]);
  kvt_io_buf_free(c->plane);
  kvt_mem_note(c->mem, KVT_MEM_OTHER,
               -(int64_t)(c->stage_cap[0] + c->stage_cap[1] + c->plane_cap));
  if (c->segs) kvt_mem_free(c->mem, KVT_MEM_OTHER, c->segs, c->max_segs * sizeof *c->segs);
  pthread_mutex_destroy(&c->rd_lock);
  pthread_mutex_destroy(&c->st_lock);
  pthread_mutex_destroy(&c->cq_lock);
  pthread_mutex_destroy(&c->gone_lock);
  free(c->gone_v);
  free(c->undo);
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

/* ---------- records ---------- */

static uint32_t header_len(uint32_t n_layers) { return kvt_rec_header_len(n_layers); }

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
  return header_len(n_layers) + (uint64_t)n_layers * slice_max(bytes_each);
}

/* Grow a writer buffer; its bytes are counted like every other. */
static int ensure(kvt_cold *c, uint8_t **buf, size_t *cap, size_t need) {
  if (*cap >= need) return 0;
  size_t n = kvt_align4k(need + need / 2);
  void *p = kvt_io_buf_alloc(n);
  if (!p) return -ENOMEM;
  kvt_io_buf_free(*buf);
  kvt_mem_note(c->mem, KVT_MEM_OTHER, (int64_t)n - (int64_t)*cap);
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
static uint64_t slice_seed(const kvt_key *key, uint32_t layer, uint64_t gen) {
  uint8_t b[28];
  memcpy(b, key->b, 16);
  kvt_le_put32(b + 16, layer);
  kvt_le_put64(b + 20, gen);
  return XXH3_64bits(b, sizeof b);
}

/* One piece of a record as written: the header from the staging buffer,
 * a slice straight from the block's payload, or one built in staging. */
typedef struct part {
  const uint8_t *buf;
  uint32_t len;               /* multiple of 4096 */
} part;

/* Build one record in the staging buffer dst: its header, then each
 * slice (a copy of the exact bytes, or byte planes). Copying costs less
 * than it saves: a group then goes to the device as one large write, where
 * writing each 64 KiB slice from its own buffer measured half as fast.
 * Fills e, sl (n_layers slices) and parts (n_layers + 1); returns the
 * record length (a multiple of 4096) and in *staged the bytes used. */
static uint32_t build_record(kvt_cold *c, const kvt_cold_rec *r, uint64_t gen, uint8_t *dst,
                             kvt_cold_entry *e, kvt_cold_slice *sl, part *parts, size_t *staged) {
  uint32_t hl = header_len(r->n_layers), off = hl, raw = 2 * r->bytes_each;
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
                                                    slice_seed(&r->key, l, gen))};
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
static uint64_t spare_segs(const kvt_cold *c) {
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
  if (spare_segs(c) <= reserve) return KVT_EFULL; /* the active one keeps its room for smaller records */
  if (c->active >= 0) {
    c->segs[c->active].state = SEG_FULL;
    sealed[(*n_sealed)++] = (uint32_t)c->active;
    c->active = -1;
  }
  for (uint32_t id = 0; id < c->n_segs; id++) {
    seg *s = &c->segs[id];
    if (s->state != SEG_FREE) continue;
    if (!s->have) { /* its file was lost: a new one, whose name is synced before use */
      if (seg_open_locked(c, id, 1)) continue;
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
  int rc = seg_open_locked(c, id, 1);
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

static int find_locked(kvt_cold *c, MDB_txn *t, const kvt_key *key, kvt_cold_entry *e,
                       kvt_cold_slice *one, uint32_t layer);

/* The segment a reclaim relocates records out of. */
typedef struct victim {
  uint32_t id;
  uint64_t gen;
} victim;

static int in_victim(const kvt_cold_entry *e, const victim *v) {
  return e->seg == v->id && e->seg_gen == v->gen;
}

typedef struct placed {
  uint32_t seg;
  uint64_t off;               /* in the segment */
  part *parts;                /* n_layers + 1 pieces, in disk order */
  kvt_cold_entry e;
  uint64_t old_len;           /* relocated: the record it replaces */
  int dead;                   /* relocated, but its entry had gone meanwhile */
} placed;

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
  uint8_t *val = NULL;
  for (size_t i = 0; i < n && !rc; i++) {
    if (vic) {
      kvt_cold_entry old;
      int r = find_locked(c, t, &pl[i].e.key, &old, NULL, 0);
      pl[i].dead = r || !in_victim(&old, vic);
      pl[i].old_len = r ? 0 : old.rec_len;
      if (pl[i].dead) continue;
    }
    size_t vl = entry_len(pl[i].e.n_layers);
    uint8_t *nv = realloc(val, vl);
    if (!nv) {
      rc = -ENOMEM;
      break;
    }
    val = nv;
    put_entry(val, &pl[i].e);
    for (uint32_t l = 0; l < pl[i].e.n_layers; l++)
      put_slice(val + ENTRY_FIXED + SLICE_ENTRY * l, &sl[i][l]);
    MDB_val k = {16, (void *)pl[i].e.key.b}, v = {vl, val};
    rc = mdb_err(mdb_put(t, c->db_blocks, &k, &v, 0));
  }
  free(val);
  if (rc) {
    mdb_txn_abort(t);
    return rc;
  }
  add_live(c, pl, n, vic, 1, pending); /* the segment rows below carry it */
  for (size_t i = 0; i < n_touched && !rc; i++) rc = seg_save(c, t, touched[i]);
  if (!rc && vic) rc = seg_save(c, t, vic->id);
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
 * post_chunks cuts records into chunks of at most cfg.group_bytes, and
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
 * forever) until the pipeline has drained. post_chunks returns once its
 * chunks are built: the records' bytes are in the staging buffers, and
 * the caller's next records are built while these are written. Whatever
 * needs the segment table to hold still (reclaiming) drains first. */

typedef struct chunk {
  placed *pl;
  kvt_cold_slice **sl;
  uint32_t *touched;
  size_t np, n_touched;
  size_t n_held;              /* touched[0..n_held) are held (seg_hold) until chunk_free */
  kvt_io_req *w;              /* the writes, from stage buffer `buf` */
  size_t nw;
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

static void evict_track(kvt_cold *c, const placed *pl, size_t n);

/* The chunk's records are settled: indexed or never to be. */
static void pending_less(kvt_cold *c, chunk *k) {
  pthread_mutex_lock(&c->st_lock);
  c->pending_bytes -= k->bytes;
  pthread_mutex_unlock(&c->st_lock);
  k->bytes = 0;
}

static void chunk_free(kvt_cold *c, chunk *k) {
  if (!k) return;
  for (size_t i = 0; i < k->n_held; i++) seg_release(c, k->touched[i]);
  for (size_t i = 0; k->sl && i < k->np; i++) {
    free(k->sl[i]);
    free(k->pl[i].parts);
  }
  free(k->pl);
  free(k->sl);
  free(k->touched);
  free(k->w);
  free(k);
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
  if (!rc && !k->vic) evict_track(c, k->pl, k->np); /* relocated ones keep their place */
  if (!rc && k->np) kvt_hist_add(&c->h_commit, kvt_hist_now_ns() - k->t0_ns);
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

static int committer_start(kvt_cold *c) {
  int rc = -pthread_create(&c->writer, NULL, writer_main, c);
  if (rc) return rc;
  c->writer_on = 1;
  rc = -pthread_create(&c->committer, NULL, committer_main, c);
  if (!rc) c->committer_on = 1;
  return rc;
}

/* Both threads are idle by now: kvt_cold_close drained the pipeline. */
static void committer_stop(kvt_cold *c) {
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
  size_t m = 0, stage_need = 0, plane_need = 0;
  while (m < n) { /* the chunk's records */
    uint64_t max = kvt_cold_record_max(recs[m].n_layers, recs[m].bytes_each);
    if (m && stage_need + max > c->cfg.group_bytes) break;
    stage_need += max;
    size_t pn = 2 * (size_t)recs[m].bytes_each + ZSTD_compressBound(4096);
    if (pn > plane_need) plane_need = pn;
    m++;
  }
  c->post_more = m < n;
  chunk *k = calloc(1, sizeof *k);
  uint32_t *sealed = calloc(m + 1, sizeof *sealed);
  int rc = k && sealed ? 0 : -ENOMEM;
  if (!rc) {
    k->buf = buf;
    k->pl = calloc(m, sizeof *k->pl);
    k->sl = calloc(m, sizeof *k->sl);
    k->touched = calloc(2 * m + 2, sizeof *k->touched);
    k->vic = vic;
    if (!k->pl || !k->sl || !k->touched) rc = -ENOMEM;
  }
  if (!rc) rc = stage_ensure(c, buf, stage_need + STAGE_SLACK);
  if (!rc) rc = ensure(c, &c->plane, &c->plane_cap, plane_need);
  uint8_t *stage = c->stage[buf];
  MDB_txn *rt = NULL;
  if (!rc) rc = mdb_err(mdb_txn_begin(c->env, NULL, MDB_RDONLY, &rt));
  size_t np = 0, n_sealed = 0, stage_off = 0, n_parts = 0, i = 0;
  for (; i < m && !rc; i++) {
    if (!vic && key_indexed(c, rt, &recs[i].key)) continue;
    uint64_t max = kvt_cold_record_max(recs[i].n_layers, recs[i].bytes_each);
    if (max > c->cfg.segment_bytes) {
      rc = KVT_EOPTION; /* a record must fit a segment */
      break;
    }
    int id = seg_for(c, max, vic ? 0 : 1, sealed, &n_sealed);
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
    placed *p = &k->pl[np];
    k->sl[np] = malloc(recs[i].n_layers * sizeof **k->sl);
    p->parts = malloc((recs[i].n_layers + 1) * sizeof *p->parts);
    if (!k->sl[np] || !p->parts) {
      free(k->sl[np]);
      free(p->parts);
      rc = -ENOMEM;
      break;
    }
    seg *s = &c->segs[id];
    p->seg = (uint32_t)id;
    p->off = s->used;
    size_t staged;
    uint32_t len = build_record(c, &recs[i], s->gen, stage + stage_off, &p->e, k->sl[np],
                                p->parts, &staged);
    p->e.seg = (uint32_t)id;
    p->e.offset = p->off;
    pthread_mutex_lock(&c->st_lock); /* the committer saves segment rows */
    s->used += len;
    c->pending_bytes += len;
    pthread_mutex_unlock(&c->st_lock);
    k->bytes += len;
    stage_off += staged;
    n_parts += recs[i].n_layers + 1;
    add_touched(k->touched, &k->n_touched, (uint32_t)id);
    k->np = ++np;
  }
  *used = i;
  if (rt) mdb_txn_abort(rt);
  for (size_t j = 0; k && j < n_sealed; j++) add_touched(k->touched, &k->n_touched, sealed[j]);
  free(sealed);
  /* The descriptors the writer and committer use stay open until then. */
  for (size_t j = 0; !rc && k && j < k->n_touched; j++) {
    int fd;
    rc = seg_hold(c, k->touched[j], &fd);
    if (!rc) k->n_held++;
  }
  /* One write per piece; pieces adjacent both in memory and on disk merge. */
  if (!rc && !(k->w = calloc(n_parts + 1, sizeof *k->w))) rc = -ENOMEM;
  for (size_t j = 0; !rc && j < np; j++) {
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
  if (rc || (np == 0 && k->n_touched == 0)) {
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
static int post_chunks(kvt_cold *c, const kvt_cold_rec *recs, size_t n, const victim *vic,
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
    if (!k && !(k = calloc(1, sizeof *k))) { /* settles once what came before does */
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
    chunk *k = calloc(1, sizeof *k);
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

static int write_sync(kvt_cold *c, const kvt_cold_rec *recs, size_t n, const victim *vic,
                      size_t *written) {
  sync_count sc = {0};
  size_t posted;
  int rc = post_chunks(c, recs, n, vic, &posted, sync_settled, &sc);
  int drc = kvt_cold_drain(c);
  if (!rc) rc = sc.rc ? sc.rc : drc;
  if (!rc && sc.indexed < n) rc = KVT_EFULL;
  if (written) *written = sc.indexed;
  return rc;
}

/* ---------- reading ---------- */

static int find_locked(kvt_cold *c, MDB_txn *t, const kvt_key *key, kvt_cold_entry *e,
                       kvt_cold_slice *one, uint32_t layer) {
  MDB_val k = {16, (void *)key->b}, v;
  int rc = mdb_get(t, c->db_blocks, &k, &v);
  if (rc) return mdb_err(rc);
  kvt_cold_entry tmp;
  if (!e) e = &tmp;
  rc = get_entry(key, &v, e);
  if (rc || !one) return rc;
  if (layer >= e->n_layers) return KVT_ENOTFOUND;
  get_slice(entry_slice(&v, layer), one);
  return 0;
}

/* ---------- keys being removed ---------- */

static int key_cmp(const void *a, const void *b) { return memcmp(a, b, 16); }

/* Where key is, or would go, in the sorted gone set. With gone_lock. */
static size_t gone_pos(const kvt_cold *c, const kvt_key *key, int *hit) {
  size_t lo = 0, hi = c->gone_n;
  *hit = 0;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int r = key_cmp(&c->gone_v[mid], key);
    if (r == 0) {
      *hit = 1;
      return mid;
    }
    if (r < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static int gone_add(kvt_cold *c, const kvt_key *key) {
  int hit, rc = 0;
  pthread_mutex_lock(&c->gone_lock);
  size_t i = gone_pos(c, key, &hit);
  if (!hit && !(rc = grow(&c->gone_v, &c->gone_cap, c->gone_n, sizeof *c->gone_v))) {
    memmove(c->gone_v + i + 1, c->gone_v + i, (c->gone_n - i) * sizeof *c->gone_v);
    c->gone_v[i] = *key;
    c->gone_n++;
  }
  pthread_mutex_unlock(&c->gone_lock);
  return rc;
}

static void gone_del(kvt_cold *c, const kvt_key *key) {
  int hit;
  pthread_mutex_lock(&c->gone_lock);
  size_t i = gone_pos(c, key, &hit);
  if (hit) {
    memmove(c->gone_v + i, c->gone_v + i + 1, (c->gone_n - i - 1) * sizeof *c->gone_v);
    c->gone_n--;
  }
  pthread_mutex_unlock(&c->gone_lock);
}

static void gone_clear(kvt_cold *c) {
  pthread_mutex_lock(&c->gone_lock);
  c->gone_n = 0;
  pthread_mutex_unlock(&c->gone_lock);
}

static int gone_has(kvt_cold *c, const kvt_key *key) {
  int hit = 0;
  pthread_mutex_lock(&c->gone_lock);
  if (c->gone_n) gone_pos(c, key, &hit);
  pthread_mutex_unlock(&c->gone_lock);
  return hit;
}

/* Does keep() keep key? Marked gone first, unmarked when kept: a find
 * after keep() said no sees it gone; one before it made the engine
 * reference the block (see kvt_seq_append), so keep() says yes. */
static int keep_or_mark(kvt_cold *c, const kvt_key *key) {
  if (gone_add(c, key)) return 1; /* cannot mark it: keep it */
  int kept = c->keep && c->keep(c->keep_arg, key);
  if (kept) gone_del(c, key);
  return kept;
}

int kvt_cold_find(kvt_cold *c, const kvt_key *key, kvt_cold_entry *e) {
  if (gone_has(c, key)) return KVT_ENOTFOUND;
  MDB_txn *t;
  kvt_cold_entry tmp;
  if (!e) e = &tmp;
  int rc = mdb_err(mdb_txn_begin(c->env, NULL, MDB_RDONLY, &t));
  if (rc) return rc;
  rc = find_locked(c, t, key, e, NULL, 0);
  mdb_txn_abort(t);
  if (!rc && seg_trouble(c, e->seg)) rc = KVT_ENOTFOUND; /* its file is gone: a miss */
  if (!rc) evict_touch(c, key); /* a lookup of it: a use */
  return rc;
}

size_t kvt_cold_prefix(kvt_cold *c, const kvt_key *keys, size_t n) {
  MDB_txn *t;
  if (mdb_txn_begin(c->env, NULL, MDB_RDONLY, &t)) return 0;
  size_t i = 0;
  kvt_cold_entry e;
  while (i < n && find_locked(c, t, &keys[i], &e, NULL, 0) == 0 && !seg_trouble(c, e.seg) &&
         !gone_has(c, &keys[i]))
    i++;
  mdb_txn_abort(t);
  for (size_t k = 0; k < i; k++) evict_touch(c, &keys[k]);
  return i;
}

/* Read len bytes at off of segment id into a new aligned buffer. */
static int read_range(kvt_cold *c, uint32_t id, uint64_t off, uint32_t len, uint8_t **out) {
  int fd;
  int rc = seg_hold(c, id, &fd);
  if (rc) return rc;
  uint8_t *buf = kvt_io_buf_alloc(len);
  if (!buf) {
    seg_release(c, id);
    return -ENOMEM;
  }
  kvt_io_req r = {.fd = fd, .op = KVT_IO_OP_READ, .buf = buf, .len = len, .off = off};
  uint64_t t0 = kvt_hist_now_ns();
  pthread_mutex_lock(&c->rd_lock);
  rc = kvt_io_run(c->rio, &r, 1);
  pthread_mutex_unlock(&c->rd_lock);
  if (!rc) kvt_hist_add(&c->h_read, kvt_hist_now_ns() - t0);
  seg_release(c, id);
  if (rc) {
    kvt_io_buf_free(buf);
    return rc == -EIO && r.res >= 0 ? KVT_ECORRUPT : rc; /* short: past the end */
  }
  *out = buf;
  return 0;
}

/* Is the slice at p what the index says of (key, layer) in this
 * generation? The checksum is seeded with exactly those. */
static int slice_ok(const uint8_t *p, const kvt_cold_entry *e, uint32_t layer, const kvt_cold_slice *s) {
  return kvt_hash64(p, s->stored_len, slice_seed(&e->key, layer, e->seg_gen)) == s->checksum;
}

/* Decode a checked payload into K||V split across k_out and v_out; dz
 * decompresses (one thread at a time). */
static int decode_payload(ZSTD_DCtx *dz, const uint8_t *p, const kvt_cold_slice *s, uint32_t esize,
                          void *k_out, void *v_out, size_t each) {
  return kvt_rec_payload_decode(dz, p, s, esize, k_out, v_out, each);
}

/* decode_payload for a synchronous read (any thread). */
static int decode_sync(kvt_cold *c, const uint8_t *p, const kvt_cold_slice *s, uint32_t esize,
                       void *k_out, void *v_out, size_t each) {
  if (s->codec == KVT_COLD_CODEC_RAW) return decode_payload(NULL, p, s, esize, k_out, v_out, each);
  pthread_mutex_lock(&c->dz_lock);
  if (!c->dctx_sync) c->dctx_sync = ZSTD_createDCtx();
  int rc = decode_payload(c->dctx_sync, p, s, esize, k_out, v_out, each);
  pthread_mutex_unlock(&c->dz_lock);
  return rc;
}

static int remove_in(kvt_cold *c, MDB_txn *t, const kvt_key *key);
static int txn_end(kvt_cold *c, MDB_txn *t, int rc);

/* A read of key at `seen` failed a check. If the index still points
 * there, the record is bad: its entry leaves the index (KVT_ECORRUPT).
 * If it points elsewhere now (a reclaim relocated it meanwhile, and the
 * old place may hold new bytes), 1: read again. Gone: KVT_ENOTFOUND. */
static int bad_or_moved(kvt_cold *c, const kvt_key *key, const kvt_cold_entry *seen) {
  MDB_txn *t;
  int rd = c->cfg.rdonly;
  if (mdb_txn_begin(c->env, NULL, rd ? MDB_RDONLY : 0, &t)) return KVT_ECORRUPT;
  kvt_cold_entry cur;
  int rc = find_locked(c, t, key, &cur, NULL, 0);
  if (rc == KVT_ECORRUPT) rc = 0, cur = *seen; /* an unparsable entry: bad */
  if (!rc && (cur.seg != seen->seg || cur.seg_gen != seen->seg_gen || cur.offset != seen->offset))
    rc = 1;
  if (rc || rd) {
    mdb_txn_abort(t);
    return rc ? rc : KVT_ECORRUPT;
  }
  txn_end(c, t, remove_in(c, t, key)); /* not synced: if lost, the next failed check removes it */
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
  rc = find_locked(c, t, key, &e, &s, layer);
  mdb_txn_abort(t);
  if (rc && rc != KVT_ECORRUPT) return rc; /* an entry that does not parse: bad, below */
  if (!rc && seg_trouble(c, e.seg)) return KVT_ENOTFOUND; /* file gone: a miss; fsck --repair */
  if (!rc && bytes_each != e.bytes_each) return KVT_EBUFSIZE;
  uint32_t len = (uint32_t)kvt_align4k(s.stored_len);
  uint8_t *buf = NULL;
  if (rc || s.rel_off + (uint64_t)len > e.rec_len) rc = KVT_ECORRUPT;
  else rc = read_range(c, e.seg, e.offset + s.rel_off, len, &buf);
  if (!rc && !slice_ok(buf, &e, layer, &s)) rc = KVT_ECORRUPT;
  if (!rc) rc = decode_sync(c, buf, &s, (uint32_t)kvt_dtype_size(e.dtype), k_out, v_out,
                            bytes_each);
  kvt_io_buf_free(buf);
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

/* ---------- removal, stats, verification ---------- */

typedef struct undo_rec {
  kvt_key key, parent;
  uint32_t seg;
  uint64_t gen, len;
  int tracked;                 /* was in the eviction order */
} undo_rec;

/* End a write transaction that may have run remove_in: commit when rc is
 * 0, else abort; when it did not commit, put back what remove_in changed
 * in memory (live bytes, the eviction order). Returns rc or the commit's
 * error. */
static int txn_end(kvt_cold *c, MDB_txn *t, int rc) {
  /* The log is taken while the writer lock is still held: once the
   * transaction ends, another thread's may fill c->undo. */
  undo_rec *undo = c->undo;
  size_t n_undo = c->undo_n;
  c->undo = NULL;
  c->undo_n = c->undo_cap = 0;
  if (!rc) rc = mdb_err(mdb_txn_commit(t));
  else mdb_txn_abort(t);
  for (size_t i = 0; rc && i < n_undo; i++) {
    const undo_rec *u = &undo[i];
    pthread_mutex_lock(&c->st_lock);
    if (u->seg < c->n_segs && c->segs[u->seg].gen == u->gen) c->segs[u->seg].live += u->len;
    c->st.live_bytes += u->len;
    pthread_mutex_unlock(&c->st_lock);
    if (u->tracked && c->ev) {
      pthread_mutex_lock(&c->ev_lock);
      kvt_evict_add(c->ev, &u->key, &u->parent, u->len);
      pthread_mutex_unlock(&c->ev_lock);
    }
  }
  free(undo);
  return rc;
}

static int remove_in(kvt_cold *c, MDB_txn *t, const kvt_key *key) {
  kvt_cold_entry e;
  int rc = find_locked(c, t, key, &e, NULL, 0);
  MDB_val k = {16, (void *)key->b};
  if (rc == KVT_ECORRUPT) return mdb_err(mdb_del(t, c->db_blocks, &k, NULL));
  if (rc) return rc;
  if ((rc = grow(&c->undo, &c->undo_cap, c->undo_n, sizeof *c->undo))) return rc;
  rc = mdb_err(mdb_del(t, c->db_blocks, &k, NULL));
  if (rc) return rc;
  int tracked = 0;
  if (c->ev) {
    pthread_mutex_lock(&c->ev_lock);
    tracked = kvt_evict_has(c->ev, key);
    pthread_mutex_unlock(&c->ev_lock);
  }
  evict_forget(c, key);
  uint64_t took = 0;
  pthread_mutex_lock(&c->st_lock);
  if (e.seg < c->n_segs && c->segs[e.seg].gen == e.seg_gen && c->segs[e.seg].live >= e.rec_len) {
    c->segs[e.seg].live -= e.rec_len;
    took = e.rec_len;
  }
  if (c->st.live_bytes >= e.rec_len) c->st.live_bytes -= e.rec_len;
  uint32_t n_segs = c->n_segs;
  pthread_mutex_unlock(&c->st_lock);
  c->undo[c->undo_n++] = (undo_rec){.key = *key, .parent = e.parent, .seg = took ? e.seg : UINT32_MAX,
                                    .gen = e.seg_gen, .len = e.rec_len, .tracked = tracked};
  return e.seg < n_segs ? seg_save(c, t, e.seg) : 0;
}

int kvt_cold_remove(kvt_cold *c, const kvt_key *key) {
  if (c->cfg.rdonly) return KVT_ERDONLY;
  MDB_txn *t;
  int rc = mdb_err(mdb_txn_begin(c->env, NULL, 0, &t));
  if (rc) return rc;
  return txn_end(c, t, remove_in(c, t, key)); /* not synced: a removal that is
                                                lost is found again by the next
                                                failed check */
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
}

void kvt_cold_hists(kvt_cold *c, kvt_hist *read, kvt_hist *commit) {
  kvt_hist_read(&c->h_read, read);
  kvt_hist_read(&c->h_commit, commit);
}

/* The namespaces fsck checks entries against: seed and shape. */
typedef struct verify_ns {
  kvt_key seed;
  kvt_shape sh;
  int ok;                      /* the encoding parsed */
} verify_ns;

/* Which field of a record header differs from its index entry, or NULL. */
static const char *header_mismatch(const uint8_t *h, const kvt_cold_entry *e, const MDB_val *v) {
  uint32_t hl = header_len(e->n_layers);
  size_t tab = REC_FIXED + (size_t)SLICE_ENTRY * e->n_layers;
  if (memcmp(h, REC_MAGIC, 8) || kvt_le_get32(h + 8) != hl || kvt_le_get64(h + tab) != XXH3_64bits(h, tab))
    return "no intact record header there";
  if (memcmp(h + 24, e->key.b, 16)) return "the record there is another block's";
  if (kvt_le_get64(h + 16) != e->seg_gen) return "segment generation differs from the record's";
  if (kvt_le_get32(h + 12) != e->rec_len) return "record length differs from the record's";
  if (kvt_le_get32(h + 76) != e->n_layers) return "n_layers differs from the record's";
  if (kvt_le_get32(h + 80) != e->dtype) return "dtype differs from the record's";
  if (kvt_le_get32(h + 84) != e->bytes_each) return "bytes_each differs from the record's";
  if (kvt_le_get32(h + 72) != e->pos) return "chain position differs from the record's";
  if (memcmp(h + 40, e->parent.b, 16)) return "parent key differs from the record's";
  if (memcmp(h + 56, e->ns_seed.b, 16)) return "namespace differs from the record's";
  if (memcmp(h + REC_FIXED, (const uint8_t *)v->mv_data + ENTRY_FIXED, tab - REC_FIXED))
    return "layer table differs from the record's";
  /* the rest of the header page is zero as written: checked too, so that
   * no byte of a record goes unchecked (a flipped bit anywhere is found) */
  for (size_t i = tab + 8; i < hl; i++)
    if (h[i]) return "record header padding is not zero";
  return NULL;
}

/* Which field of an entry its namespace contradicts, or NULL. */
static const char *ns_mismatch(const kvt_cold_entry *e, const verify_ns *ns, size_t n_ns) {
  const verify_ns *hit = NULL;
  for (size_t i = 0; i < n_ns && !hit; i++)
    if (!memcmp(ns[i].seed.b, e->ns_seed.b, 16)) hit = &ns[i];
  if (!hit) return "its namespace is not in the index";
  if (!hit->ok) return "its namespace's encoding does not parse";
  if (e->n_layers != hit->sh.n_layers) return "n_layers differs from its namespace's";
  if (e->dtype != hit->sh.dtype) return "dtype differs from its namespace's";
  if (e->bytes_each != kvt_shape_block_bytes(&hit->sh)) return "bytes_each differs from its namespace's";
  return NULL;
}

/* Check one index entry against its namespace and its record on disk;
 * what went wrong goes to msg, naming the segment, offset and layer. */
static int verify_entry(kvt_cold *c, const kvt_cold_entry *e, const MDB_val *v,
                        const verify_ns *ns, size_t n_ns, char *msg, size_t cap) {
  uint32_t hl = header_len(e->n_layers);
  uint8_t *h = NULL;
  unsigned long long off = (unsigned long long)e->offset;
  const char *why = ns_mismatch(e, ns, n_ns);
  if (!why && e->rec_len < hl) why = "record length shorter than its header";
  if (why) {
    snprintf(msg, cap, "segment %u offset %llu: index entry: %s", e->seg, off, why);
    return KVT_ECORRUPT;
  }
  int rc = read_range(c, e->seg, e->offset, hl, &h);
  if (rc) {
    snprintf(msg, cap, "segment %u offset %llu: record header unreadable (%s)", e->seg, off,
             rc == KVT_ECORRUPT ? "past the end of the segment" : kvt_strerror(rc));
    return rc;
  }
  why = header_mismatch(h, e, v);
  kvt_io_buf_free(h);
  h = NULL;
  if (why) {
    snprintf(msg, cap, "segment %u offset %llu: index entry: %s", e->seg, off, why);
    return KVT_ECORRUPT;
  }
  for (uint32_t l = 0; l < e->n_layers; l++) {
    kvt_cold_slice s;
    get_slice(entry_slice(v, l), &s);
    uint32_t len = (uint32_t)kvt_align4k(s.stored_len);
    why = NULL;
    if (s.raw_len != 2 * (uint64_t)e->bytes_each || s.codec > KVT_COLD_CODEC_PLANES ||
        s.rel_off < hl || s.rel_off % KVT_IO_ALIGN || s.rel_off + (uint64_t)len > e->rec_len)
      why = "slice entry out of range";
    else if ((rc = read_range(c, e->seg, e->offset + s.rel_off, len, &h)))
      why = rc == KVT_ECORRUPT ? "slice past the end of the segment" : kvt_strerror(rc);
    else if (!slice_ok(h, e, l, &s))
      why = "slice checksum mismatch";
    kvt_io_buf_free(h);
    h = NULL;
    if (why) {
      snprintf(msg, cap, "segment %u offset %llu layer %u: %s", e->seg, off, l, why);
      return rc && rc != KVT_ECORRUPT ? rc : KVT_ECORRUPT;
    }
  }
  return 0;
}

/* Remove keys from the index in one transaction, durably (a removal must
 * not come back after a crash); also the namespace record ns_seed when
 * given. *removed (may be NULL) counts the entries that were there. */
static int remove_keys(kvt_cold *c, const kvt_key *keys, size_t n, const kvt_key *ns_seed,
                       uint64_t *removed) {
  MDB_txn *t = NULL;
  uint64_t count = 0;
  int rc = ns_seed ? kvt_cold_ns_file_del(c->dir, ns_seed) : 0; /* put back at open if this fails */
  if (!rc) rc = mdb_err(mdb_txn_begin(c->env, NULL, 0, &t));
  for (size_t i = 0; !rc && i < n; i++) {
    int r = remove_in(c, t, &keys[i]);
    if (!r) count++;
    else if (r != KVT_ENOTFOUND) rc = r;
  }
  if (!rc && ns_seed) {
    MDB_val k = {16, (void *)ns_seed->b};
    int r = mdb_del(t, c->db_ns, &k, NULL);
    if (r && r != MDB_NOTFOUND) rc = mdb_err(r);
  }
  if (t) rc = txn_end(c, t, rc);
  if (!rc) rc = mdb_err(mdb_env_sync(c->env, 1));
  if (!rc && removed) *removed = count;
  return rc;
}

/* Repair: segments whose file is missing or unusable, their entries
 * removed, become free (a free segment without a file is never used
 * again; one whose file is deleted can be appended to again once a new
 * file can be made in its place). Durable. */
static int segs_free_unusable(kvt_cold *c) {
  MDB_txn *t = NULL;
  int rc = 0;
  for (uint32_t id = 0; !rc && id < c->n_segs; id++) {
    pthread_mutex_lock(&c->st_lock);
    seg *s = &c->segs[id];
    int bad = s->err && !s->have && s->state != SEG_FREE && (int)id != c->active;
    if (bad) {
      if (c->st.live_bytes >= s->live) c->st.live_bytes -= s->live;
      s->state = SEG_FREE;
      s->live = 0;
    }
    pthread_mutex_unlock(&c->st_lock);
    if (bad && !t) rc = mdb_err(mdb_txn_begin(c->env, NULL, 0, &t));
    if (bad && !rc) rc = seg_save(c, t, id);
  }
  if (!t) return rc;
  if (rc) {
    mdb_txn_abort(t);
    return rc;
  }
  rc = mdb_err(mdb_txn_commit(t));
  return rc ? rc : mdb_err(mdb_env_sync(c->env, 1));
}

static int same_place(const kvt_cold_entry *a, const kvt_cold_entry *b) {
  return a->seg == b->seg && a->seg_gen == b->seg_gen && a->offset == b->offset;
}

/* A check of entry `seen` (from the scan's snapshot) failed. Beside a
 * writer that reclaims segments, the snapshot may hold an entry the
 * writer has since moved or removed, and whose place it has reused: look
 * again in a new snapshot. Bad (KVT_ECORRUPT) only when the index still
 * points where the check failed (a segment is reused only after the
 * removal of every entry into it committed); 0 when it left the index or
 * checks clean where it is now. */
static int verify_recheck(kvt_cold *c, const kvt_cold_entry *seen, const verify_ns *ns,
                          size_t n_ns, char *msg, size_t cap) {
  kvt_cold_entry last = *seen;
  for (int tries = 0; tries < 3; tries++) {
    MDB_txn *t;
    int rc = mdb_err(mdb_txn_begin(c->env, NULL, MDB_RDONLY, &t));
    if (rc) return rc;
    MDB_val k = {16, (void *)last.key.b}, v;
    kvt_cold_entry cur;
    int moved = 0;
    rc = mdb_err(mdb_get(t, c->db_blocks, &k, &v));
    if (!rc) rc = get_entry(&last.key, &v, &cur);
    if (!rc && !same_place(&cur, &last)) moved = 1, rc = verify_entry(c, &cur, &v, ns, n_ns, msg, cap);
    else if (!rc) rc = KVT_ECORRUPT;
    mdb_txn_abort(t);
    if (rc == KVT_ENOTFOUND) return 0; /* it left the index meanwhile */
    if (rc != KVT_ECORRUPT || !moved) return rc;
    last = cur; /* it moved, and failed where it is now: once more */
  }
  return 0; /* kept moving: the writer has it */
}

typedef struct verify_ctx {
  kvt_cold *c;
  void (*report)(void *, const kvt_key *, const char *);
  void *arg;
  uint64_t checked, bad;
  kvt_key *broken;
  size_t n_broken, cap;
  verify_ns *ns;
  size_t n_ns, ns_cap;
  char msg[256];
} verify_ctx;

static int verify_ns_one(void *arg, const kvt_key *seed, const uint8_t *enc, size_t len) {
  verify_ctx *x = arg;
  if (grow(&x->ns, &x->ns_cap, x->n_ns, sizeof *x->ns)) return -ENOMEM;
  verify_ns *n = &x->ns[x->n_ns++];
  n->seed = *seed;
  n->ok = kvt_cold_ns_shape(enc, len, &n->sh) == 0;
  return 0;
}

static int verify_one(void *arg, const kvt_key *key, const MDB_val *v, const kvt_cold_entry *e) {
  verify_ctx *x = arg;
  x->checked++;
  const char *why = e ? NULL : kvt_rec_entry_why(v->mv_data, v->mv_size);
  snprintf(x->msg, sizeof x->msg, "index entry malformed: %s", why ? why : "unreadable");
  int r = e ? verify_entry(x->c, e, v, x->ns, x->n_ns, x->msg, sizeof x->msg) : KVT_ECORRUPT;
  if (r == KVT_ECORRUPT && e) r = verify_recheck(x->c, e, x->ns, x->n_ns, x->msg, sizeof x->msg);
  if (r == -ENOMEM || transient(r)) return r;
  if (!r) return 0;
  const char *trouble = e ? seg_trouble(x->c, e->seg) : NULL;
  if (trouble) snprintf(x->msg, sizeof x->msg, "segment file segments/seg-%08u %s", e->seg, trouble);
  x->bad++;
  if (x->report) x->report(x->arg, key, x->msg);
  if (grow(&x->broken, &x->cap, x->n_broken, sizeof *x->broken)) return -ENOMEM;
  x->broken[x->n_broken++] = *key;
  return 0;
}

int kvt_cold_verify(kvt_cold *c, int repair, uint64_t *checked, uint64_t *bad,
                    void (*report)(void *, const kvt_key *, const char *), void *arg) {
  *checked = *bad = 0;
  if (repair && c->cfg.rdonly) return KVT_ERDONLY;
  verify_ctx x = {.c = c, .report = report, .arg = arg};
  int rc = kvt_cold_ns_each(c, verify_ns_one, &x);
  if (!rc) rc = each_entry(c, verify_one, &x);
  *checked = x.checked;
  *bad = x.bad;
  if (!rc && repair && x.n_broken) rc = remove_keys(c, x.broken, x.n_broken, NULL, NULL);
  if (!rc && repair) rc = segs_free_unusable(c);
  free(x.broken);
  free(x.ns);
  return rc;
}

/* ---------- drops ---------- */

typedef struct drop_ent {
  kvt_key key, parent;
  uint32_t pos;
} drop_ent;

static int cmp_key(const void *a, const void *b) { return memcmp(a, b, 16); }
static int cmp_drop_pos(const void *a, const void *b) {
  uint32_t x = ((const drop_ent *)a)->pos, y = ((const drop_ent *)b)->pos;
  return (x > y) - (x < y);
}

typedef struct drop_ctx {
  const kvt_key *seed, *root;
  uint32_t root_pos;
  drop_ent *ents;
  size_t n, cap;
} drop_ctx;

static int drop_one(void *arg, const kvt_key *key, const MDB_val *v, const kvt_cold_entry *e) {
  drop_ctx *x = arg;
  (void)v;
  if (!e || memcmp(e->ns_seed.b, x->seed->b, 16) || (x->root && e->pos <= x->root_pos)) return 0;
  if (grow(&x->ents, &x->cap, x->n, sizeof *x->ents)) return -ENOMEM;
  x->ents[x->n++] = (drop_ent){.key = *key, .parent = e->parent, .pos = e->pos};
  return 0;
}

/* Entries of namespace seed (all, or those whose chain passes through
 * root), as keys sorted for bsearch. */
static int drop_collect(kvt_cold *c, const kvt_key *seed, const kvt_key *root, uint32_t root_pos,
                        kvt_key **out, size_t *n_out) {
  *out = NULL;
  *n_out = 0;
  drop_ctx x = {.seed = seed, .root = root, .root_pos = root_pos};
  int rc = each_entry(c, drop_one, &x);
  drop_ent *ents = x.ents;
  size_t n = x.n;
  kvt_key *keys = rc ? NULL : malloc((n + 1) * sizeof *keys);
  if (!rc && !keys) rc = -ENOMEM;
  size_t m = 0;
  if (!rc && !root) {
    for (size_t i = 0; i < n; i++) keys[m++] = ents[i].key;
  } else if (!rc) {
    /* In chain order a block descends from root iff its parent does. */
    qsort(ents, n, sizeof *ents, cmp_drop_pos);
    keys[m++] = *root;
    for (size_t i = 0; i < n; i++) { /* keys[] stays sorted: insert in place */
      if (!bsearch(&ents[i].parent, keys, m, sizeof *keys, cmp_key)) continue;
      size_t at = 0;
      while (at < m && memcmp(keys[at].b, ents[i].key.b, 16) < 0) at++;
      memmove(keys + at + 1, keys + at, (m - at) * sizeof *keys);
      keys[at] = ents[i].key;
      m++;
    }
  }
  free(ents);
  if (rc) return rc;
  *out = keys;
  *n_out = m;
  return 0;
}

int kvt_cold_drop(kvt_cold *c, const kvt_key *seed, const kvt_key *root, uint32_t root_pos,
                  uint64_t *dropped) {
  if (dropped) *dropped = 0;
  if (c->cfg.rdonly) return KVT_ERDONLY;
  kvt_key *keys;
  size_t n;
  int rc = drop_collect(c, seed, root, root_pos, &keys, &n);
  if (!rc) rc = remove_keys(c, keys, n, root ? NULL : seed, dropped);
  free(keys);
  return rc;
}

/* ---------- capacity: reclaiming segments ---------- */

void kvt_cold_set_lost(kvt_cold *c, void (*lost)(void *, const kvt_key *)) { c->lost = lost; }

void kvt_cold_set_keep(kvt_cold *c, int (*keep)(void *, const kvt_key *), void *arg) {
  c->keep = keep;
  c->keep_arg = arg;
}

/* Would records of these sizes fit, placed in order, without reclaiming,
 * leaving `reserve` spare segments? */
static int fits(const kvt_cold *c, const uint64_t *sizes, size_t n, uint64_t reserve) {
  uint64_t segb = c->cfg.segment_bytes, room = c->active >= 0 ? segb - c->segs[c->active].used : 0;
  uint64_t spare = spare_segs(c);
  for (size_t i = 0; i < n; i++) {
    if (sizes[i] > room) {
      if (spare-- <= reserve) return 0;
      room = segb;
    }
    room -= sizes[i];
  }
  return 1;
}

/* The full segment with the fewest live bytes; the one being appended
 * only when no segment is full (it holds the newest blocks, the likeliest
 * to be wanted again). */
static int victim_seg(kvt_cold *c) {
  int best = -1;
  pthread_mutex_lock(&c->st_lock); /* live changes under it (removals from any thread) */
  for (uint32_t id = 0; id < c->n_segs; id++) {
    const seg *s = &c->segs[id];
    if (s->state != SEG_FULL || !s->have || (int)id == c->active) continue;
    if (best < 0 || s->live < c->segs[best].live) best = (int)id;
  }
  if (best < 0 && c->active >= 0 && c->segs[c->active].used > 0) best = c->active;
  pthread_mutex_unlock(&c->st_lock);
  return best;
}

static void carry_free(carry *cy, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(cy[i].raw);
    free(cy[i].layers);
  }
}

/* Read every layer of entry e back into a carry record. */
static int carry_load(kvt_cold *c, const kvt_cold_entry *e, carry *cy) {
  size_t each = e->bytes_each, L = e->n_layers;
  cy->raw = malloc(2 * each * L);
  cy->layers = malloc(L * sizeof *cy->layers);
  if (!cy->raw || !cy->layers) return -ENOMEM;
  for (uint32_t l = 0; l < L; l++) {
    uint8_t *p = cy->raw + 2 * each * l;
    int rc = kvt_cold_read_layer(c, &e->key, l, p, p + each, each);
    if (rc) return rc;
    cy->layers[l] = p;
  }
  cy->rec = (kvt_cold_rec){.key = e->key, .parent = e->parent, .ns_seed = e->ns_seed, .pos = e->pos,
                           .n_layers = e->n_layers, .dtype = e->dtype, .bytes_each = e->bytes_each,
                           .layers = cy->layers};
  return 0;
}

/* Entries that live in segment id (its current generation). */
typedef struct seg_ctx {
  uint32_t id;
  uint64_t gen;
  kvt_cold_entry *v;
  size_t n, cap;
} seg_ctx;

static int seg_one(void *arg, const kvt_key *key, const MDB_val *v, const kvt_cold_entry *e) {
  seg_ctx *x = arg;
  (void)key;
  (void)v;
  if (!e || e->seg != x->id || e->seg_gen != x->gen) return 0;
  if (grow(&x->v, &x->cap, x->n, sizeof *x->v)) return -ENOMEM;
  x->v[x->n++] = *e;
  return 0;
}

static int seg_entries(kvt_cold *c, uint32_t id, kvt_cold_entry **out, size_t *n_out) {
  seg_ctx x = {.id = id, .gen = c->segs[id].gen};
  int rc = each_entry(c, seg_one, &x);
  if (rc) {
    free(x.v);
    x.v = NULL;
    x.n = 0;
  }
  *out = x.v;
  *n_out = x.n;
  return rc;
}

/* Relocate the carried records out of segment vic (write_sync), then
 * remove what is left of vic from the index and free it, in one durable
 * transaction. A block is never out of the index while it is still
 * referenced: a kill at any point leaves it at its old place or its new
 * one. Returns 1 when vic was freed, 0 when it could not be (a relocation
 * did not fit), or a negative error. */
static int relocate_and_free(kvt_cold *c, const victim *vic, const kvt_cold_entry *ents, size_t n,
                             const carry *cy, size_t n_cy) {
  int rc = 0;
  if (n_cy) {
    kvt_cold_rec *cr = malloc(n_cy * sizeof *cr);
    if (!cr) return -ENOMEM;
    for (size_t i = 0; i < n_cy; i++) cr[i] = cy[i].rec;
    rc = write_sync(c, cr, n_cy, vic, NULL);
    free(cr);
    if (rc) return rc == KVT_EFULL ? 0 : rc;
  }
  MDB_txn *t;
  rc = mdb_err(mdb_txn_begin(c->env, NULL, 0, &t));
  if (rc) return rc;
  pthread_mutex_lock(&c->st_lock); /* as it stands (removers wait for the writer lock) */
  uint64_t live0 = c->segs[vic->id].live;
  pthread_mutex_unlock(&c->st_lock);
  int freed = 1;
  for (size_t i = 0; !rc && freed && i < n_cy; i++) { /* every relocation indexed? */
    kvt_cold_entry cur;
    freed = find_locked(c, t, &cy[i].rec.key, &cur, NULL, 0) || !in_victim(&cur, vic);
  }
  for (size_t i = 0; !rc && freed && i < n; i++) {
    kvt_cold_entry cur;
    int r = find_locked(c, t, &ents[i].key, &cur, NULL, 0);
    if (r == KVT_ENOTFOUND || (!r && !in_victim(&cur, vic))) continue; /* gone or relocated */
    r = remove_in(c, t, &ents[i].key);
    if (r && r != KVT_ENOTFOUND) rc = r;
  }
  if (!rc && freed) {
    pthread_mutex_lock(&c->st_lock);
    c->segs[vic->id].state = SEG_FREE;
    c->segs[vic->id].live = 0;
    pthread_mutex_unlock(&c->st_lock);
    rc = seg_save(c, t, vic->id);
  }
  if (!freed && !rc) {
    mdb_txn_abort(t); /* nothing was removed */
    return 0;
  }
  rc = txn_end(c, t, rc);
  if (rc) { /* the segment table in memory follows the index again */
    pthread_mutex_lock(&c->st_lock);
    if (c->segs[vic->id].state == SEG_FREE) c->segs[vic->id].state = SEG_FULL;
    c->segs[vic->id].live = live0;
    pthread_mutex_unlock(&c->st_lock);
    return rc;
  }
  if (freed) rc = mdb_err(mdb_env_sync(c->env, 1)); /* removal durable before reuse */
  return rc ? rc : freed;
}

/* Reclaim the full segment with the fewest live bytes: the blocks the
 * engine still references are read back and written again elsewhere
 * first, then every other entry of the segment leaves the index, durably,
 * before the segment is marked free for reuse. Returns the bytes of room
 * it made (a segment less what was rewritten; 0: reclaiming cannot help),
 * or a negative error. */
static int64_t reclaim_one(kvt_cold *c) {
  int id = victim_seg(c);
  if (id < 0) return 0;
  int was_active = id == c->active;
  if (was_active) { /* sealed: relocations must go elsewhere */
    pthread_mutex_lock(&c->st_lock);
    c->segs[id].state = SEG_FULL;
    c->active = -1;
    pthread_mutex_unlock(&c->st_lock);
  }
  victim vic = {(uint32_t)id, c->segs[id].gen};
  kvt_cold_entry *ents;
  size_t n;
  int rc = seg_entries(c, vic.id, &ents, &n);
  if (rc) return rc;
  carry *cy = n ? calloc(n, sizeof *cy) : NULL;
  uint64_t kept = 0, *sizes = n ? malloc(n * sizeof *sizes) : NULL;
  size_t n_cy = 0;
  if (n && (!cy || !sizes)) rc = -ENOMEM;
  for (size_t i = 0; i < n && !rc; i++) {
    if (!keep_or_mark(c, &ents[i].key)) continue;
    carry *x = &cy[n_cy++];
    int r = carry_load(c, &ents[i], x);
    if (r == KVT_ECORRUPT || r == KVT_ENOTFOUND) { /* unreadable: it was lost already */
      if (c->lost) c->lost(c->keep_arg, &ents[i].key); /* the engine counted it durable */
      carry_free(x, 1);
      *x = (carry){0};
      n_cy--;
    } else if (r) {
      rc = r;
    } else {
      sizes[n_cy - 1] = kvt_cold_record_max(x->rec.n_layers, x->rec.bytes_each);
      kept += ents[i].rec_len;
    }
  }
  pthread_mutex_lock(&c->st_lock);
  uint64_t live = c->segs[id].live;
  pthread_mutex_unlock(&c->st_lock);
  int freed = 0;
  /* Worth it when it frees something: a dead block, or room (a few
   * referenced blocks moved together out of a segment of their own, into
   * the spare if need be, leave it free); possible only when the
   * relocations fit (the spare segment new records leave is for them). */
  int worth = n_cy == 0 || kept < live || kept <= c->cfg.segment_bytes / 2;
  if (!rc && worth && fits(c, sizes, n_cy, 0))
    freed = (rc = relocate_and_free(c, &vic, ents, n, cy, n_cy)) > 0;
  gone_clear(c); /* removed for good, or not removed after all */
  carry_free(cy, n_cy);
  free(cy);
  free(sizes);
  free(ents);
  if (!freed && was_active && c->active < 0 && c->segs[id].state == SEG_FULL) {
    pthread_mutex_lock(&c->st_lock); /* not reclaimed after all: append to it again */
    c->segs[id].state = SEG_OPEN;
    c->active = id;
    pthread_mutex_unlock(&c->st_lock);
  }
  if (rc < 0) return rc;
  if (!freed) return 0;
  pthread_mutex_lock(&c->st_lock);
  c->reclaims++;
  c->evictions += n - n_cy; /* the kept ones were written again */
  c->relocated += n_cy;
  pthread_mutex_unlock(&c->st_lock);
  /* A whole segment is free again, less what was relocated (kept < live
   * <= segment size): > 0 even when nothing in it was live any more. */
  return (int64_t)(c->cfg.segment_bytes - kept);
}

/* Make room for records recs[0..n) one segment at a time, while
 * reclaiming helps (at most every segment once), keeping one spare
 * segment for relocations. Reclaiming needs the pipeline drained. */
static int make_room(kvt_cold *c, const kvt_cold_rec *recs, size_t n) {
  uint64_t *sizes = malloc(n * sizeof *sizes);
  if (!sizes) return -ENOMEM;
  for (size_t i = 0; i < n; i++) sizes[i] = kvt_cold_record_max(recs[i].n_layers, recs[i].bytes_each);
  int rc = 0;
  for (uint32_t round = 0; !rc && round <= c->n_segs; round++) {
    if (fits(c, sizes, n, 1)) break;
    kvt_cold_drain(c); /* a failure in it was told to its caller */
    int64_t r = reclaim_one(c);
    if (r <= 0) rc = (int)r;
    if (r == 0) break;
  }
  free(sizes);
  return rc;
}

int kvt_cold_write(kvt_cold *c, const kvt_cold_rec *recs, size_t n, size_t *written) {
  if (written) *written = 0;
  if (c->cfg.rdonly) return KVT_ERDONLY;
  if (n == 0) return 0;
  int rc = make_room(c, recs, n);
  return rc ? rc : write_sync(c, recs, n, NULL, written);
}

int kvt_cold_post(kvt_cold *c, const kvt_cold_rec *recs, size_t n, size_t *posted,
                  kvt_cold_settled_fn settled, void *arg) {
  *posted = 0;
  if (c->cfg.rdonly) return KVT_ERDONLY;
  if (n == 0) return 0;
  int rc = make_room(c, recs, n);
  return rc ? rc : post_chunks(c, recs, n, NULL, posted, settled, arg);
}

/* ---------- asynchronous reads ---------- */

struct kvt_cold_batch {
  pthread_mutex_t m;
  pthread_cond_t cv;
  size_t pending;
  void (*notify)(void *arg);   /* told once pending reaches 0 (the tier's read_notify) */
  void *notify_arg;
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
    rc = get_entry(key, &le->v, &le->e);
    if (rc) return rc;
    le->have = 1;
    le->key = *key;
  }
  *e = le->e;
  if (layer >= e->n_layers) return KVT_ENOTFOUND;
  get_slice(entry_slice(&le->v, layer), one);
  return 0;
}

/* Look a request up; 1 when it is to be read, else completed at once. */
static int read_lookup(kvt_cold *c, MDB_txn *t, last_entry *le, kvt_cold_read *r, inflight *f) {
  int rc = find_cached(c, t, le, &r->key, &f->e, &f->s, r->layer);
  f->len = (uint32_t)kvt_align4k(f->s.stored_len);
  f->fd = -1;
  if (!rc && r->bytes_each != f->e.bytes_each) rc = KVT_EBUFSIZE;
  if (!rc && f->s.rel_off + (uint64_t)f->len > f->e.rec_len) rc = KVT_ECORRUPT;
  if (!rc && seg_trouble(c, f->e.seg)) rc = KVT_ENOTFOUND; /* file gone: a miss; fsck --repair */
  if (!rc) rc = seg_hold(c, f->e.seg, &f->fd); /* released by read_finish */
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

/* Can f join span sp: both small, f follows on disk, close enough, fits? */
static int span_joins(const span *sp, const inflight *f) {
  uint64_t end = span_end(sp);
  return f->len < SPAN_SMALL && sp->first->len < SPAN_SMALL && f->fd == sp->io.fd &&
         f->off >= end && f->off - end <= SPAN_GAP && f->off + f->len - sp->start <= SPAN_MAX;
}

/* Check and decode one request its span read (res: what the read gave it). */
static void read_finish(kvt_cold *c, ZSTD_DCtx *dz, inflight *f, int res) {
  kvt_cold_read *r = f->r;
  seg_release(c, f->e.seg); /* the read is over */
  f->fd = -1;
  const uint8_t *p = res ? NULL : f->sp->b.p + (f->off - f->sp->start);
  int rc = res;
  if (!rc && !slice_ok(p, &f->e, r->layer, &f->s)) rc = KVT_ECORRUPT;
  if (!rc) rc = decode_payload(dz, p, &f->s, (uint32_t)kvt_dtype_size(f->e.dtype),
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
  uint8_t *p = kvt_io_buf_alloc(cap);
  if (!p) {
    pool[(*n_pool)++] = sp->b; /* keep what there was */
    sp->b = (rbuf){0};
    return -ENOMEM;
  }
  kvt_io_buf_free(sp->b.p);
  kvt_mem_note(c->mem, KVT_MEM_OTHER, (int64_t)cap - (int64_t)sp->b.cap);
  sp->b = (rbuf){p, cap};
  return 0;
}

/* The reader goes idle (or stops): the pool's buffers go. */
static void pool_trim(kvt_cold *c, rbuf *pool, size_t *n_pool) {
  for (size_t i = 0; i < *n_pool; i++) {
    kvt_io_buf_free(pool[i].p);
    kvt_mem_note(c->mem, KVT_MEM_OTHER, -(int64_t)pool[i].cap);
  }
  *n_pool = 0;
}

static void *reader_main(void *arg) {
  struct reader_ctx *rx = arg;
  kvt_cold *c = rx->c;
  kvt_io *aio = c->aio[rx->i];
  ZSTD_DCtx *dz = c->dctx_async[rx->i];
  inflight *slots = calloc(READER_SLOTS, sizeof *slots);
  span *spans = calloc(READER_SLOTS, sizeof *spans);
  rbuf pool[READER_SLOTS];
  kvt_io_req *start[READER_SLOTS], *done[READER_SLOTS];
  size_t n_req = 0, n_io = 0, n_pool = 0, depth = c->cfg.io.depth ? c->cfg.io.depth : 64;
  depth = (depth + c->n_readers - 1) / c->n_readers; /* the depth is shared: more in flight
                                                        measured slower here */
  if (depth > READER_SLOTS) depth = READER_SLOTS;
  span *free_sp = NULL, *ready = NULL, **ready_tail = &ready;
  for (size_t i = 0; spans && i < READER_SLOTS; i++) {
    spans[i].next = free_sp;
    free_sp = &spans[i];
  }
  for (;;) {
    pthread_mutex_lock(&c->rq_lock);
    if (!c->rq_head && !n_req) {
      pthread_mutex_unlock(&c->rq_lock);
      pool_trim(c, pool, &n_pool);
      pthread_mutex_lock(&c->rq_lock);
    }
    while (!c->rq_head && !n_req && !c->reader_stop) pthread_cond_wait(&c->rq_cv, &c->rq_lock);
    if (!c->rq_head && !n_req && c->reader_stop) {
      pthread_mutex_unlock(&c->rq_lock);
      break;
    }
    kvt_cold_read *take = NULL, **tail = &take;
    for (size_t room = READER_SLOTS - n_req; c->rq_head && room; room--) {
      kvt_cold_read *r = c->rq_head;
      c->rq_head = r->next;
      r->next = NULL;
      *tail = r;
      tail = &r->next;
    }
    if (!c->rq_head) c->rq_tail = NULL;
    pthread_mutex_unlock(&c->rq_lock);
    if (take && (!slots || !spans)) { /* no memory for the reader: fail them */
      for (kvt_cold_read *r = take, *next; r; r = next) {
        next = r->next;
        read_done(r, -ENOMEM);
      }
      continue;
    }
    if (take) { /* look up, then group into spans, in request order */
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
        while (slots[i].r) i++;
        inflight *f = &slots[i];
        if (!read_lookup(c, t, &le, r, f)) continue;
        n_req++;
        if (cur && span_joins(cur, f)) {
          cur->last->sp_next = f;
        } else {
          cur = free_sp; /* there is one: spans in use <= requests in flight */
          free_sp = cur->next;
          cur->next = NULL;
          cur->io = (kvt_io_req){.fd = f->fd, .op = KVT_IO_OP_READ, .off = f->off, .user = cur};
          cur->start = f->off;
          cur->got = 0;
          cur->b = (rbuf){0};
          cur->first = f;
          *ready_tail = cur;
          ready_tail = &cur->next;
        }
        cur->last = f;
        f->sp = cur;
      }
      if (t) mdb_txn_abort(t);
    }
    /* Start what the ring takes; the rest waits for completions. */
    size_t n_start = 0;
    while (ready && n_io + n_start < depth) {
      span *sp = ready;
      ready = sp->next;
      if (!ready) ready_tail = &ready;
      sp->next = NULL;
      if (!sp->b.p) { /* a new span (a resubmitted one has its buffer) */
        if (span_buf(c, sp, pool, &n_pool)) { /* nothing to read into */
          size_t fin = 0;
          sp->io.res = -ENOMEM;
          span_done(c, dz, sp, &fin); /* fails them all */
          n_req -= fin;
          sp->next = free_sp;
          free_sp = sp;
          continue;
        }
        sp->io.len = (uint32_t)(span_end(sp) - sp->start);
        sp->io.buf = sp->b.p;
        sp->t0_ns = kvt_hist_now_ns();
      }
      start[n_start++] = &sp->io;
    }
    int rc = n_start ? kvt_io_submit(aio, start, n_start) : 0;
    if (!rc) n_io += n_start;
    size_t n_done = 0;
    if (rc) { /* none started: each fails as a read error would */
      for (size_t i = 0; i < n_start; i++) start[i]->res = rc;
      memcpy(done, start, n_start * sizeof *start);
      n_done = n_start;
    } else if (n_io) {
      pthread_mutex_lock(&c->rq_lock);
      int more = c->rq_head != NULL && n_req < READER_SLOTS;
      pthread_mutex_unlock(&c->rq_lock);
      /* A failed reap (EINTR and the like) leaves the reads in flight: their
       * buffers stay allocated until the kernel is done with them. */
      kvt_io_reap(aio, more ? 0 : 1, done, READER_SLOTS, &n_done);
      n_io -= n_done;
    }
    for (size_t i = 0; i < n_done; i++) {
      span *sp = done[i]->user;
      if (span_read_whole(sp)) /* counted before its requests are told */
        kvt_hist_add(&c->h_read, kvt_hist_now_ns() - sp->t0_ns);
      size_t fin = 0;
      int over = span_done(c, dz, sp, &fin);
      n_req -= fin;
      if (over) { /* its buffer back to the pool, itself to the free list */
        pool[n_pool++] = sp->b;
        sp->b = (rbuf){0};
        sp->next = free_sp;
        free_sp = sp;
      } else { /* short: the rest goes first */
        sp->next = ready;
        if (!ready) ready_tail = &sp->next;
        ready = sp;
      }
    }
  }
  pool_trim(c, pool, &n_pool);
  free(slots);
  free(spans);
  return NULL;
}

static int reader_start(kvt_cold *c) {
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

static void reader_stop(kvt_cold *c) {
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

int kvt_cold_read_submit(kvt_cold *c, kvt_cold_read *reqs, size_t n, kvt_cold_batch **out) {
  *out = NULL;
  if (n == 0) return KVT_ECOUNT;
  kvt_cold_batch *b = malloc(sizeof *b);
  if (!b) return -ENOMEM;
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
  free(b);
}

/* ---------- eviction order (tiers/evict.h) ----------
 * The index knows where blocks are; evict.c knows which to give up first.
 * It tracks every indexed block of a writer (key, parent, record size):
 * loaded from the index at open, told of new records by the committer as
 * they are indexed (evict_track),
 * of uses by kvt_cold_find() and kvt_cold_prefix(), of removals by
 * remove_in(). Records that reclaiming a segment relocates (still
 * referenced) keep their key and their place in it. ev_lock is a leaf
 * lock: keep() (which takes the engine lock) is never called with it
 * held. */

static int evict_load_one(void *arg, const kvt_key *key, const MDB_val *v, const kvt_cold_entry *e) {
  kvt_cold *c = arg;
  (void)v;
  if (!e) return 0; /* unparsable: fsck's business, never chosen */
  int rc = kvt_evict_add(c->ev, key, &e->parent, e->rec_len);
  return rc == -EEXIST ? 0 : rc;
}

/* KVT_EVICT_LEARNED's model (weights and clock) is one record of the meta
 * table, "reuse_model" (tiers/reuse_model.c says its versioned layout),
 * written at close and read at open, so a restarted writer does not start
 * from nothing. The model only ranks blocks: a record of another version,
 * or one that does not check, is ignored (the model starts afresh), and a
 * store without one is fine. fsck --repair does not carry it over. */
#define REUSE_MODEL_KEY "reuse_model"

static void evict_model_load(kvt_cold *c) {
  MDB_txn *t;
  if (c->cfg.evict_policy != KVT_EVICT_LEARNED || mdb_txn_begin(c->env, NULL, MDB_RDONLY, &t)) return;
  MDB_val k = {strlen(REUSE_MODEL_KEY), (void *)REUSE_MODEL_KEY}, v;
  if (!mdb_get(t, c->db_meta, &k, &v)) kvt_evict_model_load(c->ev, v.mv_data, v.mv_size);
  mdb_txn_abort(t);
}

static void evict_model_save(kvt_cold *c) {
  uint8_t buf[KVT_EVICT_MODEL_MAX];
  size_t n = c->env && c->ev ? kvt_evict_model_save(c->ev, buf, sizeof buf) : 0;
  MDB_txn *t;
  if (!n || mdb_txn_begin(c->env, NULL, 0, &t)) return;
  MDB_val k = {strlen(REUSE_MODEL_KEY), (void *)REUSE_MODEL_KEY}, v = {n, buf};
  if (mdb_put(t, c->db_meta, &k, &v, 0)) mdb_txn_abort(t);
  else mdb_txn_commit(t); /* a lost model costs hit rate for a while, never data */
}

size_t kvt_cold_model_state(kvt_cold *c, uint8_t *out, size_t cap) {
  if (!c->ev) return 0;
  pthread_mutex_lock(&c->ev_lock);
  size_t n = kvt_evict_model_save(c->ev, out, cap);
  pthread_mutex_unlock(&c->ev_lock);
  return n;
}

static int evict_start(kvt_cold *c) {
  if (c->cfg.rdonly) return 0;
  pthread_mutex_init(&c->ev_lock, NULL);
  c->ev_on = 1;
  int rc = kvt_evict_create(c->mem, KVT_MEM_INDEX, c->cfg.evict_policy, &c->ev);
  if (!rc) evict_model_load(c); /* first: the blocks loaded are ranked by it */
  if (!rc) rc = each_entry(c, evict_load_one, c);
  return rc;
}

static void evict_stop(kvt_cold *c) {
  if (!c->ev_on) return;
  evict_model_save(c);
  kvt_evict_free(c->ev);
  c->ev = NULL;
  pthread_mutex_destroy(&c->ev_lock);
}

static void evict_touch(kvt_cold *c, const kvt_key *key) {
  if (!c->ev) return;
  pthread_mutex_lock(&c->ev_lock);
  kvt_evict_touch(c->ev, key);
  pthread_mutex_unlock(&c->ev_lock);
}

static void evict_forget(kvt_cold *c, const kvt_key *key) {
  if (!c->ev) return;
  pthread_mutex_lock(&c->ev_lock);
  kvt_evict_remove(c->ev, key, NULL);
  pthread_mutex_unlock(&c->ev_lock);
}

/* Records a chunk has just indexed join the order (committer thread). */
static void evict_track(kvt_cold *c, const placed *pl, size_t n) {
  if (!c->ev) return;
  pthread_mutex_lock(&c->ev_lock);
  for (size_t i = 0; i < n; i++) /* -ENOMEM: untracked, still reclaimable */
    kvt_evict_add(c->ev, &pl[i].e.key, &pl[i].e.parent, pl[i].e.rec_len);
  pthread_mutex_unlock(&c->ev_lock);
}

/* Keys found kept while choosing victims, so the order skips them:
 * sorted, found by binary search. */
typedef struct kept_set {
  kvt_key *v;
  size_t n, cap;
} kept_set;

static int in_kept(void *arg, const kvt_key *key) {
  const kept_set *k = arg;
  return k->n && bsearch(key, k->v, k->n, sizeof *k->v, key_cmp) != NULL;
}

static int kept_add(kept_set *k, const kvt_key *key) {
  int rc = grow(&k->v, &k->cap, k->n, sizeof *k->v);
  if (rc) return rc;
  size_t i = k->n;
  while (i > 0 && key_cmp(&k->v[i - 1], key) > 0) i--;
  memmove(k->v + i + 1, k->v + i, (k->n - i) * sizeof *k->v);
  k->v[i] = *key;
  k->n++;
  return 0;
}

/* Put keys back in the eviction order (their removal failed). */
static void evict_restore(kvt_cold *c, const kvt_key *keys, size_t n) {
  MDB_txn *t;
  if (mdb_txn_begin(c->env, NULL, MDB_RDONLY, &t)) return;
  for (size_t i = 0; i < n; i++) {
    kvt_cold_entry e;
    if (find_locked(c, t, &keys[i], &e, NULL, 0)) continue; /* gone after all */
    pthread_mutex_lock(&c->ev_lock);
    kvt_evict_add(c->ev, &e.key, &e.parent, e.rec_len);
    pthread_mutex_unlock(&c->ev_lock);
  }
  mdb_txn_abort(t);
}

int kvt_cold_admit(kvt_cold *c, const kvt_key *key, const kvt_key *parent, uint32_t depth,
                   uint32_t ns, uint64_t rec_bytes) {
  if (!c->ev || c->cfg.rdonly || c->cfg.evict_policy != KVT_EVICT_LEARNED) return 1;
  uint64_t segb = c->cfg.segment_bytes, lim = c->cfg.bytes_limit;
  uint64_t room = lim > 2 * segb ? lim - segb : lim / 2; /* as kvt_cold_evict_for counts it */
  pthread_mutex_lock(&c->st_lock);
  uint64_t live = c->st.live_bytes + c->pending_bytes;
  pthread_mutex_unlock(&c->st_lock);
  pthread_mutex_lock(&c->ev_lock);
  int ok = kvt_evict_admit(c->ev, key, parent, depth, ns, live + rec_bytes > room);
  pthread_mutex_unlock(&c->ev_lock);
  return ok;
}

#define KEPT_MAX 4096 /* referenced blocks looked past before giving up */

int64_t kvt_cold_evict_for(kvt_cold *c, uint64_t need) {
  if (!c->ev || c->cfg.rdonly) return 0;
  uint64_t segb = c->cfg.segment_bytes, lim = c->cfg.bytes_limit;
  uint64_t room = lim > 2 * segb ? lim - segb : lim / 2; /* a segment's slack for reclaiming */
  uint64_t target = need < room ? room - need : 0;
  pthread_mutex_lock(&c->st_lock);
  uint64_t live = c->st.live_bytes + c->pending_bytes; /* posted records will be live */
  pthread_mutex_unlock(&c->st_lock);
  kept_set kept = {0};
  kvt_key *gone = NULL;
  size_t n_gone = 0, cap_gone = 0;
  int rc = 0;
  while (live > target && kept.n < KEPT_MAX) {
    kvt_key v;
    uint64_t bytes = 0;
    pthread_mutex_lock(&c->ev_lock);
    int r = kvt_evict_victim(c->ev, in_kept, &kept, &v, &bytes);
    pthread_mutex_unlock(&c->ev_lock);
    if (r) break; /* everything left is referenced */
    if (keep_or_mark(c, &v)) { /* referenced: look past it */
      if ((rc = kept_add(&kept, &v))) break;
      continue;
    }
    if ((rc = grow(&gone, &cap_gone, n_gone, sizeof *gone))) {
      gone_del(c, &v);
      break;
    }
    gone[n_gone++] = v;
    evict_forget(c, &v); /* out of the order now: the next victim is another */
    live = live > bytes ? live - bytes : 0;
  }
  uint64_t removed = 0;
  int rrc = n_gone ? remove_keys(c, gone, n_gone, NULL, &removed) : 0; /* durable, one txn */
  if (rrc) evict_restore(c, gone, n_gone); /* still indexed: back in the order */
  gone_clear(c);
  free(kept.v);
  free(gone);
  if (!rc) rc = rrc;
  if (rc) return rc;
  pthread_mutex_lock(&c->st_lock);
  c->ev_evictions += removed;
  pthread_mutex_unlock(&c->st_lock);
  return (int64_t)removed;
}

/* ---------- the record format, for rebuilding the index (cold_rebuild.c) ---------- */

uint32_t kvt_cold_header_len(uint32_t n_layers) { return header_len(n_layers); }

int kvt_cold_header_parse(const uint8_t *h, size_t avail, kvt_cold_entry *e) {
  if (avail < REC_FIXED || memcmp(h, REC_MAGIC, 8)) return KVT_ECORRUPT;
  uint32_t n_layers = kvt_le_get32(h + 76);
  if (n_layers == 0 || n_layers > KVT_MAX_LAYERS) return KVT_ECORRUPT;
  uint32_t hl = header_len(n_layers);
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
  get_slice(rec + REC_FIXED + (size_t)SLICE_ENTRY * layer, &s);
  uint64_t len = kvt_align4k(s.stored_len);
  if (s.rel_off < header_len(e->n_layers) || s.rel_off % KVT_IO_ALIGN ||
      s.rel_off + len > e->rec_len || s.raw_len != 2 * (uint64_t)e->bytes_each ||
      s.codec > KVT_COLD_CODEC_PLANES)
    return 0;
  return slice_ok(rec + s.rel_off, e, layer, &s);
}

const char *kvt_cold_dir(const kvt_cold *c) { return c->dir; }

size_t kvt_cold_entry_encode(uint8_t *out, const kvt_cold_entry *e, const uint8_t *table) {
  put_entry(out, e);
  memcpy(out + ENTRY_FIXED, table, (size_t)SLICE_ENTRY * e->n_layers);
  return entry_len(e->n_layers);
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
