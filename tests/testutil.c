/* testutil.c - helpers shared by the kvtier tests (see testutil.h).
 * Everything random comes from one splitmix64 stream whose seed is printed;
 * K/V contents are a pure hash of where they sit, so any test can recompute
 * what a block must hold without keeping a copy. */
#include "testutil.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- PRNG */

static uint64_t g_state;
static uint64_t g_seed;
static int g_seeded;

uint64_t tu_mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t tu_rand_r(uint64_t *state) {
  *state += 0x9e3779b97f4a7c15ull;
  return tu_mix(*state);
}

uint64_t tu_seed(void) {
  if (g_seeded) return g_seed;
  const char *env = getenv("KVT_SEED");
  if (env && *env) {
    g_seed = strtoull(env, NULL, 0);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    g_seed = tu_mix((uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
                    ((uint64_t)getpid() << 32));
  }
  g_state = g_seed;
  g_seeded = 1;
  fprintf(stderr, "seed: KVT_SEED=%llu\n", (unsigned long long)g_seed);
  return g_seed;
}

uint64_t tu_rand(void) {
  tu_seed();
  return tu_rand_r(&g_state);
}

uint32_t tu_below(uint32_t n) {
  assert_true(n > 0);
  return (uint32_t)(((tu_rand() >> 32) * n) >> 32);
}

int tu_stress(void) {
  const char *env = getenv("KVT_STRESS");
  return env && strcmp(env, "0") != 0 && *env;
}

/* ------------------------------------------------------ temporary dirs */

/* Directories not yet removed: a failing test longjmps past its cleanup,
 * so whatever is left is removed at exit. */
enum { MAX_DIRS = 64 };
static char *g_dirs[MAX_DIRS];
static pid_t g_dirs_pid;

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw);

static void rm_leftovers(void) {
  if (getpid() != g_dirs_pid) return; /* a forked child owns none */
  for (int i = 0; i < MAX_DIRS; i++) {
    if (!g_dirs[i]) continue;
    nftw(g_dirs[i], rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(g_dirs[i]);
    g_dirs[i] = NULL;
  }
}

static void track_dir(char *path, int add) {
  if (!g_dirs_pid) {
    g_dirs_pid = getpid();
    atexit(rm_leftovers);
  }
  for (int i = 0; i < MAX_DIRS; i++) {
    if (add ? g_dirs[i] == NULL : g_dirs[i] == path) {
      g_dirs[i] = add ? path : NULL;
      return;
    }
  }
}

char *tu_tmpdir(void) {
  const char *base = getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  size_t n = strlen(base) + sizeof "/kvt-test-XXXXXX";
  char *path = malloc(n);
  assert_non_null(path);
  snprintf(path, n, "%s/kvt-test-XXXXXX", base);
  assert_non_null(mkdtemp(path));
  track_dir(path, 1);
  return path;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path) == 0 ? 0 : -errno;
}

void tu_rmtree(char *dir) {
  if (!dir) return;
  track_dir(dir, 0);
  assert_int_equal(nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
  free(dir);
}

/* ------------------------------------------------------ half precision */

static uint32_t f32_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return x;
}

static float bits_f32(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

/* Round man >> shift to nearest even. */
static uint32_t shift_rne(uint32_t man, int shift) {
  uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
  return q + (rem > mid || (rem == mid && (q & 1)));
}

uint16_t tu_f32_to_f16(float f) {
  uint32_t x = f32_bits(f), sign = (x >> 16) & 0x8000;
  uint32_t exp = (x >> 23) & 0xff, man = x & 0x7fffff;
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
  int e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    return (uint16_t)(sign | shift_rne(man | 0x800000, 14 - e));
  }
  /* a carry out of the mantissa correctly bumps the exponent */
  return (uint16_t)(sign | (((uint32_t)e << 10) + shift_rne(man, 13)));
}

