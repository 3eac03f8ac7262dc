/* test_api.c - the contract of every public call at its edges: open and
 * options, namespace registration, refusal of each bad input with its own
 * code and no state change, error strings, read-only and metadata-only
 * engines, and a failing allocator walked over every allocation. */
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Call must fail with code and leave every counter and gauge as it was. */
#define REFUSE(e, code, call)                          \
  do {                                                 \
    kvt_stats before_, after_;                         \
    tu_stats((e), &before_);                           \
    int rc_ = (call);                                  \
    if (rc_ != (code))                                 \
      fprintf(stderr, "%s:%d: %s -> %d (%s), want %d\n", __FILE__, __LINE__, #call, rc_, \
              kvt_strerror(rc_), (code));              \
    assert_int_equal(rc_, (code));                     \
    tu_stats((e), &after_);                            \
    tu_assert_stats_eq(&before_, &after_);             \
  } while (0)

static const uint32_t dtypes[] = {KVT_F32, KVT_F16, KVT_BF16};

/* Not an engine: what *out holds before a call that must set it to NULL. */
static char not_engine;
#define POISON ((kvt_engine *)(void *)&not_engine)

/* ------------------------------------------------------- open / options */

static void test_open_close(void **state) {
  (void)state;
  char *dir = tu_tmpdir(), sub[4096];
  kvt_engine *e = POISON;
  struct stat sb;
  kvt_stats st;
  snprintf(sub, sizeof sub, "%s/store", dir);
  assert_int_equal(kvt_engine_open(sub, NULL, &e), 0);
  assert_int_equal(stat(sub, &sb), 0);
  assert_true(S_ISDIR(sb.st_mode));
  tu_stats(e, &st);
  assert_int_equal(st.namespaces, 0);
  assert_int_equal(st.seqs, 0);
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT], 0);
  assert_int_equal(st.tier_limit[KVT_TIER_HOT], 1ull << 30);
  assert_true(st.total_bytes >= st.tier_bytes[KVT_TIER_HOT] + st.index_bytes +
                                     st.seq_bytes + st.other_bytes);
  assert_true(st.total_bytes > 0);
  assert_int_equal(kvt_sync(e), 0);
  kvt_engine_close(e);
  e = tu_open(sub, NULL); /* the lock went with the close */
  kvt_engine_close(e);
  kvt_engine_close(NULL);
  tu_rmtree(dir);
}

static void test_open_refusals(void **state) {
  (void)state;
  char *dir = tu_tmpdir(), path[4096];
  kvt_engine *e = POISON;
  kvt_options o;
  FILE *f;
  kvt_options_init(&o);
  snprintf(path, sizeof path, "%s/missing", dir);
  o.flags = KVT_OPEN_NOCREATE;
  assert_int_equal(kvt_engine_open(path, &o, &e), -ENOENT);
  assert_null(e);
  e = POISON;
  o.flags = KVT_OPEN_RDONLY;
  assert_int_equal(kvt_engine_open(path, &o, &e), -ENOENT);
  assert_null(e);
  assert_int_equal(access(path, F_OK), -1); /* nothing created */
  snprintf(path, sizeof path, "%s/file", dir);
  assert_non_null(f = fopen(path, "w"));
  fclose(f);
  e = POISON;
  assert_true(kvt_engine_open(path, NULL, &e) < 0);
  assert_null(e);
  assert_int_equal(kvt_engine_open(NULL, NULL, &e), KVT_ENULL);
  assert_int_equal(kvt_engine_open(dir, NULL, NULL), KVT_ENULL);
  tu_rmtree(dir);
}

static void test_options_defaults(void **state) {
  (void)state;
  kvt_options o;
  memset(&o, 0xff, sizeof o);
  kvt_options_init(&o);
  assert_int_equal(o.tier_bytes_limit[KVT_TIER_HOT], 1ull << 30);
  assert_int_equal(o.tier_bytes_limit[KVT_TIER_WARM], 0);
  assert_int_equal(o.tier_bytes_limit[KVT_TIER_COLD], 0);
  assert_int_equal(o.max_seqs, 4096);
  assert_int_equal(o.max_namespaces, 256);
  assert_int_equal(o.max_seq_blocks, 1u << 20);
  assert_int_equal(o.max_load_reqs, 65536);
  assert_int_equal(o.flags, 0);
  assert_int_equal(o.test_fail_alloc_after, 0);
}

/* Each inconsistent option is refused, and leaves no lock behind. */
static void test_options_invalid(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  for (int i = 0; i < 7; i++) {
    kvt_options o;
    kvt_engine *e = POISON;
    kvt_options_init(&o);
    switch (i) {
    case 0: o.max_seqs = 0; break;
    case 1: o.max_namespaces = 0; break;
    case 2: o.max_seq_blocks = 0; break;
    case 3: o.max_load_reqs = 0; break;
    case 4: o.flags = 0x80000000u; break;
    case 5: o.tier_load_gbps[KVT_TIER_HOT] = -1.0; break;
    case 6: o.tier_load_latency_us[KVT_TIER_HOT] = NAN; break;
    }
    int rc = kvt_engine_open(dir, &o, &e);
    if (rc != KVT_EOPTION) fprintf(stderr, "option case %d: %s\n", i, kvt_strerror(rc));
    assert_int_equal(rc, KVT_EOPTION);
    assert_null(e);
  }
  kvt_engine_close(tu_open(dir, NULL));
  tu_rmtree(dir);
}

/* ------------------------------------------------------------ namespaces */

typedef struct fx {
  char *dir;
  kvt_engine *e;
} fx;

static fx fx_open(const kvt_options *o) {
  fx f = {.dir = tu_tmpdir()};
  f.e = tu_open(f.dir, o);
  return f;
}

static void fx_close(fx *f) {
  kvt_engine_close(f->e);
  tu_rmtree(f->dir);
}

