/* demo.c - `kvtier demo`: agents that share a system prompt and each read
 * their own document send generated KV through the engine the way a serving
 * engine would (prefix lookup, append, put per layer, gather per layer), the
 * gathered bytes are checked, and a table shows what the store holds.
 * Everything is written through to a cold tier in --dir, so a second run
 * finds the prompt and the documents there by lookup and loads them instead
 * of computing them; kvt_sync() at the end makes the run durable. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "util.h"

/* A Llama-3-8B-like model scaled down to run in seconds. */
#define DEMO_LAYERS 16u
#define DEMO_HEADS 8u
#define DEMO_HEAD_DIM 64u
#define DEMO_BLOCK_TOKENS 16u
#define DEMO_PROMPT_TOKENS 1024u /* shared system prompt */
#define DEMO_DOC_TOKENS 1024u    /* each agent's own document */
#define DEMO_TOKENS (DEMO_PROMPT_TOKENS + DEMO_DOC_TOKENS)
#define DEMO_BLOCKS (DEMO_TOKENS / DEMO_BLOCK_TOKENS)
#define DEMO_PROMPT_BLOCKS (DEMO_PROMPT_TOKENS / DEMO_BLOCK_TOKENS)
#define DEMO_AGENTS_MAX 32u
#define DEMO_COLD_BYTES (4ull << 30)     /* cold tier limit */
#define DEMO_SEGMENT_BYTES (64ull << 20) /* one segment file */

_Static_assert(DEMO_PROMPT_TOKENS % DEMO_BLOCK_TOKENS == 0, "prompt is whole blocks");
_Static_assert(DEMO_DOC_TOKENS % DEMO_BLOCK_TOKENS == 0, "document is whole blocks");

typedef struct demo_cfg {
  const char *dir, *remote;
  uint64_t agents;
  uint64_t seed;
  int json;
} demo_cfg;

typedef struct demo_run {
  demo_cfg cfg;
  kvt_engine *e;
  kvt_ns_id ns;
  kvt_shape shape;
  kvgen gen;
  size_t block_bytes;              /* K (= V) of one layer block */
  size_t layer_bytes;              /* K (= V) of one layer of one agent */
  uint32_t tokens[DEMO_TOKENS];    /* the current agent's context */
  uint64_t pos_hash[DEMO_TOKENS];
  uint8_t *k, *v;                  /* generated: [layer][token][head][dim] */
  uint8_t *gk, *gv;                /* one layer gathered: [token][head][dim] */
  uint8_t *lk, *lv;                /* one token block loaded: [layer][token][head][dim] */
  kvt_load_req reqs[DEMO_LAYERS];
  kvt_lookup_entry found[DEMO_BLOCKS];
  kvt_gathered gathered[DEMO_BLOCKS];
  kvt_seq *seqs[DEMO_AGENTS_MAX];  /* kept open to the end, as live agents */
  uint64_t agents_hit;             /* agents whose lookup found blocks */
  uint64_t tblocks_adopted, tblocks_computed, layer_puts, gathers;
  uint64_t tblocks_loaded_cold;    /* durable, not in RAM: loaded, checked, put */
  uint64_t tblocks_load_missed;    /* durable, but the load failed its check: recomputed */
  uint64_t found_by_tier[KVT_N_TIERS]; /* token blocks lookups found, by tier */
  uint64_t blocks_at_open;         /* layer blocks in RAM tiers (0: a fresh process) */
  uint64_t tblocks_at_open;        /* token blocks in the cold tier */
  uint64_t durable_agents;         /* agents whose every block is durable after sync */
  int sync_rc;
  uint64_t started_ns, seconds_ns;
  kvt_stats st;
} demo_run;

static const char *const tier_names[KVT_N_TIERS] = {"none", "hot", "warm", "cold"};

#define DEMO_N_OPTS 5

