/* test_lineage.c - content addressing under a lossy policy: once a
 * sequence's attention has been lossy, the blocks it appends are keyed
 * under a lineage of its own, so a full-cache sequence with the same tokens
 * never adopts them, nor finds them by lookup, in this process or after a
 * restart; forks inherit; the exact blocks before stay shared. The "lossy"
 * K and V are tu_kv_fill's with another salt: what a sequence that
 * attended over less would have computed for the same tokens. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL "lineage-model"
#define NB 6          /* blocks in a run */
#define EXACT_BLOCKS 2 /* put before the lossy sequence's policy cuts in */

typedef struct fx {
  char *dir;
  kvt_engine *e;
  kvt_shape sh;
  kvt_ns_id ns;
  uint64_t salt;  /* exact K and V: what the full cache computes */
  uint64_t lossy; /* what a lossy sequence computes for the same tokens */
  tu_kv kv;
  uint32_t tok[(NB + 1) * 4];
} fx;

static void fx_open_opts(fx *f, const kvt_options *o) {
  f->e = tu_open(f->dir, o);
  f->ns = tu_register(f->e, MODEL, &f->sh);
}

/* Everything but the engine: a fresh directory, the shape, both salts,
 * a K/V buffer and random tokens. */
static void fx_init(fx *f) {
  f->dir = tu_tmpdir();
  f->sh = tu_shape_small(KVT_F16);
  f->salt = tu_salt(MODEL);
  f->lossy = f->salt ^ 0x9e3779b97f4a7c15ull;
  tu_kv_alloc(&f->kv, &f->sh);
  for (size_t i = 0; i < sizeof f->tok / sizeof f->tok[0]; i++) f->tok[i] = (uint32_t)tu_rand();
}

static void fx_open(fx *f, uint32_t flags) {
  kvt_options o;
  tu_opts(&o);
  o.flags = flags;
  fx_init(f);
  fx_open_opts(f, &o);
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

static const uint32_t *blk_tok(const fx *f, uint32_t b) { return f->tok + (size_t)b * 4; }

/* Append block b of f->tok to s; put every layer with K and V of salt. */
static kvt_append_info append_put(fx *f, kvt_seq *s, uint32_t b, uint64_t salt) {
  kvt_append_info ai;
  assert_int_equal(kvt_seq_append(s, blk_tok(f, b), 4, &ai), 0);
  assert_int_equal(ai.block, b);
  for (uint32_t l = 0; l < f->sh.n_layers; l++) {
    tu_kv_fill(&f->kv, &f->sh, salt, l, b, blk_tok(f, b));
    assert_int_equal(kvt_seq_put(s, b, l, &f->kv.kv), 0);
  }
  return ai;
}

static kvt_lineage_info lineage_of(kvt_seq *s) {
  kvt_lineage_info li;
  assert_int_equal(kvt_seq_lineage(s, &li), 0);
  return li;
}

/* A sequence that puts EXACT_BLOCKS blocks over the full cache, then
 * turns on "recent" at half the cache: the policy evicts block 0, and the
 * sequence is lossy from block EXACT_BLOCKS on. */
static kvt_seq *lossy_new(fx *f) {
  kvt_seq *s = seq_new(f);
  for (uint32_t b = 0; b < EXACT_BLOCKS; b++) append_put(f, s, b, f->salt);
  assert_int_equal(lineage_of(s).lossy, 0);
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(kvt_policy_parse("recent", &p.scorer), 0);
  p.budget = 0.5;
  assert_int_equal(kvt_seq_set_policy(s, &p), 0);
  kvt_lineage_info li = lineage_of(s);
  assert_int_equal(li.lossy, 1);
  assert_int_equal(li.why, KVT_LOSSY_EVICTED);
  assert_int_equal(li.salted_from, EXACT_BLOCKS);
  return s;
}

/* A full-cache sequence with all NB blocks put (salt f->salt). */
static kvt_seq *full_run(fx *f) {
  kvt_seq *s = seq_new(f);
  for (uint32_t b = 0; b < NB; b++) append_put(f, s, b, f->salt);
  return s;
}

/* A lossy sequence (lossy_new) with its blocks past the exact ones put
 * (salt f->lossy); their keys into keys[EXACT_BLOCKS..NB) unless NULL. */
static kvt_seq *lossy_run(fx *f, kvt_key *keys) {
  kvt_seq *s = lossy_new(f);
  for (uint32_t b = EXACT_BLOCKS; b < NB; b++) {
    kvt_key k = append_put(f, s, b, f->lossy).key;
    if (keys) keys[b] = k;
  }
  return s;
}

static void assert_full_exact(fx *f, kvt_seq *s, uint32_t n) {
  for (uint32_t b = 0; b < n; b++)
    for (uint32_t l = 0; l < f->sh.n_layers; l++) tu_assert_block(s, &f->sh, f->salt, b, l, blk_tok(f, b));
}

/* The lossy sequence goes first; a full-cache one with the same tokens
 * reads back exactly what it put (as after a put into a fresh engine),
 * having adopted only the exact blocks. */
static void test_full_never_reads_lossy(void **state) {
  (void)state;
  fx f;
  fx_open(&f, KVT_OPEN_VERIFY_DEDUP);
  kvt_key lkey[NB];
  kvt_seq *ls = lossy_run(&f, lkey);
  assert_int_equal(lineage_of(ls).lossy_puts, (NB - EXACT_BLOCKS) * f.sh.n_layers);

  kvt_seq *fs = seq_new(&f);
  kvt_append_info ai[NB];
  for (uint32_t b = 0; b < NB; b++) ai[b] = append_put(&f, fs, b, f.salt);
  assert_full_exact(&f, fs, NB); /* the bytes first: what the guard is for */
  tu_assert_gather(fs, &f.sh, f.salt, f.tok, NB);
  kvt_key keys[NB];
  size_t n_keys = 0;
  assert_int_equal(kvt_keys(f.e, f.ns, f.tok, NB * 4, keys, NB, &n_keys), 0);
  for (uint32_t b = 0; b < NB; b++) {
    assert_memory_equal(ai[b].key.b, keys[b].b, 16); /* the plain key */
    if (b < EXACT_BLOCKS) {
      assert_int_equal(ai[b].layers_present, f.sh.n_layers); /* shared: exact */
    } else {
      assert_int_equal(ai[b].layers_present, 0);
      assert_memory_not_equal(ai[b].key.b, lkey[b].b, 16);
    }
  }
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.dedup_mismatches, 0);
  kvt_seq_release(fs);
  kvt_seq_release(ls);
  fx_close(&f);
}

