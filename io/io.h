/* io.h - the I/O layer: everything kvtier does to the file system goes
 * through here; the engine and tiers never make a system call. In the
 * spirit of SQLite's VFS, a small method table with backends:
 *   uring  - liburing, O_DIRECT where the file system allows it, 4 KiB
 *            alignment, registered buffers when the memlock limit allows;
 *   pread  - pread/pwrite/fdatasync, the fallback where io_uring is refused
 *            (seccomp, io_uring_disabled) or forced;
 *   fault  - wraps either one and injects errors for tests.
 * A kvt_io is used by one thread at a time (its owner, or under the
 * caller's lock): it is not internally synchronized. */
#ifndef KVT_IO_H
#define KVT_IO_H

#include <stddef.h>
#include <stdint.h>

/* ---- the store directory and its writer lock ---- */

/* Open store directory dir. A writer (rdonly == 0) creates it when create
 * is set and takes an exclusive flock() on the directory dir itself (not
 * on a file in it, which could be unlinked under the writer), held
 * through *lock_fd until kvt_io_dir_close(); the kernel releases it if
 * the process dies. A reader takes no lock and *lock_fd is -1.
 * Returns 0; KVT_ELOCKED when another writer holds the lock; -ENOENT,
 * -ENOTDIR or another -errno. */
int kvt_io_dir_open(const char *dir, int create, int rdonly, int *lock_fd);
void kvt_io_dir_close(int lock_fd);
/* The pid of the writer that holds dir's lock, as it wrote it in LOCK when
 * it took the lock; 0 when unknown (no lock file, or no pid in it). */
int kvt_io_lock_owner(const char *dir);
/* A shared flock() on dir: no writer can start while it is held. 0 or
 * KVT_ELOCKED (a writer holds the store) or -errno; release with
 * kvt_io_dir_unshare(). */
int kvt_io_dir_share(const char *dir, int *lock_fd);
void kvt_io_dir_unshare(int lock_fd);
/* 1 when dir's lock is held only shared (read-only opens without access to
 * LMDB's lock file), 0 when a writer holds it or nobody does. */
int kvt_io_dir_readers_only(const char *dir);

/* ---- backends ---- */

#define KVT_IO_ALIGN 4096u   /* offsets, lengths and buffers of direct I/O */

enum kvt_io_backend {
  KVT_IO_AUTO = 0,   /* io_uring if it works here, else pread */
  KVT_IO_URING = 1,  /* io_uring or fail */
  KVT_IO_PREAD = 2,  /* pread/pwrite */
};

enum kvt_io_op { KVT_IO_OP_READ = 1, KVT_IO_OP_WRITE = 2, KVT_IO_OP_FSYNC = 3 };

/* One request. buf, len and off must be KVT_IO_ALIGN-aligned when the file
 * was opened direct. FSYNC is fdatasync(fd) and ignores buf/len/off. */
typedef struct kvt_io_req {
  int fd;
  uint8_t op;            /* kvt_io_op */
  void *buf;
  uint32_t len;
  uint64_t off;
  int32_t res;           /* out: bytes transferred (may be short) or -errno */
  void *user;            /* caller's; untouched */
} kvt_io_req;

/* Fault injection (tests). Each I/O call of a kind in `ops` counts; from
 * call number `after` (1-based) on, `count` calls (0 = all) fail the way
 * `kind` says. Calls are counted in submission order (kvt_io_run submits
 * in request order, each resubmitted rest of a short transfer is a call).
 * EIO and ENOSPC strike any op in `ops`; SHORT, TORN and FLIP leave syncs
 * alone. */
enum kvt_io_fault_kind {
  KVT_FAULT_NONE = 0,
  KVT_FAULT_EIO,         /* res = -EIO, nothing transferred */
  KVT_FAULT_ENOSPC,      /* writes: res = -ENOSPC, nothing written */
  KVT_FAULT_SHORT,       /* res = half the length (rounded down to 512),
                            only that much transferred */
  KVT_FAULT_TORN,        /* writes: only a prefix of random length reaches
                            the file, but res says all of it was written */
  KVT_FAULT_FLIP,        /* reads: one random bit flipped in what is returned;
                            writes: one random bit flipped in what is stored */
};

typedef struct kvt_io_fault {
  uint32_t ops;          /* bit (1 << kvt_io_op) for each kind of call */
  uint32_t kind;         /* kvt_io_fault_kind */
  uint64_t after;
  uint64_t count;
  uint64_t seed;         /* for the random parts */
} kvt_io_fault;

typedef struct kvt_io_config {
  int backend;           /* kvt_io_backend */
  uint32_t depth;        /* queue depth (io_uring entries), 1 .. 4096; 0 = 64 */
  int no_direct;         /* 1: never O_DIRECT */
  kvt_io_fault fault;    /* kind NONE: no fault backend */
} kvt_io_config;

typedef struct kvt_io kvt_io;

/* Create an I/O context. With KVT_IO_AUTO, io_uring is probed once
 * (queue init plus a no-op request); on EPERM/ENOSYS/EINVAL/ENOMEM it falls
 * back to pread and kvt_io_why() says why. Returns 0; KVT_EOPTION;
 * -ENOSYS etc. when KVT_IO_URING was forced and does not work; -ENOMEM. */