static void demo_opts(demo_cfg *cfg, cli_opt opts[DEMO_N_OPTS])
{
  const cli_opt o[DEMO_N_OPTS] = {
      {"--dir", "D", CLI_STR, &cfg->dir, 0, 0, "store directory (default ./kvtier-demo)"},
      {"--agents", "N", CLI_U64, &cfg->agents, 1, DEMO_AGENTS_MAX, "agents, 1 to 32 (default 8)"},
      {"--seed", "S", CLI_U64, &cfg->seed, 0, UINT64_MAX, "seed of tokens and KV (default 1)"},
      {"--json", NULL, CLI_FLAG, &cfg->json, 0, 0, "print the figures as one JSON object"},
      CLI_OPT_REMOTE(&cfg->remote),
  };
  memcpy(opts, o, sizeof o);
}

void demo_usage(FILE *f)
{
  demo_cfg dummy;
  cli_opt opts[DEMO_N_OPTS];
  demo_opts(&dummy, opts);
  fprintf(f, "usage: kvtier demo [--dir D] [--agents N] [--seed S] [--remote URL] [--json]\n\n"
             "Agents that share a %u-token system prompt, each with its own %u-token\n"
             "document, send generated KV (a Llama-3-8B-like shape scaled down: %u layers,\n"
             "%u KV heads, head_dim %u, f16, %u tokens per block) through the engine as a\n"
             "serving engine would: prefix lookup, append, put per layer, gather per layer.\n"
             "Every gathered byte is checked against the generated KV. The table shows\n"
             "what each tier holds, what sharing saved and how often lookups hit.\n"
             "Every block is written through to a cold tier in the directory (4 GiB limit,\n"
             "64 MiB segments) and kvt_sync() makes it durable at the end, so running it\n"
             "again on the same directory continues from what is there: the agents find\n"
             "the prompt and their documents by lookup in the cold tier and load them\n"
             "instead of computing them. It never deletes anything.\n\noptions:\n",
          DEMO_PROMPT_TOKENS, DEMO_DOC_TOKENS, DEMO_LAYERS, DEMO_HEADS, DEMO_HEAD_DIM,
          DEMO_BLOCK_TOKENS);
  cli_print_opts(f, opts, DEMO_N_OPTS);
}

static int demo_fail(const char *what, int rc) { return cli_lib_error("demo", what, rc); }

/* ---- setup ---------------------------------------------------------------- */

static uint64_t demo_payload_estimate(const demo_run *r)
{
  uint64_t tblocks = DEMO_PROMPT_BLOCKS + r->cfg.agents * (DEMO_DOC_TOKENS / DEMO_BLOCK_TOKENS);
  return tblocks * DEMO_LAYERS * 2 * r->block_bytes;
}

static int demo_open(demo_run *r)
{
  kvt_options opt;
  kvt_options_init(&opt);
  /* Room for everything the agents reference, plus slack for descriptors. */
  uint64_t need = demo_payload_estimate(r);
  opt.tier_bytes_limit[KVT_TIER_HOT] = need + need / 4 + (64u << 20);
  opt.tier_bytes_limit[KVT_TIER_COLD] = DEMO_COLD_BYTES; /* write-through, persists */
  opt.cold_segment_bytes = DEMO_SEGMENT_BYTES;
  opt.max_seqs = DEMO_AGENTS_MAX;
  int rc = cli_engine_open_remote(r->cfg.dir, &opt, r->cfg.remote, &r->e);
  if (rc != 0) {
    char what[600];
    snprintf(what, sizeof what, "opening the store in '%s'", r->cfg.dir);
    return demo_fail(what, rc);
  }
  kvt_ns_desc d = {
      .model_id = "kvtier-demo/llama-3-8b-like-16L",
      .weights_fingerprint = "generated-kv-v1",
      .rope_theta = 500000.0,
      .tp_size = 1,
      .shape = r->shape,
  };
  rc = kvt_ns_register(r->e, &d, &r->ns);
  if (rc != 0) return demo_fail("registering the demo model's namespace", rc);
  kvt_stats st;
  rc = kvt_stats_get(r->e, &st);
  if (rc != 0) return demo_fail("reading the store's counters", rc);
  for (int t = KVT_TIER_HOT; t < KVT_TIER_COLD; t++) r->blocks_at_open += st.tier_blocks[t];
  r->tblocks_at_open = st.tier_blocks[KVT_TIER_COLD];
  return CLI_OK;
}

