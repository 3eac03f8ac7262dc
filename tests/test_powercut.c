/* test_powercut.c - power loss, not just a killed process (in the spirit
 * of SQLite's crash VFS and RocksDB's FaultInjectionTestFS). A forked
 * child runs a store on the pread backend (io_uring would bypass the
 * recorder; the ordering code is shared) while powercut_shim.c logs every
 * change to the store's files - segment writes, LMDB's own pwrite/writev,
 * fsync/fdatasync of files and of directories, new names - and, in the
 * same order, the child's acknowledgements: kvt_seq_durable() after every
 * block and after each kvt_sync() that returned 0. The parent replays the
 * log to cut points and builds the store as a power loss there could leave
 * it: each file's content as of its last sync plus a random subset of the
 * writes since (some torn at 512-byte or 4 KiB boundaries), and each name
 * created or removed since its directory's last fsync there or not at
 * random. It opens that store and checks: every acknowledged block loads
 * bit-exact; no block ever loads other bytes or fails instead of missing;
 * fsck finds nothing bad (a cut before the store's first open returned
 * may leave a store that does not open: counted and printed). 2 workloads
 * x 100 cuts, then 1 x 100 with a two-segment cold tier where segments are
 * reclaimed and reused (10 x 200 and 5 x 200 with KVT_STRESS=1); the seed
 * is printed (KVT_SEED replays everything), KVT_TEST_FILTER picks one, and
 * KVT_POWERCUT_LOG=file keeps a copy of the last workload's log. */
#include "cold_util.h"
#include "powercut_shim.h"

#include <ftw.h>
#include <time.h>

#define N_SEQ 40
#define N_FAM 8
#define MAX_BLOCKS 8

static const char *const MODEL = "powercut-f16";
/* The variant running: a cold tier of SMALL_SEGS segments, so segments are
 * reclaimed (referenced blocks relocated, the rest evicted) and reused. */
static int g_small;
#define SMALL_SEGS 2

static kvt_shape pc_shape(void) {
  return (kvt_shape){.n_layers = 4, .n_kv_heads = 2, .head_dim = 32, .dtype = KVT_F16,
                     .block_tokens = 8};
}

static kvt_options pc_opts(void) {
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD); /* the recorder sees C library calls only */
  o.cold_group_bytes = 32u << 10;  /* several groups per sync now and then */
  if (g_small) o.tier_bytes_limit[KVT_TIER_COLD] = SMALL_SEGS * o.cold_segment_bytes;
  return o;
}

typedef struct plan {
  cu_seqspec sp;
  uint32_t sync_every;
} plan;

static plan plan_of(uint64_t seed, uint32_t i) {
  uint64_t h = tu_mix(seed ^ tu_mix(i ^ 0x9E3779B9ull));
  plan p;
  p.sp.fam = (uint32_t)(h >> 8) % N_FAM;
  p.sp.branch = (uint32_t)(h >> 16) % 4;
  p.sp.shared = 1 + p.sp.fam % 3;
  p.sp.n_blocks = 2 + (uint32_t)(h >> 24) % (MAX_BLOCKS - 1);
  p.sync_every = 1 + (uint32_t)(h >> 40) % 4;
  return p;
}

/* The child's notes in the log: 'O' the store is open; 'S' sequence seq
 * starts; 'D' kvt_seq_durable() of sequence seq said `durable`; 'R'
 * sequence seq is released; 'E' (at the end) `durable` segments were
 * reclaimed. */
typedef struct note {
  uint32_t kind, seq, durable, pad;
} note;

static void note_put(uint32_t kind, uint32_t seq, uint32_t durable) {
  note n = {kind, seq, durable, 0};
  pc_note(&n, sizeof n);
}

/* --------------------------------------------------------------- child */

enum { C_LOG = 10, C_OPEN, C_REGISTER, C_SEQ, C_APPEND, C_SYNC, C_DURABLE, C_REFUSED };

