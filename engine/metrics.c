/* metrics.c - kvt_metrics_render(): the engine's counters, gauges and the
 * cold tier's latency histograms as Prometheus text (exposition format
 * 0.0.4), written straight into the caller's buffer. Names and meanings:
 * docs/metrics.md. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine/internal.h"
#include "tiers/hist.h"

/* Everything rendered, read once per call. */
typedef struct metrics_snap {
  kvt_stats st;
  kvt_tier_counts tc;
  uint64_t pending;           /* token blocks queued or being written */
  uint64_t lag_sum, lag_max;  /* open sequences' blocks past their durable watermark */
  double stall_s;             /* since durability last moved, while blocks wait */
  kvt_hist h_read, h_commit;
  uint64_t model[KVT_N_TIERS], model_saved[KVT_N_TIERS]; /* kvt_stats_tier's model fields */
} metrics_snap;

static void snap_take(kvt_engine *e, metrics_snap *m) {
  memset(m, 0, sizeof *m);
  kvt_stats_get(e, &m->st);
  uint64_t now = kvt_hist_now_ns();
  pthread_mutex_lock(&e->lock);
  m->tc = e->tc;
  m->pending = e->enqueued - e->completed;
  if (m->pending && now > e->tc.durable_ns) m->stall_s = (double)(now - e->tc.durable_ns) * 1e-9;
  if (kvt_store_any(e)) {
    for (const kvt_seq *s = e->seqs.next; s != &e->seqs; s = s->next) {
      uint32_t n = 0;
      while (n < s->n_blocks && s->tb[n]->cold) n++;
      uint64_t lag = s->n_blocks - n;
      m->lag_sum += lag;
      if (lag > m->lag_max) m->lag_max = lag;
    }
  }
  kvt_store *store = e->store;
  pthread_mutex_unlock(&e->lock);
  if (store) kvt_store_hists(store, &m->h_read, &m->h_commit);
  for (uint32_t t = KVT_TIER_HOT; t < KVT_N_TIERS; t++) {
    kvt_tier_stats ts;
    if (kvt_stats_tier(e, t, &ts, sizeof ts)) continue;
    m->model[t] = ts.model_accesses;
    m->model_saved[t] = ts.model_saved_accesses;
  }
}

/* The text so far; pos keeps counting past len (what it would take). */
typedef struct metrics_out {
  char *buf;
  size_t len, pos;
} metrics_out;

