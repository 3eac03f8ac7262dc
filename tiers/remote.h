/* remote.h - the remote tier on a Redis Cluster (docs/remote.md): token
 * blocks as one value each, in the cold tier's record format, read and
 * checked on demand, written once in the background. store_remote.c puts
 * it behind the store interface, above an optional local cold tier. */
#ifndef KVT_REMOTE_H
#define KVT_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "base/mem.h"
#include "io/rcluster.h"
#include "tiers/cold_record.h"
#include "tiers/store.h"

/* Record format: the cold tier's, with this generation in every slice's
 * checksum seed (a remote record has no segment; its generation says
 * "remote, format 1" so a slice copied from a segment does not pass). */
#define KVT_REMOTE_GEN 0x52454d3031ull /* "REM01" */
#define KVT_REMOTE_KEY_MAX 64u
#define KVT_REMOTE_NS_MAX 256u         /* namespaces in one cluster's directory */

/* Key of token block `key`: "kvt1:b:<32 hex>". Returns its length. */
size_t kvt_remote_block_key(const kvt_key *key, char *buf);
/* Key of directory entry i of the namespaces: "kvt1:{ns}:<i>" (one slot). */
size_t kvt_remote_ns_key(uint32_t i, char *buf);

/* The value of a token block: header, then each layer's K||V raw on the
 * 4 KiB grid. *out is allocated in m (KVT_MEM_OTHER, *len bytes). */
int kvt_remote_encode(kvt_mem *m, const kvt_store_rec *r, uint8_t **out, size_t *len);
/* The same value as parts to send from where they are: *hdr (allocated in
 * m, *hdr_len bytes) holds the header with the slices' checksums, then
 * each layer's K||V is r->layers[l] itself (which must not change or go
 * until the value is sent) and its padding to the grid a page of zeros.
 * iov has room for kvt_remote_parts_max(r->n_layers); *len the value's
 * bytes, the same bytes kvt_remote_encode builds. */
size_t kvt_remote_parts_max(uint32_t n_layers);
int kvt_remote_encode_parts(kvt_mem *m, const kvt_store_rec *r, uint8_t **hdr, size_t *hdr_len,
                            struct iovec *iov, int *n_iov, size_t *len);
/* Is the value v (len bytes) a whole record of key with every slice's
 * checksum right? 0, or KVT_ECORRUPT. e gets the header. */
int kvt_remote_check(const kvt_key *key, const uint8_t *v, size_t len, kvt_cold_entry *e,
                     kvt_cold_slice *sl);
/* Layer `layer` of a checked value into k_out/v_out (each bytes each). */
int kvt_remote_decode(kvt_mem *m, const uint8_t *v, const kvt_cold_entry *e, const kvt_cold_slice *sl,
                      uint32_t layer, void *k_out, void *v_out, size_t each);

/* Counters, monotonic (kvt_remote_stats in kvtier.h has the public copy). */
typedef struct kvt_remote_counts {
  uint64_t hits, misses, timeouts, checksum_failures, deleted;
  uint64_t bytes_in, bytes_out;
  uint64_t writes, write_exists, write_dropped, write_failures;
  uint64_t evictions;     /* GETs that found gone a block seen there before (remote.c) */
  uint64_t local_copies;  /* remote hits handed to the local cold tier */
  uint64_t write_cancelled; /* queued writes of removed blocks, not sent (queue_cancel) */
} kvt_remote_counts;

typedef struct kvt_remote kvt_remote;

typedef struct kvt_remote_cfg {
  const char *url, *password;  /* password NULL: the URL's or KVTIER_REDIS_PASSWORD */
  uint32_t deadline_ms;        /* one cluster call, retries included [1000] */
  uint64_t queue_bytes;        /* values waiting to be written, at most [64 MiB] */
  int rdonly;
} kvt_remote_cfg;

/* Connect (both clients) and start the writer. 0; KVT_EOPTION, KVT_EAUTH,
 * -errno as kvt_rc_open (err says why, never the password). */
int kvt_remote_open(kvt_mem *m, const kvt_remote_cfg *cfg, kvt_remote **out, char *err,
                    size_t err_len);
/* Write what is queued (each batch bounded by the deadline), stop, close. */
void kvt_remote_close(kvt_remote *r);

