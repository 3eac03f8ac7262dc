/* score_sink_recent.c - "sink-recent" (StreamingLLM): the first blocks
 * receive a large share of attention whatever they hold (attention
 * sinks), so they are kept, then the newest blocks as in "recent". */
#include "engine/policy.h"

static double score_sink_recent(const kvt_score_in *in) {
  /* earlier sinks first, when the budget is below sink_blocks */
  if (in->block < in->pol->sink_blocks) return KVT_SCORE_KEEP * (in->pol->sink_blocks - in->block);
  return (double)in->block;
}

const kvt_scorer kvt_scorer_sink_recent = {KVT_SCORER_SINK_RECENT, "sink-recent",
                                           score_sink_recent};
