/* test_cold_fsck.c - damaged records of the cold tier (split from
 * test_cold.c): fsck finds a flipped byte and repair turns the entry into
 * a miss; a corrupted slice read through the API is a miss, never other
 * bytes. Both backends; KVT_TEST_FILTER (a cmocka pattern) picks tests. */
#include "cold_fx.h"

/* fsck reports. */
typedef struct fsck_log {
  kvt_key keys[64];
  size_t n;
} fsck_log;

static void fsck_report(void *arg, const kvt_key *key, const char *what) {
  fsck_log *lg = arg;
  assert_non_null(what);
  assert_true(what[0] != 0);
  if (lg->n < 64) lg->keys[lg->n++] = *key;
}

/* Which workload block (first listed) has this key; -1 when none. */
static int block_of(const wl_block *b, size_t n, const kvt_key *key) {
  for (size_t i = 0; i < n; i++)
    if (cu_key_eq(&b[i].key, key)) return (int)i;
  return -1;
}

/* Flip one random checksummed byte of layer `layer` of record r (its
 * stored payload), or of the record header when layer is -1. */
static void corrupt(const cu_rec *r, int layer) {
  uint64_t at;
  if (layer < 0) {
    /* the fixed part (magic .. bytes_each) and the slice table */
    at = r->off + tu_below(KVT_REC_FIXED + KVT_REC_SLICE * r->n_layers);
  } else {
    at = r->off + r->slice_off[layer] + tu_below(r->slice_bytes[layer]);
  }
  assert_int_equal(cu_flip(r->path, at, (uint8_t)(1u << tu_below(8))), 0);
}

/* Write the workload, close, and return the records found on disk. */
static size_t written_store(cold_fx *f, cu_rec **recs) {
  fx_close(f, fx_write(f));
  size_t n = cu_records(f->dir, recs);
  assert_int_equal(n, WL_DISTINCT);
  return n;
}

/* For every workload spec, the lookup stops before the first of its
 * blocks whose key is in gone[0..n_gone); every other block is found. */
static void assert_lookups_stop_at(kvt_engine *e, const kvt_ns_id *ids, uint64_t seed,
                                   const wl_block *blocks, size_t nb, const kvt_key *gone,
                                   size_t n_gone) {
  wl_ns w[WL_N_NS];
  wl_get(w);
  for (uint32_t i = 0; i < WL_N_NS; i++) {
    for (uint32_t s = 0; s < w[i].n_specs; s++) {
      const cu_seqspec *sp = &w[i].specs[s];
      uint32_t want = sp->n_blocks;
      for (size_t k = 0; k < nb; k++)
        for (size_t g = 0; g < n_gone; g++)
          if (blocks[k].ns == i && blocks[k].spec == s && cu_key_eq(&blocks[k].key, &gone[g]) &&
              blocks[k].block < want)
            want = blocks[k].block;
      uint32_t bt = w[i].sh.block_tokens, *tok = cu_seq_tokens(seed, sp, sp->n_blocks, bt);
      size_t found = 99;
      assert_int_equal(kvt_lookup(e, ids[i], tok, (size_t)sp->n_blocks * bt, NULL, 0, &found), 0);
      assert_int_equal(found, want);
      free(tok);
    }
  }
}

/* Load every layer of a block that must be gone: each is KVT_ENOTFOUND. */
static void assert_block_gone(kvt_engine *e, const kvt_ns_id *ids, uint64_t seed,
                              const wl_block *b) {
  wl_ns w[WL_N_NS];
  wl_get(w);
  const kvt_shape *sh = &w[b->ns].sh;
  uint32_t tok[64], n_exact, n_wrong;
  int status[16];
  cu_tokens(seed, &w[b->ns].specs[b->spec], b->block, sh->block_tokens, tok);
  assert_int_equal(cu_load_block(e, ids[b->ns], sh, tu_salt(w[b->ns].model), &b->key, b->block, tok,
                                 status, NULL, &n_exact, &n_wrong),
                   KVT_ENOTFOUND);
  assert_int_equal(n_exact + n_wrong, 0);
  for (uint32_t l = 0; l < sh->n_layers; l++) assert_int_equal(status[l], KVT_ENOTFOUND);
}

/* A flipped byte in a slice, or in a record header: fsck names the block,
 * changes nothing without repair, and with repair removes the entry for
 * good, so the block is a miss, never other bytes. */
