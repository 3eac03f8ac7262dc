/* remote_rec.c - what the remote tier stores (tiers/remote.h): key names
 * and token-block values in the cold tier's record format, built and
 * checked with cold_record.h's functions. Pure: no client, no state. */
#include <stdio.h>
#include <string.h>

#include "base/hash.h"
#include "base/key.h"
#include "tiers/cold_internal.h" /* cold_slice_seed: the checksum seed of the cold format */
#include "tiers/remote.h"

size_t kvt_remote_block_key(const kvt_key *key, char *buf) {
  static const char hex[] = "0123456789abcdef";
  memcpy(buf, "kvt1:b:", 7);
  for (int i = 0; i < 16; i++) {
    buf[7 + 2 * i] = hex[key->b[i] >> 4];
    buf[8 + 2 * i] = hex[key->b[i] & 15];
  }
  buf[39] = 0;
  return 39;
}

size_t kvt_remote_ns_key(uint32_t i, char *buf) {
  return (size_t)snprintf(buf, KVT_REMOTE_KEY_MAX, "kvt1:{ns}:%u", i);
}

/* Slices raw (codec 0): a remote value is read whole, and byte planes
 * would save ~4-12% of it for a decode step on every load. */
int kvt_remote_encode(kvt_mem *m, const kvt_store_rec *r, uint8_t **out, size_t *len) {
  if (!r->n_layers || r->n_layers > KVT_MAX_LAYERS || !r->bytes_each || !r->layers)
    return KVT_EOPTION;
  uint32_t hl = kvt_rec_header_len(r->n_layers), raw = 2 * r->bytes_each;
  uint64_t slot = kvt_align4k(raw), total = hl + (uint64_t)r->n_layers * slot;
  if (total > UINT32_MAX) return KVT_ESHAPE;
  kvt_cold_slice sl[KVT_MAX_LAYERS];
  uint8_t *v = kvt_mem_alloc(m, KVT_MEM_OTHER, total);
  if (!v) return -ENOMEM;
  for (uint32_t l = 0; l < r->n_layers; l++) {
    uint8_t *p = v + hl + l * slot;
    memcpy(p, r->layers[l], raw);
    memset(p + raw, 0, slot - raw);
    sl[l] = (kvt_cold_slice){.rel_off = (uint32_t)(hl + l * slot), .stored_len = raw,
                             .raw_len = raw, .codec = KVT_COLD_CODEC_RAW,
                             .checksum = kvt_hash64(p, raw, cold_slice_seed(&r->key, l, KVT_REMOTE_GEN))};
  }
  kvt_cold_entry e = {.seg_gen = KVT_REMOTE_GEN, .rec_len = (uint32_t)total,
                      .n_layers = r->n_layers, .dtype = r->dtype, .bytes_each = r->bytes_each,
                      .pos = r->pos, .key = r->key, .parent = r->parent, .ns_seed = r->ns_seed};
  kvt_rec_header_put(v, &e, sl);
  *out = v;
  *len = total;
  return 0;
}

int kvt_remote_check(const kvt_key *key, const uint8_t *v, size_t len, kvt_cold_entry *e,
                     kvt_cold_slice *sl) {
  if (kvt_rec_header_get(v, len, e, sl)) return KVT_ECORRUPT;
  if (e->rec_len != len || e->seg_gen != KVT_REMOTE_GEN || !kvt_key_eq(&e->key, key))
    return KVT_ECORRUPT;
  for (uint32_t l = 0; l < e->n_layers; l++) {
    const uint8_t *p = v + sl[l].rel_off;
    if (kvt_hash64(p, sl[l].stored_len, cold_slice_seed(key, l, KVT_REMOTE_GEN)) != sl[l].checksum)
      return KVT_ECORRUPT;
  }
  return 0;
}

int kvt_remote_decode(kvt_mem *m, const uint8_t *v, const kvt_cold_entry *e, const kvt_cold_slice *sl,
                      uint32_t layer, void *k_out, void *v_out, size_t each) {
  if (layer >= e->n_layers || each != e->bytes_each) return KVT_ECORRUPT;
  uint32_t esize = (uint32_t)kvt_dtype_size(e->dtype);
  if (sl[layer].codec == KVT_COLD_CODEC_RAW)
    return kvt_rec_payload_decode(m, NULL, v + sl[layer].rel_off, &sl[layer], esize, k_out, v_out, each);
  ZSTD_DCtx *dz = ZSTD_createDCtx(); /* planes: written by no kvtier today, decoded all the same */
  if (!dz) return -ENOMEM;
  int rc = kvt_rec_payload_decode(m, dz, v + sl[layer].rel_off, &sl[layer], esize, k_out, v_out, each);
  ZSTD_freeDCtx(dz);
  return rc;
}