int kvt_io_create(const kvt_io_config *cfg, kvt_io **out);
void kvt_io_destroy(kvt_io *io); /* accepts NULL; waits for requests in flight */
const char *kvt_io_backend_name(const kvt_io *io); /* "uring", "pread", "fault+uring", ... */
const char *kvt_io_why(const kvt_io *io);          /* why this backend; never NULL */
/* Replace the fault plan (fault backend only; KVT_EOPTION otherwise); the
 * call count starts again from 0 and the random stream from f->seed. */
int kvt_io_set_fault(kvt_io *io, const kvt_io_fault *f);

/* Open path read-write (or read-only) with O_CLOEXEC, creating it (0644)
 * when create is set. With direct wanted and allowed, O_DIRECT; when the
 * file system refuses it (EINVAL, tmpfs) the file is opened buffered and
 * *direct is 0. Returns 0 or -errno.
 * "Wanted" is the config's no_direct == 0; *direct is output only (1 when
 * the file is O_DIRECT) and may be NULL. tmpfs accepts O_DIRECT since
 * Linux 6.6; /proc files and devices still refuse it. */
int kvt_io_open(kvt_io *io, const char *path, int create, int rdonly, int *fd, int *direct);
void kvt_io_close(kvt_io *io, int fd);
/* The same for a data file that must be a regular file: opened with
 * O_NONBLOCK (a FIFO in its place does not block the open) and
 * O_NOFOLLOW. Returns 0 or -errno: -ELOOP a symbolic link, -EISDIR a
 * directory, -EINVAL another kind of file (FIFO, socket, device). */
int kvt_io_open_regular(kvt_io *io, const char *path, int create, int rdonly, int *fd,
                        int *direct);

/* Queue n requests and start them. Completion order is not request order.
 * Returns 0 or -errno for a failure to submit at all (each request's own
 * result comes through kvt_io_reap). At most `depth` requests may be in
 * flight: the caller reaps before submitting more.
 * Nothing is started when it returns KVT_ELIMIT (more than depth would be
 * in flight) or -EINVAL (a request with an unknown op, fd < 0, a NULL buf
 * with len > 0, or len > INT32_MAX). */
int kvt_io_submit(kvt_io *io, kvt_io_req *const *reqs, size_t n);
/* Wait until at least min requests have completed (0: do not wait), store
 * up to max of them in done[], *n_done how many. Returns 0 or -errno;
 * -EINVAL, waiting for nothing, when min > max or min > requests in flight. */
int kvt_io_reap(kvt_io *io, size_t min, kvt_io_req **done, size_t max, size_t *n_done);
/* Submit all n requests (in rounds of depth) and wait for every one.
 * Short transfers are completed by resubmitting the rest (a short read at
 * end of file stops there). Returns 0 when every request transferred its
 * full length, else the first failure in request order: -errno, or -EIO
 * for a short transfer that could not be completed.
 * kvt_io_run and kvt_io_sync reap whatever completes, so they return
 * KVT_ESTATE while requests of kvt_io_submit are still in flight. */
int kvt_io_run(kvt_io *io, kvt_io_req *reqs, size_t n);
/* fdatasync(fd) through the backend (so faults apply). 0 or -errno. */
int kvt_io_sync(kvt_io *io, int fd);

/* Buffers aligned to KVT_IO_ALIGN, zeroed; len rounded up to it. */
void *kvt_io_buf_alloc(size_t len);
void kvt_io_buf_free(void *buf);

/* ---- plain file-system calls (not faulted) ---- */

int kvt_io_mkdir(const char *path);               /* 0 also when it exists */
int kvt_io_unlink(const char *path);              /* 0 also when missing */
int kvt_io_fsync_dir(const char *path);           /* make created/removed names durable */
int kvt_io_file_size(int fd, uint64_t *size);
int kvt_io_path_size(const char *path, uint64_t *size); /* a regular file's, no link followed */
int kvt_io_truncate(int fd, uint64_t size);
int kvt_io_exists(const char *path);              /* 1, 0 */
int kvt_io_writable(const char *path);            /* 1: this process may write it, 0 */
/* Create path when missing and give it at least `bytes` of real
 * allocation (posix_fallocate), so that a file later mapped and written
 * through the mapping cannot fault (SIGBUS) on a full file system: the
 * full disk is -ENOSPC here instead. 0 or -errno. */
int kvt_io_prealloc(const char *path, uint64_t bytes);
/* The soft limit on open descriptors, for sizing descriptor caches. */
uint64_t kvt_io_nofile_limit(void);
/* The memlock limit, for deciding on registered buffers. */
uint64_t kvt_io_memlock_limit(void);

/* ---- whole files and listings (io/files.c; not faulted) ---- */

/* Call fn(arg, name) for each entry of dir whose name starts with prefix,
 * in no order; stops at fn's first non-zero and returns it. A missing dir
 * lists nothing. 0 or -errno. */
int kvt_io_list(const char *dir, const char *prefix, int (*fn)(void *arg, const char *name),
                void *arg);
/* Write buf as dir/name durably: in place (a crash may leave it torn, so
 * only for files that check themselves), fsync, then fsync of dir.
 * 0 or -errno. */
int kvt_io_write_file(const char *dir, const char *name, const void *buf, size_t len);
/* Read a whole file of at most cap bytes; *len gets its size. 0, -EFBIG
 * (longer than cap) or -errno. */
int kvt_io_read_file(const char *path, void *buf, size_t cap, size_t *len);
int kvt_io_rename(const char *from, const char *to); /* 0 or -errno */
int kvt_io_rmdir(const char *path);                  /* an empty dir; 0 also when missing */

#endif
