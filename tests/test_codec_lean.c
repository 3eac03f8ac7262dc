/* test_codec_lean.c - the lean warm codecs (k8b, v2l..v4l; docs/format.md,
 * "Lean warm encodings"): their sizes against a hot block, the u8 log2
 * scales, round-trip error bounds, that any bytes decode to finite values,
 * attention on the codes against the decoded tensors, and in an engine
 * that the policy counts a warm block at exactly its encoded bytes. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"
#include "codec/codec_impl.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Keys and values with the spread of a real model's: per-head magnitudes
 * 0.3 .. 3, a few larger channels. */
static void fill(float *x, size_t n, uint32_t d, uint64_t seed) {
  uint64_t st = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(st >> 11) / 9007199254740992.0 - 0.5;
    double mag = 0.3 + 2.7 * (double)((i / d) % 5) / 4.0;
    x[i] = (float)(u * mag * ((i % d) == 3 ? 4.0 : 1.0));
  }
}

/* Hot bytes (f16 K and V) against lean warm bytes. */
static void test_sizes(void **state) {
  (void)state;
  kvt_codec_shape one = {1, 4, 8, 0, 0}, sixteen = {16, 4, 8, 0, 0}, big = {16, 8, 128, 0, 0};
  size_t hot1 = 2 * 1 * 4 * 8 * 2, hot16 = 2 * 16 * 4 * 8 * 2, hotb = 2 * 16 * 8 * 128 * 2;
  size_t w1 = kvt_codec_size(KVT_CODEC_K8B, &one) + kvt_codec_size(KVT_CODEC_V3L, &one);
  size_t w16 = kvt_codec_size(KVT_CODEC_K8B, &sixteen) + kvt_codec_size(KVT_CODEC_V3L, &sixteen);
  size_t wb = kvt_codec_size(KVT_CODEC_K8B, &big) + kvt_codec_size(KVT_CODEC_V3L, &big);
  assert_int_equal(w1, 1 + 32 + 4 + 12);       /* scale, codes; norms, codes */
  assert_int_equal(w16, 1 + 512 + 64 + 192);
  assert_true((double)w1 / (double)hot1 < 0.39); /* k8v3 with headers: 0.72 */
  assert_true((double)w16 / (double)hot16 < 0.38);
  assert_true((double)wb / (double)hotb < 0.36); /* the ideal: (8 + 3) / 32 = 0.344 */
  /* the old forms, for the record: headers and f16 scales */
  assert_true(kvt_codec_size(KVT_CODEC_K8, &one) + kvt_codec_size(KVT_CODEC_V3, &one) > 2 * w1 - 10);
  assert_string_equal(kvt_codec_name(KVT_CODEC_K8B), "k8b");
  int kc, vc;
  assert_int_equal(kvt_codec_parse("k8bv3l", &kc, &vc), 0);
  assert_int_equal(kc, KVT_CODEC_K8B);
  assert_int_equal(vc, KVT_CODEC_V3L);
  assert_int_equal(kvt_codec_parse("v3lk8b", &kc, &vc), KVT_EOPTION);
}

/* The u8 scale: exact rounding up, nearest in the log domain. */
static void test_scales(void **state) {
  (void)state;
  assert_true(kvt_lean_value(0) == 0.0f);
  assert_true(kvt_lean_value(112) == 1.0f);
  assert_true(kvt_lean_value(120) == 2.0f);
  for (int c = 1; c < 255; c++) assert_true(kvt_lean_value((uint8_t)c) < kvt_lean_value((uint8_t)(c + 1)));
  for (int i = 0; i < 20000; i++) {
    float x = ldexpf(1.0f + (float)i / 20000.0f, i % 30 - 13); /* in the range */
    int c = kvt_lean_code_up(x);
    assert_true(c >= 1 && c <= 255);
    assert_true(kvt_lean_value((uint8_t)c) >= x);
    if (c > 1) assert_true(kvt_lean_value((uint8_t)(c - 1)) < x);
    uint8_t n = kvt_lean_code_near(x);
    float r = kvt_lean_value(n) / x;
    assert_true(r < 1.0444f && r > 1.0f / 1.0444f); /* 2^(1/16) */
  }
  assert_int_equal(kvt_lean_code_up(1e30f), 256);
  assert_int_equal(kvt_lean_code_up(0), 0);
  assert_int_equal(kvt_lean_code_near(0), 0);
}

