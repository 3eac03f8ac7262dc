/* rcluster_wire.h - the data path of the Redis Cluster client (private to
 * io/): requests queued as segments and written with sendmsg (a large
 * value is sent from the caller's buffer, never copied), and replies parsed
 * from the socket, a bulk string read into its own buffer, of exact size
 * or a kept one it fits (rc_pool; the bytes past the read buffer straight
 * from the socket). */
#ifndef KVT_RCLUSTER_WIRE_H
#define KVT_RCLUSTER_WIRE_H

#include <stddef.h>
#include <sys/uio.h>

#include <hiredis/hiredis.h>

#define RC_WIRE_IN_BYTES (256u << 10) /* read buffer: a reply line longer is refused */
#define RC_WIRE_ZCOPY_MIN (16u << 10) /* arguments from this size are sent in place */
#define RC_WIRE_ARGS_MAX 8
#define RC_WIRE_IOV_MAX 1024 /* parts of one argument */

typedef struct rc_seg {
  const char *ext; /* the caller's bytes; NULL: arena bytes at off */
  size_t off, len;
} rc_seg;

/* Value buffers of replies given back (kvt_rc_recycle), taken again by
 * the next bulk replies: a value read into memory already mapped, not
 * into fresh pages that recv must fault in (glibc returns a freed buffer
 * of this size to the kernel). At most RC_POOL_N buffers, RC_POOL_BYTES. */
#define RC_POOL_N 16
#define RC_POOL_BYTES (64u << 20)
typedef struct rc_pool {
  char *buf[RC_POOL_N];
  size_t cap[RC_POOL_N];
  size_t n, bytes;
  uint64_t taken; /* buffers taken again */
} rc_pool;

/* The smallest buffer of at least len bytes, taken out; NULL none. */
char *rc_pool_take(rc_pool *p, size_t len);
/* Keep buf (cap bytes) for a later reply, or free it when full. */
void rc_pool_give(rc_pool *p, char *buf, size_t cap);
void rc_pool_free(rc_pool *p);

typedef struct rc_wire {
  /* out: segments seg[at..n) not yet sent, done bytes of seg[at] sent */
  rc_seg *seg;
  size_t seg_n, seg_cap, seg_at, seg_done;
  char *arena;
  size_t arena_len, arena_cap;
  /* in: bytes in[pos..len) not yet parsed */
  char *in;
  size_t in_pos, in_len;
  redisReply *bulk; /* a bulk string being read, NULL none */
  size_t bulk_got;  /* its value bytes read so far */
  int bulk_skip;    /* above the size limit: read and dropped (str NULL) */
  rc_pool *pool;    /* the client's, NULL: every value malloc'd */
} rc_wire;

/* Forget what is queued and half read (the connection was closed). */
void rc_wire_reset(rc_wire *w);
void rc_wire_free(rc_wire *w);

/* Queue one command of argc arguments (at most RC_WIRE_ARGS_MAX). An
 * argument of RC_WIRE_ZCOPY_MIN bytes or more is referenced, not copied:
 * it must stay valid until rc_wire_pending is 0 or rc_wire_reset.
 * 0, or -ENOMEM (nothing queued). */
int rc_wire_cmd(rc_wire *w, int argc, const void *const *argv, const size_t *lens);
/* The same, argument iov_arg (-1: none) given as iov[0..iovcnt) instead
 * of argv[iov_arg] (lens[iov_arg] must be the sum of their lengths): each
 * part of RC_WIRE_ZCOPY_MIN bytes or more is referenced, the others copied. */
int rc_wire_cmd_iov(rc_wire *w, int argc, const void *const *argv, const size_t *lens,
                    int iov_arg, const struct iovec *iov, int iovcnt);
/* Bytes queued and not sent? */
int rc_wire_pending(const rc_wire *w);
/* Send what the socket takes without blocking: 1 something sent, 0
 * nothing (full or nothing queued), -1 error. */
int rc_wire_send(rc_wire *w, int fd);

/* Read what the socket holds without blocking: 1 bytes read, 0 none
 * (would block), -1 error or end of stream. */
int rc_wire_recv(rc_wire *w, int fd);
/* The next complete reply: 1 and *out (free with freeReplyObject), 0 more
 * bytes needed, -1 protocol error (an array, a bad line, a line longer than
 * the read buffer, no memory). A bulk string above max_bulk is read and
 * dropped: *out has type STRING, its len and str NULL. Types: STATUS,
 * ERROR, INTEGER, STRING, NIL. */
int rc_wire_reply(rc_wire *w, size_t max_bulk, redisReply **out);

#endif
