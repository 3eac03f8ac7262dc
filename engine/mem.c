/* mem.c - counted allocation for the engine (see mem.h). Counters are
 * atomic because payload buffers are allocated outside the engine lock. */
#include "engine/mem.h"

#include <stdlib.h>
#include <string.h>

void kvt_mem_init(kvt_mem *m, uint64_t fail_after) {
  for (int i = 0; i < KVT_MEM_NCAT; i++) atomic_init(&m->bytes[i], 0);
  atomic_init(&m->n_allocs, 0);
  m->fail_after = fail_after;
}

static int injected_failure(kvt_mem *m) {
  uint64_t n = atomic_fetch_add_explicit(&m->n_allocs, 1, memory_order_relaxed) + 1;
  return m->fail_after != 0 && n == m->fail_after;
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
