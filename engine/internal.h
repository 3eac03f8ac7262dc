/* internal.h - engine structures shared by engine.c and seq.c.
 *
 * Invariants (checked by assertions and by tests/test_limit.c):
 *  1. A token block (kvt_tblk) is in the index iff tb->indexed; it is freed
 *     when it holds no layer block and no sequence holds it.
 *  2. A layer block with refs > 0 is never evicted; with refs == 0 it is on
 *     its tier's LRU list, unless its token block was dropped (orphan), in
 *     which case it is freed as soon as refs and pins reach 0.
 *  3. tier.bytes_used <= tier.bytes_limit after every call returns.
 *  4. Payload bytes are copied outside the engine lock, under a pin.
 * Lock order: e->lock is the only lock; nothing else is held with it, but
 * the leaf lock of the error table (e->err.lock, errinfo.h), taken last. */
#ifndef KVT_INTERNAL_H
#define KVT_INTERNAL_H

#include <pthread.h>

#include "base/key.h"
#include "base/mem.h"
#include "base/shape.h"
#include "engine/errinfo.h"
#include "engine/policy.h"
#include "kvtier.h"
#include "tiers/store.h"
#include "tiers/tier.h"

typedef struct kvt_nsrec {
  kvt_ns_id id;               /* slot in the low 16 bits, generation above */
  kvt_ns_desc desc;           /* strings point into the copies below */
  char *strs;                 /* model id, fingerprint, rope scaling, NUL separated */
  size_t strs_len;
  kvt_key seed;
  size_t bytes_each;          /* K (= V) bytes of one layer block */
  kvt_shape_lite lite;        /* what the tiers need of the shape */
  uint8_t *k_codec, *v_codec; /* [n_layers] warm codecs */
  uint64_t warm_seed;         /* rotation seed of layer l: warm_seed + l * odd */
  uint32_t n_seqs;            /* open sequences */
  uint32_t n_loads;           /* pending load batches */
  kvt_profile *profile;       /* per-layer policies for "auto" (policy.h), or NULL */
  kvt_predictor *pred;        /* the "learned" scorer's model, or NULL */
  uint32_t dropping;          /* prefix drops removing blocks from the store now,
                                 the lock let go (kvt_drop_prefix): its blocks
                                 wait to be written, none is taken as durable */
  uint64_t drop_waits;        /* its indexed token blocks with drop_wait set: what
                                 the end of its last drop has to look at (0: no
                                 scan of the index) */
} kvt_nsrec;

typedef struct kvt_tblk {
  kvt_key key;
  kvt_key parent;             /* key of the block before; zero for the first */
  struct kvt_tblk *hnext;     /* index hash chain */
  kvt_nsrec *ns;
  uint32_t pos;               /* index of the block in its chain */
  uint32_t n_present;         /* layers that have a block */
  uint32_t seq_refs;          /* sequences holding this token block */
  uint32_t n_layers;
  uint8_t indexed;
  uint8_t mark;               /* scratch for kvt_drop_prefix */
  uint8_t cold;               /* durable in the cold tier */
  uint8_t queued;             /* waiting for the flusher (its layers pinned) */
  uint8_t prompt;             /* appended as prompt at least once (admission) */
  uint8_t lost;               /* was durable, and its cold record failed a check: a
                                 layer a sequence references but never put is
                                 nowhere now (kvt_seq_away still counts it) */
  uint8_t drop_wait;          /* met while its namespace was dropping: written
                                 (or found durable) once the drop is done */
  uint32_t seen;              /* appends of it (admission) */
  int cold_err;               /* why its last way to the cold tier failed (0: none):
                                 kvt_sync reports it while it is referenced and not
                                 durable */
  struct kvt_tblk *fq_next;   /* flush queue */
  uint32_t n_hot;             /* layers in the hot tier (hot_order.c) */
  uint8_t hot_tracked;        /* in the hot tier's eviction order (e->hot_ev) */
  kvt_lblk *layers[];         /* [n_layers] */
} kvt_tblk;

