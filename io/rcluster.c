/* rcluster.c - Redis Cluster client (io/rcluster.h). hiredis 0.14 connects
 * and speaks AUTH and CLUSTER SLOTS; the data commands' requests and replies
 * go through rcluster_wire.c (values sent in place, read once); this file
 * does the routing, the per-node pipelines and every bound. Sockets are
 * non-blocking and all waiting is one poll() over the nodes of a batch, so
 * no call can block past the batch deadline; writes use send/sendmsg with
 * MSG_NOSIGNAL rather than hiredis's write(), so a node that died cannot
 * raise SIGPIPE. */
#include "io/rcluster.h"
#include "io/rcluster_wire.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "kvtier.h"

#define RC_HOST_MAX 128
#define RC_CRED_MAX 256
/* One recv() per readable event; hiredis's own read takes 16 KiB, four
 * system calls per 64 KiB value. */
#define RC_READ_BYTES (256u << 10)
#define RC_READS_PER_EVENT 8u /* reads of one node per poll, so the others get their turn */
#define RC_WINDOW_DEFAULT (8u << 20) /* max_inflight_bytes when the config leaves it 0 */

typedef struct rc_node {
  char host[RC_HOST_MAX];
  int port;
  redisContext *c;
  uint64_t down_until_ms; /* skipped (unavailable) until then */
  /* the current round: its slice of the queue array */
  uint32_t *q;            /* command indices, RC_ASK_BIT if ASKING goes first */
  size_t qn, sent, replied;
  uint64_t inflight_bytes;
  int asking_seen;        /* the ASKING reply of q[replied] was consumed */
  int failed;             /* failed in this round: the rest of its queue retries */
  uint64_t progress_ms;   /* last byte in or out, for command_timeout_ms */
  rc_wire w;              /* the rounds' requests and replies */
} rc_node;

#define RC_ASK_BIT 0x80000000u

enum { W_PENDING, W_DONE, W_REDIRECT, W_RETRY };

typedef struct rc_work {
  int16_t node;      /* target of this round, -1 none */
  int16_t ask_node;  /* ASK target for the next try, -1 none */
  uint8_t state;
  uint8_t redirects;
  uint64_t req_bytes;
} rc_work;

struct kvt_rc {
  kvt_rc_config cfg;
  uint64_t window_open; /* cfg.max_inflight_bytes as opened (kvt_rc_set_window's 0) */
  char user[RC_CRED_MAX];
  char pass[RC_CRED_MAX];
  int has_pass;
  rc_node nodes[KVT_RC_NODES_MAX];
  uint32_t n_nodes;
  uint32_t seeds[KVT_RC_SEEDS_MAX]; /* node indices of the URL's seeds */
  uint32_t n_seeds;
  int16_t slot_node[KVT_RC_SLOTS]; /* -1: no master known */
  int map_stale;
  rc_work *work;     /* scratch of the size of the largest batch */
  uint32_t *queue;
  size_t scratch_n;
  char *rbuf;        /* RC_READ_BYTES */
  rc_pool pool;      /* value buffers of released replies (kvt_rc_recycle) */
  kvt_rc_stats st;
};

/* ------------------------------------------------------------ slots */

uint16_t kvt_rc_crc16(const void *buf, size_t len) {
  const uint8_t *p = buf;
  uint16_t crc = 0;
  for (size_t i = 0; i < len; i++) {
    crc ^= (uint16_t)(p[i] << 8);
    for (int b = 0; b < 8; b++)
      crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
  }
  return crc;
}

uint16_t kvt_rc_slot(const void *key, size_t len) {
  const char *k = key;
  const char *open = len ? memchr(k, '{', len) : NULL;
  if (open) {
    size_t from = (size_t)(open - k) + 1;
    const char *close = memchr(k + from, '}', len - from);
    if (close && (size_t)(close - k) > from) /* "{}" hashes the whole key */
      return kvt_rc_crc16(k + from, (size_t)(close - k) - from) & (KVT_RC_SLOTS - 1);
  }
  return kvt_rc_crc16(k, len) & (KVT_RC_SLOTS - 1);
}

