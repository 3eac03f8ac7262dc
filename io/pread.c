/* pread.c - the synchronous backend: submit performs each request at once
 * with pread/pwrite/fdatasync and queues it as completed; reap hands the
 * queue back. Relies on io.c keeping at most depth requests in flight. */
#include <errno.h>
#include <unistd.h>

#include "io/backend.h"

typedef struct pread_be {
  kvt_io_be be;
  kvt_io_fifo done;
} pread_be;

/* One system call, as io_uring would make: a short count is returned as
 * it is (kvt_io_run completes it); only EINTR is retried. */
static int32_t perform(const kvt_io_req *r) {
  ssize_t n;
  do {
    if (r->op == KVT_IO_OP_READ) n = pread(r->fd, r->buf, r->len, (off_t)r->off);
    else if (r->op == KVT_IO_OP_WRITE) n = pwrite(r->fd, r->buf, r->len, (off_t)r->off);
    else n = fdatasync(r->fd);
  } while (n < 0 && errno == EINTR);
  return n < 0 ? -errno : (int32_t)n;
}

static int pread_submit(kvt_io_be *be, kvt_io_req *const *reqs, size_t n) {
  pread_be *p = (pread_be *)be;
  for (size_t i = 0; i < n; i++) {
    reqs[i]->res = perform(reqs[i]);
    kvt_io_fifo_push(&p->done, reqs[i]);
  }
  return 0;
}

/* Everything submitted has completed, so min is always met. */
static int pread_reap(kvt_io_be *be, size_t min, kvt_io_req **done, size_t max, size_t *n_done) {
  pread_be *p = (pread_be *)be;
  size_t k = 0;
  (void)min;
  while (k < max && p->done.n) done[k++] = kvt_io_fifo_pop(&p->done);
  *n_done = k;
  return 0;
}

static void pread_destroy(kvt_io_be *be) {
  pread_be *p = (pread_be *)be;
  free(p->done.q);
  free(p);
}

static const kvt_io_methods pread_methods = {"pread", pread_submit, pread_reap, pread_destroy};

int kvt_io_pread_create(uint32_t depth, kvt_io_be **out) {
  pread_be *p = calloc(1, sizeof *p);
  if (!p || kvt_io_fifo_init(&p->done, depth)) {
    free(p);
    return -ENOMEM;
  }
  p->be.m = &pread_methods;
  *out = &p->be;
  return 0;
}
