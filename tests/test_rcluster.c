/* test_rcluster.c - the Redis Cluster client (io/rcluster.c) against a real
 * cluster of 3 masters and 3 replicas started by the ctest fixture
 * (tests/redis_cluster.sh, ports from KVT_REDIS_PORT): key slots against
 * the server's CLUSTER KEYSLOT, binary round trips on every node, a
 * pipelined batch of 1000 mixed commands, MOVED and ASK during a slot
 * migration. Skipped (77) when redis-server is not installed. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/rcluster.h"
#include "rc_util.h"

static int g_port;
static char g_url[256];

static kvt_rc *open_rc(const kvt_rc_config *base) {
  kvt_rc_config cfg = {0};
  if (base) cfg = *base;
  cfg.url = g_url;
  if (!cfg.deadline_ms) cfg.deadline_ms = 20000; /* a loaded machine; no test depends on time */
  if (!cfg.command_timeout_ms) cfg.command_timeout_ms = 10000;
  if (!cfg.connect_timeout_ms) cfg.connect_timeout_ms = 5000;
  kvt_rc *rc = NULL;
  char err[256];
  int e = kvt_rc_open(&cfg, &rc, err, sizeof err);
  if (e) fprintf(stderr, "kvt_rc_open: %d %s\n", e, err);
  assert_int_equal(e, 0);
  return rc;
}

/* A key with a binary run prefix, so runs and tests do not collide. */
static size_t make_key(uint8_t *buf, const char *tag, uint32_t i, uint64_t salt) {
  size_t n = (size_t)snprintf((char *)buf, 64, "%s:", tag);
  memcpy(buf + n, &salt, 8);
  n += 8;
  memcpy(buf + n, &i, 4);
  n += 4;
  buf[n++] = 0; /* a NUL and CR LF inside keys: binary safe */
  buf[n++] = '\r';
  buf[n++] = '\n';
  return n;
}

static void fill_val(uint8_t *v, size_t len, uint64_t seed) {
  uint64_t s = seed;
  for (size_t i = 0; i < len; i++) v[i] = (uint8_t)tu_rand_r(&s);
}

/* ------------------------------------------------------------ slots */

static void test_slot_vectors(void **state) {
  (void)state;
  /* CRC16-XMODEM check value, as the Redis Cluster spec gives it */
  assert_int_equal(kvt_rc_crc16("123456789", 9), 0x31C3);
  /* slots printed by `redis-cli CLUSTER KEYSLOT` (redis 7.0.15) */
  assert_int_equal(kvt_rc_slot("123456789", 9), 12739);
  assert_int_equal(kvt_rc_slot("foo", 3), 12182);
  assert_int_equal(kvt_rc_slot("{user1000}.following", 20), 3443);
  assert_int_equal(kvt_rc_slot("{user1000}.followers", 20), 3443);
  /* hash tags: the first {...} that is not empty; {} hashes the whole key */
  assert_int_equal(kvt_rc_slot("a{user1000}b", 12), kvt_rc_slot("user1000", 8));
  assert_int_equal(kvt_rc_slot("foo{}{bar}", 10), kvt_rc_crc16("foo{}{bar}", 10) & 16383);
  assert_int_equal(kvt_rc_slot("foo{{bar}}zap", 13), kvt_rc_slot("{bar", 4) /* no }: whole */);
  assert_int_equal(kvt_rc_slot("foo{{bar}}zap", 13), kvt_rc_crc16("{bar", 4) & 16383);
  assert_int_equal(kvt_rc_slot("foo{bar}{zap}", 13), kvt_rc_slot("bar", 3));
  assert_int_equal(kvt_rc_slot("foo{bar", 7), kvt_rc_crc16("foo{bar", 7) & 16383);
  assert_int_equal(kvt_rc_slot("", 0), 0);
}

