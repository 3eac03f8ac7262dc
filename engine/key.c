/* key.c - XXH3-128 namespace seeds and chained block keys.
 * Layout of the hashed bytes is specified in docs/format.md ("Keys"); the
 * test vectors there are checked by tests/test_keys.c. The xxHash header is
 * compiled in (XXH_INLINE_ALL): with AVX2 it is ~4x the Debian .so here. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <string.h>

#include "engine/key.h"

static uint8_t *put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
  return p + 4;
}

static uint8_t *put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
  return p + 8;
}

static uint8_t *put_str(uint8_t *p, const char *s) {
  size_t n = s ? strlen(s) : 0;
  p = put_u32(p, (uint32_t)n);
  if (n) memcpy(p, s, n);
  return p + n;
}

static size_t slen(const char *s) { return s ? strlen(s) : 0; }

size_t kvt_ns_encode(const kvt_ns_desc *d, uint8_t *buf, size_t cap) {
  size_t need = 8 + 3 * 4 + slen(d->model_id) + slen(d->weights_fingerprint) +
                slen(d->rope_scaling) + 8 + 4 * 8;
  if (need > cap) return 0;
  uint64_t theta_bits;
  memcpy(&theta_bits, &d->rope_theta, 8);
  uint8_t *p = buf;
  memcpy(p, "KVTNS001", 8);
  p = put_str(p + 8, d->model_id);
  p = put_str(p, d->weights_fingerprint);
  p = put_u64(p, theta_bits);
  p = put_u32(p, d->rope_dims ? d->rope_dims : d->shape.head_dim);
  p = put_str(p, d->rope_scaling);
  p = put_u32(p, d->tp_rank);
  p = put_u32(p, d->tp_size);
  p = put_u32(p, d->shape.n_layers);
  p = put_u32(p, d->shape.n_kv_heads);
  p = put_u32(p, d->shape.head_dim);
  p = put_u32(p, d->shape.dtype);
  p = put_u32(p, d->shape.block_tokens);
  return (size_t)(p - buf);
}

static void canonical(XXH128_hash_t h, kvt_key *out) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  memcpy(out->b, c.digest, 16);
}

void kvt_ns_seed_of(const kvt_ns_desc *d, kvt_key *seed) {
  uint8_t buf[KVT_NS_ENCODE_MAX];
  size_t n = kvt_ns_encode(d, buf, sizeof buf);
  canonical(XXH3_128bits(buf, n), seed);
}

void kvt_key_next(const kvt_key *seed, const kvt_key *prev, const uint32_t *tokens,
                  uint32_t block_tokens, kvt_key *out) {
  static const kvt_key zero;
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  XXH3_128bits_update(&st, seed->b, 16);
  XXH3_128bits_update(&st, (prev ? prev : &zero)->b, 16);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  XXH3_128bits_update(&st, tokens, (size_t)block_tokens * 4);
#else
  for (uint32_t i = 0; i < block_tokens; i++) {
    uint8_t le[4];
    put_u32(le, tokens[i]);
    XXH3_128bits_update(&st, le, 4);
  }
#endif
  canonical(XXH3_128bits_digest(&st), out);
}

uint64_t kvt_key_hash(const kvt_key *k) {
  uint64_t h;
  memcpy(&h, k->b, 8);
  return h;
}

int kvt_key_eq(const kvt_key *a, const kvt_key *b) { return memcmp(a->b, b->b, 16) == 0; }
