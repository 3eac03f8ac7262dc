/* fuzz_codec_k.c - libFuzzer target for the key codecs' decoders (k8, k8c,
 * k4): check and decode arbitrary bytes; the oracle is in fuzz_codec.h. */
#include "fuzz_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fz_one(data, size, 0); }
