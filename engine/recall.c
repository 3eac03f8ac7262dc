/* recall.c - recall from disk: key sketches of the blocks the policy
 * evicted, the bound a query puts on their attention mass, and the reads
 * that bring back the ones whose bound beats the weakest retained block
 * (docs/policy.md, "Recall"). The sketch of a block is, per KV head and
 * channel, the min and max of its keys (Quest): for a query head q and
 * any key k of the block, q.k <= sum_c max(q_c min_c, q_c max_c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/recall.h"
#include "codec/codec.h"
#include "tiers/hist.h"

typedef struct sketch {
  uint32_t block, layer;
  uint64_t age;   /* eviction order: when full, the oldest goes */
  float key_norm; /* the block's, restored when it comes back */
  float *mm;      /* [H*D] min then [H*D] max; one [H*D] for 1-token blocks,
                   * in r->mm at the sketch's index */
} sketch;

struct kvt_recall {
  sketch *sk;        /* [cap], n used */
  float *mm;         /* [cap * vec]: the sketches' data, contiguous (a scan
                      * reads neighbours, and an eviction allocates nothing) */
  size_t n, cap;
  uint64_t clock;
  uint32_t L, HD, vec; /* vec: floats of one sketch */
  uint32_t q_cap;      /* query heads the query buffers hold */
  float *q;            /* [L][q_cap * (head_dim + 1)]: the last query, then its lse */
  uint32_t *nq;        /* [L] query heads of the last query; 0: none pending */
  float *scale;        /* [L] */
  kvt_load **pending;  /* [L] recall reads started at the step before */
  uint32_t *cursor;    /* [L] where the layer's next scan of sk starts */
  uint32_t *n_recalled; /* [L] blocks recalled and not yet observed (about) */
};

/* Bytes of the fixed part for L layers. */
static size_t fixed_bytes(uint32_t L) {
  return sizeof(struct kvt_recall) +
         L * (3 * sizeof(uint32_t) + sizeof(float) + sizeof(kvt_load *));
}

static void count_bytes(kvt_engine *e, int64_t delta) {
  e->st.sketch_bytes = (uint64_t)((int64_t)e->st.sketch_bytes + delta);
}

/* The recall state of s, made on first use. With the lock held. */
static struct kvt_recall *recall_get(kvt_seq *s) {
  if (s->recall) return s->recall;
  kvt_engine *e = s->e;
  const kvt_shape *sh = &s->ns->desc.shape;
  uint32_t L = sh->n_layers;
  struct kvt_recall *r = kvt_mem_calloc(&e->mem, KVT_MEM_SEQ, fixed_bytes(L));
  if (!r) return NULL;
  r->L = L;
  r->HD = sh->n_kv_heads * sh->head_dim;
  r->vec = sh->block_tokens == 1 ? r->HD : 2 * r->HD;
  r->pending = (kvt_load **)(r + 1);
  r->nq = (uint32_t *)(r->pending + L);
  r->scale = (float *)(r->nq + L);
  r->cursor = (uint32_t *)(r->scale + L);
  r->n_recalled = r->cursor + L;
  count_bytes(e, (int64_t)fixed_bytes(L));
  return s->recall = r;
}

static float key_at(const void *k, uint32_t dtype, size_t i) {
  return dtype == KVT_F32   ? ((const float *)k)[i]
         : dtype == KVT_F16 ? kvt_f16_to_f32(((const uint16_t *)k)[i])
                            : kvt_bf16_to_f32(((const uint16_t *)k)[i]);
}

/* Fill mm from the keys k of one block (tokens x H x D). */
static void sketch_fill(const kvt_shape *sh, const void *k, uint32_t dtype, uint32_t HD,
                        float *mm) {
  float *mn = mm, *mx = sh->block_tokens == 1 ? mm : mm + HD;
  for (uint32_t c = 0; c < HD; c++) mn[c] = mx[c] = key_at(k, dtype, c);
  for (uint32_t t = 1; t < sh->block_tokens; t++)
    for (uint32_t c = 0; c < HD; c++) {
      float x = key_at(k, dtype, (size_t)t * HD + c);
      if (x < mn[c]) mn[c] = x;
      if (x > mx[c]) mx[c] = x;
    }
}

