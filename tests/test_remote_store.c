/* test_remote_store.c - the remote tier (tiers/remote*.c, store_remote.c)
 * against the ctest fixture's Redis Cluster: values in the cold record
 * format checked slice by slice; a diskless store writes blocks that a
 * second store (its own clients) finds and reads bit-exact; a value
 * corrupted in the cluster is a miss, counted, and deleted; writes are
 * once (SET NX); namespaces are found through the cluster. Skips (77)
 * without redis-server. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/key.h"
#include "base/mem.h"
#include "io/rcluster.h"
#include "io/rcluster_wire.h"
#include "rc_util.h"
#include "remote_fx.h"
#include "tiers/remote.h"
#include "tiers/store.h"

#define NL 3
#define EACH 6000 /* not a multiple of 4096: the padding is exercised */

static char g_url[128];
static uint64_t g_run; /* keys unique to this run: a cluster may outlive it */

typedef struct blk {
  kvt_key key;
  uint8_t kv[NL][2 * EACH];
  const uint8_t *ptr[NL];
  kvt_store_rec rec;
} blk;

static void blk_make(blk *b, uint32_t pos) {
  b->key = rfx_key(g_run);
  for (int l = 0; l < NL; l++) {
    for (size_t i = 0; i < 2 * EACH; i++) b->kv[l][i] = (uint8_t)tu_rand();
    b->ptr[l] = b->kv[l];
  }
  b->rec = (kvt_store_rec){.key = b->key, .parent = rfx_key(g_run), .ns_seed = rfx_key(g_run),
                           .pos = pos, .n_layers = NL, .dtype = KVT_F16, .bytes_each = EACH,
                           .layers = b->ptr};
}

static kvt_store *store_open(kvt_mem *m, int rdonly) {
  kvt_store *s = NULL;
  char err[256] = "";
  kvt_store_config c = {.rdonly = rdonly, .remote_url = g_url, .remote_deadline_ms = 20000,
                        .remote_err = err, .remote_err_len = sizeof err};
  int rc = kvt_store_open(m, &c, &s);
  if (rc) fprintf(stderr, "open %s: %d %s\n", g_url, rc, err);
  assert_int_equal(rc, 0);
  assert_non_null(s);
  assert_string_equal(s->m->name, "remote");
  return s;
}

static void assert_layers(kvt_store *s, const blk *b) {
  rfx_assert_layers(s, &b->key, b->ptr, NL, EACH);
}

/* The value format alone: the cold record's header and seeded checksums. */
static void test_format(void **state) {
  (void)state;
  kvt_mem m;
  kvt_mem_init(&m, 0);
  static blk b;
  blk_make(&b, 7);
  uint8_t *v;
  size_t len;
  assert_int_equal(kvt_remote_encode(&m, &b.rec, &v, &len), 0);
  assert_int_equal(len, kvt_rec_header_len(NL) + NL * kvt_align4k(2 * EACH));
  kvt_cold_entry e;
  static kvt_cold_slice sl[KVT_MAX_LAYERS];
  assert_int_equal(kvt_remote_check(&b.key, v, len, &e, sl), 0);
  assert_int_equal(e.pos, 7);
  assert_true(kvt_key_eq(&e.ns_seed, &b.rec.ns_seed));
  static uint8_t k[EACH], vv[EACH];
  assert_int_equal(kvt_remote_decode(&m, v, &e, sl, 2, k, vv, EACH), 0);
  assert_memory_equal(k, b.kv[2], EACH);
  assert_memory_equal(vv, b.kv[2] + EACH, EACH);
  kvt_key other = rfx_key(g_run); /* the right bytes under another key */
  assert_int_equal(kvt_remote_check(&other, v, len, &e, sl), KVT_ECORRUPT);
  assert_int_equal(kvt_remote_check(&b.key, v, len - 4096, &e, sl), KVT_ECORRUPT);
  v[sl[1].rel_off + 100] ^= 1; /* one bit of layer 1's payload */
  assert_int_equal(kvt_remote_check(&b.key, v, len, &e, sl), KVT_ECORRUPT);
  v[sl[1].rel_off + 100] ^= 1;
  v[KVT_REC_H_POS] ^= 1;       /* the header's own checksum */
  assert_int_equal(kvt_remote_check(&b.key, v, len, &e, sl), KVT_ECORRUPT);
  kvt_mem_free(&m, KVT_MEM_OTHER, v, len);
  assert_int_equal(kvt_mem_total(&m), 0);
  kvt_mem_fini(&m);
}

