/* test_cold_faults.c - the cold tier under injected I/O faults
 * (kvt_options.test_fault, io/fault.c): every kind (EIO, ENOSPC, short,
 * torn write, bit flip) at every call site (segment writes, segment syncs,
 * slice reads), from several call numbers on, once or for good, on both
 * backends. The workload makes the call numbers predictable: 12 distinct
 * token blocks, kvt_sync after each, so block g is group g, its write is
 * write call g+1 and its fdatasync sync call g+1; reads go block by block,
 * layer by layer, so synchronous (block, layer) reads are call 1 + 3 g +
 * layer, and asynchronous loads of a block are one call (a span).
 * What must hold (DESIGN.md section 3, kvtier.h kvt_sync):
 *  - a failed write or sync is reported by the kvt_sync that covers it
 *    (with its -errno), and by every later one while a sequence still
 *    references the block and it is not durable; the block is not durable (kvt_seq_durable stops
 *    before it, cold_write_failures counts it) and after reopening it is
 *    not in the index; appending it again once the fault is gone makes it
 *    durable; nothing durable is lost;
 *  - a torn write or a flipped bit on the way to disk is silent, but a
 *    read of the damaged slice is a miss (counted) and fsck names the
 *    block: never other bytes;
 *  - a failed or damaged read is an error or a miss, never other bytes;
 *  - afterwards the store reopens without faults, fsck is clean once the
 *    damaged entries are gone, and every block reported durable (and not
 *    found damaged) reads back exactly.
 * 3 x 5 kinds x call numbers {1, middle, last} x count {once, for good}
 * per backend by default; every call number with KVT_STRESS=1. */
#include "cold_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_SEQ 3
#define N_BLK 3
#define N_G (N_SEQ * N_BLK)
#define L_MAX 3

enum { SITE_READ = 1, SITE_WRITE = 2, SITE_SYNC = 3 }; /* bit numbers in test_fault.ops */
enum { K_EIO = 1, K_ENOSPC = 2, K_SHORT = 3, K_TORN = 4, K_FLIP = 5 };
static const char *const SITE_NAME[4] = {"", "reads", "writes", "syncs"};
static const char *const KIND_NAME[6] = {"none", "EIO", "ENOSPC", "short", "torn", "flip"};

typedef struct scn {
  uint32_t backend, site, kind;
  uint64_t after, count, seed; /* seed: the fault plan's random parts */
  uint64_t data;               /* seed of the tokens (and so of keys and K/V) */
} scn;

static char g_scn[256]; /* the scenario running, printed with any failure */

#define CHECK(c)                                                                               \
  do {                                                                                         \
    if (!(c)) {                                                                                \
      fprintf(stderr, "%s:%d: check failed: %s\n  scenario: %s\n", __FILE__, __LINE__, #c,    \
              g_scn);                                                                          \
      fail();                                                                                  \
    }                                                                                          \
  } while (0)

/* A layer's K+V is exactly 4 KiB (4 tokens x 2 heads x 128 x bf16, twice),
 * so its slice has no padding: every byte a write carries is checked (the
 * slice by its checksum, the header page by its checksum and its zero
 * padding), and a flipped bit must always be found. */
static kvt_shape shape(void) {
  return (kvt_shape){.n_layers = L_MAX, .n_kv_heads = 2, .head_dim = 128, .dtype = KVT_BF16,
                     .block_tokens = 4};
}

#define MODEL "faulty"

static cu_seqspec spec_of(uint32_t s) { return (cu_seqspec){s, 0, 0, N_BLK}; }

static void tokens_of(const scn *c, uint32_t g, uint32_t *tok) {
  cu_seqspec sp = spec_of(g / N_BLK);
  cu_tokens(c->data, &sp, g % N_BLK, shape().block_tokens, tok);
}

/* Is group (or read) number n (1-based) one the plan faults? */
static int in_plan(const scn *c, uint64_t n) {
  return n >= c->after && (c->count == 0 || n < c->after + c->count);
}