/* Our slot against the server's for random binary keys, tags included. */
static void test_slot_matches_server(void **state) {
  (void)state;
  redisContext *a = rcu_admin(g_port, NULL);
  assert_non_null(a);
  for (int i = 0; i < 300; i++) {
    uint8_t k[40];
    size_t n = 1 + tu_below(sizeof k - 1);
    for (size_t j = 0; j < n; j++) k[j] = (uint8_t)tu_below(256);
    if (i % 3 == 0 && n > 4) { /* a tag somewhere */
      k[tu_below((uint32_t)n / 2)] = '{';
      k[n / 2 + tu_below((uint32_t)(n - n / 2))] = '}';
    }
    redisReply *r = redisCommand(a, "CLUSTER KEYSLOT %b", k, n);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_int_equal(kvt_rc_slot(k, n), r->integer);
    freeReplyObject(r);
  }
  redisFree(a);
}

/* ------------------------------------------------------------ round trips */

enum { RT_KEYS = 600 };

static void test_roundtrip_all_nodes(void **state) {
  (void)state;
  kvt_rc *rc = open_rc(NULL);
  uint64_t salt = tu_rand();
  static uint8_t keys[RT_KEYS][64];
  static size_t klen[RT_KEYS];
  static uint8_t *vals[RT_KEYS];
  static size_t vlen[RT_KEYS];
  kvt_rc_cmd *c = calloc(RT_KEYS, sizeof *c);
  assert_non_null(c);
  char nodes[8][64];
  int n_nodes = 0;
  for (uint32_t i = 0; i < RT_KEYS; i++) {
    klen[i] = make_key(keys[i], "rt", i, salt);
    vlen[i] = i % 50 == 0 ? 0 : (i % 7 == 0 ? 65536 + i : 1 + tu_below(3000));
    vals[i] = malloc(vlen[i] + 1);
    fill_val(vals[i], vlen[i], salt + i);
    c[i] = (kvt_rc_cmd){.op = KVT_RC_SET_NX, .key = keys[i], .key_len = klen[i],
                        .val = vals[i], .val_len = vlen[i]};
    char who[64];
    assert_int_equal(kvt_rc_slot_node(rc, kvt_rc_slot(keys[i], klen[i]), who, sizeof who), 0);
    int seen = 0;
    for (int j = 0; j < n_nodes; j++) seen |= !strcmp(nodes[j], who);
    if (!seen && n_nodes < 8) strcpy(nodes[n_nodes++], who);
  }
  assert_int_equal(n_nodes, 3); /* every master gets keys */
  assert_int_equal(kvt_rc_exec(rc, c, RT_KEYS), 0);
  for (int i = 0; i < RT_KEYS; i++) assert_int_equal(c[i].status, KVT_RC_OK);
  /* write once: a second SET NX with other bytes is refused, the first stays */
  uint8_t other[8] = "changed";
  for (int i = 0; i < RT_KEYS; i++) c[i].val = other, c[i].val_len = sizeof other;
  assert_int_equal(kvt_rc_exec(rc, c, RT_KEYS), 0);
  for (int i = 0; i < RT_KEYS; i++) assert_int_equal(c[i].status, KVT_RC_NIL);
  for (int i = 0; i < RT_KEYS; i++) c[i].op = KVT_RC_GET;
  assert_int_equal(kvt_rc_exec(rc, c, RT_KEYS), 0);
  for (int i = 0; i < RT_KEYS; i++) {
    assert_int_equal(c[i].status, KVT_RC_OK);
    assert_int_equal(c[i].out_len, vlen[i]);
    assert_memory_equal(c[i].out, vals[i], vlen[i]);
  }
  for (int i = 0; i < RT_KEYS; i++) c[i].op = i % 2 ? KVT_RC_DEL : KVT_RC_EXISTS;
  assert_int_equal(kvt_rc_exec(rc, c, RT_KEYS), 0);
  for (int i = 0; i < RT_KEYS; i++) {
    assert_int_equal(c[i].status, KVT_RC_OK);
    assert_int_equal(c[i].n, 1);
    assert_null(c[i].out);
  }
  for (int i = 0; i < RT_KEYS; i++) c[i].op = KVT_RC_GET;
  assert_int_equal(kvt_rc_exec(rc, c, RT_KEYS), 0);
  for (int i = 0; i < RT_KEYS; i++) assert_int_equal(c[i].status, i % 2 ? KVT_RC_NIL : KVT_RC_OK);
  kvt_rc_stats st;
  kvt_rc_stats_get(rc, &st);
  assert_int_equal(st.unavailable, 0);
  assert_int_equal(st.batches, 5);
  kvt_rc_release(c, RT_KEYS);
  for (int i = 0; i < RT_KEYS; i++) free(vals[i]);
  free(c);
  kvt_rc_close(rc);
}

