/* bench_cold.c - `kvtier bench cold`: how fast the cold tier makes KV
 * durable and reads it back, against what the same disk does without
 * kvtier, measured in the same run: interleaved rounds, medians.
 *
 * Payload: the util.c generator's KV (Gaussian, a few outlier K channels),
 * f16, Llama-3-8B shape: 32 layers x 16 tokens x 8 KV heads x head_dim 128,
 * so a layer block is 64 KiB of K+V and a token block 2 MiB (--block-tokens
 * changes the 16: 4 KiB of K+V per token and layer). Each round:
 *   writes  kvtier with cold_compress 0 and 1 (appends + a put per layer,
 *           then kvt_sync; after an untimed warm-up that fills the hot tier
 *           once, as the raw file's preallocation is untimed), raw O_DIRECT
 *           writes to a preallocated file through io_uring at the engine's
 *           queue depth (fdatasync every 32 MiB and at the end: the
 *           ceiling), one file per token block with pwrite + fsync each;
 *   reads   every layer of every block through kvt_load_submit/wait from a
 *           freshly reopened engine (nothing in RAM), raw O_DIRECT reads of
 *           the raw file through io_uring with as many threads as the
 *           engine has cold readers and its queue depth shared among them
 *           (a baseline at lower concurrency than kvtier's would flatter
 *           it); random single layers at depth 1 (latency) and in batches
 *           of 32 (throughput).
 * The baselines are plain system calls, made here on purpose; everything
 * of kvtier goes through include/kvtier.h. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "cmds.h"
#include "util.h"

#define BC_LAYERS 32u
#define BC_HEADS 8u
#define BC_HEAD_DIM 128u
#define BC_TOKENS_MAX 64u
static uint32_t bc_tokens = 16;      /* tokens per block (--block-tokens) */
#define BC_BLOCK_TOKENS bc_tokens
#define BC_EACH ((size_t)BC_BLOCK_TOKENS * BC_HEADS * BC_HEAD_DIM * 2) /* K (= V) bytes */
#define BC_LAYER_BYTES (2 * BC_EACH)                                   /* 64 KiB at 16 */
#define BC_TBLOCK_BYTES ((size_t)BC_LAYERS * BC_LAYER_BYTES)           /* 2 MiB at 16 */
#define BC_SEQ_BLOCKS 64u            /* token blocks per sequence: 1024 tokens */
#define BC_HOT_LIMIT (64ull << 20)   /* the writer's hot tier: a small window */
#define BC_READ_BYTES (32u << 20)    /* KV per kvt_load_submit: 16 token blocks of 2 MiB */
#define BC_READ_BATCH ((uint32_t)(BC_READ_BYTES / BC_TBLOCK_BYTES)) /* token blocks a batch */
#define BC_RAW_CHUNK (1u << 20)      /* raw request size */
#define BC_RAW_THREADS_MAX 2u        /* the engine's cold readers: two where two CPUs are */
#define BC_RAW_SYNC (32u << 20)      /* raw fdatasync interval */
#define BC_QD 32u                    /* the "depth 32" batch */
#define BC_ROUNDS_MAX 50u
#define BC_SAMPLES_MAX 100000u

_Static_assert(BC_HEADS * BC_HEAD_DIM * 2 * 2 == 4096, "a token's K+V of a layer is 4 KiB");
_Static_assert(BC_RAW_SYNC % BC_RAW_CHUNK == 0, "syncs fall on chunk boundaries");

/* Set from --block-tokens before anything else runs. */
static kvt_shape bc_shape = {BC_LAYERS, BC_HEADS, BC_HEAD_DIM, KVT_F16, 16};
static kvt_ns_desc bc_desc = {
    .model_id = "kvtier-bench/llama-3-8b-shape",
    .weights_fingerprint = "generated-kv-v1",
    .rope_theta = 500000.0,
    .tp_size = 1,
    .shape = {BC_LAYERS, BC_HEADS, BC_HEAD_DIM, KVT_F16, 16},
};

typedef struct bc_cfg {
  const char *dir, *remote; /* remote: refused, see cmd */
  uint64_t mib, rounds, samples, seed, block_tokens;
  int json;
} bc_cfg;

/* What one kvtier variant (cold_compress 0 or 1) measured. */
typedef struct bc_variant {
  double write_gbps[BC_ROUNDS_MAX], read_gbps[BC_ROUNDS_MAX];
  double write_vs_raw[BC_ROUNDS_MAX], read_vs_raw[BC_ROUNDS_MAX];
  double write_vs_fpb[BC_ROUNDS_MAX];
  uint64_t cold_write_bytes;   /* kvt_stats of the last round's writer */
  uint64_t cold_segments;
} bc_variant;

typedef struct bc_run {
  bc_cfg cfg;
  bench_dir dir;
  uint32_t n_blocks;           /* token blocks */
  uint64_t bytes;              /* n_blocks * BC_TBLOCK_BYTES */
  uint8_t *payload;            /* [block][layer][K | V], 4 KiB aligned */
  uint8_t *dst;                /* read target, same size */
  uint8_t *one;                /* random-read targets: BC_QD layer blocks */
  uint32_t *tokens;            /* [n_blocks * BC_BLOCK_TOKENS] */
  uint32_t warm_tokens[BC_TOKENS_MAX]; /* the untimed warm-up's first block's */
  kvt_key *keys;               /* [n_blocks] */
  kvt_load_req *reqs;          /* [BC_READ_BATCH * BC_LAYERS] */
  prng rng;
  bc_variant var[2];           /* by cold_compress */
  double raw_write[BC_ROUNDS_MAX], raw_read[BC_ROUNDS_MAX], fpb_write[BC_ROUNDS_MAX];
  double *lat_kvt, *lat_raw;   /* depth-1 latencies, us, pooled over rounds */
  size_t n_lat;
  double qd32[BC_ROUNDS_MAX];
  uint32_t def_compress;       /* kvt_options_init's cold_compress */
  char backend[32], why[160];
  uint64_t started_ns;
  double load_start, load_end;  /* 1-minute load average: other work on the machine */
} bc_run;

static int bc_fail(const char *what, int rc) { return cli_lib_error("bench cold", what, rc); }

static double gbps(uint64_t bytes, uint64_t ns) { return ns ? (double)bytes / (double)ns : 0.0; }

/* The 1-minute load average (-1 when unknown): a benchmark on a busy
 * machine says so. */
static double load_avg(void)
{
  double v = -1.0;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f == NULL) return v;
  if (fscanf(f, "%lf", &v) != 1) v = -1.0;
  fclose(f);
  return v;
}

/* ---- options ----------------------------------------------------------- */

#define BC_N_OPTS 8

