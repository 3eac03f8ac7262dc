/* cold_util.h - helpers shared by the cold-tier tests (test_cold.c,
 * test_crash.c, test_cold_faults.c): store options with small segments,
 * the io_uring probe, deterministic workloads of sequences with shared
 * prefixes, checks that return a code instead of failing (so forked
 * children can use them), and a reader of segment files that finds
 * records and their slices so a test can corrupt chosen bytes.
 * Header only (static inline, so a test need not use every helper).
 * Relies on the record layout of docs/format.md ("Cold tier"). */
#ifndef KVT_COLD_UTIL_H
#define KVT_COLD_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "tiers/cold_record.h"

/* ------------------------------------------------------------ options */

static inline const char *cu_backend_name(uint32_t backend) {
  return backend == KVT_BACKEND_URING ? "uring" : backend == KVT_BACKEND_PREAD ? "pread" : "auto";
}

/* Defaults with a cold tier: 1 MiB segments, a 64 MiB index map. */
static inline void cu_opts(kvt_options *o, uint32_t backend) {
  tu_opts(o);
  o->tier_bytes_limit[KVT_TIER_COLD] = 1ull << 30;
  o->cold_segment_bytes = 1u << 20;
  o->cold_index_bytes = 64u << 20;
  o->io_backend = backend;
  o->io_depth = 16;
}

/* Does a store with a forced io_uring backend open here? When not, *why
 * says so (printed by the caller when it skips). Probed once. */
static inline int cu_uring_ok(const char **why) {
  static int probed, ok;
  static char reason[200];
  if (!probed) {
    probed = 1;
    char *dir = tu_tmpdir();
    kvt_options o;
    cu_opts(&o, KVT_BACKEND_URING);
    kvt_engine *e = NULL;
    int rc = kvt_engine_open(dir, &o, &e);
    ok = rc == 0;
    if (rc) snprintf(reason, sizeof reason, "io_uring unavailable: open failed: %s", kvt_strerror(rc));
    kvt_engine_close(e);
    tu_rmtree(dir);
  }
  if (why) *why = reason;
  return ok;
}

/* In a cmocka test: skip the io_uring half when it cannot run here. */
#define CU_SKIP_UNLESS_BACKEND(backend)                                       \
  do {                                                                        \
    const char *why_;                                                         \
    if ((backend) == KVT_BACKEND_URING && !cu_uring_ok(&why_)) {              \
      fprintf(stderr, "SKIP %s [uring]: %s\n", __func__, why_);               \
      tu_skip_mark();                                                         \
      skip();                                                                 \
    }                                                                         \
  } while (0)

/* ----------------------------------------------------------- workloads */

/* One sequence of a workload: blocks [0, shared) are the family's common
 * prefix, later ones are the branch's own. Equal (fam, shared prefix)
 * gives equal keys; equal (fam, branch) gives the same sequence. */
typedef struct cu_seqspec {
  uint32_t fam, branch, shared, n_blocks;
} cu_seqspec;

/* Token ids of block j of spec under seed (bt of them). */
static inline void cu_tokens(uint64_t seed, const cu_seqspec *sp, uint32_t j, uint32_t bt,
                             uint32_t *out) {
  uint64_t who = j < sp->shared ? 0 : (uint64_t)sp->branch + 1;
  for (uint32_t t = 0; t < bt; t++)
    out[t] = (uint32_t)(tu_mix(seed ^ tu_mix(((uint64_t)sp->fam << 48) ^ (who << 24) ^
                                             ((uint64_t)j << 12) ^ t)) &
                        0xFFFFF);
}

/* All tokens of the first n blocks of spec. */
static inline uint32_t *cu_seq_tokens(uint64_t seed, const cu_seqspec *sp, uint32_t n,
                                      uint32_t bt) {
  uint32_t *tok = malloc(((size_t)n * bt + 1) * sizeof *tok);
  if (!tok) return NULL;
  for (uint32_t j = 0; j < n; j++) cu_tokens(seed, sp, j, bt, tok + (size_t)j * bt);
  return tok;
}

