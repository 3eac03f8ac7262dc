/* cold_rebuild.c - recovery of the cold tier when its index is lost: the
 * namespace copies kept in namespaces/, and a fresh index built from
 * what the segment files hold (every record carries its key, layer table
 * and checksums). docs/format.md, "Cold tier" and "Rebuilding the index". */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <assert.h>
#include <errno.h>
#include <lmdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/io.h"
#include "tiers/cold_record.h"
#include "tiers/cold_scan.h"

#define NS_DIR "namespaces"
#define NS_ENC_MAX (8 + 3 * (4 + KVT_MAX_ID_LEN) + 8 + 4 + 7 * 4) /* longest encoding E */
#define SCAN_WINDOW (4u << 20)   /* bytes of a segment read at once while scanning */
#define TXN_BLOCKS 65536u        /* entries per write transaction of the new index */
#define OLD_INDEX_MAX 1000       /* index.old-1 .. index.old-999 */

/* ---------- namespace copies ---------- */

int kvt_cold_ns_shape(const uint8_t *enc, size_t len, kvt_shape *out) {
  if (len < 8 + 20 || memcmp(enc, "KVTNS001", 8)) return KVT_ECORRUPT;
  const uint8_t *t = enc + len - 20; /* the shape ends every encoding */
  *out = (kvt_shape){.n_layers = kvt_le_get32(t), .n_kv_heads = kvt_le_get32(t + 4), .head_dim = kvt_le_get32(t + 8),
                     .dtype = kvt_le_get32(t + 12), .block_tokens = kvt_le_get32(t + 16)};
  if (!out->n_layers || out->n_layers > KVT_MAX_LAYERS || !kvt_shape_block_bytes(out))
    return KVT_ECORRUPT;
  return 0;
}

/* Is enc the encoding whose seed is seed (XXH3-128, canonical)? */
static int ns_matches(const kvt_key *seed, const uint8_t *enc, size_t len) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(enc, len));
  kvt_shape sh;
  return !memcmp(c.digest, seed->b, 16) && kvt_cold_ns_shape(enc, len, &sh) == 0;
}

static void seed_hex(const kvt_key *seed, char out[33]) {
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", seed->b[i]);
}

int kvt_cold_ns_file_put(const char *dir, const kvt_key *seed, const uint8_t *enc, size_t len) {
  char nsdir[4200], name[33], path[4300];
  snprintf(nsdir, sizeof nsdir, "%s/" NS_DIR, dir);
  seed_hex(seed, name);
  snprintf(path, sizeof path, "%s/%s", nsdir, name);
  uint8_t have[NS_ENC_MAX];
  size_t n = 0;
  if (kvt_io_read_file(path, have, sizeof have, &n) == 0 && n == len && !memcmp(have, enc, len))
    return 0;
  int rc = kvt_io_mkdir(nsdir);
  if (!rc) rc = kvt_io_fsync_dir(dir);
  return rc ? rc : kvt_io_write_file(nsdir, name, enc, len);
}

int kvt_cold_ns_file_del(const char *dir, const kvt_key *seed) {
  char nsdir[4200], name[33], path[4300];
  snprintf(nsdir, sizeof nsdir, "%s/" NS_DIR, dir);
  seed_hex(seed, name);
  snprintf(path, sizeof path, "%s/%s", nsdir, name);
  int rc = kvt_io_unlink(path);
  return rc || !kvt_io_exists(nsdir) ? rc : kvt_io_fsync_dir(nsdir);
}

typedef struct backfill_ctx {
  const char *dir;
} backfill_ctx;

static int backfill_one(void *arg, const kvt_key *seed, const uint8_t *enc, size_t len) {
  const backfill_ctx *b = arg;
  return ns_matches(seed, enc, len) ? kvt_cold_ns_file_put(b->dir, seed, enc, len) : 0;
}

int kvt_cold_ns_files_backfill(kvt_cold *c) {
  backfill_ctx b = {.dir = kvt_cold_dir(c)};
  return kvt_cold_ns_each(c, backfill_one, &b);
}