float tu_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000 | (man << 13));
  if (exp != 0) return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
  if (man == 0) return bits_f32(sign);
  uint32_t e = 113;
  while (!(man & 0x400)) {
    man <<= 1;
    e--;
  }
  return bits_f32(sign | (e << 23) | ((man & 0x3ff) << 13));
}

uint16_t tu_f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

float tu_bf16_to_f32(uint16_t h) {
  return bits_f32((uint32_t)h << 16);
}

/* ------------------------------------------------------------ K/V data */

void tu_kv_alloc(tu_kv *b, const kvt_shape *s) {
  size_t es = kvt_dtype_size(s->dtype);
  assert_true(es > 0);
  b->elems = (size_t)s->block_tokens * s->n_kv_heads * s->head_dim;
  b->bytes = b->elems * es;
  assert_int_equal(b->bytes, kvt_shape_block_bytes(s));
  b->k = malloc(b->bytes);
  b->v = malloc(b->bytes);
  assert_non_null(b->k);
  assert_non_null(b->v);
  b->kv = (kvt_kv){.k = b->k, .v = b->v, .dtype = s->dtype, .n_tokens = s->block_tokens,
                   .n_heads = s->n_kv_heads, .head_dim = s->head_dim};
}

void tu_kv_free(tu_kv *b) {
  free(b->k);
  free(b->v);
  memset(b, 0, sizeof *b);
}

static void store(void *buf, uint32_t dtype, size_t i, float f) {
  if (dtype == KVT_F32) {
    memcpy((char *)buf + 4 * i, &f, 4);
  } else {
    uint16_t h = dtype == KVT_F16 ? tu_f32_to_f16(f) : tu_f32_to_bf16(f);
    memcpy((char *)buf + 2 * i, &h, 2);
  }
}

/* A value in [-2, 2) from 24 hash bits: finite in every dtype. */
static float hval(uint64_t h) {
  return (float)(h >> 40) / (float)(1u << 22) - 2.0f;
}

void tu_kv_fill(tu_kv *b, const kvt_shape *s, uint64_t salt, uint32_t layer,
                uint32_t block, const uint32_t *tokens) {
  size_t per_tok = (size_t)s->n_kv_heads * s->head_dim;
  for (uint32_t t = 0; t < s->block_tokens; t++) {
    uint64_t pos = (uint64_t)block * s->block_tokens + t;
    uint64_t base = tu_mix(salt ^ tu_mix(((uint64_t)layer << 40) ^ pos) ^
                           tu_mix(0x5eedull + tokens[t]));
    for (size_t j = 0; j < per_tok; j++) {
      store(b->k, s->dtype, t * per_tok + j, hval(tu_mix(base + 2 * j)));
      store(b->v, s->dtype, t * per_tok + j, hval(tu_mix(base + 2 * j + 1)));
    }
  }
}

void tu_set_nonfinite(void *buf, uint32_t dtype, size_t i, int kind) {
  static const uint32_t f32[TU_N_NONFINITE] = {0x7fc00000u, 0x7f800000u, 0xff800000u,
                                               0xff800001u};
  static const uint16_t f16[TU_N_NONFINITE] = {0x7e00, 0x7c00, 0xfc00, 0xfc01};
  static const uint16_t bf16[TU_N_NONFINITE] = {0x7fc0, 0x7f80, 0xff80, 0xff81};
  assert_true(kind >= 0 && kind < TU_N_NONFINITE);
  if (dtype == KVT_F32) memcpy((char *)buf + 4 * i, &f32[kind], 4);
  else if (dtype == KVT_F16) memcpy((char *)buf + 2 * i, &f16[kind], 2);
  else memcpy((char *)buf + 2 * i, &bf16[kind], 2);
}

/* ------------------------------------------------------------ fixtures */

kvt_shape tu_shape_small(uint32_t dtype) {
  return (kvt_shape){.n_layers = 4, .n_kv_heads = 2, .head_dim = 16, .dtype = dtype,
                     .block_tokens = 4};
}