/* ------------------------------------------------------------ helpers */

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(uint64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

__attribute__((format(printf, 3, 4)))
static void set_err(char *err, size_t len, const char *fmt, ...) {
  if (!err || !len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
}

static void wipe(void *p, size_t n) {
  volatile unsigned char *v = p;
  while (n--) *v++ = 0;
}

/* ------------------------------------------------------------ nodes */

static int node_find(kvt_rc *rc, const char *host, int port) {
  for (uint32_t i = 0; i < rc->n_nodes; i++)
    if (rc->nodes[i].port == port && !strcmp(rc->nodes[i].host, host)) return (int)i;
  return -1;
}

/* The node's index, added when new; -1 when the table is full or the
 * host name too long. */
static int node_get(kvt_rc *rc, const char *host, size_t host_len, int port) {
  char h[RC_HOST_MAX];
  if (host_len == 0 || host_len >= sizeof h || port <= 0 || port > 65535) return -1;
  memcpy(h, host, host_len);
  h[host_len] = 0;
  int i = node_find(rc, h, port);
  if (i >= 0 || rc->n_nodes >= KVT_RC_NODES_MAX) return i;
  rc_node *nd = &rc->nodes[rc->n_nodes];
  memset(nd, 0, sizeof *nd);
  memcpy(nd->host, h, host_len + 1);
  nd->port = port;
  return (int)rc->n_nodes++;
}

static void node_drop(rc_node *nd) {
  if (nd->c) redisFree(nd->c);
  nd->c = NULL;
  rc_wire_reset(&nd->w);
}

static int node_out_pending(const rc_node *nd) {
  return sdslen(nd->c->obuf) || rc_wire_pending(&nd->w);
}

/* Send what the context has buffered, without blocking. -1 on error. */
static int node_flush(kvt_rc *rc, rc_node *nd, uint64_t t) {
  (void)rc;
  redisContext *c = nd->c;
  size_t len = sdslen(c->obuf);
  while (len) {
    ssize_t w = send(c->fd, c->obuf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -1;
    }
    nd->progress_ms = t;
    sdsrange(c->obuf, w, -1);
    len = sdslen(c->obuf);
  }
  int s = rc_wire_send(&nd->w, c->fd);
  if (s > 0) nd->progress_ms = t;
  return s < 0 ? -1 : 0;
}

/* Read what the socket holds (one recv, without blocking) into the
 * context's reply parser. -1 on error or end of stream. */
static int node_recv(kvt_rc *rc, rc_node *nd) {
  redisContext *c = nd->c;
  for (;;) {
    ssize_t r = recv(c->fd, rc->rbuf, RC_READ_BYTES, MSG_DONTWAIT);
    if (r > 0) return redisReaderFeed(c->reader, rc->rbuf, (size_t)r) == REDIS_OK ? 0 : -1;
    if (r == 0) return -1;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
  }
}

/* Wait for fd until the earlier of timeout_ms from now and deadline.
 * 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, uint64_t timeout_ms, uint64_t deadline) {
  for (;;) {
    uint64_t t = now_ms();
    uint64_t end = t + timeout_ms < deadline ? t + timeout_ms : deadline;
    if (t >= end) return 0;
    struct pollfd p = {fd, events, 0};
    int r = poll(&p, 1, (int)(end - t));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r;
    return 1;
  }
}

/* One command on one node, synchronously but bounded: used for AUTH and
 * CLUSTER SLOTS. Returns the reply (caller frees) or NULL. */
static redisReply *node_call(kvt_rc *rc, rc_node *nd, uint64_t deadline, int argc,
                             const char **argv, const size_t *lens) {
  redisContext *c = nd->c;
  if (redisAppendCommandArgv(c, argc, argv, lens) != REDIS_OK) return NULL;
  uint64_t t = now_ms();
  nd->progress_ms = t;
  while (sdslen(c->obuf)) {
    if (node_flush(rc, nd, now_ms()) < 0) return NULL;
    if (sdslen(c->obuf) && wait_fd(c->fd, POLLOUT, rc->cfg.command_timeout_ms, deadline) <= 0)
      return NULL;
  }
  for (;;) {
    void *reply = NULL;
    if (redisGetReplyFromReader(c, &reply) != REDIS_OK) return NULL;
    if (reply) return reply;
    if (wait_fd(c->fd, POLLIN, rc->cfg.command_timeout_ms, deadline) <= 0) return NULL;
    if (node_recv(rc, nd) < 0) return NULL;
  }
}

/* Connect (non-blocking, within connect_timeout_ms and the deadline) and
 * AUTH. 0; -ETIMEDOUT, -ECONNREFUSED or another -errno; KVT_EAUTH. A node
 * in its down period returns -EAGAIN without trying. */
static int node_connect(kvt_rc *rc, rc_node *nd, uint64_t deadline) {
  nd->w.pool = &rc->pool;
  if (nd->c && !nd->c->err) return 0;
  node_drop(nd);
  uint64_t t = now_ms();
  if (t < nd->down_until_ms) return -EAGAIN;
  int rv = -ETIMEDOUT;
  redisContext *c = redisConnectNonBlock(nd->host, nd->port);
  if (!c) return -ENOMEM;
  nd->c = c;
  if (c->err) {
    rv = -ECONNREFUSED;
    goto fail;
  }
  int w = wait_fd(c->fd, POLLOUT, rc->cfg.connect_timeout_ms, deadline);
  if (w <= 0) goto fail;
  int soerr = 0;
  socklen_t sl = sizeof soerr;
  if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr) {
    rv = soerr ? -soerr : -errno;
    goto fail;
  }
  if (rc->has_pass) {
    const char *argv[3] = {"AUTH", rc->user, rc->pass};
    size_t lens[3] = {4, strlen(rc->user), strlen(rc->pass)};
    int argc = 3;
    if (!rc->user[0]) { /* the default user: AUTH password */
      argv[1] = rc->pass;
      lens[1] = lens[2];
      argc = 2;
    }
    uint64_t cd = t + rc->cfg.connect_timeout_ms < deadline ? t + rc->cfg.connect_timeout_ms : deadline;
    redisReply *r = node_call(rc, nd, cd, argc, argv, lens);
    int ok = r && r->type == REDIS_REPLY_STATUS;
    rv = r ? KVT_EAUTH : -ETIMEDOUT;
    if (r) freeReplyObject(r);
    if (!ok) goto fail;
  }
  rc->st.connects++;
  nd->progress_ms = now_ms();
  return 0;
fail:
  node_drop(nd);
  rc->st.node_failures++;
  nd->down_until_ms = now_ms() + rc->cfg.node_retry_ms;
  return rv;
}

/* ------------------------------------------------------------ slot map */

/* An error or status reply whose first word is word. */
static int starts(const redisReply *r, const char *word) {
  size_t n = strlen(word);
  return r->len >= n && !memcmp(r->str, word, n) && (r->len == n || r->str[n] == ' ');
}

static int reply_int(const redisReply *r, long long *v) {
  if (r->type != REDIS_REPLY_INTEGER) return -1;
  *v = r->integer;
  return 0;
}

/* Apply a CLUSTER SLOTS reply: [[start, end, [ip, port, id], replicas...]...].
 * An empty ip means the node that answered. 0, or -1 on a malformed reply
 * (the map is then left as it was). */
static int map_apply(kvt_rc *rc, const redisReply *r, const rc_node *from) {
  if (r->type != REDIS_REPLY_ARRAY) return -1;
  int16_t map[KVT_RC_SLOTS];
  for (uint32_t s = 0; s < KVT_RC_SLOTS; s++) map[s] = -1;
  for (size_t i = 0; i < r->elements; i++) {
    const redisReply *e = r->element[i];
    long long a, b, port;
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || reply_int(e->element[0], &a) ||
        reply_int(e->element[1], &b) || a < 0 || b < a || b >= KVT_RC_SLOTS)
      return -1;
    const redisReply *m = e->element[2];
    if (m->type != REDIS_REPLY_ARRAY || m->elements < 2 || m->element[0]->type != REDIS_REPLY_STRING ||
        reply_int(m->element[1], &port))
      return -1;
    const char *host = m->element[0]->str;
    size_t hl = m->element[0]->len;
    if (hl == 0 || (hl == 1 && host[0] == '?')) {
      host = from->host;
      hl = strlen(host);
    }
    int nd = node_get(rc, host, hl, (int)port);
    if (nd < 0) continue; /* table full: those slots have no route (unavailable) */
    for (long long s = a; s <= b; s++) map[s] = (int16_t)nd;
  }
  memcpy(rc->slot_node, map, sizeof map);
  return 0;
}