/* What a faulted write-side call does to its group. */
enum { G_OK, G_FAILS, G_MAY_FAIL, G_SILENT };
static int group_effect(const scn *c) {
  if (c->site == SITE_READ) return G_OK;
  if (c->kind == K_EIO || c->kind == K_ENOSPC) return G_FAILS;
  if (c->site == SITE_SYNC) return G_OK; /* only EIO and ENOSPC apply to a sync */
  if (c->kind == K_SHORT) return c->count == 0 ? G_FAILS : G_MAY_FAIL; /* the rest is retried */
  return G_SILENT; /* torn, flip: the write "succeeds" */
}

static kvt_engine *open_store(const char *dir, const scn *c, int faulty) {
  kvt_options o;
  cu_opts(&o, c->backend);
  if (faulty)
    o.test_fault = (kvt_test_fault){.ops = 1u << c->site, .kind = c->kind, .after = c->after,
                                    .count = c->count, .seed = c->seed};
  kvt_engine *e = NULL;
  int rc = kvt_engine_open(dir, &o, &e);
  if (rc) fprintf(stderr, "open: %s\n", kvt_strerror(rc));
  CHECK(rc == 0);
  if (faulty) {
    kvt_stats st;
    tu_stats(e, &st);
    CHECK(strncmp(st.io_backend, "fault+", 6) == 0);
  }
  return e;
}

static kvt_ns_id ns_of(kvt_engine *e) {
  kvt_shape sh = shape();
  return tu_register(e, MODEL, &sh);
}

static int key_of(kvt_engine *e, kvt_ns_id ns, const scn *c, uint32_t g, kvt_key *key) {
  kvt_shape sh = shape();
  cu_seqspec sp = spec_of(g / N_BLK);
  uint32_t j = g % N_BLK, *tok = cu_seq_tokens(c->data, &sp, j + 1, sh.block_tokens);
  kvt_key keys[N_BLK];
  size_t nk;
  int rc = kvt_keys(e, ns, tok, (size_t)(j + 1) * sh.block_tokens, keys, N_BLK, &nk);
  free(tok);
  *key = keys[j];
  return rc;
}

/* ---------------------------------------------------------- phase A */

typedef struct world {
  int durable[N_G];   /* the engine reported it durable (possibly after a retry) */
  int planned[N_G];   /* a faulted write-side call may have been its group's */
} world;

/* Each group makes at least one call of each write-side kind (a write per
 * run of adjacent records, an fdatasync per segment touched; exactly one
 * of each today), so call number n falls in group n - 1 or earlier: a
 * one-off fault can reach only groups 0 .. after-1, and only one of them;
 * a lasting one fails every group from the one it starts in. These bounds,
 * not the exact group, are checked, so that more calls per group (records
 * written in several pieces) do not break the test. */
static int reachable(const scn *c, uint32_t g) { return c->count != 1 || g + 1 <= c->after; }

static int fault_code_ok(const scn *c, int rc) {
  if (c->kind == K_EIO) return rc == -EIO;
  if (c->kind == K_ENOSPC) return rc == -ENOSPC;
  return rc < 0; /* a short write that could not be completed */
}

/* Write the blocks with the fault plan; check what kvt_sync and the
 * durable watermark report; retry the failed blocks by appending them
 * again. Fills w. */
