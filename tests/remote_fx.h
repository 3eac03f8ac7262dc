/* remote_fx.h - helpers shared by the remote tier's tests
 * (test_remote_*.c): an engine opened on a cluster, a run of blocks
 * written through it, a killed node waited for, the fixture's directory;
 * at store level a run's random keys, a block's layers read back and
 * compared, two stores closed with nothing left allocated; and how many
 * of some blocks the cluster holds, asked through a client of its own. */
#ifndef KVT_REMOTE_FX_H
#define KVT_REMOTE_FX_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"
#include "base/mem.h"
#include "io/rcluster.h"
#include "tiers/remote.h"
#include "tiers/store.h"

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

/* A random key, xor run: keys unique to a run (a cluster may outlive it). */
static inline kvt_key rfx_key(uint64_t run) {
  kvt_key k;
  for (int i = 0; i < 2; i++) {
    uint64_t x = tu_rand() ^ run;
    memcpy(k.b + 8 * i, &x, 8);
  }
  return k;
}

/* Every layer of key read from s is kv[l] (K then V, each bytes each). */
static inline void rfx_assert_layers(kvt_store *s, const kvt_key *key, const uint8_t *const *kv,
                                     uint32_t n_layers, size_t each) {
  uint8_t *k = malloc(each), *v = malloc(each);
  assert_true(k && v);
  for (uint32_t l = 0; l < n_layers; l++) {
    assert_int_equal(kvt_store_read_layer(s, key, l, k, v, each), 0);
    assert_memory_equal(k, kv[l], each);
    assert_memory_equal(v, kv[l] + each, each);
  }
  free(k);
  free(v);
}

/* Two stores closed: each gave back every byte it allocated. */
static inline void rfx_close_stores(kvt_store *a, kvt_mem *ma, kvt_store *b, kvt_mem *mb) {
  kvt_store_close(a);
  kvt_store_close(b);
  assert_int_equal(kvt_mem_total(ma), 0);
  assert_int_equal(kvt_mem_total(mb), 0);
  kvt_mem_fini(ma);
  kvt_mem_fini(mb);
}

#define RFX_KEYS_MAX 64

/* How many of keys[0..nk) (nk <= RFX_KEYS_MAX) the cluster at url holds:
 * EXISTS through a client of its own, every answer OK. */
static inline int rfx_in_cluster(const char *url, const kvt_key *keys, int nk) {
  assert_true(nk >= 0 && nk <= RFX_KEYS_MAX);
  kvt_rc_config cfg = {.url = url, .deadline_ms = 20000, .command_timeout_ms = 10000};
  kvt_rc *rc;
  assert_int_equal(kvt_rc_open(&cfg, &rc, NULL, 0), 0);
  kvt_rc_cmd c[RFX_KEYS_MAX];
  char k[RFX_KEYS_MAX][KVT_REMOTE_KEY_MAX];
  memset(c, 0, sizeof c);
  for (int i = 0; i < nk; i++)
    c[i] = (kvt_rc_cmd){.op = KVT_RC_EXISTS, .key = k[i],
                        .key_len = kvt_remote_block_key(&keys[i], k[i])};
  assert_int_equal(kvt_rc_exec(rc, c, (size_t)nk), 0);
  int n = 0;
  for (int i = 0; i < nk; i++) {
    assert_int_equal(c[i].status, KVT_RC_OK);
    n += c[i].n == 1;
  }
  kvt_rc_release(c, (size_t)nk);
  kvt_rc_close(rc);
  return n;
}

#endif