static int any_name(void *arg, const char *name) {
  (void)arg;
  (void)name;
  return 1;
}

int kvt_cold_index_check(const char *dir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/index/data.mdb", dir);
  if (kvt_io_exists(path)) return 0;
  snprintf(path, sizeof path, "%s/segments", dir);
  return kvt_io_list(path, "seg-", any_name, NULL) == 1 ? KVT_EINDEX : 0;
}

/* ---------- scanning the segments ---------- */

/* One intact record found. */
typedef struct found {
  kvt_cold_entry e;
  uint8_t *table;              /* its header's layer table (24 * n_layers bytes) */
  int dead;                    /* not indexed: superseded */
} found;

/* A segment file. */
typedef struct segfile {
  uint32_t id;
  uint64_t size, max_gen, live;
} segfile;

/* A namespace recovered. */
typedef struct nsrec {
  kvt_key seed;
  uint8_t *enc;
  size_t len;
  kvt_shape sh;
} nsrec;

typedef struct rebuild {
  const char *dir;
  kvt_rebuild_result *res;
  void (*report)(void *, const char *);
  void *arg;
  kvt_io *io;
  found *f;
  size_t n_f, cap_f;
  segfile *segs;
  size_t n_segs, cap_segs;
  nsrec *ns;
  size_t n_ns, cap_ns;
  uint8_t *win, *rec;          /* the scan window; a record read on its own */
  size_t rec_cap;
  uint64_t old_segment_bytes;  /* from the old index, 0 when it does not read */
  kvt_mem mem;                 /* what the tables above take (no engine here) */
} rebuild;

