/* score_recent.c - "recent": a sliding window; the newest blocks win. */
#include "engine/policy.h"

static void score_recent(const kvt_pctx *c, const kvt_pblk *b, size_t n, double *out) {
  (void)c;
  for (size_t i = 0; i < n; i++) out[i] = (double)b[i].block;
}

const kvt_scorer kvt_scorer_recent = {.id = KVT_SCORER_RECENT, .name = "recent",
                                      .score = score_recent};
