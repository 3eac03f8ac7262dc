/* reuse_model.h - a small online model of token-block reuse for the
 * learned eviction order (KVT_EVICT_LEARNED, tiers/evict.c): for each
 * class of block (by how often it was accessed) the distribution of the
 * distance, in accesses to the tier, to a block's next access, learned
 * online from the accesses the tier sees. From it, the rank of a block
 * of a class at an age (accesses since its last use): its hit density,
 * the chance it is used again within the horizon per unit of space-time
 * it would hold until then. Labels are known by then: a distance is
 * counted when the next access comes; an access with none yet counts as
 * not reused. Memory is fixed at create: the histograms and a table of
 * recently seen blocks the tier does not hold (their history). Not
 * thread-safe: the owner serializes calls. */
#ifndef KVT_REUSE_MODEL_H
#define KVT_REUSE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "base/mem.h"
#include "kvtier.h"

#define KVT_REUSE_CLASSES 7  /* blocks by accesses seen: 1, 2, 3, 4, 5-8, more; 1 on new content */
#define KVT_REUSE_BUCKETS 48 /* distances and ages: two buckets an octave, up to 2^24 */

/* What the model remembers of one block; the owner keeps it beside the
 * block while the tier holds it, the model's history table after. */
typedef struct kvt_reuse_blk {
  uint64_t last;   /* model tick of its last access */
  uint32_t hits;   /* accesses seen */
  uint32_t depth;  /* position in its chain */
  uint32_t ns;     /* namespace */
  uint8_t cls;     /* class at its last access (its pending distance counts there) */
  uint8_t staged;  /* accessed by an admission the tier has not added yet */
  uint8_t fresh;   /* extends a prefix seen once: new content (kvt_reuse_blk_init) */
  uint8_t stored;  /* stored before its history began (loaded at open): accessed
                    * an unknown number of times, never new content's parent */
} kvt_reuse_blk;

typedef struct kvt_reuse kvt_reuse;

/* A model with history_slots remembered blocks (rounded up to a power of
 * two, 1024 at least). 0 or -ENOMEM. */
int kvt_reuse_create(kvt_mem *m, int cat, uint32_t history_slots, kvt_reuse **out);
void kvt_reuse_free(kvt_reuse *r); /* accepts NULL */

/* The horizon, in accesses: how long the tier keeps a block unused (the
 * owner measures it from its evictions). */
void kvt_reuse_set_horizon(kvt_reuse *r, uint64_t h);
uint64_t kvt_reuse_horizon(const kvt_reuse *r);
/* The model's clock: accesses seen so far. */
uint64_t kvt_reuse_now(const kvt_reuse *r);

/* A fresh history for a block at depth in namespace ns (never accessed),
 * whose chain parent's history is parent (NULL: a chain head, or a parent
 * neither held nor remembered; one stored before its history began -
 * loaded at open - counts as a prefix that came back). A block whose
 * parent had been accessed only once - in the request writing both, so
 * their prefix is new - is classed apart on its first access: new
 * content, as opposed to the first block written after a prefix that
 * came back. */
void kvt_reuse_blk_init(kvt_reuse_blk *b, uint32_t depth, uint32_t ns, const kvt_reuse_blk *parent);
/* Is b new content: accessed once, extending a prefix seen once (the
 * request that wrote both) - the class the owner may decline to write?
 * A chain head, or a block past a prefix that came back, is not. */
int kvt_reuse_new_content(const kvt_reuse_blk *b);
/* One access of b (a hit, or a write after a miss): counts the distance
 * from its previous access in the class it had then, moves it to its new
 * class and advances the clock. */
void kvt_reuse_access(kvt_reuse *r, kvt_reuse_blk *b);
/* b's rank now: its expected hits within the horizon per access of space
 * it would hold (higher: more worth keeping). Without enough samples of
 * its class the rank leans on every class's together. *se (may be NULL)
 * receives its standard error, from the number of reuses it rests on. */
double kvt_reuse_density(const kvt_reuse *r, const kvt_reuse_blk *b, double *se);
/* A block's history when the owner lets it go (key no longer held): kept
 * in the history table, so a later access knows its past. An older one
 * in the same slot is dropped. */
void kvt_reuse_forget(kvt_reuse *r, const kvt_key *key, const kvt_reuse_blk *b);
/* Take key's history out of the table into *b: 1 when it was there,
 * else 0 and *b untouched. */
int kvt_reuse_recall(kvt_reuse *r, const kvt_key *key, kvt_reuse_blk *b);
/* Read key's history without taking it: NULL when not remembered. */
const kvt_reuse_blk *kvt_reuse_peek(const kvt_reuse *r, const kvt_key *key);

/* The persistent state (clock and histograms), versioned, little-endian.
 * KVT_REUSE_STATE_BYTES bytes; load: 0, KVT_EVERSION (another version),
 * KVT_ECORRUPT (wrong size or checksum). */
#define KVT_REUSE_STATE_BYTES (32 + 4 * KVT_REUSE_CLASSES * (KVT_REUSE_BUCKETS + 1))
void kvt_reuse_save(const kvt_reuse *r, uint8_t out[KVT_REUSE_STATE_BYTES]);
int kvt_reuse_load(kvt_reuse *r, const uint8_t *in, size_t len);
/* A saved state's clock (the accesses it had counted), checked as load
 * checks it, without a model to load it into: 0, or load's errors. */
int kvt_reuse_state_clock(const uint8_t *in, size_t len, uint64_t *clock);
/* Distances counted so far (tests). */
uint64_t kvt_reuse_trained(const kvt_reuse *r);

#endif
