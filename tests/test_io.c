/* test_io.c - the I/O layer (io/io.h): the same suite runs on the io_uring
 * backend (skipped, with the reason, where io_uring is refused) and on the
 * pread backend; then the fault backend is checked to strike the intended
 * call with the intended damage, and bad configurations are refused.
 * File contents are a pure hash of (salt, file offset), so every read is
 * checked byte for byte without keeping a copy. */
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/io.h"

typedef struct be_param {
  int backend;
} be_param;

static be_param P_URING = {KVT_IO_URING};
static be_param P_PREAD = {KVT_IO_PREAD};

#define PAGE KVT_IO_ALIGN

/* ------------------------------------------------------------ helpers */

static uint8_t pat(uint64_t salt, uint64_t off) {
  return (uint8_t)(tu_mix(salt * 0x9e3779b97f4a7c15ull + (off >> 3)) >> ((off & 7) * 8));
}

static void fill(void *buf, size_t len, uint64_t salt, uint64_t off) {
  for (size_t i = 0; i < len; i++) ((uint8_t *)buf)[i] = pat(salt, off + i);
}

/* Index of the first byte that is not pattern salt at off, or -1. */
static long mismatch(const void *buf, size_t len, uint64_t salt, uint64_t off) {
  for (size_t i = 0; i < len; i++)
    if (((const uint8_t *)buf)[i] != pat(salt, off + i)) return (long)i;
  return -1;
}

static int bits_differing(const void *a, const void *b, size_t len) {
  int n = 0;
  for (size_t i = 0; i < len; i++)
    n += __builtin_popcount(((const uint8_t *)a)[i] ^ ((const uint8_t *)b)[i]);
  return n;
}

/* Create an I/O context or skip the test when io_uring is refused here. */
static kvt_io *mk_nd(int backend, uint32_t depth, const kvt_io_fault *f, int no_direct) {
  kvt_io_config c = {.backend = backend, .depth = depth, .no_direct = no_direct};
  if (f) c.fault = *f;
  kvt_io *io = NULL;
  int rc = kvt_io_create(&c, &io);
  if (backend == KVT_IO_URING &&
      (rc == -EPERM || rc == -ENOSYS || rc == -EINVAL || rc == -ENOMEM)) {
    fprintf(stderr, "skip: io_uring unavailable here (%s)\n", strerror(-rc));
    tu_skip_mark();
    skip();
  }
  assert_int_equal(rc, 0);
  assert_non_null(io);
  return io;
}

static kvt_io *mk(int backend, uint32_t depth, const kvt_io_fault *f) {
  return mk_nd(backend, depth, f, 0);
}

static int backend_of(void **state) { return ((be_param *)*state)->backend; }

/* Open dir/name read-write, created; asserts that the direct flag the
 * layer reports is what the descriptor really has. */
static int open_in(kvt_io *io, const char *dir, const char *name, int *direct) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = -1, d = -1;
  assert_int_equal(kvt_io_open(io, path, 1, 0, &fd, &d), 0);
  assert_true(fd >= 0);
  assert_int_equal(!!(fcntl(fd, F_GETFL) & O_DIRECT), d);
  if (direct) *direct = d;
  return fd;
}

/* A buffered file opened behind the layer's back: requests take any fd. */
static int open_buffered(const char *dir, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  assert_true(fd >= 0);
  return fd;
}

static int run1(kvt_io *io, int fd, uint8_t op, void *buf, uint32_t len, uint64_t off,
                int32_t *res) {
  kvt_io_req r = {.fd = fd, .op = op, .buf = buf, .len = len, .off = off};
  int rc = kvt_io_run(io, &r, 1);
  if (res) *res = r.res;
  return rc;
}

/* Write len bytes of pattern salt at off, asserting success. */
static void put(kvt_io *io, int fd, uint64_t salt, uint64_t off, uint32_t len) {
  uint8_t *b = kvt_io_buf_alloc(len);
  fill(b, len, salt, off);
  int32_t res;
  assert_int_equal(run1(io, fd, KVT_IO_OP_WRITE, b, len, off, &res), 0);
  assert_int_equal(res, (int32_t)len);
  kvt_io_buf_free(b);
}

/* Read len bytes at off (directly, bypassing faults) and compare. */
static long check_file(kvt_io *io, int fd, uint64_t salt, uint64_t off, uint32_t len) {
  uint8_t *b = kvt_io_buf_alloc(len);
  int32_t res;
  assert_int_equal(run1(io, fd, KVT_IO_OP_READ, b, len, off, &res), 0);
  assert_int_equal(res, (int32_t)len);
  long m = mismatch(b, len, salt, off);
  kvt_io_buf_free(b);
  return m;
}

/* ------------------------------------------ the suite, on each backend */

/* Aligned round trips at random offsets and sizes, one request at a time
 * and in batches that kvt_io_run splits into rounds of depth. */
