/* sample.h - sampling from the reference model; log-probabilities. */
#ifndef KVT_REFMODEL_SAMPLE_H
#define KVT_REFMODEL_SAMPLE_H

#include "refmodel.h"

/* out[0..len): BOS, then len - 1 tokens drawn at temperature 1 from the
 * model with a plain cache, seeded (splitmix64). 0 or a kvt code. */
int rm_sample(const rm_model *m, uint64_t seed, uint32_t len, uint32_t *out);
/* out[i] = log softmax(logits)[i], in double. */
void rm_log_softmax(const float *logits, size_t n, double *out);
uint32_t rm_argmax(const float *v, size_t n);

#endif
