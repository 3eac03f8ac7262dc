/* bench_codec_attn.c - `kvtier bench codec`, attention: the output error
 * of kvt_seq_attend over a warm context against exact attention in double,
 * and attention in place against dequantize-then-attend and the fused
 * baseline (bench_codec.h). */
#include "bench_codec.h"

/* ---- attention: exact reference in double ------------------------------------ */

typedef struct att_data {
  uint32_t n_tok, n_blk;
  uint32_t *tokens;
  uint16_t *k, *v;   /* [tok][head][dim] f16, as put */
  float *kf, *vf;    /* the same as f32 */
  float *kd, *vd;    /* scratch: dequantized by the tool */
  float *q;          /* [ATT_QUERIES][C_QHEADS][C_DIM] */
  double *o_exact;   /* [ATT_QUERIES][C_QHEADS][C_DIM] */
  double *sc;        /* [n_tok] */
} att_data;

static double dot_d(const float *a, const float *b, uint32_t n)
{
  double s[4] = {0, 0, 0, 0}; /* four chains: the sum is not latency bound */
  for (uint32_t i = 0; i < n; i += 4)
    for (int j = 0; j < 4; j++) s[j] += (double)a[i + j] * b[i + j];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

/* out = softmax(q.k / sqrt(D)) v for every query head, in double. */
static void attn_ref(const float *k, const float *v, uint32_t n_tok, const float *q, double *sc,
                     double *out)
{
  const double scale = 1.0 / sqrt((double)C_DIM);
  for (uint32_t qh = 0; qh < C_QHEADS; qh++) {
    const uint32_t kh = qh / C_GROUP;
    const float *qv = q + (size_t)qh * C_DIM;
    double m = -INFINITY, l = 0, *o = out + (size_t)qh * C_DIM;
    for (uint32_t t = 0; t < n_tok; t++) {
      sc[t] = scale * dot_d(qv, k + ((size_t)t * C_HEADS + kh) * C_DIM, C_DIM);
      if (sc[t] > m) m = sc[t];
    }
    for (uint32_t t = 0; t < n_tok; t++) l += (sc[t] = exp(sc[t] - m));
    memset(o, 0, C_DIM * sizeof *o);
    for (uint32_t t = 0; t < n_tok; t++) {
      const float *vr = v + ((size_t)t * C_HEADS + kh) * C_DIM;
      const double w = sc[t] / l;
      for (uint32_t d = 0; d < C_DIM; d++) o[d] += w * vr[d];
    }
  }
}

/* sqrt(sum |o - o_exact|^2 / sum |o_exact|^2) over all queries and heads. */
static double rel_err_d(const double *o, const double *ref, size_t n)
{
  double se = 0, ss = 0;
  for (size_t i = 0; i < n; i++) {
    se += (o[i] - ref[i]) * (o[i] - ref[i]);
    ss += ref[i] * ref[i];
  }
  return sqrt(se / ss);
}

static void att_free(att_data *a)
{
  free(a->tokens);
  free(a->k);
  free(a->v);
  free(a->kf);
  free(a->vf);
  free(a->kd);
  free(a->vd);
  free(a->q);
  free(a->o_exact);
  free(a->sc);
}

static int att_init(codec_run *r, att_data *a)
{
  memset(a, 0, sizeof *a);
  a->n_tok = (uint32_t)r->cfg.tokens;
  a->n_blk = a->n_tok / C_TOKENS;
  const size_t nv = (size_t)a->n_tok * C_VEC, nq = (size_t)ATT_QUERIES * C_QHEADS * C_DIM;
  a->tokens = malloc(a->n_tok * sizeof *a->tokens);
  a->k = malloc(nv * 2);
  a->v = malloc(nv * 2);
  a->kf = malloc(nv * 4);
  a->vf = malloc(nv * 4);
  a->kd = malloc(nv * 4);
  a->vd = malloc(nv * 4);
  a->q = malloc(nq * sizeof *a->q);
  a->o_exact = malloc(nq * sizeof *a->o_exact);
  a->sc = malloc(a->n_tok * sizeof *a->sc);
  if (!a->tokens || !a->k || !a->v || !a->kf || !a->vf || !a->kd || !a->vd || !a->q ||
      !a->o_exact || !a->sc)
    return codec_fail("allocating", -ENOMEM);
  int rc = gen_kv(1, 0, a->n_tok, mix64(r->cfg.seed ^ 0x617474ull), a->k, a->v, a->tokens);
  if (rc) return codec_fail("generating KV", rc);
  f16_to_f32_n(a->k, nv, a->kf);
  f16_to_f32_n(a->v, nv, a->vf);
  prng p;
  prng_seed(&p, mix64(r->cfg.seed ^ 0x7175657279ull));
  fill_gauss_f32(&p, a->q, nq);
  for (uint32_t i = 0; i < ATT_QUERIES; i++)
    attn_ref(a->kf, a->vf, a->n_tok, a->q + (size_t)i * C_QHEADS * C_DIM, a->sc,
             a->o_exact + (size_t)i * C_QHEADS * C_DIM);
  return CLI_OK;
}

/* Dequantize every tensor of x with codec ci (tool side) into y (f32). */
static int att_dequant(codec_run *r, const att_data *a, int ci, const uint16_t *x, float *y)
{
  uint8_t *enc = malloc(r->res[ci].enc_bytes);
  int rc = enc ? CLI_OK : codec_fail("allocating", -ENOMEM);
  for (uint32_t b = 0; b < a->n_blk && rc == CLI_OK; b++)
    rc = roundtrip(codec_ids[ci], mix64(r->cfg.seed ^ b), x + (size_t)b * C_VALUES, enc,
                   r->res[ci].enc_bytes, y + (size_t)b * C_VALUES);
  free(enc);
  return rc;
}

/* Error of attention with only K (or only V) quantized by codec ci: which
 * half of a pair the error comes from. */
static int att_alone(codec_run *r, att_data *a, int ci)
{
  const int is_v = ci >= N_KC;
  int rc = att_dequant(r, a, ci, is_v ? a->v : a->k, is_v ? a->vd : a->kd);
  if (rc != CLI_OK) return rc;
  const size_t nq = (size_t)C_QHEADS * C_DIM;
  double *o = malloc(ATT_QUERIES * nq * sizeof *o);
  if (!o) return codec_fail("allocating", -ENOMEM);
  for (uint32_t i = 0; i < ATT_QUERIES; i++)
    attn_ref(is_v ? a->kf : a->kd, is_v ? a->vd : a->vf, a->n_tok, a->q + i * nq, a->sc,
             o + i * nq);
  r->res[ci].attn_alone = rel_err_d(o, a->o_exact, ATT_QUERIES * nq);
  free(o);
  return CLI_OK;
}

/* ---- attention through the engine ----------------------------------------------- */

static kvt_ns_desc codec_desc(uint32_t n_layers)
{
  return (kvt_ns_desc){.model_id = "kvtier-bench/llama-3-8b-shape",
                       .weights_fingerprint = "generated-kv-v1",
                       .rope_theta = 500000.0,
                       .tp_size = 1,
                       .shape = {n_layers, C_HEADS, C_DIM, KVT_F16, C_TOKENS}};
}

/* An engine where every block is warm (hot limit 0: a block can never fit
 * hot, so puts encode it straight into warm), or, with k_codec 0, every
 * block hot. */
static int open_codec_engine(const char *dir, uint32_t n_layers, uint64_t n_lblk, int k_codec,
                             int v_codec, kvt_engine **e, kvt_ns_id *ns)
{
  kvt_options opt;
  kvt_options_init(&opt);
  if (k_codec) {
    uint64_t per = kvt_codec_size(k_codec, &blk_shape) + kvt_codec_size(v_codec, &blk_shape);
    opt.tier_bytes_limit[KVT_TIER_HOT] = 0;
    opt.tier_bytes_limit[KVT_TIER_WARM] = n_lblk * (per + 1024) + (16u << 20);
  } else {
    opt.tier_bytes_limit[KVT_TIER_HOT] = n_lblk * (2 * C_F16_BYTES + 1024) + (16u << 20);
  }
  int rc = cli_engine_open(dir, &opt, e);
  kvt_ns_desc d = codec_desc(n_layers);
  if (rc == 0) rc = kvt_ns_register(*e, &d, ns);
  if (rc == 0 && k_codec) rc = kvt_ns_set_codec(*e, *ns, KVT_ALL_LAYERS, k_codec, v_codec);
  return rc;
}

/* Append the blocks of tokens and put k, v ([tok][head][dim]) in every layer. */
static int put_context(kvt_seq *s, const uint32_t *tokens, uint32_t n_blk, uint32_t n_layers,
                       const uint16_t *k, const uint16_t *v)
{
  for (uint32_t b = 0; b < n_blk; b++) {
    int rc = kvt_seq_append(s, tokens + (size_t)b * C_TOKENS, C_TOKENS, NULL);
    for (uint32_t l = 0; l < n_layers && rc == 0; l++) {
      kvt_kv kv = {k + (size_t)b * C_VALUES, v + (size_t)b * C_VALUES, KVT_F16, C_TOKENS,
                   C_HEADS, C_DIM};
      rc = kvt_seq_put(s, b, l, &kv);
    }
    if (rc != 0) return rc;
  }
  return 0;
}

/* Every block where it should be: all warm (or all hot for the reference). */
static int check_tiers(kvt_engine *e, uint64_t n_lblk, int warm)
{
  kvt_stats st;
  int rc = kvt_stats_get(e, &st);
  if (rc != 0) return codec_fail("reading the counters", rc);
  if (st.tier_blocks[warm ? KVT_TIER_WARM : KVT_TIER_HOT] == n_lblk &&
      st.tier_blocks[warm ? KVT_TIER_HOT : KVT_TIER_WARM] == 0)
    return CLI_OK;
  fprintf(stderr, "kvtier bench codec: %" PRIu64 " hot and %" PRIu64 " warm layer blocks, "
          "expected %" PRIu64 " %s\n", st.tier_blocks[KVT_TIER_HOT],
          st.tier_blocks[KVT_TIER_WARM], n_lblk, warm ? "warm" : "hot");
  return CLI_FAIL;
}

/* kvt_seq_attend over the context put with codecs (k_codec, v_codec), or
 * hot with k_codec 0, against exact attention in double. */
static int att_engine(codec_run *r, const att_data *a, int k_codec, int v_codec, double *err)
{
  kvt_engine *e = NULL;
  kvt_ns_id ns = 0;
  kvt_seq *s = NULL;
  const size_t nq = (size_t)C_QHEADS * C_DIM;
  float *o = malloc(nq * sizeof *o);
  double se = 0, ss = 0;
  int rc = o ? open_codec_engine(r->dir, 1, a->n_blk, k_codec, v_codec, &e, &ns) : -ENOMEM;
  if (rc == 0) rc = kvt_seq_create(e, ns, &s);
  if (rc == 0) rc = put_context(s, a->tokens, a->n_blk, 1, a->k, a->v);
  rc = rc ? codec_fail("putting the attention context", rc) : check_tiers(e, a->n_blk, k_codec);
  for (uint32_t i = 0; i < ATT_QUERIES && rc == CLI_OK; i++) {
    size_t nb = 0;
    int arc = kvt_seq_attend(s, 0, a->q + i * nq, C_QHEADS, 0, o, NULL, NULL, 0, &nb);
    if (arc != 0 || nb != a->n_blk) {
      rc = codec_fail("attending", arc ? arc : KVT_ECOUNT);
      break;
    }
    for (size_t j = 0; j < nq; j++) {
      double ref = a->o_exact[i * nq + j], d = o[j] - ref;
      se += d * d;
      ss += ref * ref;
    }
  }
  *err = sqrt(se / ss);
  kvt_seq_release(s);
  kvt_engine_close(e);
  free(o);
  return rc;
}

int attention_tests(codec_run *r)
{
  att_data a;
  progress("bench codec: exact attention over %" PRIu64 " tokens", r->cfg.tokens);
  int rc = att_init(r, &a);
  if (rc == CLI_OK) rc = att_engine(r, &a, 0, 0, &r->attn_hot);
  for (int ki = 0; ki < N_KC && rc == CLI_OK; ki++)
    for (int vi = N_KC; vi < N_CODECS && rc == CLI_OK; vi++) {
      progress("bench codec: attention with %s%s", cname(ki), cname(vi));
      rc = att_engine(r, &a, codec_ids[ki], codec_ids[vi], &r->attn_pair[ki][vi - N_KC]);
    }
  for (int ci = 0; ci < N_CODECS && rc == CLI_OK; ci++) {
    progress("bench codec: attention with only %s", cname(ci));
    rc = att_alone(r, &a, ci);
  }
  progress_end();
  att_free(&a);
  return rc;
}

/* ---- dequantize-then-attend, the tool's kernel -------------------------------------- */

/* Attention of C_GROUP query heads over one KV head of gathered f16 K and
 * V, as a serving engine would run it after dequantizing: K and V rows are
 * read once per group (GQA), scores in f32, softmax with expf. */

#define TOOL_AVX2 __attribute__((target("avx2,fma,f16c")))

TOOL_AVX2 static float hsum8(__m256 v)
{
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

TOOL_AVX2 static void scores_avx2(const uint16_t *k, uint32_t n_tok, uint32_t h, const float *q,
                                  float scale, float *sc)
{
  for (uint32_t t = 0; t < n_tok; t++) {
    const uint16_t *row = k + ((size_t)t * C_HEADS + h) * C_DIM;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (uint32_t d = 0; d < C_DIM; d += 8) {
      __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + d)));
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), kv, a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + C_DIM + d), kv, a1);
      a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 2 * C_DIM + d), kv, a2);
      a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 3 * C_DIM + d), kv, a3);
    }
    sc[t] = scale * hsum8(a0);
    sc[n_tok + t] = scale * hsum8(a1);
    sc[2 * n_tok + t] = scale * hsum8(a2);
    sc[3 * n_tok + t] = scale * hsum8(a3);
  }
}

