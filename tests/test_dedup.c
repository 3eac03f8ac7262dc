/* test_dedup.c - one stored copy per distinct layer block: sequences with
 * equal prefixes adopt or re-put blocks without storing anything new; the
 * byte counters say so; lookups, loads and drops see the shared blocks. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fx {
  char *dir;
  kvt_engine *e;
  kvt_shape sh;
  kvt_ns_id ns;
  uint64_t salt;
  uint64_t payload; /* K plus V bytes of one layer block */
  tu_kv kv;
} fx;

static void fx_open(fx *f, uint32_t flags) {
  kvt_options o;
  tu_opts(&o);
  o.flags = flags;
  f->dir = tu_tmpdir();
  f->e = tu_open(f->dir, &o);
  f->sh = tu_shape_small(KVT_F16);
  f->ns = tu_register(f->e, "dedup-model", &f->sh);
  f->salt = tu_salt("dedup-model");
  f->payload = 2 * kvt_shape_block_bytes(&f->sh);
  tu_kv_alloc(&f->kv, &f->sh);
}

static void fx_close(fx *f) {
  tu_kv_free(&f->kv);
  kvt_engine_close(f->e);
  tu_rmtree(f->dir);
}

static kvt_seq *seq_new(fx *f) {
  kvt_seq *s = NULL;
  assert_int_equal(kvt_seq_create(f->e, f->ns, &s), 0);
  return s;
}

static void random_tokens(uint32_t *t, size_t n) {
  for (size_t i = 0; i < n; i++) t[i] = (uint32_t)tu_rand();
}

static void put_layer(fx *f, kvt_seq *s, uint32_t blk, uint32_t layer, const uint32_t *tok) {
  tu_kv_fill(&f->kv, &f->sh, f->salt, layer, blk, tok);
  assert_int_equal(kvt_seq_put(s, blk, layer, &f->kv.kv), 0);
}

static void put_all(fx *f, kvt_seq *s, uint32_t blk, const uint32_t *tok) {
  for (uint32_t l = 0; l < f->sh.n_layers; l++) put_layer(f, s, blk, l, tok);
}

/* Append and put all layers of blocks 0..n of tok. */
static void fill_seq(fx *f, kvt_seq *s, const uint32_t *tok, uint32_t n) {
  for (uint32_t b = kvt_seq_blocks(s); b < n; b++)
    tu_append_put(s, &f->sh, f->salt, tok + 4 * b, &f->kv);
}

/* A second sequence over the same tokens adopts every layer at append. */
static void test_adopt_after_put(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  uint32_t tok[16];
  kvt_seq *a = seq_new(&f), *b = seq_new(&f);
  kvt_stats s0, s1;
  random_tokens(tok, 16);
  fill_seq(&f, a, tok, 3);
  tu_stats(f.e, &s0);
  assert_int_equal(s0.tier_blocks[KVT_TIER_HOT], 3 * f.sh.n_layers);
  assert_int_equal(s0.logical_bytes, 3 * f.sh.n_layers * f.payload);
  assert_int_equal(s0.dedup_saved_bytes, 0);
  for (uint32_t i = 0; i < 3; i++) {
    kvt_append_info ia;
    assert_int_equal(kvt_seq_append(b, tok + 4 * i, 4, &ia), 0);
    assert_int_equal(ia.layers_present, f.sh.n_layers);
    assert_int_equal(ia.block, i);
  }
  tu_stats(f.e, &s1);
  assert_int_equal(s1.tier_bytes[KVT_TIER_HOT], s0.tier_bytes[KVT_TIER_HOT]);
  assert_int_equal(s1.tier_blocks[KVT_TIER_HOT], s0.tier_blocks[KVT_TIER_HOT]);
  assert_int_equal(s1.puts, s0.puts);
  assert_true(s1.dedup_hits > s0.dedup_hits);
  assert_int_equal(s1.logical_bytes, 2 * s0.logical_bytes);
  assert_int_equal(s1.dedup_saved_bytes, s0.logical_bytes);
  tu_assert_gather(b, &f.sh, f.salt, tok, 3);
  fill_seq(&f, b, tok, 4); /* a private block is stored anew */
  tu_stats(f.e, &s1);
  assert_int_equal(s1.tier_blocks[KVT_TIER_HOT], 4 * f.sh.n_layers);
  tu_assert_gather(b, &f.sh, f.salt, tok, 4);
  tu_assert_gather(a, &f.sh, f.salt, tok, 3);
  kvt_seq_release(a);
  kvt_seq_release(b);
  tu_stats(f.e, &s1);
  assert_int_equal(s1.logical_bytes, 0);
  assert_int_equal(s1.dedup_saved_bytes, 0);
  assert_int_equal(s1.seqs, 0);
  fx_close(&f);
}

