/* test_eval_policy_engine.c - `kvtier eval` runs a policy on the K and V the
 * model computes under that policy: the policy's sequence must not share the
 * blocks of the full-cache first pass (same tokens, other K and V from layer
 * 1 on). Checked by running the same configuration in the plain engine and
 * with --cold (an engine of its own): the figures must be the same, and no
 * shared block may differ from the bytes the policy's decoder put. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"
#include "testutil.h"

/* A case skipped for want of its data: main exits 77, ctest says Skipped. */
static int g_skipped;

/* The shared fixture (fixture.h) under this file's names. */
static const char *const model = tf_model;

static int have_all(void) { return tf_have_bin_model(); }

/* Run kvtier with args, stdout into out; returns the exit status. */
static int run(const char *args, char *out, size_t cap) { return tf_run(args, out, cap); }

/* The number after "key": in a flat scan of the JSON text. */
static double json_num(const char *js, const char *key) { return tf_json_num(js, key); }

/* recent (a kept set fixed by the positions) and snapkv (scores from the
 * observed attention): plain and --cold agree to the last digit printed. */
static void check_policy(const char *policy) {
  static char plain[65536], cold[65536];
  char args[4096];
  snprintf(args, sizeof args,
           "eval --model %s --policy %s --sequences 1 --seed 1 --len 160 --block-tokens 16 "
           "--budget 0.25 --json",
           model, policy);
  assert_int_equal(run(args, plain, sizeof plain), 0);
  strcat(args, " --cold");
  assert_int_equal(run(args, cold, sizeof cold), 0);
  const char *keys[] = {"delta_nll", "kl", "top1", "kept_fraction", "missed_mass"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    double a = json_num(plain, keys[i]), b = json_num(cold, keys[i]);
    if (a != b) fail_msg("%s %s: %.9g in the plain engine, %.9g with --cold", policy, keys[i], a, b);
  }
  assert_true(json_num(plain, "delta_nll") > 0); /* the budget did evict something */
  assert_true(json_num(plain, "dedup_mismatches") == 0);
  assert_true(json_num(cold, "dedup_mismatches") == 0);
}

static void test_plain_equals_own_engine(void **state) {
  (void)state;
  if (!have_all()) {
    print_message("skipped: needs $KVTIER_BIN and %s (set KVTIER_DATA)\n", model);
    g_skipped = 1;
    skip();
  }
  check_policy("recent");
  check_policy("snapkv");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plain_equals_own_engine),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  return rc ? rc : g_skipped ? 77 : 0;
}
