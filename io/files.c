/* files.c - whole small files and directory listings, for what the cold
 * tier keeps beside its index (namespace copies) and for rebuilding that
 * index from the segment files. Plain system calls, not faulted. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io.h"

int kvt_io_list(const char *dir, const char *prefix, int (*fn)(void *arg, const char *name),
                void *arg) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : -errno;
  size_t plen = strlen(prefix);
  int rc = 0;
  for (struct dirent *de; !rc && (de = readdir(d));)
    if (!strncmp(de->d_name, prefix, plen)) rc = fn(arg, de->d_name);
  closedir(d);
  return rc;
}

/* Write all of buf at fd; 0 or -errno. */
static int write_all(int fd, const uint8_t *buf, size_t len) {
  while (len) {
    ssize_t w = write(fd, buf, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? -errno : -EIO;
    buf += w;
    len -= (size_t)w;
  }
  return 0;
}

/* In place, not through a temporary file and a rename: the files written
 * here check themselves (a namespace copy's name is the hash of its
 * content), so one torn by a crash is known for what it is and written
 * again; durable once the file and then its directory are synced. */
int kvt_io_write_file(const char *dir, const char *name, const void *buf, size_t len) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return -ENAMETOOLONG;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  int rc = write_all(fd, buf, len);
  if (!rc && fsync(fd) != 0) rc = -errno;
  close(fd);
  return rc ? rc : kvt_io_fsync_dir(dir);
}

int kvt_io_read_file(const char *path, void *buf, size_t cap, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  size_t got = 0;
  int rc = 0;
  for (;;) {
    ssize_t r = read(fd, (uint8_t *)buf + got, cap - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) rc = -errno;
    if (r <= 0) break;
    got += (size_t)r;
    if (got == cap) { /* full: one byte more means it does not fit */
      char extra;
      if (read(fd, &extra, 1) > 0) rc = -EFBIG;
      break;
    }
  }
  close(fd);
  *len = got;
  return rc;
}

int kvt_io_rename(const char *from, const char *to) {
  return rename(from, to) == 0 ? 0 : -errno;
}

int kvt_io_rmdir(const char *path) {
  return (rmdir(path) == 0 || errno == ENOENT) ? 0 : -errno;
}
