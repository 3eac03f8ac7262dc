/* cold_fx.h - the harness of the cold tier's end-to-end tests (test_cold.c,
 * test_cold_fsck.c, test_cold_codec.c, test_cold_drop.c): each test is a
 * function of a fixture (a fresh directory, a seed, the backend) that
 * BOTH runs on io_uring and pread; the standard workload (cold_wl.h)
 * written by a writer, the store reopened and checked; and main().
 * Header only, like cold_wl.h. */
#ifndef KVT_COLD_FX_H
#define KVT_COLD_FX_H

#include "cold_wl.h"

typedef struct cold_fx {
  uint32_t backend;
  char *dir;                  /* fresh for each run, removed after it */
  uint64_t seed;              /* drawn for each run */
  kvt_ns_id ids[WL_N_NS];     /* fx_write's namespaces */
  kvt_seq *seqs[WL_MAX_SEQS]; /* fx_write's sequences, open until fx_close */
  kvt_shape sh;               /* fx_open_ns's namespace: its shape, id and KV salt */
  kvt_ns_id ns;
  uint64_t salt;
} cold_fx;

static inline void fx_init(cold_fx *f, uint32_t backend) {
  f->backend = backend;
  f->dir = tu_tmpdir();
  f->seed = tu_rand();
}

/* A test that needs another store: the old directory removed, a new one
 * and a new seed in its place. */
static inline void fx_renew(cold_fx *f) {
  tu_rmtree(f->dir);
  fx_init(f, f->backend);
}

/* The cold_util.h options with f's backend. */
static inline void fx_opts(const cold_fx *f, kvt_options *o) { cu_opts(o, f->backend); }

static inline kvt_engine *fx_open(const cold_fx *f) { return open_cold(f->dir, f->backend); }

/* A writer on f's store with options o, and in it the namespace `model`
 * of the small shape (tu_shape_small) in dtype: f->sh, f->ns, f->salt. */
static inline kvt_engine *fx_open_ns(cold_fx *f, const kvt_options *o, const char *model,
                                     uint32_t dtype) {
  kvt_engine *e = tu_open(f->dir, o);
  f->sh = tu_shape_small(dtype);
  f->ns = tu_register(e, model, &f->sh);
  f->salt = tu_salt(model);
  return e;
}

/* A writer on f's store with the standard workload written and synced
 * (wl_write); its sequences stay open in f->seqs. */
static inline kvt_engine *fx_write(cold_fx *f) {
  kvt_engine *e = fx_open(f);
  wl_write(e, f->seed, f->ids, f->seqs, cu_backend_name(f->backend));
  return e;
}

/* Release fx_write's sequences and close e. */
static inline void fx_close(cold_fx *f, kvt_engine *e) {
  release_all(f->seqs, WL_MAX_SEQS);
  kvt_engine_close(e);
}

/* Reopen f's store as a writer; both workload namespaces are there. */
static inline kvt_engine *fx_reopen(const cold_fx *f, kvt_ns_id ids[WL_N_NS]) {
  kvt_engine *e = fx_open(f);
  assert_int_equal(wl_ids(e, ids), 3);
  return e;
}

/* e's cold tier holds `records` token blocks, and fsck checks them all
 * and finds none bad. */
static inline void fx_assert_clean(kvt_engine *e, uint64_t records) {
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, records);
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.checked, records);
  assert_int_equal(fr.bad, 0);
}

/* One test run on one backend; with KVT_STRESS=1 ten times over (the
 * corrupted bytes, keys and data are random). */
static inline void fx_runs(void (*fn)(cold_fx *), uint32_t backend) {
  for (int i = 0; i < (tu_stress() ? 10 : 1); i++) {
    cold_fx f;
    fx_init(&f, backend);
    fn(&f);
    tu_rmtree(f.dir);
  }
}

/* Each test on both backends: fn_uring (skipped, with the reason printed,
 * where io_uring is unavailable) and fn_pread; BOTH_TESTS lists them. */
#define BOTH(fn)                                                                  \
  static void fn##_uring(void **state) {                                          \
    (void)state;                                                                  \
    CU_SKIP_UNLESS_BACKEND(KVT_BACKEND_URING);                                    \
    fx_runs(fn, KVT_BACKEND_URING);                                               \
  }                                                                               \
  static void fn##_pread(void **state) {                                          \
    (void)state;                                                                  \
    fx_runs(fn, KVT_BACKEND_PREAD);                                               \
  }
#define BOTH_TESTS(fn) cmocka_unit_test(fn##_uring), cmocka_unit_test(fn##_pread)

/* main() of a cold test: KVT_TEST_FILTER (a cmocka pattern) picks tests. */
static inline int fx_main(const struct CMUnitTest *tests, size_t n) {
  tu_seed();
  if (getenv("KVT_TEST_FILTER")) cmocka_set_test_filter(getenv("KVT_TEST_FILTER"));
  return tu_exit(_cmocka_run_group_tests("tests", tests, n, NULL, NULL));
}
#define FX_MAIN(tests) fx_main((tests), sizeof(tests) / sizeof *(tests))

#endif