static void phase_write(const char *dir, const scn *c, world *w) {
  memset(w, 0, sizeof *w);
  kvt_engine *e = open_store(dir, c, 1);
  kvt_ns_id ns = ns_of(e);
  kvt_shape sh = shape();
  uint64_t salt = tu_salt(MODEL);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_seq *q[N_SEQ];
  int effect = group_effect(c);
  uint32_t n_ok = 0, n_failed = 0;
  int first_fail = -1;
  for (uint32_t s = 0; s < N_SEQ; s++) {
    CHECK(kvt_seq_create(e, ns, &q[s]) == 0);
    int first_failed = -1;
    for (uint32_t j = 0; j < N_BLK; j++) {
      uint32_t g = s * N_BLK + j, tok[4];
      tokens_of(c, g, tok);
      kvt_append_info info;
      kvt_stats st0, st1;
      /* Counted before the put: the flusher hands a block over as soon as
       * its layers are in, so it may be written before kvt_sync is called
       * (seen under ThreadSanitizer), and a count taken after the put
       * would then call a block written in the background failed. */
      tu_stats(e, &st0);
      CHECK(cu_append_put(q[s], &sh, salt, tok, &kv, &info) == 0);
      CHECK(info.durable == 0);
      int rc = kvt_sync(e); /* the group of this one block */
      tu_stats(e, &st1);
      /* It failed now, or an earlier block did and is still referenced
       * (q[] are all open) and not durable: that error is reported again. */
      int failed = st1.cold_written == st0.cold_written;
      w->planned[g] = effect != G_OK && reachable(c, g);
      if (effect == G_FAILS || effect == G_MAY_FAIL)
        CHECK(rc == 0 || ((w->planned[g] || first_fail >= 0) && fault_code_ok(c, rc)));
      else
        CHECK(rc == 0); /* torn and flipped writes are silent; others do not apply */
      CHECK(!failed || rc != 0);
      CHECK(first_fail < 0 || rc != 0); /* not forgotten */
      if (c->count == 0 && first_fail >= 0) CHECK(rc != 0); /* a lasting fault */
      w->durable[g] = !failed;
      if (failed) {
        n_failed++;
        if (first_failed < 0) first_failed = (int)j;
        if (first_fail < 0) first_fail = (int)g;
      } else {
        n_ok++;
      }
      uint32_t want = first_failed < 0 ? j + 1 : (uint32_t)first_failed;
      CHECK(kvt_seq_durable(q[s]) == want);
    }
  }
  if (c->count == 1) CHECK(n_failed <= 1);
  if (effect == G_FAILS && c->after <= N_G) { /* the faulted call was made */
    CHECK(first_fail >= 0 && (uint64_t)first_fail + 1 <= c->after);
    if (c->count == 1) CHECK(n_failed == 1);
  }
  kvt_stats st;
  tu_stats(e, &st);
  CHECK(st.cold_write_failures == n_failed);
  CHECK(st.cold_written == n_ok);
  CHECK(st.cold_records == n_ok);
  CHECK(st.cold_queued == 0);
  CHECK((kvt_sync(e) != 0) == (n_failed > 0)); /* reported while still referenced */

  /* Append each failed block again (its layers are still in RAM): with a
   * one-off fault it now becomes durable, with a lasting one it fails again. */
  for (uint32_t g = 0; g < N_G; g++) {
    if (w->durable[g]) continue;
    kvt_seq *r;
    CHECK(kvt_seq_create(e, ns, &r) == 0);
    for (uint32_t j = 0; j <= g % N_BLK; j++) {
      uint32_t tok[4];
      kvt_append_info info;
      tokens_of(c, g - g % N_BLK + j, tok);
      CHECK(kvt_seq_append(r, tok, sh.block_tokens, &info) == 0);
      CHECK(info.layers_present == sh.n_layers);
    }
    int rc = kvt_sync(e);
    if (c->count == 1) CHECK(rc == 0);
    else CHECK(rc != 0);
    if (rc == 0) {
      CHECK(kvt_seq_durable(r) == g % N_BLK + 1); /* one-off: the only failure */
      w->durable[g] = 1;
      n_ok++;
    }
    kvt_seq_release(r);
  }
  tu_stats(e, &st);
  CHECK(st.cold_records == n_ok);
  for (uint32_t s = 0; s < N_SEQ; s++) kvt_seq_release(q[s]);
  tu_kv_free(&kv);
  kvt_engine_close(e);
}

/* fsck, collecting the keys it names. */
typedef struct bad_set {
  kvt_key keys[N_G * 2];
  size_t n;
} bad_set;

static void on_bad(void *arg, const kvt_key *key, const char *what) {
  bad_set *b = arg;
  (void)what;
  if (b->n < N_G * 2) b->keys[b->n++] = *key;
}

