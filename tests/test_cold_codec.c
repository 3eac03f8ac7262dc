/* test_cold_codec.c - the cold tier's payloads and loads (split from
 * test_cold.c): both cold codecs round-trip every dtype; loads of many
 * small slices are merged into spans, each status its own and each
 * success exactly its bytes. Both backends; KVT_TEST_FILTER picks tests. */
#include "cold_fx.h"

/* Values from a small set: byte planes that zstd shrinks a lot. */
static void fill_compressible(tu_kv *b, const kvt_shape *s, uint64_t seed, uint32_t layer,
                              uint32_t block) {
  for (size_t i = 0; i < b->elems; i++) {
    uint64_t h = tu_mix(seed ^ tu_mix(((uint64_t)layer << 40) ^ ((uint64_t)block << 20) ^ i));
    float f = (float)((int)(h >> 61) - 4) * 0.125f;
    if (s->dtype == KVT_F32) {
      memcpy((char *)b->k + 4 * i, &f, 4);
      f = -f;
      memcpy((char *)b->v + 4 * i, &f, 4);
    } else {
      uint16_t k = s->dtype == KVT_F16 ? tu_f32_to_f16(f) : tu_f32_to_bf16(f);
      uint16_t v = s->dtype == KVT_F16 ? tu_f32_to_f16(-f) : tu_f32_to_bf16(-f);
      memcpy((char *)b->k + 2 * i, &k, 2);
      memcpy((char *)b->v + 2 * i, &v, 2);
    }
  }
}

/* A writer on f's store with cold_compress = compress. */
static kvt_engine *open_compress(const cold_fx *f, uint32_t compress) {
  kvt_options o;
  fx_opts(f, &o);
  o.cold_compress = compress;
  return tu_open(f->dir, &o);
}

/* A new sequence of the namespace of dtype number d (F32, F16, BF16),
 * and its shape. */
static kvt_seq *dtype_seq(kvt_engine *e, int d, int compressible, kvt_shape *sh) {
  static const uint32_t dt[3] = {KVT_F32, KVT_F16, KVT_BF16};
  *sh = (kvt_shape){.n_layers = 2, .n_kv_heads = 4, .head_dim = 64, .dtype = dt[d], .block_tokens = 16};
  char model[32];
  snprintf(model, sizeof model, "z-%d-%d", d, compressible);
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, tu_register(e, model, sh), &q), 0);
  return q;
}

/* The 16 tokens of block j. */
static void block_tokens(uint64_t seed, uint32_t j, uint32_t tok[16]) {
  for (int t = 0; t < 16; t++) tok[t] = (uint32_t)(seed + j * 16 + (uint32_t)t);
}

/* K and V of layer l of block j in dtype number d. */
static void block_kv(tu_kv *kv, const kvt_shape *sh, uint64_t seed, int d, int compressible,
                     uint32_t l, uint32_t j, const uint32_t *tok) {
  if (compressible) fill_compressible(kv, sh, seed + (uint64_t)d, l, j);
  else tu_kv_fill(kv, sh, seed + (uint64_t)d, l, j, tok);
}

/* Write nb blocks of compressible (or generated) data in every dtype with
 * cold_compress = compress; returns cold_write_bytes. */
static uint64_t write_dtypes(const cold_fx *f, uint32_t compress, uint64_t seed, int compressible,
                             uint32_t nb) {
  kvt_engine *e = open_compress(f, compress);
  for (int d = 0; d < 3; d++) {
    kvt_shape sh;
    kvt_seq *q = dtype_seq(e, d, compressible, &sh);
    tu_kv kv;
    tu_kv_alloc(&kv, &sh);
    for (uint32_t j = 0; j < nb; j++) {
      uint32_t tok[16];
      block_tokens(seed, j, tok);
      assert_int_equal(kvt_seq_append(q, tok, 16, NULL), 0);
      for (uint32_t l = 0; l < sh.n_layers; l++) {
        block_kv(&kv, &sh, seed, d, compressible, l, j, tok);
        assert_int_equal(kvt_seq_put(q, j, l, &kv.kv), 0);
      }
    }
    kvt_seq_release(q);
    tu_kv_free(&kv);
  }
  assert_int_equal(kvt_sync(e), 0);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 3 * nb);
  kvt_engine_close(e);
  return st.cold_write_bytes;
}

