/* test_tool_small_vocab.c - `kvtier warm --prompts` with a vocabulary of
 * 100 pieces (no byte pieces): a byte the vocabulary cannot spell is
 * refused with the file, line and column, not looked up past the
 * vocabulary (byte fallback is byte + 3, up to 258). A tiny model and
 * tokenizer built here; needs $KVTIER_BIN (skips without it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refmodel.h"
#include "testutil.h"
#include "tool_files.h"

enum { VOCAB = 100 };

static char dir_model[4200], dir_tok[4200];

static void write_files(const char *dir) {
  static char pieces[VOCAB][16];
  const char *ptr[VOCAB];
  float scores[VOCAB];
  tf_vocab(pieces, ptr, scores, VOCAB);
  snprintf(dir_model, sizeof dir_model, "%s/tiny.bin", dir);
  snprintf(dir_tok, sizeof dir_tok, "%s/tok100.bin", dir);
  assert_int_equal(tf_write_model(dir_model, VOCAB, 128), 0);
  assert_int_equal(tf_write_tokenizer(dir_tok, ptr, scores, VOCAB), 0);
}

/* The library: rm_tok_encode says which byte, never reads past vocab. */
static void test_encode_small_vocab(void **state) {
  (void)state;
  char *dir = tu_tmpdir(), err[512];
  write_files(dir);
  rm_tokenizer t;
  if (rm_tok_load(dir_tok, VOCAB, &t, err, sizeof err)) fail_msg("%s", err);
  uint32_t ids[64];
  size_t n = 0;
  assert_int_equal(rm_tok_encode(&t, "hello world", 1, ids, 64, &n), 0);
  for (size_t i = 0; i < n; i++) assert_true(ids[i] < VOCAB);
  assert_int_equal(rm_tok_encode(&t, "abc~def", 1, ids, 64, &n), -2);
  assert_int_equal(n, 3); /* '~' is byte 3 */
  assert_int_equal(rm_tok_encode(&t, "caf\xc3\xa9", 1, ids, 64, &n), -2);
  assert_int_equal(n, 3);
  rm_tok_free(&t);
  tu_rmtree(dir);
}

static void test_warm_prompts_small_vocab(void **state) {
  (void)state;
  char *dir = tu_tmpdir(), prompts[4200], cmd[16384], out[8192];
  write_files(dir);
  snprintf(prompts, sizeof prompts, "%s/prompts.txt", dir);
  FILE *f = fopen(prompts, "w");
  fprintf(f, "once upon a time there was a dog\n");
  for (int b = 0x7e; b <= 0xff; b++) fputc(b == '\n' ? 'x' : b, f); /* ids 129 .. 258 */
  fputc('\n', f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "%s warm --model %s --tokenizer %s --prompts %s --dir %s/store",
           tf_bin(), dir_model, dir_tok, prompts, dir);
  int rc = tf_run(cmd, out, sizeof out);
  print_message("exit %d: %s", rc, out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, "prompts.txt line 2: byte 0x7e at column 1"));

  f = fopen(prompts, "w"); /* spelled by the vocabulary: warmed */
  fprintf(f, "once upon a time there was a dog and a cat and a bird in a tree\n");
  fclose(f);
  rc = tf_run(cmd, out, sizeof out);
  print_message("exit %d: %s", rc, out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "sequences"));
  tu_rmtree(dir);
}

int main(void) {
  if (!tf_bin()) {
    fprintf(stderr, "skipped: needs $KVTIER_BIN\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_encode_small_vocab),
      cmocka_unit_test(test_warm_prompts_small_vocab),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
