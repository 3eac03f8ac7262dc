/* test_rebuild.c - the cold tier's index is not a single point of
 * failure, and what it says of a block is checked field by field.
 *  - rebuild_after_kills: a child writing token blocks is killed (SIGKILL)
 *    a few times over one store, logging after each kvt_sync which blocks
 *    are durable; then the index is deleted, later overwritten with
 *    garbage: opening says KVT_EINDEX, kvt_store_rebuild_index() makes a
 *    new one, and every block acknowledged durable loads back bit-exact,
 *    the namespaces come back, fsck is clean and writing goes on.
 *  - fsck_checks_fields: index entries with a damaged dtype, bytes_each,
 *    chain position or an unaligned offset are found by kvt_fsck (which
 *    names the field), removed by repair; a load of the unaligned one is
 *    KVT_ECORRUPT, not -EINVAL.
 *  - corrupt_slice_names_layer: fsck names the segment and the layer of a
 *    damaged slice, and a load of it is KVT_ECORRUPT, then a miss.
 * The seed is printed; KVT_SEED replays it (where a kill lands is timing). */
#include "cold_util.h"

#include <lmdb.h>
#include <signal.h>
#include <time.h>

#define N_NS 2
#define ROUNDS 6
#define MAX_SEQ_BLOCKS 6
#define MAX_LOG 4096

static const char *const MODELS[N_NS] = {"rebuild-f16", "rebuild-bf16"};

static kvt_shape ns_shape(int i) {
  if (i == 0)
    return (kvt_shape){.n_layers = 3, .n_kv_heads = 2, .head_dim = 16, .dtype = KVT_F16,
                       .block_tokens = 4};
  return (kvt_shape){.n_layers = 2, .n_kv_heads = 1, .head_dim = 32, .dtype = KVT_BF16,
                     .block_tokens = 8};
}

typedef struct plan {
  int ns;
  cu_seqspec sp;
  uint32_t sync_every;
} plan;

/* Sequence i of round r; families repeat, so rounds share prefixes. */
static plan plan_of(uint64_t seed, uint32_t round, uint32_t i) {
  uint64_t h = tu_mix(seed ^ tu_mix(((uint64_t)round << 32) ^ i ^ 0xB10Cull));
  plan p;
  p.ns = (int)(h & 1);
  p.sp.fam = (uint32_t)(h >> 8) % 5;
  p.sp.branch = (uint32_t)(h >> 16) % 16;
  p.sp.shared = 1 + p.sp.fam % 3;
  p.sp.n_blocks = 2 + (uint32_t)(h >> 24) % (MAX_SEQ_BLOCKS - 1);
  p.sync_every = 1 + (uint32_t)(h >> 40) % 3;
  return p;
}

static kvt_options store_opts(void) {
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  o.cold_group_bytes = 64u << 10;
  return o;
}

/* ------------------------------------------------------------ child */

/* After each kvt_sync: u32 round, u32 seq, u32 durable (write + fsync). */
static int child_main(const char *dir, const char *log_path, uint64_t seed, uint32_t round) {
  int lfd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (lfd < 0) return 10;
  kvt_options o = store_opts();
  kvt_engine *e = NULL;
  if (kvt_engine_open(dir, &o, &e)) return 11;
  kvt_ns_id ids[N_NS];
  kvt_shape sh[N_NS];
  tu_kv kv[N_NS];
  for (int i = 0; i < N_NS; i++) {
    sh[i] = ns_shape(i);
    kvt_ns_desc d = tu_desc(MODELS[i], &sh[i]);
    if (kvt_ns_register(e, &d, &ids[i])) return 12;
    tu_kv_alloc(&kv[i], &sh[i]);
  }
  for (uint32_t i = 0;; i++) { /* until killed */
    plan p = plan_of(seed, round, i);
    kvt_seq *s;
    if (kvt_seq_create(e, ids[p.ns], &s)) return 13;
    uint32_t bt = sh[p.ns].block_tokens;
    for (uint32_t j = 0; j < p.sp.n_blocks; j++) {
      uint32_t tok[8];
      cu_tokens(seed, &p.sp, j, bt, tok);
      if (cu_append_put(s, &sh[p.ns], tu_salt(MODELS[p.ns]), tok, &kv[p.ns], NULL)) return 14;
      if ((j + 1) % p.sync_every && j + 1 != p.sp.n_blocks) continue;
      if (kvt_sync(e)) return 15;
      uint32_t rec[3] = {round, i, kvt_seq_durable(s)};
      if (rec[2] != j + 1) return 16;
      if (write(lfd, rec, sizeof rec) != (ssize_t)sizeof rec || fsync(lfd)) return 17;
    }
    kvt_seq_release(s);
  }
}

