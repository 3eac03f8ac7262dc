/* cold.h - the cold tier: token-block records in fixed-size segment files,
 * written append-only through the I/O layer, indexed by LMDB.
 *
 * Durability order (DESIGN.md section 3): a group of records is written
 * and fdatasync'ed; then one LMDB transaction that points at them commits
 * (MDB_NOSYNC, then one mdb_env_sync); only then does the caller learn the
 * blocks are durable. Every read checks the slice's key, layer and segment
 * generation against the index and its XXH3-64 checksum: a mismatch is a
 * miss (counted), never wrong bytes. Formats: docs/format.md, "Cold tier".
 *
 * Threads: one writer thread (the engine's flusher) calls the write,
 * drain and namespace functions; reads and lookups may come from any
 * thread. */
#ifndef KVT_COLD_H
#define KVT_COLD_H

#include <stddef.h>
#include <stdint.h>

#include "base/mem.h"
#include "io/io.h"
#include "kvtier.h"
#include "tiers/store.h"

typedef struct kvt_cold kvt_cold;

typedef struct kvt_cold_config {
  const char *dir;             /* the store directory */
  int rdonly;
  uint64_t bytes_limit;        /* segment files may total at most this */
  uint64_t segment_bytes;      /* size of one segment file */
  uint64_t map_bytes;          /* LMDB map size of a writer (a reader maps what the store records) */
  uint64_t group_bytes;        /* records synced and indexed together, at most */
  int compress;                /* 1: zstd on byte planes where it saves >= 1/16 */
  int zstd_level;
  kvt_io_config io;
  int evict_policy;            /* KVT_EVICT_*: order of kvt_cold_evict_for() */
  int nocreate;                /* a writer too only opens a store that exists (index/) */
} kvt_cold_config;

#define KVT_COLD_CODEC_RAW 0
#define KVT_COLD_CODEC_PLANES 1

/* One layer's slice as the index records it. */
typedef struct kvt_cold_slice {
  uint32_t rel_off;            /* from the record start; multiple of 4096 */
  uint32_t stored_len;         /* payload bytes after the 48-byte slice header */
  uint32_t raw_len;            /* K + V bytes once decoded */
  uint8_t codec;
  uint64_t checksum;           /* XXH3-64 of slice header + payload */
} kvt_cold_slice;

/* What the index says of one token block. */
typedef struct kvt_cold_entry {
  uint32_t seg;
  uint64_t seg_gen;
  uint64_t offset;             /* record start in the segment */
  uint32_t rec_len;
  uint32_t n_layers, dtype, bytes_each, pos;
  kvt_key key, parent, ns_seed;
} kvt_cold_entry;

/* A token block to write, and the tier's counters: the store
 * interface's types (tiers/store.h). */
typedef kvt_store_rec kvt_cold_rec;
typedef kvt_store_stats kvt_cold_stats;

/* Open or create the cold tier in cfg->dir (index/ and segments/).
 * Returns 0; KVT_EVERSION; KVT_ECORRUPT; KVT_EOPTION; -errno. */
int kvt_cold_open(kvt_mem *m, const kvt_cold_config *cfg, kvt_cold **out);
void kvt_cold_close(kvt_cold *c);

/* Bytes of the record a token block of this shape takes, at most. */
uint64_t kvt_cold_record_max(uint32_t n_layers, uint32_t bytes_each);

/* Persist a namespace: its seed and canonical encoding (docs/format.md).
 * Writer thread. 0 or -errno/KVT_E*. */
int kvt_cold_ns_put(kvt_cold *c, const kvt_key *seed, const uint8_t *enc, size_t len);
/* A small state the owner keeps in the index under name (the meta table,
 * key "owner." name: the hot tier's eviction model). get: its length (0:
 * none, or longer than cap); put: 0 or an error (KVT_ERDONLY, LMDB's). A
 * put is durable at the next group commit or close, not before. */
size_t kvt_cold_state_get(kvt_cold *c, const char *name, uint8_t *out, size_t cap);
int kvt_cold_state_put(kvt_cold *c, const char *name, const uint8_t *buf, size_t len);
/* Call fn for every stored namespace; stops at fn's first non-zero. */
int kvt_cold_ns_each(kvt_cold *c, int (*fn)(void *arg, const kvt_key *seed, const uint8_t *enc,
                                            size_t len),
                     void *arg);