/* A sketch whose block is retained again (put back), or gone. */
static int stale(const kvt_seq *s, const struct kvt_recall *r, const sketch *sk) {
  size_t at = (size_t)sk->block * r->L + sk->layer;
  return sk->block >= s->n_blocks || s->lb[at] || !s->bs[at].left;
}

/* A slot for a sketch: a new one, or when full a stale one, else the
 * oldest. NULL when out of memory. A block evicted, put back and evicted
 * again may have two; decide() recalls it once. */
static sketch *slot_for(const kvt_seq *s, struct kvt_recall *r) {
  kvt_engine *e = s->e;
  size_t oldest = 0, old = SIZE_MAX;
  for (size_t i = 0; r->n == KVT_RECALL_MAX_SKETCHES && i < r->n; i++) {
    if (stale(s, r, &r->sk[i])) {
      old = i;
      break;
    }
    if (r->sk[i].age < r->sk[oldest].age) oldest = i;
  }
  if (old != SIZE_MAX) return &r->sk[old];
  if (r->n == r->cap && r->cap < KVT_RECALL_MAX_SKETCHES) {
    size_t cap = r->cap ? 2 * r->cap : 16;
    if (cap > KVT_RECALL_MAX_SKETCHES) cap = KVT_RECALL_MAX_SKETCHES;
    size_t vb = (size_t)r->vec * sizeof(float);
    sketch *sk = kvt_mem_alloc(&e->mem, KVT_MEM_SEQ, cap * sizeof *sk);
    float *mm = sk ? kvt_mem_alloc(&e->mem, KVT_MEM_SEQ, cap * vb) : NULL;
    if (!mm) {
      if (sk) kvt_mem_free(&e->mem, KVT_MEM_SEQ, sk, cap * sizeof *sk);
      return NULL;
    }
    if (r->n) {
      memcpy(sk, r->sk, r->n * sizeof *sk);
      memcpy(mm, r->mm, r->n * vb);
    }
    for (size_t i = 0; i < r->n; i++) sk[i].mm = mm + i * r->vec;
    kvt_mem_free(&e->mem, KVT_MEM_SEQ, r->sk, r->cap * sizeof *sk);
    kvt_mem_free(&e->mem, KVT_MEM_SEQ, r->mm, r->cap * vb);
    count_bytes(e, (int64_t)((cap - r->cap) * (sizeof *sk + vb)));
    r->sk = sk;
    r->mm = mm;
    r->cap = cap;
  }
  if (r->n == r->cap) return &r->sk[oldest]; /* full: the oldest goes */
  sketch *k = &r->sk[r->n];
  k->mm = r->mm + r->n * r->vec;
  r->n++;
  return k;
}

static void sketch_drop(struct kvt_recall *r, size_t i) {
  float *mm = r->sk[i].mm; /* the last moves into i, its data too */
  if (i != --r->n) {
    r->sk[i] = r->sk[r->n];
    memcpy(mm, r->sk[r->n].mm, (size_t)r->vec * sizeof(float));
    r->sk[i].mm = mm;
  }
}

