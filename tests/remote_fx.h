/* remote_fx.h - engine helpers shared by the remote tier's tests
 * (test_remote_*.c): an engine opened on a cluster, a run of blocks
 * written through it, a killed node waited for, the fixture's directory. */
#ifndef KVT_REMOTE_FX_H
#define KVT_REMOTE_FX_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "testutil.h"

/* An engine on the cluster at url: cold is the local cold tier's limit
 * (0: diskless, the cluster the only durable tier). */
static inline kvt_engine *rfx_open(const char *dir, const char *url, uint64_t cold,
                                   uint32_t deadline_ms) {
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_COLD] = cold;
  kvt_remote_options ro = {.size = sizeof ro, .url = url, .deadline_ms = deadline_ms};
  kvt_engine *e = NULL;
  kvt_error_info info;
  int rc = kvt_engine_open_remote(dir, &o, &ro, &e, &info);
  if (rc) fprintf(stderr, "open: %s\n", info.message);
  assert_int_equal(rc, 0);
  return e;
}

/* A sequence of nb blocks of 4 tokens each (tok), every layer filled
 * from salt; sync: kvt_sync's result before the sequence goes, else 0. */
static inline int rfx_put(kvt_engine *e, kvt_ns_id ns, const kvt_shape *sh, uint64_t salt,
                          const uint32_t *tok, uint32_t nb, int sync) {
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  tu_kv kv;
  tu_kv_alloc(&kv, sh);
  for (uint32_t b = 0; b < nb; b++) tu_append_put(s, sh, salt, tok + 4 * b, &kv);
  int rc = sync ? kvt_sync(e) : 0;
  kvt_seq_release(s);
  tu_kv_free(&kv);
  return rc;
}

/* A killed node's process gone (polled, at most 5 s). */
static inline void rfx_wait_gone(pid_t pid) {
  for (int i = 0; i < 500 && kill(pid, 0) == 0; i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  assert_int_not_equal(kill(pid, 0), 0);
}

/* The fixture cluster's directory (KVT_REDIS_DIR: node pid files); the
 * test is skipped (77) without it. */
static inline const char *rfx_cluster_dir(void) {
  const char *d = getenv("KVT_REDIS_DIR");
  if (!d) {
    fprintf(stderr, "skip: KVT_REDIS_DIR unset (run through ctest)\n");
    exit(77);
  }
  return d;
}

#endif
