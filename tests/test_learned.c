/* test_learned.c - the learned scorer (KVpop, docs/policy.md): `kvtier
 * train` recovers a future mass that is a known function of the features;
 * predictor files that are truncated, damaged, of another version or for
 * another shape are refused with their code (parser and public call);
 * the MLP runs as documented; the scorer keeps the blocks the predictor
 * ranks highest. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "engine/policy.h"
#include "engine/predictor.h"
#include "testutil.h"
#include "tool_files.h"
#include "trace.h"

static int g_skipped;
/* The accounting parsed predictors are counted in (all zero: nothing
 * counted, no failure injected); every test leaves it at 0 bytes. */
static kvt_mem g_mem;

/* ---- predictor files built here, by the documented layout --------------- */

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void putf(uint8_t *p, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  put32(p, u);
}

/* A predictor file for shape sh: kind, per_layer, hidden; weights w (or
 * i * 0.01 when NULL). Returns its length; *out malloc'ed. */
static size_t make_pred(const kvt_pred_shape *sh, uint32_t kind, uint32_t per_layer,
                        uint32_t hidden, const float *w, uint8_t **out) {
  uint32_t sets = per_layer ? sh->n_layers : 1, n_w = sets * kvt_pred_set_floats(kind, hidden);
  size_t n = KVT_PRED_HDR_BYTES + (size_t)n_w * 4 + 8;
  uint8_t *b = calloc(1, n);
  assert_non_null(b);
  memcpy(b, KVT_PRED_MAGIC, 8);
  const uint32_t h[] = {KVT_PRED_VERSION, KVT_PRED_HDR_BYTES, KVT_PRED_N_FEAT, kind, per_layer,
                        hidden, sh->n_layers, sh->block_tokens, sh->head_dim, sh->n_kv_heads, 32};
  for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) put32(b + 8 + 4 * i, h[i]);
  put32(b + 56, n_w);
  for (uint32_t i = 0; i < n_w; i++) putf(b + KVT_PRED_HDR_BYTES + 4 * i, w ? w[i] : 0.01f * (float)i);
  uint64_t ck = kvt_predictor_checksum(b, n - 8);
  put32(b + n - 8, (uint32_t)ck);
  put32(b + n - 4, (uint32_t)(ck >> 32));
  *out = b;
  return n;
}

/* Recompute the checksum after editing the header. */
static void reseal(uint8_t *b, size_t n) {
  uint64_t ck = kvt_predictor_checksum(b, n - 8);
  put32(b + n - 8, (uint32_t)ck);
  put32(b + n - 4, (uint32_t)(ck >> 32));
}

static const kvt_pred_shape shape = {.n_layers = 3, .block_tokens = 16, .head_dim = 8,
                                     .n_kv_heads = 2};

static int parse(const uint8_t *b, size_t n, const kvt_pred_shape *want, char *why) {
  kvt_predictor *p = NULL;
  why[0] = 0;
  int rc = kvt_predictor_parse(&g_mem, b, n, want, &p, why, 256);
  if (rc) assert_null(p);
  kvt_predictor_free(p);
  assert_int_equal(kvt_mem_total(&g_mem), 0); /* freed all it counted, refused or not */
  return rc;
}

