/* fuzz_codec_v.c - libFuzzer target for the value codecs' decoders (v2,
 * v3, v4): check and decode arbitrary bytes; the oracle is in fuzz_codec.h. */
#include "fuzz_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fz_one(data, size, 1); }
