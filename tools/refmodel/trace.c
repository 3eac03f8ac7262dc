/* trace.c - the attention trace file (docs/trace-format.md). Fields are
 * written byte by byte in little-endian order so that a trace made on one
 * machine reads on any other. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

struct trace_w {
  FILE *f;
  uint32_t block_tokens;
  int err;
};

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }
static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void w_bytes(trace_w *w, const void *p, size_t n) {
  if (!w->err && fwrite(p, 1, n, w->f) != n) w->err = errno ? -errno : -EIO;
}

int trace_open(const char *path, const trace_hdr *h, trace_w **out) {
  *out = NULL;
  trace_w *w = calloc(1, sizeof *w);
  if (!w) return -ENOMEM;
  if (!(w->f = fopen(path, "wb"))) {
    int e = -errno;
    free(w);
    return e;
  }
  w->block_tokens = h->block_tokens;
  uint8_t b[TRACE_HDR_BYTES] = {0};
  uint64_t share;
  memcpy(b, TRACE_MAGIC, 8);
  put32(b + 8, TRACE_VERSION);
  put32(b + 12, TRACE_HDR_BYTES);
  const uint32_t f[] = {h->n_layers, h->n_q_heads, h->n_kv_heads, h->head_dim, h->block_tokens,
                        h->seq_len, h->scorer};
  for (size_t i = 0; i < 7; i++) put32(b + 16 + 4 * i, f[i]);
  memcpy(&share, &h->hot_share, 8);
  put64(b + 48, share);
  memcpy(b + 56, h->model, strnlen(h->model, 63));
  w_bytes(w, b, sizeof b);
  *out = w;
  return w->err;
}

int trace_step(trace_w *w, uint32_t seq, uint32_t pos, uint32_t layer, const kvt_gathered *blocks,
               const float *mass, const float *key_norm, size_t n) {
  uint8_t b[TRACE_ENTRY_BYTES];
  put32(b, seq);
  put32(b + 4, pos);
  put32(b + 8, layer);
  put32(b + 12, (uint32_t)n);
  w_bytes(w, b, TRACE_REC_BYTES);
  for (size_t i = 0; i < n; i++) {
    uint32_t last = blocks[i].token_pos + w->block_tokens - 1;
    put32(b, blocks[i].block);
    put32(b + 4, blocks[i].token_pos);
    put32(b + 8, pos - last);
    put32(b + 12, f32_bits(mass[i]));
    put32(b + 16, f32_bits(key_norm ? key_norm[i] : 0.0f));
    w_bytes(w, b, TRACE_ENTRY_BYTES);
  }
  return w->err;
}

int trace_close(trace_w *w) {
  if (!w) return 0;
  int e = w->err;
  if (fclose(w->f) && !e) e = -errno;
  free(w);
  return e;
}

int trace_read_hdr(FILE *f, trace_hdr *h) {
  uint8_t b[TRACE_HDR_BYTES];
  if (fread(b, 1, sizeof b, f) != sizeof b || memcmp(b, TRACE_MAGIC, 8) ||
      get32(b + 8) < 1 || get32(b + 8) > TRACE_VERSION || get32(b + 12) != TRACE_HDR_BYTES)
    return -EPROTO;
  memset(h, 0, sizeof *h);
  h->version = get32(b + 8);
  h->entry_bytes = h->version == 1 ? TRACE_ENTRY_BYTES_V1 : TRACE_ENTRY_BYTES;
  uint32_t *f32[] = {&h->n_layers, &h->n_q_heads, &h->n_kv_heads, &h->head_dim,
                     &h->block_tokens, &h->seq_len, &h->scorer};
  for (size_t i = 0; i < 7; i++) *f32[i] = get32(b + 16 + 4 * i);
  uint64_t share = get64(b + 48);
  memcpy(&h->hot_share, &share, 8);
  memcpy(h->model, b + 56, 63);
  return h->block_tokens ? 0 : -EPROTO;
}

int trace_read_rec(FILE *f, trace_rec *r) {
  uint8_t b[TRACE_REC_BYTES];
  size_t got = fread(b, 1, sizeof b, f);
  if (got == 0) return 0;
  if (got != sizeof b) return -EPROTO;
  *r = (trace_rec){get32(b), get32(b + 4), get32(b + 8), get32(b + 12)};
  return r->n_blocks >= 1 && r->n_blocks <= TRACE_MAX_BLOCKS ? 1 : -EPROTO;
}

static float f32_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

int trace_read_entries(FILE *f, const trace_hdr *h, const trace_rec *r, trace_entry *e) {
  uint8_t b[TRACE_ENTRY_BYTES];
  size_t eb = h->entry_bytes == TRACE_ENTRY_BYTES_V1 ? TRACE_ENTRY_BYTES_V1 : TRACE_ENTRY_BYTES;
  for (uint32_t i = 0; i < r->n_blocks; i++) {
    if (fread(b, 1, eb, f) != eb) return -EPROTO;
    e[i] = (trace_entry){get32(b), get32(b + 4), get32(b + 8), f32_of(get32(b + 12)),
                         eb == TRACE_ENTRY_BYTES ? f32_of(get32(b + 16)) : 0.0f};
  }
  return 0;
}

float trace_key_norm(const float *k, size_t n_vec, uint32_t head_dim) {
  double sum = 0;
  for (size_t v = 0; v < n_vec; v++) {
    double ss = 0;
    for (uint32_t i = 0; i < head_dim; i++) ss += (double)k[v * head_dim + i] * k[v * head_dim + i];
    sum += sqrt(ss);
  }
  return n_vec ? (float)(sum / (double)n_vec) : 0.0f;
}
