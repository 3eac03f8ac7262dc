/* kvtier.h - the whole public API of kvtier, a tiered store for the
 * key/value cache of transformer language models.
 *
 * Every function returns 0 on success or a negative code: -errno for system
 * errors (-ENOMEM, -EIO, ...) and KVT_E* for kvtier's own, in the reserved
 * range [KVT_E_LAST, KVT_E_FIRST]. kvt_strerror() explains either kind. The
 * library never prints, never exits and keeps no global state but one
 * choice made once, when it is loaded: which CPU kernels run (scalar or
 * AVX2/F16C for the codecs, codec/codec.c; the XXH3 build for checksums,
 * base/hash.c), read from cpuid. It is process-wide because it describes
 * the machine, not an engine, and the kvt_codec_* calls take no engine;
 * every kernel gives the same bytes, so it changes speed, never a result.
 * The caller owns every pointer it passes in, and a call keeps none of
 * them after it returns unless its documentation says so.
 *
 * Words used below (see docs/format.md and DESIGN.md section 2):
 *  - namespace: one model producing KV (model id, weights fingerprint, RoPE,
 *    tensor-parallel rank/size) and its shape (layers, KV heads, head dim,
 *    dtype, tokens per block).
 *  - token block: block_tokens consecutive tokens; its 128-bit key chains the
 *    keys of all blocks before it, so equal prefixes give equal keys.
 *  - layer block: the K and V of one token block in one layer, each laid out
 *    [token][kv_head][head_dim] in the namespace dtype.
 *  - reference: a sequence that holds a layer block keeps it alive; it is
 *    never dropped while referenced.
 *  - pin: held by the library itself while it copies a payload outside its
 *    lock, or by a request for a step (kvt_seq_pin()); a pinned block
 *    cannot change tier or be freed.
 *  - retained: the blocks of (sequence, layer) that attention runs over:
 *    every referenced block (in RAM, or not resident and brought back
 *    first), less what the sequence's policy evicted from that layer (see
 *    the policy group).
 *  - not resident: a block of (sequence, layer) that the sequence
 *    references but that is only in the cold tier: it left RAM once
 *    durable, or the token block was appended as durable (stored by an
 *    earlier run) and that layer was not put. The engine brings such
 *    blocks back into RAM itself: kvt_seq_attend() and kvt_seq_gather()
 *    read a layer's missing blocks from the cold tier in one batch, and
 *    kvt_seq_prefetch() does it ahead of time. They never run over fewer
 *    blocks than the sequence references: when a block cannot be brought
 *    back they fail with KVT_ENOTRESIDENT (what the policy evicted on
 *    purpose does not count, and is not brought back).
 *
 * Threads: one engine may be used from several threads at once. A single
 * sequence must not be used from two threads at the same time (as with an
 * LMDB transaction); different sequences may.
 */
#ifndef KVTIER_H
#define KVTIER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 1
#define KVT_VERSION_PATCH 0

/** @defgroup errors Return codes
 * kvtier's own codes; system errors are returned as -errno.
 * @{ */
#define KVT_E_FIRST     (-30900)
#define KVT_ESHAPE      (-30900) /**< a shape is out of range, or differs from the namespace */
#define KVT_EDTYPE      (-30901) /**< dtype differs from the namespace, or is unknown */
#define KVT_ECOUNT      (-30902) /**< a count is zero, too large, or not what the call needs */
#define KVT_ENULL       (-30903) /**< a required pointer is NULL */
#define KVT_ENONFINITE  (-30904) /**< K or V holds NaN or infinity */
#define KVT_EFULL       (-30905) /**< every tier is full and all it holds is referenced */
#define KVT_ELOCKED     (-30906) /**< another writer (engine or process) has the store open */
#define KVT_ERDONLY     (-30907) /**< the engine was opened read-only */
#define KVT_ENOTFOUND   (-30908) /**< no such namespace, block or layer */
#define KVT_ENSCONFLICT (-30909) /**< namespace exists with a different shape */
#define KVT_EOPTION     (-30910) /**< an option is out of range or inconsistent */
#define KVT_ESTATE      (-30911) /**< call out of order for the object's state */
#define KVT_EBUSY       (-30912) /**< object still in use (open sequences, pending loads) */
#define KVT_EBUFSIZE    (-30913) /**< caller buffer size is not what the call needs */
#define KVT_ENOPAYLOAD  (-30914) /**< metadata-only engine: blocks carry no payload */
#define KVT_ELIMIT      (-30915) /**< a fixed limit set at open was reached */
#define KVT_ECORRUPT    (-30916) /**< stored data failed a check */
#define KVT_EVERSION    (-30917) /**< stored data has a format version this build cannot read */
#define KVT_ENOTRESIDENT (-30918) /**< blocks the sequence references are only on disk
                                       and could not be brought back into RAM */
#define KVT_ENOTDURABLE (-30919) /**< blocks sequences reference cannot become durable:
                                      they reached RAM only in quantized form */
#define KVT_EINDEX      (-30920) /**< the cold tier's index is damaged or missing: rebuild it
                                      from the segments (kvt_store_rebuild_index) */
#define KVT_EAUTH       (-30921) /**< a remote node refused the credentials (user/password) */
#define KVT_E_LAST      (-30921)
/** @} */

/** Explain a return code: a KVT_E* code, -errno, or 0. Never NULL; the
 * string is static. */
const char *kvt_strerror(int err);

/** Detail of a failed call: what was wrong, what was expected, what was
 * given. kvt_strerror() says what a code means in general; this says
 * which field of which call. */
typedef struct kvt_error_info {
  int code;           /**< the code the call returned; 0 when nothing is recorded */
  char call[32];      /**< the function that failed, e.g. "kvt_ns_register" */
  char field[48];     /**< what was wrong, e.g. "shape.block_tokens" */
  char expected[96];  /**< what it must be, e.g. "a power of two in 1..4096" */
  char got[96];       /**< what it was, e.g. "12" */
  char message[320];  /**< all of it in one line, e.g. "kvt_ns_register: shape.block_tokens
                           is 12, expected a power of two in 1..4096" */
} kvt_error_info;

struct kvt_engine;
/** Detail of the last failed call that the calling thread made on e and
 * that recorded one. Calls record detail when they return KVT_ESHAPE,
 * KVT_EDTYPE, KVT_EOPTION, KVT_ECOUNT, KVT_EBUFSIZE, KVT_ENSCONFLICT or
 * KVT_ELOCKED (and some other codes); a successful call, or a failure that
 * records nothing, leaves the last detail as it was, so compare info->code
 * with the code you got before using it. Detail is kept per thread and per
 * engine: threads never see each other's, and a call on another engine
 * does not touch e's. The engine keeps detail for the last
 * KVT_ERROR_THREADS threads that failed a call on it; an older thread's
 * detail may be gone (KVT_ENOTFOUND then). It lives until the engine is
 * closed; *info is a copy, the caller's. The detail of a failed
 * kvt_engine_open() comes from kvt_engine_open_info() instead.
 * @return 0; KVT_ENULL; KVT_ENOTFOUND (nothing recorded for this thread;
 *   *info is zeroed). */
int kvt_last_error(struct kvt_engine *e, kvt_error_info *info);
#define KVT_ERROR_THREADS 16u

/** @defgroup types Types
 * @{ */
typedef struct kvt_engine kvt_engine; /**< an open store */
typedef struct kvt_seq kvt_seq;       /**< one agent's context */
typedef struct kvt_load kvt_load;     /**< a batch of submitted loads */
typedef uint32_t kvt_ns_id;           /**< a registered namespace */

/** A token-block key: XXH3-128 in canonical (big-endian) byte order. */
typedef struct kvt_key {
  uint8_t b[16];
} kvt_key;

typedef enum kvt_dtype {
  KVT_F32 = 1,
  KVT_F16 = 2,
  KVT_BF16 = 3,
} kvt_dtype;

typedef enum kvt_tier {
  KVT_TIER_NONE = 0, /**< not stored */
  KVT_TIER_HOT = 1,  /**< RAM, input precision */
  KVT_TIER_WARM = 2, /**< RAM, quantized (warm-tier issue) */
  KVT_TIER_COLD = 3, /**< NVMe (cold-tier issue) */
} kvt_tier;

/** The tiers the fixed arrays of kvt_options and kvt_stats cover. Frozen
 * at 4 (the ABI): a tier added later (a remote one behind the store
 * interface, docs/store-interface.md) does not grow these arrays. Its
 * counters come through kvt_stats_tier() (by tier id, with the size of
 * the caller's struct, so an old caller and a newer library agree on what
 * is read and written). Options by tier id: kvt_options_tier_set() and
 * kvt_options_tier_get(); kvt_options itself has room for ids 1..3 only,
 * so a later tier's options come in a size-first struct of its own at
 * open, as the remote tier's do (kvt_remote_options). */
#define KVT_N_TIERS 4

/** Warm-tier codecs (docs/format.md, "Warm encodings"). */
typedef enum kvt_codec_id {
  KVT_CODEC_NONE = 0,
  KVT_CODEC_K8 = 1,  /**< keys: int8, one f16 scale per (token, head) (default) */
  KVT_CODEC_K8C = 2, /**< keys: int8, one f16 scale per (head, channel) over the block */
  KVT_CODEC_K4 = 3,  /**< keys: 4-bit, one f16 scale per (token, head) */
  KVT_CODEC_V2 = 4,  /**< values: Hadamard-rotated Lloyd-Max 2-bit, f16 norm */
  KVT_CODEC_V3 = 5,  /**< values: the same, 3-bit (default) */
  KVT_CODEC_V4 = 6,  /**< values: the same, 4-bit */
  /* Lean forms for the warm tier (docs/format.md, "Lean warm encodings"):
   * no header, u8 log2 scales; a decoder learns the shape from its caller. */
  KVT_CODEC_K8B = 7,  /**< keys: int8, one u8 log2 scale for the whole block */
  KVT_CODEC_V2L = 8,  /**< values: as V2 with a u8 log2 norm per (token, head) */
  KVT_CODEC_V3L = 9,  /**< values: as V3, u8 norm */
  KVT_CODEC_V4L = 10, /**< values: as V4, u8 norm */
} kvt_codec_id;

/** The shape a codec works on: one K or V tensor of a layer block,
 * [n_tokens][n_heads][head_dim]. The seed picks the random sign diagonal of
 * the value codecs' rotation (kvtier uses one per namespace and layer). */
typedef struct kvt_codec_shape {
  uint32_t n_tokens;
  uint32_t n_heads;
  uint32_t head_dim;
  uint32_t pad;
  uint64_t seed;
} kvt_codec_shape;

/** Apply to every layer in kvt_ns_set_codec(). */
#define KVT_ALL_LAYERS UINT32_MAX

/** The shape of the KV a namespace produces. */
typedef struct kvt_shape {
  uint32_t n_layers;     /**< 1 .. KVT_MAX_LAYERS */
  uint32_t n_kv_heads;   /**< KV heads of this tensor-parallel rank, 1 .. KVT_MAX_HEADS */
  uint32_t head_dim;     /**< 1 .. KVT_MAX_HEAD_DIM */
  uint32_t dtype;        /**< a kvt_dtype */
  uint32_t block_tokens; /**< power of two, 1 .. KVT_MAX_BLOCK_TOKENS */
} kvt_shape;