static int child_main(const char *root, const char *dir, const char *log_path, uint64_t seed) {
  if (pc_record_start(root, log_path)) return C_LOG;
  kvt_options o = pc_opts();
  kvt_engine *e = NULL;
  int rc = kvt_engine_open(dir, &o, &e);
  if (rc) {
    fprintf(stderr, "powercut child: open: %s\n", kvt_strerror(rc));
    return C_OPEN;
  }
  kvt_shape sh = pc_shape();
  kvt_ns_desc d = tu_desc(MODEL, &sh);
  kvt_ns_id ns;
  if (kvt_ns_register(e, &d, &ns)) return C_REGISTER;
  note_put('O', 0, 0);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  for (uint32_t i = 0; i < N_SEQ; i++) {
    plan p = plan_of(seed, i);
    note_put('S', i, 0);
    kvt_seq *s;
    if (kvt_seq_create(e, ns, &s)) return C_SEQ;
    uint32_t told = 0;
    for (uint32_t j = 0; j < p.sp.n_blocks; j++) {
      uint32_t tok[64];
      cu_tokens(seed, &p.sp, j, sh.block_tokens, tok);
      if ((rc = cu_append_put(s, &sh, tu_salt(MODEL), tok, &kv, NULL))) {
        fprintf(stderr, "powercut child: append/put: %s\n", kvt_strerror(rc));
        return C_APPEND;
      }
      uint32_t dur = kvt_seq_durable(s); /* the watermark, between syncs too */
      if (dur > told) note_put('D', i, told = dur);
      if ((j + 1) % p.sync_every != 0 && j + 1 != p.sp.n_blocks) continue;
      if ((rc = kvt_sync(e))) {
        fprintf(stderr, "powercut child: kvt_sync: %s\n", kvt_strerror(rc));
        return C_SYNC;
      }
      dur = kvt_seq_durable(s);
      if (dur != j + 1) return C_DURABLE;
      if (dur > told) note_put('D', i, told = dur);
    }
    kvt_seq_release(s);
    note_put('R', i, 0);
  }
  tu_kv_free(&kv);
  kvt_stats st;
  if (kvt_stats_get(e, &st) == 0) note_put('E', 0, (uint32_t)st.cold_reclaims);
  kvt_engine_close(e);
  pc_record_stop();
  return pc_refused() ? C_REFUSED : 0;
}

/* ----------------------------------------------------------- the model */

/* One name under the root, as the replayed log left it. */
typedef struct pfile {
  char *path;
  int dir;
  int exists;        /* now */
  int dexists;       /* as of its directory's last fsync */
  int present;       /* in the store being built */
  uint8_t *cur;      /* content now */
  uint64_t size, cap;
  uint8_t *img;      /* content as of its last sync */
  uint64_t img_size;
  const pc_rec **pend; /* writes and size changes since */
  size_t n_pend, cap_pend;
} pfile;

typedef struct model {
  pfile *f;
  size_t n, cap;
  const char *root;
  uint32_t started;           /* sequences started */
  uint32_t acked[N_SEQ];      /* leading blocks acknowledged durable */
  int opened;                 /* the child's kvt_engine_open had returned */
  int released;               /* the last sequence started was released */
  uint32_t reclaims;          /* segments the child reclaimed ('E') */
} model;

static const char *rec_path(const pc_rec *r) { return (const char *)(r + 1); }
static const uint8_t *rec_data(const pc_rec *r) { return (const uint8_t *)(r + 1) + r->path_len; }

static pfile *model_find(model *m, const char *path, size_t len) {
  for (size_t i = 0; i < m->n; i++)
    if (strlen(m->f[i].path) == len && memcmp(m->f[i].path, path, len) == 0) return &m->f[i];
  return NULL;
}

static pfile *model_add(model *m, const pc_rec *r) {
  pfile *f = model_find(m, rec_path(r), r->path_len);
  if (f) return f;
  if (m->n == m->cap) {
    m->cap = m->cap ? 2 * m->cap : 32;
    m->f = realloc(m->f, m->cap * sizeof *m->f);
    assert_non_null(m->f);
  }
  f = &m->f[m->n++];
  memset(f, 0, sizeof *f);
  f->path = strndup(rec_path(r), r->path_len);
  assert_non_null(f->path);
  return f;
}

