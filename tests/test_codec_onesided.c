/* test_codec_onesided.c - warm blocks with one side quantized and the
 * other kept exact (kvt_ns_set_codec with KVT_CODEC_NONE on one side):
 * gathers return the exact side bit for bit, attention in place matches
 * attention over the gathered K and V, and the warm tier counts the exact
 * side at its full size. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/mem.h"
#include "tiers/tier.h"

#define N_BLOCKS 3

/* An engine whose every put is encoded straight into warm. */
static kvt_engine *open_warm(char *dir) {
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = 1; /* below one block */
  o.tier_bytes_limit[KVT_TIER_WARM] = 64ull << 20;
  kvt_engine *e = NULL;
  assert_int_equal(kvt_engine_open_info(dir, &o, &e, NULL), 0);
  return e;
}

static void test_set_codec_rules(void **state) {
  (void)state;
  kvt_options o;
  tu_opts(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  kvt_engine *e = tu_open(NULL, &o);
  kvt_shape sh = tu_shape_small(KVT_F16);
  kvt_ns_id ns = tu_register(e, "rules", &sh);
  assert_int_equal(kvt_ns_set_codec(e, ns, KVT_ALL_LAYERS, KVT_CODEC_K8, KVT_CODEC_NONE), 0);
  assert_int_equal(kvt_ns_set_codec(e, ns, 1, KVT_CODEC_NONE, KVT_CODEC_V3), 0);
  assert_int_equal(kvt_ns_set_codec(e, ns, 1, KVT_CODEC_NONE, KVT_CODEC_NONE), KVT_EOPTION);
  kvt_error_info info;
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_int_equal(info.code, KVT_EOPTION);
  assert_string_equal(info.got, "both KVT_CODEC_NONE");
  assert_int_equal(kvt_ns_set_codec(e, ns, 1, KVT_CODEC_V3, KVT_CODEC_NONE), KVT_EOPTION);
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_string_equal(info.field, "k_codec");
  assert_int_equal(kvt_ns_set_codec(e, ns, 1, KVT_CODEC_K8, KVT_CODEC_K4), KVT_EOPTION);
  assert_int_equal(kvt_ns_set_codec(e, ns, 1, KVT_CODEC_K8, 99), KVT_EOPTION);
  kvt_engine_close(e);
}

static float to_f32(const void *buf, uint32_t dtype, size_t i) {
  if (dtype == KVT_F32) return ((const float *)buf)[i];
  uint16_t h = ((const uint16_t *)buf)[i];
  return dtype == KVT_F16 ? tu_f16_to_f32(h) : tu_bf16_to_f32(h);
}

/* Attention of q over n_tok gathered tokens, [t][h][d] in dtype. */
static void ref_attend(const kvt_shape *sh, const void *k, const void *v, size_t n_tok,
                       const float *q, uint32_t n_q, float *out) {
  uint32_t H = sh->n_kv_heads, D = sh->head_dim, group = n_q / H;
  float scale = 1.0f / sqrtf((float)D), sc[N_BLOCKS * 16];
  for (uint32_t h = 0; h < n_q; h++) {
    uint32_t kh = h / group;
    float m = -INFINITY, l = 0;
    for (size_t t = 0; t < n_tok; t++) {
      float s = 0;
      for (uint32_t d = 0; d < D; d++)
        s += q[h * D + d] * to_f32(k, sh->dtype, (t * H + kh) * D + d);
      sc[t] = s * scale;
      m = sc[t] > m ? sc[t] : m;
    }
    for (size_t t = 0; t < n_tok; t++) l += (sc[t] = expf(sc[t] - m));
    for (uint32_t d = 0; d < D; d++) {
      float o = 0;
      for (size_t t = 0; t < n_tok; t++)
        o += sc[t] / l * to_f32(v, sh->dtype, (t * H + kh) * D + d);
      out[h * D + d] = o;
    }
  }
}

/* Put N_BLOCKS blocks into warm under (kc, vc), one of them
 * KVT_CODEC_NONE; check gather, attend and the warm tier's bytes. */
static void run_onesided(uint32_t dtype, int kc, int vc) {
  char *dir = tu_tmpdir();
  kvt_engine *e = open_warm(dir);
  kvt_shape sh = tu_shape_small(dtype);
  kvt_ns_id ns = tu_register(e, "onesided", &sh);
  assert_int_equal(kvt_ns_set_codec(e, ns, KVT_ALL_LAYERS, kc, vc), 0);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  uint32_t tok[N_BLOCKS * 4];
  for (uint32_t i = 0; i < N_BLOCKS * 4; i++) tok[i] = 100 + i * 7;
  for (uint32_t b = 0; b < N_BLOCKS; b++) tu_append_put(s, &sh, 11, tok + b * 4, &kv);

  /* Byte accounting: every layer block warm, exact side at full size. */
  kvt_stats st;
  tu_stats(e, &st);
  uint64_t n_lb = (uint64_t)N_BLOCKS * sh.n_layers;
  assert_int_equal(st.tier_blocks[KVT_TIER_WARM], n_lb);
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT], 0);
  kvt_codec_shape cs = {.n_tokens = sh.block_tokens, .n_heads = sh.n_kv_heads,
                        .head_dim = sh.head_dim};
  size_t raw = kvt_shape_block_bytes(&sh);
  size_t kl = kc ? kvt_codec_size(kc, &cs) : raw, vl = vc ? kvt_codec_size(vc, &cs) : raw;
  assert_true(kl > 0 && vl > 0);
  assert_int_equal(st.tier_bytes[KVT_TIER_WARM],
                   n_lb * (kvt_lblk_desc_bytes() + kvt_mem_round(kl + vl)));

  /* Gather: the exact side bit for bit, the other close. */
  size_t each = N_BLOCKS * kv.bytes, n = 0;
  uint8_t *gk = test_malloc(each), *gv = test_malloc(each);
  kvt_gathered g[N_BLOCKS];
  for (uint32_t l = 0; l < sh.n_layers; l++) {
    size_t cap = each;
    assert_int_equal(kvt_seq_gather(s, l, gk, gv, &cap, g, N_BLOCKS, &n), 0);
    assert_int_equal(n, N_BLOCKS);
    for (uint32_t b = 0; b < N_BLOCKS; b++) {
      assert_int_equal(g[b].tier, KVT_TIER_WARM);
      assert_int_equal(g[b].exact, 0);
      tu_kv_fill(&kv, &sh, 11, l, b, tok + b * 4);
      const uint8_t *exact = kc == KVT_CODEC_NONE ? gk : gv;
      const void *want = kc == KVT_CODEC_NONE ? kv.k : kv.v;
      assert_memory_equal(exact + b * kv.bytes, want, kv.bytes);
      const uint8_t *approx = kc == KVT_CODEC_NONE ? gv : gk;
      const void *orig = kc == KVT_CODEC_NONE ? kv.v : kv.k;
      double err = 0, norm = 0;
      for (size_t i = 0; i < kv.elems; i++) {
        float a = to_f32(approx + b * kv.bytes, dtype, i), o = to_f32(orig, dtype, i);
        err += (a - o) * (a - o);
        norm += o * o;
      }
      assert_true(err > 0);           /* that side really is quantized */
      assert_true(err < 0.2 * norm); /* and close (2-bit values: ~0.12) */
    }
    /* Attention in place equals attention over what gather returned. */
    uint32_t n_q = 2 * sh.n_kv_heads;
    float q[4 * 16], out[4 * 16], ref[4 * 16];
    for (uint32_t i = 0; i < n_q * sh.head_dim; i++)
      q[i] = (float)((i * 37 + l * 11) % 17) / 8.0f - 1.0f;
    assert_int_equal(kvt_seq_attend(s, l, q, n_q, 0, out, NULL, NULL, 0, &n), 0);
    assert_int_equal(n, N_BLOCKS);
    ref_attend(&sh, gk, gv, N_BLOCKS * sh.block_tokens, q, n_q, ref);
    /* gather rounds values to dtype; attention in place stays in f32 */
    float tol = dtype == KVT_BF16 ? 2e-2f : 1e-3f;
    for (uint32_t i = 0; i < n_q * sh.head_dim; i++) {
      if (fabsf(out[i] - ref[i]) > tol + tol * fabsf(ref[i]))
        fprintf(stderr, "dtype %u layer %u out[%u] %g ref %g\n", dtype, l, i, out[i], ref[i]);
      assert_true(fabsf(out[i] - ref[i]) <= tol + tol * fabsf(ref[i]));
    }
  }
  test_free(gk);
  test_free(gv);
  tu_kv_free(&kv);
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

static void test_k8_v_exact(void **state) {
  (void)state;
  run_onesided(KVT_F16, KVT_CODEC_K8, KVT_CODEC_NONE);
  run_onesided(KVT_F32, KVT_CODEC_K4, KVT_CODEC_NONE);
}

static void test_k_exact_v3(void **state) {
  (void)state;
  run_onesided(KVT_F16, KVT_CODEC_NONE, KVT_CODEC_V3);
  run_onesided(KVT_BF16, KVT_CODEC_NONE, KVT_CODEC_V2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_set_codec_rules),
    cmocka_unit_test(test_k8_v_exact),
    cmocka_unit_test(test_k_exact_v3),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