/* ----------------------------------------------------------- parent */

typedef struct ack {
  uint32_t round, seq, durable;
} ack;

static void sleep_us(uint64_t us) {
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static off_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : 0;
}

/* Run round r's child until its log holds a few acknowledgements (or a
 * random moment), SIGKILL it, and add what it acknowledged to acks. */
static void run_child(const char *dir, const char *log_path, uint64_t seed, uint32_t round,
                      ack *acks, size_t *n_acks) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(child_main(dir, log_path, seed, round));
  off_t want = (off_t)((2 + tu_below(12)) * 3 * sizeof(uint32_t));
  for (int waited = 0; waited < 15000 && file_size(log_path) < want; waited++) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      fprintf(stderr, "rebuild child exited early: status %d\n", WEXITSTATUS(st));
      fail();
    }
    sleep_us(200);
  }
  sleep_us(tu_below(3000));
  kill(pid, SIGKILL);
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  int fd = open(log_path, O_RDONLY | O_CLOEXEC);
  assert_true(fd >= 0);
  uint32_t rec[3];
  while (read(fd, rec, sizeof rec) == (ssize_t)sizeof rec) {
    assert_true(*n_acks < MAX_LOG);
    acks[(*n_acks)++] = (ack){rec[0], rec[1], rec[2]};
  }
  close(fd);
  unlink(log_path);
}

typedef struct seen {
  kvt_key key;
  int exact;                   /* every layer loaded back bit-exact */
} seen;

static int cmp_seen(const void *a, const void *b) {
  const seen *x = a, *y = b;
  int c = memcmp(x->key.b, y->key.b, 16);
  return c ? c : (x->exact > y->exact) - (x->exact < y->exact); /* a failure sorts first */
}

/* Open the store and check every acknowledged block: found by lookup and
 * bit-exact in every layer; both namespaces listed; fsck clean. Prints
 * and returns how many distinct blocks came back. */
