/* util.h - helpers shared by the kvtier command: option parsing, a tiny JSON
 * writer, monotonic time and medians, a seeded PRNG, f32 -> f16 conversion
 * and a deterministic generator of model-like KV. Uses only the public API. */
#ifndef KVT_TOOLS_UTIL_H
#define KVT_TOOLS_UTIL_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvtier.h"

/* Exit statuses of every subcommand. */
#define CLI_OK 0    /* done */
#define CLI_FAIL 1  /* a library call or a check failed */
#define CLI_USAGE 2 /* bad command line */

/* ---- command-line options ------------------------------------------- */

typedef enum cli_kind {
  CLI_FLAG, /* out is int*: set to 1 */
  CLI_U64,  /* out is uint64_t*: a decimal number in [min, max] */
  CLI_STR,  /* out is const char **: a non-empty string from argv */
} cli_kind;

typedef struct cli_opt {
  const char *name; /* "--agents" */
  const char *arg;  /* value name in the usage ("N"), NULL for flags */
  cli_kind kind;
  void *out;
  uint64_t min, max; /* CLI_U64 only */
  const char *help;
} cli_opt;

/* Parse argv[0..argc) against opts ("--name value" or "--name=value").
 * "--help" or "-h" sets *want_help and stops. On a bad argument prints what
 * is wrong to stderr, naming cmd, and returns CLI_USAGE; else CLI_OK. */
int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, size_t n_opts,
              int *want_help);

/* Print the option table, one option a line, as part of a usage text. */
void cli_print_opts(FILE *f, const cli_opt *opts, size_t n_opts);

/* Report a failed library call: "kvtier CMD: WHAT: <kvt_strerror(rc)>".
 * Returns CLI_FAIL so callers can `return cli_lib_error(...)`. */
int cli_lib_error(const char *cmd, const char *what, int rc);

/* kvt_engine_open() that keeps the detail of a failure, so that the next
 * cli_lib_error() with the same code prints it on a second line. */
int cli_engine_open(const char *dir, const kvt_options *opt, kvt_engine **out);

/* The --remote option, one table entry shared by every command that opens a
 * store, so that its name and help text are the same everywhere. */
#define CLI_REMOTE_HELP                                                              \
  "the remote tier on a Redis Cluster: redis://[user[:pw]@]host:port[,...] "         \
  "(password also from KVTIER_REDIS_PASSWORD; docs/remote.md)"
#define CLI_OPT_REMOTE(out) {"--remote", "URL", CLI_STR, (out), 0, 0, CLI_REMOTE_HELP}

/* The same with a remote tier (--remote URL; NULL: none). remote_cli.c. */
int cli_engine_open_remote(const char *dir, const kvt_options *opt, const char *url,
                           kvt_engine **out);
int cli_engine_open_remote_info(const char *dir, const kvt_options *opt,
                                const kvt_remote_options *ro, kvt_engine **out);

/* Print (once) the detail of the last failed cli_engine_open() when it
 * failed with rc. */
void cli_open_detail(const char *cmd, int rc);

/* cli_lib_error() for a call on e, with the detail kvt_last_error() has
 * for it when there is one. */
int cli_engine_error(const char *cmd, const char *what, kvt_engine *e, int rc);

/* A progress line on stderr, rewritten in place, only when stderr is a
 * terminal; progress_end() clears it. */
void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void progress_end(void);

/* "512.0 MiB" into buf (at least 32 bytes); returns buf. */
const char *fmt_bytes(char *buf, size_t len, uint64_t bytes);

/* ---- JSON writer: one object, nested objects, scalar members ---------- */

#define JSON_MAX_DEPTH 8

/* s as a JSON string literal, escaped. */
void json_string(FILE *f, const char *s);
typedef struct json_w {
  FILE *f;
  uint32_t depth;                    /* open objects */
  uint8_t need_comma[JSON_MAX_DEPTH];
} json_w;

void json_begin(json_w *j, FILE *f);              /* writes "{" */
void json_obj(json_w *j, const char *key);        /* "key": { */
void json_end(json_w *j);                         /* "}"; a newline after the outermost */
void json_u64(json_w *j, const char *key, uint64_t v);
void json_f64(json_w *j, const char *key, double v); /* non-finite becomes null */
void json_str(json_w *j, const char *key, const char *v);
void json_bool(json_w *j, const char *key, int v);

/* ---- time and order statistics --------------------------------------- */

uint64_t now_ns(void); /* CLOCK_MONOTONIC */
/* The L3 cache's size in bytes from sysfs, 0 when unknown: benchmarks size
 * their working sets above it, or they measure the cache, not memory. */
uint64_t cpu_l3_bytes(void);

