/* test_calibrate.c - `kvtier calibrate` end to end on synthetic traces
 * (no model needed): a layer whose attention sits on one block gets a
 * smaller budget share than a layer whose attention is spread, the profile
 * it writes loads through the engine's parser for that shape, and traces
 * it cannot use (not full-cache, truncated) are refused with a message.
 * Runs the kvtier binary ($KVTIER_BIN); skips without it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/profile.h"
#include "testutil.h"
#include "trace.h"

#define S_LAYERS 3u
/* One token a block: the tail the budget counts is at most a token, so a
 * layer whose attention sits on the newest block needs almost nothing
 * (with 16-token blocks the tail alone is a large part of a short
 * context's budget, and even that layer needs a share to cover it). */
#define S_BT 1u
#define S_LEN 320u
#define S_SEQS 2u

static char bin[2200];
static int g_skipped;

static int have_bin(void) {
  const char *b = getenv("KVTIER_BIN");
  snprintf(bin, sizeof bin, "%s", b ? b : "");
  return b && access(bin, X_OK) == 0;
}

#define NEED_BIN()                                                  \
  do {                                                              \
    if (!have_bin()) {                                              \
      print_message("skipped: needs $KVTIER_BIN\n");                \
      g_skipped = 1;                                                \
      skip();                                                       \
    }                                                               \
  } while (0)

/* Run kvtier with args, stderr into err; the exit status. */
static int run(const char *args, char *err, size_t cap) {
  char cmd[8192], path[64];
  snprintf(path, sizeof path, "/tmp/kvt_calib_err_%d", (int)getpid());
  snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s", bin, args, path);
  int st = system(cmd);
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(err, 1, cap - 1, f) : 0;
  err[n] = 0;
  if (f) fclose(f);
  unlink(path);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Layer 0: all mass on the newest block; layer 1: spread evenly; layer
 * 2: half on the newest, half spread. hot_share 1 and scorer 0 make it a
 * full-cache trace unless `share` says otherwise. */
static void write_trace(const char *path, double share) {
  trace_hdr h = {.n_layers = S_LAYERS, .n_q_heads = 2, .n_kv_heads = 1, .head_dim = 8,
                 .block_tokens = S_BT, .seq_len = 512, .scorer = 0, .hot_share = share};
  snprintf(h.model, sizeof h.model, "synthetic");
  trace_w *w;
  assert_int_equal(trace_open(path, &h, &w), 0);
  kvt_gathered g[S_LEN / S_BT];
  float mass[S_LEN / S_BT];
  for (uint32_t s = 0; s < S_SEQS; s++)
    for (uint32_t pos = S_BT; pos + 1 < S_LEN; pos++) { /* as kvtier eval writes them */
      uint32_t n = pos / S_BT;
      for (uint32_t b = 0; b < n; b++) g[b] = (kvt_gathered){.block = b, .token_pos = b * S_BT};
      for (uint32_t l = 0; l < S_LAYERS; l++) {
        for (uint32_t b = 0; b < n; b++) {
          float spread = 2.0f / (float)n, top = b + 1 == n ? 2.0f : 0.0f;
          mass[b] = l == 0 ? top : l == 1 ? spread : 0.5f * (top + spread);
        }
        assert_int_equal(trace_step(w, s, pos, l, g, mass, NULL, n), 0);
      }
    }
  assert_int_equal(trace_close(w), 0);
}

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static char buf[1 << 16];
  *len = fread(buf, 1, sizeof buf - 1, f);
  buf[*len] = 0;
  fclose(f);
  return buf;
}