void kvt_recall_on_evict(kvt_seq *s, uint32_t block, uint32_t layer, const kvt_lblk *lb) {
  if (!s->pol.recall || !lb || !lb->payload) return;
  kvt_engine *e = s->e;
  const kvt_shape *sh = &s->ns->desc.shape;
  struct kvt_recall *r = recall_get(s);
  if (!r) return; /* out of memory: the block just cannot come back */
  const void *k = lb->payload;
  uint8_t *dec = NULL;
  size_t each = s->ns->bytes_each;
  if (lb->tier == KVT_TIER_WARM) { /* keys from its quantized form */
    if (!(dec = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, 2 * each))) return;
    if (kvt_lblk_copy_out(s->ns, lb, dec, dec + each)) {
      kvt_mem_free(&e->mem, KVT_MEM_OTHER, dec, 2 * each);
      return;
    }
    k = dec;
  }
  sketch *sk = slot_for(s, r);
  if (sk) {
    sk->block = block;
    sk->layer = layer;
    sk->age = ++r->clock;
    sk->key_norm = s->bs[(size_t)block * r->L + layer].key_norm;
    sketch_fill(sh, k, sh->dtype, r->HD, sk->mm);
  }
  if (dec) kvt_mem_free(&e->mem, KVT_MEM_OTHER, dec, 2 * each);
}

/* The test k * exp(best) <= cut of sketch_bound() (k: query heads times
 * block tokens), mostly without the exp: cut's binary exponent puts
 * log(cut) within ln 2 (no log), and a best exponent farther than 1e-9
 * (far beyond the rounding of exp, log and the product) outside the band
 * log(k) + [lo, hi] decides as the exp would; within it, log(cut) itself
 * (once per cut) narrows the band; what is still within 1e-9, or out of
 * the range where k * exp(best) is a normal number, takes the exp. */
typedef struct cut_test {
  double cut, logk, lo, hi, lcut;
  int ok, have_log; /* ok: cut positive and finite */
} cut_test;

#define CUT_LN2 0.69314718055994530942

static void cut_set(cut_test *t, double cut, double logk) {
  int e = 0;
  t->cut = cut;
  t->logk = logk;
  t->ok = cut > 0 && isfinite(cut);
  t->have_log = 0;
  if (t->ok) frexp(cut, &e); /* cut in [2^(e-1), 2^e) */
  t->lo = (e - 1) * CUT_LN2 - logk;
  t->hi = e * CUT_LN2 - logk;
}

static int cut_passes(cut_test *t, double k, double best) {
  if (t->ok && best > -700 && best < 700) {
    if (best < t->lo - 1e-9) return 0;
    if (best > t->hi + 1e-9) return 1;
    if (!t->have_log) {
      t->lcut = log(t->cut) - t->logk;
      t->have_log = 1;
    }
    if (best < t->lcut - 1e-9) return 0;
    if (best > t->lcut + 1e-9) return 1;
  }
  return !(k * exp(best) <= t->cut);
}

/* One query head's exponent for the sketch: the bound of q.k over the
 * block's keys, scaled, less the head's lse. With 1-token blocks min and
 * max are the one key (mn == mx) and the larger product is either. */
static double head_bound(const float *qh, const float *mn, const float *mx, uint32_t D,
                         float scale, float lse) {
  float u = 0;
  if (mn == mx)
    for (uint32_t d = 0; d < D; d++) u += qh[d] * mn[d];
  else
    for (uint32_t d = 0; d < D; d++) {
      float a = qh[d] * mn[d], b = qh[d] * mx[d];
      u += a > b ? a : b;
    }
  return (double)(u * scale - lse);
}

/* The mass the sketch allows the block under the layer's last query: per
 * query head, block_tokens * exp(bound - lse), summed; 0 when even the
 * best head times the heads cannot pass cut (no exp a head, and mostly
 * none at all: cut_passes). Each head's bound is computed once, kept for
 * the sum. */
