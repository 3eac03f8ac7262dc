/* store_impl.h - what an implementation of the store interface gives
 * store.c: its method table, whether it wants a configuration, and how it
 * opens. One of these and one line in store.c's table add a tier. */
#ifndef KVT_STORE_IMPL_H
#define KVT_STORE_IMPL_H

#include "tiers/store.h"

typedef struct kvt_store_impl {
  const kvt_store_methods *m;
  int (*wants)(const kvt_store_config *cfg); /* 1: this implementation serves cfg */
  int (*open)(kvt_mem *m, const kvt_store_config *cfg, void **impl);
} kvt_store_impl;

extern const kvt_store_impl kvt_store_disk; /* store_disk.c: cold.c */
extern const kvt_store_impl kvt_store_meta; /* store_meta.c: cold_meta.c */
extern const kvt_store_impl kvt_store_remote; /* store_remote.c: remote.c, above one of these */

#endif
