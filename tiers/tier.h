/* tier.h - what every tier shares: the layer-block descriptor, byte
 * accounting under a hard limit, and the LRU list of evictable blocks.
 * A tier knows blocks and bytes, never policies or sequences. Payloads are
 * optional (metadata-only mode): a descriptor then carries only sizes, so
 * the capacity planner runs this very code. All calls are made with the
 * engine lock held unless a comment says otherwise. */
#ifndef KVT_TIER_H
#define KVT_TIER_H

#include <stdint.h>

#include "base/mem.h"

struct kvt_tblk;

/* The part of a namespace shape a tier needs. */
typedef struct kvt_shape_lite {
  uint32_t n_tokens, n_heads, head_dim, dtype;
} kvt_shape_lite;

/* One layer block: K then V of one token block in one layer. Immutable
 * once published; `refs` keeps it in some tier, `pins` keeps it in this one. */
typedef struct kvt_lblk {
  struct kvt_tblk *tb;          /* owning token block */
  uint8_t *payload;             /* this tier's form; NULL when metadata-only */
  struct kvt_lblk *lru_prev;    /* evictable list of its tier (refs == 0) */
  struct kvt_lblk *lru_next;
  struct kvt_lblk *all_prev;    /* every block of its tier, by recency */
  struct kvt_lblk *all_next;
  uint64_t payload_bytes;       /* exact K + V (input precision) */
  uint64_t payload_alloc;       /* bytes allocated for payload (or notional) */
  uint64_t cost;                /* bytes charged in its tier: descriptor + payload_alloc */
  uint32_t layer;
  uint32_t refs;                /* sequences referencing it */
  uint32_t pins;                /* copies in progress outside the lock */
  uint32_t k_len;               /* warm: encoded K bytes; V follows */
  uint32_t rpins;               /* request pins (kvt_seq_pin), each also one of pins */
  /* Fixed while the block is pinned: read by pinning threads without the
   * lock. These bytes share no aligned word with the ones below: the
   * compiler may turn `tier != WARM || checked` into one masked load of a
   * word (gcc does), which would otherwise also read bytes other threads
   * write under the lock - harmless on the CPU, a race for ThreadSanitizer. */
  uint8_t tier;                 /* kvt_tier */
  uint8_t k_codec, v_codec;     /* warm codecs (codec/codec.h) */
  uint8_t checked;              /* warm: payload known well formed (this engine
                                   encoded it): readers skip kvt_codec_check */
  uint8_t approx;               /* hot: dequantized from the warm form by a
                                   promotion, not the bytes put (never written to
                                   the cold tier, reported not exact) */
  uint8_t fixed_pad[3];         /* keeps the bytes below in a word of their own */
  /* Changed under the engine lock at any time. */
  uint8_t on_lru;
  uint8_t busy;                 /* being demoted by some thread */
  uint8_t held;                 /* holds a pin until written to the cold tier */
} kvt_lblk;

typedef struct kvt_tier_state {
  const char *name;
  int tier;                     /* kvt_tier */
  int mem_cat;                  /* kvt_mem category its bytes are counted in */
  uint64_t bytes_limit;
  uint64_t bytes_used;          /* sum of cost of its blocks */
  uint64_t blocks;
  uint64_t lru_bytes;           /* cost of blocks on the evictable list */
  uint64_t lru_pinned_bytes;    /* of which pinned: not evictable right now */
  uint64_t evictions;
  uint64_t moves;               /* blocks that entered or left the tier, ever: the
                                   policy (policy.c) learns from it that nothing but
                                   its own move happened while the lock was dropped */
  kvt_lblk lru;                 /* sentinel: lru.lru_next is the least recent */
  kvt_lblk all;                 /* sentinel of the list of every block */
  /* Told of every block that enters (in 1) or leaves (in 0) the tier,
   * after kvt_tier_account / before kvt_tier_unaccount changes it; NULL:
   * nobody listens. The engine keeps the hot tier's eviction order by it
   * (engine/hot_order.c): the tier itself knows no policy. */
  void (*moved)(void *arg, kvt_lblk *b, int in);
  void *moved_arg;
} kvt_tier_state;

void kvt_tier_init(kvt_tier_state *t, int tier, const char *name, int mem_cat,
                   uint64_t bytes_limit);
