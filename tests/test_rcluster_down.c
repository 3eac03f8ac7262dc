/* test_rcluster_down.c - the Redis Cluster client (io/rcluster.c) against a
 * cluster of 3 masters without replicas that requires a password (ctest
 * fixture, KVT_REDIS_PORT, KVT_REDIS_TEST_PASSWORD): AUTH with the password
 * and with an ACL user, a wrong password refused with a message that does
 * not hold it; then a master stopped (SIGSTOP) and a master killed
 * (SIGKILL): their keys come back "unavailable", the other masters' keys
 * are served, and the call returns. Skipped (77) without redis-server. */
#include "testutil.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/rcluster.h"
#include "rc_util.h"

static int g_port;
static const char *g_pw;
static const char *g_dir;

static int open_url(const char *url, const char *pw, kvt_rc **rc, char *err, size_t err_len) {
  kvt_rc_config cfg = {.url = url, .password = pw, .deadline_ms = 20000,
                       .command_timeout_ms = 10000, .connect_timeout_ms = 5000};
  return kvt_rc_open(&cfg, rc, err, err_len);
}

static void url_with(char *buf, size_t len, const char *userinfo) {
  snprintf(buf, len, "redis://%s%s127.0.0.1:%d,127.0.0.1:%d", userinfo ? userinfo : "",
           userinfo ? "@" : "", g_port, g_port + 1);
}

/* SET NX then GET of one key through rc. */
static void roundtrip(kvt_rc *rc, const char *key) {
  char val[64];
  snprintf(val, sizeof val, "value of %s", key);
  kvt_rc_cmd c = {.op = KVT_RC_SET_NX, .key = key, .key_len = strlen(key), .val = val,
                  .val_len = strlen(val)};
  assert_int_equal(kvt_rc_exec(rc, &c, 1), 0);
  assert_int_equal(c.status, KVT_RC_OK);
  c.op = KVT_RC_GET;
  assert_int_equal(kvt_rc_exec(rc, &c, 1), 0);
  assert_int_equal(c.status, KVT_RC_OK);
  assert_int_equal(c.out_len, strlen(val));
  assert_memory_equal(c.out, val, c.out_len);
  kvt_rc_release(&c, 1);
}

/* ------------------------------------------------------------ AUTH */

static void test_auth_password(void **state) {
  (void)state;
  char url[512], ui[300], err[256];
  kvt_rc *rc = NULL;
  /* the default user, password in the URL (%-encoded: '-' as %2D) */
  char enc[256];
  size_t o = 0;
  for (const char *p = g_pw; *p && o + 4 < sizeof enc; p++)
    o += (size_t)snprintf(enc + o, sizeof enc - o, *p == '-' ? "%%2D" : "%c", *p);
  snprintf(ui, sizeof ui, ":%s", enc);
  url_with(url, sizeof url, ui);
  assert_int_equal(open_url(url, NULL, &rc, err, sizeof err), 0);
  roundtrip(rc, "auth:url");
  kvt_rc_close(rc);
  /* an ACL user */
  snprintf(ui, sizeof ui, "kvt:%s", g_pw);
  url_with(url, sizeof url, ui);
  assert_int_equal(open_url(url, NULL, &rc, err, sizeof err), 0);
  roundtrip(rc, "auth:acl");
  kvt_rc_close(rc);
  /* the password from the environment */
  url_with(url, sizeof url, NULL);
  setenv("KVTIER_REDIS_PASSWORD", g_pw, 1);
  assert_int_equal(open_url(url, NULL, &rc, err, sizeof err), 0);
  unsetenv("KVTIER_REDIS_PASSWORD");
  roundtrip(rc, "auth:env");
  kvt_rc_close(rc);
  /* and from the config */
  assert_int_equal(open_url(url, g_pw, &rc, err, sizeof err), 0);
  roundtrip(rc, "auth:cfg");
  kvt_rc_close(rc);
}

static void test_auth_refused(void **state) {
  (void)state;
  char url[512], err[256];
  kvt_rc *rc = (kvt_rc *)1;
  const char *wrong = "Wr0ng-Pass-Word-77";
  char ui[300];
  /* wrong password: default user, ACL user, config */
  const char *users[] = {"", "kvt"};
  for (int i = 0; i < 3; i++) {
    snprintf(ui, sizeof ui, "%s:%s", i < 2 ? users[i] : "kvt", wrong);
    url_with(url, sizeof url, i < 2 ? ui : "kvt:x");
    memset(err, 0, sizeof err);
    int e = open_url(url, i < 2 ? NULL : wrong, &rc, err, sizeof err);
    fprintf(stderr, "wrong password: %d %s\n", e, err);
    assert_int_equal(e, KVT_EAUTH);
    assert_null(rc);
    assert_true(strstr(err, "AUTH") != NULL);
    assert_null(strstr(err, wrong));
    assert_null(strstr(err, "Wr0ng"));
  }
  /* no password: the cluster says NOAUTH */
  url_with(url, sizeof url, NULL);
  unsetenv("KVTIER_REDIS_PASSWORD");
  int e = open_url(url, NULL, &rc, err, sizeof err);
  fprintf(stderr, "no password: %d %s\n", e, err);
  assert_int_equal(e, KVT_EAUTH);
  assert_true(strstr(err, "AUTH") != NULL);
  assert_string_equal(kvt_strerror(KVT_EAUTH), "a remote node refused the credentials (user or password)");
}

/* ------------------------------------------------------------ failures */

enum { NK = 300 };
static char g_keys[NK][32];
static int g_node_of[NK]; /* port */

