/* test_tool_bad_input.c - the kvtier command refuses bad input files with
 * the file, line and field named: config.json sizes that are not positive
 * integers and unknown dtypes (plan --config); more hash ids than the
 * input has blocks and absurd timestamps (plan --trace); a NUL byte in a
 * config, a trace, a prompts file or a token file (it used to end the line
 * unseen). A tiny model built here; needs $KVTIER_BIN (skips without it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "tool_files.h"

static char *g_dir;

/* Write len bytes of data to dir/name; its path into path. */
static void put_file(const char *name, const char *data, size_t len, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", g_dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
}

/* kvtier ARGS exits 1 and says want. */
static void refused(const char *args, const char *want) {
  char cmd[16384], out[8192];
  snprintf(cmd, sizeof cmd, "%s %s", tf_bin(), args);
  int rc = tf_run(cmd, out, sizeof out);
  print_message("kvtier %s\n  exit %d: %s", args, rc, out);
  assert_int_equal(rc, 1);
  if (!strstr(out, want)) fail_msg("the message does not say '%s'", want);
}

static void test_plan_config(void **state) {
  (void)state;
  char path[4200], args[8000];
  const char neg[] = "{\n  \"num_hidden_layers\": 32,\n  \"num_attention_heads\": 32,\n"
                     "  \"num_key_value_heads\": -8,\n  \"hidden_size\": 4096\n}\n";
  put_file("neg.json", neg, sizeof neg - 1, path, sizeof path);
  snprintf(args, sizeof args, "plan --config %s", path);
  refused(args, "neg.json: line 4: num_key_value_heads: -8 is not a positive integer");
  const char dt[] = "{\n  \"num_hidden_layers\": 32,\n  \"num_attention_heads\": 32,\n"
                    "  \"hidden_size\": 4096,\n  \"torch_dtype\": \"float8\"\n}\n";
  put_file("dtype.json", dt, sizeof dt - 1, path, sizeof path);
  snprintf(args, sizeof args, "plan --config %s", path);
  refused(args, "dtype.json: line 5: torch_dtype: \"float8\" is not one of");
  const char nul[] = "{\n  \"num_hidden_layers\": 32,\n  \"num_attention_heads\": 3\0002,\n"
                     "  \"hidden_size\": 4096\n}\n";
  put_file("nul.json", nul, sizeof nul - 1, path, sizeof path);
  snprintf(args, sizeof args, "plan --config %s", path);
  refused(args, "nul.json: line 3: a NUL byte");
}

static void test_plan_trace(void **state) {
  (void)state;
  char path[4200], args[8000];
  const char *ok = "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}\n";
  size_t big = 65536 * 8 + 256;
  char *t = malloc(big);
  size_t n = (size_t)snprintf(t, big, "%s{\"timestamp\": 5, \"input_length\": 1, "
                              "\"output_length\": 1, \"hash_ids\": [", ok);
  for (int i = 0; i < 65536; i++) n += (size_t)snprintf(t + n, big - n, i ? ",%d" : "%d", i);
  n += (size_t)snprintf(t + n, big - n, "]}\n");
  put_file("ids.jsonl", t, n, path, sizeof path);
  snprintf(args, sizeof args, "plan --model llama-3.1-8b --trace %s", path);
  refused(args, "ids.jsonl: line 2: hash_ids: 65536 ids, more than the 1 blocks");
  n = (size_t)snprintf(t, big, "%s{\"timestamp\": 1e300, \"input_length\": 10, "
                       "\"output_length\": 1, \"hash_ids\": [7]}\n", ok);
  put_file("ts.jsonl", t, n, path, sizeof path);
  snprintf(args, sizeof args, "plan --model llama-3.1-8b --trace %s", path);
  refused(args, "ts.jsonl: line 2: timestamp beyond");
  n = (size_t)snprintf(t, big, "%s{\"timestamp\": 9, \"input_length\": 10, "
                       "\"output_length\": 1, \"hash_ids\": [7]}\n", ok);
  t[strlen(ok) + 20] = 0; /* inside the second line */
  put_file("nul.jsonl", t, n, path, sizeof path);
  snprintf(args, sizeof args, "plan --model llama-3.1-8b --trace %s", path);
  refused(args, "nul.jsonl: line 2: a NUL byte at column 21");
  free(t);
}

static void test_nul_in_prompts_and_tokens(void **state) {
  (void)state;
  enum { VOCAB = 300 };
  static char pieces[VOCAB][16];
  const char *ptr[VOCAB];
  float scores[VOCAB];
  tf_vocab(pieces, ptr, scores, VOCAB);
  char model[4200], tok[4200], path[4200], args[16000];
  snprintf(model, sizeof model, "%s/tiny.bin", g_dir);
  snprintf(tok, sizeof tok, "%s/tok.bin", g_dir);
  assert_int_equal(tf_write_model(model, VOCAB, 128), 0);
  assert_int_equal(tf_write_tokenizer(tok, ptr, scores, VOCAB), 0);
  const char prompts[] = "once upon a time\nthe\0 dog ran away\n";
  put_file("prompts.txt", prompts, sizeof prompts - 1, path, sizeof path);
  snprintf(args, sizeof args, "warm --model %s --tokenizer %s --prompts %s --dir %s/store", model,
           tok, path, g_dir);
  refused(args, "prompts.txt line 2: a NUL byte at column 4");
  const char ids[] = "5 6 7 8\n9 10\0 11 12\n";
  put_file("tokens.txt", ids, sizeof ids - 1, path, sizeof path);
  snprintf(args, sizeof args, "warm --model %s --tokens %s --dir %s/store", model, path, g_dir);
  refused(args, "tokens.txt line 2: a NUL byte at column 5");
}

int main(void) {
  if (!tf_bin()) {
    fprintf(stderr, "skipped: needs $KVTIER_BIN\n");
    return 77;
  }
  g_dir = tu_tmpdir();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_config),
      cmocka_unit_test(test_plan_trace),
      cmocka_unit_test(test_nul_in_prompts_and_tokens),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tu_rmtree(g_dir);
  return rc;
}
