/* engine_lookup.c - prefix lookup (RAM, then the store) with load-time
 * estimates, and dropping a prefix with every block that extends it. */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/internal.h"
#include "codec/codec.h"

/* ---------- prefix lookup and drop ---------- */

#define KEY_BATCH 64

static double est_load_us(const kvt_engine *e, int tier, uint64_t bytes) {
  return e->opt.tier_load_latency_us[tier] + (double)bytes / (e->opt.tier_load_gbps[tier] * 1e3);
}

/* Is tb stored in every layer? Then touch its idle layers and describe it. */
static void lookup_entry(kvt_lookup_entry *ent, const kvt_key *key, int tier, double us) {
  if (!ent) return;
  ent->key = *key;
  ent->tier = (uint32_t)tier;
  ent->pad = 0;
  ent->est_load_us = us;
}

/* Is tb stored in every layer (in RAM, or durable in the cold tier)? Then
 * touch its idle layers and describe it. */
static int lookup_hit(kvt_engine *e, kvt_tblk *tb, kvt_lookup_entry *ent) {
  if (!tb || !tb->indexed || (tb->n_present != tb->n_layers && !tb->cold)) return 0;
  int slowest = KVT_TIER_HOT;
  double us = 0;
  uint64_t each2 = 2 * (uint64_t)tb->ns->bytes_each;
  for (uint32_t l = 0; l < tb->n_layers; l++) {
    kvt_lblk *b = tb->layers[l];
    int tier = b ? b->tier : KVT_TIER_COLD;
    if (b && tier != KVT_TIER_COLD) kvt_tier_lru_touch(&e->tier[tier], b);
    if (tier > slowest) slowest = tier;
    us += est_load_us(e, tier, each2);
  }
  kvt_hot_order_use(e, tb, 1);
  e->tc.hits[slowest]++;
  lookup_entry(ent, &tb->key, slowest, us);
  return 1;
}

int kvt_lookup(kvt_engine *e, kvt_ns_id id, const uint32_t *tokens, size_t n_tokens,
               kvt_lookup_entry *out, size_t max_out, size_t *n_found) {
  if (!e || !n_found || (n_tokens && !tokens) || (max_out && !out)) return KVT_ENULL;
  *n_found = 0;
  kvt_key seed, keys[KEY_BATCH];
  uint32_t bt;
  int rc = kvt_ns_chain_params(e, id, &seed, &bt);
  if (rc) return rc;
  kvt_shape sh;
  kvt_ns_shape(e, id, &sh);
  double cold_us = sh.n_layers * est_load_us(e, KVT_TIER_COLD, 2 * (uint64_t)kvt_shape_block_bytes(&sh));
  size_t n = n_tokens / bt, found = 0, found_cold = 0;
  int miss = 0;
  for (size_t i0 = 0; i0 < n && !miss; i0 += KEY_BATCH) {
    size_t m = n - i0 < KEY_BATCH ? n - i0 : KEY_BATCH, j = 0;
    for (size_t k = 0; k < m; k++)
      kvt_key_next(&seed, k ? &keys[k - 1] : (i0 ? &keys[KEY_BATCH - 1] : NULL),
                   tokens + (i0 + k) * bt, bt, &keys[k]);
    while (j < m && !miss) {
      pthread_mutex_lock(&e->lock);
      for (; j < m; j++, found++)
        if (!lookup_hit(e, kvt_index_find(e, &keys[j]), found < max_out ? &out[found] : NULL)) break;
      pthread_mutex_unlock(&e->lock);
      if (j == m) break;
      /* Not in RAM: the cold tier may have this block and more. */
      size_t c = e->store ? kvt_store_prefix(e->store, keys + j, m - j) : 0;
      for (size_t k = 0; k < c; k++, found++)
        lookup_entry(found < max_out ? &out[found] : NULL, &keys[j + k], KVT_TIER_COLD, cold_us);
      j += c;
      found_cold += c;
      miss = c == 0;
    }
  }
  pthread_mutex_lock(&e->lock);
  e->st.lookups++;
  e->st.lookup_blocks_hit += found;
  e->st.lookup_blocks_miss += n - found;
  e->tc.hits[KVT_TIER_COLD] += found_cold;
  pthread_mutex_unlock(&e->lock);
  *n_found = found;
  return 0;
}

static int cmp_pos(const void *a, const void *b) {
  uint32_t x = (*(kvt_tblk *const *)a)->pos, y = (*(kvt_tblk *const *)b)->pos;
  return (x > y) - (x < y);
}

/* Token blocks of ns that extend the block `last`, in chain order. The
 * caller frees *out (n entries, counted in KVT_MEM_OTHER). */
static int descendants(kvt_engine *e, kvt_tblk *last, kvt_tblk ***out, size_t *n_out,
                       size_t *cap_out) {
  size_t cap = 0, n = 0;
  for (size_t i = 0; i < e->n_buckets; i++)
    for (kvt_tblk *tb = e->buckets[i]; tb; tb = tb->hnext)
      cap += (tb->ns == last->ns && tb->pos > last->pos);
  *out = NULL;
  *n_out = 0;
  *cap_out = cap;
  if (!cap) return 0;
  kvt_tblk **c = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, cap * sizeof *c);
  if (!c) return -ENOMEM;
  size_t m = 0;
  for (size_t i = 0; i < e->n_buckets; i++)
    for (kvt_tblk *tb = e->buckets[i]; tb; tb = tb->hnext)
      if (tb->ns == last->ns && tb->pos > last->pos) c[m++] = tb;
  qsort(c, m, sizeof *c, cmp_pos);
  /* A block descends from last iff its parent does (or is last); in chain
   * order every parent is decided before its children. A block whose
   * parent left the index is not reached: no lookup can reach it either. */
  last->mark = 1;
  for (size_t i = 0; i < m; i++) {
    kvt_tblk *p = kvt_index_find(e, &c[i]->parent);
    if (p && p->mark) {
      c[i]->mark = 1;
      c[n++] = c[i];
    }
  }
  for (size_t i = 0; i < n; i++) c[i]->mark = 0;
  last->mark = 0;
  *out = c;
  *n_out = n;
  return 0;
}