/* -------------------------------------------- checks that return codes */

#define CU_FAIL(...)                                                          \
  do {                                                                        \
    fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                           \
    fprintf(stderr, __VA_ARGS__);                                             \
    fputc('\n', stderr);                                                      \
    return -1;                                                                \
  } while (0)

/* Append one block (tokens) to s and put every layer not adopted at
 * append. *info receives the append's report. 0 or a kvtier code. */
static inline int cu_append_put(kvt_seq *s, const kvt_shape *sh, uint64_t salt,
                                const uint32_t *tokens, tu_kv *scratch, kvt_append_info *info) {
  kvt_append_info tmp;
  if (!info) info = &tmp;
  int rc = kvt_seq_append(s, tokens, sh->block_tokens, info);
  if (rc) return rc;
  if (info->layers_present == sh->n_layers) return 0;
  for (uint32_t l = 0; l < sh->n_layers; l++) {
    tu_kv_fill(scratch, sh, salt, l, info->block, tokens);
    rc = kvt_seq_put(s, info->block, l, &scratch->kv);
    if (rc) return rc;
  }
  return 0;
}

/* Do got (K, V) hold what tu_kv_fill makes for (layer, block, tokens)? */
static inline int cu_same(const tu_kv *got, tu_kv *want, const kvt_shape *sh, uint64_t salt,
                          uint32_t layer, uint32_t block, const uint32_t *tokens) {
  tu_kv_fill(want, sh, salt, layer, block, tokens);
  return memcmp(got->k, want->k, want->bytes) == 0 && memcmp(got->v, want->v, want->bytes) == 0;
}

/* Read (block, layer) of s. Returns the read's code; *exact is 1 when it
 * succeeded with the generated bytes, 0 when it succeeded with others. */
static inline int cu_read(kvt_seq *s, const kvt_shape *sh, uint64_t salt, uint32_t block,
                          uint32_t layer, const uint32_t *tokens, int *exact) {
  tu_kv got, want;
  tu_kv_alloc(&got, sh);
  tu_kv_alloc(&want, sh);
  memset(got.k, 0x5a, got.bytes);
  memset(got.v, 0xa5, got.bytes);
  int rc = kvt_seq_read(s, block, layer, got.k, got.v, got.bytes);
  *exact = rc == 0 && cu_same(&got, &want, sh, salt, layer, block, tokens);
  tu_kv_free(&got);
  tu_kv_free(&want);
  return rc;
}

/* Load every layer of the token block `key` (position block, tokens of
 * that block) with one kvt_load_submit. status[l] receives each request's
 * status, tier[l] its tier; *n_exact how many came back with exactly the
 * generated bytes; *n_wrong how many succeeded with other bytes. Returns
 * the submit's or wait's code (the wait's first failure). */
static inline int cu_load_block(kvt_engine *e, kvt_ns_id ns, const kvt_shape *sh, uint64_t salt,
                                const kvt_key *key, uint32_t block, const uint32_t *tokens,
                                int *status, uint32_t *tier, uint32_t *n_exact, uint32_t *n_wrong) {
  uint32_t L = sh->n_layers;
  tu_kv *got = calloc(L, sizeof *got), want;
  kvt_load_req *r = calloc(L, sizeof *r);
  if (!got || !r) abort();
  tu_kv_alloc(&want, sh);
  for (uint32_t l = 0; l < L; l++) {
    tu_kv_alloc(&got[l], sh);
    memset(got[l].k, 0x5a, got[l].bytes);
    memset(got[l].v, 0xa5, got[l].bytes);
    r[l] = (kvt_load_req){.key = *key, .layer = l, .k_out = got[l].k, .v_out = got[l].v,
                          .bytes_each = got[l].bytes, .status = 12345, .tier = 99};
  }
  kvt_load *ld = NULL;
  int rc = kvt_load_submit(e, ns, r, L, &ld);
  *n_exact = *n_wrong = 0;
  if (rc == 0) {
    size_t ok = 0;
    rc = kvt_load_wait(ld, &ok);
    for (uint32_t l = 0; l < L; l++) {
      if (status) status[l] = r[l].status;
      if (tier) tier[l] = r[l].tier;
      if (r[l].status == 0) {
        if (cu_same(&got[l], &want, sh, salt, l, block, tokens)) (*n_exact)++;
        else (*n_wrong)++;
      }
    }
  }
  for (uint32_t l = 0; l < L; l++) tu_kv_free(&got[l]);
  tu_kv_free(&want);
  free(got);
  free(r);
  return rc;
}

