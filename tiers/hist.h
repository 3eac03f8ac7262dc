/* hist.h - latency histograms with fixed, log-spaced buckets (1-2.5-5 per
 * decade, 5 us .. 10 s), counted with relaxed atomics so the I/O threads
 * that observe never take a lock. Read by kvt_metrics_render() as
 * Prometheus histograms (engine/metrics.c). */
#ifndef KVT_HIST_H
#define KVT_HIST_H

#include <stdint.h>

#define KVT_HIST_BOUNDS 20u /* finite upper bounds; one more bucket above them */

typedef struct kvt_hist {
  uint64_t n[KVT_HIST_BOUNDS + 1]; /* per bucket, not cumulative; n[KVT_HIST_BOUNDS]: above all */
  uint64_t sum_ns;                 /* of every observation */
} kvt_hist;

/* Upper bound of bucket i in nanoseconds (i < KVT_HIST_BOUNDS), and the
 * same bound as Prometheus' `le` text in seconds. */
uint64_t kvt_hist_bound_ns(uint32_t i);
const char *kvt_hist_bound_text(uint32_t i);

/* Count one observation of ns nanoseconds. Any thread, no lock. */
void kvt_hist_add(kvt_hist *h, uint64_t ns);

/* A copy of h read with atomic loads (each field; an observation under
 * way may show in a bucket and not yet in the sum). */
void kvt_hist_read(const kvt_hist *h, kvt_hist *out);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t kvt_hist_now_ns(void);

#endif
