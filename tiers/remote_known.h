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

#define KVT_KNOWN_SETS 4096u /* 4-way: 16384 keys, 384 KiB */
#define KVT_KNOWN_WAYS 4u
/* What a lookup found is believed this long (the gap between a lookup and
 * the appends it leads to); after it the block may have been dropped by
 * another process or evicted by the cluster, and is asked about again. */
#define KVT_KNOWN_TTL_NS 2000000000ull

typedef struct kvt_known {
  kvt_mem *mem;
  pthread_mutex_t lock;
  uint64_t gen;    /* one more at each forget: a lookup older than it adds nothing */
  kvt_key *keys;   /* [SETS * WAYS] */
  uint64_t *born;  /* [SETS * WAYS] when keys[i] was found (monotonic ns) */
  uint8_t *used;   /* [SETS * WAYS] 1: keys[i] holds a key */
  uint8_t *next;   /* [SETS] the way the next key of a full set replaces */
} kvt_known;

/* 0, or -ENOMEM (kn unusable: close it all the same). */
int kvt_known_open(kvt_known *kn, kvt_mem *m);
void kvt_known_close(kvt_known *kn);
/* The generation to read before asking the cluster, for kvt_known_add. */
uint64_t kvt_known_gen(kvt_known *kn);
/* Remember keys the cluster had at time now (ns), as asked at generation
 * gen; nothing if a forget came since (the answer may predate a removal).
 * A full set forgets its oldest: a later take misses it. */
void kvt_known_add(kvt_known *kn, const kvt_key *keys, size_t n, uint64_t gen, uint64_t now);
/* 1 if key was remembered less than KVT_KNOWN_TTL_NS before now (and
 * forget it), else 0. */
int kvt_known_take(kvt_known *kn, const kvt_key *key, uint64_t now);
/* Forget keys (removed from the cluster by this process, or gone). */
void kvt_known_forget(kvt_known *kn, const kvt_key *keys, size_t n);

#endif