static void test_ns_register(void **state) {
  (void)state;
  fx f = fx_open(NULL);
  kvt_shape sh = tu_shape_small(KVT_F16), got;
  kvt_ns_desc d = tu_desc("api-model", &sh);
  kvt_ns_id a, b, c;
  kvt_stats st;
  d.rope_dims = sh.head_dim; /* explicit: a head_dim change keeps the RoPE identity */
  assert_int_equal(kvt_ns_register(f.e, &d, &a), 0);
  assert_int_equal(kvt_ns_register(f.e, &d, &b), 0);
  assert_int_equal(a, b);
  tu_stats(f.e, &st);
  assert_int_equal(st.namespaces, 1);
  assert_int_equal(kvt_ns_shape(f.e, a, &got), 0);
  assert_memory_equal(&got, &sh, sizeof sh);
  for (int field = 0; field < 5; field++) {
    kvt_ns_desc x = d;
    switch (field) {
    case 0: x.shape.n_layers *= 2; break;
    case 1: x.shape.n_kv_heads *= 2; break;
    case 2: x.shape.head_dim *= 2; break;
    case 3: x.shape.dtype = KVT_BF16; break;
    case 4: x.shape.block_tokens *= 2; break;
    }
    REFUSE(f.e, KVT_ENSCONFLICT, kvt_ns_register(f.e, &x, &c));
  }
  d.tp_size = 2;
  assert_int_equal(kvt_ns_register(f.e, &d, &c), 0);
  assert_int_not_equal(c, a);
  d.shape.n_layers = 7; /* another identity may have any shape */
  d.tp_rank = 1;
  assert_int_equal(kvt_ns_register(f.e, &d, &c), 0);
  tu_stats(f.e, &st);
  assert_int_equal(st.namespaces, 3);
  REFUSE(f.e, KVT_ENOTFOUND, kvt_ns_shape(f.e, a + 1000, &got));
  REFUSE(f.e, KVT_ENULL, kvt_ns_shape(f.e, a, NULL));
  REFUSE(f.e, KVT_ENULL, kvt_ns_shape(NULL, a, &got));
  fx_close(&f);
}

static char *long_str(size_t n) {
  char *s = malloc(n + 1);
  assert_non_null(s);
  memset(s, 'm', n);
  s[n] = 0;
  return s;
}

static void test_ns_bad_desc(void **state) {
  (void)state;
  fx f = fx_open(NULL);
  kvt_shape sh = tu_shape_small(KVT_F32);
  kvt_ns_desc good = tu_desc("api-model", &sh), d;
  kvt_ns_id id;
  char *s255 = long_str(255), *s256 = long_str(256);
  REFUSE(f.e, KVT_ENULL, kvt_ns_register(NULL, &good, &id));
  REFUSE(f.e, KVT_ENULL, kvt_ns_register(f.e, NULL, &id));
  REFUSE(f.e, KVT_ENULL, kvt_ns_register(f.e, &good, NULL));
  d = good, d.model_id = NULL;
  REFUSE(f.e, KVT_ENULL, kvt_ns_register(f.e, &d, &id));
  d = good, d.weights_fingerprint = NULL;
  REFUSE(f.e, KVT_ENULL, kvt_ns_register(f.e, &d, &id));
  d = good, d.model_id = "";
  REFUSE(f.e, KVT_EOPTION, kvt_ns_register(f.e, &d, &id));
  d = good, d.weights_fingerprint = "";
  REFUSE(f.e, KVT_EOPTION, kvt_ns_register(f.e, &d, &id));
  d = good, d.model_id = s256;
  REFUSE(f.e, KVT_EOPTION, kvt_ns_register(f.e, &d, &id));
  d = good, d.weights_fingerprint = s256;
  REFUSE(f.e, KVT_EOPTION, kvt_ns_register(f.e, &d, &id));
  d = good, d.rope_scaling = s256;
  REFUSE(f.e, KVT_EOPTION, kvt_ns_register(f.e, &d, &id));
  d = good, d.tp_rank = 1, d.tp_size = 1;
  REFUSE(f.e, KVT_EOPTION, kvt_ns_register(f.e, &d, &id));
  d = good, d.tp_rank = 0, d.tp_size = 0;
  REFUSE(f.e, KVT_EOPTION, kvt_ns_register(f.e, &d, &id));
  d = good, d.model_id = s255, d.weights_fingerprint = s255, d.rope_scaling = s255;
  assert_int_equal(kvt_ns_register(f.e, &d, &id), 0);
  free(s255);
  free(s256);
  fx_close(&f);
}

/* Shapes outside the documented ranges, one field at a time. */
static void test_ns_bad_shape(void **state) {
  (void)state;
  fx f = fx_open(NULL);
  static const struct {
    kvt_shape s;
    int code;
  } bad[] = {
      {{0, 2, 16, KVT_F32, 4}, KVT_ESHAPE},
      {{KVT_MAX_LAYERS + 1, 2, 16, KVT_F32, 4}, KVT_ESHAPE},
      {{4, 0, 16, KVT_F32, 4}, KVT_ESHAPE},
      {{4, KVT_MAX_HEADS + 1, 16, KVT_F32, 4}, KVT_ESHAPE},
      {{4, 2, 0, KVT_F32, 4}, KVT_ESHAPE},
      {{4, 2, KVT_MAX_HEAD_DIM + 1, KVT_F32, 4}, KVT_ESHAPE},
      {{4, 2, 16, KVT_F32, 0}, KVT_ESHAPE},
      {{4, 2, 16, KVT_F32, 3}, KVT_ESHAPE},
      {{4, 2, 16, KVT_F32, 12}, KVT_ESHAPE},
      {{4, 2, 16, KVT_F32, KVT_MAX_BLOCK_TOKENS * 2}, KVT_ESHAPE},
      {{4, 1024, 1024, KVT_F32, 4096}, KVT_ESHAPE}, /* > KVT_MAX_BLOCK_BYTES */
      {{4, 2, 16, 0, 4}, KVT_EDTYPE},
      {{4, 2, 16, 4, 4}, KVT_EDTYPE},
      {{4, 2, 16, 0xffffffffu, 4}, KVT_EDTYPE},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kvt_ns_desc d = tu_desc("api-model", &bad[i].s);
    kvt_ns_id id;
    REFUSE(f.e, bad[i].code, kvt_ns_register(f.e, &d, &id));
  }
  kvt_shape edge = {KVT_MAX_LAYERS, 1, 1, KVT_F32, KVT_MAX_BLOCK_TOKENS};
  tu_register(f.e, "api-edge", &edge);
  fx_close(&f);
}