/* k8b: every key within half a step of the block's scale, and that scale
 * at most 2^(1/8) above absmax / 127. */
static void test_k8b_round_trip(void **state) {
  (void)state;
  const uint32_t shapes[][3] = {{1, 4, 8}, {16, 4, 8}, {4, 2, 12}, {16, 8, 128}};
  for (int lvl = 0; lvl <= kvt_codec_simd(); lvl++) {
    kvt_codec_force(lvl);
    for (size_t i = 0; i < N_OF(shapes); i++) {
      kvt_codec_shape s = {shapes[i][0], shapes[i][1], shapes[i][2], 0, 5};
      size_t n = (size_t)s.n_tokens * s.n_heads * s.head_dim, len = kvt_codec_size(KVT_CODEC_K8B, &s);
      float *x = malloc(n * 4), *y = malloc(n * 4);
      uint8_t *enc = malloc(len);
      fill(x, n, s.head_dim, i + 1);
      assert_int_equal(kvt_codec_encode(KVT_CODEC_K8B, &s, x, KVT_F32, enc, len), (int64_t)len);
      assert_int_equal(kvt_codec_decode(KVT_CODEC_K8B, &s, enc, len, y, KVT_F32), 0);
      float m = 0, err = 0;
      for (size_t j = 0; j < n; j++) {
        m = fmaxf(m, fabsf(x[j]));
        err = fmaxf(err, fabsf(x[j] - y[j]));
      }
      float sc = kvt_lean_value(enc[0]);
      assert_true(sc >= m / 127.0f && sc <= m / 127.0f * 1.0906f);
      assert_true(err <= 0.5f * sc * 1.0001f);
      /* a refused block (NaN) is refused, never half written as valid */
      x[n / 2] = NAN;
      assert_int_equal(kvt_codec_encode(KVT_CODEC_K8B, &s, x, KVT_F32, enc, len), KVT_ENONFINITE);
      free(x);
      free(y);
      free(enc);
    }
  }
  kvt_codec_force(-1);
  /* beyond the scale's range: refused */
  kvt_codec_shape s = {1, 1, 8, 0, 0};
  float big[8] = {1e9f, 0, 0, 0, 0, 0, 0, 0};
  uint8_t enc[64];
  assert_int_equal(kvt_codec_encode(KVT_CODEC_K8B, &s, big, KVT_F32, enc, sizeof enc), KVT_ENONFINITE);
}

/* v2l..v4l decode to v2..v4's vectors times the u8 norm's ratio to the f16
 * one (within 2^(1/16)): the same codes, a coarser norm. */