/* out[j] += sum_t p[j][t] v_t: 16 dims x 4 heads in registers, over a tile
 * of tokens whose rows stay in L1. */
TOOL_AVX2 static void values_avx2(const uint16_t *v, uint32_t n_tok, uint32_t h, const float *p,
                                  float *out)
{
  for (uint32_t t0 = 0; t0 < n_tok; t0 += VT_TILE) {
    uint32_t t1 = t0 + VT_TILE < n_tok ? t0 + VT_TILE : n_tok;
    for (uint32_t d = 0; d < C_DIM; d += 16) {
      __m256 o[C_GROUP][2];
      for (uint32_t j = 0; j < C_GROUP; j++) {
        o[j][0] = _mm256_loadu_ps(out + j * C_DIM + d);
        o[j][1] = _mm256_loadu_ps(out + j * C_DIM + d + 8);
      }
      for (uint32_t t = t0; t < t1; t++) {
        const uint16_t *row = v + ((size_t)t * C_HEADS + h) * C_DIM + d;
        __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)row));
        __m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8)));
        for (uint32_t j = 0; j < C_GROUP; j++) {
          __m256 pj = _mm256_set1_ps(p[(size_t)j * n_tok + t]);
          o[j][0] = _mm256_fmadd_ps(pj, x0, o[j][0]);
          o[j][1] = _mm256_fmadd_ps(pj, x1, o[j][1]);
        }
      }
      for (uint32_t j = 0; j < C_GROUP; j++) {
        _mm256_storeu_ps(out + j * C_DIM + d, o[j][0]);
        _mm256_storeu_ps(out + j * C_DIM + d + 8, o[j][1]);
      }
    }
  }
}