static double sketch_bound(const struct kvt_recall *r, const kvt_shape *sh, const sketch *sk,
                           cut_test *cut) {
  uint32_t layer = sk->layer, nq = r->nq[layer], D = sh->head_dim;
  uint32_t group = nq / sh->n_kv_heads;
  const float *q = r->q + (size_t)layer * r->q_cap * (D + 1), *lse = q + (size_t)nq * D;
  const float *mn = sk->mm, *mx = sh->block_tokens == 1 ? sk->mm : sk->mm + r->HD;
  float scale = r->scale[layer];
  double T = sh->block_tokens, best = -INFINITY, mass = 0;
  double xs[64], *x = nq <= 64 ? xs : NULL; /* the heads' exponents, when they fit */
  for (uint32_t h = 0; h < nq; h++) { /* the best head first */
    size_t g = (size_t)(h / group) * D;
    double xh = head_bound(q + (size_t)h * D, mn + g, mx + g, D, scale, lse[h]);
    if (x) x[h] = xh;
    if (xh > best) best = xh;
  }
  if (!cut_passes(cut, (double)nq * T, best)) return 0;
  for (uint32_t h = 0; h < nq; h++) { /* the sum when it passes */
    size_t g = (size_t)(h / group) * D;
    double xh = x ? x[h] : head_bound(q + (size_t)h * D, mn + g, mx + g, D, scale, lse[h]);
    mass += T * exp(xh);
  }
  return mass;
}

void kvt_recall_note_query(kvt_seq *s, uint32_t layer, const float *q, uint32_t n_q_heads,
                           float scale, const float *lse) {
  kvt_engine *e = s->e;
  uint32_t D = s->ns->desc.shape.head_dim;
  pthread_mutex_lock(&e->lock);
  struct kvt_recall *r = recall_get(s);
  if (r && n_q_heads > r->q_cap) { /* grow the query buffers (the first query, in practice) */
    size_t old = (size_t)r->L * r->q_cap * (D + 1) * sizeof(float);
    size_t bytes = (size_t)r->L * n_q_heads * (D + 1) * sizeof(float);
    float *nb = kvt_mem_calloc(&e->mem, KVT_MEM_SEQ, bytes);
    if (nb) {
      kvt_mem_free(&e->mem, KVT_MEM_SEQ, r->q, old);
      count_bytes(e, (int64_t)bytes - (int64_t)old);
      r->q = nb;
      r->q_cap = n_q_heads;
      memset(r->nq, 0, r->L * sizeof *r->nq);
    }
  }
  if (r && n_q_heads <= r->q_cap) {
    float *dst = r->q + (size_t)layer * r->q_cap * (D + 1);
    memcpy(dst, q, (size_t)n_q_heads * D * sizeof *dst);
    memcpy(dst + (size_t)n_q_heads * D, lse, n_q_heads * sizeof *dst);
    r->nq[layer] = n_q_heads;
    r->scale[layer] = scale;
  }
  pthread_mutex_unlock(&e->lock);
}

/* The smallest mean mass among the layer's evictable retained blocks, in
 * ascending order into v and their blocks into vb (up to max); returns how
 * many. Looks at the n_listed blocks of listed (in block order, a superset
 * of the retained ones) when given, else at every block of s. */
static size_t weakest(const kvt_seq *s, uint32_t layer, const kvt_pblk *listed,
                      size_t n_listed, double *v, uint32_t *vb, size_t max) {
  uint32_t L = s->ns->desc.shape.n_layers;
  size_t n = 0, end = listed ? n_listed : s->n_blocks;
  for (size_t k = 0; k < end; k++) {
    uint32_t b = listed ? listed[k].block : (uint32_t)k;
    const kvt_lblk *lb = s->lb[(size_t)b * L + layer];
    /* residency first: most blocks are away, and evictable() is a call */
    if (!lb || lb->tier == KVT_TIER_COLD || !kvt_policy_evictable(s, b, layer)) continue;
    const kvt_bstate *bs = &s->bs[(size_t)b * L + layer];
    /* its mean observed mass: what it has been worth, not one step's noise */
    double m = bs->observed ? bs->mass_sum / bs->observed : 0;
    size_t i = n < max ? n++ : max; /* insertion into the sorted list */
    if (i == max && m >= v[max - 1]) continue;
    if (i == max) i = max - 1;
    while (i > 0 && v[i - 1] > m) {
      v[i] = v[i - 1];
      vb[i] = vb[i - 1];
      i--;
    }
    v[i] = m;
    vb[i] = b;
  }
  return n;
}

