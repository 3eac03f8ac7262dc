/* util.c - helpers of the kvtier command (see util.h): options, JSON,
 * timing, order statistics, PRNG, f16 conversion, the KV generator and
 * benchmark directories.
 * Plain C11 + POSIX; no SIMD, since the tools are built without -mf16c. */
#include "util.h"

#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- command-line options ------------------------------------------- */

static const cli_opt *opt_find(const cli_opt *opts, size_t n, const char *name, size_t len)
{
  for (size_t i = 0; i < n; i++)
    if (strlen(opts[i].name) == len && memcmp(opts[i].name, name, len) == 0) return &opts[i];
  return NULL;
}

static int usage_error(const char *cmd, const char *fmt, const char *a, const char *b)
{
  fprintf(stderr, "kvtier %s: ", cmd);
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, "\nrun 'kvtier help %s' for its options\n", cmd);
  return CLI_USAGE;
}

/* A decimal unsigned number, whole string, no sign, no overflow. */
static int parse_u64(const char *s, uint64_t *out)
{
  if (*s < '0' || *s > '9') return -1;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0') return -1;
  *out = (uint64_t)v;
  return 0;
}

static int opt_value(const char *cmd, const cli_opt *o, const char *val)
{
  if (o->kind == CLI_STR) {
    if (*val == '\0') return usage_error(cmd, "%s needs a non-empty %s", o->name, o->arg);
    *(const char **)o->out = val;
    return CLI_OK;
  }
  uint64_t v = 0;
  if (parse_u64(val, &v) != 0 || v < o->min || v > o->max) {
    fprintf(stderr, "kvtier %s: %s must be a whole number from %" PRIu64 " to %" PRIu64
            ", not '%s'\nrun 'kvtier help %s' for its options\n",
            cmd, o->name, o->min, o->max, val, cmd);
    return CLI_USAGE;
  }
  *(uint64_t *)o->out = v;
  return CLI_OK;
}

int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, size_t n_opts,
              int *want_help)
{
  *want_help = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      *want_help = 1;
      return CLI_OK;
    }
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0')
      return usage_error(cmd, "unexpected argument '%s'%s", a, "");
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    const cli_opt *o = opt_find(opts, n_opts, a, len);
    if (o == NULL) {
      fprintf(stderr, "kvtier %s: unknown option '%.*s'\nrun 'kvtier help %s' for its options\n",
              cmd, (int)len, a, cmd);
      return CLI_USAGE;
    }
    if (o->kind == CLI_FLAG) {
      if (eq) return usage_error(cmd, "%s takes no value%s", o->name, "");
      *(int *)o->out = 1;
      continue;
    }
    const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (val == NULL) return usage_error(cmd, "%s needs a value (%s)", o->name, o->arg);
    int rc = opt_value(cmd, o, val);
    if (rc != CLI_OK) return rc;
  }
  return CLI_OK;
}

void cli_print_opts(FILE *f, const cli_opt *opts, size_t n_opts)
{
  for (size_t i = 0; i < n_opts; i++) {
    char left[48];
    snprintf(left, sizeof left, "%s%s%s", opts[i].name, opts[i].arg ? " " : "",
             opts[i].arg ? opts[i].arg : "");
    fprintf(f, "  %-18s %s\n", left, opts[i].help);
  }
  fprintf(f, "  %-18s %s\n", "--help", "show this help");
}

/* The detail of the last failed cli_engine_open(), printed once. */
static kvt_error_info open_info;

static void print_detail(const char *cmd, const kvt_error_info *info, int rc)
{
  if (info->code == rc && rc != 0 && info->message[0])
    fprintf(stderr, "kvtier %s: detail: %s\n", cmd, info->message);
}

int cli_lib_error(const char *cmd, const char *what, int rc)
{
  progress_end();
  fprintf(stderr, "kvtier %s: %s: %s\n", cmd, what, kvt_strerror(rc));
  cli_open_detail(cmd, rc);
  return CLI_FAIL;
}

