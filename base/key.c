/* key.c - XXH3-128 namespace seeds and chained block keys.
 * Layout of the hashed bytes is specified in docs/format.md ("Keys"); the
 * test vectors there are checked by tests/test_keys.c. The xxHash header is
 * compiled in (XXH_INLINE_ALL): with AVX2 it is ~4x the Debian .so here. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <stddef.h>
#include <string.h>

#include "base/key.h"

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

static int get_u32(const uint8_t **p, const uint8_t *end, uint32_t *v) {
  if (end - *p < 4) return -1;
  *v = (uint32_t)(*p)[0] | (uint32_t)(*p)[1] << 8 | (uint32_t)(*p)[2] << 16 | (uint32_t)(*p)[3] << 24;
  *p += 4;
  return 0;
}

/* A string field: copied NUL-terminated into *strs (advanced). */
static int get_str(const uint8_t **p, const uint8_t *end, char **strs, const char **out) {
  uint32_t n;
  if (get_u32(p, end, &n) || n > KVT_MAX_ID_LEN || end - *p < (ptrdiff_t)n) return -1;
  if (memchr(*p, 0, n)) return -1; /* a NUL would cut the string: it would not encode back */
  memcpy(*strs, *p, n);
  (*strs)[n] = 0;
  *out = *strs;
  *strs += n + 1;
  *p += n;
  return 0;
}

int kvt_ns_decode(const uint8_t *buf, size_t len, kvt_ns_desc *d, char *strs) {
  const uint8_t *p = buf, *end = buf + len;
  uint32_t lo, hi;
  if (len < 8 || memcmp(p, "KVTNS001", 8)) return KVT_ECORRUPT;
  p += 8;
  *d = (kvt_ns_desc){0};
  if (get_str(&p, end, &strs, &d->model_id) || get_str(&p, end, &strs, &d->weights_fingerprint) ||
      get_u32(&p, end, &lo) || get_u32(&p, end, &hi))
    return KVT_ECORRUPT;
  uint64_t bits = (uint64_t)hi << 32 | lo;
  memcpy(&d->rope_theta, &bits, 8);
  /* rope_dims 0 is never written (kvt_ns_encode writes head_dim for it) */
  if (get_u32(&p, end, &d->rope_dims) || d->rope_dims == 0 ||
      get_str(&p, end, &strs, &d->rope_scaling) ||
      get_u32(&p, end, &d->tp_rank) || get_u32(&p, end, &d->tp_size) ||
      get_u32(&p, end, &d->shape.n_layers) || get_u32(&p, end, &d->shape.n_kv_heads) ||
      get_u32(&p, end, &d->shape.head_dim) || get_u32(&p, end, &d->shape.dtype) ||
      get_u32(&p, end, &d->shape.block_tokens) || p != end)
    return KVT_ECORRUPT;
  return 0;
}

/* A lineage's stand-in for the previous key (docs/format.md, "Salted
 * keys"): a tag no token block key is hashed with, so a salted chain never
 * meets a plain one. */
void kvt_key_salt(const kvt_key *prev, const kvt_key *lineage, kvt_key *out) {
  static const kvt_key zero;
  static const uint8_t tag[8] = {'K', 'V', 'T', 'L', 'I', 'N', '0', '1'};
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  XXH3_128bits_update(&st, tag, sizeof tag);
  XXH3_128bits_update(&st, (prev ? prev : &zero)->b, 16);
  XXH3_128bits_update(&st, lineage->b, 16);
  canonical(XXH3_128bits_digest(&st), out);
}
