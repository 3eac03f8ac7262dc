/* decoder.c - the forward pass of the reference decoder, with kvtier or a
 * plain array as its KV cache. Per layer, the K and V of the current token
 * go to the tail block held here; when the tail is full the token block is
 * appended to the sequence and put layer by layer. Attention merges the
 * engine's attention over the full blocks (kvt_seq_attend) with attention
 * over the tail; the plain cache runs the very arithmetic kvt_seq_attend
 * runs on hot blocks (engine/attend.c), so that with no budget both give
 * the same bits. Build with -ffp-contract=off, as the library is. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refmodel.h"

int rm_ns_register(kvt_engine *e, const rm_model *m, uint32_t block_tokens, kvt_ns_id *ns) {
  char id[96], fp[32];
  snprintf(id, sizeof id, "llama2c/%s", m->name);
  snprintf(fp, sizeof fp, "fnv1a64:%016llx", (unsigned long long)m->fingerprint);
  kvt_ns_desc d = {.model_id = id, .weights_fingerprint = fp, .rope_theta = 10000.0,
                   .tp_size = 1,
                   .shape = {.n_layers = (uint32_t)m->c.n_layers,
                             .n_kv_heads = (uint32_t)m->c.n_kv_heads, .head_dim = m->head_dim,
                             .dtype = KVT_F32, .block_tokens = block_tokens}};
  return kvt_ns_register(e, &d, ns);
}

void rm_dec_free(rm_dec *d) {
  if (!d) return;
  kvt_seq_release(d->s);
  float *bufs[] = {d->x, d->xb, d->xb2, d->hb, d->hb2, d->q, d->logits, d->att_b, d->lse_b,
                   d->k_tail, d->v_tail, d->k_all, d->v_all, d->mass, d->kv_rt};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  free(d->tokens);
  free(d->enc);
  memset(d, 0, sizeof *d);
}

int rm_dec_init(rm_dec *d, const rm_model *m, kvt_engine *e, kvt_ns_id ns) {
  memset(d, 0, sizeof *d);
  const rm_config *c = &m->c;
  size_t dim = (size_t)c->dim, L = (size_t)c->n_layers, S = (size_t)c->seq_len;
  d->m = m;
  d->e = e;
  d->ns = ns;
  d->observe = 1;
  d->scale = 1.0f / sqrtf((float)m->head_dim);
  d->bt = 16;
  if (e) {
    kvt_shape sh;
    int rc = kvt_ns_shape(e, ns, &sh);
    if (rc) return rc;
    if (sh.dtype != KVT_F32 || sh.n_layers != L || sh.head_dim != m->head_dim ||
        sh.n_kv_heads != (uint32_t)c->n_kv_heads)
      return KVT_ESHAPE;
    d->bt = sh.block_tokens;
    if ((rc = kvt_seq_create(e, ns, &d->s))) return rc;
  }
  size_t tail = L * d->bt * m->kv_dim;
  d->x = calloc(dim, sizeof(float));
  d->xb = calloc(dim, sizeof(float));
  d->xb2 = calloc(dim, sizeof(float));
  d->q = calloc(dim, sizeof(float));
  d->att_b = calloc(dim, sizeof(float));
  d->lse_b = calloc((size_t)c->n_heads, sizeof(float));
  d->hb = calloc((size_t)c->hidden_dim, sizeof(float));
  d->hb2 = calloc((size_t)c->hidden_dim, sizeof(float));
  d->logits = calloc((size_t)c->vocab_size, sizeof(float));
  d->k_tail = calloc(tail, sizeof(float));
  d->v_tail = calloc(tail, sizeof(float));
  d->tokens = calloc(S, sizeof(uint32_t));
  d->mass = calloc(S / d->bt + 1, sizeof(float));
  d->kv_rt = calloc((size_t)d->bt * m->kv_dim, sizeof(float));
  int ok = d->x && d->xb && d->xb2 && d->q && d->att_b && d->lse_b && d->hb && d->hb2 &&
           d->logits && d->k_tail && d->v_tail && d->tokens && d->mass && d->kv_rt;
  if (ok && !e) {
    d->k_all = calloc(L * S * m->kv_dim, sizeof(float));
    d->v_all = calloc(L * S * m->kv_dim, sizeof(float));
    ok = d->k_all && d->v_all;
  }
  if (!ok) {
    rm_dec_free(d);
    return -ENOMEM;
  }
  return 0;
}

/* ---- arithmetic ------------------------------------------------------------ */

