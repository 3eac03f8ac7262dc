/* seq.c - sequences (one agent's context), puts, reads, gathers and loads.
 * A sequence is used by one thread at a time, so its own arrays are read
 * without the engine lock; everything shared is changed under it. Payload
 * bytes are copied outside the lock while the blocks are pinned. */
#include <assert.h>
#include <errno.h>
#include <string.h>

#include "engine/internal.h"
#include "engine/recall.h"

/* One allocation: tb [cap], lb [cap * L], bs [cap * L], the policy's
 * ranking scratch [cap], then the scorers' private state [cap * L *
 * stride] (pointers and doubles first, so everything stays 8-byte
 * aligned: stride is a multiple of 8). */
static size_t seq_arrays_size(uint32_t cap, uint32_t L, uint32_t stride) {
  return (size_t)cap * sizeof(kvt_tblk *) + (size_t)cap * L * sizeof(kvt_lblk *) +
         (size_t)cap * L * sizeof(kvt_bstate) + (size_t)cap * kvt_policy_scratch_bytes() +
         (size_t)cap * L * stride;
}

typedef struct seq_arrays {
  kvt_tblk **tb;
  kvt_lblk **lb;
  kvt_bstate *bs;
  kvt_pblk *pb;
  double *score;
  struct cand *cand;
  uint8_t *ss;
} seq_arrays;

static void seq_arrays_carve(void *p, uint32_t cap, uint32_t L, uint32_t stride, seq_arrays *a) {
  a->tb = p;
  a->lb = (kvt_lblk **)(a->tb + cap);
  a->bs = (kvt_bstate *)(a->lb + (size_t)cap * L);
  a->pb = (kvt_pblk *)(a->bs + (size_t)cap * L);
  a->score = (double *)(a->pb + cap);
  a->cand = (struct cand *)(a->score + cap);
  a->ss = stride ? (uint8_t *)a->cand + (size_t)cap * (kvt_policy_scratch_bytes() -
                                                      sizeof(kvt_pblk) - sizeof(double))
                 : NULL;
}

static void seq_arrays_set(kvt_seq *s, const seq_arrays *a, uint32_t cap, uint32_t stride) {
  s->tb = a->tb;
  s->lb = a->lb;
  s->bs = a->bs;
  s->scratch_pb = a->pb;
  s->scratch_score = a->score;
  s->scratch_cand = a->cand;
  s->ss = a->ss;
  s->ss_stride = stride;
  s->cap = cap;
}

/* Allocate a sequence able to hold cap blocks with private policy state
 * of stride bytes; not yet linked. */
static kvt_seq *seq_alloc(kvt_engine *e, kvt_nsrec *ns, uint32_t cap, uint32_t stride) {
  kvt_seq *s = kvt_mem_calloc(&e->mem, KVT_MEM_SEQ, sizeof *s);
  if (!s) return NULL;
  s->e = e;
  s->ns = ns;
  s->ss_stride = stride;
  s->salted_from = UINT32_MAX; /* not lossy (lineage.c) */
  kvt_policy_init(&s->pol);
  if (cap) {
    uint32_t L = ns->desc.shape.n_layers;
    void *p = kvt_mem_calloc(&e->mem, KVT_MEM_SEQ, seq_arrays_size(cap, L, stride));
    if (!p) {
      kvt_mem_free(&e->mem, KVT_MEM_SEQ, s, sizeof *s);
      return NULL;
    }
    seq_arrays a;
    seq_arrays_carve(p, cap, L, stride, &a);
    seq_arrays_set(s, &a, cap, stride);
  }
  return s;
}

static void seq_dealloc(kvt_engine *e, kvt_seq *s) {
  uint32_t L = s->ns->desc.shape.n_layers;
  if (s->cap) kvt_mem_free(&e->mem, KVT_MEM_SEQ, s->tb, seq_arrays_size(s->cap, L, s->ss_stride));
  if (s->lp) kvt_mem_free(&e->mem, KVT_MEM_SEQ, s->lp, L * sizeof *s->lp);
  kvt_mem_free(&e->mem, KVT_MEM_SEQ, s, sizeof *s);
}

static void seq_link(kvt_engine *e, kvt_seq *s) {
  s->next = e->seqs.next;
  s->prev = &e->seqs;
  e->seqs.next->prev = s;
  e->seqs.next = s;
  s->ns->n_seqs++;
  e->st.seqs++;
}

int kvt_seq_create(kvt_engine *e, kvt_ns_id id, kvt_seq **out) {
  if (!e || !out) return KVT_ENULL;
  *out = NULL;
  if (kvt_rdonly(e)) return KVT_ERDONLY;
  int rc = 0;
  pthread_mutex_lock(&e->lock);
  kvt_nsrec *ns = kvt_ns_find(e, id);
  if (!ns) rc = KVT_ENOTFOUND;
  else if (e->st.seqs >= e->opt.max_seqs) rc = KVT_ELIMIT;
  else if (!(*out = seq_alloc(e, ns, 0, 0))) rc = -ENOMEM;
  else seq_link(e, *out);
  pthread_mutex_unlock(&e->lock);
  return rc;
}

int kvt_seq_output(kvt_seq *s, int on) {
  if (!s) return KVT_ENULL;
  pthread_mutex_lock(&s->e->lock);
  s->output = on != 0;
  pthread_mutex_unlock(&s->e->lock);
  return 0;
}

