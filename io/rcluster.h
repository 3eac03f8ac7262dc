/* rcluster.h - a Redis Cluster client for the remote tier, on hiredis 0.14
 * (which has no cluster API): key slots (CRC16 with {hash tags}), the slot
 * map from CLUSTER SLOTS, MOVED/ASK redirects, one connection per node and
 * a batch call that pipelines per node, every wait bounded by a deadline.
 * A kvt_rc is used by one thread at a time: it is not synchronized. */
#ifndef KVT_RCLUSTER_H
#define KVT_RCLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define KVT_RC_SLOTS 16384u
#define KVT_RC_NODES_MAX 64u   /* masters a client tracks (seeds included) */
#define KVT_RC_SEEDS_MAX 16u   /* host:port pairs in one URL */
#define KVT_RC_BATCH_MAX 65536u /* commands in one kvt_rc_exec */

/* Limits; a field left 0 takes the default in brackets. */
typedef struct kvt_rc_config {
  /* redis://[user[:password]@]host:port[,host:port...]: seed nodes; user
   * and password may be %XX-encoded. Never echoed in an error message. */
  const char *url;
  /* Overrides the URL's password. NULL: the URL's, else the environment
   * variable KVTIER_REDIS_PASSWORD, else no AUTH. Copied at open. */
  const char *password;
  uint32_t connect_timeout_ms;    /* one TCP connect + AUTH [200] */
  uint32_t command_timeout_ms;    /* a node that makes no progress this long is failed [500] */
  uint32_t deadline_ms;           /* one whole kvt_rc_exec, retries included [1000] */
  uint32_t max_inflight_requests; /* per node, sent and not yet answered [256] */
  uint64_t max_inflight_bytes;    /* per node, request bytes sent and not yet answered [8 MiB] */
  uint32_t max_retries;           /* rounds after a node failure or TRYAGAIN [3] */
  uint32_t backoff_ms;            /* before retry round r: backoff_ms << (r-1) [10] */
  uint32_t max_redirects;         /* MOVED/ASK hops of one command [5] */
  uint64_t max_value_bytes;       /* SET values refused above, GET replies refused above [64 MiB] */
  uint32_t node_retry_ms;         /* a node that timed out or refused a connect is
                                   * skipped (unavailable) this long [1000] */
} kvt_rc_config;

typedef enum kvt_rc_op {
  KVT_RC_GET = 1, /* GET key */
  KVT_RC_SET_NX,  /* SET key val NX: write once */
  KVT_RC_DEL,     /* DEL key */
  KVT_RC_EXISTS,  /* EXISTS key */
} kvt_rc_op;

/* Per-command results. */
typedef enum kvt_rc_status {
  KVT_RC_OK = 0,      /* GET found (out/out_len), SET NX stored, DEL/EXISTS answered (n) */
  KVT_RC_NIL,         /* GET: no such key; SET NX: the key exists, nothing written */
  KVT_RC_UNAVAILABLE, /* no node answered in time (down, slow, failing over,
                       * no route, deadline): a miss on the serving path */
  KVT_RC_EREPLY,      /* the node answered with an error or an unexpected reply type */
  KVT_RC_ETOOBIG,     /* value above max_value_bytes (SET not sent; GET reply dropped) */
} kvt_rc_status;

/* One command of a batch. Zero the array before its first kvt_rc_exec;
 * a later exec on the same array releases what the previous one left. */
typedef struct kvt_rc_cmd {
  /* in: owned by the caller, read during kvt_rc_exec only */
  kvt_rc_op op;
  const void *key;
  size_t key_len;
  const void *val;  /* KVT_RC_SET_NX */
  size_t val_len;
  /* KVT_RC_SET_NX, instead of val: the value is the parts iov[0..iovcnt)
   * one after the other (val_len their sum), each of 16 KiB or more sent
   * from where it is (a record's header and its payloads in place). */
  const struct iovec *val_iov;
  int val_iovcnt;
  /* out */
  kvt_rc_status status;
  long long n;       /* DEL: keys removed; EXISTS: 0 or 1 */
  const void *out;   /* GET: the value, owned by the client until
                      * kvt_rc_release() or the next exec on this array */
  size_t out_len;
  void *reply_;      /* private: the hiredis reply holding out */
} kvt_rc_cmd;

