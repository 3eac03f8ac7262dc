/* cold_index.c - the cold tier's LMDB index: entries (key -> where the
 * record is), lookups and the keys being removed, removal with undo,
 * fsck's verification, and drops of namespaces and prefixes. */
#include "tiers/cold_internal.h"

/* ---------- index entry: key -> where the record is ---------- */

/* The byte layouts are cold_record.c's; these name them for the code below. */
size_t cold_entry_len(uint32_t n_layers) { return kvt_rec_entry_len(n_layers); }
void cold_put_slice(uint8_t *p, const kvt_cold_slice *s) { kvt_rec_slice_put(p, s); }
void cold_get_slice(const uint8_t *p, kvt_cold_slice *s) { kvt_rec_slice_get(p, s); }
void cold_put_entry(uint8_t *p, const kvt_cold_entry *e) { kvt_rec_entry_put(p, e); }

/* Parse an index value; KVT_ECORRUPT when it is not one. */
int cold_get_entry(const kvt_key *key, const MDB_val *v, kvt_cold_entry *e) {
  return kvt_rec_entry_get(key, v->mv_data, v->mv_size, e);
}

const uint8_t *cold_entry_slice(const MDB_val *v, uint32_t layer) {
  return (const uint8_t *)v->mv_data + ENTRY_FIXED + (size_t)SLICE_ENTRY * layer;
}

/* Room for one more element of size elem in *v (n used, *cap allocated),
 * counted in c->mem (KVT_MEM_OTHER); cold_vec_free frees it. */
int cold_grow(kvt_cold *c, void *v, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return 0;
  size_t nc = *cap ? 2 * *cap : 64;
  void *p = kvt_mem_alloc(c->mem, KVT_MEM_OTHER, nc * elem), *old = *(void **)v;
  if (!p) return -ENOMEM;
  if (n) memcpy(p, old, n * elem);
  kvt_mem_free(c->mem, KVT_MEM_OTHER, old, *cap * elem);
  *(void **)v = p;
  *cap = nc;
  return 0;
}

void cold_vec_free(kvt_cold *c, void *v, size_t cap, size_t elem) {
  kvt_mem_free(c->mem, KVT_MEM_OTHER, v, cap * elem);
}

/* Call fn for every entry of the blocks index, in key order, inside one
 * read-only transaction; e is NULL when the entry does not parse. Stops at
 * fn's first non-zero return and returns it. */
int cold_each_entry(kvt_cold *c, entry_fn fn, void *arg) {
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
    int ok = k.mv_size == 16 && cold_get_entry(&key, &v, &e) == 0;
    rc = fn(arg, &key, &v, ok ? &e : NULL);
  }
  if (cur) mdb_cursor_close(cur); /* read-only txns do not free their cursors */
  mdb_txn_abort(t);
  return rc;
}

/* ---------- reading ---------- */

int cold_find_locked(kvt_cold *c, MDB_txn *t, const kvt_key *key, kvt_cold_entry *e,
                       kvt_cold_slice *one, uint32_t layer) {
  MDB_val k = {16, (void *)key->b}, v;
  int rc = mdb_get(t, c->db_blocks, &k, &v);
  if (rc) return mdb_err(rc);
  kvt_cold_entry tmp;
  if (!e) e = &tmp;
  rc = cold_get_entry(key, &v, e);
  if (rc || !one) return rc;
  if (layer >= e->n_layers) return KVT_ENOTFOUND;
  cold_get_slice(cold_entry_slice(&v, layer), one);
  return 0;
}

/* ---------- keys being removed ---------- */

int cold_key_cmp(const void *a, const void *b) { return memcmp(a, b, 16); }

/* Where key is, or would go, in the sorted gone set. With gone_lock. */
static size_t gone_pos(const kvt_cold *c, const kvt_key *key, int *hit) {
  size_t lo = 0, hi = c->gone_n;
  *hit = 0;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int r = cold_key_cmp(&c->gone_v[mid], key);
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
  if (!hit && !(rc = cold_grow(c, &c->gone_v, &c->gone_cap, c->gone_n, sizeof *c->gone_v))) {
    memmove(c->gone_v + i + 1, c->gone_v + i, (c->gone_n - i) * sizeof *c->gone_v);
    c->gone_v[i] = *key;
    c->gone_n++;
  }
  pthread_mutex_unlock(&c->gone_lock);
  return rc;
}

