/* test_cold.c - the cold tier end to end. Write-through and kvt_sync make
 * every completed token block durable; the store reopens (in this process,
 * in a new process, read-only beside a live writer) with its namespaces
 * and its blocks bit-exact; fsck finds a flipped byte and repair turns the
 * entry into a miss; a corrupted slice read through the API is a miss,
 * never other bytes; both cold codecs round-trip; admission, drops and
 * eviction of durable blocks from RAM; a reader keeps working while the
 * writer grows the store into new segments; segment files use O_DIRECT
 * where the file system allows it. Every test runs on io_uring (skipped,
 * with the reason printed, where it is unavailable) and pread. The program
 * runs itself as a child (--child) for the new-process and read-only
 * cases. KVT_TEST_FILTER (a cmocka pattern) picks tests. */
#include "cold_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------- the standard workload */

typedef struct wl_ns {
  const char *model;
  kvt_shape sh;
  const cu_seqspec *specs;
  size_t n_specs;
} wl_ns;

/* Namespace a: two sequences sharing two blocks, one on its own. */
static const cu_seqspec SPECS_A[] = {{0, 0, 2, 5}, {0, 1, 2, 4}, {1, 0, 0, 3}};
/* Namespace b (another dtype and shape): two sequences sharing one block. */
static const cu_seqspec SPECS_B[] = {{0, 0, 1, 3}, {0, 1, 1, 2}};
#define WL_N_NS 2
#define WL_DISTINCT 14u /* a: 2 shared + 3 + 2 + 3; b: 3 + 1 */
#define WL_MAX_SEQS 5

static void wl_get(wl_ns out[WL_N_NS]) {
  out[0] = (wl_ns){"cold-a", tu_shape_small(KVT_BF16), SPECS_A, 3};
  out[1] = (wl_ns){"cold-b",
                   {.n_layers = 3, .n_kv_heads = 1, .head_dim = 32, .dtype = KVT_F32,
                    .block_tokens = 8},
                   SPECS_B, 2};
}

/* One block of the workload and its key, for finding what a record is. */
typedef struct wl_block {
  uint32_t ns, spec, block;
  kvt_key key;
} wl_block;

/* Every (namespace, spec, block) with its key; shared blocks repeat. */
static size_t wl_blocks(kvt_engine *e, const kvt_ns_id *ids, uint64_t seed, wl_block *out,
                        size_t max) {
  wl_ns w[WL_N_NS];
  wl_get(w);
  size_t n = 0;
  for (uint32_t i = 0; i < WL_N_NS; i++) {
    for (uint32_t s = 0; s < w[i].n_specs; s++) {
      const cu_seqspec *sp = &w[i].specs[s];
      uint32_t *tok = cu_seq_tokens(seed, sp, sp->n_blocks, w[i].sh.block_tokens);
      kvt_key keys[16];
      size_t nk = 0;
      assert_int_equal(kvt_keys(e, ids[i], tok, (size_t)sp->n_blocks * w[i].sh.block_tokens, keys,
                                16, &nk),
                       0);
      assert_int_equal(nk, sp->n_blocks);
      for (uint32_t j = 0; j < sp->n_blocks && n < max; j++)
        out[n++] = (wl_block){i, s, j, keys[j]};
      free(tok);
    }
  }
  return n;
}

/* The namespace ids of the workload in e, by model id (kvt_ns_get). */
static int wl_ids(kvt_engine *e, kvt_ns_id ids[WL_N_NS]) {
  wl_ns w[WL_N_NS];
  wl_get(w);
  int found = 0;
  for (uint32_t i = 0;; i++) {
    kvt_ns_id id;
    kvt_ns_desc d;
    int rc = kvt_ns_get(e, i, &id, &d);
    if (rc == KVT_ENOTFOUND) break;
    if (rc) CU_FAIL("kvt_ns_get(%u): %s", i, kvt_strerror(rc));
    for (int k = 0; k < WL_N_NS; k++) {
      if (strcmp(d.model_id, w[k].model) != 0) continue;
      if (memcmp(&d.shape, &w[k].sh, sizeof d.shape) != 0) CU_FAIL("%s: shape differs", w[k].model);
      if (strcmp(d.weights_fingerprint, "sha256:test") != 0) CU_FAIL("%s: fingerprint", w[k].model);
      ids[k] = id;
      found |= 1 << k;
    }
  }
  return found;
}

/* Write the workload into a fresh store; the sequences stay open in seqs
 * (WL_MAX_SEQS). Asserts what write-through promises after kvt_sync. */
static void wl_write(kvt_engine *e, uint64_t seed, kvt_ns_id ids[WL_N_NS], kvt_seq **seqs,
                     const char *backend) {
  wl_ns w[WL_N_NS];
  wl_get(w);
  size_t n_seqs = 0;
  for (int i = 0; i < WL_N_NS; i++) {
    ids[i] = tu_register(e, w[i].model, &w[i].sh);
    uint64_t salt = tu_salt(w[i].model);
    tu_kv kv;
    tu_kv_alloc(&kv, &w[i].sh);
    for (size_t s = 0; s < w[i].n_specs; s++) {
      const cu_seqspec *sp = &w[i].specs[s];
      int fam_seen = 0; /* an earlier spec appended this one's shared prefix */
      for (size_t s2 = 0; s2 < s; s2++) fam_seen |= w[i].specs[s2].fam == sp->fam;
      kvt_seq *q;
      assert_int_equal(kvt_seq_create(e, ids[i], &q), 0);
      for (uint32_t j = 0; j < sp->n_blocks; j++) {
        uint32_t tok[64];
        cu_tokens(seed, sp, j, w[i].sh.block_tokens, tok);
        kvt_append_info info;
        assert_int_equal(cu_append_put(q, &w[i].sh, salt, tok, &kv, &info), 0);
        if (!(fam_seen && j < sp->shared)) /* new here: not durable before (a shared */
          assert_int_equal(info.durable, 0); /* block may have been written since) */
      }
      seqs[n_seqs++] = q;
    }
    tu_kv_free(&kv);
  }
  assert_int_equal(kvt_sync(e), 0);
  size_t k = 0;
  for (int i = 0; i < WL_N_NS; i++)
    for (size_t s = 0; s < w[i].n_specs; s++, k++)
      assert_int_equal(kvt_seq_durable(seqs[k]), w[i].specs[s].n_blocks);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, WL_DISTINCT);
  assert_int_equal(st.cold_written, WL_DISTINCT);
  assert_int_equal(st.cold_queued, 0);
  assert_int_equal(st.cold_write_failures, 0);
  assert_int_equal(st.cold_checksum_failures, 0);
  assert_true(st.cold_segments >= 1);
  assert_true(st.cold_write_bytes > 0);
  assert_int_equal(st.tier_blocks[KVT_TIER_COLD], WL_DISTINCT);
  assert_true(st.tier_bytes[KVT_TIER_COLD] > 0);
  assert_non_null(strstr(st.io_backend, backend));
  /* A second sync has nothing to do and meets no error. */
  assert_int_equal(kvt_sync(e), 0);
  tu_stats(e, &st);
  assert_int_equal(st.cold_written, WL_DISTINCT);
}

/* Check every block of the workload in e. rdonly: e was opened read-only
 * (writes must be refused); in_ram: the writer that made them is still
 * open, so lookups report RAM tiers. Returns 0 or -1 (printed). Usable in
 * a child: no cmocka assertions. */