/* Fetch the map from the first node that gives one: nodes that are up
 * first, then the rest (seeds included). 0, or the last node's error. */
static int map_refresh(kvt_rc *rc, uint64_t deadline) {
  int rv = -ECONNREFUSED;
  for (int pass = 0; pass < 2; pass++) {
    for (uint32_t i = 0; i < rc->n_nodes && now_ms() < deadline; i++) {
      rc_node *nd = &rc->nodes[i];
      if ((pass == 0) != (nd->c != NULL && !nd->c->err)) continue;
      int e = node_connect(rc, nd, deadline);
      if (e) {
        if (e != -EAGAIN) rv = e;
        continue;
      }
      const char *argv[2] = {"CLUSTER", "SLOTS"};
      size_t lens[2] = {7, 5};
      redisReply *r = node_call(rc, nd, deadline, 2, argv, lens);
      if (!r) {
        node_drop(nd);
        rv = -ETIMEDOUT;
        continue;
      }
      int ok = map_apply(rc, r, nd) == 0;
      int noauth = r->type == REDIS_REPLY_ERROR && (starts(r, "NOAUTH") || starts(r, "WRONGPASS"));
      freeReplyObject(r);
      if (ok) {
        rc->map_stale = 0;
        rc->st.map_refreshes++;
        return 0;
      }
      rv = noauth ? KVT_EAUTH : -EPROTO;
    }
  }
  return rv;
}

int kvt_rc_refresh(kvt_rc *rc) {
  if (!rc) return KVT_ENULL;
  return map_refresh(rc, now_ms() + rc->cfg.deadline_ms);
}

/* ------------------------------------------------------------ open */

/* %XX-decode src[0..len) into dst (size cap). -1 on a bad escape or overflow. */
static int hex_digit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

static int url_decode(const char *src, size_t len, char *dst, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    int ch = (unsigned char)src[i];
    if (ch == '%') {
      if (len - i < 3) return -1;
      int hi = hex_digit(src[i + 1]), lo = hex_digit(src[i + 2]);
      if (hi < 0 || lo < 0 || (hi | lo) == 0) return -1; /* no %00: credentials are C strings */
      ch = hi * 16 + lo;
      i += 2;
    }
    if (o + 1 >= cap) return -1;
    dst[o++] = (char)ch;
  }
  dst[o] = 0;
  return 0;
}

