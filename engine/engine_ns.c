/* engine_ns.c - namespaces: registration and its checks, the records the
 * engine keeps, reloading those the store has, codecs per layer, keys of
 * a token chain, and dropping a namespace. */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/internal.h"
#include "codec/codec.h"

/* ---------- namespaces ---------- */

kvt_nsrec *kvt_ns_find(kvt_engine *e, kvt_ns_id id) {
  uint32_t slot = id & 0xFFFF;
  kvt_nsrec *ns = slot < e->n_ns ? e->ns[slot] : NULL;
  return ns && ns->id == id ? ns : NULL;
}

static int str_ok(const char *s, int required) {
  if (!s) return !required;
  size_t n = strlen(s);
  return (n > 0 || !required) && n <= KVT_MAX_ID_LEN;
}

#define DESC_BAD(field, expected, ...) \
  kvt_err_fill(info, KVT_EOPTION, "kvt_ns_register", (field), (expected), __VA_ARGS__)

static int ns_desc_check(const kvt_ns_desc *d, kvt_error_info *info) {
  if (!d->model_id || !d->weights_fingerprint)
    return kvt_err_fill(info, KVT_ENULL, "kvt_ns_register",
                        d->model_id ? "weights_fingerprint" : "model_id", "not NULL", "NULL");
  if (!str_ok(d->model_id, 1))
    return DESC_BAD("model_id", "1..255 bytes", "%zu bytes", strlen(d->model_id));
  if (!str_ok(d->weights_fingerprint, 1))
    return DESC_BAD("weights_fingerprint", "1..255 bytes", "%zu bytes",
                    strlen(d->weights_fingerprint));
  if (!str_ok(d->rope_scaling, 0))
    return DESC_BAD("rope_scaling", "at most 255 bytes", "%zu bytes", strlen(d->rope_scaling));
  if (d->tp_size == 0) return DESC_BAD("tp_size", ">= 1", "0");
  if (d->tp_rank >= d->tp_size)
    return DESC_BAD("tp_rank", "below tp_size", "%u (tp_size %u)", d->tp_rank, d->tp_size);
  if (!(d->rope_theta >= 0) || !isfinite(d->rope_theta))
    return DESC_BAD("rope_theta", "finite and >= 0", "%g", d->rope_theta);
  if (d->rope_dims > d->shape.head_dim)
    return DESC_BAD("rope_dims", "at most head_dim", "%u (head_dim %u)", d->rope_dims,
                    d->shape.head_dim);
  return kvt_shape_check_info(&d->shape, info, "kvt_ns_register");
}

static int same_identity(const kvt_ns_desc *a, const kvt_ns_desc *b) {
  const char *as = a->rope_scaling ? a->rope_scaling : "";
  const char *bs = b->rope_scaling ? b->rope_scaling : "";
  uint32_t ad = a->rope_dims ? a->rope_dims : a->shape.head_dim;
  uint32_t bd = b->rope_dims ? b->rope_dims : b->shape.head_dim;
  return strcmp(a->model_id, b->model_id) == 0 &&
         strcmp(a->weights_fingerprint, b->weights_fingerprint) == 0 &&
         memcmp(&a->rope_theta, &b->rope_theta, sizeof(double)) == 0 && ad == bd &&
         strcmp(as, bs) == 0 && a->tp_rank == b->tp_rank && a->tp_size == b->tp_size;
}