static int wl_verify(kvt_engine *e, uint64_t seed, int rdonly, int in_ram, uint64_t records) {
  wl_ns w[WL_N_NS];
  wl_get(w);
  kvt_ns_id ids[WL_N_NS];
  if (wl_ids(e, ids) != (1 << WL_N_NS) - 1) CU_FAIL("kvt_ns_get does not list both namespaces");
  for (int i = 0; i < WL_N_NS; i++) {
    kvt_ns_desc d = tu_desc(w[i].model, &w[i].sh);
    kvt_ns_id again = UINT32_MAX;
    int rc = kvt_ns_register(e, &d, &again);
    if (rdonly && rc != KVT_ERDONLY) CU_FAIL("register on a reader: %s", kvt_strerror(rc));
    if (!rdonly && (rc || again != ids[i]))
      CU_FAIL("registering %s again: %s, id %u != %u", w[i].model, kvt_strerror(rc), again, ids[i]);
    d.rope_dims = w[i].sh.head_dim; /* same identity (rope_dims 0 means head_dim) */
    d.shape.head_dim *= 2;           /* other shape */
    rc = kvt_ns_register(e, &d, &again);
    if (!rdonly && rc != KVT_ENSCONFLICT) CU_FAIL("conflicting shape: %s", kvt_strerror(rc));
  }
  kvt_stats st0;
  if (kvt_stats_get(e, &st0)) CU_FAIL("stats");
  if (st0.cold_records != records) CU_FAIL("cold_records %llu != %llu", (unsigned long long)st0.cold_records, (unsigned long long)records);
  uint32_t loads = 0;
  for (int i = 0; i < WL_N_NS; i++) {
    const kvt_shape *sh = &w[i].sh;
    uint64_t salt = tu_salt(w[i].model);
    for (size_t s = 0; s < w[i].n_specs; s++) {
      const cu_seqspec *sp = &w[i].specs[s];
      uint32_t bt = sh->block_tokens, nb = sp->n_blocks;
      uint32_t *tok = cu_seq_tokens(seed, sp, nb, bt);
      kvt_key keys[16];
      size_t nk, found = 0;
      if (kvt_keys(e, ids[i], tok, (size_t)nb * bt, keys, 16, &nk)) CU_FAIL("keys");
      kvt_lookup_entry ent[16];
      /* A longer query: the blocks past the stored ones are not found. */
      uint32_t *longer = malloc(((size_t)nb + 2) * bt * sizeof *longer);
      memcpy(longer, tok, (size_t)nb * bt * sizeof *tok);
      for (size_t t = (size_t)nb * bt; t < ((size_t)nb + 2) * bt; t++) longer[t] = 0xFFFFFFF0u;
      int rc = kvt_lookup(e, ids[i], longer, ((size_t)nb + 2) * bt, ent, 16, &found);
      free(longer);
      if (rc || found != nb)
        CU_FAIL("%s spec %zu: lookup %s, found %zu of %u", w[i].model, s, kvt_strerror(rc), found, nb);
      for (uint32_t j = 0; j < nb; j++) {
        if (!cu_key_eq(&ent[j].key, &keys[j])) CU_FAIL("lookup key %u differs", j);
        uint32_t want = in_ram ? KVT_TIER_HOT : KVT_TIER_COLD;
        if (ent[j].tier != want) CU_FAIL("block %u: tier %u, want %u", j, ent[j].tier, want);
        if (!(ent[j].est_load_us > 0)) CU_FAIL("block %u: est_load_us %g", j, ent[j].est_load_us);
        int status[16];
        uint32_t tier[16], n_exact, n_wrong;
        rc = cu_load_block(e, ids[i], sh, salt, &keys[j], j, tok + (size_t)j * bt, status, tier,
                           &n_exact, &n_wrong);
        if (rc || n_exact != sh->n_layers || n_wrong)
          CU_FAIL("%s spec %zu block %u: load %s, %u exact, %u wrong", w[i].model, s, j,
                  kvt_strerror(rc), n_exact, n_wrong);
        for (uint32_t l = 0; l < sh->n_layers; l++)
          if (tier[l] != want) CU_FAIL("load tier %u, want %u", tier[l], want);
        loads += sh->n_layers;
      }
      if (!rdonly) { /* a new sequence finds the blocks durable and reads them */
        kvt_seq *q;
        if ((rc = kvt_seq_create(e, ids[i], &q))) CU_FAIL("seq_create: %s", kvt_strerror(rc));
        for (uint32_t j = 0; j < nb; j++) {
          kvt_append_info info;
          rc = kvt_seq_append(q, tok + (size_t)j * bt, bt, &info);
          if (rc || info.durable != 1 || !cu_key_eq(&info.key, &keys[j]))
            CU_FAIL("append %u: %s, durable %u", j, kvt_strerror(rc), info.durable);
          if (!in_ram && info.layers_present != 0) CU_FAIL("layers_present %u", info.layers_present);
          if (kvt_seq_durable(q) != j + 1) CU_FAIL("durable watermark %u", kvt_seq_durable(q));
          for (uint32_t l = 0; l < sh->n_layers; l++) {
            int exact;
            rc = cu_read(q, sh, salt, j, l, tok + (size_t)j * bt, &exact);
            if (rc || !exact) CU_FAIL("seq_read %u/%u: %s, exact %d", j, l, kvt_strerror(rc), exact);
          }
        }
        kvt_seq_release(q);
      } else if (kvt_seq_create(e, ids[i], &(kvt_seq *){NULL}) != KVT_ERDONLY) {
        CU_FAIL("seq_create on a reader");
      }
      free(tok);
    }
  }
  kvt_fsck_result fr;
  int rc = kvt_fsck(e, 0, &fr, NULL, NULL);
  if (rc || fr.bad || fr.checked != records)
    CU_FAIL("fsck: %s, checked %llu, bad %llu", kvt_strerror(rc), (unsigned long long)fr.checked,
            (unsigned long long)fr.bad);
  kvt_stats st;
  if (kvt_stats_get(e, &st)) CU_FAIL("stats");
  if (st.cold_records != records || st.cold_checksum_failures) CU_FAIL("cold stats after reads");
  if (!in_ram && st.cold_reads < loads) CU_FAIL("cold_reads %llu < %u", (unsigned long long)st.cold_reads, loads);
  if (!st.io_backend[0]) CU_FAIL("io_backend empty");
  if (rdonly) {
    uint32_t tok[4] = {1, 2, 3, 4};
    if (kvt_sync(e) != KVT_ERDONLY) CU_FAIL("sync on a reader");
    if (kvt_fsck(e, 1, &fr, NULL, NULL) != KVT_ERDONLY) CU_FAIL("fsck repair on a reader");
    if (kvt_drop_prefix(e, ids[0], tok, 4, NULL) != KVT_ERDONLY) CU_FAIL("drop_prefix on a reader");
    if (kvt_ns_drop(e, ids[0]) != KVT_ERDONLY) CU_FAIL("ns_drop on a reader");
  } else if (!in_ram && st.cold_written != 0) {
    CU_FAIL("a reopened writer wrote %llu blocks again", (unsigned long long)st.cold_written);
  }
  return 0;
}

/* --------------------------------------------------------- child mode */

static int grow_child(int argc, char **argv);
static int direct_ok(const char *dir);
static void segment_fds(const char *dir, int *n, int *n_direct);

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

/* ------------------------------------------------------------- tests */

/* Each test on both backends; with KVT_STRESS=1 ten times over (the
 * corrupted bytes, keys and data are random). */
#define BOTH(fn)                                                                  \
  static void fn##_uring(void **state) {                                          \
    (void)state;                                                                  \
    CU_SKIP_UNLESS_BACKEND(KVT_BACKEND_URING);                                    \
    for (int i_ = 0; i_ < (tu_stress() ? 10 : 1); i_++) fn(KVT_BACKEND_URING);    \
  }                                                                               \
  static void fn##_pread(void **state) {                                          \
    (void)state;                                                                  \
    for (int i_ = 0; i_ < (tu_stress() ? 10 : 1); i_++) fn(KVT_BACKEND_PREAD);    \
  }

static void release_all(kvt_seq **seqs, size_t n) {
  for (size_t i = 0; i < n; i++) kvt_seq_release(seqs[i]);
}

/* Every segment file a writer has open under dir uses O_DIRECT, when the
 * file system allows it (DESIGN.md section 3). */
static void assert_segments_direct(const char *dir) {
  if (!direct_ok(dir)) return;
  int n, n_direct;
  segment_fds(dir, &n, &n_direct);
  if (n_direct != n) fprintf(stderr, "%d of %d segment fds without O_DIRECT\n", n - n_direct, n);
  assert_int_equal(n_direct, n);
}

static kvt_engine *open_cold(const char *dir, uint32_t backend) {
  kvt_options o;
  cu_opts(&o, backend);
  kvt_engine *e = tu_open(dir, &o);
  assert_segments_direct(dir);
  return e;
}

/* Durable after kvt_sync; reopened in this process and in a new one,
 * namespaces and blocks are all there, bit-exact, from the cold tier. */
static void durable_reopen(uint32_t backend) {
  char *dir = tu_tmpdir();
  uint64_t seed = tu_rand();
  kvt_engine *e = open_cold(dir, backend);
  kvt_ns_id ids[WL_N_NS];
  kvt_seq *seqs[WL_MAX_SEQS];
  wl_write(e, seed, ids, seqs, cu_backend_name(backend));
  assert_int_equal(wl_verify(e, seed, 0, 1, WL_DISTINCT), 0); /* before close: from RAM */
  release_all(seqs, WL_MAX_SEQS);
  kvt_engine_close(e);

  e = open_cold(dir, backend);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.namespaces, WL_N_NS);
  assert_int_equal(st.token_blocks, 0); /* nothing in RAM: it all comes from cold */
  assert_int_equal(wl_verify(e, seed, 0, 0, WL_DISTINCT), 0);
  kvt_engine_close(e);

  /* A new process opens it as the writer, and reads it with the other backend. */
  uint32_t other = backend == KVT_BACKEND_PREAD ? KVT_BACKEND_AUTO : KVT_BACKEND_PREAD;
  assert_int_equal(spawn_verify("rw", dir, backend, seed, WL_DISTINCT), 0);
  assert_int_equal(spawn_verify("rw", dir, other, seed, WL_DISTINCT), 0);
  e = open_cold(dir, backend);
  assert_int_equal(wl_verify(e, seed, 0, 0, WL_DISTINCT), 0);
  kvt_engine_close(e);
  tu_rmtree(dir);
}
BOTH(durable_reopen)

/* A reader in another process beside the live writer: stats, lookups,
 * loads and fsck work; every write is refused; the writer is undisturbed. */
