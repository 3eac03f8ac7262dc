/* cold_wl.h - what the cold tier's end-to-end tests share (test_cold.c,
 * test_cold_fsck.c, test_cold_codec.c, test_cold_drop.c): the standard
 * workload (two namespaces of sequences with shared prefixes, written and
 * verified) and the O_DIRECT checks of segment files; the harness that
 * runs each test on both backends is cold_fx.h. Header only (static
 * inline: a test need not use every helper). */
#ifndef KVT_COLD_WL_H
#define KVT_COLD_WL_H

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

static inline void wl_get(wl_ns out[WL_N_NS]) {
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
static inline size_t wl_blocks(kvt_engine *e, const kvt_ns_id *ids, uint64_t seed, wl_block *out,
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
static inline int wl_ids(kvt_engine *e, kvt_ns_id ids[WL_N_NS]) {
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
static inline void wl_write(kvt_engine *e, uint64_t seed, kvt_ns_id ids[WL_N_NS], kvt_seq **seqs,
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
static inline int wl_verify(kvt_engine *e, uint64_t seed, int rdonly, int in_ram, uint64_t records) {
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

/* ------------------------------------------------------------ O_DIRECT */

/* Does dir's file system take O_DIRECT? */
static inline int direct_ok(const char *dir) {
  char p[700];
  snprintf(p, sizeof p, "%s/direct-probe", dir);
  int fd = open(p, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
  unlink(p);
  return fd >= 0;
}

/* Segment files this process has open under dir: how many, and how many
 * of them with O_DIRECT (from /proc/self/fdinfo). */
static inline void segment_fds(const char *dir, int *n, int *n_direct) {
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

static inline void release_all(kvt_seq **seqs, size_t n) {
  for (size_t i = 0; i < n; i++) kvt_seq_release(seqs[i]);
}

/* Every segment file a writer has open under dir uses O_DIRECT, when the
 * file system allows it (DESIGN.md section 3). */
static inline void assert_segments_direct(const char *dir) {
  if (!direct_ok(dir)) return;
  int n, n_direct;
  segment_fds(dir, &n, &n_direct);
  if (n_direct != n) fprintf(stderr, "%d of %d segment fds without O_DIRECT\n", n - n_direct, n);
  assert_int_equal(n_direct, n);
}

static inline kvt_engine *open_cold(const char *dir, uint32_t backend) {
  kvt_options o;
  cu_opts(&o, backend);
  kvt_engine *e = tu_open(dir, &o);
  assert_segments_direct(dir);
  return e;
}

#endif
