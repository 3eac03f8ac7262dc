/* test_rcluster_wire.c - the cluster client's data path (io/rcluster_wire.c)
 * over a socketpair, no server: replies of every type, bulk strings of sizes
 * around the read buffer and the direct-read switch, fed in pieces that
 * split every part of the protocol, checked bit-exact; requests checked
 * byte for byte against hiredis's own formatter, sent through a small
 * socket buffer (partial sends in the middle of a value sent in place). */
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "io/rcluster_wire.h"

typedef struct exp_reply {
  int type;
  long long integer;
  size_t len;
  const uint8_t *str; /* NULL for NIL/INTEGER and for a dropped bulk */
} exp_reply;

static void pair(int sv[2]) {
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  for (int i = 0; i < 2; i++) fcntl(sv[i], F_SETFL, fcntl(sv[i], F_GETFL) | O_NONBLOCK);
}

/* Append s (n bytes) to the stream buffer. */
static size_t put(uint8_t *buf, size_t at, const void *s, size_t n) {
  memcpy(buf + at, s, n);
  return at + n;
}

static void check_reply(const redisReply *r, const exp_reply *e, size_t idx) {
  if (r->type != e->type || r->len != e->len)
    fprintf(stderr, "reply %zu: type %d len %zu, expected type %d len %zu\n", idx, r->type,
            r->len, e->type, e->len);
  assert_int_equal(r->type, e->type);
  assert_int_equal(r->len, e->len);
  if (e->type == REDIS_REPLY_INTEGER) assert_int_equal(r->integer, e->integer);
  if (e->str) {
    assert_non_null(r->str);
    assert_memory_equal(r->str, e->str, e->len);
    assert_int_equal(r->str[e->len], 0);
  } else if (e->type == REDIS_REPLY_STRING) {
    assert_null(r->str);
  }
}

/* Write stream[0..n) in pieces of the sizes in cut[] (cycled) while
 * reading replies; every expected reply must arrive, in order, exact. */
static void feed(const uint8_t *stream, size_t n, const size_t *cut, size_t n_cut,
                 const exp_reply *exp, size_t n_exp, size_t max_bulk) {
  int sv[2];
  pair(sv);
  rc_wire w;
  memset(&w, 0, sizeof w);
  size_t off = 0, got = 0, k = 0, piece_left = cut[0];
  while (got < n_exp) {
    while (off < n && piece_left) {
      ssize_t m = write(sv[0], stream + off, piece_left < n - off ? piece_left : n - off);
      if (m <= 0) break; /* the socket is full: read first */
      off += (size_t)m;
      piece_left -= (size_t)m;
    }
    if (!piece_left) piece_left = cut[++k % n_cut];
    int r = rc_wire_recv(&w, sv[1]);
    assert_true(r >= 0);
    redisReply *rep;
    int g;
    while ((g = rc_wire_reply(&w, max_bulk, &rep)) == 1) {
      assert_true(got < n_exp);
      check_reply(rep, &exp[got], got);
      got++;
      freeReplyObject(rep);
    }
    assert_int_equal(g, 0);
    assert_true(r == 1 || off < n || got == n_exp); /* no stall with bytes pending */
  }
  assert_int_equal(off, n);
  assert_int_equal(w.in_pos, w.in_len); /* nothing left over */
  rc_wire_free(&w);
  close(sv[0]);
  close(sv[1]);
}

/* Bulk sizes around the 256 KiB read buffer (as the first reply and after
 * a short one, so the header lands at different places), the 16 KiB
 * in-place threshold, and 2 MiB + 1. */