static void scores_c(const uint16_t *k, uint32_t n_tok, uint32_t h, const float *q, float scale,
                     float *sc)
{
  for (uint32_t t = 0; t < n_tok; t++) {
    const uint16_t *row = k + ((size_t)t * C_HEADS + h) * C_DIM;
    for (uint32_t j = 0; j < C_GROUP; j++) {
      float s = 0;
      for (uint32_t d = 0; d < C_DIM; d++) s += q[j * C_DIM + d] * f16_to_f32(row[d]);
      sc[(size_t)j * n_tok + t] = scale * s;
    }
  }
}

static void values_c(const uint16_t *v, uint32_t n_tok, uint32_t h, const float *p, float *out)
{
  for (uint32_t t = 0; t < n_tok; t++) {
    const uint16_t *row = v + ((size_t)t * C_HEADS + h) * C_DIM;
    for (uint32_t j = 0; j < C_GROUP; j++)
      for (uint32_t d = 0; d < C_DIM; d++)
        out[j * C_DIM + d] += p[(size_t)j * n_tok + t] * f16_to_f32(row[d]);
  }
}

static void softmax_rows(float *sc, uint32_t n_tok)
{
  for (uint32_t j = 0; j < C_GROUP; j++) {
    float *p = sc + (size_t)j * n_tok, m = -INFINITY, l = 0;
    for (uint32_t t = 0; t < n_tok; t++) m = fmaxf(m, p[t]);
    for (uint32_t t = 0; t < n_tok; t++) l += (p[t] = expf(p[t] - m));
    const float inv = 1.0f / l;
    for (uint32_t t = 0; t < n_tok; t++) p[t] *= inv;
  }
}

