/* flush.c - the engine's side of the store (tiers/store.h): which token
 * blocks go there (complete in every layer, exact, admitted), the flusher
 * thread that writes them in groups, kvt_sync() and the durable watermark.
 *
 * A hot layer block published while the cold tier is on holds a pin
 * (lblk.held) until its token block is durable, so it can be neither
 * demoted nor dropped before its exact bytes are written; the hold is let
 * go early when no sequence references the block any more or admission
 * says no. The pinned payloads are read (copied into the cold tier's
 * staging buffers) outside the engine lock. Lock order: engine lock,
 * never held across kvt_store_post() or kvt_store_drain(). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/internal.h"
#include "tiers/hist.h"

static int all_hot(const kvt_tblk *tb) {
  if (tb->n_present != tb->n_layers) return 0;
  for (uint32_t l = 0; l < tb->n_layers; l++)
    if (tb->layers[l]->tier != KVT_TIER_HOT || !tb->layers[l]->payload ||
        tb->layers[l]->approx)
      return 0;
  return 1;
}

static void release_holds(kvt_engine *e, kvt_tblk *tb) {
  tb->seq_refs++; /* unpinning may free layers; keep tb while we walk it */
  for (uint32_t l = 0; l < tb->n_layers; l++) {
    kvt_lblk *b = tb->layers[l];
    if (b && b->held) {
      b->held = 0;
      kvt_lblk_unpin(e, b);
    }
  }
  tb->seq_refs--;
  kvt_tblk_maybe_free(e, tb);
}

int kvt_flush_admissible(const kvt_engine *e, const kvt_tblk *tb) {
  if (e->opt.cold_admit == KVT_ADMIT_PROMPT && !tb->prompt) return 0;
  return tb->seen >= e->opt.cold_admit_min_seen;
}

/* An INLINE store (metadata-only): "written" at once, under the lock,
 * when complete in every layer in exact form (hot, or computed by the
 * caller straight for the cold tier) and admitted; the record is charged
 * its size on disk. */
static void inline_consider(kvt_engine *e, kvt_tblk *tb) {
  if (tb->cold || !tb->indexed || tb->n_present != tb->n_layers) return;
  if (!kvt_flush_admissible(e, tb)) return;
  for (uint32_t l = 0; l < tb->n_layers; l++)
    if (tb->layers[l]->tier == KVT_TIER_WARM || tb->layers[l]->approx)
      return; /* approximate: not what cold keeps */
  kvt_store_rec r = {.key = tb->key, .parent = tb->parent, .ns_seed = tb->ns->seed,
                     .pos = tb->pos, .n_layers = tb->n_layers, .dtype = tb->ns->desc.shape.dtype,
                     .bytes_each = (uint32_t)tb->ns->bytes_each};
  uint64_t rec = kvt_store_record_max(e->store, r.n_layers, r.bytes_each);
  if (!kvt_store_admit(e->store, &tb->key, &tb->parent, tb->pos, tb->ns->id, rec)) {
    e->tc.cold_declined++;
    return;
  }
  if (kvt_store_write(e->store, &r, 1, NULL) == 0) {
    tb->cold = 1;
    e->st.cold_written++;
    kvt_event_signal(e);
  }
}

void kvt_flush_consider(kvt_engine *e, kvt_tblk *tb) {
  if (tb->ns->dropping && tb->indexed && !tb->cold && !tb->queued) {
    /* A prefix drop is removing blocks from the store (kvt_drop_prefix):
     * written now, this block could be removed (or its write cancelled)
     * after it is counted durable. It goes once the drop is done. */
    kvt_tblk_drop_wait(tb);
    return;
  }
  if (kvt_store_caps(e->store) & KVT_STORE_INLINE) {
    inline_consider(e, tb);
    return;
  }
  if (!kvt_flush_on(e) || tb->cold || tb->queued || !tb->indexed || !all_hot(tb)) return;
  if (!kvt_flush_admissible(e, tb)) return; /* may be admitted on a later append */
  if (!kvt_store_admit(e->store, &tb->key, &tb->parent, tb->pos, tb->ns->id,
                       kvt_store_record_max(e->store, tb->n_layers, (uint32_t)tb->ns->bytes_each))) {
    e->tc.cold_declined++;
    return; /* (KVT_EVICT_LEARNED) not worth a write: let go when idle */
  }
  for (uint32_t l = 0; l < tb->n_layers; l++) /* the queue relies on every layer's pin */
    if (!tb->layers[l]->held) {
      tb->layers[l]->held = 1;
      kvt_lblk_pin(e, tb->layers[l]);
    }
  tb->queued = 1;
  tb->seq_refs++; /* the queue holds it too */
  tb->fq_next = NULL;
  if (e->fq_tail) e->fq_tail->fq_next = tb;
  else e->fq_head = tb;
  e->fq_tail = tb;
  if (e->enqueued == e->completed) e->tc.durable_ns = kvt_hist_now_ns(); /* the lag starts */
  e->enqueued++;
  e->st.cold_queued++;
  kvt_flush_backlog(e);
  pthread_cond_signal(&e->work);
}