static void bc_opts(bc_cfg *c, cli_opt o[BC_N_OPTS])
{
  const cli_opt t[BC_N_OPTS] = {
      {"--dir", "D", CLI_STR, &c->dir, 0, 0,
       "directory for stores and baseline files (default: scratch, removed)"},
      {"--mib", "N", CLI_U64, &c->mib, 64, 8192,
       "MiB of KV, 64 to 8192 (default 256; more than the host caches is better)"},
      {"--rounds", "R", CLI_U64, &c->rounds, 1, BC_ROUNDS_MAX, "interleaved rounds (default 5)"},
      {"--samples", "N", CLI_U64, &c->samples, 10, 20000,
       "random depth-1 reads per round, kvtier and raw each (default 400)"},
      {"--seed", "S", CLI_U64, &c->seed, 0, UINT64_MAX, "seed of tokens, KV and reads (default 1)"},
      {"--block-tokens", "T", CLI_U64, &c->block_tokens, 1, BC_TOKENS_MAX,
       "tokens per block, 1 to 64 (default 16: 64 KiB layer blocks, 2 MiB token blocks)"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the figures as one JSON object"},
      CLI_OPT_REMOTE(&c->remote),
  };
  memcpy(o, t, sizeof t);
}

void bench_cold_usage(FILE *f)
{
  bc_cfg c;
  cli_opt o[BC_N_OPTS];
  bc_opts(&c, o);
  fprintf(f, "\nbench cold: the cold tier against the same disk without kvtier, in one run,\n"
             "interleaved rounds, medians. KV of the Llama-3-8B shape (at 16 tokens a block,\n"
             "64 KiB per layer block, 2 MiB per token block). Writes: kvtier (appends, a put\n"
             "per layer, kvt_sync; hot tier %llu MiB, filled once untimed first) with\n"
             "cold_compress 0 and 1; raw O_DIRECT pwrite of %u MiB to a preallocated file with\n"
             "fdatasync every %u MiB (the ceiling); one file per token block with fsync each.\n"
             "Reads, from a reopened engine: every layer of every block (kvt_load_submit/wait,\n"
             "%u MiB a batch) against raw O_DIRECT reads; random single layers at depth 1\n"
             "(p50, p99) and in batches of %u.\n",
          (unsigned long long)(BC_HOT_LIMIT >> 20), BC_RAW_CHUNK >> 20, BC_RAW_SYNC >> 20,
          BC_READ_BYTES >> 20, BC_QD);
  cli_print_opts(f, o, BC_N_OPTS);
}

/* ---- plain-syscall helpers for the baselines ------------------------------ */

static int pwrite_all(int fd, const uint8_t *buf, size_t len, uint64_t off)
{
  while (len) {
    ssize_t n = pwrite(fd, buf, len, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) return -EIO;
    buf += n;
    len -= (size_t)n;
    off += (uint64_t)n;
  }
  return 0;
}

static int pread_all(int fd, uint8_t *buf, size_t len, uint64_t off)
{
  while (len) {
    ssize_t n = pread(fd, buf, len, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) return -EIO; /* past the end */
    buf += n;
    len -= (size_t)n;
    off += (uint64_t)n;
  }
  return 0;
}

/* Drop clean cached pages of one file (no-op for O_DIRECT files). */
static void uncache_file(const char *path)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

/* Every segment file of a store: what "nothing in RAM" means for reads,
 * whether or not the store opens them O_DIRECT. */
static void uncache_store(const char *store)
{
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/segments", store) >= (int)sizeof path) return;
  DIR *d = opendir(path);
  if (d == NULL) return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    char file[PATH_MAX + 256];
    if (strncmp(de->d_name, "seg-", 4) != 0) continue;
    snprintf(file, sizeof file, "%s/%s", path, de->d_name);
    uncache_file(file);
  }
  closedir(d);
}

static int path_of(char *buf, size_t cap, const char *dir, uint32_t round, const char *what)
{
  if (snprintf(buf, cap, "%s/round-%u-%s", dir, round, what) >= (int)cap) return -ENAMETOOLONG;
  return 0;
}

/* ---- setup: the KV, its tokens and keys ------------------------------------- */

static void *alloc_touched(size_t len)
{
  void *p = NULL;
  if (posix_memalign(&p, 4096, len) != 0) return NULL;
  memset(p, 0, len); /* pre-fault: first touch runs at a fraction of memcpy speed */
  return p;
}

static int bc_generate(bc_run *r)
{
  kvgen g;
  int rc = kvgen_init(&g, &bc_shape, r->cfg.seed);
  if (rc != 0) return bc_fail("setting up the KV generator", rc);
  uint64_t *pos = malloc(BC_SEQ_BLOCKS * BC_BLOCK_TOKENS * sizeof *pos);
  if (pos == NULL) {
    kvgen_free(&g);
    return bc_fail("allocating", -ENOMEM);
  }
  prng p;
  prng_seed(&p, r->cfg.seed);
  gen_tokens(&p, KVGEN_VOCAB, r->tokens, (size_t)r->n_blocks * BC_BLOCK_TOKENS);
  gen_tokens(&p, KVGEN_VOCAB, r->warm_tokens, BC_BLOCK_TOKENS);
  for (uint32_t s0 = 0; s0 < r->n_blocks; s0 += BC_SEQ_BLOCKS) {
    uint32_t nb = r->n_blocks - s0 < BC_SEQ_BLOCKS ? r->n_blocks - s0 : BC_SEQ_BLOCKS;
    progress("bench cold: generating KV, block %u of %u", s0 + 1, r->n_blocks);
    const uint32_t *tok = r->tokens + (size_t)s0 * BC_BLOCK_TOKENS;
    kvgen_pos_hashes(&g, 0, tok, (size_t)nb * BC_BLOCK_TOKENS, pos);
    for (uint32_t b = 0; b < nb; b++)
      for (uint32_t l = 0; l < BC_LAYERS; l++) {
        uint8_t *at = r->payload + (size_t)(s0 + b) * BC_TBLOCK_BYTES + l * BC_LAYER_BYTES;
        kvgen_fill(&g, pos + (size_t)b * BC_BLOCK_TOKENS, BC_BLOCK_TOKENS, l, at, at + BC_EACH);
      }
  }
  free(pos);
  kvgen_free(&g);
  return CLI_OK;
}