/* All C_QHEADS query heads of one layer over gathered k, v. sc holds
 * C_GROUP * n_tok floats. */
static void attend_f16(int simd, const uint16_t *k, const uint16_t *v, uint32_t n_tok,
                       const float *q, float *sc, float *out)
{
  const float scale = 1.0f / sqrtf((float)C_DIM);
  for (uint32_t h = 0; h < C_HEADS; h++) {
    const float *qg = q + (size_t)h * C_GROUP * C_DIM;
    float *og = out + (size_t)h * C_GROUP * C_DIM;
    if (simd) scores_avx2(k, n_tok, h, qg, scale, sc);
    else scores_c(k, n_tok, h, qg, scale, sc);
    softmax_rows(sc, n_tok);
    memset(og, 0, C_GROUP * C_DIM * sizeof *og);
    if (simd) values_avx2(v, n_tok, h, sc, og);
    else values_c(v, n_tok, h, sc, og);
  }
}

/* ---- dequantize a tile, then attend: the fused baseline ------------------------------ */

/* What a serving engine would write without in-place kernels but without
 * gathering either: per layer, decode one token block (K and V, every
 * head) into an f16 tile that stays in L1/L2 and attend over it at once,
 * with an online softmax across tiles (running max, running sum, the
 * accumulator rescaled), so nothing is written out at full size. */