typedef struct cand {
  double bound;
  size_t i; /* sketch index */
} cand;

/* The layer's sketches with the largest bounds, descending, into c (up to
 * max), among the next KVT_RECALL_SCAN of the layer from its cursor (all of
 * them when it has no more); stale ones are skipped. */
static size_t strongest(kvt_seq *s, struct kvt_recall *r, uint32_t layer, double cut, cand *c,
                        size_t max) {
  const kvt_shape *sh = &s->ns->desc.shape;
  size_t n = 0, seen = 0, visited = 0, total = r->n, i = r->cursor[layer];
  double k = (double)r->nq[layer] * sh->block_tokens, logk = log(k), full_need = NAN;
  cut_test base, full; /* the test against cut, and against the full list's last */
  cut_set(&base, cut, logk);
  while (visited < total && seen < KVT_RECALL_SCAN && r->n) {
    if (i >= r->n) i = 0;
    const sketch *sk = &r->sk[i];
    visited++;
    if (sk->layer != layer) {
      i++;
      continue;
    }
    if (stale(s, r, sk)) { /* its slot is reused by the next eviction */
      i++;
      continue;
    }
    seen++;
    /* once c is full, a sketch must beat its last too: its bound is not
     * summed when even the best head cannot (with a margin for rounding,
     * so that the choice is the one the full sum would make) */
    double need = n == max && c[max - 1].bound * (1 - 1e-6) > cut ? c[max - 1].bound * (1 - 1e-6)
                                                                  : cut;
    if (need != cut && need != full_need) cut_set(&full, full_need = need, logk);
    cand x = {.bound = sketch_bound(r, sh, sk, need != cut ? &full : &base), .i = i++};
    if (x.bound <= cut) continue; /* cannot be recalled this step */
    size_t j = n < max ? n++ : max;
    if (j == max && x.bound <= c[max - 1].bound) continue;
    if (j == max) j = max - 1;
    while (j > 0 && c[j - 1].bound < x.bound) {
      c[j] = c[j - 1];
      j--;
    }
    c[j] = x;
  }
  r->cursor[layer] = (uint32_t)i;
  return n;
}

/* Bring block (sk) back into the retained set as a fresh block: not left,
 * protected until observed. The read comes from the prefetch. */
static void mark_recalled(kvt_seq *s, const sketch *sk) {
  kvt_bstate *bs = &s->bs[(size_t)sk->block * s->ns->desc.shape.n_layers + sk->layer];
  memset(bs, 0, sizeof *bs);
  bs->key_norm = sk->key_norm;
  bs->recalled = 1;
}

/* A candidate whose token block is still on its way to the cold tier
 * (queued for the flusher) is waited for, so that whether it can be
 * recalled depends on the step, not on how far the flusher got
 * (docs/policy.md, "Recall is deterministic"). Bounded by
 * KVT_RECALL_WAIT_MS; the lock is dropped while waiting. */
static void wait_cold(kvt_engine *e, kvt_tblk *tb, uint64_t *until) {
  while (!tb->cold && tb->queued && kvt_flush_on(e)) {
    uint64_t now = kvt_hist_now_ns();
    if (!*until) *until = now + KVT_RECALL_WAIT_MS * 1000000ull;
    if (now >= *until) {
      e->st.recall_late++;
      return;
    }
    kvt_flush_wait_room_ns(e, *until - now);
  }
}

/* Decide the layer's recalls under its last query, the weakest blocks
 * among the n_listed of listed (kvt_recall_step()). With the lock held;
 * returns how many blocks were marked. */