#define KVT_MAX_LAYERS 1024u
#define KVT_MAX_HEADS 1024u
#define KVT_MAX_HEAD_DIM 1024u
#define KVT_MAX_BLOCK_TOKENS 4096u
#define KVT_MAX_BLOCK_BYTES (256u << 20) /**< K plus V of one layer block */
#define KVT_MAX_ID_LEN 255u              /**< model id, fingerprint, rope scaling */

/** Everything that decides whether two producers' KV is interchangeable. */
typedef struct kvt_ns_desc {
  const char *model_id;           /**< e.g. "meta-llama/Llama-3.1-8B"; required */
  const char *weights_fingerprint;/**< e.g. a SHA-256 of the weights; required */
  double rope_theta;              /**< RoPE base; 0 when the model has none */
  uint32_t rope_dims;             /**< rotated dims per head; 0 = head_dim */
  const char *rope_scaling;       /**< canonical text of any RoPE scaling, or NULL */
  uint32_t tp_rank;               /**< tensor-parallel rank, < tp_size */
  uint32_t tp_size;               /**< tensor-parallel size, >= 1 */
  kvt_shape shape;
} kvt_ns_desc;

/** Testing only: inject I/O faults into the cold tier's I/O (see
 * io/io.h). Calls of the kinds in ops count from 1; from call number
 * `after` on, `count` calls (0 = all) fail as `kind` says. */
typedef struct kvt_test_fault {
  uint32_t ops;    /**< bits: 1 << 1 reads, 1 << 2 writes, 1 << 3 syncs */
  uint32_t kind;   /**< 0 none, 1 EIO, 2 ENOSPC, 3 short, 4 torn write, 5 bit flip */
  uint64_t after;
  uint64_t count;
  uint64_t seed;
} kvt_test_fault;

/** Admission rules of the cold tier (kvt_options.cold_admit). */
#define KVT_ADMIT_ALL 0    /**< every complete token block */
#define KVT_ADMIT_PROMPT 1 /**< only blocks some sequence appended as prompt */

/** I/O backends of the cold tier. */
#define KVT_BACKEND_AUTO 0  /**< io_uring when it works here, else pread/pwrite */
#define KVT_BACKEND_URING 1 /**< io_uring or fail at open */
#define KVT_BACKEND_PREAD 2 /**< pread/pwrite */

/** Options for kvt_engine_open(). Fill with kvt_options_init() first.
 * The warm tier exists when its limit is above 0: then a put that finds
 * the hot tier full demotes its least recently used blocks to warm
 * (encoded); warm drops unreferenced blocks LRU-first. */
typedef struct kvt_options {
  /* The three per-tier arrays are the shorthand for the first four tier
   * ids (0 none, hot, warm, cold); kvt_options_tier_set() and
   * kvt_options_tier_get() reach the same fields by tier id. */
  uint64_t tier_bytes_limit[KVT_N_TIERS]; /**< hard byte limit per tier (index by kvt_tier) */
  uint32_t flags;                 /**< KVT_OPEN_* */
  uint32_t max_seqs;              /**< open sequences at once */
  uint32_t max_namespaces;        /**< registered namespaces */
  uint32_t max_seq_blocks;        /**< token blocks in one sequence */
  uint32_t max_load_reqs;         /**< requests in one kvt_load_submit() */
  double tier_load_gbps[KVT_N_TIERS]; /**< bandwidth used for load-time estimates */
  double tier_load_latency_us[KVT_N_TIERS]; /**< fixed cost per block in estimates */
  uint64_t test_fail_alloc_after; /**< testing: fail the Nth allocation (0 = never) */
  /* The cold tier exists when tier_bytes_limit[KVT_TIER_COLD] > 0, or is
   * opened read-only when the store has one. A writer on a store that has
   * a cold tier must give a limit (the store does not record one):
   * kvt_engine_open() refuses 0 with KVT_EOPTION rather than hide the
   * stored blocks. Its limit must hold two
   * segments: one stays spare for relocating blocks out of a reclaimed
   * segment (docs/format.md, "Capacity"). */
  uint64_t cold_segment_bytes;    /**< one segment file; >= 1 MiB, multiple of 4 KiB (64 MiB) */
  uint64_t cold_group_bytes;      /**< records made durable together, at most (16 MiB) */
  uint64_t cold_index_bytes;      /**< LMDB map size of a writer; 0 (default): 1/16 of the
                                       cold limit, at least 64 MiB (address space, sparse) */
  uint32_t cold_admit;            /**< KVT_ADMIT_ALL, or KVT_ADMIT_PROMPT: only token blocks
                                       appended as prompt (see kvt_seq_output()) */
  uint32_t cold_admit_min_seen;   /**< write a token block once appended this often (1: all);
                                       both rules must say yes, and with cold_evict
                                       KVT_EVICT_LEARNED (the default) a full tier may
                                       also decline new content (a block extending a
                                       prefix seen once) its model predicts unused:
                                       it is not written, kvt_sync() still returns 0 and
                                       kvt_seq_durable() stops before it
                                       (kvt_tier_stats.declined of the cold tier counts
                                       these declines) */
  uint32_t cold_compress;         /**< 1: zstd on byte planes where it saves >= 1/16, only
                                       while writing keeps up (0: off; on f16 KV it saves
                                       ~4-12% of the disk, and reads decode slower) */
  uint32_t io_backend;            /**< KVT_BACKEND_* (AUTO) */
  uint32_t io_depth;              /**< queue depth, 1 .. 4096 (64) */
  kvt_test_fault test_fault;      /**< testing: I/O faults in the cold tier */
  uint32_t cold_evict;            /**< KVT_EVICT_*: which blocks the cold tier gives up
                                       first when full (KVT_EVICT_LEARNED) */
  uint32_t hot_evict;             /**< KVT_EVICT_*: which token blocks the hot tier gives up
                                       first when full, among those no sequence references
                                       (KVT_EVICT_LEARNED: the cold tier's order, with a
                                       model of its own; KVT_EVICT_LRU: least recently used
                                       layer blocks, as before). All idle hot layers of the
                                       chosen token block go together. With a warm tier,
                                       room in the hot tier is made by demoting the least
                                       recently used block instead; the order then decides
                                       only what the warm tier's failure drops. Its model
                                       (6.5 MiB, fixed at open) is not kept across restarts.
                                       The field was `pad`: options zeroed instead of
                                       filled by kvt_options_init() now get 0 here,
                                       KVT_EVICT_CHAIN, not the LRU list they had */
} kvt_options;

/** Orders in which the cold tier (kvt_options.cold_evict) and the hot
 * tier (kvt_options.hot_evict) give up token blocks when full. Blocks
 * still referenced by a sequence are never given up. */
#define KVT_EVICT_CHAIN 0      /**< tails of prefix chains first (a block is useless
                                    without its prefix): only blocks with no stored
                                    child are candidates; a chain's tail as written
                                    (never used or extended since) goes first, as a
                                    request's partial last block is rarely asked for
                                    again; then the least recently used */
#define KVT_EVICT_LRU 1        /**< plain least recently used, for comparison */
#define KVT_EVICT_CHAIN_LEAF 2 /**< chain tails, least recently used, no probation */
#define KVT_EVICT_LEARNED 3    /**< chain tails as CHAIN, ranked by a small model of
                                    reuse trained online from the tier's own accesses
                                    (tiers/reuse_model.h): a block predicted not to be
                                    used again within the tier's horizon is not written
                                    when the tier is full, and leaves first. The
                                    model's state is kept in the cold index across
                                    restarts. While a shadow LRU of sampled keys
                                    hits more often than the tier, it decides as
                                    CHAIN (tiers/evict_guard.h). The default */

/** Open read-only: no lock, no writes; for stat and fsck beside a live store. */
#define KVT_OPEN_RDONLY 0x1u
/** On a dedup hit, compare the new content with the stored one and count
 * differences in kvt_stats.dedup_mismatches (the stored copy is kept). */
#define KVT_OPEN_VERIFY_DEDUP 0x2u
/** Metadata-only: blocks carry sizes, not payloads; puts take NULL data and
 * reads fail with KVT_ENOPAYLOAD. For capacity planning (kvtier plan).
 * The directory may then be NULL: nothing is read or written on disk.
 * With a cold limit, the cold tier is an in-memory index of token-block
 * records (their on-disk sizes, kvt_cold_record_bytes()) under that limit,
 * evicted in the kvt_options.cold_evict order, with no files and no
 * syncs: a token block is written to it as soon as it is complete in
 * every layer and admitted. A put that can never fit the hot tier (its
 * limit below one layer block) and finds no warm tier goes straight to
 * the cold tier: the caller computed the block and kvtier only stores it. */
#define KVT_OPEN_METADATA_ONLY 0x4u
/** Do not create the directory when it does not exist, nor a store (a
 * cold tier's index/) in a directory that holds none. */
#define KVT_OPEN_NOCREATE 0x8u

/** K and V of one layer block, as the caller holds them. */
typedef struct kvt_kv {
  const void *k;        /**< [n_tokens][n_heads][head_dim]; NULL only in metadata-only mode */
  const void *v;        /**< same layout as k */
  uint32_t dtype;       /**< must equal the namespace dtype */
  uint32_t n_tokens;    /**< must equal block_tokens */
  uint32_t n_heads;     /**< must equal n_kv_heads */
  uint32_t head_dim;    /**< must equal head_dim */
} kvt_kv;

/** What kvt_seq_append() found. */
typedef struct kvt_append_info {
  uint32_t block;          /**< index of the appended token block in the sequence */
  uint32_t layers_present; /**< layers already in RAM (adopted; no put needed) */
  kvt_key key;             /**< the token block's key (under the sequence's lineage
                                when it is lossy: kvt_seq_lineage()) */
  uint32_t durable;        /**< 1: the block is in the cold tier (all layers): its
                                layers can be loaded, and puts add RAM copies only */
  uint32_t pad;
  uint64_t layers_mask[KVT_MAX_LAYERS / 64]; /**< which layers layers_present counts:
                                layer l is present iff bit l % 64 of layers_mask[l / 64]
                                is set (KVT_LAYER_PRESENT); bits of layers at or past the
                                namespace's n_layers are 0. Added after pad: callers built
                                against a header without it must be rebuilt. */
} kvt_append_info;

/** 1 when layer l (< KVT_MAX_LAYERS) is set in info->layers_mask, else 0. */
#define KVT_LAYER_PRESENT(info, l) \
  ((unsigned)(((info)->layers_mask[(l) / 64u] >> ((l) % 64u)) & 1u))

/** One token block found by kvt_lookup(). */
typedef struct kvt_lookup_entry {
  kvt_key key;
  uint32_t tier;         /**< slowest tier any of its layers is in (kvt_tier) */
  uint32_t pad;
  double est_load_us;    /**< estimated time to load all its layers */
} kvt_lookup_entry;