struct kvt_seq {
  kvt_engine *e;
  kvt_nsrec *ns;
  kvt_seq *prev, *next;       /* engine's list of open sequences */
  uint32_t n_blocks, cap;
  kvt_tblk **tb;              /* [cap] */
  kvt_lblk **lb;              /* [cap * n_layers], block-major: lb[b * L + l]; NULL
                                 when not put, or evicted from that layer by the policy */
  int output;                 /* appends are output, not prompt (kvt_seq_output) */
  kvt_bstate *bs;             /* [cap * n_layers]: policy state, indexed as lb */
  uint8_t *ss;                /* [cap * n_layers * ss_stride]: the scorers' private
                                 state, indexed as lb (NULL when ss_stride is 0) */
  uint32_t ss_stride;         /* bytes of private state per (block, layer) */
  kvt_pblk *scratch_pb;       /* [cap] scratch for ranking a layer (policy.c) */
  double *scratch_score;      /* [cap] */
  struct cand *scratch_cand;  /* [cap] */
  kvt_policy pol;             /* retention policy, defaults resolved (policy.c) */
  kvt_lpol *lp;               /* [n_layers] per-layer scorer and share; NULL: "full" */
  uint64_t n_tokens;          /* length incl. the caller's tail (kvt_seq_set_tokens) */
  kvt_lblk **pin;             /* [pin_cap]: the n_pin blocks of its request pin (serve.c) */
  size_t n_pin, pin_cap;
  struct kvt_recall *recall;  /* key sketches of evicted blocks, or NULL (recall.c) */
  /* content addressing under a lossy policy (lineage.c) */
  uint8_t lossy;              /* its attention has been lossy: blocks appended from
                                 now on are keyed under lineage */
  uint8_t lossy_why;          /* KVT_LOSSY_* */
  uint32_t salted_from;       /* first block keyed under a lineage (UINT32_MAX: none) */
  kvt_key lineage;            /* random id mixed into its keys (zero: none) */
  uint64_t lossy_puts;        /* puts into its salted blocks */
};

struct kvt_load {
  kvt_engine *e;
  kvt_nsrec *ns;
  kvt_load *prev, *next;      /* engine's list of pending loads */
  kvt_load_req *reqs;
  kvt_lblk **blk;             /* [n]; pinned, or NULL when not found */
  size_t n;
  kvt_store_read *cr;         /* [n_cr] reads submitted to the store */
  uint32_t *cr_idx;           /* which request each one is */
  size_t n_cr;
  kvt_store_batch *cb;        /* NULL once waited for */
  struct kvt_promo *promo;    /* a prefetch of a sequence's own blocks (promote.c) */
  struct kvt_load **back;     /* cleared when this load is freed (a recall's, recall.c) */
};

/* Per-tier counters kvt_stats has no field for, rendered by
 * kvt_metrics_render() (metrics.c). Under e->lock. */
typedef struct kvt_tier_counts {
  uint64_t hits[KVT_N_TIERS];       /* token blocks found by lookups, by the slowest tier
                                       one of their layers was in */
  uint64_t puts[KVT_N_TIERS];       /* layer blocks stored new in the tier by puts */
  uint64_t promotions[KVT_N_TIERS]; /* layer blocks that only the cold tier held given a
                                       RAM copy in the tier again (a put) */
  uint64_t reads[KVT_N_TIERS];      /* layer blocks copied out of the tier (read, gather,
                                       load); cold reads are the cold tier's */
  uint64_t durable_ns;              /* when a block last became durable, or the first
                                       was queued while none was (monotonic clock) */
  uint64_t lossy_seqs;              /* sequences whose attention became lossy (lineage.c) */
  uint64_t lossy_puts;              /* puts into blocks keyed under a lineage */
  uint64_t cold_declined;           /* admissible token blocks the store's admission
                                       declined to write (kvt_tier_stats.declined) */
} kvt_tier_counts;

