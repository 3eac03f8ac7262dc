/* predictor.c - reading, checking and running the learned scorer's
 * predictor (predictor.h; the file format is in docs/policy.md), and the
 * scorer's hooks. A predictor that is truncated, of another version or
 * made for another shape is refused whole; nothing of it is used. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/internal.h"
#include "engine/predictor.h"
#include "kvtier.h"

static uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static float rdf(const uint8_t *p) {
  uint32_t u = rd32(p);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint64_t kvt_predictor_checksum(const void *buf, size_t len) { return XXH3_64bits(buf, len); }

/* Refuse with code rc and a sentence in why. */
static int refuse(char *why, size_t why_len, int rc, const char *fmt, ...) {
  if (why && why_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
  }
  return rc;
}

/* The header's fields, checked against each other and the length. */
static int check_header(const uint8_t *b, size_t len, kvt_predictor *p, char *why, size_t wl) {
  if (len < 12 || memcmp(b, KVT_PRED_MAGIC, 8))
    return refuse(why, wl, KVT_ECORRUPT, "not a kvtier predictor (magic)");
  if (rd32(b + 8) != KVT_PRED_VERSION)
    return refuse(why, wl, KVT_EVERSION, "predictor version %u; this build reads version %u",
                  rd32(b + 8), KVT_PRED_VERSION);
  if (len < KVT_PRED_HDR_BYTES + 8)
    return refuse(why, wl, KVT_ECORRUPT, "truncated: %zu bytes, shorter than the header", len);
  if (rd32(b + 12) != KVT_PRED_HDR_BYTES)
    return refuse(why, wl, KVT_ECORRUPT, "header size %u, expected %u", rd32(b + 12),
                  KVT_PRED_HDR_BYTES);
  if (rd32(b + 16) != KVT_PRED_N_FEAT)
    return refuse(why, wl, KVT_EVERSION, "made for %u features; this build computes %u",
                  rd32(b + 16), KVT_PRED_N_FEAT);
  p->kind = rd32(b + 20);
  p->per_layer = rd32(b + 24);
  p->hidden = rd32(b + 28);
  p->shape = (kvt_pred_shape){rd32(b + 32), rd32(b + 36), rd32(b + 40), rd32(b + 44)};
  p->window = rd32(b + 48);
  p->budget = rdf(b + 52);
  uint32_t n_w = rd32(b + 56);
  if (p->kind > KVT_PRED_MLP || p->per_layer > 1 ||
      (p->kind == KVT_PRED_MLP) != (p->hidden > 0) || p->hidden > KVT_PRED_MAX_HIDDEN)
    return refuse(why, wl, KVT_ECORRUPT, "bad model kind %u (per_layer %u, hidden %u)", p->kind,
                  p->per_layer, p->hidden);
  if (p->shape.n_layers == 0 || p->shape.n_layers > KVT_PRED_MAX_LAYERS)
    return refuse(why, wl, KVT_ECORRUPT, "n_layers %u out of range", p->shape.n_layers);
  p->set_floats = kvt_pred_set_floats(p->kind, p->hidden);
  uint64_t sets = p->per_layer ? p->shape.n_layers : 1, want = sets * p->set_floats;
  if (n_w != want)
    return refuse(why, wl, KVT_ECORRUPT, "%u weights where the model needs %llu", n_w,
                  (unsigned long long)want);
  size_t total = KVT_PRED_HDR_BYTES + (size_t)n_w * 4 + 8;
  if (len < total)
    return refuse(why, wl, KVT_ECORRUPT, "truncated: %zu bytes of %zu", len, total);
  if (len > total)
    return refuse(why, wl, KVT_ECORRUPT, "%zu bytes after the checksum", len - total);
  if (rd64(b + total - 8) != kvt_predictor_checksum(b, total - 8))
    return refuse(why, wl, KVT_ECORRUPT, "checksum mismatch");
  return 0;
}