static void test_ns_limit(void **state) {
  (void)state;
  kvt_options o;
  tu_opts(&o);
  o.max_namespaces = 2;
  fx f = fx_open(&o);
  kvt_shape sh = tu_shape_small(KVT_F32);
  kvt_ns_desc d = tu_desc("api-third", &sh);
  kvt_ns_id a = tu_register(f.e, "api-first", &sh), id;
  tu_register(f.e, "api-second", &sh);
  REFUSE(f.e, KVT_ELIMIT, kvt_ns_register(f.e, &d, &id));
  assert_int_equal(tu_register(f.e, "api-first", &sh), a); /* finding is not adding */
  assert_int_equal(kvt_ns_drop(f.e, a), 0);
  assert_int_equal(kvt_ns_register(f.e, &d, &id), 0); /* a drop frees a slot */
  /* The dropped id must not name the namespace that took its place. */
  uint32_t tok[4] = {1, 2, 3, 4};
  kvt_shape got;
  kvt_key key;
  kvt_seq *s = NULL;
  size_t n;
  assert_int_not_equal(id, a);
  REFUSE(f.e, KVT_ENOTFOUND, kvt_ns_shape(f.e, a, &got));
  REFUSE(f.e, KVT_ENOTFOUND, kvt_ns_seed(f.e, a, &key));
  REFUSE(f.e, KVT_ENOTFOUND, kvt_seq_create(f.e, a, &s));
  REFUSE(f.e, KVT_ENOTFOUND, kvt_lookup(f.e, a, tok, 4, NULL, 0, &n));
  REFUSE(f.e, KVT_ENOTFOUND, kvt_keys(f.e, a, tok, 4, &key, 1, &n));
  REFUSE(f.e, KVT_ENOTFOUND, kvt_ns_drop(f.e, a));
  assert_int_equal(kvt_ns_shape(f.e, id, &got), 0);
  fx_close(&f);
}

/* ------------------------------------------------- refusal of bad input */

/* An engine with a namespace of dtype, a sequence of 2 blocks: block 0 put
 * in every layer, block 1 in layers 0 and 1; layer 2 of block 1 is the
 * target of the refused puts. */
typedef struct pfx {
  fx f;
  kvt_shape sh;
  kvt_ns_id ns;
  uint64_t salt;
  kvt_seq *s;
  uint32_t tok[8];
  tu_kv kv;
} pfx;

static void pfx_open(pfx *p, uint32_t dtype) {
  static const char *names[] = {"", "api-f32", "api-f16", "api-bf16"};
  p->f = fx_open(NULL);
  p->sh = tu_shape_small(dtype);
  p->ns = tu_register(p->f.e, names[dtype], &p->sh);
  p->salt = tu_salt(names[dtype]);
  for (int i = 0; i < 8; i++) p->tok[i] = (uint32_t)tu_rand();
  tu_kv_alloc(&p->kv, &p->sh);
  assert_int_equal(kvt_seq_create(p->f.e, p->ns, &p->s), 0);
  tu_append_put(p->s, &p->sh, p->salt, p->tok, &p->kv);
  assert_int_equal(kvt_seq_append(p->s, p->tok + 4, 4, NULL), 0);
  for (uint32_t l = 0; l < 2; l++) {
    tu_kv_fill(&p->kv, &p->sh, p->salt, l, 1, p->tok + 4);
    assert_int_equal(kvt_seq_put(p->s, 1, l, &p->kv.kv), 0);
  }
  tu_kv_fill(&p->kv, &p->sh, p->salt, 2, 1, p->tok + 4);
}

/* What the refusals must not have changed. */
static void pfx_check_close(pfx *p) {
  assert_int_equal(kvt_seq_blocks(p->s), 2);
  for (uint32_t l = 0; l < 4; l++) tu_assert_block(p->s, &p->sh, p->salt, 0, l, p->tok);
  for (uint32_t l = 0; l < 2; l++) tu_assert_block(p->s, &p->sh, p->salt, 1, l, p->tok + 4);
  void *k = malloc(p->kv.bytes), *v = malloc(p->kv.bytes);
  for (uint32_t l = 2; l < 4; l++)
    assert_int_equal(kvt_seq_read(p->s, 1, l, k, v, p->kv.bytes), KVT_ENOTFOUND);
  free(k);
  free(v);
  kvt_seq_release(p->s);
  tu_kv_free(&p->kv);
  fx_close(&p->f);
}

static void refuse_nonfinite(pfx *p, uint32_t block, uint32_t layer) {
  size_t es = kvt_dtype_size(p->sh.dtype);
  for (int side = 0; side < 2; side++) {
    uint8_t *buf = side ? p->kv.v : p->kv.k, saved[4];
    size_t where[3] = {0, p->kv.elems - 1, tu_below((uint32_t)p->kv.elems)};
    for (int w = 0; w < 3; w++) {
      for (int kind = 0; kind < TU_N_NONFINITE; kind++) {
        memcpy(saved, buf + where[w] * es, es);
        tu_set_nonfinite(buf, p->sh.dtype, where[w], kind);
        REFUSE(p->f.e, KVT_ENONFINITE, kvt_seq_put(p->s, block, layer, &p->kv.kv));
        memcpy(buf + where[w] * es, saved, es);
      }
    }
  }
}

