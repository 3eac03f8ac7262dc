/* engine_place.c - placement of layer blocks in RAM: references and
 * pins, leaving for the cold tier, dropping and demoting to make room,
 * publishing a block into a tier, and dropping a token block. */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/internal.h"
#include "codec/codec.h"

/* ---------- layer blocks ---------- */

static void lblk_destroy(kvt_engine *e, kvt_lblk *b) {
  kvt_tier_state *t = &e->tier[b->tier];
  kvt_tblk *tb = b->tb;
  assert(b->refs == 0 && b->pins == 0 && tb->layers[b->layer] == b);
  tb->layers[b->layer] = NULL;
  tb->n_present--;
  if (b->tier == KVT_TIER_COLD) { /* a descriptor only: its bytes are on disk */
    kvt_lblk_free(&e->mem, KVT_MEM_INDEX, b);
  } else {
    if (b->on_lru) kvt_tier_lru_remove(t, b);
    kvt_tier_unaccount(t, b);
    kvt_lblk_free(&e->mem, t->mem_cat, b);
  }
  kvt_tblk_maybe_free(e, tb);
}

/* A referenced block whose token block is durable leaves RAM: its payload
 * goes, its descriptor stays (sequences point to it) with tier COLD, and
 * reads of it go to the cold tier. */
static void to_cold(kvt_engine *e, kvt_lblk *b) {
  kvt_tier_state *t = &e->tier[b->tier];
  assert(b->refs > 0 && b->pins == 0 && !b->on_lru && b->tb->cold);
  kvt_tier_unaccount(t, b);
  kvt_payload_free(&e->mem, t->mem_cat, b);
  kvt_mem_move(&e->mem, t->mem_cat, KVT_MEM_INDEX, kvt_lblk_desc_bytes());
  b->tier = KVT_TIER_COLD;
  b->cost = 0;
  b->approx = 0;
  t->evictions++;
}

/* Oldest referenced block of t that may leave RAM for the cold tier. */
static kvt_lblk *durable_victim(kvt_tier_state *t) {
  for (kvt_lblk *b = t->all.all_next; b != &t->all; b = b->all_next)
    if (b->pins == 0 && !b->busy && b->refs > 0 && b->tb->cold) return b;
  return NULL;
}

void kvt_lblk_ref(kvt_engine *e, kvt_lblk *b) {
  if (b->refs++ == 0) {
    if (b->on_lru) kvt_tier_lru_remove(&e->tier[b->tier], b);
  } else {
    e->st.dedup_saved_bytes += b->payload_bytes;
  }
  e->st.logical_bytes += b->payload_bytes;
}

/* The last reference gone: cached for reuse (LRU), or freed when its token
 * block was dropped and it is no longer pinned. */
static void lblk_idle(kvt_engine *e, kvt_lblk *b) {
  if (b->held && !b->tb->queued) { /* nobody needs it written any more */
    b->held = 0;
    kvt_tier_unpin(&e->tier[b->tier], b);
  }
  if (!b->tb->indexed || b->tier == KVT_TIER_COLD) {
    if (b->pins == 0) lblk_destroy(e, b);
  } else {
    kvt_tier_lru_push(&e->tier[b->tier], b);
  }
}

void kvt_lblk_unref(kvt_engine *e, kvt_lblk *b) {
  assert(b->refs > 0);
  e->st.logical_bytes -= b->payload_bytes;
  if (--b->refs > 0) e->st.dedup_saved_bytes -= b->payload_bytes;
  else lblk_idle(e, b);
}

void kvt_lblk_pin(kvt_engine *e, kvt_lblk *b) { kvt_tier_pin(&e->tier[b->tier], b); }

void kvt_lblk_unpin(kvt_engine *e, kvt_lblk *b) {
  kvt_tier_unpin(&e->tier[b->tier], b);
  if (b->pins == 0 && b->refs == 0 && (!b->tb->indexed || b->tier == KVT_TIER_COLD))
    lblk_destroy(e, b);
}

/* Drop the hot layers of tb no sequence references or pins (tb stays
 * while it holds a layer elsewhere or a sequence holds it). */
static void drop_idle_hot(kvt_engine *e, kvt_tblk *tb) {
  kvt_tier_state *hot = &e->tier[KVT_TIER_HOT];
  tb->seq_refs++; /* keep tb while its layers go */
  for (uint32_t l = 0; l < tb->n_layers; l++) {
    kvt_lblk *b = tb->layers[l];
    if (b && b->tier == KVT_TIER_HOT && b->on_lru && b->pins == 0) {
      hot->evictions++;
      lblk_destroy(e, b);
    }
  }
  tb->seq_refs--;
  kvt_tblk_maybe_free(e, tb);
}