/* Read them back with cold_compress = compress (either may read either). */
static void check_dtypes(const cold_fx *f, uint32_t compress, uint64_t seed, int compressible,
                         uint32_t nb) {
  kvt_engine *e = open_compress(f, compress);
  for (int d = 0; d < 3; d++) {
    kvt_shape sh;
    kvt_seq *q = dtype_seq(e, d, compressible, &sh);
    tu_kv want, got;
    tu_kv_alloc(&want, &sh);
    tu_kv_alloc(&got, &sh);
    for (uint32_t j = 0; j < nb; j++) {
      uint32_t tok[16];
      kvt_append_info info;
      block_tokens(seed, j, tok);
      assert_int_equal(kvt_seq_append(q, tok, 16, &info), 0);
      assert_int_equal(info.durable, 1);
      for (uint32_t l = 0; l < sh.n_layers; l++) {
        block_kv(&want, &sh, seed, d, compressible, l, j, tok);
        assert_int_equal(kvt_seq_read(q, j, l, got.k, got.v, got.bytes), 0);
        assert_memory_equal(got.k, want.k, want.bytes);
        assert_memory_equal(got.v, want.v, want.bytes);
      }
    }
    kvt_seq_release(q);
    tu_kv_free(&want);
    tu_kv_free(&got);
  }
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.checked, 3 * nb);
  assert_int_equal(fr.bad, 0);
  kvt_engine_close(e);
}

/* cold_compress 0 and 1 both round-trip every dtype, compressible or not;
 * compression writes fewer bytes when the data compresses. */
static void compress_roundtrip(cold_fx *f) {
  uint64_t seed = f->seed & 0xFFFFFFF;
  const uint32_t nb = 4;
  uint64_t bytes[2][2];
  for (int z = 0; z < 2; z++) {
    for (int c = 0; c < 2; c++) {
      bytes[z][c] = write_dtypes(f, (uint32_t)z, seed, c, nb);
      check_dtypes(f, (uint32_t)z, seed, c, nb);
      check_dtypes(f, (uint32_t)!z, seed, c, nb); /* codec is per slice */
      fx_renew(f); /* each case in a store of its own */
    }
  }
  assert_true(bytes[1][1] < bytes[0][1]);   /* compressible: smaller with zstd */
  assert_true(bytes[1][0] <= bytes[0][0]);  /* never larger */
}
BOTH(compress_roundtrip)

/* Loads of many small slices at once: the reader merges slices that
 * follow each other on disk into one read (spans, across records too).
 * Every layer of 40 blocks in one submit, in disk order, with requests
 * that break a span between them (an unknown key, a block read twice, a
 * layer out of order, a wrong buffer size): each status is its own, each
 * success exactly its bytes; then the same in reverse order; then in disk
 * order with the first read cut short (io/fault.c): the rest is read
 * again, every block still there and exact. */
#define SP_BLK 40
static void span_pass(kvt_engine *e, kvt_ns_id ns, const kvt_shape *shp, uint64_t salt,
                      const kvt_key *keys, const uint32_t *tok, int reversed);

static void span_loads(cold_fx *f) {
  kvt_shape sh = {.n_layers = 4, .n_kv_heads = 2, .head_dim = 16, .dtype = KVT_BF16,
                  .block_tokens = 4}; /* 512-byte slices: one 4 KiB page each */
  uint64_t salt = tu_salt("spans"), data = tu_rand();
  cu_seqspec sp = {0, 0, 0, SP_BLK};
  uint32_t *tok = cu_seq_tokens(data, &sp, SP_BLK, sh.block_tokens);
  kvt_key keys[SP_BLK];
  kvt_engine *e = fx_open(f);
  kvt_ns_id ns = tu_register(e, "spans", &sh);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, ns, &q), 0);
  for (uint32_t j = 0; j < SP_BLK; j++) {
    kvt_append_info info;
    assert_int_equal(cu_append_put(q, &sh, salt, tok + j * sh.block_tokens, &kv, &info), 0);
    keys[j] = info.key;
  }
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(q), SP_BLK);
  kvt_seq_release(q);
  kvt_engine_close(e);

  for (int pass = 0; pass < 3; pass++) {
    kvt_options o;
    fx_opts(f, &o);
    if (pass == 2) /* the reader's first read returns half of what it asked for */
      o.test_fault = (kvt_test_fault){.ops = 1u << 1, .kind = 3 /* short */, .after = 1,
                                      .count = 1, .seed = 1};
    e = tu_open(f->dir, &o); /* nothing in RAM: every load is a cold read */
    ns = tu_register(e, "spans", &sh);
    span_pass(e, ns, &sh, salt, keys, tok, pass == 1);
    kvt_stats st;
    tu_stats(e, &st);
    assert_int_equal(st.cold_records, SP_BLK); /* nothing read left the index */
    kvt_engine_close(e);
  }
  tu_kv_free(&kv);
  free(tok);
}