void cli_open_detail(const char *cmd, int rc)
{
  print_detail(cmd, &open_info, rc);
  open_info.code = 0;
}

int cli_engine_open(const char *dir, const kvt_options *opt, kvt_engine **out)
{
  return kvt_engine_open_info(dir, opt, out, &open_info);
}

int cli_engine_open_remote_info(const char *dir, const kvt_options *opt,
                                const kvt_remote_options *ro, kvt_engine **out)
{
  return kvt_engine_open_remote(dir, opt, ro, out, &open_info);
}

int cli_engine_error(const char *cmd, const char *what, kvt_engine *e, int rc)
{
  kvt_error_info info;
  cli_lib_error(cmd, what, rc);
  if (e && kvt_last_error(e, &info) == 0) print_detail(cmd, &info, rc);
  return CLI_FAIL;
}

/* ---- progress --------------------------------------------------------- */

static int progress_tty = -1; /* unknown until first use */
static int progress_shown;

void progress(const char *fmt, ...)
{
  if (progress_tty < 0) progress_tty = isatty(STDERR_FILENO) ? 1 : 0;
  if (!progress_tty) return;
  va_list ap;
  va_start(ap, fmt);
  fputs("\r\033[K", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fflush(stderr);
  progress_shown = 1;
}

void progress_end(void)
{
  if (!progress_shown) return;
  fputs("\r\033[K", stderr);
  fflush(stderr);
  progress_shown = 0;
}

const char *fmt_bytes(char *buf, size_t len, uint64_t bytes)
{
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < sizeof unit / sizeof unit[0]) {
    v /= 1024.0;
    u++;
  }
  if (u == 0)
    snprintf(buf, len, "%" PRIu64 " B", bytes);
  else
    snprintf(buf, len, "%.1f %s", v, unit[u]);
  return buf;
}

/* ---- JSON writer ------------------------------------------------------ */

void json_string(FILE *f, const char *s)
{
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p < 0x20)
      fprintf(f, "\\u%04x", *p);
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

static void json_key(json_w *j, const char *key)
{
  if (j->depth == 0) abort(); /* a member outside any object: a bug in the caller */
  if (j->need_comma[j->depth - 1]) fputc(',', j->f);
  j->need_comma[j->depth - 1] = 1;
  json_string(j->f, key);
  fputc(':', j->f);
}

static void json_open(json_w *j)
{
  if (j->depth >= JSON_MAX_DEPTH) abort();
  fputc('{', j->f);
  j->need_comma[j->depth++] = 0;
}

void json_begin(json_w *j, FILE *f)
{
  j->f = f;
  j->depth = 0;
  json_open(j);
}

void json_obj(json_w *j, const char *key)
{
  json_key(j, key);
  json_open(j);
}

void json_end(json_w *j)
{
  if (j->depth == 0) abort();
  fputc('}', j->f);
  if (--j->depth == 0) fputc('\n', j->f);
}

void json_u64(json_w *j, const char *key, uint64_t v)
{
  json_key(j, key);
  fprintf(j->f, "%" PRIu64, v);
}

void json_f64(json_w *j, const char *key, double v)
{
  json_key(j, key);
  if (isfinite(v))
    fprintf(j->f, "%.9g", v);
  else
    fputs("null", j->f);
}

void json_str(json_w *j, const char *key, const char *v)
{
  json_key(j, key);
  json_string(j->f, v);
}

void json_bool(json_w *j, const char *key, int v)
{
  json_key(j, key);
  fputs(v ? "true" : "false", j->f);
}

/* ---- time and order statistics --------------------------------------- */