struct kvt_engine {
  pthread_mutex_t lock;
  kvt_options opt;
  int lock_fd;
  kvt_mem mem;
  kvt_tier_state tier[KVT_N_TIERS];
  kvt_tblk **buckets;         /* index: token-block key -> kvt_tblk */
  size_t n_buckets;           /* power of two */
  size_t n_tblks;
  kvt_nsrec **ns;             /* [opt.max_namespaces]; NULL when free */
  uint16_t *ns_gen;           /* [opt.max_namespaces]: bumped by each drop, so
                                 a stale id never finds a newer namespace */
  uint32_t n_ns;              /* slots ever used (a high-water mark) */
  kvt_seq seqs;               /* sentinel */
  kvt_load loads;             /* sentinel */
  kvt_stats st;               /* counters; gauges are filled by kvt_stats_get */

  /* the durable tier below RAM (NULL without one; tiers/store.h) and the
   * flusher thread that writes it (not for an INLINE store) */
  kvt_store *store;
  pthread_t flusher;
  int flusher_on, stop;
  pthread_cond_t work;        /* queue not empty, or stop */
  pthread_cond_t flushed;     /* a group finished */
  kvt_tblk *fq_head, *fq_tail;
  uint64_t enqueued, completed; /* token blocks ever queued / finished */
  int cold_err;               /* first failure since the last kvt_sync */
  uint32_t room_waiters;      /* threads waiting for the flusher to free RAM */
  int cold_backlog;           /* atomic: blocks queued or room awaited (kvt_flush_backlog) */
  kvt_err_table err;          /* detail of failed calls, per thread (errinfo.c) */
  int event_fd;               /* kvt_event_fd(), -1 until asked for (atomic) */
  uint64_t pinned_hot;        /* cost of hot blocks under request pins (serve.c) */
  kvt_tier_counts tc;         /* metrics.c */
  kvt_key lineage_nonce;      /* random per open: lineage ids never repeat (lineage.c) */
  uint64_t lineages;          /* lineage ids handed out */
  struct kvt_evict *hot_ev;   /* the hot tier's eviction order of idle token blocks
                                 (opt.hot_evict; NULL: its LRU list; hot_order.c) */
  uint64_t hot_model_saved;   /* its model's clock when last kept in the store */
  uint64_t hot_model_tried;   /* ... when last written or tried (hot_order.c) */
  int hot_saving;             /* a checkpoint is taking and writing it (atomic) */
  uint32_t drops;             /* prefix drops in their store removal (kvt_sync waits) */
  void (*test_drop_window)(void *); /* tests: called by kvt_drop_prefix between */
  void *test_drop_arg;              /* its index and its store removals, unlocked */
};

/* Record the detail of a failing call on e for this thread; evaluates to code. */
#define KVT_ERR(e, code, call, field, expected, ...) \
  kvt_err_record(&(e)->err, (code), (call), (field), (expected), __VA_ARGS__)

static inline int kvt_rdonly(const kvt_engine *e) { return (e->opt.flags & KVT_OPEN_RDONLY) != 0; }
static inline int kvt_meta_only(const kvt_engine *e) {
  return (e->opt.flags & KVT_OPEN_METADATA_ONLY) != 0;
}

/* engine_index.c, engine_place.c, engine_ns.c: with e->lock held */
kvt_nsrec *kvt_ns_find(kvt_engine *e, kvt_ns_id id);
kvt_tblk *kvt_index_find(kvt_engine *e, const kvt_key *k);
void kvt_index_insert(kvt_engine *e, kvt_tblk *tb);
void kvt_index_remove(kvt_engine *e, kvt_tblk *tb);
kvt_tblk *kvt_tblk_alloc(kvt_engine *e, kvt_nsrec *ns, const kvt_key *key,
                         const kvt_key *parent, uint32_t pos);
void kvt_tblk_maybe_free(kvt_engine *e, kvt_tblk *tb);
/* tb waits for its namespace's prefix drop (kvt_drop_prefix) before it
 * is written or taken as durable; counted in ns->drop_waits while indexed. */
