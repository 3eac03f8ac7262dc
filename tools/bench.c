/* bench.c - `kvtier bench share`: what N agents with one context cost the
 * store, by the engine's own accounting, hot (f16) or with --codec every
 * block warm (quantized); `kvtier bench hot`: put and gather throughput
 * against memcpy of the same bytes (interleaved rounds, medians) and the
 * latency of a 32K-token prefix lookup. Llama-3-8B shape. `bench codec`
 * lives in bench_codec.c. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "util.h"

/* Llama-3-8B: 32 layers, 8 KV heads of 128, f16; 16 tokens per block. */
#define B_LAYERS 32u
#define B_HEADS 8u
#define B_HEAD_DIM 128u
#define B_BLOCK_TOKENS 16u
#define B_BLOCK_BYTES ((size_t)B_BLOCK_TOKENS * B_HEADS * B_HEAD_DIM * 2) /* K or V */
#define B_TBLOCK_BYTES (B_BLOCK_BYTES * 2 * B_LAYERS) /* K+V, all layers */

#define SHARE_AGENTS_MAX 256u
#define SHARE_TOKENS_MAX 65536u
#define HOT_ROUNDS_MAX 99u
#define HOT_MIB_MIN 64u
#define HOT_MIB_MAX 4096u
#define HOT_WARMUP_PUTS 2u
#define LOOKUP_TOKENS 32768u
#define LOOKUP_BLOCKS (LOOKUP_TOKENS / B_BLOCK_TOKENS)
#define LOOKUP_SAMPLES_MAX 100000u
#define LOOKUP_WARMUP 20u

static const kvt_shape b_shape = {B_LAYERS, B_HEADS, B_HEAD_DIM, KVT_F16, B_BLOCK_TOKENS};

static const kvt_ns_desc b_desc = {
    .model_id = "kvtier-bench/llama-3-8b-shape",
    .weights_fingerprint = "generated-kv-v1",
    .rope_theta = 500000.0,
    .tp_size = 1,
    .shape = {B_LAYERS, B_HEADS, B_HEAD_DIM, KVT_F16, B_BLOCK_TOKENS},
};

/* ---- shared plumbing -------------------------------------------------- */

static int share_fail(const char *what, int rc) { return cli_lib_error("bench share", what, rc); }
static int hot_fail(const char *what, int rc) { return cli_lib_error("bench hot", what, rc); }

/* bench_open with the hot tier's eviction order (kvt_options.hot_evict). */
static int bench_open_evict(const char *dir, const char *remote, uint64_t hot_limit,
                            uint64_t warm_limit, uint32_t flags, uint32_t max_seqs,
                            uint32_t hot_evict, kvt_engine **e, kvt_ns_id *ns)
{
  kvt_options opt;
  kvt_options_init(&opt);
  opt.hot_evict = hot_evict;
  opt.tier_bytes_limit[KVT_TIER_HOT] = hot_limit;
  opt.tier_bytes_limit[KVT_TIER_WARM] = warm_limit;
  opt.flags = flags;
  if (max_seqs > opt.max_seqs) opt.max_seqs = max_seqs;
  int rc = cli_engine_open_remote(dir, &opt, remote, e);
  if (rc != 0) return rc;
  return kvt_ns_register(*e, &b_desc, ns);
}

static int bench_open(const char *dir, const char *remote, uint64_t hot_limit,
                      uint64_t warm_limit, uint32_t flags, uint32_t max_seqs, kvt_engine **e,
                      kvt_ns_id *ns)
{
  return bench_open_evict(dir, remote, hot_limit, warm_limit, flags, max_seqs, KVT_EVICT_LEARNED,
                          e, ns);
}

static uint64_t stored_bytes(const kvt_stats *st)
{
  uint64_t sum = 0;
  for (int t = KVT_TIER_HOT; t < KVT_N_TIERS; t++) sum += st->tier_bytes[t];
  return sum;
}

/* ---- bench share ----------------------------------------------------------- */

typedef struct share_cfg {
  uint64_t agents, tokens, own, seed; /* tokens: shared by all; own: each agent's alone */
  const char *dir, *remote;
  const char *codec; /* NULL: every block hot, f16 */
  int json;
} share_cfg;

typedef struct share_run {
  share_cfg cfg;
  kvt_engine *e;
  kvt_ns_id ns;
  kvgen gen;
  uint32_t n_shared, n_own, n_blocks; /* token blocks: shared, each agent's own, an agent's */
  uint32_t *tokens;    /* the shared context, then each agent's own tokens */
  uint32_t *ctx;       /* one agent's whole context: shared + own */
  uint64_t *pos_hash;  /* of ctx */
  uint8_t *k, *v;      /* one layer block */
  uint8_t *gk, *gv;    /* one layer gathered, and the same regenerated */
  uint8_t *wk, *wv;
  kvt_seq *seqs[SHARE_AGENTS_MAX];
  uint64_t dedup_puts;
  int k_codec, v_codec;  /* with --codec */
  size_t k_len, v_len;   /* encoded K, V of one layer block (kvt_codec_size) */
  kvt_gathered *gathered;
  double v_nmse[2];      /* with --codec: V error of the two layers checked */
  kvt_stats st;
  uint64_t ns_total;
} share_run;

#define SHARE_N_OPTS 8