static void test_roundtrip(void **state) {
  char *dir = tu_tmpdir();
  kvt_io *io = mk(backend_of(state), 8, NULL);
  int direct;
  int fd = open_in(io, dir, "f", &direct);
  assert_int_equal(direct, 1); /* /tmp is ext4 here; a test dir on tmpfs would differ */
  int rounds = tu_stress() ? 2000 : 200;
  for (int i = 0; i < rounds; i++) {
    uint32_t len = (1 + tu_below(64)) * PAGE;
    uint64_t off = (uint64_t)tu_below(4096) * PAGE;
    uint64_t salt = tu_rand();
    put(io, fd, salt, off, len);
    assert_int_equal(check_file(io, fd, salt, off, len), -1);
  }
  /* 20 extents in one run with depth 8: three rounds. */
  enum { N = 20 };
  kvt_io_req reqs[N];
  uint64_t salt = tu_rand();
  for (int i = 0; i < N; i++) {
    uint32_t len = (1 + tu_below(16)) * PAGE;
    reqs[i] = (kvt_io_req){.fd = fd, .op = KVT_IO_OP_WRITE, .buf = kvt_io_buf_alloc(len),
                           .len = len, .off = (uint64_t)i * 16 * PAGE, .user = &reqs[i]};
    fill(reqs[i].buf, len, salt, reqs[i].off);
  }
  assert_int_equal(kvt_io_run(io, reqs, N), 0);
  for (int i = 0; i < N; i++) {
    assert_int_equal(reqs[i].res, (int32_t)reqs[i].len);
    memset(reqs[i].buf, 0, reqs[i].len);
    reqs[i].op = KVT_IO_OP_READ;
  }
  assert_int_equal(kvt_io_run(io, reqs, N), 0);
  for (int i = 0; i < N; i++) {
    assert_int_equal(reqs[i].res, (int32_t)reqs[i].len);
    assert_ptr_equal(reqs[i].user, &reqs[i]);
    assert_int_equal(mismatch(reqs[i].buf, reqs[i].len, salt, reqs[i].off), -1);
    kvt_io_buf_free(reqs[i].buf);
  }
  kvt_io_close(io, fd);
  kvt_io_destroy(io);
  tu_rmtree(dir);
}

/* Buffered files take any offset and length. */
static void test_roundtrip_buffered_unaligned(void **state) {
  char *dir = tu_tmpdir();
  kvt_io *io = mk(backend_of(state), 4, NULL);
  int fd = open_buffered(dir, "f");
  uint8_t *buf = malloc(70000);
  for (int i = 0; i < 100; i++) {
    uint32_t len = 1 + tu_below(70000);
    uint64_t off = tu_below(1u << 20);
    uint64_t salt = tu_rand();
    fill(buf, len, salt, off);
    int32_t res;
    assert_int_equal(run1(io, fd, KVT_IO_OP_WRITE, buf, len, off, &res), 0);
    memset(buf, 0, len);
    assert_int_equal(run1(io, fd, KVT_IO_OP_READ, buf, len, off, &res), 0);
    assert_int_equal(res, (int32_t)len);
    assert_int_equal(mismatch(buf, len, salt, off), -1);
  }
  free(buf);
  kvt_io_close(io, fd);
  kvt_io_destroy(io);
  tu_rmtree(dir);
}

/* depth requests in flight at once through submit/reap; one more is
 * refused; each comes back exactly once, in whatever order. */
static void test_inflight_depth(void **state) {
  enum { D = 32, LEN = 4 * PAGE };
  char *dir = tu_tmpdir();
  kvt_io *io = mk(backend_of(state), D, NULL);
  int fd = open_in(io, dir, "f", NULL);
  uint64_t salt = tu_rand();
  kvt_io_req reqs[D + 1], *ptrs[D + 1], *done[D];
  for (int i = 0; i <= D; i++) {
    reqs[i] = (kvt_io_req){.fd = fd, .op = KVT_IO_OP_WRITE, .buf = kvt_io_buf_alloc(LEN),
                           .len = LEN, .off = (uint64_t)i * LEN, .res = 12345, .user = &ptrs[i]};
    fill(reqs[i].buf, LEN, salt, reqs[i].off);
    ptrs[i] = &reqs[i];
  }
  for (int phase = 0; phase < 2; phase++) {
    /* in uneven batches: 1, 2, 3, ... */
    size_t sent = 0;
    for (size_t b = 1; sent < D; b++) {
      size_t n = sent + b > D ? D - sent : b;
      assert_int_equal(kvt_io_submit(io, ptrs + sent, n), 0);
      sent += n;
    }
    assert_int_equal(kvt_io_submit(io, ptrs + D, 1), KVT_ELIMIT);
    assert_int_equal(kvt_io_run(io, reqs, 1), KVT_ESTATE);
    size_t n_done = 99;
    assert_int_equal(kvt_io_reap(io, D + 1, done, D + 1, &n_done), -EINVAL);
    int seen[D] = {0};
    size_t total = 0;
    while (total < D) {
      size_t min = phase ? 1 : D - total; /* wait for all, or for one at a time */
      assert_int_equal(kvt_io_reap(io, min, done, D, &n_done), 0);
      assert_true(n_done >= min);
      for (size_t i = 0; i < n_done; i++) {
        int k = (int)(done[i] - reqs);
        assert_true(k >= 0 && k < D);
        assert_int_equal(seen[k]++, 0);
        assert_int_equal(done[i]->res, LEN);
        assert_ptr_equal(done[i]->user, &ptrs[k]);
      }
      total += n_done;
    }
    assert_int_equal(kvt_io_reap(io, 0, done, D, &n_done), 0);
    assert_int_equal(n_done, 0);
    for (int i = 0; i < D; i++) {
      if (phase == 0) memset(reqs[i].buf, 0, LEN);
      else assert_int_equal(mismatch(reqs[i].buf, LEN, salt, reqs[i].off), -1);
      reqs[i].op = KVT_IO_OP_READ;
      reqs[i].res = 12345;
    }
  }
  for (int i = 0; i <= D; i++) kvt_io_buf_free(reqs[i].buf);
  kvt_io_close(io, fd);
  kvt_io_destroy(io);
  tu_rmtree(dir);
}

