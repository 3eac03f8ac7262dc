/* test_warm_codecs.c - the warm tier inside the engine, through the public
 * API: codecs per layer (kvt_ns_set_codec) and codec pair names.
 * Shared helpers and the fixture: warm_util.h. */
#include "warm_util.h"

/* ------------------------------------------------ codecs per layer */

static void test_set_codec(void **state) {
  (void)state;
  kvt_shape sh = shape1(KVT_F16, 3);
  fx f;
  fx_open(&f, &sh, 0, 64ull << 20, 0);
  /* errors */
  assert_int_equal(kvt_ns_set_codec(NULL, f.ns, 0, KVT_CODEC_K8, KVT_CODEC_V3), KVT_ENULL);
  const int bad[][2] = {{KVT_CODEC_V3, KVT_CODEC_K8}, {KVT_CODEC_K8, KVT_CODEC_K8},
                        {KVT_CODEC_V2, KVT_CODEC_V3}, {0, 0}, /* one side alone: allowed */
                        {0, KVT_CODEC_K8},            {11, KVT_CODEC_V3},
                        {KVT_CODEC_K8, 11},           {-1, KVT_CODEC_V3}};
  for (size_t i = 0; i < N_OF(bad); i++)
    assert_int_equal(kvt_ns_set_codec(f.e, f.ns, 0, bad[i][0], bad[i][1]), KVT_EOPTION);
  assert_int_equal(kvt_ns_set_codec(f.e, f.ns, 3, KVT_CODEC_K8, KVT_CODEC_V3), KVT_ENOTFOUND);
  assert_int_equal(kvt_ns_set_codec(f.e, f.ns + 1, 0, KVT_CODEC_K8, KVT_CODEC_V3), KVT_ENOTFOUND);
  /* per layer, then all layers */
  const int kc[3] = {KVT_CODEC_K4, KVT_CODEC_K8C, KVT_CODEC_K8};
  const int vc[3] = {KVT_CODEC_V2, KVT_CODEC_V4, KVT_CODEC_V3};
  assert_int_equal(kvt_ns_set_codec(f.e, f.ns, 0, kc[0], vc[0]), 0);
  assert_int_equal(kvt_ns_set_codec(f.e, f.ns, 1, kc[1], vc[1]), 0);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
  uint32_t toks[2 * 4];
  block_tokens(11, 0, 4, toks);
  block_tokens(11, 1, 4, toks + 4);
  assert_int_equal(kvt_seq_append(s, toks, 4, NULL), 0);
  for (uint32_t l = 0; l < 3; l++) {
    kvt_stats a, z;
    tu_stats(f.e, &a);
    expect(&f, l, 0, toks);
    assert_int_equal(kvt_seq_put(s, 0, l, &f.want.kv), 0);
    tu_stats(f.e, &z);
    assert_int_equal(z.tier_bytes[KVT_TIER_WARM] - a.tier_bytes[KVT_TIER_WARM],
                     warm_cost(&f.c, &sh, kc[l], vc[l]));
  }
  assert_int_equal(kvt_ns_set_codec(f.e, f.ns, KVT_ALL_LAYERS, KVT_CODEC_K4, KVT_CODEC_V4), 0);
  assert_int_equal(kvt_seq_append(s, toks + 4, 4, NULL), 0);
  for (uint32_t l = 0; l < 3; l++) {
    kvt_stats a, z;
    tu_stats(f.e, &a);
    expect(&f, l, 1, toks + 4);
    assert_int_equal(kvt_seq_put(s, 1, l, &f.want.kv), 0);
    tu_stats(f.e, &z);
    assert_int_equal(z.tier_bytes[KVT_TIER_WARM] - a.tier_bytes[KVT_TIER_WARM],
                     warm_cost(&f.c, &sh, KVT_CODEC_K4, KVT_CODEC_V4));
  }
  /* blocks keep the codecs they were encoded with */
  for (uint32_t l = 0; l < 3; l++) {
    read_check(&f, s, 0, l, toks, kc[l], vc[l]);
    read_check(&f, s, 1, l, toks + 4, KVT_CODEC_K4, KVT_CODEC_V4);
  }
  kvt_seq_release(s);
  fx_close(&f);

  /* Demotion uses the codecs in force when it happens, not at the put. */
  kvt_shape sh1 = shape1(KVT_F32, 1);
  costs c = measure(&sh1);
  fx_open(&f, &sh1, 2 * c.hot, 64ull << 20, 0);
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
  uint32_t t3[3 * 4];
  for (uint32_t b = 0; b < 3; b++) block_tokens(12, b, 4, t3 + 4 * b);
  append_put(&f, s, t3);
  append_put(&f, s, t3 + 4);
  assert_int_equal(kvt_ns_set_codec(f.e, f.ns, 0, KVT_CODEC_K8C, KVT_CODEC_V2), 0);
  kvt_stats a, z;
  tu_stats(f.e, &a);
  append_put(&f, s, t3 + 8); /* demotes block 0, put before the change */
  tu_stats(f.e, &z);
  assert_int_equal(z.demotions, a.demotions + 1);
  assert_int_equal(z.tier_bytes[KVT_TIER_WARM] - a.tier_bytes[KVT_TIER_WARM],
                   warm_cost(&f.c, &sh1, KVT_CODEC_K8C, KVT_CODEC_V2));
  assert_int_equal(read_check(&f, s, 0, 0, t3, KVT_CODEC_K8C, KVT_CODEC_V2), KVT_TIER_WARM);
  kvt_seq_release(s);
  fx_close(&f);
}