/* n sequences append one block before anyone puts; each put after the
 * first finds the stored copy. saved = (refs - 1) * payload per block. */
static void test_puts_of_same_data(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  enum { N = 5 };
  uint32_t tok[4];
  kvt_seq *s[N];
  kvt_stats before, after;
  random_tokens(tok, 4);
  for (int i = 0; i < N; i++) {
    s[i] = seq_new(&f);
    assert_int_equal(kvt_seq_append(s[i], tok, 4, NULL), 0);
  }
  for (int i = 0; i < N; i++) {
    for (uint32_t l = 0; l < f.sh.n_layers; l++) {
      tu_stats(f.e, &before);
      put_layer(&f, s[i], 0, l, tok);
      tu_stats(f.e, &after);
      assert_int_equal(after.puts, before.puts + 1);
      assert_int_equal(after.logical_bytes, before.logical_bytes + f.payload);
      if (i == 0) {
        assert_int_equal(after.tier_blocks[KVT_TIER_HOT], before.tier_blocks[KVT_TIER_HOT] + 1);
        assert_int_equal(after.dedup_hits, before.dedup_hits);
        continue;
      }
      assert_int_equal(after.tier_bytes[KVT_TIER_HOT], before.tier_bytes[KVT_TIER_HOT]);
      assert_int_equal(after.tier_blocks[KVT_TIER_HOT], before.tier_blocks[KVT_TIER_HOT]);
      assert_int_equal(after.dedup_hits, before.dedup_hits + 1);
      assert_int_equal(after.dedup_saved_bytes, before.dedup_saved_bytes + f.payload);
    }
    tu_stats(f.e, &after);
    assert_int_equal(after.dedup_saved_bytes, (uint64_t)i * f.sh.n_layers * f.payload);
  }
  for (int i = 0; i < N; i++) tu_assert_gather(s[i], &f.sh, f.salt, tok, 1);
  for (int i = 0; i < N; i++) {
    kvt_seq_release(s[i]);
    tu_stats(f.e, &after);
    uint64_t refs = N - 1 - (uint64_t)i;
    assert_int_equal(after.logical_bytes, refs * f.sh.n_layers * f.payload);
    assert_int_equal(after.dedup_saved_bytes, (refs ? refs - 1 : 0) * f.sh.n_layers * f.payload);
  }
  fx_close(&f);
}

/* Put a perturbed copy of (block 0, layer) through s: returns 0 and keeps
 * the stored copy. */
static void put_different(fx *f, kvt_seq *s, uint32_t layer, const uint32_t *tok) {
  tu_kv_fill(&f->kv, &f->sh, f->salt, layer, 0, tok);
  ((uint8_t *)f->kv.v)[tu_below((uint32_t)f->kv.bytes / 2) * 2] ^= 0x01; /* one mantissa bit */
  assert_int_equal(kvt_seq_put(s, 0, layer, &f->kv.kv), 0);
}