static uint32_t decide(kvt_seq *s, struct kvt_recall *r, uint32_t layer, const kvt_pblk *listed,
                       size_t n_listed) {
  kvt_engine *e = s->e;
  double v[KVT_RECALL_PER_STEP];
  uint32_t vb[KVT_RECALL_PER_STEP];
  cand c[KVT_RECALL_PER_STEP];
  size_t nv = weakest(s, layer, listed, n_listed, v, vb, KVT_RECALL_PER_STEP);
  /* the bound of a block of T tokens counts each at its best key: its
   * best token alone must out-weigh the weakest block (and by the margin) */
  double margin = KVT_RECALL_MARGIN * s->ns->desc.shape.block_tokens;
  size_t nc = nv ? strongest(s, r, layer, margin * v[0], c, KVT_RECALL_PER_STEP) : 0;
  uint64_t until = 0; /* one bound for all of the step's candidates */
  for (size_t k = 0; k < nc; k++) /* the candidates' cold copies, written first */
    if (!stale(s, r, &r->sk[c[k].i])) wait_cold(e, s->tb[r->sk[c[k].i].block], &until);
  uint32_t marked = 0;
  size_t drop[KVT_RECALL_PER_STEP], nd = 0;
  size_t j = 0;
  for (size_t k = 0; k < nc && j < nv && c[k].bound > margin * v[j]; k++) {
    const sketch *sk = &r->sk[c[k].i];
    const kvt_tblk *tb = s->tb[sk->block];
    if (stale(s, r, sk)) { /* a second sketch of a block recalled just now */
      drop[nd++] = c[k].i;
      continue;
    }
    if (!kvt_store_payload(e) || !tb->cold) { /* no exact copy to read: it stays out */
      e->st.recall_unavailable++;
      continue;
    }
    mark_recalled(s, sk);
    r->n_recalled[layer]++;
    drop[nd++] = c[k].i;
    marked++;
    j++; /* it displaces the next weakest */
    e->st.recalls++;
  }
  /* drop in descending index order: sketch_drop moves the last into i */
  for (size_t a = 0; a < nd; a++)
    for (size_t b = a + 1; b < nd; b++)
      if (drop[b] > drop[a]) {
        size_t t = drop[a];
        drop[a] = drop[b];
        drop[b] = t;
      }
  for (size_t a = 0; a < nd; a++) sketch_drop(r, drop[a]);
  /* the weakest make room now: the budget holds while the reads run */
  for (size_t a = 0; a < j; a++) kvt_policy_evict_locked(s, vb[a], layer);
  return marked;
}

/* The bytes the layer's budget counts for lb: hot at f16 size, warm at
 * its encoded size (as policy.c counts them). */
static uint64_t budget_bytes(const kvt_shape *sh, const kvt_lblk *lb) {
  uint64_t half = (uint64_t)sh->block_tokens * sh->n_kv_heads * sh->head_dim * 2;
  if (lb->tier != KVT_TIER_WARM) return 2 * half;
  kvt_codec_shape cs = {.n_tokens = sh->block_tokens, .n_heads = sh->n_kv_heads,
                        .head_dim = sh->head_dim};
  return (lb->k_codec ? kvt_codec_size(lb->k_codec, &cs) : half) +
         (lb->v_codec ? kvt_codec_size(lb->v_codec, &cs) : half);
}

/* How many of the layer's weakest evictable blocks (at most
 * KVT_RECALL_PER_STEP, into vb) must leave so that need more bytes fit
 * its budget; -1 when even all of them would not free enough. */
static int room_for(const kvt_seq *s, uint32_t layer, int64_t need, uint32_t *vb) {
  const kvt_shape *sh = &s->ns->desc.shape;
  int64_t room = kvt_policy_room_locked(s, layer);
  if (room >= need) return 0;
  double v[KVT_RECALL_PER_STEP];
  size_t nv = weakest(s, layer, NULL, 0, v, vb, KVT_RECALL_PER_STEP);
  for (size_t k = 0; k < nv; k++) {
    room += (int64_t)budget_bytes(sh, s->lb[(size_t)vb[k] * sh->n_layers + layer]);
    if (room >= need) return (int)k + 1;
  }
  return -1;
}