uint64_t now_ns(void)
{
  struct timespec ts;
  if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) abort(); /* cannot fail on Linux */
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_f64(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void sort_f64(double *v, size_t n) { qsort(v, n, sizeof *v, cmp_f64); }

double median_f64(double *v, size_t n)
{
  sort_f64(v, n);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double percentile_sorted(const double *v, size_t n, double p)
{
  size_t rank = (size_t)ceil(p / 100.0 * (double)n); /* nearest rank, 1-based */
  if (rank < 1) rank = 1;
  if (rank > n) rank = n;
  return v[rank - 1];
}

/* ---- PRNG ------------------------------------------------------------- */

uint64_t mix64(uint64_t x)
{
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void prng_seed(prng *r, uint64_t seed) { r->s = seed; }

uint64_t prng_next(prng *r)
{
  r->s += 0x9e3779b97f4a7c15ull;
  return mix64(r->s);
}

uint32_t prng_below(prng *r, uint32_t n)
{
  /* Lemire's multiply-shift; the bias (< n / 2^64) is far below anything
   * a token generator could show. */
  return (uint32_t)(((unsigned __int128)prng_next(r) * n) >> 64);
}

double prng_gauss(prng *r)
{
  double u1 = ((double)(prng_next(r) >> 11) + 0.5) * 0x1p-53; /* (0, 1): log is finite */
  double u2 = (double)(prng_next(r) >> 11) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void gen_tokens(prng *r, uint32_t vocab, uint32_t *tokens, size_t n)
{
  for (size_t i = 0; i < n; i++) tokens[i] = prng_below(r, vocab);
}

/* ---- f16 --------------------------------------------------------------- */

/* A value below the smallest normal f16 (2^-14): shift the 24-bit
 * significand down to units of 2^-24 and round to nearest even. */
static uint16_t f16_subnormal(uint32_t sign, uint32_t ax)
{
  if (ax < 0x33000000u) return (uint16_t)sign; /* <= 2^-25: rounds to zero */
  uint32_t e = ax >> 23;                       /* 102 .. 112 */
  uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126 - e;                    /* 14 .. 24 */
  uint32_t q = m >> shift;
  uint32_t rem = m & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) q++;
  return (uint16_t)(sign | q); /* q == 0x400 is the smallest normal: still right */
}

static inline uint16_t f16_round(float f)
{
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* NaN */
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (or inf): inf */
  if (ax < 0x38800000u) return f16_subnormal(sign, ax);
  /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits
   * to nearest even; a carry into the exponent is the right result. */
  uint32_t r = ax - 0x38000000u + 0xfffu + ((ax >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

uint16_t f32_to_f16(float f) { return f16_round(f); }

float f16_to_f32(uint16_t h)
{
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0x1f)
    x = sign | 0x7f800000u | (m << 13); /* infinity, NaN */
  else if (e != 0)
    x = sign | ((e + 112) << 23) | (m << 13);
  else if (m == 0)
    x = sign;
  else { /* subnormal: m * 2^-24, exact in binary32 */
    float f = (float)m * 0x1p-24f;
    return sign ? -f : f;
  }
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

/* ---- codecs ------------------------------------------------------------- */

double lloyd_max_nmse(int v_codec)
{
  switch (v_codec) {
  case KVT_CODEC_V2: return 0.1175;
  case KVT_CODEC_V3: return 0.03454;
  case KVT_CODEC_V4: return 0.009497;
  default: return 0.0;
  }
}

/* ---- KV generator --------------------------------------------------------- */

/* Inverse of the standard normal CDF (P. J. Acklam's rational
 * approximation, relative error below 1.2e-9), for 0 < p < 1. */
static double norm_inv(double p)
{
  static const double a[6] = {-3.969683028665376e+01, 2.209460984245205e+02,
                              -2.759285104469687e+02, 1.383577518672690e+02,
                              -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[5] = {-5.447609879822406e+01, 1.615858368580409e+02,
                              -1.556989798598866e+02, 6.680131188771972e+01,
                              -1.328068155288572e+01};
  static const double c[6] = {-7.784894002430293e-03, -3.223964580411365e-01,
                              -2.400758277161838e+00, -2.549732539343734e+00,
                              4.374664141464968e+00, 2.938163982698783e+00};
  static const double d[4] = {7.784695709041462e-03, 3.224671290700398e-01,
                              2.445134137142996e+00, 3.754408661907416e+00};
  const double plow = 0.02425;
  if (p < plow || p > 1 - plow) {
    double q = sqrt(-2 * log(p < plow ? p : 1 - p));
    double x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
               ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    return p < plow ? x : -x;
  }
  double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

/* Per-channel scales of one (layer, head): K channels near 1 with a few
 * outliers (large scale and offset), V a per-layer scale. */
static void kvgen_channels(kvgen *g, uint32_t l, uint32_t h)
{
  const uint32_t D = g->shape.head_dim;
  size_t base = ((size_t)l * g->shape.n_kv_heads + h) * D;
  prng r;
  prng_seed(&r, mix64(g->seed ^ 0x6368616e6e656c73ull) ^ ((uint64_t)l << 32 | h));
  float v_layer = 0.5f + 0.5f * (float)prng_below(&r, 1000) / 1000.0f;
  for (uint32_t d = 0; d < D; d++) {
    g->k_scale[base + d] = 0.8f + 0.4f * (float)prng_below(&r, 1000) / 1000.0f;
    g->k_bias[base + d] = 0.0f;
    g->v_scale[base + d] = v_layer;
  }
  uint32_t n_out = D >= 32 ? 3 : 1; /* a few outlier channels per head */
  for (uint32_t i = 0; i < n_out; i++) {
    uint32_t d = prng_below(&r, D);
    g->k_scale[base + d] = 6.0f + 6.0f * (float)prng_below(&r, 1000) / 1000.0f;
    g->k_bias[base + d] = (prng_below(&r, 2) ? 1.0f : -1.0f) * 4.0f;
  }
  g->salt[(size_t)l * g->shape.n_kv_heads + h] = mix64(prng_next(&r));
}

int kvgen_init(kvgen *g, const kvt_shape *shape, uint64_t seed)
{
  memset(g, 0, sizeof *g);
  if (shape->dtype != KVT_F16 && shape->dtype != KVT_F32) return KVT_EDTYPE;
  if (shape->n_layers == 0 || shape->n_layers > KVT_MAX_LAYERS || shape->n_kv_heads == 0 ||
      shape->n_kv_heads > KVT_MAX_HEADS || shape->head_dim == 0 ||
      shape->head_dim > KVT_MAX_HEAD_DIM)
    return KVT_ESHAPE;
  g->shape = *shape;
  g->seed = seed;
  size_t lh = (size_t)shape->n_layers * shape->n_kv_heads;
  size_t ch = lh * shape->head_dim;
  g->gauss = malloc(KVGEN_TABLE * sizeof *g->gauss);
  g->k_scale = malloc(ch * sizeof *g->k_scale);
  g->k_bias = malloc(ch * sizeof *g->k_bias);
  g->v_scale = malloc(ch * sizeof *g->v_scale);
  g->salt = malloc(lh * sizeof *g->salt);
  if (!g->gauss || !g->k_scale || !g->k_bias || !g->v_scale || !g->salt) {
    kvgen_free(g);
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < KVGEN_TABLE; i++)
    g->gauss[i] = (float)norm_inv(((double)i + 0.5) / KVGEN_TABLE);
  for (uint32_t l = 0; l < shape->n_layers; l++)
    for (uint32_t h = 0; h < shape->n_kv_heads; h++) kvgen_channels(g, l, h);
  return 0;
}

void kvgen_free(kvgen *g)
{
  free(g->gauss);
  free(g->k_scale);
  free(g->k_bias);
  free(g->v_scale);
  free(g->salt);
  memset(g, 0, sizeof *g);
}

void kvgen_pos_hashes(const kvgen *g, uint64_t prev, const uint32_t *tokens, size_t n,
                      uint64_t *pos_hash)
{
  uint64_t h = prev ? prev : mix64(g->seed ^ 0x7072656669780000ull);
  for (size_t i = 0; i < n; i++) {
    h = mix64(h ^ mix64((uint64_t)tokens[i] + 0x9e3779b97f4a7c15ull));
    pos_hash[i] = h;
  }
}

/* One row of head_dim values: Gaussian from the table, scaled per channel,
 * four 16-bit table indices per 64-bit draw. */
static void gen_row(const float *gauss, uint64_t st, const float *scale, const float *bias,
                    uint32_t D, uint32_t dtype, void *out)
{
  for (uint32_t d = 0; d < D; d += 4) {
    st += 0x9e3779b97f4a7c15ull;
    uint64_t r = mix64(st);
    for (uint32_t i = 0; i < 4 && d + i < D; i++) {
      float x = gauss[(r >> (16 * i)) & 0xffffu] * scale[d + i] + (bias ? bias[d + i] : 0.0f);
      if (dtype == KVT_F16)
        ((uint16_t *)out)[d + i] = f16_round(x);
      else
        ((float *)out)[d + i] = x;
    }
  }
}

void kvgen_fill(const kvgen *g, const uint64_t *pos_hash, size_t n_tokens, uint32_t layer,
                void *k, void *v)
{
  const uint32_t H = g->shape.n_kv_heads, D = g->shape.head_dim, dt = g->shape.dtype;
  const size_t es = kvt_dtype_size(dt);
  for (size_t t = 0; t < n_tokens; t++) {
    for (uint32_t h = 0; h < H; h++) {
      size_t lh = (size_t)layer * H + h;
      size_t off = ((t * H) + h) * D * es;
      uint64_t st = mix64(pos_hash[t] ^ g->salt[lh]);
      gen_row(g->gauss, st, g->k_scale + lh * D, g->k_bias + lh * D, D, dt, (uint8_t *)k + off);
      gen_row(g->gauss, ~st, g->v_scale + lh * D, NULL, D, dt, (uint8_t *)v + off);
    }
  }
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
  (void)sb;
  (void)ftw;
  return (flag == FTW_DP ? rmdir(path) : unlink(path)) != 0 ? -1 : 0;
}

int remove_tree(const char *dir)
{
  return nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0 ? -errno : 0;
}

int bench_dir_open(bench_dir *d, const char *user_dir, const char *cmd)
{
  d->made = 0;
  if (user_dir) {
    if (strlen(user_dir) >= sizeof d->path - 32)
      return cli_lib_error(cmd, "--dir", -ENAMETOOLONG);
    snprintf(d->path, sizeof d->path, "%s", user_dir);
    return CLI_OK;
  }
  const char *tmp = getenv("TMPDIR");
  if (tmp == NULL || *tmp == '\0' || strlen(tmp) > sizeof d->path - 64) tmp = "/tmp";
  snprintf(d->path, sizeof d->path, "%s/kvtier-bench-XXXXXX", tmp);
  if (mkdtemp(d->path) == NULL) return cli_lib_error(cmd, "creating a scratch directory", -errno);
  d->made = 1;
  return CLI_OK;
}

void bench_dir_close(bench_dir *d, const char *cmd)
{
  if (!d->made) return;
  int rc = remove_tree(d->path);
  if (rc != 0) fprintf(stderr, "kvtier %s: removing %s: %s\n", cmd, d->path, kvt_strerror(rc));
}

/* L3 size from sysfs ("266240K"), else from the C library (cpuid), 0 when
 * unknown: said next to the working set, since a set that fits L3
 * measures the cache, not memory. */
uint64_t cpu_l3_bytes(void)
{
  for (int i = 0; i < 8; i++) {
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
    FILE *f = fopen(path, "r");
    if (!f) break;
    int level = 0, ok = fscanf(f, "%d", &level) == 1;
    fclose(f);
    if (!ok || level != 3) continue;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    f = fopen(path, "r");
    if (!f) break;
    unsigned long long v = 0;
    char unit = 0;
    ok = fscanf(f, "%llu%c", &v, &unit) >= 1;
    fclose(f);
    if (!ok) break;
    return unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : unit == 'G' ? v << 30 : v;
  }
  long v = sysconf(_SC_LEVEL3_CACHE_SIZE); /* a VM may have no cache entries in sysfs */
  return v > 0 ? (uint64_t)v : 0;
}
