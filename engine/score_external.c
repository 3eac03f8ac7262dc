/* score_external.c - "external": the caller ranks the blocks itself
 * (kvt_seq_hint()), from whatever it knows; `kvtier eval --policy oracle`
 * feeds it the attention each block will receive over the next steps. */
#include "engine/policy.h"

static void score_external(const kvt_pctx *c, const kvt_pblk *b, size_t n, double *out) {
  (void)c;
  for (size_t i = 0; i < n; i++) out[i] = b[i].bs->hint;
}

const kvt_scorer kvt_scorer_external = {.id = KVT_SCORER_EXTERNAL, .name = "external",
                                        .score = score_external};
