/* promote.c - the blocks a sequence references whose payload is only in
 * the cold tier (they left RAM, or the token block was appended as durable
 * and that layer was never put) are brought back into RAM by the engine:
 * when attention or a gather needs them, or ahead of time (kvt_seq_prefetch). */
#include <errno.h>
#include <string.h>

#include "engine/internal.h"

/* A promotion: the sequence's cold descriptors (pinned, so they outlive a
 * release of the sequence), the fresh hot blocks their bytes are read into
 * (one batched cold read) and, for the synchronous path, the layer's other
 * retained blocks pinned so that installing one cannot push another out. */
struct kvt_promo {
  kvt_engine *e;
  kvt_nsrec *ns;
  size_t n, n_keep, cap;
  kvt_lblk **blk;      /* [cap] the descriptors, pinned */
  kvt_lblk **fresh;    /* [cap] hot blocks read into; NULL once installed or freed */
  kvt_store_read *cr;  /* [cap] */
  kvt_lblk **keep;     /* [cap] other retained blocks, pinned (synchronous path) */
  int why;             /* first reason a block stayed out of RAM (0: none) */
  uint32_t installed;
};

static size_t promo_bytes(size_t cap) {
  return sizeof(struct kvt_promo) +
         cap * (3 * sizeof(kvt_lblk *) + sizeof(kvt_store_read));
}

/* Away blocks of (s, layer) with no layer block (a durable token block whose
 * layer was never put) get one: another sequence's when the token block
 * has it, else a cold descriptor, so every away block is a pinned
 * descriptor from here on and a failed read leaves it visibly away. With
 * the lock held; spare descriptors are consumed from *spare. */
static void adopt_layer(kvt_seq *s, uint32_t layer, kvt_lblk **spare, size_t *n_spare) {
  kvt_engine *e = s->e;
  uint32_t L = s->ns->desc.shape.n_layers;
  for (uint32_t b = 0; b < s->n_blocks; b++) {
    size_t i = (size_t)b * L + layer;
    if (s->lb[i] || !kvt_seq_away(s, b, layer)) continue;
    kvt_tblk *tb = s->tb[b];
    kvt_lblk *lb = tb->layers[layer];
    if (!lb) {
      if (!*n_spare) continue; /* no descriptor left: stays away this time */
      lb = spare[--*n_spare];
      spare[*n_spare] = NULL;
      kvt_publish_cold(e, tb, layer, lb);
    }
    kvt_lblk_ref(e, lb);
    s->lb[i] = lb;
  }
}

static uint32_t count_unput(const kvt_seq *s, uint32_t layer) {
  uint32_t L = s->ns->desc.shape.n_layers, n = 0;
  for (uint32_t b = 0; b < s->n_blocks; b++)
    n += !s->lb[(size_t)b * L + layer] && kvt_seq_away(s, b, layer);
  return n;
}

/* Give every away block of layers [l0, l1) a layer block (adopt_layer).
 * Descriptors are allocated outside the lock. 0 or -ENOMEM. */
static int adopt_layers(kvt_seq *s, uint32_t l0, uint32_t l1) {
  kvt_engine *e = s->e;
  size_t n = 0;
  pthread_mutex_lock(&e->lock);
  for (uint32_t l = l0; l < l1; l++) n += count_unput(s, l);
  pthread_mutex_unlock(&e->lock);
  if (!n) return 0;
  kvt_lblk **spare = kvt_mem_calloc(&e->mem, KVT_MEM_OTHER, n * sizeof *spare);
  if (!spare) return -ENOMEM;
  size_t made = 0, left;
  while (made < n && (spare[made] = kvt_hot_alloc(&e->mem, 2 * (uint64_t)s->ns->bytes_each, 0)))
    made++;
  left = made;
  pthread_mutex_lock(&e->lock);
  for (uint32_t l = l0; l < l1; l++) adopt_layer(s, l, spare, &left);
  pthread_mutex_unlock(&e->lock);
  for (size_t i = 0; i < left; i++) kvt_lblk_free(&e->mem, KVT_MEM_HOT, spare[i]);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, spare, n * sizeof *spare);
  return made < n ? -ENOMEM : 0;
}

/* Away descriptors of layers [l0, l1) and, with keep, the layers' blocks in
 * RAM. With the lock held; pins them into p up to its capacity. */