/* Counters since open; monotonic. */
typedef struct kvt_rc_stats {
  uint64_t batches, commands;
  uint64_t moved, ask;        /* redirects followed */
  uint64_t map_refreshes;     /* CLUSTER SLOTS fetched and applied */
  uint64_t connects;          /* connections made (AUTH included) */
  uint64_t node_failures;     /* connection lost, refused or failed AUTH */
  uint64_t timeouts;          /* a node silent for command_timeout_ms, or the deadline hit */
  uint64_t retries;           /* commands sent again after a failure or TRYAGAIN */
  uint64_t unavailable;       /* commands that ended KVT_RC_UNAVAILABLE */
  uint64_t bytes_out, bytes_in; /* values written / read (payload bytes only) */
  uint64_t values_reused;     /* values read into a buffer kvt_rc_recycle kept */
} kvt_rc_stats;

typedef struct kvt_rc kvt_rc;

/* Parse the URL, connect to a seed (in order) and load the slot map.
 * Returns 0 and *out; KVT_ENULL; KVT_EOPTION (bad URL or limit, err says
 * which part, never the password); KVT_EAUTH (a node refused the
 * credentials); -ECONNREFUSED, -ETIMEDOUT or another -errno when no seed
 * gave a slot map. err (may be NULL) receives a message on failure. */
int kvt_rc_open(const kvt_rc_config *cfg, kvt_rc **out, char *err, size_t err_len);
/* Close every connection and wipe the password. NULL is accepted. */
void kvt_rc_close(kvt_rc *rc);

/* Run n commands: grouped by node, pipelined per node (all nodes at
 * once), redirects followed, failures retried with backoff, all within
 * deadline_ms. Each command ends with a status; no command is left
 * pending. Returns 0; KVT_ENULL; KVT_ECOUNT (n == 0 or above
 * KVT_RC_BATCH_MAX); KVT_EOPTION (unknown op, NULL key with key_len > 0,
 * NULL val with val_len > 0 and no val_iov, val_iov parts whose lengths do
 * not add up to val_len) - then no command was sent. */
int kvt_rc_exec(kvt_rc *rc, kvt_rc_cmd *cmds, size_t n);
/* Free the GET values of a batch (out becomes NULL). */
void kvt_rc_release(kvt_rc_cmd *cmds, size_t n);
/* kvt_rc_release, the values' buffers kept by rc (bounded) for the
 * replies of later execs: a value is then read into pages already
 * mapped. rc NULL: kvt_rc_release. */
void kvt_rc_recycle(kvt_rc *rc, kvt_rc_cmd *cmds, size_t n);

/* The key's slot: CRC16-XMODEM of the key, or of the part between the
 * first '{' and the next '}' when that part is not empty, mod 16384. */
uint16_t kvt_rc_slot(const void *key, size_t len);
/* CRC16-XMODEM (poly 0x1021, init 0), as Redis Cluster uses it. */
uint16_t kvt_rc_crc16(const void *buf, size_t len);

void kvt_rc_stats_get(const kvt_rc *rc, kvt_rc_stats *st);
/* The master serving slot in the current map, "host:port" into buf;
 * 0, or KVT_ENOTFOUND when no node serves it. For tests and tools. */
int kvt_rc_slot_node(const kvt_rc *rc, uint16_t slot, char *buf, size_t len);
/* The master serving slot in the current map as an index below
 * KVT_RC_NODES_MAX (the same node, the same index, while the client is
 * open), or -1 when none is known: for a caller that spreads its commands
 * over the masters. Not synchronized, as every call on rc. */
int kvt_rc_slot_master(const kvt_rc *rc, uint16_t slot);
/* max_inflight_bytes of the following execs (0: the value rc was opened with): a caller
 * that sends a larger batch keeps each node's pipeline at this depth. */
void kvt_rc_set_window(kvt_rc *rc, uint64_t bytes);
/* Load the slot map again now (bounded by deadline_ms). 0, or the error
 * of the last node tried. */
int kvt_rc_refresh(kvt_rc *rc);

#endif