static void test_refused(void **state) {
  (void)state;
  uint8_t *b;
  char why[256];
  size_t n = make_pred(&shape, KVT_PRED_LINEAR, 1, 0, NULL, &b);
  assert_int_equal(parse(b, n, &shape, why), 0);
  /* truncated anywhere: in the weights, in the checksum, in the header */
  size_t cuts[] = {n - 1, n - 8, n - 9, KVT_PRED_HDR_BYTES + 4, 40, 10, 0};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    assert_int_equal(parse(b, cuts[i], &shape, why), KVT_ECORRUPT);
    assert_true(strlen(why) > 0);
  }
  assert_non_null(strstr((parse(b, n - 1, &shape, why), why), "truncated"));
  /* a flipped weight bit fails the checksum */
  b[KVT_PRED_HDR_BYTES + 5] ^= 0x10;
  assert_int_equal(parse(b, n, &shape, why), KVT_ECORRUPT);
  assert_non_null(strstr(why, "checksum"));
  b[KVT_PRED_HDR_BYTES + 5] ^= 0x10;
  /* another version, or another feature set */
  put32(b + 8, KVT_PRED_VERSION + 1);
  reseal(b, n);
  assert_int_equal(parse(b, n, &shape, why), KVT_EVERSION);
  assert_non_null(strstr(why, "version"));
  put32(b + 8, KVT_PRED_VERSION);
  put32(b + 16, KVT_PRED_N_FEAT - 1);
  reseal(b, n);
  assert_int_equal(parse(b, n, &shape, why), KVT_EVERSION);
  put32(b + 16, KVT_PRED_N_FEAT);
  reseal(b, n);
  assert_int_equal(parse(b, n, &shape, why), 0);
  /* made for another shape: each field */
  for (int f = 0; f < 4; f++) {
    kvt_pred_shape other = shape;
    uint32_t *field[] = {&other.n_layers, &other.block_tokens, &other.head_dim, &other.n_kv_heads};
    *field[f] += 1;
    assert_int_equal(parse(b, n, &other, why), KVT_ESHAPE);
    assert_non_null(strstr(why, "namespace"));
  }
  /* a weight count that does not match the model */
  put32(b + 56, 3 * KVT_PRED_N_FEAT - 1);
  reseal(b, n);
  assert_int_equal(parse(b, n, &shape, why), KVT_ECORRUPT);
  free(b);
  /* not a predictor at all */
  uint8_t junk[128] = "KVTTRACE";
  assert_int_equal(parse(junk, sizeof junk, &shape, why), KVT_ECORRUPT);
  /* a non-finite weight */
  float w[3 * KVT_PRED_N_FEAT] = {0};
  w[7] = NAN;
  n = make_pred(&shape, KVT_PRED_LINEAR, 1, 0, w, &b);
  assert_int_equal(parse(b, n, &shape, why), KVT_ECORRUPT);
  free(b);
}

/* The MLP computes w2 . relu(W1 f + b1) + b2 with the documented layout;
 * a linear predictor w . f; per-layer sets are indexed by layer. */
static void test_infer(void **state) {
  (void)state;
  enum { F = KVT_PRED_N_FEAT, H = 3 };
  float w[H * (F + 2) + 1], f[F];
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) w[i] = (float)((int)(i % 7) - 3) * 0.25f;
  for (size_t j = 0; j < F; j++) f[j] = (float)j * 0.1f - 0.5f;
  uint8_t *b;
  size_t n = make_pred(&shape, KVT_PRED_MLP, 0, H, w, &b);
  kvt_predictor *p;
  assert_int_equal(kvt_predictor_parse(&g_mem, b, n, &shape, &p, NULL, 0), 0);
  double want = w[H * (F + 2)];
  for (int h = 0; h < H; h++) {
    double a = w[H * F + h];
    for (int j = 0; j < F; j++) a += (double)w[h * F + j] * f[j];
    want += w[H * F + H + h] * (a > 0 ? a : 0);
  }
  assert_true(fabs(kvt_predictor_infer(p, 2, f) - want) < 1e-5);
  kvt_predictor_free(p);
  free(b);
  float lw[3 * F];
  for (size_t i = 0; i < 3 * F; i++) lw[i] = (float)(i / F + 1); /* layer l: all l + 1 */
  n = make_pred(&shape, KVT_PRED_LINEAR, 1, 0, lw, &b);
  assert_int_equal(kvt_predictor_parse(&g_mem, b, n, &shape, &p, NULL, 0), 0);
  double sf = 0;
  for (int j = 0; j < F; j++) sf += f[j];
  for (uint32_t l = 0; l < 3; l++) assert_true(fabs(kvt_predictor_infer(p, l, f) - (l + 1) * sf) < 1e-4);
  kvt_predictor_free(p);
  free(b);
}

/* ---- kvtier train on a synthetic trace -------------------------------------- */

/* A block's constant mass per step: deterministic in [0.02, 1.52]. */
static float const_mass(uint32_t seq, uint32_t layer, uint32_t block) {
  uint64_t x = (uint64_t)seq * 1000003u + layer * 10007u + block * 101u + 12345u;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return 0.02f + 1.5f * (float)(x % 10000) / 10000.0f;
}

/* Every block receives the same mass at every step: the mass of its next
 * W steps is then exactly its last (and mean, and EMA) mass, a known
 * function of its features, which a fit must recover. */