static inline void kvt_tblk_drop_wait(kvt_tblk *tb) {
  if (tb->drop_wait) return;
  tb->drop_wait = 1;
  if (tb->indexed) tb->ns->drop_waits++;
}
void kvt_lblk_ref(kvt_engine *e, kvt_lblk *b);
void kvt_lblk_unref(kvt_engine *e, kvt_lblk *b);
void kvt_lblk_pin(kvt_engine *e, kvt_lblk *b);
void kvt_lblk_unpin(kvt_engine *e, kvt_lblk *b);
/* Publish a freshly filled block b as layer `layer` of tb in tier; the
 * caller has made room. */
int kvt_publish(kvt_engine *e, kvt_tblk *tb, uint32_t layer, kvt_lblk *b, int tier);
/* Drop unreferenced blocks of t, least recent first, until cost fits;
 * KVT_EFULL and nothing changed when it cannot. */
int kvt_tier_drop_for(kvt_engine *e, kvt_tier_state *t, uint64_t cost);
/* Make room for cost bytes in the hot tier: drop unreferenced blocks, or
 * with a warm tier demote the least recently used (which unlocks and
 * relocks e->lock around encoding). 0, KVT_EFULL or -ENOMEM. */
int kvt_hot_make_room(kvt_engine *e, uint64_t cost);
/* The policy's tier moves of a referenced block b, in place, with the lock
 * held (both drop it while they encode, decode or read). Demote: hot ->
 * warm with the namespace's warm codecs (engine_place.c). Promote: warm -> hot,
 * exact from the cold tier when the token block is durable there (*exact
 * 1), else dequantized and marked approx (tiermove.c). 0, or an error and
 * b where it was: KVT_ESTATE (pinned or moved meanwhile), KVT_EFULL,
 * -ENOMEM. */
int kvt_lblk_demote(kvt_engine *e, kvt_lblk *b);
int kvt_lblk_promote(kvt_engine *e, kvt_lblk *b, int *exact);
static inline int kvt_warm_on(const kvt_engine *e) { return e->tier[KVT_TIER_WARM].bytes_limit > 0; }
static inline uint64_t kvt_layer_seed(const kvt_nsrec *ns, uint32_t layer) {
  return ns->warm_seed + (uint64_t)layer * 0x9E3779B97F4A7C15ull;
}
/* Copy a pinned block out as K and V in the namespace dtype, decoding a
 * warm one; runs without the lock. 0 or KVT_ECORRUPT. */
int kvt_lblk_copy_out(const kvt_nsrec *ns, const kvt_lblk *b, void *k_out, void *v_out);
void kvt_drop_tblk(kvt_engine *e, kvt_tblk *tb);

/* engine_ns.c: namespaces the store already has */
int kvt_ns_load(kvt_engine *e);

/* Shared between engine.c and its neighbours (engine_*.c). */
void kvt_nsrec_free(kvt_engine *e, kvt_nsrec *ns); /* engine.c */
int kvt_ns_chain_params(kvt_engine *e, kvt_ns_id id, kvt_key *seed, uint32_t *bt); /* engine_ns.c */

/* flush.c: the store's writer. start sets the store's hooks and, for a
 * store written in the background (not KVT_STORE_INLINE) and writable,
 * starts the flusher; stop drains and closes the store. */
int kvt_flush_start(kvt_engine *e);
void kvt_flush_stop(kvt_engine *e);
/* A layer of tb was just published: queue tb for the store when it is
 * complete in every layer, exact, and admitted (an INLINE store takes it
 * at once). With the lock held. */
void kvt_flush_consider(kvt_engine *e, kvt_tblk *tb);
int kvt_flush_admissible(const kvt_engine *e, const kvt_tblk *tb); /* the admission rules */
/* Is it worth waiting for the flusher to free pinned hot blocks? */
int kvt_flush_pending(const kvt_engine *e);
/* Wait for the flusher to finish a group. With the lock held (released
 * while waiting). */