static void test_vl_matches_v(void **state) {
  (void)state;
  const int lean[] = {KVT_CODEC_V2L, KVT_CODEC_V3L, KVT_CODEC_V4L};
  const int full[] = {KVT_CODEC_V2, KVT_CODEC_V3, KVT_CODEC_V4};
  const uint32_t shapes[][3] = {{1, 4, 8}, {16, 4, 8}, {3, 20, 12}, {16, 8, 128}};
  for (int lvl = 0; lvl <= kvt_codec_simd(); lvl++) {
    kvt_codec_force(lvl);
    for (size_t c = 0; c < N_OF(lean); c++)
      for (size_t i = 0; i < N_OF(shapes); i++) {
        kvt_codec_shape s = {shapes[i][0], shapes[i][1], shapes[i][2], 0, 77};
        size_t nv = (size_t)s.n_tokens * s.n_heads, D = s.head_dim, n = nv * D;
        size_t ll = kvt_codec_size(lean[c], &s), fl = kvt_codec_size(full[c], &s);
        float *x = malloc(n * 4), *yl = malloc(n * 4), *yf = malloc(n * 4);
        uint8_t *el = malloc(ll), *ef = malloc(fl);
        fill(x, n, s.head_dim, 100 + i);
        assert_int_equal(kvt_codec_encode(lean[c], &s, x, KVT_F32, el, ll), (int64_t)ll);
        assert_int_equal(kvt_codec_encode(full[c], &s, x, KVT_F32, ef, fl), (int64_t)fl);
        assert_int_equal(ll + 16, fl - nv); /* no header, 1 byte a norm instead of 2 */
        assert_memory_equal(el + nv, ef + 16 + 2 * nv, ll - nv); /* the same codes */
        assert_int_equal(kvt_codec_decode(lean[c], &s, el, ll, yl, KVT_F32), 0);
        assert_int_equal(kvt_codec_decode(full[c], &s, ef, fl, yf, KVT_F32), 0);
        double e2 = 0, x2 = 0;
        for (size_t v = 0; v < nv; v++) {
          double a = 0, b = 0;
          for (size_t d = 0; d < D; d++) {
            a += (double)yl[v * D + d] * yl[v * D + d];
            b += (double)yf[v * D + d] * yf[v * D + d];
            e2 += ((double)x[v * D + d] - yl[v * D + d]) * ((double)x[v * D + d] - yl[v * D + d]);
            x2 += (double)x[v * D + d] * x[v * D + d];
          }
          if (b > 0) {
            double r = sqrt(a / b);
            assert_true(r < 1.0445 && r > 1.0 / 1.0445);
          }
        }
        /* relative RMS error of the whole tensor: 2-bit ~0.35, 3-bit ~0.2 */
        assert_true(sqrt(e2 / x2) < (c == 0 ? 0.55 : c == 1 ? 0.33 : 0.2));
        free(x);
        free(yl);
        free(yf);
        free(el);
        free(ef);
      }
  }
  kvt_codec_force(-1);
}

/* Any bytes of the right length: k8b checks its codes (-128 is invalid);
 * what passes decodes to finite values, in range, never outside out. */
static void test_garbage_decodes_finite(void **state) {
  (void)state;
  kvt_codec_shape s = {16, 4, 8, 0, 3};
  const int ids[] = {KVT_CODEC_K8B, KVT_CODEC_V2L, KVT_CODEC_V3L, KVT_CODEC_V4L};
  size_t n = 16 * 4 * 8;
  uint16_t *out = malloc(n * 2 + 64);
  uint64_t st = 42;
  for (size_t c = 0; c < N_OF(ids); c++)
    for (int round = 0; round < 200; round++) {
      size_t len = kvt_codec_size(ids[c], &s);
      uint8_t buf[1024];
      assert_true(len <= sizeof buf);
      for (size_t i = 0; i < len; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (uint8_t)(st >> 56);
      }
      if (ids[c] == KVT_CODEC_K8B) {
        buf[1 + round % (len - 1)] = 0x80;
        assert_int_equal(kvt_codec_decode(ids[c], &s, buf, len, out, KVT_F16), KVT_ECORRUPT);
        for (size_t i = 1; i < len; i++)
          if (buf[i] == 0x80) buf[i] = 0x7F;
      }
      assert_int_equal(kvt_codec_decode(ids[c], &s, buf, len - 1, out, KVT_F16), KVT_ECORRUPT);
      memset(out, 0xEE, n * 2 + 64);
      assert_int_equal(kvt_codec_decode(ids[c], &s, buf, len, out, KVT_F16), 0);
      for (size_t i = 0; i < n; i++) assert_true(isfinite(kvt_f16_to_f32(out[i])));
      for (size_t i = n; i < n + 32; i++) assert_int_equal(out[i], 0xEEEE);
    }
  free(out);
}

/* Attention on the codes: k8b's dots and v3l's rotated sums against the
 * same computed on the decoded tensors. */
