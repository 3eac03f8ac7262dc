/* test_warm_born.c - the warm tier inside the engine, through the public
 * API: blocks born warm, and byte accounting against the codec sizes (also metadata-only).
 * Shared helpers and the fixture: warm_util.h. */
#include "warm_util.h"

/* ------------------------------------------------ born warm */

/* Hot limit 0: every block is encoded straight into warm, once however
 * many sequences reference it; the warm bytes are the encoded sizes
 * (codec sizes rounded to 64 plus the descriptor); a metadata-only engine
 * given the same puts accounts the same. */
static void born_warm_run(uint32_t dtype, uint32_t flags, kvt_stats *out) {
  kvt_shape sh = shape1(dtype, 2);
  fx f;
  fx_open(&f, &sh, 0, 64ull << 20, flags);
  int meta = (flags & KVT_OPEN_METADATA_ONLY) != 0;
  uint32_t a_tok[4 * 4], d_tok[4 * 4];
  for (uint32_t b = 0; b < 4; b++) block_tokens(3, b, 4, a_tok + 4 * b);
  memcpy(d_tok, a_tok, sizeof d_tok);
  block_tokens(4, 2, 4, d_tok + 8); /* d shares 2 blocks, then differs */
  block_tokens(4, 3, 4, d_tok + 12);
  kvt_seq *sa, *sb, *sc, *sd;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &sa), 0);
  assert_int_equal(kvt_seq_create(f.e, f.ns, &sb), 0);
  assert_int_equal(kvt_seq_create(f.e, f.ns, &sd), 0);
  kvt_kv nokv = {.dtype = dtype, .n_tokens = 4, .n_heads = 2, .head_dim = 64};
  for (uint32_t b = 0; b < 4; b++) {
    if (meta) {
      assert_int_equal(kvt_seq_append(sa, a_tok + 4 * b, 4, NULL), 0);
      for (uint32_t l = 0; l < 2; l++) assert_int_equal(kvt_seq_put(sa, b, l, &nokv), 0);
      assert_int_equal(kvt_seq_append(sb, a_tok + 4 * b, 4, NULL), 0);
      assert_int_equal(kvt_seq_append(sd, d_tok + 4 * b, 4, NULL), 0);
      for (uint32_t l = 0; l < 2; l++) assert_int_equal(kvt_seq_put(sd, b, l, &nokv), 0);
    } else {
      append_put(&f, sa, a_tok + 4 * b);
      append_put(&f, sb, a_tok + 4 * b); /* adopted at append; the puts share */
      append_put(&f, sd, d_tok + 4 * b);
    }
  }
  assert_int_equal(kvt_seq_fork(sa, UINT32_MAX, &sc), 0);
  kvt_stats st;
  tu_stats(f.e, &st);
  uint64_t distinct = 2 * (4 + 2); /* a's 4 blocks, d's last 2, both layers */
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT], 0);
  assert_int_equal(st.tier_bytes[KVT_TIER_HOT], 0);
  assert_int_equal(st.tier_blocks[KVT_TIER_WARM], distinct);
  assert_int_equal(st.tier_bytes[KVT_TIER_WARM], distinct * f.c.warm);
  assert_int_equal(st.demotions, 0); /* born warm, not demoted */
  assert_int_equal(st.logical_bytes, (4 * 2 * 4) * 2 * f.c.each); /* 4 seqs x 4 blocks x 2 layers */
  assert_int_equal(st.dedup_saved_bytes, (32 - distinct) * 2 * f.c.each);
  if (!meta) {
    check_total(&st);
    for (uint32_t b = 0; b < 4; b++)
      for (uint32_t l = 0; l < 2; l++) {
        assert_int_equal(read_check(&f, sc, b, l, a_tok + 4 * b, KVT_CODEC_K8, KVT_CODEC_V3),
                         KVT_TIER_WARM);
        assert_int_equal(read_check(&f, sd, b, l, d_tok + 4 * b, KVT_CODEC_K8, KVT_CODEC_V3),
                         KVT_TIER_WARM);
      }
    uint32_t tiers[4];
    size_t n;
    gather_tiers(&f, sb, 1, a_tok, KVT_CODEC_K8, KVT_CODEC_V3, tiers, &n);
    assert_int_equal(n, 4);
    for (uint32_t i = 0; i < 4; i++) assert_int_equal(tiers[i], KVT_TIER_WARM);
    tu_stats(f.e, &st);
    assert_int_equal(st.reads_exact, 0);
    assert_int_equal(st.reads_approx, st.reads);
  } else {
    size_t bytes = f.c.each * 4, n;
    float q[2 * 64] = {0}, o[2 * 64];
    assert_int_equal(kvt_seq_read(sa, 0, 0, f.got.k, f.got.v, f.got.bytes), KVT_ENOPAYLOAD);
    uint8_t *k = malloc(bytes), *v = malloc(bytes);
    assert_int_equal(kvt_seq_gather(sa, 0, k, v, &bytes, NULL, 0, &n), KVT_ENOPAYLOAD);
    free(k);
    free(v);
    assert_int_equal(kvt_seq_attend(sa, 0, q, 2, 0, o, NULL, NULL, 0, &n), KVT_ENOPAYLOAD);
  }
  if (out) *out = st;
  kvt_seq_release(sa);
  kvt_seq_release(sb);
  kvt_seq_release(sc);
  kvt_seq_release(sd);
  tu_stats(f.e, &st);
  assert_int_equal(st.tier_blocks[KVT_TIER_WARM], distinct); /* cached, unreferenced */
  fx_close(&f);
}

