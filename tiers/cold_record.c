/* cold_record.c - the cold tier's byte formats (cold_record.h): block
 * entries, record headers and slice payloads, encoded and checked as pure
 * functions of their bytes. docs/format.md ("Cold tier") is the spec. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "io/io.h"
#include "tiers/cold_record.h"

/* The layouts as structs of byte arrays (no padding), each from one list
 * of (field, bytes, offset): the list makes the struct, and offsetof
 * checks every offset of cold_record.h against it (REC_T names the struct
 * being checked), sizeof the fixed sizes. Used for nothing else. */
#define REC_HEADER_FIELDS(F)                                                                   \
  F(magic, 8, KVT_REC_H_MAGIC) F(hdr_len, 4, KVT_REC_H_HDR_LEN) F(rec_len, 4, KVT_REC_H_REC_LEN) \
  F(seg_gen, 8, KVT_REC_H_SEG_GEN) F(key, 16, KVT_REC_H_KEY) F(parent, 16, KVT_REC_H_PARENT)   \
  F(ns_seed, 16, KVT_REC_H_NS_SEED) F(pos, 4, KVT_REC_H_POS) F(n_layers, 4, KVT_REC_H_N_LAYERS) \
  F(dtype, 4, KVT_REC_H_DTYPE) F(bytes_each, 4, KVT_REC_H_BYTES_EACH)
#define REC_ENTRY_FIELDS(F)                                                                    \
  F(format, 4, KVT_REC_E_FORMAT) F(seg, 4, KVT_REC_E_SEG) F(seg_gen, 8, KVT_REC_E_SEG_GEN)      \
  F(offset, 8, KVT_REC_E_OFFSET) F(rec_len, 4, KVT_REC_E_REC_LEN) F(n_layers, 4, KVT_REC_E_N_LAYERS) \
  F(dtype, 4, KVT_REC_E_DTYPE) F(bytes_each, 4, KVT_REC_E_BYTES_EACH) F(parent, 16, KVT_REC_E_PARENT) \
  F(pos, 4, KVT_REC_E_POS) F(reserved, 4, KVT_REC_E_RESERVED) F(ns_seed, 16, KVT_REC_E_NS_SEED)
#define REC_SLICE_FIELDS(F)                                                                    \
  F(rel_off, 4, KVT_REC_S_REL_OFF) F(stored_len, 4, KVT_REC_S_STORED_LEN)                       \
  F(raw_len, 4, KVT_REC_S_RAW_LEN) F(codec, 1, KVT_REC_S_CODEC) F(zero, 3, KVT_REC_S_CODEC + 1) \
  F(checksum, 8, KVT_REC_S_CHECKSUM)