static void test_attend_on_codes(void **state) {
  (void)state;
  for (int lvl = 0; lvl <= kvt_codec_simd(); lvl++) {
    kvt_codec_force(lvl);
    kvt_codec_shape s = {16, 4, 8, 0, 9};
    const uint32_t T = 16, H = 4, D = 8, vd = kvt_codec_vdim(D), gn = 2;
    size_t n = (size_t)T * H * D;
    float k[16 * 4 * 8], v[16 * 4 * 8], kd[16 * 4 * 8], vdc[16 * 4 * 8];
    uint8_t ke[1024], ve[1024];
    fill(k, n, D, 5);
    fill(v, n, D, 6);
    size_t kl = kvt_codec_size(KVT_CODEC_K8B, &s), vl = kvt_codec_size(KVT_CODEC_V3L, &s);
    assert_int_equal(kvt_codec_encode(KVT_CODEC_K8B, &s, k, KVT_F32, ke, kl), (int64_t)kl);
    assert_int_equal(kvt_codec_encode(KVT_CODEC_V3L, &s, v, KVT_F32, ve, vl), (int64_t)vl);
    assert_int_equal(kvt_codec_decode(KVT_CODEC_K8B, &s, ke, kl, kd, KVT_F32), 0);
    assert_int_equal(kvt_codec_decode(KVT_CODEC_V3L, &s, ve, vl, vdc, KVT_F32), 0);
    float q[2 * 8], sc[2 * 16], p[2 * 16];
    for (uint32_t i = 0; i < gn * D; i++) q[i] = (float)i / 7.0f - 1.0f;
    for (uint32_t h = 0; h < H; h++) {
      kvt_codec_k_dots_n(KVT_CODEC_K8B, &s, ke, h, q, gn, sc, T);
      for (uint32_t j = 0; j < gn; j++)
        for (uint32_t t = 0; t < T; t++) {
          float ref = 0;
          for (uint32_t d = 0; d < D; d++) ref += q[j * D + d] * kd[((size_t)t * H + h) * D + d];
          assert_true(fabsf(sc[j * T + t] - ref) <= 1e-4f * (1 + fabsf(ref)));
          p[j * T + t] = (float)(t + 1 + j) / 40.0f;
        }
      float acc[2 * 8] = {0}, out[8];
      kvt_codec_v_accum_n(KVT_CODEC_V3L, &s, ve, h, p, T, gn, acc);
      for (uint32_t j = 0; j < gn; j++) {
        kvt_codec_v_unrotate(&s, acc + j * vd, out);
        for (uint32_t d = 0; d < D; d++) {
          float ref = 0;
          for (uint32_t t = 0; t < T; t++) ref += p[j * T + t] * vdc[((size_t)t * H + h) * D + d];
          assert_true(fabsf(out[d] - ref) <= 1e-4f * (1 + fabsf(ref)));
        }
      }
    }
  }
  kvt_codec_force(-1);
}

/* In an engine: lean codecs on every layer, a policy with a warm share.
 * Each layer's warm bytes are its warm blocks times the lean encoded size,
 * kept bytes never pass the budget, warm blocks read back not exact and
 * equal to the codec's decoding of what was put. */