typedef struct fused {
  int k_codec, v_codec;
  size_t k_len, v_len;
  uint8_t *enc_k, *enc_v;             /* [layer][block] encodings, the engine's seeds */
  uint16_t tk[C_VALUES], tv[C_VALUES];
  float m[C_QHEADS], l[C_QHEADS];     /* running max and sum per query head */
  float sc[C_GROUP * C_TOKENS];
} fused;

/* The warm tier's rotation seed of a layer (docs/format.md): the first 8
 * bytes of the namespace seed, little-endian, + layer x 0x9E3779B97F4A7C15. */
static uint64_t layer_seed(const kvt_key *ns_seed, uint32_t layer)
{
  uint64_t s = 0;
  for (int i = 7; i >= 0; i--) s = s << 8 | ns_seed->b[i];
  return s + layer * 0x9E3779B97F4A7C15ull;
}

/* Fold one tile's scores of query head j (p[0..C_TOKENS)) into the running
 * state: p becomes the tile's weights on the running scale. */
static void online_softmax(fused *f, uint32_t qh, float *p, float *out)
{
  float m = f->m[qh];
  for (uint32_t t = 0; t < C_TOKENS; t++) m = fmaxf(m, p[t]);
  const float corr = expf(f->m[qh] - m); /* 0 on the first tile (-inf) */
  f->l[qh] *= corr;
  for (uint32_t d = 0; d < C_DIM; d++) out[d] *= corr;
  for (uint32_t t = 0; t < C_TOKENS; t++) f->l[qh] += (p[t] = expf(p[t] - m));
  f->m[qh] = m;
}

