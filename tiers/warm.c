/* warm.c - the warm tier's form of a layer block: K encoded with a key
 * codec, then V with a value codec (codec/codec.h), in one 64-byte-aligned
 * allocation counted in KVT_MEM_WARM. Either side may be KVT_CODEC_NONE:
 * it is then kept exact, its bytes as given, with no header. Encoding runs
 * outside the engine lock on a pinned hot block; the result replaces the
 * hot payload. */
#include <errno.h>
#include <string.h>

#include "codec/codec.h"
#include "kvtier.h"
#include "tiers/tier.h"

static kvt_cshape cshape(const kvt_shape_lite *s, uint64_t seed) {
  return (kvt_cshape){.n_tokens = s->n_tokens, .n_heads = s->n_heads, .head_dim = s->head_dim,
                      .seed = seed};
}

size_t kvt_warm_side_size(const kvt_shape_lite *s, int codec) {
  kvt_cshape c = cshape(s, 0);
  if (codec == KVT_CODEC_NONE)
    return (size_t)s->n_tokens * s->n_heads * s->head_dim * kvt_dtype_size(s->dtype);
  return kvt_codec_size(codec, &c);
}

uint64_t kvt_warm_size(const kvt_shape_lite *s, int k_codec, int v_codec) {
  return kvt_mem_round(kvt_warm_side_size(s, k_codec) + kvt_warm_side_size(s, v_codec));
}

/* One side: encoded, or copied when it is kept exact. */
static int64_t side_encode(int codec, const kvt_cshape *c, const kvt_shape_lite *s, const void *in,
                           uint8_t *out, size_t len) {
  if (codec != KVT_CODEC_NONE) return kvt_codec_encode(codec, c, in, s->dtype, out, len);
  memcpy(out, in, len);
  return (int64_t)len;
}

static void side_decode_trusted(int codec, const kvt_cshape *c, const kvt_shape_lite *s,
                                const uint8_t *in, size_t len, void *out) {
  if (codec != KVT_CODEC_NONE) kvt_codec_decode_trusted(codec, c, in, out, s->dtype);
  else memcpy(out, in, len);
}

static int side_decode(int codec, const kvt_cshape *c, const kvt_shape_lite *s, const uint8_t *in,
                       size_t len, void *out) {
  if (codec != KVT_CODEC_NONE) return kvt_codec_decode(codec, c, in, len, out, s->dtype);
  memcpy(out, in, len); /* exact bytes: nothing to check */
  return 0;
}

int kvt_warm_check(const kvt_shape_lite *s, const kvt_lblk *b, uint64_t seed) {
  kvt_cshape c = cshape(s, seed);
  size_t kl = kvt_warm_side_size(s, b->k_codec), vl = kvt_warm_side_size(s, b->v_codec);
  if (kl != b->k_len || !kl || !vl) return KVT_ECORRUPT;
  if (b->k_codec != KVT_CODEC_NONE && kvt_codec_check(b->k_codec, &c, b->payload, kl))
    return KVT_ECORRUPT;
  if (b->v_codec != KVT_CODEC_NONE && kvt_codec_check(b->v_codec, &c, b->payload + kl, vl))
    return KVT_ECORRUPT;
  return 0;
}

int kvt_warm_encode(kvt_mem *m, const kvt_shape_lite *s, const void *k, const void *v,
                    int k_codec, int v_codec, uint64_t seed, kvt_warm_form *out) {
  kvt_cshape c = cshape(s, seed);
  size_t kl = kvt_warm_side_size(s, k_codec), vl = kvt_warm_side_size(s, v_codec);
  *out = (kvt_warm_form){.alloc = kvt_mem_round(kl + vl), .k_len = (uint32_t)kl,
                         .k_codec = (uint8_t)k_codec, .v_codec = (uint8_t)v_codec};
  if (!k) return 0;
  out->payload = kvt_mem_alloc_aligned(m, KVT_MEM_WARM, kl + vl);
  if (!out->payload) return -ENOMEM;
  int64_t r1 = side_encode(k_codec, &c, s, k, out->payload, kl);
  int64_t r2 = side_encode(v_codec, &c, s, v, out->payload + kl, vl);
  if (r1 < 0 || r2 < 0) { /* cannot happen for a valid shape; never keep half a block */
    kvt_mem_free(m, KVT_MEM_WARM, out->payload, out->alloc);
    out->payload = NULL;
    return r1 < 0 ? (int)r1 : (int)r2;
  }
  out->checked = 1; /* our own encoding: nothing to check when it is read */
  return 0;
}

int kvt_warm_decode(const kvt_shape_lite *s, const kvt_lblk *b, uint64_t seed, void *k_out,
                    void *v_out) {
  kvt_cshape c = cshape(s, seed);
  size_t kl = kvt_warm_side_size(s, b->k_codec), vl = kvt_warm_side_size(s, b->v_codec);
  if (kl != b->k_len) return KVT_ECORRUPT;
  if (b->checked) {
    side_decode_trusted(b->k_codec, &c, s, b->payload, kl, k_out);
    side_decode_trusted(b->v_codec, &c, s, b->payload + kl, vl, v_out);
    return 0;
  }
  int rc = side_decode(b->k_codec, &c, s, b->payload, kl, k_out);
  return rc ? rc : side_decode(b->v_codec, &c, s, b->payload + kl, vl, v_out);
}

kvt_lblk *kvt_warm_alloc(kvt_mem *m, uint64_t payload_bytes, const kvt_warm_form *f) {
  kvt_lblk *b = kvt_mem_alloc_aligned(m, KVT_MEM_WARM, sizeof(kvt_lblk));
  if (!b) return NULL;
  *b = (kvt_lblk){.payload = f->payload, .payload_bytes = payload_bytes, .payload_alloc = f->alloc,
                  .cost = kvt_lblk_desc_bytes() + f->alloc, .k_len = f->k_len,
                  .k_codec = f->k_codec, .v_codec = f->v_codec, .checked = f->checked};
  return b;
}