static void share_opts(share_cfg *c, cli_opt o[SHARE_N_OPTS])
{
  const cli_opt t[SHARE_N_OPTS] = {
      {"--agents", "N", CLI_U64, &c->agents, 1, SHARE_AGENTS_MAX, "agents, 1 to 256 (default 15)"},
      {"--tokens", "T", CLI_U64, &c->tokens, B_BLOCK_TOKENS, SHARE_TOKENS_MAX,
       "tokens of the shared context (system prompt and document), a multiple of 16 "
       "(default 4096)"},
      {"--own", "T", CLI_U64, &c->own, 0, SHARE_TOKENS_MAX,
       "tokens of each agent's own conversation after it, a multiple of 16; 0: every agent "
       "has the same context (default 1024)"},
      {"--seed", "S", CLI_U64, &c->seed, 0, UINT64_MAX, "seed of tokens and KV (default 1)"},
      {"--dir", "D", CLI_STR, &c->dir, 0, 0, "store directory (default: a scratch one, removed)"},
      {"--codec", "KV", CLI_STR, &c->codec, 0, 0,
       "keep every block warm, encoded with this pair (k8v3, k8cv3, k4v2, ...)"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the figures as one JSON object"},
      CLI_OPT_REMOTE(&c->remote),
  };
  memcpy(o, t, sizeof t);
}

/* Agent a's context (shared, then its own tokens) and its KV seeds. */
static void share_context(share_run *r, uint32_t a)
{
  size_t sh = r->cfg.tokens, own = r->cfg.own;
  memcpy(r->ctx, r->tokens, sh * sizeof *r->ctx);
  memcpy(r->ctx + sh, r->tokens + sh + a * own, own * sizeof *r->ctx);
  kvgen_pos_hashes(&r->gen, 0, r->ctx, sh + own, r->pos_hash);
}

/* Put every layer of block b of the current context. */
static int share_put_block(share_run *r, kvt_seq *s, uint32_t b)
{
  for (uint32_t l = 0; l < B_LAYERS; l++) {
    kvgen_fill(&r->gen, r->pos_hash + (size_t)b * B_BLOCK_TOKENS, B_BLOCK_TOKENS, l, r->k, r->v);
    kvt_kv kv = {r->k, r->v, KVT_F16, B_BLOCK_TOKENS, B_HEADS, B_HEAD_DIM};
    int rc = kvt_seq_put(s, b, l, &kv);
    if (rc != 0) {
      char what[80];
      snprintf(what, sizeof what, "putting block %u, layer %u", b, l);
      return share_fail(what, rc);
    }
  }
  return CLI_OK;
}

/* Agent a: look its context up, append it (adopting what is stored), put
 * what is missing: its own conversation, and for agent 0 everything.
 * Agent 1 also puts every shared layer again, so that the dedup path of
 * put is measured too. */
static int share_agent(share_run *r, uint32_t a)
{
  size_t found = 0;
  share_context(r, a);
  int rc = kvt_lookup(r->e, r->ns, r->ctx, r->cfg.tokens + r->cfg.own, NULL, 0, &found);
  if (rc != 0) return share_fail("looking up the context", rc);
  if (a > 0 && found != r->n_shared) {
    fprintf(stderr, "kvtier bench share: agent %u found %zu blocks stored, not the %u shared\n",
            a, found, r->n_shared);
    return CLI_FAIL;
  }
  rc = kvt_seq_create(r->e, r->ns, &r->seqs[a]);
  if (rc != 0) return share_fail("creating a sequence", rc);
  for (uint32_t b = 0; b < r->n_blocks && rc == CLI_OK; b++) {
    kvt_append_info info;
    rc = kvt_seq_append(r->seqs[a], r->ctx + (size_t)b * B_BLOCK_TOKENS, B_BLOCK_TOKENS, &info);
    if (rc != 0) return share_fail("appending a token block", rc);
    int shared = b < r->n_shared, have = info.layers_present == B_LAYERS;
    if (a > 0 && have != shared) {
      fprintf(stderr, "kvtier bench share: agent %u block %u: %s\n", a, b,
              shared ? "a shared block could not be adopted" : "its own block was found stored");
      return CLI_FAIL;
    }
    if (!have || a == 1) rc = share_put_block(r, r->seqs[a], b);
    if (have && a == 1) r->dedup_puts += B_LAYERS;
  }
  return rc;
}

/* Warm K of one gathered layer equals what the codec makes of the KV put:
 * a key codec has no rotation, so the tool can encode it itself. */
static int share_verify_warm_k(share_run *r, uint32_t layer)
{
  const kvt_codec_shape cs = {B_BLOCK_TOKENS, B_HEADS, B_HEAD_DIM, 0, 0};
  for (uint32_t b = 0; b < r->n_blocks; b++) {
    size_t off = (size_t)b * B_BLOCK_BYTES;
    int64_t n = kvt_codec_encode(r->k_codec, &cs, r->wk + off, KVT_F16, r->k, r->k_len);
    int rc = n == (int64_t)r->k_len
                 ? kvt_codec_decode(r->k_codec, &cs, r->k, r->k_len, r->v, KVT_F16)
                 : (n < 0 ? (int)n : KVT_EBUFSIZE);
    if (rc != 0) return share_fail("encoding K to check it", rc);
    if (memcmp(r->v, r->gk + off, B_BLOCK_BYTES) != 0) {
      fprintf(stderr, "kvtier bench share: layer %u block %u: gathered K differs from what "
              "kvt_codec_encode/decode give\n", layer, b);
      return CLI_FAIL;
    }
  }
  return CLI_OK;
}

/* Warm: every gathered block came from warm; K as above; V within 1.5x of
 * the codec's Gaussian NMSE (its rotation seed is the engine's, not public,
 * so the exact bytes cannot be rebuilt here). */
static int share_verify_warm(share_run *r, uint32_t layer, size_t want, double *nmse)
{
  for (uint32_t b = 0; b < r->n_blocks; b++)
    if (r->gathered[b].tier != KVT_TIER_WARM || r->gathered[b].exact) {
      fprintf(stderr, "kvtier bench share: layer %u block %u gathered from tier %u, not warm\n",
              layer, b, r->gathered[b].tier);
      return CLI_FAIL;
    }
  int rc = share_verify_warm_k(r, layer);
  if (rc != CLI_OK) return rc;
  double se = 0, ss = 0;
  const uint16_t *x = (const uint16_t *)r->wv, *y = (const uint16_t *)r->gv;
  for (size_t i = 0; i < want / 2; i++) {
    double a = f16_to_f32(x[i]), d = f16_to_f32(y[i]) - a;
    se += d * d;
    ss += a * a;
  }
  *nmse = se / ss;
  if (*nmse <= 1.5 * lloyd_max_nmse(r->v_codec)) return CLI_OK;
  fprintf(stderr, "kvtier bench share: layer %u: gathered V has NMSE %.4f, theory %.4f\n", layer,
          *nmse, lloyd_max_nmse(r->v_codec));
  return CLI_FAIL;
}

/* The last agent's first and last layers, gathered, equal the KV put (hot),
 * or what the codecs make of it (warm). */
static int share_verify(share_run *r)
{
  kvt_seq *s = r->seqs[r->cfg.agents - 1];
  size_t want = (size_t)r->n_blocks * B_BLOCK_BYTES;
  share_context(r, (uint32_t)r->cfg.agents - 1);
  const uint32_t layers[2] = {0, B_LAYERS - 1};
  for (int i = 0; i < 2; i++) {
    size_t bytes = want, n = 0;
    int rc = kvt_seq_gather(s, layers[i], r->gk, r->gv, &bytes, r->gathered, r->n_blocks, &n);
    if (rc != 0) return share_fail("gathering a layer to check it", rc);
    kvgen_fill(&r->gen, r->pos_hash, r->cfg.tokens + r->cfg.own, layers[i], r->wk, r->wv);
    if (bytes != want || n != r->n_blocks) {
      fprintf(stderr, "kvtier bench share: layer %u gathered %zu blocks, %zu bytes\n", layers[i],
              n, bytes);
      return CLI_FAIL;
    }
    if (r->cfg.codec) {
      rc = share_verify_warm(r, layers[i], want, &r->v_nmse[i]);
      if (rc != CLI_OK) return rc;
      continue;
    }
    if (memcmp(r->gk, r->wk, want) != 0 || memcmp(r->gv, r->wv, want) != 0) {
      fprintf(stderr, "kvtier bench share: layer %u gathered differs from the KV put\n",
              layers[i]);
      return CLI_FAIL;
    }
  }
  return CLI_OK;
}

static int share_alloc(share_run *r)
{
  size_t layer = (size_t)r->n_blocks * B_BLOCK_BYTES;
  size_t n_all = r->cfg.tokens + r->cfg.agents * r->cfg.own, n_ctx = r->cfg.tokens + r->cfg.own;
  r->tokens = malloc(n_all * sizeof *r->tokens);
  r->ctx = malloc(n_ctx * sizeof *r->ctx);
  r->pos_hash = malloc(n_ctx * sizeof *r->pos_hash);
  r->k = malloc(2 * B_BLOCK_BYTES); /* also the encoded K of the warm check */
  r->v = malloc(B_BLOCK_BYTES);
  r->gk = malloc(layer);
  r->gv = malloc(layer);
  r->wk = malloc(layer);
  r->wv = malloc(layer);
  r->gathered = malloc(r->n_blocks * sizeof *r->gathered);
  if (!r->tokens || !r->ctx || !r->pos_hash || !r->k || !r->v || !r->gk || !r->gv || !r->wk || !r->wv ||
      !r->gathered)
    return share_fail("allocating buffers", -ENOMEM);
  int rc = kvgen_init(&r->gen, &b_shape, r->cfg.seed);
  if (rc != 0) return share_fail("setting up the KV generator", rc);
  prng p;
  prng_seed(&p, r->cfg.seed);
  gen_tokens(&p, KVGEN_VOCAB, r->tokens, n_all);
  return CLI_OK;
}

static void share_free(share_run *r)
{
  for (uint32_t a = 0; a < SHARE_AGENTS_MAX; a++) kvt_seq_release(r->seqs[a]);
  kvt_engine_close(r->e);
  kvgen_free(&r->gen);
  free(r->tokens);
  free(r->ctx);
  free(r->pos_hash);
  free(r->k);
  free(r->v);
  free(r->gk);
  free(r->gv);
  free(r->wk);
  free(r->wv);
  free(r->gathered);
}

/* Distinct token blocks: the shared ones once, and every agent's own. */
static uint64_t share_unique(const share_run *r)
{
  return r->n_shared + r->cfg.agents * r->n_own;
}

/* f16 bytes of one agent's context, and of the distinct blocks of all. */
static uint64_t share_payload(const share_run *r) { return (uint64_t)r->n_blocks * B_TBLOCK_BYTES; }
static uint64_t share_unique_payload(const share_run *r) { return share_unique(r) * B_TBLOCK_BYTES; }

/* Layer blocks stored once for all agents. */
static uint64_t share_lblocks(const share_run *r) { return share_unique(r) * B_LAYERS; }

/* Encoded bytes of what is stored (headers, scales and norms included). */
static uint64_t share_encoded(const share_run *r)
{
  return share_lblocks(r) * (r->k_len + r->v_len);
}

/* The best reduction the stored form allows: one copy of each distinct
 * block (or of its encoding), no other byte. 1 - 1/N for N agents with
 * one context in f16. */
static double share_arith(const share_run *r)
{
  double frac = r->cfg.codec ? (double)(r->k_len + r->v_len) / (2.0 * B_BLOCK_BYTES) : 1.0;
  return 1.0 - frac * (double)share_unique(r) / (double)(r->cfg.agents * r->n_blocks);
}

/* What private copies would take, split by what saves it: deduplication
 * (private f16 down to one f16 copy of each distinct block), then the codec
 * (that f16 down to its encoding); the rest is what the engine spends
 * beyond the stored form (descriptors, index, sequences). */
typedef struct share_split {
  uint64_t priv, dedup_saved, codec_saved;
  int64_t overhead;
} share_split;

static share_split share_split_of(const share_run *r)
{
  share_split x;
  x.priv = r->cfg.agents * share_payload(r);
  x.dedup_saved = x.priv - share_unique_payload(r);
  x.codec_saved = r->cfg.codec ? share_unique_payload(r) - share_encoded(r) : 0;
  uint64_t form = r->cfg.codec ? share_encoded(r) : share_unique_payload(r);
  x.overhead = (int64_t)r->st.total_bytes - (int64_t)form;
  return x;
}

static void share_json(const share_run *r, uint64_t priv, double red)
{
  const kvt_stats *st = &r->st;
  share_split x = share_split_of(r);
  char pair[24];
  snprintf(pair, sizeof pair, "%s%s", r->cfg.codec ? kvt_codec_name(r->k_codec) : "none",
           r->cfg.codec ? kvt_codec_name(r->v_codec) : "");
  json_w j;
  json_begin(&j, stdout);
  json_str(&j, "command", "bench share");
  json_u64(&j, "agents", r->cfg.agents);
  json_u64(&j, "tokens", r->cfg.tokens);
  json_u64(&j, "own_tokens", r->cfg.own);
  json_str(&j, "workload", r->cfg.own ? "partial overlap" : "same context");
  json_u64(&j, "seed", r->cfg.seed);
  json_u64(&j, "n_layers", B_LAYERS);
  json_u64(&j, "n_kv_heads", B_HEADS);
  json_u64(&j, "head_dim", B_HEAD_DIM);
  json_str(&j, "dtype", "f16");
  json_u64(&j, "block_tokens", B_BLOCK_TOKENS);
  json_str(&j, "codec", pair);
  json_u64(&j, "payload_bytes", share_payload(r));
  json_u64(&j, "unique_payload_bytes", share_unique_payload(r));
  json_u64(&j, "stored_bytes", stored_bytes(st));
  json_u64(&j, "hot_bytes", st->tier_bytes[KVT_TIER_HOT]);
  json_u64(&j, "warm_bytes", st->tier_bytes[KVT_TIER_WARM]);
  json_u64(&j, "hot_blocks", st->tier_blocks[KVT_TIER_HOT]);
  json_u64(&j, "warm_blocks", st->tier_blocks[KVT_TIER_WARM]);
  if (r->cfg.codec) {
    json_u64(&j, "encoded_bytes", share_encoded(r));
    json_u64(&j, "warm_overhead_bytes", st->tier_bytes[KVT_TIER_WARM] - share_encoded(r));
    json_f64(&j, "v_nmse", 0.5 * (r->v_nmse[0] + r->v_nmse[1]));
  }
  json_u64(&j, "stats_total_bytes", st->total_bytes);
  json_u64(&j, "index_bytes", st->index_bytes);
  json_u64(&j, "seq_bytes", st->seq_bytes);
  json_u64(&j, "other_bytes", st->other_bytes);
  json_u64(&j, "private_bytes", priv);
  json_f64(&j, "reduction", red);
  json_u64(&j, "saved_by_dedup_bytes", x.dedup_saved);
  json_u64(&j, "saved_by_codec_bytes", x.codec_saved);
  json_f64(&j, "overhead_bytes", (double)x.overhead);
  json_f64(&j, "reduction_from_dedup", (double)x.dedup_saved / (double)priv);
  json_f64(&j, "reduction_from_codec", (double)x.codec_saved / (double)priv);
  json_f64(&j, "reduction_ceiling", share_arith(r)); /* 1 - 1/N when hot, own 0 */
  json_f64(&j, "reduction_arithmetic", share_arith(r));
  json_u64(&j, "logical_bytes", st->logical_bytes);
  json_u64(&j, "dedup_saved_bytes", st->dedup_saved_bytes);
  json_u64(&j, "dedup_puts", r->dedup_puts);
  json_u64(&j, "dedup_hits", st->dedup_hits);
  json_bool(&j, "verified", 1);
  json_f64(&j, "seconds", (double)r->ns_total / 1e9);
  kvt_remote_stats rs;
  cli_remote_get(r->e, &rs);
  cli_remote_json(&j, &rs);
  json_end(&j);
}

static void share_report(const share_run *r)
{
  const kvt_stats *st = &r->st;
  share_split x = share_split_of(r);
  uint64_t priv = x.priv;
  double red = 1.0 - (double)st->total_bytes / (double)priv;
  if (r->cfg.json) {
    share_json(r, priv, red);
    return;
  }
  char b1[32], b2[32], b3[32], b4[32];
  printf("bench share: %" PRIu64 " agents sharing a %" PRIu64 "-token context, each with %" PRIu64
         " tokens of its own after it (seed %" PRIu64 ")\n"
         "model: %u layers x %u KV heads x head_dim %u, f16, %u tokens per block\n",
         r->cfg.agents, r->cfg.tokens, r->cfg.own, r->cfg.seed, B_LAYERS, B_HEADS, B_HEAD_DIM,
         B_BLOCK_TOKENS);
  if (r->cfg.codec)
    printf("every block warm: K %s, V %s (%.3f + %.3f bits per value, headers included)\n",
           kvt_codec_name(r->k_codec), kvt_codec_name(r->v_codec),
           8.0 * (double)r->k_len / (B_BLOCK_BYTES / 2), 8.0 * (double)r->v_len / (B_BLOCK_BYTES / 2));
  printf("\n  private copies would take  %12s  (%" PRIu64 " x %s of f16 KV)\n",
         fmt_bytes(b1, sizeof b1, priv), r->cfg.agents, fmt_bytes(b2, sizeof b2, share_payload(r)));
  printf("  engine holds (total_bytes) %12s  (tiers %s, index %s, sequences %s)\n",
         fmt_bytes(b1, sizeof b1, st->total_bytes), fmt_bytes(b2, sizeof b2, stored_bytes(st)),
         fmt_bytes(b3, sizeof b3, st->index_bytes), fmt_bytes(b4, sizeof b4, st->seq_bytes));
  if (r->cfg.codec)
    printf("  warm tier                  %12s  (encoded %s, descriptors and alignment %s)\n",
           fmt_bytes(b1, sizeof b1, st->tier_bytes[KVT_TIER_WARM]),
           fmt_bytes(b2, sizeof b2, share_encoded(r)),
           fmt_bytes(b3, sizeof b3, st->tier_bytes[KVT_TIER_WARM] - share_encoded(r)));
  printf("  reduction                  %11.3f%%  (arithmetic limit %.3f%%: one %scopy of each "
         "distinct block, nothing else)\n", 100.0 * red, 100.0 * share_arith(r),
         r->cfg.codec ? "encoded " : "");
  printf("    by deduplication         %11.3f%%  (%s)\n", 100.0 * (double)x.dedup_saved / (double)priv,
         fmt_bytes(b1, sizeof b1, x.dedup_saved));
  printf("    by the codec             %11.3f%%  (%s)\n", 100.0 * (double)x.codec_saved / (double)priv,
         fmt_bytes(b1, sizeof b1, x.codec_saved));
  printf("    less engine overhead     %11.3f%%  (%.1f MiB: descriptors, index, sequences)\n",
         -100.0 * (double)x.overhead / (double)priv, (double)x.overhead / (1 << 20));
  printf("  dedup                      %" PRIu64 " puts of stored blocks, %" PRIu64
         " dedup hits; gathered KV checked\n  time                       %.2f s\n",
         r->dedup_puts, st->dedup_hits, (double)r->ns_total / 1e9);
  kvt_remote_stats rs;
  cli_remote_get(r->e, &rs);
  cli_remote_print(&rs);
}

/* Every byte by category: the tiers, index, sequences and the rest must
 * add up to total_bytes, and every block must be in the tier asked for. */
static int share_check_stats(share_run *r)
{
  const kvt_stats *st = &r->st;
  uint64_t sum = stored_bytes(st) + st->index_bytes + st->seq_bytes + st->other_bytes;
  if (sum != st->total_bytes) {
    fprintf(stderr, "kvtier bench share: tiers + index + sequences + other = %" PRIu64
            " bytes, but total_bytes = %" PRIu64 "\n", sum, st->total_bytes);
    return CLI_FAIL;
  }
  int t = r->cfg.codec ? KVT_TIER_WARM : KVT_TIER_HOT;
  if (st->tier_blocks[t] != share_lblocks(r) || stored_bytes(st) != st->tier_bytes[t]) {
    fprintf(stderr, "kvtier bench share: %" PRIu64 " of %" PRIu64 " layer blocks in the %s "
            "tier; hot %" PRIu64 ", warm %" PRIu64 " blocks\n", st->tier_blocks[t],
            share_lblocks(r), t == KVT_TIER_WARM ? "warm" : "hot", st->tier_blocks[KVT_TIER_HOT],
            st->tier_blocks[KVT_TIER_WARM]);
    return CLI_FAIL;
  }
  return CLI_OK;
}

/* Hot: room for everything in f16. --codec: hot limit 0 (a block can
 * never fit, so every put encodes it straight into warm) and a warm limit
 * with room for every block and its descriptor. */
static int share_open(share_run *r, const char *dir)
{
  uint64_t pay = share_unique_payload(r), hot = pay + pay / 4 + (64u << 20), warm = 0;
  if (r->cfg.codec) {
    const kvt_codec_shape cs = {B_BLOCK_TOKENS, B_HEADS, B_HEAD_DIM, 0, 0};
    r->k_len = kvt_codec_size(r->k_codec, &cs);
    r->v_len = kvt_codec_size(r->v_codec, &cs);
    hot = 0;
    warm = share_lblocks(r) * (r->k_len + r->v_len + 1024) + (64u << 20);
  }
  /* The hot tier's LRU list: the learned order's model is a fixed 6.5 MiB
   * of the engine's bytes, which a few-block share would count against
   * sharing (it measures what dedup saves, nothing is evicted). */
  int rc = bench_open_evict(dir, r->cfg.remote, hot, warm, 0, (uint32_t)r->cfg.agents,
                            KVT_EVICT_LRU, &r->e, &r->ns);
  if (rc != 0) return share_fail("opening the store", rc);
  if (r->cfg.codec) {
    rc = kvt_ns_set_codec(r->e, r->ns, KVT_ALL_LAYERS, r->k_codec, r->v_codec);
    if (rc != 0) return share_fail("setting the warm codecs", rc);
  }
  return CLI_OK;
}

static int share_main(share_run *r, const char *dir)
{
  uint64_t t0 = now_ns();
  int rc = share_alloc(r);
  if (rc == CLI_OK) rc = share_open(r, dir);
  if (rc != CLI_OK) return rc;
  for (uint32_t a = 0; a < r->cfg.agents; a++) {
    progress("bench share: agent %u of %" PRIu64, a + 1, r->cfg.agents);
    rc = share_agent(r, a);
    if (rc != CLI_OK) return rc;
  }
  progress_end();
  rc = kvt_stats_get(r->e, &r->st);
  if (rc != 0) return share_fail("reading the counters", rc);
  rc = share_check_stats(r);
  if (rc == CLI_OK) rc = share_verify(r);
  if (rc != CLI_OK) return rc;
  r->ns_total = now_ns() - t0;
  share_report(r);
  return CLI_OK;
}

static int bench_share(int argc, char **argv)
{
  share_cfg cfg = {.agents = 15, .tokens = 4096, .own = 1024, .seed = 1};
  cli_opt opts[SHARE_N_OPTS];
  share_opts(&cfg, opts);
  int want_help = 0;
  int rc = cli_parse("bench share", argc, argv, opts, SHARE_N_OPTS, &want_help);
  if (want_help) bench_usage(stdout);
  if (rc != CLI_OK || want_help) return rc;
  if (cfg.tokens % B_BLOCK_TOKENS != 0 || cfg.own % B_BLOCK_TOKENS != 0) {
    fprintf(stderr, "kvtier bench share: --tokens and --own must be multiples of %u, not %" PRIu64
            " and %" PRIu64 "\n", B_BLOCK_TOKENS, cfg.tokens, cfg.own);
    return CLI_USAGE;
  }
  share_run *r = calloc(1, sizeof *r);
  if (r == NULL) return share_fail("allocating state", -ENOMEM);
  if (cfg.codec && kvt_codec_parse(cfg.codec, &r->k_codec, &r->v_codec) != 0) {
    fprintf(stderr, "kvtier bench share: --codec '%s' is not a codec pair such as k8v3, k8cv3, "
            "k4v2\nrun 'kvtier help bench' for its options\n", cfg.codec);
    free(r);
    return CLI_USAGE;
  }
  r->cfg = cfg;
  r->n_shared = (uint32_t)(cfg.tokens / B_BLOCK_TOKENS);
  r->n_own = (uint32_t)(cfg.own / B_BLOCK_TOKENS);
  r->n_blocks = r->n_shared + r->n_own;
  bench_dir d;
  rc = bench_dir_open(&d, cfg.dir, "bench share");
  if (rc == CLI_OK) {
    rc = share_main(r, d.path);
    share_free(r);
    bench_dir_close(&d, "bench share");
  }
  free(r);
  return rc;
}

/* ---- bench hot --------------------------------------------------------------- */

typedef struct hot_cfg {
  uint64_t mib, rounds, lookups, seed; /* mib 0: HOT_L3_TIMES x the L3 cache */
  const char *dir, *remote;
  int json;
} hot_cfg;

typedef struct hot_run {
  hot_cfg cfg;
  kvt_engine *e;
  kvt_ns_id ns;
  uint32_t n_blocks;             /* token blocks in the working set */
  size_t layer_bytes;            /* K (= V) of one layer of the working set */
  size_t half;                   /* K (= V) of the working set */
  uint8_t *src_k, *src_v;        /* [layer][token][head][dim] */
  uint8_t *dst_k, *dst_v;
  uint32_t *tokens;              /* [1 + warm-up + rounds][n_blocks * block_tokens] */
  kvt_seq *g;                    /* the sequence gathered from */
  double put_gbps[HOT_ROUNDS_MAX], gather_gbps[HOT_ROUNDS_MAX], memcpy_gbps[HOT_ROUNDS_MAX];
  double gather_ratio[HOT_ROUNDS_MAX], put_ratio[HOT_ROUNDS_MAX];
  double *lookup_us;             /* [cfg.lookups] */
  uint64_t evictions;            /* hot-tier evictions, warm-up included */
  uint64_t l3_bytes;             /* 0: unknown */
} hot_run;

#define HOT_N_OPTS 7

static void hot_opts(hot_cfg *c, cli_opt o[HOT_N_OPTS])
{
  const cli_opt t[HOT_N_OPTS] = {
      {"--mib", "M", CLI_U64, &c->mib, HOT_MIB_MIN, HOT_MIB_MAX,
       "working set in MiB, K+V, 64 to 4096 (default: 4 x the L3 cache, 1024 if unknown)"},
      {"--rounds", "R", CLI_U64, &c->rounds, 3, HOT_ROUNDS_MAX,
       "interleaved rounds, 3 to 99 (default 7)"},
      {"--lookups", "N", CLI_U64, &c->lookups, 100, LOOKUP_SAMPLES_MAX,
       "timed prefix lookups, 100 to 100000 (default 1000)"},
      {"--seed", "S", CLI_U64, &c->seed, 0, UINT64_MAX, "seed of tokens and KV (default 1)"},
      {"--dir", "D", CLI_STR, &c->dir, 0, 0, "store directory (default: a scratch one, removed)"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the figures as one JSON object"},
      CLI_OPT_REMOTE(&c->remote),
  };
  memcpy(o, t, sizeof t);
}

static uint32_t *hot_tokens(hot_run *r, uint32_t i)
{
  return r->tokens + (size_t)i * r->n_blocks * B_BLOCK_TOKENS;
}

/* Append every block of tokens to s and put every layer from src. */
static int hot_fill_seq(hot_run *r, kvt_seq *s, const uint32_t *tokens)
{
  for (uint32_t b = 0; b < r->n_blocks; b++) {
    int rc = kvt_seq_append(s, tokens + (size_t)b * B_BLOCK_TOKENS, B_BLOCK_TOKENS, NULL);
    if (rc != 0) return rc;
    for (uint32_t l = 0; l < B_LAYERS; l++) {
      size_t off = l * r->layer_bytes + b * B_BLOCK_BYTES;
      kvt_kv kv = {r->src_k + off, r->src_v + off, KVT_F16, B_BLOCK_TOKENS, B_HEADS, B_HEAD_DIM};
      rc = kvt_seq_put(s, b, l, &kv);
      if (rc != 0) return rc;
    }
  }
  return 0;
}

/* One put round: a new context (never seen: no dedup) put whole, into a
 * tier full of the previous round's unreferenced blocks, which it evicts:
 * the steady state of a serving engine. Returns seconds, or < 0. */
static double hot_put_round(hot_run *r, uint32_t i, int *rc)
{
  kvt_seq *s = NULL;
  uint64_t t0 = now_ns();
  *rc = kvt_seq_create(r->e, r->ns, &s);
  if (*rc == 0) *rc = hot_fill_seq(r, s, hot_tokens(r, i));
  uint64_t t1 = now_ns();
  kvt_seq_release(s);
  return *rc ? -1.0 : (double)(t1 - t0) / 1e9;
}

static double hot_gather_round(hot_run *r, int *rc)
{
  uint64_t t0 = now_ns();
  for (uint32_t l = 0; l < B_LAYERS && *rc == 0; l++) {
    size_t bytes = r->layer_bytes, n = 0;
    *rc = kvt_seq_gather(r->g, l, r->dst_k + l * r->layer_bytes, r->dst_v + l * r->layer_bytes,
                         &bytes, NULL, 0, &n);
    if (*rc == 0 && (bytes != r->layer_bytes || n != r->n_blocks)) *rc = KVT_EBUFSIZE;
  }
  uint64_t t1 = now_ns();
  return *rc ? -1.0 : (double)(t1 - t0) / 1e9;
}

static double hot_memcpy_round(hot_run *r)
{
  uint64_t t0 = now_ns();
  memcpy(r->dst_k, r->src_k, r->half);
  memcpy(r->dst_v, r->src_v, r->half);
  uint64_t t1 = now_ns();
  return (double)(t1 - t0) / 1e9;
}

/* The working set when --mib is not given: several times L3, so that put,
 * gather and memcpy run from memory, as a serving engine's KV does. */
#define HOT_L3_TIMES 4u
static uint64_t hot_default_mib(uint64_t l3)
{
  uint64_t mib = l3 ? (HOT_L3_TIMES * l3 + (1u << 20) - 1) >> 20 : 1024;
  return mib < HOT_MIB_MIN ? HOT_MIB_MIN : mib > HOT_MIB_MAX ? HOT_MIB_MAX : mib;
}

static int hot_alloc(hot_run *r)
{
  r->l3_bytes = cpu_l3_bytes();
  if (r->cfg.mib == 0) r->cfg.mib = hot_default_mib(r->l3_bytes);
  r->n_blocks = (uint32_t)(r->cfg.mib * (1u << 20) / B_TBLOCK_BYTES);
  r->layer_bytes = (size_t)r->n_blocks * B_BLOCK_BYTES;
  r->half = r->layer_bytes * B_LAYERS;
  size_t n_tok = (size_t)r->n_blocks * B_BLOCK_TOKENS;
  r->src_k = malloc(r->half);
  r->src_v = malloc(r->half);
  r->dst_k = malloc(r->half);
  r->dst_v = malloc(r->half);
  r->tokens = malloc((1 + HOT_WARMUP_PUTS + r->cfg.rounds) * n_tok * sizeof *r->tokens);
  r->lookup_us = malloc(r->cfg.lookups * sizeof *r->lookup_us);
  if (!r->src_k || !r->src_v || !r->dst_k || !r->dst_v || !r->tokens || !r->lookup_us)
    return hot_fail("allocating buffers", -ENOMEM);
  memset(r->dst_k, 0, r->half); /* pre-fault: first touch runs at ~1 GB/s */
  memset(r->dst_v, 0, r->half);
  prng p;
  prng_seed(&p, r->cfg.seed);
  gen_tokens(&p, KVGEN_VOCAB, r->tokens, (1 + HOT_WARMUP_PUTS + r->cfg.rounds) * n_tok);
  return CLI_OK;
}

/* The working set's KV, generated for the gathered context's tokens. */
static int hot_generate(hot_run *r)
{
  kvgen g;
  size_t n_tok = (size_t)r->n_blocks * B_BLOCK_TOKENS;
  uint64_t *ph = malloc(n_tok * sizeof *ph);
  int rc = ph ? kvgen_init(&g, &b_shape, r->cfg.seed) : -ENOMEM;
  if (rc != 0) {
    free(ph);
    return hot_fail("setting up the KV generator", rc);
  }
  kvgen_pos_hashes(&g, 0, hot_tokens(r, 0), n_tok, ph);
  for (uint32_t l = 0; l < B_LAYERS; l++)
    kvgen_fill(&g, ph, n_tok, l, r->src_k + l * r->layer_bytes, r->src_v + l * r->layer_bytes);
  kvgen_free(&g);
  free(ph);
  return CLI_OK;
}

/* Warm-up, untimed: the gathered sequence; two put rounds, so that the tier
 * is full and the allocator has settled (the first round that evicts still
 * touches fresh pages); one gather checked byte for byte; one memcpy. */
static int hot_warmup(hot_run *r)
{
  int rc = kvt_seq_create(r->e, r->ns, &r->g);
  if (rc == 0) rc = hot_fill_seq(r, r->g, hot_tokens(r, 0));
  if (rc != 0) return hot_fail("putting the gathered context", rc);
  for (uint32_t i = 1; i <= HOT_WARMUP_PUTS && rc == 0; i++) hot_put_round(r, i, &rc);
  if (rc != 0) return hot_fail("warm-up put round", rc);
  hot_gather_round(r, &rc);
  if (rc != 0) return hot_fail("warm-up gather", rc);
  if (memcmp(r->dst_k, r->src_k, r->half) != 0 || memcmp(r->dst_v, r->src_v, r->half) != 0) {
    fprintf(stderr, "kvtier bench hot: gathered KV differs from the KV put\n");
    return CLI_FAIL;
  }
  hot_memcpy_round(r);
  return CLI_OK;
}

/* A B C A B C ...: put, gather, memcpy in each round, so that drift of the
 * machine hits all three alike; ratios are taken within a round. */
static int hot_rounds(hot_run *r)
{
  double gb = (double)(2 * r->half) / 1e9;
  for (uint32_t i = 0; i < r->cfg.rounds; i++) {
    progress("bench hot: round %u of %" PRIu64, i + 1, r->cfg.rounds);
    int rc = 0;
    double tp = hot_put_round(r, i + 1 + HOT_WARMUP_PUTS, &rc);
    if (rc != 0) return hot_fail("put round", rc);
    double tg = hot_gather_round(r, &rc);
    if (rc != 0) return hot_fail("gather round", rc);
    double tm = hot_memcpy_round(r);
    r->put_gbps[i] = gb / tp;
    r->gather_gbps[i] = gb / tg;
    r->memcpy_gbps[i] = gb / tm;
    r->put_ratio[i] = tm / tp;
    r->gather_ratio[i] = tm / tg;
  }
  progress_end();
  kvt_stats st;
  int rc = kvt_stats_get(r->e, &st);
  if (rc != 0) return hot_fail("reading the counters", rc);
  r->evictions = st.evictions[KVT_TIER_HOT];
  return CLI_OK;
}

/* Store a 32K-token context in a metadata-only engine (same index and
 * lookup code, no payloads: 4 GiB of real KV would not fit a small box)
 * and time prefix lookups of it, every block a hit. */
static int hot_lookup_store(hot_run *r, const char *dir, kvt_engine **e, kvt_ns_id *ns,
                            uint32_t *tokens)
{
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/lookup-metadata-only", dir) >= (int)sizeof path)
    return hot_fail("lookup store path", -ENAMETOOLONG);
  int rc = bench_open(path, NULL, (uint64_t)LOOKUP_BLOCKS * B_TBLOCK_BYTES * 2, 0,
                      KVT_OPEN_METADATA_ONLY, 0, e, ns);
  if (rc != 0) return hot_fail("opening a metadata-only store for the lookup test", rc);
  prng p;
  prng_seed(&p, mix64(r->cfg.seed ^ 0x6c6f6f6b7570ull));
  gen_tokens(&p, KVGEN_VOCAB, tokens, LOOKUP_TOKENS);
  kvt_seq *s = NULL;
  rc = kvt_seq_create(*e, *ns, &s);
  for (uint32_t b = 0; b < LOOKUP_BLOCKS && rc == 0; b++) {
    rc = kvt_seq_append(s, tokens + (size_t)b * B_BLOCK_TOKENS, B_BLOCK_TOKENS, NULL);
    for (uint32_t l = 0; l < B_LAYERS && rc == 0; l++) {
      kvt_kv kv = {NULL, NULL, KVT_F16, B_BLOCK_TOKENS, B_HEADS, B_HEAD_DIM};
      rc = kvt_seq_put(s, b, l, &kv);
    }
  }
  kvt_seq_release(s); /* the blocks stay cached: the limit leaves room */
  return rc != 0 ? hot_fail("storing the 32K-token context", rc) : CLI_OK;
}

static int hot_lookups(hot_run *r, const char *dir)
{
  kvt_engine *e = NULL;
  kvt_ns_id ns = 0;
  uint32_t *tokens = malloc(LOOKUP_TOKENS * sizeof *tokens);
  kvt_lookup_entry *out = calloc(LOOKUP_BLOCKS, sizeof *out); /* faulted by the warm-up lookups */
  int rc = tokens && out ? hot_lookup_store(r, dir, &e, &ns, tokens)
                         : hot_fail("allocating lookup buffers", -ENOMEM);
  for (uint64_t i = 0; i < LOOKUP_WARMUP + r->cfg.lookups && rc == CLI_OK; i++) {
    size_t found = 0;
    uint64_t t0 = now_ns();
    int lrc = kvt_lookup(e, ns, tokens, LOOKUP_TOKENS, out, LOOKUP_BLOCKS, &found);
    uint64_t t1 = now_ns();
    if (lrc != 0) rc = hot_fail("prefix lookup", lrc);
    else if (found != LOOKUP_BLOCKS) {
      fprintf(stderr, "kvtier bench hot: lookup found %zu of %u stored blocks\n", found,
              LOOKUP_BLOCKS);
      rc = CLI_FAIL;
    } else if (i >= LOOKUP_WARMUP)
      r->lookup_us[i - LOOKUP_WARMUP] = (double)(t1 - t0) / 1e3;
  }
  kvt_engine_close(e);
  free(tokens);
  free(out);
  return rc;
}

static void hot_report(hot_run *r)
{
  size_t n = r->cfg.rounds;
  double put = median_f64(r->put_gbps, n), gat = median_f64(r->gather_gbps, n);
  double mem = median_f64(r->memcpy_gbps, n);
  double gr = median_f64(r->gather_ratio, n), pr = median_f64(r->put_ratio, n);
  sort_f64(r->lookup_us, r->cfg.lookups);
  double p50 = percentile_sorted(r->lookup_us, r->cfg.lookups, 50);
  double p99 = percentile_sorted(r->lookup_us, r->cfg.lookups, 99);
  kvt_remote_stats rs;
  cli_remote_get(r->e, &rs);
  if (r->cfg.json) {
    json_w j;
    json_begin(&j, stdout);
    json_str(&j, "command", "bench hot");
    json_u64(&j, "working_set_bytes", 2 * r->half);
    json_u64(&j, "l3_bytes", r->l3_bytes);
    json_f64(&j, "working_set_vs_l3", r->l3_bytes ? (double)(2 * r->half) / (double)r->l3_bytes : NAN);
    json_u64(&j, "rounds", n);
    json_u64(&j, "seed", r->cfg.seed);
    json_f64(&j, "put_gbps", put);
    json_f64(&j, "gather_gbps", gat);
    json_f64(&j, "memcpy_gbps", mem);
    json_f64(&j, "gather_vs_memcpy", gr);
    json_f64(&j, "put_vs_memcpy", pr);
    json_u64(&j, "hot_evictions", r->evictions);
    json_f64(&j, "put_gbps_min", r->put_gbps[0]);
    json_f64(&j, "put_gbps_max", r->put_gbps[n - 1]);
    json_f64(&j, "gather_gbps_min", r->gather_gbps[0]);
    json_f64(&j, "gather_gbps_max", r->gather_gbps[n - 1]);
    json_f64(&j, "memcpy_gbps_min", r->memcpy_gbps[0]);
    json_f64(&j, "memcpy_gbps_max", r->memcpy_gbps[n - 1]);
    json_u64(&j, "lookup_tokens", LOOKUP_TOKENS);
    json_u64(&j, "lookups", r->cfg.lookups);
    json_str(&j, "lookup_store", "metadata-only");
    json_f64(&j, "lookup_p50_us", p50);
    json_f64(&j, "lookup_p99_us", p99);
    cli_remote_json(&j, &rs);
    json_end(&j);
    return;
  }
  char b1[32], b2[32];
  printf("bench hot: Llama-3-8B shape (%u layers x %u KV heads x head_dim %u, f16, %u tokens "
         "per block)\nworking set %s (K+V; L3 %s), %zu interleaved rounds, medians [min-max], "
         "seed %" PRIu64 "\n\n", B_LAYERS, B_HEADS, B_HEAD_DIM, B_BLOCK_TOKENS,
         fmt_bytes(b1, sizeof b1, 2 * r->half),
         r->l3_bytes ? fmt_bytes(b2, sizeof b2, r->l3_bytes) : "unknown", n, r->cfg.seed);
  printf("  put     %6.2f GB/s [%.2f-%.2f]  %.2f x memcpy  (new blocks into a full tier, "
         "%" PRIu64 " evictions)\n", put, r->put_gbps[0], r->put_gbps[n - 1], pr, r->evictions);
  printf("  gather  %6.2f GB/s [%.2f-%.2f]  %.2f x memcpy  (every layer, as attention reads)\n",
         gat, r->gather_gbps[0], r->gather_gbps[n - 1], gr);
  printf("  memcpy  %6.2f GB/s [%.2f-%.2f]  (the same bytes, same buffers)\n", mem,
         r->memcpy_gbps[0], r->memcpy_gbps[n - 1]);
  printf("  lookup  of a %u-token context, all hits: p50 %.1f us, p99 %.1f us (%" PRIu64
         " lookups, metadata-only store)\n", LOOKUP_TOKENS, p50, p99, r->cfg.lookups);
  cli_remote_print(&rs);
}

static int hot_main(hot_run *r, const char *dir)
{
  int rc = hot_alloc(r);
  if (rc == CLI_OK) rc = hot_generate(r);
  if (rc != CLI_OK) return rc;
  /* The gathered context plus one round of puts; the next round evicts. */
  uint64_t ws = 2 * r->half;
  rc = bench_open(dir, r->cfg.remote, 2 * ws + ws / 8, 0, 0, 0, &r->e, &r->ns);
  if (rc != 0) return hot_fail("opening the store", rc);
  rc = hot_warmup(r);
  if (rc == CLI_OK) rc = hot_rounds(r);
  if (rc == CLI_OK) rc = hot_lookups(r, dir);
  if (rc == CLI_OK) hot_report(r);
  return rc;
}

static void hot_free(hot_run *r)
{
  kvt_seq_release(r->g);
  kvt_engine_close(r->e);
  free(r->src_k);
  free(r->src_v);
  free(r->dst_k);
  free(r->dst_v);
  free(r->tokens);
  free(r->lookup_us);
}

static int bench_hot(int argc, char **argv)
{
  hot_cfg cfg = {.mib = 0, .rounds = 7, .lookups = 1000, .seed = 1};
  cli_opt opts[HOT_N_OPTS];
  hot_opts(&cfg, opts);
  int want_help = 0;
  int rc = cli_parse("bench hot", argc, argv, opts, HOT_N_OPTS, &want_help);
  if (want_help) bench_usage(stdout);
  if (rc != CLI_OK || want_help) return rc;
  hot_run *r = calloc(1, sizeof *r);
  if (r == NULL) return hot_fail("allocating state", -ENOMEM);
  r->cfg = cfg;
  bench_dir d;
  rc = bench_dir_open(&d, cfg.dir, "bench hot");
  if (rc == CLI_OK) {
    rc = hot_main(r, d.path);
    hot_free(r);
    bench_dir_close(&d, "bench hot");
  }
  free(r);
  return rc;
}

/* ---- dispatch ------------------------------------------------------------------ */

void bench_usage(FILE *f)
{
  share_cfg sc;
  hot_cfg hc;
  cli_opt so[SHARE_N_OPTS], ho[HOT_N_OPTS];
  share_opts(&sc, so);
  hot_opts(&hc, ho);
  fprintf(f, "usage: kvtier bench share [options]\n       kvtier bench hot [options]\n"
             "       kvtier bench codec [options]\n       kvtier bench cold [options]\n"
             "       kvtier bench refmodel --model M [options]\n\n"
             "All use the Llama-3-8B KV shape: %u layers, %u KV heads, head_dim %u, f16,\n"
             "%u tokens per block.\n\n"
             "share, hot, refmodel and policy take --remote URL: their engines then have\n"
             "the remote tier (blocks written through to the cluster), and the remote\n"
             "counters are printed with the figures (docs/remote.md); bench cold and bench\n"
             "codec refuse it (they measure the local cold tier and the codecs).\n\n"
             "bench share: N agents with the same context. Reports what the engine holds\n"
             "(its own byte accounting, kvt_stats total_bytes), what N private copies would\n"
             "take, and reduction = 1 - held / private (at most 1 - 1/N). With --codec every\n"
             "block is kept warm (hot limit 0), and the limit is 1 - (encoded / f16) / N.\n",
          B_LAYERS, B_HEADS, B_HEAD_DIM, B_BLOCK_TOKENS);
  cli_print_opts(f, so, SHARE_N_OPTS);
  fprintf(f, "\nbench hot: put and gather throughput on a working set several times the L3\n"
             "cache (so memory is measured, not the cache) against memcpy of the same bytes, rounds interleaved, medians; and p50/p99\n"
             "of a prefix lookup of a %u-token context, every block stored.\n",
          LOOKUP_TOKENS);
  cli_print_opts(f, ho, HOT_N_OPTS);
  bench_codec_usage(f);
  bench_cold_usage(f);
  bench_refmodel_usage(f);
  bench_policy_usage(f);
  fprintf(f, "\nbench remote --url URL [--blocks N] [--json]: token blocks of 128 KiB and\n"
             "2 MiB through the remote tier (a Redis Cluster) against redis-benchmark\n"
             "(docs/remote.md).\n");
}

int cmd_bench(int argc, char **argv)
{
  if (argc < 2) {
    fprintf(stderr, "kvtier bench: which benchmark? 'share', 'hot', 'codec', 'cold', 'refmodel' or 'policy' (kvtier "
            "help bench)\n");
    return CLI_USAGE;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    bench_usage(stdout);
    return CLI_OK;
  }
  if (strcmp(argv[1], "share") == 0) return bench_share(argc - 2, argv + 2);
  if (strcmp(argv[1], "hot") == 0) return bench_hot(argc - 2, argv + 2);
  if (strcmp(argv[1], "codec") == 0) return bench_codec(argc - 2, argv + 2);
  if (strcmp(argv[1], "cold") == 0) return bench_cold(argc - 2, argv + 2);
  if (strcmp(argv[1], "refmodel") == 0) return bench_refmodel(argc - 2, argv + 2);
  if (strcmp(argv[1], "policy") == 0) return bench_policy(argc - 2, argv + 2);
  if (strcmp(argv[1], "remote") == 0) return bench_remote(argc - 2, argv + 2);
  fprintf(stderr, "kvtier bench: unknown benchmark '%s'; there are 'share', 'hot', 'codec', "
          "'cold', 'refmodel' and 'policy'\n", argv[1]);
  return CLI_USAGE;
}