/* A lookup finds the lossy sequence's exact blocks and nothing after. */
static void test_lookup_stops_at_lossy(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  kvt_seq *ls = lossy_run(&f, NULL);
  size_t found = 99;
  kvt_lookup_entry ent[NB];
  assert_int_equal(kvt_lookup(f.e, f.ns, f.tok, NB * 4, ent, NB, &found), 0);
  assert_int_equal(found, EXACT_BLOCKS);
  kvt_seq_release(ls);
  fx_close(&f);
}

/* The full-cache sequence goes first: the lossy one adopts its exact
 * blocks up to its lossy step and none after, and what it puts after
 * changes nothing the full-cache one reads. */
static void test_lossy_does_not_adopt(void **state) {
  (void)state;
  fx f;
  fx_open(&f, KVT_OPEN_VERIFY_DEDUP);
  kvt_seq *fs = full_run(&f);
  kvt_seq *ls = lossy_new(&f);
  for (uint32_t b = EXACT_BLOCKS; b < NB; b++)
    assert_int_equal(append_put(&f, ls, b, f.lossy).layers_present, 0);
  assert_full_exact(&f, fs, NB);
  for (uint32_t l = 0; l < f.sh.n_layers; l++) /* and the lossy one keeps its own */
    tu_assert_block(ls, &f.sh, f.lossy, NB - 1, l, blk_tok(&f, NB - 1));
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.dedup_mismatches, 0);
  kvt_seq_release(ls);
  kvt_seq_release(fs);
  fx_close(&f);
}

/* Two sequences under the same deterministic policy do not share either:
 * their states may part (tier moves, recall, the caller's tail). */
static void test_two_lossy_apart(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  kvt_seq *a = lossy_new(&f), *b = lossy_new(&f);
  for (uint32_t i = EXACT_BLOCKS; i < NB; i++) append_put(&f, a, i, f.lossy);
  for (uint32_t i = EXACT_BLOCKS; i < NB; i++)
    assert_int_equal(append_put(&f, b, i, f.lossy ^ 1).layers_present, 0);
  tu_assert_block(a, &f.sh, f.lossy, NB - 1, 0, blk_tok(&f, NB - 1));
  tu_assert_block(b, &f.sh, f.lossy ^ 1, NB - 1, 0, blk_tok(&f, NB - 1));
  kvt_seq_release(a);
  kvt_seq_release(b);
  fx_close(&f);
}

/* A fork of a lossy sequence is lossy, even forked before the parent's
 * first salted block, and takes a lineage of its own; a fork of a
 * full-cache sequence shares as before. */