static void readonly_beside_writer(uint32_t backend) {
  char *dir = tu_tmpdir();
  uint64_t seed = tu_rand();
  kvt_engine *e = open_cold(dir, backend);
  kvt_ns_id ids[WL_N_NS];
  kvt_seq *seqs[WL_MAX_SEQS];
  wl_write(e, seed, ids, seqs, cu_backend_name(backend));
  assert_int_equal(spawn_verify("ro", dir, backend, seed, WL_DISTINCT), 0);

  /* The writer goes on: two more blocks on the first sequence. */
  wl_ns w[WL_N_NS];
  wl_get(w);
  tu_kv kv;
  tu_kv_alloc(&kv, &w[0].sh);
  uint64_t salt = tu_salt(w[0].model);
  uint32_t tok[2][4] = {{7, 7, 7, 7}, {8, 8, 8, 8}};
  for (int j = 0; j < 2; j++) tu_append_put(seqs[0], &w[0].sh, salt, tok[j], &kv);
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(seqs[0]), w[0].specs[0].n_blocks + 2);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, WL_DISTINCT + 2);
  /* A reader now sees the new blocks too. */
  assert_int_equal(spawn_verify("ro", dir, backend, seed, WL_DISTINCT + 2), 0);
  for (int j = 0; j < 2; j++)
    for (uint32_t l = 0; l < w[0].sh.n_layers; l++)
      tu_assert_block(seqs[0], &w[0].sh, salt, w[0].specs[0].n_blocks + (uint32_t)j, l, tok[j]);
  tu_kv_free(&kv);
  release_all(seqs, WL_MAX_SEQS);
  kvt_engine_close(e);
  tu_rmtree(dir);
}
BOTH(readonly_beside_writer)

/* fsck reports. */
typedef struct fsck_log {
  kvt_key keys[64];
  size_t n;
} fsck_log;

static void fsck_report(void *arg, const kvt_key *key, const char *what) {
  fsck_log *lg = arg;
  assert_non_null(what);
  assert_true(what[0] != 0);
  if (lg->n < 64) lg->keys[lg->n++] = *key;
}

/* Which workload block (first listed) has this key; -1 when none. */
static int block_of(const wl_block *b, size_t n, const kvt_key *key) {
  for (size_t i = 0; i < n; i++)
    if (cu_key_eq(&b[i].key, key)) return (int)i;
  return -1;
}

/* Flip one random checksummed byte of layer `layer` of record r (its
 * stored payload), or of the record header when layer is -1. */
static void corrupt(const cu_rec *r, int layer) {
  uint64_t at;
  if (layer < 0) {
    /* the fixed part (magic .. bytes_each) and the slice table */
    at = r->off + tu_below(KVT_REC_FIXED + KVT_REC_SLICE * r->n_layers);
  } else {
    at = r->off + r->slice_off[layer] + tu_below(r->slice_bytes[layer]);
  }
  assert_int_equal(cu_flip(r->path, at, (uint8_t)(1u << tu_below(8))), 0);
}

/* Write the workload, close, and return the records found on disk. */
static size_t written_store(const char *dir, uint32_t backend, uint64_t seed, cu_rec **recs) {
  kvt_engine *e = open_cold(dir, backend);
  kvt_ns_id ids[WL_N_NS];
  kvt_seq *seqs[WL_MAX_SEQS];
  wl_write(e, seed, ids, seqs, cu_backend_name(backend));
  release_all(seqs, WL_MAX_SEQS);
  kvt_engine_close(e);
  size_t n = cu_records(dir, recs);
  assert_int_equal(n, WL_DISTINCT);
  return n;
}

/* For every workload spec, the lookup stops before the first of its
 * blocks whose key is in gone[0..n_gone); every other block is found. */
static void assert_lookups_stop_at(kvt_engine *e, const kvt_ns_id *ids, uint64_t seed,
                                   const wl_block *blocks, size_t nb, const kvt_key *gone,
                                   size_t n_gone) {
  wl_ns w[WL_N_NS];
  wl_get(w);
  for (uint32_t i = 0; i < WL_N_NS; i++) {
    for (uint32_t s = 0; s < w[i].n_specs; s++) {
      const cu_seqspec *sp = &w[i].specs[s];
      uint32_t want = sp->n_blocks;
      for (size_t k = 0; k < nb; k++)
        for (size_t g = 0; g < n_gone; g++)
          if (blocks[k].ns == i && blocks[k].spec == s && cu_key_eq(&blocks[k].key, &gone[g]) &&
              blocks[k].block < want)
            want = blocks[k].block;
      uint32_t bt = w[i].sh.block_tokens, *tok = cu_seq_tokens(seed, sp, sp->n_blocks, bt);
      size_t found = 99;
      assert_int_equal(kvt_lookup(e, ids[i], tok, (size_t)sp->n_blocks * bt, NULL, 0, &found), 0);
      assert_int_equal(found, want);
      free(tok);
    }
  }
}

/* Load every layer of a block that must be gone: each is KVT_ENOTFOUND. */
static void assert_block_gone(kvt_engine *e, const kvt_ns_id *ids, uint64_t seed,
                              const wl_block *b) {
  wl_ns w[WL_N_NS];
  wl_get(w);
  const kvt_shape *sh = &w[b->ns].sh;
  uint32_t tok[64], n_exact, n_wrong;
  int status[16];
  cu_tokens(seed, &w[b->ns].specs[b->spec], b->block, sh->block_tokens, tok);
  assert_int_equal(cu_load_block(e, ids[b->ns], sh, tu_salt(w[b->ns].model), &b->key, b->block, tok,
                                 status, NULL, &n_exact, &n_wrong),
                   KVT_ENOTFOUND);
  assert_int_equal(n_exact + n_wrong, 0);
  for (uint32_t l = 0; l < sh->n_layers; l++) assert_int_equal(status[l], KVT_ENOTFOUND);
}

/* A flipped byte in a slice, or in a record header: fsck names the block,
 * changes nothing without repair, and with repair removes the entry for
 * good, so the block is a miss, never other bytes. */
static void fsck_finds_and_repairs(uint32_t backend) {
  for (int where = 0; where < 2; where++) { /* 0: a slice, 1: the record header */
    char *dir = tu_tmpdir();
    uint64_t seed = tu_rand();
    cu_rec *recs;
    size_t nr = written_store(dir, backend, seed, &recs);
    /* A clean store is clean. */
    kvt_engine *e = open_cold(dir, backend);
    kvt_fsck_result fr;
    assert_int_equal(kvt_fsck(e, 1, &fr, NULL, NULL), 0);
    assert_int_equal(fr.checked, WL_DISTINCT);
    assert_int_equal(fr.bad, 0);
    assert_int_equal(fr.removed, 0);
    kvt_engine_close(e);

    const cu_rec *r = &recs[tu_below((uint32_t)nr)];
    int layer = where == 0 ? (int)tu_below(r->n_layers) : -1;
    corrupt(r, layer);
    e = open_cold(dir, backend);
    kvt_ns_id ids[WL_N_NS];
    assert_int_equal(wl_ids(e, ids), 3);
    wl_block blocks[32];
    size_t nb = wl_blocks(e, ids, seed, blocks, 32);
    int bi = block_of(blocks, nb, &r->key);
    assert_true(bi >= 0);
    for (int pass = 0; pass < 2; pass++) { /* without repair: twice the same */
      fsck_log lg = {.n = 0};
      assert_int_equal(kvt_fsck(e, 0, &fr, fsck_report, &lg), 0);
      assert_int_equal(fr.checked, WL_DISTINCT);
      assert_int_equal(fr.bad, 1);
      assert_int_equal(fr.removed, 0);
      assert_int_equal(lg.n, 1);
      assert_true(cu_key_eq(&lg.keys[0], &r->key));
    }
    kvt_stats st;
    tu_stats(e, &st);
    assert_int_equal(st.cold_records, WL_DISTINCT);
    if (where == 1) { /* reads check slices: they still give exact bytes or a miss */
      wl_ns w[WL_N_NS];
      wl_get(w);
      const wl_block *b = &blocks[bi];
      uint32_t tok[64], n_exact, n_wrong;
      cu_tokens(seed, &w[b->ns].specs[b->spec], b->block, w[b->ns].sh.block_tokens, tok);
      cu_load_block(e, ids[b->ns], &w[b->ns].sh, tu_salt(w[b->ns].model), &b->key, b->block, tok,
                    NULL, NULL, &n_exact, &n_wrong);
      assert_int_equal(n_wrong, 0);
    }
    fsck_log lg = {.n = 0};
    assert_int_equal(kvt_fsck(e, 1, &fr, fsck_report, &lg), 0);
    assert_int_equal(fr.bad, 1);
    assert_int_equal(fr.removed, 1);
    assert_true(lg.n == 1 && cu_key_eq(&lg.keys[0], &r->key));
    tu_stats(e, &st);
    assert_int_equal(st.cold_records, WL_DISTINCT - 1);
    assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
    assert_int_equal(fr.checked, WL_DISTINCT - 1);
    assert_int_equal(fr.bad, 0);
    assert_block_gone(e, ids, seed, &blocks[bi]);
    assert_lookups_stop_at(e, ids, seed, blocks, nb, &r->key, 1);
    kvt_engine_close(e);

    e = open_cold(dir, backend); /* the repair was durable */
    assert_int_equal(wl_ids(e, ids), 3);
    tu_stats(e, &st);
    assert_int_equal(st.cold_records, WL_DISTINCT - 1);
    assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
    assert_int_equal(fr.bad, 0);
    assert_block_gone(e, ids, seed, &blocks[bi]);
    assert_lookups_stop_at(e, ids, seed, blocks, nb, &r->key, 1);
    kvt_engine_close(e);
    free(recs);
    tu_rmtree(dir);
  }
}
BOTH(fsck_finds_and_repairs)