static void say(rebuild *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(rebuild *r, const char *fmt, ...) {
  if (!r->report) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  r->report(r->arg, line);
}

/* Room for one more element of size elem in *v (n used, *cap allocated). */
static int more(rebuild *r, void *v, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return 0;
  size_t nc = *cap ? 2 * *cap : 64;
  void *p = kvt_mem_alloc(&r->mem, KVT_MEM_OTHER, nc * elem), *old = *(void **)v;
  if (!p) return -ENOMEM;
  if (n) memcpy(p, old, n * elem);
  kvt_mem_free(&r->mem, KVT_MEM_OTHER, old, *cap * elem);
  *(void **)v = p;
  *cap = nc;
  return 0;
}

static int read_at(rebuild *r, int fd, uint8_t *buf, uint64_t off, uint64_t len) {
  for (uint64_t done = 0; done < len;) { /* a request's length is a u32 */
    uint32_t n = (uint32_t)(len - done < (1u << 30) ? len - done : (1u << 30));
    kvt_io_req q = {.fd = fd, .op = KVT_IO_OP_READ, .buf = buf + done, .len = n, .off = off + done};
    int rc = kvt_io_run(r->io, &q, 1);
    if (rc) return rc;
    done += n;
  }
  return 0;
}

static int ns_add(rebuild *r, const kvt_key *seed, const uint8_t *enc, size_t len) {
  for (size_t i = 0; i < r->n_ns; i++)
    if (!memcmp(r->ns[i].seed.b, seed->b, 16)) return 0;
  if (!ns_matches(seed, enc, len)) {
    say(r, "namespace copy %02x%02x... does not match its seed: ignored", seed->b[0], seed->b[1]);
    return 0;
  }
  if (more(r, &r->ns, &r->cap_ns, r->n_ns, sizeof *r->ns)) return -ENOMEM;
  nsrec *n = &r->ns[r->n_ns];
  if (!(n->enc = kvt_mem_alloc(&r->mem, KVT_MEM_OTHER, len))) return -ENOMEM;
  memcpy(n->enc, enc, len);
  n->len = len;
  n->seed = *seed;
  kvt_cold_ns_shape(enc, len, &n->sh);
  r->n_ns++;
  return 0;
}

static const nsrec *ns_find(const rebuild *r, const kvt_key *seed) {
  for (size_t i = 0; i < r->n_ns; i++)
    if (!memcmp(r->ns[i].seed.b, seed->b, 16)) return &r->ns[i];
  return NULL;
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  return -1;
}

static int ns_file_one(void *arg, const char *name) {
  rebuild *r = arg;
  kvt_key seed;
  if (strlen(name) != 32) return 0; /* temporary files start with '.' */
  for (int i = 0; i < 16; i++) {
    int hi = hexval(name[2 * i]), lo = hexval(name[2 * i + 1]);
    if (hi < 0 || lo < 0) return 0;
    seed.b[i] = (uint8_t)(hi << 4 | lo);
  }
  char path[4400];
  uint8_t enc[NS_ENC_MAX];
  size_t len = 0;
  snprintf(path, sizeof path, "%s/" NS_DIR "/%s", r->dir, name);
  if (kvt_io_read_file(path, enc, sizeof enc, &len)) {
    say(r, "namespace copy %s unreadable: ignored", name);
    return 0;
  }
  return ns_add(r, &seed, enc, len);
}

/* Namespaces and the segment size from the old index, as far as it reads.
 * Opened read-only without a lock file: nothing is written to it. */
static int old_index_read(rebuild *r) {
  char path[4200];
  snprintf(path, sizeof path, "%s/index/data.mdb", r->dir);
  if (!kvt_io_exists(path)) return 0;
  snprintf(path, sizeof path, "%s/index", r->dir);
  MDB_env *env = NULL;
  MDB_txn *t = NULL;
  MDB_dbi meta, ns;
  MDB_cursor *cur = NULL;
  int rc = mdb_env_create(&env);
  if (!rc) rc = mdb_env_set_maxdbs(env, 4);
  if (!rc) rc = mdb_env_open(env, path, MDB_RDONLY | MDB_NOLOCK | MDB_NOTLS, 0644);
  if (!rc) rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &t);
  if (!rc && !mdb_dbi_open(t, "meta", 0, &meta)) {
    MDB_val k = {13, (void *)"segment_bytes"}, v;
    if (!mdb_get(t, meta, &k, &v) && v.mv_size == 8) r->old_segment_bytes = kvt_le_get64(v.mv_data);
  }
  if (!rc) rc = mdb_dbi_open(t, "ns", 0, &ns);
  if (!rc) rc = mdb_cursor_open(t, ns, &cur);
  MDB_val k, v;
  int err = 0;
  for (int op = MDB_FIRST; !rc && !err && !mdb_cursor_get(cur, &k, &v, op); op = MDB_NEXT) {
    kvt_key seed;
    if (k.mv_size != 16 || v.mv_size > NS_ENC_MAX) continue;
    memcpy(seed.b, k.mv_data, 16);
    err = ns_add(r, &seed, v.mv_data, v.mv_size);
  }
  if (rc) say(r, "old index: %s; namespaces come from %s/ only", mdb_strerror(rc), NS_DIR);
  if (cur) mdb_cursor_close(cur);
  if (t) mdb_txn_abort(t);
  if (env) mdb_env_close(env);
  return err;
}

static int seg_file_one(void *arg, const char *name) {
  rebuild *r = arg;
  char *end;
  if (strlen(name) != 12) return 0; /* seg-NNNNNNNN */
  unsigned long id = strtoul(name + 4, &end, 10);
  if (*end || id >= 65536) return 0;
  if (more(r, &r->segs, &r->cap_segs, r->n_segs, sizeof *r->segs)) return -ENOMEM;
  r->segs[r->n_segs++] = (segfile){.id = (uint32_t)id};
  return 0;
}

static int cmp_seg(const void *a, const void *b) {
  uint32_t x = ((const segfile *)a)->id, y = ((const segfile *)b)->id;
  return (x > y) - (x < y);
}

/* Check the record whose header is at off of segment sf (hdr: what of it
 * is in memory); 1 and added when intact, 0 when damaged. */
