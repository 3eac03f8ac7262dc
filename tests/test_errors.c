/* test_errors.c - errors say what was wrong: kvt_strerror() texts fit the
 * cases that return each code, kvt_last_error() names the field, the
 * expected and the given value, per engine and per thread, and
 * kvt_engine_open_info() explains refused opens (a second writer in this
 * process, a writer without a cold limit on a store that has a cold tier). */
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cold_util.h"

static void assert_has(const char *s, const char *part) {
  if (!strstr(s, part)) fprintf(stderr, "'%s' does not contain '%s'\n", s, part);
  assert_non_null(strstr(s, part));
}

/* kvt_ns_register with block_tokens 12: KVT_ESHAPE, and the generic text
 * does not claim the shape "differs from the namespace". */
static void test_register_bad_shape(void **state) {
  (void)state;
  kvt_options o;
  tu_opts(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  kvt_engine *e = tu_open(NULL, &o);
  kvt_shape sh = tu_shape_small(KVT_F16);
  sh.block_tokens = 12;
  kvt_ns_desc d = tu_desc("bad-shape", &sh);
  kvt_ns_id ns;
  assert_int_equal(kvt_ns_register(e, &d, &ns), KVT_ESHAPE);
  assert_has(kvt_strerror(KVT_ESHAPE), "invalid");
  kvt_error_info info;
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_int_equal(info.code, KVT_ESHAPE);
  assert_string_equal(info.call, "kvt_ns_register");
  assert_string_equal(info.field, "shape.block_tokens");
  assert_string_equal(info.got, "12");
  assert_has(info.expected, "power of two");
  assert_has(info.message, "shape.block_tokens is 12");

  sh.block_tokens = 4;
  sh.dtype = 9;
  d = tu_desc("bad-dtype", &sh);
  assert_int_equal(kvt_ns_register(e, &d, &ns), KVT_EDTYPE);
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_int_equal(info.code, KVT_EDTYPE);
  assert_string_equal(info.field, "shape.dtype");
  assert_string_equal(info.got, "9");

  sh.dtype = KVT_F16;
  d = tu_desc("tp", &sh);
  d.tp_rank = 2;
  d.tp_size = 2;
  assert_int_equal(kvt_ns_register(e, &d, &ns), KVT_EOPTION);
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_string_equal(info.field, "tp_rank");
  kvt_engine_close(e);
}

/* Same identity, another shape: KVT_ENSCONFLICT names the field. */
static void test_register_conflict(void **state) {
  (void)state;
  kvt_options o;
  tu_opts(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  kvt_engine *e = tu_open(NULL, &o);
  kvt_shape sh = tu_shape_small(KVT_F16);
  tu_register(e, "conflict", &sh);
  sh.n_layers = 7;
  kvt_ns_desc d = tu_desc("conflict", &sh);
  kvt_ns_id ns;
  assert_int_equal(kvt_ns_register(e, &d, &ns), KVT_ENSCONFLICT);
  kvt_error_info info;
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_int_equal(info.code, KVT_ENSCONFLICT);
  assert_string_equal(info.field, "shape.n_layers");
  assert_string_equal(info.got, "7");
  assert_has(info.expected, "4");
  kvt_engine_close(e);
}

/* Puts, appends, reads and gathers refused for their sizes say which. */
static void test_seq_details(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_engine *e = tu_open(dir, NULL);
  kvt_shape sh = tu_shape_small(KVT_F32);
  kvt_ns_id ns = tu_register(e, "seq-details", &sh);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  kvt_error_info info;
  assert_int_equal(kvt_last_error(e, &info), KVT_ENOTFOUND); /* nothing failed yet */
  assert_int_equal(info.code, 0);

  uint32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  assert_int_equal(kvt_seq_append(s, tok, 5, NULL), KVT_ECOUNT);
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_int_equal(info.code, KVT_ECOUNT);
  assert_string_equal(info.field, "n_tokens");
  assert_has(info.got, "5");

  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  assert_int_equal(kvt_seq_append(s, tok, 4, NULL), 0);
  tu_kv_fill(&kv, &sh, 1, 0, 0, tok);
  kv.kv.head_dim = 8;
  assert_int_equal(kvt_seq_put(s, 0, 0, &kv.kv), KVT_ESHAPE);
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_string_equal(info.field, "kv.head_dim");
  assert_has(info.got, "8 (the namespace has 16)");
  kv.kv.head_dim = sh.head_dim;
  kv.kv.dtype = KVT_F16;
  assert_int_equal(kvt_seq_put(s, 0, 0, &kv.kv), KVT_EDTYPE);
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_string_equal(info.field, "kv.dtype");
  kv.kv.dtype = sh.dtype;
  assert_int_equal(kvt_seq_put(s, 0, 0, &kv.kv), 0);

  assert_int_equal(kvt_seq_read(s, 0, 0, kv.k, kv.v, kv.bytes - 1), KVT_EBUFSIZE);
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_int_equal(info.code, KVT_EBUFSIZE);
  assert_string_equal(info.field, "bytes_each");
  char want[64];
  snprintf(want, sizeof want, "%zu", kv.bytes - 1);
  assert_has(info.got, want);

  size_t each = kv.bytes - 1, n;
  assert_int_equal(kvt_seq_gather(s, 0, kv.k, kv.v, &each, NULL, 0, &n), KVT_EBUFSIZE);
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_string_equal(info.call, "kvt_seq_gather");
  assert_string_equal(info.field, "bytes_each");

  assert_int_equal(kvt_seq_fork(s, 5, &(kvt_seq *){NULL}), KVT_ECOUNT);
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_string_equal(info.call, "kvt_seq_fork");
  float q[2 * 16] = {0}, out[2 * 16];
  assert_int_equal(kvt_seq_attend(s, 0, q, 3, 0, out, NULL, NULL, 0, &n), KVT_ECOUNT);
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_string_equal(info.field, "n_q_heads");
  kvt_seq_release(s);
  tu_kv_free(&kv);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* Detail is per thread: another thread's failure does not show here. */
typedef struct thr_arg {
  kvt_engine *e;
  kvt_ns_id ns;
  int rc, detail_rc;
  kvt_error_info info;
} thr_arg;

static void *thr_fail(void *p) {
  thr_arg *a = p;
  kvt_seq *s;
  if (kvt_seq_create(a->e, a->ns, &s)) return NULL;
  uint32_t tok[4] = {9, 9, 9, 9};
  a->rc = kvt_seq_append(s, tok, 3, NULL);
  a->detail_rc = kvt_last_error(a->e, &a->info);
  kvt_seq_release(s);
  return NULL;
}

static void test_detail_per_thread(void **state) {
  (void)state;
  kvt_options o;
  tu_opts(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  kvt_engine *e = tu_open(NULL, &o), *e2 = tu_open(NULL, &o);
  kvt_shape sh = tu_shape_small(KVT_F16);
  thr_arg a = {.e = e, .ns = tu_register(e, "threads", &sh)};
  sh.head_dim = 0;
  kvt_ns_desc d = tu_desc("bad", &sh);
  kvt_ns_id id;
  assert_int_equal(kvt_ns_register(e, &d, &id), KVT_ESHAPE);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, thr_fail, &a), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(a.rc, KVT_ECOUNT);
  assert_int_equal(a.detail_rc, 0);
  assert_int_equal(a.info.code, KVT_ECOUNT);
  kvt_error_info info;
  assert_int_equal(kvt_last_error(e, &info), 0);
  assert_int_equal(info.code, KVT_ESHAPE); /* ours, not the thread's */
  assert_string_equal(info.field, "shape.head_dim");
  assert_int_equal(kvt_last_error(e2, &info), KVT_ENOTFOUND); /* per engine */
  assert_int_equal(kvt_last_error(NULL, &info), KVT_ENULL);
  kvt_engine_close(e2);
  kvt_engine_close(e);
}

/* A second writer in the same process is told so, not "another process". */
static void test_second_open_same_process(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_engine *w = tu_open(dir, NULL), *e2 = NULL;
  kvt_error_info info;
  assert_int_equal(kvt_engine_open_info(dir, NULL, &e2, &info), KVT_ELOCKED);
  assert_null(e2);
  assert_int_equal(info.code, KVT_ELOCKED);
  assert_has(info.got, "this process");
  assert_null(strstr(kvt_strerror(KVT_ELOCKED), "another process"));
  kvt_engine_close(w);
  assert_int_equal(kvt_engine_open_info(dir, NULL, &e2, &info), 0);
  assert_int_equal(info.code, 0);
  kvt_engine_close(e2);
  tu_rmtree(dir);
}

static void test_open_bad_option(void **state) {
  (void)state;
  kvt_options o;
  tu_opts(&o);
  o.io_depth = 5000;
  kvt_engine *e = NULL;
  kvt_error_info info;
  assert_int_equal(kvt_engine_open_info(NULL, &o, &e, &info), KVT_ENULL); /* no dir */
  o.flags = KVT_OPEN_METADATA_ONLY;
  assert_int_equal(kvt_engine_open_info(NULL, &o, &e, &info), KVT_EOPTION);
  assert_int_equal(info.code, KVT_EOPTION);
  assert_string_equal(info.field, "io_depth");
  assert_string_equal(info.got, "5000");
  assert_int_equal(kvt_engine_open(NULL, &o, &e), KVT_EOPTION);
}

/* Item 11: a writer with cold limit 0 on a store that has a cold tier is
 * refused with a clear error; the stored blocks stay reachable. */
static void test_cold_limit_zero_refused(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  kvt_engine *e = tu_open(dir, &o);
  kvt_shape sh = tu_shape_small(KVT_F32);
  kvt_ns_id ns = tu_register(e, "cold-zero", &sh);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  uint32_t tok[4] = {1, 2, 3, 4};
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  tu_append_put(s, &sh, 5, tok, &kv);
  kvt_seq_release(s);
  assert_int_equal(kvt_sync(e), 0);
  kvt_engine_close(e);

  kvt_options z;
  tu_opts(&z); /* cold limit 0 */
  kvt_engine *e2 = NULL;
  kvt_error_info info;
  assert_int_equal(kvt_engine_open_info(dir, &z, &e2, &info), KVT_EOPTION);
  assert_null(e2);
  assert_string_equal(info.field, "tier_bytes_limit[KVT_TIER_COLD]");
  assert_has(info.expected, "cold tier");

  /* With a limit (or read-only) the stored block is found. */
  e = tu_open(dir, &o);
  kvt_ns_id ns2 = tu_register(e, "cold-zero", &sh);
  size_t found = 0;
  assert_int_equal(kvt_lookup(e, ns2, tok, 4, NULL, 0, &found), 0);
  assert_int_equal(found, 1);
  kvt_engine_close(e);
  tu_kv_free(&kv);
  tu_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_register_bad_shape),
    cmocka_unit_test(test_register_conflict),
    cmocka_unit_test(test_seq_details),
    cmocka_unit_test(test_detail_per_thread),
    cmocka_unit_test(test_second_open_same_process),
    cmocka_unit_test(test_open_bad_option),
    cmocka_unit_test(test_cold_limit_zero_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
