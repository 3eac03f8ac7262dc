/* test_calib_learned.c - `kvtier calibrate --predictor`: the replay runs the
 * learned scorer with the namespace's predictor and keys carrying the
 * per-layer key norms the trace recorded, so a predictor that ranks by key
 * norm keeps the blocks attention sits on, and calibrate picks it. Runs the
 * kvtier binary ($KVTIER_BIN); skips without it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/predictor.h"
#include "engine/profile.h"
#include "testutil.h"
#include "tool_files.h"
#include "trace.h"

#define S_LAYERS 2u
#define S_LEN 200u
#define S_SEQS 2u
#define S_GRID 10u

static int g_skipped;

/* In layer l, blocks b with b % 3 == l are "heavy": key norm 4 (the others
 * 1), and every step's attention mass is spread evenly over the heavy
 * blocks only. The two layers differ, so a replay that took one layer's
 * norms for all would keep the wrong blocks in the other. with_norms 0
 * writes every key norm as 0 (the same masses). */
static void write_trace(const char *path, int with_norms) {
  trace_hdr h = {.n_layers = S_LAYERS, .n_q_heads = 2, .n_kv_heads = 1, .head_dim = 8,
                 .block_tokens = 1, .seq_len = 512, .scorer = 0, .hot_share = 1.0};
  snprintf(h.model, sizeof h.model, "synthetic");
  trace_w *w;
  assert_int_equal(trace_open(path, &h, &w), 0);
  static kvt_gathered g[S_LEN];
  static float mass[S_LEN], norm[S_LEN];
  for (uint32_t s = 0; s < S_SEQS; s++)
    for (uint32_t pos = 1; pos + 1 < S_LEN; pos++) {
      uint32_t n = pos;
      for (uint32_t b = 0; b < n; b++) g[b] = (kvt_gathered){.block = b, .token_pos = b};
      for (uint32_t l = 0; l < S_LAYERS; l++) {
        uint32_t heavy = 0;
        for (uint32_t b = 0; b < n; b++) heavy += b % 3 == l;
        for (uint32_t b = 0; b < n; b++) {
          int hv = b % 3 == l;
          /* before the first heavy block exists, spread over all */
          mass[b] = heavy ? (hv ? 2.0f / (float)heavy : 0) : 2.0f / (float)n;
          norm[b] = hv ? 4.0f : 1.0f;
        }
        assert_int_equal(trace_step(w, s, pos, l, g, mass, with_norms ? norm : NULL, n), 0);
      }
    }
  assert_int_equal(trace_close(w), 0);
}

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A linear shared predictor (docs/policy.md layout) whose only weight is 1
 * on the key-norm feature: it predicts the key norm. */
static void write_pred(const char *path) {
  size_t n = KVT_PRED_HDR_BYTES + KVT_PRED_N_FEAT * 4 + 8;
  uint8_t *b = calloc(1, n);
  assert_non_null(b);
  memcpy(b, KVT_PRED_MAGIC, 8);
  const uint32_t h[] = {KVT_PRED_VERSION, KVT_PRED_HDR_BYTES, KVT_PRED_N_FEAT, KVT_PRED_LINEAR,
                        0, 0, S_LAYERS, 1, 8, 1, 32};
  for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) put32(b + 8 + 4 * i, h[i]);
  put32(b + 56, KVT_PRED_N_FEAT);
  float one = 1.0f;
  memcpy(b + KVT_PRED_HDR_BYTES + 11 * 4, &one, 4); /* f[11]: key norm */
  uint64_t ck = kvt_predictor_checksum(b, n - 8);
  put32(b + n - 8, (uint32_t)ck);
  put32(b + n - 4, (uint32_t)(ck >> 32));
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
  free(b);
}

static char *slurp(const char *path, size_t *len) {
  static char buf[1 << 16];
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  *len = fread(buf, 1, sizeof buf - 1, f);
  buf[*len] = 0;
  fclose(f);
  return buf;
}

/* From calibrate's --sensitivity file: layer l's lost mass under `scorer`
 * at share (g + 1) / S_GRID. */
static double sens_at(const char *path, const char *scorer, uint32_t l, uint32_t g) {
  size_t len;
  const char *p = slurp(path, &len);
  char key[64];
  snprintf(key, sizeof key, "\"%s\": [", scorer);
  for (uint32_t i = 0; i <= l; i++) {
    p = strstr(p, key);
    assert_non_null(p);
    p += strlen(key);
  }
  for (uint32_t i = 0; i < g; i++) {
    p = strchr(p, ',');
    assert_non_null(p);
    p++;
  }
  return strtod(p, NULL);
}