int kvt_seq_fork(kvt_seq *parent, uint32_t n_blocks, kvt_seq **out) {
  if (!parent || !out) return KVT_ENULL;
  *out = NULL;
  kvt_engine *e = parent->e;
  if (n_blocks == UINT32_MAX) n_blocks = parent->n_blocks;
  if (n_blocks > parent->n_blocks)
    return KVT_ERR(e, KVT_ECOUNT, "kvt_seq_fork", "n_blocks", "at most the parent's blocks",
                   "%u (the parent has %u)", n_blocks, parent->n_blocks);
  uint32_t L = parent->ns->desc.shape.n_layers;
  int rc = 0;
  kvt_lpol *lp = NULL; /* the parent's per-layer policies, copied */
  if (parent->lp && !(lp = kvt_mem_calloc(&e->mem, KVT_MEM_SEQ, L * sizeof *lp))) return -ENOMEM;
  pthread_mutex_lock(&e->lock);
  kvt_seq *s = NULL;
  if (e->st.seqs >= e->opt.max_seqs) rc = KVT_ELIMIT;
  else if (!(s = seq_alloc(e, parent->ns, n_blocks, parent->ss_stride))) rc = -ENOMEM;
  if (!rc) {
    /* Share, not copy: the child references the parent's blocks. */
    for (uint32_t b = 0; b < n_blocks; b++) {
      s->tb[b] = parent->tb[b];
      s->tb[b]->seq_refs++;
      for (uint32_t l = 0; l < L; l++) {
        kvt_lblk *lb = parent->lb[(size_t)b * L + l];
        s->lb[(size_t)b * L + l] = lb;
        s->bs[(size_t)b * L + l] = parent->bs[(size_t)b * L + l];
        s->bs[(size_t)b * L + l].recalled = 0; /* the parent's recall judges its own */
        if (lb) kvt_lblk_ref(e, lb);
      }
    }
    if (s->ss_stride && n_blocks)
      memcpy(s->ss, parent->ss, (size_t)n_blocks * L * s->ss_stride);
    s->n_blocks = n_blocks;
    s->pol = parent->pol;
    s->output = parent->output;
    s->n_tokens = n_blocks == parent->n_blocks ? parent->n_tokens : 0;
    if (lp) memcpy(lp, parent->lp, L * sizeof *lp);
    s->lp = lp;
    lp = NULL;
    kvt_lineage_fork_locked(s, parent);
    seq_link(e, s);
    *out = s;
  }
  pthread_mutex_unlock(&e->lock);
  if (lp) kvt_mem_free(&e->mem, KVT_MEM_SEQ, lp, L * sizeof *lp);
  return rc;
}

void kvt_seq_free_locked(kvt_seq *s) {
  kvt_engine *e = s->e;
  kvt_seq_unpin_locked(s);
  kvt_recall_free_locked(s);
  uint32_t L = s->ns->desc.shape.n_layers;
  for (uint32_t b = 0; b < s->n_blocks; b++) {
    for (uint32_t l = 0; l < L; l++) {
      kvt_lblk *lb = s->lb[(size_t)b * L + l];
      if (lb) kvt_lblk_unref(e, lb);
    }
    s->tb[b]->seq_refs--;
    kvt_tblk_maybe_free(e, s->tb[b]);
  }
  s->prev->next = s->next;
  s->next->prev = s->prev;
  s->ns->n_seqs--;
  e->st.seqs--;
  seq_dealloc(e, s);
}

void kvt_seq_release(kvt_seq *s) {
  if (!s) return;
  kvt_engine *e = s->e;
  pthread_mutex_lock(&e->lock);
  kvt_seq_free_locked(s);
  pthread_mutex_unlock(&e->lock);
}

uint32_t kvt_seq_blocks(const kvt_seq *s) { return s ? s->n_blocks : 0; }

/* ---------- append ---------- */

int kvt_seq_resize(kvt_seq *s, uint32_t cap, uint32_t stride) {
  kvt_engine *e = s->e;
  uint32_t L = s->ns->desc.shape.n_layers;
  if (!cap) { /* nothing appended yet: the stride is all there is */
    s->ss_stride = stride;
    return 0;
  }
  void *p = kvt_mem_calloc(&e->mem, KVT_MEM_SEQ, seq_arrays_size(cap, L, stride));
  if (!p) return -ENOMEM;
  seq_arrays a;
  seq_arrays_carve(p, cap, L, stride, &a);
  void *old = s->cap ? s->tb : NULL;
  size_t old_size = seq_arrays_size(s->cap, L, s->ss_stride);
  pthread_mutex_lock(&e->lock); /* kvt_sync() reads every sequence's tb under it */
  if (s->n_blocks) {
    memcpy(a.tb, s->tb, s->n_blocks * sizeof *a.tb);
    memcpy(a.lb, s->lb, (size_t)s->n_blocks * L * sizeof *a.lb);
    memcpy(a.bs, s->bs, (size_t)s->n_blocks * L * sizeof *a.bs);
    if (stride && stride == s->ss_stride) /* another stride: another scorer, fresh state */
      memcpy(a.ss, s->ss, (size_t)s->n_blocks * L * stride);
  }
  seq_arrays_set(s, &a, cap, stride);
  pthread_mutex_unlock(&e->lock);
  if (old) kvt_mem_free(&e->mem, KVT_MEM_SEQ, old, old_size);
  return 0;
}

