/* test_promote.c - blocks a sequence references whose payload is only in
 * the cold tier are brought back into RAM by the engine: attention and
 * gathers over them are bit-exact against fresh puts, a second process
 * attends over an adopted prefix without putting it, a prefetch leaves
 * attention nothing to read, a corrupted record is reported (never wrong
 * bytes), and the policy's budget and the tier limits hold meanwhile. */
#include <math.h>

#include "cold_util.h"
#include "fixture.h"

#define BLOCKS 8u
#define QH_PER_KV 2u /* query heads per KV head */

/* Fail a forked child's check: return the line. */
#define CHK(x)                                                                              \
  do {                                                                                      \
    if (!(x)) {                                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #x);                 \
      return __LINE__;                                                                      \
    }                                                                                       \
  } while (0)

static void fill_tokens(const kvt_shape *sh, uint32_t salt, uint32_t n, uint32_t *toks) {
  for (uint32_t b = 0; b < n; b++)
    for (uint32_t t = 0; t < sh->block_tokens; t++)
      toks[b * sh->block_tokens + t] = salt * 100000u + b * 100u + t + 1;
}

/* The reference: a plain engine (no cold tier) with the same blocks put. */
typedef struct ref {
  char *dir;
  kvt_engine *e;
  kvt_seq *s;
} ref;

static int ref_open(ref *r, const kvt_shape *sh, uint64_t salt, const uint32_t *toks, uint32_t n) {
  kvt_options o;
  tu_opts(&o);
  r->dir = tu_tmpdir();
  r->e = NULL;
  r->s = NULL;
  CHK(kvt_engine_open(r->dir, &o, &r->e) == 0);
  kvt_ns_desc d = tu_desc("m", sh);
  kvt_ns_id ns;
  CHK(kvt_ns_register(r->e, &d, &ns) == 0);
  CHK(kvt_seq_create(r->e, ns, &r->s) == 0);
  tu_kv kv;
  tu_kv_alloc(&kv, sh);
  for (uint32_t b = 0; b < n; b++)
    CHK(cu_append_put(r->s, sh, salt, toks + b * sh->block_tokens, &kv, NULL) == 0);
  tu_kv_free(&kv);
  return 0;
}

static void ref_close(ref *r) {
  kvt_seq_release(r->s);
  kvt_engine_close(r->e);
  tu_rmtree(r->dir);
}

/* Attention of one fixed query over (a, layer) and (b, layer): 0 when
 * both succeed over want blocks with identical bytes (out, lse, mass);
 * else the failing line, or a's return code in *rc_a. */
static int attend_same(kvt_seq *a, kvt_seq *b, const kvt_shape *sh, uint32_t layer, size_t want,
                       int *rc_a) {
  uint32_t H = sh->n_kv_heads * QH_PER_KV, D = sh->head_dim;
  float q[64 * 8], oa[64 * 8], ob[64 * 8], la[8], lb[8], ma[BLOCKS], mb[BLOCKS];
  for (uint32_t i = 0; i < H * D; i++) q[i] = 0.02f * (float)((i * 7 + layer) % 23) - 0.2f;
  memset(oa, 0x5a, sizeof oa);
  size_t na = 0, nb = 0;
  *rc_a = kvt_seq_attend(a, layer, q, H, 0, oa, la, ma, BLOCKS, &na);
  if (*rc_a) return __LINE__;
  CHK(kvt_seq_attend(b, layer, q, H, 0, ob, lb, mb, BLOCKS, &nb) == 0);
  CHK(na == want && nb == want);
  CHK(memcmp(oa, ob, (size_t)H * D * sizeof *oa) == 0);
  CHK(memcmp(la, lb, H * sizeof *la) == 0);
  CHK(memcmp(ma, mb, want * sizeof *ma) == 0);
  return 0;
}

