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

/* The 4 KiB grid's padding after a slice is below 4 KiB: sent from here. */
static const uint8_t rec_zeros[4096];

/* The header of r's record into hdr (kvt_rec_header_len bytes), its
 * slices' checksums over r's payloads where they are; slot the bytes a
 * slice takes on the grid, total the record's. */
static void rec_header(const kvt_store_rec *r, uint8_t *hdr, uint64_t slot, uint64_t total) {
  uint32_t hl = kvt_rec_header_len(r->n_layers), raw = 2 * r->bytes_each;
  kvt_cold_slice sl[KVT_MAX_LAYERS];
  for (uint32_t l = 0; l < r->n_layers; l++)
    sl[l] = (kvt_cold_slice){.rel_off = (uint32_t)(hl + l * slot), .stored_len = raw,
                             .raw_len = raw, .codec = KVT_COLD_CODEC_RAW,
                             .checksum = kvt_hash64(r->layers[l], raw,
                                                    cold_slice_seed(&r->key, l, KVT_REMOTE_GEN))};
  kvt_cold_entry e = {.seg_gen = KVT_REMOTE_GEN, .rec_len = (uint32_t)total,
                      .n_layers = r->n_layers, .dtype = r->dtype, .bytes_each = r->bytes_each,
                      .pos = r->pos, .key = r->key, .parent = r->parent, .ns_seed = r->ns_seed};
  kvt_rec_header_put(hdr, &e, sl);
}

/* r's shape as a record: 0 and its header, slot and total bytes. */
static int rec_shape(const kvt_store_rec *r, uint32_t *hl, uint64_t *slot, uint64_t *total) {
  if (!r->n_layers || r->n_layers > KVT_MAX_LAYERS || !r->bytes_each || !r->layers)
    return KVT_EOPTION;
  *hl = kvt_rec_header_len(r->n_layers);
  *slot = kvt_align4k(2 * (uint64_t)r->bytes_each);
  *total = *hl + (uint64_t)r->n_layers * *slot;
  return *total > UINT32_MAX ? KVT_ESHAPE : 0;
}

/* Slices raw (codec 0): a remote value is read whole, and byte planes
 * would save ~4-12% of it for a decode step on every load. */
int kvt_remote_encode(kvt_mem *m, const kvt_store_rec *r, uint8_t **out, size_t *len) {
  uint32_t hl;
  uint64_t slot, total;
  int rc = rec_shape(r, &hl, &slot, &total);
  if (rc) return rc;
  uint8_t *v = kvt_mem_alloc(m, KVT_MEM_OTHER, total);
  if (!v) return -ENOMEM;
  for (uint32_t l = 0; l < r->n_layers; l++) {
    uint8_t *p = v + hl + l * slot;
    memcpy(p, r->layers[l], 2 * (size_t)r->bytes_each);
    memset(p + 2 * (size_t)r->bytes_each, 0, slot - 2 * (size_t)r->bytes_each);
  }
  rec_header(r, v, slot, total);
  *out = v;
  *len = total;
  return 0;
}

size_t kvt_remote_parts_max(uint32_t n_layers) { return 1 + 2 * (size_t)n_layers; }

int kvt_remote_encode_parts(kvt_mem *m, const kvt_store_rec *r, uint8_t **hdr, size_t *hdr_len,
                            struct iovec *iov, int *n_iov, size_t *len) {
  uint32_t hl;
  uint64_t slot, total;
  int rc = rec_shape(r, &hl, &slot, &total);
  if (rc) return rc;
  uint8_t *h = kvt_mem_alloc(m, KVT_MEM_OTHER, hl);
  if (!h) return -ENOMEM;
  rec_header(r, h, slot, total);
  size_t raw = 2 * (size_t)r->bytes_each, pad = slot - raw;
  int k = 0;
  iov[k++] = (struct iovec){h, hl};
  for (uint32_t l = 0; l < r->n_layers; l++) {
    iov[k++] = (struct iovec){(void *)r->layers[l], raw};
    if (pad) iov[k++] = (struct iovec){(void *)rec_zeros, pad};
  }
  *hdr = h;
  *hdr_len = hl;
  *n_iov = k;
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
