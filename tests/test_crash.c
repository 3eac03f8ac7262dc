/* test_crash.c - kill -9 the writer at random moments and accept only what
 * the durability contract allows (RocksDB's crash test). A forked child
 * opens the store and writes token blocks forever: several sequences,
 * shared prefixes (within a round and across rounds), kvt_sync every few
 * blocks; after each sync it appends to a log, with write() + fsync(), how
 * many leading blocks of its sequence kvt_seq_durable() now reports. The
 * parent SIGKILLs it after a random 0-30 ms or once the log reaches a
 * random length, reopens the store and checks: every block the log calls
 * durable is found by lookup and loads back bit-exact; every other block
 * the child may have written either loads back bit-exact or is a miss,
 * never other bytes; kvt_fsck finds nothing bad. The next round's child
 * goes on writing into the same store (a fresh store every STORE_ROUNDS
 * rounds keeps verification cheap). 200 kills with an io_uring child and
 * 100 with a pread child by default (200 when io_uring is unavailable),
 * 2000 each with KVT_STRESS=1; and 100 (1000) more with a cold tier so
 * small that segments are reclaimed, and referenced blocks relocated,
 * while children are killed: there the child keeps its sequences open
 * (up to HOLD_BLOCKS blocks, logging each release), so every sequence it
 * still held when killed must keep all its acknowledged blocks, evicted
 * or not being the policy's choice only for what nothing referenced. At
 * least a quarter of the kills must land while the child is writing
 * blocks (after its first sequence started). KVT_TEST_FILTER=crash_reclaim (a cmocka
 * pattern) runs one variant. The parent verifies with either backend.
 * The seed is printed (KVT_SEED replays the workload and the choice of
 * kill moments; where the kill lands is timing). */
#include "cold_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STORE_ROUNDS 8
#define N_NS 2
#define N_FAM 6
#define MAX_SEQ_BLOCKS 7
#define MAX_LOG_SEQS 4096

static const char *const MODELS[N_NS] = {"crash-bf16", "crash-f16"};
static int g_reclaim; /* the variant running: a small cold tier */

static kvt_shape ns_shape(int i) {
  if (i == 0)
    return (kvt_shape){.n_layers = 3, .n_kv_heads = 2, .head_dim = 16, .dtype = KVT_BF16,
                       .block_tokens = 4};
  return (kvt_shape){.n_layers = 2, .n_kv_heads = 1, .head_dim = 32, .dtype = KVT_F16,
                     .block_tokens = 8};
}

/* Sequence i of round r: which namespace, and its spec. Families and
 * branches repeat across rounds, so later rounds append blocks that are
 * durable already. */
typedef struct plan {
  int ns;
  cu_seqspec sp;
  uint32_t sync_every; /* kvt_sync after every this many blocks */
} plan;

static plan plan_of(uint64_t seed, uint32_t round, uint32_t i) {
  uint64_t h = tu_mix(seed ^ tu_mix(((uint64_t)round << 32) ^ i ^ 0xC0FFEEull));
  plan p;
  p.ns = (int)(h & 1);
  p.sp.fam = (uint32_t)(h >> 8) % N_FAM;
  p.sp.branch = (uint32_t)(h >> 16) % (g_reclaim ? 256 : 4); /* small tier: more to write */
  p.sp.shared = 1 + p.sp.fam % 3;
  p.sp.n_blocks = 2 + (uint32_t)(h >> 24) % (MAX_SEQ_BLOCKS - 1);
  p.sync_every = 1 + (uint32_t)(h >> 40) % 4;
  return p;
}

/* The log: 16-byte records. 'S': the child starts sequence seq (write
 * only: a kill does not lose page-cache writes). 'D': after kvt_sync
 * returned 0, kvt_seq_durable() of sequence seq said `durable`
 * (write + fsync before the child goes on). 'R': the child is about to
 * release sequence seq (written before the release, so a sequence the log
 * does not call released was still referenced at the kill). */