static void assert_attend_same(kvt_seq *a, kvt_seq *b, const kvt_shape *sh, uint32_t layer,
                               size_t want) {
  int rc = 0, line = attend_same(a, b, sh, layer, want, &rc);
  if (line) fprintf(stderr, "attend_same: line %d, rc %s\n", line, kvt_strerror(rc));
  assert_int_equal(rc, 0);
  assert_int_equal(line, 0);
}

/* Open the store another process wrote and append its blocks: durable,
 * adopted, nothing in RAM. */
static kvt_ns_id g_ns; /* the namespace of the last adopt() */

static kvt_seq *adopt(kvt_engine *e, const kvt_shape *sh, const uint32_t *toks, uint32_t n) {
  kvt_ns_id ns = g_ns = tu_register(e, "m", sh);
  kvt_seq *s = NULL;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  for (uint32_t b = 0; b < n; b++) {
    kvt_append_info info;
    assert_int_equal(kvt_seq_append(s, toks + b * sh->block_tokens, sh->block_tokens, &info), 0);
    assert_int_equal(info.durable, 1);
    assert_int_equal(info.layers_present, 0);
  }
  return s;
}

/* Durable blocks nobody put in this process: kvt_seq_retained lists them as
 * cold without reading; attention brings each layer back in one go and is
 * bit-exact against fresh puts; gathers return the exact bytes. */
static void test_adopted_attend_exact(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_shape sh = tu_shape_small(KVT_F16);
  uint64_t salt = tu_salt("m");
  uint32_t toks[BLOCKS * 4];
  fill_tokens(&sh, 1, BLOCKS, toks);
  tf_write_durable(dir, KVT_BACKEND_PREAD, &sh, "m", salt, toks, BLOCKS); /* another process's */
  ref r;
  assert_int_equal(ref_open(&r, &sh, salt, toks, BLOCKS), 0);

  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  kvt_engine *e = tu_open(dir, &o);
  kvt_seq *s = adopt(e, &sh, toks, BLOCKS);
  kvt_gathered g[BLOCKS];
  size_t n = 0;
  kvt_stats st0, st;
  tu_stats(e, &st0);
  assert_int_equal(kvt_seq_retained(s, 0, g, BLOCKS, &n), 0);
  assert_int_equal(n, BLOCKS);
  for (uint32_t i = 0; i < BLOCKS; i++) {
    assert_int_equal(g[i].block, i);
    assert_int_equal(g[i].tier, KVT_TIER_COLD);
  }
  size_t bytes = 0;
  assert_int_equal(kvt_seq_gather(s, 0, NULL, NULL, &bytes, NULL, 0, &n), 0); /* size query */
  assert_int_equal(n, BLOCKS);
  assert_int_equal(bytes, BLOCKS * kvt_shape_block_bytes(&sh));
  tu_stats(e, &st);
  assert_int_equal(st.cold_reads, st0.cold_reads); /* listing and sizing read nothing */
  assert_int_equal(st.promotions, 0);

  for (uint32_t l = 0; l < sh.n_layers; l++) {
    assert_attend_same(s, r.s, &sh, l, BLOCKS);
    tu_stats(e, &st);
    assert_int_equal(st.promotions, (uint64_t)(l + 1) * BLOCKS);
    assert_int_equal(kvt_seq_retained(s, l, g, BLOCKS, &n), 0);
    for (uint32_t i = 0; i < BLOCKS; i++) assert_int_equal(g[i].tier, KVT_TIER_HOT);
  }
  tu_stats(e, &st);
  assert_int_equal(st.puts, 0);
  assert_int_equal(st.cold_reads - st0.cold_reads, (uint64_t)BLOCKS * sh.n_layers);
  tu_assert_gather(s, &sh, salt, toks, BLOCKS);
  kvt_seq_release(s);
  kvt_engine_close(e);

  /* gather first, in a fresh process state: exact bytes straight away */
  e = tu_open(dir, &o);
  s = adopt(e, &sh, toks, BLOCKS);
  tu_assert_gather(s, &sh, salt, toks, BLOCKS);
  tu_stats(e, &st);
  assert_int_equal(st.promotions, (uint64_t)BLOCKS * sh.n_layers);
  for (uint32_t l = 0; l < sh.n_layers; l++) assert_attend_same(s, r.s, &sh, l, BLOCKS);
  kvt_seq_release(s);
  kvt_engine_close(e);
  ref_close(&r);
  tu_rmtree(dir);
}

