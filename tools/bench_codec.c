/* bench_codec.c - `kvtier bench codec`: the warm tier's codecs measured
 * through the public API on Llama-3-8B layer blocks (16 tokens x 8 KV heads
 * x head_dim 128, f16). Speed: encode and decode against memcpy of the
 * same bytes, single-threaded, interleaved rounds, medians. Error: V NMSE
 * on Gaussian vectors next to Lloyd-Max theory; K relative error of q.k on
 * realistic (outlier channels) and Gaussian keys; the attention output of
 * kvt_seq_attend over a warm context against exact attention in double.
 * And attention in place against gather (dequantize) + attention here. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "cmds.h"
#include "util.h"

/* Llama-3-8B: 32 layers; 32 query heads share 8 KV heads of 128. */
#define C_LAYERS 32u
#define C_TOKENS 16u /* tokens per block */
#define C_HEADS 8u
#define C_DIM 128u
#define C_QHEADS 32u
#define C_GROUP (C_QHEADS / C_HEADS)
#define C_VEC (C_HEADS * C_DIM)                 /* values of one token */
#define C_VALUES (C_TOKENS * C_VEC)             /* values of one K (or V) tensor */
#define C_F16_BYTES ((size_t)C_VALUES * 2)      /* 32 KiB */

#define N_CODECS 6
#define N_KC 3 /* the first N_KC of codec_ids[] are key codecs, the rest value codecs */
#define MIB_MIN 64u
#define MIB_MAX 8192u
#define ROUNDS_MAX 99u
#define TOKENS_MAX 65536u
#define POOL_TOKENS 4096u  /* realistic KV generated once, tiled over the working set */
#define ERR_TENSORS 512u   /* error tests: 512 tensors = 65536 vectors of 128 */
#define QBANK 1024u        /* Gaussian queries of the q.k test */
#define QK_PER_VEC 4u      /* queries per key vector */
#define ATT_QUERIES 8u     /* query tokens of the attention error test */
#define VT_TILE 32u        /* tokens per tile of the value sum (rows stay in L1) */

_Static_assert(C_QHEADS % C_HEADS == 0, "GQA group");
_Static_assert(ERR_TENSORS % C_LAYERS == 0, "realistic keys: same count per layer");

/* Key codecs first: the public API does not say which kind a codec is. */
static const int codec_ids[N_CODECS] = {KVT_CODEC_K8, KVT_CODEC_K8C, KVT_CODEC_K4,
                                        KVT_CODEC_V2, KVT_CODEC_V3, KVT_CODEC_V4};
#define CI_K8 0
#define CI_V3 4

/* Every tensor of the speed test uses one shape and seed, as one layer does. */
static const kvt_codec_shape blk_shape = {C_TOKENS, C_HEADS, C_DIM, 0, 0x5eedu};

typedef struct codec_cfg {
  uint64_t mib, rounds, tokens, attend_tokens, seed;
  const char *codec; /* pair of the attend timing */
  const char *dir;
  int json;
} codec_cfg;

typedef struct codec_res {
  size_t enc_bytes; /* kvt_codec_size of one tensor: header, scales and norms included */
  double bits;
  double enc_gbps[ROUNDS_MAX], dec_gbps[ROUNDS_MAX], mem_gbps[ROUNDS_MAX];
  double enc_ratio[ROUNDS_MAX], dec_ratio[ROUNDS_MAX];
  double enc, dec, mem, enc_x, dec_x; /* medians */
  double v_nmse;                      /* value codecs */
  double qk_real, qk_gauss, qk_adj;   /* key codecs */
  double attn_alone;                  /* attention error with only this tensor quantized */
} codec_res;

typedef struct attend_res {
  int k_codec, v_codec;
  uint32_t tokens, blocks;
  uint64_t warm_bytes;
  double att_s[ROUNDS_MAX], deq_s[ROUNDS_MAX], gat_s[ROUNDS_MAX], cmp_s[ROUNDS_MAX];
  double fus_s[ROUNDS_MAX];
  double ratio[ROUNDS_MAX], fratio[ROUNDS_MAX];
  double att, deq, gat, cmp, fus;   /* medians */
  double speedup, fspeedup;         /* medians of the per-round ratios */
  double speedup_m, fspeedup_m;     /* the same as ratios of the medians */
  uint32_t rounds;                  /* run: --rounds, more until the two summaries agree */
  double rel_diff, frel_diff;       /* outputs compared */
} attend_res;