static void refuse_bad_kv(pfx *p, uint32_t block, uint32_t layer) {
  kvt_engine *e = p->f.e;
  kvt_kv good = p->kv.kv, kv;
  for (size_t i = 0; i < 3; i++) {
    if (dtypes[i] == p->sh.dtype) continue;
    kv = good, kv.dtype = dtypes[i];
    REFUSE(e, KVT_EDTYPE, kvt_seq_put(p->s, block, layer, &kv));
  }
  kv = good, kv.dtype = 0;
  REFUSE(e, KVT_EDTYPE, kvt_seq_put(p->s, block, layer, &kv));
  kv = good, kv.dtype = 77;
  REFUSE(e, KVT_EDTYPE, kvt_seq_put(p->s, block, layer, &kv));
  for (int i = 0; i < 3; i++) { /* zero, one less, one more */
    uint32_t t[3] = {0, good.n_tokens - 1, good.n_tokens + 1};
    uint32_t h[3] = {0, good.n_heads - 1, good.n_heads + 1};
    uint32_t d[3] = {0, good.head_dim - 1, good.head_dim + 1};
    kv = good, kv.n_tokens = t[i];
    REFUSE(e, KVT_ESHAPE, kvt_seq_put(p->s, block, layer, &kv));
    kv = good, kv.n_heads = h[i];
    REFUSE(e, KVT_ESHAPE, kvt_seq_put(p->s, block, layer, &kv));
    kv = good, kv.head_dim = d[i];
    REFUSE(e, KVT_ESHAPE, kvt_seq_put(p->s, block, layer, &kv));
  }
  kv = good, kv.n_tokens = good.n_tokens / 2; /* fewer tokens, more dims: same bytes */
  kv.head_dim = good.head_dim * 2;
  REFUSE(e, KVT_ESHAPE, kvt_seq_put(p->s, block, layer, &kv));
  kv = good, kv.k = NULL;
  REFUSE(e, KVT_ENULL, kvt_seq_put(p->s, block, layer, &kv));
  kv = good, kv.v = NULL;
  REFUSE(e, KVT_ENULL, kvt_seq_put(p->s, block, layer, &kv));
  REFUSE(e, KVT_ENULL, kvt_seq_put(p->s, block, layer, NULL));
  REFUSE(e, KVT_ENULL, kvt_seq_put(NULL, block, layer, &good));
  refuse_nonfinite(p, block, layer);
}

static void test_put_refusals(void **state) {
  (void)state;
  for (size_t i = 0; i < 3; i++) {
    pfx p;
    pfx_open(&p, dtypes[i]);
    refuse_bad_kv(&p, 1, 2);
    REFUSE(p.f.e, KVT_ENOTFOUND, kvt_seq_put(p.s, 2, 0, &p.kv.kv));
    REFUSE(p.f.e, KVT_ENOTFOUND, kvt_seq_put(p.s, UINT32_MAX, 0, &p.kv.kv));
    REFUSE(p.f.e, KVT_ENOTFOUND, kvt_seq_put(p.s, 1, 4, &p.kv.kv));
    REFUSE(p.f.e, KVT_ENOTFOUND, kvt_seq_put(p.s, 1, UINT32_MAX, &p.kv.kv));
    pfx_check_close(&p);
  }
}

/* A bad put is refused even where the layer block is stored already: the
 * dedup path must not skip validation. */
static void test_put_refusals_on_stored_block(void **state) {
  (void)state;
  for (size_t i = 0; i < 3; i++) {
    pfx p;
    pfx_open(&p, dtypes[i]);
    tu_kv_fill(&p.kv, &p.sh, p.salt, 0, 0, p.tok);
    refuse_bad_kv(&p, 0, 0);
    pfx_check_close(&p);
  }
}

static void test_put_before_append(void **state) {
  (void)state;
  pfx p;
  kvt_seq *s;
  kvt_stats a, b;
  pfx_open(&p, KVT_F32);
  assert_int_equal(kvt_seq_create(p.f.e, p.ns, &s), 0);
  tu_stats(p.f.e, &a);
  int rc = kvt_seq_put(s, 0, 0, &p.kv.kv);
  /* The header lists ENOTFOUND for kvt_seq_put and ESTATE's own example is
   * "put before append"; either names the fault. */
  assert_true(rc == KVT_ESTATE || rc == KVT_ENOTFOUND);
  tu_stats(p.f.e, &b);
  tu_assert_stats_eq(&a, &b);
  assert_int_equal(kvt_seq_blocks(s), 0);
  kvt_seq_release(s);
  pfx_check_close(&p);
}

static void test_append_refusals(void **state) {
  (void)state;
  kvt_options o;
  tu_opts(&o);
  o.max_seq_blocks = 3;
  fx f = fx_open(&o);
  kvt_shape sh = tu_shape_small(KVT_F16);
  kvt_ns_id ns = tu_register(f.e, "api-append", &sh);
  kvt_seq *s;
  uint32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  kvt_append_info info;
  assert_int_equal(kvt_seq_create(f.e, ns, &s), 0);
  assert_int_equal(kvt_seq_append(s, tok, 4, NULL), 0);
  REFUSE(f.e, KVT_ECOUNT, kvt_seq_append(s, tok, 0, &info));
  REFUSE(f.e, KVT_ECOUNT, kvt_seq_append(s, tok, 3, &info));
  REFUSE(f.e, KVT_ECOUNT, kvt_seq_append(s, tok, 5, &info));
  REFUSE(f.e, KVT_ECOUNT, kvt_seq_append(s, tok, 8, &info));
  REFUSE(f.e, KVT_ENULL, kvt_seq_append(s, NULL, 4, &info));
  REFUSE(f.e, KVT_ENULL, kvt_seq_append(NULL, tok, 4, &info));
  assert_int_equal(kvt_seq_blocks(s), 1);
  assert_int_equal(kvt_seq_append(s, tok + 4, 4, &info), 0);
  assert_int_equal(info.block, 1);
  assert_int_equal(kvt_seq_append(s, tok, 4, &info), 0);
  REFUSE(f.e, KVT_ELIMIT, kvt_seq_append(s, tok, 4, &info));
  assert_int_equal(kvt_seq_blocks(s), 3);
  kvt_seq_release(s);
  fx_close(&f);
}

