/* bench_codec_speed.c - `kvtier bench codec`, speed and error: encode
 * and decode of each warm codec against memcpy (interleaved rounds,
 * medians), V NMSE against Lloyd-Max theory, K q.k error (bench_codec.h). */
#include "bench_codec.h"

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

int speed_all(codec_run *r)
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
int roundtrip(int id, uint64_t seed, const uint16_t *x, uint8_t *enc, size_t esz, float *y)
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

int error_tests(codec_run *r)
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