/* ------------------------------------------------------ segment files */

/* Where one record sits in a segment file, as its header says. */
#define CU_MAX_LAYERS 16
typedef struct cu_rec {
  char path[1024];
  uint64_t off;           /* record start in the file */
  uint32_t rec_len, hdr_len, n_layers;
  kvt_key key;
  uint32_t slice_off[CU_MAX_LAYERS];   /* from the record start */
  uint32_t slice_bytes[CU_MAX_LAYERS]; /* checksummed bytes: the stored payload */
} cu_rec;

/* Append the records found in segment file path to *recs (growing it).
 * docs/format.md, "Records": a record starts on a 4 KiB boundary with
 * KVT_REC_MAGIC; its fields are where tiers/cold_record.h says, the slice
 * table (KVT_REC_SLICE bytes a layer) at KVT_REC_FIXED; a slice is its
 * payload alone (stored_len bytes, all checksummed), then zero padding.
 * The fields are read one by one, not through kvt_rec_header_get, so a
 * header that fails its checksum is still found. Returns 0 or -errno. */
static inline int cu_seg_scan(const char *path, cu_rec **recs, size_t *n, size_t *cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  uint8_t h[4096];
  uint64_t off = 0;
  for (;;) {
    ssize_t got = pread(fd, h, sizeof h, (off_t)off);
    if (got < (ssize_t)KVT_REC_FIXED + 8) break;
    if (memcmp(h + KVT_REC_H_MAGIC, KVT_REC_MAGIC, 8) != 0) {
      off += 4096;
      continue;
    }
    cu_rec r = {0};
    snprintf(r.path, sizeof r.path, "%s", path);
    r.off = off;
    r.hdr_len = kvt_le_get32(h + KVT_REC_H_HDR_LEN);
    r.rec_len = kvt_le_get32(h + KVT_REC_H_REC_LEN);
    memcpy(r.key.b, h + KVT_REC_H_KEY, 16);
    r.n_layers = kvt_le_get32(h + KVT_REC_H_N_LAYERS);
    if (r.rec_len < 4096 || r.rec_len % 4096 || r.n_layers == 0 || r.n_layers > CU_MAX_LAYERS ||
        KVT_REC_FIXED + KVT_REC_SLICE * r.n_layers > (uint32_t)got) {
      off += 4096;
      continue;
    }
    for (uint32_t l = 0; l < r.n_layers; l++) {
      kvt_cold_slice s;
      kvt_rec_slice_get(h + KVT_REC_FIXED + KVT_REC_SLICE * l, &s);
      r.slice_off[l] = s.rel_off;
      r.slice_bytes[l] = s.stored_len;
    }
    if (*n == *cap) {
      *cap = *cap ? 2 * *cap : 64;
      *recs = realloc(*recs, *cap * sizeof **recs);
      if (!*recs) abort();
    }
    (*recs)[(*n)++] = r;
    off += r.rec_len;
  }
  close(fd);
  return 0;
}

static int cu_cmp_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every record in dir/segments/seg-*, in file then offset order. The
 * caller frees *recs. Returns the number found. */
