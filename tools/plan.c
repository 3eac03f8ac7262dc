/* plan.c - `kvtier plan`: capacity planning. Bytes per token per tier for a
 * model (analytic), then a workload replayed through metadata-only
 * engines (kvt_engine_open with KVT_OPEN_METADATA_ONLY): the engine's own
 * index, admission and eviction code, the cold tier an in-memory index
 * under its limit, no payloads, no syncs. Every request is looked up
 * (its leading run of stored blocks is its hit), then appended, and the
 * blocks nobody had are put (computed). Two engines see every request in
 * the same order: one evicting in the chosen order (KVT_EVICT_LEARNED by
 * default) and one in plain LRU, so the gain is measured, not claimed;
 * beside them Belady's MIN (plan_belady.c) replays the same block accesses
 * knowing the future: the ceiling for the capacity.
 *
 * Layers are folded: each replay namespace has one layer holding every
 * layer's KV heads (same bytes per token block). A replay appends, puts
 * and looks up all layers of a block together, so per-layer bookkeeping
 * would only repeat itself n_layers times. Time comes from the trace's
 * timestamps (a simulated clock), never from the machine's. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cmds.h"
#include "plan.h"
#include "plan_belady.h"
#include "util.h"

#define CAP_INF UINT64_MAX /* unbounded capacity */
#define MAX_CAPS 32
#define OUTPUT_UNSET UINT64_MAX /* --output not given (0 is a valid value) */

typedef struct plan_cfg {
  const char *model, *config, *trace, *train, *policy, *codec, *svg, *caps;
  const char *hot_gib, *warm_gib, *cold_tokens, *nvme_read, *nvme_write, *prefill, *tflops;
  const char *shared, *rate;
  uint64_t agents, context, requests, output, min_seen, seed;
  int sweep, json;
  int output_set;              /* --output was given (c->output may be 0) */
} plan_cfg;

/* Everything derived from the options, in units the replay uses. */
typedef struct plan_setup {
  plan_model m;
  plan_trace t;
  plan_trace train;            /* --train: what the order learns from first (n 0: none) */
  int policy;                  /* KVT_EVICT_* of the engine under test */
  uint32_t min_seen;           /* kvt_options.cold_admit_min_seen */
  int k_codec, v_codec;        /* warm codecs */
  uint64_t hot_bytes, warm_bytes;
  uint64_t caps[MAX_CAPS];     /* cold capacities in tokens (CAP_INF: unbounded) */
  size_t n_caps;
  double read_gbps, write_gbps, prefill_tps, latency_us;
  kvt_shape shape;             /* the folded shape the replays register */
  uint64_t block_bytes;        /* K + V of one token block, every layer */
  uint64_t rec_true;           /* its cold record, real shape */
  uint64_t rec_folded;         /* its cold record, folded shape (what limits count) */
  double duration_s;
  const char *source;          /* trace path or "synthetic" */
  const char *train_source;    /* --train's path */
  plan_future *future;         /* the trace's next uses, for the offline optimum */
} plan_setup;

/* One engine replaying the workload, and what it saw. */
typedef struct sim {
  kvt_engine *e;
  kvt_ns_id ns;
  int policy;
  uint64_t hit_tokens, tier_tokens[KVT_N_TIERS], tier_blocks[KVT_N_TIERS];
  uint64_t put_refused;
  uint64_t cold_read_bytes, window_bytes, peak_window_bytes;
  int64_t window;              /* the simulated second window_bytes counts */
  uint64_t cold_fast_tokens;   /* cold-hit tokens loaded before recompute would finish */
  kvt_stats st;                /* at the end (counters: since --train's replay) */
  kvt_stats base;              /* counters after --train's replay (zero without) */
} sim;

/* ---- options -------------------------------------------------------------- */

#define PLAN_N_OPTS 25

static void plan_opts(plan_cfg *c, cli_opt o[PLAN_N_OPTS])
{
  const cli_opt t[PLAN_N_OPTS] = {
      {"--model", "NAME", CLI_STR, &c->model, 0, 0, "a built-in model (see below)"},
      {"--config", "FILE", CLI_STR, &c->config, 0, 0, "or a Hugging Face config.json"},
      {"--trace", "FILE", CLI_STR, &c->trace, 0, 0, "Mooncake JSONL trace (else a synthetic workload)"},
      {"--agents", "N", CLI_U64, &c->agents, 1, 1u << 20, "synthetic: agents (default 32)"},
      {"--context", "T", CLI_U64, &c->context, 1, 1u << 24, "synthetic: tokens per request (default 16384)"},
      {"--shared", "F", CLI_STR, &c->shared, 0, 0, "synthetic: shared prefix fraction, 0..1 (default 0.25)"},
      {"--rate", "R", CLI_STR, &c->rate, 0, 0, "synthetic: requests per second (default 2)"},
      {"--requests", "N", CLI_U64, &c->requests, 1, 1u << 22, "synthetic: requests (default 4096)"},
      {"--output", "T", CLI_U64, &c->output, 0, 1u << 24, "synthetic: output tokens per request (default 256)"},
      {"--seed", "N", CLI_U64, &c->seed, 1, UINT32_MAX, "synthetic: agents in a random order from seed N (default: in turn)"},
      {"--hot", "GIB", CLI_STR, &c->hot_gib, 0, 0, "hot tier RAM, GiB (default 0)"},
      {"--warm", "GIB", CLI_STR, &c->warm_gib, 0, 0, "warm tier RAM, GiB (default 0)"},
      {"--codec", "KV", CLI_STR, &c->codec, 0, 0, "warm codecs (default k8v3)"},
      {"--cold-tokens", "N", CLI_STR, &c->cold_tokens, 0, 0, "cold capacity in tokens, e.g. 10M (default inf)"},
      {"--nvme-read", "GBPS", CLI_STR, &c->nvme_read, 0, 0, "device read bandwidth, GB/s (default 1.5)"},
      {"--nvme-write", "GBPS", CLI_STR, &c->nvme_write, 0, 0, "device write bandwidth, GB/s (default 0.6)"},
      {"--prefill", "TOK/S", CLI_STR, &c->prefill, 0, 0, "GPU prefill speed (default: from the weights)"},
      {"--gpu-tflops", "T", CLI_STR, &c->tflops, 0, 0, "effective GPU TFLOP/s for that default (400)"},
      {"--admit-min-seen", "N", CLI_U64, &c->min_seen, 1, 1u << 20,
       "cold admission: write a block once seen N times (default 1)"},
      {"--policy", "P", CLI_STR, &c->policy, 0, 0, "cold eviction: learned (default), chain, chain-leaf, lru"},
      {"--train", "FILE", CLI_STR, &c->train, 0, 0,
       "a Mooncake trace the order learns from first (e.g. an earlier day's): see below"},
      {"--sweep", NULL, CLI_FLAG, &c->sweep, 0, 0, "replay at several cold capacities, hot and warm at 0"},
      {"--capacities", "LIST", CLI_STR, &c->caps, 0, 0, "sweep capacities (default 1M,2M,3M,5M,10M,20M,50M,inf)"},
      {"--svg", "FILE", CLI_STR, &c->svg, 0, 0, "sweep chart (default kvtier-plan.svg, none with --json)"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the figures as JSON"},
  };
  memcpy(o, t, sizeof t);
}

void plan_usage(FILE *f)
{
  plan_cfg d;
  cli_opt o[PLAN_N_OPTS];
  plan_opts(&d, o);
  fprintf(f, "usage: kvtier plan (--model NAME | --config FILE) [--trace FILE | synthetic options]\n"
             "                   [tiers] [--sweep] [--json]\n\n"
             "How much KV fits in each tier, and what prefix-hit rate a workload gets. The\n"
             "workload is replayed through metadata-only engines - kvtier's own index,\n"
             "admission and eviction code, with sizes and no payloads - at 512-token block\n"
             "granularity on the trace's clock. A request's hit is its leading run of stored\n"
             "blocks, capped at its input length; rates are token-weighted. Plain LRU runs\n"
             "alongside in the same replay, and Belady's MIN (the offline optimum at the same\n"
             "capacity, from the trace's future) beside both: gap_closed is the share of the\n"
             "LRU-to-optimum gap the policy closes. Guide: docs/capacity-planning.md.\n\n");
  cli_print_opts(f, o, PLAN_N_OPTS);
  fprintf(f, "\n--train: the engine under test first replays FILE in a namespace of its own,\n"
             "which is then dropped: its tiers start the measured replay empty, as LRU's and\n"
             "MIN's do, and only what its order learned (the learned order's model) carries\n"
             "over - what a server restarted with the model its cold index kept gets. With\n"
             "the measured trace itself as FILE, the model knows the trace's statistics in\n"
             "advance: a ceiling, not a forecast.\n");
  plan_fleet_usage(f);
  fprintf(f, "\nbuilt-in models:\n");
  plan_model_list(f);
}

static int bad(const char *opt, const char *val, const char *want)
{
  fprintf(stderr, "kvtier plan: %s must be %s, not '%s'\nrun 'kvtier help plan' for its options\n",
          opt, want, val);
  return CLI_USAGE;
}

/* A finite number in [lo, hi] (default def when s is NULL). */
static int parse_num(const char *opt, const char *s, double def, double lo, double hi, double *out)
{
  if (!s) {
    *out = def;
    return CLI_OK;
  }
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
    char want[96];
    snprintf(want, sizeof want, "a number from %g to %g", lo, hi);
    return bad(opt, s, want);
  }
  *out = v;
  return CLI_OK;
}