static void test_replies_exact(void **state) {
  (void)state;
  const size_t B = RC_WIRE_IN_BYTES;
  const size_t sizes[] = {0, 1, 2, 15, 16384 - 1, 16384, 16384 + 1, B - 16, B - 9, B - 8,
                          B - 7, B - 2, B - 1, B, B + 1, B + 2, 2 * B - 9, 2 * B + 1,
                          (2u << 20) + 1};
  const size_t n_sizes = sizeof sizes / sizeof *sizes;
  size_t total = 0;
  for (size_t i = 0; i < n_sizes; i++) total += 2 * (sizes[i] + 64) + 64;
  uint8_t *stream = malloc(total), *val = malloc((2u << 20) + 2);
  exp_reply *exp = calloc(4 * n_sizes + 8, sizeof *exp);
  assert_non_null(stream);
  assert_non_null(val);
  assert_non_null(exp);
  uint64_t s = 17;
  for (size_t i = 0; i < (2u << 20) + 2; i++) val[i] = (uint8_t)tu_rand_r(&s);
  val[100] = '\r', val[101] = '\n'; /* CR LF inside a value */
  size_t at = 0, ne = 0;
  char hdr[64];
  for (size_t i = 0; i < n_sizes; i++) {
    const uint8_t *v = val + (i % 3); /* each value its own bytes */
    int h = snprintf(hdr, sizeof hdr, "$%zu\r\n", sizes[i]);
    at = put(stream, at, hdr, (size_t)h);
    at = put(stream, at, v, sizes[i]);
    at = put(stream, at, "\r\n", 2);
    exp[ne++] = (exp_reply){REDIS_REPLY_STRING, 0, sizes[i], v};
    at = put(stream, at, "+OK\r\n", 5);
    exp[ne++] = (exp_reply){REDIS_REPLY_STATUS, 0, 2, (const uint8_t *)"OK"};
    at = put(stream, at, hdr, (size_t)h); /* the same size after a short reply */
    at = put(stream, at, v, sizes[i]);
    at = put(stream, at, "\r\n", 2);
    exp[ne++] = (exp_reply){REDIS_REPLY_STRING, 0, sizes[i], v};
  }
  const char *tail = "$-1\r\n:-42\r\n:1\r\n-MOVED 3999 127.0.0.1:6381\r\n";
  at = put(stream, at, tail, strlen(tail));
  exp[ne++] = (exp_reply){REDIS_REPLY_NIL, 0, 0, NULL};
  exp[ne++] = (exp_reply){REDIS_REPLY_INTEGER, -42, 0, NULL};
  exp[ne++] = (exp_reply){REDIS_REPLY_INTEGER, 1, 0, NULL};
  exp[ne++] = (exp_reply){REDIS_REPLY_ERROR, 0, 25, (const uint8_t *)"MOVED 3999 127.0.0.1:6381"};
  /* pieces that split headers, values and CR LF at many offsets */
  const size_t cuts[][6] = {{1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 30},
                            {1, 3, 7, 4093, 65537, 262145},
                            {262143, 1, 262144, 2, 5, 131071},
                            {9, 16385, 1, 1, 300000, 2}};
  for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) feed(stream, at, cuts[c], 6, exp, ne, 64u << 20);
  free(stream);
  free(val);
  free(exp);
}

/* A bulk above the limit is read through and dropped (str NULL, its
 * length kept); the reply after it is intact. */
static void test_bulk_dropped(void **state) {
  (void)state;
  const size_t big = 300000;
  uint8_t *stream = malloc(big + 64), *val = malloc(big);
  assert_non_null(stream);
  assert_non_null(val);
  memset(val, 'x', big);
  char hdr[32];
  int h = snprintf(hdr, sizeof hdr, "$%zu\r\n", big);
  size_t at = put(stream, 0, hdr, (size_t)h);
  at = put(stream, at, val, big);
  at = put(stream, at, "\r\n$3\r\nabc\r\n", 11);
  exp_reply exp[2] = {{REDIS_REPLY_STRING, 0, big, NULL}, {REDIS_REPLY_STRING, 0, 3, (const uint8_t *)"abc"}};
  const size_t cut[2] = {4096, 100000};
  feed(stream, at, cut, 2, exp, 2, big - 1);
  free(stream);
  free(val);
}