static size_t verify_acks(const char *dir, uint64_t seed, const ack *acks, size_t n_acks,
                          const char *when) {
  kvt_options o = store_opts();
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ids[N_NS];
  int listed = 0;
  for (uint32_t i = 0;; i++) { /* the namespaces came back with the index */
    kvt_ns_id id;
    kvt_ns_desc d;
    if (kvt_ns_get(e, i, &id, &d) == KVT_ENOTFOUND) break;
    for (int k = 0; k < N_NS; k++) listed += !strcmp(d.model_id, MODELS[k]);
  }
  assert_int_equal(listed, N_NS);
  for (int i = 0; i < N_NS; i++) {
    kvt_shape sh = ns_shape(i);
    ids[i] = tu_register(e, MODELS[i], &sh);
  }
  seen *keys = calloc(n_acks * MAX_SEQ_BLOCKS + 1, sizeof *keys);
  assert_non_null(keys);
  size_t n_keys = 0, recovered = 0, acknowledged = 0;
  for (size_t a = 0; a < n_acks; a++) {
    plan p = plan_of(seed, acks[a].round, acks[a].seq);
    kvt_shape sh = ns_shape(p.ns);
    uint32_t bt = sh.block_tokens, d = acks[a].durable;
    uint32_t *tok = cu_seq_tokens(seed, &p.sp, d, bt);
    kvt_key k[MAX_SEQ_BLOCKS];
    size_t nk = 0, found = 0;
    assert_int_equal(kvt_keys(e, ids[p.ns], tok, (size_t)d * bt, k, MAX_SEQ_BLOCKS, &nk), 0);
    assert_int_equal(kvt_lookup(e, ids[p.ns], tok, (size_t)d * bt, NULL, 0, &found), 0);
    if (found < d)
      fprintf(stderr, "%s: round %u seq %u: lookup finds %zu of %u durable blocks\n", when,
              acks[a].round, acks[a].seq, found, d);
    for (uint32_t j = 0; j < d; j++) {
      uint32_t n_exact, n_wrong;
      int rc = cu_load_block(e, ids[p.ns], &sh, tu_salt(MODELS[p.ns]), &k[j], j, tok + j * bt,
                             NULL, NULL, &n_exact, &n_wrong);
      assert_int_equal(n_wrong, 0); /* never other bytes */
      keys[n_keys++] = (seen){k[j], rc == 0 && n_exact == sh.n_layers && j < found};
    }
    free(tok);
  }
  qsort(keys, n_keys, sizeof *keys, cmp_seen);
  for (size_t i = 0; i < n_keys; i++)
    if (i == 0 || memcmp(keys[i].key.b, keys[i - 1].key.b, 16)) { /* the first of each key */
      acknowledged++;
      recovered += keys[i].exact;
    }
  kvt_fsck_result fr;
  kvt_stats st;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  tu_stats(e, &st);
  assert_int_equal(fr.bad, 0);
  assert_int_equal(fr.checked, st.cold_records);
  fprintf(stderr, "%s: blocks recovered %zu / acknowledged %zu (index holds %llu)\n", when,
          recovered, acknowledged, (unsigned long long)st.cold_records);
  assert_true(acknowledged > 0);
  assert_int_equal(recovered, acknowledged);
  kvt_engine_close(e);
  free(keys);
  return recovered;
}

static uint64_t index_records(const char *dir) {
  kvt_options o = store_opts();
  o.flags |= KVT_OPEN_RDONLY;
  kvt_engine *e = tu_open(dir, &o);
  kvt_stats st;
  tu_stats(e, &st);
  kvt_engine_close(e);
  return st.cold_records;
}

/* Opening, writer or reader, says the index is the problem. */
static void assert_index_refused(const char *dir) {
  kvt_options o = store_opts();
  kvt_engine *e = NULL;
  assert_int_equal(kvt_engine_open(dir, &o, &e), KVT_EINDEX);
  assert_null(e);
  o.flags |= KVT_OPEN_RDONLY;
  assert_int_equal(kvt_engine_open(dir, &o, &e), KVT_EINDEX);
  assert_non_null(strstr(kvt_strerror(KVT_EINDEX), "--rebuild-index"));
}

static void overwrite_garbage(const char *path, uint64_t seed) {
  int fd = open(path, O_RDWR | O_CLOEXEC);
  assert_true(fd >= 0);
  off_t size = lseek(fd, 0, SEEK_END);
  uint8_t buf[4096];
  uint64_t st = seed;
  for (off_t off = 0; off < size; off += (off_t)sizeof buf) {
    for (size_t i = 0; i < sizeof buf; i += 8) {
      uint64_t v = tu_rand_r(&st);
      memcpy(buf + i, &v, 8);
    }
    assert_int_equal(pwrite(fd, buf, sizeof buf, off), (ssize_t)sizeof buf);
  }
  assert_int_equal(fsync(fd), 0);
  close(fd);
}