/** One block gathered by kvt_seq_gather(). */
typedef struct kvt_gathered {
  uint32_t block;        /**< index of the token block in the sequence */
  uint32_t token_pos;    /**< position of its first token (block * block_tokens) */
  uint32_t tier;         /**< tier it was read from (kvt_tier) */
  uint32_t exact;        /**< 1 when the bytes are the stored input precision (0 for
                               warm blocks and for hot ones a promotion dequantized) */
} kvt_gathered;

/** One layer-block load for kvt_load_submit(). */
typedef struct kvt_load_req {
  kvt_key key;           /**< token block key */
  uint32_t layer;
  uint32_t pad;
  void *k_out;           /**< caller buffer of bytes_each bytes */
  void *v_out;           /**< caller buffer of bytes_each bytes */
  size_t bytes_each;     /**< must equal one layer block's K (or V) size */
  int status;            /**< out: 0, or why this request failed */
  uint32_t tier;         /**< out: tier it was loaded from */
} kvt_load_req;

/** Counters and gauges. Bytes come from the engine's own accounting of every
 * byte it allocated, not from a formula. */
typedef struct kvt_stats {
  uint64_t tier_blocks[KVT_N_TIERS]; /**< layer blocks held per tier */
  uint64_t tier_bytes[KVT_N_TIERS];  /**< bytes allocated per tier (payload + descriptor);
                                          metadata-only: payloads counted as if present */
  uint64_t tier_limit[KVT_N_TIERS];  /**< the limits in force */
  uint64_t index_bytes;      /**< hash table and token-block entries */
  uint64_t seq_bytes;        /**< sequence state */
  uint64_t other_bytes;      /**< namespaces, loads, engine */
  uint64_t total_bytes;      /**< every byte the engine has allocated */
  uint64_t logical_bytes;    /**< payload bytes as the sequences see them (each reference counted) */
  uint64_t dedup_saved_bytes;/**< payload bytes not stored because blocks are shared */
  uint64_t token_blocks;     /**< distinct token blocks known in RAM */
  uint64_t namespaces;
  uint64_t seqs;             /**< open sequences */
  uint64_t puts;             /**< layer-block puts */
  uint64_t dedup_hits;       /**< layer blocks found stored by a put or an append
                                  (an append counts each layer it adopts) */
  uint64_t dedup_mismatches; /**< dedup hits whose content differed (KVT_OPEN_VERIFY_DEDUP) */
  uint64_t lookups;          /**< kvt_lookup() calls */
  uint64_t lookup_blocks_hit;  /**< token blocks found by lookups */
  uint64_t lookup_blocks_miss; /**< full token blocks asked for and not found */
  uint64_t reads;            /**< layer blocks copied out (read, gather, load) */
  uint64_t reads_exact;      /**< of which were exact */
  uint64_t evictions[KVT_N_TIERS]; /**< unreferenced blocks dropped per tier */
  uint64_t put_full;         /**< puts refused with KVT_EFULL */
  uint64_t demotions;        /**< layer blocks moved hot -> warm (encoded) */
  uint64_t reads_approx;     /**< layer blocks read from their quantized form */
  uint64_t attends;          /**< kvt_seq_attend() calls */
  uint64_t cold_records;     /**< token blocks in the cold tier's index */
  uint64_t cold_queued;      /**< token blocks waiting to be written */
  uint64_t cold_written;     /**< token blocks this engine made durable */
  uint64_t cold_reads;       /**< layer slices read from the cold tier */
  uint64_t cold_read_bytes;
  uint64_t cold_write_bytes;
  uint64_t cold_checksum_failures; /**< cold reads refused by a check (each a miss) */
  uint64_t cold_write_failures;    /**< groups the cold tier failed to write */
  uint64_t cold_segments;
  uint64_t cold_segment_bytes; /**< one segment file, as the store records it (0 without files) */
  uint64_t cold_reclaims;    /**< segments reclaimed (freed for reuse) by this engine */
  uint64_t cold_relocated;   /**< referenced blocks written again out of reclaimed segments */
  uint64_t promotions;       /**< layer blocks only on disk that attention, gathers or
                                  kvt_seq_prefetch() brought back into RAM */
  char io_backend[32];       /**< "uring", "pread", ... ("" without a cold tier) */
  char io_why[160];          /**< why that backend */
  uint64_t recalls;          /**< evicted layer blocks the policy's recall brought back
                                  (docs/policy.md, "Recall") */
  uint64_t recall_useful;    /**< of which, at their next observation, received more mass
                                  than the weakest evictable retained block */
  uint64_t recall_unavailable; /**< recalls a sketch asked for with no cold copy to read */
  uint64_t recall_bytes;     /**< K and V bytes recalls read from the cold tier */
  uint64_t recall_ns;        /**< time spent starting recall reads and waiting for them
                                  (the decisions are not timed: kvtier bench policy) */
  uint64_t sketch_bytes;     /**< RAM held by key sketches of evicted blocks (a gauge) */
  uint64_t recall_late;      /**< recall candidates whose cold copy the flusher had not
                                  written within the wait's deadline (then unavailable,
                                  and the run no longer repeatable: docs/policy.md) */
} kvt_stats;
/** @} */

/** @defgroup engine Engine
 * @{ */

/** Fill opt with the defaults: hot 1 GiB, warm 0 (no warm tier), cold 0
 * (the cold tier does not exist yet), 4096 sequences, 256 namespaces, 1M
 * blocks per sequence, 65536 load requests per batch, cold eviction
 * KVT_EVICT_LEARNED. */
void kvt_options_init(kvt_options *opt);

/** The options every tier has, set and read by its id
 * (kvt_options_tier_set(), kvt_options_tier_get()), so a caller need not
 * index kvt_options' arrays. Fields are only ever appended; `size` comes
 * first and says how many bytes of the struct the caller built against
 * (set it to sizeof(kvt_tier_options), and zero the struct first). For ids
 * 1..3 these are the fields of kvt_options' per-tier arrays at that index:
 * one storage, two ways to reach it. Options of one store implementation
 * only (the cold tier's segment size, the remote tier's URL) stay where
 * they are: kvt_options' cold_* fields, kvt_remote_options
 * (docs/store-interface.md, "The public ABI"). */
typedef struct kvt_tier_options {
  uint64_t size;            /**< in (set): bytes of this struct the caller passes, equal
                                 to the size argument; out (get): bytes written */
  uint64_t bytes_limit;     /**< hard byte limit (tier_bytes_limit[tier]); 0: no tier */
  double load_gbps;         /**< bandwidth for load-time estimates, finite and > 0 */
  double load_latency_us;   /**< fixed cost per block in estimates, finite and >= 0 */
} kvt_tier_options;

/** Set the options of tier `tier` in *opt from *to, which the caller sized
 * `size` bytes (pass sizeof(kvt_tier_options)). Validated before anything
 * is written: on any error *opt is as it was. A larger struct than this
 * library knows (a newer caller) is accepted when its bytes past the
 * library's struct are all 0, and refused otherwise: the caller asked for
 * options this library would ignore. Tiers 1..3 are hot, warm and cold
 * (the durable store); ids past those name tiers added later. opt and to
 * are the caller's; nothing is kept. kvt_engine_open() checks the same
 * rules on every tier (a limit on tier 0 is refused there).
 * @return 0; KVT_ENULL (opt or to); KVT_ENOTFOUND (no tier with that id
 *   in this library: KVT_TIER_NONE, or an id it does not know);
 *   KVT_EBUFSIZE (size below the first kvt_tier_options' size);
 *   KVT_EOPTION (size above 4096, to->size differs from size, a nonzero
 *   byte past this library's struct, load_gbps not finite and > 0, load_latency_us not
 *   finite and >= 0). */
int kvt_options_tier_set(kvt_options *opt, uint32_t tier, const kvt_tier_options *to, size_t size);

/** Copy the options of tier `tier` in *opt into *to, at most size bytes
 * of it (pass sizeof(kvt_tier_options)); to->size says how many were
 * written (a newer caller's fields past it are left as they were).
 * @return 0; KVT_ENULL; KVT_EBUFSIZE (size below 8, the size field);
 *   KVT_ENOTFOUND (as kvt_options_tier_set(); *to is untouched). */
int kvt_options_tier_get(const kvt_options *opt, uint32_t tier, kvt_tier_options *to,
                         size_t size);

/** Open the store in directory dir, creating it unless KVT_OPEN_NOCREATE.
 * A writer holds an exclusive flock() on the directory dir itself until
 * kvt_engine_close() (a lock file could be unlinked under it); the kernel
 * drops it when the process dies, so a killed writer leaves no stale lock.
 * A read-only open takes no lock, except where it may not write
 * dir/index/lock.mdb (another user's store): then it holds a shared
 * flock() on dir, fails with KVT_ELOCKED while a writer runs, and a writer
 * fails with KVT_ELOCKED while it is open (docs/concurrency.md, "The
 * store lock").
 * @param dir may be NULL for a metadata-only engine (KVT_OPEN_METADATA_ONLY):
 *   no directory, no lock.
 * @param opt may be NULL for the defaults; copied, not kept.
 * @param out receives the engine; on failure set to NULL.
 * @return 0; KVT_ENULL; KVT_EOPTION (also: a writer with cold limit 0 on a
 *   store that has a cold tier); KVT_ELOCKED when another writer holds the
 *   store, in another process or in this one (another engine), or a
 *   read-only open that holds it shared (above);
 *   -ENOENT (read-only or NOCREATE, no directory, or, with a cold tier, a
 *   directory that holds no store: nothing is created in it); KVT_EINDEX
 *   (the cold tier's index is damaged or missing: kvt_store_rebuild_index);
 *   -ENOMEM; other -errno from the file system. */
int kvt_engine_open(const char *dir, const kvt_options *opt, kvt_engine **out);

/** kvt_engine_open(), and on failure the detail of what was wrong in
 * *info (which may be NULL): the option and its value for KVT_EOPTION,
 * who holds the lock for KVT_ELOCKED ("this process" when another engine
 * of the same process has the store open for writing, else the pid that
 * took it), the path for -errno from the file system. There is no engine
 * to ask afterwards, hence the out-parameter. On success info->code is 0.
 * @return as kvt_engine_open(). */
int kvt_engine_open_info(const char *dir, const kvt_options *opt, kvt_engine **out,
                         kvt_error_info *info);

/** Close the engine and free everything it holds, sequences and pending
 * loads included (their handles become invalid). Accepts NULL. */
void kvt_engine_close(kvt_engine *e);