static int bc_alloc(bc_run *r)
{
  r->payload = alloc_touched(r->bytes);
  r->dst = alloc_touched(r->bytes);
  r->one = alloc_touched((size_t)BC_QD * BC_LAYER_BYTES);
  r->tokens = malloc((size_t)r->n_blocks * BC_BLOCK_TOKENS * sizeof *r->tokens);
  r->keys = calloc(r->n_blocks, sizeof *r->keys);
  r->reqs = calloc((size_t)BC_READ_BATCH * BC_LAYERS, sizeof *r->reqs);
  r->lat_kvt = malloc(r->cfg.rounds * r->cfg.samples * sizeof *r->lat_kvt);
  r->lat_raw = malloc(r->cfg.rounds * r->cfg.samples * sizeof *r->lat_raw);
  if (!r->payload || !r->dst || !r->one || !r->tokens || !r->keys || !r->reqs || !r->lat_kvt ||
      !r->lat_raw)
    return bc_fail("allocating buffers", -ENOMEM);
  return bc_generate(r);
}

static void bc_free(bc_run *r)
{
  free(r->payload);
  free(r->dst);
  free(r->one);
  free(r->tokens);
  free(r->keys);
  free(r->reqs);
  free(r->lat_kvt);
  free(r->lat_raw);
}

/* ---- kvtier --------------------------------------------------------------------- */

static int bc_open(const bc_run *r, const char *store, uint32_t compress, kvt_engine **e,
                   kvt_ns_id *ns)
{
  kvt_options opt;
  kvt_options_init(&opt);
  opt.tier_bytes_limit[KVT_TIER_HOT] = BC_HOT_LIMIT;
  opt.tier_bytes_limit[KVT_TIER_COLD] = 2 * r->bytes + (512ull << 20);
  opt.cold_compress = compress;
  int rc = cli_engine_open(store, &opt, e);
  if (rc != 0) return bc_fail("opening the store", rc);
  rc = kvt_ns_register(*e, &bc_desc, ns);
  if (rc != 0) return bc_fail("registering the namespace", rc);
  return CLI_OK;
}

/* One sequence: append its token blocks and put every layer. */
static int kvt_write_seq(bc_run *r, kvt_engine *e, kvt_ns_id ns, uint32_t s0, uint32_t nb,
                         kvt_seq **out)
{
  int rc = kvt_seq_create(e, ns, out);
  if (rc != 0) return bc_fail("creating a sequence", rc);
  for (uint32_t b = 0; b < nb; b++) {
    kvt_append_info info;
    rc = kvt_seq_append(*out, r->tokens + (size_t)(s0 + b) * BC_BLOCK_TOKENS, BC_BLOCK_TOKENS,
                        &info);
    if (rc != 0) return bc_fail("appending a token block", rc);
    r->keys[s0 + b] = info.key;
    for (uint32_t l = 0; l < BC_LAYERS; l++) {
      const uint8_t *at = r->payload + (size_t)(s0 + b) * BC_TBLOCK_BYTES + l * BC_LAYER_BYTES;
      kvt_kv kv = {at, at + BC_EACH, KVT_F16, BC_BLOCK_TOKENS, BC_HEADS, BC_HEAD_DIM};
      rc = kvt_seq_put(*out, b, l, &kv);
      if (rc != 0) return bc_fail("putting a layer block", rc);
    }
  }
  return CLI_OK;
}

/* Token blocks the untimed warm-up writes: one hot tier's worth. */
static uint32_t n_warm(const bc_run *r)
{
  uint64_t n = BC_HOT_LIMIT / BC_TBLOCK_BYTES;
  return n < 1 ? 1 : n > r->n_blocks ? r->n_blocks : (uint32_t)n;
}

/* Untimed, as the raw file's preallocation and the baselines' touched
 * buffers are: a sequence of other keys (its first block's tokens differ)
 * fills the hot tier once, written and synced, then released. So the
 * store's first commits (which grow a new LMDB file: tens of ms here,
 * once per store) are not in the figure, and the timed blocks reuse RAM
 * the engine has touched, as in a running server, instead of faulting in
 * fresh pages at ~0.9 GB/s (MEASURED.md). */
static int kvt_warmup(bc_run *r, kvt_engine *e, kvt_ns_id ns, kvt_stats *before)
{
  kvt_seq *s = NULL;
  int rc = kvt_seq_create(e, ns, &s);
  for (uint32_t b = 0; rc == 0 && b < n_warm(r); b++) {
    const uint32_t *tok = b ? r->tokens + (size_t)b * BC_BLOCK_TOKENS : r->warm_tokens;
    rc = kvt_seq_append(s, tok, BC_BLOCK_TOKENS, NULL);
    for (uint32_t l = 0; rc == 0 && l < BC_LAYERS; l++) {
      const uint8_t *at = r->payload + (size_t)b * BC_TBLOCK_BYTES + l * BC_LAYER_BYTES;
      kvt_kv kv = {at, at + BC_EACH, KVT_F16, BC_BLOCK_TOKENS, BC_HEADS, BC_HEAD_DIM};
      rc = kvt_seq_put(s, b, l, &kv);
    }
  }
  if (rc == 0) rc = kvt_sync(e);
  kvt_seq_release(s);
  if (rc == 0) rc = kvt_stats_get(e, before);
  return rc != 0 ? bc_fail("writing the warm-up blocks", rc) : CLI_OK;
}

/* Write every block through a fresh engine and make it durable; the time
 * runs from the first append to kvt_sync()'s return. */
static int kvt_write(bc_run *r, const char *store, uint32_t compress, double *out_gbps)
{
  kvt_engine *e = NULL;
  kvt_ns_id ns;
  kvt_stats before;
  uint32_t n_seqs = (r->n_blocks + BC_SEQ_BLOCKS - 1) / BC_SEQ_BLOCKS;
  kvt_seq **seqs = calloc(n_seqs, sizeof *seqs);
  int rc = seqs ? bc_open(r, store, compress, &e, &ns) : bc_fail("allocating", -ENOMEM);
  if (rc == CLI_OK) rc = kvt_warmup(r, e, ns, &before);
  uint64_t t0 = now_ns(), t1 = t0;
  for (uint32_t s = 0; rc == CLI_OK && s < n_seqs; s++) {
    uint32_t s0 = s * BC_SEQ_BLOCKS;
    uint32_t nb = r->n_blocks - s0 < BC_SEQ_BLOCKS ? r->n_blocks - s0 : BC_SEQ_BLOCKS;
    rc = kvt_write_seq(r, e, ns, s0, nb, &seqs[s]);
  }
  if (rc == CLI_OK) {
    int lrc = kvt_sync(e);
    t1 = now_ns();
    if (lrc != 0) rc = bc_fail("kvt_sync", lrc);
  }
  kvt_stats st;
  if (rc == CLI_OK && (rc = kvt_stats_get(e, &st)) != 0) rc = bc_fail("reading the counters", rc);
  uint32_t durable = 0;
  for (uint32_t s = 0; rc == CLI_OK && s < n_seqs; s++) durable += kvt_seq_durable(seqs[s]);
  if (rc == CLI_OK && (st.cold_records != r->n_blocks + n_warm(r) || durable != r->n_blocks)) {
    fprintf(stderr, "kvtier bench cold: after kvt_sync %" PRIu64 " of %u token blocks (and %u "
            "warm-up blocks) are in the cold tier, %u durable by the watermark\n",
            st.cold_records, r->n_blocks, n_warm(r), durable);
    rc = CLI_FAIL;
  }
  if (rc == CLI_OK) {
    *out_gbps = gbps(r->bytes, t1 - t0);
    r->var[compress].cold_write_bytes = st.cold_write_bytes - before.cold_write_bytes;
    r->var[compress].cold_segments = st.cold_segments;
    snprintf(r->backend, sizeof r->backend, "%s", st.io_backend);
    snprintf(r->why, sizeof r->why, "%s", st.io_why);
  }
  for (uint32_t s = 0; seqs && s < n_seqs; s++) kvt_seq_release(seqs[s]);
  free(seqs);
  kvt_engine_close(e);
  return rc;
}