/* Queue recs for SET NX. settled (may be NULL) is called from the
 * writer thread once each is written or given up: rc 0 only when the
 * cluster stored it (or already had it), else why not (-EIO, -EAGAIN,
 * -ENOMEM; the failure is also counted). flags: KVT_REMOTE_WAIT: block
 * until the queue has room; else a record that does not fit is dropped
 * (counted) and settled at once. KVT_REMOTE_IN_PLACE (with settled): the
 * caller keeps each record's payloads unchanged until its settled call,
 * and they are sent from where they are (only the header is built);
 * else each record is copied into its value. The queue's bound counts
 * whole values either way. Returns how many were queued. */
#define KVT_REMOTE_WAIT 1
#define KVT_REMOTE_IN_PLACE 2
size_t kvt_remote_post(kvt_remote *r, const kvt_store_rec *recs, size_t n, int flags,
                       kvt_store_settled_fn settled, void *arg);
/* Wait until the queue is empty and the writer idle. */
void kvt_remote_drain(kvt_remote *r);
/* Tests only: hold the writer (hold 1: it takes no job; 2: it takes a
 * batch, then waits before sending it; 0: it runs; -1: unchanged); busy:
 * a batch taken; waited: how many removes so far waited for a batch in
 * flight. */
void kvt_remote_test_hold(kvt_remote *r, int hold, int *busy, uint64_t *waited);
/* Tests only: jobs queued, not yet taken by the writer. */
size_t kvt_remote_test_queued(kvt_remote *r);
/* Tests only: the keys of the batch the writer has taken and not yet had
 * answered (at most cap into keys); how many there are. */
size_t kvt_remote_test_flight(kvt_remote *r, kvt_key *keys, size_t cap);

/* How many of keys[0..n) lead that the cluster has (EXISTS, pipelined). */
size_t kvt_remote_prefix(kvt_remote *r, const kvt_key *keys, size_t n);
/* The checked value of key: 0 and *v (allocated in m, *len bytes; free
 * with kvt_mem_free(m, KVT_MEM_OTHER, ...)), or KVT_ENOTFOUND (absent,
 * unreachable, or a bad value, which is then deleted). */
int kvt_remote_get(kvt_remote *r, const kvt_key *key, uint8_t **v, size_t *len);
/* Read one layer: KVT_ENOTFOUND on any miss. Uses a small cache of whole
 * values, so reading the layers of a block one by one costs one GET. */
int kvt_remote_read_layer(kvt_remote *r, const kvt_key *key, uint32_t layer, void *k_out,
                          void *v_out, size_t each);
/* The values of keys[0..n) (distinct), GET in pipelines of up to 16:
 * fn(arg, key, value, len, header, slices) for each one found and checked,
 * called with the read lock held (value valid during the call only);
 * the others are misses. */
typedef void (*kvt_remote_got_fn)(void *arg, const kvt_key *key, const uint8_t *v, size_t len,
                                  const kvt_cold_entry *e, const kvt_cold_slice *sl);
void kvt_remote_get_many(kvt_remote *r, const kvt_key *keys, size_t n, kvt_remote_got_fn fn,
                         void *arg);
/* A remove cancels the queued writes of its keys (settled 0: as if
 * written, then removed) and waits for a batch in flight that writes one
 * (answered before its settled calls, which may remove), so no SET of a
 * removed key lands after its DEL. */
int kvt_remote_remove(kvt_remote *r, const kvt_key *key);
/* DEL keys[0..n), pipelined (batches of 64, each within the deadline);
 * how many the cluster had. Best effort: an unreachable node keeps its. */
uint64_t kvt_remote_remove_many(kvt_remote *r, const kvt_key *keys, size_t n);

/* Namespaces in the cluster's directory: put one (already there: 0);
 * call fn for each (stops at its non-zero return). */
int kvt_remote_ns_put(kvt_remote *r, const kvt_key *seed, const uint8_t *enc, size_t len);
int kvt_remote_ns_each(kvt_remote *r, int (*fn)(void *, const kvt_key *, const uint8_t *, size_t),
                       void *arg);

void kvt_remote_counts_get(kvt_remote *r, kvt_remote_counts *c, kvt_rc_stats *rc);
/* The counters of a store opened with a remote tier (store_remote.c):
 * 0, or KVT_ENOTFOUND when s has none. rc (may be NULL): the client's. */
int kvt_store_remote_counts(kvt_store *s, kvt_remote_counts *c, kvt_rc_stats *rc);
/* Tests only: the remote tier of a store opened with one, or NULL. */
kvt_remote *kvt_store_remote_of(kvt_store *s);

#endif