void kvt_flush_wait_room(kvt_engine *e);
void kvt_flush_wait_room_ns(kvt_engine *e, uint64_t ns); /* the same, bounded */
void kvt_flush_backlog(kvt_engine *e);
/* A store the flusher writes: in the background, and writable. */
static inline int kvt_flush_on(const kvt_engine *e) {
  return e->store && !(kvt_store_caps(e->store) & KVT_STORE_INLINE) && !kvt_rdonly(e);
}
/* A store that durable blocks may leave RAM for: flushed, or INLINE. */
static inline int kvt_store_any(const kvt_engine *e) {
  return kvt_flush_on(e) || (kvt_store_caps(e->store) & KVT_STORE_INLINE);
}
/* A store that keeps the bytes (reads go to it). */
static inline int kvt_store_payload(const kvt_engine *e) {
  return (kvt_store_caps(e->store) & KVT_STORE_PAYLOAD) != 0;
}
/* Is key in the store? A hit is a use. */
int kvt_flush_has_locked(kvt_engine *e, const kvt_key *key); /* engine lock held */
/* engine.c: a layer block that can never fit the hot tier, in a
 * metadata-only engine with a cold tier and no warm one, is published
 * straight into the cold tier (a descriptor only). With the lock held. */
int kvt_born_cold(const kvt_engine *e, size_t bytes_each);
void kvt_publish_cold(kvt_engine *e, kvt_tblk *tb, uint32_t layer, kvt_lblk *b);

/* hot_order.c: the hot tier's eviction order (kvt_options.hot_evict).
 * open creates it (0, -ENOMEM) and hooks the hot tier's moves; close
 * frees it, once no token block is indexed. untrack: tb leaves the index.
 * use: a lookup (lookup 1) or an append of tb, a use of its hot layers;
 * a lookup and the append after it count once. victim: the token block
 * whose idle hot layers go next, or NULL (then the LRU list decides).
 * All with the lock held.
 * The learned order's model is kept in the store's index across restarts:
 * restore reads it once the store is open (in kvt_engine_open); checkpoint writes
 * it (lock not held: it takes it), how: KVT_CKPT_DUE only when due (its
 * clock has run KVT_EVICT_MODEL_SAVE_EVERY accesses since it was last
 * kept or tried: the flusher before each group it hands over, and
 * kvt_sync), else always (close); KVT_CKPT_WAIT for a checkpoint running
 * in another thread (kvt_sync, close), else pass (the flusher). */
enum { KVT_CKPT_DUE = 1, KVT_CKPT_WAIT = 2 };
int kvt_hot_order_open(kvt_engine *e);
void kvt_hot_order_close(kvt_engine *e);
void kvt_hot_order_restore(kvt_engine *e);
void kvt_hot_order_checkpoint(kvt_engine *e, int how);
void kvt_hot_order_untrack(kvt_engine *e, kvt_tblk *tb);
void kvt_hot_order_use(kvt_engine *e, kvt_tblk *tb, int lookup);
kvt_tblk *kvt_hot_order_victim(kvt_engine *e);

/* seq.c */
void kvt_seq_free_locked(kvt_seq *s);
size_t kvt_retained_pin(kvt_seq *s, uint32_t layer, kvt_lblk **blk, uint32_t *idx);
void kvt_retained_unpin(kvt_engine *e, kvt_lblk **blk, size_t n);
/* Blocks of (s, layer) that s references but that are not in RAM: a layer
 * block that left for the cold tier, or a durable token block whose layer
 * was neither adopted nor put (nor evicted by the policy). Attention and
 * gathers bring them back first (promote.c) and refuse to run over fewer
 * blocks than the sequence references (KVT_ENOTRESIDENT) when that
 * fails. With the lock held. */
uint32_t kvt_seq_nonresident(const kvt_seq *s, uint32_t layer);
int kvt_seq_away(const kvt_seq *s, uint32_t block, uint32_t layer); /* one such block? */
void kvt_load_free_locked(kvt_load *ld);

/* promote.c: bring the away blocks of (s, layer) back into RAM (one
 * batched cold read) and hold every retained block of the layer pinned, so
 * none leaves before the caller pins what it runs over; release after.
 * Without the lock. 0 (*hold may be NULL: nothing was away) or -ENOMEM. */