/* Recalled blocks of (s, layer) that came back as a copy still in the warm
 * tier (the prefetch re-references a layer block still in RAM instead of
 * reading the disk) are made hot with their exact bytes when the token
 * block is durable and the layer's budget has room for the difference:
 * recall brings back what the query needs, not its quantized form. It is
 * protected until observed, so it must fit the budget as hot: the weakest
 * evictable blocks (at most KVT_RECALL_PER_STEP) leave for it, but only
 * once it was promoted, and only when they free enough; a block a reader
 * pins (or in a move) cannot be promoted, and nothing leaves for it. Else
 * it stays warm (the policy's promotion may move it later). With the lock
 * held (kvt_lblk_promote drops it while it reads); counted as the
 * policy's promotions. */
static void promote_recalled(kvt_seq *s, uint32_t layer) {
  kvt_engine *e = s->e;
  const kvt_shape *sh = &s->ns->desc.shape;
  uint32_t L = sh->n_layers;
  if (!kvt_store_payload(e)) return;
  for (uint32_t b = 0; b < s->n_blocks; b++) {
    size_t i = (size_t)b * L + layer;
    kvt_lblk *lb = s->lb[i];
    if (!s->bs[i].recalled || !lb || lb->tier != KVT_TIER_WARM || lb->refs != 1 ||
        lb->pins || lb->busy || !lb->tb->cold || lb->tb->lost)
      continue;
    int64_t need = (int64_t)(2 * (uint64_t)sh->block_tokens * sh->n_kv_heads * sh->head_dim * 2) -
                   (int64_t)budget_bytes(sh, lb);
    uint32_t vb[KVT_RECALL_PER_STEP];
    if (room_for(s, layer, need, vb) < 0) continue;
    int exact = 0;
    if (kvt_lblk_promote(e, lb, &exact)) continue; /* nothing left for it */
    if (s->lp) {
      s->lp[layer].promotions++;
      s->lp[layer].promotions_exact += (uint64_t)exact;
    }
    /* it is hot now: the weakest leave until the budget holds (the same
     * ones as counted above, unless the lock's release let them move) */
    for (int k = 0; k < (int)KVT_RECALL_PER_STEP && kvt_policy_room_locked(s, layer) < 0; k++) {
      double v;
      if (!weakest(s, layer, NULL, 0, &v, vb, 1)) break;
      kvt_policy_evict_locked(s, vb[0], layer);
    }
  }
}

void kvt_recall_step(kvt_seq *s, uint32_t layer, const kvt_pblk *listed, size_t n_listed) {
  struct kvt_recall *r = s->recall;
  if (!r || !s->pol.recall || !s->lp) return;
  kvt_engine *e = s->e;
  pthread_mutex_lock(&e->lock);
  uint32_t marked =
      r->nq[layer] && !r->pending[layer] ? decide(s, r, layer, listed, n_listed) : 0;
  r->nq[layer] = 0; /* a query is used once */
  pthread_mutex_unlock(&e->lock);
  if (!marked) return;
  /* timed from here only: a clock read can cost as much as a decision
   * (kvtier bench policy measures those) */
  uint64_t t0 = kvt_hist_now_ns();
  kvt_load *ld = NULL;
  /* One batched read of the layer's blocks now away, while the caller
   * computes the rest of the step; a failure leaves them away, and the
   * next attention reads them itself. */
  if (kvt_seq_prefetch(s, layer, 1, &ld)) ld = NULL;
  pthread_mutex_lock(&e->lock);
  if (ld) {
    r->pending[layer] = ld;
    ld->back = &r->pending[layer];
  }
  promote_recalled(s, layer);        /* some may be in RAM already, */
  kvt_policy_apply_locked(s, layer); /* and retained at once */
  e->st.recall_ns += kvt_hist_now_ns() - t0;
  pthread_mutex_unlock(&e->lock);
}