/* The value in parts (sent in place by a diskless writer): the same bytes
 * as the encoded copy, each layer's K||V the record's own payload (not a
 * copy), the 4 KiB grid's padding zeros. */
static void test_parts(void **state) {
  (void)state;
  kvt_mem m;
  kvt_mem_init(&m, 0);
  static blk b;
  blk_make(&b, 9);
  uint8_t *v, *hdr;
  size_t len, hl, plen;
  assert_int_equal(kvt_remote_encode(&m, &b.rec, &v, &len), 0);
  struct iovec iov[1 + 2 * NL];
  int n = 0;
  assert_int_equal(kvt_remote_parts_max(NL), 1 + 2 * NL);
  assert_int_equal(kvt_remote_encode_parts(&m, &b.rec, &hdr, &hl, iov, &n, &plen), 0);
  assert_int_equal(plen, len);
  assert_int_equal(hl, kvt_rec_header_len(NL));
  assert_int_equal(n, 1 + 2 * NL); /* EACH leaves padding after every layer */
  assert_ptr_equal(iov[0].iov_base, hdr);
  size_t at = 0;
  for (int i = 0; i < n; i++) {
    assert_true(at + iov[i].iov_len <= len);
    assert_memory_equal(v + at, iov[i].iov_base, iov[i].iov_len);
    at += iov[i].iov_len;
  }
  assert_int_equal(at, len);
  for (int l = 0; l < NL; l++) assert_ptr_equal(iov[1 + 2 * l].iov_base, b.kv[l]);
  kvt_mem_free(&m, KVT_MEM_OTHER, v, len);
  kvt_mem_free(&m, KVT_MEM_OTHER, hdr, hl);
  assert_int_equal(kvt_mem_total(&m), 0);
  kvt_mem_fini(&m);
}

static size_t g_settled;
static void settled(void *arg, size_t from, size_t to, int rc) {
  (void)arg;
  assert_int_equal(rc, 0);
  g_settled += to - from;
}

/* A diskless writer posts; another store finds the chain and reads it
 * bit-exact; a key never written is a miss. */
static void test_share(void **state) {
  (void)state;
  kvt_mem m1, m2;
  kvt_mem_init(&m1, 0);
  kvt_mem_init(&m2, 0);
  kvt_store *a = store_open(&m1, 0), *b = store_open(&m2, 1);
  static blk bl[3];
  kvt_store_rec recs[3];
  for (int i = 0; i < 3; i++) {
    blk_make(&bl[i], (uint32_t)i);
    recs[i] = bl[i].rec;
  }
  kvt_key keys[4] = {bl[0].key, bl[1].key, bl[2].key, rfx_key(g_run)};
  assert_int_equal(kvt_store_prefix(b, keys, 4), 0);
  size_t posted = 0;
  g_settled = 0;
  assert_int_equal(kvt_store_post(a, recs, 3, &posted, settled, NULL), 0);
  assert_int_equal(kvt_store_drain(a), 0);
  assert_int_equal(posted, 3);
  assert_int_equal(g_settled, 3);
  assert_int_equal(kvt_store_prefix(b, keys, 4), 3);
  assert_int_equal(kvt_store_find(b, &keys[1]), 0);
  assert_int_equal(kvt_store_find(b, &keys[3]), KVT_ENOTFOUND);
  for (int i = 0; i < 3; i++) assert_layers(b, &bl[i]);
  static uint8_t k[EACH], v[EACH];
  assert_int_equal(kvt_store_read_layer(b, &keys[3], 0, k, v, EACH), KVT_ENOTFOUND);
  /* a batch: two blocks' layers in one submit */
  kvt_store_read rq[2] = {{.key = keys[0], .layer = 1, .k_out = k, .v_out = v, .bytes_each = EACH},
                          {.key = keys[3], .layer = 0, .k_out = k, .v_out = v, .bytes_each = EACH}};
  kvt_store_batch *bt;
  assert_int_equal(kvt_store_read_submit(b, rq, 2, &bt), 0);
  kvt_store_read_wait(bt);
  assert_int_equal(rq[0].status, 0);
  assert_int_equal(rq[1].status, KVT_ENOTFOUND);
  kvt_remote_counts c;
  assert_int_equal(kvt_store_remote_counts(b, &c, NULL), 0);
  assert_int_equal(c.hits, 3);   /* one GET per block, whatever the layers read */
  assert_int_equal(c.misses, 2);
  assert_int_equal(c.checksum_failures, 0);
  assert_true(c.bytes_in >= 3 * 2 * EACH * NL);
  /* written once: a second writer of the same blocks skips them */
  assert_int_equal(kvt_store_post(a, recs, 3, &posted, NULL, NULL), 0);
  assert_int_equal(kvt_store_drain(a), 0);
  assert_int_equal(kvt_store_remote_counts(a, &c, NULL), 0);
  assert_int_equal(c.writes, 3);
  assert_int_equal(c.write_exists, 3);
  rfx_close_stores(a, &m1, b, &m2);
}