/* 1000 mixed commands in one batch, through a narrow window (7 requests,
 * 20 KiB in flight per node) and a wide one; each result checked against
 * what the batch order implies. */
static void run_mixed(const kvt_rc_config *cfg) {
  enum { N = 1000, K = 300 };
  kvt_rc *rc = open_rc(cfg);
  uint64_t salt = tu_rand();
  static uint8_t keys[K][64];
  static size_t klen[K];
  static uint8_t vals[K][5000];
  for (uint32_t i = 0; i < K; i++) {
    klen[i] = make_key(keys[i], "mix", i, salt);
    fill_val(vals[i], sizeof vals[i], salt ^ i);
  }
  /* keys [0, K/2) exist before the batch */
  kvt_rc_cmd pre[K / 2];
  memset(pre, 0, sizeof pre);
  for (int i = 0; i < K / 2; i++)
    pre[i] = (kvt_rc_cmd){.op = KVT_RC_SET_NX, .key = keys[i], .key_len = klen[i],
                          .val = vals[i], .val_len = 1000 + (size_t)i};
  assert_int_equal(kvt_rc_exec(rc, pre, K / 2), 0);
  for (int i = 0; i < K / 2; i++) assert_int_equal(pre[i].status, KVT_RC_OK);
  int exists[K] = {0};
  for (int i = 0; i < K / 2; i++) exists[i] = 1;
  kvt_rc_cmd *c = calloc(N, sizeof *c);
  int expect[N];
  long long expect_n[N];
  int key_of[N];
  for (int i = 0; i < N; i++) {
    int k = (int)tu_below(K);
    int op = (int)tu_below(4) + KVT_RC_GET;
    key_of[i] = k;
    c[i] = (kvt_rc_cmd){.op = (kvt_rc_op)op, .key = keys[k], .key_len = klen[k]};
    expect_n[i] = 0;
    /* the same key's commands run in batch order on one node */
    switch (op) {
    case KVT_RC_GET: expect[i] = exists[k] ? KVT_RC_OK : KVT_RC_NIL; break;
    case KVT_RC_SET_NX:
      c[i].val = vals[k];
      c[i].val_len = 1000 + (size_t)k;
      expect[i] = exists[k] ? KVT_RC_NIL : KVT_RC_OK;
      exists[k] = 1;
      break;
    case KVT_RC_DEL:
      expect[i] = KVT_RC_OK;
      expect_n[i] = exists[k];
      exists[k] = 0;
      break;
    default:
      expect[i] = KVT_RC_OK;
      expect_n[i] = exists[k];
    }
  }
  assert_int_equal(kvt_rc_exec(rc, c, N), 0);
  for (int i = 0; i < N; i++) {
    if ((int)c[i].status != expect[i]) fprintf(stderr, "command %d op %d: %d, expected %d\n", i, c[i].op, c[i].status, expect[i]);
    assert_int_equal(c[i].status, expect[i]);
    if (c[i].op == KVT_RC_DEL || c[i].op == KVT_RC_EXISTS) assert_int_equal(c[i].n, expect_n[i]);
    if (c[i].op == KVT_RC_GET && c[i].status == KVT_RC_OK) {
      assert_int_equal(c[i].out_len, 1000 + (size_t)key_of[i]);
      assert_memory_equal(c[i].out, vals[key_of[i]], c[i].out_len);
    }
  }
  kvt_rc_stats st;
  kvt_rc_stats_get(rc, &st);
  assert_int_equal(st.unavailable, 0);
  assert_int_equal(st.retries, 0);
  kvt_rc_release(c, N);
  free(c);
  kvt_rc_close(rc);
}