static void grow(uint8_t **buf, uint64_t *cap, uint64_t need) {
  if (need <= *cap) return;
  uint64_t c = *cap ? *cap : 65536;
  while (c < need) c *= 2;
  *buf = realloc(*buf, c);
  assert_non_null(*buf);
  *cap = c;
}

/* Set *size of *buf to n, zero-filling what it grows by. */
static void resize(uint8_t **buf, uint64_t *size, uint64_t *cap, uint64_t n) {
  grow(buf, cap, n);
  if (n > *size) memset(*buf + *size, 0, n - *size);
  *size = n;
}

static void put_bytes(uint8_t **buf, uint64_t *size, uint64_t *cap, uint64_t off,
                      const uint8_t *p, uint64_t n) {
  if (off + n > *size) resize(buf, size, cap, off + n);
  memcpy(*buf + off, p, n);
}

static void pend_push(pfile *f, const pc_rec *r) {
  if (f->n_pend == f->cap_pend) {
    f->cap_pend = f->cap_pend ? 2 * f->cap_pend : 64;
    f->pend = realloc(f->pend, f->cap_pend * sizeof *f->pend);
    assert_non_null(f->pend);
  }
  f->pend[f->n_pend++] = r;
}

static size_t parent_len(const char *path, size_t len) {
  while (len > 0 && path[len - 1] != '/') len--;
  return len ? len - 1 : 0;
}

/* The file a write, sync or size change names; it must be known. */
static pfile *model_file(model *m, const pc_rec *r) {
  pfile *f = model_find(m, rec_path(r), r->path_len);
  if (!f) fprintf(stderr, "powercut: the log names %.*s before creating it\n", (int)r->path_len,
                  rec_path(r));
  assert_non_null(f);
  return f;
}

static void model_apply(model *m, const pc_rec *r) {
  pfile *f;
  switch (r->kind) {
  case PC_CREATE:
  case PC_MKDIR:
    f = model_add(m, r);
    f->dir = r->kind == PC_MKDIR;
    f->exists = 1;
    f->size = f->img_size = 0;
    f->n_pend = 0;
    break;
  case PC_WRITE:
    f = model_file(m, r);
    put_bytes(&f->cur, &f->size, &f->cap, r->off, rec_data(r), r->len);
    pend_push(f, r);
    break;
  case PC_TRUNC:
    f = model_file(m, r);
    resize(&f->cur, &f->size, &f->cap, r->off);
    pend_push(f, r);
    break;
  case PC_SYNC: {
    f = model_file(m, r);
    f->img = realloc(f->img, f->size ? f->size : 1); /* exactly img_size bytes */
    assert_non_null(f->img);
    if (f->size) memcpy(f->img, f->cur, f->size);
    f->img_size = f->size;
    f->n_pend = 0;
    break;
  }
  case PC_DIRSYNC:
    for (size_t i = 0; i < m->n; i++) {
      pfile *g = &m->f[i];
      size_t pl = parent_len(g->path, strlen(g->path));
      if (pl == r->path_len && memcmp(g->path, rec_path(r), pl) == 0) g->dexists = g->exists;
    }
    break;
  case PC_UNLINK:
    model_file(m, r)->exists = 0;
    break;
  case PC_NOTE: {
    note n;
    assert_int_equal(r->len, sizeof n);
    memcpy(&n, rec_data(r), sizeof n);
    if (n.kind == 'O') m->opened = 1;
    if (n.kind == 'S') m->started = n.seq + 1, m->released = 0;
    if (n.kind == 'R') m->released = 1;
    if (n.kind == 'E') m->reclaims = n.durable;
    if (n.kind == 'D') {
      assert_true(n.seq < N_SEQ);
      assert_true(n.durable >= m->acked[n.seq]);
      m->acked[n.seq] = n.durable;
    }
    break;
  }
  default:
    fprintf(stderr, "powercut: record kind %u in the log\n", r->kind);
    fail();
  }
}

static void model_free(model *m) {
  for (size_t i = 0; i < m->n; i++) {
    free(m->f[i].path);
    free(m->f[i].cur);
    free(m->f[i].img);
    free(m->f[i].pend);
  }
  free(m->f);
}