static int fused_layer(fused *f, int simd, uint32_t layer, uint32_t n_blk, const float *q,
                       float *out, uint64_t seed)
{
  const float scale = 1.0f / sqrtf((float)C_DIM);
  const kvt_codec_shape cs = {C_TOKENS, C_HEADS, C_DIM, 0, seed};
  for (uint32_t j = 0; j < C_QHEADS; j++) {
    f->m[j] = -INFINITY;
    f->l[j] = 0;
  }
  memset(out, 0, (size_t)C_QHEADS * C_DIM * sizeof *out);
  for (uint32_t b = 0; b < n_blk; b++) {
    size_t i = (size_t)layer * n_blk + b;
    int rc = kvt_codec_decode(f->k_codec, &cs, f->enc_k + i * f->k_len, f->k_len, f->tk, KVT_F16);
    if (rc == 0)
      rc = kvt_codec_decode(f->v_codec, &cs, f->enc_v + i * f->v_len, f->v_len, f->tv, KVT_F16);
    if (rc != 0) return rc;
    for (uint32_t h = 0; h < C_HEADS; h++) {
      const float *qg = q + (size_t)h * C_GROUP * C_DIM;
      float *og = out + (size_t)h * C_GROUP * C_DIM;
      if (simd) scores_avx2(f->tk, C_TOKENS, h, qg, scale, f->sc);
      else scores_c(f->tk, C_TOKENS, h, qg, scale, f->sc);
      for (uint32_t j = 0; j < C_GROUP; j++)
        online_softmax(f, h * C_GROUP + j, f->sc + j * C_TOKENS, og + j * C_DIM);
      if (simd) values_avx2(f->tv, C_TOKENS, h, f->sc, og);
      else values_c(f->tv, C_TOKENS, h, f->sc, og);
    }
  }
  for (uint32_t j = 0; j < C_QHEADS; j++)
    for (uint32_t d = 0; d < C_DIM; d++) out[j * C_DIM + d] /= f->l[j];
  return 0;
}

/* ---- attend in place against dequantize-then-attend ------------------------------------ */

typedef struct att_time {
  kvt_engine *e;
  kvt_ns_id ns;
  kvt_seq *s;
  uint32_t n_tok, n_blk;
  uint32_t *tokens;
  uint16_t *k, *v;       /* generated, then the gather buffers */
  float *q;              /* [layer][C_QHEADS][C_DIM] */
  float *out_a, *out_b, *out_c; /* [layer][C_QHEADS][C_DIM] */
  float *sc;             /* [C_GROUP][n_tok] */
  fused f;               /* the fused baseline's encodings and state */
  kvt_key ns_seed;
} att_time;

static int at_round_attend(att_time *t, double *secs)
{
  const size_t nq = (size_t)C_QHEADS * C_DIM;
  uint64_t t0 = now_ns();
  for (uint32_t l = 0; l < C_LAYERS; l++) {
    size_t nb = 0;
    int rc = kvt_seq_attend(t->s, l, t->q + l * nq, C_QHEADS, 0, t->out_a + l * nq, NULL, NULL, 0,
                            &nb);
    if (rc != 0 || nb != t->n_blk) return codec_fail("attending", rc ? rc : KVT_ECOUNT);
  }
  *secs = secs_since(t0);
  return CLI_OK;
}

static int at_round_dequant(att_time *t, int simd, double *secs, double *gat, double *cmp)
{
  const size_t nq = (size_t)C_QHEADS * C_DIM, each = (size_t)t->n_tok * C_VEC * 2;
  uint64_t tg = 0, t0 = now_ns();
  for (uint32_t l = 0; l < C_LAYERS; l++) {
    size_t bytes = each, nb = 0;
    uint64_t g0 = now_ns();
    int rc = kvt_seq_gather(t->s, l, t->k, t->v, &bytes, NULL, 0, &nb);
    tg += now_ns() - g0;
    if (rc != 0 || nb != t->n_blk || bytes != each)
      return codec_fail("gathering", rc ? rc : KVT_ECOUNT);
    attend_f16(simd, t->k, t->v, t->n_tok, t->q + l * nq, t->sc, t->out_b + l * nq);
  }
  *secs = secs_since(t0);
  *gat = (double)tg / 1e9;
  *cmp = *secs - *gat;
  return CLI_OK;
}

static int at_round_fused(att_time *t, int simd, double *secs)
{
  const size_t nq = (size_t)C_QHEADS * C_DIM;
  uint64_t t0 = now_ns();
  for (uint32_t l = 0; l < C_LAYERS; l++) {
    int rc = fused_layer(&t->f, simd, l, t->n_blk, t->q + l * nq, t->out_c + l * nq,
                         layer_seed(&t->ns_seed, l));
    if (rc != 0) return codec_fail("decoding a tile", rc);
  }
  *secs = secs_since(t0);
  return CLI_OK;
}