/* "inf", or a token count with an optional K, M or G (decimal) suffix. */
int parse_tokens(const char *s, uint64_t *out)
{
  if (strcasecmp(s, "inf") == 0 || strcasecmp(s, "infinity") == 0) {
    *out = CAP_INF;
    return 0;
  }
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || !isfinite(v) || v <= 0) return -1;
  double mul = 1;
  if (*end == 'k' || *end == 'K') mul = 1e3, end++;
  else if (*end == 'm' || *end == 'M') mul = 1e6, end++;
  else if (*end == 'g' || *end == 'G') mul = 1e9, end++;
  if (*end || v * mul < PLAN_BLOCK_TOKENS || v * mul > 1e15) return -1;
  *out = (uint64_t)(v * mul);
  return 0;
}

static int cmp_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int parse_caps(const char *list, plan_setup *p)
{
  char buf[512];
  if (snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf) return bad("--capacities", list, "shorter");
  p->n_caps = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (p->n_caps == MAX_CAPS) return bad("--capacities", list, "at most 32 capacities");
    if (parse_tokens(tok, &p->caps[p->n_caps++]))
      return bad("--capacities", tok, "token counts of at least 512 (e.g. 3M) or inf");
  }
  if (p->n_caps == 0) return bad("--capacities", list, "a comma-separated list");
  /* Ascending, each once: the table and the chart's x axis go left to right. */
  qsort(p->caps, p->n_caps, sizeof *p->caps, cmp_u64);
  size_t n = 1;
  for (size_t i = 1; i < p->n_caps; i++)
    if (p->caps[i] != p->caps[n - 1]) p->caps[n++] = p->caps[i];
  p->n_caps = n;
  return CLI_OK;
}

static int parse_policy(const char *s, int *out)
{
  if (!s || strcmp(s, "learned") == 0) *out = KVT_EVICT_LEARNED;
  else if (strcmp(s, "chain") == 0) *out = KVT_EVICT_CHAIN;
  else if (strcmp(s, "lru") == 0) *out = KVT_EVICT_LRU;
  else if (strcmp(s, "chain-leaf") == 0) *out = KVT_EVICT_CHAIN_LEAF;
  else return bad("--policy", s, "learned, chain, chain-leaf or lru");
  return CLI_OK;
}

static const char *policy_name(int p)
{
  return p == KVT_EVICT_LRU          ? "lru"
         : p == KVT_EVICT_CHAIN_LEAF ? "chain-leaf"
         : p == KVT_EVICT_LEARNED    ? "learned"
                                     : "chain";
}

/* Fold the layers into as few as the limits allow (one, for every model in
 * the table): a largest divisor g of n_layers with n_kv_heads * g heads. */
int fold_shape(const plan_model *m, kvt_shape *s)
{
  for (uint32_t g = m->n_layers; g >= 1; g--) {
    if (m->n_layers % g) continue;
    *s = (kvt_shape){m->n_layers / g, m->n_kv_heads * g, m->head_dim, m->dtype, PLAN_BLOCK_TOKENS};
    if (s->n_kv_heads <= KVT_MAX_HEADS && 2 * (uint64_t)kvt_shape_block_bytes(s) <= KVT_MAX_BLOCK_BYTES)
      return 0;
  }
  return -1;
}

static int setup_model(const plan_cfg *c, plan_setup *p)
{
  if (!c->model == !c->config) {
    fprintf(stderr, "kvtier plan: give one of --model NAME or --config FILE\n"
                    "run 'kvtier help plan' for its options and the built-in models\n");
    return CLI_USAGE;
  }
  if (c->model ? plan_model_builtin(c->model, &p->m) : plan_model_config(c->config, &p->m))
    return c->model ? CLI_USAGE : CLI_FAIL;
  if (fold_shape(&p->m, &p->shape)) {
    fprintf(stderr, "kvtier plan: %s: a 512-token block is too large for kvtier\n", p->m.name);
    return CLI_FAIL;
  }
  kvt_shape real = {p->m.n_layers, p->m.n_kv_heads, p->m.head_dim, p->m.dtype, PLAN_BLOCK_TOKENS};
  p->block_bytes = 2 * (uint64_t)kvt_shape_block_bytes(&real) * real.n_layers;
  p->rec_true = kvt_cold_record_bytes(&real);
  p->rec_folded = kvt_cold_record_bytes(&p->shape);
  return CLI_OK;
}