/* ------------------------------------------------ the store after a cut */

typedef struct cut_stats {
  uint64_t cuts, acked_checked, blocks_exact, blocks_missing, before_open;
  uint64_t files_lost, writes_dropped, writes_torn, writes_kept, reclaims;
  double child_s, cuts_s; /* printed only */
} cut_stats;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The content f may have after a power loss now: its synced image, then
 * each later write or size change in order, kept, dropped, or (a write)
 * torn: each 512-byte or 4 KiB sector of it kept or not. */
static void file_after_cut(const pfile *f, uint64_t *rng, uint8_t **buf, uint64_t *size,
                           uint64_t *cap, cut_stats *cs) {
  *size = 0;
  resize(buf, size, cap, f->img_size);
  if (f->img_size) memcpy(*buf, f->img, f->img_size);
  for (size_t i = 0; i < f->n_pend; i++) {
    const pc_rec *r = f->pend[i];
    uint64_t x = tu_rand_r(rng);
    if (r->kind == PC_TRUNC) {
      if (x & 1) resize(buf, size, cap, r->off);
      continue;
    }
    if (r->flags & PC_F_DSYNC) x = 2; /* written through O_DSYNC: durable when done */
    switch (x % 8) {
    case 0:
    case 1:
      cs->writes_dropped++;
      break;
    case 6:
    case 7: {
      uint64_t g = (x >> 8) & 1 ? 512 : 4096, end = r->off + r->len;
      for (uint64_t a = r->off; a < end;) {
        uint64_t b = (a / g + 1) * g;
        if (b > end) b = end;
        if (tu_rand_r(rng) & 1) put_bytes(buf, size, cap, a, rec_data(r) + (a - r->off), b - a);
        a = b;
      }
      cs->writes_torn++;
      break;
    }
    default:
      put_bytes(buf, size, cap, r->off, rec_data(r), r->len);
      cs->writes_kept++;
    }
  }
}

static void write_file(const char *path, const uint8_t *p, uint64_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  assert_true(fd >= 0);
  while (n) {
    ssize_t w = write(fd, p, n);
    assert_true(w > 0);
    p += w;
    n -= (uint64_t)w;
  }
  assert_int_equal(close(fd), 0);
}

/* Build, under out, what the root may hold after a power loss now. */
static void build_cut(model *m, const char *out, uint64_t *rng, cut_stats *cs) {
  size_t rl = strlen(m->root);
  uint8_t *buf = NULL;
  uint64_t size = 0, cap = 0;
  for (size_t i = 0; i < m->n; i++) { /* creation order: parents first */
    pfile *f = &m->f[i];
    size_t len = strlen(f->path), pl = parent_len(f->path, len);
    int parent = pl == rl;
    if (!parent) {
      pfile *p = model_find(m, f->path, pl);
      assert_non_null(p);
      parent = p->present;
    }
    f->present = parent && (f->exists == f->dexists ? f->exists : (int)(tu_rand_r(rng) & 1));
    if (f->exists && !f->present) cs->files_lost++;
    if (!f->present) continue;
    char path[1200];
    snprintf(path, sizeof path, "%s%s", out, f->path + rl);
    if (f->dir) {
      assert_int_equal(mkdir(path, 0755), 0);
      continue;
    }
    file_after_cut(f, rng, &buf, &size, &cap, cs);
    write_file(path, buf, size);
  }
  free(buf);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path) == 0 ? 0 : -errno;
}

/* --------------------------------------------------- checking the store */