/* One process, a hot tier of 10 of the 32 layer blocks: blocks leave RAM
 * once durable. Attention over every layer, again and again, brings back
 * what left and stays exact; the hot tier never exceeds its limit. */
static void test_left_ram_attend_exact(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  kvt_shape sh = tu_shape_small(KVT_F16);
  size_t bb = kvt_shape_block_bytes(&sh);
  o.tier_bytes_limit[KVT_TIER_HOT] = (BLOCKS + 2) * (2 * bb + 256);
  uint64_t salt = tu_salt("m");
  uint32_t toks[BLOCKS * 4];
  fill_tokens(&sh, 2, BLOCKS, toks);
  ref r;
  assert_int_equal(ref_open(&r, &sh, salt, toks, BLOCKS), 0);
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "m", &sh);
  kvt_seq *s = NULL;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  for (uint32_t b = 0; b < BLOCKS; b++) tu_append_put(s, &sh, salt, toks + b * sh.block_tokens, &kv);
  tu_kv_free(&kv);
  assert_int_equal(kvt_sync(e), 0);
  kvt_stats st;
  tu_stats(e, &st);
  assert_true(st.tier_blocks[KVT_TIER_HOT] < (uint64_t)BLOCKS * sh.n_layers); /* some left */
  for (int round = 0; round < 3; round++)
    for (uint32_t l = 0; l < sh.n_layers; l++) {
      assert_attend_same(s, r.s, &sh, l, BLOCKS);
      tu_stats(e, &st);
      assert_true(st.tier_bytes[KVT_TIER_HOT] <= o.tier_bytes_limit[KVT_TIER_HOT]);
    }
  assert_true(st.promotions > 0);
  tu_assert_gather(s, &sh, salt, toks, BLOCKS);
  tu_stats(e, &st);
  assert_true(st.tier_bytes[KVT_TIER_HOT] <= o.tier_bytes_limit[KVT_TIER_HOT]);
  kvt_seq_release(s);
  kvt_engine_close(e);
  ref_close(&r);
  tu_rmtree(dir);
}

/* The child: open the store, find the prefix by lookup, append it, attend
 * over every layer without a put or a load. Returns 0 or a failing line. */
static int child_adopts(const char *dir, const kvt_shape *sh, uint64_t salt, const uint32_t *toks) {
  ref r;
  int line = ref_open(&r, sh, salt, toks, BLOCKS);
  if (line) return line;
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_AUTO);
  kvt_engine *e = NULL;
  CHK(kvt_engine_open(dir, &o, &e) == 0);
  kvt_ns_desc d = tu_desc("m", sh);
  kvt_ns_id ns;
  CHK(kvt_ns_register(e, &d, &ns) == 0);
  size_t found = 0;
  CHK(kvt_lookup(e, ns, toks, BLOCKS * sh->block_tokens, NULL, 0, &found) == 0);
  CHK(found == BLOCKS);
  kvt_seq *s = NULL;
  CHK(kvt_seq_create(e, ns, &s) == 0);
  for (uint32_t b = 0; b < found; b++)
    CHK(kvt_seq_append(s, toks + b * sh->block_tokens, sh->block_tokens, NULL) == 0);
  for (uint32_t l = 0; l < sh->n_layers; l++) {
    int rc = 0;
    if ((line = attend_same(s, r.s, sh, l, BLOCKS, &rc))) {
      fprintf(stderr, "child: layer %u: %s\n", l, kvt_strerror(rc));
      return line;
    }
  }
  kvt_stats st;
  CHK(kvt_stats_get(e, &st) == 0);
  CHK(st.puts == 0);
  CHK(st.promotions == (uint64_t)BLOCKS * sh->n_layers);
  kvt_seq_release(s);
  kvt_engine_close(e);
  ref_close(&r);
  return 0;
}