static int setup_workload(const plan_cfg *c, plan_setup *p)
{
  if (c->trace) {
    if (c->agents || c->context || c->shared || c->rate || c->requests || c->output_set || c->seed) {
      fprintf(stderr, "kvtier plan: --trace and the synthetic options exclude each other\n");
      return CLI_USAGE;
    }
    p->source = c->trace;
    if (plan_trace_load(c->trace, &p->t)) return CLI_FAIL;
  } else {
    double shared, rate;
    int rc = parse_num("--shared", c->shared, 0.25, 0, 1, &shared);
    if (!rc) rc = parse_num("--rate", c->rate, 2, 1e-6, 1e6, &rate);
    if (rc) return rc;
    p->source = "synthetic";
    if (plan_trace_synth(&p->t, c->seed, c->agents ? (uint32_t)c->agents : 32,
                         c->context ? (uint32_t)c->context : 16384, shared, rate,
                         c->requests ? (uint32_t)c->requests : 4096,
                         c->output_set ? (uint32_t)c->output : 256)) {
      fprintf(stderr, "kvtier plan: out of memory\n");
      return CLI_FAIL;
    }
  }
  p->train_source = c->train;
  if (c->train && plan_trace_load(c->train, &p->train)) return CLI_FAIL;
  const plan_trace *t = &p->t;
  p->duration_s = (t->reqs[t->n - 1].t_ms - t->reqs[0].t_ms) / 1e3;
  if (p->duration_s < 1) p->duration_s = 1;
  return CLI_OK;
}

static int setup(const plan_cfg *c, plan_setup *p)
{
  memset(p, 0, sizeof *p);
  double hot, warm, tflops;
  int rc = setup_model(c, p);
  if (!rc) rc = parse_policy(c->policy, &p->policy);
  p->min_seen = c->min_seen ? (uint32_t)c->min_seen : 1;
  if (!rc) rc = parse_num("--hot", c->hot_gib, 0, 0, 1 << 24, &hot);
  if (!rc) rc = parse_num("--warm", c->warm_gib, 0, 0, 1 << 24, &warm);
  if (!rc) rc = parse_num("--nvme-read", c->nvme_read, 1.5, 1e-3, 1e4, &p->read_gbps);
  if (!rc) rc = parse_num("--nvme-write", c->nvme_write, 0.6, 1e-3, 1e4, &p->write_gbps);
  if (!rc) rc = parse_num("--gpu-tflops", c->tflops, 400, 1e-3, 1e6, &tflops);
  /* Prefill costs about 2 FLOPs per weight per token (attention aside). */
  double def_tps = tflops * 1e12 / (2 * p->m.params);
  if (!rc) rc = parse_num("--prefill", c->prefill, def_tps, 1, 1e9, &p->prefill_tps);
  if (rc) return rc;
  if (!c->prefill && !(p->m.params > 0 && isfinite(def_tps) && def_tps >= 1 && def_tps <= 1e9)) {
    fprintf(stderr, "kvtier plan: %s: cannot estimate the prefill speed from the weights "
                    "(%.3g estimated; config.json needs hidden_size or num_attention_heads, "
                    "intermediate_size and vocab_size); give --prefill TOK/S\n",
            p->m.name, p->m.params);
    return CLI_USAGE;
  }
  if (kvt_codec_parse(c->codec ? c->codec : "k8v3", &p->k_codec, &p->v_codec))
    return bad("--codec", c->codec, "a codec pair such as k8v3, k8cv3, k4v2");
  p->hot_bytes = (uint64_t)(hot * (1ull << 30));
  p->warm_bytes = (uint64_t)(warm * (1ull << 30));
  if (p->min_seen > 1 && p->hot_bytes == 0) {
    fprintf(stderr, "kvtier plan: --admit-min-seen above 1 needs --hot: a block waits in the hot "
                    "tier until it is seen that often (with no hot tier nothing is admitted)\n");
    return CLI_USAGE;
  }
  p->latency_us = 80; /* a read's latency, MEASURED.md: ~80 us at depth 1 */
  if (c->sweep) {
    if (c->cold_tokens) {
      fprintf(stderr, "kvtier plan: --sweep takes --capacities, not --cold-tokens\n");
      return CLI_USAGE;
    }
    if (c->hot_gib || c->warm_gib) {
      fprintf(stderr, "kvtier plan: --sweep runs with hot and warm at 0 (comparable to other caches)\n");
      return CLI_USAGE;
    }
    rc = parse_caps(c->caps ? c->caps : "1M,2M,3M,5M,10M,20M,50M,inf", p);
  } else {
    if (c->caps || c->svg) {
      fprintf(stderr, "kvtier plan: %s needs --sweep\n", c->caps ? "--capacities" : "--svg");
      return CLI_USAGE;
    }
    p->n_caps = 1;
    p->caps[0] = CAP_INF;
    if (c->cold_tokens && parse_tokens(c->cold_tokens, &p->caps[0]))
      return bad("--cold-tokens", c->cold_tokens, "a token count of at least 512 (e.g. 10M) or inf");
  }
  return rc ? rc : setup_workload(c, p);
}

/* ---- the replay ----------------------------------------------------------- */

static uint64_t cold_limit(const plan_setup *p, uint64_t cap_tokens)
{
  const uint64_t unbounded = 1ull << 62; /* beyond any trace */
  uint64_t blocks = cap_tokens / PLAN_BLOCK_TOKENS;
  /* A capacity whose bytes pass the unbounded limit (or 2^64) is unbounded. */
  if (cap_tokens == CAP_INF || blocks > unbounded / p->rec_folded) return unbounded;
  return blocks * p->rec_folded;
}

