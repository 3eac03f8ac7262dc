/* score_learned.c - "learned" (KVpop): the namespace's predictor
 * (predictor.h) estimates the attention mass each block will receive over
 * the next steps from features the framework keeps; the lowest estimate
 * leaves. */
#include "engine/policy.h"
#include "engine/predictor.h"

static void observe_learned(const kvt_pctx *c, const kvt_pblk *b, float mass) {
  kvt_predictor_observe(c->model, c, b, mass);
}

static void score_learned(const kvt_pctx *c, const kvt_pblk *b, size_t n, double *out) {
  kvt_predictor_score(c->model, c, b, n, out);
}

const kvt_scorer kvt_scorer_learned = {.id = KVT_SCORER_LEARNED, .name = "learned",
                                       .state_bytes = KVT_PREDICTOR_STATE, .default_delay = 1,
                                       .observe = observe_learned, .score = score_learned};