static void test_engine_accounting(void **state) {
  (void)state;
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_WARM] = 16u << 20;
  char *dir = tu_tmpdir();
  kvt_engine *e = tu_open(dir, &o);
  kvt_shape sh = tu_shape_small(KVT_F32);
  kvt_ns_id ns = tu_register(e, "lean-model", &sh);
  uint64_t salt = tu_salt("lean-model");
  assert_int_equal(kvt_ns_set_codec(e, ns, KVT_ALL_LAYERS, KVT_CODEC_K8B, KVT_CODEC_V3L), 0);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  enum { NB = 8 };
  uint32_t tok[NB * 8];
  for (size_t i = 0; i < N_OF(tok); i++) tok[i] = (uint32_t)tu_rand();
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  for (uint32_t b = 0; b < NB; b++) tu_append_put(s, &sh, salt, tok + b * sh.block_tokens, &kv);
  float score[NB] = {80, 70, 60, 50, 40, 30, 20, 10};
  for (uint32_t l = 0; l < sh.n_layers; l++) assert_int_equal(kvt_seq_hint(s, l, score, NB), 0);
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(kvt_policy_parse("external", &p.scorer), 0);
  p.budget = 0.4;
  p.warm = 0.6;
  p.margin = 100;
  p.sink_blocks = p.window_blocks = p.delay = 0;
  assert_int_equal(kvt_seq_set_policy(s, &p), 0);
  kvt_codec_shape cs = {sh.block_tokens, sh.n_kv_heads, sh.head_dim, 0, 0};
  uint64_t lean = kvt_codec_size(KVT_CODEC_K8B, &cs) + kvt_codec_size(KVT_CODEC_V3L, &cs);
  uint64_t hot = 2ull * sh.block_tokens * sh.n_kv_heads * sh.head_dim * 2;
  for (uint32_t l = 0; l < sh.n_layers; l++) {
    kvt_policy_info pi;
    assert_int_equal(kvt_seq_policy_info(s, l, &pi), 0);
    uint64_t nw = pi.warm_tokens / sh.block_tokens;
    assert_true(nw >= 2);
    assert_int_equal(pi.warm_bytes, nw * lean);
    assert_int_equal(pi.kept_bytes, pi.warm_bytes + (pi.kept_tokens - pi.warm_tokens) / sh.block_tokens * hot);
    assert_true(pi.kept_bytes <= (uint64_t)(0.4 * NB * hot) + 1);
    /* warm blocks: not exact, the codec's decoding of what was put */
    kvt_gathered g[NB];
    size_t each = kvt_shape_block_bytes(&sh), be = each * NB, ng;
    uint8_t *ko = malloc(be), *vo = malloc(be), *enc = malloc(4096);
    float *dec = malloc(each);
    assert_int_equal(kvt_seq_gather(s, l, ko, vo, &be, g, NB, &ng), 0);
    int seen = 0;
    for (size_t i = 0; i < ng; i++) {
      if (g[i].tier != KVT_TIER_WARM) continue;
      seen++;
      assert_int_equal(g[i].exact, 0);
      tu_kv_fill(&kv, &sh, salt, l, g[i].block, tok + g[i].block * sh.block_tokens);
      size_t kl = kvt_codec_size(KVT_CODEC_K8B, &cs);
      assert_int_equal(kvt_codec_encode(KVT_CODEC_K8B, &cs, kv.k, KVT_F32, enc, kl), (int64_t)kl);
      assert_int_equal(kvt_codec_decode(KVT_CODEC_K8B, &cs, enc, kl, dec, KVT_F32), 0);
      assert_memory_equal(ko + i * each, dec, each);
    }
    assert_int_equal(seen, (int)nw);
    free(ko);
    free(vo);
    free(enc);
    free(dec);
  }
  kvt_seq_release(s);
  tu_kv_free(&kv);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* Scalar and AVX2 kernels write the same bytes, as for the other codecs. */
static void test_simd_same_bytes(void **state) {
  (void)state;
  if (!kvt_codec_simd()) skip();
  const int ids[] = {KVT_CODEC_K8B, KVT_CODEC_V2L, KVT_CODEC_V3L, KVT_CODEC_V4L};
  const uint32_t shapes[][3] = {{1, 4, 8}, {16, 4, 8}, {16, 8, 128}, {2, 3, 96}};
  for (size_t c = 0; c < N_OF(ids); c++)
    for (size_t i = 0; i < N_OF(shapes); i++) {
      kvt_codec_shape s = {shapes[i][0], shapes[i][1], shapes[i][2], 0, 11};
      size_t n = (size_t)s.n_tokens * s.n_heads * s.head_dim, len = kvt_codec_size(ids[c], &s);
      float *x = malloc(n * 4);
      uint8_t *a = malloc(len), *b = malloc(len);
      fill(x, n, s.head_dim, 7 + i);
      kvt_codec_force(0);
      assert_int_equal(kvt_codec_encode(ids[c], &s, x, KVT_F32, a, len), (int64_t)len);
      kvt_codec_force(1);
      assert_int_equal(kvt_codec_encode(ids[c], &s, x, KVT_F32, b, len), (int64_t)len);
      assert_memory_equal(a, b, len);
      free(x);
      free(a);
      free(b);
    }
  kvt_codec_force(-1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_scales),
      cmocka_unit_test(test_k8b_round_trip),
      cmocka_unit_test(test_vl_matches_v),
      cmocka_unit_test(test_garbage_decodes_finite),
      cmocka_unit_test(test_attend_on_codes),
      cmocka_unit_test(test_engine_accounting),
      cmocka_unit_test(test_simd_same_bytes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