static int scan_record(rebuild *r, int fd, segfile *sf, uint64_t off, const uint8_t *hdr,
                       size_t avail) {
  kvt_cold_entry e = {0};
  uint8_t *tmp = NULL;
  uint32_t nl = avail >= KVT_REC_FIXED ? kvt_le_get32(hdr + KVT_REC_H_N_LAYERS) : 0;
  if (nl && nl <= KVT_MAX_LAYERS && kvt_cold_header_len(nl) > avail) {
    /* a header longer than the window's rest */
    uint32_t hl = kvt_cold_header_len(nl);
    if (off + hl > sf->size) return -1;
    if (!(tmp = kvt_io_buf_alloc(hl))) return -ENOMEM;
    if (read_at(r, fd, tmp, off, hl)) {
      kvt_io_buf_free(tmp);
      return -1;
    }
    hdr = tmp;
    avail = hl;
  }
  int ok = kvt_cold_header_parse(hdr, avail, &e) == 0;
  if (tmp) { /* the header alone was read: the record is read whole below */
    kvt_io_buf_free(tmp);
    hdr = NULL;
    avail = 0;
  }
  if (!ok) {
    say(r, "segment %u offset %llu: damaged record header", sf->id, (unsigned long long)off);
    return -1;
  }
  e.seg = sf->id;
  e.offset = off;
  if (off + e.rec_len > sf->size) {
    say(r, "segment %u offset %llu: record runs past the end of the file (torn write)", sf->id,
        (unsigned long long)off);
    return -1;
  }
  const uint8_t *rec = hdr;
  if (avail < e.rec_len) {
    if (r->rec_cap < e.rec_len) {
      kvt_io_buf_free(r->rec);
      r->rec_cap = 0;
      if (!(r->rec = kvt_io_buf_alloc(e.rec_len))) return -ENOMEM;
      r->rec_cap = e.rec_len;
    }
    int rc = read_at(r, fd, r->rec, off, e.rec_len);
    if (rc) return rc == -ENOMEM ? rc : -1;
    rec = r->rec;
  }
  for (uint32_t l = 0; l < e.n_layers; l++)
    if (!kvt_cold_record_slice_ok(rec, &e, l)) {
      say(r, "segment %u offset %llu layer %u: slice checksum mismatch", sf->id,
          (unsigned long long)off, l);
      return -1;
    }
  if (more(r, &r->f, &r->cap_f, r->n_f, sizeof *r->f)) return -ENOMEM;
  found *f = &r->f[r->n_f];
  size_t tab = (size_t)24 * e.n_layers;
  if (!(f->table = kvt_mem_alloc(&r->mem, KVT_MEM_OTHER, tab))) return -ENOMEM;
  memcpy(f->table, rec + KVT_REC_FIXED, tab);
  f->e = e;
  f->dead = 0;
  r->n_f++;
  if (e.seg_gen > sf->max_gen) sf->max_gen = e.seg_gen;
  return 1;
}

/* Walk one segment file page by page: a page that starts an intact
 * record is followed by the record's length, any other by one page. */
static int scan_segment(rebuild *r, segfile *sf) {
  char path[4200];
  snprintf(path, sizeof path, "%s/segments/seg-%08u", r->dir, sf->id);
  int fd = -1, rc = kvt_io_open(r->io, path, 0, 1, &fd, NULL);
  if (rc) return rc;
  rc = kvt_io_file_size(fd, &sf->size);
  sf->size &= ~(uint64_t)(KVT_IO_ALIGN - 1);
  uint64_t wstart = 0, wlen = 0;
  for (uint64_t off = 0; !rc && off + KVT_IO_ALIGN <= sf->size;) {
    if (off < wstart || off + KVT_IO_ALIGN > wstart + wlen) {
      wstart = off;
      wlen = sf->size - off < SCAN_WINDOW ? sf->size - off : SCAN_WINDOW;
      if ((rc = read_at(r, fd, r->win, wstart, wlen))) break;
    }
    const uint8_t *p = r->win + (off - wstart);
    if (memcmp(p, "KVTREC01", 8)) {
      off += KVT_IO_ALIGN;
      continue;
    }
    int got = scan_record(r, fd, sf, off, p, (size_t)(wstart + wlen - off));
    if (got < -1) rc = got;
    else if (got == 1) off += r->f[r->n_f - 1].e.rec_len;
    else {
      r->res->damaged++;
      off += KVT_IO_ALIGN;
    }
  }
  kvt_io_close(r->io, fd);
  return rc;
}

