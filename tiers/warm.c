/* warm.c - the warm tier's form of a layer block: K encoded with a key
 * codec, then V with a value codec (tiers/codec.h), in one 64-byte-aligned
 * allocation counted in KVT_MEM_WARM. Encoding runs outside the engine lock
 * on a pinned hot block; the result replaces the hot payload. */
#include <errno.h>

#include "kvtier.h"
#include "tiers/codec.h"
#include "tiers/tier.h"

static kvt_cshape cshape(const kvt_shape_lite *s, uint64_t seed) {
  return (kvt_cshape){.n_tokens = s->n_tokens, .n_heads = s->n_heads, .head_dim = s->head_dim,
                      .seed = seed};
}

uint64_t kvt_warm_size(const kvt_shape_lite *s, int k_codec, int v_codec) {
  kvt_cshape c = cshape(s, 0);
  return kvt_mem_round(kvt_codec_size(k_codec, &c) + kvt_codec_size(v_codec, &c));
}

int kvt_warm_encode(kvt_mem *m, const kvt_shape_lite *s, const void *k, const void *v,
                    int k_codec, int v_codec, uint64_t seed, kvt_warm_form *out) {
  kvt_cshape c = cshape(s, seed);
  size_t kl = kvt_codec_size(k_codec, &c), vl = kvt_codec_size(v_codec, &c);
  *out = (kvt_warm_form){.alloc = kvt_mem_round(kl + vl), .k_len = (uint32_t)kl,
                         .k_codec = (uint8_t)k_codec, .v_codec = (uint8_t)v_codec};
  if (!k) return 0;
  out->payload = kvt_mem_alloc_aligned(m, KVT_MEM_WARM, kl + vl);
  if (!out->payload) return -ENOMEM;
  int64_t r1 = kvt_codec_encode(k_codec, &c, k, s->dtype, out->payload, kl);
  int64_t r2 = kvt_codec_encode(v_codec, &c, v, s->dtype, out->payload + kl, vl);
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
  size_t kl = kvt_codec_size(b->k_codec, &c), vl = kvt_codec_size(b->v_codec, &c);
  if (kl != b->k_len) return KVT_ECORRUPT;
  if (b->checked) {
    kvt_codec_decode_trusted(b->k_codec, &c, b->payload, k_out, s->dtype);
    kvt_codec_decode_trusted(b->v_codec, &c, b->payload + kl, v_out, s->dtype);
    return 0;
  }
  int rc = kvt_codec_decode(b->k_codec, &c, b->payload, kl, k_out, s->dtype);
  return rc ? rc : kvt_codec_decode(b->v_codec, &c, b->payload + kl, vl, v_out, s->dtype);
}

kvt_lblk *kvt_warm_alloc(kvt_mem *m, uint64_t payload_bytes, const kvt_warm_form *f) {
  kvt_lblk *b = kvt_mem_alloc_aligned(m, KVT_MEM_WARM, sizeof(kvt_lblk));
  if (!b) return NULL;
  *b = (kvt_lblk){.payload = f->payload, .payload_bytes = payload_bytes, .payload_alloc = f->alloc,
                  .cost = kvt_lblk_desc_bytes() + f->alloc, .k_len = f->k_len,
                  .k_codec = f->k_codec, .v_codec = f->v_codec, .checked = f->checked};
  return b;
}