static int sim_open(const plan_setup *p, uint64_t cap_tokens, int policy, sim *s)
{
  memset(s, 0, sizeof *s);
  s->policy = policy;
  s->window = -1;
  kvt_options o;
  kvt_options_init(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  o.tier_bytes_limit[KVT_TIER_HOT] = p->hot_bytes;
  o.tier_bytes_limit[KVT_TIER_WARM] = p->warm_bytes;
  o.tier_bytes_limit[KVT_TIER_COLD] = cold_limit(p, cap_tokens);
  o.cold_evict = (uint32_t)policy;
  o.hot_evict = (uint32_t)policy; /* both tiers in the order under test (LRU: the LRU row) */
  o.cold_admit_min_seen = p->min_seen;
  o.max_seq_blocks = PLAN_MAX_BLOCKS;
  int rc = kvt_engine_open(NULL, &o, &s->e);
  if (rc) return cli_lib_error("plan", "opening a metadata-only engine", rc);
  kvt_ns_desc d = {.model_id = p->m.name, .weights_fingerprint = "plan", .tp_size = 1,
                   .shape = p->shape};
  rc = kvt_ns_register(s->e, &d, &s->ns);
  if (!rc) rc = kvt_ns_set_codec(s->e, s->ns, KVT_ALL_LAYERS, p->k_codec, p->v_codec);
  if (rc) return cli_lib_error("plan", "registering the model", rc);
  return CLI_OK;
}

/* The tokens of a request: block i is (its hash id, 0, 0, ...), so equal
 * id chains give equal key chains, as equal prefixes would. */
void request_tokens(const plan_trace *t, const plan_req *r, uint32_t *tokens)
{
  for (uint32_t i = 0; i < r->n_blocks; i++) {
    uint64_t id = t->ids[r->first + i];
    uint32_t *b = tokens + (size_t)i * PLAN_BLOCK_TOKENS;
    memset(b, 0, PLAN_BLOCK_TOKENS * sizeof *b);
    b[0] = (uint32_t)id;
    b[1] = (uint32_t)(id >> 32);
  }
}

/* Input tokens of block i of a request of len tokens. */
uint64_t block_input(uint32_t i, uint32_t len)
{
  uint64_t start = (uint64_t)i * PLAN_BLOCK_TOKENS;
  if (start >= len) return 0;
  return len - start < PLAN_BLOCK_TOKENS ? len - start : PLAN_BLOCK_TOKENS;
}

/* Cold-tier figures of one request's hits, on the simulated clock. */
static void count_cold(const plan_setup *p, sim *s, const plan_req *r, uint64_t blocks,
                       uint64_t tokens)
{
  if (!blocks) return;
  uint64_t bytes = blocks * p->block_bytes;
  s->cold_read_bytes += bytes;
  int64_t w = (int64_t)(r->t_ms / 1000);
  if (w != s->window) {
    s->window = w;
    s->window_bytes = 0;
  }
  s->window_bytes += bytes;
  if (s->window_bytes > s->peak_window_bytes) s->peak_window_bytes = s->window_bytes;
  /* A block's layer slices are read together (in flight at once): one
   * latency a block, then the bytes at the device's bandwidth. */
  double load_us = (double)blocks * p->latency_us + (double)bytes / (p->read_gbps * 1e3);
  double recompute_us = (double)tokens / p->prefill_tps * 1e6;
  if (load_us <= recompute_us) s->cold_fast_tokens += tokens;
}

/* One request through one engine: lookup (the hit), then append every
 * block and put those that no tier had (the serving engine computed them). */
static int sim_request(const plan_setup *p, sim *s, const plan_req *r, const uint32_t *tokens,
                       kvt_lookup_entry *ent)
{
  size_t found = 0, n_tok = (size_t)r->n_blocks * PLAN_BLOCK_TOKENS;
  int rc = kvt_lookup(s->e, s->ns, tokens, n_tok, ent, r->n_blocks, &found);
  if (rc) return cli_lib_error("plan", "kvt_lookup", rc);
  uint64_t cold_blocks = 0, cold_tokens = 0;
  for (size_t i = 0; i < found; i++) {
    uint64_t in = block_input((uint32_t)i, r->input_len);
    uint32_t tier = ent[i].tier < KVT_N_TIERS ? ent[i].tier : KVT_TIER_COLD;
    s->hit_tokens += in;
    s->tier_tokens[tier] += in;
    s->tier_blocks[tier]++;
    if (tier == KVT_TIER_COLD) {
      cold_blocks++;
      cold_tokens += in;
    }
  }
  count_cold(p, s, r, cold_blocks, cold_tokens);
  kvt_seq *q;
  rc = kvt_seq_create(s->e, s->ns, &q);
  if (rc) return cli_lib_error("plan", "kvt_seq_create", rc);
  kvt_kv kv = {.dtype = p->shape.dtype, .n_tokens = PLAN_BLOCK_TOKENS,
               .n_heads = p->shape.n_kv_heads, .head_dim = p->shape.head_dim};
  for (uint32_t i = 0; !rc && i < r->n_blocks; i++) {
    kvt_append_info info;
    rc = kvt_seq_append(q, tokens + (size_t)i * PLAN_BLOCK_TOKENS, PLAN_BLOCK_TOKENS, &info);
    if (rc || info.durable || info.layers_present == p->shape.n_layers) continue;
    for (uint32_t l = 0; !rc && l < p->shape.n_layers; l++) {
      rc = kvt_seq_put(q, i, l, &kv);
      if (rc == KVT_EFULL) { /* every tier full of referenced blocks: not stored */
        s->put_refused++;
        rc = 0;
      }
    }
  }
  kvt_seq_release(q);
  return rc ? cli_lib_error("plan", "replaying a request", rc) : CLI_OK;
}

/* Replay trace t through n engines, request by request. */
static int replay_trace(const plan_setup *p, const plan_trace *t, sim *sims, size_t n,
                        const char *label)
{
  uint32_t *tokens = malloc((size_t)t->max_blocks * PLAN_BLOCK_TOKENS * sizeof *tokens);
  kvt_lookup_entry *ent = malloc(t->max_blocks * sizeof *ent);
  int rc = tokens && ent ? CLI_OK : CLI_FAIL;
  if (rc) fprintf(stderr, "kvtier plan: out of memory\n");
  for (size_t i = 0; !rc && i < t->n; i++) {
    const plan_req *r = &t->reqs[i];
    request_tokens(t, r, tokens);
    for (size_t k = 0; !rc && k < n; k++) rc = sim_request(p, &sims[k], r, tokens, ent);
    if ((i & 1023) == 0) progress("plan: %s: request %zu of %zu", label, i, t->n);
  }
  for (size_t k = 0; !rc && k < n; k++) {
    int r = kvt_stats_get(sims[k].e, &sims[k].st);
    if (r) rc = cli_lib_error("plan", "kvt_stats_get", r);
  }
  free(tokens);
  free(ent);
  return rc;
}

/* The counters of st since base. */
static void stats_since(kvt_stats *st, const kvt_stats *base)
{
  st->puts -= base->puts;
  st->demotions -= base->demotions;
  st->cold_written -= base->cold_written;
  for (int t = 0; t < KVT_N_TIERS; t++) st->evictions[t] -= base->evictions[t];
}

/* Replay the workload through n engines; the figures are its own. */
static int replay(const plan_setup *p, sim *sims, size_t n, const char *label)
{
  int rc = replay_trace(p, &p->t, sims, n, label);
  for (size_t k = 0; !rc && k < n; k++) stats_since(&sims[k].st, &sims[k].base);
  return rc;
}

/* --train: s replays the training trace in a namespace of its own, then
 * drops it (every tier lets its blocks go, the metadata cold tier too),
 * so s starts the measured replay as empty as an untrained engine; what
 * carries over is its orders' state (the learned order's model, its
 * clock and horizon, its check against LRU). The figures restart. */
static int sim_train(const plan_setup *p, sim *s)
{
  if (!p->train.n) return CLI_OK;
  kvt_ns_desc d = {.model_id = p->m.name, .weights_fingerprint = "plan --train", .tp_size = 1,
                   .shape = p->shape};
  kvt_ns_id measured = s->ns;
  int rc = kvt_ns_register(s->e, &d, &s->ns);
  if (!rc) rc = kvt_ns_set_codec(s->e, s->ns, KVT_ALL_LAYERS, p->k_codec, p->v_codec);
  if (rc) return cli_lib_error("plan", "registering the training namespace", rc);
  rc = replay_trace(p, &p->train, s, 1, "training");
  if (rc) return rc;
  rc = kvt_ns_drop(s->e, s->ns);
  if (!rc) rc = kvt_stats_get(s->e, &s->base);
  if (rc) return cli_lib_error("plan", "dropping the training namespace", rc);
  if (s->base.tier_blocks[KVT_TIER_COLD] || s->base.tier_bytes[KVT_TIER_HOT] ||
      s->base.tier_bytes[KVT_TIER_WARM]) {
    fprintf(stderr, "kvtier plan: the training namespace left blocks behind after its drop\n");
    return CLI_FAIL;
  }
  *s = (sim){.e = s->e, .ns = measured, .policy = s->policy, .window = -1, .base = s->base};
  return CLI_OK;
}

static void sim_close(sim *s)
{
  kvt_engine_close(s->e);
  s->e = NULL;
}

static double hit_rate(const plan_setup *p, const sim *s)
{
  return p->t.input_tokens ? (double)s->hit_tokens / (double)p->t.input_tokens : 0;
}

/* ---- reports ---------------------------------------------------------------- */

static const char *dtype_name(uint32_t dt)
{
  return dt == KVT_F32 ? "f32" : dt == KVT_F16 ? "f16" : "bf16";
}

static void fmt_tokens(char *buf, size_t len, uint64_t cap)
{
  if (cap == CAP_INF) snprintf(buf, len, "inf");
  else if (cap >= 1000000 && cap % 1000000 == 0) snprintf(buf, len, "%" PRIu64 "M", cap / 1000000);
  else if (cap >= 1000000) snprintf(buf, len, "%.1fM", cap / 1e6);
  else if (cap >= 1000) snprintf(buf, len, "%.0fK", cap / 1e3);
  else snprintf(buf, len, "%" PRIu64, cap);
}

/* Bytes per token in each tier's form. */
typedef struct per_token {
  double hot, warm, cold;
} per_token;

static per_token bytes_per_token(const plan_setup *p)
{
  kvt_codec_shape cs = {PLAN_BLOCK_TOKENS, p->m.n_kv_heads, p->m.head_dim, 0, 0};
  double warm_block = (double)(kvt_codec_size(p->k_codec, &cs) + kvt_codec_size(p->v_codec, &cs));
  return (per_token){.hot = (double)p->block_bytes / PLAN_BLOCK_TOKENS,
                     .warm = warm_block * p->m.n_layers / PLAN_BLOCK_TOKENS,
                     .cold = (double)p->rec_true / PLAN_BLOCK_TOKENS};
}

static double mean_context(const plan_setup *p)
{
  return (double)(p->t.input_tokens + p->t.output_tokens) / (double)p->t.n;
}

static void print_header(const plan_setup *p)
{
  char b1[32], b2[32], b3[32], b4[32];
  per_token bt = bytes_per_token(p);
  printf("model     %s: %u layers, %u KV heads x %u, %s; prefill %.0f tokens/s\n", p->m.name,
         p->m.n_layers, p->m.n_kv_heads, p->m.head_dim, dtype_name(p->m.dtype), p->prefill_tps);
  printf("per token hot %s, warm %s (%s%s), cold %s (a 512-token block: %s on disk)\n",
         fmt_bytes(b1, sizeof b1, (uint64_t)bt.hot), fmt_bytes(b2, sizeof b2, (uint64_t)bt.warm),
         kvt_codec_name(p->k_codec), kvt_codec_name(p->v_codec),
         fmt_bytes(b3, sizeof b3, (uint64_t)bt.cold), fmt_bytes(b4, sizeof b4, p->rec_true));
  printf("workload  %s: %zu requests over %.0f s, %.1fM input tokens (mean context %.0f)\n",
         p->source, p->t.n, p->duration_s, p->t.input_tokens / 1e6, mean_context(p));
  if (p->train.n)
    printf("trained   on %s first: %zu requests, in a namespace dropped before the replay\n",
           p->train_source, p->train.n);
}

static void json_header(const plan_setup *p)
{
  per_token bt = bytes_per_token(p);
  printf("{\"model\": ");
  json_string(stdout, p->m.name);
  printf(", \"n_layers\": %u, \"n_kv_heads\": %u, \"head_dim\": %u, \"dtype\": \"%s\",\n",
         p->m.n_layers, p->m.n_kv_heads, p->m.head_dim, dtype_name(p->m.dtype));
  printf(" \"prefill_tokens_per_s\": %.1f, \"block_tokens\": %u, \"block_bytes\": %" PRIu64
         ", \"cold_record_bytes\": %" PRIu64 ",\n",
         p->prefill_tps, PLAN_BLOCK_TOKENS, p->block_bytes, p->rec_true);
  printf(" \"bytes_per_token\": {\"hot\": %.1f, \"warm\": %.1f, \"cold\": %.1f},\n", bt.hot, bt.warm,
         bt.cold);
  printf(" \"workload\": {\"source\": ");
  json_string(stdout, p->source);
  printf(", \"requests\": %zu, \"duration_s\": %.3f, \"input_tokens\": %" PRIu64
         ", \"output_tokens\": %" PRIu64 "},\n",
         p->t.n, p->duration_s, p->t.input_tokens, p->t.output_tokens);
  printf(" \"policy\": \"%s\", \"admit_min_seen\": %u, \"train\": ", policy_name(p->policy),
         p->min_seen);
  if (p->train.n) json_string(stdout, p->train_source);
  else printf("null");
  printf(",\n");
}

/* ---- the offline optimum ------------------------------------------------------ */

/* The distinct blocks the store under test can hold at once: the cold
 * records its limit admits (cold_limit: an unbounded tier is beyond any
 * trace), plus the RAM tiers in whole blocks as the "fits" line counts
 * them. No policy of that store ever holds more blocks at once, so MIN at
 * this size bounds every policy from above. */
static uint64_t store_blocks(const plan_setup *p, uint64_t cap_tokens)
{
  per_token bt = bytes_per_token(p);
  uint64_t blocks = cold_limit(p, cap_tokens) / p->rec_folded;
  blocks += p->hot_bytes / p->block_bytes;
  if (bt.warm > 0) blocks += (uint64_t)((double)p->warm_bytes / (bt.warm * PLAN_BLOCK_TOKENS));
  return blocks;
}

static int belady_run(const plan_setup *p, uint64_t cap_tokens, plan_belady_stats *b)
{
  if (!plan_belady_replay(&p->t, p->future, store_blocks(p, cap_tokens), b)) return CLI_OK;
  fprintf(stderr, "kvtier plan: out of memory\n");
  return CLI_FAIL;
}

/* The share of the gap from LRU to the optimum that a policy closes:
 * (policy - LRU) / (Belady - LRU) on tokens saved. NAN (printed null)
 * when there is no gap: Belady no better than LRU (everything fits). */
static double gap_closed(uint64_t policy, uint64_t lru, uint64_t belady)
{
  if (belady <= lru) return NAN;
  return ((double)policy - (double)lru) / ((double)belady - (double)lru);
}

static void json_gap(double g)
{
  if (isnan(g)) printf("null");
  else printf("%.6f", g);
}

static const char *fmt_gap(char *buf, size_t len, double g)
{
  if (isnan(g)) snprintf(buf, len, "-");
  else snprintf(buf, len, "%.1f%%", 100 * g);
  return buf;
}

/* ---- one replay, full report ---------------------------------------------- */

static void tiers_json(const plan_setup *p, const sim *s)
{
  const char *names[KVT_N_TIERS] = {"none", "hot", "warm", "cold"};
  double in = (double)p->t.input_tokens;
  printf("\"hit_rate\": %.6f, \"hit_rate_by_tier\": {", hit_rate(p, s));
  for (int t = 1; t < KVT_N_TIERS; t++)
    printf("%s\"%s\": %.6f", t > 1 ? ", " : "", names[t], s->tier_tokens[t] / in);
  printf("}, \"prefill_tokens_saved\": %" PRIu64 ", \"tier_bytes\": {", s->hit_tokens);
  for (int t = 1; t < KVT_N_TIERS; t++) {
    uint64_t b = t == KVT_TIER_COLD ? s->st.tier_blocks[t] * p->rec_true : s->st.tier_bytes[t];
    printf("%s\"%s\": %" PRIu64, t > 1 ? ", " : "", names[t], b);
  }
  /* Bytes moved per tier: hits read in each tier's form; puts written hot
   * (every put is one token block, all layers), demotions written warm. */
  per_token bt = bytes_per_token(p);
  double warm_block = bt.warm * PLAN_BLOCK_TOKENS;
  printf("}, \"read_bytes\": {\"hot\": %" PRIu64 ", \"warm\": %.0f, \"cold\": %" PRIu64 "}",
         s->tier_blocks[KVT_TIER_HOT] * p->block_bytes, s->tier_blocks[KVT_TIER_WARM] * warm_block,
         s->cold_read_bytes);
  printf(", \"written_bytes\": {\"hot\": %" PRIu64 ", \"warm\": %.0f, \"cold\": %" PRIu64,
         s->st.puts / p->shape.n_layers * p->block_bytes,
         (double)(s->st.demotions / p->shape.n_layers) * warm_block, s->st.cold_written * p->rec_true);
  double cold_tok = (double)s->tier_tokens[KVT_TIER_COLD];
  printf("}, \"cold_blocks\": %" PRIu64 ", \"cold_evictions\": %" PRIu64
         ", \"cold_written_bytes\": %" PRIu64 ", \"cold_read_bytes\": %" PRIu64
         ", \"nvme_read_gbps_mean\": %.4f, \"nvme_read_gbps_peak_1s\": %.4f"
         ", \"nvme_write_gbps_mean\": %.4f, \"cold_hits_faster_than_recompute\": %.6f"
         ", \"puts_refused\": %" PRIu64,
         s->st.tier_blocks[KVT_TIER_COLD], s->st.evictions[KVT_TIER_COLD],
         s->st.cold_written * p->rec_true, s->cold_read_bytes,
         s->cold_read_bytes / p->duration_s / 1e9, s->peak_window_bytes / 1e9,
         s->st.cold_written * p->rec_true / p->duration_s / 1e9,
         cold_tok > 0 ? s->cold_fast_tokens / cold_tok : 0.0, s->put_refused);
}

static void bw_line(const char *what, double need, double have)
{
  printf("  %-26s %8.3f GB/s of %.3f (%s)\n", what, need, have,
         need <= have ? "enough" : "short");
}

static void report_text(const plan_setup *p, const sim *s, const plan_belady_stats *b)
{
  char b1[32], b2[32], b3[32], cap[32];
  per_token bt = bytes_per_token(p);
  double ctx = mean_context(p), in = (double)p->t.input_tokens;
  fmt_tokens(cap, sizeof cap, p->caps[0]);
  print_header(p);
  printf("\nfits      hot %s: %.0f tokens; warm %s: %.0f tokens; cold %s tokens\n",
         fmt_bytes(b1, sizeof b1, p->hot_bytes), p->hot_bytes / bt.hot,
         fmt_bytes(b2, sizeof b2, p->warm_bytes), p->warm_bytes / bt.warm, cap);
  printf("          %.1f concurrent sequences of the mean context in RAM (hot + warm)\n",
         (p->hot_bytes / bt.hot + p->warm_bytes / bt.warm) / ctx);
  printf("\nreplay (cold eviction: %s; plain LRU alongside)\n", policy_name(p->policy));
  printf("  %-26s %8.1f%%   (plain LRU %.1f%%)\n", "prefix-hit rate", 100 * hit_rate(p, s),
         100 * hit_rate(p, s + 1));
  printf("  %-26s %8.1f%%   (gap from LRU to it closed: %s)\n", "offline optimum (Belady)",
         100 * (double)b->hit_tokens / in,
         fmt_gap(b1, sizeof b1, gap_closed(s->hit_tokens, s[1].hit_tokens, b->hit_tokens)));
  printf("  %-26s hot %.1f%%, warm %.1f%%, cold %.1f%%\n", "hits by tier",
         100 * s->tier_tokens[1] / in, 100 * s->tier_tokens[2] / in, 100 * s->tier_tokens[3] / in);
  printf("  %-26s %.1fM of %.1fM input tokens\n", "prefill tokens saved", s->hit_tokens / 1e6,
         in / 1e6);
  printf("  %-26s hot %s, warm %s, cold %s (%" PRIu64 " blocks, %" PRIu64 " evicted)\n",
         "held at the end", fmt_bytes(b1, sizeof b1, s->st.tier_bytes[1]),
         fmt_bytes(b2, sizeof b2, s->st.tier_bytes[2]),
         fmt_bytes(b3, sizeof b3, s->st.tier_blocks[3] * p->rec_true), s->st.tier_blocks[3],
         s->st.evictions[3]);
  double warm_block = bt.warm * PLAN_BLOCK_TOKENS;
  printf("  %-26s hot %s, warm %s, cold %s\n", "read by hits",
         fmt_bytes(b1, sizeof b1, s->tier_blocks[1] * p->block_bytes),
         fmt_bytes(b2, sizeof b2, (uint64_t)((double)s->tier_blocks[2] * warm_block)),
         fmt_bytes(b3, sizeof b3, s->cold_read_bytes));
  printf("  %-26s hot %s, warm %s, cold %s\n", "written",
         fmt_bytes(b1, sizeof b1, s->st.puts / p->shape.n_layers * p->block_bytes),
         fmt_bytes(b2, sizeof b2, (uint64_t)((double)(s->st.demotions / p->shape.n_layers) * warm_block)),
         fmt_bytes(b3, sizeof b3, s->st.cold_written * p->rec_true));
  bw_line("NVMe read, mean", s->cold_read_bytes / p->duration_s / 1e9, p->read_gbps);
  bw_line("NVMe read, busiest second", s->peak_window_bytes / 1e9, p->read_gbps);
  bw_line("NVMe write, mean", s->st.cold_written * p->rec_true / p->duration_s / 1e9, p->write_gbps);
  double ct = (double)s->tier_tokens[KVT_TIER_COLD];
  printf("  %-26s %.1f%% of cold-hit tokens (reading at %.2f GB/s vs prefill at %.0f tokens/s)\n",
         "cold loads beat recompute", ct > 0 ? 100 * s->cold_fast_tokens / ct : 0.0, p->read_gbps,
         p->prefill_tps);
  if (s->put_refused)
    printf("  %" PRIu64 " puts refused: the tiers were full of referenced blocks\n", s->put_refused);
}

static void report_json(const plan_setup *p, const sim *s, const plan_belady_stats *b)
{
  per_token bt = bytes_per_token(p);
  json_header(p);
  printf(" \"hot_bytes\": %" PRIu64 ", \"warm_bytes\": %" PRIu64 ", \"cold_capacity_tokens\": ",
         p->hot_bytes, p->warm_bytes);
  if (p->caps[0] == CAP_INF) printf("null");
  else printf("%" PRIu64, p->caps[0]);
  printf(", \"tokens_fit\": {\"hot\": %.0f, \"warm\": %.0f},\n", p->hot_bytes / bt.hot,
         p->warm_bytes / bt.warm);
  printf(" \"concurrent_sequences_in_ram\": %.2f,\n",
         (p->hot_bytes / bt.hot + p->warm_bytes / bt.warm) / mean_context(p));
  printf(" \"nvme_read_gbps\": %.3f, \"nvme_write_gbps\": %.3f,\n \"replay\": {", p->read_gbps,
         p->write_gbps);
  tiers_json(p, s);
  printf("},\n \"lru\": {");
  tiers_json(p, s + 1);
  printf("},\n \"belady_hit_rate\": %.6f, \"belady_prefill_tokens_saved\": %" PRIu64
         ", \"gap_closed\": ", p->t.input_tokens ? (double)b->hit_tokens / (double)p->t.input_tokens : 0,
         b->hit_tokens);
  json_gap(gap_closed(s->hit_tokens, s[1].hit_tokens, b->hit_tokens));
  printf("}\n");
}

static int run_one(const plan_setup *p, int json)
{
  sim s[2] = {0}; /* closed whether opened or not */
  int rc = sim_open(p, p->caps[0], p->policy, &s[0]);
  if (!rc) rc = sim_train(p, &s[0]);
  if (!rc) rc = sim_open(p, p->caps[0], KVT_EVICT_LRU, &s[1]);
  if (!rc) rc = replay(p, s, 2, "replay");
  progress_end();
  plan_belady_stats b;
  if (!rc) rc = belady_run(p, p->caps[0], &b);
  if (!rc) {
    if (json) report_json(p, s, &b);
    else report_text(p, s, &b);
  }
  sim_close(&s[0]);
  sim_close(&s[1]);
  return rc;
}

/* ---- the sweep ---------------------------------------------------------------- */

typedef struct sweep_row {
  uint64_t cap;
  double hit, lru_hit, cold_fast, read_peak;
  uint64_t saved, lru_saved, evictions, lru_evictions;
  double belady_hit, gap;      /* the offline optimum; gap_closed (NAN: no gap) */
  uint64_t belady_saved;
} sweep_row;

static int sweep_one(const plan_setup *p, uint64_t cap, sweep_row *row)
{
  sim s[2] = {0}; /* closed whether opened or not */
  char label[64], c[32];
  fmt_tokens(c, sizeof c, cap);
  snprintf(label, sizeof label, "capacity %s", c);
  int rc = sim_open(p, cap, p->policy, &s[0]);
  if (!rc) rc = sim_train(p, &s[0]);
  if (!rc) rc = sim_open(p, cap, KVT_EVICT_LRU, &s[1]);
  if (!rc) rc = replay(p, s, 2, label);
  if (!rc) {
    double ct = (double)s[0].tier_tokens[KVT_TIER_COLD];
    *row = (sweep_row){.cap = cap, .hit = hit_rate(p, &s[0]), .lru_hit = hit_rate(p, &s[1]),
                       .cold_fast = ct > 0 ? s[0].cold_fast_tokens / ct : 0,
                       .read_peak = s[0].peak_window_bytes / 1e9, .saved = s[0].hit_tokens,
                       .lru_saved = s[1].hit_tokens, .evictions = s[0].st.evictions[KVT_TIER_COLD],
                       .lru_evictions = s[1].st.evictions[KVT_TIER_COLD]};
    plan_belady_stats b;
    rc = belady_run(p, cap, &b);
    row->belady_saved = b.hit_tokens;
    row->belady_hit = p->t.input_tokens ? (double)b.hit_tokens / (double)p->t.input_tokens : 0;
    row->gap = gap_closed(row->saved, row->lru_saved, b.hit_tokens);
  }
  sim_close(&s[0]);
  sim_close(&s[1]);
  return rc;
}

/* The cold bytes of a capacity (in double: huge capacities pass 2^64). */
static double cap_bytes(const plan_setup *p, uint64_t cap)
{
  return (double)(cap / PLAN_BLOCK_TOKENS) * (double)p->rec_true;
}

static void sweep_text(const plan_setup *p, const sweep_row *rows, size_t n)
{
  char b[32], c[32], g[32];
  print_header(p);
  printf("\ncold tier only (hot and warm 0); eviction %s against plain LRU in the same replay\n\n",
         policy_name(p->policy));
  printf("  %10s %12s %10s %10s %8s %10s %8s %12s %12s\n", "capacity", "cold bytes", "hit rate",
         "LRU", "gain", "Belady", "closed", "tokens saved", "read peak");
  for (size_t i = 0; i < n; i++) {
    const sweep_row *r = &rows[i];
    fmt_tokens(c, sizeof c, r->cap);
    double cb = cap_bytes(p, r->cap);
    if (r->cap == CAP_INF) snprintf(b, sizeof b, "-");
    else if (cb < 0x1p64) fmt_bytes(b, sizeof b, (uint64_t)cb);
    else snprintf(b, sizeof b, "%.0f TiB", cb / 0x1p40);
    printf("  %10s %12s %9.1f%% %9.1f%% %+7.1f%% %9.1f%% %8s %11.1fM %8.2f GB/s\n", c, b,
           100 * r->hit, 100 * r->lru_hit, 100 * (r->hit - r->lru_hit), 100 * r->belady_hit,
           fmt_gap(g, sizeof g, r->gap), r->saved / 1e6, r->read_peak);
  }
}

static void sweep_json(const plan_setup *p, const sweep_row *rows, size_t n)
{
  json_header(p);
  printf(" \"rows\": [\n");
  for (size_t i = 0; i < n; i++) {
    const sweep_row *r = &rows[i];
    printf("  {\"capacity_tokens\": ");
    if (r->cap == CAP_INF) printf("null, \"unbounded\": true");
    else printf("%" PRIu64 ", \"unbounded\": false", r->cap);
    printf(", \"cold_bytes\": ");
    if (r->cap == CAP_INF) printf("null");
    else printf("%.0f", cap_bytes(p, r->cap));
    printf(", \"hit_rate\": %.6f, \"lru_hit_rate\": %.6f, \"prefill_tokens_saved\": %" PRIu64
           ", \"lru_prefill_tokens_saved\": %" PRIu64 ", \"evictions\": %" PRIu64
           ", \"lru_evictions\": %" PRIu64 ", \"cold_hits_faster_than_recompute\": %.6f"
           ", \"nvme_read_gbps_peak_1s\": %.4f",
           r->hit, r->lru_hit, r->saved, r->lru_saved, r->evictions, r->lru_evictions, r->cold_fast,
           r->read_peak);
    printf(", \"belady_hit_rate\": %.6f, \"belady_prefill_tokens_saved\": %" PRIu64
           ", \"gap_closed\": ", r->belady_hit, r->belady_saved);
    json_gap(r->gap);
    printf("}%s\n", i + 1 < n ? "," : "");
  }
  printf(" ]}\n");
}

static int plan_svg(const char *path, const char *title, const sweep_row *rows, size_t n);

static int run_sweep(const plan_setup *p, const plan_cfg *c)
{
  sweep_row rows[MAX_CAPS];
  int rc = CLI_OK;
  for (size_t i = 0; !rc && i < p->n_caps; i++) rc = sweep_one(p, p->caps[i], &rows[i]);
  progress_end();
  if (rc) return rc;
  if (c->json) sweep_json(p, rows, p->n_caps);
  else sweep_text(p, rows, p->n_caps);
  const char *svg = c->svg ? c->svg : c->json ? NULL : "kvtier-plan.svg";
  if (svg) {
    char title[160];
    const char *base = strrchr(p->source, '/');
    snprintf(title, sizeof title, "%s, %s: prefix-hit rate against cold capacity", p->m.name,
             base ? base + 1 : p->source);
    if (plan_svg(svg, title, rows, p->n_caps)) {
      fprintf(stderr, "kvtier plan: writing %s: %s\n", svg, strerror(errno));
      return CLI_FAIL;
    }
    if (!c->json) printf("\nchart: %s\n", svg);
  }
  return CLI_OK;
}

/* ---- the chart ------------------------------------------------------------------ */

/* Hit rate (y) against capacity (x, log scale; "inf" at the right end). */
static int plan_svg(const char *path, const char *title, const sweep_row *rows, size_t n)
{
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  const double W = 720, H = 420, L = 70, R = 30, T = 50, B = 60;
  double lo = 1e300, hi = 0, ymax = 0;
  int has_inf = 0;
  for (size_t i = 0; i < n; i++) {
    if (rows[i].cap == CAP_INF) has_inf = 1;
    else {
      lo = fmin(lo, (double)rows[i].cap);
      hi = fmax(hi, (double)rows[i].cap);
    }
    ymax = fmax(ymax, fmax(rows[i].hit, fmax(rows[i].lru_hit, rows[i].belady_hit)));
  }
  if (hi <= 0) lo = hi = 1e6;
  double llo = log10(lo), lhi = log10(hi) + (has_inf ? 0.35 : 0);
  if (lhi - llo < 1e-9) lhi = llo + 1;
  ymax = ceil(ymax * 10 + 0.5) / 10;
  if (ymax > 1) ymax = 1;
  double pw = W - L - R, ph = H - T - B;
#define X(c) (L + ((c) == CAP_INF ? lhi - llo : log10((double)(c)) - llo) / (lhi - llo) * pw)
#define Y(v) (T + ph - (v) / ymax * ph)
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
             "font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
  fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  fprintf(f, "<text x=\"%.0f\" y=\"24\" font-size=\"14\">", L);
  for (const char *s = title; *s; s++) {
    if (*s == '<') fputs("&lt;", f);
    else if (*s == '&') fputs("&amp;", f);
    else fputc(*s, f);
  }
  fprintf(f, "</text>\n");
  for (int k = 0; k <= 5; k++) { /* y grid */
    double v = ymax * k / 5;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, Y(v),
            W - R, Y(v));
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.0f%%</text>\n", L - 6, Y(v) + 4,
            100 * v);
  }
  for (size_t i = 0; i < n; i++) { /* x ticks at the capacities */
    char c[32];
    fmt_tokens(c, sizeof c, rows[i].cap);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
            X(rows[i].cap), T, X(rows[i].cap), T + ph);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", X(rows[i].cap),
            T + ph + 18, c);
  }
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">cold capacity (tokens, log scale)</text>\n",
          L + pw / 2, H - 14);
  fprintf(f, "<text transform=\"translate(16,%.1f) rotate(-90)\" text-anchor=\"middle\">"
             "prefix-hit rate (token-weighted)</text>\n", T + ph / 2);
  /* Series: the policy, plain LRU (dashed), the offline optimum (dotted). */
  const char *color[3] = {"#1f77b4", "#d62728", "#2ca02c"},
             *name[3] = {"kvtier eviction", "plain LRU", "offline optimum (Belady)"},
             *dash[3] = {"", " stroke-dasharray=\"6 4\"", " stroke-dasharray=\"2 3\""};
