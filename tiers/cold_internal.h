/* cold_internal.h - the cold tier's private state (struct kvt_cold) and
 * the functions its files share: cold.c (shell: segments, open/close,
 * namespaces, stats), cold_index.c, cold_write.c, cold_read.c,
 * cold_reclaim.c. Not for use outside tiers/cold*.c. */
#ifndef KVT_COLD_INTERNAL_H
#define KVT_COLD_INTERNAL_H

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

#include "tiers/cold.h"
#include "tiers/cold_record.h"
#include "tiers/cold_scan.h"
#include "tiers/evict.h"
#include "base/hash.h"
#include "tiers/hist.h"

#define FORMAT_VERSION 1u
#define READERS_MAX 2u   /* reader threads: checking and copying keep one core busy at disk speed */
#define REC_MAGIC KVT_REC_MAGIC
#define REC_FIXED KVT_REC_FIXED
#define SLICE_ENTRY KVT_REC_SLICE
#define ENTRY_FIXED KVT_REC_ENTRY_FIXED
#define MAX_SEGS 65536u
#define LOCK_FILE_BYTES (64u << 10) /* LMDB's lock file, allocated up front: room for ~1000 readers */

/* The segment state machine. A segment's state is kept in memory (the
 * segment table, under st_lock) and in the index's segment rows
 * (cold_seg_save), which open reads back (segs_load in cold.c).
 *
 *   (none) --> OPEN    seg_for_locked (cold_write.c): no free segment, a
 *                      new file is made (generation 1) and becomes active.
 *   FREE   --> OPEN    seg_for_locked: a free segment is reused; its
 *                      generation is bumped first, so entries into its
 *                      old life can no longer match.
 *   OPEN   --> FULL    seg_for_locked: the active segment has no room for
 *                      the next record (sealed); reclaim_one
 *                      (cold_reclaim.c): the active one is sealed before
 *                      it is reclaimed; segs_load: an OPEN row other than
 *                      the first, or whose file is unusable.
 *   FULL   --> FREE    relocate_and_free (cold_reclaim.c): the referenced
 *                      records were written elsewhere and every other
 *                      entry left the index in the same transaction,
 *                      synced before the segment is reused ("reclaimed");
 *                      segs_free_unusable (cold_index.c, fsck repair): the
 *                      file is lost.
 *   FREE   --> FULL    relocate_and_free: its transaction did not commit,
 *                      so memory follows the index back.
 *   FULL   --> OPEN    reclaim_one: the active segment it sealed was not
 *                      reclaimed after all; appending to it resumes.
 *
 * Only OPEN is appended to (one at a time: c->active); only FULL is
 * reclaimed (victim_seg); a FREE segment holds no entry. */
enum seg_state { SEG_FREE = 0, SEG_OPEN = 1, SEG_FULL = 2 };

typedef struct seg {
  int fd;                      /* -1 when not open (the descriptor cache: cold_seg_hold) */
  uint64_t gen;                /* bumped whenever the file is reused */
  uint64_t used;               /* bytes appended so far (never rewritten) */
  uint64_t live;               /* bytes of records the index points to */
  uint32_t state;
  uint32_t users;              /* holders of fd (cold_seg_hold), which stays open meanwhile */
  uint64_t tick;               /* last hold, for closing the least recently used */
  int have;                    /* the file is there (opened once, or created) */
  int err;                     /* why it could not be opened (-errno), or 0 */
} seg;

typedef struct carry {
  kvt_cold_rec rec;
  uint8_t *raw;                /* all layers' K||V (raw_bytes, counted in c->mem) */
  const uint8_t **layers;      /* [n_ptrs], counted in c->mem */
  size_t raw_bytes, n_ptrs;
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
  /* the write pipeline (see cold_post_chunks): chunks built by the flusher,
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
  /* What cold_remove_in changed in memory in the write transaction under way
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
  uint64_t model_saved;        /* the clock of the model the index keeps: read at open,
                                  set by the committer's saves (atomic: stats read it) */
  uint64_t model_tried;        /* its clock when last saved or tried (committer) */
  int ev_on;                   /* ev_lock initialized */
  void (*read_notify)(void *arg); /* a read batch finished (kvt_cold_set_read_notify) */
  void *read_notify_arg;
  kvt_hist h_read;             /* one read of a segment file, submitted to complete */
  kvt_hist h_commit;           /* one group: write started to indexed */
};


/* Little-endian fields: kvt_le_* in tiers/cold_record.h. */

static inline int mdb_err(int rc) {
  if (rc == 0) return 0;
  if (rc == MDB_NOTFOUND) return KVT_ENOTFOUND;
  if (rc == MDB_MAP_FULL) return -ENOSPC;
  if (rc == MDB_VERSION_MISMATCH || rc == MDB_INVALID || rc == MDB_CORRUPTED) return KVT_ECORRUPT;
  return rc > 0 ? -rc : -EIO;
}

/* Shared by the write side, reclaiming and the eviction order. */
/* One piece of a record as written: the header from the staging buffer,
 * a slice straight from the block's payload, or one built in staging. */
typedef struct part {
  const uint8_t *buf;
  uint32_t len;               /* multiple of 4096 */
} part;

