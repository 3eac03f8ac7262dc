/* test_tool_bpe.c - the reference tokenizer's BPE (tools/refmodel): the
 * O(n log n) merge gives exactly the ids of the plain rescan-everything
 * merge (kept here as the oracle) on random texts, ties included, with a
 * tokenizer built here and with tok512 when the data is there; and a
 * 256 KiB line encodes (the rescanning merge took minutes on 68 KB) into
 * pieces that spell the text back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refmodel.h"
#include "testutil.h"
#include "tool_files.h"

/* Pieces of the built tokenizer: specials, single characters, then merges
 * with many equal scores so that the leftmost-of-equals rule matters. */
static const char *const pieces[] = {
    "<unk>", "\n<s>\n", "\n</s>\n", " ", "a", "b", "c", "d", "ab", "ba", "aa", "bb", "abc",
    " a", " ab", "cd", "dc", "aaa", "abab", "cc", "dd", "ca", "ac", " b", "bc", "cb", "  ",
    "abcd", "dcba", "aab", "bba", " c", " d", "db", "bd", "ad", "da",
};
static const float scores[] = {
    0, 0, 0, -1, -1, -1, -1, -1, 1, 1, 1, 1, 2, 1, 3, 1, 1, 2, 2, 1, 1, 1, 1, 0.5f, 0.5f,
    0.5f, 0.5f, 4, 4, 2, 2, 0.5f, 0.5f, 1, 1, -2e10f, 1,
};
#define N_PIECES (sizeof pieces / sizeof pieces[0])
_Static_assert(sizeof scores / sizeof scores[0] == N_PIECES, "a score a piece");

static int piece_id(const rm_tokenizer *t, const char *s) {
  for (uint32_t i = 0; i < t->vocab_size; i++)
    if (strcmp(t->vocab[i], s) == 0) return (int)i;
  return -1;
}

/* The oracle: each round scans every adjacent pair and merges the best
 * scored (the leftmost of equals), as llama2.c's encode does. */
static size_t oracle_encode(const rm_tokenizer *t, const char *text, uint32_t *out) {
  size_t k = 0;
  out[k++] = RM_BOS;
  if (text[0]) out[k++] = (uint32_t)piece_id(t, " ");
  char cp[8];
  size_t cl = 0;
  for (const char *c = text; *c; c++) {
    if ((*c & 0xC0) != 0x80) cl = 0;
    cp[cl++] = *c;
    cp[cl] = 0;
    if ((c[1] & 0xC0) == 0x80 && cl < 4) continue;
    int id = piece_id(t, cp);
    if (id >= 0) out[k++] = (uint32_t)id;
    else
      for (size_t i = 0; i < cl; i++) out[k++] = (uint8_t)cp[i] + 3u;
    cl = 0;
  }
  char buf[2 * 4096 + 3];
  for (;;) {
    float best = -1e10f;
    int best_id = -1;
    size_t best_i = 0;
    for (size_t i = 1; i + 1 < k; i++) {
      snprintf(buf, sizeof buf, "%s%s", t->vocab[out[i]], t->vocab[out[i + 1]]);
      int id = piece_id(t, buf);
      if (id >= 0 && t->scores[id] > best) best = t->scores[id], best_id = id, best_i = i;
    }
    if (best_id < 0) return k;
    out[best_i] = (uint32_t)best_id;
    memmove(out + best_i + 1, out + best_i + 2, (k - best_i - 2) * sizeof *out);
    k--;
  }
}

static void load_built(rm_tokenizer *t, char **dir) {
  *dir = tu_tmpdir();
  char path[4200], err[512];
  snprintf(path, sizeof path, "%s/tok.bin", *dir);
  assert_int_equal(tf_write_tokenizer(path, pieces, scores, N_PIECES), 0);
  if (rm_tok_load(path, N_PIECES, t, err, sizeof err)) fail_msg("%s", err);
}

static void compare_random(const rm_tokenizer *t, const char *alphabet, int rounds, size_t max_len) {
  size_t na = strlen(alphabet);
  char *text = malloc(max_len + 1);
  uint32_t *want = malloc((max_len + 3) * sizeof *want), *got = malloc((max_len + 3) * sizeof *got);
  for (int r = 0; r < rounds; r++) {
    size_t len = 1 + tu_below((uint32_t)max_len);
    for (size_t i = 0; i < len; i++) text[i] = alphabet[tu_below((uint32_t)na)];
    text[len] = 0;
    size_t nw = oracle_encode(t, text, want), ng = 0;
    assert_int_equal(rm_tok_encode(t, text, 1, got, max_len + 3, &ng), 0);
    if (ng != nw || memcmp(got, want, nw * sizeof *got))
      fail_msg("text '%s': %zu ids, the oracle %zu (or they differ)", text, ng, nw);
  }
  free(text);
  free(want);
  free(got);
}

static void test_bpe_matches_oracle_built(void **state) {
  (void)state;
  rm_tokenizer t;
  char *dir;
  load_built(&t, &dir);
  compare_random(&t, "abcd  ", 3000, 120);
  compare_random(&t, "ab", 500, 300);
  rm_tok_free(&t);
  tu_rmtree(dir);
}

static void test_bpe_matches_oracle_tok512(void **state) {
  (void)state;
  const char *d = getenv("KVTIER_DATA"), *src = getenv("KVTIER_SRC");
  char path[4200], err[512];
  if (d) snprintf(path, sizeof path, "%s/models/tok512.bin", d);
  else snprintf(path, sizeof path, "%s/../shared/data/models/tok512.bin", src ? src : ".");
  rm_tokenizer t;
  if (access(path, R_OK) != 0) {
    print_message("skipped: no %s (set KVTIER_DATA)\n", path);
    skip();
  }
  if (rm_tok_load(path, 512, &t, err, sizeof err)) fail_msg("%s", err);
  compare_random(&t, "Once upon a time, the little dog said: \"hello!\" \xc3\xa9\xe2\x82\xac~\t", 400,
                 200);
  rm_tok_free(&t);
}

/* 256 KiB in one line: the pieces spell the text back (after BOS and the
 * leading space). Ended by the ctest timeout when the merge is quadratic. */
static void test_bpe_long_line(void **state) {
  (void)state;
  rm_tokenizer t;
  char *dir;
  load_built(&t, &dir);
  size_t len = 256u << 10;
  char *text = malloc(len + 1), *back = malloc(len + 2);
  uint32_t *ids = malloc((len + 3) * sizeof *ids);
  for (size_t i = 0; i < len; i++) text[i] = "abcd "[tu_below(5)];
  text[len] = 0;
  size_t n = 0;
  assert_int_equal(rm_tok_encode(&t, text, 1, ids, len + 3, &n), 0);
  assert_true(n > 1 && n <= len + 1);
  size_t at = 0;
  for (size_t i = 1; i < n; i++) {
    size_t pl = strlen(t.vocab[ids[i]]);
    assert_true(at + pl <= len + 1);
    memcpy(back + at, t.vocab[ids[i]], pl);
    at += pl;
  }
  assert_int_equal(at, len + 1);
  assert_int_equal(back[0], ' ');
  assert_memory_equal(back + 1, text, len);
  free(text);
  free(back);
  free(ids);
  rm_tok_free(&t);
  tu_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bpe_matches_oracle_built),
      cmocka_unit_test(test_bpe_matches_oracle_tok512),
      cmocka_unit_test(test_bpe_long_line),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