static void verify_seq(kvt_engine *e, kvt_ns_id ns, uint64_t seed, uint32_t i, uint32_t acked,
                       uint64_t cut, cut_stats *cs) {
  plan p = plan_of(seed, i);
  kvt_shape sh = pc_shape();
  uint32_t bt = sh.block_tokens, nb = p.sp.n_blocks;
  uint32_t *tok = cu_seq_tokens(seed, &p.sp, nb, bt);
  kvt_key keys[MAX_BLOCKS];
  size_t nk = 0, found = 0;
  assert_int_equal(kvt_keys(e, ns, tok, (size_t)nb * bt, keys, MAX_BLOCKS, &nk), 0);
  assert_int_equal(kvt_lookup(e, ns, tok, (size_t)nb * bt, NULL, 0, &found), 0);
  if (found < acked)
    fprintf(stderr, "powercut: cut at record %llu: seq %u: lookup finds %zu blocks, %u were "
            "acknowledged durable\n", (unsigned long long)cut, i, found, acked);
  assert_true(found >= acked);
  for (uint32_t j = 0; j < nb; j++) {
    int status[8];
    uint32_t n_exact, n_wrong;
    int rc = cu_load_block(e, ns, &sh, tu_salt(MODEL), &keys[j], j, tok + j * bt, status, NULL,
                           &n_exact, &n_wrong);
    if (n_wrong)
      fprintf(stderr, "powercut: cut at record %llu: seq %u block %u: %u layers load WRONG "
              "bytes\n", (unsigned long long)cut, i, j, n_wrong);
    assert_int_equal(n_wrong, 0); /* never other bytes */
    int missing = 1;
    for (uint32_t l = 0; l < sh.n_layers; l++) missing &= status[l] == KVT_ENOTFOUND;
    if (rc != 0 && (j < acked || !missing))
      fprintf(stderr, "powercut: cut at record %llu: seq %u block %u%s: load gives %s\n",
              (unsigned long long)cut, i, j, j < acked ? " (acknowledged durable)" : "",
              kvt_strerror(rc));
    if (j < acked) assert_int_equal(rc, 0); /* durable: there, exact */
    if (rc == 0) {
      assert_int_equal(n_exact, sh.n_layers);
      cs->blocks_exact++;
    } else {
      assert_true(missing); /* not durable: exact or a miss, never an error */
      cs->blocks_missing++;
    }
  }
  cs->acked_checked += acked;
  free(tok);
}

static void fsck_report(void *arg, const kvt_key *key, const char *what) {
  (void)key;
  fprintf(stderr, "powercut: cut at record %llu: fsck: %s\n", *(unsigned long long *)arg, what);
}

/* Open the store built at out/st and check it against the model. */
static void verify_cut(const model *m, const char *store, uint64_t seed, uint64_t cut,
                       cut_stats *cs) {
  kvt_options o = pc_opts();
  kvt_engine *e = NULL;
  int rc = kvt_engine_open(store, &o, &e);
  if (rc && !m->opened) { /* the store had never been opened whole */
    fprintf(stderr, "powercut: cut at record %llu, before the first open returned: open gives "
            "%s\n", (unsigned long long)cut, kvt_strerror(rc));
    cs->before_open++;
    return;
  }
  if (rc)
    fprintf(stderr, "powercut: cut at record %llu: open fails: %s\n", (unsigned long long)cut,
            kvt_strerror(rc));
  assert_int_equal(rc, 0);
  kvt_shape sh = pc_shape();
  kvt_ns_id ns = tu_register(e, MODEL, &sh);
  for (uint32_t i = 0; i < m->started; i++) {
    /* With a small tier, released sequences' blocks may be evicted: only
     * the one still referenced keeps what was acknowledged. */
    int held = !g_small || (i + 1 == m->started && !m->released);
    verify_seq(e, ns, seed, i, held ? m->acked[i] : 0, cut, cs);
  }
  kvt_stats st;
  tu_stats(e, &st); /* a refused read is told as a miss: count them apart */
  if (st.cold_checksum_failures)
    fprintf(stderr, "powercut: cut at record %llu: %llu cold reads failed a check\n",
            (unsigned long long)cut, (unsigned long long)st.cold_checksum_failures);
  assert_int_equal(st.cold_checksum_failures, 0);
  kvt_fsck_result fr;
  unsigned long long at = (unsigned long long)cut;
  assert_int_equal(kvt_fsck(e, 0, &fr, fsck_report, &at), 0);
  if (fr.bad) { /* say whether repair would have helped, then fail */
    kvt_fsck_result fr2;
    assert_int_equal(kvt_fsck(e, 1, &fr2, NULL, NULL), 0);
    assert_int_equal(kvt_fsck(e, 0, &fr2, NULL, NULL), 0);
    fprintf(stderr, "powercut: cut at record %llu: fsck finds %llu bad entries (%llu after "
            "repair)\n", at, (unsigned long long)fr.bad, (unsigned long long)fr2.bad);
  }
  assert_int_equal(fr.bad, 0); /* an index entry never points at bytes not durable */
  kvt_engine_close(e);
}