static int url_parse(kvt_rc *rc, const char *url, char *err, size_t err_len) {
  static const char scheme[] = "redis://";
  if (strncmp(url, scheme, sizeof scheme - 1)) {
    set_err(err, err_len, "remote URL: does not start with redis://");
    return KVT_EOPTION;
  }
  const char *p = url + sizeof scheme - 1;
  const char *at = strrchr(p, '@');
  if (at) {
    const char *colon = memchr(p, ':', (size_t)(at - p));
    size_t ul = colon ? (size_t)(colon - p) : (size_t)(at - p);
    if (url_decode(p, ul, rc->user, sizeof rc->user) < 0) {
      set_err(err, err_len, "remote URL: bad or too long user name");
      return KVT_EOPTION;
    }
    if (colon) {
      if (url_decode(colon + 1, (size_t)(at - colon - 1), rc->pass, sizeof rc->pass) < 0) {
        set_err(err, err_len, "remote URL: bad or too long password");
        return KVT_EOPTION;
      }
      rc->has_pass = 1;
    } else if (rc->user[0]) { /* redis://user@host: user without a password is no AUTH */
      set_err(err, err_len, "remote URL: user name without a password");
      return KVT_EOPTION;
    }
    p = at + 1;
  }
  int k = 0;
  while (*p) {
    k++;
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *colon = len ? memrchr(p, ':', len) : NULL;
    char *pe = NULL;
    long port = colon ? strtol(colon + 1, &pe, 10) : 0;
    if (!colon || colon == p || pe != p + len || colon + 1 == pe || port <= 0 || port > 65535) {
      set_err(err, err_len, "remote URL: seed %d is not host:port (port 1-65535)", k);
      return KVT_EOPTION;
    }
    if (rc->n_seeds >= KVT_RC_SEEDS_MAX) {
      set_err(err, err_len, "remote URL: more than %u seeds", KVT_RC_SEEDS_MAX);
      return KVT_EOPTION;
    }
    int nd = node_get(rc, p, (size_t)(colon - p), (int)port);
    if (nd < 0) {
      set_err(err, err_len, "remote URL: host name of seed %d too long", k);
      return KVT_EOPTION;
    }
    rc->seeds[rc->n_seeds++] = (uint32_t)nd;
    if (!end) break;
    p = end + 1;
    if (!*p) {
      set_err(err, err_len, "remote URL: empty seed after seed %d", k);
      return KVT_EOPTION;
    }
  }
  if (!rc->n_seeds) {
    set_err(err, err_len, "remote URL: no host:port");
    return KVT_EOPTION;
  }
  return 0;
}

/* Words for the errors open can meet (io/ does not call up into
 * kvt_strerror, and strerror is not thread-safe). */
static const char *err_name(int e) {
  switch (e) {
  case -ECONNREFUSED: return "connection refused";
  case -ETIMEDOUT: return "timed out";
  case -EPROTO: return "unexpected reply to CLUSTER SLOTS";
  case -EHOSTUNREACH: return "host unreachable";
  case -ENOMEM: return "out of memory";
  default: return "connection failed";
  }
}

static void config_defaults(kvt_rc_config *c) {
  if (!c->connect_timeout_ms) c->connect_timeout_ms = 200;
  if (!c->command_timeout_ms) c->command_timeout_ms = 500;
  if (!c->deadline_ms) c->deadline_ms = 1000;
  if (!c->max_inflight_requests) c->max_inflight_requests = 256;
  if (!c->max_inflight_bytes) c->max_inflight_bytes = RC_WINDOW_DEFAULT;
  if (!c->max_retries) c->max_retries = 3;
  if (!c->backoff_ms) c->backoff_ms = 10;
  if (!c->max_redirects) c->max_redirects = 5;
  if (!c->max_value_bytes) c->max_value_bytes = 64u << 20;
  if (!c->node_retry_ms) c->node_retry_ms = 1000;
}

int kvt_rc_open(const kvt_rc_config *cfg, kvt_rc **out, char *err, size_t err_len) {
  if (err && err_len) err[0] = 0;
  if (!cfg || !out || !cfg->url) return KVT_ENULL;
  *out = NULL;
  kvt_rc *rc = calloc(1, sizeof *rc);
  if (!rc) return -ENOMEM;
  rc->rbuf = malloc(RC_READ_BYTES);
  if (!rc->rbuf) {
    free(rc);
    return -ENOMEM;
  }
  rc->cfg = *cfg;
  rc->cfg.url = NULL; /* not kept: it may hold the password */
  rc->cfg.password = NULL;
  config_defaults(&rc->cfg);
  rc->window_open = rc->cfg.max_inflight_bytes;
  for (uint32_t s = 0; s < KVT_RC_SLOTS; s++) rc->slot_node[s] = -1;
  int e = url_parse(rc, cfg->url, err, err_len);
  const char *pw = cfg->password ? cfg->password : (rc->has_pass ? NULL : getenv("KVTIER_REDIS_PASSWORD"));
  if (!e && pw) {
    if (strlen(pw) >= sizeof rc->pass) {
      set_err(err, err_len, "remote password longer than %d bytes", RC_CRED_MAX - 1);
      e = KVT_EOPTION;
    } else {
      strcpy(rc->pass, pw);
      rc->has_pass = 1;
    }
  }
  if (!e && rc->cfg.deadline_ms > 600000u) {
    set_err(err, err_len, "remote deadline_ms above %d", 600000);
    e = KVT_EOPTION;
  }
  if (!e) {
    /* seeds only at first, so an error names a seed */
    uint64_t deadline = now_ms() + rc->cfg.deadline_ms;
    for (uint32_t i = 0; i < rc->n_seeds; i++) {
      rc_node *nd = &rc->nodes[rc->seeds[i]];
      e = node_connect(rc, nd, deadline);
      if (e == KVT_EAUTH) {
        set_err(err, err_len, "remote %s:%d refused AUTH (wrong user or password)", nd->host, nd->port);
        break;
      }
      if (e) continue;
      e = map_refresh(rc, deadline);
      if (!e) break;
    }
    if (e == KVT_EAUTH && !(err && err[0]))
      set_err(err, err_len, "remote: the cluster requires AUTH (no password given, or refused)");
    else if (e && e != KVT_EAUTH)
      set_err(err, err_len, "remote: no seed gave a slot map (last: %s, code %d)", err_name(e), e);
  }
  if (e) {
    kvt_rc_close(rc);
    return e;
  }
  *out = rc;
  return 0;
}

