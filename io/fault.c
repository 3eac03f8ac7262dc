/* fault.c - the fault-injecting backend: wraps another and, per the plan,
 * fails, shortens, tears or corrupts chosen calls. Inner sees a private copy
 * of each request; randomness is splitmix64 from plan.seed, so runs replay. */
#include <string.h>

#include "io/backend.h"

typedef struct fault_slot {
  kvt_io_req piece;      /* first: the inner backend hands back &piece */
  kvt_io_req *orig;
  void *copy;            /* FLIP on a write: the corrupted copy written */
  uint8_t flip_read;     /* FLIP on a read: corrupt what comes back */
  uint8_t report_full;   /* TORN: claim the whole length was written */
} fault_slot;

typedef struct fault_be {
  kvt_io_be be;
  kvt_io_be *inner;
  kvt_io_fault plan;
  uint64_t calls;        /* calls of a kind in plan.ops so far */
  uint64_t rng;
  fault_slot *slots;     /* [depth] */
  uint32_t *free_slots;  /* [depth] stack */
  uint32_t n_free;
  kvt_io_req **tmp;      /* [depth] batches to and from inner */
  kvt_io_fifo local;     /* failed here, never reached inner */
} fault_be;

static uint64_t rnd(fault_be *f) {
  uint64_t x = (f->rng += 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Count the call and say which fault, if any, it gets. */
static uint32_t fault_for(fault_be *f, uint8_t op) {
  if (f->plan.kind == KVT_FAULT_NONE || !(f->plan.ops & (1u << op))) return KVT_FAULT_NONE;
  uint64_t n = ++f->calls, after = f->plan.after ? f->plan.after : 1;
  if (n < after || (f->plan.count && n - after >= f->plan.count)) return KVT_FAULT_NONE;
  return f->plan.kind;
}

static void flip_bit(fault_be *f, void *buf, uint32_t len) {
  uint64_t bit = rnd(f) % ((uint64_t)len * 8);
  ((uint8_t *)buf)[bit / 8] ^= (uint8_t)(1u << (bit % 8));
}

static void fail_here(fault_be *f, kvt_io_req *r, int32_t res) {
  r->res = res;
  kvt_io_fifo_push(&f->local, r);
}

/* Shape the piece sent to inner; 0, or the result when it must not go. */
static int32_t prepare(fault_be *f, fault_slot *s, uint32_t kind) {
  kvt_io_req *p = &s->piece;
  if (p->op == KVT_IO_OP_FSYNC) return 0; /* only EIO and ENOSPC apply to a sync */
  if (kind == KVT_FAULT_SHORT) p->len = (p->len / 2) & ~511u;
  if (kind == KVT_FAULT_TORN && p->op == KVT_IO_OP_WRITE) {
    p->len = p->len < 512 ? 0 : (uint32_t)(rnd(f) % (p->len / 512)) * 512; /* < len */
    s->report_full = 1;
  }
  if (kind == KVT_FAULT_FLIP && p->len && p->op == KVT_IO_OP_READ) s->flip_read = 1;
  if (kind == KVT_FAULT_FLIP && p->len && p->op == KVT_IO_OP_WRITE) {
    if (!(s->copy = kvt_io_buf_alloc(p->len))) return -ENOMEM;
    memcpy(s->copy, p->buf, p->len);
    flip_bit(f, s->copy, p->len);
    p->buf = s->copy;
  }
  return 0;
}

static void release(fault_be *f, fault_slot *s) {
  kvt_io_buf_free(s->copy);
  f->free_slots[f->n_free++] = (uint32_t)(s - f->slots);
}

static int fault_submit(kvt_io_be *be, kvt_io_req *const *reqs, size_t n) {
  fault_be *f = (fault_be *)be;
  size_t batch = 0;
  for (size_t i = 0; i < n; i++) {
    kvt_io_req *r = reqs[i];
    uint32_t kind = fault_for(f, r->op);
    if (kind == KVT_FAULT_EIO || kind == KVT_FAULT_ENOSPC) {
      fail_here(f, r, kind == KVT_FAULT_EIO ? -EIO : -ENOSPC);
      continue;
    }
    fault_slot *s = &f->slots[f->free_slots[--f->n_free]];
    *s = (fault_slot){.piece = *r, .orig = r};
    int32_t res = prepare(f, s, kind);
    if (res < 0) {
      release(f, s);
      fail_here(f, r, res);
      continue;
    }
    f->tmp[batch++] = &s->piece;
  }
  int rc = batch ? f->inner->m->submit(f->inner, f->tmp, batch) : 0;
  if (rc < 0) { /* none of the batch started: they complete here, failed */
    for (size_t i = 0; i < batch; i++) {
      fault_slot *s = (fault_slot *)f->tmp[i];
      kvt_io_req *r = s->orig;
      release(f, s);
      fail_here(f, r, rc);
    }
  }
  return 0;
}

static kvt_io_req *finish(fault_be *f, kvt_io_req *piece) {
  fault_slot *s = (fault_slot *)piece;
  kvt_io_req *r = s->orig;
  int32_t res = piece->res;
  if (s->report_full && res >= 0) res = (int32_t)r->len;
  if (s->flip_read && res > 0) flip_bit(f, r->buf, (uint32_t)res);
  r->res = res;
  release(f, s);
  return r;
}

static int fault_reap(kvt_io_be *be, size_t min, kvt_io_req **done, size_t max, size_t *n_done) {
  fault_be *f = (fault_be *)be;
  size_t k = 0, got = 0;
  int rc = 0;
  while (k < max && f->local.n) done[k++] = kvt_io_fifo_pop(&f->local);
  if (k < max) { /* all local ones taken, so min - k <= what inner has in flight */
    rc = f->inner->m->reap(f->inner, min > k ? min - k : 0, f->tmp, max - k, &got);
    for (size_t i = 0; i < got; i++) done[k++] = finish(f, f->tmp[i]);
  }
  *n_done = k;
  return rc;
}

static void fault_destroy(kvt_io_be *be) {
  fault_be *f = (fault_be *)be;
  if (f->inner) f->inner->m->destroy(f->inner);
  free(f->slots);
  free(f->free_slots);
  free(f->tmp);
  free(f->local.q);
  free(f);
}

static const kvt_io_methods fault_methods = {"fault", fault_submit, fault_reap, fault_destroy};

void kvt_io_fault_set(kvt_io_be *be, const kvt_io_fault *plan) {
  fault_be *f = (fault_be *)be;
  f->plan = *plan;
  f->calls = 0; /* `after` counts from the new plan */
  f->rng = plan->seed;
}

int kvt_io_fault_create(kvt_io_be *inner, uint32_t depth, const kvt_io_fault *plan,
                        kvt_io_be **out) {
  fault_be *f = calloc(1, sizeof *f);
  if (!f) {
    inner->m->destroy(inner);
    return -ENOMEM;
  }
  f->be.m = &fault_methods;
  f->inner = inner;
  f->slots = calloc(depth, sizeof *f->slots);
  f->free_slots = calloc(depth, sizeof *f->free_slots);
  f->tmp = calloc(depth, sizeof *f->tmp);
  if (!f->slots || !f->free_slots || !f->tmp || kvt_io_fifo_init(&f->local, depth)) {
    fault_destroy(&f->be);
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < depth; i++) f->free_slots[f->n_free++] = depth - 1 - i;
  kvt_io_fault_set(&f->be, plan);
  *out = &f->be;
  return 0;
}
