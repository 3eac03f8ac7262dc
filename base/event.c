/* event.c - the eventfd behind kvt_event_fd(): created, signalled and
 * closed here (base/event.h), below the engine, which makes no system call
 * itself; an fd to poll, not a file, so it is no part of io/ or a store. */
#include <errno.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/event.h"

int kvt_evfd_open(void) {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  return fd < 0 ? -errno : fd;
}

/* Add one to the counter. It cannot fail in practice: EAGAIN only at a
 * counter of 2^64 - 2, which a reader that never clears would need
 * centuries of events to reach; the fd is readable then anyway. */
void kvt_evfd_signal(int fd) {
  uint64_t one = 1;
  ssize_t r = write(fd, &one, sizeof one);
  (void)r;
}

void kvt_evfd_close(int fd) {
  if (fd >= 0) close(fd);
}