static void rebuild_ok(const char *dir, uint64_t want_at_least, const char *old_index) {
  kvt_rebuild_result res;
  assert_int_equal(kvt_store_rebuild_index(dir, 0, &res, NULL, NULL), 0);
  fprintf(stderr,
          "rebuild: %llu segments, %llu intact records, %llu damaged, %llu superseded -> %llu "
          "blocks, %llu namespaces, segment size %llu\n",
          (unsigned long long)res.segments, (unsigned long long)res.records,
          (unsigned long long)res.damaged, (unsigned long long)res.superseded,
          (unsigned long long)res.blocks, (unsigned long long)res.namespaces,
          (unsigned long long)res.segment_bytes);
  assert_true(res.blocks >= want_at_least); /* all the old index had, and more maybe */
  assert_int_equal(res.namespaces, N_NS);
  assert_int_equal(res.orphans, 0);
  assert_int_equal(res.segment_bytes, store_opts().cold_segment_bytes);
  assert_string_equal(res.old_index, old_index);
}

static void rebuild_after_kills(void **state) {
  (void)state;
  uint64_t seed = tu_rand();
  char *base = tu_tmpdir();
  char dir[600], log_path[700], path[800];
  snprintf(dir, sizeof dir, "%s/store", base);
  ack *acks = calloc(MAX_LOG, sizeof *acks);
  assert_non_null(acks);
  size_t n_acks = 0;
  for (uint32_t round = 0; round < ROUNDS; round++) {
    snprintf(log_path, sizeof log_path, "%s/log-%u", base, round);
    run_child(dir, log_path, seed, round, acks, &n_acks);
  }
  assert_true(n_acks > 0);
  uint64_t before = index_records(dir);
  assert_true(before > 0);

  /* 1. The index deleted. */
  snprintf(path, sizeof path, "%s/index/data.mdb", dir);
  assert_int_equal(unlink(path), 0);
  snprintf(path, sizeof path, "%s/index/lock.mdb", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/index", dir);
  assert_int_equal(rmdir(path), 0);
  assert_index_refused(dir);
  rebuild_ok(dir, before, "");
  size_t n1 = verify_acks(dir, seed, acks, n_acks, "index deleted");

  /* 2. Every page of the index overwritten with garbage. */
  snprintf(path, sizeof path, "%s/index/data.mdb", dir);
  overwrite_garbage(path, seed);
  assert_index_refused(dir);
  rebuild_ok(dir, before, "index.old-1");
  size_t n2 = verify_acks(dir, seed, acks, n_acks, "index overwritten");
  assert_int_equal(n1, n2);

  /* 3. Writing goes on in the rebuilt store (new records land where they
   * overwrite nothing indexed), and everything still reads back. */
  snprintf(log_path, sizeof log_path, "%s/log-more", base);
  run_child(dir, log_path, seed, ROUNDS, acks, &n_acks);
  size_t n3 = verify_acks(dir, seed, acks, n_acks, "after more writes");
  assert_true(n3 >= n2);
  free(acks);
  tu_rmtree(base);
}

/* --------------------------------------------- segments reused, rebuilt */

/* The keys of the index's blocks database, read with LMDB directly. */
static size_t index_keys(const char *dir, kvt_key *out, size_t max) {
  char path[700];
  snprintf(path, sizeof path, "%s/index", dir);
  MDB_env *env;
  MDB_txn *t;
  MDB_dbi db;
  MDB_cursor *cur;
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 4);
  assert_int_equal(mdb_env_open(env, path, MDB_RDONLY, 0644), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &t), 0);
  assert_int_equal(mdb_dbi_open(t, "blocks", 0, &db), 0);
  assert_int_equal(mdb_cursor_open(t, db, &cur), 0);
  size_t n = 0;
  MDB_val k, v;
  for (int op = MDB_FIRST; !mdb_cursor_get(cur, &k, &v, op); op = MDB_NEXT) {
    assert_true(n < max && k.mv_size == 16);
    memcpy(out[n++].b, k.mv_data, 16);
  }
  mdb_cursor_close(cur);
  mdb_txn_abort(t);
  mdb_env_close(env);
  return n;
}

#define REUSE_SEQS 60 /* 480 blocks: 7.5 segments of 64 records, so the last life is partial */
#define REUSE_BLOCKS 8

