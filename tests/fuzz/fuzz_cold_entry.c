/* fuzz_cold_entry.c - libFuzzer target for the cold tier's LMDB block
 * entry decoder (kvt_rec_entry_get, tiers/cold_record.c). Input: a 16-byte
 * key, then the entry value. What must hold: the decoder returns 0 or
 * KVT_ECORRUPT and reads nothing outside the value; an accepted entry
 * re-encodes (kvt_rec_entry_put, kvt_rec_slice_put) to the same bytes, and
 * every slice it lists lies inside its record after the header, where a
 * reader reads align4k(stored_len) bytes (checked here, not through the
 * decoder's own check). */
#include "kvtier.h"
#include "tests/fuzz/fuzz_cold.h"
#include "tiers/cold_record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < FZ_KEY) return 0;
  kvt_key key;
  memcpy(key.b, data, FZ_KEY);
  size_t len = size - FZ_KEY;
  uint8_t *v = fz_dup(data + FZ_KEY, len);
  kvt_cold_entry e;
  int rc = kvt_rec_entry_get(&key, v, len, &e);
  FZ_CHECK(rc == 0 || rc == KVT_ECORRUPT);
  if (rc == 0) {
    FZ_CHECK(e.n_layers >= 1 && e.n_layers <= KVT_MAX_LAYERS);
    FZ_CHECK(len == kvt_rec_entry_len(e.n_layers));
    FZ_CHECK(memcmp(e.key.b, key.b, 16) == 0);
    FZ_CHECK(kvt_dtype_size(e.dtype) != 0 && e.offset % 4096 == 0 && e.rec_len % 4096 == 0);
    uint8_t *re = malloc(len);
    FZ_CHECK(re != NULL);
    kvt_rec_entry_put(re, &e);
    uint64_t hl = kvt_rec_header_len(e.n_layers);
    for (uint32_t l = 0; l < e.n_layers; l++) {
      kvt_cold_slice s;
      const uint8_t *row = v + KVT_REC_ENTRY_FIXED + (size_t)KVT_REC_SLICE * l;
      kvt_rec_slice_get(row, &s);
      kvt_rec_slice_put(re + KVT_REC_ENTRY_FIXED + (size_t)KVT_REC_SLICE * l, &s);
      uint64_t rd = ((uint64_t)s.stored_len + 4095) / 4096 * 4096; /* what a reader reads */
      FZ_CHECK(s.rel_off % 4096 == 0 && s.rel_off >= hl);
      FZ_CHECK((uint64_t)s.rel_off + rd <= e.rec_len);
      FZ_CHECK((uint32_t)((s.stored_len + 4095u) & ~4095u) >= s.stored_len); /* no 32-bit wrap */
      FZ_CHECK(s.raw_len == 2 * (uint64_t)e.bytes_each && s.codec <= 1);
    }
    FZ_CHECK(memcmp(re, v, len) == 0);
    free(re);
  }
  free(v);
  return 0;
}