static int demo_alloc(demo_run *r)
{
  size_t all = (size_t)DEMO_LAYERS * r->layer_bytes;
  r->k = malloc(all);
  r->v = malloc(all);
  r->gk = malloc(r->layer_bytes);
  r->gv = malloc(r->layer_bytes);
  r->lk = malloc((size_t)DEMO_LAYERS * r->block_bytes);
  r->lv = malloc((size_t)DEMO_LAYERS * r->block_bytes);
  if (!r->k || !r->v || !r->gk || !r->gv || !r->lk || !r->lv)
    return demo_fail("allocating KV buffers", -ENOMEM);
  int rc = kvgen_init(&r->gen, &r->shape, r->cfg.seed);
  if (rc != 0) return demo_fail("setting up the KV generator", rc);
  return CLI_OK;
}

static void demo_free(demo_run *r)
{
  for (uint32_t a = 0; a < DEMO_AGENTS_MAX; a++) kvt_seq_release(r->seqs[a]);
  kvt_engine_close(r->e);
  kvgen_free(&r->gen);
  free(r->k);
  free(r->v);
  free(r->gk);
  free(r->gv);
  free(r->lk);
  free(r->lv);
}

/* ---- one agent ------------------------------------------------------------- */

/* Agent a's context: the shared system prompt, then its own document, and
 * its KV in every layer as the model would compute it. A serving engine
 * computes only what it cannot adopt; the demo generates it all so that
 * every gathered byte can be checked. */
static void agent_generate(demo_run *r, uint32_t a)
{
  prng p;
  prng_seed(&p, r->cfg.seed);
  gen_tokens(&p, KVGEN_VOCAB, r->tokens, DEMO_PROMPT_TOKENS);
  prng_seed(&p, mix64(r->cfg.seed ^ mix64((uint64_t)a + 1)));
  gen_tokens(&p, KVGEN_VOCAB, r->tokens + DEMO_PROMPT_TOKENS, DEMO_DOC_TOKENS);
  kvgen_pos_hashes(&r->gen, 0, r->tokens, DEMO_TOKENS, r->pos_hash);
  for (uint32_t l = 0; l < DEMO_LAYERS; l++)
    kvgen_fill(&r->gen, r->pos_hash, DEMO_TOKENS, l, r->k + l * r->layer_bytes,
               r->v + l * r->layer_bytes);
}

static int agent_put_block(demo_run *r, kvt_seq *s, uint32_t b)
{
  for (uint32_t l = 0; l < DEMO_LAYERS; l++) {
    size_t off = l * r->layer_bytes + b * r->block_bytes;
    kvt_kv kv = {r->k + off, r->v + off, r->shape.dtype, DEMO_BLOCK_TOKENS, DEMO_HEADS,
                 DEMO_HEAD_DIM};
    int rc = kvt_seq_put(s, b, l, &kv);
    if (rc != 0) {
      char what[96];
      snprintf(what, sizeof what, "putting block %u, layer %u", b, l);
      return demo_fail(what, rc);
    }
    r->layer_puts++;
  }
  return CLI_OK;
}

#define DEMO_MISS 3 /* agent_load_cold: the stored block cannot be loaded; compute it */

/* A token block that is durable but not in RAM (stored by an earlier run):
 * load every layer from the cold tier as a serving engine would instead of
 * computing it, check the bytes against the model's KV, and put them so
 * attention has them in RAM (a put of a durable block adds a RAM copy
 * only; nothing is written again). A record that fails its check
 * (KVT_ECORRUPT, or KVT_ENOTFOUND once the cold tier has dropped it) is a
 * miss: DEMO_MISS, nothing put. */
