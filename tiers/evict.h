/* evict.h - the order in which a tier gives up token blocks. It knows
 * keys, parents, sizes and access ticks; nothing about files, segments or
 * sequences. Used by the cold tier on disk (which blocks to invalidate
 * before reclaiming segments) and by the metadata-only cold tier that
 * `kvtier plan` replays traces through, so both run this very code.
 *
 * Policies:
 *  - KVT_EVICT_CHAIN: a block is useless without its prefix, so
 *    only the tails of prefix chains are candidates: a block with a stored
 *    child is never chosen while a leaf is. Among leaves, tails as written
 *    (never used or extended since they were added) go first - a probation
 *    segment, as in segmented LRU, for the blocks a workload almost never
 *    asks for again - then the least recently used.
 *  - KVT_EVICT_LRU: plain least recently used, for comparison.
 *  - KVT_EVICT_LEARNED (kvt_options_init's default): CHAIN's candidates
 *    and probation; among the other leaves, 64 sampled at random (and
 *    the least recently used) are ranked by a reuse model trained online
 *    from this order's own accesses
 *    (tiers/reuse_model.h: hit density by class and age, the horizon the
 *    tier's residence time) and the least dense goes - unless the model
 *    is not sure it is worth less than the least recently used leaf,
 *    which then goes; and until the model's clock has run two horizons
 *    (kvt_evict_seasoned) CHAIN's leaf goes. kvt_evict_admit() says whether a block is worth
 *    writing at all: not when it is new content (kvt_reuse_new_content)
 *    the model is sure is worth less than the leaf it would displace.
 *    A shadow LRU of sampled keys checks the model on the live stream:
 *    while the tier is behind it, LEARNED decides as CHAIN does
 *    (tiers/evict_guard.h).
 * Costs: O(1) add, touch and remove for LRU; O(log n) for CHAIN (a binary
 * heap of leaves). Not thread-safe: the owner serializes calls. */
#ifndef KVT_EVICT_H
#define KVT_EVICT_H

#include <stdint.h>

#include "base/mem.h"
#include "kvtier.h"

typedef struct kvt_evict kvt_evict;

/* Create an empty order for policy (KVT_EVICT_*), its memory counted in
 * m's category cat. 0, KVT_EOPTION, -ENOMEM. */
int kvt_evict_create(kvt_mem *m, int cat, int policy, kvt_evict **out);
void kvt_evict_free(kvt_evict *ev); /* accepts NULL */

/* Track key, most recent, with its chain parent (NULL or all zero for a
 * chain head) and size. 0; -EEXIST (tracked: touched instead); -ENOMEM. */
int kvt_evict_add(kvt_evict *ev, const kvt_key *key, const kvt_key *parent, uint64_t bytes);
/* kvt_evict_add for a block stored before (the index, loaded at open):
 * tracked the same, but no access for LEARNED's model - its counts stay
 * what was saved, and the block's age counts from now. */
int kvt_evict_load(kvt_evict *ev, const kvt_key *key, const kvt_key *parent, uint64_t bytes);
/* A use of key: refreshes its recency. 1 when tracked, else 0. */
int kvt_evict_touch(kvt_evict *ev, const kvt_key *key);
/* A lookup's use of key (a prefix lookup): as kvt_evict_touch, and the
 * touch that follows it (the append or find of the block the lookup
 * found) refreshes recency only: a server looks a prompt up, then
 * appends it, and that is one use, not two - counted twice, LEARNED's
 * model would learn a reuse at distance zero from every hit. A look is
 * pending for as many uses of the tier as it holds blocks (a lookup
 * finds no more, other requests' uses may come in between): a touch
 * after that is a use of its own, so a lookup no append followed does
 * not hide the block's next use for long. */
int kvt_evict_look(kvt_evict *ev, const kvt_key *key);
/* Is key tracked? No side effect. */
int kvt_evict_has(const kvt_evict *ev, const kvt_key *key);
/* Stop tracking key; *bytes (may be NULL) receives its size.
 * 0 or KVT_ENOTFOUND. */
int kvt_evict_remove(kvt_evict *ev, const kvt_key *key, uint64_t *bytes);
/* The owner's mark on key (the metadata tier: its namespace), for
 * kvt_evict_remove_tagged; 0 is no mark. 0 or KVT_ENOTFOUND. */
int kvt_evict_set_tag(kvt_evict *ev, const kvt_key *key, uint64_t tag);
/* Stop tracking every key marked tag (not 0); *bytes (may be NULL)
 * receives their size. How many, or -ENOMEM (then none is removed). */
int64_t kvt_evict_remove_tagged(kvt_evict *ev, uint64_t tag, uint64_t *bytes);

/* The next block to give up, not removed: the first in policy order for
 * which keep(arg, key) returns 0 (keep may be NULL). Blocks kept stay
 * where they are. 0 with *out and *bytes set; KVT_ENOTFOUND when every
 * tracked block is kept (or none is tracked). */
int kvt_evict_victim(kvt_evict *ev, int (*keep)(void *arg, const kvt_key *key), void *arg,
                     kvt_key *out, uint64_t *bytes);

/* Admission (LEARNED; 1 for every other policy): a write of key, not
 * tracked, at depth of its chain in namespace ns is coming. Counts the
 * access for the model (the following kvt_evict_add does not count it
 * again) and says whether the block should be written: always while the
 * tier is not full; when full, only when its prefix is tracked (or was
 * just admitted) and, for new content (a first access extending a prefix
 * seen once), the model is not sure it is worth less than the leaf it
 * would displace; a chain head, and a block extending a prefix that came
 * back, are written. 1 (write it) or 0. */
int kvt_evict_admit(kvt_evict *ev, const kvt_key *key, const kvt_key *parent, uint32_t depth,
                    uint32_t ns, int full);

/* LEARNED's model state (counts and clock), for the cold index: save
 * returns the bytes written to out (0 when not LEARNED or cap is short);
 * load: 0, KVT_EOPTION (not LEARNED), KVT_EVERSION, KVT_ECORRUPT. */
#define KVT_EVICT_MODEL_MAX (32 + 4 * 4096) /* save's bytes, at most */
size_t kvt_evict_model_save(const kvt_evict *ev, uint8_t *out, size_t cap);
int kvt_evict_model_load(kvt_evict *ev, const uint8_t *in, size_t len);
/* The model's clock: accesses it has counted, those of a loaded state
 * included (0 when not LEARNED). */
uint64_t kvt_evict_model_clock(const kvt_evict *ev);
/* The clock of a saved state, checked as load checks it (for a report of
 * what an owner keeps, whatever its own order): 0, or load's errors. */
int kvt_evict_model_state_clock(const uint8_t *in, size_t len, uint64_t *clock);
/* Owners keep the model in a store's index: at close, and between, once
 * its clock has run this many accesses since they last did. */
#define KVT_EVICT_MODEL_SAVE_EVERY 4096

/* LEARNED's check against plain LRU (tiers/evict_guard.h): while its
 * shadow LRU hits the sampled keys more often than the tier, by more
 * than noise, the order decides as CHAIN does. NULL for other policies;
 * for tests and reports. */
struct kvt_guard *kvt_evict_guard(kvt_evict *ev);

/* LEARNED: does the model choose victims yet? Not until its clock has run
 * two horizons (the tier's residence time): before, the victim is CHAIN's.
 * 0 for other policies; for tests and reports. */
int kvt_evict_seasoned(const kvt_evict *ev);

uint64_t kvt_evict_count(const kvt_evict *ev);
uint64_t kvt_evict_bytes(const kvt_evict *ev);

#endif