void kvt_rc_close(kvt_rc *rc) {
  if (!rc) return;
  for (uint32_t i = 0; i < rc->n_nodes; i++) {
    node_drop(&rc->nodes[i]);
    rc_wire_free(&rc->nodes[i].w);
  }
  free(rc->work);
  free(rc->queue);
  free(rc->rbuf);
  rc_pool_free(&rc->pool);
  wipe(rc->pass, sizeof rc->pass);
  free(rc);
}

void kvt_rc_stats_get(const kvt_rc *rc, kvt_rc_stats *st) {
  if (!rc || !st) return;
  *st = rc->st;
  st->values_reused = rc->pool.taken;
}

int kvt_rc_slot_node(const kvt_rc *rc, uint16_t slot, char *buf, size_t len) {
  if (!rc || !buf) return KVT_ENULL;
  if (slot >= KVT_RC_SLOTS || rc->slot_node[slot] < 0) return KVT_ENOTFOUND;
  const rc_node *nd = &rc->nodes[rc->slot_node[slot]];
  snprintf(buf, len, "%s:%d", nd->host, nd->port);
  return 0;
}

int kvt_rc_slot_master(const kvt_rc *rc, uint16_t slot) {
  return rc && slot < KVT_RC_SLOTS ? rc->slot_node[slot] : -1;
}

void kvt_rc_set_window(kvt_rc *rc, uint64_t bytes) {
  if (rc) rc->cfg.max_inflight_bytes = bytes ? bytes : rc->window_open;
}

/* ------------------------------------------------------------ replies */

void kvt_rc_release(kvt_rc_cmd *cmds, size_t n) {
  if (!cmds) return;
  for (size_t i = 0; i < n; i++) {
    if (cmds[i].reply_) freeReplyObject(cmds[i].reply_);
    cmds[i].reply_ = NULL;
    cmds[i].out = NULL;
    cmds[i].out_len = 0;
  }
}

void kvt_rc_recycle(kvt_rc *rc, kvt_rc_cmd *cmds, size_t n) {
  if (!cmds) return;
  for (size_t i = 0; rc && i < n; i++) {
    redisReply *r = cmds[i].reply_;
    if (r && r->type == REDIS_REPLY_STRING && r->str) {
      rc_pool_give(&rc->pool, r->str, r->len + 1);
      r->str = NULL;
    }
  }
  kvt_rc_release(cmds, n);
}

static void cmd_finish(kvt_rc *rc, kvt_rc_cmd *c, rc_work *w, kvt_rc_status s) {
  c->status = s;
  w->state = W_DONE;
  if (s == KVT_RC_UNAVAILABLE) rc->st.unavailable++;
}


/* "MOVED 3999 127.0.0.1:6381": the target node's index, -1 if unparsable. */
static int redirect_target(kvt_rc *rc, const redisReply *r, long *slot) {
  char buf[RC_HOST_MAX + 64];
  if (r->len >= sizeof buf) return -1;
  memcpy(buf, r->str, r->len);
  buf[r->len] = 0;
  char *sp = strchr(buf, ' ');
  char *end = NULL;
  if (!sp) return -1;
  *slot = strtol(sp + 1, &end, 10);
  if (end == sp + 1 || *end != ' ' || *slot < 0 || *slot >= (long)KVT_RC_SLOTS) return -1;
  char *hp = end + 1;
  char *colon = strrchr(hp, ':');
  if (!colon) return -1;
  long port = strtol(colon + 1, &end, 10);
  if (*end || port <= 0 || port > 65535) return -1;
  return node_get(rc, hp, (size_t)(colon - hp), (int)port);
}

