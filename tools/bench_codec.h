/* bench_codec.h - what the files of `kvtier bench codec` share
 * (bench_codec.c: report and command; bench_codec_speed.c: speed and
 * error; bench_codec_attn.c: attention): the Llama-3-8B shape, the
 * configuration and results, the data generators, and each part's entry
 * points. Split from bench_codec.c by its sections; nothing changed. */
#ifndef KVT_BENCH_CODEC_H
#define KVT_BENCH_CODEC_H

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
  const char *remote; /* --remote URL: refused (bench_codec.c) */
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

static inline int codec_fail(const char *what, int rc) { return cli_lib_error("bench codec", what, rc); }

static inline double secs_since(uint64_t t0) { return (double)(now_ns() - t0) / 1e9; }

static const char *cname(int ci) { return kvt_codec_name(codec_ids[ci]); }

/* ---- the machine ----------------------------------------------------------- */

static inline int cpu_avx2(void)
{
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

/* ---- data ----------------------------------------------------------------- */

static inline void fill_gauss_f16(prng *p, uint16_t *x, size_t n)
{
  for (size_t i = 0; i < n; i++) x[i] = f32_to_f16((float)prng_gauss(p));
}

static inline void fill_gauss_f32(prng *p, float *x, size_t n)
{
  for (size_t i = 0; i < n; i++) x[i] = (float)prng_gauss(p);
}

static inline void f16_to_f32_n(const uint16_t *in, size_t n, float *out)
{
  for (size_t i = 0; i < n; i++) out[i] = f16_to_f32(in[i]);
}

/* Realistic K and V of one layer (n_layers of shape 1 or more) for n_tok
 * positions of random tokens. */
static inline int gen_kv(uint32_t n_layers, uint32_t layer, uint32_t n_tok, uint64_t seed, uint16_t *k,
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

/* The two summaries of a ratio across rounds (the median of the per-round
 * ratios, the ratio of the medians) agree within this when the rounds are
 * enough (bench_codec_attn.c). */
#define AGREE 0.05

/* bench_codec_speed.c */
int speed_all(codec_run *r);   /* encode, decode and memcpy speed of every codec */
int error_tests(codec_run *r); /* V NMSE, K q.k error; picks the best key codec */
/* Encode and decode (to f32) one tensor of codec id; seed picks the V rotation. */
int roundtrip(int id, uint64_t seed, const uint16_t *x, uint8_t *enc, size_t esz, float *y);

/* bench_codec_attn.c */
int attention_tests(codec_run *r); /* attention output error per codec pair */
int attend_timing(codec_run *r);   /* attend in place against dequantize-then-attend */

#endif
