/* cold_reclaim.c - room in the cold tier: reclaiming the segment with the
 * fewest live bytes (relocating what is still referenced), and the
 * eviction order (tiers/evict.h) that chooses blocks before that. */
#include "tiers/cold_internal.h"

/* ---------- capacity: reclaiming segments ---------- */

void kvt_cold_set_lost(kvt_cold *c, void (*lost)(void *, const kvt_key *)) { c->lost = lost; }

void kvt_cold_set_keep(kvt_cold *c, int (*keep)(void *, const kvt_key *), void *arg) {
  c->keep = keep;
  c->keep_arg = arg;
}

/* Would records of these sizes fit, placed in order, without reclaiming,
 * leaving `reserve` spare segments? */
int cold_fits(const kvt_cold *c, const uint64_t *sizes, size_t n, uint64_t reserve) {
  uint64_t segb = c->cfg.segment_bytes, room = c->active >= 0 ? segb - c->segs[c->active].used : 0;
  uint64_t spare = cold_spare_segs(c);
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

static void carry_free(kvt_cold *c, carry *cy, size_t n) {
  for (size_t i = 0; i < n; i++) {
    kvt_mem_free(c->mem, KVT_MEM_OTHER, cy[i].raw, cy[i].raw_bytes);
    kvt_mem_free(c->mem, KVT_MEM_OTHER, cy[i].layers, cy[i].n_ptrs * sizeof *cy[i].layers);
  }
}

/* Read every layer of entry e back into a carry record. */
static int carry_load(kvt_cold *c, const kvt_cold_entry *e, carry *cy) {
  size_t each = e->bytes_each, L = e->n_layers;
  cy->raw = kvt_mem_alloc(c->mem, KVT_MEM_OTHER, 2 * each * L);
  cy->layers = kvt_mem_alloc(c->mem, KVT_MEM_OTHER, L * sizeof *cy->layers);
  cy->raw_bytes = cy->raw ? 2 * each * L : 0; /* carry_free frees what was had */
  cy->n_ptrs = cy->layers ? L : 0;
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
  kvt_cold *c;
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
  if (cold_grow(x->c, &x->v, &x->cap, x->n, sizeof *x->v)) return -ENOMEM;
  x->v[x->n++] = *e;
  return 0;
}

/* *out holds *n_out entries, allocated for *cap_out (cold_vec_free). */
static int seg_entries(kvt_cold *c, uint32_t id, kvt_cold_entry **out, size_t *n_out,
                       size_t *cap_out) {
  seg_ctx x = {.c = c, .id = id, .gen = c->segs[id].gen};
  int rc = cold_each_entry(c, seg_one, &x);
  if (rc) {
    cold_vec_free(c, x.v, x.cap, sizeof *x.v);
    x.v = NULL;
    x.n = x.cap = 0;
  }
  *out = x.v;
  *n_out = x.n;
  *cap_out = x.cap;
  return rc;
}

/* Relocate the carried records out of segment vic (cold_write_sync), then
 * remove what is left of vic from the index and free it, in one durable
 * transaction. A block is never out of the index while it is still
 * referenced: a kill at any point leaves it at its old place or its new
 * one. Returns 1 when vic was freed, 0 when it could not be (a relocation
 * did not fit), or a negative error. */
static int relocate_and_free(kvt_cold *c, const victim *vic, const kvt_cold_entry *ents, size_t n,
                             const carry *cy, size_t n_cy) {
  int rc = 0;
  if (n_cy) {
    kvt_cold_rec *cr = kvt_mem_alloc(c->mem, KVT_MEM_OTHER, n_cy * sizeof *cr);
    if (!cr) return -ENOMEM;
    for (size_t i = 0; i < n_cy; i++) cr[i] = cy[i].rec;
    rc = cold_write_sync(c, cr, n_cy, vic, NULL);
    kvt_mem_free(c->mem, KVT_MEM_OTHER, cr, n_cy * sizeof *cr);
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
    freed = cold_find_locked(c, t, &cy[i].rec.key, &cur, NULL, 0) || !cold_in_victim(&cur, vic);
  }
  for (size_t i = 0; !rc && freed && i < n; i++) {
    kvt_cold_entry cur;
    int r = cold_find_locked(c, t, &ents[i].key, &cur, NULL, 0);
    if (r == KVT_ENOTFOUND || (!r && !cold_in_victim(&cur, vic))) continue; /* gone or relocated */
    r = cold_remove_in(c, t, &ents[i].key);
    if (r && r != KVT_ENOTFOUND) rc = r;
  }
  if (!rc && freed) {
    pthread_mutex_lock(&c->st_lock);
    c->segs[vic->id].state = SEG_FREE;
    c->segs[vic->id].live = 0;
    pthread_mutex_unlock(&c->st_lock);
    rc = cold_seg_save(c, t, vic->id);
  }
  if (!freed && !rc) {
    mdb_txn_abort(t); /* nothing was removed */
    return 0;
  }
  rc = cold_txn_end(c, t, rc);
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
  size_t n, cap_ents;
  int rc = seg_entries(c, vic.id, &ents, &n, &cap_ents);
  if (rc) return rc;
  carry *cy = n ? kvt_mem_calloc(c->mem, KVT_MEM_OTHER, n * sizeof *cy) : NULL;
  uint64_t kept = 0, *sizes = n ? kvt_mem_alloc(c->mem, KVT_MEM_OTHER, n * sizeof *sizes) : NULL;
  size_t n_cy = 0;
  if (n && (!cy || !sizes)) rc = -ENOMEM;
  for (size_t i = 0; i < n && !rc; i++) {
    if (!cold_keep_or_mark(c, &ents[i].key)) continue;
    carry *x = &cy[n_cy++];
    int r = carry_load(c, &ents[i], x);
    if (r == KVT_ECORRUPT || r == KVT_ENOTFOUND) { /* unreadable: it was lost already */
      if (c->lost) c->lost(c->keep_arg, &ents[i].key); /* the engine counted it durable */
      carry_free(c, x, 1);
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
  if (!rc && worth && cold_fits(c, sizes, n_cy, 0))
    freed = (rc = relocate_and_free(c, &vic, ents, n, cy, n_cy)) > 0;
  cold_gone_clear(c); /* removed for good, or not removed after all */
  if (cy) carry_free(c, cy, n_cy);
  kvt_mem_free(c->mem, KVT_MEM_OTHER, cy, n * sizeof *cy);
  kvt_mem_free(c->mem, KVT_MEM_OTHER, sizes, n * sizeof *sizes);
  cold_vec_free(c, ents, cap_ents, sizeof *ents);
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
  uint64_t *sizes = kvt_mem_alloc(c->mem, KVT_MEM_OTHER, n * sizeof *sizes);
  if (!sizes) return -ENOMEM;
  for (size_t i = 0; i < n; i++) sizes[i] = kvt_cold_record_max(recs[i].n_layers, recs[i].bytes_each);
  int rc = 0;
  for (uint32_t round = 0; !rc && round <= c->n_segs; round++) {
    if (cold_fits(c, sizes, n, 1)) break;
    kvt_cold_drain(c); /* a failure in it was told to its caller */
    int64_t r = reclaim_one(c);
    if (r <= 0) rc = (int)r;
    if (r == 0) break;
  }
  kvt_mem_free(c->mem, KVT_MEM_OTHER, sizes, n * sizeof *sizes);
  return rc;
}

int kvt_cold_write(kvt_cold *c, const kvt_cold_rec *recs, size_t n, size_t *written) {
  if (written) *written = 0;
  if (c->cfg.rdonly) return KVT_ERDONLY;
  if (n == 0) return 0;
  int rc = make_room(c, recs, n);
  return rc ? rc : cold_write_sync(c, recs, n, NULL, written);
}

int kvt_cold_post(kvt_cold *c, const kvt_cold_rec *recs, size_t n, size_t *posted,
                  kvt_cold_settled_fn settled, void *arg) {
  *posted = 0;
  if (c->cfg.rdonly) return KVT_ERDONLY;
  if (n == 0) return 0;
  int rc = make_room(c, recs, n);
  return rc ? rc : cold_post_chunks(c, recs, n, NULL, posted, settled, arg);
}

/* ---------- eviction order (tiers/evict.h) ----------
 * The index knows where blocks are; evict.c knows which to give up first.
 * It tracks every indexed block of a writer (key, parent, record size):
 * loaded from the index at open, told of new records by the committer as
 * they are indexed (cold_evict_track),
 * of uses by kvt_cold_find() and kvt_cold_prefix(), of removals by
 * cold_remove_in(). Records that reclaiming a segment relocates (still
 * referenced) keep their key and their place in it. ev_lock is a leaf
 * lock: keep() (which takes the engine lock) is never called with it
 * held. */

static int evict_load_one(void *arg, const kvt_key *key, const MDB_val *v, const kvt_cold_entry *e) {
  kvt_cold *c = arg;
  (void)v;
  if (!e) return 0; /* unparsable: fsck's business, never chosen */
  int rc = kvt_evict_load(c->ev, key, &e->parent, e->rec_len); /* no access: a restart */
  return rc == -EEXIST ? 0 : rc;
}

/* KVT_EVICT_LEARNED's model (weights and clock) is one record of the meta
 * table, "reuse_model" (tiers/reuse_model.c says its versioned layout),
 * read at open and written at close - and after a group commit whenever
 * the model has counted KVT_EVICT_MODEL_SAVE_EVERY accesses since it was last
 * written, so a writer killed without closing restarts with what it had
 * learned up to then, not from nothing. The model only ranks blocks: a
 * record of another version, or one that does not check, is ignored (the
 * model starts afresh), a store without one is fine, and it is written in
 * a transaction of its own, so it never fails a group. fsck --repair does
 * not carry it over. */
#define REUSE_MODEL_KEY "reuse_model"

/* The record is read whatever the order (a read-only store reports what
 * it keeps); model_saved is the clock of the copy the index holds, 0 for
 * none or one that does not check (then the model starts afresh too). */
static void evict_model_load(kvt_cold *c) {
  uint8_t buf[KVT_EVICT_MODEL_MAX];
  size_t n = cold_meta_get(c, REUSE_MODEL_KEY, buf, sizeof buf);
  uint64_t clock = 0;
  if (n && kvt_evict_model_state_clock(buf, n, &clock)) clock = 0;
  __atomic_store_n(&c->model_saved, clock, __ATOMIC_RELAXED);
  c->model_tried = clock;
  if (clock && c->ev && c->cfg.evict_policy == KVT_EVICT_LEARNED)
    kvt_evict_model_load(c->ev, buf, n);
}

/* A lost model costs hit rate for a while, never data. */
static void evict_model_save(kvt_cold *c) {
  uint8_t buf[KVT_EVICT_MODEL_MAX];
  size_t n = c->env && c->ev ? kvt_evict_model_save(c->ev, buf, sizeof buf) : 0;
  if (n) cold_meta_put(c, REUSE_MODEL_KEY, buf, n);
}

void cold_model_checkpoint(kvt_cold *c) {
  if (!c->ev || c->cfg.evict_policy != KVT_EVICT_LEARNED) return;
  uint8_t buf[KVT_EVICT_MODEL_MAX];
  pthread_mutex_lock(&c->ev_lock);
  uint64_t now = kvt_evict_model_clock(c->ev);
  size_t n = 0;
  if (now >= c->model_tried + KVT_EVICT_MODEL_SAVE_EVERY) { /* the committer's own */
    n = kvt_evict_model_save(c->ev, buf, sizeof buf);
    c->model_tried = now; /* a failed save is tried again a save's worth later */
  }
  pthread_mutex_unlock(&c->ev_lock);
  if (n && cold_meta_put(c, REUSE_MODEL_KEY, buf, n) == 0)
    __atomic_store_n(&c->model_saved, now, __ATOMIC_RELAXED); /* stats read it */
}

void cold_model_stats(kvt_cold *c, kvt_cold_stats *st) {
  st->model_saved = __atomic_load_n(&c->model_saved, __ATOMIC_RELAXED);
  if (!c->ev) return;
  pthread_mutex_lock(&c->ev_lock);
  st->model_clock = kvt_evict_model_clock(c->ev);
  pthread_mutex_unlock(&c->ev_lock);
}

size_t kvt_cold_model_state(kvt_cold *c, uint8_t *out, size_t cap) {
  if (!c->ev) return 0;
  pthread_mutex_lock(&c->ev_lock);
  size_t n = kvt_evict_model_save(c->ev, out, cap);
  pthread_mutex_unlock(&c->ev_lock);
  return n;
}

int cold_evict_start(kvt_cold *c) {
  if (c->cfg.rdonly) { /* no order: blocks are not added nor evicted */
    evict_model_load(c);
    return 0;
  }
  pthread_mutex_init(&c->ev_lock, NULL);
  c->ev_on = 1;
  int rc = kvt_evict_create(c->mem, KVT_MEM_INDEX, c->cfg.evict_policy, &c->ev);
  if (!rc) evict_model_load(c); /* first: the blocks loaded are ranked by it */
  if (!rc) rc = cold_each_entry(c, evict_load_one, c);
  return rc;
}

void cold_evict_stop(kvt_cold *c) {
  if (!c->ev_on) return;
  evict_model_save(c);
  kvt_evict_free(c->ev);
  c->ev = NULL;
  pthread_mutex_destroy(&c->ev_lock);
}

void cold_evict_touch(kvt_cold *c, const kvt_key *key, int look) {
  if (!c->ev) return;
  pthread_mutex_lock(&c->ev_lock);
  if (look) kvt_evict_look(c->ev, key);
  else kvt_evict_touch(c->ev, key);
  pthread_mutex_unlock(&c->ev_lock);
}

void cold_evict_forget(kvt_cold *c, const kvt_key *key) {
  if (!c->ev) return;
  pthread_mutex_lock(&c->ev_lock);
  kvt_evict_remove(c->ev, key, NULL);
  pthread_mutex_unlock(&c->ev_lock);
}

/* Records a chunk has just indexed join the order (committer thread). */
void cold_evict_track(kvt_cold *c, const placed *pl, size_t n) {
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
  return k->n && bsearch(key, k->v, k->n, sizeof *k->v, cold_key_cmp) != NULL;
}

static int kept_add(kvt_cold *c, kept_set *k, const kvt_key *key) {
  int rc = cold_grow(c, &k->v, &k->cap, k->n, sizeof *k->v);
  if (rc) return rc;
  size_t i = k->n;
  while (i > 0 && cold_key_cmp(&k->v[i - 1], key) > 0) i--;
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
    if (cold_find_locked(c, t, &keys[i], &e, NULL, 0)) continue; /* gone after all */
    pthread_mutex_lock(&c->ev_lock);
    kvt_evict_load(c->ev, &e.key, &e.parent, e.rec_len); /* no access */
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
    if (cold_keep_or_mark(c, &v)) { /* referenced: look past it */
      if ((rc = kept_add(c, &kept, &v))) break;
      continue;
    }
    if ((rc = cold_grow(c, &gone, &cap_gone, n_gone, sizeof *gone))) {
      cold_gone_del(c, &v);
      break;
    }
    gone[n_gone++] = v;
    cold_evict_forget(c, &v); /* out of the order now: the next victim is another */
    live = live > bytes ? live - bytes : 0;
  }
  uint64_t removed = 0;
  int rrc = n_gone ? cold_remove_keys(c, gone, n_gone, NULL, &removed) : 0; /* durable, one txn */
  if (rrc) evict_restore(c, gone, n_gone); /* still indexed: back in the order */
  cold_gone_clear(c);
  cold_vec_free(c, kept.v, kept.cap, sizeof *kept.v);
  cold_vec_free(c, gone, cap_gone, sizeof *gone);
  if (!rc) rc = rrc;
  if (rc) return rc;
  pthread_mutex_lock(&c->st_lock);
  c->ev_evictions += removed;
  pthread_mutex_unlock(&c->st_lock);
  return (int64_t)removed;
}
