/* mem.c - counted allocation for the engine and its tiers (see mem.h).
 * Counters are atomic because payload buffers are allocated outside the
 * engine lock. */
#include "base/mem.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static int injected_failure(kvt_mem *m) {
  uint64_t n = atomic_fetch_add_explicit(&m->n_allocs, 1, memory_order_relaxed) + 1;
  return m->fail_after != 0 && n == m->fail_after;
}

void kvt_mem_init(kvt_mem *m, uint64_t fail_after) {
  for (int i = 0; i < KVT_MEM_NCAT; i++) atomic_init(&m->bytes[i], 0);
  atomic_init(&m->n_allocs, 0);
  m->fail_after = fail_after;
  pthread_mutex_init(&m->pool_lock, NULL);
  memset(m->pool, 0, sizeof m->pool);
  m->pool_bytes = m->pool_cap = 0;
}

void kvt_mem_pool_cap(kvt_mem *m, uint64_t cap) { m->pool_cap = cap; }

void kvt_mem_fini(kvt_mem *m) {
  for (int c = 0; c < KVT_POOL_CLASSES; c++)
    while (m->pool[c].head) {
      void *p = m->pool[c].head;
      memcpy(&m->pool[c].head, p, sizeof(void *));
      kvt_mem_free(m, KVT_MEM_OTHER, p, m->pool[c].size);
    }
  m->pool_bytes = 0;
  pthread_mutex_destroy(&m->pool_lock);
}

/* The class for size: its own, else an empty one to claim; -1 if none. */
static int pool_class(kvt_mem *m, size_t size, int claim) {
  for (int c = 0; c < KVT_POOL_CLASSES; c++)
    if (m->pool[c].size == size) return c;
  for (int c = 0; claim && c < KVT_POOL_CLASSES; c++)
    if (!m->pool[c].head) {
      m->pool[c].size = size;
      return c;
    }
  return -1;
}

void *kvt_mem_page_alloc(kvt_mem *m, int cat, size_t size) {
  if (size == 0 || injected_failure(m)) return NULL;
  void *p = NULL;
  pthread_mutex_lock(&m->pool_lock);
  int c = pool_class(m, size, 0);
  if (c >= 0 && m->pool[c].head) {
    p = m->pool[c].head;
    memcpy(&m->pool[c].head, p, sizeof(void *));
    m->pool_bytes -= size;
  }
  pthread_mutex_unlock(&m->pool_lock);
  if (p) {
    kvt_mem_move(m, KVT_MEM_OTHER, cat, size);
    return p;
  }
  p = aligned_alloc(4096, size);
  if (p) atomic_fetch_add_explicit(&m->bytes[cat], size, memory_order_relaxed);
#ifdef MADV_POPULATE_WRITE
  /* Fresh pages are written whole right after (a put's copy): fault them
   * in with one call instead of one fault per 4 KiB page (each an exit to
   * the hypervisor in a VM). Best effort: older kernels say EINVAL. */
  static atomic_int no_populate; /* the kernel said EINVAL once: not again */
  if (p && size % 4096 == 0 && !atomic_load_explicit(&no_populate, memory_order_relaxed) &&
      madvise(p, size, MADV_POPULATE_WRITE) != 0 && errno == EINVAL)
    atomic_store_explicit(&no_populate, 1, memory_order_relaxed);
#endif
  return p;
}

void kvt_mem_page_free(kvt_mem *m, int cat, void *p, size_t size) {
  if (!p) return;
  pthread_mutex_lock(&m->pool_lock);
  int c = m->pool_bytes + size <= m->pool_cap ? pool_class(m, size, 1) : -1;
  if (c >= 0) {
    memcpy(p, &m->pool[c].head, sizeof(void *));
    m->pool[c].head = p;
    m->pool_bytes += size;
  }
  pthread_mutex_unlock(&m->pool_lock);
  if (c >= 0) kvt_mem_move(m, cat, KVT_MEM_OTHER, size);
  else kvt_mem_free(m, cat, p, size);
}


void *kvt_mem_alloc(kvt_mem *m, int cat, size_t size) {
  if (size == 0 || injected_failure(m)) return NULL;
  void *p = malloc(size);
  if (p) atomic_fetch_add_explicit(&m->bytes[cat], size, memory_order_relaxed);
  return p;
}

void *kvt_mem_calloc(kvt_mem *m, int cat, size_t size) {
  void *p = kvt_mem_alloc(m, cat, size);
  if (p) memset(p, 0, size);
  return p;
}

size_t kvt_mem_round(size_t size) { return (size + 63) & ~(size_t)63; }

void *kvt_mem_alloc_aligned(kvt_mem *m, int cat, size_t size) {
  return kvt_mem_alloc_align(m, cat, 64, size);
}

size_t kvt_mem_round_to(size_t size, size_t align) { return (size + align - 1) & ~(align - 1); }

void *kvt_mem_alloc_align(kvt_mem *m, int cat, size_t align, size_t size) {
  size = kvt_mem_round_to(size, align);
  if (size == 0 || injected_failure(m)) return NULL;
  void *p = aligned_alloc(align, size);
  if (p) atomic_fetch_add_explicit(&m->bytes[cat], size, memory_order_relaxed);
  return p;
}

void kvt_mem_free(kvt_mem *m, int cat, void *p, size_t size) {
  if (!p) return;
  atomic_fetch_sub_explicit(&m->bytes[cat], size, memory_order_relaxed);
  free(p);
}

void kvt_mem_move(kvt_mem *m, int from, int to, size_t bytes) {
  atomic_fetch_sub_explicit(&m->bytes[from], bytes, memory_order_relaxed);
  atomic_fetch_add_explicit(&m->bytes[to], bytes, memory_order_relaxed);
}

void kvt_mem_note(kvt_mem *m, int cat, int64_t delta) {
  atomic_fetch_add_explicit(&m->bytes[cat], (uint64_t)delta, memory_order_relaxed);
}

uint64_t kvt_mem_bytes(const kvt_mem *m, int cat) {
  return atomic_load_explicit(&m->bytes[cat], memory_order_relaxed);
}

uint64_t kvt_mem_total(const kvt_mem *m) {
  uint64_t t = 0;
  for (int i = 0; i < KVT_MEM_NCAT; i++) t += kvt_mem_bytes(m, i);
  return t;
}