int kvt_predictor_parse(kvt_mem *m, const void *buf, size_t len, const kvt_pred_shape *want,
                        kvt_predictor **out, char *why, size_t why_len) {
  if (!buf || !out) return KVT_ENULL;
  *out = NULL;
  const uint8_t *b = buf;
  kvt_predictor p = {0};
  int rc = check_header(b, len, &p, why, why_len);
  if (rc) return rc;
  const kvt_pred_shape *s = &p.shape;
  if (want && (s->n_layers != want->n_layers || s->block_tokens != want->block_tokens ||
               s->head_dim != want->head_dim || s->n_kv_heads != want->n_kv_heads))
    return refuse(why, why_len, KVT_ESHAPE,
                  "made for %u layers, %u-token blocks, head_dim %u, %u KV heads; the namespace "
                  "has %u, %u, %u, %u", s->n_layers, s->block_tokens, s->head_dim, s->n_kv_heads,
                  want->n_layers, want->block_tokens, want->head_dim, want->n_kv_heads);
  size_t n = (size_t)(p.per_layer ? s->n_layers : 1) * p.set_floats;
  p.mem = m;
  p.w_bytes = n * sizeof *p.w;
  if (!(p.w = kvt_mem_alloc(m, KVT_MEM_OTHER, p.w_bytes))) return -ENOMEM;
  for (size_t i = 0; i < n; i++) {
    p.w[i] = rdf(b + KVT_PRED_HDR_BYTES + 4 * i);
    if (!isfinite(p.w[i])) {
      kvt_mem_free(m, KVT_MEM_OTHER, p.w, p.w_bytes);
      return refuse(why, why_len, KVT_ECORRUPT, "weight %zu is not finite", i);
    }
  }
  if (p.kind == KVT_PRED_MLP) {
    size_t sets = p.per_layer ? s->n_layers : 1, H = p.hidden, F = KVT_PRED_N_FEAT;
    p.w1t_bytes = sets * H * F * sizeof *p.w1t;
    if (!(p.w1t = kvt_mem_alloc(m, KVT_MEM_OTHER, p.w1t_bytes))) {
      kvt_mem_free(m, KVT_MEM_OTHER, p.w, p.w_bytes);
      return -ENOMEM;
    }
    for (size_t k = 0; k < sets; k++)
      for (size_t h = 0; h < H; h++)
        for (size_t i = 0; i < F; i++)
          p.w1t[k * H * F + i * H + h] = p.w[k * p.set_floats + h * F + i];
  }
  if (!(*out = kvt_mem_alloc(m, KVT_MEM_OTHER, sizeof **out))) {
    if (p.w1t) kvt_mem_free(m, KVT_MEM_OTHER, p.w1t, p.w1t_bytes);
    kvt_mem_free(m, KVT_MEM_OTHER, p.w, p.w_bytes);
    return -ENOMEM;
  }
  **out = p;
  return 0;
}

void kvt_predictor_free(kvt_predictor *p) {
  if (!p) return;
  if (p->w1t) kvt_mem_free(p->mem, KVT_MEM_OTHER, p->w1t, p->w1t_bytes);
  kvt_mem_free(p->mem, KVT_MEM_OTHER, p->w, p->w_bytes);
  kvt_mem_free(p->mem, KVT_MEM_OTHER, p, sizeof *p);
}

/* The MLP over the transposed W1 (kvt_predictor.w1t): the same sums as
 * kvt_predictor_infer's plain loop, each hidden unit's in the same order
 * (b1, then feature 0, 1, ...), then y in hidden order, so the same floats;
 * walked feature-major so that the hidden units vectorise. (A version
 * with H a constant 16, or fixed 4- or 8-unit chunks, measured slower.) */
static float mlp_t(const float *wt, const float *b1, const float *w2, const float *f,
                   const uint32_t H) {
  float a[KVT_PRED_MAX_HIDDEN], y = 0;
  for (uint32_t h = 0; h < H; h++) a[h] = b1[h];
  for (uint32_t i = 0; i < KVT_PRED_N_FEAT; i++) {
    const float fi = f[i], *row = wt + (size_t)i * H;
    for (uint32_t h = 0; h < H; h++) a[h] += row[h] * fi;
  }
  for (uint32_t h = 0; h < H; h++) y += w2[h] * (a[h] > 0 ? a[h] : 0);
  return y + w2[H];
}

