/* attend.c - attention of one query over the retained blocks of a
 * (sequence, layer): exact on hot blocks, in place on the quantized data
 * of warm blocks. For warm values, sum_t p_t v_t = S H (sum_t p_t w_t c_t)
 * (S the sign diagonal, H the Hadamard transform, c_t the centroid codes,
 * w_t = norm_t / vdim): one inverse rotation per head per query instead of
 * one per token. The query heads of a GQA group go together, so each code
 * is read and converted once per group rather than once per query head.
 * Blocks are pinned; the arithmetic runs outside the lock. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "codec/codec.h"
#include "engine/internal.h"
#include "engine/recall.h"

/* Scores and rotated-domain sums of the query heads attended in one pass
 * over the blocks: as many heads as fit (at least one). */
#define WAVE_BYTES (4u << 20)

typedef struct attend_ctx {
  const kvt_nsrec *ns;
  uint32_t T, H, D, vdim, group; /* group: query heads per KV head */
  size_t es, stride;             /* stride: n * T, the scores of one query head */
  kvt_cshape cs;
  float scale;
  kvt_lblk *const *blk;          /* the n retained blocks */
  size_t n;
  const float *q;
  float *out, *lse, *mass;       /* lse and mass may be NULL */
} attend_ctx;

/* Query heads [h0, h1): scores [h1 - h0][stride] (then probabilities),
 * rotated-domain sums [h1 - h0][vdim]. */
typedef struct attend_wave {
  uint32_t h0, h1;
  float *sc, *rot;
} attend_wave;