typedef struct logrec {
  uint32_t kind, round, seq, durable;
} logrec;

static int log_put(int fd, uint32_t kind, uint32_t round, uint32_t seq, uint32_t durable) {
  logrec r = {kind, round, seq, durable};
  if (write(fd, &r, sizeof r) != (ssize_t)sizeof r) return -1;
  return kind == 'D' ? fsync(fd) : 0;
}

/* The small-tier variant: RECLAIM_SEGS segments (one of them the spare),
 * so segments are reclaimed every few rounds; the other variants never
 * fill their store. */
#define RECLAIM_SEGS 3
#define RECLAIM_STORE_ROUNDS 25
/* Blocks the child keeps referenced: well under the room of the small
 * tier (two 1 MiB segments of records of 12-16 KiB), so keeping them never
 * leaves every block referenced (KVT_EFULL). */
#define HOLD_BLOCKS 32u
#define HOLD_SEQS 16u

static kvt_options crash_opts(uint32_t backend) {
  kvt_options o;
  cu_opts(&o, backend);
  o.cold_group_bytes = 64u << 10; /* several groups per sync now and then */
  if (g_reclaim) o.tier_bytes_limit[KVT_TIER_COLD] = RECLAIM_SEGS * o.cold_segment_bytes;
  return o;
}

/* --------------------------------------------------------------- child */

/* The cold tier's declines so far: under the learned order (the default)
 * a full tier may decline a block it predicts unused; it is not written,
 * kvt_sync() returns 0 and the sequence's durable watermark stops before
 * it (kvtier.h, cold_evict) - the small tier of crash_reclaim is full. */
static uint64_t cold_declined(kvt_engine *e) {
  kvt_tier_stats ts;
  return kvt_stats_tier(e, KVT_TIER_COLD, &ts, sizeof ts) ? 0 : ts.declined;
}

/* A sequence's watermark across its syncs (durable_ok). */
typedef struct dur_state {
  uint64_t declined; /* the tier's declines at the last sync (or the start) */
  uint32_t last_d;   /* the watermark then */
  int stopped;       /* it stopped short: a block was declined */
} dur_state;

static dur_state dur_start(kvt_engine *e) { return (dur_state){cold_declined(e), 0, 0}; }

/* After a sync, is d the durable watermark the contract allows for a
 * sequence of n complete blocks? All n; or, only in the small tier of
 * crash_reclaim (the others never fill), short of n when the tier
 * declined a block since the last sync, with no error, not below the
 * watermark then - and from there on it stays where it stopped. */
static int durable_ok(kvt_engine *e, const kvt_seq *s, uint32_t d, uint32_t n, dur_state *ds) {
  uint64_t declined = cold_declined(e);
  int ok;
  if (ds->stopped) ok = d == ds->last_d;
  else if (d == n) ok = 1;
  else
    ok = g_reclaim && d < n && d >= ds->last_d && declined > ds->declined &&
         kvt_seq_durable_error(s, NULL) == 0;
  ds->stopped |= d != n;
  ds->declined = declined;
  ds->last_d = d;
  return ok;
}

/* Exit codes tell the parent what went wrong before it was killed. */
enum { C_OPEN = 10, C_REGISTER, C_SEQ, C_APPEND, C_SYNC, C_DURABLE, C_LOG };

