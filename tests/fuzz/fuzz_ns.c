/* fuzz_ns.c - libFuzzer target for the namespace decoder
 * (kvt_ns_decode, base/key.c), what the cold tier's LMDB `ns` database
 * holds. Input: the stored encoding. What must hold: 0 or KVT_ECORRUPT,
 * nothing read outside the input nor written outside the strings buffer
 * the engine gives it (3 x (KVT_MAX_ID_LEN + 1)); an accepted encoding is
 * exactly what kvt_ns_encode makes of the decoded namespace, so the seed
 * the engine recomputes from it is the seed it was stored under. */
#include "base/key.h"
#include "kvtier.h"
#include "tests/fuzz/fuzz_cold.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *in = fz_dup(data, size);
  char *strs = malloc(3 * (KVT_MAX_ID_LEN + 1));
  FZ_CHECK(strs != NULL);
  kvt_ns_desc d;
  int rc = kvt_ns_decode(in, size, &d, strs);
  FZ_CHECK(rc == 0 || rc == KVT_ECORRUPT);
  if (rc == 0) {
    FZ_CHECK(d.model_id && d.weights_fingerprint && d.rope_scaling);
    uint8_t re[KVT_NS_ENCODE_MAX];
    size_t n = kvt_ns_encode(&d, re, sizeof re);
    FZ_CHECK(n == size && memcmp(re, in, size) == 0);
  }
  free(strs);
  free(in);
  return 0;
}
