/* test_profile.c - policy profiles (engine/profile.c, docs/policy.md
 * "Profiles"): a good one parses and its budgets are found; a truncated
 * one, another version, another shape, an unknown scorer, shares that do
 * not average to the budget or a share outside (0, 1] are each refused
 * with their own code and a detail that names the field. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/profile.h"
#include "testutil.h"

static const kvt_shape shape = {3, 2, 16, KVT_F16, 16};

typedef struct fx {
  char *dir;
  kvt_engine *e;
} fx;

static int setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  kvt_options o;
  tu_opts(&o);
  f->dir = tu_tmpdir();
  f->e = tu_open(f->dir, &o);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx *f = *state;
  kvt_engine_close(f->e);
  tu_rmtree(f->dir);
  free(f);
  return 0;
}

/* A profile's text with these fields; NULL scorers mean the defaults. */
static void make(char *buf, size_t len, unsigned version, unsigned layers, unsigned head_dim,
                 unsigned bt, const char *sc2, double s0, double s1, double s2) {
  snprintf(buf, len,
           "{\n  \"format\": \"kvtier-profile\",\n  \"version\": %u,\n  \"model\": \"t\",\n"
           "  \"shape\": {\"n_layers\": %u, \"n_kv_heads\": 2, \"head_dim\": %u, "
           "\"block_tokens\": %u},\n  \"profiles\": [\n"
           "    {\"budget\": 0.5, \"layers\": [{\"scorer\": \"recent\", \"share\": %.9f},\n"
           "      {\"scorer\": \"h2o\", \"share\": %.9f}, {\"scorer\": \"%s\", \"share\": %.9f}]},\n"
           "    {\"budget\": 0.25, \"layers\": [{\"scorer\": \"recent\", \"share\": 0.5},\n"
           "      {\"scorer\": \"recent\", \"share\": 0.125}, {\"scorer\": \"h2o\", \"share\": 0.125}]}\n"
           "  ]\n}\n",
           version, layers, head_dim, bt, s0, s1, sc2 ? sc2 : "sink-recent", s2);
}

static void good(char *buf, size_t len) { make(buf, len, 1, 3, 16, 16, NULL, 0.9, 0.4, 0.2); }

/* The call is refused with code, and the detail names field. */
static void refused(fx *f, const char *text, size_t len, int code, const char *field) {
  kvt_profile *p = (kvt_profile *)1;
  int rc = kvt_profile_parse(f->e, &shape, text, len, &p);
  if (rc != code) fail_msg("got %d (%s), want %d (%s)", rc, kvt_strerror(rc), code, kvt_strerror(code));
  assert_null(p);
  kvt_error_info info;
  assert_int_equal(kvt_last_error(f->e, &info), 0);
  assert_int_equal(info.code, code);
  if (!strstr(info.field, field)) fail_msg("detail field \"%s\", want \"%s\"", info.field, field);
}

static void test_good(void **state) {
  fx *f = *state;
  char buf[2048];
  good(buf, sizeof buf);
  kvt_profile *p = NULL;
  assert_int_equal(kvt_profile_parse(f->e, &shape, buf, strlen(buf), &p), 0);
  assert_int_equal(p->n_budgets, 2);
  assert_int_equal(p->n_layers, 3);
  int i = kvt_profile_pick(p, 0.5);
  assert_int_equal(i, 0);
  assert_int_equal(p->layers[1].scorer, KVT_SCORER_H2O);
  assert_int_equal(p->layers[2].scorer, KVT_SCORER_SINK_RECENT);
  assert_true(fabs(p->layers[0].share - 0.9) < 1e-12);
  assert_int_equal(kvt_profile_pick(p, 0.25), 1);
  assert_int_equal(p->layers[3 + 2].scorer, KVT_SCORER_H2O);
  assert_int_equal(kvt_profile_pick(p, 0.1), -1);
  assert_int_equal(kvt_profile_pick(p, 0), -1); /* two budgets: say which */
  kvt_profile_free(p);
}