static int agent_load_cold(demo_run *r, uint32_t a, kvt_seq *s, uint32_t b, const kvt_key *key)
{
  for (uint32_t l = 0; l < DEMO_LAYERS; l++)
    r->reqs[l] = (kvt_load_req){.key = *key, .layer = l, .k_out = r->lk + l * r->block_bytes,
                                .v_out = r->lv + l * r->block_bytes,
                                .bytes_each = r->block_bytes};
  kvt_load *ld = NULL;
  int rc = kvt_load_submit(r->e, r->ns, r->reqs, DEMO_LAYERS, &ld);
  if (rc == 0) rc = kvt_load_wait(ld, NULL);
  if (rc == KVT_ENOTFOUND || rc == KVT_ECORRUPT) return DEMO_MISS;
  if (rc != 0) {
    char what[96];
    snprintf(what, sizeof what, "loading block %u of agent %u from the cold tier", b, a);
    return demo_fail(what, rc);
  }
  for (uint32_t l = 0; l < DEMO_LAYERS; l++) {
    size_t off = l * r->layer_bytes + b * r->block_bytes;
    if (memcmp(r->lk + l * r->block_bytes, r->k + off, r->block_bytes) != 0 ||
        memcmp(r->lv + l * r->block_bytes, r->v + off, r->block_bytes) != 0) {
      fprintf(stderr, "kvtier demo: agent %u, block %u, layer %u: KV loaded from tier %u "
              "differs from the model's\n", a, b, l, r->reqs[l].tier);
      return CLI_FAIL;
    }
    kvt_kv kv = {r->lk + l * r->block_bytes, r->lv + l * r->block_bytes, r->shape.dtype,
                 DEMO_BLOCK_TOKENS, DEMO_HEADS, DEMO_HEAD_DIM};
    rc = kvt_seq_put(s, b, l, &kv);
    if (rc != 0) return demo_fail("putting a block loaded from the cold tier", rc);
    r->layer_puts++;
  }
  r->tblocks_loaded_cold++;
  return CLI_OK;
}

/* What a serving engine does with a new request: ask how much of the
 * prefix is stored and where, then append each token block; layers in RAM
 * are adopted, durable blocks are loaded from the cold tier, the others
 * are computed (here: generated) and put. Once a stored block cannot be
 * loaded, it and every later block not in RAM are computed: a serving
 * engine's prefill continues from its first miss. */
static int agent_prefill(demo_run *r, uint32_t a)
{
  size_t found = 0;
  int rc = kvt_lookup(r->e, r->ns, r->tokens, DEMO_TOKENS, r->found, DEMO_BLOCKS, &found);
  if (rc != 0) return demo_fail("looking up the agent's prefix", rc);
  r->agents_hit += found > 0;
  for (size_t i = 0; i < found && i < DEMO_BLOCKS; i++)
    if (r->found[i].tier < KVT_N_TIERS) r->found_by_tier[r->found[i].tier]++;
  rc = kvt_seq_create(r->e, r->ns, &r->seqs[a]);
  if (rc != 0) return demo_fail("creating the agent's sequence", rc);
  int missed = 0;
  for (uint32_t b = 0; b < DEMO_BLOCKS; b++) {
    kvt_append_info info;
    rc = kvt_seq_append(r->seqs[a], r->tokens + (size_t)b * DEMO_BLOCK_TOKENS, DEMO_BLOCK_TOKENS,
                        &info);
    if (rc != 0) return demo_fail("appending a token block", rc);
    if (info.layers_present == DEMO_LAYERS) {
      r->tblocks_adopted++;
      continue;
    }
    if (info.durable && !missed) {
      rc = agent_load_cold(r, a, r->seqs[a], b, &info.key);
      if (rc == CLI_OK) continue;
      if (rc != DEMO_MISS) return rc;
      r->tblocks_load_missed++;
      missed = 1;
    }
    /* Not stored, a miss, or partly present (some layers evicted): the
     * count does not say which, so put every layer; the present ones are
     * dedup hits. */
    r->tblocks_computed++;
    rc = agent_put_block(r, r->seqs[a], b);
    if (rc != CLI_OK) return rc;
  }
  return CLI_OK;
}