/* With the lock held: is there work behind what the flusher hands over
 * (blocks queued, or a thread waiting for RAM that writing frees)? The
 * store compresses only while writing keeps up (kvt_cold_set_backlog). */
void kvt_flush_backlog(kvt_engine *e) {
  __atomic_store_n(&e->cold_backlog, e->fq_head != NULL || e->room_waiters > 0, __ATOMIC_RELAXED);
}

int kvt_flush_pending(const kvt_engine *e) { return e->fq_head != NULL || e->enqueued != e->completed; }

void kvt_flush_wait_room(kvt_engine *e) {
  e->room_waiters++;
  kvt_flush_backlog(e);
  pthread_cond_wait(&e->flushed, &e->lock);
  e->room_waiters--;
  kvt_flush_backlog(e);
}

/* The same, for at most ns nanoseconds (the condition variable runs on
 * CLOCK_REALTIME, its default); a wake-up may come early or late by a
 * clock step, which callers tolerate: they re-check their own deadline. */
void kvt_flush_wait_room_ns(kvt_engine *e, uint64_t ns) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t t = (uint64_t)ts.tv_nsec + ns;
  ts.tv_sec += (time_t)(t / 1000000000ull);
  ts.tv_nsec = (long)(t % 1000000000ull);
  e->room_waiters++;
  kvt_flush_backlog(e);
  pthread_cond_timedwait(&e->flushed, &e->lock, &ts);
  e->room_waiters--;
  kvt_flush_backlog(e);
}

/* Groups handed to the cold tier at once, at most: it builds the next
 * while one is written and the one before synced and indexed
 * (tiers/cold.c, "the write pipeline"). */
#define PIPELINE_GROUPS 4

/* Take up to PIPELINE_GROUPS groups of queued token blocks (at least
 * one block), cut as the cold tier cuts them (record sizes, at most
 * cold_group_bytes a group). A group the queue does not fill yet stays
 * queued when a whole one goes now: it grows until the next hand-over
 * instead of going to the device (and to its own fdatasync) half empty. */
static size_t take_group(kvt_engine *e, kvt_tblk **out, size_t max) {
  uint64_t in_group = 0;
  size_t n = 0, cut = 0;
  unsigned groups = 0;
  const kvt_tblk *tb = e->fq_head;
  for (; tb && n < max; tb = tb->fq_next) {
    uint64_t b = kvt_store_record_max(e->store, tb->n_layers, (uint32_t)tb->ns->bytes_each);
    if (in_group && in_group + b > e->opt.cold_group_bytes) { /* a group closes before tb */
      cut = n;
      in_group = 0;
      if (++groups == PIPELINE_GROUPS) break;
    }
    in_group += b;
    n++;
  }
  if (!tb && cut && !e->stop) n = cut; /* the queue ended in an open group */
  for (size_t i = 0; i < n; i++) {
    out[i] = e->fq_head;
    e->fq_head = e->fq_head->fq_next;
    e->st.cold_queued--;
  }
  if (!e->fq_head) e->fq_tail = NULL;
  kvt_flush_backlog(e);
  return n;
}

#define GROUP_MAX 1024