/* Destroy waits for what is still in flight (ASan would see the kernel
 * write into freed memory otherwise). */
static void test_destroy_inflight(void **state) {
  enum { D = 16 };
  char *dir = tu_tmpdir();
  kvt_io *io = mk(backend_of(state), D, NULL);
  int fd = open_in(io, dir, "f", NULL);
  put(io, fd, 5, 0, D * 16 * PAGE);
  kvt_io_req reqs[D], *ptrs[D];
  uint8_t *big = kvt_io_buf_alloc(D * 16 * PAGE);
  for (int i = 0; i < D; i++) {
    reqs[i] = (kvt_io_req){.fd = fd, .op = KVT_IO_OP_READ, .buf = big + i * 16 * PAGE,
                           .len = 16 * PAGE, .off = (uint64_t)i * 16 * PAGE};
    ptrs[i] = &reqs[i];
  }
  assert_int_equal(kvt_io_submit(io, ptrs, D), 0);
  kvt_io_destroy(io);
  for (int i = 0; i < D; i++) assert_int_equal(reqs[i].res, 16 * PAGE);
  assert_int_equal(mismatch(big, D * 16 * PAGE, 5, 0), -1);
  kvt_io_buf_free(big);
  close(fd);
  tu_rmtree(dir);
}

/* kvt_io_run resubmits the rest of short transfers (made short by the
 * fault backend: the first 3 calls move half of what they are asked). */
static void test_run_completes_short(void **state) {
  char *dir = tu_tmpdir();
  kvt_io_fault f = {.ops = (1u << KVT_IO_OP_READ) | (1u << KVT_IO_OP_WRITE),
                    .kind = KVT_FAULT_SHORT, .after = 1, .count = 3, .seed = tu_rand()};
  kvt_io *io = mk(backend_of(state), 4, &f);
  int fd = open_in(io, dir, "f", NULL);
  enum { LEN = 64 * 1024 };
  uint8_t *b = kvt_io_buf_alloc(LEN);
  fill(b, LEN, 7, PAGE);
  int32_t res;
  /* 32 KiB, 16 KiB, 8 KiB short, then 8 KiB whole: one request, 4 pieces. */
  assert_int_equal(run1(io, fd, KVT_IO_OP_WRITE, b, LEN, PAGE, &res), 0);
  assert_int_equal(res, LEN);
  kvt_io_set_fault(io, &f);
  memset(b, 0, LEN);
  assert_int_equal(run1(io, fd, KVT_IO_OP_READ, b, LEN, PAGE, &res), 0);
  assert_int_equal(res, LEN);
  assert_int_equal(mismatch(b, LEN, 7, PAGE), -1);
  /* Always short: 32K, 16K, ... 512, then 0 bytes: cannot complete. */
  f.count = 0;
  kvt_io_set_fault(io, &f);
  assert_int_equal(run1(io, fd, KVT_IO_OP_READ, b, LEN, PAGE, &res), -EIO);
  assert_true(res > 0 && res < LEN);
  kvt_io_close(io, fd);
  kvt_io_destroy(io);
  kvt_io_buf_free(b);
  tu_rmtree(dir);
}

/* A read past end of file is short: res says how much there was, run
 * reports -EIO, and a read wholly past the end gives 0 bytes. */
static void test_read_past_eof(void **state) {
  char *dir = tu_tmpdir();
  kvt_io *io = mk(backend_of(state), 4, NULL);
  for (int direct = 0; direct < 2; direct++) {
    int fd = direct ? open_in(io, dir, "d", NULL) : open_buffered(dir, "b");
    put(io, fd, 9, 0, 3 * PAGE);
    uint8_t *b = kvt_io_buf_alloc(8 * PAGE);
    kvt_io_req r = {.fd = fd, .op = KVT_IO_OP_READ, .buf = b, .len = 8 * PAGE, .off = 0};
    kvt_io_req *p = &r, *d;
    size_t n;
    assert_int_equal(kvt_io_submit(io, &p, 1), 0);
    assert_int_equal(kvt_io_reap(io, 1, &d, 1, &n), 0);
    assert_int_equal(n, 1);
    assert_ptr_equal(d, &r);
    assert_int_equal(r.res, 3 * PAGE);
    assert_int_equal(mismatch(b, 3 * PAGE, 9, 0), -1);
    int32_t res;
    assert_int_equal(run1(io, fd, KVT_IO_OP_READ, b, 8 * PAGE, PAGE, &res), -EIO);
    assert_int_equal(res, 2 * PAGE);
    assert_int_equal(run1(io, fd, KVT_IO_OP_READ, b, PAGE, 5 * PAGE, &res), -EIO);
    assert_int_equal(res, 0);
    if (!direct) { /* an unaligned end: 10000 bytes */
      assert_int_equal(kvt_io_truncate(fd, 10000), 0);
      assert_int_equal(run1(io, fd, KVT_IO_OP_READ, b, 3 * PAGE, 0, &res), -EIO);
      assert_int_equal(res, 10000);
    }
    kvt_io_buf_free(b);
    kvt_io_close(io, fd);
  }
  kvt_io_destroy(io);
  tu_rmtree(dir);
}