static void test_pipeline_mixed_narrow(void **state) {
  (void)state;
  kvt_rc_config cfg = {.max_inflight_requests = 7, .max_inflight_bytes = 20 << 10};
  run_mixed(&cfg);
}

static void test_pipeline_mixed_wide(void **state) {
  (void)state;
  run_mixed(NULL);
}

/* ------------------------------------------------------------ migration */

static node_info g_masters[8];
static int g_n_masters;

/* The masters of the cluster (ROLE), with their ids. */
static void masters_load(void) {
  g_n_masters = 0;
  for (int p = g_port; p < g_port + 6; p++) {
    redisContext *a = rcu_admin(p, NULL);
    assert_non_null(a);
    redisReply *r = redisCommand(a, "ROLE");
    assert_non_null(r);
    int master = r->type == REDIS_REPLY_ARRAY && !strcmp(r->element[0]->str, "master");
    freeReplyObject(r);
    if (master) {
      r = redisCommand(a, "CLUSTER MYID");
      assert_non_null(r);
      node_info *ni = &g_masters[g_n_masters++];
      ni->port = p;
      snprintf(ni->id, sizeof ni->id, "%s", r->str);
      freeReplyObject(r);
    }
    redisFree(a);
  }
  assert_int_equal(g_n_masters, 3);
}

/* The master serving slot (asked of the cluster, not of the client), and another master. */
static void masters_for(uint16_t slot, node_info *src, node_info *dst) {
  masters_load();
  redisContext *a = rcu_admin(g_port, NULL);
  assert_non_null(a);
  redisReply *s = redisCommand(a, "CLUSTER SLOTS");
  assert_non_null(s);
  int owner = -1;
  for (size_t i = 0; i < s->elements; i++) {
    redisReply *e = s->element[i];
    if (slot >= e->element[0]->integer && slot <= e->element[1]->integer)
      owner = (int)e->element[2]->element[1]->integer;
  }
  freeReplyObject(s);
  redisFree(a);
  int got_src = 0, got_dst = 0;
  for (int i = 0; i < g_n_masters; i++) {
    if (g_masters[i].port == owner) {
      *src = g_masters[i];
      got_src = 1;
    } else if (!got_dst) {
      *dst = g_masters[i];
      got_dst = 1;
    }
  }
  assert_true(got_src && got_dst);
}

/* Tell every node that slot now belongs to id. */
static void slot_assign(uint16_t slot, const char *id) {
  for (int i = 0; i < g_n_masters; i++)
    rcu_admin_ok(g_masters[i].port, "CLUSTER SETSLOT %d NODE %s", (int)slot, id);
}

static void migrate_key(const node_info *src, const node_info *dst, const void *k, size_t n) {
  rcu_admin_ok(src->port, "MIGRATE 127.0.0.1 %d %b 0 5000", dst->port, k, n);
}

/* Move every key of slot still on src (other tests' keys land in any
 * slot): the source refuses SETSLOT NODE while it holds keys. */
static void migrate_slot(const node_info *src, const node_info *dst, uint16_t slot) {
  redisContext *a = rcu_admin(src->port, NULL);
  assert_non_null(a);
  for (;;) {
    redisReply *r = redisCommand(a, "CLUSTER GETKEYSINSLOT %d 100", (int)slot);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    size_t n = r->elements;
    for (size_t i = 0; i < n; i++) migrate_key(src, dst, r->element[i]->str, r->element[i]->len);
    freeReplyObject(r);
    if (!n) break;
  }
  redisFree(a);
}

