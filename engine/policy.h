/* policy.h - the policy layer's scorer interface (DESIGN.md section 4).
 * A scorer ranks the retained blocks of one (sequence, layer); the
 * framework (policy.c) keeps the best ranked within the layer's byte
 * budget and evicts the rest from that layer of that sequence, never
 * touching the sinks, the protected window or blocks still in their
 * scoring delay. A scorer sees only the per-block state below and a
 * private state of its own size, never tiers or files. Adding one is one
 * file (score_<name>.c) plus a line in policy.c's table. */
#ifndef KVT_POLICY_H
#define KVT_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

/* Per (sequence, block, layer) state every scorer may read, kept by the
 * framework: fed by kvt_seq_observe(), set at put. */
typedef struct kvt_bstate {
  double mass_sum;     /* accumulated observed mass */
  float mass_last;     /* mass at the last observation */
  float mass_max;      /* largest mass of one observation */
  float key_norm;      /* mean L2 norm of the block's key vectors (per token and
                          KV head) at put; 0 when unknown (adopted, not put) */
  float hint;          /* the caller's score (kvt_seq_hint; "external") */
  uint32_t observed;   /* observations since it joined */
  uint32_t left;       /* 1: the policy evicted it from this layer (not an error
                          that it is not in RAM; a put takes it back) */
  uint32_t recalled;   /* 1: brought back by recall (recall.c), not yet observed:
                          kept until its first observation says whether it mattered */
} kvt_bstate;

/* One layer's policy inside a sequence: from the sequence's kvt_policy
 * (uniform) or from the namespace's profile ("auto"). */
typedef struct kvt_lpol {
  uint32_t scorer;     /* kvt_scorer_id; never AUTO */
  uint32_t pad;
  double share;        /* budget: fraction of the layer's full f16 cache */
  double warm;         /* of which warm blocks may take this fraction (<= share;
                          0: no warm share, eviction only); hot the rest */
  uint64_t promotions, promotions_exact, demotions; /* the policy's tier moves */
} kvt_lpol;

/* What a scorer knows of the (sequence, layer) it is asked about. */
typedef struct kvt_pctx {
  const kvt_policy *pol;      /* the sequence's policy (defaults resolved) */
  const kvt_lpol *lp;         /* this layer's scorer and share */
  const void *model;          /* the namespace's predictor (predictor.h), or NULL */
  uint32_t layer, n_layers;
  uint32_t n_blocks;          /* full blocks in the sequence */
  uint32_t block_tokens;
  uint64_t n_tokens;          /* the sequence's length, tail included */
  uint32_t n_kv_heads, head_dim;
} kvt_pctx;

/* One retained block as a scorer sees it. Its age in tokens is
 * n_tokens - (block + 1) * block_tokens. */
typedef struct kvt_pblk {
  uint32_t block;             /* index in the sequence */
  uint32_t tier;              /* the framework's: the block's tier when listed */
  const kvt_bstate *bs;
  void *st;                   /* the scorer's private state (state_bytes) */
} kvt_pblk;

/* The largest private state a scorer may ask for, per (block, layer). */
#define KVT_SCORER_STATE_MAX 64u

typedef struct kvt_scorer {
  uint32_t id;                /* kvt_scorer_id */
  const char *name;
  uint32_t state_bytes;       /* private bytes per (block, layer), <= KVT_SCORER_STATE_MAX */
  uint32_t default_sinks;     /* kvt_policy defaults this scorer wants */
  uint32_t default_delay;
  /* One observation of one retained block (b->bs already updated with
   * mass). NULL: nothing private to update. */
  void (*observe)(const kvt_pctx *c, const kvt_pblk *b, float mass);
  /* Scores of the n candidate blocks, in block order (out[i] for b[i]);
   * higher keeps. Ties go to the older block. */
  void (*score)(const kvt_pctx *c, const kvt_pblk *b, size_t n, double *out);
} kvt_scorer;

extern const kvt_scorer kvt_scorer_recent;      /* score_recent.c */
extern const kvt_scorer kvt_scorer_sink_recent; /* score_sink_recent.c */
extern const kvt_scorer kvt_scorer_h2o;         /* score_h2o.c */
extern const kvt_scorer kvt_scorer_snapkv;      /* score_snapkv.c */
extern const kvt_scorer kvt_scorer_tova;        /* score_tova.c */
extern const kvt_scorer kvt_scorer_external;    /* score_external.c */
extern const kvt_scorer kvt_scorer_learned;     /* score_learned.c */

/* The scorer of id, NULL for "full", "auto" and unknown ids. */
const kvt_scorer *kvt_scorer_get(uint32_t id);

/* Profiles (profile.c) and predictors (predictor.c), per namespace. Both
 * are read whole, checked against the namespace's shape, and then
 * immutable; the engine replaces them under its lock. The readers record
 * the error detail on e. */
struct kvt_engine;
typedef struct kvt_profile kvt_profile;
typedef struct kvt_predictor kvt_predictor;
int kvt_profile_read(struct kvt_engine *e, const char *path, const kvt_shape *sh,
                     kvt_profile **out);
void kvt_profile_free(kvt_profile *p);
/* The per-layer scorers and shares for a total budget (mean share over
 * the layers = budget, each share at most 1). */
/* 1 when the profile names warm shares (version 2), 0 when out's warm
 * shares are 0 and left to the caller (version 1). */
int kvt_profile_layers(const kvt_profile *p, double budget, kvt_lpol *out, uint32_t n_layers);
/* The mean L2 norm of kv's key rows (n_tokens x n_heads rows of head_dim;
 * kv->k set), in double as one row after another would sum it: the
 * learned predictor's key_norm feature of a put block. */
float kvt_policy_key_norm(const kvt_kv *kv);
int kvt_predictor_read(struct kvt_engine *e, const char *path, const kvt_shape *sh,
                       kvt_predictor **out);
void kvt_predictor_free(kvt_predictor *p);

#endif
