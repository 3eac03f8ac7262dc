/* layers.c - kvt_seq_put_layers() and kvt_seq_gather_layers(): several
 * layers of a sequence in one call, for callers whose per-call cost is
 * high (the Python binding pays about a microsecond per C call, as much
 * as a 64 KiB copy). Each is the per-layer call in a loop, nothing more. */
#include "engine/internal.h"

int kvt_seq_put_layers(kvt_seq *s, uint32_t block, uint32_t first_layer, uint32_t n_layers,
                       const kvt_kv *kv, size_t layer_stride, uint32_t *n_done) {
  if (n_done) *n_done = 0;
  if (!s || !kv) return KVT_ENULL;
  if (n_layers == 0)
    return KVT_ERR(s->e, KVT_ECOUNT, "kvt_seq_put_layers", "n_layers", "at least 1", "0");
  kvt_kv one = *kv;
  for (uint32_t i = 0; i < n_layers; i++) {
    if (kv->k) one.k = (const char *)kv->k + (size_t)i * layer_stride;
    if (kv->v) one.v = (const char *)kv->v + (size_t)i * layer_stride;
    int rc = kvt_seq_put(s, block, first_layer + i, &one);
    if (rc) return rc;
    if (n_done) *n_done = i + 1;
  }
  return 0;
}

int kvt_seq_gather_layers(kvt_seq *s, uint32_t first_layer, uint32_t n_layers, void *k_out,
                          void *v_out, size_t layer_stride, size_t *bytes_each,
                          uint32_t *n_done) {
  if (n_done) *n_done = 0;
  if (!s || !k_out || !v_out || !bytes_each) return KVT_ENULL;
  if (n_layers == 0)
    return KVT_ERR(s->e, KVT_ECOUNT, "kvt_seq_gather_layers", "n_layers", "at least 1", "0");
  if (layer_stride < bytes_each[0])
    return KVT_ERR(s->e, KVT_EBUFSIZE, "kvt_seq_gather_layers", "layer_stride",
                   "at least bytes_each[0] (layers must not overlap)", "%zu (bytes_each[0] %zu)",
                   layer_stride, bytes_each[0]);
  size_t cap = bytes_each[0];
  for (uint32_t i = 0; i < n_layers; i++) {
    size_t n = 0, each = cap;
    int rc = kvt_seq_gather(s, first_layer + i, (char *)k_out + (size_t)i * layer_stride,
                            (char *)v_out + (size_t)i * layer_stride, &each, NULL, 0, &n);
    if (rc) return rc;
    bytes_each[i] = each;
    if (n_done) *n_done = i + 1;
  }
  return 0;
}