/* A corrupted slice read through kvt_seq_read and through a load is
 * KVT_ECORRUPT for that read, counted in cold_checksum_failures, and its
 * entry leaves the index (for good): every later read is a miss
 * (KVT_ENOTFOUND) and lookups stop before it. */
static void corrupt_read_is_miss(uint32_t backend) {
  char *dir = tu_tmpdir();
  uint64_t seed = tu_rand();
  cu_rec *recs;
  size_t nr = written_store(dir, backend, seed, &recs);
  uint32_t r1 = tu_below((uint32_t)nr), r2 = (r1 + 1 + tu_below((uint32_t)nr - 1)) % (uint32_t)nr;
  int l1 = (int)tu_below(recs[r1].n_layers), l2 = (int)tu_below(recs[r2].n_layers);
  corrupt(&recs[r1], l1);

  kvt_engine *e = open_cold(dir, backend);
  kvt_ns_id ids[WL_N_NS];
  assert_int_equal(wl_ids(e, ids), 3);
  wl_block blocks[32];
  size_t nb = wl_blocks(e, ids, seed, blocks, 32);
  wl_ns w[WL_N_NS];
  wl_get(w);

  /* r1 through kvt_seq_read on a sequence that reaches it. */
  const wl_block *b1 = &blocks[block_of(blocks, nb, &recs[r1].key)];
  const kvt_shape *sh = &w[b1->ns].sh;
  uint64_t salt = tu_salt(w[b1->ns].model);
  const cu_seqspec *sp = &w[b1->ns].specs[b1->spec];
  uint32_t *tok = cu_seq_tokens(seed, sp, b1->block + 1, sh->block_tokens);
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, ids[b1->ns], &q), 0);
  for (uint32_t j = 0; j <= b1->block; j++) {
    kvt_append_info info;
    assert_int_equal(kvt_seq_append(q, tok + (size_t)j * sh->block_tokens, sh->block_tokens, &info), 0);
    assert_int_equal(info.durable, 1);
  }
  assert_int_equal(kvt_seq_durable(q), b1->block + 1);
  const uint32_t *t1 = tok + (size_t)b1->block * sh->block_tokens;
  int exact;
  for (uint32_t l = 0; l < (uint32_t)l1; l++) { /* the layers before are fine */
    assert_int_equal(cu_read(q, sh, salt, b1->block, l, t1, &exact), 0);
    assert_true(exact);
  }
  assert_int_equal(cu_read(q, sh, salt, b1->block, (uint32_t)l1, t1, &exact), KVT_ECORRUPT);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_checksum_failures, 1);
  assert_int_equal(st.cold_records, WL_DISTINCT - 1);
  assert_int_equal(kvt_seq_durable(q), b1->block); /* no longer durable */
  for (uint32_t l = 0; l < sh->n_layers; l++) /* the entry is gone: every layer misses */
    assert_int_equal(cu_read(q, sh, salt, b1->block, l, t1, &exact), KVT_ENOTFOUND);
  for (uint32_t j = 0; j < b1->block; j++) /* blocks before it are untouched */
    for (uint32_t l = 0; l < sh->n_layers; l++) {
      assert_int_equal(cu_read(q, sh, salt, j, l, tok + (size_t)j * sh->block_tokens, &exact), 0);
      assert_true(exact);
    }
  kvt_seq_release(q);
  free(tok);
  assert_lookups_stop_at(e, ids, seed, blocks, nb, &recs[r1].key, 1);

  /* r2, corrupted while the store is open, through kvt_load_submit/wait. */
  corrupt(&recs[r2], l2);
  const wl_block *b2 = &blocks[block_of(blocks, nb, &recs[r2].key)];
  sh = &w[b2->ns].sh;
  uint32_t t2[64], n_exact, n_wrong;
  int status[16];
  cu_tokens(seed, &w[b2->ns].specs[b2->spec], b2->block, sh->block_tokens, t2);
  assert_int_equal(cu_load_block(e, ids[b2->ns], sh, tu_salt(w[b2->ns].model), &b2->key, b2->block,
                                 t2, status, NULL, &n_exact, &n_wrong),
                   KVT_ECORRUPT);
  assert_int_equal(n_wrong, 0);
  assert_int_equal(status[l2], KVT_ECORRUPT);
  for (int l = 0; l < l2; l++) assert_int_equal(status[l], 0); /* read before the bad one */
  tu_stats(e, &st);
  assert_int_equal(st.cold_checksum_failures, 2);
  assert_int_equal(st.cold_records, WL_DISTINCT - 2);
  assert_block_gone(e, ids, seed, b2);
  kvt_key gone[2] = {recs[r1].key, recs[r2].key};
  assert_lookups_stop_at(e, ids, seed, blocks, nb, gone, 2);
  kvt_engine_close(e);

  e = open_cold(dir, backend); /* still gone; what is left is clean */
  assert_int_equal(wl_ids(e, ids), 3);
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, WL_DISTINCT - 2);
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.checked, WL_DISTINCT - 2);
  assert_int_equal(fr.bad, 0);
  assert_block_gone(e, ids, seed, b1);
  assert_block_gone(e, ids, seed, b2);
  assert_lookups_stop_at(e, ids, seed, blocks, nb, gone, 2);
  kvt_engine_close(e);
  free(recs);
  tu_rmtree(dir);
}
BOTH(corrupt_read_is_miss)

/* Values from a small set: byte planes that zstd shrinks a lot. */
static void fill_compressible(tu_kv *b, const kvt_shape *s, uint64_t seed, uint32_t layer,
                              uint32_t block) {
  for (size_t i = 0; i < b->elems; i++) {
    uint64_t h = tu_mix(seed ^ tu_mix(((uint64_t)layer << 40) ^ ((uint64_t)block << 20) ^ i));
    float f = (float)((int)(h >> 61) - 4) * 0.125f;
    if (s->dtype == KVT_F32) {
      memcpy((char *)b->k + 4 * i, &f, 4);
      f = -f;
      memcpy((char *)b->v + 4 * i, &f, 4);
    } else {
      uint16_t k = s->dtype == KVT_F16 ? tu_f32_to_f16(f) : tu_f32_to_bf16(f);
      uint16_t v = s->dtype == KVT_F16 ? tu_f32_to_f16(-f) : tu_f32_to_bf16(-f);
      memcpy((char *)b->k + 2 * i, &k, 2);
      memcpy((char *)b->v + 2 * i, &v, 2);
    }
  }
}

/* Write nb blocks of compressible (or generated) data in every dtype with
 * cold_compress = compress; returns cold_write_bytes. */
static uint64_t write_dtypes(const char *dir, uint32_t backend, uint32_t compress, uint64_t seed,
                             int compressible, uint32_t nb) {
  kvt_options o;
  cu_opts(&o, backend);
  o.cold_compress = compress;
  kvt_engine *e = tu_open(dir, &o);
  static const uint32_t dt[3] = {KVT_F32, KVT_F16, KVT_BF16};
  for (int d = 0; d < 3; d++) {
    kvt_shape sh = {.n_layers = 2, .n_kv_heads = 4, .head_dim = 64, .dtype = dt[d], .block_tokens = 16};
    char model[32];
    snprintf(model, sizeof model, "z-%d-%d", d, compressible);
    kvt_ns_id ns = tu_register(e, model, &sh);
    kvt_seq *q;
    tu_kv kv;
    tu_kv_alloc(&kv, &sh);
    assert_int_equal(kvt_seq_create(e, ns, &q), 0);
    for (uint32_t j = 0; j < nb; j++) {
      uint32_t tok[16];
      for (int t = 0; t < 16; t++) tok[t] = (uint32_t)(seed + j * 16 + (uint32_t)t);
      assert_int_equal(kvt_seq_append(q, tok, 16, NULL), 0);
      for (uint32_t l = 0; l < sh.n_layers; l++) {
        if (compressible) fill_compressible(&kv, &sh, seed + (uint64_t)d, l, j);
        else tu_kv_fill(&kv, &sh, seed + (uint64_t)d, l, j, tok);
        assert_int_equal(kvt_seq_put(q, j, l, &kv.kv), 0);
      }
    }
    kvt_seq_release(q);
    tu_kv_free(&kv);
  }
  assert_int_equal(kvt_sync(e), 0);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 3 * nb);
  kvt_engine_close(e);
  return st.cold_write_bytes;
}