int kvt_recall_reading(const kvt_seq *s, uint32_t block, uint32_t layer) {
  const struct kvt_recall *r = s->recall;
  size_t at = (size_t)block * s->ns->desc.shape.n_layers + layer;
  return r && r->pending[layer] && s->bs[at].recalled && s->lb[at];
}

void kvt_recall_install(kvt_seq *s, uint32_t layer) {
  struct kvt_recall *r = s->recall;
  if (!r) return;
  kvt_engine *e = s->e;
  pthread_mutex_lock(&e->lock);
  kvt_load *ld = r->pending[layer];
  r->pending[layer] = NULL;
  if (ld) ld->back = NULL;
  pthread_mutex_unlock(&e->lock);
  if (!ld) return;
  uint64_t t0 = kvt_hist_now_ns();
  size_t ok = 0;
  kvt_load_wait(ld, &ok); /* what failed stays away: attention reads or reports it */
  pthread_mutex_lock(&e->lock);
  e->st.recall_bytes += (uint64_t)ok * 2 * s->ns->bytes_each;
  promote_recalled(s, layer);
  kvt_policy_apply_locked(s, layer);
  e->st.recall_ns += kvt_hist_now_ns() - t0;
  pthread_mutex_unlock(&e->lock);
}

void kvt_recall_observed_locked(kvt_seq *s, uint32_t layer, const kvt_pblk *listed,
                                size_t n_listed) {
  if (!s->recall || !s->recall->n_recalled[layer]) return;
  uint32_t L = s->ns->desc.shape.n_layers;
  double low = INFINITY;
  for (size_t k = 0; k < n_listed; k++) {
    uint32_t b = listed[k].block;
    const kvt_lblk *lb = s->lb[(size_t)b * L + layer];
    if (lb && lb->tier != KVT_TIER_COLD && kvt_policy_evictable(s, b, layer) &&
        s->bs[(size_t)b * L + layer].mass_last < low)
      low = s->bs[(size_t)b * L + layer].mass_last;
  }
  for (size_t k = 0; k < n_listed; k++) {
    uint32_t b = listed[k].block;
    kvt_bstate *bs = &s->bs[(size_t)b * L + layer];
    const kvt_lblk *lb = s->lb[(size_t)b * L + layer];
    if (!bs->recalled || !lb || lb->tier == KVT_TIER_COLD) continue;
    bs->recalled = 0;
    if (s->recall->n_recalled[layer]) s->recall->n_recalled[layer]--;
    /* it mattered: more than a block the policy could have kept instead */
    s->e->st.recall_useful += (double)bs->mass_last > low;
  }
}

void kvt_recall_free_locked(kvt_seq *s) {
  struct kvt_recall *r = s->recall;
  if (!r) return;
  kvt_engine *e = s->e;
  for (uint32_t l = 0; l < r->L; l++)
    if (r->pending[l]) kvt_load_free_locked(r->pending[l]); /* clears the slot */
  size_t vb = (size_t)r->vec * sizeof(float);
  kvt_mem_free(&e->mem, KVT_MEM_SEQ, r->sk, r->cap * sizeof *r->sk);
  kvt_mem_free(&e->mem, KVT_MEM_SEQ, r->mm, r->cap * vb);
  count_bytes(e, -(int64_t)(r->cap * (sizeof *r->sk + vb)));
  r->n = 0;
  uint32_t D = s->ns->desc.shape.head_dim;
  size_t qb = (size_t)r->L * r->q_cap * (D + 1) * sizeof(float);
  kvt_mem_free(&e->mem, KVT_MEM_SEQ, r->q, qb);
  count_bytes(e, -(int64_t)qb);
  count_bytes(e, -(int64_t)fixed_bytes(r->L));
  kvt_mem_free(&e->mem, KVT_MEM_SEQ, r, fixed_bytes(r->L));
  s->recall = NULL;
}