/* Key order; for one key, the newest first (segment generation, then the
 * later segment, then the later offset). */
static int cmp_found(const void *a, const void *b) {
  const kvt_cold_entry *x = &((const found *)a)->e, *y = &((const found *)b)->e;
  int c = memcmp(x->key.b, y->key.b, 16);
  if (c) return c;
  if (x->seg_gen != y->seg_gen) return x->seg_gen > y->seg_gen ? -1 : 1;
  if (x->seg != y->seg) return x->seg > y->seg ? -1 : 1;
  return (x->offset < y->offset) - (x->offset > y->offset);
}

/* The segment file of id (r->segs is sorted by id; every record found
 * came from one of them). */
static segfile *seg_of(rebuild *r, uint32_t id) {
  segfile want = {.id = id};
  return bsearch(&want, r->segs, r->n_segs, sizeof *r->segs, cmp_seg);
}

/* Which records go into the index: those of the current life of their
 * segment (an older life's were all removed or moved before it was
 * reused), one per key, consistent with a namespace where it is known. */
static void choose(rebuild *r) {
  for (size_t i = 0; i < r->n_f; i++) {
    found *f = &r->f[i];
    if (f->e.seg_gen < seg_of(r, f->e.seg)->max_gen) f->dead = 1;
  }
  qsort(r->f, r->n_f, sizeof *r->f, cmp_found);
  const found *last = NULL;
  for (size_t i = 0; i < r->n_f; i++) {
    found *f = &r->f[i];
    if (f->dead) continue;
    if (last && !memcmp(last->e.key.b, f->e.key.b, 16)) {
      f->dead = 1;
      continue;
    }
    const nsrec *ns = ns_find(r, &f->e.ns_seed);
    if (ns && (ns->sh.n_layers != f->e.n_layers || ns->sh.dtype != f->e.dtype ||
               kvt_shape_block_bytes(&ns->sh) != f->e.bytes_each)) {
      say(r, "segment %u offset %llu: record does not fit its namespace's shape: left out",
          f->e.seg, (unsigned long long)f->e.offset);
      f->dead = 1;
      continue;
    }
    last = f;
    r->res->orphans += !ns;
    seg_of(r, f->e.seg)->live += f->e.rec_len;
  }
  for (size_t i = 0; i < r->n_f; i++) {
    r->res->superseded += r->f[i].dead;
    r->res->blocks += !r->f[i].dead;
  }
}

/* ---------- writing the new index ---------- */

static int put_u64(MDB_txn *t, MDB_dbi db, const char *name, uint64_t v) {
  uint8_t b[8];
  kvt_le_put64(b, v);
  MDB_val k = {strlen(name), (void *)name}, val = {8, b};
  return mdb_put(t, db, &k, &val, 0);
}

static void rm_index_dir(const char *path) {
  char p[4300];
  snprintf(p, sizeof p, "%s/data.mdb", path);
  kvt_io_unlink(p);
  snprintf(p, sizeof p, "%s/lock.mdb", path);
  kvt_io_unlink(p);
  kvt_io_rmdir(path);
}

