/* io.c - the I/O layer's front (io.h): config and the AUTO choice, checks
 * of arguments and depth done once for all backends (backend.h), kvt_io_run,
 * O_DIRECT opens with their buffered fallback, plain file-system calls. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/backend.h"
#include "kvtier.h"

enum { DEPTH_DEFAULT = 64, DEPTH_MAX = 4096 };

/* One piece of a kvt_io_run request in flight; piece first, so the
 * completed request pointer is the slot. */
typedef struct run_slot {
  kvt_io_req piece;
  size_t idx;            /* which of the caller's requests */
  uint32_t done;         /* bytes transferred before this piece */
} run_slot;

struct kvt_io {
  kvt_io_be *be;         /* the top backend: the fault wrapper when faulting */
  int faulting;
  int no_direct;
  uint32_t depth;
  uint32_t inflight;     /* submitted, not yet reaped */
  run_slot *slots;       /* [depth] for kvt_io_run */
  uint32_t *free_slots;  /* [depth] */
  kvt_io_req **batch;    /* [depth] */
  kvt_io_req **done;     /* [depth] */
  char name[24];
  char why[160];
};

/* ---------------------------------------------------------------- create */

static int check_config(const kvt_io_config *c) {
  if (c->backend < KVT_IO_AUTO || c->backend > KVT_IO_PREAD) return KVT_EOPTION;
  if (c->depth > DEPTH_MAX) return KVT_EOPTION;
  if (c->fault.kind > KVT_FAULT_FLIP) return KVT_EOPTION;
  uint32_t all_ops = (1u << KVT_IO_OP_READ) | (1u << KVT_IO_OP_WRITE) | (1u << KVT_IO_OP_FSYNC);
  if (c->fault.ops & ~all_ops) return KVT_EOPTION;
  return 0;
}

/* io_uring refusals that mean "not here" rather than "not now". */
static int uring_refused(int rc) {
  return rc == -EPERM || rc == -ENOSYS || rc == -EINVAL || rc == -ENOMEM;
}

static int make_backend(kvt_io *io, int backend) {
  char fail[96] = "";
  int rc = -ENOSYS;
  if (backend != KVT_IO_PREAD) {
    rc = kvt_io_uring_create(io->depth, &io->be, fail, sizeof fail);
    if (rc == 0) {
      snprintf(io->why, sizeof io->why,
               "io_uring %s (ring init + no-op probe ok), depth %u; plain buffers: registered "
               "ones gained ~0 at 4 KiB, <10%% (in noise) at 128 KiB",
               backend == KVT_IO_URING ? "forced" : "works", io->depth);
      return 0;
    }
    if (rc == -ENOMEM && !fail[0]) return rc; /* our own allocation */
    if (backend == KVT_IO_URING || !uring_refused(rc)) return rc;
  }
  rc = kvt_io_pread_create(io->depth, &io->be);
  if (rc == 0 && backend == KVT_IO_PREAD) snprintf(io->why, sizeof io->why, "pread forced by config");
  else if (rc == 0) snprintf(io->why, sizeof io->why, "pread: io_uring refused here (%s)", fail);
  return rc;
}

int kvt_io_create(const kvt_io_config *cfg, kvt_io **out) {
  if (!out) return KVT_ENULL;
  *out = NULL;
  kvt_io_config c = {0};
  if (cfg) c = *cfg;
  int rc = check_config(&c);
  if (rc) return rc;
  kvt_io *io = calloc(1, sizeof *io);
  if (!io) return -ENOMEM;
  io->depth = c.depth ? c.depth : DEPTH_DEFAULT;
  io->no_direct = c.no_direct;
  io->slots = calloc(io->depth, sizeof *io->slots);
  io->free_slots = calloc(io->depth, sizeof *io->free_slots);
  io->batch = calloc(io->depth, sizeof *io->batch);
  io->done = calloc(io->depth, sizeof *io->done);
  rc = (io->slots && io->free_slots && io->batch && io->done) ? 0 : -ENOMEM;
  if (rc == 0) rc = make_backend(io, c.backend);
  if (rc == 0) {
    snprintf(io->name, sizeof io->name, "%s", io->be->m->name);
    if (c.fault.kind != KVT_FAULT_NONE) {
      snprintf(io->name, sizeof io->name, "fault+%s", io->be->m->name);
      io->faulting = 1;
      rc = kvt_io_fault_create(io->be, io->depth, &c.fault, &io->be);
      if (rc) io->be = NULL; /* the wrapper destroyed inner */
    }
  }
  if (rc) {
    kvt_io_destroy(io);
    return rc;
  }
  *out = io;
  return 0;
}

void kvt_io_destroy(kvt_io *io) {
  if (!io) return;
  /* Buffers of requests in flight belong to the kernel until they
   * complete: wait for them (a broken ring gives up). */
  while (io->inflight) {
    size_t n = 0;
    if (kvt_io_reap(io, 1, io->done, io->depth, &n) < 0) break;
  }
  if (io->be) io->be->m->destroy(io->be);
  free(io->slots);
  free(io->free_slots);
  free(io->batch);
  free(io->done);
  free(io);
}