#define V(s, r) ((s) == 0 ? (r).hit : (s) == 1 ? (r).lru_hit : (r).belady_hit)
  for (int s = 0; s < 3; s++) {
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", color[s],
            dash[s]);
    for (size_t i = 0; i < n; i++)
      fprintf(f, "%.1f,%.1f ", X(rows[i].cap), Y(V(s, rows[i])));
    fprintf(f, "\"/>\n");
    for (size_t i = 0; i < n; i++)
      fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", X(rows[i].cap),
              Y(V(s, rows[i])), color[s]);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
            L + 12, T + 14 + 18.0 * s, L + 40, T + 14 + 18.0 * s, color[s], dash[s]);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", L + 46, T + 18 + 18.0 * s, name[s]);
  }
#undef V
#undef X
#undef Y
  fprintf(f, "</svg>\n");
  return fclose(f) ? -1 : 0;
}

/* ---- the command ---------------------------------------------------------------- */

int cmd_plan(int argc, char **argv)
{
  plan_cfg c = {0};
  c.output = OUTPUT_UNSET; /* cli_parse writes it only when given */
  cli_opt o[PLAN_N_OPTS];
  plan_opts(&c, o);
  int help = 0;
  if (plan_fleet_wanted(argc, argv)) return cmd_plan_fleet(argc, argv); /* plan_fleet.c */
  int rc = cli_parse("plan", argc - 1, argv + 1, o, PLAN_N_OPTS, &help);
  if (rc != CLI_OK) return rc;
  c.output_set = c.output != OUTPUT_UNSET;
  if (help) {
    plan_usage(stdout);
    return CLI_OK;
  }
  plan_setup p;
  rc = setup(&c, &p);
  if (!rc && plan_future_build(&p.t, &p.future)) {
    fprintf(stderr, "kvtier plan: cannot index the workload's next uses for the offline optimum "
                    "(out of memory, or more than %u block accesses)\n", PLAN_BELADY_MAX_ACCESSES);
    rc = CLI_FAIL;
  }
  if (!rc) rc = c.sweep ? run_sweep(&p, &c) : run_one(&p, c.json);
  plan_future_free(p.future);
  plan_trace_free(&p.t);
  plan_trace_free(&p.train);
  return rc;
}
