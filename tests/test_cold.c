/* test_cold.c - the cold tier end to end: write-through and kvt_sync make
 * every completed token block durable; the store reopens (in this process,
 * in a new process, read-only beside a live writer) with its namespaces
 * and its blocks bit-exact; a reader keeps working while the writer grows
 * the store into new segments; segment files use O_DIRECT where the file
 * system allows it. fsck and corrupted slices are in test_cold_fsck.c, the
 * cold codecs and merged loads in test_cold_codec.c, admission, drops,
 * eviction and a full tier in test_cold_drop.c (the shared workload:
 * cold_wl.h, the harness: cold_fx.h). Every test runs on io_uring (skipped, with the reason
 * printed, where it is unavailable) and pread. The program runs itself as
 * a child (--child) for the new-process and read-only cases.
 * KVT_TEST_FILTER (a cmocka pattern) picks tests. */
#include "cold_fx.h"

/* --------------------------------------------------------- child mode */

static int grow_child(int argc, char **argv);

/* test_cold --child rw|ro DIR BACKEND SEED RECORDS: verify the workload;
 * test_cold --child grow ...: see grow_child(). */
static int child_main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[2], "grow") == 0) return grow_child(argc, argv);
  if (argc != 7) return 2;
  int rdonly = strcmp(argv[2], "ro") == 0;
  const char *dir = argv[3];
  uint32_t backend = (uint32_t)strtoul(argv[4], NULL, 10);
  uint64_t seed = strtoull(argv[5], NULL, 10), records = strtoull(argv[6], NULL, 10);
  kvt_options o;
  if (rdonly) { /* a reader with default options: the store says what it is */
    kvt_options_init(&o);
    o.flags = KVT_OPEN_RDONLY;
    o.io_backend = backend;
  } else {
    cu_opts(&o, backend);
  }
  kvt_engine *e = NULL;
  int rc = kvt_engine_open(dir, &o, &e);
  if (rc) {
    fprintf(stderr, "child: open %s: %s\n", dir, kvt_strerror(rc));
    return 1;
  }
  rc = wl_verify(e, seed, rdonly, 0, records);
  if (!rc && !rdonly && direct_ok(dir)) { /* O_DIRECT where the file system allows it */
    int n, n_direct;
    segment_fds(dir, &n, &n_direct);
    if (n < 1 || n_direct != n) {
      fprintf(stderr, "child: %d of %d segment fds without O_DIRECT\n", n - n_direct, n);
      rc = -1;
    }
  }
  if (!rc && !rdonly) { /* puts after a durable append add RAM copies only */
    wl_ns w[WL_N_NS];
    wl_get(w);
    kvt_ns_id ids[WL_N_NS];
    wl_ids(e, ids);
    kvt_seq *q;
    tu_kv kv;
    tu_kv_alloc(&kv, &w[0].sh);
    rc = kvt_seq_create(e, ids[0], &q);
    for (uint32_t j = 0; !rc && j < w[0].specs[0].n_blocks; j++) {
      uint32_t tok[64];
      kvt_append_info info;
      cu_tokens(seed, &w[0].specs[0], j, w[0].sh.block_tokens, tok);
      rc = cu_append_put(q, &w[0].sh, tu_salt(w[0].model), tok, &kv, &info);
      if (!rc && !info.durable) rc = -1;
    }
    if (!rc) rc = kvt_sync(e);
    kvt_stats st;
    kvt_stats_get(e, &st);
    if (!rc && (st.cold_written || st.cold_records != records || st.cold_queued)) {
      fprintf(stderr, "child: puts of durable blocks were written again\n");
      rc = -1;
    }
    tu_kv_free(&kv);
    kvt_seq_release(q);
  }
  kvt_engine_close(e);
  return rc ? 1 : 0;
}

