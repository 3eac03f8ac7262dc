/* hot_order.c - the order in which the hot tier gives up the token blocks
 * it keeps for reuse (layers no sequence references): the same module as
 * the cold tier's (tiers/evict.h), chosen by kvt_options.hot_evict. */
#include <assert.h>
#include <errno.h>
#include <sched.h>

#include "engine/internal.h"
#include "tiers/evict.h"

/* Token blocks are tracked while indexed with a layer in the hot tier: a
 * token block is the unit a lookup finds, so its layers go together. The
 * first layer in is its write (an access for LEARNED's model), the last
 * out ends its entry (the model remembers it, as the cold tier's does). */
static void hot_moved(void *arg, kvt_lblk *b, int in) {
  kvt_engine *e = arg;
  kvt_tblk *tb = b->tb;
  if (in) {
    if (tb->n_hot++ || !tb->indexed || tb->hot_tracked) return;
    uint64_t bytes = (uint64_t)tb->n_layers * 2 * tb->ns->bytes_each;
    int rc = kvt_evict_add(e->hot_ev, &tb->key, &tb->parent, bytes);
    /* -ENOMEM: not in the order; its layers go by the LRU list. */
    tb->hot_tracked = rc == 0 || rc == -EEXIST;
  } else {
    assert(tb->n_hot > 0);
    if (--tb->n_hot == 0 && tb->hot_tracked) kvt_hot_order_untrack(e, tb);
  }
}

int kvt_hot_order_open(kvt_engine *e) {
  /* No hot tier, or its LRU list by choice: nothing to keep. */
  if (e->opt.hot_evict == KVT_EVICT_LRU || e->tier[KVT_TIER_HOT].bytes_limit == 0) return 0;
  int rc = kvt_evict_create(&e->mem, KVT_MEM_INDEX, (int)e->opt.hot_evict, &e->hot_ev);
  if (rc) return rc;
  e->tier[KVT_TIER_HOT].moved = hot_moved;
  e->tier[KVT_TIER_HOT].moved_arg = e;
  return 0;
}

#define HOT_MODEL_STATE "hot_reuse_model" /* its name in the store (the cold index) */

/* Read whatever the hot tier's order (kvt_stats_tier reports what the
 * store keeps); one that does not check counts as none: start afresh. */
void kvt_hot_order_restore(kvt_engine *e) {
  if (!e->store) return;
  uint8_t buf[KVT_EVICT_MODEL_MAX];
  size_t n = kvt_store_state_get(e->store, HOT_MODEL_STATE, buf, sizeof buf);
  uint64_t clock = 0;
  if (n && kvt_evict_model_state_clock(buf, n, &clock)) clock = 0;
  e->hot_model_saved = e->hot_model_tried = clock;
  if (clock && e->hot_ev) kvt_evict_model_load(e->hot_ev, buf, n); /* LEARNED only */
}

/* Due: a save's worth of accesses since the last try (0 for an order that
 * is not LEARNED, whose clock stays 0). Lock held. */
static int hot_due(const kvt_engine *e) {
  return kvt_evict_model_clock(e->hot_ev) >= e->hot_model_tried + KVT_EVICT_MODEL_SAVE_EVERY;
}

/* The state is taken under the lock and written without it: the store's
 * write goes to disk, and nothing should wait on the engine lock meanwhile.
 * One checkpoint at a time, so an older copy never overwrites a newer one:
 * the flusher's passes while another runs, kvt_sync's and close's wait for
 * it (then take the model as it is). A store that refuses the write is
 * asked again a save's worth of accesses later, not at every hand-over. */
void kvt_hot_order_checkpoint(kvt_engine *e, int how) {
  if (!e->hot_ev || !e->store || !e->store->m->state_put || kvt_rdonly(e)) return;
  int due = how & KVT_CKPT_DUE;
  if (due) { /* the flusher asks at every hand-over: mostly not due */
    pthread_mutex_lock(&e->lock);
    int d = hot_due(e);
    pthread_mutex_unlock(&e->lock);
    if (!d) return;
  }
  while (__atomic_exchange_n(&e->hot_saving, 1, __ATOMIC_ACQUIRE)) {
    if (!(how & KVT_CKPT_WAIT)) return;
    sched_yield(); /* one small store write to wait for */
  }
  uint8_t buf[KVT_EVICT_MODEL_MAX];
  size_t n = 0;
  pthread_mutex_lock(&e->lock);
  uint64_t now = kvt_evict_model_clock(e->hot_ev);
  if (!due || hot_due(e)) { /* again: the one waited for may have saved it */
    n = kvt_evict_model_save(e->hot_ev, buf, sizeof buf); /* 0 unless learned */
    e->hot_model_tried = now;
  }
  pthread_mutex_unlock(&e->lock);
  if (n && kvt_store_state_put(e->store, HOT_MODEL_STATE, buf, n) == 0) { /* else: hit rate */
    pthread_mutex_lock(&e->lock);
    e->hot_model_saved = now;
    pthread_mutex_unlock(&e->lock);
  }
  __atomic_store_n(&e->hot_saving, 0, __ATOMIC_RELEASE);
}

void kvt_hot_order_close(kvt_engine *e) {
  e->tier[KVT_TIER_HOT].moved = NULL;
  kvt_evict_free(e->hot_ev);
  e->hot_ev = NULL;
}

void kvt_hot_order_untrack(kvt_engine *e, kvt_tblk *tb) {
  if (!tb->hot_tracked) return;
  kvt_evict_remove(e->hot_ev, &tb->key, NULL);
  tb->hot_tracked = 0;
}

void kvt_hot_order_use(kvt_engine *e, kvt_tblk *tb, int lookup) {
  if (!tb->hot_tracked) return;
  /* A server looks a prompt up, then appends it: one use, not two (two
   * would teach the model a reuse at distance zero on every hit); a
   * lookup no append followed lapses after a tier's worth of uses and
   * does not hide the block's next use (kvt_evict_look). */
  if (lookup) kvt_evict_look(e->hot_ev, &tb->key);
  else kvt_evict_touch(e->hot_ev, &tb->key);
}

static int idle_hot(const kvt_lblk *b) {
  return b && b->tier == KVT_TIER_HOT && b->on_lru && b->pins == 0;
}

/* The order's keep: a token block none of whose hot layers may go now
 * (referenced, pinned, or no longer indexed). */
static int none_idle(void *arg, const kvt_key *key) {
  kvt_tblk *tb = kvt_index_find(arg, key);
  if (!tb) return 1;
  for (uint32_t l = 0; l < tb->n_layers; l++)
    if (idle_hot(tb->layers[l])) return 0;
  return 1;
}

kvt_tblk *kvt_hot_order_victim(kvt_engine *e) {
  kvt_tier_state *hot = &e->tier[KVT_TIER_HOT];
  kvt_key k;
  /* Nothing idle and unpinned: no need to ask every entry. */
  if (!e->hot_ev || kvt_tier_evictable(hot) == 0) return NULL;
  if (kvt_evict_victim(e->hot_ev, none_idle, e, &k, NULL)) return NULL;
  return kvt_index_find(e, &k);
}