/* Every cut before the closing brace is refused as corrupt. */
static void test_truncated(void **state) {
  fx *f = *state;
  char buf[2048];
  good(buf, sizeof buf);
  size_t end = (size_t)(strrchr(buf, '}') - buf);
  for (size_t n = 0; n < end; n++) refused(f, buf, n, KVT_ECORRUPT, "text");
}

static void test_version(void **state) {
  fx *f = *state;
  char buf[2048];
  make(buf, sizeof buf, 3, 3, 16, 16, NULL, 0.9, 0.4, 0.2);
  refused(f, buf, strlen(buf), KVT_EVERSION, "version");
}

static void test_shape(void **state) {
  fx *f = *state;
  char buf[2048];
  make(buf, sizeof buf, 1, 4, 16, 16, NULL, 0.9, 0.4, 0.2);
  refused(f, buf, strlen(buf), KVT_ESHAPE, "n_layers");
  make(buf, sizeof buf, 1, 3, 8, 16, NULL, 0.9, 0.4, 0.2);
  refused(f, buf, strlen(buf), KVT_ESHAPE, "head_dim");
  make(buf, sizeof buf, 1, 3, 16, 1, NULL, 0.9, 0.4, 0.2);
  refused(f, buf, strlen(buf), KVT_ESHAPE, "block_tokens");
}

static void test_scorer(void **state) {
  fx *f = *state;
  char buf[2048];
  make(buf, sizeof buf, 1, 3, 16, 16, "lru", 0.9, 0.4, 0.2);
  refused(f, buf, strlen(buf), KVT_EOPTION, "scorer");
  make(buf, sizeof buf, 1, 3, 16, 16, "auto", 0.9, 0.4, 0.2); /* a layer's own scorer */
  refused(f, buf, strlen(buf), KVT_EOPTION, "scorer");
  make(buf, sizeof buf, 1, 3, 16, 16, "full", 0.9, 0.4, 0.2); /* full keeps all: share 1 */
  refused(f, buf, strlen(buf), KVT_EOPTION, "share");
}

static void test_shares(void **state) {
  fx *f = *state;
  char buf[2048];
  make(buf, sizeof buf, 1, 3, 16, 16, NULL, 0.9, 0.4, 0.3); /* mean 0.533, budget 0.5 */
  refused(f, buf, strlen(buf), KVT_EOPTION, "share");
  make(buf, sizeof buf, 1, 3, 16, 16, NULL, 1.1, 0.2, 0.2); /* mean right, one above 1 */
  refused(f, buf, strlen(buf), KVT_EOPTION, "share");
  make(buf, sizeof buf, 1, 3, 16, 16, NULL, 0.75, 0.75, 0); /* mean right, one at 0 */
  refused(f, buf, strlen(buf), KVT_EOPTION, "share");
}

static void test_not_a_profile(void **state) {
  fx *f = *state;
  const char *t = "{\"format\": \"kvtier-predictor\", \"version\": 1}";
  refused(f, t, strlen(t), KVT_ECORRUPT, "format");
  t = "[1, 2]";
  refused(f, t, strlen(t), KVT_ECORRUPT, "text");
  char buf[2048];
  good(buf, sizeof buf);
  const char *third = ", {\"scorer\": \"h2o\", \"share\": 0.125}";
  char *cut = strstr(buf, third); /* 2 layers of 3 */
  assert_non_null(cut);
  memmove(cut, cut + strlen(third), strlen(cut + strlen(third)) + 1);
  refused(f, buf, strlen(buf), KVT_ECORRUPT, "layers");
}

static void check_mean(const double *share, double budget) {
  double sum = 0;
  for (int l = 0; l < 3; l++) {
    assert_true(share[l] > 0 && share[l] <= 1 + 1e-12);
    sum += share[l];
  }
  if (fabs(sum / 3 - budget) > 1e-9) fail_msg("mean share %.12f, budget %g", sum / 3, budget);
}

/* Any budget gets shares averaging to it: the entries' own, interpolated
 * between them, scaled outside them. */
