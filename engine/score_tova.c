/* score_tova.c - "tova" (Token Omission Via Attention): what the current
 * query attends to is what stays; the block with the least mass at the
 * last observation leaves. Scored once observed (default delay 1). */
#include "engine/policy.h"

static void score_tova(const kvt_pctx *c, const kvt_pblk *b, size_t n, double *out) {
  (void)c;
  for (size_t i = 0; i < n; i++) out[i] = b[i].bs->mass_last;
}

const kvt_scorer kvt_scorer_tova = {.id = KVT_SCORER_TOVA, .name = "tova", .default_delay = 1,
                                    .score = score_tova};
