/* event.h - the eventfd behind kvt_event_fd() (base/, below every layer):
 * the one wakeup a serving loop polls. Not a file of the store: the engine
 * reaches no file and no store through it. */
#ifndef KVT_EVENT_H
#define KVT_EVENT_H

/* A non-blocking, close-on-exec eventfd: the fd (>= 0) or -errno. */
int kvt_evfd_open(void);
void kvt_evfd_signal(int fd); /* add 1 to its counter; any thread */
void kvt_evfd_close(int fd);  /* accepts -1 */

#endif