static int write_index(rebuild *r, const char *path, uint64_t segment_bytes, uint64_t map_bytes) {
  MDB_env *env = NULL;
  MDB_txn *t = NULL;
  MDB_dbi meta, nsdb, blocks, segs;
  int rc = mdb_env_create(&env);
  if (!rc) rc = mdb_env_set_maxdbs(env, 4);
  if (!rc) rc = mdb_env_set_mapsize(env, map_bytes);
  if (!rc) rc = mdb_env_open(env, path, MDB_NOTLS | MDB_NOSYNC, 0644);
  if (!rc) rc = mdb_txn_begin(env, NULL, 0, &t);
  if (!rc) rc = mdb_dbi_open(t, "meta", MDB_CREATE, &meta);
  if (!rc) rc = mdb_dbi_open(t, "ns", MDB_CREATE, &nsdb);
  if (!rc) rc = mdb_dbi_open(t, "blocks", MDB_CREATE, &blocks);
  if (!rc) rc = mdb_dbi_open(t, "segs", MDB_CREATE, &segs);
  if (!rc) rc = put_u64(t, meta, "format", kvt_cold_format_version());
  if (!rc) rc = put_u64(t, meta, "segment_bytes", segment_bytes);
  for (size_t i = 0; !rc && i < r->n_ns; i++) {
    MDB_val k = {16, r->ns[i].seed.b}, v = {r->ns[i].len, r->ns[i].enc};
    rc = mdb_put(t, nsdb, &k, &v, 0);
  }
  for (size_t i = 0; !rc && i < r->n_segs; i++) {
    const segfile *sf = &r->segs[i];
    uint8_t key[4] = {(uint8_t)sf->id, (uint8_t)(sf->id >> 8), (uint8_t)(sf->id >> 16),
                      (uint8_t)(sf->id >> 24)};
    uint8_t row[32];
    kvt_cold_seg_encode(row, sf->max_gen ? sf->max_gen : 1, sf->size, sf->live, sf->live > 0);
    MDB_val k = {4, key}, v = {32, row};
    rc = mdb_put(t, segs, &k, &v, 0);
  }
  const size_t ent_cap = 80 + (size_t)24 * KVT_MAX_LAYERS;
  uint8_t *ent = kvt_mem_alloc(&r->mem, KVT_MEM_OTHER, ent_cap);
  if (!ent && !rc) rc = ENOMEM;
  size_t in_txn = 0;
  for (size_t i = 0; !rc && i < r->n_f; i++) {
    const found *f = &r->f[i];
    if (f->dead) continue;
    MDB_val k = {16, (void *)f->e.key.b}, v = {kvt_cold_entry_encode(ent, &f->e, f->table), ent};
    rc = mdb_put(t, blocks, &k, &v, 0);
    if (!rc && ++in_txn == TXN_BLOCKS) { /* bounded transactions */
      in_txn = 0;
      rc = mdb_txn_commit(t);
      t = NULL;
      if (!rc) rc = mdb_txn_begin(env, NULL, 0, &t);
    }
  }
  kvt_mem_free(&r->mem, KVT_MEM_OTHER, ent, ent_cap);
  if (!rc) {
    rc = mdb_txn_commit(t);
    t = NULL;
  }
  if (t) mdb_txn_abort(t);
  if (!rc) rc = mdb_env_sync(env, 1);
  if (env) mdb_env_close(env);
  if (rc == MDB_MAP_FULL) return -ENOSPC;
  return rc > 0 ? -rc : rc ? -EIO : 0;
}

/* Put the new index in place, the old one (if any) kept as index.old-N. */
static int swap_index(rebuild *r, const char *fresh) {
  char cur[4200], old[4300];
  snprintf(cur, sizeof cur, "%s/index", r->dir);
  if (kvt_io_exists(cur)) {
    int n = 1;
    for (; n < OLD_INDEX_MAX; n++) {
      snprintf(old, sizeof old, "%s/index.old-%d", r->dir, n);
      if (!kvt_io_exists(old)) break;
    }
    if (n == OLD_INDEX_MAX) return -EEXIST;
    int rc = kvt_io_rename(cur, old);
    if (rc) return rc;
    snprintf(r->res->old_index, sizeof r->res->old_index, "index.old-%d", n);
  }
  int rc = kvt_io_rename(fresh, cur);
  return rc ? rc : kvt_io_fsync_dir(r->dir);
}

