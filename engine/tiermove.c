/* tiermove.c - the policy's moves of a referenced layer block between the
 * RAM tiers, in place (every sequence that references the block sees it
 * move): warm -> hot with the exact bytes read from the cold tier when the
 * token block is durable there, else dequantized from the warm form and
 * marked approximate. hot -> warm is engine.c's demotion. */
#include <errno.h>
#include <string.h>

#include "engine/internal.h"

/* A read of the cold tier failed its check: the token block is no longer
 * durable (as seq.c's reads say). With the lock held. */
static void cold_lost(kvt_tblk *tb) {
  tb->lost |= tb->cold;
  tb->cold = 0;
}

/* Fill f (a fresh hot block) with b's bytes: exact from the cold tier when
 * durable, else decoded from b's warm payload (b pinned). Without the
 * lock. 0 and *exact, or an error. */
static int fill_hot(kvt_engine *e, const kvt_nsrec *ns, const kvt_lblk *b, const kvt_key *key,
                    int durable, kvt_lblk *f, int *exact, int *corrupt) {
  size_t each = ns->bytes_each;
  *exact = 0;
  *corrupt = 0;
  if (!f->payload) { /* metadata-only: sizes move, no bytes */
    *exact = durable;
    return 0;
  }
  if (durable && kvt_store_payload(e)) {
    int rc = kvt_store_read_layer(e->store, key, b->layer, f->payload, f->payload + each, each);
    if (!rc) {
      *exact = 1;
      return 0;
    }
    *corrupt = rc == KVT_ECORRUPT;
  }
  return kvt_warm_decode(&ns->lite, b, kvt_layer_seed(ns, b->layer), f->payload,
                         f->payload + each);
}

/* Move f's payload into b (warm -> hot). With the lock held. */
static void install_hot(kvt_engine *e, kvt_lblk *b, kvt_lblk *f, int exact) {
  kvt_tier_state *warm = &e->tier[KVT_TIER_WARM], *hot = &e->tier[KVT_TIER_HOT];
  kvt_tier_unaccount(warm, b);
  kvt_payload_free(&e->mem, KVT_MEM_WARM, b);
  kvt_mem_move(&e->mem, KVT_MEM_WARM, KVT_MEM_HOT, kvt_lblk_desc_bytes());
  b->payload = f->payload;
  b->payload_alloc = f->payload_alloc;
  b->cost = f->cost;
  b->k_len = 0;
  b->k_codec = b->v_codec = KVT_CODEC_NONE;
  b->checked = 0;
  b->approx = (uint8_t)!exact;
  f->payload = NULL;
  kvt_tier_account(hot, b);
  e->tc.promotions[KVT_TIER_HOT]++;
}

int kvt_lblk_promote(kvt_engine *e, kvt_lblk *b, int *exact) {
  kvt_nsrec *ns = b->tb->ns;
  kvt_tier_state *warm = &e->tier[KVT_TIER_WARM];
  *exact = 0;
  if (b->tier != KVT_TIER_WARM || b->busy || b->pins || b->refs == 0) return KVT_ESTATE;
  kvt_key key = b->tb->key;
  int durable = b->tb->cold && !b->tb->lost;
  int meta = kvt_meta_only(e);
  b->busy = 1;
  kvt_lblk_pin(e, b);
  pthread_mutex_unlock(&e->lock);
  /* a scratch descriptor: install_hot keeps only its payload */
  kvt_lblk fresh, *f = &fresh;
  int ex = 0, corrupt = 0;
  int rc = kvt_hot_init(&e->mem, f, 2 * (uint64_t)ns->bytes_each, !meta)
               ? -ENOMEM
               : fill_hot(e, ns, b, &key, durable, f, &ex, &corrupt);
  pthread_mutex_lock(&e->lock);
  b->busy = 0;
  kvt_tier_unpin(warm, b); /* not kvt_lblk_unpin: s still references b */
  if (corrupt) cold_lost(b->tb);
  /* Room in the hot tier (may drop the lock: b, warm, is not a victim). */
  if (!rc) rc = kvt_hot_make_room(e, f->cost);
  /* Someone else pinned it meanwhile (a reader copies the warm payload),
   * or it moved, or another sequence took a reference (a dedup append, a
   * recall): leave it as it is. */
  if (!rc && (b->tier != KVT_TIER_WARM || b->pins || b->busy || b->refs != 1)) rc = KVT_ESTATE;
  if (!rc) install_hot(e, b, f, ex);
  kvt_payload_free(&e->mem, KVT_MEM_HOT, f); /* when not installed */
  *exact = ex;
  return rc;
}