/** Wait until every token block completed so far (all layers put) and
 * admitted to the cold tier (cold_admit, cold_admit_min_seen and,
 * with KVT_EVICT_LEARNED on a full tier, the model: kvt_options; its
 * declines are counted in kvt_tier_stats.declined) is durable: written,
 * fdatasync'ed and indexed.
 * Without a cold tier there is nothing to make durable: returns 0.
 * A kvt_drop_prefix() removing blocks from the store meanwhile is waited
 * for: blocks put during its removals are written after them.
 * Durable means it survives a power loss, not only a crash of the process:
 * once this returns 0, those blocks load back bit-exact after a power cut
 * at any later moment, unless evicted or dropped since (given a device
 * that honours fdatasync and writes a 512-byte sector whole); blocks not
 * yet acknowledged may be lost, but never load other bytes.
 * docs/format.md, "Power loss", says exactly what is fsynced when, and
 * tests/test_powercut.c checks it.
 * @return 0; KVT_ENULL; KVT_ERDONLY; the first error the cold tier met
 *   since the last kvt_sync() (-EIO, -ENOSPC, KVT_EFULL...): the blocks it
 *   could not write stay in RAM, not durable, and nothing durable is lost.
 *   Such an error (KVT_EFULL too: a cold tier full of referenced blocks)
 *   is returned again by every kvt_sync() while a block it kept from the
 *   cold tier is referenced by a sequence and not durable
 *   (kvt_seq_durable() stops before it; kvt_seq_durable_error() names it
 *   to every sequence that holds the block); 0 again once it is durable
 *   or released. KVT_ENOTDURABLE, likewise: a complete, admitted block some
 *   sequence references reached RAM only in quantized form, so there is no
 *   exact copy to write (the hot tier is below one layer block, so puts
 *   are born warm, or cannot hold all layers of a token block, so layers
 *   were demoted before it was complete). */
int kvt_sync(kvt_engine *e);

/** Copy the counters into *st. @return 0; KVT_ENULL. */
int kvt_stats_get(kvt_engine *e, kvt_stats *st);

/** The counters of one tier, asked for by its id (kvt_stats_tier()): the
 * way a tier added after KVT_N_TIERS was frozen reports itself without
 * changing kvt_stats. Fields are only ever appended; a caller passes
 * sizeof the struct it was built against, and the library writes the
 * smaller of that and its own sizeof, never a byte past it; `filled` says
 * how many (a newer caller's fields past it are left as they were). */
typedef struct kvt_tier_stats {
  uint64_t filled;       /**< out: bytes of this struct the library wrote */
  uint32_t tier;         /**< out: the id asked for (kvt_tier, or a later tier's id) */
  uint32_t present;      /**< out: 1 when this engine has the tier (a limit above 0, or a
                              store opened), else 0 and the counters are 0 */
  char name[16];         /**< out: "hot", "warm", or the store's implementation name
                              ("disk", "metadata", ...) for a durable tier */
  uint64_t blocks;       /**< layer blocks (RAM tiers) or token-block records (a store) held */
  uint64_t bytes;        /**< bytes held: allocated (RAM tiers), live records (a store) */
  uint64_t limit;        /**< the byte limit in force */
  uint64_t evictions;    /**< blocks dropped (RAM) or records removed to make room (a store) */
  uint64_t reads;        /**< a store: layer slices read */
  uint64_t read_bytes;   /**< a store: bytes read */
  uint64_t write_bytes;  /**< a store: bytes written */
  uint64_t checksum_failures; /**< a store: reads refused by a check */
  uint64_t write_failures;    /**< a store: groups it failed to write */
  uint64_t declined;     /**< a store: token blocks that were complete and admissible
                              (kvt_options.cold_admit, cold_admit_min_seen) but that the
                              store's own admission declined to write: with cold_evict
                              KVT_EVICT_LEARNED, a full tier whose model predicts the
                              block unused. Each decision counts (a block declined, then
                              appended again and declined again, counts twice); counted
                              from this engine's open. 0 for RAM tiers (the hot tier
                              keeps whatever a sequence put) */
  uint64_t model_accesses; /**< the hot tier and a store, with the learned eviction order
                              (KVT_EVICT_LEARNED): the accesses its model has counted,
                              those of the model it started from included; 0 for another
                              order, and in a read-only engine's store (it runs none) */
  uint64_t model_saved_accesses; /**< the same count for the copy of that model the store
                              keeps across restarts (the cold index): what an engine
                              opened now would start from; it trails model_accesses by
                              under 4,096 while blocks are written (docs/format.md).
                              0: the store keeps none (a new store, a metadata-only
                              engine, or a copy that does not check) */
} kvt_tier_stats;

/** Copy the counters of tier `tier` into *st, at most size bytes of it
 * (pass sizeof(kvt_tier_stats)); st->filled says how many were written.
 * Tiers 1..3 are hot, warm and cold (the durable store, whichever
 * implementation); ids past those name tiers added later. Any thread; st
 * is the caller's.
 * @return 0; KVT_ENULL; KVT_EBUFSIZE (size below 8, the filled field);
 *   KVT_ENOTFOUND (no tier with that id in this library: KVT_TIER_NONE,
 *   or an id it does not know; *st is untouched). */
int kvt_stats_tier(kvt_engine *e, uint32_t tier, kvt_tier_stats *st, size_t size);

/** Render the engine's counters and gauges as text in the Prometheus
 * exposition format (version 0.0.4; every family with HELP and TYPE
 * lines): per tier (label tier="hot", "warm", "cold") blocks, bytes,
 * limit, lookup hits and misses, puts, reads, demotions, promotions,
 * evictions, checksum failures; latency histograms of cold reads and
 * group commits (kvtier_cold_read_seconds, kvtier_cold_group_commit_seconds);
 * how far durability lags; engine totals. docs/metrics.md lists every
 * name. Counters count from this engine's open: a read-only engine
 * (kvtier stat) shows the store's gauges and its own, idle, counters.
 * Each group of values is copied under the engine lock (the stats, then
 * the per-tier counters: not one atomic snapshot; a counter may run a
 * little ahead of another); nothing is allocated, and the lock is held
 * only while counters are copied and the open sequences' durable
 * watermarks are walked.
 * @param buf receives the text, NUL-terminated; may be NULL when len is 0
 *   (a size query).
 * @param len capacity of buf in bytes, the terminating NUL included.
 * @param needed may be NULL; receives the length of the whole text
 *   without the NUL (so len must exceed it). Counters and series may grow
 *   between two calls: after a size query give some room to spare.
 * @return 0 (buf holds the whole text); KVT_ENULL (e, or buf with len >
 *   0); KVT_EBUFSIZE when the text does not fit: nothing partial is
 *   left, buf[0] is '\0' when len > 0, *needed says what this snapshot
 *   takes. */
int kvt_metrics_render(kvt_engine *e, char *buf, size_t len, size_t *needed);

/** What kvt_fsck() found. */
typedef struct kvt_fsck_result {
  uint64_t checked;      /**< index entries checked */
  uint64_t bad;          /**< entries whose record failed a check */
  uint64_t removed;      /**< of which removed (repair) */
} kvt_fsck_result;

/** Verify every entry of the cold tier's index against its namespace
 * (known; same n_layers, dtype and bytes_each) and its record on disk:
 * every field of the record header (length, generation, key, shape,
 * position, parent, namespace, layer table) and every slice's range and
 * checksum. With repair (a writer only) the broken entries are removed,
 * so they become misses. report (may be NULL) is called for each problem
 * with the block's key and what failed, naming the segment, offset and
 * layer (the string lives until report returns). Works on a read-only
 * engine beside a live writer.
 * @return 0 (look at res->bad); KVT_ENULL; KVT_ENOTFOUND (no cold tier);
 *   KVT_ERDONLY (repair on a read-only engine); -errno. */
int kvt_fsck(kvt_engine *e, int repair, kvt_fsck_result *res,
             void (*report)(void *arg, const kvt_key *key, const char *what), void *arg);

/** What kvt_store_rebuild_index() did. */
typedef struct kvt_rebuild_result {
  uint64_t segments;     /**< segment files scanned */
  uint64_t records;      /**< intact records found (every checksum right) */
  uint64_t damaged;      /**< record headers found whose record failed a check */
  uint64_t superseded;   /**< intact records not indexed: an older life of their
                              segment, or a key a newer record also holds */
  uint64_t blocks;       /**< token blocks in the new index */
  uint64_t namespaces;   /**< namespaces in the new index */
  uint64_t orphans;      /**< of the blocks, those of a namespace not recovered (found
                              again once that namespace is registered) */
  uint64_t segment_bytes;/**< the store's segment size, as the new index records it */
  char old_index[64];    /**< where the old index was kept, under dir ("" if none) */
} kvt_rebuild_result;

/** Rebuild the cold tier's index of the store in dir from its segment
 * files, when the index is damaged or lost (KVT_EINDEX). Every record is
 * read and checked (header and every layer's checksum); each intact one
 * of the current life of its segment goes back into a fresh index, the
 * newest segment generation winning when two hold the same key.
 * Namespaces come from the copies in dir/namespaces/ and from the old
 * index where it still reads. The old index is kept aside as
 * dir/index.old-N. Blocks dropped or evicted whose records are still
 * intact may come back: they hold exactly the bytes written for their
 * key. Needs the store closed (it takes the writer lock).
 * @param segment_bytes 0: as the old index says, else inferred from the
 *   files (the largest, rounded up to a MiB); or the size the store was
 *   created with (kvt_options.cold_segment_bytes).
 * @param res receives the counts. report (may be NULL) is called with a
 *   line on each damaged record and anything else worth knowing.
 * @return 0; KVT_ENULL; KVT_ELOCKED (a writer has the store open);
 *   -ENOENT (no store there); KVT_EOPTION (segment_bytes not a multiple
 *   of 4 KiB, under 1 MiB or under a segment file's size); -ENOMEM;
 *   -errno. On failure the old index is where it was. */
int kvt_store_rebuild_index(const char *dir, uint64_t segment_bytes, kvt_rebuild_result *res,
                            void (*report)(void *arg, const char *what), void *arg);

/** @} */

/** @defgroup ns Namespaces and keys
 * @{ */

/** Register a namespace, or find it when one with the same identity (model
 * id, fingerprint, RoPE, TP rank and size) exists with the same shape.
 * rope_dims 0 means head_dim (so with rope_dims 0 a different head_dim is
 * a different identity); a NULL rope_scaling is the same as "". Ids of
 * dropped namespaces are refused (a 16-bit generation per slot).
 * @return 0; KVT_ENULL (desc, out, model id or fingerprint NULL);
 *   KVT_EOPTION for a bad descriptor (empty or too long strings, tp_rank >=
 *   tp_size, rope_theta negative or not finite, rope_dims > head_dim);
 *   KVT_ESHAPE, KVT_EDTYPE for an invalid shape; KVT_ENSCONFLICT when it
 *   exists with another shape; KVT_ELIMIT; KVT_ERDONLY; -ENOMEM. */
int kvt_ns_register(kvt_engine *e, const kvt_ns_desc *desc, kvt_ns_id *out);

/** The index-th registered namespace (0, 1, ...), for listing; a store
 * with a cold tier knows those registered by earlier processes too. The
 * strings in *desc belong to the engine and stay valid until the namespace
 * is dropped or the engine closed. @return 0; KVT_ENULL; KVT_ENOTFOUND
 * past the last one. */
int kvt_ns_get(kvt_engine *e, uint32_t index, kvt_ns_id *id, kvt_ns_desc *desc);

/** The shape of a namespace. @return 0; KVT_ENULL; KVT_ENOTFOUND. */
int kvt_ns_shape(kvt_engine *e, kvt_ns_id ns, kvt_shape *out);