#define REC_FIELD(field, bytes, off) uint8_t field[bytes];
#define REC_AT(field, bytes, off) \
  _Static_assert(offsetof(REC_T, field) == (off), "layout: " #field " is not at " #off);

typedef struct rec_header_layout { REC_HEADER_FIELDS(REC_FIELD) } rec_header_layout;
typedef struct rec_entry_layout { REC_ENTRY_FIELDS(REC_FIELD) } rec_entry_layout;
typedef struct rec_slice_layout { REC_SLICE_FIELDS(REC_FIELD) } rec_slice_layout;
#define REC_T rec_header_layout
REC_HEADER_FIELDS(REC_AT)
#undef REC_T
#define REC_T rec_entry_layout
REC_ENTRY_FIELDS(REC_AT)
#undef REC_T
#define REC_T rec_slice_layout
REC_SLICE_FIELDS(REC_AT)
#undef REC_T
_Static_assert(sizeof(rec_header_layout) == KVT_REC_FIXED, "record header fixed part");
_Static_assert(KVT_REC_FIXED == 88, "the record header's fixed part is 88 bytes in format 1");
_Static_assert(sizeof(rec_entry_layout) == KVT_REC_ENTRY_FIXED, "block entry fixed part");
_Static_assert(KVT_REC_ENTRY_FIXED == 80, "the block entry's fixed part is 80 bytes in format 1");
_Static_assert(sizeof(rec_slice_layout) == KVT_REC_SLICE && KVT_REC_SLICE == 24, "slice row");
_Static_assert(sizeof KVT_REC_MAGIC - 1 == sizeof(((rec_header_layout *)0)->magic), "magic");

size_t kvt_rec_entry_len(uint32_t n_layers) {
  return KVT_REC_ENTRY_FIXED + (size_t)KVT_REC_SLICE * n_layers;
}

uint32_t kvt_rec_header_len(uint32_t n_layers) {
  return (uint32_t)kvt_align4k(KVT_REC_FIXED + (uint64_t)KVT_REC_SLICE * n_layers + 8);
}

uint32_t kvt_rec_planes_overhead(uint32_t esize) { return 8 + 8 * esize; }

void kvt_rec_slice_put(uint8_t *p, const kvt_cold_slice *s) {
  kvt_le_put32(p + KVT_REC_S_REL_OFF, s->rel_off);
  kvt_le_put32(p + KVT_REC_S_STORED_LEN, s->stored_len);
  kvt_le_put32(p + KVT_REC_S_RAW_LEN, s->raw_len);
  p[KVT_REC_S_CODEC] = s->codec;
  memset(p + KVT_REC_S_CODEC + 1, 0, 3);
  kvt_le_put64(p + KVT_REC_S_CHECKSUM, s->checksum);
}

void kvt_rec_slice_get(const uint8_t *p, kvt_cold_slice *s) {
  s->rel_off = kvt_le_get32(p + KVT_REC_S_REL_OFF);
  s->stored_len = kvt_le_get32(p + KVT_REC_S_STORED_LEN);
  s->raw_len = kvt_le_get32(p + KVT_REC_S_RAW_LEN);
  s->codec = p[KVT_REC_S_CODEC];
  s->checksum = kvt_le_get64(p + KVT_REC_S_CHECKSUM);
}

void kvt_rec_entry_put(uint8_t *p, const kvt_cold_entry *e) {
  kvt_le_put32(p + KVT_REC_E_FORMAT, KVT_REC_FORMAT);
  kvt_le_put32(p + KVT_REC_E_SEG, e->seg);
  kvt_le_put64(p + KVT_REC_E_SEG_GEN, e->seg_gen);
  kvt_le_put64(p + KVT_REC_E_OFFSET, e->offset);
  kvt_le_put32(p + KVT_REC_E_REC_LEN, e->rec_len);
  kvt_le_put32(p + KVT_REC_E_N_LAYERS, e->n_layers);
  kvt_le_put32(p + KVT_REC_E_DTYPE, e->dtype);
  kvt_le_put32(p + KVT_REC_E_BYTES_EACH, e->bytes_each);
  memcpy(p + KVT_REC_E_PARENT, e->parent.b, 16);
  kvt_le_put32(p + KVT_REC_E_POS, e->pos);
  kvt_le_put32(p + KVT_REC_E_RESERVED, 0);
  memcpy(p + KVT_REC_E_NS_SEED, e->ns_seed.b, 16);
}

int kvt_rec_slice_check(const kvt_cold_entry *e, const kvt_cold_slice *s) {
  uint32_t esize = (uint32_t)kvt_dtype_size(e->dtype);
  if (s->rel_off % KVT_IO_ALIGN || s->rel_off < kvt_rec_header_len(e->n_layers) ||
      s->rel_off + kvt_align4k(s->stored_len) > e->rec_len || s->raw_len != 2 * (uint64_t)e->bytes_each)
    return 0;
  if (s->codec == KVT_COLD_CODEC_RAW) return s->stored_len == s->raw_len;
  return s->codec == KVT_COLD_CODEC_PLANES && esize >= 2 &&
         s->stored_len >= kvt_rec_planes_overhead(esize);
}

/* What an entry and a header both say of a record, and its slices. */
static int record_check(const kvt_cold_entry *e, const uint8_t *tab) {
  if (e->n_layers == 0 || e->n_layers > KVT_MAX_LAYERS || kvt_dtype_size(e->dtype) == 0 ||
      e->bytes_each == 0 || e->offset % KVT_IO_ALIGN || e->rec_len % KVT_IO_ALIGN ||
      e->rec_len < kvt_rec_header_len(e->n_layers))
    return KVT_ECORRUPT;
  for (uint32_t l = 0; l < e->n_layers; l++) {
    const uint8_t *row = tab + (size_t)KVT_REC_SLICE * l;
    kvt_cold_slice s;
    kvt_rec_slice_get(row, &s);
    if (!kvt_rec_slice_check(e, &s) || row[13] || row[14] || row[15]) return KVT_ECORRUPT;
  }
  return 0;
}

/* Are the n bytes at p zero? What the writer leaves zero must read zero:
 * a decoded entry or header then encodes back to the same bytes. */
static int all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

/* Why kvt_rec_entry_get refuses the len bytes at p: the first check that
 * fails, named by its field, for fsck to report; NULL when it would not. */
const char *kvt_rec_entry_why(const uint8_t *p, size_t len) {
  if (len < KVT_REC_ENTRY_FIXED || kvt_le_get32(p + KVT_REC_E_FORMAT) != KVT_REC_FORMAT)
    return "format version or length";
  kvt_cold_entry e;
  kvt_key k = {{0}};
  if (kvt_rec_entry_get(&k, p, len, &e) == 0) return NULL;
  uint32_t n = kvt_le_get32(p + KVT_REC_E_N_LAYERS), dtype = kvt_le_get32(p + KVT_REC_E_DTYPE);
  uint32_t each = kvt_le_get32(p + KVT_REC_E_BYTES_EACH);
  uint64_t off = kvt_le_get64(p + KVT_REC_E_OFFSET), rec_len = kvt_le_get32(p + KVT_REC_E_REC_LEN);
  if (n == 0 || n > KVT_MAX_LAYERS || len != kvt_rec_entry_len(n)) return "n_layers or length";
  if (!all_zero(p + KVT_REC_E_RESERVED, 4)) return "reserved bytes not zero";
  if (kvt_dtype_size(dtype) == 0) return "dtype unknown";
  if (each == 0) return "bytes_each is 0";
  if (off % KVT_IO_ALIGN || rec_len % KVT_IO_ALIGN) return "record offset or length off the 4 KiB grid";
  if (rec_len < kvt_rec_header_len(n)) return "record length shorter than its header";
  for (uint32_t l = 0; l < n; l++) {
    kvt_cold_slice sl;
    kvt_rec_slice_get(p + KVT_REC_ENTRY_FIXED + (size_t)KVT_REC_SLICE * l, &sl);
    if (sl.raw_len != 2 * (uint64_t)each) return "bytes_each disagrees with the slices' raw length";
  }
  return "a slice outside its record, or of an unknown codec";
}

int kvt_rec_entry_get(const kvt_key *key, const uint8_t *p, size_t len, kvt_cold_entry *e) {
  if (len < KVT_REC_ENTRY_FIXED || kvt_le_get32(p + KVT_REC_E_FORMAT) != KVT_REC_FORMAT)
    return KVT_ECORRUPT;
  e->key = *key;
  e->seg = kvt_le_get32(p + KVT_REC_E_SEG);
  e->seg_gen = kvt_le_get64(p + KVT_REC_E_SEG_GEN);
  e->offset = kvt_le_get64(p + KVT_REC_E_OFFSET);
  e->rec_len = kvt_le_get32(p + KVT_REC_E_REC_LEN);
  e->n_layers = kvt_le_get32(p + KVT_REC_E_N_LAYERS);
  e->dtype = kvt_le_get32(p + KVT_REC_E_DTYPE);
  e->bytes_each = kvt_le_get32(p + KVT_REC_E_BYTES_EACH);
  memcpy(e->parent.b, p + KVT_REC_E_PARENT, 16);
  e->pos = kvt_le_get32(p + KVT_REC_E_POS);
  memcpy(e->ns_seed.b, p + KVT_REC_E_NS_SEED, 16);
  if (e->n_layers == 0 || e->n_layers > KVT_MAX_LAYERS || len != kvt_rec_entry_len(e->n_layers) ||
      !all_zero(p + KVT_REC_E_RESERVED, 4))
    return KVT_ECORRUPT;
  return record_check(e, p + KVT_REC_ENTRY_FIXED);
}

void kvt_rec_header_put(uint8_t *dst, const kvt_cold_entry *e, const kvt_cold_slice *sl) {
  uint32_t hl = kvt_rec_header_len(e->n_layers);
  memset(dst, 0, hl);
  memcpy(dst + KVT_REC_H_MAGIC, KVT_REC_MAGIC, 8);
  kvt_le_put32(dst + KVT_REC_H_HDR_LEN, hl);
  kvt_le_put32(dst + KVT_REC_H_REC_LEN, e->rec_len);
  kvt_le_put64(dst + KVT_REC_H_SEG_GEN, e->seg_gen);
  memcpy(dst + KVT_REC_H_KEY, e->key.b, 16);
  memcpy(dst + KVT_REC_H_PARENT, e->parent.b, 16);
  memcpy(dst + KVT_REC_H_NS_SEED, e->ns_seed.b, 16);
  kvt_le_put32(dst + KVT_REC_H_POS, e->pos);
  kvt_le_put32(dst + KVT_REC_H_N_LAYERS, e->n_layers);
  kvt_le_put32(dst + KVT_REC_H_DTYPE, e->dtype);
  kvt_le_put32(dst + KVT_REC_H_BYTES_EACH, e->bytes_each);
  for (uint32_t l = 0; l < e->n_layers; l++)
    kvt_rec_slice_put(dst + KVT_REC_FIXED + KVT_REC_SLICE * l, &sl[l]);
  size_t tab = KVT_REC_FIXED + (size_t)KVT_REC_SLICE * e->n_layers;
  kvt_le_put64(dst + tab, XXH3_64bits(dst, tab));
}

int kvt_rec_header_get(const uint8_t *h, size_t len, kvt_cold_entry *e, kvt_cold_slice *sl) {
  if (len < KVT_REC_FIXED || memcmp(h + KVT_REC_H_MAGIC, KVT_REC_MAGIC, 8)) return KVT_ECORRUPT;
  uint32_t n = kvt_le_get32(h + KVT_REC_H_N_LAYERS), hl = kvt_le_get32(h + KVT_REC_H_HDR_LEN);
  if (n == 0 || n > KVT_MAX_LAYERS || hl != kvt_rec_header_len(n) || len < hl) return KVT_ECORRUPT;
  size_t tab = KVT_REC_FIXED + (size_t)KVT_REC_SLICE * n;
  if (kvt_le_get64(h + tab) != XXH3_64bits(h, tab) || !all_zero(h + tab + 8, hl - tab - 8))
    return KVT_ECORRUPT;
  *e = (kvt_cold_entry){.rec_len = kvt_le_get32(h + KVT_REC_H_REC_LEN), .seg_gen = kvt_le_get64(h + KVT_REC_H_SEG_GEN), .pos = kvt_le_get32(h + KVT_REC_H_POS),
                        .n_layers = n, .dtype = kvt_le_get32(h + KVT_REC_H_DTYPE), .bytes_each = kvt_le_get32(h + KVT_REC_H_BYTES_EACH)};
  memcpy(e->key.b, h + KVT_REC_H_KEY, 16);
  memcpy(e->parent.b, h + KVT_REC_H_PARENT, 16);
  memcpy(e->ns_seed.b, h + KVT_REC_H_NS_SEED, 16);
  int rc = record_check(e, h + KVT_REC_FIXED);
  for (uint32_t l = 0; !rc && l < n; l++) kvt_rec_slice_get(h + KVT_REC_FIXED + KVT_REC_SLICE * l, &sl[l]);
  return rc;
}

/* Put byte plane p (n elements of esize bytes) back into K||V, K being
 * the first `each` bytes. */
static void plane_join(const uint8_t *pl, size_t n, uint32_t esize, uint32_t p, uint8_t *k,
                       uint8_t *v, size_t each) {
  size_t nk = each / esize;
  for (size_t i = 0; i < n; i++) {
    uint8_t *dst = i < nk ? k + i * esize : v + (i - nk) * esize;
    dst[p] = pl[i];
  }
}

/* Both planes of f16 at once: K and V element by element. */
static void planes_join2(const uint8_t *lo, const uint8_t *hi, size_t n, uint8_t *k, uint8_t *v,
                         size_t each) {
  size_t nk = each / 2;
  for (size_t i = 0; i < n; i++) { /* k and v are the caller's: any alignment */
    uint16_t w = (uint16_t)(lo[i] | hi[i] << 8);
    memcpy(i < nk ? k + 2 * i : v + 2 * (i - nk), &w, 2);
  }
}

int kvt_rec_payload_decode(kvt_mem *m, ZSTD_DCtx *dz, const uint8_t *p, const kvt_cold_slice *s,
                           uint32_t esize, void *k_out, void *v_out, size_t each) {
  if (s->raw_len != 2 * (uint64_t)each) return KVT_ECORRUPT;
  if (s->codec == KVT_COLD_CODEC_RAW) {
    if (s->stored_len != s->raw_len) return KVT_ECORRUPT;
    memcpy(k_out, p, each);
    memcpy(v_out, p + each, each);
    return 0;
  }
  if (s->codec != KVT_COLD_CODEC_PLANES || esize == 0 ||
      s->stored_len < kvt_rec_planes_overhead(esize) || kvt_le_get32(p) != esize ||
      (uint64_t)kvt_le_get32(p + 4) * esize != s->raw_len || each % esize)
    return KVT_ECORRUPT;
  size_t n = kvt_le_get32(p + 4), off = kvt_rec_planes_overhead(esize);
  size_t planes_len = esize == 2 ? 2 * n + 1 : n + 1; /* f16: both planes, joined at once */
  uint8_t *planes = kvt_mem_alloc(m, KVT_MEM_OTHER, planes_len);
  int rc = planes ? 0 : -ENOMEM;
  for (uint32_t pi = 0; !rc && pi < esize; pi++) {
    const uint8_t *ph = p + 8 + 8 * pi;
    size_t len = kvt_le_get32(ph);
    uint8_t *plane = esize == 2 ? planes + pi * n : planes;
    if (off + len > s->stored_len || ph[4] > 1 || (ph[4] == 0 && len != n)) {
      rc = KVT_ECORRUPT;
      break;
    }
    if (ph[4] == 0) memcpy(plane, p + off, n);
    else if (!dz) rc = -ENOMEM;
    else if (ZSTD_decompressDCtx(dz, plane, n, p + off, len) != n) rc = KVT_ECORRUPT;
    if (!rc && esize != 2) plane_join(plane, n, esize, pi, k_out, v_out, each);
    off += len;
  }
  if (!rc && off != s->stored_len) rc = KVT_ECORRUPT;
  if (!rc && esize == 2) planes_join2(planes, planes + n, n, k_out, v_out, each);
  kvt_mem_free(m, KVT_MEM_OTHER, planes, planes_len);
  return rc;
}
