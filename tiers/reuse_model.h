/* reuse_model.h - a small online model of token-block reuse for the
 * learned eviction order (KVT_EVICT_LEARNED, tiers/evict.c): the
 * probability that a block is used again within a horizon of accesses,
 * from what the tier saw of it and of its chain before. Trained online,
 * in the order the accesses happen, from labels that are known by then:
 * a sample (a block's features at one access) is positive when the block
 * is accessed again within the horizon, negative once the horizon has
 * passed without one. Memory is fixed at create: a weight table and a
 * table of recently seen blocks the tier does not hold (their history).
 * Not thread-safe: the owner serializes calls. */
#ifndef KVT_REUSE_MODEL_H
#define KVT_REUSE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "base/mem.h"
#include "kvtier.h"

#define KVT_REUSE_NFEAT 10     /* features of one sample */
#define KVT_REUSE_WEIGHTS 4096 /* hashed weight slots (power of two) */

/* What the model remembers of one block; the owner keeps it beside the
 * block while the tier holds it, the model's history table after. */
typedef struct kvt_reuse_blk {
  uint64_t last;                   /* model tick of its last access */
  uint32_t hits;                   /* accesses seen */
  uint32_t gap;                    /* ticks between its last two accesses (0: one so far) */
  uint32_t depth;                  /* position in its chain */
  uint32_t ns;                     /* namespace */
  float p;                         /* predicted at its last access */
  uint16_t feat[KVT_REUSE_NFEAT];  /* weight slots at its last access: the pending sample */
  uint8_t pending;                 /* that sample still waits for its label */
  uint8_t staged;                  /* accessed by an admission the tier has not added yet */
} kvt_reuse_blk;

typedef struct kvt_reuse kvt_reuse;

/* A model with history_slots remembered blocks (rounded up to a power of
 * two, 1024 at least). 0 or -ENOMEM. */
int kvt_reuse_create(kvt_mem *m, int cat, uint32_t history_slots, kvt_reuse **out);
void kvt_reuse_free(kvt_reuse *r); /* accepts NULL */

/* The horizon, in accesses (the owner sets it from its size). */
void kvt_reuse_set_horizon(kvt_reuse *r, uint64_t h);
uint64_t kvt_reuse_horizon(const kvt_reuse *r);
/* The model's clock: accesses seen so far. */
uint64_t kvt_reuse_now(const kvt_reuse *r);

/* A fresh history for a block at depth in namespace ns (never accessed). */
void kvt_reuse_blk_init(kvt_reuse_blk *b, uint32_t depth, uint32_t ns);
/* One access of b (a hit, or a write after a miss). chain_gap is its
 * parent's gap (0: unknown or none). Labels b's pending sample, takes a
 * new one, advances the clock and returns b->p, the probability that b
 * is accessed again within the horizon. */
float kvt_reuse_access(kvt_reuse *r, kvt_reuse_blk *b, uint32_t chain_gap);
/* A block's history when the owner lets it go (key no longer held): kept
 * in the history table, so a later access knows its past. An older one
 * in the same slot is dropped (labelled first when its horizon passed). */
void kvt_reuse_forget(kvt_reuse *r, const kvt_key *key, const kvt_reuse_blk *b);
/* Take key's history out of the table into *b: 1 when it was there,
 * else 0 and *b untouched. */
int kvt_reuse_recall(kvt_reuse *r, const kvt_key *key, kvt_reuse_blk *b);
/* Read key's history without taking it: NULL when not remembered. */
const kvt_reuse_blk *kvt_reuse_peek(const kvt_reuse *r, const kvt_key *key);
/* A pending sample whose block stays held but has gone unused beyond the
 * horizon is labelled negative (the owner calls this when it looks). */
void kvt_reuse_expire(kvt_reuse *r, kvt_reuse_blk *b);

/* The persistent state (weights and clock), versioned, little-endian.
 * KVT_REUSE_STATE_BYTES bytes; load: 0, KVT_EVERSION (another version),
 * KVT_ECORRUPT (wrong size or checksum). */
#define KVT_REUSE_STATE_BYTES (32 + 4 * KVT_REUSE_WEIGHTS)
void kvt_reuse_save(const kvt_reuse *r, uint8_t out[KVT_REUSE_STATE_BYTES]);
int kvt_reuse_load(kvt_reuse *r, const uint8_t *in, size_t len);
/* Samples trained on so far (tests). */
uint64_t kvt_reuse_trained(const kvt_reuse *r);

#endif