/* Grow s to hold one more block. Allocates before taking anything over,
 * so a failure leaves s as it was. Called without the lock: the arrays
 * are the sequence's own (only the swap takes it, for kvt_sync's scan);
 * the byte counters are atomic. */
static int seq_reserve(kvt_seq *s) {
  if (s->n_blocks < s->cap) return 0;
  kvt_engine *e = s->e;
  if (s->cap >= e->opt.max_seq_blocks) return KVT_ELIMIT;
  uint32_t cap = s->cap ? s->cap * 2 : 16;
  if (cap > e->opt.max_seq_blocks) cap = e->opt.max_seq_blocks;
  return kvt_seq_resize(s, cap, s->ss_stride);
}

/* Find or create the token block for key; with the lock held. *spare is a
 * preallocated entry, consumed (set to NULL) when used. */
static kvt_tblk *tblk_get(kvt_engine *e, kvt_seq *s, const kvt_key *key, kvt_tblk **spare) {
  kvt_tblk *tb = kvt_index_find(e, key);
  if (tb || !*spare) return tb;
  tb = *spare;
  *spare = NULL;
  if (tb->ns->dropping) kvt_tblk_drop_wait(tb); /* the store may hold what the drop removes next */
  else tb->cold = (uint8_t)kvt_flush_has_locked(e, key); /* durable from an earlier run, or another path */
  kvt_index_insert(e, tb);
  e->n_tblks++;
  (void)s;
  return tb;
}

int kvt_seq_append(kvt_seq *s, const uint32_t *tokens, uint32_t n_tokens, kvt_append_info *info) {
  if (!s || !tokens) return KVT_ENULL;
  kvt_engine *e = s->e;
  kvt_nsrec *ns = s->ns;
  uint32_t L = ns->desc.shape.n_layers, b = s->n_blocks;
  if (n_tokens != ns->desc.shape.block_tokens)
    return KVT_ERR(e, KVT_ECOUNT, "kvt_seq_append", "n_tokens",
                   "the namespace's block_tokens, one whole block", "%u (block_tokens %u)",
                   n_tokens, ns->desc.shape.block_tokens);
  if (b >= e->opt.max_seq_blocks) return KVT_ELIMIT;
  kvt_key key;
  const kvt_key *parent = b ? &s->tb[b - 1]->key : NULL;
  kvt_lineage_key(s, parent, tokens, n_tokens, &key); /* plain, or under its lineage */
  const size_t tb_size = sizeof(kvt_tblk) + (size_t)L * sizeof(kvt_lblk *);

  /* Allocate what may be needed first, so a failure changes nothing. */
  pthread_mutex_lock(&e->lock);
  int found = kvt_index_find(e, &key) != NULL;
  pthread_mutex_unlock(&e->lock);
  kvt_tblk *spare = found ? NULL : kvt_tblk_alloc(e, ns, &key, parent, b), *tb;
  if (!found && !spare) return -ENOMEM;
  int rc = seq_reserve(s);
  if (rc) {
    kvt_mem_free(&e->mem, KVT_MEM_INDEX, spare, tb_size);
    return rc;
  }
  pthread_mutex_lock(&e->lock);
  while (!(tb = tblk_get(e, s, &key, &spare))) { /* it left the index meanwhile */
    pthread_mutex_unlock(&e->lock);
    if (!(spare = kvt_tblk_alloc(e, ns, &key, parent, b))) return -ENOMEM;
    pthread_mutex_lock(&e->lock);
  }
  tb->seen++;
  tb->prompt |= !s->output;
  tb->seq_refs++;
  s->tb[b] = tb;
  kvt_hot_order_use(e, tb, 0);
  uint32_t present = 0;
  uint64_t mask[KVT_MAX_LAYERS / 64] = {0};
  for (uint32_t l = 0; l < L; l++) {
    kvt_lblk *lb = tb->layers[l];
    s->lb[(size_t)b * L + l] = lb;
    if (lb) {
      kvt_lblk_ref(e, lb);
      if (lb->tier != KVT_TIER_COLD) {
        kvt_tier_lru_touch(&e->tier[lb->tier], lb);
        present++;
        mask[l / 64] |= 1ull << (l % 64);
      }
    }
  }
  e->st.dedup_hits += present;
  s->n_blocks = b + 1;
  for (uint32_t l = 0; present && l < L; l++) kvt_policy_apply_locked(s, l); /* adopted layers */
  int durable = tb->cold;
  kvt_flush_consider(e, tb); /* seen once more: admission may say yes now */
  pthread_mutex_unlock(&e->lock);
  kvt_mem_free(&e->mem, KVT_MEM_INDEX, spare, tb_size); /* unused: found it */
  if (info) {
    info->block = b;
    info->layers_present = present;
    info->key = key;
    info->durable = (uint32_t)durable;
    info->pad = 0;
    memcpy(info->layers_mask, mask, sizeof mask);
  }
  return 0;
}

/* ---------- put ---------- */