/* Where two buffers first differ, as a token index. */
static size_t first_diff_token(const uint8_t *x, const uint8_t *y, size_t n, size_t token_bytes)
{
  size_t i = 0;
  while (i < n && x[i] == y[i]) i++;
  return i / token_bytes;
}

static int check_gathered(demo_run *r, uint32_t a, uint32_t l, size_t bytes, size_t n)
{
  if (bytes != r->layer_bytes || n != DEMO_BLOCKS) {
    fprintf(stderr, "kvtier demo: agent %u, layer %u: gather returned %zu blocks, %zu bytes;"
            " expected %u blocks, %zu bytes\n", a, l, n, bytes, DEMO_BLOCKS, r->layer_bytes);
    return CLI_FAIL;
  }
  for (uint32_t i = 0; i < DEMO_BLOCKS; i++) {
    const kvt_gathered *g = &r->gathered[i];
    if (g->block != i || g->token_pos != i * DEMO_BLOCK_TOKENS || !g->exact) {
      fprintf(stderr, "kvtier demo: agent %u, layer %u: gathered slice %u says block %u at "
              "token %u, exact %u\n", a, l, i, g->block, g->token_pos, g->exact);
      return CLI_FAIL;
    }
  }
  const uint8_t *want[2] = {r->k + l * r->layer_bytes, r->v + l * r->layer_bytes};
  const uint8_t *got[2] = {r->gk, r->gv};
  size_t token_bytes = r->layer_bytes / DEMO_TOKENS;
  for (int kv = 0; kv < 2; kv++) {
    if (memcmp(want[kv], got[kv], r->layer_bytes) == 0) continue;
    fprintf(stderr, "kvtier demo: agent %u, layer %u: gathered %s differs from the generated "
            "KV, first at token %zu\n", a, l, kv ? "V" : "K",
            first_diff_token(want[kv], got[kv], r->layer_bytes, token_bytes));
    return CLI_FAIL;
  }
  return CLI_OK;
}

/* Attention's view: each layer's retained blocks in order, checked byte
 * for byte against what the model produced. */
static int agent_check(demo_run *r, uint32_t a)
{
  for (uint32_t l = 0; l < DEMO_LAYERS; l++) {
    size_t bytes = r->layer_bytes, n = 0;
    int rc = kvt_seq_gather(r->seqs[a], l, r->gk, r->gv, &bytes, r->gathered, DEMO_BLOCKS, &n);
    if (rc != 0) {
      char what[64];
      snprintf(what, sizeof what, "gathering layer %u", l);
      return demo_fail(what, rc);
    }
    r->gathers++;
    rc = check_gathered(r, a, l, bytes, n);
    if (rc != CLI_OK) return rc;
  }
  return CLI_OK;
}

static int demo_agents(demo_run *r)
{
  for (uint32_t a = 0; a < r->cfg.agents; a++) {
    progress("demo: agent %u of %" PRIu64 "", a + 1, r->cfg.agents);
    agent_generate(r, a);
    int rc = agent_prefill(r, a);
    if (rc == CLI_OK) rc = agent_check(r, a);
    if (rc != CLI_OK) return rc;
  }
  progress_end();
  /* Everything the agents computed is durable once this returns. */
  r->sync_rc = kvt_sync(r->e);
  if (r->sync_rc != 0) return demo_fail("making the store durable (kvt_sync)", r->sync_rc);
  for (uint32_t a = 0; a < r->cfg.agents; a++)
    r->durable_agents += kvt_seq_durable(r->seqs[a]) == DEMO_BLOCKS;
  int rc = kvt_stats_get(r->e, &r->st);
  return rc != 0 ? demo_fail("reading the store's counters", rc) : CLI_OK;
}

/* ---- report ------------------------------------------------------------------ */

static uint64_t private_bytes(const demo_run *r)
{
  return r->cfg.agents * DEMO_BLOCKS * DEMO_LAYERS * 2 * (uint64_t)r->block_bytes;
}