float kvt_predictor_infer(const kvt_predictor *p, uint32_t layer, const float *f) {
  const float *w = p->w + (size_t)(p->per_layer ? layer : 0) * p->set_floats;
  float y = 0;
  if (p->kind == KVT_PRED_LINEAR) {
    for (uint32_t i = 0; i < KVT_PRED_N_FEAT; i++) y += w[i] * f[i];
    return y;
  }
  /* MLP: hidden[h] = relu(W1[h] . f + b1[h]); y = w2 . hidden + b2, laid
   * out as W1 [hidden][N_FEAT], b1 [hidden], w2 [hidden], b2. */
  const float *b1 = w + (size_t)p->hidden * KVT_PRED_N_FEAT, *w2 = b1 + p->hidden;
  if (p->w1t) {
    const uint32_t H = p->hidden;
    const float *wt = p->w1t + (size_t)(p->per_layer ? layer : 0) * H * KVT_PRED_N_FEAT;
    return mlp_t(wt, b1, w2, f, H);
  }
  for (uint32_t h = 0; h < p->hidden; h++) {
    float a = b1[h];
    for (uint32_t i = 0; i < KVT_PRED_N_FEAT; i++) a += w[(size_t)h * KVT_PRED_N_FEAT + i] * f[i];
    y += w2[h] * (a > 0 ? a : 0);
  }
  return y + w2[p->hidden];
}

/* ---- the engine's side: reading for a namespace, the scorer's hooks ------ */

#define KVT_PRED_MAX_FILE (16u << 20) /* far above any model this format holds */

int kvt_predictor_read(kvt_engine *e, const char *path, const kvt_shape *sh, kvt_predictor **out) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    int rc = -errno;
    return KVT_ERR(e, rc, "kvt_ns_load_predictor", "path", "a readable predictor file", "%s: %s",
                   path, strerror(-rc));
  }
  uint8_t *buf = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, KVT_PRED_MAX_FILE + 1);
  size_t n = buf ? fread(buf, 1, KVT_PRED_MAX_FILE + 1, f) : 0;
  int rd_err = ferror(f);
  fclose(f);
  if (!buf) return -ENOMEM;
  if (rd_err) {
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, buf, KVT_PRED_MAX_FILE + 1);
    return KVT_ERR(e, -EIO, "kvt_ns_load_predictor", "path", "a readable predictor file",
                   "%s: read error", path);
  }
  kvt_pred_shape want = {sh->n_layers, sh->block_tokens, sh->head_dim, sh->n_kv_heads};
  char why[256] = "";
  int rc = n > KVT_PRED_MAX_FILE
               ? (snprintf(why, sizeof why, "larger than %u bytes", KVT_PRED_MAX_FILE), KVT_ECORRUPT)
               : kvt_predictor_parse(&e->mem, buf, n, &want, out, why, sizeof why);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, buf, KVT_PRED_MAX_FILE + 1);
  if (rc && rc != -ENOMEM)
    return KVT_ERR(e, rc, "kvt_ns_load_predictor", "path", "a predictor for the namespace's shape",
                   "%s: %s", path, why);
  return rc;
}

void kvt_predictor_observe(const void *model, const kvt_pctx *c, const kvt_pblk *b, float mass) {
  (void)model;
  (void)c;
  kvt_pred_observe(b->st, mass);
}

/* The MLP for KVT_PRED_BATCH (8) blocks at once, lane j one block, in
 * GCC/Clang vector types: each block's sums are exactly
 * kvt_predictor_infer's (b1[h], then features 0, 1, ... in order; y over h
 * in order; the build has -ffp-contract=off), only lane-wise, so the very
 * same floats. relu keeps a where a > 0 and +0 elsewhere, as the scalar
 * `a > 0 ? a : 0`. f0 holds blocks 0-3's features, f1 blocks 4-7's. */
#define KVT_PRED_BATCH 8
typedef float kvt_v4f __attribute__((vector_size(16)));
typedef int32_t kvt_v4i __attribute__((vector_size(16)));
static inline kvt_v4f relu4(kvt_v4f a, kvt_v4f z) { return (kvt_v4f)((kvt_v4i)a & (a > z)); }

static void mlp_batch(const kvt_predictor *p, uint32_t layer, const kvt_v4f *f0,
                      const kvt_v4f *f1, float *y) {
  const float *w = p->w + (size_t)(p->per_layer ? layer : 0) * p->set_floats;
  const float *b1 = w + (size_t)p->hidden * KVT_PRED_N_FEAT, *w2 = b1 + p->hidden;
  const kvt_v4f z = {0, 0, 0, 0};
  kvt_v4f y0 = z, y1 = z;
  for (uint32_t h = 0; h < p->hidden; h++) {
    const float *row = w + (size_t)h * KVT_PRED_N_FEAT;
    kvt_v4f a0 = z + b1[h], a1 = a0;
    for (uint32_t i = 0; i < KVT_PRED_N_FEAT; i++) {
      kvt_v4f r = z + row[i];
      a0 += r * f0[i];
      a1 += r * f1[i];
    }
    kvt_v4f q = z + w2[h];
    y0 += q * relu4(a0, z);
    y1 += q * relu4(a1, z);
  }
  kvt_v4f c = z + w2[p->hidden];
  y0 += c;
  y1 += c;
  memcpy(y, &y0, sizeof y0);
  memcpy(y + 4, &y1, sizeof y1);
}