/* Without a cold tier: drop unreferenced blocks of t, least recent first
 * (the hot tier: in its order, kvt_options.hot_evict),
 * until cost fits, checking first so that a refusal changes nothing.
 * With one: also let durable referenced blocks leave RAM, and wait for the
 * flusher when what pins the tier is waiting to be written. */
int kvt_tier_drop_for(kvt_engine *e, kvt_tier_state *t, uint64_t cost) {
  if (!kvt_store_any(e) && !kvt_tier_can_fit(t, cost)) return KVT_EFULL;
  if (cost > t->bytes_limit) return KVT_EFULL;
  while (t->bytes_used + cost > t->bytes_limit) {
    kvt_tblk *vt = t->tier == KVT_TIER_HOT ? kvt_hot_order_victim(e) : NULL;
    if (vt) { /* the hot tier's order (hot_order.c): all its idle layers go */
      drop_idle_hot(e, vt);
      continue;
    }
    kvt_lblk *v = kvt_tier_lru_victim(t);
    if (v) {
      t->evictions++;
      lblk_destroy(e, v);
    } else if ((v = durable_victim(t))) {
      to_cold(e, v);
    } else if (kvt_flush_on(e) && (kvt_flush_pending(e) || e->drops)) {
      kvt_flush_wait_room(e); /* a drop in progress holds its namespace's writes */
    } else {
      return KVT_EFULL;
    }
  }
  return 0;
}

/* Move hot block b to the warm tier. Encodes outside the lock while b is
 * pinned and marked busy (so no other thread demotes it too). */
static int demote(kvt_engine *e, kvt_lblk *b) {
  kvt_tier_state *hot = &e->tier[KVT_TIER_HOT], *warm = &e->tier[KVT_TIER_WARM];
  kvt_nsrec *ns = b->tb->ns;
  uint32_t l = b->layer;
  int kc = ns->k_codec[l], vc = ns->v_codec[l]; /* kvt_ns_set_codec() writes them locked */
  kvt_warm_form f;
  b->busy = 1;
  kvt_lblk_pin(e, b);
  pthread_mutex_unlock(&e->lock);
  const uint8_t *k = b->payload, *v = k ? k + ns->bytes_each : NULL;
  int rc = kvt_warm_encode(&e->mem, &ns->lite, k, v, kc, vc, kvt_layer_seed(ns, l), &f);
  pthread_mutex_lock(&e->lock);
  b->busy = 0;
  kvt_tier_unpin(hot, b); /* not kvt_lblk_unpin: b is still needed here */
  if (b->refs == 0 && b->pins == 0 && !b->tb->indexed) { /* dropped while we encoded */
    if (f.payload) kvt_mem_free(&e->mem, KVT_MEM_WARM, f.payload, f.alloc);
    lblk_destroy(e, b);
    return rc;
  }
  if (b->pins > 0) { /* a reader pinned it meanwhile and may be copying it */
    if (f.payload) kvt_mem_free(&e->mem, KVT_MEM_WARM, f.payload, f.alloc);
    return rc;
  }
  uint64_t cost = kvt_lblk_desc_bytes() + f.alloc;
  if (!rc) rc = kvt_tier_drop_for(e, warm, cost);
  if (rc) {
    if (f.payload) kvt_mem_free(&e->mem, KVT_MEM_WARM, f.payload, f.alloc);
    /* Warm cannot take it: an unreferenced block is dropped instead. */
    if (rc == KVT_EFULL && b->refs == 0) {
      hot->evictions++;
      lblk_destroy(e, b);
      return 0;
    }
    return rc;
  }
  int listed = b->on_lru;
  if (listed) kvt_tier_lru_remove(hot, b);
  kvt_tier_unaccount(hot, b);
  kvt_payload_free(&e->mem, KVT_MEM_HOT, b);
  kvt_mem_move(&e->mem, KVT_MEM_HOT, KVT_MEM_WARM, kvt_lblk_desc_bytes());
  b->payload = f.payload;
  b->payload_alloc = f.alloc;
  b->k_len = f.k_len;
  b->k_codec = f.k_codec;
  b->v_codec = f.v_codec;
  b->checked = f.checked;
  b->cost = cost;
  kvt_tier_account(warm, b);
  if (listed) kvt_tier_lru_push(warm, b);
  e->st.demotions++;
  return 0;
}

int kvt_lblk_demote(kvt_engine *e, kvt_lblk *b) {
  if (b->tier != KVT_TIER_HOT || b->busy || b->pins) return KVT_ESTATE;
  int rc = demote(e, b);
  return rc ? rc : b->tier == KVT_TIER_WARM ? 0 : KVT_ESTATE;
}

/* Oldest hot block held for the cold tier whose token block is not queued
 * (not complete in the hot tier), pinned by nothing else; or NULL. */
