/* engine_index.c - the token-block index: a hash table of token blocks
 * by key, grown as it fills, and token-block allocation and freeing. */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/internal.h"
#include "codec/codec.h"

/* ---------- the index ---------- */

kvt_tblk *kvt_index_find(kvt_engine *e, const kvt_key *k) {
  kvt_tblk *tb = e->buckets[kvt_key_hash(k) & (e->n_buckets - 1)];
  while (tb && !kvt_key_eq(&tb->key, k)) tb = tb->hnext;
  return tb;
}

/* Double the table when it averages more than one entry a bucket. When
 * the allocation fails the chains just grow longer: nothing is lost. */
static void index_grow(kvt_engine *e) {
  size_t n = e->n_buckets * 2;
  kvt_tblk **nb = kvt_mem_calloc(&e->mem, KVT_MEM_INDEX, n * sizeof *nb);
  if (!nb) return;
  for (size_t i = 0; i < e->n_buckets; i++) {
    kvt_tblk *tb = e->buckets[i];
    while (tb) {
      kvt_tblk *next = tb->hnext;
      size_t h = kvt_key_hash(&tb->key) & (n - 1);
      tb->hnext = nb[h];
      nb[h] = tb;
      tb = next;
    }
  }
  kvt_mem_free(&e->mem, KVT_MEM_INDEX, e->buckets, e->n_buckets * sizeof *nb);
  e->buckets = nb;
  e->n_buckets = n;
}

void kvt_index_insert(kvt_engine *e, kvt_tblk *tb) {
  assert(!tb->indexed && !kvt_index_find(e, &tb->key));
  if (e->n_tblks >= e->n_buckets) index_grow(e);
  size_t h = kvt_key_hash(&tb->key) & (e->n_buckets - 1);
  tb->hnext = e->buckets[h];
  e->buckets[h] = tb;
  tb->indexed = 1;
  if (tb->drop_wait) tb->ns->drop_waits++;
}

void kvt_index_remove(kvt_engine *e, kvt_tblk *tb) {
  if (!tb->indexed) return;
  kvt_hot_order_untrack(e, tb); /* its key may be another block's next */
  kvt_tblk **pp = &e->buckets[kvt_key_hash(&tb->key) & (e->n_buckets - 1)];
  while (*pp != tb) pp = &(*pp)->hnext;
  *pp = tb->hnext;
  tb->hnext = NULL;
  tb->indexed = 0;
  if (tb->drop_wait) tb->ns->drop_waits--;
}

static size_t tblk_size(uint32_t n_layers) {
  return sizeof(kvt_tblk) + (size_t)n_layers * sizeof(kvt_lblk *);
}

kvt_tblk *kvt_tblk_alloc(kvt_engine *e, kvt_nsrec *ns, const kvt_key *key, const kvt_key *parent,
                         uint32_t pos) {
  uint32_t L = ns->desc.shape.n_layers;
  kvt_tblk *tb = kvt_mem_calloc(&e->mem, KVT_MEM_INDEX, tblk_size(L));
  if (!tb) return NULL;
  tb->key = *key;
  if (parent) tb->parent = *parent;
  tb->ns = ns;
  tb->pos = pos;
  tb->n_layers = L;
  return tb;
}

void kvt_tblk_maybe_free(kvt_engine *e, kvt_tblk *tb) {
  if (tb->n_present || tb->seq_refs) return;
  if (tb->indexed) {
    kvt_index_remove(e, tb);
    e->n_tblks--;
  }
  kvt_mem_free(&e->mem, KVT_MEM_INDEX, tb, tblk_size(tb->n_layers));
}