static int check_loaded(const kvt_load_req *q, size_t n, const char *what)
{
  for (size_t i = 0; i < n; i++)
    if (q[i].status != 0 || q[i].tier != KVT_TIER_COLD) {
      fprintf(stderr, "kvtier bench cold: %s: layer %u: status %d (%s), tier %u\n", what,
              q[i].layer, q[i].status, kvt_strerror(q[i].status), q[i].tier);
      return CLI_FAIL;
    }
  return CLI_OK;
}

/* Load every layer of every block from a reopened engine, BC_READ_BATCH
 * token blocks per submit, into dst; then check dst against the payload. */
static int kvt_read_all(bc_run *r, kvt_engine *e, kvt_ns_id ns, double *out_gbps)
{
  memset(r->dst, 0xa5, r->bytes); /* stale bytes from another reader cannot pass the check */
  uint64_t t0 = now_ns();
  for (uint32_t b0 = 0; b0 < r->n_blocks; b0 += BC_READ_BATCH) {
    uint32_t nb = r->n_blocks - b0 < BC_READ_BATCH ? r->n_blocks - b0 : BC_READ_BATCH;
    size_t n = 0;
    for (uint32_t b = b0; b < b0 + nb; b++)
      for (uint32_t l = 0; l < BC_LAYERS; l++) {
        uint8_t *at = r->dst + (size_t)b * BC_TBLOCK_BYTES + l * BC_LAYER_BYTES;
        r->reqs[n++] = (kvt_load_req){.key = r->keys[b], .layer = l, .k_out = at,
                                      .v_out = at + BC_EACH, .bytes_each = BC_EACH};
      }
    kvt_load *ld = NULL;
    int rc = kvt_load_submit(e, ns, r->reqs, n, &ld);
    if (rc == 0) rc = kvt_load_wait(ld, NULL);
    if (rc != 0) return bc_fail("loading layer blocks from the cold tier", rc);
    if (check_loaded(r->reqs, n, "sequential load") != CLI_OK) return CLI_FAIL;
  }
  uint64_t t1 = now_ns();
  if (memcmp(r->dst, r->payload, r->bytes) != 0) {
    fprintf(stderr, "kvtier bench cold: KV loaded from the cold tier differs from the KV put\n");
    return CLI_FAIL;
  }
  *out_gbps = gbps(r->bytes, t1 - t0);
  return CLI_OK;
}

static int kvt_read(bc_run *r, const char *store, uint32_t compress, double *out_gbps)
{
  uncache_store(store);
  kvt_engine *e = NULL;
  kvt_ns_id ns;
  int rc = bc_open(r, store, compress, &e, &ns);
  if (rc == CLI_OK) rc = kvt_read_all(r, e, ns, out_gbps);
  kvt_engine_close(e);
  return rc;
}

/* ---- baselines ------------------------------------------------------------------ */

/* The raw device at kvtier's own concurrency: BC_RAW_CHUNK requests
 * through io_uring, `depth` in flight on each of `threads` rings, thread t
 * taking chunks t, t + threads, ...; writes fdatasync every BC_RAW_SYNC
 * (after draining) and at the end. No index, checksum or codec. */
typedef struct raw_job {
  int fd, write, rc;
  uint8_t *buf;
  uint64_t bytes;
  uint32_t depth, t, threads;
} raw_job;

static int raw_reap(struct io_uring *ring, uint32_t *inflight, unsigned wait)
{
  struct io_uring_cqe *cqe;
  int rc = io_uring_submit_and_wait(ring, wait);
  if (rc < 0) return rc;
  rc = 0;
  while (*inflight && io_uring_peek_cqe(ring, &cqe) == 0) {
    if (cqe->res < 0 && rc == 0) rc = cqe->res;
    else if ((uint64_t)cqe->res != cqe->user_data && rc == 0) rc = -EIO; /* short: not expected */
    io_uring_cqe_seen(ring, cqe);
    (*inflight)--;
  }
  return rc;
}

static void *raw_job_run(void *arg)
{
  raw_job *j = arg;
  struct io_uring ring;
  j->rc = io_uring_queue_init(j->depth, &ring, 0);
  if (j->rc < 0) return NULL;
  uint64_t next = (uint64_t)j->t * BC_RAW_CHUNK, since_sync = 0;
  uint32_t inflight = 0;
  while (j->rc == 0 && (next < j->bytes || inflight)) {
    while (inflight < j->depth && next < j->bytes && !(j->write && since_sync >= BC_RAW_SYNC)) {
      struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
      if (!sqe) break;
      if (j->write) io_uring_prep_write(sqe, j->fd, j->buf + next, BC_RAW_CHUNK, next);
      else io_uring_prep_read(sqe, j->fd, j->buf + next, BC_RAW_CHUNK, next);
      sqe->user_data = BC_RAW_CHUNK;
      next += (uint64_t)j->threads * BC_RAW_CHUNK;
      since_sync += BC_RAW_CHUNK;
      inflight++;
    }
    j->rc = raw_reap(&ring, &inflight, 1);
    if (j->rc == 0 && j->write && inflight == 0 && (since_sync >= BC_RAW_SYNC || next >= j->bytes)) {
      if (fdatasync(j->fd) != 0) j->rc = -errno;
      since_sync = 0;
    }
  }
  io_uring_queue_exit(&ring);
  return NULL;
}