static int spawn_verify(const char *mode, const char *dir, uint32_t backend, uint64_t seed,
                        uint64_t records) {
  char b[16], s[32], r[32];
  snprintf(b, sizeof b, "%u", backend);
  snprintf(s, sizeof s, "%llu", (unsigned long long)seed);
  snprintf(r, sizeof r, "%llu", (unsigned long long)records);
  char *argv[] = {"test_cold", "--child", (char *)mode, (char *)dir, b, s, r, NULL};
  return cu_run_self(argv);
}

/* Durable after kvt_sync; reopened in this process and in a new one,
 * namespaces and blocks are all there, bit-exact, from the cold tier. */
static void durable_reopen(cold_fx *f) {
  kvt_engine *e = fx_write(f);
  assert_int_equal(wl_verify(e, f->seed, 0, 1, WL_DISTINCT), 0); /* before close: from RAM */
  fx_close(f, e);

  e = fx_open(f);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.namespaces, WL_N_NS);
  assert_int_equal(st.token_blocks, 0); /* nothing in RAM: it all comes from cold */
  assert_int_equal(wl_verify(e, f->seed, 0, 0, WL_DISTINCT), 0);
  kvt_engine_close(e);

  /* A new process opens it as the writer, and reads it with the other backend. */
  uint32_t other = f->backend == KVT_BACKEND_PREAD ? KVT_BACKEND_AUTO : KVT_BACKEND_PREAD;
  assert_int_equal(spawn_verify("rw", f->dir, f->backend, f->seed, WL_DISTINCT), 0);
  assert_int_equal(spawn_verify("rw", f->dir, other, f->seed, WL_DISTINCT), 0);
  e = fx_open(f);
  assert_int_equal(wl_verify(e, f->seed, 0, 0, WL_DISTINCT), 0);
  kvt_engine_close(e);
}
BOTH(durable_reopen)

/* A reader in another process beside the live writer: stats, lookups,
 * loads and fsck work; every write is refused; the writer is undisturbed. */
static void readonly_beside_writer(cold_fx *f) {
  kvt_engine *e = fx_write(f);
  assert_int_equal(spawn_verify("ro", f->dir, f->backend, f->seed, WL_DISTINCT), 0);

  /* The writer goes on: two more blocks on the first sequence. */
  wl_ns w[WL_N_NS];
  wl_get(w);
  tu_kv kv;
  tu_kv_alloc(&kv, &w[0].sh);
  uint64_t salt = tu_salt(w[0].model);
  uint32_t tok[2][4] = {{7, 7, 7, 7}, {8, 8, 8, 8}};
  for (int j = 0; j < 2; j++) tu_append_put(f->seqs[0], &w[0].sh, salt, tok[j], &kv);
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(f->seqs[0]), w[0].specs[0].n_blocks + 2);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, WL_DISTINCT + 2);
  /* A reader now sees the new blocks too. */
  assert_int_equal(spawn_verify("ro", f->dir, f->backend, f->seed, WL_DISTINCT + 2), 0);
  for (int j = 0; j < 2; j++)
    for (uint32_t l = 0; l < w[0].sh.n_layers; l++)
      tu_assert_block(f->seqs[0], &w[0].sh, salt, w[0].specs[0].n_blocks + (uint32_t)j, l, tok[j]);
  tu_kv_free(&kv);
  fx_close(f, e);
}
BOTH(readonly_beside_writer)

/* ------------------------------------- a reader while the writer grows */

#define GROW_BEFORE 4u  /* blocks written before the reader opens */
#define GROW_AFTER 70u  /* then this many more: over 1 MiB, so new segments */