static float dot_f32(const float *a, const float *b, uint32_t n) {
  float s = 0;
  for (uint32_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* Query heads from h (before h1) that share h's KV head, at most
 * KVT_CODEC_GQA: the codecs read each code once for all of them. */
static uint32_t chunk_len(const attend_ctx *c, uint32_t h, uint32_t h1) {
  uint32_t end = (h / c->group + 1) * c->group;
  if (end > h1) end = h1;
  return end - h < KVT_CODEC_GQA ? end - h : KVT_CODEC_GQA;
}

/* sc[j * stride + t] = scale * q_j . k_t over block b, for the gn query
 * heads from h. */
static void block_scores(const attend_ctx *c, const kvt_lblk *b, uint32_t h, uint32_t gn,
                         float *sc) {
  const uint32_t kh = h / c->group;
  const float *q = c->q + (size_t)h * c->D;
  if (b->tier == KVT_TIER_WARM && b->k_codec != KVT_CODEC_NONE) {
    kvt_codec_k_dots_n(b->k_codec, &c->cs, b->payload, kh, q, gn, sc, c->stride);
    for (uint32_t j = 0; j < gn; j++)
      for (uint32_t t = 0; t < c->T; t++) sc[j * c->stride + t] *= c->scale;
    return;
  }
  float k[KVT_MAX_HEAD_DIM]; /* exact K: hot, or warm with K kept exact (first in both) */
  for (uint32_t t = 0; t < c->T; t++) { /* each row converted once for the gn heads */
    const uint8_t *row = b->payload + ((size_t)t * c->H + kh) * c->D * c->es;
    kvt_to_f32(row, c->ns->desc.shape.dtype, c->D, k);
    for (uint32_t j = 0; j < gn; j++)
      sc[j * c->stride + t] = c->scale * dot_f32(q + j * c->D, k, c->D);
  }
}

/* For the gn query heads from h: out_j += sum_t p_j[t] v_t over a hot
 * block; rot_j += the rotated-domain sum over a warm one. */
static void block_values(const attend_ctx *c, const kvt_lblk *b, uint32_t h, uint32_t gn,
                         const float *p, float *rot) {
  const uint32_t kh = h / c->group;
  if (b->tier == KVT_TIER_WARM && b->v_codec != KVT_CODEC_NONE) {
    kvt_codec_v_accum_n(b->v_codec, &c->cs, b->payload + b->k_len, kh, p, c->stride, gn, rot);
    return;
  }
  /* exact V: after exact K when hot, after K's warm form when V is kept exact */
  const uint8_t *v0 = b->payload + (b->tier == KVT_TIER_WARM ? b->k_len : c->ns->bytes_each);
  float v[KVT_MAX_HEAD_DIM];
  for (uint32_t t = 0; t < c->T; t++) {
    float any = 0;
    for (uint32_t j = 0; j < gn; j++) any += p[j * c->stride + t];
    if (any == 0) continue; /* (probabilities are >= 0) */
    kvt_to_f32(v0 + ((size_t)t * c->H + kh) * c->D * c->es, c->ns->desc.shape.dtype, c->D, v);
    for (uint32_t j = 0; j < gn; j++) {
      float pj = p[j * c->stride + t], *o = c->out + (size_t)(h + j) * c->D;
      for (uint32_t d = 0; d < c->D; d++) o[d] += pj * v[d];
    }
  }
}

/* Warm payloads are checked before their codes are used, unless the block
 * says its payload is known well formed (encoded by this engine). */
static int check_warm(const attend_ctx *c, kvt_lblk *const *blk, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const kvt_lblk *b = blk[i];
    if (b->tier != KVT_TIER_WARM || b->checked) continue;
    if (kvt_warm_check(&c->ns->lite, b, c->cs.seed)) return KVT_ECORRUPT;
  }
  return 0;
}

/* Scores to probabilities in place, one query head; its lse. */
static float softmax(float *p, size_t n) {
  float m = -INFINITY, l = 0;
  for (size_t i = 0; i < n; i++) m = p[i] > m ? p[i] : m;
  for (size_t i = 0; i < n; i++) l += (p[i] = expf(p[i] - m));
  float inv = 1.0f / l;
  for (size_t i = 0; i < n; i++) p[i] *= inv;
  return m + logf(l);
}

/* Blocks in order, every query head of the wave for each: each block's
 * codes are read as one run, once per wave. */
static void wave_scores(const attend_ctx *c, const attend_wave *w) {
  for (size_t i = 0; i < c->n; i++)
    for (uint32_t h = w->h0, gn; h < w->h1; h += gn) {
      gn = chunk_len(c, h, w->h1);
      block_scores(c, c->blk[i], h, gn, w->sc + (h - w->h0) * c->stride + i * c->T);
    }
}

static void wave_values(const attend_ctx *c, const attend_wave *w) {
  for (size_t i = 0; i < c->n; i++) {
    for (uint32_t h = w->h0, gn; h < w->h1; h += gn) {
      gn = chunk_len(c, h, w->h1);
      const float *p = w->sc + (h - w->h0) * c->stride + i * c->T;
      block_values(c, c->blk[i], h, gn, p, w->rot + (size_t)(h - w->h0) * c->vdim);
      for (uint32_t j = 0; c->mass && j < gn; j++)
        for (uint32_t t = 0; t < c->T; t++) c->mass[i] += p[j * c->stride + t];
    }
  }
}

static void attend_wave_run(const attend_ctx *c, const attend_wave *w) {
  const uint32_t nh = w->h1 - w->h0;
  wave_scores(c, w);
  for (uint32_t j = 0; j < nh; j++) {
    float lse = softmax(w->sc + j * c->stride, c->stride);
    if (c->lse) c->lse[w->h0 + j] = lse;
  }
  memset(c->out + (size_t)w->h0 * c->D, 0, (size_t)nh * c->D * sizeof *c->out);
  memset(w->rot, 0, (size_t)nh * c->vdim * sizeof *w->rot);
  wave_values(c, w);
  int any_warm = 0; /* any value accumulated in the rotated domain */
  for (size_t i = 0; i < c->n; i++)
    any_warm |= c->blk[i]->tier == KVT_TIER_WARM && c->blk[i]->v_codec != KVT_CODEC_NONE;
  for (uint32_t j = 0; any_warm && j < nh; j++) {
    float v[KVT_MAX_HEAD_DIM], *o = c->out + (size_t)(w->h0 + j) * c->D;
    kvt_codec_v_unrotate(&c->cs, w->rot + (size_t)j * c->vdim, v);
    for (uint32_t d = 0; d < c->D; d++) o[d] += v[d];
  }
}

/* Query heads per wave for up to cap blocks. */
static uint32_t wave_heads(const attend_ctx *c, size_t cap, uint32_t n_q_heads) {
  size_t per = (cap * c->T + c->vdim) * sizeof(float), nh = WAVE_BYTES / per;
  return nh < 1 ? 1 : nh > n_q_heads ? n_q_heads : (uint32_t)nh;
}

static void attend_all(const attend_ctx *c, float *buf, uint32_t per_wave, uint32_t n_q_heads) {
  for (uint32_t h0 = 0; h0 < n_q_heads; h0 += per_wave) {
    attend_wave w = {.h0 = h0, .h1 = n_q_heads - h0 < per_wave ? n_q_heads : h0 + per_wave,
                     .sc = buf, .rot = buf + (size_t)per_wave * c->stride};
    attend_wave_run(c, &w);
  }
}

int kvt_seq_attend(kvt_seq *s, uint32_t layer, const float *q, uint32_t n_q_heads, float scale,
                   float *out, float *lse, float *block_mass, size_t max_blocks, size_t *n_blocks) {
  if (!s || !q || !out || !n_blocks) return KVT_ENULL;
  *n_blocks = 0;
  kvt_engine *e = s->e;
  const kvt_shape *sh = &s->ns->desc.shape;
  if (layer >= sh->n_layers) return KVT_ENOTFOUND;
  if (n_q_heads == 0 || n_q_heads % sh->n_kv_heads || n_q_heads > KVT_MAX_HEADS * 64)
    return KVT_ERR(e, KVT_ECOUNT, "kvt_seq_attend", "n_q_heads",
                   "a multiple of n_kv_heads, 1..65536", "%u (n_kv_heads %u)", n_q_heads,
                   sh->n_kv_heads);
  if (kvt_meta_only(e)) return KVT_ENOPAYLOAD;
  if (scale == 0) scale = 1.0f / sqrtf((float)sh->head_dim);
  attend_ctx c = {.ns = s->ns, .T = sh->block_tokens, .H = sh->n_kv_heads, .D = sh->head_dim,
                  .vdim = kvt_codec_vdim(sh->head_dim), .group = n_q_heads / sh->n_kv_heads,
                  .es = kvt_dtype_size(sh->dtype), .scale = scale, .q = q, .out = out, .lse = lse,
                  .mass = block_mass,
                  .cs = {.n_tokens = sh->block_tokens, .n_heads = sh->n_kv_heads,
                         .head_dim = sh->head_dim, .seed = kvt_layer_seed(s->ns, layer)}};
  size_t cap = s->n_blocks ? s->n_blocks : 1;
  uint32_t per_wave = wave_heads(&c, cap, n_q_heads);
  size_t blk_bytes = cap * sizeof(kvt_lblk *);
  size_t buf_bytes = (size_t)per_wave * (cap * c.T + c.vdim) * sizeof(float);
  /* recall needs the query's lse (recall.c): its own when the caller's is NULL */
  int recall = s->pol.recall && s->lp;
  size_t lse_bytes = recall && !lse ? n_q_heads * sizeof(float) : 0;
  float *lse_own = lse_bytes ? kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, lse_bytes) : NULL;
  if (lse_own) c.lse = lse_own;
  kvt_lblk **blk = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, blk_bytes);
  float *buf = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, buf_bytes);
  int rc = (!blk || !buf || (lse_bytes && !lse_own)) ? -ENOMEM : 0;
  if (recall && !rc) kvt_recall_install(s, layer); /* the reads the last step started */
  size_t n = 0;
  kvt_promo *hold = NULL; /* blocks only on disk, brought back (promote.c) */
  if (!rc) rc = kvt_promote_hold(s, layer, &hold);
  if (!rc) {
    pthread_mutex_lock(&e->lock);
    uint32_t away = kvt_seq_nonresident(s, layer);
    n = away ? 0 : kvt_retained_pin(s, layer, blk, NULL);
    kvt_lineage_check_locked(s, blk, n); /* approximate bytes make s lossy */
    e->st.attends++;
    pthread_mutex_unlock(&e->lock);
    int why = kvt_promote_why(hold);
    kvt_promote_release(e, hold);
    *n_blocks = away ? away : n;
    rc = away ? KVT_ENOTRESIDENT
              : (block_mass && max_blocks < n) ? KVT_EBUFSIZE : check_warm(&c, blk, n);
    if (rc == KVT_EBUFSIZE)
      KVT_ERR(e, rc, "kvt_seq_attend", "max_blocks", "at least the retained blocks",
              "%zu (%zu retained)", max_blocks, n);
    else if (rc == KVT_ENOTRESIDENT)
      KVT_ERR(e, rc, "kvt_seq_attend", "layer", "every referenced block in RAM",
              "%u blocks on disk (%s)", away, kvt_promote_reason(why));
  }
  if (!rc) {
    if (block_mass) memset(block_mass, 0, n * sizeof *block_mass);
    if (n == 0) {
      memset(out, 0, (size_t)n_q_heads * c.D * sizeof *out);
      for (uint32_t h = 0; lse && h < n_q_heads; h++) lse[h] = -INFINITY;
    }
    c.blk = blk;
    c.n = n;
    c.stride = n * c.T;
    if (n) attend_all(&c, buf, per_wave, n_q_heads);
    if (recall && n) kvt_recall_note_query(s, layer, q, n_q_heads, scale, c.lse);
  }
  if (blk && n) {
    pthread_mutex_lock(&e->lock);
    kvt_retained_unpin(e, blk, n);
    pthread_mutex_unlock(&e->lock);
  }
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, blk, blk_bytes);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, buf, buf_bytes);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, lse_own, lse_bytes);
  return rc;
}