/* Run `threads` jobs over the file; the time they took in *ns. 0 or -errno. */
static int raw_io(int fd, int write, uint8_t *buf, uint64_t bytes, uint32_t depth,
                  uint32_t threads, uint64_t *ns)
{
  raw_job jobs[BC_RAW_THREADS_MAX];
  pthread_t tid[BC_RAW_THREADS_MAX];
  uint32_t started = 0;
  int rc = 0;
  uint64_t t0 = now_ns();
  for (uint32_t t = 0; t < threads; t++) {
    jobs[t] = (raw_job){.fd = fd, .write = write, .buf = buf, .bytes = bytes,
                        .depth = depth, .t = t, .threads = threads};
    if (threads == 1) raw_job_run(&jobs[t]);
    else if ((rc = -pthread_create(&tid[t], NULL, raw_job_run, &jobs[t])) != 0) break;
    started++;
  }
  for (uint32_t t = 0; t < started; t++) {
    if (threads > 1) pthread_join(tid[t], NULL);
    if (rc == 0) rc = jobs[t].rc;
  }
  *ns = now_ns() - t0;
  return rc;
}

/* The engine's concurrency, which the raw baselines copy: its queue depth
 * (kvt_options.io_depth), shared among its cold readers as it shares it. */
static uint32_t raw_depth(void)
{
  kvt_options o;
  kvt_options_init(&o);
  return o.io_depth;
}
static uint32_t raw_readers(void) { return sysconf(_SC_NPROCESSORS_ONLN) > 1 ? 2 : 1; }

/* The ceiling: the same bytes, O_DIRECT, a preallocated file, one writer at
 * the engine's depth, fdatasync every BC_RAW_SYNC and at the end. */
static int raw_write(bc_run *r, const char *path, double *out_gbps)
{
  int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) return bc_fail("creating the raw baseline file (O_DIRECT)", -errno);
  int rc = posix_fallocate(fd, 0, (off_t)r->bytes);
  if (rc == 0 && fsync(fd) != 0) rc = errno; /* the allocation durable before timing */
  if (rc != 0) {
    close(fd);
    return bc_fail("preallocating the raw baseline file", -rc);
  }
  uint64_t ns = 0;
  rc = raw_io(fd, 1, r->payload, r->bytes, raw_depth(), 1, &ns);
  close(fd);
  if (rc != 0) return bc_fail("writing the raw baseline file", rc);
  *out_gbps = gbps(r->bytes, ns);
  return CLI_OK;
}

static int raw_read(bc_run *r, const char *path, double *out_gbps)
{
  uncache_file(path);
  int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) return bc_fail("opening the raw baseline file (O_DIRECT)", -errno);
  memset(r->dst, 0x5a, r->bytes);
  uint32_t n = raw_readers(), depth = (raw_depth() + n - 1) / n;
  uint64_t ns = 0;
  int rc = raw_io(fd, 0, r->dst, r->bytes, depth, n, &ns);
  close(fd);
  if (rc != 0) return bc_fail("reading the raw baseline file", rc);
  if (memcmp(r->dst, r->payload, r->bytes) != 0) {
    fprintf(stderr, "kvtier bench cold: the raw baseline file reads back different bytes\n");
    return CLI_FAIL;
  }
  *out_gbps = gbps(r->bytes, ns);
  return CLI_OK;
}

/* What several KV offloaders do: one file per token block, written and
 * fsync'ed on its own; the directory synced once at the end. */
static int fpb_write(bc_run *r, const char *dir, double *out_gbps)
{
  if (mkdir(dir, 0755) != 0) return bc_fail("creating the file-per-block directory", -errno);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return bc_fail("opening the file-per-block directory", -errno);
  int rc = 0;
  uint64_t t0 = now_ns();
  for (uint32_t b = 0; rc == 0 && b < r->n_blocks; b++) {
    char name[32];
    snprintf(name, sizeof name, "blk-%08u", b);
    int fd = openat(dfd, name, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) {
      rc = -errno;
      break;
    }
    rc = pwrite_all(fd, r->payload + (size_t)b * BC_TBLOCK_BYTES, BC_TBLOCK_BYTES, 0);
    if (rc == 0 && fsync(fd) != 0) rc = -errno;
    close(fd);
  }
  if (rc == 0 && fsync(dfd) != 0) rc = -errno;
  uint64_t t1 = now_ns();
  close(dfd);
  if (rc != 0) return bc_fail("writing one file per block", rc);
  *out_gbps = gbps(r->bytes, t1 - t0);
  return CLI_OK;
}

/* ---- random single-layer reads ----------------------------------------------------- */

static void pick(bc_run *r, uint32_t *b, uint32_t *l)
{
  *b = prng_below(&r->rng, r->n_blocks);
  *l = prng_below(&r->rng, BC_LAYERS);
}

static const uint8_t *src_of(const bc_run *r, uint32_t b, uint32_t l)
{
  return r->payload + (size_t)b * BC_TBLOCK_BYTES + (size_t)l * BC_LAYER_BYTES;
}

/* Depth 1: one load of one layer, submit then wait, kvtier and a 64 KiB
 * O_DIRECT pread of the same bytes from the raw file, alternately. */
static int rand_qd1(bc_run *r, kvt_engine *e, kvt_ns_id ns, int raw_fd)
{
  for (uint64_t i = 0; i < r->cfg.samples; i++) {
    uint32_t b, l;
    pick(r, &b, &l);
    kvt_load_req q = {.key = r->keys[b], .layer = l, .k_out = r->one,
                      .v_out = r->one + BC_EACH, .bytes_each = BC_EACH};
    kvt_load *ld = NULL;
    uint64_t t0 = now_ns();
    int rc = kvt_load_submit(e, ns, &q, 1, &ld);
    if (rc == 0) rc = kvt_load_wait(ld, NULL);
    uint64_t t1 = now_ns();
    if (rc != 0) return bc_fail("loading one layer block", rc);
    if (check_loaded(&q, 1, "random load") != CLI_OK) return CLI_FAIL;
    if (memcmp(r->one, src_of(r, b, l), BC_LAYER_BYTES) != 0) {
      fprintf(stderr, "kvtier bench cold: block %u layer %u loaded differs\n", b, l);
      return CLI_FAIL;
    }
    r->lat_kvt[r->n_lat] = (double)(t1 - t0) / 1e3;
    pick(r, &b, &l);
    uint64_t off = (uint64_t)b * BC_TBLOCK_BYTES + (uint64_t)l * BC_LAYER_BYTES;
    t0 = now_ns();
    rc = pread_all(raw_fd, r->one, BC_LAYER_BYTES, off);
    t1 = now_ns();
    if (rc != 0) return bc_fail("reading the raw baseline file", rc);
    r->lat_raw[r->n_lat++] = (double)(t1 - t0) / 1e3;
  }
  return CLI_OK;
}