static int kv_check(const kvt_seq *s, uint32_t block, uint32_t layer, const kvt_kv *kv) {
  const kvt_shape *sh = &s->ns->desc.shape;
  if (!kv) return KVT_ENULL;
  if (kv->dtype != sh->dtype)
    return KVT_ERR(s->e, KVT_EDTYPE, "kvt_seq_put", "kv.dtype", "the namespace's dtype",
                   "%u (the namespace has %u)", kv->dtype, sh->dtype);
  if (kv->n_tokens != sh->block_tokens)
    return KVT_ERR(s->e, KVT_ESHAPE, "kvt_seq_put", "kv.n_tokens", "the namespace's block_tokens",
                   "%u (the namespace has %u)", kv->n_tokens, sh->block_tokens);
  if (kv->n_heads != sh->n_kv_heads)
    return KVT_ERR(s->e, KVT_ESHAPE, "kvt_seq_put", "kv.n_heads", "the namespace's n_kv_heads",
                   "%u (the namespace has %u)", kv->n_heads, sh->n_kv_heads);
  if (kv->head_dim != sh->head_dim)
    return KVT_ERR(s->e, KVT_ESHAPE, "kvt_seq_put", "kv.head_dim", "the namespace's head_dim",
                   "%u (the namespace has %u)", kv->head_dim, sh->head_dim);
  if (block >= s->n_blocks || layer >= sh->n_layers) return KVT_ENOTFOUND;
  if (kvt_meta_only(s->e)) return 0;
  if (!kv->k || !kv->v) return KVT_ENULL;
  size_t n = s->ns->bytes_each / kvt_dtype_size(sh->dtype);
  int rc = kvt_finite_check(kv->k, n, sh->dtype);
  return rc ? rc : kvt_finite_check(kv->v, n, sh->dtype);
}

/* b is held by s: with VERIFY_DEDUP compare it with kv, outside the lock
 * under a pin. Called and returns with the lock held. */
static void dedup_verify(kvt_engine *e, kvt_lblk *b, const kvt_kv *kv, size_t bytes_each) {
  if (!(e->opt.flags & KVT_OPEN_VERIFY_DEDUP) || !b->payload) return;
  kvt_lblk_pin(e, b);
  pthread_mutex_unlock(&e->lock);
  int differ = memcmp(b->payload, kv->k, bytes_each) != 0 ||
               memcmp(b->payload + bytes_each, kv->v, bytes_each) != 0;
  pthread_mutex_lock(&e->lock);
  kvt_lblk_unpin(e, b);
  e->st.dedup_mismatches += (uint64_t)differ;
}

/* Share the stored layer block b (another sequence's, or one that won a
 * race). With the lock held. */
static void put_share(kvt_engine *e, kvt_lblk **slot, kvt_lblk *b, const kvt_kv *kv, size_t each) {
  kvt_lblk_ref(e, b);
  if (b->tier != KVT_TIER_COLD) kvt_tier_lru_touch(&e->tier[b->tier], b);
  *slot = b;
  e->st.dedup_hits++;
  if (b->tier == KVT_TIER_HOT && !b->approx) dedup_verify(e, b, kv, each);
}

/* Place a new, filled block nb as (tb, layer) in tier, making room. Making
 * room in the hot tier may drop the lock, so the slot is checked again
 * after it. With the lock held; consumes nb. */
static int put_new(kvt_engine *e, kvt_tblk *tb, uint32_t layer, kvt_lblk **slot, kvt_lblk *nb,
                   int tier, const kvt_kv *kv, size_t each) {
  int rc = tier == KVT_TIER_HOT ? kvt_hot_make_room(e, nb->cost)
                                : kvt_tier_drop_for(e, &e->tier[tier], nb->cost);
  kvt_lblk *b = tb->layers[layer];
  if (b || rc) {
    kvt_lblk_free(&e->mem, e->tier[tier].mem_cat, nb);
    if (b) { /* someone stored it meanwhile: share theirs */
      put_share(e, slot, b, kv, each);
      return 0;
    }
    if (rc == KVT_EFULL) e->st.put_full++;
    return rc;
  }
  kvt_publish(e, tb, layer, nb, tier);
  kvt_lblk_ref(e, nb);
  *slot = nb;
  e->tc.puts[tier]++;
  return 0;
}

/* A block that could never fit the hot tier goes straight to warm. */
static int born_warm(const kvt_engine *e, size_t each) {
  return kvt_warm_on(e) &&
         kvt_lblk_desc_bytes() + kvt_mem_round(2 * each) > e->tier[KVT_TIER_HOT].bytes_limit;
}

static kvt_lblk *new_hot(kvt_engine *e, const kvt_kv *kv, size_t each) {
  int with = !kvt_meta_only(e);
  kvt_lblk *nb = kvt_hot_alloc(&e->mem, 2 * (uint64_t)each, with);
  if (nb && with) {
    memcpy(nb->payload, kv->k, each);
    memcpy(nb->payload + each, kv->v, each);
  }
  return nb;
}

static kvt_lblk *new_warm(kvt_seq *s, uint32_t layer, const kvt_kv *kv) {
  kvt_engine *e = s->e;
  kvt_nsrec *ns = s->ns;
  kvt_warm_form f;
  int meta = kvt_meta_only(e);
  pthread_mutex_lock(&e->lock); /* kvt_ns_set_codec() may run meanwhile */
  int kc = ns->k_codec[layer], vc = ns->v_codec[layer];
  pthread_mutex_unlock(&e->lock);
  if (kvt_warm_encode(&e->mem, &ns->lite, meta ? NULL : kv->k, meta ? NULL : kv->v, kc, vc,
                      kvt_layer_seed(ns, layer), &f))
    return NULL;
  kvt_lblk *b = kvt_warm_alloc(&e->mem, 2 * (uint64_t)ns->bytes_each, &f);
  if (!b && f.payload) kvt_mem_free(&e->mem, KVT_MEM_WARM, f.payload, f.alloc);
  return b;
}

