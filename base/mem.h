/* mem.h - the library's allocation accounting (base/, below every layer).
 * Every byte the engine and its tiers allocate goes through these calls and
 * is counted in one category; stats report these counters, never a formula.
 * A test knob fails the Nth allocation so tests can walk every failure path. */
#ifndef KVT_MEM_H
#define KVT_MEM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum kvt_mem_cat {
  KVT_MEM_HOT = 0,   /* hot-tier layer blocks: descriptor + payload */
  KVT_MEM_WARM,      /* reserved for the warm tier */
  KVT_MEM_INDEX,     /* hash table and token-block entries */
  KVT_MEM_SEQ,       /* sequences */
  KVT_MEM_OTHER,     /* engine, namespaces, loads */
  KVT_MEM_NCAT
};

#define KVT_POOL_CLASSES 4

/* Freed page-aligned buffers kept for reuse, a stack per size: putting and
 * evicting blocks would otherwise fault fresh pages in and contend on the
 * process's mmap lock with every O_DIRECT write. Counted as OTHER while
 * pooled; bounded by pool_cap. */
typedef struct kvt_pool_class {
  size_t size;
  void *head;
} kvt_pool_class;

typedef struct kvt_mem {
  _Atomic uint64_t bytes[KVT_MEM_NCAT];
  _Atomic uint64_t n_allocs;      /* allocations attempted */
  uint64_t fail_after;            /* fail allocation number fail_after (0 = never) */
  pthread_mutex_t pool_lock;
  kvt_pool_class pool[KVT_POOL_CLASSES];
  uint64_t pool_bytes, pool_cap;
} kvt_mem;

void kvt_mem_init(kvt_mem *m, uint64_t fail_after);
/* Set how many bytes of freed page buffers may be kept (0: none). */
void kvt_mem_pool_cap(kvt_mem *m, uint64_t cap);
/* Free the pool; the counters of what is still allocated stay. */
void kvt_mem_fini(kvt_mem *m);
/* Page-aligned buffers of size (a multiple of 4096), from the pool when it
 * has one of that size. */
void *kvt_mem_page_alloc(kvt_mem *m, int cat, size_t size);
void kvt_mem_page_free(kvt_mem *m, int cat, void *p, size_t size);
/* malloc counted in cat; NULL on failure (real or injected). */
void *kvt_mem_alloc(kvt_mem *m, int cat, size_t size);
/* zeroed. */
void *kvt_mem_calloc(kvt_mem *m, int cat, size_t size);
/* 64-byte aligned; size is rounded up to a multiple of 64 and that is what
 * is counted: kvt_mem_round(size) tells it. */
void *kvt_mem_alloc_aligned(kvt_mem *m, int cat, size_t size);
size_t kvt_mem_round(size_t size);
/* align (a power of two >= 64) and size rounded up to it, as counted. */
void *kvt_mem_alloc_align(kvt_mem *m, int cat, size_t align, size_t size);
size_t kvt_mem_round_to(size_t size, size_t align);
/* Free p of the size it was allocated with (the rounded size for aligned). */
void kvt_mem_free(kvt_mem *m, int cat, void *p, size_t size);
/* Count bytes already allocated under another category (a block that
 * changed tier keeps its descriptor). */
void kvt_mem_move(kvt_mem *m, int from, int to, size_t bytes);
/* Count bytes allocated elsewhere (I/O buffers) under cat; delta may be < 0. */
void kvt_mem_note(kvt_mem *m, int cat, int64_t delta);
uint64_t kvt_mem_bytes(const kvt_mem *m, int cat);
uint64_t kvt_mem_total(const kvt_mem *m);

#endif