static void test_born_warm(void **state) {
  (void)state;
  kvt_stats live, meta;
  born_warm_run(KVT_F16, 0, &live);
  born_warm_run(KVT_F16, KVT_OPEN_METADATA_ONLY, &meta);
  assert_int_equal(live.tier_bytes[KVT_TIER_WARM], meta.tier_bytes[KVT_TIER_WARM]);
  assert_int_equal(live.tier_blocks[KVT_TIER_WARM], meta.tier_blocks[KVT_TIER_WARM]);
  born_warm_run(KVT_F32, 0, NULL);
  born_warm_run(KVT_BF16, 0, NULL);
}

/* A demotion in a metadata-only engine accounts what a live one does:
 * the same puts (some refused), releases and forks give the same tiers. */
static void demote_run(uint32_t flags, kvt_stats *out) {
  kvt_shape sh = shape1(KVT_F32, 2);
  fx f;
  costs c = measure(&sh);
  fx_open(&f, &sh, 5 * c.hot, 7 * c.warm + 10, flags);
  kvt_seq *s, *s2;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &s), 0);
  kvt_kv nokv = {.dtype = KVT_F32, .n_tokens = 4, .n_heads = 2, .head_dim = 64};
  uint32_t tok[4];
  int n_full = 0;
  for (uint32_t b = 0; b < 12; b++) {
    if (b == 6) { /* keep 3 blocks, drop the references to the others */
      assert_int_equal(kvt_seq_fork(s, 3, &s2), 0);
      kvt_seq_release(s);
      s = s2;
    }
    kvt_append_info info;
    block_tokens(9, b, 4, tok);
    assert_int_equal(kvt_seq_append(s, tok, 4, &info), 0);
    for (uint32_t l = 0; l < 2; l++) {
      expect(&f, l, info.block, tok);
      int rc = kvt_seq_put(s, info.block, l, flags ? &nokv : &f.want.kv);
      assert_true(rc == 0 || rc == KVT_EFULL);
      n_full += rc != 0;
    }
  }
  assert_true(n_full > 0);
  tu_stats(f.e, out);
  kvt_seq_release(s);
  fx_close(&f);
}

static void test_metadata_only_same_accounting(void **state) {
  (void)state;
  kvt_stats live, meta;
  demote_run(0, &live);
  demote_run(KVT_OPEN_METADATA_ONLY, &meta);
  for (int t = 0; t < KVT_N_TIERS; t++) {
    assert_int_equal(live.tier_blocks[t], meta.tier_blocks[t]);
    assert_int_equal(live.tier_bytes[t], meta.tier_bytes[t]);
    assert_int_equal(live.evictions[t], meta.evictions[t]);
  }
  assert_int_equal(live.demotions, meta.demotions);
  assert_int_equal(live.put_full, meta.put_full);
  assert_true(live.demotions > 0);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_born_warm),
      cmocka_unit_test(test_metadata_only_same_accounting),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
