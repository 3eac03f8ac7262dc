/* fuzz_cold.h - what the durable-format fuzz targets (fuzz_cold_*.c,
 * fuzz_ns.c, fuzz_*_trace.c) and their corpus generator share: input
 * layouts and the failure report. Each oracle abort()s, so libFuzzer and
 * the replay (replay.c) both report it. */
#ifndef KVT_FUZZ_COLD_H
#define KVT_FUZZ_COLD_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_KEY 16 /* fuzz_cold_entry: the block key, then the entry */

/* fuzz_cold_payload: a prefix saying what the index says of the slice,
 * then the payload (its stored length is the rest of the input):
 *   [0] codec  [1] dtype  [2] bit 0: a zstd context is given  [3] 0
 *   [4..7] each (K bytes = V bytes), u32 LE  [8..11] raw_len, u32 LE */
#define FZ_PAYLOAD_PREFIX 12
#define FZ_EACH_MAX (1u << 20) /* larger inputs are skipped: memory, not format */

static inline void fz_put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static inline uint32_t fz_get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t fz_get64(const uint8_t *p) {
  return fz_get32(p) | (uint64_t)fz_get32(p + 4) << 32;
}

static inline void fz_payload_prefix(uint8_t *pre, uint8_t codec, uint32_t dtype, int dz,
                                     uint32_t each, uint32_t raw_len) {
  pre[0] = codec;
  pre[1] = (uint8_t)dtype;
  pre[2] = (uint8_t)(dz ? 1 : 0);
  pre[3] = 0;
  fz_put32(pre + 4, each);
  fz_put32(pre + 8, raw_len);
}

/* A copy of the input in an allocation of exactly its size, so that any
 * read past it is caught. */
static inline uint8_t *fz_dup(const uint8_t *data, size_t size) {
  uint8_t *p = malloc(size ? size : 1);
  if (!p) abort();
  if (size) memcpy(p, data, size);
  return p;
}

#define FZ_CHECK(c)                                                                   \
  do {                                                                                \
    if (!(c)) {                                                                       \
      fprintf(stderr, "fuzz oracle: %s (%s:%d)\n", #c, __FILE__, __LINE__);           \
      abort();                                                                        \
    }                                                                                 \
  } while (0)

#endif