/* Read them back with cold_compress = compress (either may read either). */
static void check_dtypes(const char *dir, uint32_t backend, uint32_t compress, uint64_t seed,
                         int compressible, uint32_t nb) {
  kvt_options o;
  cu_opts(&o, backend);
  o.cold_compress = compress;
  kvt_engine *e = tu_open(dir, &o);
  static const uint32_t dt[3] = {KVT_F32, KVT_F16, KVT_BF16};
  for (int d = 0; d < 3; d++) {
    kvt_shape sh = {.n_layers = 2, .n_kv_heads = 4, .head_dim = 64, .dtype = dt[d], .block_tokens = 16};
    char model[32];
    snprintf(model, sizeof model, "z-%d-%d", d, compressible);
    kvt_ns_id ns = tu_register(e, model, &sh);
    kvt_seq *q;
    tu_kv want, got;
    tu_kv_alloc(&want, &sh);
    tu_kv_alloc(&got, &sh);
    assert_int_equal(kvt_seq_create(e, ns, &q), 0);
    for (uint32_t j = 0; j < nb; j++) {
      uint32_t tok[16];
      kvt_append_info info;
      for (int t = 0; t < 16; t++) tok[t] = (uint32_t)(seed + j * 16 + (uint32_t)t);
      assert_int_equal(kvt_seq_append(q, tok, 16, &info), 0);
      assert_int_equal(info.durable, 1);
      for (uint32_t l = 0; l < sh.n_layers; l++) {
        if (compressible) fill_compressible(&want, &sh, seed + (uint64_t)d, l, j);
        else tu_kv_fill(&want, &sh, seed + (uint64_t)d, l, j, tok);
        assert_int_equal(kvt_seq_read(q, j, l, got.k, got.v, got.bytes), 0);
        assert_memory_equal(got.k, want.k, want.bytes);
        assert_memory_equal(got.v, want.v, want.bytes);
      }
    }
    kvt_seq_release(q);
    tu_kv_free(&want);
    tu_kv_free(&got);
  }
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.checked, 3 * nb);
  assert_int_equal(fr.bad, 0);
  kvt_engine_close(e);
}

/* cold_compress 0 and 1 both round-trip every dtype, compressible or not;
 * compression writes fewer bytes when the data compresses. */
static void compress_roundtrip(uint32_t backend) {
  uint64_t seed = tu_rand() & 0xFFFFFFF;
  const uint32_t nb = 4;
  uint64_t bytes[2][2];
  for (int z = 0; z < 2; z++) {
    for (int c = 0; c < 2; c++) {
      char *dir = tu_tmpdir();
      bytes[z][c] = write_dtypes(dir, backend, (uint32_t)z, seed, c, nb);
      check_dtypes(dir, backend, (uint32_t)z, seed, c, nb);
      check_dtypes(dir, backend, (uint32_t)!z, seed, c, nb); /* codec is per slice */
      tu_rmtree(dir);
    }
  }
  assert_true(bytes[1][1] < bytes[0][1]);   /* compressible: smaller with zstd */
  assert_true(bytes[1][0] <= bytes[0][0]);  /* never larger */
}
BOTH(compress_roundtrip)

/* cold_admit_min_seen = 2: a block appended once is not written; the
 * second append of it (by another sequence) admits it. */
static void admission(uint32_t backend) {
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, backend);
  o.cold_admit_min_seen = 2;
  kvt_engine *e = tu_open(dir, &o);
  kvt_shape sh = tu_shape_small(KVT_F16);
  kvt_ns_id ns = tu_register(e, "admit", &sh);
  uint64_t salt = tu_salt("admit");
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  uint32_t once[3][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}};
  uint32_t twice[2][4] = {{1, 2, 3, 4}, {13, 14, 15, 16}}; /* shares block 0 with once */
  kvt_seq *a, *b;
  assert_int_equal(kvt_seq_create(e, ns, &a), 0);
  for (int j = 0; j < 3; j++) tu_append_put(a, &sh, salt, once[j], &kv);
  assert_int_equal(kvt_sync(e), 0);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 0);
  assert_int_equal(st.cold_written, 0);
  assert_int_equal(kvt_seq_durable(a), 0);
  assert_int_equal(kvt_seq_create(e, ns, &b), 0);
  for (int j = 0; j < 2; j++) tu_append_put(b, &sh, salt, twice[j], &kv);
  assert_int_equal(kvt_sync(e), 0);
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 1); /* block 0, seen twice */
  assert_int_equal(kvt_seq_durable(a), 1);
  assert_int_equal(kvt_seq_durable(b), 1);
  kvt_seq_release(a);
  kvt_seq_release(b);
  kvt_engine_close(e);

  e = tu_open(dir, &o);
  ns = tu_register(e, "admit", &sh);
  size_t found;
  assert_int_equal(kvt_lookup(e, ns, &once[0][0], 12, NULL, 0, &found), 0);
  assert_int_equal(found, 1);
  assert_int_equal(kvt_lookup(e, ns, &twice[0][0], 8, NULL, 0, &found), 0);
  assert_int_equal(found, 1);
  assert_int_equal(kvt_seq_create(e, ns, &a), 0);
  kvt_append_info info;
  assert_int_equal(kvt_seq_append(a, once[0], 4, &info), 0);
  assert_int_equal(info.durable, 1);
  for (uint32_t l = 0; l < sh.n_layers; l++) tu_assert_block(a, &sh, salt, 0, l, once[0]);
  assert_int_equal(kvt_seq_append(a, once[1], 4, &info), 0);
  assert_int_equal(info.durable, 0);
  kvt_seq_release(a);
  kvt_engine_close(e);
  tu_kv_free(&kv);
  tu_rmtree(dir);
}
BOTH(admission)

/* KVT_ADMIT_PROMPT: a sequence's prompt blocks are written, its output
 * blocks are not (and are not held hot for the flusher); the next turn,
 * which appends the same blocks as prompt, gets them written. */
static void admit_prompt(uint32_t backend) {
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, backend);
  o.cold_admit = KVT_ADMIT_PROMPT;
  kvt_engine *e = tu_open(dir, &o);
  kvt_shape sh = tu_shape_small(KVT_F16);
  kvt_ns_id ns = tu_register(e, "prompt", &sh);
  uint64_t salt = tu_salt("prompt");
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  uint32_t tok[6][4];
  for (uint32_t j = 0; j < 6; j++)
    for (uint32_t i = 0; i < 4; i++) tok[j][i] = 100 * j + i;
  kvt_seq *a, *b;
  assert_int_equal(kvt_seq_output(NULL, 1), KVT_ENULL);
  assert_int_equal(kvt_seq_create(e, ns, &a), 0);
  for (int j = 0; j < 3; j++) tu_append_put(a, &sh, salt, tok[j], &kv); /* prompt */
  assert_int_equal(kvt_seq_output(a, 1), 0);
  for (int j = 3; j < 5; j++) tu_append_put(a, &sh, salt, tok[j], &kv); /* output */
  assert_int_equal(kvt_sync(e), 0);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 3);
  assert_int_equal(kvt_seq_durable(a), 3);
  /* turn two: the whole conversation so far is its prompt */
  assert_int_equal(kvt_seq_create(e, ns, &b), 0);
  for (int j = 0; j < 6; j++) tu_append_put(b, &sh, salt, tok[j], &kv);
  assert_int_equal(kvt_sync(e), 0);
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 6);
  assert_int_equal(kvt_seq_durable(a), 5);
  assert_int_equal(kvt_seq_durable(b), 6);
  kvt_seq_release(a);
  kvt_seq_release(b);
  kvt_engine_close(e);
  /* a fork inherits the output mode; an unknown rule is refused */
  o.cold_admit = 2;
  kvt_engine *bad = NULL;
  assert_int_equal(kvt_engine_open(dir, &o, &bad), KVT_EOPTION);
  assert_null(bad);
  o.cold_admit = KVT_ADMIT_PROMPT;
  e = tu_open(dir, &o);
  ns = tu_register(e, "prompt", &sh);
  assert_int_equal(kvt_seq_create(e, ns, &a), 0);
  assert_int_equal(kvt_seq_output(a, 1), 0);
  uint32_t fresh[2][4] = {{7, 7, 7, 7}, {8, 8, 8, 8}};
  tu_append_put(a, &sh, salt, fresh[0], &kv);
  assert_int_equal(kvt_seq_fork(a, UINT32_MAX, &b), 0);
  tu_append_put(b, &sh, salt, fresh[1], &kv);
  assert_int_equal(kvt_sync(e), 0);
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 6); /* neither output block */
  assert_int_equal(kvt_seq_durable(b), 0);
  size_t found;
  assert_int_equal(kvt_lookup(e, ns, &tok[0][0], 24, NULL, 0, &found), 0);
  assert_int_equal(found, 6);
  kvt_seq_release(a);
  kvt_seq_release(b);
  kvt_engine_close(e);
  tu_kv_free(&kv);
  tu_rmtree(dir);
}
BOTH(admit_prompt)

/* Store specs of one namespace, each sequence synced (and checked
 * durable) and released. */
static void store_specs(kvt_engine *e, kvt_ns_id ns, const kvt_shape *sh, uint64_t salt,
                        uint64_t seed, const cu_seqspec *specs, size_t n) {
  tu_kv kv;
  tu_kv_alloc(&kv, sh);
  for (size_t s = 0; s < n; s++) {
    kvt_seq *q;
    assert_int_equal(kvt_seq_create(e, ns, &q), 0);
    for (uint32_t j = 0; j < specs[s].n_blocks; j++) {
      uint32_t tok[64];
      cu_tokens(seed, &specs[s], j, sh->block_tokens, tok);
      assert_int_equal(cu_append_put(q, sh, salt, tok, &kv, NULL), 0);
    }
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(kvt_seq_durable(q), specs[s].n_blocks);
    kvt_seq_release(q);
  }
  tu_kv_free(&kv);
}

static size_t lookup_spec(kvt_engine *e, kvt_ns_id ns, const kvt_shape *sh, uint64_t seed,
                          const cu_seqspec *sp) {
  uint32_t *tok = cu_seq_tokens(seed, sp, sp->n_blocks, sh->block_tokens);
  size_t found = 99;
  assert_int_equal(kvt_lookup(e, ns, tok, (size_t)sp->n_blocks * sh->block_tokens, NULL, 0, &found), 0);
  free(tok);
  return found;
}