/* Bytes in RAM (hot + warm): what sharing saves. The cold tier's copy is
 * the durable one, reported on its own. */
static uint64_t stored_bytes(const kvt_stats *st)
{
  uint64_t sum = 0;
  for (int t = KVT_TIER_HOT; t < KVT_TIER_COLD; t++) sum += st->tier_bytes[t];
  return sum;
}

static double ratio(uint64_t num, uint64_t den) { return den ? (double)num / (double)den : 0.0; }

static double hit_rate(const kvt_stats *st)
{
  return ratio(st->lookup_blocks_hit, st->lookup_blocks_hit + st->lookup_blocks_miss);
}

static int cold_exists(const demo_run *r) { return r->st.tier_limit[KVT_TIER_COLD] != 0; }

static void report_json(const demo_run *r)
{
  const kvt_stats *st = &r->st;
  json_w j;
  json_begin(&j, stdout);
  json_str(&j, "command", "demo");
  json_str(&j, "dir", r->cfg.dir);
  json_u64(&j, "agents", r->cfg.agents);
  json_u64(&j, "seed", r->cfg.seed);
  json_obj(&j, "shape");
  json_u64(&j, "n_layers", DEMO_LAYERS);
  json_u64(&j, "n_kv_heads", DEMO_HEADS);
  json_u64(&j, "head_dim", DEMO_HEAD_DIM);
  json_str(&j, "dtype", "f16");
  json_u64(&j, "block_tokens", DEMO_BLOCK_TOKENS);
  json_end(&j);
  json_u64(&j, "system_prompt_tokens", DEMO_PROMPT_TOKENS);
  json_u64(&j, "document_tokens", DEMO_DOC_TOKENS);
  json_u64(&j, "blocks_at_open", r->blocks_at_open);
  json_u64(&j, "token_blocks_at_open", r->tblocks_at_open);
  json_bool(&j, "persists_across_runs", cold_exists(r));
  json_obj(&j, "tiers");
  for (int t = KVT_TIER_HOT; t < KVT_N_TIERS; t++) {
    json_obj(&j, tier_names[t]);
    json_u64(&j, "blocks", st->tier_blocks[t]);
    json_str(&j, "unit", t == KVT_TIER_COLD ? "token blocks" : "layer blocks");
    json_u64(&j, "bytes", st->tier_bytes[t]);
    json_u64(&j, "limit", st->tier_limit[t]);
    json_end(&j);
  }
  json_end(&j);
  json_obj(&j, "cold");
  json_u64(&j, "records", st->cold_records);
  json_u64(&j, "segments", st->cold_segments);
  json_u64(&j, "written_this_run", st->cold_written);
  json_u64(&j, "write_bytes", st->cold_write_bytes);
  json_u64(&j, "reads", st->cold_reads);
  json_u64(&j, "read_bytes", st->cold_read_bytes);
  json_u64(&j, "checksum_failures", st->cold_checksum_failures);
  json_str(&j, "io_backend", st->io_backend);
  json_str(&j, "io_why", st->io_why);
  json_end(&j);
  json_bool(&j, "synced", r->sync_rc == 0);
  json_u64(&j, "durable_token_blocks", st->cold_records);
  json_u64(&j, "durable_agents", r->durable_agents);
  json_obj(&j, "lookup_found_by_tier");
  for (int t = KVT_TIER_HOT; t < KVT_N_TIERS; t++) json_u64(&j, tier_names[t], r->found_by_tier[t]);
  json_end(&j);
  json_u64(&j, "token_blocks_loaded_cold", r->tblocks_loaded_cold);
  json_u64(&j, "token_blocks_load_missed", r->tblocks_load_missed);
  json_u64(&j, "stored_bytes", stored_bytes(st));
  json_u64(&j, "total_bytes", st->total_bytes);
  json_u64(&j, "private_bytes", private_bytes(r));
  json_u64(&j, "logical_bytes", st->logical_bytes);
  json_u64(&j, "dedup_saved_bytes", st->dedup_saved_bytes);
  json_f64(&j, "dedup_saved_pct", 100.0 * ratio(st->dedup_saved_bytes, private_bytes(r)));
  json_u64(&j, "dedup_hits", st->dedup_hits);
  json_u64(&j, "lookups", st->lookups);
  json_u64(&j, "lookup_blocks_hit", st->lookup_blocks_hit);
  json_u64(&j, "lookup_blocks_miss", st->lookup_blocks_miss);
  json_f64(&j, "hit_rate", hit_rate(st));
  json_u64(&j, "agents_hit", r->agents_hit);
  json_u64(&j, "token_blocks_adopted", r->tblocks_adopted);
  json_u64(&j, "token_blocks_computed", r->tblocks_computed);
  json_u64(&j, "layer_puts", r->layer_puts);
  json_u64(&j, "gathers", r->gathers);
  json_bool(&j, "verified", 1);
  json_f64(&j, "seconds", (double)r->seconds_ns / 1e9);
  kvt_remote_stats rs;
  cli_remote_get(r->e, &rs);
  cli_remote_json(&j, &rs);
  json_end(&j);
}

