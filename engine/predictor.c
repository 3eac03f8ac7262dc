/* predictor.c - the learned scorer's model. Not there yet: loading any
 * predictor is refused, so "learned" cannot be chosen. */
#include <stdlib.h>

#include "engine/internal.h"
#include "engine/predictor.h"

int kvt_predictor_read(kvt_engine *e, const char *path, const kvt_shape *sh, kvt_predictor **out) {
  (void)sh;
  *out = NULL;
  return KVT_ERR(e, KVT_EOPTION, "kvt_ns_load_predictor", "path", "a predictor file",
                 "%s: predictors are not supported by this build", path);
}

void kvt_predictor_free(kvt_predictor *p) { free(p); }

void kvt_predictor_observe(const void *model, const kvt_pctx *c, const kvt_pblk *b, float mass) {
  (void)model;
  (void)c;
  (void)b;
  (void)mass;
}

void kvt_predictor_score(const void *model, const kvt_pctx *c, const kvt_pblk *b, size_t n,
                         double *out) {
  (void)model;
  (void)c;
  for (size_t i = 0; i < n; i++) out[i] = b[i].bs->mass_sum;
}