static void test_codec_parse(void **state) {
  (void)state;
  const struct {
    const char *s;
    int k, v;
  } ok[] = {{"k8v3", KVT_CODEC_K8, KVT_CODEC_V3},   {"k8cv3", KVT_CODEC_K8C, KVT_CODEC_V3},
            {"k4v2", KVT_CODEC_K4, KVT_CODEC_V2},   {"k4v4", KVT_CODEC_K4, KVT_CODEC_V4},
            {"k8cv2", KVT_CODEC_K8C, KVT_CODEC_V2}, {"k8v4", KVT_CODEC_K8, KVT_CODEC_V4}};
  for (size_t i = 0; i < N_OF(ok); i++) {
    int k = -5, v = -5;
    assert_int_equal(kvt_codec_parse(ok[i].s, &k, &v), 0);
    assert_int_equal(k, ok[i].k);
    assert_int_equal(v, ok[i].v);
    char name[16];
    snprintf(name, sizeof name, "%s%s", kvt_codec_name(k), kvt_codec_name(v));
    assert_string_equal(name, ok[i].s); /* names round trip */
  }
  const char *bad[] = {"", "k8", "v3", "k8v5", "v3k8", "k8v3x", "K8V3", "k8 v3", "kv3", "k8v",
                       "k9v3", "k8k4", "v2v3", "k8cv", "k8cc v3", "k8v3v3", "x"};
  for (size_t i = 0; i < N_OF(bad); i++) {
    int k = -5, v = -5;
    int rc = kvt_codec_parse(bad[i], &k, &v);
    if (rc != KVT_EOPTION) fail_msg("kvt_codec_parse(\"%s\") = %d, expected KVT_EOPTION", bad[i], rc);
    assert_int_equal(k, -5); /* untouched on failure */
    assert_int_equal(v, -5);
  }
  int k, v;
  assert_int_equal(kvt_codec_parse(NULL, &k, &v), KVT_ENULL);
  assert_int_equal(kvt_codec_parse("k8v3", NULL, &v), KVT_ENULL);
  assert_int_equal(kvt_codec_parse("k8v3", &k, NULL), KVT_ENULL);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_codec_parse),
      cmocka_unit_test(test_set_codec),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