static int get_one(kvt_rc *rc, const void *k, size_t n, const void *want, size_t want_len) {
  kvt_rc_cmd c = {.op = KVT_RC_GET, .key = k, .key_len = n};
  assert_int_equal(kvt_rc_exec(rc, &c, 1), 0);
  int ok = c.status == KVT_RC_OK && c.out_len == want_len && !memcmp(c.out, want, want_len);
  if (!ok) fprintf(stderr, "GET: status %d len %zu\n", c.status, c.out_len);
  kvt_rc_release(&c, 1);
  return ok;
}

/* The client holds the map from before a slot moved: the next GET gets
 * MOVED, follows it and finds the key; the map is refreshed. */
static void test_moved(void **state) {
  (void)state;
  kvt_rc *rc = open_rc(NULL);
  uint8_t key[64];
  size_t kn = (size_t)snprintf((char *)key, sizeof key, "{mv%llx}a", (unsigned long long)tu_rand());
  uint16_t slot = kvt_rc_slot(key, kn);
  const char val[] = "moved\0value";
  kvt_rc_cmd c = {.op = KVT_RC_SET_NX, .key = key, .key_len = kn, .val = val, .val_len = sizeof val};
  assert_int_equal(kvt_rc_exec(rc, &c, 1), 0);
  assert_int_equal(c.status, KVT_RC_OK);
  node_info src, dst;
  masters_for(slot, &src, &dst);
  char before[64], after[64];
  assert_int_equal(kvt_rc_slot_node(rc, slot, before, sizeof before), 0);
  rcu_admin_ok(dst.port, "CLUSTER SETSLOT %d IMPORTING %s", (int)slot, src.id);
  rcu_admin_ok(src.port, "CLUSTER SETSLOT %d MIGRATING %s", (int)slot, dst.id);
  migrate_slot(&src, &dst, slot);
  slot_assign(slot, dst.id);
  assert_true(get_one(rc, key, kn, val, sizeof val));
  kvt_rc_stats st;
  kvt_rc_stats_get(rc, &st);
  assert_true(st.moved >= 1);
  assert_int_equal(st.unavailable, 0);
  assert_int_equal(kvt_rc_slot_node(rc, slot, after, sizeof after), 0);
  assert_string_not_equal(before, after);
  char want[64];
  snprintf(want, sizeof want, "127.0.0.1:%d", dst.port);
  assert_string_equal(after, want);
  kvt_rc_close(rc);
}

/* A slot half migrated: keys already moved are answered with ASK by the
 * source; the client sends ASKING then the command to the target. Keys
 * not moved yet are still served by the source; a new key written during
 * the migration goes to the target. */