/* Write records durably: append to segments, fdatasync, commit the
 * index, in groups of at most group_bytes, the next group built while the
 * one before is written and the one before that synced and indexed.
 * Records whose key is already indexed are skipped. *written (may be
 * NULL) receives how many leading records are now in the index (written
 * or there already). Writer thread. Returns 0 (all of them); KVT_EFULL
 * (the tier is full) or another error: only the leading *written are. */
int kvt_cold_write(kvt_cold *c, const kvt_cold_rec *recs, size_t n, size_t *written);

/* The same without waiting: returns once the records are built into the
 * pipeline (recs and the payloads it points to are not used after), so
 * the caller's next records are built while these are written. Records
 * recs[0..*posted) are told of through settled(arg, from, to, rc) in
 * order, after everything posted before, once each group is indexed (rc
 * 0: durable) or has failed (rc the error; once a group fails to be
 * written or indexed, every group after it fails too until the pipeline
 * drains; the groups before it are unaffected); records that could not be
 * written at all (KVT_EFULL: no room) are told of in order the same way.
 * settled is called from the committer thread, or the caller's, with no
 * cold-tier lock held. *posted is n unless memory ran out (-ENOMEM; the
 * pipeline has drained then, so the caller can fail the rest in order).
 * Returns 0, or the first reason records were not written. Writer
 * thread. */
typedef kvt_store_settled_fn kvt_cold_settled_fn;
int kvt_cold_post(kvt_cold *c, const kvt_cold_rec *recs, size_t n, size_t *posted,
                  kvt_cold_settled_fn settled, void *arg);
/* Wait until the pipeline can take records to build (a staging buffer is
 * free): what the caller hands over after this is built at once, so
 * waiting here first lets a hand-over grow while the device is busy.
 * Writer thread. */
void kvt_cold_wait_stage(kvt_cold *c);
/* *flag (read atomically; may be NULL) is non-zero while the writer's
 * caller has work behind what it posted. With cfg.compress, slices are
 * compressed only while writing keeps up: when the writer thread waits
 * for the chunk being built and work waits behind it (later records of
 * the same post, or *flag), the rest of the chunk is stored raw. */
void kvt_cold_set_backlog(kvt_cold *c, const int *flag);

/* Wait until everything posted has settled. Returns the first failure
 * since the last drain (each also told through its settled), or 0.
 * Writer thread; kvt_cold_close() drains too. */
int kvt_cold_drain(kvt_cold *c);

/* When the tier is full, kvt_cold_write() reclaims the segment with the
 * fewest live bytes: keep(arg, key) says which of its blocks must be
 * written again (still referenced); the rest are evicted. keep is called
 * from the writer thread, outside every cold-tier lock and transaction. */
void kvt_cold_set_keep(kvt_cold *c, int (*keep)(void *arg, const kvt_key *key), void *arg);
/* lost(arg, key): a block keep() kept was found bad while a reclaim read
 * it back, and left the index: it is not durable any more. Called on the
 * writer's thread with no cold-tier lock held. */
void kvt_cold_set_lost(kvt_cold *c, void (*lost)(void *arg, const kvt_key *key));

/* Should a block not indexed yet be written? Under KVT_EVICT_LEARNED the
 * eviction order's admission (kvt_evict_admit: the tier full, a block
 * predicted not to outlast what it displaces is not); 1 for every other
 * order. Counts the access for the model. Leaf locks only. */
int kvt_cold_admit(kvt_cold *c, const kvt_key *key, const kvt_key *parent, uint32_t depth,
                   uint32_t ns, uint64_t rec_bytes);
/* KVT_EVICT_LEARNED's model state as kvt_evict_model_save() gives it (0:
 * another order, or a reader). Kept in the index across restarts. */
size_t kvt_cold_model_state(kvt_cold *c, uint8_t *out, size_t cap);
/* It is written at close, and after a group commit whenever the model has
 * counted KVT_EVICT_MODEL_SAVE_EVERY accesses since it last was: a writer
 * killed without closing loses what its model counted since the last
 * group that saved it (while blocks are written, fewer than that many
 * accesses; lookups alone commit no group). */
/* The eviction order (tiers/evict.h) of a writer's blocks. Before a group
 * is written, kvt_cold_evict_for() invalidates blocks one by one in that
 * order - never one keep() says to keep - until the live records and
 * those posted and not yet settled leave room for need bytes and a
 * segment's slack, durably (one transaction); reclaiming segments by
 * fewest live bytes then mostly frees what the order chose. Returns how
 * many it removed, or a negative error. Records join the order as they
 * are indexed. Writer thread; keep() is called with no cold-tier lock
 * held. */
int64_t kvt_cold_evict_for(kvt_cold *c, uint64_t need);