/* b is referenced by s but left RAM for the cold tier, and the caller put
 * its bytes again: b gets a RAM copy back (hot, or warm when no block fits
 * the hot tier), so attention and gathers see it. With the lock held; the
 * copy is made without it. 0, KVT_EFULL or -ENOMEM (b stays in cold). */
static int put_restore(kvt_seq *s, kvt_lblk *b, uint32_t layer, const kvt_kv *kv) {
  kvt_engine *e = s->e;
  size_t each = s->ns->bytes_each;
  if (kvt_meta_only(e)) return 0; /* descriptors only: nothing to restore */
  int tier = born_warm(e, each) ? KVT_TIER_WARM : KVT_TIER_HOT;
  kvt_tier_state *t = &e->tier[tier];
  pthread_mutex_unlock(&e->lock);
  kvt_lblk *nb = tier == KVT_TIER_HOT ? new_hot(e, kv, each) : new_warm(s, layer, kv);
  pthread_mutex_lock(&e->lock);
  if (!nb) return -ENOMEM;
  int rc = tier == KVT_TIER_HOT ? kvt_hot_make_room(e, nb->cost)
                                : kvt_tier_drop_for(e, t, nb->cost);
  if (!rc && b->tier == KVT_TIER_COLD && b->pins == 0) { /* (another put may have won) */
    b->payload = nb->payload;
    b->payload_alloc = nb->payload_alloc;
    b->cost = nb->cost;
    b->k_len = nb->k_len;
    b->k_codec = nb->k_codec;
    b->v_codec = nb->v_codec;
    b->checked = nb->checked;
    nb->payload = NULL;
    kvt_mem_move(&e->mem, KVT_MEM_INDEX, t->mem_cat, kvt_lblk_desc_bytes());
    kvt_tier_account(t, b);
    e->tc.promotions[tier]++;
  }
  if (rc == KVT_EFULL) e->st.put_full++;
  kvt_lblk_free(&e->mem, t->mem_cat, nb);
  return rc;
}

static int seq_put(kvt_seq *s, uint32_t block, uint32_t layer, const kvt_kv *kv) {
  int rc = kv_check(s, block, layer, kv);
  if (rc) return rc;
  kvt_engine *e = s->e;
  uint32_t L = s->ns->desc.shape.n_layers;
  size_t each = s->ns->bytes_each;
  kvt_lblk **slot = &s->lb[(size_t)block * L + layer];
  kvt_tblk *tb = s->tb[block];

  pthread_mutex_lock(&e->lock);
  if (*slot) { /* adopted at append, or put before: nothing new to store */
    e->st.puts++;
    e->st.dedup_hits++;
    if ((*slot)->tier == KVT_TIER_HOT && !(*slot)->approx) dedup_verify(e, *slot, kv, each);
    rc = (*slot)->tier == KVT_TIER_COLD ? put_restore(s, *slot, layer, kv) : 0;
    pthread_mutex_unlock(&e->lock);
    return rc;
  }
  if (tb->layers[layer]) {
    e->st.puts++;
    put_share(e, slot, tb->layers[layer], kv, each);
    rc = (*slot)->tier == KVT_TIER_COLD ? put_restore(s, *slot, layer, kv) : 0;
    pthread_mutex_unlock(&e->lock);
    return rc;
  }
  pthread_mutex_unlock(&e->lock);

  if (kvt_born_cold(e, each)) { /* metadata-only, no RAM tier can take it */
    kvt_lblk *nb = new_hot(e, kv, each);
    if (!nb) return -ENOMEM;
    pthread_mutex_lock(&e->lock);
    if (tb->layers[layer]) { /* stored meanwhile: share it */
      kvt_lblk_free(&e->mem, KVT_MEM_HOT, nb);
      put_share(e, slot, tb->layers[layer], kv, each);
    } else {
      kvt_publish_cold(e, tb, layer, nb);
      kvt_lblk_ref(e, nb);
      *slot = nb;
    }
    e->st.puts++;
    pthread_mutex_unlock(&e->lock);
    return 0;
  }
  /* Allocate and copy (or encode) outside the lock, then publish. */
  int tier = born_warm(e, each) ? KVT_TIER_WARM : KVT_TIER_HOT;
  kvt_lblk *nb = tier == KVT_TIER_HOT ? new_hot(e, kv, each) : new_warm(s, layer, kv);
  if (!nb) return -ENOMEM;
  pthread_mutex_lock(&e->lock);
  rc = put_new(e, tb, layer, slot, nb, tier, kv, each);
  if (!rc) e->st.puts++;
  pthread_mutex_unlock(&e->lock);
  return rc;
}

/* A put may take the layer over the policy's budget: apply it. */
int kvt_seq_put(kvt_seq *s, uint32_t block, uint32_t layer, const kvt_kv *kv) {
  if (!s) return KVT_ENULL;
  int rc = seq_put(s, block, layer, kv);
  if (!rc) kvt_policy_on_put(s, block, layer, kv); /* retained again */
  if (rc || (!s->lp && !s->lossy)) return rc;
  pthread_mutex_lock(&s->e->lock);
  if (s->lossy) kvt_lineage_on_put_locked(s, block);
  kvt_policy_apply_locked(s, layer);
  pthread_mutex_unlock(&s->e->lock);
  return 0;
}

/* ---------- reads ---------- */