/* Input that is not a reply of the data path is refused, never guessed. */
static void test_bad_replies(void **state) {
  (void)state;
  const char *bad[] = {"*1\r\n$1\r\na\r\n", "+OK\n", "$abc\r\n", "$-2\r\n", "$3\r\nabcXY",
                       ":12x\r\n", "_\r\n", "$1234567890123456789\r\n", "\r\n"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int sv[2];
    pair(sv);
    rc_wire w;
    memset(&w, 0, sizeof w);
    assert_int_equal(write(sv[0], bad[i], strlen(bad[i])), (ssize_t)strlen(bad[i]));
    assert_int_equal(rc_wire_recv(&w, sv[1]), 1);
    redisReply *r = NULL;
    int g = rc_wire_reply(&w, 1u << 20, &r);
    if (g != -1) fprintf(stderr, "bad reply %zu accepted (%d)\n", i, g);
    assert_int_equal(g, -1);
    assert_null(r);
    rc_wire_free(&w);
    close(sv[0]);
    close(sv[1]);
  }
  /* a line longer than the read buffer */
  int sv[2];
  pair(sv);
  rc_wire w;
  memset(&w, 0, sizeof w);
  char *line = malloc(RC_WIRE_IN_BYTES + 1);
  assert_non_null(line);
  memset(line, 'e', RC_WIRE_IN_BYTES + 1);
  line[0] = '-';
  size_t off = 0;
  redisReply *r = NULL;
  int g = 0;
  for (int k = 0; k < 1000 && g == 0; k++) {
    ssize_t m = off < RC_WIRE_IN_BYTES + 1 ? write(sv[0], line + off, RC_WIRE_IN_BYTES + 1 - off) : 0;
    if (m > 0) off += (size_t)m;
    assert_true(rc_wire_recv(&w, sv[1]) >= 0);
    g = rc_wire_reply(&w, 1u << 20, &r);
  }
  assert_int_equal(g, -1);
  free(line);
  rc_wire_free(&w);
  close(sv[0]);
  close(sv[1]);
  /* end of stream */
  pair(sv);
  memset(&w, 0, sizeof w);
  close(sv[0]);
  assert_int_equal(rc_wire_recv(&w, sv[1]), -1);
  rc_wire_free(&w);
  close(sv[1]);
}

/* Commands with arguments around the in-place threshold, sent through a
 * small socket buffer while the other side drains it: the bytes must be
 * exactly hiredis's redisFormatCommandArgv of the same commands. */
static void test_requests_exact(void **state) {
  (void)state;
  const size_t Z = RC_WIRE_ZCOPY_MIN;
  const size_t vs[] = {0, 1, Z - 1, Z, Z + 1, 3 * Z + 7, (2u << 20) + 3};
  const size_t n_vs = sizeof vs / sizeof *vs;
  uint8_t *val = malloc((2u << 20) + 16);
  assert_non_null(val);
  uint64_t s = 5;
  for (size_t i = 0; i < (2u << 20) + 16; i++) val[i] = (uint8_t)tu_rand_r(&s);
  size_t cap = 0;
  for (size_t i = 0; i < n_vs; i++) cap += 2 * vs[i] + 256;
  char *want = malloc(cap), *got = malloc(cap);
  assert_non_null(want);
  assert_non_null(got);
  size_t wn = 0;
  int sv[2];
  pair(sv);
  int small = 4096;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  rc_wire w;
  memset(&w, 0, sizeof w);
  for (size_t round = 0; round < 2; round++) { /* the second reuses the emptied queue */
    for (size_t i = 0; i < n_vs; i++) {
      const char *key = round ? "kvt1:b:0123" : "k\r\n\0y";
      size_t klen = round ? 11 : 5;
      const void *argv[4] = {"SET", key, val + i, "NX"};
      size_t lens[4] = {3, klen, vs[i], 2};
      const void *gv[2] = {"GET", key};
      size_t gl[2] = {3, klen};
      assert_int_equal(rc_wire_cmd(&w, 4, argv, lens), 0);
      assert_int_equal(rc_wire_cmd(&w, 2, gv, gl), 0);
      char *f = NULL;
      long long fl = redisFormatCommandArgv(&f, 4, (const char **)argv, lens);
      assert_true(fl > 0);
      memcpy(want + wn, f, (size_t)fl);
      wn += (size_t)fl;
      free(f);
      fl = redisFormatCommandArgv(&f, 2, (const char **)gv, gl);
      memcpy(want + wn, f, (size_t)fl);
      wn += (size_t)fl;
      free(f);
    }
    size_t gn = 0;
    while (rc_wire_pending(&w) || gn < wn) {
      assert_true(rc_wire_send(&w, sv[0]) >= 0);
      ssize_t m = read(sv[1], got + gn, cap - gn);
      if (m > 0) gn += (size_t)m;
    }
    assert_int_equal(gn, wn);
    assert_memory_equal(got, want, wn);
    wn = 0;
  }
  assert_int_equal(rc_wire_cmd(&w, 0, NULL, NULL), -EINVAL);
  rc_wire_free(&w);
  close(sv[0]);
  close(sv[1]);
  free(val);
  free(want);
  free(got);
}

