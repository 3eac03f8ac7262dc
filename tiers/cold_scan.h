/* cold_scan.h - recovery of the cold tier: the copies of namespace
 * encodings kept beside the index (namespaces/), rebuilding the index
 * from the segment files (tiers/cold_rebuild.c), and the pieces of the
 * record format in cold.c that rebuilding needs. docs/format.md, "Cold
 * tier". */
#ifndef KVT_COLD_SCAN_H
#define KVT_COLD_SCAN_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "tiers/cold.h"

/* ---- in cold.c ---- */

/* Bytes of a record header with n_layers layers (a multiple of 4096). */
uint32_t kvt_cold_header_len(uint32_t n_layers);
/* Parse and check a record header (magic, length, checksum) from the
 * avail bytes at h: fills everything in e but seg and offset.
 * 0 or KVT_ECORRUPT. */
int kvt_cold_header_parse(const uint8_t *h, size_t avail, kvt_cold_entry *e);
/* Is slice `layer` of the whole record rec (e->rec_len bytes, its header
 * parsed into e) in range and its checksum right? 1 or 0. */
int kvt_cold_record_slice_ok(const uint8_t *rec, const kvt_cold_entry *e, uint32_t layer);
/* The index value for e with the layer table of its record header
 * (24 * n_layers bytes). out has room for 80 + 24 * n_layers bytes;
 * returns the length. */
size_t kvt_cold_entry_encode(uint8_t *out, const kvt_cold_entry *e, const uint8_t *table);
/* The store directory. */
const char *kvt_cold_dir(const kvt_cold *c);
/* A row of the segment table: full (records live in it) or free. */
void kvt_cold_seg_encode(uint8_t row[32], uint64_t gen, uint64_t used, uint64_t live, int full);
uint64_t kvt_cold_format_version(void);

/* ---- in cold_rebuild.c ---- */

/* The shape at the end of a namespace encoding E. 0 or KVT_ECORRUPT. */
int kvt_cold_ns_shape(const uint8_t *enc, size_t len, kvt_shape *out);
/* Keep dir/namespaces/<seed in hex> = enc (durably; nothing is written
 * when it is there already). 0 or -errno. */
int kvt_cold_ns_file_put(const char *dir, const kvt_key *seed, const uint8_t *enc, size_t len);
/* Remove that copy. 0 or -errno. */
int kvt_cold_ns_file_del(const char *dir, const kvt_key *seed);
/* Give every namespace of the index its copy (stores made before the
 * copies existed). 0 or -errno. */
int kvt_cold_ns_files_backfill(kvt_cold *c);
/* Segment files exist but the index does not: KVT_EINDEX (opening would
 * start an empty index over them), else 0. */
int kvt_cold_index_check(const char *dir);

/* Rebuild dir's index from its segment files (the caller holds the
 * store's lock). segment_bytes 0: from the old index, else inferred from
 * the files. report (may be NULL) hears of each damaged record and of
 * anything else worth knowing. 0, or -errno / KVT_E* when it could not
 * finish (the old index is then left where it was). */
int kvt_cold_rebuild(const char *dir, uint64_t segment_bytes, uint64_t map_bytes,
                     kvt_rebuild_result *res, void (*report)(void *arg, const char *what),
                     void *arg);

#endif