static void test_concentrated_gets_less(void **state) {
  (void)state;
  NEED_BIN();
  char *dir = tu_tmpdir(), trace[2200], prof[2200], args[8192], err[4096];
  snprintf(trace, sizeof trace, "%s/t.trace", dir);
  snprintf(prof, sizeof prof, "%s/p.json", dir);
  write_trace(trace, 1.0);
  snprintf(args, sizeof args, "calibrate --trace %s --budget 0.25,0.5 --grid 20 -o %s", trace, prof);
  int rc = run(args, err, sizeof err);
  if (rc) fail_msg("calibrate exited %d: %s", rc, err);
  /* the profile loads for this shape, through the engine */
  kvt_options o;
  tu_opts(&o);
  char *edir = tu_tmpdir();
  kvt_engine *e = tu_open(edir, &o);
  kvt_shape sh = {S_LAYERS, 1, 8, KVT_F32, S_BT};
  size_t len;
  const char *text = read_all(prof, &len);
  kvt_profile *p = NULL;
  assert_int_equal(kvt_profile_parse(e, &sh, text, len, &p), 0);
  assert_int_equal(p->n_budgets, 2);
  for (int i = 0; i < 2; i++) {
    double budget = i ? 0.5 : 0.25, sum = 0;
    int k = kvt_profile_pick(p, budget);
    assert_true(k >= 0);
    const kvt_profile_layer *ly = p->layers + (size_t)k * S_LAYERS;
    print_message("budget %g: shares %.4f %.4f %.4f\n", budget, ly[0].share, ly[1].share,
                  ly[2].share);
    for (uint32_t l = 0; l < S_LAYERS; l++) sum += ly[l].share;
    assert_true(fabs(sum / S_LAYERS - budget) < 1e-6);
    /* concentrated < spread; the half-and-half layer loses half as fast
     * as the spread one, so it gets the budget only once that has its fill */
    assert_true(ly[0].share < ly[1].share);
    assert_true(ly[0].share <= ly[2].share && ly[2].share <= ly[1].share);
    if (budget == 0.5) assert_true(ly[0].share < ly[2].share && ly[1].share >= 0.9);
  }
  kvt_profile_free(p);
  kvt_engine_close(e);
  tu_rmtree(edir);
  tu_rmtree(dir);
}

/* --layer-weights: weighting the half-and-half layer 10 times and the
 * spread one not at all moves the budget from the spread layer to it;
 * a wrong count of weights is a usage error. */
static void test_layer_weights(void **state) {
  (void)state;
  NEED_BIN();
  char *dir = tu_tmpdir(), trace[2200], prof[2200], args[8192], err[4096];
  snprintf(trace, sizeof trace, "%s/t.trace", dir);
  snprintf(prof, sizeof prof, "%s/p.json", dir);
  write_trace(trace, 1.0);
  snprintf(args, sizeof args,
           "calibrate --trace %s --budget 0.25 --grid 20 --layer-weights 1,0,10 -o %s", trace,
           prof);
  int rc = run(args, err, sizeof err);
  if (rc) fail_msg("calibrate exited %d: %s", rc, err);
  kvt_options o;
  tu_opts(&o);
  char *edir = tu_tmpdir();
  kvt_engine *e = tu_open(edir, &o);
  kvt_shape sh = {S_LAYERS, 1, 8, KVT_F32, S_BT};
  size_t len;
  const char *text = read_all(prof, &len);
  kvt_profile *p = NULL;
  assert_int_equal(kvt_profile_parse(e, &sh, text, len, &p), 0);
  print_message("weighted shares %.4f %.4f %.4f\n", p->layers[0].share, p->layers[1].share,
                p->layers[2].share);
  assert_true(p->layers[2].share > p->layers[1].share); /* unweighted: 0.05 against 0.65 */
  kvt_profile_free(p);
  kvt_engine_close(e);
  tu_rmtree(edir);
  snprintf(args, sizeof args,
           "calibrate --trace %s --budget 0.25 --grid 20 --layer-weights 1,0 -o %s", trace, prof);
  assert_int_equal(run(args, err, sizeof err), 2);
  assert_non_null(strstr(err, "fewer weights"));
  tu_rmtree(dir);
}

static void test_refuses_unusable_traces(void **state) {
  (void)state;
  NEED_BIN();
  char *dir = tu_tmpdir(), trace[2200], prof[2200], args[8192], err[4096];
  snprintf(trace, sizeof trace, "%s/t.trace", dir);
  snprintf(prof, sizeof prof, "%s/p.json", dir);
  write_trace(trace, 0.5); /* made under a budget: not every block is there */
  snprintf(args, sizeof args, "calibrate --trace %s --budget 0.5 --grid 10 -o %s", trace, prof);
  assert_int_equal(run(args, err, sizeof err), 1);
  assert_non_null(strstr(err, "not a full-cache trace"));
  write_trace(trace, 1.0);
  assert_int_equal(truncate(trace, 128 + 16 * 40 + 7), 0); /* inside a record */
  assert_int_equal(run(args, err, sizeof err), 1);
  assert_non_null(strstr(err, "truncated"));
  assert_int_equal(access(prof, F_OK), -1); /* nothing written */
  snprintf(args, sizeof args, "calibrate --trace %s --budget 1.5 -o %s", trace, prof);
  assert_int_equal(run(args, err, sizeof err), 2);
  tu_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_concentrated_gets_less),
      cmocka_unit_test(test_refuses_unusable_traces),
      cmocka_unit_test(test_layer_weights),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  return rc ? rc : g_skipped ? 77 : 0;
}