static int in_set(const bad_set *b, const kvt_key *k) {
  for (size_t i = 0; i < b->n; i++)
    if (cu_key_eq(&b->keys[i], k)) return 1;
  return 0;
}

/* Load every layer of block g. Returns the number of layers that came
 * back exact, and 0..L in *missing (KVT_ENOTFOUND, or KVT_ECORRUPT for
 * the read that found the record bad); anything else fails. */
static uint32_t load_g(kvt_engine *e, kvt_ns_id ns, const scn *c, uint32_t g, uint32_t *missing) {
  kvt_shape sh = shape();
  uint32_t tok[4], n_exact, n_wrong;
  int status[L_MAX];
  kvt_key key;
  CHECK(key_of(e, ns, c, g, &key) == 0);
  tokens_of(c, g, tok);
  cu_load_block(e, ns, &sh, tu_salt(MODEL), &key, g % N_BLK, tok, status, NULL, &n_exact, &n_wrong);
  CHECK(n_wrong == 0); /* never other bytes */
  *missing = 0;
  for (uint32_t l = 0; l < sh.n_layers; l++) {
    CHECK(status[l] == 0 || status[l] == KVT_ENOTFOUND || status[l] == KVT_ECORRUPT);
    *missing += status[l] == KVT_ENOTFOUND || status[l] == KVT_ECORRUPT;
  }
  return n_exact;
}

/* After write-side faults: reopen without faults and check against w. */
static void phase_check_writes(const char *dir, const scn *c, const world *w) {
  kvt_engine *e = open_store(dir, c, 0);
  kvt_ns_id ns = ns_of(e);
  kvt_shape sh = shape();
  int silent = group_effect(c) == G_SILENT;
  bad_set bad = {.n = 0};
  kvt_fsck_result fr;
  CHECK(kvt_fsck(e, 0, &fr, on_bad, &bad) == 0);
  CHECK(fr.bad == bad.n);
  if (c->count == 1) CHECK(bad.n <= 1); /* one faulted call, one record */
  if (c->kind == K_FLIP && c->site == SITE_WRITE && c->after <= N_G) /* it landed: found */
    CHECK(c->count == 1 ? bad.n == 1 : bad.n >= 1);
  uint32_t n_durable = 0, damaged = 0, missed_layers = 0;
  for (uint32_t g = 0; g < N_G; g++) n_durable += (uint32_t)w->durable[g];
  CHECK(fr.checked == n_durable);
  for (uint32_t g = 0; g < N_G; g++) {
    kvt_key key;
    CHECK(key_of(e, ns, c, g, &key) == 0);
    int may_be_damaged = silent && w->planned[g];
    if (in_set(&bad, &key)) CHECK(may_be_damaged); /* fsck blames only what was damaged */
    uint32_t missing, exact = load_g(e, ns, c, g, &missing);
    if (!w->durable[g]) { /* never indexed */
      CHECK(exact == 0 && missing == sh.n_layers);
    } else if (may_be_damaged) {
      if (missing) { /* a damaged slice: a miss, and fsck had named it */
        CHECK(in_set(&bad, &key));
        damaged++;
        missed_layers += missing;
      }
    } else {
      CHECK(exact == sh.n_layers);
    }
  }
  kvt_stats st;
  tu_stats(e, &st);
  /* each damaged block failed a check at least once, at most once a layer */
  CHECK(st.cold_checksum_failures >= damaged && st.cold_checksum_failures <= missed_layers);
  /* Lookups: each sequence is found up to its first block not durable
   * (damaged blocks stay indexed until a read or fsck removes them). */
  for (uint32_t s = 0; s < N_SEQ && !silent; s++) {
    cu_seqspec sp = spec_of(s);
    uint32_t *tok = cu_seq_tokens(c->data, &sp, N_BLK, sh.block_tokens);
    size_t found = 99, want = 0;
    while (want < N_BLK && w->durable[s * N_BLK + want]) want++;
    CHECK(kvt_lookup(e, ns, tok, (size_t)N_BLK * sh.block_tokens, NULL, 0, &found) == 0);
    CHECK(found == want);
    free(tok);
  }
  /* Repair what reads did not already remove; then all is clean. */
  CHECK(kvt_fsck(e, 1, &fr, NULL, NULL) == 0);
  CHECK(fr.removed == fr.bad);
  CHECK(fr.bad <= bad.n);
  kvt_engine_close(e);

  e = open_store(dir, c, 0);
  ns = ns_of(e);
  CHECK(kvt_fsck(e, 0, &fr, NULL, NULL) == 0);
  CHECK(fr.bad == 0);
  for (uint32_t g = 0; g < N_G; g++) {
    uint32_t missing, exact = load_g(e, ns, c, g, &missing);
    if (w->durable[g] && !(silent && w->planned[g])) CHECK(exact == sh.n_layers);
    CHECK(exact == sh.n_layers || missing == sh.n_layers);
  }
  kvt_engine_close(e);
}