static void test_fork_inherits(void **state) {
  (void)state;
  fx f;
  fx_open(&f, KVT_OPEN_VERIFY_DEDUP);
  kvt_seq *fs = full_run(&f);
  kvt_key lkey[NB];
  kvt_seq *ls = lossy_run(&f, lkey);

  /* forked at the exact prefix: its next block is not the plain key's */
  kvt_seq *early = NULL;
  assert_int_equal(kvt_seq_fork(ls, EXACT_BLOCKS, &early), 0);
  kvt_lineage_info li = lineage_of(early);
  assert_int_equal(li.lossy, 1);
  assert_int_equal(li.why, KVT_LOSSY_FORK);
  assert_int_equal(li.salted_from, EXACT_BLOCKS);
  kvt_append_info ai = append_put(&f, early, EXACT_BLOCKS, f.lossy ^ 2);
  assert_int_equal(ai.layers_present, 0);
  assert_memory_not_equal(ai.key.b, lkey[EXACT_BLOCKS].b, 16); /* its own lineage */

  /* forked at the end: the parent's salted blocks are shared by
   * reference, what each appends next is its own */
  kvt_seq *late = NULL;
  assert_int_equal(kvt_seq_fork(ls, UINT32_MAX, &late), 0);
  assert_int_equal(lineage_of(late).salted_from, EXACT_BLOCKS);
  tu_assert_block(late, &f.sh, f.lossy, NB - 1, 1, blk_tok(&f, NB - 1));
  kvt_key pk = append_put(&f, ls, NB, f.lossy).key;
  ai = append_put(&f, late, NB, f.lossy ^ 3);
  assert_int_equal(ai.layers_present, 0);
  assert_memory_not_equal(ai.key.b, pk.b, 16);
  tu_assert_block(ls, &f.sh, f.lossy, NB, 0, blk_tok(&f, NB));

  /* a fork of the full-cache sequence is exact and shares */
  kvt_seq *ff = NULL;
  assert_int_equal(kvt_seq_fork(fs, EXACT_BLOCKS + 1, &ff), 0);
  assert_int_equal(lineage_of(ff).lossy, 0);
  assert_int_equal(lineage_of(ff).salted_from, UINT32_MAX);
  assert_int_equal(append_put(&f, ff, EXACT_BLOCKS + 1, f.salt).layers_present, f.sh.n_layers);

  assert_full_exact(&f, fs, NB);
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.dedup_mismatches, 0);
  kvt_seq_release(ff);
  kvt_seq_release(late);
  kvt_seq_release(early);
  kvt_seq_release(ls);
  kvt_seq_release(fs);
  fx_close(&f);
}

/* A full-cache sequence is lossy too once it attends over a warm block:
 * here the hot tier demotes under memory pressure. */
static void test_warm_read_is_lossy(void **state) {
  (void)state;
  fx f;
  kvt_options o;
  tu_opts(&o);
  fx_init(&f);
  /* room for about 2 of the 6 token blocks' layers: the rest go warm */
  uint64_t block = 2 * kvt_shape_block_bytes(&f.sh) + 512;
  o.tier_bytes_limit[KVT_TIER_HOT] = 2 * f.sh.n_layers * block;
  o.tier_bytes_limit[KVT_TIER_WARM] = 1u << 20;
  fx_open_opts(&f, &o);
  kvt_seq *s = full_run(&f);
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_true(st.demotions > 0);
  assert_int_equal(lineage_of(s).lossy, 0);
  float q[2 * 16] = {0}, out[2 * 16], mass[NB];
  size_t n = 0;
  assert_int_equal(kvt_seq_attend(s, 0, q, 2, 0, out, NULL, mass, NB, &n), 0);
  kvt_lineage_info li = lineage_of(s);
  assert_int_equal(li.lossy, 1);
  assert_int_equal(li.why, KVT_LOSSY_APPROX);
  assert_int_equal(li.salted_from, NB);
  kvt_key k = append_put(&f, s, NB, f.lossy).key;
  kvt_key plain[NB + 1];
  size_t nk = 0;
  assert_int_equal(kvt_keys(f.e, f.ns, f.tok, (NB + 1) * 4, plain, NB + 1, &nk), 0);
  assert_memory_not_equal(k.b, plain[NB].b, 16);
  kvt_seq_release(s);
  fx_close(&f);
}

/* The policy's warm share quantizes: lossy from then on. */
static void test_policy_warm_is_lossy(void **state) {
  (void)state;
  fx f;
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_WARM] = 16u << 20;
  fx_init(&f);
  fx_open_opts(&f, &o);
  kvt_seq *s = full_run(&f);
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(kvt_policy_parse("recent", &p.scorer), 0);
  p.budget = 0.9;
  p.warm = 0.5;
  assert_int_equal(kvt_seq_set_policy(s, &p), 0);
  kvt_policy_info pi;
  assert_int_equal(kvt_seq_policy_info(s, 0, &pi), 0);
  assert_true(pi.demotions > 0);
  kvt_lineage_info li = lineage_of(s);
  assert_int_equal(li.lossy, 1);
  assert_int_equal(li.why, KVT_LOSSY_QUANTIZED);
  kvt_seq_release(s);
  fx_close(&f);
}

