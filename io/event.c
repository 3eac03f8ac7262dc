/* event.c - the eventfd behind kvt_event_fd(): created, signalled and
 * closed here, so the engine makes no system call itself (io.h). */
#include <errno.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "io/io.h"

int kvt_io_event_open(void) {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  return fd < 0 ? -errno : fd;
}

/* Add one to the counter. It cannot fail in practice: EAGAIN only at a
 * counter of 2^64 - 2, which a reader that never clears would need
 * centuries of events to reach; the fd is readable then anyway. */
void kvt_io_event_signal(int fd) {
  uint64_t one = 1;
  ssize_t r = write(fd, &one, sizeof one);
  (void)r;
}

void kvt_io_event_close(int fd) {
  if (fd >= 0) close(fd);
}