/* ------------------------------------------------------- read faults */

/* Read every (block, layer) in order with the read fault plan: seqs 0 and
 * 2 through kvt_seq_read on a new sequence (synchronous reads), seq 1
 * through kvt_load_submit/wait (the asynchronous reader). Each path has
 * its own I/O context and so its own count of read calls; until the first
 * fault a synchronous read is one call, and the asynchronous reader reads
 * a block's layers, small slices one after another on disk, in one call
 * (a span: a fault there strikes every layer it covers). Fills gone[]:
 * the blocks that missed (their entries leave the index). */
static void phase_reads(const char *dir, const scn *c, int *gone) {
  kvt_engine *e = open_store(dir, c, 1);
  kvt_ns_id ns = ns_of(e);
  kvt_shape sh = shape();
  uint64_t salt = tu_salt(MODEL);
  uint64_t calls[2] = {0, 0}; /* read calls so far: [0] kvt_seq_read, [1] loads */
  uint32_t n_gone = 0, n_missed = 0;
  memset(gone, 0, N_G * sizeof *gone);
  for (uint32_t s = 0; s < N_SEQ; s++) {
    int path = s == 1;
    cu_seqspec sp = spec_of(s);
    uint32_t *tok = cu_seq_tokens(c->data, &sp, N_BLK, sh.block_tokens);
    kvt_seq *q = NULL;
    if (!path) CHECK(kvt_seq_create(e, ns, &q) == 0);
    for (uint32_t j = 0; j < N_BLK; j++) {
      uint32_t g = s * N_BLK + j, *t = tok + j * sh.block_tokens;
      int rcs[L_MAX], exact[L_MAX];
      if (!path) {
        kvt_append_info info;
        CHECK(kvt_seq_append(q, t, sh.block_tokens, &info) == 0);
        CHECK(info.durable == 1 && info.layers_present == 0);
        for (uint32_t l = 0; l < sh.n_layers; l++) rcs[l] = cu_read(q, &sh, salt, j, l, t, &exact[l]);
      } else {
        kvt_key key;
        int status[L_MAX];
        uint32_t n_exact, n_wrong;
        CHECK(key_of(e, ns, c, g, &key) == 0);
        cu_load_block(e, ns, &sh, salt, &key, j, t, status, NULL, &n_exact, &n_wrong);
        CHECK(n_wrong == 0);
        for (uint32_t l = 0; l < sh.n_layers; l++) {
          rcs[l] = status[l];
          exact[l] = status[l] == 0; /* n_wrong == 0: every success was exact */
        }
      }
      int block_missed = 0; /* a layer of this block missed before */
      int span_faulted = path ? in_plan(c, ++calls[1]) : 0; /* the block's one read */
      for (uint32_t l = 0; l < sh.n_layers; l++) {
        int rc = rcs[l];
        /* a miss: KVT_ECORRUPT for the read that found the record bad, then
         * KVT_ENOTFOUND (the entry left the index) */
        int miss = rc == KVT_ENOTFOUND || rc == KVT_ECORRUPT;
        CHECK(rc != 0 || exact[l]); /* a success is always the exact bytes */
        CHECK(rc == 0 || miss || rc == -EIO || rc == -ENOSPC);
        if (block_missed) { /* the entry is leaving: a miss, or bytes read before */
          CHECK(rc == 0 || miss);
          if (!path) CHECK(rc == KVT_ENOTFOUND); /* synchronous: it is gone already */
          n_missed += miss;
          continue;
        }
        int faulted = path ? span_faulted : in_plan(c, ++calls[0]);
        if (!faulted || c->kind == K_TORN) CHECK(rc == 0); /* torn applies to writes only */
        else if (c->kind == K_EIO) CHECK(rc == -EIO || miss);
        else if (c->kind == K_ENOSPC) CHECK(rc == -ENOSPC || miss);
        else CHECK(rc == 0 || miss); /* a short read, or a flip */
        if (!path && miss) CHECK(rc == KVT_ECORRUPT); /* the read that found it bad says so */
        if (miss) {
          block_missed = 1;
          n_missed++;
        }
      }
      if (block_missed) {
        gone[g] = 1;
        n_gone++;
      }
    }
    kvt_seq_release(q);
    free(tok);
  }
  kvt_stats st;
  tu_stats(e, &st);
  /* each block that missed failed a check at least once; no more checks
   * failed than there were misses */
  CHECK(st.cold_checksum_failures >= n_gone && st.cold_checksum_failures <= n_missed);
  CHECK(st.cold_records == N_G - n_gone);
  kvt_engine_close(e);

  /* Without faults: what missed is gone for good, the rest is exact (an
   * error such as EIO does not cost a durable block). */
  e = open_store(dir, c, 0);
  ns = ns_of(e);
  kvt_fsck_result fr;
  CHECK(kvt_fsck(e, 0, &fr, NULL, NULL) == 0);
  CHECK(fr.bad == 0);
  CHECK(fr.checked == N_G - n_gone);
  for (uint32_t g = 0; g < N_G; g++) {
    uint32_t missing, exact = load_g(e, ns, c, g, &missing);
    CHECK(gone[g] ? missing == sh.n_layers : exact == sh.n_layers);
  }
  kvt_engine_close(e);
}