/* Is key in the index? Fills e (may be NULL); a hit is a use for the
 * eviction order. 0 or KVT_ENOTFOUND. */
int kvt_cold_find(kvt_cold *c, const kvt_key *key, kvt_cold_entry *e);
/* How many of keys[0..n), from the first, are in the index (each a use). */
size_t kvt_cold_prefix(kvt_cold *c, const kvt_key *keys, size_t n);

/* Read one layer of a token block into k_out and v_out (bytes_each each),
 * reading only that layer's slice. Returns 0; KVT_ENOTFOUND; KVT_ECORRUPT
 * (a check failed: counted, and the entry left the index if it still
 * pointed at what failed - a record relocated meanwhile is read again
 * where it is; the caller reports it, and later lookups miss); KVT_EBUFSIZE; -errno. Any
 * thread. */
int kvt_cold_read_layer(kvt_cold *c, const kvt_key *key, uint32_t layer, void *k_out, void *v_out,
                        size_t bytes_each);

/* Asynchronous reads of single layers: reader threads (two where two
 * CPUs are, one under a read fault plan), each with its own ring, take
 * requests from one queue, look them up, keep io depth reads in flight
 * between them (small adjacent slices merged), check and decode into the
 * caller's buffers. reqs stays the caller's and must live
 * until kvt_cold_read_wait() returns; statuses as kvt_cold_read_layer(). */
typedef struct kvt_cold_batch kvt_cold_batch;
typedef kvt_store_read kvt_cold_read; /* tiers/store.h */
int kvt_cold_read_submit(kvt_cold *c, kvt_cold_read *reqs, size_t n, kvt_cold_batch **out);
void kvt_cold_read_wait(kvt_cold_batch *b); /* frees b */
/* Has every read of b finished (kvt_cold_read_wait() would not wait)?
 * 1 for NULL. Does not free b. Any thread. */
int kvt_cold_read_done(kvt_cold_batch *b);
/* notify(arg) is called on a reader thread, with no cold-tier lock held,
 * each time a batch submitted after this call has finished its last read
 * (kvt_cold_read_wait() may already have freed the batch). Set before any
 * read is submitted. */
void kvt_cold_set_read_notify(kvt_cold *c, void (*notify)(void *arg), void *arg);

/* Remove key from the index (a failed check, a drop). 0 or KVT_ENOTFOUND. */
int kvt_cold_remove(kvt_cold *c, const kvt_key *key);

/* Remove, durably, every entry of namespace seed (root NULL), or root and
 * every entry whose chain passes through root (at position root_pos).
 * *dropped (may be NULL) receives how many. 0 or -errno/KVT_E*. */
int kvt_cold_drop(kvt_cold *c, const kvt_key *seed, const kvt_key *root, uint32_t root_pos,
                  uint64_t *dropped);
/* kvt_cold_drop that first hands the keys it is about to remove to
 * each(arg, keys, n) (each may be NULL): a tier above mirrors the drop. */
int kvt_cold_drop_each(kvt_cold *c, const kvt_key *seed, const kvt_key *root, uint32_t root_pos,
                       uint64_t *dropped, void (*each)(void *, const kvt_key *, size_t), void *arg);

void kvt_cold_stats_get(kvt_cold *c, kvt_cold_stats *st);

/* Latency histograms (tiers/hist.h), copied with atomic loads: *read,
 * one read of a segment file from submission to completion (a layer
 * slice, or small adjacent slices merged; synchronous and load reads);
 * *commit, one group from the start of its write to its index commit
 * (write, fdatasync, LMDB commit). Any thread. */
struct kvt_hist;
void kvt_cold_hists(kvt_cold *c, struct kvt_hist *read, struct kvt_hist *commit);

/* Verify every index entry against its record: headers, keys, generation
 * and checksums of every slice. Counts go to *bad and *checked; with repair
 * the broken entries are removed. Returns 0 or -errno when it could not run. */
int kvt_cold_verify(kvt_cold *c, int repair, uint64_t *checked, uint64_t *bad,
                    void (*report)(void *arg, const kvt_key *key, const char *what), void *arg);

/* The LMDB map a cold tier of cold_bytes needs, with room to spare: one
 * index entry (under 1.3% of the smallest record: a 4 KiB header and a
 * 4 KiB slice a layer) a token block, B-tree pages half full, the segment
 * table and namespaces; at least 64 MiB. A map is address space, not
 * memory, but a fixed 8 GiB one failed every command under ulimit -v. */
uint64_t kvt_cold_map_bytes(uint64_t cold_bytes);

#endif