static void test_verify_dedup(void **state) {
  (void)state;
  for (int verify = 0; verify < 2; verify++) {
    fx f;
    fx_open(&f, verify ? KVT_OPEN_VERIFY_DEDUP : 0);
    uint32_t tok[4];
    kvt_seq *a = seq_new(&f), *b = seq_new(&f), *c;
    kvt_stats st;
    random_tokens(tok, 4);
    assert_int_equal(kvt_seq_append(a, tok, 4, NULL), 0);
    assert_int_equal(kvt_seq_append(b, tok, 4, NULL), 0);
    put_all(&f, a, 0, tok);
    put_layer(&f, b, 0, 0, tok); /* same content: no mismatch */
    put_different(&f, b, 1, tok);
    tu_stats(f.e, &st);
    assert_int_equal(st.dedup_mismatches, verify ? 1 : 0);
    c = seq_new(&f); /* adopted at append, then re-put with other bytes */
    assert_int_equal(kvt_seq_append(c, tok, 4, NULL), 0);
    put_different(&f, c, 2, tok);
    tu_stats(f.e, &st);
    assert_int_equal(st.dedup_mismatches, verify ? 2 : 0);
    assert_int_equal(st.tier_blocks[KVT_TIER_HOT], f.sh.n_layers);
    for (uint32_t l = 0; l < f.sh.n_layers; l++) {
      if (l < 2) tu_assert_block(b, &f.sh, f.salt, 0, l, tok); /* b put layers 0, 1 */
      tu_assert_block(c, &f.sh, f.salt, 0, l, tok);
    }
    kvt_seq_release(a);
    kvt_seq_release(b);
    kvt_seq_release(c);
    fx_close(&f);
  }
}

/* Lookup counts leading blocks stored in every layer. */
static void test_lookup(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  uint32_t tok[22], other[16];
  kvt_key keys[5];
  kvt_lookup_entry out[6];
  size_t n, nk;
  kvt_seq *a = seq_new(&f), *c = seq_new(&f);
  kvt_stats s0, s1;
  random_tokens(tok, 22);
  fill_seq(&f, a, tok, 3);
  /* block 3 appended by c with only layer 0 put: not a full hit */
  for (uint32_t i = 0; i < 4; i++) assert_int_equal(kvt_seq_append(c, tok + 4 * i, 4, NULL), 0);
  put_layer(&f, c, 3, 0, tok + 12);
  assert_int_equal(kvt_keys(f.e, f.ns, tok, 22, keys, 5, &nk), 0);
  memset(out, 0x77, sizeof out);
  tu_stats(f.e, &s0);
  assert_int_equal(kvt_lookup(f.e, f.ns, tok, 22, out, 6, &n), 0);
  tu_stats(f.e, &s1);
  assert_int_equal(n, 3);
  for (size_t i = 0; i < 3; i++) {
    assert_memory_equal(&out[i].key, &keys[i], sizeof(kvt_key));
    assert_int_equal(out[i].tier, KVT_TIER_HOT);
    assert_true(out[i].est_load_us > 0);
  }
  assert_int_equal(s1.lookups, s0.lookups + 1);
  assert_int_equal(s1.lookup_blocks_hit, s0.lookup_blocks_hit + 3);
  assert_int_equal(s1.lookup_blocks_miss, s0.lookup_blocks_miss + 2); /* 5 full blocks asked */
  memset(out, 0x77, sizeof out);
  assert_int_equal(kvt_lookup(f.e, f.ns, tok, 22, out, 1, &n), 0);
  assert_int_equal(n, 3); /* may exceed max_out */
  assert_memory_equal(&out[0].key, &keys[0], sizeof(kvt_key));
  assert_int_equal(out[1].tier, 0x77777777u); /* nothing past max_out */
  assert_int_equal(kvt_lookup(f.e, f.ns, tok, 3, NULL, 0, &n), 0);
  assert_int_equal(n, 0);
  memcpy(other, tok, sizeof other);
  other[9] ^= 1; /* diverges in block 2 */
  assert_int_equal(kvt_lookup(f.e, f.ns, other, 16, NULL, 0, &n), 0);
  assert_int_equal(n, 2);
  other[0] ^= 1;
  assert_int_equal(kvt_lookup(f.e, f.ns, other, 16, NULL, 0, &n), 0);
  assert_int_equal(n, 0);
  put_layer(&f, c, 3, 1, tok + 12);
  put_layer(&f, c, 3, 2, tok + 12);
  put_layer(&f, c, 3, 3, tok + 12);
  assert_int_equal(kvt_lookup(f.e, f.ns, tok, 22, NULL, 0, &n), 0);
  assert_int_equal(n, 4);
  kvt_seq_release(a);
  kvt_seq_release(c);
  assert_int_equal(kvt_lookup(f.e, f.ns, tok, 22, NULL, 0, &n), 0);
  assert_int_equal(n, 4); /* released blocks stay cached while space allows */
  fx_close(&f);
}