/* Encode every block of every layer as the warm tier does (its seeds), for
 * the fused baseline; the KV is the same in every layer, as put. */
static int at_encode(att_time *t, const attend_res *a)
{
  fused *f = &t->f;
  const kvt_codec_shape s0 = {C_TOKENS, C_HEADS, C_DIM, 0, 0};
  f->k_codec = a->k_codec;
  f->v_codec = a->v_codec;
  f->k_len = kvt_codec_size(a->k_codec, &s0);
  f->v_len = kvt_codec_size(a->v_codec, &s0);
  size_t n = (size_t)C_LAYERS * t->n_blk;
  f->enc_k = malloc(n * f->k_len);
  f->enc_v = malloc(n * f->v_len);
  if (!f->enc_k || !f->enc_v) return codec_fail("allocating", -ENOMEM);
  int rc = kvt_ns_seed(t->e, t->ns, &t->ns_seed);
  for (uint32_t l = 0; l < C_LAYERS && rc == 0; l++)
    for (uint32_t b = 0; b < t->n_blk && rc == 0; b++) {
      const kvt_codec_shape cs = {C_TOKENS, C_HEADS, C_DIM, 0, layer_seed(&t->ns_seed, l)};
      size_t i = (size_t)l * t->n_blk + b, off = (size_t)b * C_VALUES;
      int64_t nk = kvt_codec_encode(f->k_codec, &cs, t->k + off, KVT_F16, f->enc_k + i * f->k_len,
                                    f->k_len);
      int64_t nv = kvt_codec_encode(f->v_codec, &cs, t->v + off, KVT_F16, f->enc_v + i * f->v_len,
                                    f->v_len);
      rc = nk < 0 ? (int)nk : nv < 0 ? (int)nv : 0;
    }
  return rc ? codec_fail("encoding the fused baseline's tiles", rc) : CLI_OK;
}

static double rel_diff_f(const float *a, const float *b, size_t n)
{
  double se = 0, ss = 0;
  for (size_t i = 0; i < n; i++) {
    se += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    ss += (double)b[i] * b[i];
  }
  return sqrt(se / ss);
}

static int at_setup(codec_run *r, att_time *t)
{
  attend_res *a = &r->at;
  t->n_tok = a->tokens;
  t->n_blk = a->blocks;
  const size_t nv = (size_t)t->n_tok * C_VEC, nq = (size_t)C_LAYERS * C_QHEADS * C_DIM;
  t->tokens = malloc(t->n_tok * sizeof *t->tokens);
  t->k = malloc(nv * 2);
  t->v = malloc(nv * 2);
  t->q = malloc(nq * sizeof *t->q);
  t->out_a = calloc(nq, sizeof *t->out_a);
  t->out_b = calloc(nq, sizeof *t->out_b);
  t->out_c = calloc(nq, sizeof *t->out_c);
  t->sc = malloc((size_t)C_GROUP * t->n_tok * sizeof *t->sc);
  if (!t->tokens || !t->k || !t->v || !t->q || !t->out_a || !t->out_b || !t->out_c || !t->sc)
    return codec_fail("allocating", -ENOMEM);
  /* One layer's KV put in all 32: the timing does not depend on the values. */
  int rc = gen_kv(1, 0, t->n_tok, mix64(r->cfg.seed ^ 0x74696d65ull), t->k, t->v, t->tokens);
  if (rc) return codec_fail("generating KV", rc);
  prng p;
  prng_seed(&p, mix64(r->cfg.seed ^ 0x71ull));
  fill_gauss_f32(&p, t->q, nq);
  uint64_t n_lblk = (uint64_t)t->n_blk * C_LAYERS;
  rc = open_codec_engine(r->dir, C_LAYERS, n_lblk, a->k_codec, a->v_codec, &t->e, &t->ns);
  if (rc == 0) rc = kvt_seq_create(t->e, t->ns, &t->s);
  if (rc == 0) rc = put_context(t->s, t->tokens, t->n_blk, C_LAYERS, t->k, t->v);
  if (rc != 0) return codec_fail("putting the timed context", rc);
  rc = at_encode(t, a);
  if (rc != CLI_OK) return rc;
  kvt_stats st;
  rc = kvt_stats_get(t->e, &st);
  if (rc != 0) return codec_fail("reading the counters", rc);
  a->warm_bytes = st.tier_bytes[KVT_TIER_WARM];
  return check_tiers(t->e, n_lblk, 1);
}

