/* backend.h - the method table behind io.h, private to io/. io.c checks
 * every argument and the depth limit once, so a backend may trust that ops
 * are valid, that at most `depth` requests are in flight and min <= max. */
#ifndef KVT_IO_BACKEND_H
#define KVT_IO_BACKEND_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "io/io.h"

typedef struct kvt_io_be kvt_io_be;

typedef struct kvt_io_methods {
  const char *name;
  /* Start n requests; 0, or -errno when none of them was started. */
  int (*submit)(kvt_io_be *be, kvt_io_req *const *reqs, size_t n);
  /* Collect at least min (<= in flight), at most max completions. */
  int (*reap)(kvt_io_be *be, size_t min, kvt_io_req **done, size_t max, size_t *n_done);
  /* Called with nothing in flight. */
  void (*destroy)(kvt_io_be *be);
} kvt_io_methods;

struct kvt_io_be {
  const kvt_io_methods *m;
};

/* On failure, why (why_len bytes) says which step failed and with what. */
int kvt_io_uring_create(uint32_t depth, kvt_io_be **out, char *why, size_t why_len);
int kvt_io_pread_create(uint32_t depth, kvt_io_be **out);
/* Takes ownership of inner (destroyed with the wrapper, or on failure). */
int kvt_io_fault_create(kvt_io_be *inner, uint32_t depth, const kvt_io_fault *f,
                        kvt_io_be **out);
void kvt_io_fault_set(kvt_io_be *be, const kvt_io_fault *f);

/* A FIFO of completed requests, bounded by depth (never overflows because
 * io.c never lets more than depth be in flight). */
typedef struct kvt_io_fifo {
  kvt_io_req **q;
  uint32_t cap, head, n;
} kvt_io_fifo;

static inline int kvt_io_fifo_init(kvt_io_fifo *f, uint32_t cap) {
  f->q = calloc(cap, sizeof *f->q);
  f->cap = cap;
  f->head = f->n = 0;
  return f->q ? 0 : -ENOMEM;
}

static inline void kvt_io_fifo_push(kvt_io_fifo *f, kvt_io_req *r) {
  f->q[(f->head + f->n++) % f->cap] = r;
}

static inline kvt_io_req *kvt_io_fifo_pop(kvt_io_fifo *f) {
  kvt_io_req *r = f->q[f->head];
  f->head = (f->head + 1) % f->cap;
  f->n--;
  return r;
}

#endif
