/* hash.c - kvt_hash64: XXH3-64 with a seed (hash.h), dispatching once to
 * the AVX2 build in hash_avx2.c when the CPU has it. XXH3 gives the same
 * value on every vector path. */
#include <cpuid.h>

#include "base/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t kvt_hash64_avx2(const void *p, size_t n, uint64_t seed);

static uint64_t hash_base(const void *p, size_t n, uint64_t seed) {
  return XXH3_64bits_withSeed(p, n, seed);
}

static int have_avx2(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1) || !((c >> 28) & 1)) return 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((b >> 5) & 1)) return 0;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0)); /* the OS saves YMM state */
  (void)hi;
  return (lo & 6) == 6;
}

static uint64_t (*hash_fn)(const void *, size_t, uint64_t) = hash_base;

__attribute__((constructor)) static void hash_init(void) {
  if (have_avx2()) hash_fn = kvt_hash64_avx2;
}

uint64_t kvt_hash64(const void *p, size_t n, uint64_t seed) { return hash_fn(p, n, seed); }