/* Check blocks [0, n) of the grow workload in e: lookup, fsck, loads. */
static int grow_check(kvt_engine *e, uint64_t seed, uint32_t n) {
  kvt_shape sh = tu_shape_small(KVT_BF16);
  kvt_ns_id ns = UINT32_MAX;
  kvt_ns_desc d;
  if (kvt_ns_get(e, 0, &ns, &d) || strcmp(d.model_id, "grow") != 0) CU_FAIL("no namespace");
  cu_seqspec sp = {0, 0, 0, n};
  uint32_t *tok = cu_seq_tokens(seed, &sp, n, sh.block_tokens);
  kvt_key *keys = calloc(n, sizeof *keys);
  size_t nk = 0, found = 0;
  int bad = 0;
  if (kvt_keys(e, ns, tok, (size_t)n * sh.block_tokens, keys, n, &nk)) CU_FAIL("keys");
  if (kvt_lookup(e, ns, tok, (size_t)n * sh.block_tokens, NULL, 0, &found) || found != n) {
    fprintf(stderr, "grow: lookup finds %zu of %u\n", found, n);
    bad = 1;
  }
  kvt_fsck_result fr;
  int rc = kvt_fsck(e, 0, &fr, NULL, NULL);
  if (rc || fr.bad || fr.checked != n) {
    fprintf(stderr, "grow: fsck on the reader: %s, checked %llu, bad %llu (of %u durable, intact)\n",
            kvt_strerror(rc), (unsigned long long)fr.checked, (unsigned long long)fr.bad, n);
    bad = 1;
  }
  uint32_t missed = 0, wrong = 0;
  for (uint32_t j = 0; j < n; j++) {
    uint32_t n_exact, n_wrong;
    cu_load_block(e, ns, &sh, tu_salt("grow"), &keys[j], j, tok + (size_t)j * sh.block_tokens, NULL,
                  NULL, &n_exact, &n_wrong);
    missed += n_exact != sh.n_layers;
    wrong += n_wrong;
  }
  if (missed || wrong) {
    fprintf(stderr, "grow: loads on the reader: %u of %u durable blocks not exact, %u layers wrong\n",
            missed, n, wrong);
    bad = 1;
  }
  free(keys);
  free(tok);
  return bad ? -1 : 0;
}

/* test_cold --child grow DIR BACKEND SEED RFD WFD: a reader that opens
 * beside the writer, says so on WFD, waits on RFD while the writer adds
 * blocks in new segments, then checks everything. */
static int grow_child(int argc, char **argv) {
  if (argc != 8) return 2;
  const char *dir = argv[3];
  uint64_t seed = strtoull(argv[5], NULL, 10);
  int rfd = atoi(argv[6]), wfd = atoi(argv[7]);
  kvt_options o;
  kvt_options_init(&o);
  o.flags = KVT_OPEN_RDONLY;
  o.io_backend = (uint32_t)strtoul(argv[4], NULL, 10);
  kvt_engine *e = NULL;
  int rc = kvt_engine_open(dir, &o, &e);
  if (rc) {
    fprintf(stderr, "grow child: open: %s\n", kvt_strerror(rc));
    return 1;
  }
  int bad = grow_check(e, seed, GROW_BEFORE) != 0;
  char b = 'o';
  if (write(wfd, &b, 1) != 1 || read(rfd, &b, 1) != 1) bad = 1;
  if (grow_check(e, seed, GROW_BEFORE + GROW_AFTER)) bad = 1;
  kvt_engine_close(e);
  return bad;
}

/* A reader opened beside the writer keeps working while the writer grows
 * the store into new segments: lookups, fsck and loads of every durable
 * block (DESIGN.md section 6: stat and fsck beside a live store). */