/* A diskless writer sends a record's payloads in place, one part a layer
 * (and its padding): a record of more parts than the wire takes for one
 * argument (2 * 600 + 1 > RC_WIRE_IOV_MAX) is sent as a copy instead, and
 * stored like any other, not failed with the rest of its batch. */
static void test_many_layers(void **state) {
  (void)state;
  enum { ML = 600, ME = 100 };
  assert_true(kvt_remote_parts_max(ML) > RC_WIRE_IOV_MAX);
  kvt_mem m1, m2;
  kvt_mem_init(&m1, 0);
  kvt_mem_init(&m2, 0);
  kvt_store *a = store_open(&m1, 0), *b = store_open(&m2, 1);
  uint8_t *kv = malloc((size_t)ML * 2 * ME);
  const uint8_t **ptr = malloc(ML * sizeof *ptr);
  assert_true(kv && ptr);
  for (size_t i = 0; i < (size_t)ML * 2 * ME; i++) kv[i] = (uint8_t)tu_rand();
  for (int l = 0; l < ML; l++) ptr[l] = kv + (size_t)l * 2 * ME;
  static blk small; /* a record of NL layers in the same batch */
  blk_make(&small, 1);
  kvt_store_rec recs[2] = {{.key = rfx_key(g_run), .parent = rfx_key(g_run),
                            .ns_seed = rfx_key(g_run), .pos = 0, .n_layers = ML,
                            .dtype = KVT_F16, .bytes_each = ME, .layers = ptr},
                           small.rec};
  size_t posted = 0;
  g_settled = 0;
  assert_int_equal(kvt_store_post(a, recs, 2, &posted, settled, NULL), 0);
  assert_int_equal(kvt_store_drain(a), 0);
  assert_int_equal(posted, 2);
  assert_int_equal(g_settled, 2);
  rfx_assert_layers(b, &recs[0].key, ptr, ML, ME);
  assert_layers(b, &small);
  free(kv);
  free(ptr);
  rfx_close_stores(a, &m1, b, &m2);
}

/* A value overwritten in the cluster with bytes that fail the check
 * (one bit of a slice) is a miss, counted, and deleted. */
