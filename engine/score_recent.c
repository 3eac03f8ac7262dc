/* score_recent.c - "recent": a sliding window; the newest blocks win. */
#include "engine/policy.h"

static double score_recent(const kvt_score_in *in) { return (double)in->block; }

const kvt_scorer kvt_scorer_recent = {KVT_SCORER_RECENT, "recent", score_recent};
