/* rcluster_wire.c - RESP requests and replies of the cluster client's
 * rounds (io/rcluster_wire.h). hiredis's formatting copies every value into
 * its output buffer, which is then shifted after each partial send, and its
 * reader copies a bulk string twice (into the reader's buffer, then into the
 * reply): at 2 MiB values those copies cost more than the socket. */
#include "io/rcluster_wire.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define RC_WIRE_IOV 256     /* segments per sendmsg (IOV_MAX is 1024) */
#define RC_WIRE_LEN_DIGITS 18 /* a reply's length or integer: below 10^18 */

char *rc_pool_take(rc_pool *p, size_t len) {
  size_t best = p->n;
  for (size_t i = 0; i < p->n; i++)
    if (p->cap[i] >= len && (best == p->n || p->cap[i] < p->cap[best])) best = i;
  if (best == p->n) return NULL;
  char *b = p->buf[best];
  p->taken++;
  p->bytes -= p->cap[best];
  p->n--;
  p->buf[best] = p->buf[p->n];
  p->cap[best] = p->cap[p->n];
  return b;
}

void rc_pool_give(rc_pool *p, char *buf, size_t cap) {
  if (!buf) return;
  if (p->n == RC_POOL_N || cap > RC_POOL_BYTES - p->bytes) {
    free(buf);
    return;
  }
  p->buf[p->n] = buf;
  p->cap[p->n++] = cap;
  p->bytes += cap;
}

void rc_pool_free(rc_pool *p) {
  for (size_t i = 0; i < p->n; i++) free(p->buf[i]);
  p->n = p->bytes = 0;
}

void rc_wire_reset(rc_wire *w) {
  w->seg_n = w->seg_at = w->seg_done = 0;
  w->arena_len = 0;
  w->in_pos = w->in_len = 0;
  if (w->bulk) freeReplyObject(w->bulk);
  w->bulk = NULL;
  w->bulk_got = 0;
  w->bulk_skip = 0;
}

void rc_wire_free(rc_wire *w) {
  rc_wire_reset(w);
  free(w->seg);
  free(w->arena);
  free(w->in);
  memset(w, 0, sizeof *w);
}

/* ------------------------------------------------------------ out */

static int seg_room(rc_wire *w, size_t n) {
  if (w->seg_n + n <= w->seg_cap) return 0;
  size_t cap = w->seg_cap ? 2 * w->seg_cap : 64;
  while (cap < w->seg_n + n) cap *= 2;
  rc_seg *s = realloc(w->seg, cap * sizeof *s);
  if (!s) return -ENOMEM;
  w->seg = s;
  w->seg_cap = cap;
  return 0;
}

static int arena_room(rc_wire *w, size_t n) {
  if (w->arena_len + n <= w->arena_cap) return 0;
  size_t cap = w->arena_cap ? 2 * w->arena_cap : 4096;
  while (cap < w->arena_len + n) cap *= 2;
  char *a = realloc(w->arena, cap);
  if (!a) return -ENOMEM;
  w->arena = a;
  w->arena_cap = cap;
  return 0;
}

/* Append bytes to the arena, growing the last segment when it is the
 * arena's tail. Room was made by the caller. */
static void put_copy(rc_wire *w, const void *p, size_t n) {
  rc_seg *last = w->seg_n > w->seg_at ? &w->seg[w->seg_n - 1] : NULL;
  if (!last || last->ext || last->off + last->len != w->arena_len)
    last = &w->seg[w->seg_n++], *last = (rc_seg){NULL, w->arena_len, 0};
  memcpy(w->arena + w->arena_len, p, n);
  w->arena_len += n;
  last->len += n;
}

static void put_fmt(rc_wire *w, char type, size_t n) {
  char b[32];
  int k = snprintf(b, sizeof b, "%c%zu\r\n", type, n);
  put_copy(w, b, (size_t)k);
}

/* One argument's bytes: referenced from RC_WIRE_ZCOPY_MIN up, else copied.
 * Room was made by the caller. */