static void test_corrupt(void **state) {
  (void)state;
  kvt_mem m, mc;
  kvt_mem_init(&m, 0);
  kvt_mem_init(&mc, 0);
  static blk b;
  blk_make(&b, 0);
  uint8_t *bad;
  size_t len;
  assert_int_equal(kvt_remote_encode(&mc, &b.rec, &bad, &len), 0);
  bad[kvt_rec_header_len(NL) + 2 * 4096 + 17] ^= 0x40; /* layer 0 or 1, inside its payload */
  char k[KVT_REMOTE_KEY_MAX];
  size_t kl = kvt_remote_block_key(&b.key, k);
  kvt_rc_config cfg = {.url = g_url, .deadline_ms = 20000};
  kvt_rc *rc;
  assert_int_equal(kvt_rc_open(&cfg, &rc, NULL, 0), 0);
  kvt_rc_cmd c[2] = {{.op = KVT_RC_DEL, .key = k, .key_len = kl},
                     {.op = KVT_RC_SET_NX, .key = k, .key_len = kl, .val = bad, .val_len = len}};
  assert_int_equal(kvt_rc_exec(rc, c, 2), 0);
  assert_int_equal(c[1].status, KVT_RC_OK);
  kvt_store *s = store_open(&m, 0);
  static uint8_t kk[EACH], vv[EACH];
  assert_int_equal(kvt_store_prefix(s, &b.key, 1), 1); /* there, until read */
  assert_int_equal(kvt_store_read_layer(s, &b.key, 2, kk, vv, EACH), KVT_ENOTFOUND);
  kvt_remote_counts n;
  assert_int_equal(kvt_store_remote_counts(s, &n, NULL), 0);
  assert_int_equal(n.checksum_failures, 1);
  assert_int_equal(n.deleted, 1);
  assert_int_equal(n.misses, 1);
  assert_int_equal(n.hits, 0);
  kvt_rc_cmd ex = {.op = KVT_RC_EXISTS, .key = k, .key_len = kl};
  assert_int_equal(kvt_rc_exec(rc, &ex, 1), 0);
  assert_int_equal(ex.status, KVT_RC_OK);
  assert_int_equal(ex.n, 0);                      /* deleted */
  assert_int_equal(kvt_store_prefix(s, &b.key, 1), 0);
  /* stored again by a writer, it reads */
  size_t posted;
  assert_int_equal(kvt_store_post(s, &b.rec, 1, &posted, NULL, NULL), 0);
  assert_int_equal(kvt_store_drain(s), 0);
  assert_layers(s, &b);
  kvt_rc_close(rc);
  kvt_store_close(s);
  kvt_mem_free(&mc, KVT_MEM_OTHER, bad, len);
  assert_int_equal(kvt_mem_total(&m), 0);
  kvt_mem_fini(&m);
  kvt_mem_fini(&mc);
}

typedef struct ns_seen {
  kvt_key seed;
  int found;
} ns_seen;

static int ns_fn(void *arg, const kvt_key *seed, const uint8_t *enc, size_t len) {
  ns_seen *s = arg;
  if (kvt_key_eq(seed, &s->seed)) {
    assert_int_equal(len, 5);
    assert_memory_equal(enc, "model", 5);
    s->found++;
  }
  return 0;
}

/* A namespace put by one store is found by another; put twice, once. */
static void test_namespaces(void **state) {
  (void)state;
  kvt_mem m1, m2;
  kvt_mem_init(&m1, 0);
  kvt_mem_init(&m2, 0);
  kvt_store *a = store_open(&m1, 0), *b = store_open(&m2, 1);
  ns_seen seen = {.seed = rfx_key(g_run)};
  assert_int_equal(kvt_store_ns_each(b, ns_fn, &seen), 0);
  assert_int_equal(seen.found, 0);
  assert_int_equal(kvt_store_ns_put(a, &seen.seed, (const uint8_t *)"model", 5), 0);
  assert_int_equal(kvt_store_ns_put(a, &seen.seed, (const uint8_t *)"model", 5), 0);
  assert_int_equal(kvt_store_ns_each(b, ns_fn, &seen), 0);
  assert_int_equal(seen.found, 1);
  rfx_close_stores(a, &m1, b, &m2); /* now also: nothing left allocated */
}

int main(void) {
  rcu_require_redis();
  snprintf(g_url, sizeof g_url, "redis://127.0.0.1:%d", rcu_base_port(7100));
  g_run = tu_seed() * 0x9e3779b97f4a7c15ull;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_format),
      cmocka_unit_test(test_parts),
      cmocka_unit_test(test_share),
      cmocka_unit_test(test_many_layers),
      cmocka_unit_test(test_corrupt),
      cmocka_unit_test(test_namespaces),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