/* One submit of every layer of every block (reversed: last first), with
 * three requests that break spans between them; checks every status and
 * every byte. */
static void span_pass(kvt_engine *e, kvt_ns_id ns, const kvt_shape *shp, uint64_t salt,
                      const kvt_key *keys, const uint32_t *tok, int reversed) {
  kvt_shape sh = *shp;
  size_t n = (size_t)SP_BLK * sh.n_layers + 4;
  kvt_load_req *r = calloc(n, sizeof *r);
  uint32_t *blk = calloc(n, sizeof *blk);
  int *want = calloc(n, sizeof *want);
  tu_kv *got = calloc(n, sizeof *got), exp;
  assert_non_null(r);
  tu_kv_alloc(&exp, &sh);
  {
    size_t m = 0;
    for (uint32_t i = 0; i < SP_BLK * sh.n_layers; i++) {
      uint32_t x = reversed ? SP_BLK * sh.n_layers - 1 - i : i, j = x / sh.n_layers, l = x % sh.n_layers;
      if (i == 37) { /* an unknown key */
        blk[m] = UINT32_MAX;
        want[m] = KVT_ENOTFOUND;
        r[m++] = (kvt_load_req){.key = {{0xee}}, .layer = 1};
      }
      if (i == 61) { /* block 3 again, layer 2 */
        blk[m] = 3;
        want[m] = 0;
        r[m++] = (kvt_load_req){.key = keys[3], .layer = 2};
      }
      if (i == 90) { /* a wrong buffer size */
        blk[m] = UINT32_MAX;
        want[m] = KVT_EBUFSIZE;
        r[m++] = (kvt_load_req){.key = keys[j], .layer = l, .bytes_each = 1};
      }
      blk[m] = j;
      want[m] = 0;
      r[m++] = (kvt_load_req){.key = keys[j], .layer = l};
    }
    assert_true(m <= n);
    for (size_t i = 0; i < m; i++) {
      if (!got[i].k) tu_kv_alloc(&got[i], &sh);
      memset(got[i].k, 0x5a, got[i].bytes);
      memset(got[i].v, 0xa5, got[i].bytes);
      r[i].k_out = got[i].k;
      r[i].v_out = got[i].v;
      if (r[i].bytes_each == 0) r[i].bytes_each = got[i].bytes;
      r[i].status = 12345;
    }
    kvt_load *ld = NULL;
    assert_int_equal(kvt_load_submit(e, ns, r, m, &ld), 0);
    size_t ok = 0;
    kvt_load_wait(ld, &ok);
    size_t n_ok = 0;
    for (size_t i = 0; i < m; i++) {
      assert_int_equal(r[i].status, want[i]);
      if (want[i]) continue;
      n_ok++;
      assert_int_equal(r[i].tier, KVT_TIER_COLD);
      assert_true(cu_same(&got[i], &exp, &sh, salt, r[i].layer, blk[i],
                          tok + (size_t)blk[i] * sh.block_tokens));
    }
    assert_int_equal(ok, n_ok);
  }
  for (size_t i = 0; i < n; i++)
    if (got[i].k) tu_kv_free(&got[i]);
  tu_kv_free(&exp);
  free(got);
  free(want);
  free(blk);
  free(r);
}
BOTH(span_loads)

int main(void) {
  const struct CMUnitTest tests[] = {
      BOTH_TESTS(compress_roundtrip),
      BOTH_TESTS(span_loads),
  };
  return FX_MAIN(tests);
}