static void collect(kvt_seq *s, uint32_t l0, uint32_t l1, kvt_promo *p, int keep) {
  uint32_t L = s->ns->desc.shape.n_layers;
  for (uint32_t l = l0; l < l1; l++)
    for (uint32_t b = 0; b < s->n_blocks; b++) {
      kvt_lblk *lb = s->lb[(size_t)b * L + l];
      if (!lb) continue;
      if (lb->tier == KVT_TIER_COLD && p->n < p->cap) {
        kvt_lblk_pin(s->e, lb);
        p->blk[p->n++] = lb;
      } else if (lb->tier != KVT_TIER_COLD && keep && p->n_keep < p->cap) {
        kvt_lblk_pin(s->e, lb);
        p->keep[p->n_keep++] = lb;
      }
    }
}

static uint32_t count_refs(const kvt_seq *s, uint32_t l0, uint32_t l1) {
  uint32_t L = s->ns->desc.shape.n_layers, n = 0;
  for (uint32_t l = l0; l < l1; l++)
    for (uint32_t b = 0; b < s->n_blocks; b++) n += s->lb[(size_t)b * L + l] != NULL;
  return n;
}

/* Allocate a promotion for up to cap blocks and a hot block per away
 * descriptor, then start one batched read of them all. */
static int promo_start(kvt_seq *s, uint32_t l0, uint32_t l1, int keep, kvt_promo **out) {
  kvt_engine *e = s->e;
  *out = NULL;
  int rc = adopt_layers(s, l0, l1);
  if (rc) return rc;
  pthread_mutex_lock(&e->lock);
  size_t cap = count_refs(s, l0, l1); /* everything that can be pinned */
  pthread_mutex_unlock(&e->lock);
  kvt_promo *p = kvt_mem_calloc(&e->mem, KVT_MEM_OTHER, promo_bytes(cap ? cap : 1));
  if (!p) return -ENOMEM;
  p->e = e;
  p->ns = s->ns;
  p->cap = cap;
  p->blk = (kvt_lblk **)(p + 1);
  p->fresh = p->blk + cap;
  p->keep = p->fresh + cap;
  p->cr = (kvt_store_read *)(p->keep + cap);
  pthread_mutex_lock(&e->lock);
  collect(s, l0, l1, p, keep);
  pthread_mutex_unlock(&e->lock);
  *out = p;
  size_t each = s->ns->bytes_each;
  for (size_t i = 0; i < p->n; i++) {
    if (!(p->fresh[i] = kvt_hot_alloc(&e->mem, 2 * (uint64_t)each, 1))) {
      p->why = -ENOMEM;
      continue;
    }
    p->cr[i] = (kvt_store_read){.key = p->blk[i]->tb->key, .layer = p->blk[i]->layer,
                               .k_out = p->fresh[i]->payload,
                               .v_out = p->fresh[i]->payload + each, .bytes_each = each};
  }
  return 0;
}

/* Read what promo_start allocated: one batch, or one by one when the
 * batch cannot start. Without the lock. */
static int promo_submit(kvt_promo *p, kvt_store_batch **cb) {
  size_t n = 0;
  *cb = NULL;
  for (size_t i = 0; i < p->n; i++) /* blocks without a hot block go last */
    if (p->fresh[i]) {
      kvt_lblk *b = p->blk[i], *f = p->fresh[i];
      kvt_store_read r = p->cr[i];
      p->blk[i] = p->blk[n];
      p->fresh[i] = p->fresh[n];
      p->cr[i] = p->cr[n];
      p->blk[n] = b;
      p->fresh[n] = f;
      p->cr[n++] = r;
    }
  if (!n) return 0;
  if (!kvt_store_payload(p->e)) {
    for (size_t i = 0; i < n; i++) p->cr[i].status = KVT_ENOTFOUND;
    return 0;
  }
  if (!kvt_store_read_submit(p->e->store, p->cr, n, cb)) return 0;
  for (size_t i = 0; i < n; i++)
    p->cr[i].status = kvt_store_read_layer(p->e->store, &p->cr[i].key, p->cr[i].layer,
                                           p->cr[i].k_out, p->cr[i].v_out, p->cr[i].bytes_each);
  return 0;
}