static void count_read(kvt_engine *e, const kvt_lblk *b) {
  e->st.reads++;
  e->tc.reads[b->tier]++;
  if (b->tier == KVT_TIER_HOT && !b->approx) e->st.reads_exact++;
  else e->st.reads_approx++;
}


/* Read (key, layer) from the cold tier. A record that fails a check is
 * KVT_ECORRUPT for this read and a miss from then on: the cold tier took
 * it out of the index (only if the index still pointed at what failed: a
 * block relocated meanwhile is read where it is), and the token block is
 * no longer durable. */
static int read_cold(kvt_engine *e, kvt_tblk *tb, const kvt_key *key, uint32_t layer, void *k_out,
                     void *v_out, size_t each) {
  int rc = kvt_store_read_layer(e->store, key, layer, k_out, v_out, each);
  if (rc != KVT_ECORRUPT) return rc;
  if (tb) {
    pthread_mutex_lock(&e->lock);
    tb->lost |= tb->cold;
    tb->cold = 0;
    pthread_mutex_unlock(&e->lock);
  }
  return KVT_ECORRUPT;
}

int kvt_seq_read(kvt_seq *s, uint32_t block, uint32_t layer, void *k_out, void *v_out,
                 size_t bytes_each) {
  if (!s || !k_out || !v_out) return KVT_ENULL;
  kvt_engine *e = s->e;
  uint32_t L = s->ns->desc.shape.n_layers;
  if (block >= s->n_blocks || layer >= L) return KVT_ENOTFOUND;
  if (kvt_meta_only(e)) return KVT_ENOPAYLOAD;
  if (bytes_each != s->ns->bytes_each)
    return KVT_ERR(e, KVT_EBUFSIZE, "kvt_seq_read", "bytes_each",
                   "the bytes of K in one layer block", "%zu (a layer block's K takes %zu)",
                   bytes_each, s->ns->bytes_each);
  kvt_lblk *b = s->lb[(size_t)block * L + layer];
  kvt_tblk *tb = s->tb[block];
  pthread_mutex_lock(&e->lock);
  int in_ram = b && b->tier != KVT_TIER_COLD, cold = tb->cold;
  if (in_ram) kvt_lblk_pin(e, b);
  if (in_ram) kvt_lineage_check_locked(s, &b, 1); /* approximate bytes make s lossy */
  pthread_mutex_unlock(&e->lock);
  if (!in_ram) return cold ? read_cold(e, tb, &tb->key, layer, k_out, v_out, bytes_each)
                           : KVT_ENOTFOUND;
  int rc = kvt_lblk_copy_out(s->ns, b, k_out, v_out);
  pthread_mutex_lock(&e->lock);
  count_read(e, b);
  kvt_lblk_unpin(e, b);
  pthread_mutex_unlock(&e->lock);
  return rc;
}

/* Retained blocks of (s, layer): every block the sequence references in
 * that layer that is in RAM (hot or warm); what the policy evicted is no
 * longer referenced (policy.c). With the lock held: pins them and lists them in blk (room for
 * s->n_blocks) when blk is not NULL; returns how many. */
size_t kvt_retained_pin(kvt_seq *s, uint32_t layer, kvt_lblk **blk, uint32_t *idx) {
  uint32_t L = s->ns->desc.shape.n_layers;
  size_t n = 0;
  for (uint32_t b = 0; b < s->n_blocks; b++) {
    kvt_lblk *lb = s->lb[(size_t)b * L + layer];
    if (!lb || lb->tier == KVT_TIER_COLD) continue;
    if (blk) {
      kvt_lblk_pin(s->e, lb);
      blk[n] = lb;
      if (idx) idx[n] = b;
    }
    n++;
  }
  return n;
}

void kvt_retained_unpin(kvt_engine *e, kvt_lblk **blk, size_t n) {
  for (size_t i = 0; i < n; i++) kvt_lblk_unpin(e, blk[i]);
}

int kvt_seq_away(const kvt_seq *s, uint32_t block, uint32_t layer) {
  size_t i = (size_t)block * s->ns->desc.shape.n_layers + layer;
  const kvt_lblk *lb = s->lb[i];
  const kvt_tblk *tb = s->tb[block];
  return lb ? lb->tier == KVT_TIER_COLD : (tb->cold || tb->lost) && !s->bs[i].left;
}

uint32_t kvt_seq_nonresident(const kvt_seq *s, uint32_t layer) {
  uint32_t n = 0;
  for (uint32_t b = 0; b < s->n_blocks; b++) n += (uint32_t)kvt_seq_away(s, b, layer);
  return n;
}