static void put_arg(rc_wire *w, const void *p, size_t n) {
  if (n >= RC_WIRE_ZCOPY_MIN) w->seg[w->seg_n++] = (rc_seg){p, 0, n};
  else if (n) put_copy(w, p, n);
}

int rc_wire_cmd_iov(rc_wire *w, int argc, const void *const *argv, const size_t *lens,
                    int iov_arg, const struct iovec *iov, int iovcnt) {
  if (argc <= 0 || argc > RC_WIRE_ARGS_MAX || (iov_arg >= 0 && iovcnt < 0)) return -EINVAL;
  if (w->seg_at == w->seg_n) { /* all sent: start over */
    w->seg_n = w->seg_at = w->seg_done = 0;
    w->arena_len = 0;
  }
  size_t copied = 32, segs = 1;
  for (int i = 0; i < argc; i++) {
    int parts = i == iov_arg ? iovcnt : 1;
    copied += 32 + 2;
    for (int j = 0; j < parts; j++) {
      size_t n = i == iov_arg ? iov[j].iov_len : lens[i];
      if (n < RC_WIRE_ZCOPY_MIN) copied += n;
      else segs += 2;
    }
    segs += 1;
  }
  if (seg_room(w, segs) || arena_room(w, copied)) return -ENOMEM;
  put_fmt(w, '*', (size_t)argc);
  for (int i = 0; i < argc; i++) {
    put_fmt(w, '$', lens[i]); /* an iov argument's length: the sum of its parts */
    if (i != iov_arg) put_arg(w, argv[i], lens[i]);
    else
      for (int j = 0; j < iovcnt; j++) put_arg(w, iov[j].iov_base, iov[j].iov_len);
    put_copy(w, "\r\n", 2);
  }
  return 0;
}

int rc_wire_cmd(rc_wire *w, int argc, const void *const *argv, const size_t *lens) {
  return rc_wire_cmd_iov(w, argc, argv, lens, -1, NULL, 0);
}

int rc_wire_pending(const rc_wire *w) { return w->seg_at < w->seg_n; }

int rc_wire_send(rc_wire *w, int fd) {
  int sent = 0;
  while (w->seg_at < w->seg_n) {
    struct iovec iov[RC_WIRE_IOV];
    int k = 0;
    for (size_t s = w->seg_at; s < w->seg_n && k < RC_WIRE_IOV; s++, k++) {
      const rc_seg *g = &w->seg[s];
      const char *p = g->ext ? g->ext : w->arena + g->off;
      size_t skip = s == w->seg_at ? w->seg_done : 0;
      iov[k] = (struct iovec){(void *)(p + skip), g->len - skip};
    }
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
    ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return sent;
      return -1;
    }
    sent = 1;
    size_t left = (size_t)n;
    while (left && w->seg_at < w->seg_n) {
      size_t rest = w->seg[w->seg_at].len - w->seg_done;
      if (left < rest) {
        w->seg_done += left;
        left = 0;
      } else {
        left -= rest;
        w->seg_at++;
        w->seg_done = 0;
      }
    }
  }
  return sent;
}

/* ------------------------------------------------------------ in */

int rc_wire_recv(rc_wire *w, int fd) {
  if (!w->in && !(w->in = malloc(RC_WIRE_IN_BYTES))) return -1;
  char *dst;
  size_t room;
  if (w->bulk && !w->bulk_skip && w->in_pos == w->in_len && w->bulk_got < w->bulk->len) {
    /* the rest of a value: into its own buffer, no copy through `in` */
    w->in_pos = w->in_len = 0;
    dst = w->bulk->str + w->bulk_got;
    room = w->bulk->len - w->bulk_got;
  } else {
    if (w->in_pos) { /* keep the unparsed tail at the start */
      memmove(w->in, w->in + w->in_pos, w->in_len - w->in_pos);
      w->in_len -= w->in_pos;
      w->in_pos = 0;
    }
    dst = w->in + w->in_len;
    room = RC_WIRE_IN_BYTES - w->in_len;
    if (!room) return 0; /* a full buffer without a reply: rc_wire_reply refuses it */
  }
  for (;;) {
    ssize_t r = recv(fd, dst, room, MSG_DONTWAIT);
    if (r > 0) {
      if (dst == w->in + w->in_len) w->in_len += (size_t)r;
      else w->bulk_got += (size_t)r;
      return 1;
    }
    if (r == 0) return -1;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
  }
}