/* A SET whose value is given in parts (rc_wire_cmd_iov): small parts
 * copied, large ones sent in place, empty ones skipped, in order - the
 * request byte for byte hiredis's of the joined value, through a small
 * socket buffer (partial sends inside the parts). */
static void test_requests_iov(void **state) {
  (void)state;
  const size_t Z = RC_WIRE_ZCOPY_MIN;
  const size_t part[] = {4096, Z, 0, 100, 3 * Z + 5, Z - 1, 1, 2 * Z};
  enum { NP = sizeof part / sizeof *part };
  size_t total = 0;
  for (int i = 0; i < NP; i++) total += part[i];
  uint8_t *val = malloc(total);
  assert_non_null(val);
  uint64_t s = 9;
  for (size_t i = 0; i < total; i++) val[i] = (uint8_t)tu_rand_r(&s);
  struct iovec iov[NP];
  for (size_t i = 0, at = 0; i < NP; at += part[i++]) iov[i] = (struct iovec){val + at, part[i]};
  const void *argv[4] = {"SET", "kvt1:b:00ff", val, "NX"};
  size_t lens[4] = {3, 11, total, 2};
  char *want = NULL;
  long long wn = redisFormatCommandArgv(&want, 4, (const char **)argv, lens);
  assert_true(wn > 0);
  int sv[2];
  pair(sv);
  int small = 4096;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  rc_wire w;
  memset(&w, 0, sizeof w);
  argv[2] = NULL; /* the value comes from the parts only */
  assert_int_equal(rc_wire_cmd_iov(&w, 4, argv, lens, 2, iov, NP), 0);
  char *got = malloc((size_t)wn);
  assert_non_null(got);
  size_t gn = 0;
  for (;;) { /* until everything queued is sent and read */
    int sent = rc_wire_send(&w, sv[0]);
    assert_true(sent >= 0);
    ssize_t m = read(sv[1], got + gn, (size_t)wn - gn);
    if (m > 0) gn += (size_t)m;
    if (m <= 0 && !sent && !rc_wire_pending(&w)) break;
    if (gn == (size_t)wn && !rc_wire_pending(&w)) break;
  }
  assert_int_equal(gn, (size_t)wn);
  assert_memory_equal(got, want, (size_t)wn);
  assert_int_equal(rc_wire_cmd_iov(&w, 4, argv, lens, 2, iov, -1), -EINVAL);
  rc_wire_free(&w);
  close(sv[0]);
  close(sv[1]);
  free(want);
  free(got);
  free(val);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_replies_exact),
      cmocka_unit_test(test_bulk_dropped),
      cmocka_unit_test(test_bad_replies),
      cmocka_unit_test(test_requests_exact),
      cmocka_unit_test(test_requests_iov),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