/** Drop a namespace and every block it stored (a model upgrade must not
 * leave stale KV). @return 0; KVT_ENOTFOUND; KVT_EBUSY while sequences of
 * it are open or loads pending; KVT_ERDONLY. */
int kvt_ns_drop(kvt_engine *e, kvt_ns_id ns);

/** Choose the warm codecs of one layer (or KVT_ALL_LAYERS) of ns: a key
 * codec (K8, K8C, K4, K8B) and a value codec (V2, V3, V4, V2L, V3L, V4L;
 * the lean ones cost least with small heads or blocks). Either side (not
 * both) may be KVT_CODEC_NONE: that side is then kept exact in the warm
 * tier (its bytes in the namespace dtype), the other quantized; attention
 * in place, gathers, reads and loads use the exact side as they use a hot
 * block's, and the warm tier counts the exact side's full size. Applies to
 * blocks demoted from now on; blocks already warm keep the codecs they
 * were encoded with. Default: K8 and V3.
 * @return 0; KVT_ENULL; KVT_ENOTFOUND; KVT_EOPTION (wrong kind of codec,
 *   or both KVT_CODEC_NONE). */
int kvt_ns_set_codec(kvt_engine *e, kvt_ns_id ns, uint32_t layer, int k_codec, int v_codec);

/** Parse a codec pair such as "k8v3", "k8cv3", "k4v2" (key codec name then
 * value codec name). @return 0; KVT_ENULL; KVT_EOPTION. */
int kvt_codec_parse(const char *name, int *k_codec, int *v_codec);

/** The name of a codec ("k8", "v3", ...), or NULL for an unknown id. */
const char *kvt_codec_name(int codec);

/** Bytes of one tensor of shape s encoded with codec (header included; the
 * lean codecs K8B, V2L..V4L have none), or 0 for an unknown codec or a
 * shape out of range. */
size_t kvt_codec_size(int codec, const kvt_codec_shape *s);

/** Encode one tensor (dtype KVT_F32, KVT_F16 or KVT_BF16) into out.
 * Deterministic: the same input, shape and seed give the same bytes on
 * every machine, with or without AVX2.
 * @return bytes written; KVT_EOPTION (codec); KVT_ESHAPE; KVT_ENULL;
 *   KVT_EDTYPE; KVT_EBUFSIZE (out_len < kvt_codec_size()); KVT_ENONFINITE
 *   (also a K8B block whose largest |key| passes 127 x 2^17.875, beyond
 *   its scale's range). */
int64_t kvt_codec_encode(int codec, const kvt_codec_shape *s, const void *in, uint32_t dtype,
                         uint8_t *out, size_t out_len);

/** Check an encoded tensor: header, length, scales and codes. Never reads
 * outside in[0..in_len). A lean codec has no header to compare: only its
 * length and codes are checked (every scale byte is valid), so a lean
 * buffer of another shape of the same length is not detected; it still
 * decodes to finite values within the codec's range.
 * @return 0; KVT_ECORRUPT. */
int kvt_codec_check(int codec, const kvt_codec_shape *s, const uint8_t *in, size_t in_len);

/** Check, then dequantize into out (n_tokens * n_heads * head_dim values
 * of dtype; f16 output saturates at +-65504 rather than overflowing).
 * @return 0; KVT_ECORRUPT (nothing written); KVT_EDTYPE; KVT_ENULL. */
int kvt_codec_decode(int codec, const kvt_codec_shape *s, const uint8_t *in, size_t in_len,
                     void *out, uint32_t dtype);

/** The namespace seed: 16 bytes that start every key chain of ns.
 * @return 0; KVT_ENULL; KVT_ENOTFOUND. */
int kvt_ns_seed(kvt_engine *e, kvt_ns_id ns, kvt_key *out);

/** Keys of the full token blocks of tokens[0..n_tokens): n_tokens /
 * block_tokens keys are written to keys (a trailing partial block has no
 * key). Pure function of the seed and the tokens (docs/format.md).
 * @param max_keys capacity of keys.
 * @param n_keys receives the number written.
 * @return 0; KVT_ENULL; KVT_ECOUNT when keys is too small; KVT_ENOTFOUND. */
int kvt_keys(kvt_engine *e, kvt_ns_id ns, const uint32_t *tokens, size_t n_tokens,
             kvt_key *keys, size_t max_keys, size_t *n_keys);

/** The key chain primitive, usable without an engine: key of the token
 * block that follows prev (NULL for the first block). */
void kvt_key_next(const kvt_key *seed, const kvt_key *prev, const uint32_t *tokens,
                  uint32_t block_tokens, kvt_key *out);

/** Drop the token blocks of the full blocks of tokens, and every stored
 * block that extends the whole prefix (whose chain passes through its last
 * block), in every layer. Blocks that share only part of the prefix are
 * not dropped, but lose their chain head, so lookups no longer reach them.
 * Blocks still referenced by sequences stay with those sequences but are
 * no longer found by lookups, loads or dedup. The store's removals run
 * without the engine's lock; blocks of the namespace put meanwhile are
 * written (or found durable) only after them.
 * @param dropped may be NULL; receives the number of token blocks dropped.
 * @return 0; KVT_ENULL; KVT_ENOTFOUND; KVT_ECOUNT (fewer than one block);
 *   KVT_ERDONLY. */
int kvt_drop_prefix(kvt_engine *e, kvt_ns_id ns, const uint32_t *tokens, size_t n_tokens,
                    uint64_t *dropped);

/** @} */

/** @defgroup lookup Prefix lookup and loads
 * @{ */

/** How many leading full token blocks of tokens are stored in every layer.
 * Blocks a lossy sequence keyed under its lineage are never found
 * (kvt_seq_lineage()).
 * For each, up to max_out entries give its key, tier and estimated load
 * time. A hit refreshes the blocks' recency.
 * @param out may be NULL when max_out is 0.
 * @param n_found receives the number of leading blocks stored (may exceed max_out).
 * @return 0; KVT_ENULL; KVT_ENOTFOUND (namespace). */
int kvt_lookup(kvt_engine *e, kvt_ns_id ns, const uint32_t *tokens, size_t n_tokens,
               kvt_lookup_entry *out, size_t max_out, size_t *n_found);

/** Submit loads of layer blocks into caller buffers. The blocks found are
 * pinned until kvt_load_wait(), so they cannot leave RAM in between;
 * hot blocks are copied by kvt_load_wait() outside the engine lock, cold
 * reads (cold-tier issue) are submitted to the device here.
 * The reqs array is kept by the library until kvt_load_wait() returns and
 * must stay valid until then; statuses are written there. (To bring a
 * sequence's own blocks back into RAM ahead of attention, rather than copy
 * them out, see kvt_seq_prefetch().)
 * @return 0 (per-request failures are reported in reqs[i].status by wait);
 *   KVT_ENULL; KVT_ECOUNT (0 or more than max_load_reqs); KVT_ENOTFOUND
 *   (namespace); KVT_ENOPAYLOAD; -ENOMEM. */
int kvt_load_submit(kvt_engine *e, kvt_ns_id ns, kvt_load_req *reqs, size_t n, kvt_load **out);

/** Complete a batch: copy (dequantizing warm blocks), unpin, fill
 * reqs[i].status (0, KVT_ENOTFOUND, KVT_EBUFSIZE, KVT_ENULL, KVT_ECORRUPT,
 * -errno) and .tier, free the batch. KVT_ECORRUPT: the layer's cold copy
 * or the block's index entry failed a check, and the request's buffers
 * hold nothing valid. A record that failed its check has left the cold
 * tier, so later lookups and loads miss it (KVT_ENOTFOUND); an index
 * entry that does not parse stays until kvt_fsck() repairs it or a
 * kvt_seq_read() of it removes it. A block whose segment file is missing
 * or not a regular file is a miss (KVT_ENOTFOUND) for lookups, reads and
 * loads; its entry stays until kvt_fsck() with repair removes it.
 * @param n_ok may be NULL; receives how many requests succeeded.
 * @return 0 when every request succeeded, else the first failing status
 *   in request order. */
int kvt_load_wait(kvt_load *ld, size_t *n_ok);

/** kvt_load_wait() without waiting for the device: when every cold read
 * of the batch has finished, complete it exactly as kvt_load_wait() does
 * (copy the blocks that were in RAM, fill every status, free the batch)
 * and return what it returns; otherwise return KVT_EBUSY and change
 * nothing (ld stays valid: poll again, or kvt_load_wait()). A batch
 * whose blocks were all in RAM is complete from kvt_load_submit() on.
 * The completion itself copies (and dequantizes warm blocks) on the
 * calling thread; it blocks on the device only for requests whose reads
 * could not be submitted (out of memory at submit), which it reads then.
 * Like a sequence, one batch must not be polled or waited for from two
 * threads at once; different batches may. Use kvt_event_fd() to learn
 * when polling is worth it.
 * @param n_ok may be NULL; as kvt_load_wait() (left as it was on KVT_EBUSY).
 * @return KVT_EBUSY (not done; ld still valid); KVT_ENULL; else as
 *   kvt_load_wait() (ld freed). */
int kvt_load_poll(kvt_load *ld, size_t *n_ok);

/** A file descriptor for event loops (poll, epoll, select; asyncio's
 * loop.add_reader): an eventfd(2) that becomes readable when a load
 * batch of e becomes complete (its cold reads finished, or at
 * kvt_load_submit() when it needs none; kvt_load_poll() then does not
 * return KVT_EBUSY) and when the flusher settled a group of token blocks
 * for the cold tier (written and durable, or failed), so a durable
 * watermark (kvt_seq_durable()) or a durability error
 * (kvt_seq_durable_error(), kvt_sync()) may have changed (metadata-only:
 * when a block enters the in-memory cold tier).
 * Level-triggered: readable while its 8-byte counter is not zero; each
 * event adds to it. The caller clears it by read(2)ing 8 bytes (it is
 * non-blocking: the read fails with EAGAIN when it is zero). To lose no
 * wakeup, clear it first, then poll every pending batch and look at the
 * watermarks, then wait again. Events coalesce and may be spurious (another thread's
 * batch, a group of another sequence): it says when to look, not what
 * changed. One reader per engine (one event loop): two threads reading
 * it would take each other's counts. The fd is created on the first call
 * (close-on-exec), every later call returns the same one; the engine owns
 * it: do not close it; kvt_engine_close() does. Thread-safe.
 * @return the fd (>= 0); KVT_ENULL; -errno from eventfd(2) (-EMFILE...). */
int kvt_event_fd(kvt_engine *e);