static void rmsnorm(float *o, const float *x, const float *w, size_t n) {
  float ss = 0;
  for (size_t i = 0; i < n; i++) ss += x[i] * x[i];
  ss = 1.0f / sqrtf(ss / (float)n + 1e-5f);
  for (size_t i = 0; i < n; i++) o[i] = w[i] * (ss * x[i]);
}

/* o[rows] = W[rows][cols] x[cols]. Eight independent partial sums per row
 * (summed in a fixed order, so the result is the same on every run and in
 * both caches): a single running sum is bound by the latency of one add
 * per element. Attention keeps kvt_seq_attend's single sums (below). */
static void matmul(float *o, const float *x, const float *w, size_t rows, size_t cols) {
  for (size_t r = 0; r < rows; r++) {
    const float *wr = w + r * cols;
    float acc[8] = {0}, s = 0;
    size_t i = 0;
    for (; i + 8 <= cols; i += 8)
      for (int j = 0; j < 8; j++) acc[j] += wr[i + j] * x[i + j];
    for (; i < cols; i++) s += wr[i] * x[i];
    o[r] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + s;
  }
}

/* RoPE on interleaved pairs (llama2.c): pair (2i, 2i+1) of each head turns
 * by pos * 10000^(-2i / head_dim). */
static void rope(float *v, size_t n, uint32_t head_dim, uint32_t pos) {
  for (size_t i = 0; i < n; i += 2) {
    float freq = 1.0f / powf(10000.0f, (float)(i % head_dim) / (float)head_dim);
    float a = (float)pos * freq, fr = cosf(a), fi = sinf(a), v0 = v[i], v1 = v[i + 1];
    v[i] = v0 * fr - v1 * fi;
    v[i + 1] = v0 * fi + v1 * fr;
  }
}