static void test_read_refusals(void **state) {
  (void)state;
  pfx p;
  pfx_open(&p, KVT_BF16);
  size_t n = p.kv.bytes;
  uint8_t *k = malloc(n + 8), *v = malloc(n + 8);
  memset(k, 0x3c, n + 8);
  memset(v, 0x3c, n + 8);
  REFUSE(p.f.e, KVT_EBUFSIZE, kvt_seq_read(p.s, 0, 0, k, v, n - 1));
  REFUSE(p.f.e, KVT_EBUFSIZE, kvt_seq_read(p.s, 0, 0, k, v, n + 8));
  REFUSE(p.f.e, KVT_EBUFSIZE, kvt_seq_read(p.s, 0, 0, k, v, 0));
  REFUSE(p.f.e, KVT_ENULL, kvt_seq_read(p.s, 0, 0, NULL, v, n));
  REFUSE(p.f.e, KVT_ENULL, kvt_seq_read(p.s, 0, 0, k, NULL, n));
  REFUSE(p.f.e, KVT_ENULL, kvt_seq_read(NULL, 0, 0, k, v, n));
  REFUSE(p.f.e, KVT_ENOTFOUND, kvt_seq_read(p.s, 2, 0, k, v, n));
  REFUSE(p.f.e, KVT_ENOTFOUND, kvt_seq_read(p.s, 1, 3, k, v, n));
  REFUSE(p.f.e, KVT_ENOTFOUND, kvt_seq_read(p.s, 0, 4, k, v, n));
  for (size_t i = 0; i < n + 8; i++) {
    assert_int_equal(k[i], 0x3c);
    assert_int_equal(v[i], 0x3c);
  }
  free(k);
  free(v);
  pfx_check_close(&p);
}

/* Gather refuses small buffers and writes nothing; block 1 has layers 0-1
 * only, so layer 0 gathers two blocks and layer 3 one. */
static void test_gather_refusals(void **state) {
  (void)state;
  pfx p;
  pfx_open(&p, KVT_F16);
  size_t bb = p.kv.bytes, bytes, nb;
  uint8_t *k = malloc(2 * bb), *v = malloc(2 * bb);
  kvt_gathered g[2];
  assert_int_equal(kvt_seq_gather(p.s, 0, NULL, NULL, &bytes, NULL, 0, &nb), 0);
  assert_int_equal(nb, 2);
  assert_int_equal(bytes, 2 * bb);
  assert_int_equal(kvt_seq_gather(p.s, 3, NULL, NULL, &bytes, NULL, 0, &nb), 0);
  assert_int_equal(nb, 1);
  assert_int_equal(bytes, bb);
  memset(k, 0x3c, 2 * bb);
  memset(v, 0x3c, 2 * bb);
  bytes = 2 * bb - 1;
  REFUSE(p.f.e, KVT_EBUFSIZE, kvt_seq_gather(p.s, 0, k, v, &bytes, g, 2, &nb));
  bytes = 2 * bb;
  REFUSE(p.f.e, KVT_EBUFSIZE, kvt_seq_gather(p.s, 0, k, v, &bytes, g, 1, &nb));
  for (size_t i = 0; i < 2 * bb; i++) assert_true(k[i] == 0x3c && v[i] == 0x3c);
  REFUSE(p.f.e, KVT_ENOTFOUND, kvt_seq_gather(p.s, 4, k, v, &bytes, g, 2, &nb));
  REFUSE(p.f.e, KVT_ENULL, kvt_seq_gather(p.s, 0, k, v, NULL, g, 2, &nb));
  REFUSE(p.f.e, KVT_ENULL, kvt_seq_gather(p.s, 0, k, v, &bytes, g, 2, NULL));
  REFUSE(p.f.e, KVT_ENULL, kvt_seq_gather(NULL, 0, k, v, &bytes, g, 2, &nb));
  REFUSE(p.f.e, KVT_ENULL, kvt_seq_gather(p.s, 0, k, NULL, &bytes, g, 2, &nb));
  free(k);
  free(v);
  pfx_check_close(&p);
}

static void test_lookup_load_drop_refusals(void **state) {
  (void)state;
  pfx p;
  pfx_open(&p, KVT_F32);
  kvt_engine *e = p.f.e;
  kvt_lookup_entry out[2];
  kvt_load_req req = {.layer = 0, .k_out = p.kv.k, .v_out = p.kv.v, .bytes_each = p.kv.bytes};
  kvt_load *ld = NULL;
  size_t n;
  uint64_t dropped;
  REFUSE(e, KVT_ENULL, kvt_lookup(e, p.ns, NULL, 8, out, 2, &n));
  REFUSE(e, KVT_ENULL, kvt_lookup(e, p.ns, p.tok, 8, out, 2, NULL));
  REFUSE(e, KVT_ENULL, kvt_lookup(e, p.ns, p.tok, 8, NULL, 2, &n));
  REFUSE(e, KVT_ENULL, kvt_lookup(NULL, p.ns, p.tok, 8, out, 2, &n));
  REFUSE(e, KVT_ENOTFOUND, kvt_lookup(e, p.ns + 1000, p.tok, 8, out, 2, &n));
  REFUSE(e, KVT_ECOUNT, kvt_load_submit(e, p.ns, &req, 0, &ld));
  REFUSE(e, KVT_ENULL, kvt_load_submit(e, p.ns, NULL, 1, &ld));
  REFUSE(e, KVT_ENULL, kvt_load_submit(e, p.ns, &req, 1, NULL));
  REFUSE(e, KVT_ENOTFOUND, kvt_load_submit(e, p.ns + 1000, &req, 1, &ld));
  REFUSE(e, KVT_ECOUNT, kvt_drop_prefix(e, p.ns, p.tok, 3, &dropped));
  REFUSE(e, KVT_ENULL, kvt_drop_prefix(e, p.ns, NULL, 8, &dropped));
  REFUSE(e, KVT_ENOTFOUND, kvt_drop_prefix(e, p.ns + 1000, p.tok, 8, &dropped));
  REFUSE(e, KVT_ENOTFOUND, kvt_ns_drop(e, p.ns + 1000));
  REFUSE(e, KVT_EBUSY, kvt_ns_drop(e, p.ns));
  REFUSE(e, KVT_ENULL, kvt_stats_get(e, NULL));
  assert_int_equal(kvt_stats_get(NULL, &(kvt_stats){0}), KVT_ENULL);
  assert_int_equal(kvt_sync(NULL), KVT_ENULL);
  pfx_check_close(&p);
}