/* With the lock held: the flusher is done with tb, durable (err 0) or not. */
static void block_done(kvt_engine *e, kvt_tblk *tb, int err) {
  int ok = err == 0;
  tb->queued = 0;
  tb->cold_err = err;
  if (ok && !tb->indexed) {
    /* Dropped while being written: its entry goes too - unless a block of
     * the same key entered the index meanwhile, which may count on the
     * entry (found durable, or skipped as written). Under the engine lock
     * (then LMDB's writer lock, as docs/concurrency.md allows), so none
     * can enter between the look and the removal. */
    if (!kvt_index_find(e, &tb->key)) kvt_store_remove(e->store, &tb->key);
  } else if (ok) {
    tb->cold = 1;
  }
  tb->seq_refs--;
  release_holds(e, tb); /* durable, or given up on: RAM may let it go */
  e->st.cold_written += ok != 0;
  if (ok) e->tc.durable_ns = kvt_hist_now_ns();
  e->completed++;
}

/* A hand-over of token blocks to the store. kvt_store_post returns
 * once they are built into its pipeline; its committer then tells, group
 * by group, which are durable (reported durable and let go at once, so
 * callers waiting for room go on) and which failed, while the flusher
 * already builds the next hand-over. The last one told frees it. */
typedef struct flush_batch {
  kvt_engine *e;
  size_t left;                /* blocks not yet told of, + 1 until posted (engine lock) */
  size_t n;                   /* g[n] */
  kvt_tblk *g[];
} flush_batch;

static void batch_free(flush_batch *fb) {
  if (fb) kvt_mem_free(&fb->e->mem, KVT_MEM_OTHER, fb, sizeof *fb + fb->n * sizeof *fb->g);
}

/* With the engine lock held: n blocks of fb told of; frees it after the last. */
static int batch_less(flush_batch *fb, size_t n) {
  fb->left -= n;
  return fb->left == 0;
}

static void group_settled(void *arg, size_t from, size_t to, int rc) {
  flush_batch *fb = arg;
  kvt_engine *e = fb->e;
  pthread_mutex_lock(&e->lock);
  for (size_t i = from; i < to; i++) block_done(e, fb->g[i], rc);
  if (rc && !e->cold_err) e->cold_err = rc;
  int last = batch_less(fb, to - from);
  pthread_cond_broadcast(&e->flushed);
  pthread_mutex_unlock(&e->lock);
  kvt_event_signal(e); /* watermarks moved, or errors to report */
  if (last) batch_free(fb);
}

/* Hand g[0..n) over (payloads pinned: read with no lock held). */
static void hand_over(kvt_engine *e, kvt_tblk **g, size_t n, kvt_store_rec *recs,
                      const uint8_t **ptrs) {
  size_t np = 0;
  for (size_t i = 0; i < n; i++) {
    kvt_tblk *tb = g[i];
    const kvt_shape *sh = &tb->ns->desc.shape;
    recs[i] = (kvt_store_rec){.key = tb->key, .parent = tb->parent, .ns_seed = tb->ns->seed,
                             .pos = tb->pos, .n_layers = tb->n_layers, .dtype = sh->dtype,
                             .bytes_each = (uint32_t)tb->ns->bytes_each, .layers = ptrs + np};
    for (uint32_t l = 0; l < tb->n_layers; l++) ptrs[np++] = tb->layers[l]->payload;
  }
  /* The eviction order chooses what goes before segments are reclaimed;
   * an error there only leaves the choice to reclaiming. */
  uint64_t need = 0;
  for (size_t i = 0; i < n; i++)
    need += kvt_store_record_max(e->store, recs[i].n_layers, recs[i].bytes_each);
  kvt_store_evict_for(e->store, need);
  flush_batch *fb = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, sizeof *fb + n * sizeof *g);
  size_t posted = 0;
  int rc = -ENOMEM;
  if (fb) {
    *fb = (flush_batch){.e = e, .left = n + 1, .n = n}; /* ours until post returns */
    memcpy(fb->g, g, n * sizeof *g);
    rc = kvt_store_post(e->store, recs, n, &posted, group_settled, fb);
  }
  if (!fb || posted < n) kvt_store_drain(e->store); /* what went before is told of first */
  pthread_mutex_lock(&e->lock);
  for (size_t i = posted; i < n; i++) block_done(e, g[i], rc ? rc : -EIO); /* not written */
  if (rc && posted < n && !e->cold_err) e->cold_err = rc; /* else told in order */
  int last = fb && batch_less(fb, n - posted + 1);
  pthread_cond_broadcast(&e->flushed);
  pthread_mutex_unlock(&e->lock);
  if (posted < n) kvt_event_signal(e); /* blocks failed here */
  if (last) batch_free(fb);
}