static float dot(const float *a, const float *b, uint32_t n) {
  float s = 0;
  for (uint32_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* Softmax in place; returns the log of the denominator with the max
 * (engine/attend.c's softmax, operation for operation). */
static float softmax_lse(float *p, size_t n) {
  float m = -INFINITY, l = 0;
  for (size_t i = 0; i < n; i++) m = p[i] > m ? p[i] : m;
  for (size_t i = 0; i < n; i++) l += (p[i] = expf(p[i] - m));
  float inv = 1.0f / l;
  for (size_t i = 0; i < n; i++) p[i] *= inv;
  return m + logf(l);
}

/* One query head over n cached positions of K and V rows with stride kv_dim
 * (offset kh * head_dim): out = softmax(scale q.k) v, returns the lse.
 * The order of every sum is kvt_seq_attend's on hot blocks. */
static float attend_rows(const float *q, const float *k, const float *v, size_t n, size_t stride,
                         uint32_t D, float scale, float *out, float *p) {
  for (size_t t = 0; t < n; t++) p[t] = scale * dot(q, k + t * stride, D);
  float lse = softmax_lse(p, n);
  memset(out, 0, D * sizeof *out);
  for (size_t t = 0; t < n; t++) {
    if (p[t] == 0) continue;
    for (uint32_t i = 0; i < D; i++) out[i] += p[t] * v[t * stride + i];
  }
  return lse;
}

/* ---- the cache ---------------------------------------------------------------- */

/* Attention over the full blocks of layer l into d->att_b, d->lse_b. */
#define RELOAD_ROUNDS 8

/* Blocks of layer l that left RAM for the cold tier: read each back and
 * put it, which gives the engine its RAM copy again (attention never runs
 * over fewer blocks than the sequence holds). */
static int reload_layer(rm_dec *d, uint32_t l) {
  const rm_model *m = d->m;
  size_t max = (size_t)m->c.seq_len / d->bt + 1, n = 0, each = (size_t)d->bt * m->kv_dim;
  kvt_gathered *g = malloc(max * sizeof *g);
  float *k = malloc(2 * each * sizeof *k);
  int rc = g && k ? KVT_ENOTRESIDENT : -ENOMEM;
  /* A put may push out an older block of the layer: again, a few times. */
  for (int round = 0; rc == KVT_ENOTRESIDENT && round < RELOAD_ROUNDS; round++) {
    rc = kvt_seq_retained(d->s, l, g, max, &n);
    if (rc != KVT_ENOTRESIDENT) break;
    rc = n <= max ? 0 : KVT_EBUFSIZE;
    for (size_t i = 0; !rc && i < n; i++) {
      kvt_kv kv = {.k = k, .v = k + each, .dtype = KVT_F32, .n_tokens = d->bt,
                   .n_heads = (uint32_t)m->c.n_kv_heads, .head_dim = m->head_dim};
      rc = kvt_seq_read(d->s, g[i].block, l, k, k + each, each * sizeof *k);
      if (!rc) rc = kvt_seq_put(d->s, g[i].block, l, &kv);
    }
    if (!rc) rc = KVT_ENOTRESIDENT; /* see whether that was all */
  }
  free(g);
  free(k);
  return rc;
}

static int attend_blocks(rm_dec *d, uint32_t l, float *p) {
  const rm_model *m = d->m;
  uint32_t H = (uint32_t)m->c.n_heads, D = m->head_dim, grp = H / (uint32_t)m->c.n_kv_heads;
  size_t full = (size_t)(d->pos / d->bt) * d->bt;
  if (!d->e) {
    const float *k = d->k_all + (size_t)l * m->c.seq_len * m->kv_dim;
    const float *v = d->v_all + (size_t)l * m->c.seq_len * m->kv_dim;
    for (uint32_t h = 0; h < H; h++) {
      size_t off = (size_t)(h / grp) * D;
      if (full == 0) {
        memset(d->att_b + (size_t)h * D, 0, D * sizeof(float));
        d->lse_b[h] = -INFINITY;
        continue;
      }
      d->lse_b[h] = attend_rows(d->q + (size_t)h * D, k + off, v + off, full, m->kv_dim, D,
                                d->scale, d->att_b + (size_t)h * D, p);
    }
    return 0;
  }
  size_t n = 0, max = (size_t)m->c.seq_len / d->bt + 1;
  int rc = kvt_seq_attend(d->s, l, d->q, H, d->scale, d->att_b, d->lse_b, d->mass, max, &n);
  if (rc == KVT_ENOTRESIDENT && !(rc = reload_layer(d, l)))
    rc = kvt_seq_attend(d->s, l, d->q, H, d->scale, d->att_b, d->lse_b, d->mass, max, &n);
  if (rc) return rc;
  if (d->on_mass) d->on_mass(d->on_mass_arg, l, d->pos, d->s, d->mass, n);
  return d->observe ? kvt_seq_observe(d->s, l, d->mass, n) : 0;
}

/* out (d->xb) = attention of every query head over the blocks merged with
 * the tail, through the two log-sum-exps. */
static int attention(rm_dec *d, uint32_t l, float *p) {
  const rm_model *m = d->m;
  uint32_t H = (uint32_t)m->c.n_heads, D = m->head_dim, grp = H / (uint32_t)m->c.n_kv_heads;
  int rc = attend_blocks(d, l, p);
  if (rc) return rc;
  size_t nt = d->pos % d->bt + 1;
  const float *kt = d->k_tail + (size_t)l * d->bt * m->kv_dim;
  const float *vt = d->v_tail + (size_t)l * d->bt * m->kv_dim;
  for (uint32_t h = 0; h < H; h++) {
    float ot[KVT_MAX_HEAD_DIM], *o = d->xb + (size_t)h * D, *ob = d->att_b + (size_t)h * D;
    size_t off = (size_t)(h / grp) * D;
    float lt = attend_rows(d->q + (size_t)h * D, kt + off, vt + off, nt, m->kv_dim, D, d->scale,
                           ot, p);
    float lb = d->lse_b[h];
    if (lb == -INFINITY) {
      memcpy(o, ot, D * sizeof *o);
      continue;
    }
    float mx = lb > lt ? lb : lt, wb = expf(lb - mx), wt = expf(lt - mx), inv = 1.0f / (wb + wt);
    for (uint32_t i = 0; i < D; i++) o[i] = (wb * ob[i] + wt * ot[i]) * inv;
  }
  return 0;
}

/* Quantize and dequantize one [bt][kv_heads][head_dim] tensor in place
 * with a warm codec (public kvt_codec_*), to measure a codec on one side
 * alone while the other stays exact. */
static int codec_round_trip(rm_dec *d, int codec, float *x, uint32_t layer) {
  kvt_codec_shape cs = {.n_tokens = d->bt, .n_heads = (uint32_t)d->m->c.n_kv_heads,
                        .head_dim = d->m->head_dim, .seed = 0x5eedull + layer};
  size_t need = kvt_codec_size(codec, &cs);
  if (need > d->enc_len) {
    uint8_t *p = realloc(d->enc, need);
    if (!p) return -ENOMEM;
    d->enc = p;
    d->enc_len = need;
  }
  int64_t w = kvt_codec_encode(codec, &cs, x, KVT_F32, d->enc, need);
  if (w < 0) return (int)w;
  return kvt_codec_decode(codec, &cs, d->enc, (size_t)w, x, KVT_F32);
}

/* The tail is full: hand its token block to the cache. */
static int flush_tail(rm_dec *d) {
  const rm_model *m = d->m;
  uint32_t L = (uint32_t)m->c.n_layers, b0 = d->pos + 1 - d->bt;
  size_t each = (size_t)d->bt * m->kv_dim;
  if (!d->e) {
    for (uint32_t l = 0; l < L; l++) {
      size_t at = ((size_t)l * m->c.seq_len + b0) * m->kv_dim;
      memcpy(d->k_all + at, d->k_tail + l * each, each * sizeof(float));
      memcpy(d->v_all + at, d->v_tail + l * each, each * sizeof(float));
    }
    return 0;
  }
  kvt_append_info info;
  int rc = kvt_seq_append(d->s, d->tokens + b0, d->bt, &info);
  for (uint32_t l = 0; !rc && l < L; l++) {
    float *k = d->k_tail + l * each, *v = d->v_tail + l * each;
    for (int side = 0; side < 2 && !rc; side++) {
      if (!d->rt_codec[side]) continue;
      float *x = side ? v : k;
      memcpy(d->kv_rt, x, each * sizeof(float));
      rc = codec_round_trip(d, d->rt_codec[side], d->kv_rt, l);
      if (side) v = d->kv_rt;
      else k = d->kv_rt;
    }
    kvt_kv kv = {.k = k, .v = v, .dtype = KVT_F32, .n_tokens = d->bt,
                 .n_heads = (uint32_t)m->c.n_kv_heads, .head_dim = m->head_dim};
    if (!rc) rc = kvt_seq_put(d->s, info.block, l, &kv);
  }
  return rc;
}

int rm_dec_step(rm_dec *d, uint32_t token, const float **logits) {
  const rm_model *m = d->m;
  const rm_config *c = &m->c;
  if (d->pos >= (uint32_t)c->seq_len) return KVT_ECOUNT;
  if (token >= (uint32_t)c->vocab_size) return KVT_ENOTFOUND;
  size_t dim = (size_t)c->dim, hid = (size_t)c->hidden_dim, kvd = m->kv_dim;
  float p[1024], *pb = (size_t)c->seq_len > 1024 ? malloc((size_t)c->seq_len * sizeof *pb) : p;
  if (!pb) return -ENOMEM;
  d->tokens[d->pos] = token;
  memcpy(d->x, m->tok_emb + (size_t)token * dim, dim * sizeof(float));
  /* the budget counts the tail this step attends: pos + 1 tokens */
  int rc = d->e ? kvt_seq_set_tokens(d->s, (uint64_t)d->pos + 1) : 0;
  for (uint32_t l = 0; l < (uint32_t)c->n_layers && !rc; l++) {
    float *kt = d->k_tail + ((size_t)l * d->bt + d->pos % d->bt) * kvd;
    float *vt = d->v_tail + ((size_t)l * d->bt + d->pos % d->bt) * kvd;
    rmsnorm(d->xb, d->x, m->rms_att + l * dim, dim);
    matmul(d->q, d->xb, m->wq + l * dim * dim, dim, dim);
    matmul(kt, d->xb, m->wk + l * dim * kvd, kvd, dim);
    matmul(vt, d->xb, m->wv + l * dim * kvd, kvd, dim);
    rope(d->q, dim, m->head_dim, d->pos);
    rope(kt, kvd, m->head_dim, d->pos);
    if ((rc = attention(d, l, pb))) break;
    matmul(d->xb2, d->xb, m->wo + l * dim * dim, dim, dim);
    for (size_t i = 0; i < dim; i++) d->x[i] += d->xb2[i];
    rmsnorm(d->xb, d->x, m->rms_ffn + l * dim, dim);
    matmul(d->hb, d->xb, m->w1 + l * hid * dim, hid, dim);
    matmul(d->hb2, d->xb, m->w3 + l * hid * dim, hid, dim);
    for (size_t i = 0; i < hid; i++) { /* SwiGLU: silu(w1 x) * (w3 x) */
      float v = d->hb[i];
      d->hb[i] = v * (1.0f / (1.0f + expf(-v))) * d->hb2[i];
    }
    matmul(d->xb, d->hb, m->w2 + l * dim * hid, dim, hid);
    for (size_t i = 0; i < dim; i++) d->x[i] += d->xb[i];
  }
  if (pb != p) free(pb);
  if (rc) return rc;
  rmsnorm(d->x, d->x, m->rms_final, dim);
  matmul(d->logits, d->x, m->wcls, (size_t)c->vocab_size, dim);
  if (d->pos % d->bt == d->bt - 1 && (rc = flush_tail(d))) return rc;
  d->pos++;
  if (logits) *logits = d->logits;
  return 0;
}

int rm_dec_resume(rm_dec *d, const uint32_t *tokens, size_t n, size_t *n_tokens) {
  *n_tokens = 0;
  if (!d->e || d->pos) return KVT_ESTATE;
  const rm_model *m = d->m;
  uint32_t L = (uint32_t)m->c.n_layers;
  size_t found = 0, nk = 0, each = (size_t)d->bt * m->kv_dim * sizeof(float);
  if (n > (size_t)m->c.seq_len) n = (size_t)m->c.seq_len;
  int rc = kvt_lookup(d->e, d->ns, tokens, n ? n - 1 : 0, NULL, 0, &found);
  if (rc || !found) return rc;
  kvt_load_req *req = calloc(L, sizeof *req);
  kvt_key *keys = calloc(found, sizeof *keys);
  if (!req || !keys) rc = -ENOMEM;
  if (!rc) rc = kvt_keys(d->e, d->ns, tokens, found * d->bt, keys, found, &nk);
  for (size_t b = 0; !rc && b < nk; b++) {
    /* Load before appending: a block that cannot be loaded is not in the
     * sequence, and the caller computes it and the rest. */
    for (uint32_t l = 0; l < L; l++)
      req[l] = (kvt_load_req){.key = keys[b], .layer = l,
                              .k_out = d->k_tail + (size_t)l * d->bt * m->kv_dim,
                              .v_out = d->v_tail + (size_t)l * d->bt * m->kv_dim,
                              .bytes_each = each};
    kvt_load *ld;
    if ((rc = kvt_load_submit(d->e, d->ns, req, L, &ld)) || (rc = kvt_load_wait(ld, NULL))) {
      if (rc == KVT_ENOTFOUND || rc == KVT_ECORRUPT) rc = 0; /* failed its check, or gone */
      break;
    }
    kvt_append_info info;
    const uint32_t *bt = tokens + b * d->bt;
    if ((rc = kvt_seq_append(d->s, bt, d->bt, &info))) break;
    for (uint32_t l = 0; !rc && l < L; l++) {
      kvt_kv kv = {.k = req[l].k_out, .v = req[l].v_out, .dtype = KVT_F32, .n_tokens = d->bt,
                   .n_heads = (uint32_t)m->c.n_kv_heads, .head_dim = m->head_dim};
      rc = kvt_seq_put(d->s, info.block, l, &kv);
    }
    memcpy(d->tokens + b * d->bt, bt, d->bt * sizeof *bt);
    d->pos = (uint32_t)((b + 1) * d->bt);
  }
  free(req);
  free(keys);
  *n_tokens = d->pos;
  return rc;
}