/* Load every layer of block j of sp by key: 1 when all exact, 0 when all
 * missing; fails on anything else. */
static int load_spec_block(kvt_engine *e, kvt_ns_id ns, const kvt_shape *sh, uint64_t salt,
                           uint64_t seed, const cu_seqspec *sp, uint32_t j) {
  uint32_t *tok = cu_seq_tokens(seed, sp, j + 1, sh->block_tokens);
  kvt_key *keys = calloc(j + 1, sizeof *keys);
  size_t nk;
  assert_int_equal(kvt_keys(e, ns, tok, (size_t)(j + 1) * sh->block_tokens, keys, j + 1, &nk), 0);
  uint32_t n_exact, n_wrong;
  int rc = cu_load_block(e, ns, sh, salt, &keys[j], j, tok + (size_t)j * sh->block_tokens, NULL,
                         NULL, &n_exact, &n_wrong);
  free(keys);
  free(tok);
  assert_int_equal(n_wrong, 0);
  if (rc == 0) {
    assert_int_equal(n_exact, sh->n_layers);
    return 1;
  }
  assert_int_equal(rc, KVT_ENOTFOUND);
  assert_int_equal(n_exact, 0);
  return 0;
}

/* kvt_drop_prefix removes, durably, the prefix and what extends it; a
 * block sharing only part of it stays stored but unreachable by lookup. */
static void drop_prefix_durable(uint32_t backend) {
  char *dir = tu_tmpdir();
  uint64_t seed = tu_rand();
  kvt_shape sh = tu_shape_small(KVT_BF16);
  uint64_t salt = tu_salt("dropper");
  /* X and Y share blocks 0-1; Z shares block 0 only; W is unrelated. */
  const cu_seqspec X = {0, 0, 2, 4}, Y = {0, 1, 2, 3}, Z = {0, 2, 1, 3}, W = {1, 0, 0, 2};
  const cu_seqspec all[4] = {X, Y, Z, W};
  kvt_engine *e = open_cold(dir, backend);
  kvt_ns_id ns = tu_register(e, "dropper", &sh);
  store_specs(e, ns, &sh, salt, seed, all, 4);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 9); /* b0 b1 x2 x3 y2 z1 z2 w0 w1 */
  uint32_t *px = cu_seq_tokens(seed, &X, 2, sh.block_tokens);
  uint64_t dropped = 0;
  assert_int_equal(kvt_drop_prefix(e, ns, px, 2 * sh.block_tokens, &dropped), 0);
  assert_int_equal(dropped, 5); /* b0 b1 x2 x3 y2 */
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 4);
  for (int pass = 0; pass < 2; pass++) {
    assert_int_equal(lookup_spec(e, ns, &sh, seed, &X), 0);
    assert_int_equal(lookup_spec(e, ns, &sh, seed, &Y), 0);
    assert_int_equal(lookup_spec(e, ns, &sh, seed, &Z), 0); /* lost its chain head */
    assert_int_equal(lookup_spec(e, ns, &sh, seed, &W), 2);
    for (uint32_t j = 0; j < 4; j++) assert_int_equal(load_spec_block(e, ns, &sh, salt, seed, &X, j), 0);
    assert_int_equal(load_spec_block(e, ns, &sh, salt, seed, &Y, 2), 0);
    assert_int_equal(load_spec_block(e, ns, &sh, salt, seed, &Z, 1), 1); /* kept */
    assert_int_equal(load_spec_block(e, ns, &sh, salt, seed, &Z, 2), 1);
    assert_int_equal(load_spec_block(e, ns, &sh, salt, seed, &W, 1), 1);
    kvt_engine_close(e); /* and after reopening */
    e = open_cold(dir, backend);
    ns = tu_register(e, "dropper", &sh);
    tu_stats(e, &st);
    assert_int_equal(st.cold_records, 4);
  }
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.checked, 4);
  assert_int_equal(fr.bad, 0);
  /* Writing X again makes it durable again. */
  store_specs(e, ns, &sh, salt, seed, &X, 1);
  assert_int_equal(lookup_spec(e, ns, &sh, seed, &X), 4);
  kvt_engine_close(e);
  free(px);
  tu_rmtree(dir);
}
BOTH(drop_prefix_durable)

/* kvt_ns_drop removes every block of the namespace and the namespace,
 * durably; registering the same descriptor again finds no stale KV. */
static void ns_drop_durable(uint32_t backend) {
  char *dir = tu_tmpdir();
  uint64_t seed = tu_rand();
  kvt_shape sa = tu_shape_small(KVT_BF16), sb = tu_shape_small(KVT_F32);
  const cu_seqspec A[2] = {{0, 0, 1, 3}, {0, 1, 1, 2}}, B[1] = {{0, 0, 0, 3}};
  kvt_engine *e = open_cold(dir, backend);
  kvt_ns_id na = tu_register(e, "gone", &sa), nb = tu_register(e, "stays", &sb);
  store_specs(e, na, &sa, tu_salt("gone"), seed, A, 2);
  store_specs(e, nb, &sb, tu_salt("stays"), seed, B, 1);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 4 + 3);
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, na, &q), 0);
  assert_int_equal(kvt_ns_drop(e, na), KVT_EBUSY);
  kvt_seq_release(q);
  assert_int_equal(kvt_ns_drop(e, na), 0);
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 3);
  assert_int_equal(st.namespaces, 1);
  kvt_engine_close(e);

  e = open_cold(dir, backend);
  kvt_ns_id id;
  kvt_ns_desc d;
  assert_int_equal(kvt_ns_get(e, 0, &id, &d), 0);
  assert_string_equal(d.model_id, "stays");
  assert_int_equal(kvt_ns_get(e, 1, &id, &d), KVT_ENOTFOUND);
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 3);
  nb = id;
  assert_int_equal(lookup_spec(e, nb, &sb, seed, &B[0]), 3);
  for (uint32_t j = 0; j < 3; j++)
    assert_int_equal(load_spec_block(e, nb, &sb, tu_salt("stays"), seed, &B[0], j), 1);
  na = tu_register(e, "gone", &sa); /* same descriptor, so the same keys */
  for (int s = 0; s < 2; s++) {
    assert_int_equal(lookup_spec(e, na, &sa, seed, &A[s]), 0);
    for (uint32_t j = 0; j < A[s].n_blocks; j++)
      assert_int_equal(load_spec_block(e, na, &sa, tu_salt("gone"), seed, &A[s], j), 0);
  }
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.checked, 3);
  assert_int_equal(fr.bad, 0);
  kvt_engine_close(e);
  tu_rmtree(dir);
}
BOTH(ns_drop_durable)

/* A hot tier smaller than the data: referenced blocks whose token block is
 * durable leave RAM, still read back exactly (from cold) through
 * kvt_seq_read; kvt_seq_retained lists them as cold; lookups report a
 * block with a layer out of RAM as cold; kvt_seq_gather of a layer that
 * RAM cannot hold whole refuses, writing nothing. */