static int segment_size(rebuild *r, uint64_t asked, uint64_t *out) {
  uint64_t largest = 0;
  for (size_t i = 0; i < r->n_segs; i++)
    if (r->segs[i].size > largest) largest = r->segs[i].size;
  uint64_t s = asked, old = r->old_segment_bytes;
  if (!s && old >= (1u << 20) && old % KVT_IO_ALIGN == 0 && old >= largest) s = old;
  if (!s) { /* the old index does not say (or says nonsense): infer it */
    s = (largest + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
    if (s < (1u << 20)) s = 1u << 20;
  }
  if (s < (1u << 20) || s % KVT_IO_ALIGN || s < largest) return KVT_EOPTION;
  *out = s;
  return 0;
}

static int rebuild_run(rebuild *r, uint64_t segment_bytes, uint64_t map_bytes) {
  char path[4200];
  snprintf(path, sizeof path, "%s/" NS_DIR, r->dir);
  int rc = kvt_io_list(path, "", ns_file_one, r);
  if (!rc) rc = old_index_read(r);
  snprintf(path, sizeof path, "%s/segments", r->dir);
  if (!rc) rc = kvt_io_list(path, "seg-", seg_file_one, r);
  if (rc) return rc;
  qsort(r->segs, r->n_segs, sizeof *r->segs, cmp_seg);
  if (!(r->win = kvt_io_buf_alloc(SCAN_WINDOW))) return -ENOMEM;
  for (size_t i = 0; !rc && i < r->n_segs; i++) rc = scan_segment(r, &r->segs[i]);
  if (rc) return rc;
  r->res->segments = r->n_segs;
  r->res->records = r->n_f;
  choose(r);
  if ((rc = segment_size(r, segment_bytes, &r->res->segment_bytes))) return rc;
  r->res->namespaces = r->n_ns;
  snprintf(path, sizeof path, "%s/index.new", r->dir);
  rm_index_dir(path); /* left by a rebuild that did not finish */
  rc = kvt_io_mkdir(path);
  if (!map_bytes) map_bytes = kvt_cold_map_bytes((uint64_t)(r->n_segs + 1) * r->res->segment_bytes);
  if (!rc) rc = write_index(r, path, r->res->segment_bytes, map_bytes);
  if (!rc) rc = kvt_io_fsync_dir(path); /* index.new's files: named durably before the swap */
  if (!rc) rc = swap_index(r, path);
  for (size_t i = 0; !rc && i < r->n_ns; i++) /* old index's namespaces get their copy */
    rc = kvt_cold_ns_file_put(r->dir, &r->ns[i].seed, r->ns[i].enc, r->ns[i].len);
  if (r->res->orphans)
    say(r, "%llu blocks belong to namespaces not recovered: found again once they are "
           "registered", (unsigned long long)r->res->orphans);
  return rc;
}

int kvt_cold_rebuild(const char *dir, uint64_t segment_bytes, uint64_t map_bytes,
                     kvt_rebuild_result *res, void (*report)(void *arg, const char *what),
                     void *arg) {
  *res = (kvt_rebuild_result){0};
  rebuild r = {.dir = dir, .res = res, .report = report, .arg = arg};
  kvt_mem_init(&r.mem, 0);
  kvt_io_config io = {.backend = KVT_IO_PREAD, .no_direct = 1};
  int rc = kvt_io_create(&io, &r.io);
  if (!rc) rc = rebuild_run(&r, segment_bytes, map_bytes);
  if (rc) { /* counts of a rebuild that did not finish mean nothing */
    *res = (kvt_rebuild_result){0};
    char path[4200];
    snprintf(path, sizeof path, "%s/index.new", dir);
    rm_index_dir(path);
  }
  kvt_io_destroy(r.io);
  for (size_t i = 0; i < r.n_f; i++)
    kvt_mem_free(&r.mem, KVT_MEM_OTHER, r.f[i].table, (size_t)24 * r.f[i].e.n_layers);
  for (size_t i = 0; i < r.n_ns; i++) kvt_mem_free(&r.mem, KVT_MEM_OTHER, r.ns[i].enc, r.ns[i].len);
  kvt_mem_free(&r.mem, KVT_MEM_OTHER, r.f, r.cap_f * sizeof *r.f);
  kvt_mem_free(&r.mem, KVT_MEM_OTHER, r.segs, r.cap_segs * sizeof *r.segs);
  kvt_mem_free(&r.mem, KVT_MEM_OTHER, r.ns, r.cap_ns * sizeof *r.ns);
  assert(kvt_mem_total(&r.mem) == 0); /* every table freed with its size */
  kvt_mem_fini(&r.mem);
  kvt_io_buf_free(r.win);
  kvt_io_buf_free(r.rec);
  return rc;
}