static void test_shares_any_budget(void **state) {
  fx *f = *state;
  char buf[2048];
  good(buf, sizeof buf); /* 0.5: .9 .4 .2 (recent h2o sink-recent); 0.25: .5 .125 .125 */
  kvt_profile *p = NULL;
  assert_int_equal(kvt_profile_parse(f->e, &shape, buf, strlen(buf), &p), 0);
  uint32_t sc[3];
  double sh[3];
  kvt_profile_shares(p, 0.5, sc, sh);
  assert_true(fabs(sh[0] - 0.9) < 1e-12 && fabs(sh[2] - 0.2) < 1e-12);
  assert_int_equal(sc[2], KVT_SCORER_SINK_RECENT);
  kvt_profile_shares(p, 0.4, sc, sh); /* 60% of the way to 0.5 */
  check_mean(sh, 0.4);
  assert_true(fabs(sh[0] - (0.4 * 0.5 + 0.6 * 0.9)) < 1e-12);
  assert_int_equal(sc[2], KVT_SCORER_SINK_RECENT); /* the nearer entry's */
  kvt_profile_shares(p, 0.3, sc, sh);                /* nearer 0.25 */
  check_mean(sh, 0.3);
  assert_int_equal(sc[2], KVT_SCORER_H2O);
  const double outside[] = {0.05, 0.1, 0.6, 0.9, 1.0};
  for (size_t i = 0; i < sizeof outside / sizeof *outside; i++) {
    kvt_profile_shares(p, outside[i], sc, sh);
    check_mean(sh, outside[i]);
  }
  kvt_profile_shares(p, 0.1, sc, sh); /* 0.25's shares scaled by 0.4 */
  assert_true(fabs(sh[0] - 0.2) < 1e-12 && fabs(sh[1] - 0.05) < 1e-12);
  kvt_profile_shares(p, 0.7, sc, sh); /* 0.9 x 1.4 passes 1: held there */
  assert_true(sh[0] == 1);
  kvt_profile_free(p);
}

/* Through the public API: kvt_ns_load_profile() reads the file, refuses a
 * bad one without replacing the loaded one, and an "auto" sequence's
 * layers take the profile's scorers and shares. */
static void test_load_and_auto(void **state) {
  fx *f = *state;
  kvt_ns_id ns = tu_register(f->e, "profile-test", &shape);
  char path[2200], buf[2048];
  snprintf(path, sizeof path, "%s/p.json", f->dir);
  good(buf, sizeof buf);
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  fputs(buf, fp);
  fclose(fp);
  assert_int_equal(kvt_ns_load_profile(f->e, ns, path), 0);
  char bad[2200];
  snprintf(bad, sizeof bad, "%s/bad.json", f->dir);
  fp = fopen(bad, "w");
  assert_non_null(fp);
  fwrite(buf, 1, strlen(buf) / 2, fp); /* truncated */
  fclose(fp);
  assert_int_equal(kvt_ns_load_profile(f->e, ns, bad), KVT_ECORRUPT);
  snprintf(bad, sizeof bad, "%s/missing.json", f->dir);
  assert_true(kvt_ns_load_profile(f->e, ns, bad) == -ENOENT);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(f->e, ns, &s), 0);
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(kvt_policy_parse("auto", &p.scorer), 0);
  p.budget = 0.5;
  assert_int_equal(kvt_seq_set_policy(s, &p), 0);
  const uint32_t want_sc[3] = {KVT_SCORER_RECENT, KVT_SCORER_H2O, KVT_SCORER_SINK_RECENT};
  const double want_sh[3] = {0.9, 0.4, 0.2};
  for (uint32_t l = 0; l < 3; l++) {
    kvt_policy_info pi;
    assert_int_equal(kvt_seq_policy_info(s, l, &pi), 0);
    assert_int_equal(pi.scorer, want_sc[l]);
    assert_true(fabs(pi.share - want_sh[l]) < 1e-9);
  }
  kvt_seq_release(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_good, setup, teardown),
      cmocka_unit_test_setup_teardown(test_truncated, setup, teardown),
      cmocka_unit_test_setup_teardown(test_version, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shape, setup, teardown),
      cmocka_unit_test_setup_teardown(test_scorer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shares, setup, teardown),
      cmocka_unit_test_setup_teardown(test_not_a_profile, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shares_any_budget, setup, teardown),
      cmocka_unit_test_setup_teardown(test_load_and_auto, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