/* Depth 32: batches of BC_QD random single-layer loads, submit then wait. */
static int rand_qd32(bc_run *r, kvt_engine *e, kvt_ns_id ns, double *out_gbps)
{
  uint32_t n_batches = r->n_blocks * BC_LAYERS / BC_QD / 4; /* a quarter of the data */
  if (n_batches < 8) n_batches = 8;
  uint32_t bl[BC_QD][2];
  uint64_t ns_total = 0;
  for (uint32_t k = 0; k < n_batches; k++) {
    for (uint32_t i = 0; i < BC_QD; i++) {
      pick(r, &bl[i][0], &bl[i][1]);
      uint8_t *at = r->one + (size_t)i * BC_LAYER_BYTES;
      r->reqs[i] = (kvt_load_req){.key = r->keys[bl[i][0]], .layer = bl[i][1], .k_out = at,
                                  .v_out = at + BC_EACH, .bytes_each = BC_EACH};
    }
    kvt_load *ld = NULL;
    uint64_t t0 = now_ns();
    int rc = kvt_load_submit(e, ns, r->reqs, BC_QD, &ld);
    if (rc == 0) rc = kvt_load_wait(ld, NULL);
    ns_total += now_ns() - t0;
    if (rc != 0) return bc_fail("loading a batch of layer blocks", rc);
    if (check_loaded(r->reqs, BC_QD, "batched random load") != CLI_OK) return CLI_FAIL;
    for (uint32_t i = 0; i < BC_QD; i++)
      if (memcmp(r->one + (size_t)i * BC_LAYER_BYTES, src_of(r, bl[i][0], bl[i][1]),
                 BC_LAYER_BYTES) != 0) {
        fprintf(stderr, "kvtier bench cold: batched load of block %u layer %u differs\n",
                bl[i][0], bl[i][1]);
        return CLI_FAIL;
      }
  }
  *out_gbps = gbps((uint64_t)n_batches * BC_QD * BC_LAYER_BYTES, ns_total);
  return CLI_OK;
}

static int rand_reads(bc_run *r, const char *store, const char *raw_path, uint32_t compress,
                      double *qd32)
{
  uncache_store(store);
  uncache_file(raw_path);
  int fd = open(raw_path, O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) return bc_fail("opening the raw baseline file (O_DIRECT)", -errno);
  kvt_engine *e = NULL;
  kvt_ns_id ns;
  int rc = bc_open(r, store, compress, &e, &ns);
  if (rc == CLI_OK) rc = rand_qd1(r, e, ns, fd);
  if (rc == CLI_OK) rc = rand_qd32(r, e, ns, qd32);
  kvt_engine_close(e);
  close(fd);
  return rc;
}

/* ---- rounds -------------------------------------------------------------------------- */

typedef struct bc_paths {
  char kvt[2][PATH_MAX], raw[PATH_MAX], fpb[PATH_MAX];
} bc_paths;

static int round_paths(const bc_run *r, uint32_t i, bc_paths *p)
{
  int rc = path_of(p->kvt[0], sizeof p->kvt[0], r->dir.path, i, "kvtier-compress0");
  if (!rc) rc = path_of(p->kvt[1], sizeof p->kvt[1], r->dir.path, i, "kvtier-compress1");
  if (!rc) rc = path_of(p->raw, sizeof p->raw, r->dir.path, i, "raw.bin");
  if (!rc) rc = path_of(p->fpb, sizeof p->fpb, r->dir.path, i, "file-per-block");
  return rc ? bc_fail("round paths", rc) : CLI_OK;
}

static void round_cleanup(const bc_paths *p)
{
  remove_tree(p->kvt[0]);
  remove_tree(p->kvt[1]);
  remove_tree(p->fpb);
  unlink(p->raw);
}

/* Writes: even rounds kvtier(c0) raw kvtier(c1) file-per-block, odd rounds
 * the reverse, so drift of the disk within a round falls on every side. */
static int round_writes(bc_run *r, uint32_t i, const bc_paths *p)
{
  static const int order[2][4] = {{0, 2, 1, 3}, {3, 1, 2, 0}}; /* 0,1 kvtier; 2 raw; 3 fpb */
  int rc = CLI_OK;
  for (int k = 0; rc == CLI_OK && k < 4; k++) {
    int w = order[i % 2][k];
    progress("bench cold: round %u of %" PRIu64 ": writes (%d of 4)", i + 1, r->cfg.rounds, k + 1);
    if (w < 2) rc = kvt_write(r, p->kvt[w], (uint32_t)w, &r->var[w].write_gbps[i]);
    else if (w == 2) rc = raw_write(r, p->raw, &r->raw_write[i]);
    else rc = fpb_write(r, p->fpb, &r->fpb_write[i]);
  }
  return rc;
}

static int round_reads(bc_run *r, uint32_t i, const bc_paths *p)
{
  static const int order[2][3] = {{0, 2, 1}, {1, 2, 0}}; /* 0,1 kvtier; 2 raw */
  int rc = CLI_OK;
  for (int k = 0; rc == CLI_OK && k < 3; k++) {
    int w = order[i % 2][k];
    progress("bench cold: round %u of %" PRIu64 ": reads (%d of 3)", i + 1, r->cfg.rounds, k + 1);
    if (w < 2) rc = kvt_read(r, p->kvt[w], (uint32_t)w, &r->var[w].read_gbps[i]);
    else rc = raw_read(r, p->raw, &r->raw_read[i]);
  }
  if (rc == CLI_OK) {
    progress("bench cold: round %u of %" PRIu64 ": random reads", i + 1, r->cfg.rounds);
    rc = rand_reads(r, p->kvt[r->def_compress], p->raw, r->def_compress, &r->qd32[i]);
  }
  return rc;
}

static void round_ratios(bc_run *r, uint32_t i)
{
  for (int c = 0; c < 2; c++) {
    bc_variant *v = &r->var[c];
    v->write_vs_raw[i] = v->write_gbps[i] / r->raw_write[i];
    v->read_vs_raw[i] = v->read_gbps[i] / r->raw_read[i];
    v->write_vs_fpb[i] = v->write_gbps[i] / r->fpb_write[i];
  }
}

static int bc_rounds(bc_run *r)
{
  for (uint32_t i = 0; i < r->cfg.rounds; i++) {
    bc_paths p;
    int rc = round_paths(r, i, &p);
    if (rc == CLI_OK) round_cleanup(&p); /* left by an interrupted run */
    if (rc == CLI_OK) rc = round_writes(r, i, &p);
    if (rc == CLI_OK) rc = round_reads(r, i, &p);
    round_cleanup(&p);
    if (rc != CLI_OK) return rc;
    round_ratios(r, i);
  }
  progress_end();
  return CLI_OK;
}

/* ---- report ----------------------------------------------------------------------------- */

typedef struct bc_fig {
  double med, lo, hi;
} bc_fig;

static bc_fig fig(const double *v, size_t n)
{
  double tmp[BC_ROUNDS_MAX];
  memcpy(tmp, v, n * sizeof *v);
  bc_fig f;
  f.med = median_f64(tmp, n); /* sorts tmp */
  f.lo = tmp[0];
  f.hi = tmp[n - 1];
  return f;
}

