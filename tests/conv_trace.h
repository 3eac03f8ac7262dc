/* conv_trace.h - a made-up request trace for the tests of the learned
 * eviction orders (cold tier: test_engine_learned; hot tier:
 * test_hot_order): conversations coming back soon, late or never, a few
 * hot ones, and a third of one-off prompts after a shared system block:
 * blocks reused and blocks never reused, for the model to tell apart. */
#ifndef KVT_CONV_TRACE_H
#define KVT_CONV_TRACE_H

#include <stdint.h>
#include <string.h>

#include "testutil.h"

#define CT_MAX_BLK 24 /* token blocks a request, at most */

typedef struct ct_req {
  uint32_t n;
  uint64_t id[CT_MAX_BLK]; /* block ids, 1 the shared system block */
} ct_req;

/* n requests from seed (the same seed, the same trace). */
static inline void ct_make_trace(ct_req *r, size_t n, uint64_t seed) {
  enum { CONVS = 120 };
  static ct_req last[CONVS];
  memset(last, 0, sizeof last);
  uint64_t st = seed, next_id = 1000;
  for (size_t i = 0; i < n; i++) {
    if (tu_rand_r(&st) % 3 == 0) {
      r[i].n = 1 + 4 + (uint32_t)(tu_rand_r(&st) % 8);
      r[i].id[0] = 1;
      for (uint32_t k = 1; k < r[i].n; k++) r[i].id[k] = next_id++;
      continue;
    }
    uint32_t c = (uint32_t)(tu_rand_r(&st) % CONVS);
    if (tu_rand_r(&st) % 4 == 0) c = (uint32_t)(tu_rand_r(&st) % 8);
    ct_req *l = &last[c];
    if (l->n == 0 || l->n + 4 > CT_MAX_BLK) {
      l->n = 1;
      l->id[0] = 1;
    }
    uint32_t add = 1 + (uint32_t)(tu_rand_r(&st) % 4);
    for (uint32_t k = 0; k < add; k++) l->id[l->n++] = next_id++;
    r[i] = *l;
  }
}

#endif
