/* test_keys.c - token-block keys against the vectors of docs/format.md
 * ("Keys"), which were made by tests/gen_key_vectors.py with xxh128sum, not
 * by kvtier; then the chain's properties on random tokens. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------- the hard vectors */

typedef struct vec_ns {
  const char *name;
  kvt_ns_desc desc;
  const char *seed;
  const char *keys[3]; /* blocks of tokens 0 .. 3*block_tokens-1 */
} vec_ns;

#define SHAPE_A {.n_layers = 32, .n_kv_heads = 8, .head_dim = 128, .dtype = KVT_F16, \
                 .block_tokens = 16}
#define DESC_A(rank, size)                                                              \
  {.model_id = "meta-llama/Llama-3.1-8B", .weights_fingerprint = "sha256:0123abcd",  \
   .rope_theta = 500000.0, .rope_dims = 0, .rope_scaling = "llama3:factor=8",        \
   .tp_rank = rank, .tp_size = size, .shape = SHAPE_A}

static const vec_ns vectors[] = {
    {"A", DESC_A(0, 1), "1f392997998a984ca501ea7939b4fca5",
     {"334a710b3cb09d78197ca1941083fb34", "ad58d7ee4c9fa0b8855a6da1592f816e",
      "f39f0f0147a522fed2a6691a31e3e426"}},
    {"B", DESC_A(0, 2), "91e106d2a57ba0addb4ae44d44e9bc64",
     {"5144d86a6ab92218e072b38e70d6ffa6", "4f0e4abc0cc47557253472d0273be1d1",
      "55fbde55ce7b238cb282f857f0f05bb6"}},
    {"C", DESC_A(1, 2), "2f005b2b9819ed4858ea31141b51e64e",
     {"923debde0c39b97f2353ce4d0f9d279d", "461ff36bfa6fd45f121cd76944fe8cc4",
      "e52744d3108a8f3374bbcbb77685a9d3"}},
    {"D",
     {.model_id = "tiny", .weights_fingerprint = "x", .rope_theta = 0.0, .rope_dims = 0,
      .rope_scaling = NULL, .tp_rank = 0, .tp_size = 1,
      .shape = {.n_layers = 4, .n_kv_heads = 2, .head_dim = 16, .dtype = KVT_F32,
                .block_tokens = 4}},
     "997259f0ad7641c28771a18fa72e9392",
     {"56a3d3c55cdef6406f3711afc2330393", "a18be55652c869d85493b489cfceec58",
      "a3a563d9dfcc0da1ac540f9517feb6fc"}},
};
#define N_VECTORS (sizeof vectors / sizeof vectors[0])

/* Namespace A, one block of token i = i * 2654435761 mod 2^32. */
static const char *wide_key0 = "2a39bb92ce831ac16b6057b94cbf1a87";

static kvt_key hex_key(const char *hex) {
  kvt_key k;
  assert_int_equal(strlen(hex), 32);
  for (int i = 0; i < 16; i++) {
    unsigned x;
    assert_int_equal(sscanf(hex + 2 * i, "%2x", &x), 1);
    k.b[i] = (uint8_t)x;
  }
  return k;
}

static void assert_key(const kvt_key *got, const char *hex) {
  kvt_key want = hex_key(hex);
  if (memcmp(got->b, want.b, 16) != 0) {
    fprintf(stderr, "key mismatch: want %s got ", hex);
    for (int i = 0; i < 16; i++) fprintf(stderr, "%02x", got->b[i]);
    fprintf(stderr, "\n");
  }
  assert_memory_equal(got->b, want.b, 16);
}

static int key_eq(const kvt_key *a, const kvt_key *b) {
  return memcmp(a->b, b->b, 16) == 0;
}

typedef struct fix {
  char *dir;
  kvt_engine *e;
} fix;

static fix fix_open(void) {
  fix f = {.dir = tu_tmpdir()};
  f.e = tu_open(f.dir, NULL);
  return f;
}

static void fix_close(fix *f) {
  kvt_engine_close(f->e);
  tu_rmtree(f->dir);
}

static uint32_t *seq_tokens(size_t n) {
  uint32_t *t = malloc(n * sizeof *t);
  assert_non_null(t);
  for (size_t i = 0; i < n; i++) t[i] = (uint32_t)i;
  return t;
}