static kvt_nsrec *nsrec_new(kvt_engine *e, const kvt_ns_desc *d) {
  kvt_nsrec *ns = kvt_mem_calloc(&e->mem, KVT_MEM_OTHER, sizeof *ns);
  if (!ns) return NULL;
  const char *src[3] = {d->model_id, d->weights_fingerprint, d->rope_scaling ? d->rope_scaling : ""};
  size_t len[3], total = 0;
  for (int i = 0; i < 3; i++) total += (len[i] = strlen(src[i])) + 1;
  uint32_t L = d->shape.n_layers;
  ns->strs = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, total);
  ns->k_codec = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, 2 * (size_t)L);
  if (!ns->strs || !ns->k_codec) {
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, ns->strs, total);
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, ns->k_codec, 2 * (size_t)L);
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, ns, sizeof *ns);
    return NULL;
  }
  ns->v_codec = ns->k_codec + L;
  memset(ns->k_codec, KVT_CODEC_K8, L);
  memset(ns->v_codec, KVT_CODEC_V3, L);
  ns->strs_len = total;
  char *p = ns->strs, *dst[3];
  for (int i = 0; i < 3; i++) {
    memcpy(p, src[i], len[i] + 1);
    dst[i] = p;
    p += len[i] + 1;
  }
  ns->desc = *d;
  ns->desc.model_id = dst[0];
  ns->desc.weights_fingerprint = dst[1];
  ns->desc.rope_scaling = dst[2];
  if (ns->desc.rope_dims == 0) ns->desc.rope_dims = d->shape.head_dim;
  kvt_ns_seed_of(&ns->desc, &ns->seed);
  ns->bytes_each = kvt_shape_block_bytes(&d->shape);
  ns->lite = (kvt_shape_lite){d->shape.block_tokens, d->shape.n_kv_heads, d->shape.head_dim,
                              d->shape.dtype};
  ns->warm_seed = kvt_key_hash(&ns->seed);
  return ns;
}

/* The detail of KVT_ENSCONFLICT: the first field of the shape that differs. */
static int shape_conflict(kvt_engine *e, const kvt_shape *have, const kvt_shape *got) {
  static const char *const names[5] = {"shape.n_layers", "shape.n_kv_heads", "shape.head_dim",
                                       "shape.dtype", "shape.block_tokens"};
  const uint32_t h[5] = {have->n_layers, have->n_kv_heads, have->head_dim, have->dtype,
                         have->block_tokens};
  const uint32_t g[5] = {got->n_layers, got->n_kv_heads, got->head_dim, got->dtype,
                         got->block_tokens};
  int i = 0;
  while (i < 4 && h[i] == g[i]) i++;
  char want[96];
  snprintf(want, sizeof want, "%u, as the namespace is registered", h[i]);
  return KVT_ERR(e, KVT_ENSCONFLICT, "kvt_ns_register", names[i], want, "%u", g[i]);
}

/* Find or add namespace d, with the lock held; persist says whether to
 * write it to the cold tier (not when it was just read from there). */
static int ns_add_locked(kvt_engine *e, const kvt_ns_desc *d, int persist, kvt_ns_id *out) {
  for (uint32_t i = 0; i < e->n_ns; i++) {
    kvt_nsrec *ns = e->ns[i];
    if (!ns || !same_identity(&ns->desc, d)) continue;
    if (memcmp(&ns->desc.shape, &d->shape, sizeof d->shape))
      return shape_conflict(e, &ns->desc.shape, &d->shape);
    *out = ns->id;
    return 0;
  }
  uint32_t slot = 0;
  while (slot < e->n_ns && e->ns[slot]) slot++;
  if (slot >= e->opt.max_namespaces) return KVT_ELIMIT;
  kvt_nsrec *ns = nsrec_new(e, d);
  if (!ns) return -ENOMEM;
  if (persist && kvt_flush_on(e)) { /* persisted before anything of it can be */
    uint8_t enc[KVT_NS_ENCODE_MAX];
    size_t len = kvt_ns_encode(&ns->desc, enc, sizeof enc);
    int rc = kvt_store_ns_put(e->store, &ns->seed, enc, len);
    if (rc) {
      kvt_nsrec_free(e, ns);
      return rc;
    }
  }
  ns->id = slot | (uint32_t)e->ns_gen[slot] << 16;
  *out = ns->id;
  e->ns[slot] = ns;
  if (slot == e->n_ns) e->n_ns++;
  e->st.namespaces++;
  return 0;
}