static void write_const_trace(const char *path, uint32_t n_seqs) {
  enum { L = 2, BT = 4, S = 64 };
  trace_hdr h = {.n_layers = L, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 8,
                 .block_tokens = BT, .seq_len = S, .scorer = KVT_SCORER_FULL, .hot_share = 1};
  snprintf(h.model, sizeof h.model, "synthetic");
  trace_w *w;
  assert_int_equal(trace_open(path, &h, &w), 0);
  kvt_gathered g[S / BT];
  float m[S / BT], kn[S / BT];
  for (uint32_t s = 0; s < n_seqs; s++)
    for (uint32_t pos = BT; pos + 1 < S; pos++)
      for (uint32_t l = 0; l < L; l++) {
        uint32_t nb = pos / BT;
        for (uint32_t b = 0; b < nb; b++) {
          g[b] = (kvt_gathered){.block = b, .token_pos = b * BT};
          m[b] = const_mass(s, l, b);
          kn[b] = 1.0f + (float)(b % 3);
        }
        assert_int_equal(trace_step(w, s, pos, l, g, m, kn, nb), 0);
      }
  assert_int_equal(trace_close(w), 0);
}

static uint8_t *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  uint8_t *b = malloc(1 << 20);
  *n = fread(b, 1, 1 << 20, f);
  fclose(f);
  return b;
}

static void test_train_recovers(void **state) {
  (void)state;
  const char *bin = tf_bin();
  if (!bin) {
    print_message("skipped: needs $KVTIER_BIN\n");
    g_skipped = 1;
    skip();
  }
  char *dir = tu_tmpdir(), tr[2400], pr[2400], cmd[8192];
  static char out[65536];
  snprintf(tr, sizeof tr, "%s/t.trace", dir);
  snprintf(pr, sizeof pr, "%s/p.pred", dir);
  write_const_trace(tr, 20);
  snprintf(cmd, sizeof cmd, "%s train --trace %s -o %s --model linear --json", bin, tr, pr);
  assert_int_equal(tf_run(cmd, out, sizeof out), 0);
  /* the held-out top blocks by prediction are the true top blocks */
  const char *cap = strstr(out, "\"learned\":{\"0.1\":");
  assert_non_null(cap);
  assert_true(strtod(cap + strlen("\"learned\":{\"0.1\":"), NULL) > 0.995);
  size_t n;
  uint8_t *b = slurp(pr, &n);
  kvt_pred_shape sh = {2, 4, 8, 2};
  kvt_predictor *p;
  char why[256] = "";
  assert_int_equal(kvt_predictor_parse(&g_mem, b, n, &sh, &p, why, sizeof why), 0);
  /* predictions: log(mass + 1e-3) for a block seen with a constant mass,
   * whatever its age, position, key norm or layer */
  int checked = 0;
  for (uint32_t l = 0; l < 2; l++)
    for (float c = 0.05f; c < 1.5f; c += 0.15f)
      for (uint32_t nb = 6; nb < 15; nb += 4)
        for (uint32_t blk = 0; blk + 2 < nb; blk += 3) {
          kvt_pred_bstate st = {.key_norm = 1.0f + (float)(blk % 3)};
          for (uint32_t k = 0; k < (nb - 1 - blk) * 4 + 1; k++) kvt_pred_observe(&st, c);
          float f[KVT_PRED_N_FEAT];
          kvt_pred_features(&st, blk, nb, 4, l, 2, f);
          float y = kvt_predictor_infer(p, l, f), want = logf(c + 1e-3f);
          if (fabsf(y - want) > 0.05f)
            fail_msg("layer %u mass %g block %u of %u: predicted %g, want %g", l, c, blk, nb, y,
                     want);
          checked++;
        }
  assert_true(checked > 100);
  kvt_predictor_free(p);
  free(b);
  /* a trace that is not a full cache's is refused */
  trace_hdr h = {.n_layers = 2, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 8,
                 .block_tokens = 4, .seq_len = 64, .scorer = KVT_SCORER_H2O, .hot_share = 0.5};
  trace_w *w;
  assert_int_equal(trace_open(tr, &h, &w), 0);
  assert_int_equal(trace_close(w), 0);
  assert_int_equal(tf_run(cmd, out, sizeof out), 1);
  assert_non_null(strstr(out, "not a full-cache trace"));
  /* and a truncated one */
  write_const_trace(tr, 6);
  assert_int_equal(truncate(tr, 128 + 16 + 10), 0);
  assert_int_equal(tf_run(cmd, out, sizeof out), 1);
  assert_non_null(strstr(out, "truncated"));
  tu_rmtree(dir);
}

