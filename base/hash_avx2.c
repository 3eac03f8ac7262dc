/* hash_avx2.c - xxHash's XXH3 built for AVX2 (the target pragma), called
 * only by hash.c after cpuid said yes. Nothing else in the library is
 * compiled for AVX2 outside functions marked for it. */
#include <stddef.h>
#include <stdint.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC target("avx2")
#endif
#include <immintrin.h> /* xxhash.h includes it only when __AVX2__ is set (gcc sets it here, clang not) */
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

uint64_t kvt_hash64_avx2(const void *p, size_t n, uint64_t seed);

uint64_t kvt_hash64_avx2(const void *p, size_t n, uint64_t seed) {
  return XXH3_64bits_withSeed(p, n, seed);
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