typedef struct kvt_promo kvt_promo;
int kvt_promote_hold(kvt_seq *s, uint32_t layer, kvt_promo **hold);
/* Why a block stayed away (KVT_ECORRUPT, KVT_ENOTFOUND, KVT_EFULL,
 * -ENOMEM), or 0. */
int kvt_promote_why(const kvt_promo *hold);
const char *kvt_promote_reason(int why); /* short, for error details */
void kvt_promote_release(kvt_engine *e, kvt_promo *hold);
/* kvt_load_wait and kvt_load_free_locked of a kvt_seq_prefetch() load. */
int kvt_promote_load_wait(kvt_load *ld, size_t *n_ok);
void kvt_promote_load_free_locked(kvt_load *ld);

/* seq.c: reallocate s's arrays for cap blocks and private policy state
 * of stride bytes per (block, layer) (reset when the stride changes).
 * Without the lock; a failure leaves s as it was. 0, KVT_ELIMIT, -ENOMEM. */
int kvt_seq_resize(kvt_seq *s, uint32_t cap, uint32_t stride);

/* serve.c: tell kvt_event_fd()'s reader to look (any thread, locked or
 * not); let go of the request pin of s (with the lock held). */
void kvt_event_signal(kvt_engine *e);
void kvt_event_notify(void *engine); /* the store's read-batch hook */
void kvt_event_close(kvt_engine *e); /* at close, once the store's readers stopped */
void kvt_seq_unpin_locked(kvt_seq *s);

/* policy.c: evict the retained blocks of (s, layer) beyond the policy's
 * budget, lowest scored first. With the lock held. */
void kvt_policy_apply_locked(kvt_seq *s, uint32_t layer);
/* The same for a layer with a warm share (three tiers): the hot share's
 * weakest blocks go warm, the budget's weakest leave, and with
 * allow_promote warm blocks that rank into the hot set by the margin are
 * promoted. May drop the lock (encoding, decoding, cold reads). */
void kvt_policy_tiers_locked(kvt_seq *s, uint32_t layer, const kvt_scorer *sc, int allow_promote);
/* A put of (s, block, layer) succeeded: retained again, key norm of kv. */
void kvt_policy_on_put(kvt_seq *s, uint32_t block, uint32_t layer, const kvt_kv *kv);
/* Per-candidate scratch bytes the ranking needs, per block of cap. */
size_t kvt_policy_scratch_bytes(void);
/* May the policy evict retained block (block, layer) of s now? Lock held. */
int kvt_policy_evictable(const kvt_seq *s, uint32_t block, uint32_t layer);
/* Evict retained block (block, layer) of s (recall makes room). Lock held. */
void kvt_policy_evict_locked(kvt_seq *s, uint32_t block, uint32_t layer);
/* The layer's budget bytes minus its kept bytes (negative when over). */
int64_t kvt_policy_room_locked(const kvt_seq *s, uint32_t layer);

/* lineage.c: content addressing under a lossy policy. With the lock held:
 * mark s lossy for reason why (KVT_LOSSY_*; nothing when it is already);
 * mark it when one of the n blocks it is about to read is approximate;
 * a fork inherits (a lineage of its own) from parent; count a put. */
void kvt_lineage_mark_locked(kvt_seq *s, uint32_t why);
void kvt_lineage_check_locked(kvt_seq *s, kvt_lblk *const *blk, size_t n);
void kvt_lineage_fork_locked(kvt_seq *child, const kvt_seq *parent);
void kvt_lineage_on_put_locked(kvt_seq *s, uint32_t block);
/* The key of the block that follows parent in s: plain, or under the
 * lineage of s when it is lossy. Reads only s. */
void kvt_lineage_key(const kvt_seq *s, const kvt_key *parent, const uint32_t *tokens,
                     uint32_t n_tokens, kvt_key *out);

/* validation shared by put and the tests of shapes (engine.c) */
int kvt_shape_check(const kvt_shape *s);
/* The same, filling *info (may be NULL) for call when it fails. */
int kvt_shape_check_info(const kvt_shape *s, kvt_error_info *info, const char *call);

#endif
