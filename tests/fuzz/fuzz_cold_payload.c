/* fuzz_cold_payload.c - libFuzzer target for the cold tier's slice payload
 * decoder (kvt_rec_payload_decode, tiers/cold_record.c): raw K||V, and byte
 * planes raw or zstd (f16 and bf16 take the two-plane path, f32 four
 * planes). Input: the prefix of fuzz_cold.h, then the payload. What must
 * hold: 0, KVT_ECORRUPT, or -ENOMEM only when no zstd context was given;
 * nothing is read outside the payload nor written outside K and V (each
 * in an allocation of exactly `each` bytes); an accepted payload is what
 * K||V encodes to: raw, its bytes; byte planes, plane p of K||V equals the
 * stored plane p (raw, or as zstd decompresses it here), with the header
 * the format says. */
#include <errno.h>
#include <zstd.h>

#include "kvtier.h"
#include "tests/fuzz/fuzz_cold.h"
#include "tiers/cold_record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ZSTD_DCtx *g_dz, *g_dz_check;

/* Byte plane p of K||V (n elements of esize bytes) equals plane[0..n). */
static int plane_is(const uint8_t *k, const uint8_t *v, size_t each, uint32_t esize, uint32_t p,
                    const uint8_t *plane, size_t n) {
  for (size_t i = 0; i < n; i++) {
    size_t b = i * esize + p;
    uint8_t x = b < each ? k[b] : v[b - each];
    if (x != plane[i]) return 0;
  }
  return 1;
}

static void check_planes(const uint8_t *p, size_t len, const uint8_t *k, const uint8_t *v,
                         size_t each, uint32_t esize) {
  FZ_CHECK(len >= kvt_rec_planes_overhead(esize) && fz_get32(p) == esize);
  size_t n = fz_get32(p + 4), off = kvt_rec_planes_overhead(esize);
  FZ_CHECK(n * esize == 2 * each);
  uint8_t *plane = malloc(n ? n : 1);
  FZ_CHECK(plane != NULL);
  for (uint32_t pi = 0; pi < esize; pi++) {
    const uint8_t *ph = p + 8 + 8 * pi;
    size_t pl = fz_get32(ph);
    FZ_CHECK(off + pl <= len && ph[4] <= 1);
    if (ph[4] == 0) {
      FZ_CHECK(pl == n);
      memcpy(plane, p + off, n);
    } else {
      FZ_CHECK(ZSTD_decompressDCtx(g_dz_check, plane, n, p + off, pl) == n);
    }
    FZ_CHECK(plane_is(k, v, each, esize, pi, plane, n));
    off += pl;
  }
  FZ_CHECK(off == len);
  free(plane);
}

/* Does a plane header of the payload ask for zstd (the one thing that
 * needs the context)? */
static int has_zstd(const uint8_t *p, size_t len, uint32_t esize) {
  for (uint32_t pi = 0; pi < esize && 8 + 8 * (size_t)pi + 5 <= len; pi++)
    if (p[8 + 8 * pi + 4] == 1) return 1;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < FZ_PAYLOAD_PREFIX) return 0;
  if (!g_dz) g_dz = ZSTD_createDCtx();
  if (!g_dz_check) g_dz_check = ZSTD_createDCtx();
  FZ_CHECK(g_dz && g_dz_check);
  uint32_t each = fz_get32(data + 4), dtype = data[1];
  if (each > FZ_EACH_MAX) return 0;
  int use_dz = data[2] & 1;
  size_t len = size - FZ_PAYLOAD_PREFIX;
  kvt_cold_slice s = {.stored_len = (uint32_t)len, .raw_len = fz_get32(data + 8), .codec = data[0]};
  uint8_t *p = fz_dup(data + FZ_PAYLOAD_PREFIX, len);
  uint8_t *k = malloc(each ? each : 1), *v = malloc(each ? each : 1);
  FZ_CHECK(k && v);
  uint32_t esize = (uint32_t)kvt_dtype_size(dtype);
  static kvt_mem mem; /* counts the planes' scratch; never fails */
  int rc = kvt_rec_payload_decode(&mem, use_dz ? g_dz : NULL, p, &s, esize, k, v, each);
  FZ_CHECK(rc == 0 || rc == KVT_ECORRUPT || (rc == -ENOMEM && !use_dz && has_zstd(p, len, esize)));
  if (rc == 0) {
    FZ_CHECK(s.raw_len == 2 * (uint64_t)each);
    if (s.codec == KVT_COLD_CODEC_RAW) {
      FZ_CHECK(len == 2 * (size_t)each && memcmp(p, k, each) == 0 && memcmp(p + each, v, each) == 0);
    } else {
      FZ_CHECK(s.codec == KVT_COLD_CODEC_PLANES && esize != 0 && each % esize == 0);
      check_planes(p, len, k, v, each, esize);
    }
  }
  free(k);
  free(v);
  free(p);
  return 0;
}