static inline size_t cu_records(const char *dir, cu_rec **recs) {
  char path[512];
  snprintf(path, sizeof path, "%s/segments", dir);
  DIR *d = opendir(path);
  *recs = NULL;
  if (!d) return 0;
  char *names[4096];
  size_t nn = 0, n = 0, cap = 0;
  for (struct dirent *de; (de = readdir(d)) && nn < 4096;)
    if (strncmp(de->d_name, "seg-", 4) == 0) names[nn++] = strdup(de->d_name);
  closedir(d);
  qsort(names, nn, sizeof *names, cu_cmp_name);
  for (size_t i = 0; i < nn; i++) {
    char p[1024];
    snprintf(p, sizeof p, "%s/segments/%s", dir, names[i]);
    cu_seg_scan(p, recs, &n, &cap);
    free(names[i]);
  }
  return n;
}

/* XOR byte `at` of file path with mask (non-zero). 0 or -errno. */
static inline int cu_flip(const char *path, uint64_t at, uint8_t mask) {
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -errno;
  uint8_t b;
  int rc = pread(fd, &b, 1, (off_t)at) == 1 ? 0 : -EIO;
  b ^= mask;
  if (!rc) rc = pwrite(fd, &b, 1, (off_t)at) == 1 ? 0 : -EIO;
  if (!rc) rc = fsync(fd) ? -errno : 0;
  close(fd);
  return rc;
}

static inline int cu_key_eq(const kvt_key *a, const kvt_key *b) { return memcmp(a->b, b->b, 16) == 0; }

/* Copy file src to dst (created or truncated). 0 or -errno. */
static inline int cu_copy_file(const char *src, const char *dst) {
  int in = open(src, O_RDONLY | O_CLOEXEC), out = -1, rc = 0;
  if (in < 0) return -errno;
  out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) rc = -errno;
  char buf[1 << 16];
  for (ssize_t n; !rc && (n = read(in, buf, sizeof buf)) != 0;) {
    if (n < 0 || write(out, buf, (size_t)n) != n) rc = -EIO;
  }
  if (out >= 0) close(out);
  close(in);
  return rc;
}

/* Copy a closed store: its index (not the LMDB lock file, which the next
 * opener recreates) and its segment files. 0 or -errno. */
static inline int cu_copy_store(const char *src, const char *dst) {
  char a[1024], b[1024];
  int rc = 0;
  snprintf(b, sizeof b, "%s/index", dst);
  if (mkdir(dst, 0755) || mkdir(b, 0755)) return -errno;
  snprintf(b, sizeof b, "%s/segments", dst);
  if (mkdir(b, 0755)) return -errno;
  snprintf(a, sizeof a, "%s/index/data.mdb", src);
  snprintf(b, sizeof b, "%s/index/data.mdb", dst);
  if ((rc = cu_copy_file(a, b))) return rc;
  snprintf(a, sizeof a, "%s/segments", src);
  DIR *d = opendir(a);
  if (!d) return -errno;
  for (struct dirent *de; !rc && (de = readdir(d));) {
    if (strncmp(de->d_name, "seg-", 4) != 0) continue;
    snprintf(a, sizeof a, "%s/segments/%s", src, de->d_name);
    snprintf(b, sizeof b, "%s/segments/%s", dst, de->d_name);
    rc = cu_copy_file(a, b);
  }
  closedir(d);
  return rc;
}

/* ---------------------------------------------------- child processes */

/* The path of this test program: main() passes argv[0] to cu_set_self
 * (so a run under valgrind re-executes the test, not valgrind). */
static char cu_self[4096] = "/proc/self/exe";
static inline void cu_set_self(const char *argv0) {
  if (argv0 && !realpath(argv0, cu_self)) snprintf(cu_self, sizeof cu_self, "/proc/self/exe");
}

/* Start this test program again as a child with argv; returns its pid,
 * or -1. */
static inline pid_t cu_spawn_self(char *const argv[]) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    execv(cu_self, argv);
    _exit(127);
  }
  return pid;
}

/* Wait for a child: its exit status, or -1 when it did not exit (a signal). */
static inline int cu_wait(pid_t pid) {
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Run this test program again as a child and wait for it. */
static inline int cu_run_self(char *const argv[]) { return cu_wait(cu_spawn_self(argv)); }

#endif
