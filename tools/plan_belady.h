/* plan_belady.h - the offline optimum beside `kvtier plan`'s replays:
 * Belady's MIN over a workload's block accesses (plan_belady.c), so a
 * policy's hit rate can be read against the best any policy could do. */
#ifndef KVT_TOOLS_PLAN_BELADY_H
#define KVT_TOOLS_PLAN_BELADY_H

#include <stdint.h>
#include <stdio.h> /* plan.h names FILE */

#include "plan.h"

/* A trace's future: every block access resolved to its block (a block is
 * its whole prefix chain of ids, as the engine's chained keys are) and the
 * position of that block's next access. Built once, replayed at any
 * number of capacities. */
typedef struct plan_future plan_future;

/* What one MIN replay saw. */
typedef struct plan_belady_stats {
  uint64_t accesses;     /* block accesses: every block of every request */
  uint64_t block_hits;   /* accesses that found their block stored */
  uint64_t hit_blocks;   /* blocks in the requests' leading runs of stored blocks */
  uint64_t hit_tokens;   /* those as plan counts hits: input tokens, capped at input length */
  uint64_t evictions;    /* stored blocks given up for an incoming one */
  uint64_t bypasses;     /* missed blocks not admitted (next use farthest, or none) */
} plan_belady_stats;

/* At most this many block accesses in a trace (positions are 32-bit). */
#define PLAN_BELADY_MAX_ACCESSES (UINT32_MAX - 1u)

/* Build t's future into *out (owned by the caller: plan_future_free).
 * 0; -1 when out of memory or t has more than PLAN_BELADY_MAX_ACCESSES
 * block accesses (*out is then NULL). t must stay unchanged while *out
 * is used. */
int plan_future_build(const plan_trace *t, plan_future **out);
void plan_future_free(plan_future *f);
/* Distinct blocks in the trace. */
uint64_t plan_future_blocks(const plan_future *f);

/* Replay t (the trace f was built from) through a store of cap_blocks
 * blocks (UINT64_MAX: unbounded) under MIN with bypass: a missed block is
 * admitted unless its next use is farther than every stored block's (or
 * it has none); when full, the stored block used farthest in the future
 * goes. Requests in t's order; each request's leading run of stored
 * blocks is counted before its blocks are accessed, as plan's lookup
 * comes before its puts. 0, or -1 when out of memory. */
int plan_belady_replay(const plan_trace *t, const plan_future *f, uint64_t cap_blocks,
                       plan_belady_stats *st);

#endif
