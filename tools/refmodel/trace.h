/* trace.h - writing and reading attention traces (docs/trace-format.md):
 * per step, per layer, the attention mass of every retained block with its
 * position and age, so that scorers can be trained and calibrated without
 * the model. Little-endian on disk whatever the host. */
#ifndef KVT_REFMODEL_TRACE_H
#define KVT_REFMODEL_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "kvtier.h"

#define TRACE_MAGIC "KVTTRACE"
#define TRACE_VERSION 2u      /* written; version 1 is still read */
#define TRACE_HDR_BYTES 128u
#define TRACE_REC_BYTES 16u   /* a record header */
#define TRACE_ENTRY_BYTES 20u /* one block of a record (version 1: 16, no key norm) */
#define TRACE_ENTRY_BYTES_V1 16u
#define TRACE_MAX_BLOCKS (1u << 20) /* n_blocks of one record, at most (a reader's limit) */

typedef struct trace_hdr {
  uint32_t entry_bytes; /* set by trace_read_hdr from the version */
  uint32_t version, n_layers, n_q_heads, n_kv_heads, head_dim, block_tokens, seq_len, scorer;
  double hot_share;
  char model[64];
} trace_hdr;

typedef struct trace_rec {
  uint32_t seq, pos, layer, n_blocks;
} trace_rec;

typedef struct trace_entry {
  uint32_t block, token_pos, age; /* age: steps since the block's last token */
  float mass;
  float key_norm; /* mean L2 norm of the block's key vectors (0 in a version-1 trace) */
} trace_entry;

typedef struct trace_w trace_w;

/* Create path and write the header. 0 or -errno. */
int trace_open(const char *path, const trace_hdr *h, trace_w **out);
/* One record: the n retained blocks of (seq, layer) at query position pos,
 * with their masses and key norms (key_norm NULL: written as 0). */
int trace_step(trace_w *w, uint32_t seq, uint32_t pos, uint32_t layer, const kvt_gathered *blocks,
               const float *mass, const float *key_norm, size_t n);
/* Flush, close, free. 0 or the first -errno met since open. */
int trace_close(trace_w *w);

/* Reading: 0; -EPROTO for a bad header (magic, version 1 or 2, sizes). */
int trace_read_hdr(FILE *f, trace_hdr *h);
/* The next record's header: 1, 0 at a clean end, -EPROTO when truncated
 * or n_blocks is 0 or over TRACE_MAX_BLOCKS (the caller sizes the entries
 * from it before reading them). */
int trace_read_rec(FILE *f, trace_rec *r);
/* Its entries, r->n_blocks of them, in h's version: 0 or -EPROTO. */
int trace_read_entries(FILE *f, const trace_hdr *h, const trace_rec *r, trace_entry *e);

/* The key norm recorded per block: the mean over its tokens and KV heads
 * of the L2 norm of the key vector (n_vec vectors of head_dim floats). */
float trace_key_norm(const float *k, size_t n_vec, uint32_t head_dim);

#endif