static void test_fsync(void **state) {
  char *dir = tu_tmpdir();
  kvt_io *io = mk(backend_of(state), 4, NULL);
  int fd = open_in(io, dir, "f", NULL);
  uint8_t *b = kvt_io_buf_alloc(2 * PAGE);
  fill(b, 2 * PAGE, 3, 0);
  kvt_io_req reqs[3] = {
      {.fd = fd, .op = KVT_IO_OP_WRITE, .buf = b, .len = PAGE, .off = 0},
      {.fd = fd, .op = KVT_IO_OP_WRITE, .buf = b + PAGE, .len = PAGE, .off = PAGE},
      {.fd = fd, .op = KVT_IO_OP_FSYNC, .res = 77},
  };
  assert_int_equal(kvt_io_run(io, reqs, 3), 0);
  assert_int_equal(reqs[2].res, 0);
  assert_int_equal(kvt_io_sync(io, fd), 0);
  assert_int_equal(check_file(io, fd, 3, 0, 2 * PAGE), -1);
  int bad = dup(fd);
  close(bad);
  assert_int_equal(kvt_io_sync(io, bad), -EBADF);
  kvt_io_buf_free(b);
  kvt_io_close(io, fd);
  kvt_io_destroy(io);
  tu_rmtree(dir);
}

/* O_DIRECT where refused falls back to buffered and says so. tmpfs
 * refused O_DIRECT until Linux 6.6; newer kernels accept it, so /dev/shm
 * is checked for consistency and working I/O, and the refusal itself on
 * files whose file systems still refuse it (/proc, a device). */
static void test_direct_fallback(void **state) {
  kvt_io *io = mk(backend_of(state), 4, NULL);
  if (access("/dev/shm", W_OK) == 0) {
    char tmpl[] = "/dev/shm/kvt-io-XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    int direct;
    int fd = open_in(io, tmpl, "f", &direct);
    fprintf(stderr, "note: /dev/shm opened %s\n", direct ? "O_DIRECT (tmpfs allows it)" : "buffered");
    put(io, fd, 11, PAGE, 4 * PAGE);
    assert_int_equal(check_file(io, fd, 11, PAGE, 4 * PAGE), -1);
    assert_int_equal(kvt_io_sync(io, fd), 0);
    kvt_io_close(io, fd);
    char path[64];
    snprintf(path, sizeof path, "%s/f", tmpl);
    assert_int_equal(kvt_io_unlink(path), 0);
    assert_int_equal(rmdir(tmpl), 0);
  }
  int fd = -1, direct = 1;
  assert_int_equal(kvt_io_open(io, "/proc/version", 0, 1, &fd, &direct), 0);
  assert_int_equal(direct, 0);
  assert_int_equal(fcntl(fd, F_GETFL) & O_DIRECT, 0);
  char text[256] = {0};
  kvt_io_req r = {.fd = fd, .op = KVT_IO_OP_READ, .buf = text, .len = sizeof text - 1};
  assert_int_equal(kvt_io_run(io, &r, 1), -EIO); /* shorter than asked */
  assert_true(r.res > 5);
  assert_memory_equal(text, "Linux", 5);
  kvt_io_close(io, fd);
  direct = 1;
  assert_int_equal(kvt_io_open(io, "/dev/null", 0, 0, &fd, &direct), 0);
  assert_int_equal(direct, 0);
  r = (kvt_io_req){.fd = fd, .op = KVT_IO_OP_WRITE, .buf = text, .len = 100};
  assert_int_equal(kvt_io_run(io, &r, 1), 0);
  assert_int_equal(r.res, 100);
  kvt_io_close(io, fd);
  /* Not allowed by the config: buffered. */
  char *dir = tu_tmpdir();
  kvt_io_destroy(io);
  kvt_io_config c = {.backend = backend_of(state), .no_direct = 1};
  assert_int_equal(kvt_io_create(&c, &io), 0);
  fd = open_in(io, dir, "g", &direct);
  assert_int_equal(direct, 0);
  kvt_io_close(io, fd);
  /* Errors other than EINVAL are returned, not papered over. */
  char path[512];
  snprintf(path, sizeof path, "%s/missing/x", dir);
  assert_int_equal(kvt_io_open(io, path, 1, 0, &fd, &direct), -ENOENT);
  kvt_io_destroy(io);
  tu_rmtree(dir);
}

/* --------------------------------------------------------------- faults */

static kvt_io_fault plan(uint32_t ops, uint32_t kind, uint64_t after, uint64_t count) {
  return (kvt_io_fault){.ops = ops, .kind = kind, .after = after, .count = count, .seed = tu_rand()};
}

#define RD (1u << KVT_IO_OP_READ)
#define WR (1u << KVT_IO_OP_WRITE)
#define FS (1u << KVT_IO_OP_FSYNC)