static void *flusher_main(void *arg) {
  kvt_engine *e = arg;
  kvt_tblk *g[GROUP_MAX];
  kvt_store_rec *recs = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, GROUP_MAX * sizeof *recs);
  const uint8_t **ptrs = NULL;
  size_t ptrs_cap = 0;
  pthread_mutex_lock(&e->lock);
  for (;;) {
    while (!e->fq_head && !e->stop) pthread_cond_wait(&e->work, &e->lock);
    if (!e->fq_head) break; /* stop, and everything queued is handed over */
    pthread_mutex_unlock(&e->lock); /* hand over what is queued once it can be built: */
    kvt_store_wait_stage(e->store); /* meanwhile more is queued (batches grow under load) */
    pthread_mutex_lock(&e->lock);
    size_t n = take_group(e, g, GROUP_MAX), need = 0;
    for (size_t i = 0; i < n; i++) need += g[i]->n_layers;
    pthread_mutex_unlock(&e->lock);
    int rc = recs ? 0 : -ENOMEM;
    if (!rc && need > ptrs_cap) {
      const uint8_t **np = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, need * sizeof *np);
      if (np) { /* nothing in it to keep: grown between hand-overs */
        kvt_mem_free(&e->mem, KVT_MEM_OTHER, ptrs, ptrs_cap * sizeof *ptrs);
        ptrs = np;
        ptrs_cap = need;
      } else {
        rc = -ENOMEM;
      }
    }
    if (!rc) {
      /* The hot tier's model, when due, before the group: a block seen
       * durable was handed over after it, so a writer killed then loses
       * no more of the model than kvt_sync's would. */
      kvt_hot_order_checkpoint(e, KVT_CKPT_DUE);
      hand_over(e, g, n, recs, ptrs);
      pthread_mutex_lock(&e->lock);
      continue;
    }
    kvt_store_drain(e->store); /* blocks finish in the order they were queued */
    pthread_mutex_lock(&e->lock);
    for (size_t i = 0; i < n; i++) block_done(e, g[i], rc);
    if (!e->cold_err) e->cold_err = rc;
    pthread_cond_broadcast(&e->flushed);
    kvt_event_signal(e);
  }
  pthread_mutex_unlock(&e->lock);
  kvt_store_drain(e->store); /* what was handed over settles before the tier closes */
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, recs, GROUP_MAX * sizeof *recs);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, ptrs, ptrs_cap * sizeof *ptrs);
  return NULL;
}

/* Reclaiming a cold segment: blocks still referenced by a sequence are
 * written again; the others leave the cold tier (and stop being durable). */
static int keep_block(void *arg, const kvt_key *key) {
  kvt_engine *e = arg;
  pthread_mutex_lock(&e->lock);
  kvt_tblk *tb = kvt_index_find(e, key);
  int keep = tb && tb->seq_refs > 0;
  if (tb && !keep) tb->cold = 0;
  pthread_mutex_unlock(&e->lock);
  return keep;
}

/* A block a reclaim kept was found bad in the cold tier and left it: not
 * durable any more; written again if its exact layers are still in RAM. */
static void lost_block(void *arg, const kvt_key *key) {
  kvt_engine *e = arg;
  pthread_mutex_lock(&e->lock);
  kvt_tblk *tb = kvt_index_find(e, key);
  if (tb) {
    tb->cold = 0;
    kvt_flush_consider(e, tb);
  }
  pthread_mutex_unlock(&e->lock);
}

/* An INLINE store's hooks, called with the engine lock held:
 * referenced blocks stay; an evicted one is no longer durable. */
static int meta_keep(void *arg, const kvt_key *key) {
  kvt_tblk *tb = kvt_index_find(arg, key);
  return tb && tb->seq_refs > 0;
}

static void meta_evicted(void *arg, const kvt_key *key) {
  kvt_tblk *tb = kvt_index_find(arg, key);
  if (tb) tb->cold = 0;
}

/* With the engine lock held. The disk store's find takes only leaf locks
 * and an LMDB read transaction (lock order: engine lock first). Asked
 * under the engine lock as a token block enters the index, the answer
 * cannot go stale before the block is referenced: a removal chosen before
 * hides the key already, one chosen after sees the reference (keep()). */
int kvt_flush_has_locked(kvt_engine *e, const kvt_key *key) {
  return e->store && kvt_store_find(e->store, key) == 0;
}