/* ---- the learned scorer in the engine -------------------------------------- */

/* Write a linear shared predictor for sh whose only weight is wk on the
 * key-norm feature: its prediction is wk * key norm. */
static void write_keynorm_pred(const char *path, const kvt_shape *sh, float wk) {
  float w[KVT_PRED_N_FEAT] = {0};
  w[11] = wk;
  kvt_pred_shape ps = {sh->n_layers, sh->block_tokens, sh->head_dim, sh->n_kv_heads};
  uint8_t *b;
  size_t n = make_pred(&ps, KVT_PRED_LINEAR, 0, 0, w, &b);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
  free(b);
}

/* Blocks whose keys are all c_b: key norm c_b * sqrt(head_dim). With a
 * predictor that scores by key norm (or its negative), the budget keeps
 * the blocks it ranks highest, whatever their age. */
static void keeps_ranked(float wk, const uint32_t *want, size_t n_want) {
  static const float c[8] = {3, 7, 1, 8, 2, 6, 4, 5};
  char *dir = tu_tmpdir(), path[2400];
  snprintf(path, sizeof path, "%s/p.pred", dir);
  kvt_engine *e = tu_open(dir, NULL);
  kvt_shape sh = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 8, .dtype = KVT_F32,
                  .block_tokens = 4};
  kvt_ns_id ns = tu_register(e, "learned-model", &sh);
  write_keynorm_pred(path, &sh, wk);
  assert_int_equal(kvt_ns_load_predictor(e, ns, path), 0);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  float k[4 * 8], v[4 * 8] = {0};
  for (uint32_t b = 0; b < 8; b++) {
    uint32_t tok[4] = {b * 4 + 1, b * 4 + 2, b * 4 + 3, b * 4 + 4};
    kvt_append_info info;
    assert_int_equal(kvt_seq_append(s, tok, 4, &info), 0);
    for (int i = 0; i < 32; i++) k[i] = c[b];
    kvt_kv kv = {.k = k, .v = v, .dtype = KVT_F32, .n_tokens = 4, .n_heads = 1, .head_dim = 8};
    assert_int_equal(kvt_seq_put(s, info.block, 0, &kv), 0);
  }
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(kvt_policy_parse("learned", &p.scorer), 0);
  p.budget = 0.5;
  p.sink_blocks = 0;
  p.window_blocks = 0;
  p.delay = 0;
  assert_int_equal(kvt_seq_set_policy(s, &p), 0);
  kvt_gathered g[8];
  size_t n;
  assert_int_equal(kvt_seq_retained(s, 0, g, 8, &n), 0);
  assert_int_equal(n, n_want);
  for (size_t i = 0; i < n; i++) assert_int_equal(g[i].block, want[i]);
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

static void test_scorer_keeps_ranked(void **state) {
  (void)state;
  const uint32_t high[4] = {1, 3, 5, 7}, low[4] = {0, 2, 4, 6};
  keeps_ranked(1.0f, high, 4);  /* key norms 7, 8, 6, 5 */
  keeps_ranked(-1.0f, low, 4);  /* key norms 3, 1, 2, 4 */
}

/* Through the public call: a predictor for another shape, truncated or
 * of another version is refused with its code, and "learned" without a
 * predictor cannot be chosen. */