/* ---------------------------------------------------------- the matrix */

static void describe(const scn *c) {
  snprintf(g_scn, sizeof g_scn,
           "backend %s, %s fault %s, after %llu, count %llu, fault seed %llu, KVT_SEED=%llu",
           cu_backend_name(c->backend), SITE_NAME[c->site], KIND_NAME[c->kind],
           (unsigned long long)c->after, (unsigned long long)c->count,
           (unsigned long long)c->seed, (unsigned long long)tu_seed());
}

/* A write-side scenario from an empty store; a read-side one on a copy of
 * base (written without faults with the same data seed). */
static void run_scenario(const scn *c, const char *base) {
  describe(c);
  char *tmp = tu_tmpdir(), dir[700];
  snprintf(dir, sizeof dir, "%s/store", tmp);
  world w;
  if (c->site == SITE_READ) {
    CHECK(cu_copy_store(base, dir) == 0);
    int gone[N_G];
    phase_reads(dir, c, gone);
  } else {
    phase_write(dir, c, &w);
    phase_check_writes(dir, c, &w);
  }
  tu_rmtree(tmp);
}

/* Does this kind do anything at this site? (Only EIO and ENOSPC apply to
 * a sync; a torn write is a write.) */
static int applies(uint32_t site, uint32_t kind) {
  if (site == SITE_SYNC) return kind == K_EIO || kind == K_ENOSPC;
  if (site == SITE_READ) return kind != K_TORN;
  return 1;
}