/* Seed and keys through the engine and through kvt_key_next(). */
static void check_vector(kvt_engine *e, const vec_ns *v) {
  kvt_ns_id ns;
  kvt_key seed, keys[4], chained, prev;
  size_t bt = v->desc.shape.block_tokens, n_keys = 99;
  uint32_t *tok = seq_tokens(3 * bt + bt / 2); /* a trailing half block */
  assert_int_equal(kvt_ns_register(e, &v->desc, &ns), 0);
  assert_int_equal(kvt_ns_seed(e, ns, &seed), 0);
  assert_key(&seed, v->seed);
  assert_int_equal(kvt_keys(e, ns, tok, 3 * bt + bt / 2, keys, 4, &n_keys), 0);
  assert_int_equal(n_keys, 3);
  for (size_t i = 0; i < 3; i++) {
    assert_key(&keys[i], v->keys[i]);
    kvt_key_next(&seed, i ? &prev : NULL, tok + i * bt, (uint32_t)bt, &chained);
    assert_key(&chained, v->keys[i]);
    prev = chained;
  }
  free(tok);
}

static void test_vectors(void **state) {
  (void)state;
  fix f = fix_open();
  for (size_t i = 0; i < N_VECTORS; i++) check_vector(f.e, &vectors[i]);
  fix_close(&f);
}

static void test_vector_wide_tokens(void **state) {
  (void)state;
  fix f = fix_open();
  uint32_t tok[16];
  kvt_ns_id ns;
  kvt_key keys[1], seed, k0;
  size_t n = 0;
  for (uint32_t i = 0; i < 16; i++) tok[i] = (uint32_t)(i * 2654435761u);
  assert_int_equal(kvt_ns_register(f.e, &vectors[0].desc, &ns), 0);
  assert_int_equal(kvt_keys(f.e, ns, tok, 16, keys, 1, &n), 0);
  assert_int_equal(n, 1);
  assert_key(&keys[0], wide_key0);
  seed = hex_key(vectors[0].seed);
  kvt_key_next(&seed, NULL, tok, 16, &k0);
  assert_key(&k0, wide_key0);
  fix_close(&f);
}

/* kvt_key_next() needs no engine: chain the vectors from the hex seed. */
static void test_key_next_standalone(void **state) {
  (void)state;
  for (size_t v = 0; v < N_VECTORS; v++) {
    uint32_t bt = vectors[v].desc.shape.block_tokens;
    uint32_t *tok = seq_tokens(3 * bt);
    kvt_key seed = hex_key(vectors[v].seed), prev, out;
    for (uint32_t i = 0; i < 3; i++) {
      memset(&out, 0xee, sizeof out);
      kvt_key_next(&seed, i ? &prev : NULL, tok + i * bt, bt, &out);
      assert_key(&out, vectors[v].keys[i]);
      prev = out;
    }
    free(tok);
  }
}

/* rope_dims 0 means head_dim: registering either finds one namespace. */
static void test_rope_dims_normalized(void **state) {
  (void)state;
  fix f = fix_open();
  kvt_ns_desc d = vectors[0].desc;
  kvt_ns_id a, b;
  kvt_key sa, sb;
  assert_int_equal(kvt_ns_register(f.e, &d, &a), 0);
  d.rope_dims = d.shape.head_dim;
  assert_int_equal(kvt_ns_register(f.e, &d, &b), 0);
  assert_int_equal(a, b);
  assert_int_equal(kvt_ns_seed(f.e, b, &sb), 0);
  assert_int_equal(kvt_ns_seed(f.e, a, &sa), 0);
  assert_key(&sb, vectors[0].seed);
  assert_key(&sa, vectors[0].seed);
  fix_close(&f);
}

/* ------------------------------------------------------------ properties */

/* Each variant differs from A in one field of the encoding. */
static kvt_ns_desc variant(int i) {
  kvt_ns_desc d = vectors[0].desc;
  switch (i) {
  case 0: break;
  case 1: d.model_id = "meta-llama/Llama-3.1-8C"; break;
  case 2: d.weights_fingerprint = "sha256:0123abce"; break;
  case 3: d.rope_theta = nextafter(d.rope_theta, 1e9); break;
  case 4: d.rope_dims = 64; break;
  case 5: d.rope_scaling = NULL; break;
  case 6: d.rope_scaling = "llama3:factor=4"; break;
  case 7: d.tp_size = 2; break;
  case 8: d.shape.n_layers = 33; break;
  case 9: d.shape.n_kv_heads = 4; break;
  case 10: d.shape.head_dim = 64; break;
  case 11: d.shape.dtype = KVT_BF16; break;
  case 12: d.shape.block_tokens = 32; break;
  case 13: d.model_id = "meta-llama/Llama-3.1-8Bs"; d.weights_fingerprint = "ha256:0123abcd"; break;
  default: fail();
  }
  return d;
}
#define N_VARIANTS 14