static void test_load_refused(void **state) {
  (void)state;
  char *dir = tu_tmpdir(), path[2400];
  snprintf(path, sizeof path, "%s/p.pred", dir);
  kvt_engine *e = tu_open(dir, NULL);
  kvt_shape sh = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 8, .dtype = KVT_F32,
                  .block_tokens = 4};
  kvt_ns_id ns = tu_register(e, "learned-model", &sh);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(kvt_policy_parse("learned", &p.scorer), 0);
  p.budget = 0.5;
  assert_int_equal(kvt_seq_set_policy(s, &p), KVT_EOPTION);
  kvt_shape other = sh;
  other.block_tokens = 16;
  write_keynorm_pred(path, &other, 1.0f);
  assert_int_equal(kvt_ns_load_predictor(e, ns, path), KVT_ESHAPE);
  write_keynorm_pred(path, &sh, 1.0f);
  assert_int_equal(truncate(path, 70), 0);
  assert_int_equal(kvt_ns_load_predictor(e, ns, path), KVT_ECORRUPT);
  write_keynorm_pred(path, &sh, 1.0f);
  FILE *f = fopen(path, "r+b");
  uint8_t ver[4] = {2, 0, 0, 0};
  assert_int_equal(fseek(f, 8, SEEK_SET), 0);
  assert_int_equal(fwrite(ver, 1, 4, f), 4);
  fclose(f);
  assert_int_equal(kvt_ns_load_predictor(e, ns, path), KVT_EVERSION);
  snprintf(path, sizeof path, "%s/none", dir);
  assert_int_equal(kvt_ns_load_predictor(e, ns, path), -ENOENT);
  assert_int_equal(kvt_seq_set_policy(s, &p), KVT_EOPTION); /* still none */
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* The engine scores blocks in batches (vector lanes, a second copy of the
 * features' arithmetic): every score must equal, bit for bit, what the
 * scalar features and kvt_predictor_infer give block by block. */
static void test_batch_scores_exact(void **state) {
  (void)state;
  enum { HB = 12, NB = 53 };
  float w[3 * (HB * (KVT_PRED_N_FEAT + 2) + 1)];
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
    w[i] = (float)((int)tu_below(2001) - 1000) / 997.0f;
  uint8_t *b;
  size_t n = make_pred(&shape, KVT_PRED_MLP, 1, HB, w, &b);
  kvt_predictor *p;
  assert_int_equal(kvt_predictor_parse(&g_mem, b, n, &shape, &p, NULL, 0), 0);
  kvt_bstate bs[NB];
  kvt_pred_bstate st[NB];
  kvt_pblk pb[NB];
  memset(bs, 0, sizeof bs);
  memset(st, 0, sizeof st);
  for (uint32_t i = 0; i < NB; i++) {
    uint32_t obs = (uint32_t)tu_below(40);
    for (uint32_t k = 0; k < obs; k++) /* zero, tiny and ordinary masses */
      kvt_pred_observe(&st[i], k % 5 == 0 ? 0.0f : k % 7 == 0 ? 1e-30f : (float)tu_below(1000) / 999.0f);
    bs[i].key_norm = (float)tu_below(5000) / 1000.0f;
    pb[i] = (kvt_pblk){.block = i * 3 + (uint32_t)tu_below(3), .bs = &bs[i], .st = &st[i]};
  }
  for (uint32_t layer = 0; layer < shape.n_layers; layer++) {
    for (size_t cnt = 1; cnt <= NB; cnt += 13) {
      kvt_pctx c = {.model = p, .layer = layer, .n_layers = shape.n_layers,
                    .n_blocks = NB * 3 + 1, .block_tokens = shape.block_tokens,
                    .n_tokens = (uint64_t)(NB * 3 + 1) * shape.block_tokens + 5};
      double got[NB];
      kvt_predictor_score(p, &c, pb, cnt, got);
      for (size_t i = 0; i < cnt; i++) {
        kvt_pred_bstate one = st[i];
        one.key_norm = bs[i].key_norm;
        float f[KVT_PRED_N_FEAT];
        kvt_pred_features(&one, pb[i].block, c.n_blocks, c.block_tokens, layer, c.n_layers, f);
        double want = kvt_predictor_infer(p, layer, f);
        if (memcmp(&got[i], &want, sizeof want))
          fail_msg("layer %u, %zu blocks, block %zu: batched %.9g, one by one %.9g", layer, cnt,
                   i, got[i], want);
      }
    }
  }
  kvt_predictor_free(p);
  free(b);
  assert_int_equal(kvt_mem_total(&g_mem), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_infer),
      cmocka_unit_test(test_batch_scores_exact),
      cmocka_unit_test(test_train_recovers),
      cmocka_unit_test(test_scorer_keeps_ranked),
      cmocka_unit_test(test_load_refused),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  return rc ? rc : g_skipped ? 77 : 0;
}
