/* recall.h - recall from disk (docs/policy.md, "Recall"): a block the
 * policy evicts keeps a key sketch (per KV head and channel, the min and
 * max of its keys); when a query's upper bound on the block's mass beats
 * the weakest evictable retained block, the block comes back from the
 * cold tier, read ahead of the next step by a prefetch (promote.c). */
#ifndef KVT_RECALL_H
#define KVT_RECALL_H

#include <stdint.h>

#include "engine/internal.h"

/* Sketches kept per sequence at most; beyond, the oldest goes. */
#define KVT_RECALL_MAX_SKETCHES 4096u
/* Blocks recalled per (sequence, layer) and step at most (one batch). */
#define KVT_RECALL_PER_STEP 4u
/* Sketches whose bound one step computes per layer at most, in turn: a
 * bound costs what attention over one key costs, and with 1-token blocks
 * there are as many sketches as evicted tokens. */
#define KVT_RECALL_SCAN 32u
/* A sketch's bound must beat the weakest retained block's mass by this
 * factor: the bound of a block of many tokens is loose (every token at the
 * best key), and a block that just left should not flap back. */
#define KVT_RECALL_MARGIN 2.0
/* A recall candidate whose token block the flusher is still writing is
 * waited for at most this long (ms): beyond, it counts as unavailable. */
#define KVT_RECALL_WAIT_MS 2000u

/* The policy evicts (s, block, layer), still referenced as lb: keep its
 * sketch when s recalls. With the lock held. */
void kvt_recall_on_evict(kvt_seq *s, uint32_t block, uint32_t layer, const kvt_lblk *lb);
/* kvt_seq_observe() of (s, layer) updated the masses: judge the recalled
 * blocks seen for the first time. With the lock held, before the layer's
 * budget is applied; listed: the layer's retained blocks (n_listed, in
 * block order) as the observation listed them. */
void kvt_recall_observed_locked(kvt_seq *s, uint32_t layer, const kvt_pblk *listed,
                                size_t n_listed);
/* After kvt_seq_observe() of (s, layer): compare the sketches' bounds for
 * the layer's last query with the weakest retained blocks and start the
 * reads of those that win. The weakest are looked for among listed (the
 * observation's list, in block order): it holds every block retained now,
 * as blocks only left the retained set or moved between hot and warm
 * since, and only the sequence's own thread (this one) puts or adopts
 * blocks into it. Without the lock. */
void kvt_recall_step(kvt_seq *s, uint32_t layer, const kvt_pblk *listed, size_t n_listed);
/* Start of kvt_seq_attend() of (s, layer): wait for the recall reads
 * started at the step before and apply the budget. Without the lock. */
void kvt_recall_install(kvt_seq *s, uint32_t layer);

/* Is block (s, block, layer) recalled and its read still running (started
 * by kvt_recall_step(), not yet waited for by kvt_recall_install())? The
 * budget counts such a block as hot from its recall on, whether the
 * prefetch found its bytes still in RAM or reads them from the cold tier:
 * which one it is depends on how far the flusher got (docs/policy.md,
 * "Recall is deterministic"). With the lock held. */
int kvt_recall_reading(const kvt_seq *s, uint32_t block, uint32_t layer);
/* kvt_seq_attend() of (s, layer) ran query q (n_q_heads x head_dim) with
 * scale and got lse over the retained blocks: keep them for the step.
 * Without the lock. */
void kvt_recall_note_query(kvt_seq *s, uint32_t layer, const float *q, uint32_t n_q_heads,
                           float scale, const float *lse);
/* Free the sketches of s and its pending recall reads. With the lock held. */
void kvt_recall_free_locked(kvt_seq *s);

#endif