kvt_ns_desc tu_desc(const char *model_id, const kvt_shape *s) {
  return (kvt_ns_desc){.model_id = model_id, .weights_fingerprint = "sha256:test",
                       .rope_theta = 10000.0, .rope_dims = 0, .rope_scaling = NULL,
                       .tp_rank = 0, .tp_size = 1, .shape = *s};
}

void tu_opts(kvt_options *o) {
  kvt_options_init(o);
  o->tier_bytes_limit[KVT_TIER_HOT] = 64ull << 20;
}

kvt_engine *tu_open(const char *dir, const kvt_options *o) {
  kvt_engine *e = NULL;
  int rc = kvt_engine_open(dir, o, &e);
  if (rc) fprintf(stderr, "kvt_engine_open(%s): %s\n", dir, kvt_strerror(rc));
  assert_int_equal(rc, 0);
  assert_non_null(e);
  return e;
}

uint64_t tu_salt(const char *model_id) {
  uint64_t h = 0x1234567ull;
  for (const char *p = model_id; *p; p++) h = tu_mix(h ^ (unsigned char)*p);
  return h;
}

kvt_ns_id tu_register(kvt_engine *e, const char *model_id, const kvt_shape *s) {
  kvt_ns_desc d = tu_desc(model_id, s);
  kvt_ns_id ns = UINT32_MAX;
  assert_int_equal(kvt_ns_register(e, &d, &ns), 0);
  return ns;
}

void tu_stats(kvt_engine *e, kvt_stats *st) {
  memset(st, 0xa5, sizeof *st);
  assert_int_equal(kvt_stats_get(e, st), 0);
}

#define F(name) {#name, offsetof(kvt_stats, name)}
#define F4(name) F(name[0]), F(name[1]), F(name[2]), F(name[3])
static const struct {
  const char *name;
  size_t off;
} stat_fields[] = {
    F4(tier_blocks), F4(tier_bytes), F4(tier_limit), F(index_bytes), F(seq_bytes),
    F(other_bytes), F(total_bytes), F(logical_bytes), F(dedup_saved_bytes), F(token_blocks),
    F(namespaces), F(seqs), F(puts), F(dedup_hits), F(dedup_mismatches), F(lookups),
    F(lookup_blocks_hit), F(lookup_blocks_miss), F(reads), F(reads_exact), F4(evictions),
    F(put_full), F(demotions), F(reads_approx), F(attends), F(cold_records), F(cold_queued),
    F(cold_written), F(cold_reads), F(cold_read_bytes), F(cold_write_bytes),
    F(cold_checksum_failures), F(cold_write_failures), F(cold_segments), F(cold_segment_bytes),
    F(cold_reclaims),
    F(cold_relocated),
    F(promotions),
    F(recalls), F(recall_useful), F(recall_unavailable), F(recall_bytes), F(recall_ns),
    F(sketch_bytes),
    F(recall_late),
};

void tu_assert_stats_eq(const kvt_stats *a, const kvt_stats *b) {
  _Static_assert(sizeof stat_fields / sizeof stat_fields[0] * 8 +
                         sizeof a->io_backend + sizeof a->io_why == sizeof(kvt_stats),
                 "stat_fields must list every kvt_stats field");
  int bad = strcmp(a->io_backend, b->io_backend) != 0 || strcmp(a->io_why, b->io_why) != 0;
  for (size_t i = 0; i < sizeof stat_fields / sizeof stat_fields[0]; i++) {
    uint64_t x, y;
    memcpy(&x, (const char *)a + stat_fields[i].off, 8);
    memcpy(&y, (const char *)b + stat_fields[i].off, 8);
    if (x != y) {
      fprintf(stderr, "stats differ: %s %llu != %llu\n", stat_fields[i].name,
              (unsigned long long)x, (unsigned long long)y);
      bad = 1;
    }
  }
  assert_false(bad);
}

