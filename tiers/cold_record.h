/* cold_record.h - the cold tier's byte formats as pure functions on byte
 * buffers (docs/format.md, "Cold tier"): the LMDB block entry, the record
 * header and a slice's payload. No LMDB, no files, no state: cold.c writes
 * and reads through them, and the fuzz targets (tests/fuzz/fuzz_cold_*.c)
 * drive them on arbitrary bytes. */
#ifndef KVT_COLD_RECORD_H
#define KVT_COLD_RECORD_H

#include <stddef.h>
#include <stdint.h>
#include <zstd.h>

#include "tiers/cold.h"

#define KVT_REC_FORMAT 1u        /* block entry format version */
#define KVT_REC_MAGIC "KVTREC01"
#define KVT_REC_FIXED 88u        /* record header before its slice table */
#define KVT_REC_SLICE 24u        /* one slice in an entry or header table */
#define KVT_REC_ENTRY_FIXED 80u  /* block entry before its slice table */

/* Field offsets, little-endian (docs/format.md, "Cold tier"). cold_record.c
 * asserts at compile time that each field starts where the one before it
 * ends and that the last ends at the fixed size: the layout has no gap and
 * no overlap, and a change to it does not compile unnoticed. */
enum {
  /* record header: magic, then the fields, then the slice table at KVT_REC_FIXED */
  KVT_REC_H_MAGIC = 0,       /* 8 bytes, KVT_REC_MAGIC */
  KVT_REC_H_HDR_LEN = 8,     /* u32, kvt_rec_header_len(n_layers) */
  KVT_REC_H_REC_LEN = 12,    /* u32 */
  KVT_REC_H_SEG_GEN = 16,    /* u64 */
  KVT_REC_H_KEY = 24,        /* 16 bytes */
  KVT_REC_H_PARENT = 40,     /* 16 bytes */
  KVT_REC_H_NS_SEED = 56,    /* 16 bytes */
  KVT_REC_H_POS = 72,        /* u32 */
  KVT_REC_H_N_LAYERS = 76,   /* u32 */
  KVT_REC_H_DTYPE = 80,      /* u32 */
  KVT_REC_H_BYTES_EACH = 84, /* u32 */
  /* block entry (the LMDB value): the slice table at KVT_REC_ENTRY_FIXED */
  KVT_REC_E_FORMAT = 0,      /* u32, KVT_REC_FORMAT */
  KVT_REC_E_SEG = 4,         /* u32 */
  KVT_REC_E_SEG_GEN = 8,     /* u64 */
  KVT_REC_E_OFFSET = 16,     /* u64 */
  KVT_REC_E_REC_LEN = 24,    /* u32 */
  KVT_REC_E_N_LAYERS = 28,   /* u32 */
  KVT_REC_E_DTYPE = 32,      /* u32 */
  KVT_REC_E_BYTES_EACH = 36, /* u32 */
  KVT_REC_E_PARENT = 40,     /* 16 bytes */
  KVT_REC_E_POS = 56,        /* u32 */
  KVT_REC_E_RESERVED = 60,   /* 4 bytes, zero */
  KVT_REC_E_NS_SEED = 64,    /* 16 bytes */
  /* one slice row, in both tables */
  KVT_REC_S_REL_OFF = 0,     /* u32 */
  KVT_REC_S_STORED_LEN = 4,  /* u32 */
  KVT_REC_S_RAW_LEN = 8,     /* u32 */
  KVT_REC_S_CODEC = 12,      /* u8, then 3 bytes zero */
  KVT_REC_S_CHECKSUM = 16,   /* u64 */
};

/* Little-endian fields and the 4 KiB grid, for every reader and writer of
 * these formats (cold.c, cold_record.c, cold_rebuild.c). */
static inline void kvt_le_put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static inline void kvt_le_put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static inline uint32_t kvt_le_get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << 8 * i;
  return v;
}
static inline uint64_t kvt_le_get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << 8 * i;
  return v;
}
static inline uint64_t kvt_align4k(uint64_t n) {
  return (n + KVT_IO_ALIGN - 1) & ~(uint64_t)(KVT_IO_ALIGN - 1);
}

/* Bytes of a block entry with n_layers slices. */
size_t kvt_rec_entry_len(uint32_t n_layers);
/* Bytes of a record header (4096-aligned) with n_layers slices. */
uint32_t kvt_rec_header_len(uint32_t n_layers);
/* Bytes of the byte-planes payload header for elements of esize bytes. */
uint32_t kvt_rec_planes_overhead(uint32_t esize);

/* One slice table row (KVT_REC_SLICE bytes at p). */
void kvt_rec_slice_put(uint8_t *p, const kvt_cold_slice *s);
void kvt_rec_slice_get(const uint8_t *p, kvt_cold_slice *s);

/* The fixed part of a block entry (KVT_REC_ENTRY_FIXED bytes at p; the
 * slice rows follow, written with kvt_rec_slice_put). */
void kvt_rec_entry_put(uint8_t *p, const kvt_cold_entry *e);
/* Parse the block entry of key (len bytes at p) into e. 0, or
 * KVT_ECORRUPT when it is not one a reader can follow: wrong version or
 * size, n_layers out of range, a reserved byte not zero, an unknown dtype, a record offset or
 * length not 4096-aligned, or a slice that is not inside the record after
 * its header (see kvt_rec_slice_check). */
int kvt_rec_entry_get(const kvt_key *key, const uint8_t *p, size_t len, kvt_cold_entry *e);

/* Which check kvt_rec_entry_get fails on the len bytes at p, in words
 * naming the field (fsck reports it); NULL when the entry parses. */
const char *kvt_rec_entry_why(const uint8_t *p, size_t len);

/* Is slice s of a record described by e one a reader may read: 4096-
 * aligned, after the header, its 4096-aligned stored length inside
 * rec_len, raw length 2 * bytes_each, a known codec? 1 or 0. */
int kvt_rec_slice_check(const kvt_cold_entry *e, const kvt_cold_slice *s);

/* Write the header of the record e (with its e->n_layers slices sl) at
 * dst: kvt_rec_header_len(e->n_layers) bytes, zero-padded. */
void kvt_rec_header_put(uint8_t *dst, const kvt_cold_entry *e, const kvt_cold_slice *sl);
/* Parse a record header from the len bytes at h: e gets everything the
 * header holds (seg and offset are left 0) and sl its slices (room for
 * KVT_MAX_LAYERS). 0, or KVT_ECORRUPT: bad magic, a header length or
 * n_layers that do not agree, a checksum mismatch, padding not zero, or what
 * kvt_rec_entry_get refuses. len may exceed the header (a whole record). */
int kvt_rec_header_get(const uint8_t *h, size_t len, kvt_cold_entry *e, kvt_cold_slice *sl);

/* Decode a slice payload (s->stored_len bytes at p, checksum already
 * checked) into K and V, each bytes at k_out and v_out; esize is the
 * dtype's element size. dz decompresses zstd planes (NULL: a plane that
 * needs it is -ENOMEM). The planes' scratch is counted in m (OTHER). 0,
 * KVT_ECORRUPT (never writing past each bytes of k_out and v_out), or
 * -ENOMEM. */
int kvt_rec_payload_decode(kvt_mem *m, ZSTD_DCtx *dz, const uint8_t *p, const kvt_cold_slice *s,
                           uint32_t esize, void *k_out, void *v_out, size_t each);

#endif
