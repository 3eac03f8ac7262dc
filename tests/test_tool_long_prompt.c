/* test_tool_long_prompt.c - `kvtier warm --prompts` refuses a line longer
 * than the model's context can hold before encoding it (no piece is longer
 * than the tokenizer's longest, so the bytes bound the tokens from below):
 * a 5 MB line is refused at once, naming the file and line, where the
 * encoding used to run for days (a ctest timeout). Tiny model and tokenizer built here;
 * needs $KVTIER_BIN (skips without it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "tool_files.h"

enum { VOCAB = 300, CTX = 256 };

static void test_long_line_refused(void **state) {
  (void)state;
  static char pieces[VOCAB][16];
  const char *ptr[VOCAB];
  float scores[VOCAB];
  tf_vocab(pieces, ptr, scores, VOCAB);
  /* merges that the text below makes at every position: a merge that
   * rescans the line after each merge never ends on it */
  const char *merges[] = {"ab", "cd", "abcd", " a", "d ", "abcd "};
  for (int i = 0; i < 6; i++) {
    snprintf(pieces[VOCAB - 1 - i], 16, "%s", merges[i]);
    scores[VOCAB - 1 - i] = (float)(i + 1);
  }
  char *dir = tu_tmpdir(), model[4200], tok[4200], prompts[4200], cmd[16384], out[8192];
  snprintf(model, sizeof model, "%s/tiny.bin", dir);
  snprintf(tok, sizeof tok, "%s/tok.bin", dir);
  snprintf(prompts, sizeof prompts, "%s/prompts.txt", dir);
  assert_int_equal(tf_write_model(model, VOCAB, CTX), 0);
  assert_int_equal(tf_write_tokenizer(tok, ptr, scores, VOCAB), 0);
  FILE *f = fopen(prompts, "w");
  fprintf(f, "a short one\n");
  for (size_t i = 0; i < (5u << 20); i++) fputc("abcd "[i % 5], f);
  fputc('\n', f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "%s warm --model %s --tokenizer %s --prompts %s --dir %s/store",
           tf_bin(), model, tok, prompts, dir);
  int rc = tf_run(cmd, out, sizeof out);
  print_message("exit %d: %s", rc, out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, "prompts.txt line 2: 5242880 bytes, at least"));
  assert_non_null(strstr(out, "beyond the model's context (256)"));
  tu_rmtree(dir);
}

int main(void) {
  if (!tf_bin()) {
    fprintf(stderr, "skipped: needs $KVTIER_BIN\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_long_line_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
