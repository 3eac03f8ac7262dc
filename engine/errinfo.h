/* errinfo.h - recording the detail of a failed call (kvt_last_error):
 * which field was wrong, what was expected and what was given, kept per
 * engine and per calling thread. */
#ifndef KVT_ERRINFO_H
#define KVT_ERRINFO_H

#include <pthread.h>

#include "kvtier.h"

typedef struct kvt_err_slot {
  pthread_t thread;
  int used;
  kvt_error_info info;
} kvt_err_slot;

/* The engine's table: one slot per thread that failed a call, the oldest
 * reused first. err_lock is a leaf lock: taken with or without e->lock,
 * nothing is taken while it is held. */
typedef struct kvt_err_table {
  pthread_mutex_t lock;
  uint32_t next;                      /* slot to reuse when the thread has none */
  kvt_err_slot slot[KVT_ERROR_THREADS];
} kvt_err_table;

void kvt_err_table_init(kvt_err_table *t);
void kvt_err_table_fini(kvt_err_table *t);

/* Fill *info (may be NULL) with code, call, field, expected and the value
 * given (printf format); returns code, so a failing path can say
 * `return kvt_err_fill(...)`. */
int kvt_err_fill(kvt_error_info *info, int code, const char *call, const char *field,
                 const char *expected, const char *got_fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Record the detail for the calling thread in t; returns code. */
int kvt_err_record(kvt_err_table *t, int code, const char *call, const char *field,
                   const char *expected, const char *got_fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Record a filled detail for the calling thread; returns info->code. */
int kvt_err_keep(kvt_err_table *t, const kvt_error_info *info);

#endif
