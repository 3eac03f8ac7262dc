/* lockdir.c - the store directory and its single-writer lock.
 * The lock is an flock() on the store directory itself, not on a file in
 * it: a lock file can be unlinked or replaced under a running writer, and
 * a second writer would then lock the new file and get in; the directory
 * cannot be replaced while the store is in it. flock() rather than fcntl()
 * locks: an flock belongs to the open file description, so it is not lost
 * when another descriptor on the same file is closed, and it dies with
 * the process, so SIGKILL leaves no stale lock. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io.h"
#include "kvtier.h"

/* fsync the directory that holds path. 0 or -errno. */
static int fsync_parent(const char *path) {
  char parent[PATH_MAX];
  if (snprintf(parent, sizeof parent, "%s", path) >= (int)sizeof parent) return -ENAMETOOLONG;
  size_t n = strlen(parent);
  while (n > 1 && parent[n - 1] == '/') parent[--n] = 0; /* "a/b/" names a/b */
  char *slash = strrchr(parent, '/');
  if (!slash) snprintf(parent, sizeof parent, ".");
  else if (slash == parent) parent[1] = 0; /* under / */
  else *slash = 0;
  return kvt_io_fsync_dir(parent);
}

static int dir_check(const char *dir, int create) {
  struct stat st;
  if (stat(dir, &st) == 0) return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
  if (errno != ENOENT || !create) return -errno;
  if (mkdir(dir, 0755) != 0) return errno == EEXIST ? 0 : -errno;
  return fsync_parent(dir); /* the new directory's name survives a power loss */
}

/* The pid hint LOCK in the store directory dfd, opened so that nothing
 * put in its place can hurt: no symbolic link followed, no FIFO waited
 * on, only a regular file. A descriptor, or -1. */
static int lock_hint_open(int dfd, int flags) {
  int pf = openat(dfd, "LOCK", flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  struct stat st;
  if (pf >= 0 && (fstat(pf, &st) != 0 || !S_ISREG(st.st_mode))) {
    close(pf);
    pf = -1;
  }
  return pf;
}

/* flock(how | LOCK_NB) on the directory itself, through a new descriptor. */
static int dir_lock(const char *dir, int how, int *lock_fd) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  if (flock(fd, how | LOCK_NB) != 0) {
    int rc = (errno == EWOULDBLOCK) ? KVT_ELOCKED : -errno;
    close(fd);
    return rc;
  }
  /* A writer says who holds the lock, in the file LOCK (not the lock: a
   * hint for messages), so a refused open can tell "this process" from
   * another one; only ever read while the lock is held. */
  if (how == LOCK_EX) {
    char pid[24];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    int pf = lock_hint_open(fd, O_WRONLY | O_CREAT);
    if (pf >= 0 && (ftruncate(pf, 0) != 0 || pwrite(pf, pid, (size_t)n, 0) != n)) { /* a hint */ }
    if (pf >= 0) close(pf);
  }
  *lock_fd = fd;
  return 0;
}

int kvt_io_dir_open(const char *dir, int create, int rdonly, int *lock_fd) {
  *lock_fd = -1;
  int rc = dir_check(dir, create && !rdonly);
  if (rc || rdonly) return rc;
  return dir_lock(dir, LOCK_EX, lock_fd);
}

int kvt_io_dir_share(const char *dir, int *lock_fd) {
  *lock_fd = -1;
  return dir_lock(dir, LOCK_SH, lock_fd);
}

void kvt_io_dir_close(int lock_fd) {
  if (lock_fd < 0) return;
  int pf = lock_hint_open(lock_fd, O_WRONLY); /* empty the writer's pid */
  if (pf >= 0 && ftruncate(pf, 0) != 0) { /* a stale pid is only read under a live lock */ }
  if (pf >= 0) close(pf);
  close(lock_fd); /* closing the last descriptor drops the flock */
}

int kvt_io_dir_readers_only(const char *dir) {
  int fd = -1;
  int rc = dir_lock(dir, LOCK_SH, &fd); /* granted only when nobody holds it exclusively */
  if (rc == 0) close(fd);
  return rc == 0;
}

void kvt_io_dir_unshare(int lock_fd) {
  if (lock_fd >= 0) close(lock_fd); /* a reader's lock: LOCK is the writer's, not touched */
}

int kvt_io_lock_owner(const char *dir) {
  char buf[24];
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int fd = dfd >= 0 ? lock_hint_open(dfd, O_RDONLY) : -1;
  if (dfd >= 0) close(dfd);
  if (fd < 0) return 0;
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  long pid = strtol(buf, NULL, 10);
  return pid > 0 && pid < INT_MAX ? (int)pid : 0;
}