static int child_main(const char *dir, const char *log_path, uint32_t backend, uint64_t seed,
                      uint32_t round) {
  int lfd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (lfd < 0) return C_LOG;
  kvt_options o = crash_opts(backend);
  kvt_engine *e = NULL;
  int rc = kvt_engine_open(dir, &o, &e);
  if (rc) {
    fprintf(stderr, "crash child: open: %s\n", kvt_strerror(rc));
    return C_OPEN;
  }
  kvt_ns_id ids[N_NS];
  kvt_shape sh[N_NS];
  tu_kv kv[N_NS];
  for (int i = 0; i < N_NS; i++) {
    sh[i] = ns_shape(i);
    kvt_ns_desc d = tu_desc(MODELS[i], &sh[i]);
    if (kvt_ns_register(e, &d, &ids[i])) return C_REGISTER;
    tu_kv_alloc(&kv[i], &sh[i]);
  }
  kvt_seq *held[HOLD_SEQS];
  uint32_t held_blocks[HOLD_SEQS], held_id[HOLD_SEQS], n_held = 0, n_blocks_held = 0;
  for (uint32_t i = 0;; i++) { /* until killed */
    plan p = plan_of(seed, round, i);
    /* release the oldest sequences held until this one fits the hold */
    while (n_held && (n_held == HOLD_SEQS || n_blocks_held + p.sp.n_blocks > HOLD_BLOCKS)) {
      if (log_put(lfd, 'R', round, held_id[0], 0)) return C_LOG;
      kvt_seq_release(held[0]);
      n_blocks_held -= held_blocks[0];
      n_held--;
      memmove(held, held + 1, n_held * sizeof *held);
      memmove(held_blocks, held_blocks + 1, n_held * sizeof *held_blocks);
      memmove(held_id, held_id + 1, n_held * sizeof *held_id);
    }
    if (log_put(lfd, 'S', round, i, 0)) return C_LOG;
    kvt_seq *s;
    dur_state ds = dur_start(e);
    if (kvt_seq_create(e, ids[p.ns], &s)) return C_SEQ;
    uint32_t bt = sh[p.ns].block_tokens;
    for (uint32_t j = 0; j < p.sp.n_blocks; j++) {
      uint32_t tok[64];
      cu_tokens(seed, &p.sp, j, bt, tok);
      if ((rc = cu_append_put(s, &sh[p.ns], tu_salt(MODELS[p.ns]), tok, &kv[p.ns], NULL))) {
        fprintf(stderr, "crash child: append/put: %s\n", kvt_strerror(rc));
        return C_APPEND;
      }
      if ((j + 1) % p.sync_every != 0 && j + 1 != p.sp.n_blocks) continue;
      if ((rc = kvt_sync(e))) {
        fprintf(stderr, "crash child: kvt_sync: %s\n", kvt_strerror(rc));
        return C_SYNC;
      }
      uint32_t d = kvt_seq_durable(s);
      /* every completed block is durable after a sync (or declined) */
      if (!durable_ok(e, s, d, j + 1, &ds)) {
        fprintf(stderr, "crash child: round %u seq %u: durable %u after %u blocks\n", round, i, d,
                j + 1);
        return C_DURABLE;
      }
      if (log_put(lfd, 'D', round, i, d)) return C_LOG;
    }
    held[n_held] = s;
    held_blocks[n_held] = p.sp.n_blocks;
    held_id[n_held++] = i;
    n_blocks_held += p.sp.n_blocks;
  }
}

/* -------------------------------------------------------------- parent */

typedef struct round_log {
  uint32_t started;   /* sequences started: 0 .. started-1 */
  uint32_t durable[MAX_LOG_SEQS];
  uint8_t released[MAX_LOG_SEQS];
} round_log;

static void read_log(const char *path, uint32_t round, round_log *rl) {
  memset(rl, 0, sizeof *rl);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return; /* killed before it opened the log */
  logrec r;
  while (read(fd, &r, sizeof r) == (ssize_t)sizeof r) {
    assert_int_equal(r.round, round);
    assert_true(r.seq < MAX_LOG_SEQS);
    if (r.kind == 'S') {
      assert_int_equal(r.seq, rl->started); /* in order */
      rl->started = r.seq + 1;
    } else if (r.kind == 'R') {
      assert_true(r.seq < rl->started && !rl->released[r.seq]);
      rl->released[r.seq] = 1;
    } else {
      assert_int_equal(r.kind, 'D');
      assert_true(r.seq + 1 == rl->started);
      assert_true(r.durable >= rl->durable[r.seq]);
      rl->durable[r.seq] = r.durable;
    }
  }
  close(fd);
}