static void fsck_finds_and_repairs(cold_fx *f) {
  for (int where = 0; where < 2; where++) { /* 0: a slice, 1: the record header */
    cu_rec *recs;
    size_t nr = written_store(f, &recs);
    /* A clean store is clean. */
    kvt_engine *e = fx_open(f);
    kvt_fsck_result fr;
    assert_int_equal(kvt_fsck(e, 1, &fr, NULL, NULL), 0);
    assert_int_equal(fr.checked, WL_DISTINCT);
    assert_int_equal(fr.bad, 0);
    assert_int_equal(fr.removed, 0);
    kvt_engine_close(e);

    const cu_rec *r = &recs[tu_below((uint32_t)nr)];
    int layer = where == 0 ? (int)tu_below(r->n_layers) : -1;
    corrupt(r, layer);
    kvt_ns_id ids[WL_N_NS];
    e = fx_reopen(f, ids);
    wl_block blocks[32];
    size_t nb = wl_blocks(e, ids, f->seed, blocks, 32);
    int bi = block_of(blocks, nb, &r->key);
    assert_true(bi >= 0);
    for (int pass = 0; pass < 2; pass++) { /* without repair: twice the same */
      fsck_log lg = {.n = 0};
      assert_int_equal(kvt_fsck(e, 0, &fr, fsck_report, &lg), 0);
      assert_int_equal(fr.checked, WL_DISTINCT);
      assert_int_equal(fr.bad, 1);
      assert_int_equal(fr.removed, 0);
      assert_int_equal(lg.n, 1);
      assert_true(cu_key_eq(&lg.keys[0], &r->key));
    }
    kvt_stats st;
    tu_stats(e, &st);
    assert_int_equal(st.cold_records, WL_DISTINCT);
    if (where == 1) { /* reads check slices: they still give exact bytes or a miss */
      wl_ns w[WL_N_NS];
      wl_get(w);
      const wl_block *b = &blocks[bi];
      uint32_t tok[64], n_exact, n_wrong;
      cu_tokens(f->seed, &w[b->ns].specs[b->spec], b->block, w[b->ns].sh.block_tokens, tok);
      cu_load_block(e, ids[b->ns], &w[b->ns].sh, tu_salt(w[b->ns].model), &b->key, b->block, tok,
                    NULL, NULL, &n_exact, &n_wrong);
      assert_int_equal(n_wrong, 0);
    }
    fsck_log lg = {.n = 0};
    assert_int_equal(kvt_fsck(e, 1, &fr, fsck_report, &lg), 0);
    assert_int_equal(fr.bad, 1);
    assert_int_equal(fr.removed, 1);
    assert_true(lg.n == 1 && cu_key_eq(&lg.keys[0], &r->key));
    fx_assert_clean(e, WL_DISTINCT - 1);
    assert_block_gone(e, ids, f->seed, &blocks[bi]);
    assert_lookups_stop_at(e, ids, f->seed, blocks, nb, &r->key, 1);
    kvt_engine_close(e);

    e = fx_reopen(f, ids); /* the repair was durable */
    fx_assert_clean(e, WL_DISTINCT - 1);
    assert_block_gone(e, ids, f->seed, &blocks[bi]);
    assert_lookups_stop_at(e, ids, f->seed, blocks, nb, &r->key, 1);
    kvt_engine_close(e);
    free(recs);
    fx_renew(f); /* the other case in a store of its own */
  }
}
BOTH(fsck_finds_and_repairs)

/* A corrupted slice read through kvt_seq_read and through a load is
 * KVT_ECORRUPT for that read, counted in cold_checksum_failures, and its
 * entry leaves the index (for good): every later read is a miss
 * (KVT_ENOTFOUND) and lookups stop before it. */
