/* hist.c - the fixed log-spaced latency buckets of hist.h: relaxed atomic
 * counters, a binary search over 20 bounds per observation. */
#include "tiers/hist.h"

#include <time.h>

static const uint64_t bound_ns[KVT_HIST_BOUNDS] = {
    5000ull,       10000ull,      25000ull,      50000ull,      100000ull,
    250000ull,     500000ull,     1000000ull,    2500000ull,    5000000ull,
    10000000ull,   25000000ull,   50000000ull,   100000000ull,  250000000ull,
    500000000ull,  1000000000ull, 2500000000ull, 5000000000ull, 10000000000ull,
};

/* The same bounds in seconds, written out: no float formatting decides
 * what a scraper sees. */
static const char *const bound_text[KVT_HIST_BOUNDS] = {
    "0.000005", "0.00001", "0.000025", "0.00005", "0.0001", "0.00025", "0.0005",
    "0.001",    "0.0025",  "0.005",    "0.01",    "0.025",  "0.05",    "0.1",
    "0.25",     "0.5",     "1",        "2.5",     "5",      "10",
};

uint64_t kvt_hist_bound_ns(uint32_t i) { return i < KVT_HIST_BOUNDS ? bound_ns[i] : UINT64_MAX; }

const char *kvt_hist_bound_text(uint32_t i) { return i < KVT_HIST_BOUNDS ? bound_text[i] : "+Inf"; }

void kvt_hist_add(kvt_hist *h, uint64_t ns) {
  uint32_t lo = 0, hi = KVT_HIST_BOUNDS; /* first bound >= ns, or KVT_HIST_BOUNDS */
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (bound_ns[mid] >= ns) hi = mid;
    else lo = mid + 1;
  }
  __atomic_fetch_add(&h->n[lo], 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&h->sum_ns, ns, __ATOMIC_RELAXED);
}

void kvt_hist_read(const kvt_hist *h, kvt_hist *out) {
  for (uint32_t i = 0; i <= KVT_HIST_BOUNDS; i++)
    out->n[i] = __atomic_load_n(&h->n[i], __ATOMIC_RELAXED);
  out->sum_ns = __atomic_load_n(&h->sum_ns, __ATOMIC_RELAXED);
}

uint64_t kvt_hist_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