static void test_load_limit(void **state) {
  (void)state;
  kvt_options o;
  tu_opts(&o);
  o.max_load_reqs = 2;
  fx f = fx_open(&o);
  kvt_shape sh = tu_shape_small(KVT_F32);
  kvt_ns_id ns = tu_register(f.e, "api-load", &sh);
  kvt_load_req req[3];
  kvt_load *ld = NULL;
  memset(req, 0, sizeof req);
  REFUSE(f.e, KVT_ECOUNT, kvt_load_submit(f.e, ns, req, 3, &ld));
  fx_close(&f);
}

static void test_seq_refusals(void **state) {
  (void)state;
  kvt_options o;
  tu_opts(&o);
  o.max_seqs = 2;
  fx f = fx_open(&o);
  kvt_shape sh = tu_shape_small(KVT_F32);
  kvt_ns_id ns = tu_register(f.e, "api-seq", &sh);
  uint32_t tok[4] = {9, 8, 7, 6};
  kvt_seq *a, *b, *c = NULL;
  REFUSE(f.e, KVT_ENULL, kvt_seq_create(f.e, ns, NULL));
  REFUSE(f.e, KVT_ENULL, kvt_seq_create(NULL, ns, &a));
  REFUSE(f.e, KVT_ENOTFOUND, kvt_seq_create(f.e, ns + 1000, &a));
  assert_int_equal(kvt_seq_create(f.e, ns, &a), 0);
  assert_int_equal(kvt_seq_append(a, tok, 4, NULL), 0);
  REFUSE(f.e, KVT_ECOUNT, kvt_seq_fork(a, 2, &b));
  REFUSE(f.e, KVT_ENULL, kvt_seq_fork(NULL, 1, &b));
  REFUSE(f.e, KVT_ENULL, kvt_seq_fork(a, 1, NULL));
  assert_int_equal(kvt_seq_fork(a, 1, &b), 0);
  REFUSE(f.e, KVT_ELIMIT, kvt_seq_create(f.e, ns, &c));
  REFUSE(f.e, KVT_ELIMIT, kvt_seq_fork(a, UINT32_MAX, &c));
  kvt_seq_release(b);
  assert_int_equal(kvt_seq_fork(a, 0, &c), 0); /* a slot came back */
  assert_int_equal(kvt_seq_blocks(c), 0);
  kvt_seq_release(c);
  kvt_seq_release(a);
  kvt_seq_release(NULL);
  fx_close(&f);
}

/* -------------------------------------------------------- small helpers */

static void test_strerror(void **state) {
  (void)state;
  enum { N = KVT_E_FIRST - KVT_E_LAST + 1 };
  const char *s[N + 3];
  int codes[N + 3];
  for (int i = 0; i < N; i++) codes[i] = KVT_E_FIRST - i;
  codes[N] = -ENOMEM;
  codes[N + 1] = -EIO;
  codes[N + 2] = 0;
  for (int i = 0; i < N + 3; i++) {
    s[i] = kvt_strerror(codes[i]);
    assert_non_null(s[i]);
    assert_true(strlen(s[i]) > 0);
    for (int j = 0; j < i; j++) {
      if (!strcmp(s[i], s[j])) fprintf(stderr, "%d and %d both say \"%s\"\n", codes[i], codes[j], s[i]);
      assert_string_not_equal(s[i], s[j]);
    }
  }
  assert_non_null(kvt_strerror(KVT_E_LAST - 1));
  assert_non_null(kvt_strerror(KVT_E_FIRST + 1));
  assert_non_null(kvt_strerror(12345));
  assert_non_null(kvt_strerror(-99999));
}

static void test_dtype_and_block_bytes(void **state) {
  (void)state;
  assert_int_equal(kvt_dtype_size(KVT_F32), sizeof(float));
  assert_int_equal(kvt_dtype_size(KVT_F16), sizeof(uint16_t));
  assert_int_equal(kvt_dtype_size(KVT_BF16), sizeof(uint16_t));
  assert_int_equal(kvt_dtype_size(0), 0);
  assert_int_equal(kvt_dtype_size(4), 0);
  for (int i = 0; i < 100; i++) {
    kvt_shape s = {1 + tu_below(64), 1 + tu_below(64), 1 + tu_below(256), 1 + tu_below(3),
                   1u << tu_below(10)};
    size_t want = (size_t)s.block_tokens * s.n_kv_heads * s.head_dim * kvt_dtype_size(s.dtype);
    assert_int_equal(kvt_shape_block_bytes(&s), want);
  }
}

/* ---------------------------------------------------- engine modes */

static void test_readonly(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  kvt_engine *w = tu_open(dir, NULL), *r;
  kvt_shape sh = tu_shape_small(KVT_F32);
  kvt_ns_desc d = tu_desc("api-ro", &sh);
  kvt_ns_id ns = tu_register(w, "api-ro", &sh), id;
  uint32_t tok[4] = {1, 2, 3, 4};
  kvt_seq *s = NULL;
  uint64_t dropped;
  kvt_stats st;
  kvt_options_init(&o);
  o.flags = KVT_OPEN_RDONLY;
  r = tu_open(dir, &o); /* beside a live writer */
  REFUSE(r, KVT_ERDONLY, kvt_ns_register(r, &d, &id));
  REFUSE(r, KVT_ERDONLY, kvt_seq_create(r, ns, &s));
  assert_null(s);
  REFUSE(r, KVT_ERDONLY, kvt_sync(r));
  REFUSE(r, KVT_ERDONLY, kvt_ns_drop(r, ns));
  REFUSE(r, KVT_ERDONLY, kvt_drop_prefix(r, ns, tok, 4, &dropped));
  tu_stats(r, &st);
  assert_int_equal(st.seqs, 0);
  kvt_engine_close(r);
  assert_int_equal(kvt_sync(w), 0);
  kvt_engine_close(w);
  tu_rmtree(dir);
}