int kvt_seq_gather(kvt_seq *s, uint32_t layer, void *k_out, void *v_out, size_t *bytes_each,
                   kvt_gathered *blocks, size_t max_blocks, size_t *n_blocks) {
  if (!s || !bytes_each || !n_blocks) return KVT_ENULL;
  kvt_engine *e = s->e;
  uint32_t L = s->ns->desc.shape.n_layers;
  if (layer >= L) return KVT_ENOTFOUND;
  size_t each = s->ns->bytes_each;
  if (!k_out) { /* size query: blocks only on disk will be brought back */
    pthread_mutex_lock(&e->lock);
    *n_blocks = kvt_seq_nonresident(s, layer) + kvt_retained_pin(s, layer, NULL, NULL);
    pthread_mutex_unlock(&e->lock);
    *bytes_each = *n_blocks * each;
    return 0;
  }
  if (!v_out) return KVT_ENULL;
  if (kvt_meta_only(e)) return KVT_ENOPAYLOAD;
  size_t arr = (size_t)s->n_blocks * (sizeof(kvt_lblk *) + sizeof(uint32_t)) + 1;
  kvt_lblk **blk = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, arr);
  if (!blk) return -ENOMEM;
  uint32_t *idx = (uint32_t *)(blk + s->n_blocks);
  kvt_promo *hold = NULL; /* blocks only on disk, brought back (promote.c) */
  int rc = kvt_promote_hold(s, layer, &hold);
  if (rc) {
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, blk, arr);
    return rc;
  }
  pthread_mutex_lock(&e->lock);
  uint32_t away = kvt_seq_nonresident(s, layer);
  size_t n = away ? 0 : kvt_retained_pin(s, layer, blk, idx), need = n * each;
  rc = away ? KVT_ENOTRESIDENT
            : (*bytes_each < need || (blocks && max_blocks < n)) ? KVT_EBUFSIZE : 0;
  if (rc) kvt_retained_unpin(e, blk, n);
  else kvt_lineage_check_locked(s, blk, n); /* approximate bytes make s lossy */
  pthread_mutex_unlock(&e->lock);
  int why = kvt_promote_why(hold);
  kvt_promote_release(e, hold);
  *n_blocks = away ? away : n;
  if (rc == KVT_EBUFSIZE && *bytes_each < need)
    KVT_ERR(e, rc, "kvt_seq_gather", "bytes_each", "room for every retained block",
            "%zu (%zu blocks need %zu)", *bytes_each, n, need);
  else if (rc == KVT_EBUFSIZE)
    KVT_ERR(e, rc, "kvt_seq_gather", "max_blocks", "at least the retained blocks",
            "%zu (%zu retained)", max_blocks, n);
  else if (rc == KVT_ENOTRESIDENT)
    KVT_ERR(e, rc, "kvt_seq_gather", "layer", "every referenced block in RAM",
            "%u blocks on disk (%s)", away, kvt_promote_reason(why));
  if (!rc) {
    uint32_t bt = s->ns->desc.shape.block_tokens;
    for (size_t i = 0; i < n && !rc; i++) {
      const kvt_lblk *lb = blk[i];
      rc = kvt_lblk_copy_out(s->ns, lb, (uint8_t *)k_out + i * each, (uint8_t *)v_out + i * each);
      if (blocks)
        blocks[i] = (kvt_gathered){.block = idx[i], .token_pos = idx[i] * bt, .tier = lb->tier,
                                   .exact = lb->tier == KVT_TIER_HOT && !lb->approx};
    }
    pthread_mutex_lock(&e->lock);
    for (size_t i = 0; i < n; i++) count_read(e, blk[i]);
    kvt_retained_unpin(e, blk, n);
    pthread_mutex_unlock(&e->lock);
  }
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, blk, arr);
  *bytes_each = need;
  return rc;
}

/* ---------- loads ---------- */

/* A request's status while its block is to be read from the cold tier. */
#define LOAD_FROM_COLD 1

void kvt_load_free_locked(kvt_load *ld) {
  kvt_engine *e = ld->e;
  if (ld->back) *ld->back = NULL; /* a recall's: its sequence forgets it */
  kvt_promote_load_free_locked(ld); /* a prefetch: its own blocks */
  kvt_store_read_wait(ld->cb); /* the reader writes into cr and the caller's buffers */
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, ld->cr, ld->n_cr * (sizeof *ld->cr + sizeof *ld->cr_idx));
  for (size_t i = 0; i < ld->n; i++)
    if (ld->blk[i]) kvt_lblk_unpin(e, ld->blk[i]);
  ld->prev->next = ld->next;
  ld->next->prev = ld->prev;
  ld->ns->n_loads--;
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, ld->blk, ld->n * sizeof *ld->blk);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, ld, sizeof *ld);
}

static int load_req_check(const kvt_load_req *r, size_t each, uint32_t L) {
  if (!r->k_out || !r->v_out) return KVT_ENULL;
  if (r->bytes_each != each) return KVT_EBUFSIZE;
  return r->layer < L ? 0 : KVT_ENOTFOUND;
}

/* Start the reads of the requests that are not in RAM. If that fails they
 * are read one by one in kvt_load_wait() instead. */
static int load_cold_submit(kvt_engine *e, kvt_load *ld) {
  size_t n = 0;
  for (size_t i = 0; i < ld->n; i++) n += ld->reqs[i].status == LOAD_FROM_COLD;
  if (!n) return 0;
  size_t bytes = n * (sizeof *ld->cr + sizeof *ld->cr_idx);
  kvt_store_read *cr = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, bytes);
  if (!cr) return 0;
  uint32_t *idx = (uint32_t *)(cr + n);
  for (size_t i = 0, j = 0; i < ld->n; i++) {
    kvt_load_req *r = &ld->reqs[i];
    if (r->status != LOAD_FROM_COLD) continue;
    cr[j] = (kvt_store_read){.key = r->key, .layer = r->layer, .k_out = r->k_out,
                            .v_out = r->v_out, .bytes_each = ld->ns->bytes_each};
    idx[j++] = (uint32_t)i;
  }
  if (kvt_store_read_submit(e->store, cr, n, &ld->cb)) {
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, cr, bytes);
    return 0;
  }
  ld->cr = cr;
  ld->cr_idx = idx;
  ld->n_cr = n;
  return 0;
}