/* A cold tier of three 1 MiB segments written over several times (each
 * sequence released at once, so its blocks can be evicted): segments are
 * reclaimed and reused, so their files hold records of older lives. After
 * the index is deleted and rebuilt, every block the old index held is
 * there and loads bit-exact; no block loads other bytes; older lives are
 * left out (superseded). */
static void rebuild_after_reclaims(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o = store_opts();
  o.tier_bytes_limit[KVT_TIER_COLD] = 3 * o.cold_segment_bytes;
  kvt_engine *e = tu_open(dir, &o);
  kvt_shape sh = ns_shape(0);
  kvt_ns_id ns = tu_register(e, MODELS[0], &sh);
  uint64_t salt = tu_salt(MODELS[0]);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  for (uint32_t i = 0; i < REUSE_SEQS; i++) {
    cu_seqspec sp = {100 + i, 0, 0, REUSE_BLOCKS};
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(e, ns, &s), 0);
    for (uint32_t j = 0; j < REUSE_BLOCKS; j++) {
      uint32_t tok[4];
      cu_tokens(11, &sp, j, sh.block_tokens, tok);
      assert_int_equal(cu_append_put(s, &sh, salt, tok, &kv, NULL), 0);
    }
    assert_int_equal(kvt_sync(e), 0);
    kvt_seq_release(s);
  }
  kvt_stats st;
  tu_stats(e, &st);
  assert_true(st.cold_reclaims > 0);
  kvt_engine_close(e);
  static kvt_key before[REUSE_SEQS * REUSE_BLOCKS];
  size_t n_before = index_keys(dir, before, REUSE_SEQS * REUSE_BLOCKS);
  assert_true(n_before > 0);

  char path[700];
  snprintf(path, sizeof path, "%s/index/data.mdb", dir);
  assert_int_equal(unlink(path), 0);
  kvt_rebuild_result res;
  assert_int_equal(kvt_store_rebuild_index(dir, 0, &res, NULL, NULL), 0);
  fprintf(stderr, "reclaimed store: %llu reclaims; rebuild: %llu intact records, %llu "
          "superseded, %llu damaged -> %llu blocks (old index %zu)\n",
          (unsigned long long)st.cold_reclaims, (unsigned long long)res.records,
          (unsigned long long)res.superseded, (unsigned long long)res.damaged,
          (unsigned long long)res.blocks, n_before);
  assert_true(res.superseded > 0); /* older lives of reused segments */
  assert_true(res.blocks >= n_before);

  e = tu_open(dir, &o);
  ns = tu_register(e, MODELS[0], &sh);
  size_t exact_old = 0, exact_other = 0;
  for (uint32_t i = 0; i < REUSE_SEQS; i++) {
    cu_seqspec sp = {100 + i, 0, 0, REUSE_BLOCKS};
    uint32_t *tok = cu_seq_tokens(11, &sp, REUSE_BLOCKS, sh.block_tokens);
    kvt_key k[REUSE_BLOCKS];
    size_t nk;
    assert_int_equal(kvt_keys(e, ns, tok, (size_t)REUSE_BLOCKS * sh.block_tokens, k, REUSE_BLOCKS,
                              &nk), 0);
    for (uint32_t j = 0; j < REUSE_BLOCKS; j++) {
      int was = 0;
      for (size_t b = 0; b < n_before && !was; b++) was = cu_key_eq(&before[b], &k[j]);
      uint32_t n_exact, n_wrong;
      int rc = cu_load_block(e, ns, &sh, salt, &k[j], j, tok + j * sh.block_tokens, NULL, NULL,
                             &n_exact, &n_wrong);
      assert_int_equal(n_wrong, 0);
      if (was) assert_int_equal(rc, 0);
      assert_true(rc == 0 || rc == KVT_ENOTFOUND);
      if (rc == 0) assert_int_equal(n_exact, sh.n_layers);
      exact_old += was && rc == 0;
      exact_other += !was && rc == 0;
    }
    free(tok);
  }
  fprintf(stderr, "reclaimed store: blocks recovered %zu / indexed before %zu (and %zu evicted "
          "ones whose records were intact)\n", exact_old, n_before, exact_other);
  assert_int_equal(exact_old, n_before);
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.bad, 0);
  kvt_engine_close(e);
  tu_kv_free(&kv);
  tu_rmtree(dir);
}