typedef struct crash_stats {
  uint64_t kills, rounds, durable_checked, blocks_exact, blocks_missing, loads;
  uint64_t kills_writing; /* kills after the child had started a sequence */
  uint64_t held_checked;  /* sequences held at a kill (small tier): all their blocks checked */
  uint64_t shrinks; /* rounds after which the index held fewer blocks than before */
} crash_stats;

/* Check the sequences of one finished round against its log. full: load
 * every block the child may have written, else only the durable ones.
 * With a small cold tier (g_reclaim) blocks that no sequence references
 * may be evicted to make room, so the sequences the child still held when
 * it was killed (those of the last round the log does not call released)
 * must keep their durable blocks; every other block is exact or a miss. */
static void verify_round(kvt_engine *e, const kvt_ns_id *ids, uint64_t seed, uint32_t round,
                         const round_log *rl, int full, int last_round, crash_stats *cs) {
  for (uint32_t i = 0; i < rl->started; i++) {
    plan p = plan_of(seed, round, i);
    kvt_shape sh = ns_shape(p.ns);
    uint32_t bt = sh.block_tokens, nb = p.sp.n_blocks, dur = rl->durable[i];
    if (g_reclaim && !(last_round && !rl->released[i])) dur = 0; /* may be evicted */
    if (g_reclaim && dur) cs->held_checked++;
    uint32_t *tok = cu_seq_tokens(seed, &p.sp, nb, bt);
    kvt_key keys[MAX_SEQ_BLOCKS];
    size_t nk = 0, found = 0;
    assert_int_equal(kvt_keys(e, ids[p.ns], tok, (size_t)nb * bt, keys, MAX_SEQ_BLOCKS, &nk), 0);
    assert_int_equal(kvt_lookup(e, ids[p.ns], tok, (size_t)nb * bt, NULL, 0, &found), 0);
    if (found < dur) { /* say which blocks are gone before failing */
      fprintf(stderr, "round %u seq %u (%s, fam %u branch %u shared %u): lookup found %zu, log says %u durable\n",
              round, i, MODELS[p.ns], p.sp.fam, p.sp.branch, p.sp.shared, found, dur);
      for (uint32_t j = 0; j < nb; j++) {
        uint32_t n_exact, n_wrong;
        int rc = cu_load_block(e, ids[p.ns], &sh, tu_salt(MODELS[p.ns]), &keys[j], j, tok + j * bt,
                               NULL, NULL, &n_exact, &n_wrong);
        fprintf(stderr, "  block %u: load %s (%u layers exact)%s\n", j, kvt_strerror(rc), n_exact,
                j < p.sp.shared ? " [shared prefix]" : "");
      }
    }
    assert_true(found >= dur);
    cs->durable_checked += dur;
    uint32_t upto = full ? nb : dur;
    for (uint32_t j = 0; j < upto; j++) {
      int status[8];
      uint32_t n_exact, n_wrong;
      int rc = cu_load_block(e, ids[p.ns], &sh, tu_salt(MODELS[p.ns]), &keys[j], j, tok + j * bt,
                             status, NULL, &n_exact, &n_wrong);
      cs->loads += sh.n_layers;
      if (n_wrong) fprintf(stderr, "round %u seq %u block %u: %u layers WRONG\n", round, i, j, n_wrong);
      assert_int_equal(n_wrong, 0); /* never other bytes */
      if (j < dur && rc)
        fprintf(stderr, "round %u seq %u block %u: durable but load gives %s\n", round, i, j,
                kvt_strerror(rc));
      if (j < dur) assert_int_equal(rc, 0); /* durable: there, exact */
      if (rc == 0) {
        assert_int_equal(n_exact, sh.n_layers);
        cs->blocks_exact++;
      } else {
        for (uint32_t l = 0; l < sh.n_layers; l++) assert_int_equal(status[l], KVT_ENOTFOUND);
        cs->blocks_missing++;
      }
    }
    free(tok);
  }
}

/* Small cold tier: the parent writes FILL_BLOCKS blocks of its own each
 * round (released at once, so evictable), so the store fills and segments
 * are reclaimed whatever the children managed to write. */