typedef struct victim {
  uint32_t id;
  uint64_t gen;
} victim;

typedef struct placed {
  uint32_t seg;
  uint64_t off;               /* in the segment */
  part *parts;                /* n_layers + 1 pieces, in disk order */
  kvt_cold_entry e;
  uint64_t old_len;           /* relocated: the record it replaces */
  int dead;                   /* relocated, but its entry had gone meanwhile */
} placed;

typedef int (*entry_fn)(void *arg, const kvt_key *key, const MDB_val *v, const kvt_cold_entry *e);

/* cold.c: segments, open/close */
int cold_seg_hold(kvt_cold *c, uint32_t id, int *fd);
int cold_seg_open_locked(kvt_cold *c, uint32_t id, int create);
void cold_seg_release(kvt_cold *c, uint32_t id);
int cold_seg_save(kvt_cold *c, MDB_txn *t, uint32_t id);
const char *cold_seg_trouble(kvt_cold *c, uint32_t id);
int cold_transient(int rc);

/* cold_index.c: the index */
int cold_each_entry(kvt_cold *c, entry_fn fn, void *arg);
size_t cold_entry_len(uint32_t n_layers);
const uint8_t *cold_entry_slice(const MDB_val *v, uint32_t layer);
int cold_find_locked(kvt_cold *c, MDB_txn *t, const kvt_key *key, kvt_cold_entry *e,
                       kvt_cold_slice *one, uint32_t layer);
int cold_get_entry(const kvt_key *key, const MDB_val *v, kvt_cold_entry *e);
void cold_get_slice(const uint8_t *p, kvt_cold_slice *s);
void cold_gone_clear(kvt_cold *c);
void cold_gone_del(kvt_cold *c, const kvt_key *key);
int cold_grow(kvt_cold *c, void *v, size_t *cap, size_t n, size_t elem);
void cold_vec_free(kvt_cold *c, void *v, size_t cap, size_t elem);
void cold_index_fini(kvt_cold *c);
/* Direct-I/O buffers (KVT_IO_ALIGN-aligned, zeroed), counted in c->mem
 * (OTHER) under the failing-allocator hook; freed with the len asked. */
void *cold_buf_alloc(kvt_cold *c, size_t len);
void cold_buf_free(kvt_cold *c, void *p, size_t len);
int cold_keep_or_mark(kvt_cold *c, const kvt_key *key);
int cold_key_cmp(const void *a, const void *b);
void cold_put_entry(uint8_t *p, const kvt_cold_entry *e);
void cold_put_slice(uint8_t *p, const kvt_cold_slice *s);
int cold_remove_in(kvt_cold *c, MDB_txn *t, const kvt_key *key);
int cold_remove_keys(kvt_cold *c, const kvt_key *keys, size_t n, const kvt_key *ns_seed,
                       uint64_t *removed);
int cold_txn_end(kvt_cold *c, MDB_txn *t, int rc);

/* cold_read.c: reads */
int cold_read_range(kvt_cold *c, uint32_t id, uint64_t off, uint32_t len, uint8_t **out);
int cold_reader_start(kvt_cold *c);
void cold_reader_stop(kvt_cold *c);
int cold_slice_ok(const uint8_t *p, const kvt_cold_entry *e, uint32_t layer, const kvt_cold_slice *s);

/* cold.c: a meta-table record in a transaction of its own (the learned
 * models: they only rank blocks). get: its length (0: none, or longer
 * than cap); put: 0, KVT_ERDONLY or LMDB's error. */
size_t cold_meta_get(kvt_cold *c, const char *key, uint8_t *out, size_t cap);
int cold_meta_put(kvt_cold *c, const char *key, const uint8_t *buf, size_t len);

/* cold_reclaim.c: room and the eviction order */
void cold_evict_forget(kvt_cold *c, const kvt_key *key);
int cold_evict_start(kvt_cold *c);
void cold_evict_stop(kvt_cold *c);
void cold_evict_touch(kvt_cold *c, const kvt_key *key, int look); /* look: a prefix lookup (kvt_evict_look) */
void cold_evict_track(kvt_cold *c, const placed *pl, size_t n);
void cold_model_checkpoint(kvt_cold *c); /* committer, after a group: the model when due */
void cold_model_stats(kvt_cold *c, kvt_cold_stats *st); /* model_clock, model_saved */
int cold_fits(const kvt_cold *c, const uint64_t *sizes, size_t n, uint64_t reserve);

/* cold_write.c: writing */
int cold_committer_start(kvt_cold *c);
void cold_committer_stop(kvt_cold *c);
uint32_t cold_header_len(uint32_t n_layers);
int cold_in_victim(const kvt_cold_entry *e, const victim *v);
int cold_post_chunks(kvt_cold *c, const kvt_cold_rec *recs, size_t n, const victim *vic,
                       size_t *posted, kvt_cold_settled_fn settled, void *arg);
uint64_t cold_slice_seed(const kvt_key *key, uint32_t layer, uint64_t gen);
uint64_t cold_spare_segs(const kvt_cold *c);
int cold_write_sync(kvt_cold *c, const kvt_cold_rec *recs, size_t n, const victim *vic,
                      size_t *written);

#endif