/* ------------------------------------------------- index entry checks */

/* A closed store with one namespace and n blocks (one sequence). */
static void small_store(const char *dir, uint32_t n, kvt_key *keys) {
  kvt_options o = store_opts();
  kvt_engine *e = tu_open(dir, &o);
  kvt_shape sh = ns_shape(0);
  kvt_ns_id ns = tu_register(e, MODELS[0], &sh);
  kvt_seq *s;
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  cu_seqspec sp = {1, 0, 0, n};
  for (uint32_t j = 0; j < n; j++) {
    uint32_t tok[4];
    kvt_append_info info;
    cu_tokens(7, &sp, j, sh.block_tokens, tok);
    assert_int_equal(cu_append_put(s, &sh, tu_salt(MODELS[0]), tok, &kv, &info), 0);
    keys[j] = info.key;
  }
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(s), n);
  kvt_seq_release(s);
  tu_kv_free(&kv);
  kvt_engine_close(e);
}

/* Add delta to the u32 (size 4) or u64 (size 8) at off of key's index
 * entry (docs/format.md, "Block entry"), with LMDB directly. */
static void entry_poke(const char *dir, const kvt_key *key, size_t off, int size, uint64_t delta) {
  char path[700];
  snprintf(path, sizeof path, "%s/index", dir);
  MDB_env *env;
  MDB_txn *t;
  MDB_dbi db;
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 4);
  mdb_env_set_mapsize(env, 64u << 20);
  assert_int_equal(mdb_env_open(env, path, 0, 0644), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &t), 0);
  assert_int_equal(mdb_dbi_open(t, "blocks", 0, &db), 0);
  MDB_val k = {16, (void *)key->b}, v;
  assert_int_equal(mdb_get(t, db, &k, &v), 0);
  uint8_t buf[1024];
  assert_true(v.mv_size <= sizeof buf && off + (size_t)size <= v.mv_size);
  memcpy(buf, v.mv_data, v.mv_size);
  uint64_t x = 0;
  for (int i = 0; i < size; i++) x |= (uint64_t)buf[off + (size_t)i] << 8 * i;
  x += delta;
  for (int i = 0; i < size; i++) buf[off + (size_t)i] = (uint8_t)(x >> 8 * i);
  MDB_val nv = {v.mv_size, buf};
  assert_int_equal(mdb_put(t, db, &k, &nv, 0), 0);
  assert_int_equal(mdb_txn_commit(t), 0);
  mdb_env_close(env);
}

typedef struct problems {
  char what[8][256];
  kvt_key key[8];
  int n;
} problems;

static void note(void *arg, const kvt_key *key, const char *what) {
  problems *p = arg;
  if (p->n >= 8) return;
  snprintf(p->what[p->n], sizeof p->what[p->n], "%s", what);
  p->key[p->n++] = *key;
}

static const char *problem_of(const problems *p, const kvt_key *key) {
  for (int i = 0; i < p->n; i++)
    if (cu_key_eq(&p->key[i], key)) return p->what[i];
  return "";
}

/* Load every layer of block j of the small store's sequence. */
static int load_j(kvt_engine *e, const kvt_key *keys, uint32_t j, int *status) {
  kvt_shape sh = ns_shape(0);
  kvt_ns_id ns = tu_register(e, MODELS[0], &sh);
  cu_seqspec sp = {1, 0, 0, j + 1};
  uint32_t tok[4], n_exact, n_wrong;
  cu_tokens(7, &sp, j, sh.block_tokens, tok);
  int rc = cu_load_block(e, ns, &sh, tu_salt(MODELS[0]), &keys[j], j, tok, status, NULL, &n_exact,
                         &n_wrong);
  assert_int_equal(n_wrong, 0);
  return rc;
}

