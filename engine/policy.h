/* policy.h - the policy layer's scorer interface (DESIGN.md section 4).
 * A scorer ranks the retained blocks of one (sequence, layer); the policy
 * (policy.c) keeps the best ranked within the budget and evicts the rest
 * from that layer of that sequence. A scorer sees only the per-block state
 * below, never tiers or files; adding one is one file plus a line in
 * policy.c's table. */
#ifndef KVT_POLICY_H
#define KVT_POLICY_H

#include <stdint.h>

#include "kvtier.h"

/* Per (sequence, block, layer) policy state, fed by kvt_seq_observe(). */
typedef struct kvt_bstate {
  double mass_sum;     /* accumulated observed mass */
  float mass_last;     /* mass at the last observation */
  uint32_t observed;   /* observations since it was put */
  uint32_t left;       /* 1: the policy evicted it from this layer (not an error
                          that it is not in RAM; a put takes it back) */
} kvt_bstate;

/* What a scorer is asked about one block. */
typedef struct kvt_score_in {
  uint32_t block;          /* index in the sequence (its age is n_blocks - 1 - block) */
  uint32_t n_blocks;       /* blocks in the sequence */
  const kvt_bstate *st;    /* its state */
  const kvt_policy *pol;
} kvt_score_in;

typedef struct kvt_scorer {
  uint32_t id;             /* kvt_scorer_id */
  const char *name;
  /* Higher keeps. Ties are broken towards the more recent block. */
  double (*score)(const kvt_score_in *in);
} kvt_scorer;

extern const kvt_scorer kvt_scorer_recent;      /* score_recent.c */
extern const kvt_scorer kvt_scorer_sink_recent; /* score_sink_recent.c */
extern const kvt_scorer kvt_scorer_h2o;         /* score_h2o.c */

/* A score that the budget never evicts unless nothing else is left. */
#define KVT_SCORE_KEEP 1e200

#endif