/* A reply to command i. Takes ownership of r. */
static void reply_handle(kvt_rc *rc, kvt_rc_cmd *c, rc_work *w, redisReply *r) {
  if (r->type == REDIS_REPLY_ERROR) {
    long slot;
    if (starts(r, "MOVED") || starts(r, "ASK")) {
      int moved = starts(r, "MOVED");
      int nd = redirect_target(rc, r, &slot);
      if (nd < 0 || w->redirects >= rc->cfg.max_redirects) {
        cmd_finish(rc, c, w, nd < 0 ? KVT_RC_EREPLY : KVT_RC_UNAVAILABLE);
      } else {
        w->redirects++;
        w->state = W_REDIRECT;
        if (moved) {
          rc->slot_node[slot] = (int16_t)nd;
          rc->map_stale = 1;
          w->ask_node = -1;
          rc->st.moved++;
        } else {
          w->ask_node = (int16_t)nd;
          rc->st.ask++;
        }
      }
    } else if (starts(r, "TRYAGAIN") || starts(r, "CLUSTERDOWN") || starts(r, "LOADING") ||
               starts(r, "MASTERDOWN")) {
      w->state = W_RETRY;
      rc->map_stale = 1;
    } else {
      cmd_finish(rc, c, w, KVT_RC_EREPLY);
    }
    freeReplyObject(r);
    return;
  }
  kvt_rc_status s = KVT_RC_EREPLY;
  switch (c->op) {
  case KVT_RC_GET:
    if (r->type == REDIS_REPLY_NIL) {
      s = KVT_RC_NIL;
    } else if (r->type == REDIS_REPLY_STRING) {
      if (r->len > rc->cfg.max_value_bytes) {
        s = KVT_RC_ETOOBIG;
      } else {
        c->reply_ = r;
        c->out = r->str;
        c->out_len = r->len;
        rc->st.bytes_in += r->len;
        r = NULL;
        s = KVT_RC_OK;
      }
    }
    break;
  case KVT_RC_SET_NX:
    if (r->type == REDIS_REPLY_NIL) s = KVT_RC_NIL;
    else if (r->type == REDIS_REPLY_STATUS && r->len == 2 && !memcmp(r->str, "OK", 2)) {
      s = KVT_RC_OK;
      rc->st.bytes_out += c->val_len;
    }
    break;
  case KVT_RC_DEL:
  case KVT_RC_EXISTS:
    if (r->type == REDIS_REPLY_INTEGER) {
      c->n = r->integer;
      s = KVT_RC_OK;
    }
    break;
  }
  if (r) freeReplyObject(r);
  cmd_finish(rc, c, w, s);
}

/* ------------------------------------------------------------ one round */

/* Queue the command (after ASKING when asked): 0, or -1 out of memory,
 * when the connection is out of step and must be failed. */
static int cmd_append(rc_node *nd, const kvt_rc_cmd *c, int asking) {
  static const char *const name[] = {"", "GET", "SET", "DEL", "EXISTS"};
  /* GET/DEL/EXISTS key, or SET key val NX; the value is sent in place */
  const void *argv[4] = {name[c->op], c->key ? c->key : "", c->val ? c->val : "", "NX"};
  size_t lens[4] = {strlen(name[c->op]), c->key_len, c->val_len, 2};
  if (asking) {
    const void *a[1] = {"ASKING"};
    size_t al[1] = {6};
    if (rc_wire_cmd(&nd->w, 1, a, al)) return -1;
  }
  int iov = c->op == KVT_RC_SET_NX && c->val_iov ? 2 : -1;
  return rc_wire_cmd_iov(&nd->w, c->op == KVT_RC_SET_NX ? 4 : 2, argv, lens, iov, c->val_iov,
                         c->val_iovcnt) ? -1 : 0;
}

/* The node failed mid-round: the connection is out of step, so close it;
 * commands it has not answered are tried again next round. */
enum { F_COUNT = 1, F_TIMEOUT = 2, F_DOWN = 4 };

static void node_fail(kvt_rc *rc, rc_node *nd, rc_work *work, int how) {
  node_drop(nd);
  nd->failed = 1;
  rc->map_stale = 1;
  if (how & F_COUNT) rc->st.node_failures++;
  if (how & F_TIMEOUT) rc->st.timeouts++;
  if (how & F_DOWN) nd->down_until_ms = now_ms() + rc->cfg.node_retry_ms;
  for (size_t k = nd->replied; k < nd->qn; k++) {
    rc_work *w = &work[nd->q[k] & ~RC_ASK_BIT];
    if (w->state == W_PENDING) w->state = W_RETRY;
  }
  nd->replied = nd->qn;
}

/* Append commands while the node's window allows; always at least one.
 * -1 when one could not be queued (no memory). */
static int node_fill(kvt_rc *rc, rc_node *nd, const kvt_rc_cmd *cmds, const rc_work *work) {
  while (nd->sent < nd->qn) {
    uint32_t i = nd->q[nd->sent] & ~RC_ASK_BIT;
    uint64_t b = work[i].req_bytes;
    size_t outstanding = nd->sent - nd->replied;
    if (outstanding && (outstanding >= rc->cfg.max_inflight_requests ||
                        nd->inflight_bytes + b > rc->cfg.max_inflight_bytes))
      break;
    if (cmd_append(nd, &cmds[i], (nd->q[nd->sent] & RC_ASK_BIT) != 0)) return -1;
    nd->inflight_bytes += b;
    nd->sent++;
  }
  return 0;
}

/* Hand each complete reply to its command. 0, or -1 on a protocol error. */
static int node_replies(kvt_rc *rc, rc_node *nd, kvt_rc_cmd *cmds, rc_work *work) {
  while (nd->replied < nd->sent) {
    redisReply *reply = NULL;
    int g = rc_wire_reply(&nd->w, rc->cfg.max_value_bytes, &reply);
    if (g <= 0) return g;
    uint32_t qi = nd->q[nd->replied];
    if ((qi & RC_ASK_BIT) && !nd->asking_seen) { /* +OK of ASKING */
      freeReplyObject(reply);
      nd->asking_seen = 1;
      continue;
    }
    uint32_t i = qi & ~RC_ASK_BIT;
    nd->asking_seen = 0;
    nd->inflight_bytes -= work[i].req_bytes;
    nd->replied++;
    reply_handle(rc, &cmds[i], &work[i], reply);
  }
  return 0;
}