int kvt_ns_register(kvt_engine *e, const kvt_ns_desc *d, kvt_ns_id *out) {
  if (!e || !d || !out) return KVT_ENULL;
  kvt_error_info info;
  int rc = ns_desc_check(d, &info);
  if (rc) return kvt_err_keep(&e->err, &info);
  if (kvt_rdonly(e)) return KVT_ERDONLY;
  pthread_mutex_lock(&e->lock);
  rc = ns_add_locked(e, d, 1, out);
  pthread_mutex_unlock(&e->lock);
  return rc;
}

/* kvt_store_ns_each callback: a namespace the store already has. */
static int ns_load_one(void *arg, const kvt_key *seed, const uint8_t *enc, size_t len) {
  kvt_engine *e = arg;
  kvt_ns_desc d;
  char strs[3 * (KVT_MAX_ID_LEN + 1)];
  kvt_key check;
  kvt_ns_id id;
  if (kvt_ns_decode(enc, len, &d, strs) || ns_desc_check(&d, NULL)) return KVT_ECORRUPT;
  kvt_ns_seed_of(&d, &check);
  if (!kvt_key_eq(&check, seed)) return KVT_ECORRUPT;
  return ns_add_locked(e, &d, 0, &id);
}

int kvt_ns_load(kvt_engine *e) {
  pthread_mutex_lock(&e->lock);
  int rc = kvt_store_ns_each(e->store, ns_load_one, e);
  pthread_mutex_unlock(&e->lock);
  return rc;
}

int kvt_ns_get(kvt_engine *e, uint32_t index, kvt_ns_id *id, kvt_ns_desc *desc) {
  if (!e || !id || !desc) return KVT_ENULL;
  pthread_mutex_lock(&e->lock);
  uint32_t seen = 0;
  int rc = KVT_ENOTFOUND;
  for (uint32_t i = 0; i < e->n_ns && rc; i++) {
    if (!e->ns[i] || seen++ != index) continue;
    *id = e->ns[i]->id;
    *desc = e->ns[i]->desc;
    rc = 0;
  }
  pthread_mutex_unlock(&e->lock);
  return rc;
}

int kvt_ns_shape(kvt_engine *e, kvt_ns_id id, kvt_shape *out) {
  if (!e || !out) return KVT_ENULL;
  pthread_mutex_lock(&e->lock);
  kvt_nsrec *ns = kvt_ns_find(e, id);
  if (ns) *out = ns->desc.shape;
  pthread_mutex_unlock(&e->lock);
  return ns ? 0 : KVT_ENOTFOUND;
}

int kvt_ns_seed(kvt_engine *e, kvt_ns_id id, kvt_key *out) {
  if (!e || !out) return KVT_ENULL;
  pthread_mutex_lock(&e->lock);
  kvt_nsrec *ns = kvt_ns_find(e, id);
  if (ns) *out = ns->seed;
  pthread_mutex_unlock(&e->lock);
  return ns ? 0 : KVT_ENOTFOUND;
}

