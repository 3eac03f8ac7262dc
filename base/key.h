/* key.h - namespace seeds and chained token-block keys (docs/format.md,
 * "Keys"). Pure functions of their inputs: equal in any process, any day. */
#ifndef KVT_KEY_H
#define KVT_KEY_H

#include "kvtier.h"

/* Canonical encoding of a namespace into buf (cap bytes); returns its
 * length, or 0 when cap is too small. rope_dims 0 is encoded as head_dim. */
size_t kvt_ns_encode(const kvt_ns_desc *d, uint8_t *buf, size_t cap);
/* Upper bound of kvt_ns_encode() for strings of at most KVT_MAX_ID_LEN. */
#define KVT_NS_ENCODE_MAX (8 + 3 * (4 + KVT_MAX_ID_LEN) + 8 + 4 * 8)
void kvt_ns_seed_of(const kvt_ns_desc *d, kvt_key *seed);
/* Inverse of kvt_ns_encode: strings are copied into strs (room for
 * 3 * (KVT_MAX_ID_LEN + 1) bytes). 0 or KVT_ECORRUPT. */
int kvt_ns_decode(const uint8_t *buf, size_t len, kvt_ns_desc *d, char *strs);
/* First 8 bytes of a key as an integer: keys are uniform, so this is a hash. */
uint64_t kvt_key_hash(const kvt_key *k);
int kvt_key_eq(const kvt_key *a, const kvt_key *b);
/* The previous key of a block appended under a lineage (a sequence whose
 * attention was lossy, engine/lineage.c): XXH3-128 of the tag "KVTLIN01",
 * prev (16 zero bytes for a first block) and the lineage id. The block's
 * key is then kvt_key_next(seed, out, tokens). */
void kvt_key_salt(const kvt_key *prev, const kvt_key *lineage, kvt_key *out);

#endif