/* Encode hot block f's exact bytes into the warm form of b's layer. */
static int to_warm_form(kvt_engine *e, const kvt_nsrec *ns, uint32_t layer, const kvt_lblk *f,
                        kvt_warm_form *w) {
  int kc = ns->k_codec[layer], vc = ns->v_codec[layer];
  pthread_mutex_unlock(&e->lock);
  int rc = kvt_warm_encode(&e->mem, &ns->lite, f->payload, f->payload + ns->bytes_each, kc, vc,
                           kvt_layer_seed(ns, layer), w);
  pthread_mutex_lock(&e->lock);
  return rc ? rc : 0;
}

/* Room for f in the hot tier, or else for its warm form in the warm tier;
 * 0 and *tier, or KVT_EFULL / -ENOMEM. May drop the lock. */
static int make_room(kvt_engine *e, kvt_nsrec *ns, uint32_t layer, kvt_lblk *f, int *tier,
                     kvt_warm_form *w) {
  *tier = KVT_TIER_HOT;
  int rc = kvt_hot_make_room(e, f->cost);
  if (rc != KVT_EFULL || !kvt_warm_on(e)) return rc;
  if ((rc = to_warm_form(e, ns, layer, f, w))) return rc;
  *tier = KVT_TIER_WARM;
  rc = kvt_tier_drop_for(e, &e->tier[KVT_TIER_WARM], kvt_lblk_desc_bytes() + w->alloc);
  if (rc) {
    kvt_mem_free(&e->mem, KVT_MEM_WARM, w->payload, w->alloc);
    w->payload = NULL;
  }
  return rc;
}

/* Move the RAM form into descriptor b (tier COLD, still referenced). */
static void take_payload(kvt_engine *e, kvt_lblk *b, kvt_lblk *f, int tier,
                         const kvt_warm_form *w) {
  kvt_tier_state *t = &e->tier[tier];
  if (tier == KVT_TIER_HOT) {
    b->payload = f->payload;
    b->payload_alloc = f->payload_alloc;
    b->cost = f->cost;
    b->k_len = 0;
    b->k_codec = b->v_codec = KVT_CODEC_NONE;
    b->checked = 0;
    f->payload = NULL;
  } else {
    b->payload = w->payload;
    b->payload_alloc = w->alloc;
    b->cost = kvt_lblk_desc_bytes() + w->alloc;
    b->k_len = w->k_len;
    b->k_codec = w->k_codec;
    b->v_codec = w->v_codec;
    b->checked = w->checked;
  }
  kvt_mem_move(&e->mem, KVT_MEM_INDEX, t->mem_cat, kvt_lblk_desc_bytes());
  kvt_tier_account(t, b);
  e->st.promotions++;
  e->tc.promotions[tier]++;
}

/* Install block i of p after its read: with the lock held. A record that
 * failed its check is no longer durable (the cold tier took it out of its
 * index): the descriptor stays away, so attention says so. */
static void install(kvt_promo *p, size_t i) {
  kvt_engine *e = p->e;
  kvt_lblk *b = p->blk[i], *f = p->fresh[i];
  int st = p->cr[i].status;
  if (st == KVT_ECORRUPT) {
    b->tb->lost |= b->tb->cold;
    b->tb->cold = 0;
  }
  if (!st && b->tier == KVT_TIER_COLD && b->refs > 0) {
    int tier;
    kvt_warm_form w = {0};
    st = make_room(e, p->ns, b->layer, f, &tier, &w);
    if (!st && b->tier == KVT_TIER_COLD && b->refs > 0) {
      take_payload(e, b, f, tier, &w);
      p->installed++;
    } else if (!st && tier == KVT_TIER_WARM) {
      kvt_mem_free(&e->mem, KVT_MEM_WARM, w.payload, w.alloc);
    }
  }
  if (st && !p->why) p->why = st;
  kvt_lblk_free(&e->mem, KVT_MEM_HOT, f);
  p->fresh[i] = NULL;
}

static void promo_install_all(kvt_promo *p) {
  pthread_mutex_lock(&p->e->lock);
  for (size_t i = 0; i < p->n; i++)
    if (p->fresh[i]) install(p, i);
  pthread_mutex_unlock(&p->e->lock);
}

/* Unpin everything and free p (fresh blocks not installed too). With the
 * lock held; the reads are finished. */
static void promo_free_locked(kvt_promo *p) {
  kvt_engine *e = p->e;
  for (size_t i = 0; i < p->n; i++) {
    kvt_lblk_free(&e->mem, KVT_MEM_HOT, p->fresh[i]);
    kvt_lblk_unpin(e, p->blk[i]);
  }
  kvt_retained_unpin(e, p->keep, p->n_keep);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, p, promo_bytes(p->cap ? p->cap : 1));
}