typedef struct codec_run {
  codec_cfg cfg;
  const char *dir;
  uint64_t l3_bytes;
  int simd;                   /* the tool's own attention kernel: 1 AVX2/F16C */
  size_t ws, n_blk;           /* working set (f16 bytes) and its tensors */
  uint8_t *src, *dst, *enc;   /* speed test buffers */
  uint16_t *pool_k, *pool_v;  /* [POOL_TOKENS][C_VEC] realistic KV */
  codec_res res[N_CODECS];
  double attn_pair[N_KC][N_CODECS - N_KC];
  double attn_hot;
  attend_res at;
  int best_k;                 /* index in codec_ids[] */
} codec_run;

static int codec_fail(const char *what, int rc) { return cli_lib_error("bench codec", what, rc); }

static double secs_since(uint64_t t0) { return (double)(now_ns() - t0) / 1e9; }

static const char *cname(int ci) { return kvt_codec_name(codec_ids[ci]); }

/* ---- the machine ----------------------------------------------------------- */

static int cpu_avx2(void)
{
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

/* ---- data ----------------------------------------------------------------- */

static void fill_gauss_f16(prng *p, uint16_t *x, size_t n)
{
  for (size_t i = 0; i < n; i++) x[i] = f32_to_f16((float)prng_gauss(p));
}

static void fill_gauss_f32(prng *p, float *x, size_t n)
{
  for (size_t i = 0; i < n; i++) x[i] = (float)prng_gauss(p);
}

static void f16_to_f32_n(const uint16_t *in, size_t n, float *out)
{
  for (size_t i = 0; i < n; i++) out[i] = f16_to_f32(in[i]);
}

/* Realistic K and V of one layer (n_layers of shape 1 or more) for n_tok
 * positions of random tokens. */
static int gen_kv(uint32_t n_layers, uint32_t layer, uint32_t n_tok, uint64_t seed, uint16_t *k,
                  uint16_t *v, uint32_t *tokens_out)
{
  kvt_shape sh = {n_layers, C_HEADS, C_DIM, KVT_F16, C_TOKENS};
  kvgen g;
  uint32_t *tok = tokens_out ? tokens_out : malloc(n_tok * sizeof *tok);
  uint64_t *ph = malloc(n_tok * sizeof *ph);
  int rc = tok && ph ? kvgen_init(&g, &sh, seed) : -ENOMEM;
  if (rc == 0) {
    prng p;
    prng_seed(&p, mix64(seed ^ 0x746f6b656e73ull));
    gen_tokens(&p, KVGEN_VOCAB, tok, n_tok);
    kvgen_pos_hashes(&g, 0, tok, n_tok, ph);
    kvgen_fill(&g, ph, n_tok, layer, k, v);
    kvgen_free(&g);
  }
  if (!tokens_out) free(tok);
  free(ph);
  return rc;
}

/* ---- speed: encode, decode, memcpy ------------------------------------------ */

static void tile_pool(codec_run *r, const uint16_t *pool)
{
  const size_t pool_bytes = (size_t)POOL_TOKENS * C_VEC * 2;
  for (size_t off = 0; off < r->ws; off += pool_bytes)
    memcpy(r->src + off, pool, r->ws - off < pool_bytes ? r->ws - off : pool_bytes);
}

static int speed_encode(codec_run *r, int id, size_t esz, double *t)
{
  uint64_t t0 = now_ns();
  for (size_t i = 0; i < r->n_blk; i++) {
    int64_t n = kvt_codec_encode(id, &blk_shape, r->src + i * C_F16_BYTES, KVT_F16,
                                 r->enc + i * esz, esz);
    if (n != (int64_t)esz) return codec_fail("encoding", n < 0 ? (int)n : KVT_EBUFSIZE);
  }
  *t = secs_since(t0);
  return CLI_OK;
}

static int speed_decode(codec_run *r, int id, size_t esz, double *t)
{
  uint64_t t0 = now_ns();
  for (size_t i = 0; i < r->n_blk; i++) {
    int rc = kvt_codec_decode(id, &blk_shape, r->enc + i * esz, esz, r->dst + i * C_F16_BYTES,
                              KVT_F16);
    if (rc != 0) return codec_fail("decoding", rc);
  }
  *t = secs_since(t0);
  return CLI_OK;
}

static double speed_memcpy(codec_run *r)
{
  uint64_t t0 = now_ns();
  memcpy(r->dst, r->src, r->ws);
  return secs_since(t0);
}

/* A decoded tensor within a loose bound of its input: catches a kernel
 * that writes nothing or garbage; the error tests measure the real error. */
static int speed_sanity(codec_run *r, int ci)
{
  double se = 0, ss = 0;
  const uint16_t *x = (const uint16_t *)r->src, *y = (const uint16_t *)r->dst;
  for (size_t i = 0; i < C_VALUES; i++) {
    double a = f16_to_f32(x[i]), d = f16_to_f32(y[i]) - a;
    se += d * d;
    ss += a * a;
  }
  if (se <= 0.25 * ss) return CLI_OK;
  fprintf(stderr, "kvtier bench codec: %s decodes to a relative error of %.3f: broken\n",
          cname(ci), sqrt(se / ss));
  return CLI_FAIL;
}

static void speed_medians(codec_res *c, size_t n)
{
  c->enc = median_f64(c->enc_gbps, n);
  c->dec = median_f64(c->dec_gbps, n);
  c->mem = median_f64(c->mem_gbps, n);
  c->enc_x = median_f64(c->enc_ratio, n);
  c->dec_x = median_f64(c->dec_ratio, n);
}

/* Warm-up (untimed: first touch of the encoded range, branch history),
 * then encode, decode, memcpy in every round; ratios within a round. */
static int speed_codec(codec_run *r, int ci)
{
  const int id = codec_ids[ci];
  codec_res *c = &r->res[ci];
  double te = 0, td = 0, gb = (double)r->ws / 1e9;
  int rc = speed_encode(r, id, c->enc_bytes, &te);
  if (rc == CLI_OK) rc = speed_decode(r, id, c->enc_bytes, &td);
  if (rc == CLI_OK) rc = speed_sanity(r, ci);
  speed_memcpy(r);
  for (uint32_t i = 0; i < r->cfg.rounds && rc == CLI_OK; i++) {
    progress("bench codec: %s round %u of %" PRIu64, cname(ci), i + 1, r->cfg.rounds);
    rc = speed_encode(r, id, c->enc_bytes, &te);
    if (rc == CLI_OK) rc = speed_decode(r, id, c->enc_bytes, &td);
    double tm = speed_memcpy(r);
    c->enc_gbps[i] = gb / te;
    c->dec_gbps[i] = gb / td;
    c->mem_gbps[i] = gb / tm;
    c->enc_ratio[i] = tm / te;
    c->dec_ratio[i] = tm / td;
  }
  progress_end();
  if (rc == CLI_OK) speed_medians(c, r->cfg.rounds);
  return rc;
}

static int speed_alloc(codec_run *r)
{
  r->ws = (size_t)r->cfg.mib << 20;
  r->n_blk = r->ws / C_F16_BYTES;
  size_t emax = 0;
  for (int ci = 0; ci < N_CODECS; ci++) {
    codec_res *c = &r->res[ci];
    c->enc_bytes = kvt_codec_size(codec_ids[ci], &blk_shape);
    if (c->enc_bytes == 0) return codec_fail("sizing a codec", KVT_EOPTION);
    c->bits = 8.0 * (double)c->enc_bytes / C_VALUES;
    if (c->enc_bytes > emax) emax = c->enc_bytes;
  }
  const size_t pool = (size_t)POOL_TOKENS * C_VEC;
  r->src = malloc(r->ws);
  r->dst = malloc(r->ws);
  r->enc = malloc(r->n_blk * emax);
  r->pool_k = malloc(pool * 2);
  r->pool_v = malloc(pool * 2);
  if (!r->src || !r->dst || !r->enc || !r->pool_k || !r->pool_v)
    return codec_fail("allocating the working set", -ENOMEM);
  /* pre-fault: first touch runs at ~1 GB/s (MEASURED.md) */
  memset(r->dst, 0, r->ws);
  memset(r->enc, 0, r->n_blk * emax);
  int rc = gen_kv(1, 0, POOL_TOKENS, r->cfg.seed, r->pool_k, r->pool_v, NULL);
  return rc ? codec_fail("generating KV", rc) : CLI_OK;
}

static int speed_all(codec_run *r)
{
  int rc = speed_alloc(r);
  for (int ci = 0; ci < N_CODECS && rc == CLI_OK; ci++) {
    if (ci == 0) tile_pool(r, r->pool_k); /* keys for key codecs, values for value codecs */
    if (ci == N_KC) tile_pool(r, r->pool_v);
    rc = speed_codec(r, ci);
  }
  free(r->src);
  free(r->dst);
  free(r->enc);
  r->src = r->dst = r->enc = NULL;
  return rc;
}

/* ---- error: V NMSE, K q.k ----------------------------------------------------- */

/* Encode and decode (to f32) one tensor; seed picks the V rotation. */
static int roundtrip(int id, uint64_t seed, const uint16_t *x, uint8_t *enc, size_t esz, float *y)
{
  kvt_codec_shape s = blk_shape;
  s.seed = seed;
  int64_t n = kvt_codec_encode(id, &s, x, KVT_F16, enc, esz);
  if (n != (int64_t)esz) return codec_fail("encoding", n < 0 ? (int)n : KVT_EBUFSIZE);
  int rc = kvt_codec_decode(id, &s, enc, esz, y, KVT_F32);
  return rc ? codec_fail("decoding", rc) : CLI_OK;
}

/* sum |y - x|^2 / sum |x|^2 over ERR_TENSORS tensors, each with its own
 * rotation, as layers have. */
static int v_nmse(codec_run *r, int ci, const uint16_t *g, uint8_t *enc, float *y)
{
  double se = 0, ss = 0;
  for (uint32_t i = 0; i < ERR_TENSORS; i++) {
    const uint16_t *x = g + (size_t)i * C_VALUES;
    int rc = roundtrip(codec_ids[ci], mix64(r->cfg.seed + i), x, enc, r->res[ci].enc_bytes, y);
    if (rc != CLI_OK) return rc;
    for (uint32_t j = 0; j < C_VALUES; j++) {
      double a = f16_to_f32(x[j]), d = (double)y[j] - a;
      se += d * d;
      ss += a * a;
    }
  }
  r->res[ci].v_nmse = se / ss;
  return CLI_OK;
}

/* RMS of q.k' - q.k over RMS of q.k, QK_PER_VEC Gaussian queries per key
 * vector from a fixed bank, so every codec sees the same queries. */
static int qk_err(codec_run *r, int ci, const uint16_t *keys, const float *qbank, uint8_t *enc,
                  float *y, double *out)
{
  double se = 0, ss = 0;
  for (uint32_t i = 0; i < ERR_TENSORS; i++) {
    const uint16_t *x = keys + (size_t)i * C_VALUES;
    int rc = roundtrip(codec_ids[ci], mix64(r->cfg.seed + i), x, enc, r->res[ci].enc_bytes, y);
    if (rc != CLI_OK) return rc;
    for (uint32_t v = 0; v < C_TOKENS * C_HEADS; v++) {
      for (uint32_t j = 0; j < QK_PER_VEC; j++) {
        const float *q = qbank + (size_t)((i * 128u + v * QK_PER_VEC + j) % QBANK) * C_DIM;
        double exact = 0, err = 0;
        for (uint32_t d = 0; d < C_DIM; d++) {
          double k = f16_to_f32(x[v * C_DIM + d]);
          exact += q[d] * k;
          err += q[d] * ((double)y[v * C_DIM + d] - k);
        }
        se += err * err;
        ss += exact * exact;
      }
    }
  }
  *out = sqrt(se / ss);
  return CLI_OK;
}

/* Each bit halves a uniform quantizer's error, so err * 2^(bits - 8) puts
 * the key codecs at a common 8 bits per value: the lowest wins. */
static void pick_best_k(codec_run *r)
{
  r->best_k = 0;
  for (int ci = 0; ci < N_KC; ci++) {
    codec_res *c = &r->res[ci];
    c->qk_adj = c->qk_real * exp2(c->bits - 8.0);
    if (c->qk_adj < r->res[r->best_k].qk_adj) r->best_k = ci;
  }
}

static int error_tests(codec_run *r)
{
  const size_t n = (size_t)ERR_TENSORS * C_VALUES;
  uint16_t *gauss = malloc(n * 2), *keys = malloc(n * 2), *vals = malloc(n * 2);
  float *qbank = malloc((size_t)QBANK * C_DIM * sizeof *qbank), *y = malloc(C_VALUES * 4);
  uint8_t *enc = malloc(2 * C_F16_BYTES);
  int rc = gauss && keys && vals && qbank && y && enc ? CLI_OK
                                                     : codec_fail("allocating", -ENOMEM);
  if (rc == CLI_OK) {
    prng p;
    prng_seed(&p, mix64(r->cfg.seed ^ 0x6761757373ull));
    fill_gauss_f16(&p, gauss, n);
    fill_gauss_f32(&p, qbank, (size_t)QBANK * C_DIM);
    /* realistic keys: every layer's outlier channels, 16 blocks each */
    const uint32_t per_layer = ERR_TENSORS / C_LAYERS * C_TOKENS;
    for (uint32_t l = 0; l < C_LAYERS && rc == CLI_OK; l++) {
      size_t off = (size_t)l * per_layer * C_VEC;
      int grc = gen_kv(C_LAYERS, l, per_layer, r->cfg.seed, keys + off, vals + off, NULL);
      if (grc) rc = codec_fail("generating KV", grc);
    }
  }
  for (int ci = 0; ci < N_CODECS && rc == CLI_OK; ci++) {
    progress("bench codec: error of %s", cname(ci));
    if (ci >= N_KC) {
      rc = v_nmse(r, ci, gauss, enc, y);
      continue;
    }
    rc = qk_err(r, ci, keys, qbank, enc, y, &r->res[ci].qk_real);
    if (rc == CLI_OK) rc = qk_err(r, ci, gauss, qbank, enc, y, &r->res[ci].qk_gauss);
  }
  progress_end();
  if (rc == CLI_OK) pick_best_k(r);
  free(gauss);
  free(keys);
  free(vals);
  free(qbank);
  free(y);
  free(enc);
  return rc;
}

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

static int attention_tests(codec_run *r)
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
 * ratio of the medians. They agree within AGREE when the rounds are enough. */
#define AGREE 0.05
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
static int attend_timing(codec_run *r)
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

/* ---- report -------------------------------------------------------------------------- */

typedef struct target {
  const char *name;
  double value, want;
} target;

#define N_TARGETS 4

static void targets_of(const codec_run *r, target t[N_TARGETS])
{
  t[0] = (target){"v3_decode_vs_memcpy", r->res[CI_V3].dec_x, 0.25};
  t[1] = (target){"v3_encode_vs_memcpy", r->res[CI_V3].enc_x, 0.1};
  t[2] = (target){"k8_decode_vs_memcpy", r->res[CI_K8].dec_x, 0.5};
  t[3] = (target){"attend_vs_dequant", r->at.speedup, 1.0};
}

static void json_codec(json_w *j, const codec_run *r, int ci)
{
  const codec_res *c = &r->res[ci];
  json_obj(j, cname(ci));
  json_f64(j, "bits_per_value", c->bits);
  json_u64(j, "encoded_bytes", c->enc_bytes);
  json_f64(j, "encode_gbps", c->enc);
  json_f64(j, "decode_gbps", c->dec);
  json_f64(j, "memcpy_gbps", c->mem);
  json_f64(j, "encode_vs_memcpy", c->enc_x);
  json_f64(j, "decode_vs_memcpy", c->dec_x);
  size_t n = r->cfg.rounds;
  json_f64(j, "encode_gbps_min", c->enc_gbps[0]);
  json_f64(j, "encode_gbps_max", c->enc_gbps[n - 1]);
  json_f64(j, "decode_gbps_min", c->dec_gbps[0]);
  json_f64(j, "decode_gbps_max", c->dec_gbps[n - 1]);
  if (ci >= N_KC) {
    json_f64(j, "v_nmse", c->v_nmse);
    json_f64(j, "v_nmse_theory", lloyd_max_nmse(codec_ids[ci]));
    json_f64(j, "v_nmse_vs_theory", c->v_nmse / lloyd_max_nmse(codec_ids[ci]));
  } else {
    json_f64(j, "qk_rel_err", c->qk_real);
    json_f64(j, "qk_rel_err_gaussian", c->qk_gauss);
    json_f64(j, "qk_rel_err_at_8_bits", c->qk_adj);
  }
  json_f64(j, "attn_rel_err_alone", c->attn_alone);
  json_end(j);
}

static void json_report(const codec_run *r)
{
  json_w j;
  json_begin(&j, stdout);
  json_str(&j, "command", "bench codec");
  json_u64(&j, "block_tokens", C_TOKENS);
  json_u64(&j, "n_kv_heads", C_HEADS);
  json_u64(&j, "head_dim", C_DIM);
  json_str(&j, "dtype", "f16");
  json_u64(&j, "working_set_bytes", r->ws);
  json_u64(&j, "l3_bytes", r->l3_bytes);
  json_u64(&j, "rounds", r->cfg.rounds);
  json_u64(&j, "seed", r->cfg.seed);
  json_obj(&j, "codecs");
  for (int ci = 0; ci < N_CODECS; ci++) json_codec(&j, r, ci);
  json_end(&j);
  json_str(&j, "best_k_codec_realistic", cname(r->best_k));
  json_obj(&j, "attention");
  json_u64(&j, "tokens", r->cfg.tokens);
  json_u64(&j, "q_heads", C_QHEADS);
  json_u64(&j, "queries", ATT_QUERIES);
  json_f64(&j, "hot", r->attn_hot);
  for (int ki = 0; ki < N_KC; ki++)
    for (int vi = N_KC; vi < N_CODECS; vi++) {
      char name[16];
      snprintf(name, sizeof name, "%s%s", cname(ki), cname(vi));
      json_f64(&j, name, r->attn_pair[ki][vi - N_KC]);
    }
  json_end(&j);
  const attend_res *a = &r->at;
  json_obj(&j, "attend_vs_dequant");
  char pair[16];
  snprintf(pair, sizeof pair, "%s%s", kvt_codec_name(a->k_codec), kvt_codec_name(a->v_codec));
  json_str(&j, "codec", pair);
  json_u64(&j, "layers", C_LAYERS);
  json_u64(&j, "tokens", a->tokens);
  json_u64(&j, "warm_bytes", a->warm_bytes);
  json_str(&j, "tool_kernel", r->simd ? "avx2" : "scalar");
  json_f64(&j, "attend_s", a->att);
  json_f64(&j, "dequant_s", a->deq);
  json_f64(&j, "dequant_gather_s", a->gat);
  json_f64(&j, "dequant_compute_s", a->cmp);
  json_f64(&j, "speedup", a->speedup);
  json_f64(&j, "speedup_ratio_of_medians", a->speedup_m);
  json_f64(&j, "outputs_rel_diff", a->rel_diff);
  json_f64(&j, "fused_s", a->fus);
  json_f64(&j, "speedup_vs_fused", a->fspeedup);
  json_f64(&j, "speedup_vs_fused_ratio_of_medians", a->fspeedup_m);
  json_f64(&j, "fused_outputs_rel_diff", a->frel_diff);
  json_u64(&j, "rounds", a->rounds);
  json_bool(&j, "summaries_agree", fabs(a->speedup_m / a->speedup - 1) <= AGREE &&
                                        fabs(a->fspeedup_m / a->fspeedup - 1) <= AGREE);
  json_end(&j);
  target t[N_TARGETS];
  targets_of(r, t);
  json_obj(&j, "targets");
  for (int i = 0; i < N_TARGETS; i++) json_bool(&j, t[i].name, t[i].value >= t[i].want);
  json_end(&j);
  json_end(&j);
}

static void human_speed(const codec_run *r)
{
  char b1[32], b2[32];
  printf("bench codec: warm codecs on Llama-3-8B layer blocks (%u tokens x %u KV heads x %u, "
         "f16)\nworking set %s of f16 per codec (L3 %s), one thread, %" PRIu64
         " interleaved rounds, medians, seed %" PRIu64 "\n\n",
         C_TOKENS, C_HEADS, C_DIM, fmt_bytes(b1, sizeof b1, r->ws),
         r->l3_bytes ? fmt_bytes(b2, sizeof b2, r->l3_bytes) : "unknown", r->cfg.rounds,
         r->cfg.seed);
  printf("  codec  bits/value  encode GB/s (x memcpy)  decode GB/s (x memcpy)  memcpy GB/s  "
         "error\n");
  for (int ci = 0; ci < N_CODECS; ci++) {
    const codec_res *c = &r->res[ci];
    printf("  %-5s  %10.3f  %11.2f (%5.3f)      %11.2f (%5.3f)      %11.2f  ", cname(ci), c->bits,
           c->enc, c->enc_x, c->dec, c->dec_x, c->mem);
    if (ci >= N_KC)
      printf("NMSE %.5f (theory %.5f, x%.3f)\n", c->v_nmse, lloyd_max_nmse(codec_ids[ci]),
             c->v_nmse / lloyd_max_nmse(codec_ids[ci]));
    else
      printf("q.k %.5f realistic, %.5f Gaussian keys\n", c->qk_real, c->qk_gauss);
  }
}

static void human_attention(const codec_run *r)
{
  printf("\n  attention over %" PRIu64 " tokens (%u query heads, %u queries): "
         "||o' - o|| / ||o|| against exact attention in double\n", r->cfg.tokens, C_QHEADS,
         ATT_QUERIES);
  printf("         ");
  for (int vi = N_KC; vi < N_CODECS; vi++) printf("%10s", cname(vi));
  printf("   K alone\n");
  for (int ki = 0; ki < N_KC; ki++) {
    printf("    %-5s", cname(ki));
    for (int vi = N_KC; vi < N_CODECS; vi++) printf("%10.5f", r->attn_pair[ki][vi - N_KC]);
    printf("%10.5f\n", r->res[ki].attn_alone);
  }
  printf("  V alone");
  for (int vi = N_KC; vi < N_CODECS; vi++) printf("%10.5f", r->res[vi].attn_alone);
  printf("\n    hot blocks (f16, exact): %.2g\n", r->attn_hot);
  const codec_res *b = &r->res[r->best_k];
  printf("\n  best key codec on realistic keys per bit: %s (q.k error %.5f at %.3f bits/value; "
         "error x 2^(bits-8) = %.5f", cname(r->best_k), b->qk_real, b->bits, b->qk_adj);
  for (int ci = 0; ci < N_KC; ci++)
    if (ci != r->best_k) printf(", %s %.5f", cname(ci), r->res[ci].qk_adj);
  printf(")\n");
}

static void human_report(const codec_run *r)
{
  human_speed(r);
  human_attention(r);
  const attend_res *a = &r->at;
  char b1[32];
  printf("\n  attend in place vs dequantize-then-attend: %s%s, %u layers x %u tokens warm (%s), "
         "32 query heads, medians\n", kvt_codec_name(a->k_codec), kvt_codec_name(a->v_codec),
         C_LAYERS, a->tokens, fmt_bytes(b1, sizeof b1, a->warm_bytes));
  printf("    kvt_seq_attend           %8.2f ms\n", 1e3 * a->att);
  printf("    gather + attend (%s)  %8.2f ms  (gather %.2f, attention %.2f)\n",
         r->simd ? "AVX2" : "C   ", 1e3 * a->deq, 1e3 * a->gat, 1e3 * a->cmp);
  printf("    tile decode + attend     %8.2f ms  (fused: one block decoded at a time, "
         "online softmax)\n", 1e3 * a->fus);
  printf("    speedup %.2fx vs gather + attend, %.2fx vs fused (> 1: in place is faster; medians\n"
         "    of per-round ratios over %u rounds; ratios of medians %.2fx, %.2fx); outputs "
         "differ by %.2g, %.2g\n", a->speedup, a->fspeedup, a->rounds, a->speedup_m,
         a->fspeedup_m, a->rel_diff, a->frel_diff);
  target t[N_TARGETS];
  targets_of(r, t);
  printf("\n  targets:");
  for (int i = 0; i < N_TARGETS; i++)
    printf(" %s %.3f %s %.2f%s", t[i].name, t[i].value, t[i].value >= t[i].want ? ">=" : "<",
           t[i].want, i + 1 < N_TARGETS ? ";" : "\n");
}

/* ---- command ------------------------------------------------------------------------- */

#define CODEC_N_OPTS 8

static void codec_opts(codec_cfg *c, cli_opt o[CODEC_N_OPTS])
{
  const cli_opt t[CODEC_N_OPTS] = {
      {"--mib", "M", CLI_U64, &c->mib, MIB_MIN, MIB_MAX,
       "f16 working set per codec in MiB, 64 to 8192 (default: 2 x the L3 cache, at least 512)"},
      {"--rounds", "R", CLI_U64, &c->rounds, 3, ROUNDS_MAX,
       "interleaved rounds, 3 to 99 (default 7)"},
      {"--tokens", "T", CLI_U64, &c->tokens, C_TOKENS, TOKENS_MAX,
       "context of the attention error test, a multiple of 16 (default 4096)"},
      {"--attend-tokens", "T", CLI_U64, &c->attend_tokens, C_TOKENS, TOKENS_MAX,
       "context per layer of the attend timing, 32 layers (default 8192)"},
      {"--codec", "KV", CLI_STR, &c->codec, 0, 0, "codec pair of the attend timing (default k8v3)"},
      {"--seed", "S", CLI_U64, &c->seed, 0, UINT64_MAX, "seed of KV and queries (default 1)"},
      {"--dir", "D", CLI_STR, &c->dir, 0, 0, "store directory (default: a scratch one, removed)"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the figures as one JSON object"},
  };
  memcpy(o, t, sizeof t);
}

void bench_codec_usage(FILE *f)
{
  codec_cfg c;
  cli_opt o[CODEC_N_OPTS];
  codec_opts(&c, o);
  fprintf(f, "\nbench codec: the warm codecs (k8, k8c, k4, v2, v3, v4) on Llama-3-8B layer\n"
             "blocks. Encode and decode GB/s of f16 against memcpy of the same bytes (one\n"
             "thread, interleaved rounds, medians) and bits per value (kvt_codec_size).\n"
             "Error: v_nmse on Gaussian vectors next to Lloyd-Max theory; qk_rel_err, RMS of\n"
             "q.k' - q.k over RMS of q.k, on realistic keys (outlier channels; and _gaussian);\n"
             "attention output error of kvt_seq_attend on a warm context against exact\n"
             "attention in double, per codec pair. And kvt_seq_attend against gather\n"
             "(dequantize) + attention in f32: speedup = dequant time / attend time.\n");
  cli_print_opts(f, o, CODEC_N_OPTS);
}

static int codec_check_cfg(codec_cfg *c, attend_res *a)
{
  if (c->tokens % C_TOKENS != 0 || c->attend_tokens % C_TOKENS != 0) {
    fprintf(stderr, "kvtier bench codec: --tokens and --attend-tokens must be multiples of %u\n",
            C_TOKENS);
    return CLI_USAGE;
  }
  if (kvt_codec_parse(c->codec, &a->k_codec, &a->v_codec) != 0) {
    fprintf(stderr, "kvtier bench codec: --codec '%s' is not a codec pair such as k8v3, k8cv3, "
            "k4v2\nrun 'kvtier help bench' for its options\n", c->codec);
    return CLI_USAGE;
  }
  a->tokens = (uint32_t)c->attend_tokens;
  a->blocks = a->tokens / C_TOKENS;
  return CLI_OK;
}

static int codec_main(codec_run *r)
{
  r->l3_bytes = cpu_l3_bytes();
  r->simd = cpu_avx2();
  int rc = speed_all(r);
  if (rc == CLI_OK) rc = error_tests(r);
  if (rc == CLI_OK) rc = attention_tests(r);
  if (rc == CLI_OK) rc = attend_timing(r);
  if (rc != CLI_OK) return rc;
  if (r->cfg.json) json_report(r);
  else human_report(r);
  return CLI_OK;
}

int bench_codec(int argc, char **argv)
{
  codec_cfg cfg = {.mib = 0, .rounds = 7, .tokens = 4096, .attend_tokens = 8192, .seed = 1,
                   .codec = "k8v3"};
  cli_opt opts[CODEC_N_OPTS];
  codec_opts(&cfg, opts);
  int want_help = 0;
  int rc = cli_parse("bench codec", argc, argv, opts, CODEC_N_OPTS, &want_help);
  if (want_help) bench_usage(stdout);
  if (rc != CLI_OK || want_help) return rc;
  codec_run *r = calloc(1, sizeof *r);
  if (r == NULL) return codec_fail("allocating state", -ENOMEM);
  r->cfg = cfg;
  if (r->cfg.mib == 0) { /* twice L3, so the codecs run from memory, not the cache */
    uint64_t l3_mib = (cpu_l3_bytes() + (1u << 20) - 1) >> 20;
    r->cfg.mib = 2 * l3_mib < 512 ? 512 : 2 * l3_mib > MIB_MAX ? MIB_MAX : 2 * l3_mib;
  }
  rc = codec_check_cfg(&r->cfg, &r->at);
  bench_dir d;
  if (rc == CLI_OK) rc = bench_dir_open(&d, cfg.dir, "bench codec");
  if (rc == CLI_OK) {
    r->dir = d.path;
    rc = codec_main(r);
    bench_dir_close(&d, "bench codec");
  }
  free(r->src);
  free(r->dst);
  free(r->enc);
  free(r->pool_k);
  free(r->pool_v);
  free(r);
  return rc;
}
