/* score_sink_recent.c - "sink-recent" (StreamingLLM): the first blocks
 * receive a large share of attention whatever they hold (attention
 * sinks), so they are kept - the framework protects sink_blocks, one by
 * default for this scorer - then the newest blocks as in "recent". */
#include "engine/policy.h"

static void score_sink_recent(const kvt_pctx *c, const kvt_pblk *b, size_t n, double *out) {
  (void)c;
  for (size_t i = 0; i < n; i++) out[i] = (double)b[i].block;
}

const kvt_scorer kvt_scorer_sink_recent = {.id = KVT_SCORER_SINK_RECENT, .name = "sink-recent",
                                           .default_sinks = 1, .score = score_sink_recent};