static void test_second_process_adopts(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_shape sh = tu_shape_small(KVT_BF16);
  uint64_t salt = tu_salt("m");
  uint32_t toks[BLOCKS * 4];
  fill_tokens(&sh, 3, BLOCKS, toks);
  tf_write_durable(dir, KVT_BACKEND_PREAD, &sh, "m", salt, toks, BLOCKS); /* another process's */
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(child_adopts(dir, &sh, salt, toks) ? 1 : 0);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  tu_rmtree(dir);
}

/* A prefetch of every layer, then attention: the reads happened in the
 * prefetch, attention reads nothing from the cold tier. */
static void prefetch_then_attend(uint32_t backend) {
  char *dir = tu_tmpdir();
  kvt_shape sh = tu_shape_small(KVT_F16);
  uint64_t salt = tu_salt("m");
  uint32_t toks[BLOCKS * 4];
  fill_tokens(&sh, 4, BLOCKS, toks);
  tf_write_durable(dir, KVT_BACKEND_PREAD, &sh, "m", salt, toks, BLOCKS); /* another process's */
  ref r;
  assert_int_equal(ref_open(&r, &sh, salt, toks, BLOCKS), 0);
  kvt_options o;
  cu_opts(&o, backend);
  kvt_engine *e = tu_open(dir, &o);
  kvt_seq *s = adopt(e, &sh, toks, BLOCKS);
  kvt_stats st0, st;
  tu_stats(e, &st0);
  kvt_load *ld = NULL;
  assert_int_equal(kvt_seq_prefetch(s, 0, sh.n_layers, &ld), 0);
  assert_non_null(ld);
  size_t ok = 0;
  assert_int_equal(kvt_load_wait(ld, &ok), 0);
  assert_int_equal(ok, (size_t)BLOCKS * sh.n_layers);
  tu_stats(e, &st);
  assert_int_equal(st.cold_reads - st0.cold_reads, (uint64_t)BLOCKS * sh.n_layers);
  assert_int_equal(st.promotions, (uint64_t)BLOCKS * sh.n_layers);
  for (uint32_t l = 0; l < sh.n_layers; l++) assert_attend_same(s, r.s, &sh, l, BLOCKS);
  tu_assert_gather(s, &sh, salt, toks, BLOCKS);
  kvt_stats st2;
  tu_stats(e, &st2);
  assert_int_equal(st2.cold_reads, st.cold_reads); /* no synchronous read */
  assert_int_equal(st2.promotions, st.promotions);
  /* Nothing left to prefetch: an empty handle. */
  assert_int_equal(kvt_seq_prefetch(s, 1, 2, &ld), 0);
  assert_int_equal(kvt_load_wait(ld, &ok), 0);
  assert_int_equal(ok, 0);
  assert_int_equal(kvt_seq_prefetch(s, 1, sh.n_layers, &ld), KVT_ENOTFOUND);
  assert_null(ld);
  kvt_seq_release(s);

  /* A prefetch outlives a release of its sequence, and a close. */
  kvt_engine_close(e);
  e = tu_open(dir, &o);
  s = adopt(e, &sh, toks, BLOCKS);
  assert_int_equal(kvt_seq_prefetch(s, 0, sh.n_layers, &ld), 0);
  kvt_seq_release(s);
  assert_int_equal(kvt_load_wait(ld, &ok), 0);
  assert_int_equal(ok, 0); /* nobody references them any more */
  s = adopt(e, &sh, toks, BLOCKS);
  assert_int_equal(kvt_seq_prefetch(s, 0, 1, &ld), 0);
  kvt_engine_close(e); /* frees the pending load */
  ref_close(&r);
  tu_rmtree(dir);
}

