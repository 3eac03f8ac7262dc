/* remote_known.h - block keys a lookup of this process just found in the
 * cluster, kept so that the appends which follow the lookup learn that the
 * block is stored without asking the cluster again (store_remote.c). */
#ifndef KVT_REMOTE_KNOWN_H
#define KVT_REMOTE_KNOWN_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "base/mem.h"
#include "kvtier.h"

#define KVT_KNOWN_SETS 4096u /* 4-way: 16384 keys, 256 KiB */
#define KVT_KNOWN_WAYS 4u

typedef struct kvt_known {
  kvt_mem *mem;
  pthread_mutex_t lock;
  kvt_key *keys;   /* [SETS * WAYS] */
  uint8_t *used;   /* [SETS * WAYS] 1: keys[i] holds a key */
  uint8_t *next;   /* [SETS] the way the next key of a full set replaces */
} kvt_known;

/* 0, or -ENOMEM (kn unusable: close it all the same). */
int kvt_known_open(kvt_known *kn, kvt_mem *m);
void kvt_known_close(kvt_known *kn);
/* Remember keys (a full set forgets its oldest: a later take misses it). */
void kvt_known_add(kvt_known *kn, const kvt_key *keys, size_t n);
/* 1 if key was remembered (and forget it), else 0. */
int kvt_known_take(kvt_known *kn, const kvt_key *key);
/* Forget keys (removed from the cluster by this process). */
void kvt_known_forget(kvt_known *kn, const kvt_key *keys, size_t n);

#endif