/* A prefix drop's store removals are done, with the lock held: blocks of
 * its namespace met meanwhile (put again, kvt_flush_consider held them
 * back) are looked up in the store anew - another writer may have stored
 * one since - and written if it has not. The index is scanned only while
 * some of them are left to find (ns->drop_waits): a drop nothing was put
 * into meanwhile, the common case, does not scan it. */
static void drop_done(kvt_engine *e, kvt_ns_id id) {
  kvt_nsrec *ns = kvt_ns_find(e, id);
  e->drops--;
  pthread_cond_broadcast(&e->flushed); /* kvt_sync waits for drops */
  if (!ns || --ns->dropping) return;
  for (size_t i = 0; i < e->n_buckets && ns->drop_waits; i++)
    for (kvt_tblk *tb = e->buckets[i]; tb; tb = tb->hnext)
      if (tb->ns == ns && tb->drop_wait) {
        tb->drop_wait = 0;
        ns->drop_waits--;
        if (!tb->cold && !tb->queued) tb->cold = (uint8_t)kvt_flush_has_locked(e, &tb->key);
        kvt_flush_consider(e, tb);
      }
}

int kvt_drop_prefix(kvt_engine *e, kvt_ns_id id, const uint32_t *tokens, size_t n_tokens,
                    uint64_t *dropped) {
  if (!e || !tokens) return KVT_ENULL;
  if (dropped) *dropped = 0;
  if (kvt_rdonly(e)) return KVT_ERDONLY;
  kvt_key seed, prev, cur;
  uint32_t bt;
  int rc = kvt_ns_chain_params(e, id, &seed, &bt);
  if (rc) return rc;
  size_t n = n_tokens / bt;
  if (n == 0)
    return KVT_ERR(e, KVT_ECOUNT, "kvt_drop_prefix", "n_tokens", "at least one block",
                   "%zu (block_tokens %u)", n_tokens, bt);
  kvt_key_next(&seed, NULL, tokens, bt, &cur);
  for (size_t i = 1; i < n; i++) {
    prev = cur;
    kvt_key_next(&seed, &prev, tokens + i * bt, bt, &cur);
  }
  pthread_mutex_lock(&e->lock);
  /* Find what extends the prefix first, so that a failure changes nothing.
   * A token block durable in the cold tier is counted by the cold drop. */
  kvt_tblk *last = kvt_index_find(e, &cur), **d = NULL;
  size_t nd = 0, cap = 0;
  if (last) rc = descendants(e, last, &d, &nd, &cap);
  uint64_t count = 0;
  /* Descendants durable in the store, for one that cannot find them
   * itself (a diskless remote tier); best effort without memory. */
  kvt_key *also = nd && kvt_store_any(e) ? kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, nd * sizeof *also) : NULL;
  size_t n_also = 0;
  if (!rc) {
    for (size_t i = 0; i < nd; i++) {
      count += !d[i]->cold;
      if (also && d[i]->cold) also[n_also++] = d[i]->key;
      kvt_drop_tblk(e, d[i]);
    }
    kvt_mem_free(&e->mem, KVT_MEM_OTHER, d, cap * sizeof *d);
    for (size_t i = 0; i < n; i++) {
      kvt_key_next(&seed, i ? &prev : NULL, tokens + i * bt, bt, &cur);
      prev = cur;
      kvt_tblk *tb = kvt_index_find(e, &cur);
      if (tb) {
        count += !tb->cold;
        kvt_drop_tblk(e, tb);
      }
      if (kvt_store_any(e) && i + 1 < n) count += kvt_store_remove(e->store, &cur) == 0;
    }
  }
  /* The store's removals below run unlocked: until they are done, blocks
   * of the namespace put again are not written nor taken as durable (a
   * write then could be cancelled, or the block removed, after it was
   * counted durable: a later miss). */
  int held = !rc && kvt_store_any(e);
  kvt_nsrec *ns = held ? kvt_ns_find(e, id) : NULL;
  if (ns) ns->dropping++;
  e->drops += held;
  pthread_mutex_unlock(&e->lock);
  if (held && e->test_drop_window) e->test_drop_window(e->test_drop_arg);
  if (!rc && n_also) count += kvt_store_drop_also(e->store, also, n_also);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, also, nd * sizeof *also);
  if (!rc && kvt_store_any(e)) { /* the last block and all that extends it, durably */
    uint64_t cold_n = 0;
    rc = kvt_store_drop(e->store, &seed, &cur, (uint32_t)(n - 1), &cold_n);
    count += cold_n;
  }
  if (held) {
    pthread_mutex_lock(&e->lock);
    drop_done(e, id);
    pthread_mutex_unlock(&e->lock);
  }
  if (dropped) *dropped = count;
  return rc;
}