/* Any change in the encoded fields changes the seed (one engine each, since
 * a shape change of one identity would conflict). Variant 13 moves a byte
 * from the fingerprint to the model id: only the length prefixes differ. */
static void test_seed_covers_every_field(void **state) {
  (void)state;
  kvt_key seeds[N_VARIANTS];
  for (int i = 0; i < N_VARIANTS; i++) {
    fix f = fix_open();
    kvt_ns_desc d = variant(i);
    kvt_ns_id ns;
    assert_int_equal(kvt_ns_register(f.e, &d, &ns), 0);
    assert_int_equal(kvt_ns_seed(f.e, ns, &seeds[i]), 0);
    for (int j = 0; j < i; j++) {
      if (key_eq(&seeds[i], &seeds[j])) fprintf(stderr, "variants %d and %d share a seed\n", i, j);
      assert_false(key_eq(&seeds[i], &seeds[j]));
    }
    fix_close(&f);
  }
}

static void random_tokens(uint32_t *t, size_t n) {
  for (size_t i = 0; i < n; i++) t[i] = (uint32_t)tu_rand();
}

static size_t keys_of(kvt_engine *e, kvt_ns_id ns, const uint32_t *t, size_t n, kvt_key *k,
                      size_t max) {
  size_t got = SIZE_MAX;
  assert_int_equal(kvt_keys(e, ns, t, n, k, max, &got), 0);
  return got;
}

/* Two engines in two directories agree on every key of random tokens. */
static void test_equal_prefix_equal_keys_across_engines(void **state) {
  (void)state;
  fix f1 = fix_open(), f2 = fix_open();
  kvt_shape sh = tu_shape_small(KVT_F16);
  kvt_ns_id n1 = tu_register(f1.e, "keys-model", &sh), n2 = tu_register(f2.e, "keys-model", &sh);
  uint32_t tok[64];
  kvt_key k1[16], k2[16];
  for (int round = 0; round < 20; round++) {
    size_t n = tu_below(65);
    random_tokens(tok, n);
    assert_int_equal(keys_of(f1.e, n1, tok, n, k1, 16), n / sh.block_tokens);
    assert_int_equal(keys_of(f2.e, n2, tok, n, k2, 16), n / sh.block_tokens);
    assert_memory_equal(k1, k2, n / sh.block_tokens * sizeof(kvt_key));
  }
  fix_close(&f1);
  fix_close(&f2);
}

/* Changing one token of block i changes keys i.. and none before. */
static void test_change_propagates_forward_only(void **state) {
  (void)state;
  fix f = fix_open();
  kvt_shape sh = tu_shape_small(KVT_F32);
  kvt_ns_id ns = tu_register(f.e, "keys-model", &sh);
  uint32_t tok[40];
  kvt_key a[10], b[10];
  for (int round = 0; round < 40; round++) {
    random_tokens(tok, 40);
    assert_int_equal(keys_of(f.e, ns, tok, 40, a, 10), 10);
    size_t pos = tu_below(40), blk = pos / sh.block_tokens;
    tok[pos] ^= 1u << tu_below(32);
    assert_int_equal(keys_of(f.e, ns, tok, 40, b, 10), 10);
    for (size_t i = 0; i < 10; i++) {
      if (i < blk) assert_true(key_eq(&a[i], &b[i]));
      else assert_false(key_eq(&a[i], &b[i]));
    }
  }
  fix_close(&f);
}