static void evict_to_cold(uint32_t backend) {
  char *dir = tu_tmpdir();
  kvt_shape sh = tu_shape_small(KVT_BF16);
  size_t each = kvt_shape_block_bytes(&sh);
  const uint32_t nb = 16, L = sh.n_layers;
  kvt_options o;
  cu_opts(&o, backend);
  o.tier_bytes_limit[KVT_TIER_HOT] = 12 * (2 * each + 256); /* ~ 12 of 64 layer blocks */
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "evict", &sh);
  uint64_t salt = tu_salt("evict");
  uint32_t *tok = malloc(nb * sh.block_tokens * sizeof *tok);
  for (uint32_t i = 0; i < nb * sh.block_tokens; i++) tok[i] = (uint32_t)tu_rand();
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, ns, &q), 0);
  for (uint32_t j = 0; j < nb; j++) tu_append_put(q, &sh, salt, tok + j * sh.block_tokens, &kv);
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(q), nb);
  kvt_stats st;
  tu_stats(e, &st);
  assert_true(st.evictions[KVT_TIER_HOT] > 0);
  assert_true(st.tier_bytes[KVT_TIER_HOT] <= o.tier_bytes_limit[KVT_TIER_HOT]);
  assert_true(st.tier_blocks[KVT_TIER_HOT] < (uint64_t)nb * L);
  assert_int_equal(st.cold_records, nb);
  uint64_t reads0 = st.cold_reads;

  /* kvt_seq_retained lists what left RAM as cold, without reading */
  uint8_t in_ram[16][8] = {{0}};
  uint64_t listed_hot = 0;
  uint8_t *gk = malloc(nb * each), *gv = malloc(nb * each);
  kvt_gathered g[16];
  tu_kv want;
  tu_kv_alloc(&want, &sh);
  for (uint32_t l = 0; l < L; l++) {
    size_t n = 0;
    assert_int_equal(kvt_seq_retained(q, l, g, 16, &n), 0);
    assert_int_equal(n, nb);
    for (size_t i = 0; i < n; i++) {
      assert_int_equal(g[i].block, i);
      in_ram[i][l] = g[i].tier != KVT_TIER_COLD;
      listed_hot += g[i].tier == KVT_TIER_HOT;
    }
  }
  tu_stats(e, &st);
  assert_int_equal(listed_hot, st.tier_blocks[KVT_TIER_HOT]);
  assert_true(listed_hot < (uint64_t)nb * L);
  assert_int_equal(st.cold_reads, reads0);
  /* lookups: cold when any layer left RAM */
  kvt_lookup_entry ent[16];
  size_t found;
  assert_int_equal(kvt_lookup(e, ns, tok, nb * sh.block_tokens, ent, 16, &found), 0);
  assert_int_equal(found, nb);
  uint64_t out_of_ram = 0;
  for (uint32_t j = 0; j < nb; j++) {
    int all = 1;
    for (uint32_t l = 0; l < L; l++) {
      all &= in_ram[j][l];
      out_of_ram += !in_ram[j][l];
    }
    assert_int_equal(ent[j].tier, all ? KVT_TIER_HOT : KVT_TIER_COLD);
    assert_true(ent[j].est_load_us > 0);
  }
  /* every block reads back exactly, the evicted ones from cold */
  for (uint32_t j = 0; j < nb; j++)
    for (uint32_t l = 0; l < L; l++) tu_assert_block(q, &sh, salt, j, l, tok + j * sh.block_tokens);
  tu_stats(e, &st);
  assert_int_equal(st.cold_reads - reads0, out_of_ram);
  assert_int_equal(st.cold_checksum_failures, 0);
  /* 12 layer blocks of RAM cannot hold a layer of 16: a gather brings back
   * what fits, then refuses (KVT_ENOTRESIDENT, saying RAM is full) and
   * writes nothing; the hot tier stays within its limit */
  for (uint32_t l = 0; l < L; l++) {
    size_t bytes = nb * each, n = 0;
    memset(gk, 0x3c, nb * each);
    assert_int_equal(kvt_seq_gather(q, l, gk, gv, &bytes, g, 16, &n), KVT_ENOTRESIDENT);
    assert_true(n > 0 && n <= nb);
    for (size_t i = 0; i < nb * each; i++) assert_int_equal(gk[i], 0x3c);
    kvt_error_info info;
    assert_int_equal(kvt_last_error(e, &info), 0);
    assert_non_null(strstr(info.message, "RAM is full"));
    tu_stats(e, &st);
    assert_true(st.tier_bytes[KVT_TIER_HOT] <= o.tier_bytes_limit[KVT_TIER_HOT]);
  }
  /* a hot tier that is still full of referenced blocks can take more */
  uint32_t more[4] = {1, 1, 2, 2};
  tu_append_put(q, &sh, salt, more, &kv);
  tu_assert_block(q, &sh, salt, nb, 0, more);
  kvt_seq_release(q);
  tu_kv_free(&want);
  tu_kv_free(&kv);
  free(gk);
  free(gv);
  free(tok);
  kvt_engine_close(e);
  tu_rmtree(dir);
}
BOTH(evict_to_cold)

/* ------------------------------------------------- a full cold tier */

/* A cold tier of three segments (two for data, one spare for relocating
 * blocks out of a reclaimed one): a sequence that references more than it
 * holds gets KVT_EFULL from kvt_sync, its durable watermark stops, and its
 * blocks stay readable from RAM; nothing durable is lost. Once released,
 * its blocks make room (segments are reclaimed) for a new sequence, which
 * becomes durable in full and survives reopening. */
static void cold_full(uint32_t backend) {
  char *dir = tu_tmpdir();
  uint64_t seed = tu_rand();
  kvt_options o;
  cu_opts(&o, backend);
  o.tier_bytes_limit[KVT_TIER_COLD] = 3 * o.cold_segment_bytes;
  kvt_engine *e = tu_open(dir, &o);
  kvt_shape sh = tu_shape_small(KVT_BF16);
  kvt_ns_id ns = tu_register(e, "full", &sh);
  uint64_t salt = tu_salt("full");
  const uint32_t na = 150, nb = 60; /* records of ~20 KiB: ~100 fit in two segments */
  cu_seqspec a = {0, 0, 0, na}, b = {1, 0, 0, nb};
  uint32_t *ta = cu_seq_tokens(seed, &a, na, sh.block_tokens);
  uint32_t *tb = cu_seq_tokens(seed, &b, nb, sh.block_tokens);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, ns, &q), 0);
  int full = 0;
  for (uint32_t j = 0; j < na; j++) {
    tu_append_put(q, &sh, salt, ta + j * sh.block_tokens, &kv);
    if ((j + 1) % 10) continue;
    int rc = kvt_sync(e);
    if (rc && rc != KVT_EFULL) fprintf(stderr, "cold_full: sync after %u blocks: %s\n", j + 1, kvt_strerror(rc));
    assert_true(rc == 0 || rc == KVT_EFULL);
    full |= rc == KVT_EFULL;
  }
  assert_true(full);
  uint32_t da = kvt_seq_durable(q);
  assert_true(da > 0 && da < na);
  kvt_stats st;
  tu_stats(e, &st);
  assert_true(st.cold_segments <= 3);
  assert_true(st.cold_write_failures > 0);
  assert_true(st.tier_bytes[KVT_TIER_COLD] <= o.tier_bytes_limit[KVT_TIER_COLD]);
  for (uint32_t j = 0; j < na; j += 7) /* still readable, exactly */
    for (uint32_t l = 0; l < sh.n_layers; l++) tu_assert_block(q, &sh, salt, j, l, ta + j * sh.block_tokens);
  size_t found = 0;
  assert_int_equal(kvt_lookup(e, ns, ta, (size_t)na * sh.block_tokens, NULL, 0, &found), 0);
  assert_int_equal(found, na); /* in RAM, all of them */
  kvt_seq_release(q);

  assert_int_equal(kvt_seq_create(e, ns, &q), 0);
  for (uint32_t j = 0; j < nb; j++) tu_append_put(q, &sh, salt, tb + j * sh.block_tokens, &kv);
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(q), nb);
  kvt_seq_release(q);
  kvt_engine_close(e);

  e = tu_open(dir, &o);
  ns = tu_register(e, "full", &sh);
  assert_int_equal(kvt_lookup(e, ns, tb, (size_t)nb * sh.block_tokens, NULL, 0, &found), 0);
  assert_int_equal(found, nb);
  for (uint32_t j = 0; j < nb; j++) assert_int_equal(load_spec_block(e, ns, &sh, salt, seed, &b, j), 1);
  for (uint32_t j = 0; j < na; j += 3) /* the first sequence: exact or evicted, never other bytes */
    load_spec_block(e, ns, &sh, salt, seed, &a, j);
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.bad, 0);
  tu_stats(e, &st);
  assert_int_equal(fr.checked, st.cold_records);
  assert_true(st.cold_segments <= 3);
  kvt_engine_close(e);
  tu_kv_free(&kv);
  free(ta);
  free(tb);
  tu_rmtree(dir);
}
BOTH(cold_full)

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
static void readonly_beside_growing_writer(uint32_t backend) {
  char *dir = tu_tmpdir();
  uint64_t seed = tu_rand();
  kvt_engine *e = open_cold(dir, backend);
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
    cu_tokens(seed, &sp, j, sh.block_tokens, tok);
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
  snprintf(a_dir, sizeof a_dir, "%s", dir);
  snprintf(a_b, sizeof a_b, "%u", backend);
  snprintf(a_s, sizeof a_s, "%llu", (unsigned long long)seed);
  snprintf(a_r, sizeof a_r, "%d", p2c[0]);
  snprintf(a_w, sizeof a_w, "%d", c2p[1]);
  char *argv[] = {"test_cold", "--child", "grow", a_dir, a_b, a_s, a_r, a_w, NULL};
  pid_t pid = cu_spawn_self(argv);
  assert_true(pid > 0);
  char b;
  int got = (int)read(c2p[0], &b, 1); /* the reader is open */
  for (uint32_t j = GROW_BEFORE; j < GROW_BEFORE + GROW_AFTER; j++) {
    uint32_t tok[4];
    cu_tokens(seed, &sp, j, sh.block_tokens, tok);
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
  tu_rmtree(dir);
}
BOTH(readonly_beside_growing_writer)

/* ------------------------------------------------------------ O_DIRECT */

/* Does dir's file system take O_DIRECT? */
static int direct_ok(const char *dir) {
  char p[700];
  snprintf(p, sizeof p, "%s/direct-probe", dir);
  int fd = open(p, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
  unlink(p);
  return fd >= 0;
}

/* Segment files this process has open under dir: how many, and how many
 * of them with O_DIRECT (from /proc/self/fdinfo). */
static void segment_fds(const char *dir, int *n, int *n_direct) {
  char prefix[700], link[1024], path[320];
  snprintf(prefix, sizeof prefix, "%s/segments/seg-", dir);
  *n = *n_direct = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return;
  for (struct dirent *de; (de = readdir(d));) {
    if (de->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/self/fd/%s", de->d_name);
    ssize_t len = readlink(path, link, sizeof link - 1);
    if (len < 0) continue;
    link[len] = 0;
    if (strncmp(link, prefix, strlen(prefix)) != 0) continue;
    snprintf(path, sizeof path, "/proc/self/fdinfo/%s", de->d_name);
    FILE *f = fopen(path, "r");
    char line[128];
    unsigned long flags = 0;
    while (f && fgets(line, sizeof line, f))
      if (sscanf(line, "flags: %lo", &flags) == 1) break;
    if (f) fclose(f);
    (*n)++;
    *n_direct += (flags & O_DIRECT) != 0;
  }
  closedir(d);
}

/* Segment files are written and read with O_DIRECT where the file system
 * allows it (DESIGN.md section 3), whichever way they were opened: created
 * by the writer, or opened again by a later one. */
static void segments_direct(uint32_t backend) {
  char *dir = tu_tmpdir();
  if (!direct_ok(dir)) {
    fprintf(stderr, "SKIP %s: no O_DIRECT on %s\n", __func__, dir);
    tu_rmtree(dir);
    tu_skip_mark();
    skip();
  }
  uint64_t seed = tu_rand();
  kvt_engine *e = open_cold(dir, backend);
  kvt_ns_id ids[WL_N_NS];
  kvt_seq *seqs[WL_MAX_SEQS];
  wl_write(e, seed, ids, seqs, cu_backend_name(backend));
  int n, n_direct;
  segment_fds(dir, &n, &n_direct);
  assert_true(n >= 1);
  if (n_direct != n) fprintf(stderr, "%d of %d segment fds without O_DIRECT (new store)\n", n - n_direct, n);
  assert_int_equal(n_direct, n);
  release_all(seqs, WL_MAX_SEQS);
  kvt_engine_close(e);
  for (int round = 0; round < 3; round++) { /* reopened, read, written */
    e = open_cold(dir, backend);
    assert_int_equal(wl_verify(e, seed, 0, 0, WL_DISTINCT), 0);
    segment_fds(dir, &n, &n_direct);
    assert_true(n >= 1);
    if (n_direct != n) fprintf(stderr, "%d of %d segment fds without O_DIRECT (reopened)\n", n - n_direct, n);
    assert_int_equal(n_direct, n);
    kvt_engine_close(e);
  }
  tu_rmtree(dir);
}
BOTH(segments_direct)

/* Loads of many small slices at once: the reader merges slices that
 * follow each other on disk into one read (spans, across records too).
 * Every layer of 40 blocks in one submit, in disk order, with requests
 * that break a span between them (an unknown key, a block read twice, a
 * layer out of order, a wrong buffer size): each status is its own, each
 * success exactly its bytes; then the same in reverse order; then in disk
 * order with the first read cut short (io/fault.c): the rest is read
 * again, every block still there and exact. */
#define SP_BLK 40
static void span_pass(kvt_engine *e, kvt_ns_id ns, const kvt_shape *shp, uint64_t salt,
                      const kvt_key *keys, const uint32_t *tok, int reversed);

static void span_loads(uint32_t backend) {
  char *dir = tu_tmpdir();
  kvt_shape sh = {.n_layers = 4, .n_kv_heads = 2, .head_dim = 16, .dtype = KVT_BF16,
                  .block_tokens = 4}; /* 512-byte slices: one 4 KiB page each */
  uint64_t salt = tu_salt("spans"), data = tu_rand();
  cu_seqspec sp = {0, 0, 0, SP_BLK};
  uint32_t *tok = cu_seq_tokens(data, &sp, SP_BLK, sh.block_tokens);
  kvt_key keys[SP_BLK];
  kvt_engine *e = open_cold(dir, backend);
  kvt_ns_id ns = tu_register(e, "spans", &sh);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, ns, &q), 0);
  for (uint32_t j = 0; j < SP_BLK; j++) {
    kvt_append_info info;
    assert_int_equal(cu_append_put(q, &sh, salt, tok + j * sh.block_tokens, &kv, &info), 0);
    keys[j] = info.key;
  }
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(q), SP_BLK);
  kvt_seq_release(q);
  kvt_engine_close(e);

  for (int pass = 0; pass < 3; pass++) {
    kvt_options o;
    cu_opts(&o, backend);
    if (pass == 2) /* the reader's first read returns half of what it asked for */
      o.test_fault = (kvt_test_fault){.ops = 1u << 1, .kind = 3 /* short */, .after = 1,
                                      .count = 1, .seed = 1};
    e = tu_open(dir, &o); /* nothing in RAM: every load is a cold read */
    ns = tu_register(e, "spans", &sh);
    span_pass(e, ns, &sh, salt, keys, tok, pass == 1);
    kvt_stats st;
    tu_stats(e, &st);
    assert_int_equal(st.cold_records, SP_BLK); /* nothing read left the index */
    kvt_engine_close(e);
  }
  tu_kv_free(&kv);
  free(tok);
  tu_rmtree(dir);
}