/* Sequences that share p blocks then diverge share exactly those blocks. */
static void test_divergence(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  uint32_t ta[20], tb[20];
  uint32_t p = 1 + tu_below(4);
  kvt_seq *a = seq_new(&f), *b = seq_new(&f);
  kvt_stats st;
  random_tokens(ta, 20);
  memcpy(tb, ta, sizeof tb);
  tb[4 * p + tu_below(4)] += 1;
  fill_seq(&f, a, ta, 5);
  for (uint32_t i = 0; i < 5; i++) {
    kvt_append_info ia;
    assert_int_equal(kvt_seq_append(b, tb + 4 * i, 4, &ia), 0);
    assert_int_equal(ia.layers_present, i < p ? f.sh.n_layers : 0);
    if (i >= p) put_all(&f, b, i, tb + 4 * i);
  }
  tu_stats(f.e, &st);
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT], (5 + 5 - p) * f.sh.n_layers);
  assert_int_equal(st.dedup_saved_bytes, (uint64_t)p * f.sh.n_layers * f.payload);
  tu_assert_gather(a, &f.sh, f.salt, ta, 5);
  tu_assert_gather(b, &f.sh, f.salt, tb, 5);
  kvt_seq_release(a);
  kvt_seq_release(b);
  fx_close(&f);
}

/* Loads copy stored layer blocks and report each failing request. */
static void test_load(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  enum { NR = 7 };
  uint32_t tok[12];
  kvt_key keys[3], bogus;
  size_t nk, ok = 99, bb = f.kv.bytes;
  kvt_seq *a = seq_new(&f);
  kvt_load_req req[NR];
  kvt_load *ld = NULL;
  uint8_t *buf = calloc(2 * NR, bb + 1);
  kvt_stats s0, s1;
  random_tokens(tok, 12);
  fill_seq(&f, a, tok, 3);
  assert_int_equal(kvt_keys(f.e, f.ns, tok, 12, keys, 3, &nk), 0);
  kvt_seq_release(a); /* cached blocks load as well as referenced ones */
  memset(&bogus, 0x42, sizeof bogus);
  for (int i = 0; i < NR; i++)
    req[i] = (kvt_load_req){.key = keys[i % 3], .layer = (uint32_t)i % 4,
                            .k_out = buf + 2 * i * (bb + 1), .v_out = buf + (2 * i + 1) * (bb + 1),
                            .bytes_each = bb, .status = 12345, .tier = 99};
  req[3].key = bogus;
  req[4].layer = f.sh.n_layers;
  req[5].bytes_each = bb + 1;
  req[6].v_out = NULL;
  tu_stats(f.e, &s0);
  assert_int_equal(kvt_load_submit(f.e, f.ns, req, NR, &ld), 0);
  assert_int_equal(kvt_ns_drop(f.e, f.ns), KVT_EBUSY); /* a load is pending */
  assert_int_equal(kvt_load_wait(ld, &ok), KVT_ENOTFOUND); /* the first failure */
  tu_stats(f.e, &s1);
  assert_int_equal(ok, 3);
  assert_int_equal(req[3].status, KVT_ENOTFOUND);
  assert_int_equal(req[4].status, KVT_ENOTFOUND);
  assert_int_equal(req[5].status, KVT_EBUFSIZE);
  assert_int_equal(req[6].status, KVT_ENULL);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(req[i].status, 0);
    assert_int_equal(req[i].tier, KVT_TIER_HOT);
    tu_kv_fill(&f.kv, &f.sh, f.salt, req[i].layer, (uint32_t)i, tok + 4 * i);
    assert_memory_equal(req[i].k_out, f.kv.k, bb);
    assert_memory_equal(req[i].v_out, f.kv.v, bb);
  }
  assert_int_equal(s1.reads, s0.reads + 3);
  assert_int_equal(s1.reads_exact, s0.reads_exact + 3);
  assert_int_equal(kvt_ns_drop(f.e, f.ns), 0);
  free(buf);
  fx_close(&f);
}