int kvt_ns_set_codec(kvt_engine *e, kvt_ns_id id, uint32_t layer, int k_codec, int v_codec) {
  if (!e) return KVT_ENULL;
  const kvt_codec *kc = kvt_codec_get(k_codec), *vc = kvt_codec_get(v_codec);
  /* KVT_CODEC_NONE keeps that side exact; one side at least is quantized */
  if (k_codec == KVT_CODEC_NONE && v_codec == KVT_CODEC_NONE)
    return KVT_ERR(e, KVT_EOPTION, "kvt_ns_set_codec", "k_codec and v_codec",
                   "at least one quantized side", "both KVT_CODEC_NONE");
  if (k_codec != KVT_CODEC_NONE && (!kc || kc->is_value))
    return KVT_ERR(e, KVT_EOPTION, "kvt_ns_set_codec", "k_codec",
                   "KVT_CODEC_NONE or a key codec (K8, K8C, K4, K8B)", "%d", k_codec);
  if (v_codec != KVT_CODEC_NONE && (!vc || !vc->is_value))
    return KVT_ERR(e, KVT_EOPTION, "kvt_ns_set_codec", "v_codec",
                   "KVT_CODEC_NONE or a value codec (V2, V3, V4, V2L, V3L, V4L)", "%d", v_codec);
  pthread_mutex_lock(&e->lock);
  kvt_nsrec *ns = kvt_ns_find(e, id);
  int rc = 0;
  if (!ns || (layer != KVT_ALL_LAYERS && layer >= ns->desc.shape.n_layers)) {
    rc = KVT_ENOTFOUND;
  } else {
    uint32_t l0 = layer == KVT_ALL_LAYERS ? 0 : layer;
    uint32_t l1 = layer == KVT_ALL_LAYERS ? ns->desc.shape.n_layers : layer + 1;
    for (uint32_t l = l0; l < l1; l++) {
      ns->k_codec[l] = (uint8_t)k_codec;
      ns->v_codec[l] = (uint8_t)v_codec;
    }
  }
  pthread_mutex_unlock(&e->lock);
  return rc;
}

/* Seed and block size of a namespace, read under the lock; namespaces are
 * immutable until dropped, so the copies stay right for the caller. */
int kvt_ns_chain_params(kvt_engine *e, kvt_ns_id id, kvt_key *seed, uint32_t *bt) {
  pthread_mutex_lock(&e->lock);
  kvt_nsrec *ns = kvt_ns_find(e, id);
  if (ns) {
    *seed = ns->seed;
    *bt = ns->desc.shape.block_tokens;
  }
  pthread_mutex_unlock(&e->lock);
  return ns ? 0 : KVT_ENOTFOUND;
}

int kvt_keys(kvt_engine *e, kvt_ns_id id, const uint32_t *tokens, size_t n_tokens, kvt_key *keys,
             size_t max_keys, size_t *n_keys) {
  if (!e || !n_keys || (n_tokens && !tokens)) return KVT_ENULL;
  kvt_key seed;
  uint32_t bt;
  int rc = kvt_ns_chain_params(e, id, &seed, &bt);
  if (rc) return rc;
  size_t n = n_tokens / bt;
  *n_keys = n;
  if (n > max_keys)
    return KVT_ERR(e, KVT_ECOUNT, "kvt_keys", "max_keys", "at least n_tokens / block_tokens",
                   "%zu (%zu keys needed)", max_keys, n);
  if (n && !keys) return KVT_ENULL;
  for (size_t i = 0; i < n; i++)
    kvt_key_next(&seed, i ? &keys[i - 1] : NULL, tokens + i * bt, bt, &keys[i]);
  return 0;
}

int kvt_ns_drop(kvt_engine *e, kvt_ns_id id) {
  if (!e) return KVT_ENULL;
  if (kvt_rdonly(e)) return KVT_ERDONLY;
  pthread_mutex_lock(&e->lock);
  kvt_nsrec *ns = kvt_ns_find(e, id);
  int rc = !ns ? KVT_ENOTFOUND : (ns->n_seqs || ns->n_loads) ? KVT_EBUSY : 0;
  if (!rc) {
    for (size_t i = 0; i < e->n_buckets; i++) {
      kvt_tblk **pp = &e->buckets[i];
      while (*pp) {
        if ((*pp)->ns == ns) kvt_drop_tblk(e, *pp); /* unlinks *pp */
        else pp = &(*pp)->hnext;
      }
    }
    e->ns[id & 0xFFFF] = NULL;
    e->ns_gen[id & 0xFFFF]++;
    kvt_key seed = ns->seed;
    kvt_nsrec_free(e, ns);
    e->st.namespaces--;
    if (kvt_store_any(e)) rc = kvt_store_drop(e->store, &seed, NULL, 0, NULL);
  }
  pthread_mutex_unlock(&e->lock);
  return rc;
}
