/* test_tool_warm_rate.c - `kvtier warm --json` reports tokens_per_s null
 * when it computed nothing (every block stored already), not the tokens it
 * merely looked up divided by the time. A tiny model built here; needs
 * $KVTIER_BIN (skips without it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "tool_files.h"

static void test_warm_rate_when_nothing_computed(void **state) {
  (void)state;
  char *dir = tu_tmpdir(), model[4200], toks[4200], cmd[16384], out[8192];
  snprintf(model, sizeof model, "%s/tiny.bin", dir);
  snprintf(toks, sizeof toks, "%s/tokens.txt", dir);
  assert_int_equal(tf_write_model(model, 64, 128), 0);
  FILE *f = fopen(toks, "w");
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < 40; i++) fprintf(f, "%d%c", 3 + (i * 7 + s * 13) % 60, i < 39 ? ' ' : '\n');
  fclose(f);
  snprintf(cmd, sizeof cmd, "%s warm --model %s --tokens %s --dir %s/store --json", tf_bin(), model,
           toks, dir);
  assert_int_equal(tf_run(cmd, out, sizeof out), 0);
  print_message("first:  %s", out);
  assert_non_null(strstr(out, "\"tokens_computed\":64,"));
  const char *r = strstr(out, "\"tokens_per_s\":");
  assert_non_null(r);
  assert_true(strtod(r + strlen("\"tokens_per_s\":"), NULL) > 0);

  assert_int_equal(tf_run(cmd, out, sizeof out), 0);
  print_message("second: %s", out);
  assert_non_null(strstr(out, "\"tokens_computed\":0,"));
  assert_non_null(strstr(out, "\"tokens_per_s\":null"));

  snprintf(cmd, sizeof cmd, "%s warm --model %s --tokens %s --dir %s/store", tf_bin(), model, toks,
           dir);
  assert_int_equal(tf_run(cmd, out, sizeof out), 0);
  assert_non_null(strstr(out, "nothing computed"));
  assert_null(strstr(out, "tokens/s"));
  tu_rmtree(dir);
}

int main(void) {
  if (!tf_bin()) {
    fprintf(stderr, "skipped: needs $KVTIER_BIN\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_warm_rate_when_nothing_computed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