static void emit(metrics_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(metrics_out *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int room = o->pos < o->len;
  int n = vsnprintf(room ? o->buf + o->pos : NULL, room ? o->len - o->pos : 0, fmt, ap);
  va_end(ap);
  if (n > 0) o->pos += (size_t)n;
}

static void family(metrics_out *o, const char *name, const char *type, const char *help) {
  emit(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static const char *const tier_label[KVT_N_TIERS] = {NULL, "hot", "warm", "cold"};

/* One family with a series per tier, values v[KVT_TIER_HOT..KVT_TIER_COLD]. */
static void per_tier(metrics_out *o, const char *name, const char *type, const char *help,
                     const uint64_t v[KVT_N_TIERS]) {
  family(o, name, type, help);
  for (int t = KVT_TIER_HOT; t < KVT_N_TIERS; t++)
    emit(o, "%s{tier=\"%s\"} %llu\n", name, tier_label[t], (unsigned long long)v[t]);
}

static void one(metrics_out *o, const char *name, const char *type, const char *help,
                uint64_t v) {
  family(o, name, type, help);
  emit(o, "%s %llu\n", name, (unsigned long long)v);
}

/* Cumulative buckets from the per-bucket counts; _count is the +Inf bucket,
 * so the two agree whatever observations landed while they were read. */
static void histogram(metrics_out *o, const char *name, const char *help, const kvt_hist *h) {
  family(o, name, "histogram", help);
  uint64_t cum = 0;
  for (uint32_t i = 0; i <= KVT_HIST_BOUNDS; i++) {
    cum += h->n[i];
    emit(o, "%s_bucket{le=\"%s\"} %llu\n", name, kvt_hist_bound_text(i), (unsigned long long)cum);
  }
  emit(o, "%s_sum %.9f\n%s_count %llu\n", name, (double)h->sum_ns * 1e-9, name,
       (unsigned long long)cum);
}

static void render_tiers(metrics_out *o, const metrics_snap *m) {
  const kvt_stats *st = &m->st;
  uint64_t v[KVT_N_TIERS] = {0};
  per_tier(o, "kvtier_tier_blocks", "gauge",
           "Blocks held: layer blocks in hot and warm (this process's RAM), token blocks "
           "(all layers) in cold (the store).", st->tier_blocks);
  per_tier(o, "kvtier_tier_bytes", "gauge",
           "Bytes held: allocated in RAM for hot and warm, live records on disk for cold.",
           st->tier_bytes);
  per_tier(o, "kvtier_tier_limit_bytes", "gauge",
           "Hard byte limit of the tier (0: no such tier, or cold in a read-only process, "
           "which enforces none).", st->tier_limit);
  per_tier(o, "kvtier_tier_hits_total", "counter",
           "Token blocks found by prefix lookups, counted at the slowest tier one of their "
           "layers was in.", m->tc.hits);
  uint64_t past = st->lookup_blocks_miss; /* went past every tier */
  for (int t = KVT_N_TIERS - 1; t >= KVT_TIER_HOT; t--) {
    v[t] = past;
    past += m->tc.hits[t];
  }
  per_tier(o, "kvtier_tier_misses_total", "counter",
           "Token blocks asked for by prefix lookups and not found in this tier or a faster "
           "one (found slower, or nowhere).", v);
  memcpy(v, m->tc.puts, sizeof v);
  v[KVT_TIER_COLD] = st->cold_written;
  per_tier(o, "kvtier_tier_puts_total", "counter",
           "Blocks stored new: layer blocks by puts in hot and warm, token blocks made "
           "durable by this process in cold.", v);
  memcpy(v, m->tc.reads, sizeof v);
  v[KVT_TIER_COLD] = st->cold_reads;
  per_tier(o, "kvtier_tier_reads_total", "counter",
           "Layer blocks copied out of the tier (reads, gathers, loads).", v);
  memset(v, 0, sizeof v);
  v[KVT_TIER_HOT] = st->demotions;
  per_tier(o, "kvtier_tier_demotions_total", "counter",
           "Layer blocks moved out of the tier to a slower one (hot to warm, encoded; warm "
           "and cold evict instead).", v);
  per_tier(o, "kvtier_tier_promotions_total", "counter",
           "Layer blocks that only the cold tier held given a copy in this tier again.",
           m->tc.promotions);
  per_tier(o, "kvtier_tier_evictions_total", "counter",
           "Unreferenced blocks dropped from the tier to make room.", st->evictions);
  per_tier(o, "kvtier_tier_model_accesses", "gauge",
           "Accesses the tier's learned eviction order's model has counted, those of the "
           "model it started from included (0: another order, or none in this process).",
           m->model);
  per_tier(o, "kvtier_tier_model_saved_accesses", "gauge",
           "The same for the copy of that model the store keeps across restarts: what an "
           "engine opened now would start from (0: none kept).", m->model_saved);
  family(o, "kvtier_tier_checksum_failures_total", "counter",
         "Reads refused by a checksum or header check, each a miss (only the cold tier "
         "checks: RAM holds what this process encoded).");
  emit(o, "kvtier_tier_checksum_failures_total{tier=\"cold\"} %llu\n",
       (unsigned long long)st->cold_checksum_failures);
}

static void render_engine(metrics_out *o, const metrics_snap *m) {
  const kvt_stats *st = &m->st;
  one(o, "kvtier_engine_allocated_bytes", "gauge",
      "Every byte the engine allocated: tiers, index, sequences, bookkeeping.", st->total_bytes);
  one(o, "kvtier_index_bytes", "gauge", "Bytes of the RAM index: hash table and token blocks.",
      st->index_bytes);
  one(o, "kvtier_token_blocks", "gauge", "Distinct token blocks known in RAM.", st->token_blocks);
  one(o, "kvtier_sequences", "gauge", "Open sequences.", st->seqs);
  one(o, "kvtier_namespaces", "gauge", "Registered namespaces.", st->namespaces);
  one(o, "kvtier_lookups_total", "counter", "Prefix lookups (kvt_lookup calls).", st->lookups);
  one(o, "kvtier_puts_total", "counter", "Layer-block puts, stored new or deduplicated.",
      st->puts);
  one(o, "kvtier_put_full_total", "counter", "Puts refused because every tier was full.",
      st->put_full);
  one(o, "kvtier_dedup_hits_total", "counter",
      "Layer blocks found stored already by a put or an append.", st->dedup_hits);
  one(o, "kvtier_dedup_mismatches_total", "counter",
      "Deduplicated puts whose content differed from the stored copy (verified opens only).",
      st->dedup_mismatches);
  one(o, "kvtier_dedup_saved_bytes", "gauge",
      "Payload bytes not stored because sequences share blocks.", st->dedup_saved_bytes);
  one(o, "kvtier_attends_total", "counter", "Attention calls (kvt_seq_attend).", st->attends);
  one(o, "kvtier_lossy_sequences_total", "counter",
      "Sequences whose attention became lossy: their later blocks are keyed under a lineage.",
      m->tc.lossy_seqs);
  one(o, "kvtier_lossy_puts_total", "counter",
      "Layer-block puts into blocks keyed under a lossy sequence's lineage.", m->tc.lossy_puts);
}

static void render_cold(metrics_out *o, const metrics_snap *m) {
  const kvt_stats *st = &m->st;
  one(o, "kvtier_cold_segments", "gauge", "Segment files of the cold tier.", st->cold_segments);
  one(o, "kvtier_cold_segment_size_bytes", "gauge", "Size of one segment, as the store records it.",
      st->cold_segment_bytes);
  one(o, "kvtier_cold_read_bytes_total", "counter", "Bytes read from segment files.",
      st->cold_read_bytes);
  one(o, "kvtier_cold_written_bytes_total", "counter", "Record bytes written and made durable.",
      st->cold_write_bytes);
  one(o, "kvtier_cold_write_failures_total", "counter", "Groups the cold tier failed to write.",
      st->cold_write_failures);
  one(o, "kvtier_cold_reclaims_total", "counter", "Segments reclaimed for reuse.",
      st->cold_reclaims);
  one(o, "kvtier_cold_relocated_total", "counter",
      "Referenced blocks written again out of reclaimed segments.", st->cold_relocated);
  one(o, "kvtier_cold_admission_declines_total", "counter",
      "Token blocks complete and admissible that the cold tier's own admission declined to "
      "write (KVT_EVICT_LEARNED on a full tier: the model predicts them unused).",
      m->tc.cold_declined);
  histogram(o, "kvtier_cold_read_seconds",
            "One read of a segment file, submitted to completed (a layer slice, or adjacent "
            "small slices read together).", &m->h_read);
  histogram(o, "kvtier_cold_group_commit_seconds",
            "One group of records, from the start of its write to its index commit (write, "
            "fdatasync, LMDB commit).", &m->h_commit);
}

static void render_durable(metrics_out *o, const metrics_snap *m) {
  one(o, "kvtier_durable_pending_blocks", "gauge",
      "Token blocks complete and admitted to the cold tier, not yet durable.", m->pending);
  one(o, "kvtier_durable_lag_blocks", "gauge",
      "Token blocks of open sequences past their durable watermark, summed.", m->lag_sum);
  one(o, "kvtier_durable_lag_max_blocks", "gauge",
      "Token blocks past the durable watermark in the sequence that lags most.", m->lag_max);
  family(o, "kvtier_durable_stall_seconds", "gauge",
         "Seconds since a block last became durable while blocks wait for it (0: none waits).");
  emit(o, "kvtier_durable_stall_seconds %.6f\n", m->stall_s);
}

int kvt_metrics_render(kvt_engine *e, char *buf, size_t len, size_t *needed) {
  if (!e || (len && !buf)) return KVT_ENULL;
  metrics_snap m;
  snap_take(e, &m);
  metrics_out o = {.buf = buf, .len = len, .pos = 0};
  family(&o, "kvtier_info", "gauge", "The library version and the cold tier's I/O backend.");
  emit(&o, "kvtier_info{version=\"%d.%d.%d\",io_backend=\"%s\"} 1\n", KVT_VERSION_MAJOR,
       KVT_VERSION_MINOR, KVT_VERSION_PATCH, m.st.io_backend[0] ? m.st.io_backend : "none");
  render_tiers(&o, &m);
  render_engine(&o, &m);
  render_cold(&o, &m);
  render_durable(&o, &m);
  if (needed) *needed = o.pos;
  if (o.pos < len) return 0;
  if (len) buf[0] = '\0';
  return KVT_EBUFSIZE;
}