static void report_store_line(const demo_run *r)
{
  if (!cold_exists(r))
    printf("store: %s (nothing persists across processes until the cold tier exists,\n"
           "       so every run starts from an empty store; nothing was deleted)\n",
           r->cfg.dir);
  else if (r->tblocks_at_open == 0)
    printf("store: %s (started empty; written through to its cold tier)\n", r->cfg.dir);
  else
    printf("store: %s (continued from %" PRIu64 " token blocks already in its cold tier)\n",
           r->cfg.dir, r->tblocks_at_open);
}

static void report_tiers(const kvt_stats *st)
{
  char b1[32], b2[32];
  printf("\n  %-6s %14s %12s %12s\n", "tier", "blocks", "bytes", "limit");
  for (int t = KVT_TIER_HOT; t < KVT_N_TIERS; t++)
    printf("  %-6s %14" PRIu64 " %12s %12s  %s\n", tier_names[t], st->tier_blocks[t],
           fmt_bytes(b1, sizeof b1, st->tier_bytes[t]),
           fmt_bytes(b2, sizeof b2, st->tier_limit[t]),
           t == KVT_TIER_COLD ? "token blocks, all layers (on disk, durable)" : "layer blocks");
  printf("  engine total %21s  (payloads, index, sequences, bookkeeping)\n\n",
         fmt_bytes(b1, sizeof b1, st->total_bytes));
}