/* Sort v[0..n) ascending in place. */
void sort_f64(double *v, size_t n);
/* Median of v[0..n), n >= 1; sorts v. */
double median_f64(double *v, size_t n);
/* Nearest-rank percentile (0 < p <= 100) of sorted v[0..n), n >= 1. */
double percentile_sorted(const double *v, size_t n, double p);

/* ---- seeded PRNG (splitmix64) ----------------------------------------- */

typedef struct prng {
  uint64_t s;
} prng;

uint64_t mix64(uint64_t x); /* a bijective 64-bit mixer */
void prng_seed(prng *r, uint64_t seed);
uint64_t prng_next(prng *r);
uint32_t prng_below(prng *r, uint32_t n); /* uniform in [0, n), n >= 1 */

/* A standard normal draw (Box-Muller on two 53-bit uniforms). */
double prng_gauss(prng *r);

/* Fill tokens[0..n) with ids in [0, vocab) drawn from r. */
void gen_tokens(prng *r, uint32_t vocab, uint32_t *tokens, size_t n);

/* ---- f16 ---------------------------------------------------------------- */

/* IEEE binary32 -> binary16, round to nearest even; overflow gives infinity,
 * NaN stays NaN (quietened, top payload bits kept), as F16C's VCVTPS2PH. */
uint16_t f32_to_f16(float f);
/* binary16 -> binary32, exact (subnormals, infinities and NaN included). */
float f16_to_f32(uint16_t h);

/* ---- codecs -------------------------------------------------------------- */

/* Mean squared error of the Lloyd-Max quantizer of N(0,1) at a value
 * codec's bits (2: 0.1175, 3: 0.03454, 4: 0.009497): the NMSE a rotated
 * Gaussian vector should show. 0 for any other codec. */
double lloyd_max_nmse(int v_codec);

/* ---- deterministic KV generator ------------------------------------------ *
 * The KV of position i in layer l, head h is a function of (seed, tokens
 * 0..i, l, h) only, as with a real model: equal prefixes give equal KV.
 * Values are Gaussian per channel; K has a few outlier channels per head
 * (large scale and offset), as measured in real models. */

typedef struct kvgen {
  kvt_shape shape;  /* dtype KVT_F16 or KVT_F32 */
  uint64_t seed;
  float *gauss;     /* [KVGEN_TABLE]: inverse normal CDF at (i + 0.5) / n */
  float *k_scale;   /* [layer][head][dim] */
  float *k_bias;    /* [layer][head][dim] */
  float *v_scale;   /* [layer][head][dim] */
  uint64_t *salt;   /* [layer][head] */
} kvgen;

#define KVGEN_TABLE 65536u
#define KVGEN_VOCAB 128256u /* Llama 3 */

/* 0; KVT_EDTYPE (dtype other than f16 or f32); KVT_ESHAPE; -ENOMEM. */
int kvgen_init(kvgen *g, const kvt_shape *shape, uint64_t seed);
void kvgen_free(kvgen *g);

/* pos_hash[i] = hash of (seed, tokens[0..i]); chain from a previous run by
 * passing its last hash as prev (0 for the start of a sequence). */
void kvgen_pos_hashes(const kvgen *g, uint64_t prev, const uint32_t *tokens, size_t n,
                      uint64_t *pos_hash);

/* K and V of layer `layer` for n_tokens positions given by pos_hash, laid
 * out [token][head][dim] in the shape's dtype; k and v hold
 * n_tokens * n_kv_heads * head_dim elements each. */
void kvgen_fill(const kvgen *g, const uint64_t *pos_hash, size_t n_tokens, uint32_t layer,
                void *k, void *v);

/* Remove a directory tree that this process created (bench scratch). */
int remove_tree(const char *dir);

/* A benchmark's store directory: the user's, or a scratch one. */
typedef struct bench_dir {
  char path[PATH_MAX];
  int made; /* created here: removed at the end */
} bench_dir;

/* The user's directory (user_dir non-NULL), or a scratch one under $TMPDIR
 * that bench_dir_close() removes. CLI_OK, or CLI_FAIL reported for cmd. */
int bench_dir_open(bench_dir *d, const char *user_dir, const char *cmd);
void bench_dir_close(bench_dir *d, const char *cmd);

/* The remote tier's counters of e: 1, or 0 (rs->size 0) when it has
 * none; then the printers print nothing. A text paragraph on stdout, or a
 * "remote" object. cli_remote_get_settled first waits (at most ms) until
 * want background writes to the cluster are settled. remote_cli.c. */
int cli_remote_get(kvt_engine *e, kvt_remote_stats *rs);
int cli_remote_get_settled(kvt_engine *e, kvt_remote_stats *rs, uint64_t want, unsigned ms);
void cli_remote_print(const kvt_remote_stats *rs);
void cli_remote_json(json_w *j, const kvt_remote_stats *rs);

#endif
