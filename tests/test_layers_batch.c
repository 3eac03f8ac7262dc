/* test_layers_batch.c - kvt_seq_put_layers and kvt_seq_gather_layers are
 * the per-layer calls in a loop: the same bytes stored and gathered as
 * layer-by-layer calls, slices at the stride given, and a failure stops
 * at the failing layer with the layers before it done and counted. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

typedef struct fx {
  char *dir;
  kvt_engine *e;
  kvt_shape sh;
  kvt_ns_id ns;
  size_t each;       /* bytes of one layer block's K */
  uint8_t *k, *v;    /* [n_layers][each]: distinct bytes per layer */
} fx;

static void fx_open(fx *f) {
  f->dir = tu_tmpdir();
  f->e = tu_open(f->dir, NULL);
  f->sh = tu_shape_small(KVT_F16);
  f->ns = tu_register(f->e, "layers-model", &f->sh);
  f->each = kvt_shape_block_bytes(&f->sh);
  f->k = malloc(f->sh.n_layers * f->each);
  f->v = malloc(f->sh.n_layers * f->each);
  assert_non_null(f->k);
  assert_non_null(f->v);
  uint16_t *k = (uint16_t *)f->k, *v = (uint16_t *)f->v;
  for (size_t i = 0; i < f->sh.n_layers * f->each / 2; i++) {
    k[i] = tu_f32_to_f16((float)(i % 977) / 64.0f);
    v[i] = tu_f32_to_f16(-(float)(i % 883) / 32.0f);
  }
}

static void fx_close(fx *f) {
  kvt_engine_close(f->e);
  free(f->k);
  free(f->v);
  tu_rmtree(f->dir);
}

static kvt_kv fx_kv(const fx *f) {
  return (kvt_kv){.k = f->k, .v = f->v, .dtype = f->sh.dtype, .n_tokens = f->sh.block_tokens,
                  .n_heads = f->sh.n_kv_heads, .head_dim = f->sh.head_dim};
}

static kvt_seq *seq_with_block(fx *f, uint32_t first_token) {
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(f->e, f->ns, &s), 0);
  uint32_t tok[64];
  for (uint32_t i = 0; i < f->sh.block_tokens; i++) tok[i] = first_token + i;
  assert_int_equal(kvt_seq_append(s, tok, f->sh.block_tokens, NULL), 0);
  return s;
}

/* put_layers stores what per-layer puts store; gather_layers writes each
 * layer at its stride and reports its bytes. */
static void test_same_as_per_layer(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  uint32_t L = f.sh.n_layers, done = 99;
  kvt_seq *s = seq_with_block(&f, 100);
  kvt_kv kv = fx_kv(&f);
  assert_int_equal(kvt_seq_put_layers(s, 0, 0, L, &kv, f.each, &done), 0);
  assert_int_equal(done, L);
  uint8_t *kb = malloc(f.each), *vb = malloc(f.each);
  for (uint32_t l = 0; l < L; l++) { /* per-layer reads see layer l's bytes */
    assert_int_equal(kvt_seq_read(s, 0, l, kb, vb, f.each), 0);
    assert_memory_equal(kb, f.k + l * f.each, f.each);
    assert_memory_equal(vb, f.v + l * f.each, f.each);
  }
  /* gather into slices of a larger stride: the gaps stay untouched */
  size_t stride = f.each + 64, bytes[16];
  uint8_t *ko = malloc(L * stride), *vo = malloc(L * stride);
  memset(ko, 0xA5, L * stride);
  memset(vo, 0xA5, L * stride);
  bytes[0] = f.each;
  assert_int_equal(kvt_seq_gather_layers(s, 0, L, ko, vo, stride, bytes, &done), 0);
  assert_int_equal(done, L);
  for (uint32_t l = 0; l < L; l++) {
    assert_int_equal(bytes[l], f.each);
    assert_memory_equal(ko + l * stride, f.k + l * f.each, f.each);
    assert_memory_equal(vo + l * stride, f.v + l * f.each, f.each);
    for (size_t i = f.each; i < stride; i++) assert_int_equal(ko[l * stride + i], 0xA5);
  }
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.puts, L);
  free(kb), free(vb), free(ko), free(vo);
  kvt_seq_release(s);
  fx_close(&f);
}

