/* attend.c - attention of one query over the retained blocks of a
 * (sequence, layer): exact on hot blocks, in place on the quantized data
 * of warm blocks. For warm values, sum_t p_t v_t = S H (sum_t p_t w_t c_t)
 * (S the sign diagonal, H the Hadamard transform, c_t the centroid codes,
 * w_t = norm_t / vdim): one inverse rotation per head per query instead of
 * one per token. Blocks are pinned; the arithmetic runs outside the lock. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "engine/internal.h"
#include "tiers/codec.h"

typedef struct attend_ctx {
  const kvt_nsrec *ns;
  uint32_t layer, T, H, D, vdim;
  size_t es;
  kvt_cshape cs;
} attend_ctx;

static float dot_f32(const float *a, const float *b, uint32_t n) {
  float s = 0;
  for (uint32_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* scores[t] = scale * q . k_t for head kh of block b */
static void block_scores(const attend_ctx *c, const kvt_lblk *b, uint32_t kh, const float *q,
                         float scale, float *scores) {
  if (b->tier == KVT_TIER_WARM) {
    kvt_codec_k_dots(b->k_codec, &c->cs, b->payload, kh, q, scores);
    for (uint32_t t = 0; t < c->T; t++) scores[t] *= scale;
    return;
  }
  float k[KVT_MAX_HEAD_DIM];
  for (uint32_t t = 0; t < c->T; t++) {
    kvt_to_f32(b->payload + ((size_t)t * c->H + kh) * c->D * c->es, c->ns->desc.shape.dtype, c->D, k);
    scores[t] = scale * dot_f32(q, k, c->D);
  }
}

/* out += sum_t p_t v_t for hot blocks; rot += the rotated-domain sum for warm. */
static void block_values(const attend_ctx *c, const kvt_lblk *b, uint32_t kh, const float *p,
                         float *out, float *rot) {
  if (b->tier == KVT_TIER_WARM) {
    kvt_codec_v_accum(b->v_codec, &c->cs, b->payload + b->k_len, kh, p, rot);
    return;
  }
  const uint8_t *v0 = b->payload + c->ns->bytes_each;
  float v[KVT_MAX_HEAD_DIM];
  for (uint32_t t = 0; t < c->T; t++) {
    if (p[t] == 0) continue;
    kvt_to_f32(v0 + ((size_t)t * c->H + kh) * c->D * c->es, c->ns->desc.shape.dtype, c->D, v);
    for (uint32_t d = 0; d < c->D; d++) out[d] += p[t] * v[d];
  }
}

/* Warm payloads are checked once per call before their codes are used. */
static int check_warm(const attend_ctx *c, kvt_lblk *const *blk, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const kvt_lblk *b = blk[i];
    if (b->tier != KVT_TIER_WARM) continue;
    size_t kl = kvt_codec_size(b->k_codec, &c->cs), vl = kvt_codec_size(b->v_codec, &c->cs);
    if (kl != b->k_len || kvt_codec_check(b->k_codec, &c->cs, b->payload, kl) ||
        kvt_codec_check(b->v_codec, &c->cs, b->payload + kl, vl))
      return KVT_ECORRUPT;
  }
  return 0;
}

/* One query head over all blocks. scores has n * T floats. */
static void attend_head(const attend_ctx *c, kvt_lblk *const *blk, size_t n, uint32_t kh,
                        const float *q, float scale, float *scores, float *out, float *lse,
                        float *mass) {
  float m = -INFINITY, l = 0, rot[KVT_MAX_HEAD_DIM];
  for (size_t i = 0; i < n; i++) block_scores(c, blk[i], kh, q, scale, scores + i * c->T);
  for (size_t j = 0; j < n * c->T; j++) m = fmaxf(m, scores[j]);
  for (size_t j = 0; j < n * c->T; j++) l += (scores[j] = expf(scores[j] - m));
  for (size_t j = 0; j < n * c->T; j++) scores[j] /= l;
  memset(out, 0, c->D * sizeof *out);
  memset(rot, 0, c->vdim * sizeof *rot);
  int any_warm = 0;
  for (size_t i = 0; i < n; i++) {
    const float *p = scores + i * c->T;
    block_values(c, blk[i], kh, p, out, rot);
    any_warm |= blk[i]->tier == KVT_TIER_WARM;
    if (mass)
      for (uint32_t t = 0; t < c->T; t++) mass[i] += p[t];
  }
  if (any_warm) {
    float w[KVT_MAX_HEAD_DIM];
    kvt_codec_v_unrotate(&c->cs, rot, w);
    for (uint32_t d = 0; d < c->D; d++) out[d] += w[d];
  }
  if (lse) *lse = m + logf(l);
}

int kvt_seq_attend(kvt_seq *s, uint32_t layer, const float *q, uint32_t n_q_heads, float scale,
                   float *out, float *lse, float *block_mass, size_t max_blocks, size_t *n_blocks) {
  if (!s || !q || !out || !n_blocks) return KVT_ENULL;
  *n_blocks = 0;
  kvt_engine *e = s->e;
  const kvt_shape *sh = &s->ns->desc.shape;
  if (layer >= sh->n_layers) return KVT_ENOTFOUND;
  if (n_q_heads == 0 || n_q_heads % sh->n_kv_heads || n_q_heads > KVT_MAX_HEADS * 64)
    return KVT_ECOUNT;
  if (kvt_meta_only(e)) return KVT_ENOPAYLOAD;
  if (scale == 0) scale = 1.0f / sqrtf((float)sh->head_dim);
  attend_ctx c = {.ns = s->ns, .layer = layer, .T = sh->block_tokens, .H = sh->n_kv_heads,
                  .D = sh->head_dim, .vdim = kvt_codec_vdim(sh->head_dim),
                  .es = kvt_dtype_size(sh->dtype),
                  .cs = {.n_tokens = sh->block_tokens, .n_heads = sh->n_kv_heads,
                         .head_dim = sh->head_dim, .seed = kvt_layer_seed(s->ns, layer)}};
  size_t cap = s->n_blocks ? s->n_blocks : 1;
  size_t blk_bytes = cap * sizeof(kvt_lblk *), sc_bytes = cap * c.T * sizeof(float);
  kvt_lblk **blk = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, blk_bytes);
  float *scores = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, sc_bytes);
  int rc = (!blk || !scores) ? -ENOMEM : 0;
  size_t n = 0;
  if (!rc) {
    pthread_mutex_lock(&e->lock);
    n = kvt_retained_pin(s, layer, blk, NULL);
    e->st.attends++;
    pthread_mutex_unlock(&e->lock);
    *n_blocks = n;
    rc = (block_mass && max_blocks < n) ? KVT_EBUFSIZE : check_warm(&c, blk, n);
  }
  if (!rc) {
    if (block_mass) memset(block_mass, 0, n * sizeof *block_mass);
    if (n == 0) {
      memset(out, 0, (size_t)n_q_heads * c.D * sizeof *out);
      for (uint32_t h = 0; lse && h < n_q_heads; h++) lse[h] = -INFINITY;
    }
    uint32_t group = n_q_heads / c.H;
    for (uint32_t h = 0; n && h < n_q_heads; h++)
      attend_head(&c, blk, n, h / group, q + (size_t)h * c.D, scale, scores, out + (size_t)h * c.D,
                  lse ? lse + h : NULL, block_mass);
  }
  if (blk && n) {
    pthread_mutex_lock(&e->lock);
    kvt_retained_unpin(e, blk, n);
    pthread_mutex_unlock(&e->lock);
  }
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, blk, blk_bytes);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, scores, sc_bytes);
  return rc;
}