#define FILL_BLOCKS 16

static void fill(kvt_engine *e, kvt_ns_id ns, uint32_t round) {
  kvt_shape sh = ns_shape(0);
  cu_seqspec sp = {N_FAM + 1, round, 0, FILL_BLOCKS};
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_seq *s;
  dur_state ds = dur_start(e);
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  for (uint32_t j = 0; j < FILL_BLOCKS; j++) {
    uint32_t tok[4];
    cu_tokens(0xF111, &sp, j, sh.block_tokens, tok);
    assert_int_equal(cu_append_put(s, &sh, tu_salt(MODELS[0]), tok, &kv, NULL), 0);
  }
  assert_int_equal(kvt_sync(e), 0);
  assert_true(durable_ok(e, s, kvt_seq_durable(s), FILL_BLOCKS, &ds));
  kvt_seq_release(s);
  tu_kv_free(&kv);
}

/* Sleep us microseconds. */
static void sleep_us(uint64_t us) {
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static off_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : 0;
}

/* Run the child for round r and kill it. Returns 1 when killed. */
static int run_child(const char *dir, const char *log_path, uint32_t backend, uint64_t seed,
                     uint32_t round) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(child_main(dir, log_path, backend, seed, round));
  if (tu_below(2)) {
    sleep_us(tu_below(30001));
  } else { /* once the log holds n records (or 3 s passed) */
    off_t want = (off_t)((1 + tu_below(16)) * sizeof(logrec)); /* it has started writing */
    for (int waited = 0; waited < 15000 && file_size(log_path) < want; waited++) {
      int st;
      if (waitpid(pid, &st, WNOHANG) == pid) { /* it stopped by itself: an error */
        fprintf(stderr, "crash child exited early: status %d\n", WEXITSTATUS(st));
        fail();
      }
      sleep_us(200);
    }
    sleep_us(tu_below(2000));
  }
  kill(pid, SIGKILL);
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  if (WIFEXITED(st)) fprintf(stderr, "crash child exited: status %d\n", WEXITSTATUS(st));
  assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  return 1;
}