void cold_gone_del(kvt_cold *c, const kvt_key *key) {
  int hit;
  pthread_mutex_lock(&c->gone_lock);
  size_t i = gone_pos(c, key, &hit);
  if (hit) {
    memmove(c->gone_v + i, c->gone_v + i + 1, (c->gone_n - i - 1) * sizeof *c->gone_v);
    c->gone_n--;
  }
  pthread_mutex_unlock(&c->gone_lock);
}

void cold_gone_clear(kvt_cold *c) {
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
int cold_keep_or_mark(kvt_cold *c, const kvt_key *key) {
  if (gone_add(c, key)) return 1; /* cannot mark it: keep it */
  int kept = c->keep && c->keep(c->keep_arg, key);
  if (kept) cold_gone_del(c, key);
  return kept;
}

int kvt_cold_find(kvt_cold *c, const kvt_key *key, kvt_cold_entry *e) {
  if (gone_has(c, key)) return KVT_ENOTFOUND;
  MDB_txn *t;
  kvt_cold_entry tmp;
  if (!e) e = &tmp;
  int rc = mdb_err(mdb_txn_begin(c->env, NULL, MDB_RDONLY, &t));
  if (rc) return rc;
  rc = cold_find_locked(c, t, key, e, NULL, 0);
  mdb_txn_abort(t);
  if (!rc && cold_seg_trouble(c, e->seg)) rc = KVT_ENOTFOUND; /* its file is gone: a miss */
  if (!rc) cold_evict_touch(c, key, 0); /* a lookup of it: a use (once after a prefix lookup) */
  return rc;
}

size_t kvt_cold_prefix(kvt_cold *c, const kvt_key *keys, size_t n) {
  MDB_txn *t;
  if (mdb_txn_begin(c->env, NULL, MDB_RDONLY, &t)) return 0;
  size_t i = 0;
  kvt_cold_entry e;
  while (i < n && cold_find_locked(c, t, &keys[i], &e, NULL, 0) == 0 && !cold_seg_trouble(c, e.seg) &&
         !gone_has(c, &keys[i]))
    i++;
  mdb_txn_abort(t);
  for (size_t k = 0; k < i; k++) cold_evict_touch(c, &keys[k], 1);
  return i;
}
/* ---------- removal, stats, verification ---------- */

typedef struct undo_rec {
  kvt_key key, parent;
  uint32_t seg;
  uint64_t gen, len;
  int tracked;                 /* was in the eviction order */
} undo_rec;

/* End a write transaction that may have run cold_remove_in: commit when rc is
 * 0, else abort; when it did not commit, put back what cold_remove_in changed
 * in memory (live bytes, the eviction order). Returns rc or the commit's
 * error. */
int cold_txn_end(kvt_cold *c, MDB_txn *t, int rc) {
  /* The log is taken while the writer lock is still held: once the
   * transaction ends, another thread's may fill c->undo. */
  undo_rec *undo = c->undo;
  size_t n_undo = c->undo_n, cap_undo = c->undo_cap;
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
  cold_vec_free(c, undo, cap_undo, sizeof *undo);
  return rc;
}

void *cold_buf_alloc(kvt_cold *c, size_t len) {
  void *p = kvt_mem_alloc_align(c->mem, KVT_MEM_OTHER, KVT_IO_ALIGN, len ? len : 1);
  if (p) memset(p, 0, kvt_mem_round_to(len ? len : 1, KVT_IO_ALIGN));
  return p;
}

void cold_buf_free(kvt_cold *c, void *p, size_t len) {
  kvt_mem_free(c->mem, KVT_MEM_OTHER, p, kvt_mem_round_to(len ? len : 1, KVT_IO_ALIGN));
}

/* At close: the keys being removed and an undo log left over. */
void cold_index_fini(kvt_cold *c) {
  cold_vec_free(c, c->gone_v, c->gone_cap, sizeof *c->gone_v);
  cold_vec_free(c, c->undo, c->undo_cap, sizeof *c->undo);
  c->gone_v = NULL;
  c->undo = NULL;
  c->gone_cap = c->undo_cap = 0;
}

int cold_remove_in(kvt_cold *c, MDB_txn *t, const kvt_key *key) {
  kvt_cold_entry e;
  int rc = cold_find_locked(c, t, key, &e, NULL, 0);
  MDB_val k = {16, (void *)key->b};
  if (rc == KVT_ECORRUPT) return mdb_err(mdb_del(t, c->db_blocks, &k, NULL));
  if (rc) return rc;
  if ((rc = cold_grow(c, &c->undo, &c->undo_cap, c->undo_n, sizeof *c->undo))) return rc;
  rc = mdb_err(mdb_del(t, c->db_blocks, &k, NULL));
  if (rc) return rc;
  int tracked = 0;
  if (c->ev) {
    pthread_mutex_lock(&c->ev_lock);
    tracked = kvt_evict_has(c->ev, key);
    pthread_mutex_unlock(&c->ev_lock);
  }
  cold_evict_forget(c, key);
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
  return e.seg < n_segs ? cold_seg_save(c, t, e.seg) : 0;
}

int kvt_cold_remove(kvt_cold *c, const kvt_key *key) {
  if (c->cfg.rdonly) return KVT_ERDONLY;
  MDB_txn *t;
  int rc = mdb_err(mdb_txn_begin(c->env, NULL, 0, &t));
  if (rc) return rc;
  return cold_txn_end(c, t, cold_remove_in(c, t, key)); /* not synced: a removal that is
                                                lost is found again by the next
                                                failed check */
}

/* The namespaces fsck checks entries against: seed and shape. */
typedef struct verify_ns {
  kvt_key seed;
  kvt_shape sh;
  int ok;                      /* the encoding parsed */
} verify_ns;

/* Which field of a record header differs from its index entry, or NULL. */
static const char *header_mismatch(const uint8_t *h, const kvt_cold_entry *e, const MDB_val *v) {
  uint32_t hl = cold_header_len(e->n_layers);
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
  uint32_t hl = cold_header_len(e->n_layers);
  uint8_t *h = NULL;
  unsigned long long off = (unsigned long long)e->offset;
  const char *why = ns_mismatch(e, ns, n_ns);
  if (!why && e->rec_len < hl) why = "record length shorter than its header";
  if (why) {
    snprintf(msg, cap, "segment %u offset %llu: index entry: %s", e->seg, off, why);
    return KVT_ECORRUPT;
  }
  int rc = cold_read_range(c, e->seg, e->offset, hl, &h);
  if (rc) {
    snprintf(msg, cap, "segment %u offset %llu: record header unreadable (%s)", e->seg, off,
             rc == KVT_ECORRUPT ? "past the end of the segment" : kvt_strerror(rc));
    return rc;
  }
  why = header_mismatch(h, e, v);
  cold_buf_free(c, h, hl);
  h = NULL;
  if (why) {
    snprintf(msg, cap, "segment %u offset %llu: index entry: %s", e->seg, off, why);
    return KVT_ECORRUPT;
  }
  for (uint32_t l = 0; l < e->n_layers; l++) {
    kvt_cold_slice s;
    cold_get_slice(cold_entry_slice(v, l), &s);
    uint32_t len = (uint32_t)kvt_align4k(s.stored_len);
    why = NULL;
    if (s.raw_len != 2 * (uint64_t)e->bytes_each || s.codec > KVT_COLD_CODEC_PLANES ||
        s.rel_off < hl || s.rel_off % KVT_IO_ALIGN || s.rel_off + (uint64_t)len > e->rec_len)
      why = "slice entry out of range";
    else if ((rc = cold_read_range(c, e->seg, e->offset + s.rel_off, len, &h)))
      why = rc == KVT_ECORRUPT ? "slice past the end of the segment" : kvt_strerror(rc);
    else if (!cold_slice_ok(h, e, l, &s))
      why = "slice checksum mismatch";
    cold_buf_free(c, h, len);
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
int cold_remove_keys(kvt_cold *c, const kvt_key *keys, size_t n, const kvt_key *ns_seed,
                       uint64_t *removed) {
  MDB_txn *t = NULL;
  uint64_t count = 0;
  int rc = ns_seed ? kvt_cold_ns_file_del(c->dir, ns_seed) : 0; /* put back at open if this fails */
  if (!rc) rc = mdb_err(mdb_txn_begin(c->env, NULL, 0, &t));
  for (size_t i = 0; !rc && i < n; i++) {
    int r = cold_remove_in(c, t, &keys[i]);
    if (!r) count++;
    else if (r != KVT_ENOTFOUND) rc = r;
  }
  if (!rc && ns_seed) {
    MDB_val k = {16, (void *)ns_seed->b};
    int r = mdb_del(t, c->db_ns, &k, NULL);
    if (r && r != MDB_NOTFOUND) rc = mdb_err(r);
  }
  if (t) rc = cold_txn_end(c, t, rc);
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
    if (bad && !rc) rc = cold_seg_save(c, t, id);
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
    if (!rc) rc = cold_get_entry(&last.key, &v, &cur);
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
  if (cold_grow(x->c, &x->ns, &x->ns_cap, x->n_ns, sizeof *x->ns)) return -ENOMEM;
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
  if (r == -ENOMEM || cold_transient(r)) return r;
  if (!r) return 0;
  const char *trouble = e ? cold_seg_trouble(x->c, e->seg) : NULL;
  if (trouble) snprintf(x->msg, sizeof x->msg, "segment file segments/seg-%08u %s", e->seg, trouble);
  x->bad++;
  if (x->report) x->report(x->arg, key, x->msg);
  if (cold_grow(x->c, &x->broken, &x->cap, x->n_broken, sizeof *x->broken)) return -ENOMEM;
  x->broken[x->n_broken++] = *key;
  return 0;
}

int kvt_cold_verify(kvt_cold *c, int repair, uint64_t *checked, uint64_t *bad,
                    void (*report)(void *, const kvt_key *, const char *), void *arg) {
  *checked = *bad = 0;
  if (repair && c->cfg.rdonly) return KVT_ERDONLY;
  verify_ctx x = {.c = c, .report = report, .arg = arg};
  int rc = kvt_cold_ns_each(c, verify_ns_one, &x);
  if (!rc) rc = cold_each_entry(c, verify_one, &x);
  *checked = x.checked;
  *bad = x.bad;
  if (!rc && repair && x.n_broken) rc = cold_remove_keys(c, x.broken, x.n_broken, NULL, NULL);
  if (!rc && repair) rc = segs_free_unusable(c);
  cold_vec_free(c, x.broken, x.cap, sizeof *x.broken);
  cold_vec_free(c, x.ns, x.ns_cap, sizeof *x.ns);
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
  kvt_cold *c;
  const kvt_key *seed, *root;
  uint32_t root_pos;
  drop_ent *ents;
  size_t n, cap;
} drop_ctx;

static int drop_one(void *arg, const kvt_key *key, const MDB_val *v, const kvt_cold_entry *e) {
  drop_ctx *x = arg;
  (void)v;
  if (!e || memcmp(e->ns_seed.b, x->seed->b, 16) || (x->root && e->pos <= x->root_pos)) return 0;
  if (cold_grow(x->c, &x->ents, &x->cap, x->n, sizeof *x->ents)) return -ENOMEM;
  x->ents[x->n++] = (drop_ent){.key = *key, .parent = e->parent, .pos = e->pos};
  return 0;
}

/* Entries of namespace seed (all, or those whose chain passes through
 * root), as keys sorted for bsearch; *out holds n_out, allocated for
 * *cap_out (cold_vec_free). */
static int drop_collect(kvt_cold *c, const kvt_key *seed, const kvt_key *root, uint32_t root_pos,
                        kvt_key **out, size_t *n_out, size_t *cap_out) {
  *out = NULL;
  *n_out = *cap_out = 0;
  drop_ctx x = {.c = c, .seed = seed, .root = root, .root_pos = root_pos};
  int rc = cold_each_entry(c, drop_one, &x);
  drop_ent *ents = x.ents;
  size_t n = x.n;
  kvt_key *keys = rc ? NULL : kvt_mem_alloc(c->mem, KVT_MEM_OTHER, (n + 1) * sizeof *keys);
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
  cold_vec_free(c, ents, x.cap, sizeof *ents);
  if (rc) return rc;
  *out = keys;
  *n_out = m;
  *cap_out = n + 1;
  return 0;
}

int kvt_cold_drop(kvt_cold *c, const kvt_key *seed, const kvt_key *root, uint32_t root_pos,
                  uint64_t *dropped) {
  return kvt_cold_drop_each(c, seed, root, root_pos, dropped, NULL, NULL);
}

int kvt_cold_drop_each(kvt_cold *c, const kvt_key *seed, const kvt_key *root, uint32_t root_pos,
                       uint64_t *dropped, void (*each)(void *, const kvt_key *, size_t), void *arg) {
  if (dropped) *dropped = 0;
  if (c->cfg.rdonly) return KVT_ERDONLY;
  kvt_key *keys;
  size_t n, cap;
  int rc = drop_collect(c, seed, root, root_pos, &keys, &n, &cap);
  if (!rc && each && n) each(arg, keys, n);
  if (!rc) rc = cold_remove_keys(c, keys, n, root ? NULL : seed, dropped);
  cold_vec_free(c, keys, cap, sizeof *keys);
  return rc;
}