/* kvt_seq_mark_lossy(): the caller's word; lossy puts are counted per
 * sequence and in the metrics. */
static void test_mark_and_count(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  assert_int_equal(kvt_seq_mark_lossy(NULL), KVT_ENULL);
  kvt_lineage_info li;
  assert_int_equal(kvt_seq_lineage(NULL, &li), KVT_ENULL);
  kvt_seq *s = seq_new(&f);
  assert_int_equal(kvt_seq_lineage(s, NULL), KVT_ENULL);
  li = lineage_of(s);
  assert_int_equal(li.lossy, 0);
  assert_int_equal(li.why, KVT_LOSSY_NONE);
  assert_int_equal(li.salted_from, UINT32_MAX);
  assert_int_equal(kvt_seq_mark_lossy(s), 0);
  assert_int_equal(kvt_seq_mark_lossy(s), 0); /* once */
  for (uint32_t b = 0; b < 2; b++) append_put(&f, s, b, f.lossy);
  li = lineage_of(s);
  assert_int_equal(li.why, KVT_LOSSY_CALLER);
  assert_int_equal(li.salted_from, 0);
  assert_int_equal(li.lossy_puts, 2 * f.sh.n_layers);
  size_t found = 9;
  assert_int_equal(kvt_lookup(f.e, f.ns, f.tok, 2 * 4, NULL, 0, &found), 0);
  assert_int_equal(found, 0);
  char buf[32768];
  size_t need = 0;
  assert_int_equal(kvt_metrics_render(f.e, buf, sizeof buf, &need), 0);
  assert_non_null(strstr(buf, "\nkvtier_lossy_sequences_total 1\n"));
  char want[64];
  snprintf(want, sizeof want, "\nkvtier_lossy_puts_total %u\n", 2 * f.sh.n_layers);
  assert_non_null(strstr(buf, want));
  kvt_seq_release(s);
  fx_close(&f);
}

/* Salted blocks go to the cold tier like others; after a restart a
 * full-cache sequence finds only the exact prefix there. */
static void test_restart_keeps_apart(void **state) {
  (void)state;
  fx f;
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_COLD] = 1ull << 30;
  o.cold_segment_bytes = 1u << 20;
  o.cold_index_bytes = 64u << 20;
  o.io_backend = KVT_BACKEND_PREAD;
  fx_init(&f);
  fx_open_opts(&f, &o);
  kvt_seq *ls = lossy_new(&f);
  for (uint32_t b = EXACT_BLOCKS; b < NB; b++) append_put(&f, ls, b, f.lossy);
  assert_int_equal(kvt_sync(f.e), 0);
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.cold_records, NB); /* the salted ones too */
  kvt_seq_release(ls);
  kvt_engine_close(f.e);

  o.flags |= KVT_OPEN_VERIFY_DEDUP;
  fx_open_opts(&f, &o);
  size_t found = 99;
  assert_int_equal(kvt_lookup(f.e, f.ns, f.tok, NB * 4, NULL, 0, &found), 0);
  assert_int_equal(found, EXACT_BLOCKS);
  kvt_seq *fs = seq_new(&f);
  for (uint32_t b = 0; b < NB; b++) {
    kvt_append_info ai = append_put(&f, fs, b, f.salt);
    assert_int_equal(ai.durable, b < EXACT_BLOCKS);
  }
  assert_full_exact(&f, fs, NB);
  /* and a lossy sequence of the new process has a lineage of its own */
  kvt_seq *l2 = lossy_new(&f);
  for (uint32_t b = EXACT_BLOCKS; b < NB; b++) {
    kvt_append_info ai = append_put(&f, l2, b, f.lossy);
    assert_int_equal(ai.durable, 0);
    assert_int_equal(ai.layers_present, 0);
  }
  tu_stats(f.e, &st);
  assert_int_equal(st.dedup_mismatches, 0);
  kvt_seq_release(l2);
  kvt_seq_release(fs);
  fx_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_full_never_reads_lossy),
      cmocka_unit_test(test_lookup_stops_at_lossy),
      cmocka_unit_test(test_lossy_does_not_adopt),
      cmocka_unit_test(test_two_lossy_apart),
      cmocka_unit_test(test_fork_inherits),
      cmocka_unit_test(test_warm_read_is_lossy),
      cmocka_unit_test(test_policy_warm_is_lossy),
      cmocka_unit_test(test_mark_and_count),
      cmocka_unit_test(test_restart_keeps_apart),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