static void report_human(const demo_run *r)
{
  const kvt_stats *st = &r->st;
  char b1[32], b2[32], b3[32];
  printf("kvtier demo: %" PRIu64 " agents, each with the same %u-token system prompt and its "
         "own %u-token document (seed %" PRIu64 ")\nmodel: %u layers x %u KV heads x head_dim "
         "%u, f16, %u tokens per block (%s of K+V per layer block)\n",
         r->cfg.agents, DEMO_PROMPT_TOKENS, DEMO_DOC_TOKENS, r->cfg.seed, DEMO_LAYERS, DEMO_HEADS,
         DEMO_HEAD_DIM, DEMO_BLOCK_TOKENS, fmt_bytes(b1, sizeof b1, 2 * r->block_bytes));
  report_store_line(r);
  report_tiers(st);
  printf("  dedup    %s stored where private copies would take %s: %s saved (%.1f%%)\n",
         fmt_bytes(b1, sizeof b1, stored_bytes(st)), fmt_bytes(b2, sizeof b2, private_bytes(r)),
         fmt_bytes(b3, sizeof b3, st->dedup_saved_bytes),
         100.0 * ratio(st->dedup_saved_bytes, private_bytes(r)));
  printf("  lookups  %" PRIu64 ": %" PRIu64 " of %" PRIu64 " token blocks found (hit rate "
         "%.1f%%)\n", st->lookups, st->lookup_blocks_hit,
         st->lookup_blocks_hit + st->lookup_blocks_miss, 100.0 * hit_rate(st));
  printf("  found    by lookup: %" PRIu64 " token blocks in hot, %" PRIu64 " in warm, %" PRIu64
         " in cold; %" PRIu64 " loaded from cold\n", r->found_by_tier[KVT_TIER_HOT],
         r->found_by_tier[KVT_TIER_WARM], r->found_by_tier[KVT_TIER_COLD], r->tblocks_loaded_cold);
  if (r->tblocks_load_missed)
    printf("  missed   %" PRIu64 " stored token blocks failed their check when loaded: computed "
           "again, with the rest of their agent's context\n", r->tblocks_load_missed);
  printf("  durable  kvt_sync: %" PRIu64 " token blocks in the cold tier (%" PRIu64 " segments, "
         "%s written by this run); %" PRIu64 " of %" PRIu64 " agents fully durable\n",
         st->cold_records, st->cold_segments, fmt_bytes(b1, sizeof b1, st->cold_write_bytes),
         r->durable_agents, r->cfg.agents);
  printf("  I/O      %s\n", st->io_backend[0] ? st->io_backend : "none");
  printf("  check    %" PRIu64 " gathers (%u layers x %" PRIu64 " agents) returned exactly the "
         "KV that was put\n  time     %.2f s\n\n", r->gathers, DEMO_LAYERS, r->cfg.agents,
         (double)r->seconds_ns / 1e9);
  printf("What it means: the agents share one stored copy of the system prompt's KV;\n"
         "%" PRIu64 " of %" PRIu64 " agents found stored blocks by prefix lookup and skipped "
         "computing %" PRIu64 " token blocks\n(%" PRIu64 " of them loaded from disk), so RAM "
         "holds %s for %s of context.\nEverything is durable in %s: run the demo again to "
         "continue from it.\n",
         r->agents_hit, r->cfg.agents, r->tblocks_adopted + r->tblocks_loaded_cold,
         r->tblocks_loaded_cold, fmt_bytes(b1, sizeof b1, stored_bytes(st)),
         fmt_bytes(b2, sizeof b2, st->logical_bytes), r->cfg.dir);
}

/* ---- entry ------------------------------------------------------------------- */

static int demo_main(demo_run *r)
{
  int rc = demo_alloc(r);
  if (rc == CLI_OK) rc = demo_open(r);
  if (rc == CLI_OK) rc = demo_agents(r);
  if (rc != CLI_OK) return rc;
  r->seconds_ns = now_ns() - r->started_ns;
  if (r->cfg.json)
    report_json(r);
  else {
    report_human(r);
    kvt_remote_stats rs;
    cli_remote_get(r->e, &rs);
    cli_remote_print(&rs);
  }
  return CLI_OK;
}

int cmd_demo(int argc, char **argv)
{
  demo_cfg cfg = {.dir = "./kvtier-demo", .agents = 8, .seed = 1, .json = 0};
  cli_opt opts[DEMO_N_OPTS];
  demo_opts(&cfg, opts);
  int want_help = 0;
  int rc = cli_parse("demo", argc - 1, argv + 1, opts, DEMO_N_OPTS, &want_help);
  if (want_help) demo_usage(stdout);
  if (rc != CLI_OK || want_help) return rc;
  demo_run *r = calloc(1, sizeof *r);
  if (r == NULL) return demo_fail("allocating the demo's state", -ENOMEM);
  r->cfg = cfg;
  r->started_ns = now_ns();
  r->shape = (kvt_shape){DEMO_LAYERS, DEMO_HEADS, DEMO_HEAD_DIM, KVT_F16, DEMO_BLOCK_TOKENS};
  r->block_bytes = (size_t)DEMO_BLOCK_TOKENS * DEMO_HEADS * DEMO_HEAD_DIM * 2;
  r->layer_bytes = (size_t)DEMO_TOKENS * DEMO_HEADS * DEMO_HEAD_DIM * 2;
  rc = demo_main(r);
  demo_free(r);
  free(r);
  return rc;
}