static void fault_matrix(uint32_t backend, uint32_t site) {
  uint64_t last = site == SITE_READ ? (uint64_t)N_G * L_MAX : N_G;
  uint64_t data = tu_rand();
  char *base = NULL;
  if (site == SITE_READ) { /* one store for every read scenario */
    scn c0 = {.backend = backend, .site = SITE_READ, .kind = K_EIO, .after = last + 1, .data = data};
    describe(&c0);
    base = tu_tmpdir();
    world w;
    phase_write(base, &c0, &w);
  }
  uint32_t scenarios = 0;
  for (uint32_t kind = K_EIO; kind <= K_FLIP; kind++) {
    /* call numbers: the first, one in the middle, the last; all with STRESS */
    uint64_t afters[128];
    size_t n_after = 0;
    if (tu_stress()) {
      for (uint64_t a = 1; a <= last; a++) afters[n_after++] = a;
    } else if (!applies(site, kind)) {
      afters[n_after++] = 1; /* must change nothing: once is enough */
    } else {
      afters[n_after++] = 1;
      afters[n_after++] = 2 + tu_below((uint32_t)last - 2);
      afters[n_after++] = last;
    }
    for (size_t a = 0; a < n_after; a++)
      for (uint64_t count = 0; count <= 1; count++) {
        if (count == 0 && afters[a] == last && !tu_stress()) continue; /* same as count 1 */
        if (!applies(site, kind) && count == 1 && !tu_stress()) continue;
        scn c = {.backend = backend, .site = site, .kind = kind, .after = afters[a],
                 .count = count, .seed = tu_rand(), .data = data};
        run_scenario(&c, base);
        scenarios++;
      }
  }
  /* a plan that starts past the last call: nothing fails */
  scn c = {.backend = backend, .site = site, .kind = K_EIO, .after = last + 1, .count = 0,
           .seed = tu_rand(), .data = data};
  run_scenario(&c, base);
  scenarios++;
  fprintf(stderr, "faults[%s, %s]: %u scenarios\n", cu_backend_name(backend), SITE_NAME[site],
          scenarios);
  if (base) tu_rmtree(base);
}

#define MATRIX(site_name, site)                                         \
  static void site_name##_uring(void **state) {                         \
    (void)state;                                                        \
    CU_SKIP_UNLESS_BACKEND(KVT_BACKEND_URING);                          \
    fault_matrix(KVT_BACKEND_URING, site);                              \
  }                                                                     \
  static void site_name##_pread(void **state) {                         \
    (void)state;                                                        \
    fault_matrix(KVT_BACKEND_PREAD, site);                              \
  }

MATRIX(segment_writes, SITE_WRITE)
MATRIX(segment_syncs, SITE_SYNC)
MATRIX(slice_reads, SITE_READ)

/* ---------------------------------------------- overlapping hand-overs */

#define OV_SEQ 4
#define OV_BLK 12

/* Many groups in flight at once (one block a group, nothing synced in
 * between), a write or sync fault from call `after` on, once or for good:
 * kvt_sync() returns 0 only when every block queued since the last one is
 * durable;
 * the durable watermark never counts a block that is not in the index
 * (checked after reopening without faults); a failure is reported by a
 * kvt_sync, not lost. */
