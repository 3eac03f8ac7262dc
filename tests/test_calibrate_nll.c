/* test_calibrate_nll.c - `kvtier calibrate --objective nll` on a tiny run of
 * the real model: the profile it chooses is no worse than the uniform scorer
 * it started from, both recomputed independently by `kvtier eval` on the same
 * sequences, and its reported figures are eval's; bad options are refused
 * with a clear message. Needs $KVTIER_BIN and the model; skips without. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

static int g_skipped;
static char model[2200], bin[2200], prof[128];

static int have_all(void) {
  const char *d = getenv("KVTIER_DATA"), *src = getenv("KVTIER_SRC"), *b = getenv("KVTIER_BIN");
  if (d) snprintf(model, sizeof model, "%s/models/stories260K.bin", d);
  else snprintf(model, sizeof model, "%s/../shared/data/models/stories260K.bin", src ? src : ".");
  snprintf(bin, sizeof bin, "%s", b ? b : "");
  return b && access(bin, X_OK) == 0 && access(model, R_OK) == 0;
}

#define NEED_ALL()                                                                  \
  do {                                                                              \
    if (!have_all()) {                                                              \
      print_message("skipped: needs $KVTIER_BIN and %s (set KVTIER_DATA)\n", model); \
      g_skipped = 1;                                                                \
      skip();                                                                       \
    }                                                                               \
  } while (0)

/* Run kvtier with args: stdout into out, stderr into err (either may be
 * NULL); the exit status. */
static int run(const char *args, char *out, size_t cap, char *err, size_t err_cap) {
  char cmd[8192], path[64];
  snprintf(path, sizeof path, "/tmp/kvt_cnll_err_%d", (int)getpid());
  snprintf(cmd, sizeof cmd, "%s %s 2>%s", bin, args, path);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  static char sink[65536];
  if (!out) {
    out = sink;
    cap = sizeof sink;
  }
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  FILE *f = fopen(path, "r");
  if (err && f) err[fread(err, 1, err_cap - 1, f)] = 0;
  if (f) fclose(f);
  unlink(path);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The number after "key": in a flat scan of the JSON text. */
static double json_num(const char *js, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(js, pat);
  if (!p) fail_msg("key %s missing in %s", key, js);
  return strtod(p + strlen(pat), NULL);
}

#define SET "--sequences 2 --seed 5000 --len 160 --block-tokens 16 --budget 0.25"

/* kvtier eval's delta NLL (and kept fraction) of one policy on the set. */
static double eval_delta(const char *policy, double *kept) {
  static char out[65536];
  char args[4096];
  snprintf(args, sizeof args, "eval --model %s " SET " %s --json", model, policy);
  assert_int_equal(run(args, out, sizeof out, NULL, 0), 0);
  *kept = json_num(out, "kept_fraction");
  return json_num(out, "delta_nll");
}

static void test_chosen_beats_start(void **state) {
  (void)state;
  NEED_ALL();
  static char out[65536];
  char args[4096];
  snprintf(prof, sizeof prof, "/tmp/kvt_cnll_%d.json", (int)getpid());
  snprintf(args, sizeof args,
           "calibrate --objective nll --model %s " SET
           " --scorers snapkv,tova --max-evals 12 --json -o %s",
           model, prof);
  assert_int_equal(run(args, out, sizeof out, NULL, 0), 0);
  /* the start: the better uniform scorer, named in the summary */
  const char *st = strstr(out, "\"start\":\"");
  assert_non_null(st);
  char start[32] = {0};
  sscanf(st + 9, "%31[a-z-]", start);
  assert_true(strcmp(start, "snapkv") == 0 || strcmp(start, "tova") == 0);
  double cal_start = json_num(out, "start_delta_nll"), cal_best = json_num(out, "delta_nll");
  assert_true(json_num(out, "moves") >= 1); /* the search found a better point */

  char pol[512];
  double kept_u, kept_p;
  snprintf(pol, sizeof pol, "--policy %s", start);
  double uni = eval_delta(pol, &kept_u);
  snprintf(pol, sizeof pol, "--policy auto --profile %s", prof);
  double chosen = eval_delta(pol, &kept_p);
  unlink(prof);
  print_message("uniform %s %.6f (calibrate %.6f), chosen %.6f (calibrate %.6f)\n", start, uni,
                cal_start, chosen, cal_best);
  /* recomputed by eval: the figures calibrate chose by are eval's */
  assert_true(fabs(uni - cal_start) < 1e-6);
  assert_true(fabs(chosen - cal_best) < 1e-6);
  assert_true(chosen < uni);
  assert_true(kept_p <= 0.25 + 0.005); /* within the byte budget */
}

/* Each bad command line: its exit status and a word of its message. */
static void test_bad_options(void **state) {
  (void)state;
  NEED_ALL();
  struct {
    const char *args;
    int status;
    const char *says;
  } cases[] = {
      {"--objective nll --budget 0.25 -o /tmp/kvt_cnll_never.json", 2, "needs --model"},
      {"--objective nll --model M --budget 0.25", 2, "-o PROFILE is required"},
      {"--objective nll --model M --budget 1.5 -o /tmp/kvt_cnll_never.json", 2, "--budget takes fractions"},
      {"--objective nll --model M --budget 0.25 --scorers learned -o /tmp/kvt_cnll_never.json", 2,
       "needs --predictor"},
      {"--objective nll --model M --budget 0.25 --scorers auto -o /tmp/kvt_cnll_never.json", 2,
       "--scorers takes"},
      {"--objective nll --model M --budget 0.25 --warm 0,1 -o /tmp/kvt_cnll_never.json", 2, "--warm takes"},
      {"--objective nll --model M --budget 0.25 --max-evals 1 -o /tmp/kvt_cnll_never.json", 2,
       "--max-evals must cover"},
      {"--objective nll --model /nonexistent.bin --budget 0.25 -o /tmp/kvt_cnll_never.json", 1,
       "cannot load the model"},
      {"--objective nll --model M --budget 0.25 --sequences 1 --len 70 --scorers snapkv "
       "--predictor /nonexistent.pred -o /tmp/kvt_cnll_never.json", 1, "nonexistent.pred"},
      {"--objective sideways --trace t --budget 0.25 -o /tmp/kvt_cnll_never.json", 2, "--objective takes"},
  };
  unlink("/tmp/kvt_cnll_never.json");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char args[8192], err[8192], a[4096];
    const char *m = strstr(cases[i].args, "--model M");
    if (m) /* the real model in place of M */
      snprintf(a, sizeof a, "%.*s--model %s%s", (int)(m - cases[i].args), cases[i].args, model,
               m + 9);
    else snprintf(a, sizeof a, "%s", cases[i].args);
    snprintf(args, sizeof args, "calibrate %s", a);
    int st = run(args, NULL, 0, err, sizeof err);
    if (st != cases[i].status || !strstr(err, cases[i].says))
      fail_msg("kvtier %s: status %d (want %d), stderr: %s (want \"%s\")", args, st,
               cases[i].status, err, cases[i].says);
  }
  assert_int_equal(access("/tmp/kvt_cnll_never.json", F_OK), -1); /* nothing written */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chosen_beats_start),
      cmocka_unit_test(test_bad_options),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  return rc ? rc : g_skipped ? 77 : 0;
}