typedef struct bc_summary {
  bc_fig w[2], rd[2], w_raw[2], rd_raw[2], w_fpb[2];
  bc_fig raw_w, raw_r, fpb, qd32;
  bc_fig raw_fpb;              /* raw / file per block: what write_vs_file_per_block can reach */
  double p50, p99, raw_p50, raw_p99;
  double stored_vs_raw[2];
} bc_summary;

static void summarize(bc_run *r, bc_summary *s)
{
  size_t n = r->cfg.rounds;
  for (int c = 0; c < 2; c++) {
    const bc_variant *v = &r->var[c];
    s->w[c] = fig(v->write_gbps, n);
    s->rd[c] = fig(v->read_gbps, n);
    s->w_raw[c] = fig(v->write_vs_raw, n);
    s->rd_raw[c] = fig(v->read_vs_raw, n);
    s->w_fpb[c] = fig(v->write_vs_fpb, n);
    s->stored_vs_raw[c] = (double)v->cold_write_bytes / (double)r->bytes;
  }
  s->raw_w = fig(r->raw_write, n);
  s->raw_r = fig(r->raw_read, n);
  s->fpb = fig(r->fpb_write, n);
  double rf[BC_ROUNDS_MAX];
  for (size_t i = 0; i < n; i++) rf[i] = r->raw_write[i] / r->fpb_write[i];
  s->raw_fpb = fig(rf, n);
  s->qd32 = fig(r->qd32, n);
  sort_f64(r->lat_kvt, r->n_lat);
  sort_f64(r->lat_raw, r->n_lat);
  s->p50 = percentile_sorted(r->lat_kvt, r->n_lat, 50);
  s->p99 = percentile_sorted(r->lat_kvt, r->n_lat, 99);
  s->raw_p50 = percentile_sorted(r->lat_raw, r->n_lat, 50);
  s->raw_p99 = percentile_sorted(r->lat_raw, r->n_lat, 99);
}

static void json_fig(json_w *j, const char *key, const bc_fig *f)
{
  json_obj(j, key);
  json_f64(j, "median", f->med);
  json_f64(j, "min", f->lo);
  json_f64(j, "max", f->hi);
  json_end(j);
}

static void bc_json(const bc_run *r, const bc_summary *s)
{
  const int d = (int)r->def_compress;
  json_w j;
  json_begin(&j, stdout);
  json_str(&j, "command", "bench cold");
  json_u64(&j, "bytes", r->bytes);
  json_u64(&j, "token_blocks", r->n_blocks);
  json_u64(&j, "block_tokens", BC_BLOCK_TOKENS);
  json_u64(&j, "token_block_bytes", BC_TBLOCK_BYTES);
  json_u64(&j, "layer_block_bytes", BC_LAYER_BYTES);
  json_u64(&j, "rounds", r->cfg.rounds);
  json_u64(&j, "seed", r->cfg.seed);
  json_str(&j, "io_backend", r->backend);
  json_str(&j, "io_why", r->why);
  json_str(&j, "raw_io", "io_uring, O_DIRECT, 1 MiB requests");
  json_u64(&j, "raw_depth", raw_depth());
  json_u64(&j, "raw_read_threads", raw_readers());
  json_bool(&j, "compression", d);
  json_str(&j, "units", "GB/s = 1e9 bytes of raw KV per second; medians over rounds; ratios "
                        "are medians of per-round ratios");
  json_f64(&j, "write_gbps", s->w[d].med);
  json_f64(&j, "raw_write_gbps", s->raw_w.med);
  json_f64(&j, "file_per_block_gbps", s->fpb.med);
  json_f64(&j, "read_gbps", s->rd[d].med);
  json_f64(&j, "raw_read_gbps", s->raw_r.med);
  json_f64(&j, "write_vs_raw", s->w_raw[d].med);
  json_f64(&j, "read_vs_raw", s->rd_raw[d].med);
  json_f64(&j, "write_vs_file_per_block", s->w_fpb[d].med);
  json_f64(&j, "raw_vs_file_per_block", s->raw_fpb.med);
  json_f64(&j, "rand_read_p50_us", s->p50);
  json_f64(&j, "rand_read_p99_us", s->p99);
  json_f64(&j, "rand_read_qd32_gbps", s->qd32.med);
  json_f64(&j, "raw_rand_read_p50_us", s->raw_p50);
  json_f64(&j, "raw_rand_read_p99_us", s->raw_p99);
  json_u64(&j, "rand_read_samples", r->n_lat);
  for (int c = 0; c < 2; c++) {
    const bc_variant *v = &r->var[c];
    json_obj(&j, c ? "compress_on" : "compress_off");
    json_fig(&j, "write_gbps", &s->w[c]);
    json_fig(&j, "read_gbps", &s->rd[c]);
    json_f64(&j, "write_vs_raw", s->w_raw[c].med);
    json_f64(&j, "read_vs_raw", s->rd_raw[c].med);
    json_f64(&j, "write_vs_file_per_block", s->w_fpb[c].med);
    json_u64(&j, "cold_write_bytes", v->cold_write_bytes);
    json_f64(&j, "stored_vs_raw", s->stored_vs_raw[c]);
    json_u64(&j, "segments", v->cold_segments);
    json_end(&j);
  }
  json_str(&j, "faster_write", s->w[1].med > s->w[0].med ? "compress_on" : "compress_off");
  json_str(&j, "faster_read", s->rd[1].med > s->rd[0].med ? "compress_on" : "compress_off");
  json_fig(&j, "raw_write", &s->raw_w);
  json_fig(&j, "raw_read", &s->raw_r);
  json_fig(&j, "file_per_block", &s->fpb);
  json_fig(&j, "rand_read_qd32", &s->qd32);
  json_obj(&j, "targets");
  json_bool(&j, "write_vs_raw_ge_0_8", s->w_raw[d].med >= 0.8);
  json_bool(&j, "read_vs_raw_ge_0_8", s->rd_raw[d].med >= 0.8);
  json_bool(&j, "write_vs_file_per_block_ge_3", s->w_fpb[d].med >= 3.0);
  json_end(&j);
  json_str(&j, "dir", r->dir.made ? "(scratch, removed)" : r->dir.path);
  json_u64(&j, "cpus_online", (uint64_t)sysconf(_SC_NPROCESSORS_ONLN));
  json_f64(&j, "load_avg_start", r->load_start);
  json_f64(&j, "load_avg_end", r->load_end);
  json_f64(&j, "seconds", (double)(now_ns() - r->started_ns) / 1e9);
  json_end(&j);
}

static const char *yes(int ok) { return ok ? "met" : "NOT met"; }