/** Prefetch: start bringing back into RAM the blocks s references in
 * layers [layer, layer + n_layers) whose payload is only in the cold tier
 * (they left RAM, or the token block was appended as durable and that
 * layer was not put), as one batched cold read, and return at once, so a
 * serving engine reads the next layers while the GPU computes.
 * kvt_load_wait(*out, &n_ok) waits for the reads, checks them and
 * publishes the blocks into the hot tier (the warm tier when the hot one
 * cannot take them), under the tier limits; the sequence references them
 * as before, so kvt_seq_attend() and kvt_seq_gather() then read nothing
 * from disk (unless the blocks left RAM again meanwhile). Blocks the
 * policy evicted (left) are not brought back. *out is always a handle
 * (possibly with nothing to read); until kvt_load_wait() the blocks'
 * descriptors are pinned, and releasing s meanwhile is allowed.
 * kvt_load_wait() of it: n_ok receives the blocks brought back; returns 0,
 * or the first reason a block was not: KVT_ECORRUPT (its cold record
 * failed a check: it is a miss from then on, see kvt_seq_attend()),
 * KVT_ENOTFOUND (no longer in the cold tier), KVT_EFULL (RAM cannot take
 * it), -ENOMEM.
 * @return 0; KVT_ENULL; KVT_ENOTFOUND (the layer range); KVT_ENOPAYLOAD;
 *   -ENOMEM. */
int kvt_seq_prefetch(kvt_seq *s, uint32_t layer, uint32_t n_layers, kvt_load **out);

/** @} */

/** @defgroup seq Sequences
 * @{ */

/** A new, empty sequence in namespace ns.
 * @return 0; KVT_ENULL; KVT_ENOTFOUND; KVT_ELIMIT (max_seqs); KVT_ERDONLY; -ENOMEM. */
int kvt_seq_create(kvt_engine *e, kvt_ns_id ns, kvt_seq **out);

/** A new sequence sharing the first n_blocks token blocks of parent (all of
 * them when n_blocks is UINT32_MAX): it references the same layer blocks,
 * nothing is copied. A fork of a lossy sequence is lossy, with a lineage
 * of its own (kvt_seq_lineage()). @return 0; KVT_ENULL; KVT_ECOUNT (n_blocks > parent's);
 * KVT_ELIMIT; -ENOMEM. */
int kvt_seq_fork(kvt_seq *parent, uint32_t n_blocks, kvt_seq **out);

/** Release a sequence: drop its references (blocks stay cached until space
 * is needed) and free it. Accepts NULL. */
void kvt_seq_release(kvt_seq *s);

/** Token blocks in the sequence. */
uint32_t kvt_seq_blocks(const kvt_seq *s);

/** The durable watermark: how many leading token blocks of s are durable
 * (in the cold tier, every layer). 0 without a cold tier. It carries no
 * error: kvt_seq_durable_error() says what stops it. */
uint32_t kvt_seq_durable(const kvt_seq *s);

/** The durable watermark of s and the first error that stopped a block of
 * s from becoming durable. Blocks of s go to the cold tier on their own
 * (complete in every layer and admitted); when the cold tier fails one
 * (-EIO, -ENOSPC, KVT_EFULL: the tier is full of blocks still
 * referenced; KVT_ENOTDURABLE: it reached RAM only quantized, see
 * kvt_sync()), the error stays with the token block while it is not
 * durable: every call on every sequence that holds it reports it, until
 * the block becomes durable (written again: a later append of it admits
 * it again when its exact layers are in RAM) or s is released. Other
 * sequences' kvt_sync() calls do not consume it. Blocks after the failing
 * one may be durable already; *n_durable counts only the leading ones.
 * @param n_durable may be NULL; receives kvt_seq_durable(s).
 * @return 0 (nothing failed: blocks not durable yet are on their way or
 *   not admitted); KVT_ENULL; else the error of the first block of s, in
 *   block order, that is not durable and whose last way to the cold tier
 *   failed. 0 without a cold tier. */
int kvt_seq_durable_error(const kvt_seq *s, uint32_t *n_durable);

/** Pin the retained blocks of s at their current precision, for one step
 * of a request: until kvt_seq_unpin() (or kvt_seq_release()), every
 * layer block s retains in RAM now stays where it is: a hot block is
 * neither demoted to warm nor let go to the cold tier, a warm block does
 * not leave RAM; other sequences' puts make room from unpinned blocks
 * only (they get KVT_EFULL when nothing else can move). So attention and
 * gathers of s see the same bytes all step. Blocks s appends, adopts or
 * puts after the call are not pinned: call kvt_seq_pin() again to take
 * them in (the pin is then the blocks retained at the last call). Blocks
 * shared with other sequences are pinned once whoever pins them.
 * Bound: the hot bytes pinned by every sequence of the engine together
 * must leave room in the hot tier for one token block of s's namespace
 * (every layer), so other requests can still put; a pin that would go
 * past it is refused and changes nothing (a previous pin of s stays).
 * A fork does not inherit the pin.
 * @return 0; KVT_ENULL; KVT_ELIMIT (the bound above; kvt_last_error()
 *   says how many bytes were asked and allowed); -ENOMEM. */
int kvt_seq_pin(kvt_seq *s);

/** Let go of the pin of s (kvt_seq_pin()); its blocks may be demoted or
 * leave RAM again. Nothing to do when s is not pinned.
 * @return 0; KVT_ENULL. */
int kvt_seq_unpin(kvt_seq *s);

/** Say what kvt_seq_append() adds to s from now on: output the model
 * generated (on = 1) or prompt (on = 0, where a new sequence starts; a
 * fork starts where its parent is). Under KVT_ADMIT_PROMPT only prompt
 * blocks are written to the cold tier; an output block becomes a prompt
 * block when a later sequence appends it as prompt (the next turn of a
 * conversation), and is written then if its exact layers are still in
 * RAM. Output blocks are not held in RAM for the cold tier.
 * @return 0; KVT_ENULL. */
int kvt_seq_output(kvt_seq *s, int on);

/** Append exactly one token block (n_tokens == block_tokens). Layers whose
 * block is already stored are adopted at once (referenced; put optional).
 * Once the attention of s has been lossy, the block is keyed under the
 * lineage of s and adopts nothing another sequence stored (kvt_seq_lineage()).
 * @param info may be NULL.
 * @return 0; KVT_ENULL; KVT_ECOUNT (n_tokens != block_tokens);
 *   KVT_ELIMIT (max_seq_blocks); -ENOMEM. No state change on failure. */
int kvt_seq_append(kvt_seq *s, const uint32_t *tokens, uint32_t n_tokens, kvt_append_info *info);

/** Put K and V of token block `block` in layer `layer`. When the layer
 * block is stored already (another sequence, or adopted at append), nothing
 * new is stored: the sequence references the stored copy (content compared
 * with KVT_OPEN_VERIFY_DEDUP when the stored copy is hot). When that copy
 * is only in the cold tier (not resident), the put gives it a RAM copy
 * again from kv (which must be its bytes: read or loaded); if that fails
 * (KVT_EFULL, -ENOMEM) the sequence still references it, not resident. To make room,
 * unreferenced blocks are dropped LRU-first; with a warm tier the least
 * recently used hot blocks are demoted instead (they stay referenced and
 * readable, approximately); when the hot tier holds only blocks waiting
 * for the cold tier, the put waits for them to be written, or demotes
 * those of a token block the hot tier cannot hold whole (which then cannot
 * become durable: kvt_sync() returns KVT_ENOTDURABLE). A block that can
 * never fit the hot tier (hot limit below one block) is encoded straight
 * into warm (likewise never durable). A put refused with
 * KVT_EFULL may have demoted blocks; it never drops a referenced one.
 * @return 0; KVT_ENULL; KVT_EDTYPE; KVT_ESHAPE; KVT_ENONFINITE;
 *   KVT_ENOTFOUND (block not appended, or layer out of range); KVT_EFULL
 *   when the tiers cannot hold it and everything left is referenced;
 *   -ENOMEM. No state change on failure, except the demotions above. */
int kvt_seq_put(kvt_seq *s, uint32_t block, uint32_t layer, const kvt_kv *kv);

/** Copy one layer block out: bytes_each bytes of K to k_out and of V to
 * v_out (bytes_each = block_tokens * n_kv_heads * head_dim * dtype size).
 * @return 0; KVT_ENULL; KVT_ENOTFOUND (not appended, or layer not put);
 *   KVT_EBUFSIZE; KVT_ENOPAYLOAD; KVT_ECORRUPT (its cold copy failed a
 *   check: k_out and v_out hold nothing valid, and the block left the cold tier, so
 *   lookups miss it from now on); -errno (an I/O error). */
int kvt_seq_read(kvt_seq *s, uint32_t block, uint32_t layer, void *k_out, void *v_out,
                 size_t bytes_each);

/** Gather every retained block of (s, layer), in block order, into k_out
 * and v_out: block i's tokens follow block i-1's, each [t][h][d]. Warm
 * blocks are dequantized into the buffers (blocks[i].exact == 0).
 * Size query: with k_out == NULL, only *n_blocks and *bytes_each are set.
 * @param blocks may be NULL; else max_blocks entries say which block each
 *   gathered slice came from, its token position and tier.
 * Blocks of the layer only on disk are first brought back into RAM (one
 * batched cold read, checked; see kvt_seq_prefetch()); a size query
 * counts them without reading.
 * @param n_blocks receives the number of blocks gathered (or that would be);
 *   with KVT_ENOTRESIDENT, the number of blocks not resident.
 * @param bytes_each in: capacity of k_out and v_out; out: bytes written
 *   (or needed; 0 with KVT_ENOTRESIDENT). @return 0; KVT_ENULL;
 *   KVT_ENOTFOUND (layer); KVT_EBUFSIZE when a buffer or blocks is too
 *   small (nothing is written); KVT_ENOPAYLOAD; KVT_ENOTRESIDENT when
 *   blocks s references in the layer are only on disk and could not be
 *   brought back: a cold record failed its check (it left the cold tier
 *   and the token block is no longer durable: the block stays referenced
 *   and reported until the caller puts it again), is no longer stored, or
 *   RAM cannot take them (the tiers are full of pinned or referenced
 *   blocks); nothing is written, kvt_seq_retained() lists them as cold
 *   and kvt_last_error() says why; -ENOMEM. */
int kvt_seq_gather(kvt_seq *s, uint32_t layer, void *k_out, void *v_out, size_t *bytes_each,
                   kvt_gathered *blocks, size_t max_blocks, size_t *n_blocks);

/** Attention of one query over the retained blocks of (s, layer): exact on
 * hot blocks, on the quantized data in place for warm blocks (int8 dot
 * products for keys; values accumulated in the rotated domain and rotated
 * back once per head). The query is at a position after every retained
 * token, so no mask applies. Grouped-query attention: query head i uses KV
 * head i / (n_q_heads / n_kv_heads).
 * @param q [n_q_heads][head_dim] f32.
 * @param n_q_heads a multiple of n_kv_heads, at most KVT_MAX_HEADS * 64.
 * @param scale score scale; 0 means 1 / sqrt(head_dim).
 * @param out [n_q_heads][head_dim] f32: softmax-weighted values (zeros when
 *   nothing is retained).
 * @param lse may be NULL; else [n_q_heads]: log of the softmax denominator
 *   (natural log, including the max), -INFINITY when nothing is retained,
 *   so a caller can merge this with attention over tokens it holds itself.
 * @param block_mass may be NULL; else max_blocks entries: the attention
 *   mass each retained block received, in block order, summed over query
 *   heads (what kvt's policy layer observes).
 * Blocks of the layer only on disk are first brought back into RAM, as in
 * kvt_seq_gather().
 * @param n_blocks receives the number of retained blocks; with
 *   KVT_ENOTRESIDENT, the number of blocks not resident.
 * @return 0; KVT_ENULL; KVT_ENOTFOUND (layer); KVT_ECOUNT (n_q_heads);
 *   KVT_EBUFSIZE (max_blocks too small; nothing computed); KVT_ENOPAYLOAD;
 *   KVT_ECORRUPT (a warm payload failed its check); KVT_ENOTRESIDENT
 *   (blocks s references in the layer are only on disk and could not be
 *   brought back, as in kvt_seq_gather(); nothing computed); -ENOMEM. */
