/* predictor.h - the learned scorer's model (KVpop, DESIGN.md section 4):
 * per-block features from observed attention, and a small model (linear,
 * or one hidden layer) that predicts the mass a block will receive over
 * the next W steps. The file format is in docs/policy.md ("Predictor
 * file"); `kvtier train` writes it, the engine parses it from bytes. The
 * feature code is inline here so that training and the engine compute the
 * very same numbers. */
#ifndef KVT_PREDICTOR_H
#define KVT_PREDICTOR_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/policy.h"

#define KVT_PRED_MAGIC "KVTPRED\0"
#define KVT_PRED_VERSION 1u
#define KVT_PRED_HDR_BYTES 64u
#define KVT_PRED_N_FEAT 16u      /* the feature vector below, bias first */
#define KVT_PRED_MAX_HIDDEN 64u  /* hidden units of an MLP, at most */
#define KVT_PRED_MAX_LAYERS 1024u
#define KVT_PRED_LINEAR 0u
#define KVT_PRED_MLP 1u
#define KVT_PRED_N_EMA 3u

/* Decays of the attention-mass EMAs, per observation. */
static const float kvt_pred_decay[KVT_PRED_N_EMA] = {0.5f, 0.8f, 0.95f};

/* What the learned scorer keeps per (sequence, block, layer): 32 bytes,
 * its private state (kvt_scorer.state_bytes). The key norm is the
 * framework's (kvt_bstate), copied in when features are computed. */
typedef struct kvt_pred_bstate {
  float ema[KVT_PRED_N_EMA]; /* EMAs of the observed mass (the first observation sets them) */
  float max, sum, last;      /* max, accumulated and last observed mass */
  float key_norm;            /* mean L2 norm of the block's key vectors */
  uint32_t count;            /* observations */
} kvt_pred_bstate;

/* One observation of a block: mass as kvt_seq_observe() takes it (summed
 * over query heads). */
static inline void kvt_pred_observe(kvt_pred_bstate *st, float mass) {
  for (uint32_t i = 0; i < KVT_PRED_N_EMA; i++)
    st->ema[i] = st->count ? kvt_pred_decay[i] * st->ema[i] + (1 - kvt_pred_decay[i]) * mass : mass;
  st->max = st->count && st->max > mass ? st->max : mass;
  st->sum += mass;
  st->last = mass;
  st->count++;
}

/* Natural log for x > 0, to about 1e-4: the exponent from the bits and a
 * polynomial for the mantissa in [1, 2). A few times cheaper than logf,
 * and the features take nine per block; training uses the same. */
static inline float kvt_pred_fastlog(float x) {
  union {
    float f;
    uint32_t u;
  } v = {x};
  float e = (float)((int32_t)((v.u >> 23) & 0xff) - 127);
  v.u = (v.u & 0x007fffffu) | 0x3f800000u; /* mantissa m in [1, 2) */
  float m = v.f - 1.0f;
  /* log2(1 + m) on [0, 1), least-squares degree 5 */
  float p = m * (1.44254f + m * (-0.71827f + m * (0.45698f + m * (-0.27462f +
            m * (0.12183f + m * -0.02846f)))));
  return (e + p) * 0.69314718f;
}

static inline float kvt_pred_log(float x) { return kvt_pred_fastlog(x + 1e-6f); }

/* The features of block `block` of a sequence of n_blocks full blocks of
 * block_tokens tokens, at layer `layer` of n_layers: f[KVT_PRED_N_FEAT].
 * Only what the engine knows after an observation: the block's index and
 * state and the sequence's length in blocks. */
