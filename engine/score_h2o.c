/* score_h2o.c - "h2o" (Heavy-Hitter Oracle): blocks that accumulated the
 * most attention mass are kept. A block not yet observed has no evidence,
 * and the newest block is where the next queries look, so both are kept
 * (the protected window of DESIGN.md section 4, one block wide). */
#include "engine/policy.h"

static double score_h2o(const kvt_score_in *in) {
  if (in->block + 1 == in->n_blocks || in->st->observed == 0) return KVT_SCORE_KEEP;
  return in->st->mass_sum;
}

const kvt_scorer kvt_scorer_h2o = {KVT_SCORER_H2O, "h2o", score_h2o};
