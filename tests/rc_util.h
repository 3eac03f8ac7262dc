/* rc_util.h - helpers of the Redis Cluster tests (test_rcluster*.c): where
 * the cluster the ctest fixture started lives (env KVT_REDIS_PORT,
 * KVT_REDIS_DIR), a skip when redis-server is not installed, and admin
 * commands on one node through plain hiredis. The asserting helpers need
 * cmocka: include testutil.h first. */
#ifndef KVT_RC_UTIL_H
#define KVT_RC_UTIL_H

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

/* Exit 77 with the reason when redis-server is missing: the fixture could
 * not start a cluster. */
static inline void rcu_require_redis(void) {
  if (system("command -v redis-server >/dev/null 2>&1") != 0) {
    fprintf(stderr, "skip: redis-server not installed (apt-get install redis-server)\n");
    exit(77);
  }
}

static inline int rcu_base_port(int dflt) {
  const char *p = getenv("KVT_REDIS_PORT");
  return p && atoi(p) > 0 ? atoi(p) : dflt;
}

/* A blocking admin connection to 127.0.0.1:port (AUTH when pw). */
static inline redisContext *rcu_admin(int port, const char *pw) {
  struct timeval tv = {5, 0};
  redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (!c || c->err) {
    fprintf(stderr, "admin connect %d: %s\n", port, c ? c->errstr : "oom");
    if (c) redisFree(c);
    return NULL;
  }
  redisSetTimeout(c, tv);
  if (pw) {
    redisReply *r = redisCommand(c, "AUTH %s", pw);
    if (r) freeReplyObject(r);
  }
  return c;
}

/* A node: its port and its cluster id. */
typedef struct node_info {
  int port;
  char id[64];
} node_info;

/* One admin command on port that must not fail (an error reply is printed). */
static inline void rcu_admin_ok(int port, const char *fmt, ...) {
  redisContext *a = rcu_admin(port, NULL);
  assert_non_null(a);
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(a, fmt, ap);
  va_end(ap);
  assert_non_null(r);
  if (r->type == REDIS_REPLY_ERROR) fprintf(stderr, "port %d: %s\n", port, r->str);
  assert_int_not_equal(r->type, REDIS_REPLY_ERROR);
  freeReplyObject(r);
  redisFree(a);
}

/* The pid a node wrote in DIR/PORT/redis.pid; 0 if unknown. */
static inline pid_t rcu_node_pid(const char *dir, int port) {
  char path[512];
  snprintf(path, sizeof path, "%s/%d/redis.pid", dir, port);
  FILE *f = fopen(path, "r");
  long pid = 0;
  if (f) {
    if (fscanf(f, "%ld", &pid) != 1) pid = 0;
    fclose(f);
  }
  return (pid_t)pid;
}

#endif
