/* fuzz_cold_header.c - libFuzzer target for the cold tier's on-disk record
 * header decoder (kvt_rec_header_get, tiers/cold_record.c). Input: a mode
 * byte, then the first bytes of a record; with mode bit 0 set the header's
 * checksum is recomputed first (where n_layers leaves room for it), so
 * that the fuzzer reaches the checks behind it. What must hold: 0 or KVT_ECORRUPT, nothing read
 * outside the input; an accepted header lies inside the input, its slices
 * inside the record after the header (as a reader reads them:
 * align4k(stored_len) bytes), and it re-encodes (kvt_rec_header_put) to
 * the same header bytes. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvtier.h"
#include "tests/fuzz/fuzz_cold.h"
#include "tiers/cold_record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int fix = data[0] & 1;
  uint8_t *h = fz_dup(data + 1, --size);
  if (fix && size >= KVT_REC_FIXED) {
    uint64_t tab = KVT_REC_FIXED + (uint64_t)KVT_REC_SLICE * fz_get32(h + KVT_REC_H_N_LAYERS);
    if (tab + 8 <= size) {
      uint64_t x = XXH3_64bits(h, tab);
      for (int i = 0; i < 8; i++) h[tab + i] = (uint8_t)(x >> 8 * i);
    }
  }
  kvt_cold_entry e;
  static kvt_cold_slice sl[KVT_MAX_LAYERS];
  int rc = kvt_rec_header_get(h, size, &e, sl);
  FZ_CHECK(rc == 0 || rc == KVT_ECORRUPT);
  if (rc == 0) {
    uint32_t hl = kvt_rec_header_len(e.n_layers);
    FZ_CHECK(e.n_layers >= 1 && e.n_layers <= KVT_MAX_LAYERS && hl <= size);
    FZ_CHECK(e.rec_len >= hl && e.rec_len % 4096 == 0 && kvt_dtype_size(e.dtype) != 0);
    for (uint32_t l = 0; l < e.n_layers; l++) {
      uint64_t rd = ((uint64_t)sl[l].stored_len + 4095) / 4096 * 4096;
      FZ_CHECK(sl[l].rel_off % 4096 == 0 && sl[l].rel_off >= hl);
      FZ_CHECK((uint64_t)sl[l].rel_off + rd <= e.rec_len);
      FZ_CHECK(sl[l].raw_len == 2 * (uint64_t)e.bytes_each && sl[l].codec <= 1);
    }
    uint8_t *re = malloc(hl);
    FZ_CHECK(re != NULL);
    kvt_rec_header_put(re, &e, sl);
    FZ_CHECK(memcmp(re, h, hl) == 0);
    free(re);
  }
  free(h);
  return 0;
}
