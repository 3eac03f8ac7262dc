/* sample.c - sampling sequences from the reference model and scoring
 * next-token distributions: what `kvtier eval` and the tests share. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample.h"

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void rm_log_softmax(const float *logits, size_t n, double *out) {
  double mx = -INFINITY, sum = 0;
  for (size_t i = 0; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
  for (size_t i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
  double lse = mx + log(sum);
  for (size_t i = 0; i < n; i++) out[i] = (double)logits[i] - lse;
}

uint32_t rm_argmax(const float *v, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; i++)
    if (v[i] > v[best]) best = i;
  return (uint32_t)best;
}

int rm_sample(const rm_model *m, uint64_t seed, uint32_t len, uint32_t *out) {
  if (len == 0 || len > (uint32_t)m->c.seq_len) return KVT_ECOUNT;
  rm_dec d;
  int rc = rm_dec_init(&d, m, NULL, 0);
  if (rc) return rc;
  size_t V = (size_t)m->c.vocab_size;
  double *lp = malloc(V * sizeof *lp);
  if (!lp) {
    rm_dec_free(&d);
    return -ENOMEM;
  }
  uint64_t st = seed;
  out[0] = RM_BOS;
  /* Temperature 1. A story that ends samples BOS, and a new one follows
   * in the same context, as in the training data. */
  for (uint32_t i = 0; i + 1 < len && !rc; i++) {
    const float *logits;
    if ((rc = rm_dec_step(&d, out[i], &logits))) break;
    rm_log_softmax(logits, V, lp);
    double u = (double)(splitmix(&st) >> 11) * 0x1.0p-53, c = 0;
    uint32_t tok = (uint32_t)V - 1;
    for (size_t t = 0; t < V; t++)
      if ((c += exp(lp[t])) > u) {
        tok = (uint32_t)t;
        break;
      }
    out[i + 1] = tok;
  }
  free(lp);
  rm_dec_free(&d);
  return rc;
}