int kvt_promote_hold(kvt_seq *s, uint32_t layer, kvt_promo **hold) {
  *hold = NULL;
  kvt_engine *e = s->e;
  pthread_mutex_lock(&e->lock);
  uint32_t away = kvt_seq_nonresident(s, layer);
  pthread_mutex_unlock(&e->lock);
  if (!away || kvt_meta_only(e)) return 0;
  kvt_promo *p;
  int rc = promo_start(s, layer, layer + 1, 1, &p);
  if (!p) return rc;
  kvt_store_batch *cb;
  promo_submit(p, &cb);
  kvt_store_read_wait(cb);
  promo_install_all(p);
  if (rc && !p->why) p->why = rc;
  /* Back in RAM (installed here, adopted from another sequence, or by a
   * prefetch): counted by the layer's budget again. */
  pthread_mutex_lock(&e->lock);
  kvt_policy_apply_locked(s, layer);
  pthread_mutex_unlock(&e->lock);
  *hold = p;
  return 0;
}

int kvt_promote_why(const kvt_promo *hold) { return hold ? hold->why : 0; }

const char *kvt_promote_reason(int why) {
  switch (why) {
  case KVT_ECORRUPT: return "a cold record failed its check";
  case KVT_ENOTFOUND: return "no longer in the cold tier";
  case KVT_EFULL: return "RAM is full";
  case -ENOMEM: return "out of memory";
  default: return why ? kvt_strerror(why) : "they left RAM again";
  }
}

void kvt_promote_release(kvt_engine *e, kvt_promo *hold) {
  if (!hold) return;
  pthread_mutex_lock(&e->lock);
  promo_free_locked(hold);
  pthread_mutex_unlock(&e->lock);
}

/* ---------- prefetch: a load of the sequence's own blocks ---------- */

int kvt_seq_prefetch(kvt_seq *s, uint32_t layer, uint32_t n_layers, kvt_load **out) {
  if (!s || !out) return KVT_ENULL;
  *out = NULL;
  kvt_engine *e = s->e;
  uint32_t L = s->ns->desc.shape.n_layers;
  if (layer >= L || n_layers == 0 || n_layers > L - layer)
    return KVT_ERR(e, KVT_ENOTFOUND, "kvt_seq_prefetch", "layer, n_layers",
                   "a range of the namespace's layers", "%u, %u (n_layers %u)", layer, n_layers,
                   L);
  if (kvt_meta_only(e)) return KVT_ENOPAYLOAD;
  kvt_load *ld = kvt_mem_calloc(&e->mem, KVT_MEM_OTHER, sizeof *ld);
  if (!ld) return -ENOMEM;
  kvt_promo *p;
  int rc = promo_start(s, layer, layer + n_layers, 0, &p);
  if (!p) {
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, ld, sizeof *ld);
    return rc;
  }
  if (rc && !p->why) p->why = rc;
  kvt_store_batch *cb;
  promo_submit(p, &cb);
  pthread_mutex_lock(&e->lock);
  *ld = (kvt_load){.e = e, .ns = s->ns, .promo = p, .cb = cb};
  ld->next = e->loads.next;
  ld->prev = &e->loads;
  e->loads.next->prev = ld;
  e->loads.next = ld;
  s->ns->n_loads++;
  pthread_mutex_unlock(&e->lock);
  if (!cb) kvt_event_signal(e); /* complete already: tell the event loop, as kvt_load_submit does */
  *out = ld;
  return 0;
}

int kvt_promote_load_wait(kvt_load *ld, size_t *n_ok) {
  kvt_engine *e = ld->e;
  kvt_promo *p = ld->promo;
  kvt_store_read_wait(ld->cb);
  ld->cb = NULL;
  promo_install_all(p);
  size_t ok = p->installed;
  int why = p->why;
  pthread_mutex_lock(&e->lock);
  kvt_load_free_locked(ld);
  pthread_mutex_unlock(&e->lock);
  if (n_ok) *n_ok = ok;
  return why;
}

void kvt_promote_load_free_locked(kvt_load *ld) {
  if (!ld->promo) return;
  kvt_store_read_wait(ld->cb); /* the readers write into the fresh blocks */
  ld->cb = NULL;
  promo_free_locked(ld->promo);
  ld->promo = NULL;
}