/* Dropping a one-block prefix drops it and every block extending it, but
 * not from the sequences that hold them. */
static void test_drop_prefix(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  uint32_t ta[12], tb[12], tc[8];
  kvt_seq *a = seq_new(&f), *b = seq_new(&f), *c = seq_new(&f), *d;
  uint64_t dropped = 0;
  size_t n;
  kvt_append_info info;
  kvt_stats st;
  random_tokens(ta, 12);
  random_tokens(tc, 8);
  memcpy(tb, ta, sizeof tb);
  tb[8] ^= 1;
  fill_seq(&f, a, ta, 3);
  fill_seq(&f, b, tb, 3);
  fill_seq(&f, c, tc, 2);
  assert_int_equal(kvt_drop_prefix(f.e, f.ns, ta, 6, &dropped), 0); /* one full block */
  assert_int_equal(dropped, 4);                                     /* a0 a1 a2 b2 */
  assert_int_equal(kvt_lookup(f.e, f.ns, ta, 12, NULL, 0, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(kvt_lookup(f.e, f.ns, tb, 12, NULL, 0, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(kvt_lookup(f.e, f.ns, tc, 8, NULL, 0, &n), 0);
  assert_int_equal(n, 2);
  tu_assert_gather(a, &f.sh, f.salt, ta, 3);
  tu_assert_gather(b, &f.sh, f.salt, tb, 3);
  d = seq_new(&f); /* dedup no longer finds the dropped blocks */
  assert_int_equal(kvt_seq_append(d, ta, 4, &info), 0);
  assert_int_equal(info.layers_present, 0);
  kvt_seq_release(a);
  kvt_seq_release(b);
  tu_stats(f.e, &st); /* dropped and unreferenced: freed, not cached */
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT], 2 * f.sh.n_layers);
  put_all(&f, d, 0, ta);
  tu_assert_gather(d, &f.sh, f.salt, ta, 1);
  assert_int_equal(kvt_lookup(f.e, f.ns, ta, 12, NULL, 0, &n), 0);
  assert_int_equal(n, 1);
  kvt_seq_release(c);
  kvt_seq_release(d);
  fx_close(&f);
}

/* Dropping a two-block prefix drops at least its last block and all that
 * extends it; an unrelated prefix is untouched. */
static void test_drop_longer_prefix(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  uint32_t ta[12], tb[12], tc[8];
  kvt_seq *s = seq_new(&f);
  uint64_t dropped = 0;
  size_t n;
  random_tokens(ta, 12);
  random_tokens(tc, 8);
  memcpy(tb, ta, sizeof tb);
  tb[8] ^= 1;
  fill_seq(&f, s, ta, 3);
  kvt_seq_release(s);
  s = seq_new(&f);
  fill_seq(&f, s, tb, 3);
  kvt_seq_release(s);
  s = seq_new(&f);
  fill_seq(&f, s, tc, 2);
  kvt_seq_release(s);
  assert_int_equal(kvt_drop_prefix(f.e, f.ns, ta, 8, &dropped), 0);
  assert_true(dropped >= 3 && dropped <= 4);
  assert_int_equal(kvt_lookup(f.e, f.ns, ta, 12, NULL, 0, &n), 0);
  assert_true(n <= 1);
  assert_int_equal(kvt_lookup(f.e, f.ns, tb, 12, NULL, 0, &n), 0);
  assert_true(n <= 1);
  assert_int_equal(kvt_lookup(f.e, f.ns, tc, 8, NULL, 0, &n), 0);
  assert_int_equal(n, 2);
  fx_close(&f);
}

/* Dropping a namespace waits for its sequences, then frees all it stored;
 * another namespace keeps its blocks. */
static void test_ns_drop(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  uint32_t tok[8];
  kvt_ns_id other = tu_register(f.e, "dedup-other", &f.sh);
  kvt_seq *a = seq_new(&f), *o;
  kvt_shape got;
  kvt_stats st;
  size_t n;
  random_tokens(tok, 8);
  fill_seq(&f, a, tok, 2);
  assert_int_equal(kvt_seq_create(f.e, other, &o), 0);
  tu_append_put(o, &f.sh, tu_salt("dedup-other"), tok, &f.kv);
  assert_int_equal(kvt_ns_drop(f.e, f.ns), KVT_EBUSY);
  tu_assert_gather(a, &f.sh, f.salt, tok, 2);
  kvt_seq_release(a);
  assert_int_equal(kvt_ns_drop(f.e, f.ns), 0);
  tu_stats(f.e, &st);
  assert_int_equal(st.namespaces, 1);
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT], f.sh.n_layers);
  assert_int_equal(kvt_ns_shape(f.e, f.ns, &got), KVT_ENOTFOUND);
  assert_int_equal(kvt_lookup(f.e, f.ns, tok, 8, NULL, 0, &n), KVT_ENOTFOUND);
  assert_int_equal(kvt_ns_drop(f.e, f.ns), KVT_ENOTFOUND);
  f.ns = tu_register(f.e, "dedup-model", &f.sh); /* back, but empty */
  assert_int_equal(kvt_lookup(f.e, f.ns, tok, 8, NULL, 0, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(kvt_lookup(f.e, other, tok, 8, NULL, 0, &n), 0);
  assert_int_equal(n, 1);
  tu_assert_gather(o, &f.sh, tu_salt("dedup-other"), tok, 1);
  kvt_seq_release(o);
  fx_close(&f);
}

/* Many sequences over random mixes of shared and private blocks: the tier
 * holds each distinct layer block once and the byte counters agree. */
static void test_many_sequences(void **state) {
  (void)state;
  fx f;
  fx_open(&f, KVT_OPEN_VERIFY_DEDUP);
  enum { NS = 8, NB = 6 };
  uint32_t common[4 * NB], tok[NS][4 * NB];
  kvt_key keys[NS][NB];
  kvt_seq *s[NS];
  uint64_t held = 0, distinct = 0;
  kvt_stats st;
  random_tokens(common, 4 * NB);
  for (int i = 0; i < NS; i++) {
    uint32_t shared = tu_below(NB + 1), nb = 1 + tu_below(NB);
    memcpy(tok[i], common, sizeof common);
    random_tokens(tok[i] + 4 * shared, 4 * (NB - shared));
    s[i] = seq_new(&f);
    fill_seq(&f, s[i], tok[i], nb);
    size_t nk;
    assert_int_equal(kvt_keys(f.e, f.ns, tok[i], 4 * nb, keys[i], NB, &nk), 0);
    held += nb;
    for (uint32_t b = 0; b < nb; b++) { /* count keys not seen before */
      int seen = 0;
      for (int j = 0; j <= i && !seen; j++)
        for (uint32_t c = 0; c < (j < i ? kvt_seq_blocks(s[j]) : b) && !seen; c++)
          seen = !memcmp(&keys[j][c], &keys[i][b], sizeof(kvt_key));
      distinct += !seen;
    }
  }
  tu_stats(f.e, &st);
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT], distinct * f.sh.n_layers);
  assert_int_equal(st.logical_bytes, held * f.sh.n_layers * f.payload);
  assert_int_equal(st.dedup_saved_bytes, (held - distinct) * f.sh.n_layers * f.payload);
  assert_int_equal(st.dedup_mismatches, 0);
  for (int i = 0; i < NS; i++) {
    tu_assert_gather(s[i], &f.sh, f.salt, tok[i], kvt_seq_blocks(s[i]));
    kvt_seq_release(s[i]);
  }
  fx_close(&f);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adopt_after_put),
      cmocka_unit_test(test_puts_of_same_data),
      cmocka_unit_test(test_verify_dedup),
      cmocka_unit_test(test_lookup),
      cmocka_unit_test(test_divergence),
      cmocka_unit_test(test_load),
      cmocka_unit_test(test_drop_prefix),
      cmocka_unit_test(test_drop_longer_prefix),
      cmocka_unit_test(test_ns_drop),
      cmocka_unit_test(test_many_sequences),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