static void crash_loop(uint32_t backend, uint32_t kills) {
  uint64_t seed = tu_rand();
  char *base = tu_tmpdir();
  char dir[600], log_path[700];
  crash_stats cs = {0};
  uint32_t store_rounds = g_reclaim ? RECLAIM_STORE_ROUNDS : STORE_ROUNDS;
  round_log *logs = calloc(store_rounds, sizeof *logs);
  assert_non_null(logs);
  struct timespec t0, t1;
  double child_s = 0;
  uint64_t prev_records = 0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (uint32_t round = 0; round < kills; round++) {
    uint32_t life = round % store_rounds; /* rounds so far on this store */
    snprintf(dir, sizeof dir, "%s/store-%u", base, round / store_rounds);
    snprintf(log_path, sizeof log_path, "%s/log-%u", base, round);
    struct timespec ta, tb;
    clock_gettime(CLOCK_MONOTONIC, &ta);
    cs.kills += (uint64_t)run_child(dir, log_path, backend, seed, round);
    clock_gettime(CLOCK_MONOTONIC, &tb);
    child_s += (double)(tb.tv_sec - ta.tv_sec) + (double)(tb.tv_nsec - ta.tv_nsec) * 1e-9;
    cs.rounds++;
    read_log(log_path, round, &logs[life]);
    cs.kills_writing += logs[life].started > 0;
    unlink(log_path);

    /* Reopen (the other backend now and then) and check every round of
     * this store: the last two in full, older ones their durable blocks. */
    uint32_t other = backend == KVT_BACKEND_PREAD ? KVT_BACKEND_AUTO : KVT_BACKEND_PREAD;
    uint32_t vb = tu_below(2) ? backend : other;
    kvt_options o = crash_opts(vb);
    kvt_engine *e = tu_open(dir, &o);
    kvt_ns_id ids[N_NS];
    for (int i = 0; i < N_NS; i++) {
      kvt_shape sh = ns_shape(i);
      ids[i] = tu_register(e, MODELS[i], &sh);
    }
    for (uint32_t k = 0; k <= life; k++)
      verify_round(e, ids, seed, round - life + k, &logs[k], k + 2 > life, k == life, &cs);
    kvt_fsck_result fr;
    kvt_stats st;
    assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
    tu_stats(e, &st);
    if (fr.bad) fprintf(stderr, "round %u: fsck finds %llu bad\n", round, (unsigned long long)fr.bad);
    assert_int_equal(fr.bad, 0);
    assert_int_equal(fr.checked, st.cold_records);
    assert_int_equal(st.cold_checksum_failures, 0);
    if (g_reclaim) { /* evidence that reclaiming ran: the index shrank */
      assert_true(st.cold_segments <= RECLAIM_SEGS);
      cs.shrinks += life && st.cold_records < prev_records;
      fill(e, ids[0], round);
      tu_stats(e, &st);
      prev_records = st.cold_records;
    }
    kvt_engine_close(e);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  fprintf(stderr,
          "crash[%s%s]: %llu kills in %llu rounds, %.1f s (%.1f s in children); durable blocks "
          "checked %llu, blocks exact %llu, missing (not durable) %llu, layer loads %llu; "
          "kills while writing %llu\n",
          cu_backend_name(backend), g_reclaim ? ", small cold tier" : "",
          (unsigned long long)cs.kills, (unsigned long long)cs.rounds, secs, child_s, (unsigned long long)cs.durable_checked,
          (unsigned long long)cs.blocks_exact, (unsigned long long)cs.blocks_missing,
          (unsigned long long)cs.loads, (unsigned long long)cs.kills_writing);
  if (g_reclaim)
    fprintf(stderr, "crash: the index shrank after %llu rounds; %llu sequences held at a kill "
            "checked whole\n", (unsigned long long)cs.shrinks, (unsigned long long)cs.held_checked);
  assert_int_equal(cs.kills, kills);
  assert_true(cs.kills_writing >= kills / 4); /* most kills hit a child writing blocks */
  if (g_reclaim) assert_true(cs.held_checked > cs.kills_writing); /* more than one a kill */
  if (g_reclaim) assert_true(cs.shrinks > 0); /* segments were reclaimed */
  assert_true(cs.durable_checked > 0); /* the kills did not all come too early */
  free(logs);
  tu_rmtree(base);
}

/* 200 kills (2000 with KVT_STRESS=1) with the default backend's child;
 * the pread variant does half as many, or as many when io_uring is not
 * available here and the first variant was skipped. */
static void crash_uring(void **state) {
  (void)state;
  CU_SKIP_UNLESS_BACKEND(KVT_BACKEND_URING);
  crash_loop(KVT_BACKEND_URING, tu_stress() ? 2000 : 200);
}

static void crash_pread(void **state) {
  (void)state;
  crash_loop(KVT_BACKEND_PREAD, tu_stress() ? 2000 : cu_uring_ok(NULL) ? 100 : 200);
}

/* The same with a cold tier of RECLAIM_SEGS segments: the child's writes
 * (and the parent's fill()) keep reclaiming segments, evicting
 * unreferenced blocks and rewriting the referenced ones, while the child
 * is killed. 100 kills (1000 with KVT_STRESS=1). */
static void crash_reclaim(void **state) {
  (void)state;
  g_reclaim = 1;
  crash_loop(cu_uring_ok(NULL) ? KVT_BACKEND_URING : KVT_BACKEND_PREAD, tu_stress() ? 1000 : 100);
  g_reclaim = 0;
}

int main(void) {
  tu_seed();
  if (getenv("KVT_TEST_FILTER")) cmocka_set_test_filter(getenv("KVT_TEST_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(crash_uring),
      cmocka_unit_test(crash_pread),
      cmocka_unit_test(crash_reclaim),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