/* A decimal of at most RC_WIRE_LEN_DIGITS digits, optional '-'. */
static int parse_ll(const char *p, size_t n, long long *v) {
  int neg = n && *p == '-';
  p += neg, n -= (size_t)neg;
  if (!n || n > RC_WIRE_LEN_DIGITS) return -1;
  long long x = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] < '0' || p[i] > '9') return -1;
    x = x * 10 + (p[i] - '0');
  }
  *v = neg ? -x : x;
  return 0;
}

static redisReply *reply_new(int type) {
  redisReply *r = calloc(1, sizeof *r);
  if (r) r->type = type;
  return r;
}

/* The value bytes of the bulk in progress that `in` holds, then its CRLF. */
static int bulk_step(rc_wire *w, redisReply **out) {
  redisReply *b = w->bulk;
  size_t avail = w->in_len - w->in_pos, need = b->len - w->bulk_got;
  size_t take = avail < need ? avail : need;
  if (take && !w->bulk_skip) memcpy(b->str + w->bulk_got, w->in + w->in_pos, take);
  w->in_pos += take;
  w->bulk_got += take;
  if (w->bulk_got < b->len || w->in_len - w->in_pos < 2) return 0;
  if (memcmp(w->in + w->in_pos, "\r\n", 2)) return -1;
  w->in_pos += 2;
  *out = b;
  w->bulk = NULL;
  w->bulk_got = 0;
  w->bulk_skip = 0;
  return 1;
}

/* A bulk header "$<n>": NIL, or the start of a value. */
static int bulk_start(rc_wire *w, const char *p, size_t n, size_t max_bulk, redisReply **out) {
  long long len;
  if (parse_ll(p, n, &len) || len < -1) return -1;
  if (len == -1) return (*out = reply_new(REDIS_REPLY_NIL)) ? 1 : -1;
  redisReply *b = reply_new(REDIS_REPLY_STRING);
  if (!b) return -1;
  b->len = (size_t)len;
  w->bulk_skip = (uint64_t)len > max_bulk;
  if (!w->bulk_skip && w->pool) b->str = rc_pool_take(w->pool, b->len + 1);
  if (!w->bulk_skip && !b->str && !(b->str = malloc(b->len + 1))) {
    free(b);
    return -1;
  }
  if (b->str) b->str[b->len] = 0;
  w->bulk = b;
  w->bulk_got = 0;
  return bulk_step(w, out);
}

int rc_wire_reply(rc_wire *w, size_t max_bulk, redisReply **out) {
  *out = NULL;
  if (w->bulk) return bulk_step(w, out);
  const char *p = w->in + w->in_pos;
  size_t avail = w->in_len - w->in_pos;
  const char *nl = avail ? memchr(p, '\n', avail) : NULL;
  if (!nl) return avail >= RC_WIRE_IN_BYTES ? -1 : 0;
  size_t n = (size_t)(nl - p); /* the line with its '\r', without '\n' */
  if (n < 2 || p[n - 1] != '\r') return -1;
  w->in_pos += n + 1;
  const char *body = p + 1;
  size_t blen = n - 2;
  redisReply *r = NULL;
  long long v;
  switch (p[0]) {
  case '+':
  case '-':
    r = reply_new(p[0] == '+' ? REDIS_REPLY_STATUS : REDIS_REPLY_ERROR);
    if (r && !(r->str = malloc(blen + 1))) {
      free(r);
      r = NULL;
    }
    if (!r) return -1;
    memcpy(r->str, body, blen);
    r->str[blen] = 0;
    r->len = blen;
    break;
  case ':':
    if (parse_ll(body, blen, &v) || !(r = reply_new(REDIS_REPLY_INTEGER))) return -1;
    r->integer = v;
    break;
  case '$': return bulk_start(w, body, blen, max_bulk, out);
  default: return -1; /* arrays and RESP3 types are not replies of the data path */
  }
  *out = r;
  return 1;
}