static void corrupt_read_is_miss(cold_fx *f) {
  cu_rec *recs;
  size_t nr = written_store(f, &recs);
  uint32_t r1 = tu_below((uint32_t)nr), r2 = (r1 + 1 + tu_below((uint32_t)nr - 1)) % (uint32_t)nr;
  int l1 = (int)tu_below(recs[r1].n_layers), l2 = (int)tu_below(recs[r2].n_layers);
  corrupt(&recs[r1], l1);

  kvt_ns_id ids[WL_N_NS];
  kvt_engine *e = fx_reopen(f, ids);
  wl_block blocks[32];
  size_t nb = wl_blocks(e, ids, f->seed, blocks, 32);
  wl_ns w[WL_N_NS];
  wl_get(w);

  /* r1 through kvt_seq_read on a sequence that reaches it. */
  const wl_block *b1 = &blocks[block_of(blocks, nb, &recs[r1].key)];
  const kvt_shape *sh = &w[b1->ns].sh;
  uint64_t salt = tu_salt(w[b1->ns].model);
  const cu_seqspec *sp = &w[b1->ns].specs[b1->spec];
  uint32_t *tok = cu_seq_tokens(f->seed, sp, b1->block + 1, sh->block_tokens);
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, ids[b1->ns], &q), 0);
  for (uint32_t j = 0; j <= b1->block; j++) {
    kvt_append_info info;
    assert_int_equal(kvt_seq_append(q, tok + (size_t)j * sh->block_tokens, sh->block_tokens, &info), 0);
    assert_int_equal(info.durable, 1);
  }
  assert_int_equal(kvt_seq_durable(q), b1->block + 1);
  const uint32_t *t1 = tok + (size_t)b1->block * sh->block_tokens;
  int exact;
  for (uint32_t l = 0; l < (uint32_t)l1; l++) { /* the layers before are fine */
    assert_int_equal(cu_read(q, sh, salt, b1->block, l, t1, &exact), 0);
    assert_true(exact);
  }
  assert_int_equal(cu_read(q, sh, salt, b1->block, (uint32_t)l1, t1, &exact), KVT_ECORRUPT);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_checksum_failures, 1);
  assert_int_equal(st.cold_records, WL_DISTINCT - 1);
  assert_int_equal(kvt_seq_durable(q), b1->block); /* no longer durable */
  for (uint32_t l = 0; l < sh->n_layers; l++) /* the entry is gone: every layer misses */
    assert_int_equal(cu_read(q, sh, salt, b1->block, l, t1, &exact), KVT_ENOTFOUND);
  for (uint32_t j = 0; j < b1->block; j++) /* blocks before it are untouched */
    for (uint32_t l = 0; l < sh->n_layers; l++) {
      assert_int_equal(cu_read(q, sh, salt, j, l, tok + (size_t)j * sh->block_tokens, &exact), 0);
      assert_true(exact);
    }
  kvt_seq_release(q);
  free(tok);
  assert_lookups_stop_at(e, ids, f->seed, blocks, nb, &recs[r1].key, 1);

  /* r2, corrupted while the store is open, through kvt_load_submit/wait. */
  corrupt(&recs[r2], l2);
  const wl_block *b2 = &blocks[block_of(blocks, nb, &recs[r2].key)];
  sh = &w[b2->ns].sh;
  uint32_t t2[64], n_exact, n_wrong;
  int status[16];
  cu_tokens(f->seed, &w[b2->ns].specs[b2->spec], b2->block, sh->block_tokens, t2);
  assert_int_equal(cu_load_block(e, ids[b2->ns], sh, tu_salt(w[b2->ns].model), &b2->key, b2->block,
                                 t2, status, NULL, &n_exact, &n_wrong),
                   KVT_ECORRUPT);
  assert_int_equal(n_wrong, 0);
  assert_int_equal(status[l2], KVT_ECORRUPT);
  for (int l = 0; l < l2; l++) assert_int_equal(status[l], 0); /* read before the bad one */
  tu_stats(e, &st);
  assert_int_equal(st.cold_checksum_failures, 2);
  assert_int_equal(st.cold_records, WL_DISTINCT - 2);
  assert_block_gone(e, ids, f->seed, b2);
  kvt_key gone[2] = {recs[r1].key, recs[r2].key};
  assert_lookups_stop_at(e, ids, f->seed, blocks, nb, gone, 2);
  kvt_engine_close(e);

  e = fx_reopen(f, ids); /* still gone; what is left is clean */
  fx_assert_clean(e, WL_DISTINCT - 2);
  assert_block_gone(e, ids, f->seed, b1);
  assert_block_gone(e, ids, f->seed, b2);
  assert_lookups_stop_at(e, ids, f->seed, blocks, nb, gone, 2);
  kvt_engine_close(e);
  free(recs);
}
BOTH(corrupt_read_is_miss)

int main(void) {
  const struct CMUnitTest tests[] = {
      BOTH_TESTS(fsck_finds_and_repairs),
      BOTH_TESTS(corrupt_read_is_miss),
  };
  return FX_MAIN(tests);
}