static inline void kvt_pred_features(const kvt_pred_bstate *st, uint32_t block, uint32_t n_blocks,
                                     uint32_t block_tokens, uint32_t layer, uint32_t n_layers,
                                     float *f) {
  float age = (float)(n_blocks - 1 - block), bt = (float)block_tokens;
  f[0] = 1.0f;
  f[1] = kvt_pred_fastlog(1 + age * bt);                           /* age in tokens */
  f[2] = kvt_pred_fastlog(1 + (float)block * bt);                 /* position */
  f[3] = ((float)block + 0.5f) / (float)n_blocks;    /* relative position */
  for (uint32_t i = 0; i < KVT_PRED_N_EMA; i++) f[4 + i] = kvt_pred_log(st->ema[i]);
  f[7] = kvt_pred_log(st->max);
  f[8] = kvt_pred_log(st->count ? st->sum / (float)st->count : 0); /* mean */
  f[9] = kvt_pred_log(st->last);
  f[10] = kvt_pred_fastlog(1 + (float)st->count);
  f[11] = st->key_norm;
  f[12] = kvt_pred_fastlog(1 + (float)n_blocks * bt);            /* context */
  f[13] = n_layers > 1 ? (float)layer / (float)(n_layers - 1) : 0;
  f[14] = kvt_pred_log(st->sum);                     /* accumulated (H2O) */
  f[15] = 1.0f / (1.0f + age);                       /* recency */
}

/* Private state bytes per (block, layer) the learned scorer keeps. */
#define KVT_PREDICTOR_STATE 32u
_Static_assert(sizeof(kvt_pred_bstate) == KVT_PREDICTOR_STATE, "the scorer's state size");

/* The shape a predictor is for, as its header states it. */
typedef struct kvt_pred_shape {
  uint32_t n_layers, block_tokens, head_dim, n_kv_heads;
} kvt_pred_shape;

typedef struct kvt_predictor {
  kvt_pred_shape shape;
  uint32_t kind;      /* KVT_PRED_LINEAR or KVT_PRED_MLP */
  uint32_t per_layer; /* 1: a weight set per layer; 0: one shared */
  uint32_t hidden;    /* MLP hidden units (0 for linear) */
  uint32_t window;    /* W of the target, steps (informational) */
  float budget;       /* budget it was trained for (informational; 0: several) */
  uint32_t set_floats; /* floats per weight set */
  float *w;           /* [sets][set_floats] (owned) */
  struct kvt_mem *mem; /* the accounting w and the struct are counted in (OTHER) */
  size_t w_bytes;
  /* MLP only, made by kvt_predictor_parse: each set's W1 transposed,
   * [sets][N_FEAT][hidden], for inference; NULL (e.g. a model built and
   * trained in place by `kvtier train`) falls back to reading W1 from w. */
  float *w1t;
  size_t w1t_bytes;
} kvt_predictor;

/* Floats in one weight set. */
static inline uint32_t kvt_pred_set_floats(uint32_t kind, uint32_t hidden) {
  return kind == KVT_PRED_LINEAR ? KVT_PRED_N_FEAT : hidden * (KVT_PRED_N_FEAT + 2) + 1;
}

/* Parse a predictor file held in memory and check it is for `want`.
 * 0 and *out (free with kvt_predictor_free); KVT_ECORRUPT (bad magic,
 * truncated, inconsistent sizes, checksum, non-finite weights),
 * KVT_EVERSION (another version or feature count), KVT_ESHAPE (made for
 * another shape), -ENOMEM. why (may be NULL) receives a sentence. The
 * predictor is allocated through m (KVT_MEM_OTHER). */
int kvt_predictor_parse(struct kvt_mem *m, const void *buf, size_t len, const kvt_pred_shape *want,
                        kvt_predictor **out, char *why, size_t why_len);
void kvt_predictor_free(kvt_predictor *p);
/* The predicted (log) future mass of a block with features f at layer. */
float kvt_predictor_infer(const kvt_predictor *p, uint32_t layer, const float *f);
/* The checksum a predictor file ends with: XXH3-64 of the bytes before it. */
uint64_t kvt_predictor_checksum(const void *buf, size_t len);

/* The engine's side (declared with the other per-namespace readers in
 * policy.h: kvt_predictor_read()): the learned scorer's hooks. One
 * observation of one block (update its private state). */
void kvt_predictor_observe(const void *model, const kvt_pctx *c, const kvt_pblk *b, float mass);
/* Predicted future mass (log) of n blocks; higher keeps. */
void kvt_predictor_score(const void *model, const kvt_pctx *c, const kvt_pblk *b, size_t n,
                         double *out);

#endif
