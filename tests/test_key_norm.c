/* test_key_norm.c - the key norm of a put block (the learned predictor's
 * key_norm feature, engine/policy.c) is summed four rows side by side
 * after a vector conversion, for speed; it must give the bits of the plain
 * loop below - every row's squares in channel order in double, the row
 * norms in row order - for f32, f16 and bf16, row counts that are and are
 * not multiples of four, and head_dim from 1 to KVT_MAX_HEAD_DIM. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"
#include "engine/policy.h"

static uint64_t rnd_next(uint64_t *x) {
  *x ^= *x >> 12;
  *x ^= *x << 25;
  *x ^= *x >> 27;
  return *x * 0x2545f4914f6cdd1dull;
}

/* The reference: one element at a time, through the scalar converters. */
static float plain(const kvt_kv *kv) {
  size_t rows = (size_t)kv->n_tokens * kv->n_heads;
  double sum = 0;
  for (size_t r = 0; r < rows; r++) {
    double sq = 0;
    for (uint32_t d = 0; d < kv->head_dim; d++) {
      size_t i = r * kv->head_dim + d;
      float x = kv->dtype == KVT_F32   ? ((const float *)kv->k)[i]
                : kv->dtype == KVT_F16 ? kvt_f16_to_f32(((const uint16_t *)kv->k)[i])
                                       : kvt_bf16_to_f32(((const uint16_t *)kv->k)[i]);
      sq += (double)x * x;
    }
    sum += sqrt(sq);
  }
  return rows ? (float)(sum / (double)rows) : 0;
}

/* Finite values over a wide range of magnitudes, some subnormal in f16. */
static float value(uint64_t *x) {
  uint64_t r = rnd_next(x);
  float m = (float)(r >> 40) / (float)(1u << 24) - 0.5f;
  int e = (int)((r >> 8) % 40) - 30; /* 2^-30 .. 2^9 */
  return ldexpf(m, e);
}

static void check(uint32_t dtype, uint32_t tokens, uint32_t heads, uint32_t hd, uint64_t seed) {
  size_t n = (size_t)tokens * heads * hd, es = dtype == KVT_F32 ? 4 : 2;
  void *k = malloc(n * es);
  assert_non_null(k);
  float *f = malloc(n * sizeof *f);
  assert_non_null(f);
  for (size_t i = 0; i < n; i++) f[i] = value(&seed);
  kvt_from_f32(f, dtype, n, k);
  kvt_kv kv = {.k = k, .v = k, .dtype = dtype, .n_tokens = tokens, .n_heads = heads,
               .head_dim = hd};
  float a = kvt_policy_key_norm(&kv), b = plain(&kv);
  if (memcmp(&a, &b, sizeof a))
    fail_msg("dtype %u, %u tokens x %u heads x %u: %.9g, the plain loop %.9g", dtype, tokens,
             heads, hd, (double)a, (double)b);
  free(f);
  free(k);
}

static void test_same_bits(void **state) {
  (void)state;
  static const uint32_t dts[] = {KVT_F32, KVT_F16, KVT_BF16};
  static const uint32_t hds[] = {1, 7, 64, 128, 1024};
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (size_t t = 0; t < sizeof dts / sizeof *dts; t++)
    for (size_t h = 0; h < sizeof hds / sizeof *hds; h++)
      for (uint32_t rows = 1; rows <= 9; rows++) {
        check(dts[t], rows, 1, hds[h], seed++); /* rows % 4: 1, 2, 3 and 0 */
        check(dts[t], 1 + rows % 3, rows, hds[h], seed++);
      }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_same_bits)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