/* EIO on reads 3 and 4 only; writes and syncs do not count as reads. */
static void test_fault_eio(void **state) {
  char *dir = tu_tmpdir();
  kvt_io_fault f = plan(RD, KVT_FAULT_EIO, 3, 2);
  kvt_io *io = mk(backend_of(state), 4, &f);
  assert_string_equal(kvt_io_backend_name(io),
                      backend_of(state) == KVT_IO_URING ? "fault+uring" : "fault+pread");
  int fd = open_in(io, dir, "f", NULL);
  uint8_t *b = kvt_io_buf_alloc(PAGE);
  int32_t res;
  for (int call = 1; call <= 6; call++) {
    put(io, fd, (uint64_t)call, 0, PAGE); /* writes: not counted */
    assert_int_equal(kvt_io_sync(io, fd), 0);
    memset(b, 0xEE, PAGE);
    int rc = run1(io, fd, KVT_IO_OP_READ, b, PAGE, 0, &res);
    if (call == 3 || call == 4) {
      assert_int_equal(rc, -EIO);
      assert_int_equal(res, -EIO);
      assert_int_equal(b[0], 0xEE); /* nothing transferred */
    } else {
      assert_int_equal(rc, 0);
      assert_int_equal(mismatch(b, PAGE, (uint64_t)call, 0), -1);
    }
  }
  /* count 0: every call from `after` on; here on fsync. */
  f = plan(FS, KVT_FAULT_EIO, 2, 0);
  assert_int_equal(kvt_io_set_fault(io, &f), 0);
  assert_int_equal(kvt_io_sync(io, fd), 0);
  for (int i = 0; i < 5; i++) assert_int_equal(kvt_io_sync(io, fd), -EIO);
  kvt_io_buf_free(b);
  kvt_io_close(io, fd);
  kvt_io_destroy(io);
  tu_rmtree(dir);
}

/* ENOSPC on write 2 of a batch of 4: that one, and only it, left the file
 * as it was. Within one run the calls are counted in request order. */
static void test_fault_enospc(void **state) {
  char *dir = tu_tmpdir();
  kvt_io_fault f = plan(WR, KVT_FAULT_ENOSPC, 2, 1);
  kvt_io *io = mk(backend_of(state), 8, &f);
  int fd = open_in(io, dir, "f", NULL);
  kvt_io_fault none = {0};
  assert_int_equal(kvt_io_set_fault(io, &none), 0);
  put(io, fd, 1, 0, 4 * PAGE); /* old contents, salt 1 */
  assert_int_equal(kvt_io_set_fault(io, &f), 0);
  uint8_t *b = kvt_io_buf_alloc(4 * PAGE);
  fill(b, 4 * PAGE, 2, 0);
  kvt_io_req reqs[4];
  for (int i = 0; i < 4; i++)
    reqs[i] = (kvt_io_req){.fd = fd, .op = KVT_IO_OP_WRITE, .buf = b + i * PAGE, .len = PAGE,
                           .off = (uint64_t)i * PAGE};
  assert_int_equal(kvt_io_run(io, reqs, 4), -ENOSPC);
  assert_int_equal(reqs[0].res, PAGE);
  assert_int_equal(reqs[1].res, -ENOSPC);
  assert_int_equal(reqs[2].res, PAGE);
  assert_int_equal(reqs[3].res, PAGE);
  assert_int_equal(check_file(io, fd, 2, 0, PAGE), -1);
  assert_int_equal(check_file(io, fd, 1, PAGE, PAGE), -1); /* untouched */
  assert_int_equal(check_file(io, fd, 2, 2 * PAGE, 2 * PAGE), -1);
  kvt_io_buf_free(b);
  kvt_io_close(io, fd);
  kvt_io_destroy(io);
  tu_rmtree(dir);
}