static void fsck_checks_fields(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_key keys[6];
  small_store(dir, 6, keys);
  entry_poke(dir, &keys[1], 32, 4, 1);          /* dtype */
  entry_poke(dir, &keys[2], 36, 4, 2);          /* bytes_each */
  entry_poke(dir, &keys[3], 56, 4, 5);          /* chain position */
  entry_poke(dir, &keys[4], 16, 8, 512);        /* record offset, off the 4 KiB grid */

  kvt_options o = store_opts();
  o.flags |= KVT_OPEN_RDONLY;
  kvt_engine *e = tu_open(dir, &o);
  problems p = {0};
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, note, &p), 0);
  for (int i = 0; i < p.n; i++) fprintf(stderr, "fsck: %s\n", p.what[i]);
  assert_int_equal(fr.checked, 6);
  assert_int_equal(fr.bad, 4);
  assert_non_null(strstr(problem_of(&p, &keys[1]), "dtype"));
  assert_non_null(strstr(problem_of(&p, &keys[2]), "bytes_each"));
  assert_non_null(strstr(problem_of(&p, &keys[3]), "position"));
  assert_non_null(strstr(problem_of(&p, &keys[4]), "4 KiB"));
  kvt_engine_close(e);

  o.flags &= ~KVT_OPEN_RDONLY;
  e = tu_open(dir, &o);
  int status[4];
  assert_int_equal(load_j(e, keys, 4, status), KVT_ECORRUPT); /* not -EINVAL */
  assert_int_equal(load_j(e, keys, 0, status), 0);
  assert_int_equal(kvt_fsck(e, 1, &fr, NULL, NULL), 0);
  assert_int_equal(fr.removed, 4);
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.bad, 0);
  assert_int_equal(fr.checked, 2);
  for (uint32_t j = 1; j < 5; j++) assert_int_equal(load_j(e, keys, j, status), KVT_ENOTFOUND);
  assert_int_equal(load_j(e, keys, 5, status), 0);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

static void corrupt_slice_names_layer(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_key keys[3];
  small_store(dir, 3, keys);
  cu_rec *recs;
  size_t nr = cu_records(dir, &recs);
  assert_int_equal(nr, 3);
  const cu_rec *r = &recs[1];
  uint32_t bad_layer = r->n_layers - 1;
  assert_int_equal(cu_flip(r->path, r->off + r->slice_off[bad_layer] + 3, 0x10), 0);
  uint32_t j = cu_key_eq(&r->key, &keys[0]) ? 0 : cu_key_eq(&r->key, &keys[1]) ? 1 : 2;

  kvt_options o = store_opts();
  kvt_engine *e = tu_open(dir, &o);
  problems p = {0};
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, note, &p), 0);
  assert_int_equal(fr.bad, 1);
  fprintf(stderr, "fsck: %s\n", p.what[0]);
  char want[64];
  snprintf(want, sizeof want, "layer %u", bad_layer);
  assert_non_null(strstr(p.what[0], want));
  assert_non_null(strstr(p.what[0], "segment 0"));
  int status[4];
  assert_int_equal(load_j(e, keys, j, status), KVT_ECORRUPT);
  assert_int_equal(status[bad_layer], KVT_ECORRUPT);
  for (uint32_t l = 0; l < bad_layer; l++) assert_int_equal(status[l], 0);
  assert_int_equal(load_j(e, keys, j, status), KVT_ENOTFOUND); /* then a miss */
  kvt_engine_close(e);
  free(recs);
  tu_rmtree(dir);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(rebuild_after_kills),
      cmocka_unit_test(rebuild_after_reclaims),
      cmocka_unit_test(fsck_checks_fields),
      cmocka_unit_test(corrupt_slice_names_layer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