static void test_prefetch_uring(void **state) {
  (void)state;
  CU_SKIP_UNLESS_BACKEND(KVT_BACKEND_URING);
  prefetch_then_attend(KVT_BACKEND_URING);
}

static void test_prefetch_pread(void **state) {
  (void)state;
  prefetch_then_attend(KVT_BACKEND_PREAD);
}

/* A flipped byte in one layer slice of block 2: attention and gathers of
 * that layer fail with KVT_ENOTRESIDENT (one block not resident) and write
 * nothing, the record is a miss for lookups from then on, the block stays
 * listed as cold; putting it again makes attention exact. */
static void test_corrupt_record(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_shape sh = tu_shape_small(KVT_F16);
  uint64_t salt = tu_salt("m");
  uint32_t toks[BLOCKS * 4];
  fill_tokens(&sh, 5, BLOCKS, toks);
  tf_write_durable(dir, KVT_BACKEND_PREAD, &sh, "m", salt, toks, BLOCKS); /* another process's */
  ref r;
  assert_int_equal(ref_open(&r, &sh, salt, toks, BLOCKS), 0);
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  kvt_engine *e = tu_open(dir, &o);
  kvt_seq *s = adopt(e, &sh, toks, BLOCKS);
  kvt_key keys[BLOCKS];
  size_t nk = 0;
  assert_int_equal(kvt_keys(e, g_ns, toks, BLOCKS * sh.block_tokens, keys, BLOCKS, &nk), 0);
  cu_rec *recs = NULL;
  size_t nr = cu_records(dir, &recs), hit = 0;
  const uint32_t bad = 2, layer = 1;
  for (size_t i = 0; i < nr; i++)
    if (cu_key_eq(&recs[i].key, &keys[bad])) {
      assert_int_equal(cu_flip(recs[i].path, recs[i].off + recs[i].slice_off[layer] + 5, 0x10), 0);
      hit++;
    }
  free(recs);
  assert_int_equal(hit, 1);

  uint32_t H = sh.n_kv_heads * QH_PER_KV, D = sh.head_dim;
  float q[64 * 8], out[64 * 8], sentinel[64 * 8];
  for (uint32_t i = 0; i < H * D; i++) q[i] = 0.01f * (float)i;
  memset(out, 0x5a, sizeof out);
  memcpy(sentinel, out, sizeof out);
  size_t n = 0;
  assert_int_equal(kvt_seq_attend(s, layer, q, H, 0, out, NULL, NULL, 0, &n), KVT_ENOTRESIDENT);
  assert_int_equal(n, 1);
  assert_memory_equal(out, sentinel, sizeof out); /* nothing computed */
  kvt_error_info info;
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_int_equal(info.code, KVT_ENOTRESIDENT);
  assert_non_null(strstr(info.message, "failed its check"));
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_checksum_failures, 1);
  assert_int_equal(st.promotions, BLOCKS - 1); /* the others came back */
  /* Listed as cold; gathers refuse and write nothing. */
  kvt_gathered g[BLOCKS];
  assert_int_equal(kvt_seq_retained(s, layer, g, BLOCKS, &n), 0);
  assert_int_equal(n, BLOCKS);
  for (uint32_t i = 0; i < BLOCKS; i++)
    assert_int_equal(g[i].tier, i == bad ? KVT_TIER_COLD : KVT_TIER_HOT);
  size_t bb = kvt_shape_block_bytes(&sh), bytes = BLOCKS * bb;
  uint8_t *k = malloc(bytes), *v = malloc(bytes), *k0 = malloc(bytes);
  memset(k, 0x77, bytes);
  memcpy(k0, k, bytes);
  assert_int_equal(kvt_seq_gather(s, layer, k, v, &bytes, g, BLOCKS, &n), KVT_ENOTRESIDENT);
  assert_int_equal(n, 1);
  assert_memory_equal(k, k0, BLOCKS * bb);
  /* Again: still reported (the record left the cold tier: a miss now). */
  assert_int_equal(kvt_seq_attend(s, layer, q, H, 0, out, NULL, NULL, 0, &n), KVT_ENOTRESIDENT);
  assert_int_equal(n, 1);
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_non_null(strstr(info.message, "no longer in the cold tier"));
  size_t found = 0;
  assert_int_equal(kvt_lookup(e, g_ns, toks, BLOCKS * sh.block_tokens, NULL, 0, &found), 0);
  assert_int_equal(found, bad);
  /* Other layers of the lost block are misses too (the record is gone). */
  assert_int_equal(kvt_seq_attend(s, 0, q, H, 0, out, NULL, NULL, 0, &n), KVT_ENOTRESIDENT);
  assert_int_equal(n, 1);
  /* The caller puts the block again: exact everywhere. */
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  for (uint32_t l = 0; l < sh.n_layers; l++) {
    tu_kv_fill(&kv, &sh, salt, l, bad, toks + bad * sh.block_tokens);
    assert_int_equal(kvt_seq_put(s, bad, l, &kv.kv), 0);
  }
  tu_kv_free(&kv);
  for (uint32_t l = 0; l < sh.n_layers; l++) assert_attend_same(s, r.s, &sh, l, BLOCKS);
  tu_assert_gather(s, &sh, salt, toks, BLOCKS);
  free(k);
  free(v);
  free(k0);
  kvt_seq_release(s);
  kvt_engine_close(e);
  ref_close(&r);
  tu_rmtree(dir);
}