static void at_free(att_time *t)
{
  kvt_seq_release(t->s);
  kvt_engine_close(t->e);
  free(t->tokens);
  free(t->k);
  free(t->v);
  free(t->q);
  free(t->out_a);
  free(t->out_b);
  free(t->out_c);
  free(t->sc);
  free(t->f.enc_k);
  free(t->f.enc_v);
}

/* The two summaries of a ratio across rounds: the median of the per-round
 * ratios (drift of the machine hits both sides of a round alike) and the
 * ratio of the medians. They agree within AGREE (bench_codec.h) when the
 * rounds are enough. */
static int summaries_agree(const double *num, const double *den, const double *ratio,
                           size_t n, double *med_ratio, double *ratio_med)
{
  double a[ROUNDS_MAX], b[ROUNDS_MAX], c[ROUNDS_MAX];
  memcpy(a, num, n * sizeof *a);
  memcpy(b, den, n * sizeof *b);
  memcpy(c, ratio, n * sizeof *c);
  *med_ratio = median_f64(c, n);
  *ratio_med = median_f64(a, n) / median_f64(b, n);
  return fabs(*ratio_med / *med_ratio - 1.0) <= AGREE;
}

/* A B C A B C ...: attend in place, gather + attend, the fused baseline,
 * every round; --rounds of them, then more (up to ROUNDS_MAX) until each
 * speedup's median of per-round ratios and ratio of medians agree. */
int attend_timing(codec_run *r)
{
  att_time t;
  attend_res *a = &r->at;
  memset(&t, 0, sizeof t);
  progress("bench codec: putting %u tokens x %u layers warm", a->tokens, C_LAYERS);
  int rc = at_setup(r, &t);
  double ta = 0, td = 0, tg = 0, tc = 0, tf = 0;
  if (rc == CLI_OK) rc = at_round_attend(&t, &ta); /* warm-up, and outputs compared */
  if (rc == CLI_OK) rc = at_round_dequant(&t, r->simd, &td, &tg, &tc);
  if (rc == CLI_OK) rc = at_round_fused(&t, r->simd, &tf);
  const size_t nq = (size_t)C_LAYERS * C_QHEADS * C_DIM;
  if (rc == CLI_OK) {
    a->rel_diff = rel_diff_f(t.out_a, t.out_b, nq);
    a->frel_diff = rel_diff_f(t.out_a, t.out_c, nq);
  }
  uint32_t i = 0;
  for (; i < ROUNDS_MAX && rc == CLI_OK; i++) {
    if (i >= r->cfg.rounds) {
      double x, y;
      int ok = summaries_agree(a->deq_s, a->att_s, a->ratio, i, &x, &y) &&
               summaries_agree(a->fus_s, a->att_s, a->fratio, i, &x, &y);
      if (ok) break;
    }
    progress("bench codec: attend round %u", i + 1);
    rc = at_round_attend(&t, &ta);
    if (rc == CLI_OK) rc = at_round_dequant(&t, r->simd, &td, &tg, &tc);
    if (rc == CLI_OK) rc = at_round_fused(&t, r->simd, &tf);
    a->att_s[i] = ta;
    a->deq_s[i] = td;
    a->gat_s[i] = tg;
    a->cmp_s[i] = tc;
    a->fus_s[i] = tf;
    a->ratio[i] = td / ta;
    a->fratio[i] = tf / ta;
  }
  progress_end();
  at_free(&t);
  if (rc != CLI_OK) return rc;
  a->rounds = i;
  summaries_agree(a->deq_s, a->att_s, a->ratio, i, &a->speedup, &a->speedup_m);
  summaries_agree(a->fus_s, a->att_s, a->fratio, i, &a->fspeedup, &a->fspeedup_m);
  a->att = median_f64(a->att_s, i);
  a->deq = median_f64(a->deq_s, i);
  a->gat = median_f64(a->gat_s, i);
  a->cmp = median_f64(a->cmp_s, i);
  a->fus = median_f64(a->fus_s, i);
  return CLI_OK;
}