/* SHORT through submit/reap (no completion by run): half moved, half not. */
static void test_fault_short(void **state) {
  enum { LEN = 16 * PAGE };
  char *dir = tu_tmpdir();
  kvt_io_fault f = plan(WR | RD, KVT_FAULT_SHORT, 2, 1);
  kvt_io *io = mk(backend_of(state), 4, &f);
  int fd = open_in(io, dir, "f", NULL);
  put(io, fd, 1, 0, LEN); /* call 1: whole */
  uint8_t *b = kvt_io_buf_alloc(LEN);
  fill(b, LEN, 2, 0);
  kvt_io_req r = {.fd = fd, .op = KVT_IO_OP_WRITE, .buf = b, .len = LEN}, *p = &r, *d;
  size_t n;
  assert_int_equal(kvt_io_submit(io, &p, 1), 0); /* call 2: short */
  assert_int_equal(kvt_io_reap(io, 1, &d, 1, &n), 0);
  assert_int_equal(r.res, LEN / 2);
  assert_int_equal(check_file(io, fd, 2, 0, LEN / 2), -1);      /* call 3 */
  assert_int_equal(check_file(io, fd, 1, LEN / 2, LEN / 2), -1); /* call 4 */
  f = plan(RD, KVT_FAULT_SHORT, 1, 1);
  assert_int_equal(kvt_io_set_fault(io, &f), 0);
  memset(b, 0xEE, LEN);
  r = (kvt_io_req){.fd = fd, .op = KVT_IO_OP_READ, .buf = b, .len = LEN};
  assert_int_equal(kvt_io_submit(io, &p, 1), 0);
  assert_int_equal(kvt_io_reap(io, 1, &d, 1, &n), 0);
  assert_int_equal(r.res, LEN / 2);
  assert_int_equal(mismatch(b, LEN / 2, 2, 0), -1);
  for (int i = LEN / 2; i < LEN; i++) assert_int_equal(b[i], 0xEE);
  /* Half of an odd length is rounded down to 512: 3000 moves 1024. */
  kvt_io_close(io, fd);
  fd = open_buffered(dir, "buffered");
  f = plan(WR, KVT_FAULT_SHORT, 1, 1);
  assert_int_equal(kvt_io_set_fault(io, &f), 0);
  r = (kvt_io_req){.fd = fd, .op = KVT_IO_OP_WRITE, .buf = b, .len = 3000};
  assert_int_equal(kvt_io_submit(io, &p, 1), 0);
  assert_int_equal(kvt_io_reap(io, 1, &d, 1, &n), 0);
  assert_int_equal(r.res, 1024);
  uint64_t size;
  assert_int_equal(kvt_io_file_size(fd, &size), 0);
  assert_int_equal(size, 1024);
  kvt_io_buf_free(b);
  kvt_io_close(io, fd);
  kvt_io_destroy(io);
  tu_rmtree(dir);
}

/* TORN: the write says all of it went, the file holds a prefix of it (a
 * multiple of 512 bytes, shorter than the whole) and the old bytes after. */
static void test_fault_torn(void **state) {
  enum { LEN = 32 * PAGE };
  char *dir = tu_tmpdir();
  kvt_io *io = mk(backend_of(state), 4, &(kvt_io_fault){.kind = KVT_FAULT_TORN});
  int fd = open_in(io, dir, "f", NULL);
  long lens[2];
  int rounds = tu_stress() ? 200 : 20;
  for (int i = 0; i < rounds; i++) {
    kvt_io_fault f = plan(WR, KVT_FAULT_TORN, 2, 1);
    if (i < 2) f.seed = 42; /* the same seed tears the same way */
    assert_int_equal(kvt_io_set_fault(io, &f), 0);
    put(io, fd, 1, 0, LEN);   /* call 1: whole */
    put(io, fd, 2, 0, LEN);   /* call 2: torn, yet reported whole */
    uint8_t *b = kvt_io_buf_alloc(LEN);
    int32_t res;
    assert_int_equal(run1(io, fd, KVT_IO_OP_READ, b, LEN, 0, &res), 0);
    /* The first differing byte lies in the first 512-byte block not
     * written (old and new bytes agree by chance 1 time in 256); from that
     * block's start on the old bytes must all be there. */
    long first = mismatch(b, LEN, 2, 0);
    assert_true(first >= 0); /* not all of it */
    long cut = first / 512 * 512;
    assert_int_equal(mismatch(b + cut, LEN - (size_t)cut, 1, (uint64_t)cut), -1);
    if (i < 2) lens[i] = cut;
    kvt_io_buf_free(b);
  }
  assert_int_equal(lens[0], lens[1]);
  kvt_io_close(io, fd);
  kvt_io_destroy(io);
  tu_rmtree(dir);
}

/* FLIP: exactly one bit differs, in what a read returns (the file is
 * intact) or in what a write stores (the caller's buffer is intact). */
static void test_fault_flip(void **state) {
  enum { LEN = 8 * PAGE };
  char *dir = tu_tmpdir();
  kvt_io_fault f = plan(RD, KVT_FAULT_FLIP, 2, 1);
  kvt_io *io = mk(backend_of(state), 4, &f);
  int fd = open_in(io, dir, "f", NULL);
  put(io, fd, 4, 0, LEN);
  uint8_t *want = kvt_io_buf_alloc(LEN), *b = kvt_io_buf_alloc(LEN);
  fill(want, LEN, 4, 0);
  for (int call = 1; call <= 3; call++) {
    int32_t res;
    assert_int_equal(run1(io, fd, KVT_IO_OP_READ, b, LEN, 0, &res), 0);
    assert_int_equal(res, LEN);
    assert_int_equal(bits_differing(b, want, LEN), call == 2 ? 1 : 0);
  }
  f = plan(WR, KVT_FAULT_FLIP, 1, 1);
  assert_int_equal(kvt_io_set_fault(io, &f), 0);
  memcpy(b, want, LEN);
  int32_t res;
  assert_int_equal(run1(io, fd, KVT_IO_OP_WRITE, b, LEN, 0, &res), 0);
  assert_int_equal(bits_differing(b, want, LEN), 0);
  assert_int_equal(run1(io, fd, KVT_IO_OP_READ, b, LEN, 0, &res), 0);
  assert_int_equal(bits_differing(b, want, LEN), 1);
  kvt_io_buf_free(want);
  kvt_io_buf_free(b);
  kvt_io_close(io, fd);
  kvt_io_destroy(io);
  tu_rmtree(dir);
}

/* ------------------------------------------------- config and the rest */