static void test_ask(void **state) {
  (void)state;
  kvt_rc *rc = open_rc(NULL);
  char tag[32];
  snprintf(tag, sizeof tag, "{ask%llx}", (unsigned long long)tu_rand());
  char k1[64], k2[64], k3[64];
  size_t n1 = (size_t)snprintf(k1, sizeof k1, "%s1", tag);
  size_t n2 = (size_t)snprintf(k2, sizeof k2, "%s2", tag);
  size_t n3 = (size_t)snprintf(k3, sizeof k3, "%s3", tag);
  uint16_t slot = kvt_rc_slot(k1, n1);
  kvt_rc_cmd c[3] = {
      {.op = KVT_RC_SET_NX, .key = k1, .key_len = n1, .val = "one", .val_len = 3},
      {.op = KVT_RC_SET_NX, .key = k2, .key_len = n2, .val = "two", .val_len = 3},
  };
  assert_int_equal(kvt_rc_exec(rc, c, 2), 0);
  assert_int_equal(c[0].status, KVT_RC_OK);
  assert_int_equal(c[1].status, KVT_RC_OK);
  node_info src, dst;
  masters_for(slot, &src, &dst);
  rcu_admin_ok(dst.port, "CLUSTER SETSLOT %d IMPORTING %s", (int)slot, src.id);
  rcu_admin_ok(src.port, "CLUSTER SETSLOT %d MIGRATING %s", (int)slot, dst.id);
  migrate_key(&src, &dst, k1, n1); /* k1 moved, k2 not yet */
  memset(c, 0, sizeof c);
  c[0] = (kvt_rc_cmd){.op = KVT_RC_GET, .key = k1, .key_len = n1};
  c[1] = (kvt_rc_cmd){.op = KVT_RC_GET, .key = k2, .key_len = n2};
  c[2] = (kvt_rc_cmd){.op = KVT_RC_SET_NX, .key = k3, .key_len = n3, .val = "three", .val_len = 5};
  assert_int_equal(kvt_rc_exec(rc, c, 3), 0);
  for (int i = 0; i < 3; i++) assert_int_equal(c[i].status, KVT_RC_OK);
  assert_int_equal(c[0].out_len, 3);
  assert_memory_equal(c[0].out, "one", 3);
  assert_int_equal(c[1].out_len, 3);
  assert_memory_equal(c[1].out, "two", 3);
  kvt_rc_release(c, 3);
  kvt_rc_stats st;
  kvt_rc_stats_get(rc, &st);
  assert_true(st.ask >= 2); /* k1 (moved) and k3 (new) */
  assert_int_equal(st.moved, 0);
  char who[64], want[64];
  snprintf(want, sizeof want, "127.0.0.1:%d", src.port);
  assert_int_equal(kvt_rc_slot_node(rc, slot, who, sizeof who), 0);
  assert_string_equal(who, want); /* ASK does not change the map */
  /* k3 lives on the target: ask it directly */
  redisContext *a = rcu_admin(dst.port, NULL);
  redisReply *r = redisCommand(a, "ASKING");
  freeReplyObject(r);
  r = redisCommand(a, "GET %b", k3, n3);
  assert_int_equal(r->type, REDIS_REPLY_STRING);
  assert_memory_equal(r->str, "three", 5);
  freeReplyObject(r);
  redisFree(a);
  /* finish the migration; everything is found through MOVED */
  migrate_slot(&src, &dst, slot); /* k2 and any other key of the slot */
  slot_assign(slot, dst.id);
  assert_true(get_one(rc, k1, n1, "one", 3));
  assert_true(get_one(rc, k2, n2, "two", 3));
  assert_true(get_one(rc, k3, n3, "three", 5));
  kvt_rc_stats_get(rc, &st);
  assert_true(st.moved >= 1);
  assert_int_equal(st.unavailable, 0);
  kvt_rc_close(rc);
}

/* ------------------------------------------------------------ bad calls */

static void test_bad_calls(void **state) {
  (void)state;
  kvt_rc *rc = open_rc(NULL);
  kvt_rc_cmd c = {.op = KVT_RC_GET, .key = NULL, .key_len = 3};
  assert_int_equal(kvt_rc_exec(rc, &c, 1), KVT_EOPTION);
  c = (kvt_rc_cmd){.op = (kvt_rc_op)99, .key = "k", .key_len = 1};
  assert_int_equal(kvt_rc_exec(rc, &c, 1), KVT_EOPTION);
  c = (kvt_rc_cmd){.op = KVT_RC_SET_NX, .key = "k", .key_len = 1, .val = NULL, .val_len = 5};
  assert_int_equal(kvt_rc_exec(rc, &c, 1), KVT_EOPTION);
  assert_int_equal(kvt_rc_exec(rc, &c, 0), KVT_ECOUNT);
  assert_int_equal(kvt_rc_exec(NULL, &c, 1), KVT_ENULL);
  kvt_rc_close(rc);
  /* a value above the limit is not sent */
  kvt_rc_config cfg = {.max_value_bytes = 100};
  rc = open_rc(&cfg);
  uint8_t big[101] = {0};
  c = (kvt_rc_cmd){.op = KVT_RC_SET_NX, .key = "toobig", .key_len = 6, .val = big, .val_len = sizeof big};
  assert_int_equal(kvt_rc_exec(rc, &c, 1), 0);
  assert_int_equal(c.status, KVT_RC_ETOOBIG);
  c = (kvt_rc_cmd){.op = KVT_RC_EXISTS, .key = "toobig", .key_len = 6};
  assert_int_equal(kvt_rc_exec(rc, &c, 1), 0);
  assert_int_equal(c.n, 0);
  kvt_rc_close(rc);
  /* URL errors */
  char err[256];
  const char *bad[] = {"http://127.0.0.1:7100", "redis://127.0.0.1", "redis://127.0.0.1:0",
                       "redis://127.0.0.1:7100,", "redis://:70000", "redis://u@127.0.0.1:1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kvt_rc_config b = {.url = bad[i]};
    rc = (kvt_rc *)1;
    assert_int_equal(kvt_rc_open(&b, &rc, err, sizeof err), KVT_EOPTION);
    assert_null(rc);
    assert_true(strstr(err, "remote URL") != NULL);
  }
}