/* One submit of every layer of every block (reversed: last first), with
 * three requests that break spans between them; checks every status and
 * every byte. */
static void span_pass(kvt_engine *e, kvt_ns_id ns, const kvt_shape *shp, uint64_t salt,
                      const kvt_key *keys, const uint32_t *tok, int reversed) {
  kvt_shape sh = *shp;
  size_t n = (size_t)SP_BLK * sh.n_layers + 4;
  kvt_load_req *r = calloc(n, sizeof *r);
  uint32_t *blk = calloc(n, sizeof *blk);
  int *want = calloc(n, sizeof *want);
  tu_kv *got = calloc(n, sizeof *got), exp;
  assert_non_null(r);
  tu_kv_alloc(&exp, &sh);
  {
    size_t m = 0;
    for (uint32_t i = 0; i < SP_BLK * sh.n_layers; i++) {
      uint32_t x = reversed ? SP_BLK * sh.n_layers - 1 - i : i, j = x / sh.n_layers, l = x % sh.n_layers;
      if (i == 37) { /* an unknown key */
        blk[m] = UINT32_MAX;
        want[m] = KVT_ENOTFOUND;
        r[m++] = (kvt_load_req){.key = {{0xee}}, .layer = 1};
      }
      if (i == 61) { /* block 3 again, layer 2 */
        blk[m] = 3;
        want[m] = 0;
        r[m++] = (kvt_load_req){.key = keys[3], .layer = 2};
      }
      if (i == 90) { /* a wrong buffer size */
        blk[m] = UINT32_MAX;
        want[m] = KVT_EBUFSIZE;
        r[m++] = (kvt_load_req){.key = keys[j], .layer = l, .bytes_each = 1};
      }
      blk[m] = j;
      want[m] = 0;
      r[m++] = (kvt_load_req){.key = keys[j], .layer = l};
    }
    assert_true(m <= n);
    for (size_t i = 0; i < m; i++) {
      if (!got[i].k) tu_kv_alloc(&got[i], &sh);
      memset(got[i].k, 0x5a, got[i].bytes);
      memset(got[i].v, 0xa5, got[i].bytes);
      r[i].k_out = got[i].k;
      r[i].v_out = got[i].v;
      if (r[i].bytes_each == 0) r[i].bytes_each = got[i].bytes;
      r[i].status = 12345;
    }
    kvt_load *ld = NULL;
    assert_int_equal(kvt_load_submit(e, ns, r, m, &ld), 0);
    size_t ok = 0;
    kvt_load_wait(ld, &ok);
    size_t n_ok = 0;
    for (size_t i = 0; i < m; i++) {
      assert_int_equal(r[i].status, want[i]);
      if (want[i]) continue;
      n_ok++;
      assert_int_equal(r[i].tier, KVT_TIER_COLD);
      assert_true(cu_same(&got[i], &exp, &sh, salt, r[i].layer, blk[i],
                          tok + (size_t)blk[i] * sh.block_tokens));
    }
    assert_int_equal(ok, n_ok);
  }
  for (size_t i = 0; i < n; i++)
    if (got[i].k) tu_kv_free(&got[i]);
  tu_kv_free(&exp);
  free(got);
  free(want);
  free(blk);
  free(r);
}
BOTH(span_loads)

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "--child") == 0) return child_main(argc, argv);
  cu_set_self(argv[0]);
  tu_seed();
  if (getenv("KVT_TEST_FILTER")) cmocka_set_test_filter(getenv("KVT_TEST_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(durable_reopen_uring),
      cmocka_unit_test(durable_reopen_pread),
      cmocka_unit_test(readonly_beside_writer_uring),
      cmocka_unit_test(readonly_beside_writer_pread),
      cmocka_unit_test(readonly_beside_growing_writer_uring),
      cmocka_unit_test(readonly_beside_growing_writer_pread),
      cmocka_unit_test(fsck_finds_and_repairs_uring),
      cmocka_unit_test(fsck_finds_and_repairs_pread),
      cmocka_unit_test(corrupt_read_is_miss_uring),
      cmocka_unit_test(corrupt_read_is_miss_pread),
      cmocka_unit_test(compress_roundtrip_uring),
      cmocka_unit_test(compress_roundtrip_pread),
      cmocka_unit_test(admission_uring),
      cmocka_unit_test(admission_pread),
      cmocka_unit_test(admit_prompt_uring),
      cmocka_unit_test(admit_prompt_pread),
      cmocka_unit_test(drop_prefix_durable_uring),
      cmocka_unit_test(drop_prefix_durable_pread),
      cmocka_unit_test(ns_drop_durable_uring),
      cmocka_unit_test(ns_drop_durable_pread),
      cmocka_unit_test(evict_to_cold_uring),
      cmocka_unit_test(evict_to_cold_pread),
      cmocka_unit_test(cold_full_uring),
      cmocka_unit_test(cold_full_pread),
      cmocka_unit_test(segments_direct_uring),
      cmocka_unit_test(segments_direct_pread),
      cmocka_unit_test(span_loads_uring),
      cmocka_unit_test(span_loads_pread),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
