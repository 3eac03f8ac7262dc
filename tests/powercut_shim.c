/* powercut_shim.c - the power-cut test's recorder (powercut_shim.h). The
 * test program defines the file-system calls below itself, so the
 * library's calls (linked in) and liblmdb's (bound by the dynamic linker to
 * the program's definitions first) come here; each passes the call on to
 * the C library (dlsym RTLD_NEXT) and, while recording, logs what changed
 * under the root: writes with their bytes, syncs, new and removed names.
 * Calls on one recorded file are serialized under one lock, so the log's
 * order is the order in which the kernel saw them. io_uring bypasses the C
 * library: the test runs the store on the pread backend. */
#undef _FORTIFY_SOURCE
#include "powercut_shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define PC_MAX_FDS 4096
#define PC_PATH 1024

typedef struct pc_fd {
  char *path;        /* NULL: not followed */
  uint8_t dir, dsync, append;
} pc_fd;

static pthread_mutex_t pc_mu = PTHREAD_MUTEX_INITIALIZER;
static int pc_on;              /* recording */
static int pc_log = -1;
static char pc_root[PC_PATH];
static size_t pc_root_len;
static pc_fd pc_fds[PC_MAX_FDS];
static uint64_t pc_refusals;

/* The C library's definition of name, looked up once. */
#define REAL(type, name, args)                                                \
  static type(*real_##name) args;                                             \
  if (!real_##name) {                                                         \
    void *sym_ = dlsym(RTLD_NEXT, #name);                                     \
    if (!sym_) abort();                                                       \
    memcpy(&real_##name, &sym_, sizeof sym_);                                 \
  }

static int on(void) { return __atomic_load_n(&pc_on, __ATOMIC_ACQUIRE); }

/* ------------------------------------------------------------- the log */

static void log_bytes(const void *p, size_t n) {
  REAL(ssize_t, write, (int, const void *, size_t));
  const char *c = p;
  while (n) {
    ssize_t w = real_write(pc_log, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      pc_refusals++;
      return;
    }
    c += w;
    n -= (size_t)w;
  }
}

/* With pc_mu held. iov/n_iov: the data (WRITE, NOTE). */
static void log_rec(uint32_t kind, uint32_t flags, const char *path, uint64_t off,
                    const struct iovec *iov, int n_iov, uint64_t len) {
  pc_rec r = {kind, flags, off, len, path ? (uint32_t)strlen(path) : 0, 0};
  int saved = errno;
  log_bytes(&r, sizeof r);
  if (path) log_bytes(path, r.path_len);
  for (int i = 0; i < n_iov && len; i++) {
    size_t n = iov[i].iov_len < len ? iov[i].iov_len : (size_t)len;
    log_bytes(iov[i].iov_base, n);
    len -= n;
  }
  static const uint8_t zeros[8];
  uint64_t total = sizeof r + r.path_len + (n_iov ? r.len : 0);
  log_bytes(zeros, (8 - total % 8) % 8); /* the next record starts 8-aligned */
  errno = saved;
}

/* ------------------------------------------------------------- paths */

/* Is abs strictly under the root? */
static int under_root(const char *abs) {
  return pc_root_len && strncmp(abs, pc_root, pc_root_len) == 0 && abs[pc_root_len] == '/';
}

/* The absolute path of (dirfd, path) into out; 0, or -1 when it cannot be
 * told (a relative path against a descriptor not followed). With pc_mu held. */
static int resolve(int dirfd, const char *path, char *out) {
  if (path[0] == '/') return snprintf(out, PC_PATH, "%s", path) < PC_PATH ? 0 : -1;
  const char *base = NULL;
  char cwd[PC_PATH];
  if (dirfd == AT_FDCWD) base = getcwd(cwd, sizeof cwd);
  else if (dirfd >= 0 && dirfd < PC_MAX_FDS) base = pc_fds[dirfd].path;
  if (!base) return -1;
  return snprintf(out, PC_PATH, "%s/%s", base, path) < PC_PATH ? 0 : -1;
}

static pc_fd *followed(int fd) {
  return fd >= 0 && fd < PC_MAX_FDS && pc_fds[fd].path ? &pc_fds[fd] : NULL;
}

/* ---------------------------------------------------------- recording */

int pc_record_start(const char *root, const char *log_path) {
  REAL(int, open, (const char *, int, ...));
  if (strlen(root) >= PC_PATH) return -ENAMETOOLONG;
  int fd = real_open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  pthread_mutex_lock(&pc_mu);
  pc_log = fd;
  snprintf(pc_root, sizeof pc_root, "%s", root);
  pc_root_len = strlen(pc_root);
  __atomic_store_n(&pc_on, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&pc_mu);
  return 0;
}

void pc_record_stop(void) {
  REAL(int, close, (int));
  pthread_mutex_lock(&pc_mu);
  __atomic_store_n(&pc_on, 0, __ATOMIC_RELEASE);
  if (pc_log >= 0) real_close(pc_log);
  pc_log = -1;
  for (int i = 0; i < PC_MAX_FDS; i++) {
    free(pc_fds[i].path);
    pc_fds[i].path = NULL;
  }
  pthread_mutex_unlock(&pc_mu);
}

void pc_note(const void *data, uint32_t len) {
  struct iovec v = {(void *)data, len};
  pthread_mutex_lock(&pc_mu);
  if (on()) log_rec(PC_NOTE, 0, NULL, 0, &v, 1, len);
  pthread_mutex_unlock(&pc_mu);
}

uint64_t pc_refused(void) {
  pthread_mutex_lock(&pc_mu);
  uint64_t n = pc_refusals;
  pthread_mutex_unlock(&pc_mu);
  return n;
}

/* ------------------------------------------------------ opening files */

static int open_common(int dirfd, const char *path, int flags, mode_t mode) {
  REAL(int, openat, (int, const char *, int, ...));
  if (!on()) return real_openat(dirfd, path, flags, mode);
  char abs[PC_PATH];
  pthread_mutex_lock(&pc_mu);
  /* the root itself is followed too: its fsync makes the names in it durable */
  if (resolve(dirfd, path, abs) != 0 || !(under_root(abs) || strcmp(abs, pc_root) == 0)) {
    pthread_mutex_unlock(&pc_mu);
    return real_openat(dirfd, path, flags, mode);
  }
  int existed = access(abs, F_OK) == 0;
  int fd = real_openat(dirfd, path, flags, mode);
  if (fd >= 0) {
    struct stat st;
    int is_dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
    if (!existed) log_rec(PC_CREATE, 0, abs, 0, NULL, 0, 0);
    else if ((flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY)
      log_rec(PC_TRUNC, 0, abs, 0, NULL, 0, 0);
    if (fd >= PC_MAX_FDS) {
      pc_refusals++;
    } else {
      pc_fd *f = &pc_fds[fd];
      free(f->path);
      f->path = strdup(abs);
      if (!f->path) pc_refusals++;
      f->dir = (uint8_t)is_dir;
      f->dsync = (flags & (O_DSYNC | O_SYNC)) != 0;
      f->append = (flags & O_APPEND) != 0;
    }
  }
  pthread_mutex_unlock(&pc_mu);
  return fd;
}

static mode_t mode_arg(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t m = mode_arg(flags, ap);
  va_end(ap);
  return open_common(AT_FDCWD, path, flags, m);
}

int open64(const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t m = mode_arg(flags, ap);
  va_end(ap);
  return open_common(AT_FDCWD, path, flags, m);
}

int openat(int dirfd, const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t m = mode_arg(flags, ap);
  va_end(ap);
  return open_common(dirfd, path, flags, m);
}

int openat64(int dirfd, const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t m = mode_arg(flags, ap);
  va_end(ap);
  return open_common(dirfd, path, flags, m);
}

int creat(const char *path, mode_t mode) {
  return open_common(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC, mode);
}

int creat64(const char *path, mode_t mode) {
  return open_common(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC, mode);
}

int close(int fd) {
  REAL(int, close, (int));
  if (on()) {
    pthread_mutex_lock(&pc_mu);
    pc_fd *f = followed(fd);
    if (f) {
      free(f->path);
      f->path = NULL;
    }
    pthread_mutex_unlock(&pc_mu);
  }
  return real_close(fd);
}

/* ------------------------------------------------------------- writes */

/* A write of iov at off (-1: the file position) through fd, done by
 * `doit` under the lock so the log keeps the kernel's order. */
typedef ssize_t (*write_fn)(int fd, const struct iovec *iov, int n, off_t off);

static ssize_t write_common(int fd, const struct iovec *iov, int n, off_t off, write_fn doit) {
  if (!on()) return doit(fd, iov, n, off);
  pthread_mutex_lock(&pc_mu);
  pc_fd *f = followed(fd);
  if (!f) {
    pthread_mutex_unlock(&pc_mu);
    return doit(fd, iov, n, off);
  }
  off_t at = off;
  if (off < 0) {
    struct stat st;
    at = f->append ? (fstat(fd, &st) == 0 ? st.st_size : -1) : lseek(fd, 0, SEEK_CUR);
  }
  ssize_t w = doit(fd, iov, n, off);
  if (w > 0) {
    if (at < 0) pc_refusals++;
    char path[PC_PATH];
    snprintf(path, sizeof path, "%s", f->path);
    log_rec(PC_WRITE, f->dsync ? PC_F_DSYNC : 0, path, (uint64_t)at, iov, n, (uint64_t)w);
  }
  pthread_mutex_unlock(&pc_mu);
  return w;
}

static ssize_t do_write(int fd, const struct iovec *iov, int n, off_t off) {
  REAL(ssize_t, write, (int, const void *, size_t));
  (void)n;
  (void)off;
  return real_write(fd, iov[0].iov_base, iov[0].iov_len);
}

static ssize_t do_pwrite(int fd, const struct iovec *iov, int n, off_t off) {
  REAL(ssize_t, pwrite, (int, const void *, size_t, off_t));
  (void)n;
  return real_pwrite(fd, iov[0].iov_base, iov[0].iov_len, off);
}

static ssize_t do_writev(int fd, const struct iovec *iov, int n, off_t off) {
  REAL(ssize_t, writev, (int, const struct iovec *, int));
  (void)off;
  return real_writev(fd, iov, n);
}

static ssize_t do_pwritev(int fd, const struct iovec *iov, int n, off_t off) {
  REAL(ssize_t, pwritev, (int, const struct iovec *, int, off_t));
  return real_pwritev(fd, iov, n, off);
}

ssize_t write(int fd, const void *buf, size_t n) {
  struct iovec v = {(void *)buf, n};
  return write_common(fd, &v, 1, -1, do_write);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
  struct iovec v = {(void *)buf, n};
  if (off < 0) {
    errno = EINVAL;
    return -1;
  }
  return write_common(fd, &v, 1, off, do_pwrite);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off) {
  return pwrite(fd, buf, n, (off_t)off);
}

ssize_t writev(int fd, const struct iovec *iov, int n) {
  return write_common(fd, iov, n, -1, do_writev);
}

ssize_t pwritev(int fd, const struct iovec *iov, int n, off_t off) {
  if (off < 0) {
    errno = EINVAL;
    return -1;
  }
  return write_common(fd, iov, n, off, do_pwritev);
}

ssize_t pwritev64(int fd, const struct iovec *iov, int n, off64_t off) {
  return pwritev(fd, iov, n, (off_t)off);
}

/* ------------------------------------------------------ syncs, sizes */

static int sync_common(int fd, int (*real)(int)) {
  if (!on()) return real(fd);
  pthread_mutex_lock(&pc_mu);
  pc_fd *f = followed(fd);
  int rc = real(fd);
  if (f && rc == 0) {
    char path[PC_PATH];
    snprintf(path, sizeof path, "%s", f->path);
    log_rec(f->dir ? PC_DIRSYNC : PC_SYNC, 0, path, 0, NULL, 0, 0);
  }
  pthread_mutex_unlock(&pc_mu);
  return rc;
}

int fsync(int fd) {
  REAL(int, fsync, (int));
  return sync_common(fd, real_fsync);
}

int fdatasync(int fd) {
  REAL(int, fdatasync, (int));
  return sync_common(fd, real_fdatasync);
}

/* A writable shared mapping would change the file behind the recorder's
 * back: LMDB uses one (and msync) only with MDB_WRITEMAP. */
int msync(void *addr, size_t len, int flags) {
  REAL(int, msync, (void *, size_t, int));
  if (on()) {
    pthread_mutex_lock(&pc_mu);
    pc_refusals++;
    pthread_mutex_unlock(&pc_mu);
  }
  return real_msync(addr, len, flags);
}

/* Log the size fd has now, as a PC_TRUNC. With pc_mu held. */
static void log_size(pc_fd *f, int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    pc_refusals++;
    return;
  }
  char path[PC_PATH];
  snprintf(path, sizeof path, "%s", f->path);
  log_rec(PC_TRUNC, 0, path, (uint64_t)st.st_size, NULL, 0, 0);
}

int ftruncate(int fd, off_t len) {
  REAL(int, ftruncate, (int, off_t));
  if (!on()) return real_ftruncate(fd, len);
  pthread_mutex_lock(&pc_mu);
  pc_fd *f = followed(fd);
  int rc = real_ftruncate(fd, len);
  if (f && rc == 0) log_size(f, fd);
  pthread_mutex_unlock(&pc_mu);
  return rc;
}

int ftruncate64(int fd, off64_t len) { return ftruncate(fd, (off_t)len); }

int fallocate(int fd, int mode, off_t off, off_t len) {
  REAL(int, fallocate, (int, int, off_t, off_t));
  if (!on()) return real_fallocate(fd, mode, off, len);
  pthread_mutex_lock(&pc_mu);
  pc_fd *f = followed(fd);
  int rc = real_fallocate(fd, mode, off, len);
  if (f && rc == 0) {
    if (mode & ~FALLOC_FL_KEEP_SIZE) pc_refusals++; /* holes, ranges: not modelled */
    else log_size(f, fd);
  }
  pthread_mutex_unlock(&pc_mu);
  return rc;
}

int fallocate64(int fd, int mode, off64_t off, off64_t len) {
  return fallocate(fd, mode, (off_t)off, (off_t)len);
}

/* -------------------------------------------------------------- names */

/* Run op on (dirfd, path); log kind for the path when it is under the
 * root and op succeeded. */
static int name_common(int dirfd, const char *path, uint32_t kind, int rc_of_op(void *),
                       void *arg) {
  if (!on()) return rc_of_op(arg);
  char abs[PC_PATH];
  pthread_mutex_lock(&pc_mu);
  int ours = resolve(dirfd, path, abs) == 0 && under_root(abs);
  int rc = rc_of_op(arg);
  if (ours && rc == 0) log_rec(kind, 0, abs, 0, NULL, 0, 0);
  pthread_mutex_unlock(&pc_mu);
  return rc;
}

typedef struct name_args {
  int dirfd;
  const char *path;
  mode_t mode;
  int flags;
} name_args;

static int op_mkdirat(void *p) {
  REAL(int, mkdirat, (int, const char *, mode_t));
  name_args *a = p;
  return real_mkdirat(a->dirfd, a->path, a->mode);
}

static int op_unlinkat(void *p) {
  REAL(int, unlinkat, (int, const char *, int));
  name_args *a = p;
  return real_unlinkat(a->dirfd, a->path, a->flags);
}

int mkdirat(int dirfd, const char *path, mode_t mode) {
  name_args a = {dirfd, path, mode, 0};
  return name_common(dirfd, path, PC_MKDIR, op_mkdirat, &a);
}

int mkdir(const char *path, mode_t mode) { return mkdirat(AT_FDCWD, path, mode); }

int unlinkat(int dirfd, const char *path, int flags) {
  name_args a = {dirfd, path, 0, flags};
  return name_common(dirfd, path, PC_UNLINK, op_unlinkat, &a);
}

int unlink(const char *path) { return unlinkat(AT_FDCWD, path, 0); }

int rmdir(const char *path) { return unlinkat(AT_FDCWD, path, AT_REMOVEDIR); }

/* Renames are not modelled (the store never renames): refused. */
static void rename_seen(int dfa, const char *a, int dfb, const char *b) {
  if (!on()) return;
  char pa[PC_PATH], pb[PC_PATH];
  pthread_mutex_lock(&pc_mu);
  if ((resolve(dfa, a, pa) == 0 && under_root(pa)) || (resolve(dfb, b, pb) == 0 && under_root(pb)))
    pc_refusals++;
  pthread_mutex_unlock(&pc_mu);
}

int renameat2(int dfa, const char *a, int dfb, const char *b, unsigned flags) {
  REAL(int, renameat2, (int, const char *, int, const char *, unsigned));
  rename_seen(dfa, a, dfb, b);
  return real_renameat2(dfa, a, dfb, b, flags);
}

int renameat(int dfa, const char *a, int dfb, const char *b) {
  return renameat2(dfa, a, dfb, b, 0);
}

int rename(const char *a, const char *b) { return renameat2(AT_FDCWD, a, AT_FDCWD, b, 0); }