const char *kvt_io_backend_name(const kvt_io *io) { return io ? io->name : "none"; }
const char *kvt_io_why(const kvt_io *io) { return io ? io->why : "no I/O context"; }

int kvt_io_set_fault(kvt_io *io, const kvt_io_fault *f) {
  if (!io || !f) return KVT_ENULL;
  if (!io->faulting || f->kind > KVT_FAULT_FLIP) return KVT_EOPTION;
  kvt_io_fault_set(io->be, f);
  return 0;
}

/* ------------------------------------------------------------ open/close */

static int open_flags(kvt_io *io, const char *path, int flags, int *fd, int *direct);

int kvt_io_open(kvt_io *io, const char *path, int create, int rdonly, int *fd, int *direct) {
  int flags = (rdonly ? O_RDONLY : O_RDWR) | O_CLOEXEC | (create ? O_CREAT : 0);
  return open_flags(io, path, flags, fd, direct);
}

/* O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOFOLLOW: a
 * symbolic link is not a data file of ours. Neither changes how a regular
 * file behaves. */
int kvt_io_open_regular(kvt_io *io, const char *path, int create, int rdonly, int *fd,
                        int *direct) {
  int flags = (rdonly ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK |
              (create ? O_CREAT : 0);
  int f = -1;
  int rc = open_flags(io, path, flags, &f, direct);
  if (rc) return rc;
  struct stat st;
  if (fstat(f, &st) != 0) rc = -errno;
  else if (S_ISDIR(st.st_mode)) rc = -EISDIR;
  else if (!S_ISREG(st.st_mode)) rc = -EINVAL;
  if (rc) {
    close(f);
    return rc;
  }
  *fd = f;
  return 0;
}

static int open_flags(kvt_io *io, const char *path, int flags, int *fd, int *direct) {
  int want = !(io && io->no_direct);
  int f = -1;
  if (want) {
    f = open(path, flags | O_DIRECT, 0644);
    if (f < 0 && errno != EINVAL) return -errno;
  }
  if (f < 0) {
    want = 0;
    f = open(path, flags, 0644);
    if (f < 0) return -errno;
  }
  *fd = f;
  if (direct) *direct = want;
  return 0;
}

void kvt_io_close(kvt_io *io, int fd) {
  (void)io;
  if (fd >= 0) close(fd);
}

/* ---------------------------------------------------------- submit/reap */

static int req_ok(const kvt_io_req *r) {
  if (!r || r->fd < 0) return 0;
  if (r->op == KVT_IO_OP_FSYNC) return 1;
  if (r->op != KVT_IO_OP_READ && r->op != KVT_IO_OP_WRITE) return 0;
  return (r->buf || r->len == 0) && r->len <= INT32_MAX; /* res must hold len */
}

int kvt_io_submit(kvt_io *io, kvt_io_req *const *reqs, size_t n) {
  if (!io || (!reqs && n)) return KVT_ENULL;
  if (n > io->depth - io->inflight) return KVT_ELIMIT;
  for (size_t i = 0; i < n; i++)
    if (!req_ok(reqs[i])) return -EINVAL;
  if (n == 0) return 0;
  int rc = io->be->m->submit(io->be, reqs, n);
  if (rc == 0) io->inflight += (uint32_t)n;
  return rc;
}

int kvt_io_reap(kvt_io *io, size_t min, kvt_io_req **done, size_t max, size_t *n_done) {
  if (!io || !n_done || (!done && max)) return KVT_ENULL;
  *n_done = 0;
  if (min > max || min > io->inflight) return -EINVAL; /* would wait forever */
  if (max > io->inflight) max = io->inflight;
  if (max == 0) return 0;
  int rc = io->be->m->reap(io->be, min, done, max, n_done);
  io->inflight -= (uint32_t)*n_done;
  return rc;
}

/* ------------------------------------------------------------------ run */

#define RUN_PENDING (-EINPROGRESS) /* res of a request kvt_io_run has not finished */

/* A piece came back: 1 when its request is finished (reqs[idx].res set),
 * 0 when the rest was put in place to be resubmitted. */
static int piece_done(run_slot *s, kvt_io_req *reqs) {
  kvt_io_req *r = &reqs[s->idx], *p = &s->piece;
  int32_t res = p->res;
  /* A rest that O_DIRECT refuses (unaligned after a short transfer, as at
   * end of file) ends the request short, not failed. */
  if (res == -EINVAL && s->done) res = 0;
  if (res < 0 || r->op == KVT_IO_OP_FSYNC) {
    r->res = res;
    return 1;
  }
  s->done += (uint32_t)res;
  /* Full, or no progress: end of file for a read, -EIO below for a write. */
  if (s->done >= r->len || res == 0) {
    r->res = (int32_t)s->done;
    return 1;
  }
  p->buf = (uint8_t *)p->buf + res;
  p->off += (uint32_t)res;
  p->len -= (uint32_t)res;
  return 0;
}

/* Every slot is free, in flight or in the batch to submit, so a batch
 * never exceeds what the depth allows. */
int kvt_io_run(kvt_io *io, kvt_io_req *reqs, size_t n) {
  if (!io || (!reqs && n)) return KVT_ENULL;
  if (io->inflight) return KVT_ESTATE; /* their completions are the caller's */
  for (size_t i = 0; i < n; i++)
    if (!req_ok(&reqs[i])) return -EINVAL;
  for (size_t i = 0; i < n; i++) reqs[i].res = RUN_PENDING;
  uint32_t n_free = 0;
  for (uint32_t i = 0; i < io->depth; i++) io->free_slots[n_free++] = io->depth - 1 - i;
  size_t next = 0, nb = 0;
  int stop = 0; /* submit or reap failed: start nothing new */
  while (nb || io->inflight || (!stop && next < n)) {
    while (!stop && next < n && n_free) {
      run_slot *s = &io->slots[io->free_slots[--n_free]];
      *s = (run_slot){.piece = reqs[next], .idx = next};
      io->batch[nb++] = &s->piece;
      next++;
    }
    int rc = nb ? kvt_io_submit(io, io->batch, nb) : 0;
    if (rc < 0) { /* none of the batch started */
      for (size_t i = 0; i < nb; i++) {
        run_slot *s = (run_slot *)io->batch[i];
        reqs[s->idx].res = rc;
        io->free_slots[n_free++] = (uint32_t)(s - io->slots);
      }
      stop = rc;
    }
    nb = 0;
    if (!io->inflight) continue;
    size_t got = 0;
    rc = kvt_io_reap(io, 1, io->done, io->depth, &got);
    if (rc < 0 && !got) {
      stop = rc;
      break; /* a broken ring: what is in flight cannot be waited for */
    }
    for (size_t i = 0; i < got; i++) {
      run_slot *s = (run_slot *)io->done[i];
      if (piece_done(s, reqs)) io->free_slots[n_free++] = (uint32_t)(s - io->slots);
      else io->batch[nb++] = &s->piece;
    }
  }
  for (size_t i = 0; i < n; i++) {
    if (reqs[i].res == RUN_PENDING) reqs[i].res = stop;
    if (reqs[i].res < 0) return reqs[i].res;
    if (reqs[i].op != KVT_IO_OP_FSYNC && (uint32_t)reqs[i].res != reqs[i].len) return -EIO;
  }
  return 0;
}

int kvt_io_sync(kvt_io *io, int fd) {
  kvt_io_req r = {.fd = fd, .op = KVT_IO_OP_FSYNC};
  return kvt_io_run(io, &r, 1);
}

/* -------------------------------------------------------------- buffers */

void *kvt_io_buf_alloc(size_t len) {
  size_t rounded = (len + KVT_IO_ALIGN - 1) & ~(size_t)(KVT_IO_ALIGN - 1);
  if (rounded < len) return NULL;
  if (rounded == 0) rounded = KVT_IO_ALIGN;
  void *p = aligned_alloc(KVT_IO_ALIGN, rounded);
  if (p) memset(p, 0, rounded);
  return p;
}

void kvt_io_buf_free(void *buf) { free(buf); }

/* -------------------------------------------------- plain file system */

int kvt_io_mkdir(const char *path) {
  return (mkdir(path, 0755) == 0 || errno == EEXIST) ? 0 : -errno;
}

int kvt_io_unlink(const char *path) {
  return (unlink(path) == 0 || errno == ENOENT) ? 0 : -errno;
}

int kvt_io_fsync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int rc = fsync(fd) == 0 ? 0 : -errno;
  close(fd);
  return rc;
}

int kvt_io_file_size(int fd, uint64_t *size) {
  struct stat st;
  if (fstat(fd, &st) != 0) return -errno;
  *size = (uint64_t)st.st_size;
  return 0;
}

int kvt_io_path_size(const char *path, uint64_t *size) {
  struct stat st;
  if (lstat(path, &st) != 0) return -errno;
  if (!S_ISREG(st.st_mode)) return -EINVAL;
  *size = (uint64_t)st.st_size;
  return 0;
}

int kvt_io_truncate(int fd, uint64_t size) {
  int rc;
  do rc = ftruncate(fd, (off_t)size);
  while (rc != 0 && errno == EINTR);
  return rc == 0 ? 0 : -errno;
}

int kvt_io_exists(const char *path) { return access(path, F_OK) == 0; }

int kvt_io_prealloc(const char *path, uint64_t bytes) {
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return -errno;
  int rc = posix_fallocate(fd, 0, (off_t)bytes); /* an error number, not -1 */
  close(fd);
  return -rc;
}

int kvt_io_writable(const char *path) { return access(path, W_OK) == 0; }

uint64_t kvt_io_nofile_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
}

uint64_t kvt_io_memlock_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 0;
  return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
}