/* Puts without payload; reads refuse; the tier still counts the blocks. */
static void test_metadata_only(void **state) {
  (void)state;
  kvt_options o;
  tu_opts(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  fx f = fx_open(&o);
  kvt_shape sh = tu_shape_small(KVT_F16);
  kvt_ns_id ns = tu_register(f.e, "api-meta", &sh);
  kvt_kv kv = {NULL, NULL, sh.dtype, sh.block_tokens, sh.n_kv_heads, sh.head_dim};
  uint32_t tok[4] = {5, 6, 7, 8};
  size_t bb = kvt_shape_block_bytes(&sh), bytes = 2 * bb, nb;
  uint8_t *k = malloc(2 * bb), *v = malloc(2 * bb);
  kvt_seq *s, *t;
  kvt_stats st;
  kvt_append_info info;
  kvt_load_req req = {.layer = 0, .k_out = k, .v_out = v, .bytes_each = bb};
  kvt_load *ld;
  assert_int_equal(kvt_seq_create(f.e, ns, &s), 0);
  assert_int_equal(kvt_seq_append(s, tok, 4, &info), 0);
  req.key = info.key;
  for (uint32_t l = 0; l < sh.n_layers; l++) assert_int_equal(kvt_seq_put(s, 0, l, &kv), 0);
  tu_stats(f.e, &st);
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT], sh.n_layers);
  assert_true(st.tier_bytes[KVT_TIER_HOT] > 0);
  assert_int_equal(st.tier_bytes[KVT_TIER_HOT] % sh.n_layers, 0);
  REFUSE(f.e, KVT_ENOPAYLOAD, kvt_seq_read(s, 0, 0, k, v, bb));
  REFUSE(f.e, KVT_ENOPAYLOAD, kvt_seq_gather(s, 0, k, v, &bytes, NULL, 0, &nb));
  REFUSE(f.e, KVT_ENOPAYLOAD, kvt_load_submit(f.e, ns, &req, 1, &ld));
  assert_int_equal(kvt_lookup(f.e, ns, tok, 4, NULL, 0, &nb), 0);
  assert_int_equal(nb, 1);
  assert_int_equal(kvt_seq_create(f.e, ns, &t), 0);
  assert_int_equal(kvt_seq_append(t, tok, 4, &info), 0);
  assert_int_equal(info.layers_present, sh.n_layers);
  kvt_seq_release(t);
  kvt_seq_release(s);
  free(k);
  free(v);
  fx_close(&f);
}

/* Planning replays a workload through the tiers' own accounting: the same
 * puts must cost the same bytes with and without payloads. */
static void test_metadata_costs_match_payload(void **state) {
  (void)state;
  kvt_stats st[2];
  for (int meta = 0; meta < 2; meta++) {
    kvt_options o;
    tu_opts(&o);
    o.flags = meta ? KVT_OPEN_METADATA_ONLY : 0;
    fx f = fx_open(&o);
    kvt_shape sh = tu_shape_small(KVT_BF16);
    kvt_ns_id ns = tu_register(f.e, "api-plan", &sh);
    uint32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    tu_kv b;
    kvt_seq *s;
    tu_kv_alloc(&b, &sh);
    assert_int_equal(kvt_seq_create(f.e, ns, &s), 0);
    for (uint32_t blk = 0; blk < 2; blk++) {
      assert_int_equal(kvt_seq_append(s, tok + 4 * blk, 4, NULL), 0);
      for (uint32_t l = 0; l < sh.n_layers; l++) {
        tu_kv_fill(&b, &sh, 1, l, blk, tok + 4 * blk);
        if (meta) b.kv.k = b.kv.v = NULL;
        assert_int_equal(kvt_seq_put(s, blk, l, &b.kv), 0);
      }
    }
    tu_stats(f.e, &st[meta]);
    kvt_seq_release(s);
    tu_kv_free(&b);
    fx_close(&f);
  }
  assert_int_equal(st[0].tier_blocks[KVT_TIER_HOT], st[1].tier_blocks[KVT_TIER_HOT]);
  assert_int_equal(st[0].logical_bytes, st[1].logical_bytes);
  assert_int_equal(st[0].tier_bytes[KVT_TIER_HOT], st[1].tier_bytes[KVT_TIER_HOT]);
}

/* ------------------------------------------------ failing allocations */

typedef struct fa {
  kvt_engine *e;
  int failures;
} fa;

/* Run call; on -ENOMEM the stats must be unchanged and a retry (the Nth
 * allocation has been spent) must succeed. */
#define TRY(F, call)                                   \
  do {                                                 \
    kvt_stats b_, a_;                                  \
    tu_stats((F)->e, &b_);                             \
    int rc_ = (call);                                  \
    if (rc_ == -ENOMEM) {                              \
      (F)->failures++;                                 \
      tu_stats((F)->e, &a_);                           \
      if (memcmp(&b_, &a_, sizeof a_))                 \
        fprintf(stderr, "%s:%d: %s failed with -ENOMEM and changed stats\n", __FILE__, \
                __LINE__, #call);                      \
      tu_assert_stats_eq(&b_, &a_);                    \
      rc_ = (call);                                    \
    }                                                  \
    if (rc_) fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, kvt_strerror(rc_)); \
    assert_int_equal(rc_, 0);                          \
  } while (0)

static void fa_put_block(fa *F, kvt_seq *s, const kvt_shape *sh, const uint32_t *tok,
                         uint32_t blk, tu_kv *b) {
  TRY(F, kvt_seq_append(s, tok, sh->block_tokens, NULL));
  assert_int_equal(kvt_seq_blocks(s), blk + 1);
  for (uint32_t l = 0; l < sh->n_layers; l++) {
    tu_kv_fill(b, sh, 7, l, blk, tok);
    TRY(F, kvt_seq_put(s, blk, l, &b->kv));
  }
}

