/* uring.c - the io_uring backend (liburing): one ring of `depth` entries,
 * user_data = the request, plain (unregistered) buffers. Relies on io.c
 * for at most depth in flight, so the SQ ring never fills. */
#include <errno.h>
#include <liburing.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "io/backend.h"

typedef struct uring_be {
  kvt_io_be be;
  struct io_uring ring;
} uring_be;

enum { CQE_BATCH = 64, BUSY_RETRIES = 1000 };

/* io_uring_enter can fail for a moment (EINTR, or EAGAIN/EBUSY while the
 * kernel is short of memory); anything else is a broken ring. */
static int transient(int rc, int *tries) {
  if (rc == -EINTR) return 1;
  if ((rc == -EAGAIN || rc == -EBUSY) && ++*tries < BUSY_RETRIES) {
    sched_yield();
    return 1;
  }
  return 0;
}

/* Prepared SQEs that the kernel did not take stay in the SQ ring and are
 * flushed by the next submit or reap, so nothing is lost or run twice:
 * submit never reports a request as not started that may still start. */
static int uring_submit(kvt_io_be *be, kvt_io_req *const *reqs, size_t n) {
  uring_be *u = (uring_be *)be;
  for (size_t i = 0; i < n; i++) {
    kvt_io_req *r = reqs[i];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring); /* never NULL: <= depth in flight */
    if (r->op == KVT_IO_OP_READ) io_uring_prep_read(sqe, r->fd, r->buf, r->len, r->off);
    else if (r->op == KVT_IO_OP_WRITE) io_uring_prep_write(sqe, r->fd, r->buf, r->len, r->off);
    else io_uring_prep_fsync(sqe, r->fd, IORING_FSYNC_DATASYNC);
    io_uring_sqe_set_data(sqe, r);
  }
  int rc;
  do rc = io_uring_submit(&u->ring);
  while (rc == -EINTR);
  return 0;
}

static size_t harvest(uring_be *u, kvt_io_req **done, size_t room) {
  struct io_uring_cqe *cqes[CQE_BATCH];
  unsigned got = io_uring_peek_batch_cqe(&u->ring, cqes, room < CQE_BATCH ? (unsigned)room : CQE_BATCH);
  for (unsigned i = 0; i < got; i++) {
    kvt_io_req *r = io_uring_cqe_get_data(cqes[i]);
    r->res = cqes[i]->res;
    done[i] = r;
  }
  io_uring_cq_advance(&u->ring, got);
  return got;
}

static int uring_reap(kvt_io_be *be, size_t min, kvt_io_req **done, size_t max, size_t *n_done) {
  uring_be *u = (uring_be *)be;
  size_t k = 0;
  int rc = 0, tries = 0;
  if (io_uring_sq_ready(&u->ring)) io_uring_submit(&u->ring); /* left over from submit */
  for (;;) {
    size_t got = k < max ? harvest(u, done + k, max - k) : 0;
    k += got;
    if (got) continue;
    if (k >= min) break;
    rc = io_uring_submit_and_wait(&u->ring, (unsigned)(min - k));
    if (rc < 0 && !transient(rc, &tries)) break;
    rc = 0;
  }
  *n_done = k;
  return rc;
}

static void uring_destroy(kvt_io_be *be) {
  uring_be *u = (uring_be *)be;
  io_uring_queue_exit(&u->ring);
  free(u);
}

static const kvt_io_methods uring_methods = {"uring", uring_submit, uring_reap, uring_destroy};

static const char *ename(int rc) {
  const char *s = strerrorname_np(-rc);
  return s ? s : "?";
}

/* The probe: kernel support for the opcodes we use, then one no-op through
 * the ring (seccomp may allow io_uring_setup yet refuse io_uring_enter). */
static int probe(struct io_uring *ring, char *why, size_t why_len) {
  struct io_uring_probe *p = io_uring_get_probe_ring(ring);
  static const int ops[] = {IORING_OP_NOP, IORING_OP_READ, IORING_OP_WRITE, IORING_OP_FSYNC};
  int ok = p != NULL;
  for (size_t i = 0; ok && i < sizeof ops / sizeof ops[0]; i++)
    ok = io_uring_opcode_supported(p, ops[i]);
  io_uring_free_probe(p);
  if (!ok) {
    snprintf(why, why_len, "io_uring lacks READ/WRITE/FSYNC (kernel < 5.6)");
    return -ENOSYS;
  }
  struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
  struct io_uring_cqe *cqe;
  io_uring_prep_nop(sqe);
  int rc = io_uring_submit(ring);
  if (rc >= 0) rc = io_uring_wait_cqe(ring, &cqe);
  if (rc >= 0) {
    rc = cqe->res;
    io_uring_cqe_seen(ring, cqe);
  }
  if (rc < 0) snprintf(why, why_len, "io_uring no-op failed: %s", ename(rc));
  return rc < 0 ? rc : 0;
}

/* No registered buffers: measured here on O_DIRECT random reads they gained
 * nothing at 4 KiB and 5-10% at 128 KiB (inside the disk's noise, though a
 * third less CPU per read), and they would need a pool owned by the ring
 * and capped by the memlock limit instead of the caller's buffers.
 * No SINGLE_ISSUER/DEFER_TASKRUN: different threads may take turns. */
int kvt_io_uring_create(uint32_t depth, kvt_io_be **out, char *why, size_t why_len) {
  uring_be *u = calloc(1, sizeof *u);
  if (!u) return -ENOMEM;
  /* SUBMIT_ALL (5.18): a request that fails at submission gets a CQE
   * instead of stopping the batch. Older kernels refuse the flag. */
  struct io_uring_params p = {.flags = IORING_SETUP_SUBMIT_ALL};
  int rc = io_uring_queue_init_params(depth, &u->ring, &p);
  if (rc == -EINVAL) {
    memset(&p, 0, sizeof p);
    rc = io_uring_queue_init_params(depth, &u->ring, &p);
  }
  if (rc < 0) {
    snprintf(why, why_len, "io_uring_queue_init: %s", ename(rc));
    free(u);
    return rc;
  }
  rc = probe(&u->ring, why, why_len);
  if (rc < 0) {
    uring_destroy(&u->be);
    return rc;
  }
  u->be.m = &uring_methods;
  *out = &u->be;
  return 0;
}
