/* errinfo.c - the detail of failed calls: filled where a call refuses its
 * input, kept per (engine, thread), copied out by kvt_last_error(). The
 * library keeps no global state, so the table lives in the engine; a
 * slot is found by pthread_self(). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine/errinfo.h"
#include "engine/internal.h"

void kvt_err_table_init(kvt_err_table *t) {
  memset(t->slot, 0, sizeof t->slot);
  t->next = 0;
  pthread_mutex_init(&t->lock, NULL);
}

void kvt_err_table_fini(kvt_err_table *t) { pthread_mutex_destroy(&t->lock); }

static void set_str(char *dst, size_t cap, const char *src) {
  snprintf(dst, cap, "%s", src ? src : "");
}

static void vfill(kvt_error_info *info, int code, const char *call, const char *field,
                  const char *expected, const char *got_fmt, va_list ap) {
  memset(info, 0, sizeof *info);
  info->code = code;
  set_str(info->call, sizeof info->call, call);
  set_str(info->field, sizeof info->field, field);
  set_str(info->expected, sizeof info->expected, expected);
  if (got_fmt) vsnprintf(info->got, sizeof info->got, got_fmt, ap);
  /* "call: field is got, expected expected" with the parts there are */
  int n = snprintf(info->message, sizeof info->message, "%s: %s", info->call, info->field);
  if (n > 0 && info->got[0] && (size_t)n < sizeof info->message)
    n += snprintf(info->message + n, sizeof info->message - (size_t)n, " is %s", info->got);
  if (n > 0 && info->expected[0] && (size_t)n < sizeof info->message)
    snprintf(info->message + n, sizeof info->message - (size_t)n, ", expected %s",
             info->expected);
}

int kvt_err_fill(kvt_error_info *info, int code, const char *call, const char *field,
                 const char *expected, const char *got_fmt, ...) {
  if (!info) return code;
  va_list ap;
  va_start(ap, got_fmt);
  vfill(info, code, call, field, expected, got_fmt, ap);
  va_end(ap);
  return code;
}

/* The calling thread's slot, taking the oldest one over when it has none.
 * With t->lock held. */
static kvt_err_slot *slot_for(kvt_err_table *t, int create) {
  pthread_t self = pthread_self();
  for (uint32_t i = 0; i < KVT_ERROR_THREADS; i++)
    if (t->slot[i].used && pthread_equal(t->slot[i].thread, self)) return &t->slot[i];
  if (!create) return NULL;
  kvt_err_slot *s = &t->slot[t->next];
  t->next = (t->next + 1) % KVT_ERROR_THREADS;
  s->used = 1;
  s->thread = self;
  return s;
}

int kvt_err_keep(kvt_err_table *t, const kvt_error_info *info) {
  pthread_mutex_lock(&t->lock);
  slot_for(t, 1)->info = *info;
  pthread_mutex_unlock(&t->lock);
  return info->code;
}

int kvt_err_record(kvt_err_table *t, int code, const char *call, const char *field,
                   const char *expected, const char *got_fmt, ...) {
  kvt_error_info info;
  va_list ap;
  va_start(ap, got_fmt);
  vfill(&info, code, call, field, expected, got_fmt, ap);
  va_end(ap);
  return kvt_err_keep(t, &info);
}

int kvt_last_error(kvt_engine *e, kvt_error_info *info) {
  if (!e || !info) return KVT_ENULL;
  pthread_mutex_lock(&e->err.lock);
  kvt_err_slot *s = slot_for(&e->err, 0);
  if (s) *info = s->info;
  else memset(info, 0, sizeof *info);
  pthread_mutex_unlock(&e->err.lock);
  return s ? 0 : KVT_ENOTFOUND;
}