/* ------------------------------------------------------------ the loop */

typedef struct pc_log {
  uint8_t *buf;
  size_t len;
  const pc_rec **r;
  size_t n;
} pc_log;

static void log_read(const char *path, pc_log *lg) {
  memset(lg, 0, sizeof *lg);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  lg->len = (size_t)st.st_size;
  lg->buf = malloc(lg->len + 1);
  assert_non_null(lg->buf);
  for (size_t got = 0; got < lg->len;) {
    ssize_t n = read(fd, lg->buf + got, lg->len - got);
    assert_true(n > 0);
    got += (size_t)n;
  }
  close(fd);
  size_t cap = 0;
  for (size_t off = 0; off < lg->len;) {
    assert_true(off + sizeof(pc_rec) <= lg->len);
    const pc_rec *r = (const pc_rec *)(lg->buf + off);
    uint64_t body = r->path_len + (r->kind == PC_WRITE || r->kind == PC_NOTE ? r->len : 0);
    assert_true(off + sizeof *r + body <= lg->len);
    if (lg->n == cap) {
      cap = cap ? 2 * cap : 1024;
      lg->r = realloc(lg->r, cap * sizeof *lg->r);
      assert_non_null(lg->r);
    }
    lg->r[lg->n++] = r;
    off += sizeof *r + body;
    off = (off + 7) & ~(size_t)7; /* records are written 8-aligned */
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The index of the want-th record of kind in the log. */
static size_t nth_of(const pc_log *lg, uint32_t kind, size_t want) {
  size_t i = 0;
  for (;; i++)
    if (lg->r[i]->kind == kind && want-- == 0) return i;
}

/* Cut points: a quarter anywhere, a quarter just after an
 * acknowledgement (where a sync that did not reach the disk shows), a
 * quarter just before a file's sync (where the most writes are not durable
 * yet), a quarter just before a directory's fsync (new names at stake). */
static void pick_cuts(const pc_log *lg, uint64_t *cuts, uint32_t n) {
  size_t n_notes = 0, n_syncs = 0, n_dirsyncs = 0;
  for (size_t i = 0; i < lg->n; i++) {
    n_notes += lg->r[i]->kind == PC_NOTE;
    n_syncs += lg->r[i]->kind == PC_SYNC;
    n_dirsyncs += lg->r[i]->kind == PC_DIRSYNC;
  }
  for (uint32_t c = 0; c < n; c++) {
    uint32_t how = tu_below(4);
    if (how == 1 && n_notes)
      cuts[c] = nth_of(lg, PC_NOTE, tu_rand() % n_notes) + 1 + tu_below(3);
    else if (how == 2 && n_syncs)
      cuts[c] = nth_of(lg, PC_SYNC, tu_rand() % n_syncs);
    else if (how == 3 && n_dirsyncs)
      cuts[c] = nth_of(lg, PC_DIRSYNC, tu_rand() % n_dirsyncs);
    else
      cuts[c] = tu_rand() % (lg->n + 1);
    if (cuts[c] > lg->n) cuts[c] = lg->n;
  }
  qsort(cuts, n, sizeof *cuts, cmp_u64);
}

static void powercut_run(uint64_t seed, uint32_t n_cuts, cut_stats *cs) {
  char *base = tu_tmpdir(), *logdir = tu_tmpdir(), *outdir = tu_tmpdir();
  char store[600], log_path[600], out_store[600];
  snprintf(store, sizeof store, "%s/st", base);
  snprintf(log_path, sizeof log_path, "%s/log", logdir);
  snprintf(out_store, sizeof out_store, "%s/st", outdir);
  fflush(NULL);
  double t0 = now_s();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(child_main(base, store, log_path, seed));
  int st = cu_wait(pid);
  if (st) fprintf(stderr, "powercut child: exit status %d\n", st);
  assert_int_equal(st, 0);
  double t1 = now_s();
  cs->child_s += t1 - t0;

  pc_log lg;
  if (getenv("KVT_POWERCUT_LOG")) cu_copy_file(log_path, getenv("KVT_POWERCUT_LOG"));
  log_read(log_path, &lg);
  uint64_t *cuts = calloc(n_cuts, sizeof *cuts);
  assert_non_null(cuts);
  pick_cuts(&lg, cuts, n_cuts);
  model m = {.root = base};
  uint64_t rng = tu_rand();
  size_t done = 0;
  for (uint32_t c = 0; c < n_cuts; c++) {
    while (done < cuts[c]) model_apply(&m, lg.r[done++]);
    build_cut(&m, outdir, &rng, cs);
    verify_cut(&m, out_store, seed, cuts[c], cs);
    cs->cuts++;
    if (access(out_store, F_OK) == 0) assert_int_equal(nftw(out_store, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
  }
  cs->cuts_s += now_s() - t1;
  while (done < lg.n) model_apply(&m, lg.r[done++]);
  for (uint32_t i = 0; i < N_SEQ; i++) /* the whole run was acknowledged */
    assert_int_equal(m.acked[i], plan_of(seed, i).sp.n_blocks);
  cs->reclaims += m.reclaims;
  model_free(&m);
  free(cuts);
  free(lg.r);
  free(lg.buf);
  tu_rmtree(base);
  tu_rmtree(logdir);
  tu_rmtree(outdir);
}

static void powercut_loop(uint32_t runs, uint32_t per_run) {
  cut_stats cs = {0};
  for (uint32_t r = 0; r < runs; r++) powercut_run(tu_rand(), per_run, &cs);
  fprintf(stderr,
          "powercut [pread%s]: cuts %llu, acknowledged blocks checked %llu; blocks exact %llu, "
          "missing (not acknowledged) %llu; cuts before the store was open %llu; names lost "
          "%llu; unsynced writes kept %llu, dropped %llu, torn %llu; segments reclaimed %llu "
          "(%.1f s in children, %.1f s checking cuts)\n",
          g_small ? ", small cold tier" : "", (unsigned long long)cs.cuts,
          (unsigned long long)cs.acked_checked,
          (unsigned long long)cs.blocks_exact, (unsigned long long)cs.blocks_missing,
          (unsigned long long)cs.before_open, (unsigned long long)cs.files_lost,
          (unsigned long long)cs.writes_kept, (unsigned long long)cs.writes_dropped,
          (unsigned long long)cs.writes_torn, (unsigned long long)cs.reclaims, cs.child_s, cs.cuts_s);
  assert_true(cs.cuts >= (uint64_t)runs * per_run);
  assert_true(cs.acked_checked > 0);
  assert_true(cs.writes_dropped > 0 && cs.writes_torn > 0);
  if (!g_small) assert_true(cs.files_lost > 0); /* new names were at stake */
  if (g_small) assert_true(cs.reclaims > 0);
}

/* 2 workloads x 100 cuts (10 x 200 with KVT_STRESS=1). */
static void powercut(void **state) {
  (void)state;
  powercut_loop(tu_stress() ? 10 : 2, tu_stress() ? 200 : 100);
}

/* The same with SMALL_SEGS segments: reclaiming and segment reuse under
 * power cuts. 1 x 100 cuts (5 x 200). */
static void powercut_reclaim(void **state) {
  (void)state;
  g_small = 1;
  powercut_loop(tu_stress() ? 5 : 1, tu_stress() ? 200 : 100);
  g_small = 0;
}

int main(void) {
  tu_seed();
  if (getenv("KVT_TEST_FILTER")) cmocka_set_test_filter(getenv("KVT_TEST_FILTER"));
  /* What survives a cut is the recorder's model, not the file system's:
   * on tmpfs the thousands of real fsyncs cost nothing. */
  if (!getenv("TMPDIR") && access("/dev/shm", W_OK) == 0) setenv("TMPDIR", "/dev/shm", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(powercut),
      cmocka_unit_test(powercut_reclaim),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