/* kvt_pred_fastlog on 4 lanes: the very same operations, lane-wise. */
static inline kvt_v4f fastlog4(kvt_v4f x) {
  typedef uint32_t v4u __attribute__((vector_size(16)));
  v4u u;
  memcpy(&u, &x, sizeof u);
  kvt_v4f e = __builtin_convertvector((kvt_v4i)((u >> 23) & 0xff) - 127, kvt_v4f);
  u = (u & 0x007fffffu) | 0x3f800000u;
  kvt_v4f m;
  memcpy(&m, &u, sizeof m);
  m = m - 1.0f;
  kvt_v4f p = m * (1.44254f + m * (-0.71827f + m * (0.45698f + m * (-0.27462f +
              m * (0.12183f + m * -0.02846f)))));
  return (e + p) * 0.69314718f;
}

/* kvt_pred_features for blocks b[0..3] on 4 lanes, each lane the same
 * operations as the scalar code (predictor.h), so the same floats. */
static void features4(const kvt_pctx *c, const kvt_pblk *b, kvt_v4f *f) {
  kvt_v4f age, blk, ema[KVT_PRED_N_EMA], mx, mean, last, cnt, kn, sum;
  for (int j = 0; j < 4; j++) {
    const kvt_pred_bstate *st = b[j].st;
    age[j] = (float)(c->n_blocks - 1 - b[j].block);
    blk[j] = (float)b[j].block;
    for (uint32_t i = 0; i < KVT_PRED_N_EMA; i++) ema[i][j] = st->ema[i];
    mx[j] = st->max;
    mean[j] = st->count ? st->sum / (float)st->count : 0;
    last[j] = st->last;
    cnt[j] = (float)st->count;
    kn[j] = b[j].bs->key_norm;
    sum[j] = st->sum;
  }
  const float bt = (float)c->block_tokens, nb = (float)c->n_blocks;
  const kvt_v4f z = {0, 0, 0, 0};
  f[0] = z + 1.0f;
  f[1] = fastlog4(1 + age * bt);
  f[2] = fastlog4(1 + blk * bt);
  f[3] = (blk + 0.5f) / nb;
  for (uint32_t i = 0; i < KVT_PRED_N_EMA; i++) f[4 + i] = fastlog4(ema[i] + 1e-6f);
  f[7] = fastlog4(mx + 1e-6f);
  f[8] = fastlog4(mean + 1e-6f);
  f[9] = fastlog4(last + 1e-6f);
  f[10] = fastlog4(1 + cnt);
  f[11] = kn;
  f[12] = z + kvt_pred_fastlog(1 + nb * bt);
  f[13] = z + (c->n_layers > 1 ? (float)c->layer / (float)(c->n_layers - 1) : 0);
  f[14] = fastlog4(sum + 1e-6f);
  f[15] = 1.0f / (1.0f + age);
}

void kvt_predictor_score(const void *model, const kvt_pctx *c, const kvt_pblk *b, size_t n,
                         double *out) {
  float f[KVT_PRED_N_FEAT];
  const kvt_predictor *p = model;
  size_t i = 0;
  if (p && p->kind == KVT_PRED_MLP) {
    kvt_v4f f0[KVT_PRED_N_FEAT], f1[KVT_PRED_N_FEAT];
    float y[KVT_PRED_BATCH];
    for (; i + KVT_PRED_BATCH <= n; i += KVT_PRED_BATCH) {
      features4(c, b + i, f0);
      features4(c, b + i + 4, f1);
      mlp_batch(p, c->layer, f0, f1, y);
      for (int j = 0; j < KVT_PRED_BATCH; j++) out[i + j] = y[j];
    }
  }
  for (; i < n; i++) {
    kvt_pred_bstate st = *(const kvt_pred_bstate *)b[i].st;
    st.key_norm = b[i].bs->key_norm;
    if (!model) { /* the framework refuses "learned" without one; stay defined */
      out[i] = b[i].bs->mass_sum;
      continue;
    }
    kvt_pred_features(&st, b[i].block, c->n_blocks, c->block_tokens, c->layer, c->n_layers, f);
    out[i] = kvt_predictor_infer(model, c->layer, f);
  }
}
