/* fuzz_attn_trace.c - libFuzzer target for the attention-trace reader
 * (tools/refmodel/trace.c, docs/trace-format.md). Input: a trace file.
 * What must hold: the header is refused (-EPROTO) or its fields are the
 * bytes at their offsets with a NUL-terminated model name; each record
 * read has 1 <= n_blocks <= TRACE_MAX_BLOCKS (so a caller can size the
 * entries before reading them) and entries that are the bytes that follow;
 * the reader stops cleanly (0) only at the exact end of the file, and a
 * file that ends inside a record is refused (-EPROTO). */
#include <errno.h>
#include <stdio.h>

#include "tests/fuzz/fuzz_cold.h"
#include "trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *in = fz_dup(data, size);
  FILE *f = fmemopen(in, size ? size : 1, "rb");
  FZ_CHECK(f != NULL);
  if (size == 0) fgetc(f); /* fmemopen needs a size of at least 1: read it away */
  trace_hdr h;
  int rc = trace_read_hdr(f, &h);
  FZ_CHECK(rc == 0 || rc == -EPROTO);
  if (rc == 0) {
    FZ_CHECK(size >= TRACE_HDR_BYTES && memcmp(in, TRACE_MAGIC, 8) == 0);
    FZ_CHECK((h.version == 1 || h.version == TRACE_VERSION) && fz_get32(in + 12) == TRACE_HDR_BYTES);
    size_t eb = h.version == 1 ? TRACE_ENTRY_BYTES_V1 : TRACE_ENTRY_BYTES;
    FZ_CHECK(h.entry_bytes == eb);
    const uint32_t want[7] = {h.n_layers, h.n_q_heads, h.n_kv_heads, h.head_dim,
                              h.block_tokens, h.seq_len, h.scorer};
    for (int i = 0; i < 7; i++) FZ_CHECK(fz_get32(in + 16 + 4 * i) == want[i]);
    FZ_CHECK(h.block_tokens != 0 && memchr(h.model, 0, sizeof h.model) != NULL);
    uint64_t share = fz_get64(in + 48), got;
    memcpy(&got, &h.hot_share, 8);
    FZ_CHECK(got == share);
    size_t off = TRACE_HDR_BYTES;
    trace_rec r;
    while ((rc = trace_read_rec(f, &r)) == 1) {
      FZ_CHECK(off + TRACE_REC_BYTES <= size);
      FZ_CHECK(r.seq == fz_get32(in + off) && r.pos == fz_get32(in + off + 4) &&
               r.layer == fz_get32(in + off + 8) && r.n_blocks == fz_get32(in + off + 12));
      FZ_CHECK(r.n_blocks >= 1 && r.n_blocks <= TRACE_MAX_BLOCKS);
      off += TRACE_REC_BYTES;
      trace_entry *e = malloc((size_t)r.n_blocks * sizeof *e);
      FZ_CHECK(e != NULL);
      rc = trace_read_entries(f, &h, &r, e);
      FZ_CHECK(rc == 0 || rc == -EPROTO);
      if (rc == 0) {
        for (uint32_t i = 0; i < r.n_blocks; i++, off += eb) {
          uint32_t m, kn;
          memcpy(&m, &e[i].mass, 4);
          memcpy(&kn, &e[i].key_norm, 4);
          FZ_CHECK(e[i].block == fz_get32(in + off) && e[i].token_pos == fz_get32(in + off + 4) &&
                   e[i].age == fz_get32(in + off + 8) && m == fz_get32(in + off + 12));
          FZ_CHECK(kn == (eb == TRACE_ENTRY_BYTES ? fz_get32(in + off + 16) : 0));
        }
      }
      free(e);
      if (rc) {
        FZ_CHECK(off + (size_t)r.n_blocks * eb > size); /* truncated, truly */
        break;
      }
    }
    FZ_CHECK(rc == 0 || rc == -EPROTO);
    if (rc == 0) FZ_CHECK(off == size);
  }
  fclose(f);
  free(in);
  return 0;
}