static void bc_human(const bc_run *r, const bc_summary *s)
{
  const int d = (int)r->def_compress;
  char b1[32];
  char b2[32];
  printf("bench cold: %s of KV (%u token blocks of %s: %u layers x %u tokens x %u KV heads x "
         "head_dim %u, f16)\n%" PRIu64 " interleaved rounds, medians [min-max]; GB/s of raw KV; "
         "I/O %s\n  (%s)\n\n",
         fmt_bytes(b1, sizeof b1, r->bytes), r->n_blocks, fmt_bytes(b2, sizeof b2, BC_TBLOCK_BYTES),
         BC_LAYERS, BC_BLOCK_TOKENS, BC_HEADS,
         BC_HEAD_DIM, r->cfg.rounds, r->backend, r->why);
  printf("  %-34s %6s  %-15s %8s\n", "durable write", "GB/s", "", "vs raw");
  for (int c = 0; c < 2; c++)
    printf("  kvtier, cold_compress %d%-10s %6.3f  [%.3f-%.3f]  %7.2f  (%.2fx file per block)\n",
           c, c == d ? " (default)" : "", s->w[c].med, s->w[c].lo, s->w[c].hi, s->w_raw[c].med,
           s->w_fpb[c].med);
  char how[64];
  snprintf(how, sizeof how, "raw, depth %u, fdatasync/32 MiB", raw_depth());
  printf("  %-34s %6.3f  [%.3f-%.3f]\n", how, s->raw_w.med, s->raw_w.lo, s->raw_w.hi);
  printf("  %-34s %6.3f  [%.3f-%.3f]  (raw: %.2fx file per block, the most kvtier can reach)\n\n",
         "one file per block, fsync each", s->fpb.med, s->fpb.lo, s->fpb.hi, s->raw_fpb.med);
  printf("  %-34s %6s  %-15s %8s\n", "read back, every layer", "GB/s", "", "vs raw");
  for (int c = 0; c < 2; c++)
    printf("  kvtier, cold_compress %d%-10s %6.3f  [%.3f-%.3f]  %7.2f\n", c,
           c == d ? " (default)" : "", s->rd[c].med, s->rd[c].lo, s->rd[c].hi, s->rd_raw[c].med);
  snprintf(how, sizeof how, "raw, %u threads x depth %u", raw_readers(),
           (raw_depth() + raw_readers() - 1) / raw_readers());
  printf("  %-34s %6.3f  [%.3f-%.3f]\n\n", how, s->raw_r.med, s->raw_r.lo, s->raw_r.hi);
  printf("  random single layer (%s), depth 1: kvtier p50 %.0f us, p99 %.0f us; raw pread "
         "p50 %.0f us, p99 %.0f us (%zu samples each)\n", fmt_bytes(b2, sizeof b2, BC_LAYER_BYTES),
         s->p50, s->p99, s->raw_p50, s->raw_p99, r->n_lat);
  printf("  random single layers, batches of %u (submit, wait): kvtier %.3f GB/s [%.3f-%.3f]\n\n",
         BC_QD, s->qd32.med, s->qd32.lo, s->qd32.hi);
  printf("  compression: stored %.3f of the raw bytes with cold_compress 1, %.3f with 0 "
         "(headers, 4 KiB alignment);\n  faster to write: cold_compress %d; to read: "
         "cold_compress %d\n\n", s->stored_vs_raw[1], s->stored_vs_raw[0],
         s->w[1].med > s->w[0].med, s->rd[1].med > s->rd[0].med);
  printf("machine: %ld CPUs, 1-minute load average %.2f at the start, %.2f at the end\n",
         sysconf(_SC_NPROCESSORS_ONLN), r->load_start, r->load_end);
  printf("targets (default cold_compress %d): write >= 0.8 x raw %s (%.2f); read >= 0.8 x raw "
         "%s (%.2f); write >= 3 x file per block %s (%.2f)\n", d, yes(s->w_raw[d].med >= 0.8),
         s->w_raw[d].med, yes(s->rd_raw[d].med >= 0.8), s->rd_raw[d].med,
         yes(s->w_fpb[d].med >= 3.0), s->w_fpb[d].med);
}

/* ---- entry --------------------------------------------------------------------------------- */

int bench_cold(int argc, char **argv)
{
  bc_cfg cfg = {.dir = NULL, .mib = 256, .rounds = 5, .samples = 400, .seed = 1,
                .block_tokens = 16, .json = 0};
  cli_opt o[BC_N_OPTS];
  bc_opts(&cfg, o);
  int want_help = 0;
  int rc = cli_parse("bench cold", argc, argv, o, BC_N_OPTS, &want_help);
  if (want_help) bench_usage(stdout);
  if (rc != CLI_OK || want_help) return rc;
  /* Not with a remote tier: bench cold measures the local cold tier
   * against raw file I/O; a remote writer behind it would add its SETs to
   * the rounds, and a block another round's engine already sent would
   * count twice (docs/remote.md). bench remote measures the cluster. */
  if (cfg.remote) {
    fprintf(stderr, "kvtier bench cold: --remote: bench cold measures the local cold tier "
                    "against raw file I/O and does not run with a remote tier; 'kvtier bench "
                    "remote --url URL' measures that (docs/remote.md)\n");
    return CLI_USAGE;
  }
  bc_tokens = (uint32_t)cfg.block_tokens;
  bc_shape.block_tokens = bc_desc.shape.block_tokens = bc_tokens;
  bc_run *r = calloc(1, sizeof *r);
  if (r == NULL) return bc_fail("allocating state", -ENOMEM);
  r->cfg = cfg;
  r->started_ns = now_ns();
  r->load_start = load_avg();
  r->n_blocks = (uint32_t)((cfg.mib << 20) / BC_TBLOCK_BYTES);
  r->bytes = (uint64_t)r->n_blocks * BC_TBLOCK_BYTES;
  prng_seed(&r->rng, mix64(cfg.seed ^ 0x636f6c64ull));
  kvt_options defaults;
  kvt_options_init(&defaults);
  r->def_compress = defaults.cold_compress ? 1 : 0;
  if (cfg.dir && mkdir(cfg.dir, 0755) != 0 && errno != EEXIST) {
    rc = bc_fail("creating --dir", -errno);
    free(r);
    return rc;
  }
  rc = bench_dir_open(&r->dir, cfg.dir, "bench cold");
  if (rc == CLI_OK) {
    rc = bc_alloc(r);
    if (rc == CLI_OK) rc = bc_rounds(r);
    bench_dir_close(&r->dir, "bench cold");
  }
  r->load_end = load_avg();
  if (rc == CLI_OK) {
    bc_summary s;
    summarize(r, &s);
    if (cfg.json)
      bc_json(r, &s);
    else
      bc_human(r, &s);
  }
  bc_free(r);
  free(r);
  return rc;
}