/* A trailing partial block has no key and does not disturb the others. */
static void test_partial_block_has_no_key(void **state) {
  (void)state;
  fix f = fix_open();
  kvt_shape sh = tu_shape_small(KVT_BF16);
  kvt_ns_id ns = tu_register(f.e, "keys-model", &sh);
  uint32_t tok[23];
  kvt_key full[5], part[5];
  random_tokens(tok, 23);
  assert_int_equal(keys_of(f.e, ns, tok, 20, full, 5), 5);
  for (size_t n = 0; n <= 23; n++) {
    size_t got = keys_of(f.e, ns, tok, n, part, 5);
    assert_int_equal(got, n / sh.block_tokens);
    assert_memory_equal(part, full, got * sizeof(kvt_key));
  }
  fix_close(&f);
}

/* kvt_keys refuses a too-small array and writes no more than it may. */
static void test_keys_capacity(void **state) {
  (void)state;
  fix f = fix_open();
  kvt_shape sh = tu_shape_small(KVT_F32);
  kvt_ns_id ns = tu_register(f.e, "keys-model", &sh);
  uint32_t tok[12];
  kvt_key k[4];
  size_t n = 77;
  random_tokens(tok, 12);
  memset(k, 0xcc, sizeof k);
  assert_int_equal(kvt_keys(f.e, ns, tok, 12, k, 2, &n), KVT_ECOUNT);
  for (int i = 0; i < 16; i++) assert_int_equal(k[2].b[i], 0xcc);
  assert_int_equal(kvt_keys(f.e, ns, tok, 12, k, 3, &n), 0);
  assert_int_equal(n, 3);
  assert_int_equal(kvt_keys(f.e, ns + 1000, tok, 12, k, 3, &n), KVT_ENOTFOUND);
  assert_int_equal(kvt_keys(f.e, ns, NULL, 12, k, 3, &n), KVT_ENULL);
  assert_int_equal(kvt_keys(f.e, ns, tok, 12, NULL, 3, &n), KVT_ENULL);
  assert_int_equal(kvt_keys(f.e, ns, tok, 12, k, 3, NULL), KVT_ENULL);
  assert_int_equal(kvt_keys(NULL, ns, tok, 12, k, 3, &n), KVT_ENULL);
  assert_int_equal(kvt_ns_seed(f.e, ns + 1000, &k[0]), KVT_ENOTFOUND);
  fix_close(&f);
}

/* The key append reports is the key kvt_keys computes, and two sequences
 * diverging after a shared prefix share keys exactly up to the divergence. */
static void test_append_key_matches_keys(void **state) {
  (void)state;
  fix f = fix_open();
  kvt_shape sh = tu_shape_small(KVT_F16);
  kvt_ns_id ns = tu_register(f.e, "keys-model", &sh);
  uint32_t ta[24], tb[24];
  kvt_key ka[6], kb[6];
  kvt_seq *a, *b;
  size_t split = 1 + tu_below(5); /* blocks shared */
  random_tokens(ta, 24);
  memcpy(tb, ta, sizeof tb);
  tb[split * 4 + tu_below(4)] ^= 0x80000000u;
  assert_int_equal(keys_of(f.e, ns, ta, 24, ka, 6), 6);
  assert_int_equal(keys_of(f.e, ns, tb, 24, kb, 6), 6);
  assert_int_equal(kvt_seq_create(f.e, ns, &a), 0);
  assert_int_equal(kvt_seq_create(f.e, ns, &b), 0);
  for (uint32_t i = 0; i < 6; i++) {
    kvt_append_info ia, ib;
    assert_int_equal(kvt_seq_append(a, ta + 4 * i, 4, &ia), 0);
    assert_int_equal(kvt_seq_append(b, tb + 4 * i, 4, &ib), 0);
    assert_int_equal(ia.block, i);
    assert_true(key_eq(&ia.key, &ka[i]));
    assert_true(key_eq(&ib.key, &kb[i]));
    assert_int_equal(key_eq(&ia.key, &ib.key), i < split);
  }
  kvt_seq_release(a);
  kvt_seq_release(b);
  fix_close(&f);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vectors),
      cmocka_unit_test(test_vector_wide_tokens),
      cmocka_unit_test(test_key_next_standalone),
      cmocka_unit_test(test_rope_dims_normalized),
      cmocka_unit_test(test_seed_covers_every_field),
      cmocka_unit_test(test_equal_prefix_equal_keys_across_engines),
      cmocka_unit_test(test_change_propagates_forward_only),
      cmocka_unit_test(test_partial_block_has_no_key),
      cmocka_unit_test(test_keys_capacity),
      cmocka_unit_test(test_append_key_matches_keys),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