/* A budget of half the layer on an adopted sequence: what attention brings
 * back is counted by the budget (the policy evicts down to it), and what
 * the policy evicted is not read back. */
static void test_budget_holds(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_shape sh = tu_shape_small(KVT_F16);
  uint64_t salt = tu_salt("m");
  uint32_t toks[BLOCKS * 4];
  fill_tokens(&sh, 6, BLOCKS, toks);
  tf_write_durable(dir, KVT_BACKEND_PREAD, &sh, "m", salt, toks, BLOCKS); /* another process's */
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  kvt_engine *e = tu_open(dir, &o);
  kvt_seq *s = adopt(e, &sh, toks, BLOCKS);
  kvt_policy p;
  kvt_policy_init(&p);
  p.scorer = KVT_SCORER_RECENT;
  p.budget = 0.5;
  assert_int_equal(kvt_seq_set_policy(s, &p), 0);
  uint32_t H = sh.n_kv_heads * QH_PER_KV, D = sh.head_dim;
  float q[64 * 8], out[64 * 8];
  for (uint32_t i = 0; i < H * D; i++) q[i] = 0.01f * (float)i;
  for (uint32_t l = 0; l < sh.n_layers; l++) {
    size_t n = 0;
    assert_int_equal(kvt_seq_attend(s, l, q, H, 0, out, NULL, NULL, 0, &n), 0);
    assert_int_equal(n, BLOCKS / 2);
    kvt_policy_info pi;
    assert_int_equal(kvt_seq_policy_info(s, l, &pi), 0);
    assert_true(pi.kept_bytes <= pi.budget_bytes);
    assert_int_equal(pi.over, 0);
  }
  kvt_stats st, st2;
  tu_stats(e, &st);
  for (uint32_t l = 0; l < sh.n_layers; l++) {
    size_t n = 0;
    assert_int_equal(kvt_seq_attend(s, l, q, H, 0, out, NULL, NULL, 0, &n), 0);
    assert_int_equal(n, BLOCKS / 2);
  }
  tu_stats(e, &st2);
  assert_int_equal(st2.cold_reads, st.cold_reads); /* the evicted stay out */
  assert_int_equal(st2.promotions, st.promotions);
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adopted_attend_exact),
      cmocka_unit_test(test_left_ram_attend_exact),
      cmocka_unit_test(test_second_process_adopts),
      cmocka_unit_test(test_prefetch_uring),
      cmocka_unit_test(test_prefetch_pread),
      cmocka_unit_test(test_corrupt_record),
      cmocka_unit_test(test_budget_holds),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
