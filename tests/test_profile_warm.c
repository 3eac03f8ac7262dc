/* test_profile_warm.c - version 2 of the policy profile (docs/policy.md):
 * per-layer warm parts are read, interpolated between budgets and given to
 * a sequence's layers ("auto"); a bad warm part is refused naming the
 * field; a version-1 profile is still read, its layers taking the
 * policy's warm part. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/profile.h"
#include "testutil.h"

static const kvt_shape shape = {3, 2, 16, KVT_F16, 16};

/* A profile of this version with these warm parts of layer 0 at budgets
 * 0.5 and 0.25 (others 0); version 1 writes none. */
static void make(char *buf, size_t len, unsigned version, const char *w05, const char *w025) {
  char a[64] = "", b[64] = "";
  if (version >= 2) {
    snprintf(a, sizeof a, ", \"warm\": %s", w05);
    snprintf(b, sizeof b, ", \"warm\": %s", w025);
  }
  snprintf(buf, len,
           "{\"format\": \"kvtier-profile\", \"version\": %u, \"model\": \"t\",\n"
           " \"shape\": {\"n_layers\": 3, \"n_kv_heads\": 2, \"head_dim\": 16, \"block_tokens\": 16},\n"
           " \"profiles\": [\n"
           "  {\"budget\": 0.5, \"layers\": [{\"scorer\": \"snapkv\", \"share\": 0.9%s},\n"
           "    {\"scorer\": \"h2o\", \"share\": 0.4}, {\"scorer\": \"recent\", \"share\": 0.2}]},\n"
           "  {\"budget\": 0.25, \"layers\": [{\"scorer\": \"snapkv\", \"share\": 0.5%s},\n"
           "    {\"scorer\": \"recent\", \"share\": 0.125}, {\"scorer\": \"h2o\", \"share\": 0.125}]}\n"
           " ]}\n",
           version, a, b);
}

static void test_warm_parts(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_engine *e = tu_open(dir, NULL);
  char buf[2048];
  kvt_profile *p = NULL;
  make(buf, sizeof buf, 2, "0.6", "0.2");
  assert_int_equal(kvt_profile_parse(e, &shape, buf, strlen(buf), &p), 0);
  double w[3];
  kvt_profile_warm(p, 0.5, w);
  assert_true(fabs(w[0] - 0.6) < 1e-12 && w[1] == 0 && w[2] == 0);
  kvt_profile_warm(p, 0.4, w); /* 60% of the way from 0.25 to 0.5 */
  assert_true(fabs(w[0] - (0.4 * 0.2 + 0.6 * 0.6)) < 1e-12);
  kvt_profile_warm(p, 0.1, w); /* outside: the nearest entry's */
  assert_true(fabs(w[0] - 0.2) < 1e-12);
  kvt_profile_free(p);
  /* refused: out of range, not a number */
  const char *bad[] = {"1", "-0.1", "\"x\""};
  const int code[] = {KVT_EOPTION, KVT_EOPTION, KVT_ECORRUPT};
  for (int i = 0; i < 3; i++) {
    make(buf, sizeof buf, 2, bad[i], "0.2");
    p = NULL;
    assert_int_equal(kvt_profile_parse(e, &shape, buf, strlen(buf), &p), code[i]);
    assert_null(p);
    kvt_error_info info;
    assert_int_equal(kvt_last_error(e, &info), 0);
    assert_non_null(strstr(info.field, "warm"));
  }
  /* version 1: no warm parts */
  make(buf, sizeof buf, 1, "", "");
  assert_int_equal(kvt_profile_parse(e, &shape, buf, strlen(buf), &p), 0);
  kvt_profile_warm(p, 0.5, w);
  assert_true(w[0] == 0 && w[1] == 0 && w[2] == 0);
  kvt_profile_free(p);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* Through the engine: "auto" gives each layer share x warm part (version
 * 2), or share x the policy's warm (version 1). */
static void test_auto_layers(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_engine *e = tu_open(dir, NULL);
  kvt_ns_id ns = tu_register(e, "pw", &shape);
  char path[4096], buf[2048];
  snprintf(path, sizeof path, "%s/p.json", dir);
  for (unsigned version = 1; version <= 2; version++) {
    make(buf, sizeof buf, version, "0.6", "0.2");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(buf, f);
    fclose(f);
    assert_int_equal(kvt_ns_load_profile(e, ns, path), 0);
    kvt_seq *s;
    assert_int_equal(kvt_seq_create(e, ns, &s), 0);
    kvt_policy p;
    kvt_policy_init(&p);
    assert_int_equal(kvt_policy_parse("auto", &p.scorer), 0);
    p.budget = 0.5;
    p.warm = 0.3;
    assert_int_equal(kvt_seq_set_policy(s, &p), 0);
    kvt_policy_info pi;
    assert_int_equal(kvt_seq_policy_info(s, 0, &pi), 0);
    assert_true(fabs(pi.warm_share - 0.9 * (version == 2 ? 0.6 : 0.3)) < 1e-9);
    assert_int_equal(kvt_seq_policy_info(s, 1, &pi), 0);
    assert_true(fabs(pi.warm_share - (version == 2 ? 0 : 0.4 * 0.3)) < 1e-9);
    kvt_seq_release(s);
  }
  kvt_engine_close(e);
  tu_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_warm_parts),
      cmocka_unit_test(test_auto_layers),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