static kvt_rc *open_ok(uint32_t cmd_timeout_ms, uint32_t node_retry_ms) {
  char url[512], err[256];
  url_with(url, sizeof url, NULL);
  kvt_rc_config cfg = {.url = url, .password = g_pw, .deadline_ms = 20000,
                       .command_timeout_ms = cmd_timeout_ms, .connect_timeout_ms = 5000,
                       .node_retry_ms = node_retry_ms};
  kvt_rc *rc = NULL;
  int e = kvt_rc_open(&cfg, &rc, err, sizeof err);
  if (e) fprintf(stderr, "open: %s\n", err);
  assert_int_equal(e, 0);
  return rc;
}

/* NK keys spread over the three masters, written once. */
static void keys_write(kvt_rc *rc, const char *tag) {
  kvt_rc_cmd c[NK];
  memset(c, 0, sizeof c);
  for (int i = 0; i < NK; i++) {
    snprintf(g_keys[i], sizeof g_keys[i], "%s:%d", tag, i);
    c[i] = (kvt_rc_cmd){.op = KVT_RC_SET_NX, .key = g_keys[i], .key_len = strlen(g_keys[i]),
                        .val = g_keys[i], .val_len = strlen(g_keys[i])};
    char who[64];
    assert_int_equal(kvt_rc_slot_node(rc, kvt_rc_slot(g_keys[i], strlen(g_keys[i])), who, sizeof who), 0);
    g_node_of[i] = atoi(strchr(who, ':') + 1);
  }
  assert_int_equal(kvt_rc_exec(rc, c, NK), 0);
  for (int i = 0; i < NK; i++) assert_int_equal(c[i].status, KVT_RC_OK);
}

/* GET every key; those on port `down` must be unavailable, the rest found. */
static void keys_check(kvt_rc *rc, int down) {
  kvt_rc_cmd c[NK];
  memset(c, 0, sizeof c);
  for (int i = 0; i < NK; i++)
    c[i] = (kvt_rc_cmd){.op = KVT_RC_GET, .key = g_keys[i], .key_len = strlen(g_keys[i])};
  assert_int_equal(kvt_rc_exec(rc, c, NK), 0);
  int n_down = 0;
  for (int i = 0; i < NK; i++) {
    if (g_node_of[i] == down) {
      assert_int_equal(c[i].status, KVT_RC_UNAVAILABLE);
      assert_null(c[i].out);
      n_down++;
    } else {
      if (c[i].status != KVT_RC_OK) fprintf(stderr, "key %d on %d: status %d\n", i, g_node_of[i], c[i].status);
      assert_int_equal(c[i].status, KVT_RC_OK);
      assert_int_equal(c[i].out_len, strlen(g_keys[i]));
      assert_memory_equal(c[i].out, g_keys[i], c[i].out_len);
    }
  }
  assert_true(n_down > 0);
  kvt_rc_release(c, NK);
}

static void wait_gone(pid_t pid) {
  for (int i = 0; i < 500 && kill(pid, 0) == 0; i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  assert_int_not_equal(kill(pid, 0), 0);
}

/* A master stopped by SIGSTOP accepts connections and answers nothing:
 * its keys end unavailable after the command timeout, the others are
 * served. (The stop is shorter than cluster-node-timeout in practice; the
 * surviving masters serve regardless, cluster-require-full-coverage no.) */
static void test_sigstop_unavailable(void **state) {
  (void)state;
  kvt_rc *rc = open_ok(300, 60000);
  keys_write(rc, "stop");
  int port = g_port + 1;
  pid_t pid = rcu_node_pid(g_dir, port);
  assert_true(pid > 0);
  assert_int_equal(kill(pid, SIGSTOP), 0);
  keys_check(rc, port);
  kill(pid, SIGCONT);
  kvt_rc_stats st;
  kvt_rc_stats_get(rc, &st);
  assert_true(st.timeouts >= 1);
  assert_true(st.unavailable > 0);
  kvt_rc_close(rc);
}

/* A master killed (SIGKILL, no replica): its keys are unavailable, first
 * through the lost connection, then at once while it is marked down. */
static void test_kill_unavailable(void **state) {
  (void)state;
  kvt_rc *rc = open_ok(10000, 60000);
  keys_write(rc, "kill");
  int port = g_port + 2;
  pid_t pid = rcu_node_pid(g_dir, port);
  assert_true(pid > 0);
  assert_int_equal(kill(pid, SIGKILL), 0);
  wait_gone(pid);
  keys_check(rc, port);
  keys_check(rc, port);
  kvt_rc_stats st;
  kvt_rc_stats_get(rc, &st);
  assert_true(st.node_failures >= 1);
  /* a fresh client: the seed list still works, the dead master's slots are unavailable */
  kvt_rc_close(rc);
  rc = open_ok(10000, 60000);
  keys_check(rc, port);
  kvt_rc_close(rc);
  /* no down period: every batch tries the dead node again, its retries
   * run out, and its keys still end unavailable */
  rc = open_ok(10000, 1);
  keys_check(rc, port);
  keys_check(rc, port);
  kvt_rc_stats_get(rc, &st);
  assert_true(st.retries >= 1);
  kvt_rc_close(rc);
}

int main(void) {
  rcu_require_redis();
  g_port = rcu_base_port(7110);
  g_pw = getenv("KVT_REDIS_TEST_PASSWORD");
  g_dir = getenv("KVT_REDIS_DIR");
  if (!g_pw || !g_dir) {
    fprintf(stderr, "skip: KVT_REDIS_TEST_PASSWORD and KVT_REDIS_DIR unset (run through ctest)\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_auth_password),
      cmocka_unit_test(test_auth_refused),
      cmocka_unit_test(test_sigstop_unavailable),
      cmocka_unit_test(test_kill_unavailable),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