/* Statuses of the cold reads: a record that failed a check is
 * KVT_ECORRUPT here and a miss for lookups from now on (the cold tier
 * took it out of the index if the index still pointed there). */
static void load_cold_finish(kvt_engine *e, kvt_load *ld) {
  kvt_store_read_wait(ld->cb);
  ld->cb = NULL;
  for (size_t j = 0; j < ld->n_cr; j++) {
    kvt_load_req *r = &ld->reqs[ld->cr_idx[j]];
    int st = ld->cr[j].status;
    if (st == KVT_ECORRUPT) { /* no longer durable */
      pthread_mutex_lock(&e->lock);
      kvt_tblk *tb = kvt_index_find(e, &r->key);
      if (tb) {
        tb->lost |= tb->cold;
        tb->cold = 0;
      }
      pthread_mutex_unlock(&e->lock);
    }
    r->status = st;
    r->tier = KVT_TIER_COLD;
  }
}

int kvt_load_submit(kvt_engine *e, kvt_ns_id id, kvt_load_req *reqs, size_t n, kvt_load **out) {
  if (!e || !reqs || !out) return KVT_ENULL;
  *out = NULL;
  if (n == 0 || n > e->opt.max_load_reqs)
    return KVT_ERR(e, KVT_ECOUNT, "kvt_load_submit", "n", "1..max_load_reqs",
                   "%zu (max_load_reqs %u)", n, e->opt.max_load_reqs);
  if (kvt_meta_only(e)) return KVT_ENOPAYLOAD;
  kvt_load *ld = kvt_mem_calloc(&e->mem, KVT_MEM_OTHER, sizeof *ld);
  kvt_lblk **blk = kvt_mem_calloc(&e->mem, KVT_MEM_OTHER, n * sizeof *blk);
  int rc;
  if (!ld || !blk) {
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, ld, sizeof *ld);
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, blk, n * sizeof *blk);
    return -ENOMEM;
  }
  pthread_mutex_lock(&e->lock);
  kvt_nsrec *ns = kvt_ns_find(e, id);
  if (!ns) {
    pthread_mutex_unlock(&e->lock);
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, ld, sizeof *ld);
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, blk, n * sizeof *blk);
    return KVT_ENOTFOUND;
  }
  uint32_t L = ns->desc.shape.n_layers;
  for (size_t i = 0; i < n; i++) {
    kvt_load_req *r = &reqs[i];
    r->tier = KVT_TIER_NONE;
    r->status = load_req_check(r, ns->bytes_each, L);
    if (r->status) continue;
    kvt_tblk *tb = kvt_index_find(e, &r->key);
    kvt_lblk *b = (tb && tb->ns == ns) ? tb->layers[r->layer] : NULL;
    if (!b || b->tier == KVT_TIER_COLD) {
      /* Not in RAM: read from the cold tier in kvt_load_wait(). */
      r->status = kvt_store_payload(e) ? LOAD_FROM_COLD : KVT_ENOTFOUND;
      continue;
    }
    kvt_lblk_pin(e, b);
    kvt_tier_lru_touch(&e->tier[b->tier], b);
    blk[i] = b;
  }
  *ld = (kvt_load){.e = e, .ns = ns, .reqs = reqs, .blk = blk, .n = n};
  ld->next = e->loads.next;
  ld->prev = &e->loads;
  e->loads.next->prev = ld;
  e->loads.next = ld;
  ns->n_loads++;
  pthread_mutex_unlock(&e->lock);
  *out = ld;
  rc = load_cold_submit(e, ld);
  if (!ld->cb) kvt_event_signal(e); /* nothing to wait for: complete now */
  return rc;
}

int kvt_load_wait(kvt_load *ld, size_t *n_ok) {
  if (!ld) return KVT_ENULL;
  if (ld->promo) return kvt_promote_load_wait(ld, n_ok);
  kvt_engine *e = ld->e;
  size_t ok = 0, first_i = 0;
  int first = 0;
  if (ld->cb) load_cold_finish(e, ld);
  for (size_t i = 0; i < ld->n; i++) {
    kvt_load_req *r = &ld->reqs[i];
    if (r->status == LOAD_FROM_COLD) { /* not submitted: read it now */
      r->status = read_cold(e, NULL, &r->key, r->layer, r->k_out, r->v_out, ld->ns->bytes_each);
      r->tier = KVT_TIER_COLD;
    }
    if (r->tier == KVT_TIER_COLD) {
      ok += r->status == 0;
    } else if (ld->blk[i]) {
      r->status = kvt_lblk_copy_out(ld->ns, ld->blk[i], r->k_out, r->v_out);
      r->tier = ld->blk[i]->tier;
      ok += r->status == 0;
    }
    if (r->status && !first) {
      first = r->status;
      first_i = i;
    }
  }
  if (first == KVT_EBUFSIZE)
    KVT_ERR(e, first, "kvt_load_wait", "reqs[i].bytes_each", "the bytes of K in one layer block",
            "%zu in request %zu (a layer block's K takes %zu)", ld->reqs[first_i].bytes_each,
            first_i, ld->ns->bytes_each);
  pthread_mutex_lock(&e->lock);
  for (size_t i = 0; i < ld->n; i++)
    if (ld->blk[i] && ld->reqs[i].status == 0) count_read(e, ld->blk[i]);
  kvt_load_free_locked(ld);
  pthread_mutex_unlock(&e->lock);
  if (n_ok) *n_ok = ok;
  return first;
}