static kvt_lblk *held_victim(kvt_tier_state *t) {
  for (kvt_lblk *b = t->all.all_next; b != &t->all; b = b->all_next)
    if (b->held && b->pins == 1 && !b->busy && !b->tb->queued) return b;
  return NULL;
}

int kvt_hot_make_room(kvt_engine *e, uint64_t cost) {
  kvt_tier_state *hot = &e->tier[KVT_TIER_HOT];
  if (!kvt_warm_on(e)) return kvt_tier_drop_for(e, hot, cost);
  if (cost > hot->bytes_limit) return KVT_EFULL;
  while (hot->bytes_used + cost > hot->bytes_limit) {
    kvt_lblk *v = kvt_tier_oldest(hot);
    if (!v && kvt_flush_on(e) && (kvt_flush_pending(e) || e->drops)) { /* what is written lets go */
      kvt_flush_wait_room(e);
      continue;
    }
    if (!v && (v = held_victim(hot))) {
      /* The hot tier cannot hold its token block whole, so it can never be
       * written exactly: it goes warm, and kvt_sync says so. */
      v->held = 0;
      kvt_tier_unpin(hot, v);
      v->tb->cold_err = KVT_ENOTDURABLE;
    }
    if (!v) return KVT_EFULL; /* everything left is pinned or being moved */
    int rc = demote(e, v);
    if (rc) return rc;
  }
  return 0;
}

int kvt_publish(kvt_engine *e, kvt_tblk *tb, uint32_t layer, kvt_lblk *b, int tier) {
  assert(!tb->layers[layer]);
  b->tb = tb;
  b->layer = layer;
  kvt_tier_account(&e->tier[tier], b);
  tb->layers[layer] = b;
  tb->n_present++;
  /* Held unless the rule rules it out for now (output under
   * KVT_ADMIT_PROMPT); a block short of min_seen is held, to be written
   * if it is seen again while referenced. */
  int maybe = e->opt.cold_admit != KVT_ADMIT_PROMPT || tb->prompt;
  if (kvt_flush_on(e) && !tb->cold && tier == KVT_TIER_HOT && b->payload && maybe) {
    b->held = 1; /* keep the exact bytes until they are written */
    kvt_lblk_pin(e, b);
  }
  if (kvt_flush_on(e) && !tb->cold && tier == KVT_TIER_WARM && kvt_flush_admissible(e, tb))
    tb->cold_err = KVT_ENOTDURABLE; /* born warm: no exact copy to write */
  kvt_flush_consider(e, tb);
  return 0;
}

int kvt_born_cold(const kvt_engine *e, size_t each) {
  return (kvt_store_caps(e->store) & KVT_STORE_INLINE) && !kvt_warm_on(e) &&
         kvt_lblk_desc_bytes() + kvt_mem_round(2 * each) > e->tier[KVT_TIER_HOT].bytes_limit;
}

void kvt_publish_cold(kvt_engine *e, kvt_tblk *tb, uint32_t layer, kvt_lblk *b) {
  assert(!tb->layers[layer] && !b->payload);
  b->tb = tb;
  b->layer = layer;
  b->tier = KVT_TIER_COLD;
  b->cost = 0; /* nothing in RAM: like a block that left for the cold tier */
  kvt_mem_move(&e->mem, KVT_MEM_HOT, KVT_MEM_INDEX, kvt_lblk_desc_bytes());
  tb->layers[layer] = b;
  tb->n_present++;
  kvt_flush_consider(e, tb);
}

int kvt_lblk_copy_out(const kvt_nsrec *ns, const kvt_lblk *b, void *k_out, void *v_out) {
  size_t each = ns->bytes_each;
  if (b->tier == KVT_TIER_COLD) return KVT_ENOTFOUND; /* the caller reads the cold tier */
  if (b->tier == KVT_TIER_WARM)
    return kvt_warm_decode(&ns->lite, b, kvt_layer_seed(ns, b->layer), k_out, v_out);
  memcpy(k_out, b->payload, each);
  memcpy(v_out, b->payload + each, each);
  return 0;
}

/* Remove tb from the index with every layer it holds: layers nobody holds
 * are freed now, the others when their last reference or pin goes. */
void kvt_drop_tblk(kvt_engine *e, kvt_tblk *tb) {
  if (tb->indexed) {
    kvt_index_remove(e, tb);
    e->n_tblks--;
  }
  tb->seq_refs++; /* keep tb alive while its layers go */
  for (uint32_t l = 0; l < tb->n_layers; l++) {
    kvt_lblk *b = tb->layers[l];
    if (b && b->refs == 0 && b->pins == 0) lblk_destroy(e, b);
  }
  tb->seq_refs--;
  kvt_tblk_maybe_free(e, tb);
}