uint32_t tu_append_put(kvt_seq *s, const kvt_shape *sh, uint64_t salt, const uint32_t *tokens,
                       tu_kv *scratch) {
  kvt_append_info info;
  memset(&info, 0xff, sizeof info);
  assert_int_equal(kvt_seq_append(s, tokens, sh->block_tokens, &info), 0);
  assert_int_equal(info.block + 1, kvt_seq_blocks(s));
  assert_true(info.layers_present <= sh->n_layers);
  if (info.layers_present == sh->n_layers) return info.layers_present;
  for (uint32_t l = 0; l < sh->n_layers; l++) {
    tu_kv_fill(scratch, sh, salt, l, info.block, tokens);
    assert_int_equal(kvt_seq_put(s, info.block, l, &scratch->kv), 0);
  }
  return info.layers_present;
}

void tu_assert_block(kvt_seq *s, const kvt_shape *sh, uint64_t salt, uint32_t block,
                     uint32_t layer, const uint32_t *tokens) {
  tu_kv want, got;
  tu_kv_alloc(&want, sh);
  tu_kv_alloc(&got, sh);
  tu_kv_fill(&want, sh, salt, layer, block, tokens);
  memset(got.k, 0x5a, got.bytes);
  memset(got.v, 0x5a, got.bytes);
  assert_int_equal(kvt_seq_read(s, block, layer, got.k, got.v, got.bytes), 0);
  assert_memory_equal(got.k, want.k, want.bytes);
  assert_memory_equal(got.v, want.v, want.bytes);
  tu_kv_free(&want);
  tu_kv_free(&got);
}

static void check_gathered(const kvt_shape *sh, uint64_t salt, const uint32_t *toks,
                           uint32_t layer, const uint8_t *k, const uint8_t *v,
                           const kvt_gathered *g, uint32_t n_blocks) {
  tu_kv want;
  tu_kv_alloc(&want, sh);
  for (uint32_t i = 0; i < n_blocks; i++) {
    assert_int_equal(g[i].block, i);
    assert_int_equal(g[i].token_pos, i * sh->block_tokens);
    assert_int_equal(g[i].tier, KVT_TIER_HOT);
    assert_int_equal(g[i].exact, 1);
    tu_kv_fill(&want, sh, salt, layer, i, toks + (size_t)i * sh->block_tokens);
    assert_memory_equal(k + i * want.bytes, want.k, want.bytes);
    assert_memory_equal(v + i * want.bytes, want.v, want.bytes);
  }
  tu_kv_free(&want);
}

void tu_assert_gather(kvt_seq *s, const kvt_shape *sh, uint64_t salt, const uint32_t *toks,
                      uint32_t n_blocks) {
  size_t bb = kvt_shape_block_bytes(sh), total = bb * n_blocks;
  uint8_t *k = malloc(total + 1), *v = malloc(total + 1);
  kvt_gathered *g = calloc(n_blocks + 1, sizeof *g);
  assert_true(k && v && g);
  for (uint32_t l = 0; l < sh->n_layers; l++) {
    size_t bytes = 0, nb = 0;
    assert_int_equal(kvt_seq_gather(s, l, NULL, NULL, &bytes, NULL, 0, &nb), 0);
    assert_int_equal(nb, n_blocks);
    assert_int_equal(bytes, total);
    bytes = total + 1;
    nb = 0;
    assert_int_equal(kvt_seq_gather(s, l, k, v, &bytes, g, n_blocks + 1, &nb), 0);
    assert_int_equal(nb, n_blocks);
    assert_int_equal(bytes, total);
    check_gathered(sh, salt, toks, l, k, v, g, n_blocks);
  }
  free(k);
  free(v);
  free(g);
}

static int tu_skipped;

void tu_skip_mark(void) { tu_skipped = 1; }

int tu_exit(int rc) { return rc ? rc : tu_skipped ? 77 : 0; }