/* A failure stops at the failing layer: the layers before it are done. */
static void test_stops_at_failure(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  uint32_t L = f.sh.n_layers, done = 99;
  kvt_seq *s = seq_with_block(&f, 200);
  kvt_kv kv = fx_kv(&f);
  /* layers 1 .. L: the last does not exist */
  assert_int_equal(kvt_seq_put_layers(s, 0, 1, L, &kv, f.each, &done), KVT_ENOTFOUND);
  assert_int_equal(done, L - 1);
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.puts, L - 1);
  /* a NaN in layer 2's K: layers 0 and 1 are put, 2 is refused */
  kvt_seq *s2 = seq_with_block(&f, 300);
  tu_set_nonfinite(f.k + 2 * f.each, KVT_F16, 5, 0);
  assert_int_equal(kvt_seq_put_layers(s2, 0, 0, L, &kv, f.each, &done), KVT_ENONFINITE);
  assert_int_equal(done, 2);
  /* s2's layers 0..1 gather; layer 2 was not put, so it retains nothing */
  size_t bytes[16] = {f.each};
  uint8_t *ko = malloc(L * f.each), *vo = malloc(L * f.each);
  assert_int_equal(kvt_seq_gather_layers(s2, 0, 3, ko, vo, f.each, bytes, &done), 0);
  assert_int_equal(done, 3);
  assert_int_equal(bytes[0], f.each);
  assert_int_equal(bytes[2], 0); /* nothing retained in layer 2 */
  bytes[0] = f.each / 2;          /* too small for one block */
  assert_int_equal(kvt_seq_gather_layers(s2, 0, 2, ko, vo, f.each, bytes, &done), KVT_EBUFSIZE);
  assert_int_equal(done, 0);
  free(ko), free(vo);
  kvt_seq_release(s);
  kvt_seq_release(s2);
  fx_close(&f);
}

static void test_bad_arguments(void **state) {
  (void)state;
  fx f;
  fx_open(&f);
  kvt_seq *s = seq_with_block(&f, 400);
  kvt_kv kv = fx_kv(&f);
  uint32_t done = 99;
  size_t bytes[4] = {f.each};
  uint8_t buf[64];
  assert_int_equal(kvt_seq_put_layers(NULL, 0, 0, 1, &kv, f.each, &done), KVT_ENULL);
  assert_int_equal(done, 0);
  assert_int_equal(kvt_seq_put_layers(s, 0, 0, 1, NULL, f.each, NULL), KVT_ENULL);
  assert_int_equal(kvt_seq_put_layers(s, 0, 0, 0, &kv, f.each, NULL), KVT_ECOUNT);
  assert_int_equal(kvt_seq_gather_layers(s, 0, 0, buf, buf, f.each, bytes, NULL), KVT_ECOUNT);
  assert_int_equal(kvt_seq_gather_layers(s, 0, 1, NULL, buf, f.each, bytes, NULL), KVT_ENULL);
  /* overlapping slices are refused before anything is written */
  assert_int_equal(kvt_seq_gather_layers(s, 0, 2, buf, buf, f.each - 1, bytes, NULL),
                   KVT_EBUFSIZE);
  kvt_error_info info;
  assert_int_equal(kvt_last_error(f.e, &info), 0);
  assert_int_equal(info.code, KVT_EBUFSIZE);
  assert_non_null(strstr(info.message, "layer_stride"));
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.puts, 0);
  kvt_seq_release(s);
  fx_close(&f);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_as_per_layer),
      cmocka_unit_test(test_stops_at_failure),
      cmocka_unit_test(test_bad_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