static void test_auto(void **state) {
  (void)state;
  kvt_io_config c = {.backend = KVT_IO_AUTO};
  kvt_io *io = NULL;
  assert_int_equal(kvt_io_create(&c, &io), 0);
  const char *name = kvt_io_backend_name(io), *why = kvt_io_why(io);
  fprintf(stderr, "note: auto chose %s: %s\n", name, why);
  assert_true(strcmp(name, "uring") == 0 || strcmp(name, "pread") == 0);
  assert_non_null(strstr(why, "io_uring")); /* says what became of io_uring */
  kvt_io *forced = NULL;
  c.backend = KVT_IO_URING;
  int rc = kvt_io_create(&c, &forced);
  /* AUTO takes io_uring exactly when forcing it works. */
  assert_int_equal(strcmp(name, "uring") == 0, rc == 0);
  if (rc == 0) assert_string_equal(kvt_io_backend_name(forced), "uring");
  kvt_io_destroy(forced);
  kvt_io_destroy(io);
  c.backend = KVT_IO_PREAD;
  assert_int_equal(kvt_io_create(&c, &io), 0);
  assert_string_equal(kvt_io_backend_name(io), "pread");
  assert_non_null(strstr(kvt_io_why(io), "forced"));
  kvt_io_fault f = {.kind = KVT_FAULT_EIO};
  assert_int_equal(kvt_io_set_fault(io, &f), KVT_EOPTION); /* not a fault backend */
  kvt_io_destroy(io);
  kvt_io_destroy(NULL);
}

/* Where io_uring is refused (here: a seccomp filter in a child, as a
 * container runtime would install), AUTO falls back to pread and says why,
 * and forcing io_uring fails. Refused at setup, or only at io_uring_enter
 * (which the no-op probe catches). Returns the child's exit status. */
