/* predictor.h - the learned scorer's model: reads a predictor file
 * (docs/policy.md), keeps per-block features in the scorer's private
 * state, and estimates each block's future attention mass. */
#ifndef KVT_PREDICTOR_H
#define KVT_PREDICTOR_H

#include "engine/policy.h"

/* Private state bytes per (block, layer) the predictor keeps. */
#define KVT_PREDICTOR_STATE 32u

/* One observation of one block (update its features). */
void kvt_predictor_observe(const void *model, const kvt_pctx *c, const kvt_pblk *b, float mass);
/* Estimated future mass of n blocks; higher keeps. */
void kvt_predictor_score(const void *model, const kvt_pctx *c, const kvt_pblk *b, size_t n,
                         double *out);

#endif