/* The store's copies (remote hits into the local tier) are admitted under
 * their namespace; called from the flusher's store calls, lock not held. */
static uint32_t ns_of_seed(void *arg, const kvt_key *seed) {
  kvt_engine *e = arg;
  uint32_t id = 0;
  pthread_mutex_lock(&e->lock);
  for (uint32_t i = 0; i < e->n_ns && !id; i++)
    if (e->ns[i] && kvt_key_eq(&e->ns[i]->seed, seed)) id = e->ns[i]->id;
  pthread_mutex_unlock(&e->lock);
  return id;
}

int kvt_flush_start(kvt_engine *e) {
  if (!e->store) return 0;
  if (kvt_store_caps(e->store) & KVT_STORE_INLINE) {
    kvt_store_set_hooks(e->store, &(kvt_store_hooks){.arg = e, .keep = meta_keep,
                                                      .evicted = meta_evicted});
    return 0;
  }
  kvt_store_hooks h = {.arg = e, .read_notify = kvt_event_notify}; /* loads: kvt_event_fd */
  if (!kvt_rdonly(e)) {
    h.keep = keep_block;
    h.lost = lost_block;
    h.backlog = &e->cold_backlog;
    h.ns_of = ns_of_seed;
  }
  kvt_store_set_hooks(e->store, &h);
  if (kvt_rdonly(e)) return 0;
  pthread_cond_init(&e->work, NULL);
  pthread_cond_init(&e->flushed, NULL);
  int rc = -pthread_create(&e->flusher, NULL, flusher_main, e);
  if (rc) {
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->flushed);
    return rc;
  }
  e->flusher_on = 1;
  return 0;
}

/* With the engine lock held; returns with it held. */
void kvt_flush_stop(kvt_engine *e) {
  if (e->flusher_on) {
    e->stop = 1;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->lock);
    pthread_join(e->flusher, NULL);
    pthread_mutex_lock(&e->lock);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->flushed);
    e->flusher_on = 0;
  }
  kvt_store_close(e->store);
  e->store = NULL;
}

/* The error that keeps a block some sequence references from being
 * durable, or 0. With the lock held. */
static int referenced_cold_err(const kvt_engine *e) {
  for (const kvt_seq *s = e->seqs.next; s != &e->seqs; s = s->next)
    for (uint32_t b = 0; b < s->n_blocks; b++)
      if (s->tb[b]->cold_err && !s->tb[b]->cold) return s->tb[b]->cold_err;
  return 0;
}

int kvt_sync(kvt_engine *e) {
  if (!e) return KVT_ENULL;
  if (kvt_rdonly(e)) return KVT_ERDONLY;
  if (!kvt_flush_on(e)) return 0;
  pthread_mutex_lock(&e->lock);
  while (e->drops) pthread_cond_wait(&e->flushed, &e->lock); /* blocks they hold back */
  uint64_t target = e->enqueued;
  while (e->completed < target) pthread_cond_wait(&e->flushed, &e->lock);
  int rc = e->cold_err;
  e->cold_err = 0;
  if (!rc) rc = referenced_cold_err(e); /* still not durable: still an error */
  pthread_mutex_unlock(&e->lock);
  kvt_hot_order_checkpoint(e, KVT_CKPT_DUE | KVT_CKPT_WAIT); /* the hot tier's model */
  return rc;
}

uint32_t kvt_seq_durable(const kvt_seq *s) {
  if (!s || !kvt_store_payload(s->e)) return 0;
  kvt_engine *e = s->e;
  pthread_mutex_lock(&e->lock);
  uint32_t n = 0;
  while (n < s->n_blocks && s->tb[n]->cold) n++;
  pthread_mutex_unlock(&e->lock);
  return n;
}

int kvt_fsck(kvt_engine *e, int repair, kvt_fsck_result *res,
             void (*report)(void *, const kvt_key *, const char *), void *arg) {
  if (!e || !res) return KVT_ENULL;
  *res = (kvt_fsck_result){0};
  if (!e->store || !e->store->m->verify) return KVT_ENOTFOUND;
  if (repair && kvt_rdonly(e)) return KVT_ERDONLY;
  int rc = kvt_store_verify(e->store, repair, &res->checked, &res->bad, report, arg);
  if (!rc && repair) res->removed = res->bad;
  return rc;
}