static void overlap_run(uint32_t backend, uint32_t site, uint64_t after, uint64_t count) {
  snprintf(g_scn, sizeof g_scn, "overlap: backend %s, %s fault EIO, after %llu, count %llu, "
           "KVT_SEED=%llu", cu_backend_name(backend), SITE_NAME[site], (unsigned long long)after,
           (unsigned long long)count, (unsigned long long)tu_seed());
  char *tmp = tu_tmpdir(), dir[700];
  snprintf(dir, sizeof dir, "%s/store", tmp);
  kvt_options o;
  cu_opts(&o, backend);
  kvt_shape sh = shape();
  o.cold_group_bytes = 1; /* every block its own group: many in flight */
  o.test_fault = (kvt_test_fault){.ops = 1u << site, .kind = K_EIO, .after = after,
                                  .count = count, .seed = tu_rand()};
  kvt_engine *e = NULL;
  CHECK(kvt_engine_open(dir, &o, &e) == 0);
  kvt_ns_id ns = tu_register(e, MODEL, &sh);
  uint64_t salt = tu_salt(MODEL), data = tu_rand();
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_seq *q[OV_SEQ];
  uint32_t *tok[OV_SEQ], durable[OV_SEQ];
  int failures = 0;
  for (uint32_t s = 0; s < OV_SEQ; s++) {
    cu_seqspec sp = {s, 0, 0, OV_BLK};
    tok[s] = cu_seq_tokens(data, &sp, OV_BLK, sh.block_tokens);
    CHECK(kvt_seq_create(e, ns, &q[s]) == 0);
  }
  for (uint32_t half = 0; half < 2; half++) { /* two rounds: append, then one kvt_sync */
    uint32_t from = half * OV_BLK / 2, to = from + OV_BLK / 2;
    for (uint32_t j = from; j < to; j++)
      for (uint32_t s = 0; s < OV_SEQ; s++)
        CHECK(cu_append_put(q[s], &sh, salt, tok[s] + j * sh.block_tokens, &kv, NULL) == 0);
    int rc = kvt_sync(e);
    CHECK(rc == 0 || rc == -EIO);
    failures += rc != 0;
    for (uint32_t s = 0; s < OV_SEQ; s++) {
      durable[s] = kvt_seq_durable(q[s]); /* the leading durable blocks */
      if (failures == 0) CHECK(durable[s] == to); /* everything queued before it */
    }
  }
  if (after > 64) CHECK(failures == 0); /* the plan starts past the last call */
  /* 48 blocks, each its own group: at least 48 writes and 48 syncs, so a
   * plan from call 34 or earlier was reached and failed a group */
  if (after <= 34) CHECK(failures > 0);
  kvt_stats st;
  tu_stats(e, &st);
  if (st.cold_write_failures) CHECK(failures > 0); /* reported, not lost */
  for (uint32_t s = 0; s < OV_SEQ; s++) kvt_seq_release(q[s]);
  kvt_engine_close(e);
  /* Reopened without faults: every block counted durable is there. */
  kvt_options o2;
  cu_opts(&o2, backend);
  CHECK(kvt_engine_open(dir, &o2, &e) == 0);
  ns = tu_register(e, MODEL, &sh);
  for (uint32_t s = 0; s < OV_SEQ; s++) {
    size_t found = 0;
    CHECK(kvt_lookup(e, ns, tok[s], (size_t)OV_BLK * sh.block_tokens, NULL, 0, &found) == 0);
    CHECK(found >= durable[s]);
    free(tok[s]);
  }
  kvt_engine_close(e);
  tu_kv_free(&kv);
  tu_rmtree(tmp);
}

static void overlap_matrix(uint32_t backend) {
  static const uint64_t afters[] = {1, 2, 3, 5, 8, 13, 21, 34, 1000};
  unsigned n = 0;
  for (uint32_t site = SITE_WRITE; site <= SITE_SYNC; site++)
    for (size_t a = 0; a < sizeof afters / sizeof *afters; a++)
      for (uint64_t count = 0; count <= 1; count++, n++) overlap_run(backend, site, afters[a], count);
  fprintf(stderr, "overlap[%s]: %u scenarios\n", cu_backend_name(backend), n);
}

static void overlap_uring(void **state) {
  (void)state;
  CU_SKIP_UNLESS_BACKEND(KVT_BACKEND_URING);
  overlap_matrix(KVT_BACKEND_URING);
}

static void overlap_pread(void **state) {
  (void)state;
  overlap_matrix(KVT_BACKEND_PREAD);
}

int main(void) {
  tu_seed();
  if (getenv("KVT_TEST_FILTER")) cmocka_set_test_filter(getenv("KVT_TEST_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(segment_writes_uring), cmocka_unit_test(segment_writes_pread),
      cmocka_unit_test(segment_syncs_uring),  cmocka_unit_test(segment_syncs_pread),
      cmocka_unit_test(slice_reads_uring),    cmocka_unit_test(slice_reads_pread),
      cmocka_unit_test(overlap_uring),        cmocka_unit_test(overlap_pread),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