static int refused_child(long nr, int err, const char *why_has) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) { /* no cmocka in the child */
    struct sock_filter filt[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((uint32_t)err & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof filt / sizeof filt[0], .filter = filt};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
      _exit(3);
    kvt_io *io = NULL;
    kvt_io_config c = {.backend = KVT_IO_AUTO};
    if (kvt_io_create(&c, &io) != 0) _exit(4);
    if (strcmp(kvt_io_backend_name(io), "pread") != 0) _exit(5);
    if (!strstr(kvt_io_why(io), why_has)) _exit(6);
    int fd = -1;
    if (kvt_io_open(io, "/proc/version", 0, 1, &fd, NULL) != 0) _exit(7);
    char text[64];
    kvt_io_req r = {.fd = fd, .op = KVT_IO_OP_READ, .buf = text, .len = 5};
    if (kvt_io_run(io, &r, 1) != 0 || memcmp(text, "Linux", 5) != 0) _exit(8);
    kvt_io_close(io, fd);
    kvt_io_destroy(io);
    c.backend = KVT_IO_URING;
    if (kvt_io_create(&c, &io) != -err || io != NULL) _exit(9);
    _exit(0);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  return WEXITSTATUS(st);
}

static void test_auto_fallback(void **state) {
  (void)state;
  assert_int_equal(refused_child(__NR_io_uring_setup, EPERM, "io_uring_queue_init: EPERM"), 0);
  assert_int_equal(refused_child(__NR_io_uring_setup, ENOSYS, "io_uring_queue_init: ENOSYS"), 0);
  kvt_io_config c = {.backend = KVT_IO_URING};
  kvt_io *io = NULL;
  if (kvt_io_create(&c, &io) != 0) { /* refused at setup already: no enter to refuse */
    fprintf(stderr, "note: io_uring unavailable here; refusal at io_uring_enter not checked\n");
    return;
  }
  kvt_io_destroy(io);
  assert_int_equal(refused_child(__NR_io_uring_enter, ENOSYS, "no-op failed: ENOSYS"), 0);
}

static void test_bad_config(void **state) {
  (void)state;
  kvt_io *io = NULL;
  kvt_io_config c = {.backend = KVT_IO_PREAD, .depth = 4097};
  assert_int_equal(kvt_io_create(&c, &io), KVT_EOPTION);
  assert_null(io);
  c = (kvt_io_config){.backend = 3};
  assert_int_equal(kvt_io_create(&c, &io), KVT_EOPTION);
  c = (kvt_io_config){.backend = -1};
  assert_int_equal(kvt_io_create(&c, &io), KVT_EOPTION);
  c = (kvt_io_config){.fault = {.kind = KVT_FAULT_FLIP + 1}};
  assert_int_equal(kvt_io_create(&c, &io), KVT_EOPTION);
  c = (kvt_io_config){.fault = {.kind = KVT_FAULT_EIO, .ops = 1u << 5}};
  assert_int_equal(kvt_io_create(&c, &io), KVT_EOPTION);
  assert_int_equal(kvt_io_create(&c, NULL), KVT_ENULL);
  /* depth 4096 is allowed; depth 0 means 64: the 65th request is refused. */
  for (int b = KVT_IO_AUTO; b <= KVT_IO_PREAD; b++) {
    c = (kvt_io_config){.backend = b, .depth = 4096};
    int rc = kvt_io_create(&c, &io);
    if (b == KVT_IO_URING && rc != 0) continue; /* io_uring refused here */
    assert_int_equal(rc, 0);
    kvt_io_destroy(io);
    c.depth = 0;
    assert_int_equal(kvt_io_create(&c, &io), 0);
    kvt_io_req reqs[65], *ptrs[65], *done[65];
    int zero = open("/dev/zero", O_RDONLY | O_CLOEXEC);
    assert_true(zero >= 0);
    for (int i = 0; i < 65; i++) {
      reqs[i] = (kvt_io_req){.fd = zero, .op = KVT_IO_OP_READ, .buf = NULL, .len = 0};
      ptrs[i] = &reqs[i];
    }
    assert_int_equal(kvt_io_submit(io, ptrs, 65), KVT_ELIMIT);
    assert_int_equal(kvt_io_submit(io, ptrs, 64), 0);
    assert_int_equal(kvt_io_submit(io, ptrs + 64, 1), KVT_ELIMIT);
    size_t n = 0, total = 0;
    while (total < 64) {
      assert_int_equal(kvt_io_reap(io, 1, done, 65, &n), 0);
      total += n;
    }
    assert_int_equal(total, 64);
    kvt_io_destroy(io);
    close(zero);
  }
  /* Malformed requests are refused before anything starts. */
  c = (kvt_io_config){.backend = KVT_IO_PREAD};
  assert_int_equal(kvt_io_create(NULL, &io), 0);
  kvt_io_destroy(io);
  assert_int_equal(kvt_io_create(&c, &io), 0);
  kvt_io_req r = {.fd = 0, .op = 9}, *p = &r;
  assert_int_equal(kvt_io_submit(io, &p, 1), -EINVAL);
  r.op = KVT_IO_OP_READ;
  r.len = 1; /* NULL buffer */
  assert_int_equal(kvt_io_run(io, &r, 1), -EINVAL);
  size_t n = 7;
  assert_int_equal(kvt_io_reap(io, 1, &p, 1, &n), -EINVAL); /* nothing in flight */
  assert_int_equal(n, 0);
  kvt_io_destroy(io);
}

static void test_fs_calls(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  char sub[512], file[600];
  snprintf(sub, sizeof sub, "%s/sub", dir);
  snprintf(file, sizeof file, "%s/file", sub);
  assert_int_equal(kvt_io_mkdir(sub), 0);
  assert_int_equal(kvt_io_mkdir(sub), 0);
  assert_int_equal(kvt_io_exists(file), 0);
  kvt_io *io = mk(KVT_IO_PREAD, 0, NULL);
  int fd = -1;
  assert_int_equal(kvt_io_open(io, file, 0, 0, &fd, NULL), -ENOENT);
  assert_int_equal(kvt_io_open(io, file, 1, 0, &fd, NULL), 0);
  assert_int_equal(kvt_io_exists(file), 1);
  uint64_t size = 1;
  assert_int_equal(kvt_io_file_size(fd, &size), 0);
  assert_int_equal(size, 0);
  assert_int_equal(kvt_io_truncate(fd, 12345), 0);
  assert_int_equal(kvt_io_file_size(fd, &size), 0);
  assert_int_equal(size, 12345);
  assert_int_equal(kvt_io_fsync_dir(sub), 0);
  assert_true(kvt_io_fsync_dir(file) < 0); /* not a directory */
  kvt_io_close(io, fd);
  int ro = -1;
  assert_int_equal(kvt_io_open(io, file, 0, 1, &ro, NULL), 0);
  uint8_t byte = 1;
  kvt_io_req w = {.fd = ro, .op = KVT_IO_OP_WRITE, .buf = &byte, .len = 1};
  assert_int_equal(kvt_io_run(io, &w, 1), -EBADF); /* read-only */
  kvt_io_close(io, ro);
  assert_int_equal(kvt_io_unlink(file), 0);
  assert_int_equal(kvt_io_unlink(file), 0);
  assert_int_equal(kvt_io_exists(file), 0);
  assert_true(kvt_io_memlock_limit() > 0);
  uint8_t *b = kvt_io_buf_alloc(5000);
  assert_non_null(b);
  assert_int_equal((uintptr_t)b % KVT_IO_ALIGN, 0);
  for (int i = 0; i < 8192; i++) assert_int_equal(b[i], 0); /* rounded up, zeroed */
  kvt_io_buf_free(b);
  kvt_io_buf_free(NULL);
  kvt_io_destroy(io);
  tu_rmtree(dir);
}

/* Each test of the suite twice, named after its backend. */
#define BOTH(t) {#t "/uring", t, NULL, NULL, &P_URING}, {#t "/pread", t, NULL, NULL, &P_PREAD}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      BOTH(test_roundtrip),
      BOTH(test_roundtrip_buffered_unaligned),
      BOTH(test_inflight_depth),
      BOTH(test_destroy_inflight),
      BOTH(test_run_completes_short),
      BOTH(test_read_past_eof),
      BOTH(test_fsync),
      BOTH(test_direct_fallback),
      BOTH(test_fault_eio),
      BOTH(test_fault_enospc),
      BOTH(test_fault_short),
      BOTH(test_fault_torn),
      BOTH(test_fault_flip),
      cmocka_unit_test(test_auto),
      cmocka_unit_test(test_auto_fallback),
      cmocka_unit_test(test_bad_config),
      cmocka_unit_test(test_fs_calls),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