/* A value's buffer given back by kvt_rc_recycle is read into again by
 * a later GET of a value that fits (no fresh pages), with the right
 * bytes; one that does not fit, or a buffer released, is not reused. */
static void test_recycle(void **state) {
  (void)state;
  kvt_rc *rc = open_rc(NULL);
  uint64_t salt = tu_rand();
  static uint8_t v[3][131072];
  const size_t len[3] = {65536, 60000, 131072};
  uint8_t key[3][64];
  kvt_rc_cmd c[3];
  memset(c, 0, sizeof c);
  for (uint32_t i = 0; i < 3; i++) {
    fill_val(v[i], len[i], salt + i);
    c[i] = (kvt_rc_cmd){.op = KVT_RC_SET_NX, .key = key[i], .key_len = make_key(key[i], "rcy", i, salt),
                        .val = v[i], .val_len = len[i]};
  }
  assert_int_equal(kvt_rc_exec(rc, c, 3), 0);
  kvt_rc_stats st;
  /* 64 KiB (new, kept); 60000 into it (kept again); 128 KiB: it does not
   * fit (new, released); 60000 into the kept one again */
  uint32_t order[4] = {0, 1, 2, 1};
  uint64_t want[4] = {0, 1, 1, 2};
  kvt_rc_cmd g;
  memset(&g, 0, sizeof g);
  for (int k = 0; k < 4; k++) {
    uint32_t i = order[k];
    g = (kvt_rc_cmd){.op = KVT_RC_GET, .key = key[i], .key_len = c[i].key_len};
    assert_int_equal(kvt_rc_exec(rc, &g, 1), 0);
    assert_int_equal(g.status, KVT_RC_OK);
    assert_int_equal(g.out_len, len[i]);
    assert_memory_equal(g.out, v[i], len[i]);
    kvt_rc_stats_get(rc, &st);
    assert_int_equal(st.values_reused, want[k]);
    if (k < 2) kvt_rc_recycle(rc, &g, 1);
    else kvt_rc_release(&g, 1);
  }
  for (uint32_t i = 0; i < 3; i++) c[i].op = KVT_RC_DEL;
  assert_int_equal(kvt_rc_exec(rc, c, 3), 0);
  kvt_rc_close(rc);
}

int main(void) {
  rcu_require_redis();
  g_port = rcu_base_port(7100);
  snprintf(g_url, sizeof g_url, "redis://127.0.0.1:%d,127.0.0.1:%d", g_port, g_port + 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slot_vectors),
      cmocka_unit_test(test_slot_matches_server),
      cmocka_unit_test(test_roundtrip_all_nodes),
      cmocka_unit_test(test_pipeline_mixed_narrow),
      cmocka_unit_test(test_pipeline_mixed_wide),
      cmocka_unit_test(test_moved),
      cmocka_unit_test(test_ask),
      cmocka_unit_test(test_bad_calls),
      cmocka_unit_test(test_recycle),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
