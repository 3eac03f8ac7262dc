/* bench_rcluster.c - throughput of the Redis Cluster client (io/rcluster.c)
 * until `kvtier bench remote` can measure the remote tier itself: SET NX
 * and GET of N values of a given size, one command per kvt_rc_exec
 * against batches of B, in the same run on the same cluster, as JSON.
 *   bench_rcluster URL [N=1000] [VALUE_BYTES=65536] [BATCH=64] [INFLIGHT=256]
 * (INFLIGHT: max_inflight_requests per node)
 * Not a test (no pass/fail): speed lives in benches. Keys are deleted at
 * the end. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/rcluster.h"
#include "kvtier.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct run {
  double set_s, get_s;
  size_t set_ok, get_ok, unavailable;
} run;

/* All n commands of op, in batches of b; counts the expected status. */
static double pass(kvt_rc *rc, kvt_rc_cmd *c, size_t n, size_t b, kvt_rc_op op, size_t vlen,
                   size_t *ok, size_t *unavail) {
  for (size_t i = 0; i < n; i++) c[i].op = op;
  double t0 = now_s();
  for (size_t i = 0; i < n; i += b) {
    size_t m = n - i < b ? n - i : b;
    if (kvt_rc_exec(rc, c + i, m)) return -1;
    for (size_t j = i; j < i + m; j++) {
      *ok += c[j].status == KVT_RC_OK && (op != KVT_RC_GET || c[j].out_len == vlen);
      *unavail += c[j].status == KVT_RC_UNAVAILABLE;
    }
    kvt_rc_release(c + i, m);
  }
  return now_s() - t0;
}

static int one_run(kvt_rc *rc, kvt_rc_cmd *c, char (*keys)[48], size_t n, size_t b,
                   const char *tag, const uint8_t *val, size_t vlen, run *r) {
  memset(c, 0, n * sizeof *c);
  for (size_t i = 0; i < n; i++) {
    int kl = snprintf(keys[i], sizeof keys[i], "bench:%s:%zu", tag, i);
    c[i].key = keys[i];
    c[i].key_len = (size_t)kl;
    c[i].val = val;
    c[i].val_len = vlen;
  }
  memset(r, 0, sizeof *r);
  r->set_s = pass(rc, c, n, b, KVT_RC_SET_NX, vlen, &r->set_ok, &r->unavailable);
  r->get_s = pass(rc, c, n, b, KVT_RC_GET, vlen, &r->get_ok, &r->unavailable);
  size_t dummy = 0;
  pass(rc, c, n, 256, KVT_RC_DEL, vlen, &dummy, &dummy);
  return r->set_s < 0 || r->get_s < 0 ? -1 : 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_rcluster URL [N=1000] [VALUE_BYTES=65536] [BATCH=64] [INFLIGHT=256]\n");
    return 2;
  }
  size_t n = argc > 2 ? strtoul(argv[2], NULL, 10) : 1000;
  size_t vlen = argc > 3 ? strtoul(argv[3], NULL, 10) : 65536;
  size_t b = argc > 4 ? strtoul(argv[4], NULL, 10) : 64;
  if (!n || n > KVT_RC_BATCH_MAX || !b || b > KVT_RC_BATCH_MAX || vlen > (64u << 20)) {
    fprintf(stderr, "bench_rcluster: N and BATCH 1..%u, VALUE_BYTES up to 64 MiB\n", KVT_RC_BATCH_MAX);
    return 2;
  }
  kvt_rc_config cfg = {.url = argv[1], .deadline_ms = 60000, .command_timeout_ms = 10000,
                       .connect_timeout_ms = 5000};
  if (argc > 5) cfg.max_inflight_requests = (uint32_t)strtoul(argv[5], NULL, 10);
  kvt_rc *rc = NULL;
  char err[256];
  int e = kvt_rc_open(&cfg, &rc, err, sizeof err);
  if (e) {
    fprintf(stderr, "bench_rcluster: %s\n", err);
    return 1;
  }
  uint8_t *val = malloc(vlen ? vlen : 1);
  kvt_rc_cmd *c = calloc(n, sizeof *c);
  char (*keys)[48] = calloc(n, sizeof *keys);
  if (!val || !c || !keys) return 1;
  for (size_t i = 0; i < vlen; i++) val[i] = (uint8_t)(i * 131u + 7u);
  char tag[32];
  snprintf(tag, sizeof tag, "%ld", (long)time(NULL));
  char t1[40], t2[40];
  snprintf(t1, sizeof t1, "%s:1", tag);
  snprintf(t2, sizeof t2, "%s:%zu", tag, b);
  run one, many;
  if (one_run(rc, c, keys, n, 1, t1, val, vlen, &one) ||
      one_run(rc, c, keys, n, b, t2, val, vlen, &many)) {
    fprintf(stderr, "bench_rcluster: a batch was refused\n");
    return 1;
  }
  double mb = (double)n * (double)vlen / 1e6;
  printf("{\"n\": %zu, \"value_bytes\": %zu, \"batch\": %zu,\n", n, vlen, b);
  printf(" \"one_at_a_time\": {\"set_per_s\": %.0f, \"get_per_s\": %.0f, \"set_MB_s\": %.1f, "
         "\"get_MB_s\": %.1f, \"set_ok\": %zu, \"get_ok\": %zu, \"unavailable\": %zu},\n",
         n / one.set_s, n / one.get_s, mb / one.set_s, mb / one.get_s, one.set_ok, one.get_ok,
         one.unavailable);
  printf(" \"pipelined\": {\"set_per_s\": %.0f, \"get_per_s\": %.0f, \"set_MB_s\": %.1f, "
         "\"get_MB_s\": %.1f, \"set_ok\": %zu, \"get_ok\": %zu, \"unavailable\": %zu},\n",
         n / many.set_s, n / many.get_s, mb / many.set_s, mb / many.get_s, many.set_ok,
         many.get_ok, many.unavailable);
  printf(" \"set_speedup\": %.2f, \"get_speedup\": %.2f}\n", one.set_s / many.set_s,
         one.get_s / many.get_s);
  kvt_rc_stats st;
  kvt_rc_stats_get(rc, &st);
  fprintf(stderr, "bench_rcluster: %" PRIu64 " batches, %" PRIu64 " commands, %" PRIu64
          " redirects, %" PRIu64 " unavailable\n", st.batches, st.commands, st.moved + st.ask,
          st.unavailable);
  free(keys);
  free(c);
  free(val);
  kvt_rc_close(rc);
  return 0;
}