int kvt_seq_attend(kvt_seq *s, uint32_t layer, const float *q, uint32_t n_q_heads, float scale,
                   float *out, float *lse, float *block_mass, size_t max_blocks, size_t *n_blocks);

/** kvt_seq_put() of layers first_layer .. first_layer + n_layers - 1 of
 * token block `block` in one call, for callers that pay per call (the
 * Python binding): layer first_layer + i reads kv->k and kv->v advanced by
 * i * layer_stride bytes (a [layers][tokens][heads][dim] array has
 * layer_stride = one layer block's bytes); the other fields of *kv apply
 * to every layer. The layers are put in order, each exactly as by
 * kvt_seq_put(); the first failure stops the loop.
 * @param n_done may be NULL; receives the number of layers put.
 * @return 0; KVT_ENULL; KVT_ECOUNT (n_layers 0); else the first failing
 *   kvt_seq_put()'s code (the layers before it are put). */
int kvt_seq_put_layers(kvt_seq *s, uint32_t block, uint32_t first_layer, uint32_t n_layers,
                       const kvt_kv *kv, size_t layer_stride, uint32_t *n_done);

/** kvt_seq_gather() of layers first_layer .. first_layer + n_layers - 1
 * in one call: layer first_layer + i into k_out and v_out advanced by
 * i * layer_stride bytes.
 * @param bytes_each [n_layers]; in: bytes_each[0] is the capacity of each
 *   layer's slice (at most layer_stride); out: bytes_each[i] the bytes
 *   written for layer first_layer + i.
 * @param n_done may be NULL; receives the number of layers gathered.
 * @return 0; KVT_ENULL; KVT_ECOUNT (n_layers 0); KVT_EBUFSIZE
 *   (layer_stride below the capacity: slices would overlap); else the
 *   first failing kvt_seq_gather()'s code (the layers before it are
 *   written; that layer's slice and the rest are not). */
int kvt_seq_gather_layers(kvt_seq *s, uint32_t first_layer, uint32_t n_layers, void *k_out,
                          void *v_out, size_t layer_stride, size_t *bytes_each,
                          uint32_t *n_done);

/** @} */

/** @defgroup policy Retention policy and observation
 * The policy layer (DESIGN.md section 4; docs/policy.md). A sequence has a
 * policy: per layer a scorer and a byte budget. The budget is a fraction
 * of the layer's full f16 cache for the sequence's length (K and V of
 * every token at 2 bytes an element), and it counts everything attention
 * reads: retained hot blocks at f16 size, retained warm blocks at their
 * encoded size, and the tail the caller holds (kvt_seq_set_tokens()).
 * After every put of a layer, every kvt_seq_observe() of it, every
 * kvt_seq_set_tokens() and at kvt_seq_set_policy(), while a layer keeps
 * more bytes than its budget, its lowest scored block leaves: the
 * sequence drops its reference to that layer block (so the tiers may
 * evict it; a cold copy, when there is one, stays) and attention, gathers
 * and kvt_seq_retained() no longer see it. Other sequences that reference
 * the same block keep it. Never evicted: the first sink_blocks blocks,
 * the newest window_blocks blocks, and blocks observed fewer than delay
 * times (delayed scoring); when those and the tail alone exceed the
 * budget, the layer is over budget (kvt_seq_policy_info()). What the
 * policy evicted is not brought back (retained blocks only on disk are:
 * kvt_seq_prefetch()). The default policy, "full", retains everything.
 * @{ */

/** Scorers: what decides which blocks a layer keeps. These ids are
 * stable; scorers are chosen by name (kvt_policy_parse()), and a scorer
 * added later gets an id from there, not a new constant here. */
typedef enum kvt_scorer_id {
  KVT_SCORER_FULL = 0,        /**< "full": keep every block (no budget) */
  KVT_SCORER_RECENT = 1,      /**< "recent": the most recent blocks */
  KVT_SCORER_SINK_RECENT = 2, /**< "sink-recent": the first sink_blocks (attention
                                   sinks, StreamingLLM; 1 by default), then the most recent */
  KVT_SCORER_H2O = 3,         /**< "h2o": the most accumulated observed mass (H2O) */
  KVT_SCORER_SNAPKV = 4,      /**< "snapkv": mean mass over the last observations,
                                   pooled over neighbouring blocks (SnapKV) */
  KVT_SCORER_TOVA = 5,        /**< "tova": the mass at the last observation (TOVA) */
  KVT_SCORER_EXTERNAL = 6,    /**< "external": the caller's scores (kvt_seq_hint()) */
  KVT_SCORER_LEARNED = 7,     /**< "learned": the namespace's predictor of future
                                   attention (kvt_ns_load_predictor(); KVpop) */
  KVT_SCORER_AUTO = 8,        /**< "auto": per layer as the namespace's profile says
                                   (kvt_ns_load_profile()); without one, "snapkv" */
} kvt_scorer_id;

/** kvt_policy fields left at this value take the scorer's default. */
#define KVT_POLICY_DEFAULT UINT32_MAX

/** A sequence's retention policy. Fill with kvt_policy_init() first. */
typedef struct kvt_policy {
  uint32_t scorer;        /**< an id from kvt_policy_parse() (kvt_scorer_id) */
  uint32_t sink_blocks;   /**< leading blocks never evicted (default: 1 for
                               sink-recent, 0 for the others) */
  double budget;          /**< (0, 1]: bytes each layer keeps, as a fraction of its full
                               f16 cache, tail included (1). With a profile ("auto"),
                               the total: layers get shares of it. */
  uint32_t window_blocks; /**< newest blocks never evicted (default 0) */
  uint32_t delay;         /**< a block is scored only once observed this many times;
                               before, it is kept (default: the scorer's, 0 for most) */
  double warm;            /**< [0, 1): the part of each layer's budget that warm
                               blocks may take (three tiers per layer, docs/policy.md):
                               blocks ranked below the hot ones are quantized with
                               the namespace's warm codecs and still attended, the
                               rest leave. 0 (default): no warm share, eviction only.
                               With a profile ("auto"), a version-2 profile's
                               per-layer warm shares are used and this is ignored. */
  double margin;          /**< [0, 100]: hysteresis of promotion: a warm block
                               takes the place of the weakest hot one only when its
                               score is above the hot one's by this fraction of
                               the hot one's (default 0.1); 100: never (warm
                               blocks stay warm until they leave) */
  uint32_t recall;        /**< 1: evicted blocks keep a key sketch and come back from
                               the cold tier when a query's bound beats the weakest
                               retained block (docs/policy.md, "Recall"); default 0.
                               kvt_seq_observe() then decides and starts the reads
                               (the weakest leaves at once); until the layer's next
                               kvt_seq_attend() installs them, kvt_seq_retained()
                               lists them as cold. Needs kvt_seq_attend() before
                               kvt_seq_observe() (the query); forks do not inherit
                               the sketches. */
} kvt_policy;

/** Defaults: "full", budget 1, warm 0, margin 0.1, the rest
 * KVT_POLICY_DEFAULT. */
void kvt_policy_init(kvt_policy *p);

/** The scorer named name ("full", "recent", "sink-recent", "h2o",
 * "snapkv", "tova", "external", "learned", "auto").
 * @return 0; KVT_ENULL; KVT_EOPTION (unknown name). */
int kvt_policy_parse(const char *name, uint32_t *scorer);

/** The name of a scorer, or NULL for an unknown id. */
const char *kvt_policy_name(uint32_t scorer);

/** Set the policy of s and apply it at once to every layer (blocks over
 * the budget leave; none come back; with a warm share, blocks below the
 * hot part are quantized in place instead, and warm blocks that rank into
 * the hot set by the margin are promoted, docs/policy.md). A fork inherits its parent's policy
 * and per-block state. "auto" reads the namespace's profile now (a profile
 * loaded later applies to later kvt_seq_set_policy() calls).
 * @return 0; KVT_ENULL; KVT_EOPTION (unknown scorer, budget outside
 *   (0, 1] or not finite, warm outside [0, 1), margin outside [0, 100], a field out of range; "learned" without a
 *   predictor loaded for the namespace); -ENOMEM. */
int kvt_seq_set_policy(kvt_seq *s, const kvt_policy *p);

/** The policy of s with every default resolved (what kvt_policy_init()
 * left at KVT_POLICY_DEFAULT, as the scorer chose it).
 * @return 0; KVT_ENULL. */
int kvt_seq_get_policy(kvt_seq *s, kvt_policy *out);

/** Tell s its length in tokens, counting the tail the caller holds and
 * attends itself (the block being filled): budgets count the tail and
 * are fractions of this length's full cache. n_tokens is from
 * blocks * block_tokens to (blocks + 1) * block_tokens (a full tail not
 * yet appended). Without a call, or when appends pass it, the length is
 * the full blocks' tokens. Applies the policy to every layer.
 * @return 0; KVT_ENULL; KVT_ECOUNT (n_tokens out of that range). */
int kvt_seq_set_tokens(kvt_seq *s, uint64_t n_tokens);

/** Scores for the "external" scorer: score[b] for block b of the
 * sequence, b < n_blocks (the sequence's blocks; blocks not retained are
 * ignored). Kept until the next call; blocks appended later score 0.
 * Does not apply the policy (the next observe or put does).
 * @return 0; KVT_ENULL; KVT_ENOTFOUND (layer); KVT_ECOUNT (n_blocks is not
 *   the sequence's blocks); KVT_EOPTION (a score not finite). */
int kvt_seq_hint(kvt_seq *s, uint32_t layer, const float *score, size_t n_blocks);

/** What a layer of a sequence keeps against its budget, in bytes counted
 * as the budget counts them. */
typedef struct kvt_policy_info {
  uint32_t scorer;        /**< the layer's scorer (a profile may choose it) */
  uint32_t over;          /**< 1: protected blocks and the tail alone exceed the budget */
  double share;           /**< the layer's budget, a fraction of its full cache */
  uint64_t tokens;        /**< the sequence's length (kvt_seq_set_tokens()) */
  uint64_t kept_tokens;   /**< tokens attention reads: retained blocks and the tail */
  uint64_t full_bytes;    /**< the layer's full f16 cache for tokens */
  uint64_t budget_bytes;  /**< share * full_bytes */
  uint64_t kept_bytes;    /**< retained hot blocks at f16 size, warm at their
                               encoded size, and the tail at f16 size */
  double warm_share;      /**< the part of the layer's full cache warm blocks may
                               take (within share); 0: no warm share */
  uint64_t warm_tokens;   /**< tokens in retained warm blocks (within kept_tokens) */
  uint64_t warm_bytes;    /**< their encoded bytes (within kept_bytes) */
  uint64_t promotions;    /**< warm blocks the policy made hot again since the
                               policy was set (exact from the cold tier, or
                               dequantized: approximate) */
  uint64_t promotions_exact; /**< of which read exact from the cold tier */
  uint64_t demotions;     /**< hot blocks the policy quantized to warm */
} kvt_policy_info;

