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
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io.h"
#include "kvtier.h"

static int dir_check(const char *dir, int create) {
  struct stat st;
  if (stat(dir, &st) == 0) return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
  if (errno != ENOENT || !create) return -errno;
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -errno;
  return 0;
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
  if (lock_fd >= 0) close(lock_fd); /* closing the last descriptor drops the flock */
}
