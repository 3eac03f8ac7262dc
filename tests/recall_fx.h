/* recall_fx.h - the fixture of the recall tests (test_recall*.c): BLOCKS
 * blocks whose keys put the TARGET block alone on channel CH, written
 * into one sequence, and a decoding step whose query drifts to it. */
#ifndef KVT_RECALL_FX_H
#define KVT_RECALL_FX_H

#include "cold_util.h"

#define BLOCKS 8u
#define TARGET 1u   /* the evicted block the query drifts to */
#define QH_PER_KV 2u
#define CH 3u       /* the key channel the query looks at */

/* Channel CH of block b's keys: the target hi; the other evicted blocks
 * (0..3, "recent" at budget 0.5) -1; the retained ones 0.5. */
static inline float chan(uint32_t b, float hi) {
  return b == TARGET ? hi : b < BLOCKS / 2 ? -1.0f : 0.5f;
}

static inline void fill(tu_kv *kv, const kvt_shape *sh, uint32_t b, uint32_t l, float hi) {
  float *k = kv->k, *v = kv->v;
  uint32_t H = sh->n_kv_heads, D = sh->head_dim;
  for (uint32_t t = 0; t < sh->block_tokens; t++)
    for (uint32_t h = 0; h < H; h++)
      for (uint32_t d = 0; d < D; d++) {
        size_t i = ((size_t)t * H + h) * D + d;
        k[i] = d == CH ? chan(b, hi) : 0.01f * (float)((b * 5 + t * 3 + h * 7 + d + l) % 7);
        v[i] = 0.1f * (float)(b + 1) + 0.001f * (float)i + (float)l;
      }
}

typedef struct fx {
  char *dir;
  kvt_engine *e;
  kvt_seq *s;
  kvt_shape sh;
  tu_kv kv;
  float hi;
  kvt_key target_key;
  kvt_ns_id ns;
} fx;

/* Append BLOCKS blocks to f->s, every layer filled (channel CH at hi). */
static inline void fx_write_blocks(fx *f, float hi) {
  tu_kv_alloc(&f->kv, &f->sh);
  uint32_t toks[16];
  for (uint32_t b = 0; b < BLOCKS; b++) {
    for (uint32_t t = 0; t < f->sh.block_tokens; t++) toks[t] = b * 100 + t + 1;
    kvt_append_info info;
    assert_int_equal(kvt_seq_append(f->s, toks, f->sh.block_tokens, &info), 0);
    if (b == TARGET) f->target_key = info.key;
    for (uint32_t l = 0; l < f->sh.n_layers; l++) {
      fill(&f->kv, &f->sh, b, l, hi);
      assert_int_equal(kvt_seq_put(f->s, b, l, &f->kv.kv), 0);
    }
  }
}

static inline void fx_close(fx *f) {
  tu_kv_free(&f->kv);
  kvt_seq_release(f->s);
  kvt_engine_close(f->e);
  tu_rmtree(f->dir);
}

/* One decoding step of layer 0: attention of a query on channel CH over
 * the retained blocks, then its observation (which decides recalls). */
static inline size_t step(fx *f) {
  uint32_t H = f->sh.n_kv_heads * QH_PER_KV, D = f->sh.head_dim;
  float q[8 * 16] = {0}, out[8 * 16], lse[8], mass[BLOCKS];
  for (uint32_t h = 0; h < H; h++) q[h * D + CH] = 2.0f;
  size_t n = 0;
  assert_int_equal(kvt_seq_attend(f->s, 0, q, H, 0, out, lse, mass, BLOCKS, &n), 0);
  assert_int_equal(kvt_seq_observe(f->s, 0, mass, n), 0);
  return n;
}

#endif