/** Fill *out for (s, layer). @return 0; KVT_ENULL; KVT_ENOTFOUND (layer). */
int kvt_seq_policy_info(kvt_seq *s, uint32_t layer, kvt_policy_info *out);

/** Load a profile (docs/policy.md: per layer, the scorer and its share
 * of the budget; written by `kvtier calibrate`) for namespace ns; it
 * replaces any earlier one and is used by sequences whose policy is
 * "auto". The file is read now and not kept open.
 * @return 0; KVT_ENULL; KVT_ENOTFOUND (ns); KVT_EVERSION (another
 *   version); KVT_ESHAPE (made for another shape); KVT_ECORRUPT
 *   (truncated or malformed; kvt_last_error() says where); KVT_EOPTION
 *   (well formed but unusable: an unknown scorer or "auto" for a layer, a
 *   share outside (0, 1], shares that do not average to their budget, a
 *   budget twice); -errno (the file cannot be read). */
int kvt_ns_load_profile(kvt_engine *e, kvt_ns_id ns, const char *path);

/** Load a predictor of future attention (docs/policy.md; written by
 * `kvtier train`) for namespace ns, used by the "learned" scorer of its
 * sequences. Replaces any earlier one for sequences that set their
 * policy later. Same return codes as kvt_ns_load_profile(). */
int kvt_ns_load_predictor(kvt_engine *e, kvt_ns_id ns, const char *path);

/** Report the attention mass each retained block of (s, layer) received
 * at one decoding step: block_mass[i] is for the i-th retained block in
 * block order, exactly the list kvt_seq_attend() attended and
 * kvt_seq_retained() returns (for one query, summed over the query heads
 * that share a KV head, then over KV heads, as kvt_seq_attend() fills its
 * block_mass). The engine keeps, per (sequence, layer, block), the last
 * mass, the accumulated mass and how many steps observed it; the policy
 * is then applied to the layer. The array is read, not kept.
 * @return 0; KVT_ENULL; KVT_ENOTFOUND (layer); KVT_ECOUNT (n_blocks is not
 *   the number of retained blocks); KVT_EOPTION (a mass negative or not
 *   finite; nothing recorded). */
int kvt_seq_observe(kvt_seq *s, uint32_t layer, const float *block_mass, size_t n_blocks);

/** List the retained blocks of (s, layer) in block order: index, token
 * position and tier (exact: 1 when hot with the bytes put), without copying any payload and
 * without reading: a block only on disk, which kvt_seq_attend(),
 * kvt_seq_gather() and kvt_seq_prefetch() bring back, is listed with tier
 * KVT_TIER_COLD (exact 0).
 * @param blocks may be NULL when max_blocks is 0 (a count query).
 * @param n_blocks receives the number of retained blocks.
 * @return 0; KVT_ENULL; KVT_ENOTFOUND (layer); KVT_EBUFSIZE (max_blocks
 *   too small: *n_blocks says how many, nothing else is written). */
int kvt_seq_retained(kvt_seq *s, uint32_t layer, kvt_gathered *blocks, size_t max_blocks,
                     size_t *n_blocks);

/** The policy state of block `block` of (s, layer): the accumulated and
 * last observed mass and the number of observations (0 for a block never
 * observed or no longer retained). @return 0; KVT_ENULL; KVT_ENOTFOUND. */
int kvt_seq_block_mass(kvt_seq *s, uint32_t block, uint32_t layer, double *mass_sum,
                       float *mass_last, uint32_t *observed);

/** Content addressing under a lossy policy (docs/policy.md, "Lossy
 * sequences do not share"). A block's key names its K and V only when
 * every earlier layer of the sequence attended over the full, exact cache.
 * Once the attention of s has been lossy, every block s appends from then
 * on is keyed under a lineage of its own (a random 128-bit id mixed into
 * the key chain, docs/format.md "Salted keys"): it neither adopts a block
 * of the plain key nor publishes under it, so no full-cache sequence, no
 * kvt_lookup() and no kvt_keys() ever reaches it, in this process or
 * after a restart. Blocks s appended before stay shared: they are exact.
 * s becomes lossy, for good, when: the policy evicts one of its blocks
 * (KVT_LOSSY_EVICTED) or quantizes one to warm (KVT_LOSSY_QUANTIZED);
 * kvt_seq_attend(), kvt_seq_gather() or kvt_seq_read() of s reads a warm
 * block or a hot one a promotion dequantized (KVT_LOSSY_APPROX, whatever
 * made it approximate: the policy, or the hot tier's demotions under
 * memory pressure); it is forked from a lossy sequence (KVT_LOSSY_FORK);
 * or the caller says so (kvt_seq_mark_lossy(), KVT_LOSSY_CALLER). The
 * engine takes a block's K and V to be computed before its append (the
 * serving loop holds the tail and appends it when full); a caller that
 * computes them after the append calls kvt_seq_mark_lossy() before it. */
#define KVT_LOSSY_NONE 0u
#define KVT_LOSSY_EVICTED 1u
#define KVT_LOSSY_QUANTIZED 2u
#define KVT_LOSSY_APPROX 3u
#define KVT_LOSSY_FORK 4u
#define KVT_LOSSY_CALLER 5u

/** What kvt_seq_lineage() reports. */
typedef struct kvt_lineage_info {
  uint32_t lossy;         /**< 1: the attention of s has been lossy */
  uint32_t why;           /**< KVT_LOSSY_*: what made it lossy first (NONE when not) */
  uint32_t salted_from;   /**< blocks of s at and after this index are keyed under a
                               lineage (== kvt_seq_blocks() when none appended yet);
                               UINT32_MAX when s is not lossy */
  uint32_t pad;
  uint64_t lossy_puts;    /**< successful kvt_seq_put() calls of s into such blocks */
} kvt_lineage_info;

/** Fill *out for s. @return 0; KVT_ENULL. */
int kvt_seq_lineage(kvt_seq *s, kvt_lineage_info *out);

/** Declare the attention of s lossy (KVT_LOSSY_CALLER, unless it already
 * is): the caller attended over less, or other, K and V than the exact
 * full cache (its own sparse attention, warm blocks it loaded with
 * kvt_load_submit(), K and V it quantized itself). Blocks s appends from
 * now on are keyed under its lineage (kvt_seq_lineage()). There is no way
 * back: later blocks were computed from the lossy ones.
 * @return 0; KVT_ENULL. */
int kvt_seq_mark_lossy(kvt_seq *s);

/** @} */

/** Bytes one token block of shape s takes in the cold tier on disk, at
 * most (record header, every layer's slice 4 KiB aligned, uncompressed);
 * 0 for an invalid shape. Capacity planning divides cold limits by it. */
uint64_t kvt_cold_record_bytes(const kvt_shape *s);

/** Size of one element of dtype in bytes, 0 for an unknown dtype. */
size_t kvt_dtype_size(uint32_t dtype);

/** Bytes of K (equally of V) in one layer block of shape s. */
size_t kvt_shape_block_bytes(const kvt_shape *s);

/** @name The remote tier (docs/remote.md)
 * A Redis Cluster shared by serving processes, below the local cold tier
 * (or instead of it). Its options and counters are structs whose first
 * field is their size, so kvt_options and kvt_stats keep their layout.
 * @{ */

/** Options of the remote tier; fill size with sizeof(kvt_remote_options)
 * and leave what you do not set 0. */
typedef struct kvt_remote_options {
  uint32_t size;              /**< sizeof(kvt_remote_options) */
  uint32_t deadline_ms;       /**< one cluster call, retries included (0: 1000) */
  const char *url;            /**< redis://[user[:password]@]host:port[,host:port...]
                                   (seed nodes; IP addresses); NULL: no remote tier.
                                   Read during the open only, never printed */
  const char *password;       /**< NULL: the URL's, else env KVTIER_REDIS_PASSWORD */
  uint64_t queue_bytes;       /**< values waiting to be written, at most (0: 64 MiB);
                                   the writer's batch in flight (32 MiB at most) comes on top */
} kvt_remote_options;

/** kvt_engine_open_info() with a remote tier when ro->url is set: lookups
 * and loads go RAM, then the local cold tier, then the cluster; blocks
 * written to the cold tier are written to the cluster too, in the
 * background (write once: SET NX). Without a cold limit the cluster is
 * the engine's only durable tier. A node down or slow is a miss, never an
 * error of a later call. ro may be NULL (kvt_engine_open_info()).
 * @return as kvt_engine_open_info(); also KVT_EOPTION (ro->size too small,
 *   a bad URL, or with KVT_OPEN_METADATA_ONLY), KVT_EAUTH (credentials
 *   refused), -ECONNREFUSED / -ETIMEDOUT (no seed answered). */
int kvt_engine_open_remote(const char *dir, const kvt_options *opt, const kvt_remote_options *ro,
                           kvt_engine **out, kvt_error_info *info);

/** Counters of the remote tier since open. */
typedef struct kvt_remote_stats {
  uint32_t size;              /**< in: sizeof(kvt_remote_stats) */
  uint32_t pad;
  uint64_t hits;              /**< blocks read from the cluster and checked */
  uint64_t misses;            /**< blocks asked for and not served (absent, down, bad) */
  uint64_t timeouts;          /**< commands no node answered in time */
  uint64_t checksum_failures; /**< values refused by a check (each a miss, then deleted) */
  uint64_t deleted;           /**< of those, deleted from the cluster */
  uint64_t bytes_in, bytes_out; /**< value bytes read / written */
  uint64_t writes;            /**< blocks stored */
  uint64_t write_exists;      /**< blocks another writer had stored (SET NX) */
  uint64_t write_dropped;     /**< blocks not written: the write queue was full */
  uint64_t write_failures;    /**< blocks not written: node down, out of memory */
  uint64_t local_copies;      /**< remote hits written to the local cold tier */
  uint64_t evictions_noticed; /**< of the misses, blocks this process had seen in the
                                   cluster (EXISTS, its own write, a read) and then
                                   found gone: evicted by maxmemory-policy (or deleted
                                   by another process) */
  uint64_t write_cancelled;   /**< blocks not written: removed (a prefix drop) while
                                   their write was queued */
} kvt_remote_stats;

/** The remote tier's counters into *st (st->size set by the caller;
 * fields beyond it are not written). @return 0; KVT_ENULL; KVT_EOPTION
 * (st->size below the first fields); KVT_ENOTFOUND (no remote tier). */
int kvt_remote_stats_get(kvt_engine *e, kvt_remote_stats *st);

/** @} */

#ifdef __cplusplus
}
#endif
#endif /* KVTIER_H */