/* Bytes that could be freed now by evicting unpinned, unreferenced blocks. */
uint64_t kvt_tier_evictable(const kvt_tier_state *t);
/* Would a block of this cost fit after evicting what may be evicted? */
int kvt_tier_can_fit(const kvt_tier_state *t, uint64_t cost);
void kvt_tier_account(kvt_tier_state *t, kvt_lblk *b);   /* b enters t (most recent) */
void kvt_tier_unaccount(kvt_tier_state *t, kvt_lblk *b); /* b leaves t */
/* Least recently used block that is not pinned or busy, or NULL. */
kvt_lblk *kvt_tier_oldest(kvt_tier_state *t);
void kvt_tier_lru_push(kvt_tier_state *t, kvt_lblk *b);  /* most recent end */
void kvt_tier_lru_remove(kvt_tier_state *t, kvt_lblk *b);
void kvt_tier_lru_touch(kvt_tier_state *t, kvt_lblk *b); /* refresh if listed */
/* Least recently used unpinned evictable block, or NULL. */
kvt_lblk *kvt_tier_lru_victim(kvt_tier_state *t);
void kvt_tier_pin(kvt_tier_state *t, kvt_lblk *b);
void kvt_tier_unpin(kvt_tier_state *t, kvt_lblk *b);

/* Layer-block descriptors live as long as the block, whatever its tier, so
 * sequences can hold pointers to them; payloads belong to a tier. The
 * descriptor's bytes are counted in the tier that holds the block. */
uint64_t kvt_lblk_desc_bytes(void);
/* Allocate a hot block with its exact payload (not yet accounted or
 * published). May be called without the engine lock. NULL on failure. */
kvt_lblk *kvt_hot_alloc(kvt_mem *m, uint64_t payload_bytes, int with_payload);
/* The same into a descriptor the caller holds (a promotion's scratch one:
 * only its payload is kept); 0, or -1 when the payload cannot be had. */
int kvt_hot_init(kvt_mem *m, kvt_lblk *b, uint64_t payload_bytes, int with_payload);
/* Free a block (descriptor and payload) that is in no tier. */
void kvt_lblk_free(kvt_mem *m, int mem_cat, kvt_lblk *b);
/* Free only the payload, counted in mem_cat (KVT_MEM_HOT: the hot form). */
void kvt_payload_free(kvt_mem *m, int mem_cat, kvt_lblk *b);

/* Warm tier (warm.c): the quantized form, K and V encoded one after the
 * other with the codecs of codec/codec.h. */
typedef struct kvt_warm_form {
  uint8_t *payload;
  uint64_t alloc;               /* bytes allocated (or notional) */
  uint32_t k_len;
  uint8_t k_codec, v_codec;
  uint8_t checked;              /* 1: encoded here (kvt_lblk.checked) */
} kvt_warm_form;
/* Notional size of the warm form of one layer block of this shape. A
 * side whose codec is KVT_CODEC_NONE is kept exact (its bytes as given). */
uint64_t kvt_warm_size(const kvt_shape_lite *s, int k_codec, int v_codec);
/* Bytes of one side (K or V) in the warm form: encoded, or exact. */
size_t kvt_warm_side_size(const kvt_shape_lite *s, int codec);
/* Check a warm payload (lengths, and each encoded side); 0 or KVT_ECORRUPT. */
int kvt_warm_check(const kvt_shape_lite *s, const kvt_lblk *b, uint64_t seed);
/* Encode exact K and V (dtype) into a new warm payload; may run unlocked.
 * With k NULL (metadata-only) only sizes are filled. 0, -ENOMEM. */
int kvt_warm_encode(kvt_mem *m, const kvt_shape_lite *s, const void *k, const void *v,
                    int k_codec, int v_codec, uint64_t seed, kvt_warm_form *out);
/* A descriptor (counted in KVT_MEM_WARM) for a block born warm, owning
 * f's payload. NULL on allocation failure (f is not freed). */
kvt_lblk *kvt_warm_alloc(kvt_mem *m, uint64_t payload_bytes, const kvt_warm_form *f);
/* Decode a warm payload into K and V in dtype, checking it first unless
 * b->checked. 0 or KVT_ECORRUPT. */
int kvt_warm_decode(const kvt_shape_lite *s, const kvt_lblk *b, uint64_t seed, void *k_out,
                    void *v_out);

#endif