/* Read what arrived (a few reads while the socket has more: a 2 MiB
 * value comes in pieces) and hand each complete reply to its command. */
static void node_read(kvt_rc *rc, rc_node *nd, kvt_rc_cmd *cmds, rc_work *work, uint64_t t) {
  for (unsigned k = 0; k < RC_READS_PER_EVENT && nd->replied < nd->sent; k++) {
    int r = rc_wire_recv(&nd->w, nd->c->fd);
    if (r < 0 || node_replies(rc, nd, cmds, work) < 0) {
      node_fail(rc, nd, work, F_COUNT);
      return;
    }
    if (!r) break;
    nd->progress_ms = t;
  }
}

/* Run every routed command of this round: all nodes at once, one poll. */
static void round_run(kvt_rc *rc, kvt_rc_cmd *cmds, rc_work *work, uint32_t *active,
                      uint32_t n_active, uint64_t deadline) {
  struct pollfd pfd[KVT_RC_NODES_MAX];
  uint32_t who[KVT_RC_NODES_MAX];
  for (uint32_t a = 0; a < n_active; a++) {
    rc_node *nd = &rc->nodes[active[a]];
    int e = node_connect(rc, nd, deadline);
    if (e == -EAGAIN) {
      /* in its down period and the map still routes here: a miss now,
       * rather than a wait for a node that failed a moment ago */
      for (size_t k = 0; k < nd->qn; k++) {
        uint32_t i = nd->q[k] & ~RC_ASK_BIT;
        cmd_finish(rc, &cmds[i], &work[i], KVT_RC_UNAVAILABLE);
      }
      nd->failed = 1;
    } else if (e) {
      nd->sent = nd->qn; /* nothing sent: all tried again next round */
      node_fail(rc, nd, work, 0); /* node_connect counted it */
    }
    nd->progress_ms = now_ms(); /* the command timeout runs from the round's start */
  }
  for (;;) {
    uint64_t t = now_ms();
    uint32_t np = 0;
    uint64_t wake = deadline;
    for (uint32_t a = 0; a < n_active; a++) {
      rc_node *nd = &rc->nodes[active[a]];
      if (nd->failed || nd->replied >= nd->qn) continue;
      if (t >= deadline) { /* the batch's time is up; the node may be fine */
        node_fail(rc, nd, work, F_TIMEOUT);
        continue;
      }
      if (t >= nd->progress_ms + rc->cfg.command_timeout_ms) { /* silent: stopped or hung */
        node_fail(rc, nd, work, F_COUNT | F_TIMEOUT | F_DOWN);
        continue;
      }
      if (node_fill(rc, nd, cmds, work) < 0 || node_flush(rc, nd, t) < 0) {
        node_fail(rc, nd, work, F_COUNT);
        continue;
      }
      if (nd->progress_ms + rc->cfg.command_timeout_ms < wake)
        wake = nd->progress_ms + rc->cfg.command_timeout_ms;
      pfd[np] = (struct pollfd){nd->c->fd, (short)(POLLIN | (node_out_pending(nd) ? POLLOUT : 0)), 0};
      who[np++] = active[a];
    }
    if (!np) {
      /* Every reply is in; a node that answered before reading all of its
       * requests (an error a server writes on accept, at maxclients) may
       * still hold unsent parts that point at the caller's values, which
       * are not valid once this returns (rcluster_wire.h): drop them. */
      for (uint32_t a = 0; a < n_active; a++) {
        rc_node *nd = &rc->nodes[active[a]];
        if (nd->c && rc_wire_pending(&nd->w)) node_drop(nd);
      }
      return;
    }
    int r = poll(pfd, np, wake > t ? (int)(wake - t) : 0);
    if (r < 0 && errno != EINTR) { /* not expected: drop the connections, the commands left retry */
      /* a node left as it is would keep unsent segments that point into
       * the caller's buffers and replies owed to this batch */
      for (uint32_t k = 0; k < np; k++) node_fail(rc, &rc->nodes[who[k]], work, F_COUNT);
      return;
    }
    t = now_ms();
    for (uint32_t k = 0; r > 0 && k < np; k++) {
      rc_node *nd = &rc->nodes[who[k]];
      if (!pfd[k].revents || nd->failed) continue;
      if ((pfd[k].revents & POLLOUT) && node_flush(rc, nd, t) < 0) {
        node_fail(rc, nd, work, F_COUNT);
        continue;
      }
      if (pfd[k].revents & (POLLIN | POLLHUP | POLLERR)) node_read(rc, nd, cmds, work, t);
    }
  }
}

/* ------------------------------------------------------------ exec */

/* The sum of a SET's value parts; SIZE_MAX when their count is bad. */
static size_t iov_len(const kvt_rc_cmd *c) {
  if (c->val_iovcnt < 0 || c->val_iovcnt > RC_WIRE_IOV_MAX) return SIZE_MAX;
  size_t n = 0;
  for (int i = 0; i < c->val_iovcnt; i++) {
    if (!c->val_iov[i].iov_base && c->val_iov[i].iov_len) return SIZE_MAX;
    n += c->val_iov[i].iov_len;
  }
  return n;
}

