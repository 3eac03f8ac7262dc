/* hash.h - XXH3-64 over long buffers (cold-tier checksums), with an AVX2
 * build of xxHash picked at run time; the library itself is compiled for
 * baseline x86-64, where XXH3 runs its SSE2 path at half the speed. */
#ifndef KVT_HASH_H
#define KVT_HASH_H

#include <stddef.h>
#include <stdint.h>

/* XXH3_64bits_withSeed(p, n, seed): the same value whichever build runs. */
uint64_t kvt_hash64(const void *p, size_t n, uint64_t seed);

#endif