static void readonly_beside_growing_writer(cold_fx *f) {
  kvt_engine *e = fx_open(f);
  kvt_shape sh = tu_shape_small(KVT_BF16);
  kvt_ns_id ns = tu_register(e, "grow", &sh);
  uint64_t salt = tu_salt("grow");
  cu_seqspec sp = {0, 0, 0, GROW_BEFORE + GROW_AFTER};
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, ns, &q), 0);
  for (uint32_t j = 0; j < GROW_BEFORE; j++) {
    uint32_t tok[4];
    cu_tokens(f->seed, &sp, j, sh.block_tokens, tok);
    tu_append_put(q, &sh, salt, tok, &kv);
  }
  assert_int_equal(kvt_sync(e), 0);
  kvt_stats st;
  tu_stats(e, &st);
  uint64_t segs0 = st.cold_segments;
  int p2c[2], c2p[2];
  assert_int_equal(pipe(p2c), 0);
  assert_int_equal(pipe(c2p), 0);
  char a_dir[600], a_b[16], a_s[32], a_r[16], a_w[16];
  snprintf(a_dir, sizeof a_dir, "%s", f->dir);
  snprintf(a_b, sizeof a_b, "%u", f->backend);
  snprintf(a_s, sizeof a_s, "%llu", (unsigned long long)f->seed);
  snprintf(a_r, sizeof a_r, "%d", p2c[0]);
  snprintf(a_w, sizeof a_w, "%d", c2p[1]);
  char *argv[] = {"test_cold", "--child", "grow", a_dir, a_b, a_s, a_r, a_w, NULL};
  pid_t pid = cu_spawn_self(argv);
  assert_true(pid > 0);
  char b;
  int got = (int)read(c2p[0], &b, 1); /* the reader is open */
  for (uint32_t j = GROW_BEFORE; j < GROW_BEFORE + GROW_AFTER; j++) {
    uint32_t tok[4];
    cu_tokens(f->seed, &sp, j, sh.block_tokens, tok);
    tu_append_put(q, &sh, salt, tok, &kv);
  }
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(q), GROW_BEFORE + GROW_AFTER);
  tu_stats(e, &st);
  assert_true(st.cold_segments > segs0); /* the point: blocks in segments the reader never saw */
  b = 'g';
  assert_int_equal(write(p2c[1], &b, 1), 1);
  int status = cu_wait(pid);
  close(p2c[0]);
  close(p2c[1]);
  close(c2p[0]);
  close(c2p[1]);
  assert_int_equal(got, 1);
  assert_int_equal(status, 0);
  kvt_seq_release(q);
  tu_kv_free(&kv);
  kvt_engine_close(e);
}
BOTH(readonly_beside_growing_writer)

/* Segment files are written and read with O_DIRECT where the file system
 * allows it (DESIGN.md section 3), whichever way they were opened: created
 * by the writer, or opened again by a later one. */
static void segments_direct(cold_fx *f) {
  if (!direct_ok(f->dir)) {
    fprintf(stderr, "SKIP %s: no O_DIRECT on %s\n", __func__, f->dir);
    tu_rmtree(f->dir);
    tu_skip_mark();
    skip();
  }
  kvt_engine *e = fx_write(f);
  int n, n_direct;
  segment_fds(f->dir, &n, &n_direct);
  assert_true(n >= 1);
  if (n_direct != n) fprintf(stderr, "%d of %d segment fds without O_DIRECT (new store)\n", n - n_direct, n);
  assert_int_equal(n_direct, n);
  fx_close(f, e);
  for (int round = 0; round < 3; round++) { /* reopened, read, written */
    e = fx_open(f);
    assert_int_equal(wl_verify(e, f->seed, 0, 0, WL_DISTINCT), 0);
    segment_fds(f->dir, &n, &n_direct);
    assert_true(n >= 1);
    if (n_direct != n) fprintf(stderr, "%d of %d segment fds without O_DIRECT (reopened)\n", n - n_direct, n);
    assert_int_equal(n_direct, n);
    kvt_engine_close(e);
  }
}
BOTH(segments_direct)

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "--child") == 0) return child_main(argc, argv);
  cu_set_self(argv[0]);
  const struct CMUnitTest tests[] = {
      BOTH_TESTS(durable_reopen),
      BOTH_TESTS(readonly_beside_writer),
      BOTH_TESTS(readonly_beside_growing_writer),
      BOTH_TESTS(segments_direct),
  };
  return FX_MAIN(tests);
}