static int batch_check(const kvt_rc *rc, const kvt_rc_cmd *cmds, size_t n) {
  (void)rc;
  for (size_t i = 0; i < n; i++) {
    const kvt_rc_cmd *c = &cmds[i];
    if (c->op < KVT_RC_GET || c->op > KVT_RC_EXISTS) return KVT_EOPTION;
    if (!c->key && c->key_len) return KVT_EOPTION;
    if (c->op == KVT_RC_SET_NX && !c->val && !c->val_iov && c->val_len) return KVT_EOPTION;
    if (c->op == KVT_RC_SET_NX && c->val_iov && iov_len(c) != c->val_len) return KVT_EOPTION;
  }
  return 0;
}

static int scratch_grow(kvt_rc *rc, size_t n) {
  if (n <= rc->scratch_n) return 0;
  rc_work *w = realloc(rc->work, n * sizeof *w);
  if (!w) return -ENOMEM;
  rc->work = w;
  uint32_t *q = realloc(rc->queue, n * sizeof *q);
  if (!q) return -ENOMEM;
  rc->queue = q;
  rc->scratch_n = n;
  return 0;
}

/* Route the pending commands to nodes and lay out the per-node queues
 * (in batch order, so replies come back in the order sent). Returns the
 * number of active nodes written to active[]. */
static uint32_t round_plan(kvt_rc *rc, kvt_rc_cmd *cmds, rc_work *work, size_t n, uint32_t *active) {
  size_t count[KVT_RC_NODES_MAX] = {0};
  for (size_t i = 0; i < n; i++) {
    rc_work *w = &work[i];
    if (w->state == W_DONE) continue;
    w->state = W_PENDING;
    w->node = w->ask_node >= 0 ? w->ask_node : rc->slot_node[kvt_rc_slot(cmds[i].key, cmds[i].key_len)];
    if (w->node < 0) {
      w->state = W_RETRY; /* no route: a refreshed map may have one */
      rc->map_stale = 1;
      continue;
    }
    count[w->node]++;
  }
  uint32_t n_active = 0;
  size_t off = 0;
  for (uint32_t k = 0; k < rc->n_nodes; k++) {
    rc_node *nd = &rc->nodes[k];
    nd->q = rc->queue + off;
    nd->qn = nd->sent = nd->replied = 0;
    nd->inflight_bytes = 0;
    nd->asking_seen = nd->failed = 0;
    off += count[k];
    if (count[k]) active[n_active++] = k;
  }
  for (size_t i = 0; i < n; i++) {
    rc_work *w = &work[i];
    if (w->state != W_PENDING) continue;
    rc_node *nd = &rc->nodes[w->node];
    nd->q[nd->qn++] = (uint32_t)i | (w->ask_node >= 0 ? RC_ASK_BIT : 0);
    w->ask_node = -1; /* ASK holds for one try only */
  }
  return n_active;
}

int kvt_rc_exec(kvt_rc *rc, kvt_rc_cmd *cmds, size_t n) {
  if (!rc || !cmds) return KVT_ENULL;
  if (n == 0 || n > KVT_RC_BATCH_MAX) return KVT_ECOUNT;
  int e = batch_check(rc, cmds, n);
  if (e) return e;
  if ((e = scratch_grow(rc, n))) return e;
  uint64_t deadline = now_ms() + rc->cfg.deadline_ms;
  rc->st.batches++;
  rc->st.commands += n;
  kvt_rc_recycle(rc, cmds, n);
  rc_work *work = rc->work;
  for (size_t i = 0; i < n; i++) {
    kvt_rc_cmd *c = &cmds[i];
    c->n = 0;
    work[i] = (rc_work){.node = -1, .ask_node = -1, .state = W_PENDING};
    work[i].req_bytes = c->key_len + 32 + (c->op == KVT_RC_SET_NX ? c->val_len : 0);
    if (c->op == KVT_RC_SET_NX && c->val_len > rc->cfg.max_value_bytes)
      cmd_finish(rc, c, &work[i], KVT_RC_ETOOBIG);
  }
  uint32_t active[KVT_RC_NODES_MAX];
  uint32_t attempt = 0;
  for (;;) {
    if (rc->map_stale) map_refresh(rc, deadline);
    uint32_t n_active = round_plan(rc, cmds, work, n, active);
    round_run(rc, cmds, work, active, n_active, deadline);
    int retry = 0, redirect = 0;
    for (size_t i = 0; i < n; i++) {
      retry |= work[i].state == W_RETRY;
      redirect |= work[i].state == W_REDIRECT;
    }
    if (!retry && !redirect) break;
    uint64_t t = now_ms();
    if (t >= deadline || (retry && attempt >= rc->cfg.max_retries)) break;
    if (retry) {
      attempt++;
      uint64_t b = (uint64_t)rc->cfg.backoff_ms << (attempt - 1 < 16 ? attempt - 1 : 16);
      sleep_ms(t + b < deadline ? b : deadline - t);
      for (size_t i = 0; i < n; i++) rc->st.retries += work[i].state == W_RETRY;
    }
  }
  for (size_t i = 0; i < n; i++)
    if (work[i].state != W_DONE) cmd_finish(rc, &cmds[i], &work[i], KVT_RC_UNAVAILABLE);
  return 0;
}
