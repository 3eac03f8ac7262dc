/* score_h2o.c - "h2o" (Heavy-Hitter Oracle): blocks that accumulated the
 * most attention mass are kept. A block is scored once it has been
 * observed (default delay 1): before, it has no evidence. */
#include "engine/policy.h"

static void score_h2o(const kvt_pctx *c, const kvt_pblk *b, size_t n, double *out) {
  (void)c;
  for (size_t i = 0; i < n; i++) out[i] = b[i].bs->mass_sum;
}

const kvt_scorer kvt_scorer_h2o = {.id = KVT_SCORER_H2O, .name = "h2o", .default_delay = 1,
                                   .score = score_h2o};