/* Calibrate on the trace; *learned[l] and *recent[l]: the lost mass at
 * share 0.5; *pick[l]: the profile's scorer of layer l at budget 0.5. */
static void calibrate(const char *dir, const char *trace, double learned[S_LAYERS],
                      double recent[S_LAYERS], uint32_t pick[S_LAYERS]) {
  char prof[2400], sens[2400], pred[2400], cmd[8192];
  static char out[65536];
  snprintf(prof, sizeof prof, "%s/p.json", dir);
  snprintf(sens, sizeof sens, "%s/s.json", dir);
  snprintf(pred, sizeof pred, "%s/k.pred", dir);
  write_pred(pred);
  snprintf(cmd, sizeof cmd,
           "%s calibrate --trace %s --budget 0.5 --grid %u --scorers recent,learned "
           "--predictor %s --sensitivity %s -o %s 2>&1",
           tf_bin(), trace, S_GRID, pred, sens, prof);
  int rc = tf_run(cmd, out, sizeof out);
  if (rc) fail_msg("calibrate exited %d: %s", rc, out);
  for (uint32_t l = 0; l < S_LAYERS; l++) {
    learned[l] = sens_at(sens, "learned", l, S_GRID / 2 - 1);
    recent[l] = sens_at(sens, "recent", l, S_GRID / 2 - 1);
  }
  kvt_options o;
  tu_opts(&o);
  char *edir = tu_tmpdir();
  kvt_engine *e = tu_open(edir, &o);
  kvt_shape sh = {S_LAYERS, 1, 8, KVT_F32, 1};
  size_t len;
  const char *text = slurp(prof, &len);
  kvt_profile *p = NULL;
  assert_int_equal(kvt_profile_parse(e, &sh, text, len, &p), 0);
  int k = kvt_profile_pick(p, 0.5);
  assert_true(k >= 0);
  for (uint32_t l = 0; l < S_LAYERS; l++) pick[l] = p->layers[(size_t)k * S_LAYERS + l].scorer;
  kvt_profile_free(p);
  kvt_engine_close(e);
  tu_rmtree(edir);
}

/* With the traced norms, the learned replay keeps every heavy block at a
 * half share (loses almost nothing) and calibrate picks it over recent; the
 * same masses with norms of 0 leave the predictor nothing to rank by. */
static void test_replay_uses_key_norms(void **state) {
  (void)state;
  if (!tf_bin()) {
    print_message("skipped: needs $KVTIER_BIN\n");
    g_skipped = 1;
    skip();
  }
  char *dir = tu_tmpdir(), trace[2400];
  snprintf(trace, sizeof trace, "%s/t.trace", dir);
  double lw[S_LAYERS], rw[S_LAYERS], lz[S_LAYERS], rz[S_LAYERS];
  uint32_t pw[S_LAYERS], pz[S_LAYERS];
  write_trace(trace, 1);
  calibrate(dir, trace, lw, rw, pw);
  write_trace(trace, 0);
  calibrate(dir, trace, lz, rz, pz);
  for (uint32_t l = 0; l < S_LAYERS; l++) {
    print_message("layer %u at share 0.5: learned %.4f (norms 0: %.4f), recent %.4f; picks %s\n",
                  l, lw[l], lz[l], rw[l], kvt_policy_name(pw[l]));
    assert_true(lw[l] < 0.05);
    assert_true(lz[l] > 0.2);
    assert_true(rw[l] > 0.2);
    assert_int_equal(pw[l], KVT_SCORER_LEARNED);
  }
  tu_rmtree(dir);
}

/* learned without --predictor is a usage error that says so. */
static void test_learned_needs_predictor(void **state) {
  (void)state;
  if (!tf_bin()) {
    g_skipped = 1;
    skip();
  }
  char *dir = tu_tmpdir(), trace[2400], cmd[8192];
  static char out[65536];
  snprintf(trace, sizeof trace, "%s/t.trace", dir);
  write_trace(trace, 1);
  snprintf(cmd, sizeof cmd, "%s calibrate --trace %s --budget 0.5 --scorers learned -o %s/p.json 2>&1",
           tf_bin(), trace, dir);
  assert_int_equal(tf_run(cmd, out, sizeof out), 2);
  assert_non_null(strstr(out, "needs --predictor"));
  tu_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_replay_uses_key_norms),
      cmocka_unit_test(test_learned_needs_predictor),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  return rc ? rc : g_skipped ? 77 : 0;
}