static void fa_loads(fa *F, kvt_ns_id ns, tu_kv *b) {
  kvt_append_info info;
  kvt_load_req req[2];
  kvt_load *ld = NULL;
  size_t ok = 0;
  uint32_t tok[4] = {100, 101, 102, 103};
  kvt_seq *t = NULL;
  TRY(F, kvt_seq_create(F->e, ns, &t));
  TRY(F, kvt_seq_append(t, tok, 4, &info)); /* adopts block 0 */
  for (int i = 0; i < 2; i++)
    req[i] = (kvt_load_req){.key = info.key, .layer = (uint32_t)i, .k_out = b->k,
                            .v_out = b->v, .bytes_each = b->bytes};
  TRY(F, kvt_load_submit(F->e, ns, req, 2, &ld));
  assert_int_equal(kvt_load_wait(ld, &ok), 0);
  assert_int_equal(ok, 2);
  kvt_seq_release(t);
}

/* Gather (which may allocate) and compare with what was put. */
static void fa_gather(fa *F, kvt_seq *s, const kvt_shape *sh, const uint32_t *tok,
                      uint32_t layer, tu_kv *b) {
  size_t bytes = 3 * b->bytes, nb = 0;
  uint8_t *k = malloc(bytes), *v = malloc(bytes);
  assert_true(k && v);
  TRY(F, kvt_seq_gather(s, layer, k, v, &bytes, NULL, 0, &nb));
  assert_int_equal(nb, 3);
  assert_int_equal(bytes, 3 * b->bytes);
  for (uint32_t i = 0; i < 3; i++) {
    tu_kv_fill(b, sh, 7, layer, i, tok + 4 * i);
    assert_memory_equal(k + i * b->bytes, b->k, b->bytes);
    assert_memory_equal(v + i * b->bytes, b->v, b->bytes);
  }
  free(k);
  free(v);
}

/* One open .. close under test_fail_alloc_after = n; returns failures seen,
 * or -1 when the open itself failed. */
static int fa_run(const char *dir, uint64_t n) {
  kvt_options o;
  tu_opts(&o);
  o.test_fail_alloc_after = n;
  fa F = {0};
  int rc = kvt_engine_open(dir, &o, &F.e);
  if (rc == -ENOMEM) {
    assert_null(F.e);
    return -1;
  }
  assert_int_equal(rc, 0);
  kvt_shape sh = tu_shape_small(KVT_F32);
  kvt_ns_desc d = tu_desc("api-fail", &sh);
  kvt_ns_id ns;
  kvt_seq *a = NULL, *b = NULL, *c = NULL;
  uint32_t tok[12] = {100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111};
  size_t found;
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  TRY(&F, kvt_ns_register(F.e, &d, &ns));
  TRY(&F, kvt_seq_create(F.e, ns, &a));
  for (uint32_t blk = 0; blk < 2; blk++) fa_put_block(&F, a, &sh, tok + 4 * blk, blk, &kv);
  TRY(&F, kvt_seq_fork(a, UINT32_MAX, &b));
  TRY(&F, kvt_seq_fork(a, 1, &c));
  fa_put_block(&F, b, &sh, tok + 8, 2, &kv);
  TRY(&F, kvt_lookup(F.e, ns, tok, 12, NULL, 0, &found));
  assert_int_equal(found, 3);
  fa_loads(&F, ns, &kv);
  kvt_seq_release(a);
  kvt_seq_release(c);
  for (uint32_t l = 0; l < sh.n_layers; l++) fa_gather(&F, b, &sh, tok, l, &kv);
  kvt_seq_release(b);
  uint64_t dropped = 0;
  TRY(&F, kvt_drop_prefix(F.e, ns, tok, 4, &dropped));
  assert_int_equal(dropped, 3);
  TRY(&F, kvt_lookup(F.e, ns, tok, 12, NULL, 0, &found));
  assert_int_equal(found, 0);
  TRY(&F, kvt_ns_drop(F.e, ns));
  tu_kv_free(&kv);
  kvt_engine_close(F.e);
  return F.failures;
}

static void test_fail_alloc_after(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  uint64_t n, bound = tu_stress() ? 100000 : 3000;
  int total = 0, clean = 0;
  /* Stop after a run of clean passes: n is then past the last allocation
   * (a single clean run may be an allocation the library survives). */
  for (n = 1; n <= bound && clean < 20; n++) {
    int r = fa_run(dir, n);
    clean = r == 0 ? clean + 1 : 0;
    total += r > 0;
  }
  fprintf(stderr, "fail_alloc: %llu runs, %d with a refused call\n", (unsigned long long)n - 1,
          total);
  assert_true(total > 0);
  assert_int_equal(clean, 20);
  tu_rmtree(dir);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_open_close),
      cmocka_unit_test(test_open_refusals),
      cmocka_unit_test(test_options_defaults),
      cmocka_unit_test(test_options_invalid),
      cmocka_unit_test(test_ns_register),
      cmocka_unit_test(test_ns_bad_desc),
      cmocka_unit_test(test_ns_bad_shape),
      cmocka_unit_test(test_ns_limit),
      cmocka_unit_test(test_put_refusals),
      cmocka_unit_test(test_put_refusals_on_stored_block),
      cmocka_unit_test(test_put_before_append),
      cmocka_unit_test(test_append_refusals),
      cmocka_unit_test(test_read_refusals),
      cmocka_unit_test(test_gather_refusals),
      cmocka_unit_test(test_lookup_load_drop_refusals),
      cmocka_unit_test(test_load_limit),
      cmocka_unit_test(test_seq_refusals),
      cmocka_unit_test(test_strerror),
      cmocka_unit_test(test_dtype_and_block_bytes),
      cmocka_unit_test(test_readonly),
      cmocka_unit_test(test_metadata_only),
      cmocka_unit_test(test_metadata_costs_match_payload),
      cmocka_unit_test(test_fail_alloc_after),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
