/* test_tool_corrupt_prefix.c - `kvtier warm` and `kvtier demo` on a store
 * whose first stored block fails its checksum: the block is a miss, the
 * tools compute it (and the rest of that sequence) again and finish with
 * exit 0, instead of stopping at the first bad entry. A tiny model built
 * here; needs $KVTIER_BIN (skips without it). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "tool_files.h"

/* Flip one byte inside the first layer slice of the first record of the
 * first segment (the record header takes the first 4 KiB). */
static void corrupt_first_record(const char *store) {
  char segdir[4200], path[4500], best[256] = "";
  snprintf(segdir, sizeof segdir, "%s/segments", store);
  DIR *d = opendir(segdir);
  assert_non_null(d);
  for (struct dirent *e; (e = readdir(d));)
    if (strncmp(e->d_name, "seg-", 4) == 0 && (!best[0] || strcmp(e->d_name, best) < 0))
      snprintf(best, sizeof best, "%s", e->d_name);
  closedir(d);
  assert_true(best[0]);
  snprintf(path, sizeof path, "%s/%s", segdir, best);
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, 4096 + 100, SEEK_SET), 0);
  int c = fgetc(f);
  assert_true(c != EOF);
  assert_int_equal(fseek(f, 4096 + 100, SEEK_SET), 0);
  fputc(c ^ 0x5a, f);
  assert_int_equal(fclose(f), 0);
}

static uint64_t json_u(const char *text, const char *key) {
  char pat[80];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(text, pat);
  if (!p) fail_msg("no \"%s\" in: %s", key, text);
  return strtoull(p + strlen(pat), NULL, 10);
}

static void test_warm_recomputes_a_corrupt_block(void **state) {
  (void)state;
  char *dir = tu_tmpdir(), model[4200], toks[4200], cmd[16384], out[8192], store[4200];
  snprintf(model, sizeof model, "%s/tiny.bin", dir);
  snprintf(toks, sizeof toks, "%s/tokens.txt", dir);
  snprintf(store, sizeof store, "%s/store", dir);
  assert_int_equal(tf_write_model(model, 64, 128), 0);
  /* one sequence of 3 full blocks and a partial one */
  FILE *f = fopen(toks, "w");
  for (int i = 0; i < 56; i++) fprintf(f, "%d%c", 3 + (i * 11) % 60, i < 55 ? ' ' : '\n');
  fclose(f);
  snprintf(cmd, sizeof cmd, "%s warm --model %s --tokens %s --dir %s --json", tf_bin(), model, toks,
           store);
  assert_int_equal(tf_run(cmd, out, sizeof out), 0);
  assert_int_equal(json_u(out, "blocks_written"), 3);
  /* the sequence again, one token longer than a 4th block: it resumes from
   * the 3 stored blocks, the first of which is now bad */
  corrupt_first_record(store);
  f = fopen(toks, "w");
  for (int i = 0; i < 70; i++) fprintf(f, "%d%c", 3 + (i * 11) % 60, i < 69 ? ' ' : '\n');
  fclose(f);
  int rc = tf_run(cmd, out, sizeof out);
  print_message("exit %d: %s", rc, out);
  assert_int_equal(rc, 0);
  assert_int_equal(json_u(out, "tokens_computed"), 64); /* all 4 blocks: the bad one and on */
  assert_int_equal(json_u(out, "blocks_deduplicated"), 0);
  assert_true(json_u(out, "blocks_written") >= 2); /* the bad block again, and the 4th */
  /* a third run finds everything stored and sound */
  rc = tf_run(cmd, out, sizeof out);
  print_message("exit %d: %s", rc, out);
  assert_int_equal(rc, 0);
  assert_int_equal(json_u(out, "tokens_computed"), 0);
  snprintf(cmd, sizeof cmd, "%s fsck %s", tf_bin(), store);
  rc = tf_run(cmd, out, sizeof out);
  print_message("fsck exit %d: %s", rc, out);
  assert_int_equal(rc, 0);
  tu_rmtree(dir);
}

static void test_demo_recomputes_a_corrupt_block(void **state) {
  (void)state;
  char *dir = tu_tmpdir(), cmd[16384], out[16384], store[4200];
  snprintf(store, sizeof store, "%s/demo", dir);
  snprintf(cmd, sizeof cmd, "%s demo --dir %s --agents 1 --json", tf_bin(), store);
  assert_int_equal(tf_run(cmd, out, sizeof out), 0);
  corrupt_first_record(store);
  int rc = tf_run(cmd, out, sizeof out);
  print_message("exit %d: %.600s\n", rc, out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "\"verified\":true"));
  assert_int_equal(json_u(out, "token_blocks_load_missed"), 1);
  assert_int_equal(json_u(out, "token_blocks_computed"), 128); /* the bad block and on */
  rc = tf_run(cmd, out, sizeof out);
  assert_int_equal(rc, 0);
  assert_int_equal(json_u(out, "token_blocks_load_missed"), 0);
  assert_int_equal(json_u(out, "token_blocks_computed"), 0);
  tu_rmtree(dir);
}

int main(void) {
  if (!tf_bin()) {
    fprintf(stderr, "skipped: needs $KVTIER_BIN\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_warm_recomputes_a_corrupt_block),
      cmocka_unit_test(test_demo_recomputes_a_corrupt_block),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
