/* eval.c - `kvtier eval`: the reference model's loss when its KV cache
 * keeps only part of the context (a policy and a budget) or quantizes it
 * (a codec), against the full cache, on sampled or given token sequences.
 * Optionally writes every observation to a trace (docs/trace-format.md),
 * and the logits of every step to a file (--dump-logits; checks of other
 * implementations of the model, such as the Python example). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "refcli.h"
#include "sample.h"
#include "trace.h"
#include "util.h"

/* Target positions before this are not scored: the context is too short
 * there for a budget to mean anything. */
#define EVAL_FIRST_TARGET 64u

/* The oracle ranks blocks by the full cache's attention over this many
 * steps ahead (the ceiling of eviction), and eval reports the mass the
 * policy misses over the same horizon. */
#define EVAL_HORIZON 32u

typedef struct eval_cfg {
  const char *model, *tokenizer, *policy, *codec, *input, *trace, *budget_s, *logits;
  const char *profile, *predictor, *warm_s, *warm_codec, *margin_s;
  uint64_t sequences, len, seed, block_tokens;
  int show, json, recall, cold;
  double budget, warm, margin;
} eval_cfg;

/* Per-layer attention concentration, summed over observed steps. */
typedef struct layer_acc {
  double top10, first;
  uint64_t steps;
} layer_acc;

typedef struct eval_run {
  eval_cfg cfg;
  rm_model m;
  ref_codec codec;
  ref_codec wcodec;                   /* --warm-codec: the policy's warm form */
  kvt_policy pol;
  int oracle;                         /* --policy oracle: "external" fed the future */
  uint32_t bt;                        /* tokens per block */
  uint32_t **seqs, *lens;
  size_t n_seqs;
  kvt_engine *e;
  kvt_ns_id ns;
  /* the engine the policy runs in: e, or with --recall one of its own
   * with a cold tier and a hot tier near the budget (eval_open_recall) */
  kvt_engine *pe;
  kvt_ns_id pns;
  kvt_stats pst;                      /* pe's, after the last sequence */
  double *nll, *nll_full, *kl, *top1; /* per-sequence means, [n_scored] of [n_seqs] */
  size_t n_scored;                    /* sequences longer than EVAL_FIRST_TARGET */
  uint64_t positions;
  layer_acc *layers;                  /* [n_layers] */
  trace_w *tw;
  FILE *logits_f;                     /* --dump-logits */
  uint32_t cur_seq;
  kvt_gathered *ret;                  /* scratch for kvt_seq_retained */
  const rm_dec *dec;                  /* the decoder under evaluation (its key norms) */
  float *sorted, *knorm;              /* scratch: masses sorted, key norms of ret */
  /* the full cache's block masses of the current sequence, from a first
   * pass through kvtier with nothing evicted: [pos][layer][block] */
  float *fmass;
  size_t fm_blocks;                   /* blocks per (pos, layer) row */
  int fm_pass;                        /* 1 while the first pass records */
  /* budgets, per scored position (summed over layers), over the run */
  double kept_frac, kept_tok_frac, warm_tok_frac, missed, missed_h;
  uint64_t promotions, promotions_exact, demotions; /* the policy's, summed over sequences */
  uint64_t kept_n, missed_n, over_positions;
  int over_now;                       /* a layer over budget at this position */
  uint8_t *keep;                      /* [fm_blocks] scratch */
  int cb_rc;
  kvt_stats st;                       /* the engine's, after the last sequence */
} eval_run;

#define EVAL_N_OPTS 21

static void eval_opts(eval_cfg *c, cli_opt o[EVAL_N_OPTS]) {
  const cli_opt opts[EVAL_N_OPTS] = {
      {"--model", "M", CLI_STR, &c->model, 0, 0, "llama2.c checkpoint (required)"},
      {"--tokenizer", "T", CLI_STR, &c->tokenizer, 0, 0,
       "llama2.c tokenizer for --show (default tok<vocab>.bin beside the model)"},
      {"--sequences", "N", CLI_U64, &c->sequences, 1, 100000, "sequences to sample (default 8)"},
      {"--len", "L", CLI_U64, &c->len, EVAL_FIRST_TARGET + 1, 1u << 20,
       "tokens per sequence, up to the model's context (default: the context)"},
      {"--seed", "S", CLI_U64, &c->seed, 0, UINT64_MAX, "sampling seed (default 1)"},
      {"--budget", "F", CLI_STR, &c->budget_s, 0, 0,
       "bytes each layer keeps, a fraction of its full f16 cache, tail included (default 1)"},
      {"--policy", "P", CLI_STR, &c->policy, 0, 0,
       "full, recent, sink-recent, h2o, snapkv, tova, learned, auto, or oracle (default full)"},
      {"--profile", "FILE", CLI_STR, &c->profile, 0, 0,
       "per-layer scorers and shares for --policy auto (kvtier calibrate)"},
      {"--predictor", "FILE", CLI_STR, &c->predictor, 0, 0,
       "the learned scorer's model (kvtier train)"},
      {"--block-tokens", "N", CLI_U64, &c->block_tokens, 1, 256, "tokens per block (default 16)"},
      {"--warm", "F", CLI_STR, &c->warm_s, 0, 0,
       "part of each layer's budget for warm blocks (three tiers; default 0, or the profile's)"},
      {"--warm-codec", "C", CLI_STR, &c->warm_codec, 0, 0,
       "the warm tier's codecs for --warm and profiles (default the namespace's: k8v3)"},
      {"--margin", "M", CLI_STR, &c->margin_s, 0, 0,
       "promotion hysteresis: a warm block must beat the weakest hot by this fraction (0.1)"},
      {"--codec", "C", CLI_STR, &c->codec, 0, 0,
       "quantize every block (warm, in place): k8v3 (both), k8 (keys), v3 (values), ..."},
      {"--input", "FILE", CLI_STR, &c->input, 0, 0,
       "evaluate these token ids (one sequence a line) instead of sampling"},
      {"--dump-trace", "FILE", CLI_STR, &c->trace, 0, 0,
       "write every step's per-layer block masses (docs/trace-format.md)"},
      {"--dump-logits", "FILE", CLI_STR, &c->logits, 0, 0,
       "write each step's logits with kvtier's cache (raw f32, docs/refmodel.md)"},
      {"--cold", NULL, CLI_FLAG, &c->cold, 0, 0,
       "run the policy in an engine of its own with a cold tier and a hot tier near the "
       "budget (the baseline of --recall)"},
      {"--recall", NULL, CLI_FLAG, &c->recall, 0, 0,
       "recall evicted blocks from a cold tier when a query's key-sketch bound beats the "
       "weakest retained block (docs/policy.md, \"Recall\"); implies --cold"},
      {"--show", NULL, CLI_FLAG, &c->show, 0, 0, "print the text of the first sequence"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the figures as one JSON object"},
  };
  memcpy(o, opts, sizeof opts);
}

void eval_usage(FILE *f) {
  eval_cfg c;
  cli_opt o[EVAL_N_OPTS];
  eval_opts(&c, o);
  fprintf(f,
          "usage: kvtier eval --model M [--sequences N] [--len L] [--seed S] [--budget F]\n"
          "                   [--policy P] [--profile FILE] [--predictor FILE]\n"
          "                   [--block-tokens N] [--warm F] [--warm-codec C] [--margin M]\n"
          "                   [--codec C] [--input FILE] [--cold] [--recall]\n"
          "                   [--dump-trace FILE] [--dump-logits FILE] [--show] [--json]\n\n"
          "Runs the reference decoder (docs/refmodel.md) with kvtier as its KV cache.\n"
          "Samples N sequences of L tokens from the model with a full cache (temperature\n"
          "1, seeded; a story that ends is followed by a new one), or reads them with\n"
          "--input, then teacher-forces each through the model keeping a budget of the\n"
          "context under a policy and/or quantizing it with a codec. Reports, over target\n"
          "positions >= %u: nll, its change against the full cache (delta_nll), the mean\n"
          "KL(full || compressed) of next-token distributions (kl), top-1 agreement with\n"
          "the full cache (top1), each with its standard error over sequences; and per\n"
          "layer the share of attention mass on the top 10%% of retained blocks and on\n"
          "the first block. See docs/policy.md.\n\noptions:\n",
          EVAL_FIRST_TARGET);
  cli_print_opts(f, o, EVAL_N_OPTS);
}

static int usage_error(const char *msg, const char *arg) {
  fprintf(stderr, "kvtier eval: %s%s%s\nrun 'kvtier help eval' for its options\n", msg,
          arg ? ": " : "", arg ? arg : "");
  return CLI_USAGE;
}

/* Options that need more than cli_parse's checks. */
static int eval_check(eval_run *r) {
  eval_cfg *c = &r->cfg;
  if (!c->model) return usage_error("--model is required", NULL);
  char *end = NULL;
  c->budget = c->budget_s ? strtod(c->budget_s, &end) : 1.0;
  if (c->budget_s && (*end || !(c->budget > 0 && c->budget <= 1)))
    return usage_error("--budget must be a fraction in (0, 1]", c->budget_s);
  kvt_policy_init(&r->pol);
  r->oracle = c->policy && strcmp(c->policy, "oracle") == 0;
  if (r->oracle) r->pol.scorer = KVT_SCORER_EXTERNAL;
  else if (c->policy && (kvt_policy_parse(c->policy, &r->pol.scorer) ||
                         r->pol.scorer == KVT_SCORER_EXTERNAL))
    return usage_error("unknown --policy (full, recent, sink-recent, h2o, snapkv, tova, learned, "
                       "auto, oracle)", c->policy);
  r->pol.budget = c->budget;
  c->warm = c->warm_s ? strtod(c->warm_s, &end) : 0;
  if (c->warm_s && (*end || !(c->warm >= 0 && c->warm < 1)))
    return usage_error("--warm must be a fraction in [0, 1)", c->warm_s);
  r->pol.warm = c->warm;
  c->margin = c->margin_s ? strtod(c->margin_s, &end) : r->pol.margin;
  if (c->margin_s && (*end || !(c->margin >= 0 && c->margin <= 100)))
    return usage_error("--margin must be in [0, 100]", c->margin_s);
  r->pol.margin = c->margin;
  if (c->warm_codec && (ref_codec_parse(c->warm_codec, &r->wcodec) || !r->wcodec.k || !r->wcodec.v))
    return usage_error("unknown --warm-codec (both sides: k8v3, k4v2, ...)", c->warm_codec);
  r->bt = c->block_tokens ? (uint32_t)c->block_tokens : REF_BLOCK_TOKENS;
  if (r->pol.scorer == KVT_SCORER_FULL && c->budget < 1)
    return usage_error("--budget below 1 needs a --policy other than full", c->budget_s);
  r->pol.recall = (uint32_t)c->recall;
  c->cold |= c->recall;
  if (c->cold && (r->pol.scorer == KVT_SCORER_FULL || c->codec))
    return usage_error("--cold and --recall need a --policy other than full, and no --codec",
                       NULL);
  if (c->codec && ref_codec_parse(c->codec, &r->codec))
    return usage_error("unknown --codec (k8v3, k8cv3, k4v2, ..., or one side: k8, v3, ...)",
                       c->codec);
  if (c->input && (c->sequences || c->len))
    return usage_error("--input gives the sequences: no --sequences or --len with it", NULL);
  return CLI_OK;
}

/* ---- sequences ---------------------------------------------------------------- */

static int eval_sequences(eval_run *r) {
  eval_cfg *c = &r->cfg;
  uint32_t ctx = (uint32_t)r->m.c.seq_len;
  if (c->input)
    return ref_read_tokens("eval", c->input, (uint32_t)r->m.c.vocab_size, ctx, &r->seqs, &r->lens,
                           &r->n_seqs);
  uint64_t len = c->len ? c->len : ctx, n = c->sequences ? c->sequences : 8;
  if (len > ctx) {
    fprintf(stderr, "kvtier eval: --len %" PRIu64 " is beyond the model's context (%u)\n", len,
            ctx);
    return CLI_USAGE;
  }
  r->seqs = calloc(n, sizeof *r->seqs);
  r->lens = calloc(n, sizeof *r->lens);
  if (!r->seqs || !r->lens) return cli_lib_error("eval", "allocating sequences", -ENOMEM);
  r->n_seqs = n;
  for (size_t i = 0; i < n; i++) {
    progress("eval: sampling sequence %zu of %zu", i + 1, (size_t)n);
    if (!(r->seqs[i] = malloc(len * sizeof **r->seqs)))
      return cli_lib_error("eval", "allocating sequences", -ENOMEM);
    r->lens[i] = (uint32_t)len;
    int rc = rm_sample(&r->m, mix64(c->seed + i), (uint32_t)len, r->seqs[i]);
    if (rc) return cli_lib_error("eval", "sampling", rc);
  }
  return CLI_OK;
}

/* ---- the engine ---------------------------------------------------------------- */

/* An engine in dir for the reference model: a large hot tier, or with a
 * warm codec every block encoded into warm; the profile and the predictor
 * loaded. Dedup is verified, so a put whose bytes differ from the stored
 * copy it shares shows in dedup_mismatches. */
static int eval_open_engine(eval_run *r, const char *dir, kvt_engine **e, kvt_ns_id *ns) {
  kvt_options o;
  kvt_options_init(&o);
  o.flags |= KVT_OPEN_VERIFY_DEDUP;
  o.tier_bytes_limit[KVT_TIER_HOT] = 256u << 20;
  if (r->codec.warm) {
    /* Below one block: every put is encoded straight into warm. */
    o.tier_bytes_limit[KVT_TIER_HOT] = 1;
    o.tier_bytes_limit[KVT_TIER_WARM] = 256u << 20;
  } else if (r->cfg.warm > 0 || r->cfg.profile) {
    o.tier_bytes_limit[KVT_TIER_WARM] = 256u << 20; /* the policy's warm share */
    /* exact copies for promotions: what was demoted comes back exact */
    o.tier_bytes_limit[KVT_TIER_COLD] = 1ull << 30;
  }
  int rc = cli_engine_open(dir, &o, e);
  if (!rc) rc = rm_ns_register(*e, &r->m, r->bt, ns);
  if (!rc && r->codec.warm) rc = kvt_ns_set_codec(*e, *ns, KVT_ALL_LAYERS, r->codec.k, r->codec.v);
  else if (!rc && r->wcodec.warm)
    rc = kvt_ns_set_codec(*e, *ns, KVT_ALL_LAYERS, r->wcodec.k, r->wcodec.v);
  if (rc) return cli_engine_error("eval", "opening the engine", *e, rc);
  if (r->cfg.profile && (rc = kvt_ns_load_profile(*e, *ns, r->cfg.profile)))
    return cli_engine_error("eval", r->cfg.profile, *e, rc);
  if (r->cfg.predictor && (rc = kvt_ns_load_predictor(*e, *ns, r->cfg.predictor)))
    return cli_engine_error("eval", r->cfg.predictor, *e, rc);
  return CLI_OK;
}

/* The first pass (full-cache masses) runs in r->e. A policy runs in an
 * engine of its own, in dir/policy: in r->e its sequence would adopt the
 * first pass's blocks (same tokens, same keys), and from layer 1 on those
 * hold the full cache's K and V, not the ones the model computes under
 * the policy, so attention would read K and V the policy never had. */
static int eval_open(eval_run *r, const char *dir) {
  int rc = eval_open_engine(r, dir, &r->e, &r->ns);
  if (rc != CLI_OK) return rc;
  r->pe = r->e;
  r->pns = r->ns;
  if (r->pol.scorer == KVT_SCORER_FULL || r->cfg.cold) return CLI_OK; /* no first pass, or --cold */
  char sub[PATH_MAX];
  if (snprintf(sub, sizeof sub, "%s/policy", dir) >= (int)sizeof sub)
    return cli_lib_error("eval", "the scratch directory's path", -ENAMETOOLONG);
  r->pe = NULL;
  return eval_open_engine(r, sub, &r->pe, &r->pns);
}

/* Hot-tier bytes of one layer block of the model at r->bt tokens: its f32
 * K and V rounded as the engine allocates them, and a descriptor. */
static uint64_t eval_block_cost(const eval_run *r) {
  uint64_t payload = 2ull * r->bt * (uint64_t)r->m.c.n_kv_heads * r->m.head_dim * sizeof(float);
  return ((payload + 63) & ~63ull) + 256;
}

/* --cold, --recall: the policy runs in an engine of its own, in dir/recall, with a
 * cold tier every block is written to and a hot tier of the budget plus
 * 0.15 of one sequence's cache (protected blocks may exceed a share), so
 * what the policy evicts leaves RAM and a recall reads it from disk. The
 * first pass (full-cache masses) stays in the plain engine. */
static int eval_open_recall(eval_run *r, const char *dir) {
  char sub[PATH_MAX];
  if (snprintf(sub, sizeof sub, "%s/recall", dir) >= (int)sizeof sub)
    return cli_lib_error("eval", "the scratch directory's path", -ENAMETOOLONG);
  kvt_options o;
  kvt_options_init(&o);
  uint64_t blocks = ((uint64_t)r->m.c.seq_len / r->bt + 1) * (uint64_t)r->m.c.n_layers;
  double share = r->cfg.budget + 0.15 > 1 ? 1 : r->cfg.budget + 0.15;
  o.tier_bytes_limit[KVT_TIER_HOT] =
      (uint64_t)(share * (double)blocks) * eval_block_cost(r) + 4ull * r->m.c.n_layers * eval_block_cost(r);
  o.tier_bytes_limit[KVT_TIER_COLD] = 1ull << 30;
  o.cold_segment_bytes = 8u << 20;
  if (r->cfg.warm > 0 || r->cfg.profile) /* the policy's warm share, as eval_open */
    o.tier_bytes_limit[KVT_TIER_WARM] = 256u << 20;
  o.flags |= KVT_OPEN_VERIFY_DEDUP;
  int rc = cli_engine_open(sub, &o, &r->pe);
  if (!rc) rc = rm_ns_register(r->pe, &r->m, r->bt, &r->pns);
  if (!rc && r->wcodec.warm)
    rc = kvt_ns_set_codec(r->pe, r->pns, KVT_ALL_LAYERS, r->wcodec.k, r->wcodec.v);
  if (rc) return cli_engine_error("eval", "opening the recall engine", r->pe, rc);
  if (r->cfg.profile && (rc = kvt_ns_load_profile(r->pe, r->pns, r->cfg.profile)))
    return cli_engine_error("eval", r->cfg.profile, r->pe, rc);
  if (r->cfg.predictor && (rc = kvt_ns_load_predictor(r->pe, r->pns, r->cfg.predictor)))
    return cli_engine_error("eval", r->cfg.predictor, r->pe, rc);
  return CLI_OK;
}

/* ---- observation: concentration and the trace ---------------------------------- */

static int cmp_desc(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x < y) - (x > y);
}

static float *fmass_row(eval_run *r, uint32_t pos, uint32_t layer) {
  return r->fmass + ((size_t)pos * (size_t)r->m.c.n_layers + layer) * r->fm_blocks;
}

/* First pass: the full cache's mass of every block at (pos, layer). */
static void on_mass_full(void *arg, uint32_t layer, uint32_t pos, kvt_seq *s, const float *mass,
                         size_t n) {
  (void)s;
  eval_run *r = arg;
  memcpy(fmass_row(r, pos, layer), mass, n * sizeof *mass);
}

/* What the policy keeps at (pos, layer) against its budget, and the
 * full cache's mass over the next EVAL_HORIZON steps (and at this step)
 * on blocks it no longer retains. Called on the retained list r->ret. */
static void account_budget(eval_run *r, uint32_t layer, uint32_t pos, kvt_seq *s, size_t n) {
  kvt_policy_info pi;
  if (kvt_seq_policy_info(s, layer, &pi)) return;
  r->over_now |= (int)pi.over;
  uint32_t L = (uint32_t)r->m.c.n_layers;
  double H = (double)r->m.c.n_heads;
  /* kept fractions are summed per layer and divided by L at the end of
   * the position (every layer has the same full size) */
  r->kept_frac += (double)pi.kept_bytes / (double)pi.full_bytes / L;
  r->kept_tok_frac += (double)pi.kept_tokens / (double)pi.tokens / L;
  r->warm_tok_frac += (double)pi.warm_tokens / (double)pi.tokens / L;
  if (!r->fmass) return;
  /* retained blocks, marked over the sequence's blocks */
  uint8_t *keep = r->keep;
  size_t nbk = pos / r->bt;
  memset(keep, 0, nbk);
  for (size_t i = 0; i < n; i++)
    if (r->ret[i].block < nbk) keep[r->ret[i].block] = 1;
  const float *now = fmass_row(r, pos, layer);
  double miss = 0, miss_h = 0, tot_h = 0;
  for (size_t b = 0; b < nbk; b++) miss += keep[b] ? 0 : now[b];
  uint32_t last = pos + EVAL_HORIZON;
  if (last > r->lens[r->cur_seq] - 1) last = r->lens[r->cur_seq] - 1;
  for (uint32_t t = pos; t < last; t++) {
    const float *row = fmass_row(r, t, layer);
    for (size_t b = 0; b < nbk; b++) {
      tot_h += row[b];
      miss_h += keep[b] ? 0 : row[b];
    }
  }
  r->missed += miss / H;
  r->missed_h += tot_h > 0 ? miss_h / tot_h : 0;
  r->missed_n++;
}

static void on_mass(void *arg, uint32_t layer, uint32_t pos, kvt_seq *s, const float *mass,
                    size_t n) {
  eval_run *r = arg;
  if (r->fm_pass) {
    on_mass_full(arg, layer, pos, s, mass, n);
    return;
  }
  if (r->cb_rc) return;
  if (n == 0) {
    if (pos + 1 >= EVAL_FIRST_TARGET) account_budget(r, layer, pos, s, 0);
    return;
  }
  size_t got;
  int rc = kvt_seq_retained(s, layer, r->ret, (size_t)r->m.c.seq_len, &got);
  if (rc || got != n) {
    r->cb_rc = rc ? rc : KVT_ECOUNT;
    return;
  }
  uint32_t L = (uint32_t)r->m.c.n_layers;
  for (size_t i = 0; r->tw && i < n; i++)
    r->knorm[i] = r->dec->key_norm[(size_t)r->ret[i].block * L + layer];
  if (r->tw && (rc = trace_step(r->tw, r->cur_seq, pos, layer, r->ret, mass, r->knorm, n))) {
    r->cb_rc = rc;
    return;
  }
  if (pos + 1 < EVAL_FIRST_TARGET) return;
  account_budget(r, layer, pos, s, n);
  double total = 0, top = 0;
  memcpy(r->sorted, mass, n * sizeof *mass);
  qsort(r->sorted, n, sizeof *r->sorted, cmp_desc);
  size_t k = (n + 9) / 10; /* the top 10%, at least one block */
  for (size_t i = 0; i < n; i++) total += r->sorted[i];
  for (size_t i = 0; i < k; i++) top += r->sorted[i];
  if (total <= 0) return;
  layer_acc *a = &r->layers[layer];
  a->top10 += top / total;
  a->first += r->ret[0].block == 0 ? mass[0] / total : 0;
  a->steps++;
}

/* ---- scoring ---------------------------------------------------------------------- */

/* First pass over sequence i: kvtier with nothing evicted, recording the
 * full cache's mass of every block at every (position, layer). */
static int eval_full_masses(eval_run *r, size_t i) {
  const uint32_t *tok = r->seqs[i], len = r->lens[i];
  rm_dec d;
  int rc = rm_dec_init(&d, &r->m, r->e, r->ns);
  if (rc) return rc;
  d.on_mass = on_mass;
  d.on_mass_arg = r;
  d.observe = 0;
  r->fm_pass = 1;
  memset(r->fmass, 0, (size_t)r->m.c.seq_len * (size_t)r->m.c.n_layers * r->fm_blocks *
                          sizeof *r->fmass);
  for (uint32_t p = 0; !rc && p + 1 < len; p++) rc = rm_dec_step(&d, tok[p], NULL);
  r->fm_pass = 0;
  rm_dec_free(&d);
  return rc;
}

/* The oracle's hints before step p: each block's full-cache mass over
 * steps p .. p + EVAL_HORIZON - 1 (what eviction at the start of step p
 * will miss). */
static int eval_oracle_hints(eval_run *r, rm_dec *d, uint32_t p) {
  uint32_t nb = kvt_seq_blocks(d->s), L = (uint32_t)r->m.c.n_layers, last = p + EVAL_HORIZON;
  if (last > r->lens[r->cur_seq] - 1) last = r->lens[r->cur_seq] - 1;
  float *h = r->sorted; /* scratch of fm_blocks */
  for (uint32_t l = 0; l < L; l++) {
    memset(h, 0, nb * sizeof *h);
    for (uint32_t t = p; t < last; t++) {
      const float *row = fmass_row(r, t, l);
      for (uint32_t b = 0; b < nb; b++) h[b] += row[b];
    }
    int rc = kvt_seq_hint(d->s, l, h, nb);
    if (rc) return rc;
  }
  return 0;
}

/* Teacher-force sequence i through the full cache (plain) and through
 * kvtier with the policy and codec; accumulate the per-sequence means. */
static int eval_one(eval_run *r, size_t i, double *lp_full, double *lp) {
  const uint32_t *tok = r->seqs[i], len = r->lens[i];
  size_t V = (size_t)r->m.c.vocab_size;
  r->cur_seq = (uint32_t)i;
  int rc = r->fmass ? eval_full_masses(r, i) : 0;
  if (rc) return rc;
  rm_dec full, d;
  if ((rc = rm_dec_init(&full, &r->m, NULL, 0))) return rc;
  if ((rc = rm_dec_init(&d, &r->m, r->pe, r->pns))) {
    rm_dec_free(&full);
    return rc;
  }
  d.rt_codec[0] = r->codec.warm ? 0 : r->codec.k;
  d.rt_codec[1] = r->codec.warm ? 0 : r->codec.v;
  d.on_mass = on_mass;
  d.on_mass_arg = r;
  r->dec = &d;
  rc = kvt_seq_set_policy(d.s, &r->pol);
  double nll = 0, nll_f = 0, kl = 0, agree = 0;
  uint64_t n = 0;
  for (uint32_t p = 0; !rc && p + 1 < len; p++) {
    const float *lf, *lc;
    r->over_now = 0;
    if (r->oracle && (rc = eval_oracle_hints(r, &d, p))) break;
    if ((rc = rm_dec_step(&full, tok[p], &lf)) || (rc = rm_dec_step(&d, tok[p], &lc)) ||
        (rc = r->cb_rc))
      break;
    if (r->logits_f && fwrite(lc, sizeof *lc, V, r->logits_f) != V) {
      rc = -errno;
      break;
    }
    if (p + 1 < EVAL_FIRST_TARGET) continue;
    r->kept_n++;
    r->over_positions += (uint64_t)r->over_now;
    rm_log_softmax(lf, V, lp_full);
    rm_log_softmax(lc, V, lp);
    nll -= lp[tok[p + 1]];
    nll_f -= lp_full[tok[p + 1]];
    for (size_t t = 0; t < V; t++) kl += exp(lp_full[t]) * (lp_full[t] - lp[t]);
    agree += rm_argmax(lf, V) == rm_argmax(lc, V);
    n++;
  }
  for (uint32_t l = 0; !rc && l < (uint32_t)r->m.c.n_layers; l++) {
    kvt_policy_info pi;
    if (kvt_seq_policy_info(d.s, l, &pi)) continue;
    r->promotions += pi.promotions;
    r->promotions_exact += pi.promotions_exact;
    r->demotions += pi.demotions;
  }
  rm_dec_free(&full);
  rm_dec_free(&d);
  r->dec = NULL;
  if (rc) return rc;
  if (n == 0) return 0; /* too short to score: not in the means */
  size_t k = r->n_scored++;
  r->nll[k] = nll / (double)n;
  r->nll_full[k] = nll_f / (double)n;
  r->kl[k] = kl / (double)n;
  r->top1[k] = agree / (double)n;
  r->positions += n;
  return 0;
}

/* Mean and standard error of the mean over sequences. */
static void mean_se(const double *v, size_t n, double *mean, double *se) {
  double s = 0, ss = 0;
  for (size_t i = 0; i < n; i++) s += v[i];
  *mean = s / (double)n;
  for (size_t i = 0; i < n; i++) ss += (v[i] - *mean) * (v[i] - *mean);
  *se = n > 1 ? sqrt(ss / (double)(n - 1) / (double)n) : 0;
}

/* ---- output ------------------------------------------------------------------------- */

/* The text of the first sequence; BOS, which starts each story, as a
 * blank line between stories. */
static void eval_show(eval_run *r, const rm_tokenizer *t) {
  printf("sequence 1 (%u tokens):\n\n", r->lens[0]);
  for (uint32_t p = 0; p < r->lens[0]; p++) {
    uint32_t tok = r->seqs[0][p];
    if (tok == RM_BOS) fputs(p ? "\n\n" : "", stdout);
    else fputs(rm_tok_piece(t, p ? r->seqs[0][p - 1] : RM_BOS, tok), stdout);
  }
  printf("\n\n");
}

static void eval_print(eval_run *r) {
  double m[4] = {NAN, NAN, NAN, NAN}, se[4] = {NAN, NAN, NAN, NAN}, *delta = malloc(r->n_seqs * sizeof *delta);
  size_t ns = r->n_scored;
  for (size_t i = 0; delta && i < ns; i++) delta[i] = r->nll[i] - r->nll_full[i];
  mean_se(r->nll, ns, &m[0], &se[0]);
  if (delta) mean_se(delta, ns, &m[1], &se[1]);
  mean_se(r->kl, ns, &m[2], &se[2]);
  mean_se(r->top1, ns, &m[3], &se[3]);
  free(delta);
  const char *policy = r->oracle ? "oracle" : kvt_policy_name(r->pol.scorer);
  const char *codec = r->cfg.codec ? r->cfg.codec : "none";
  double kn = r->kept_n ? (double)r->kept_n : NAN, mn = r->missed_n ? (double)r->missed_n : NAN;
  double kept[4] = {r->kept_frac / kn, r->kept_tok_frac / kn, r->fmass ? r->missed / mn : 0,
                    r->fmass ? r->missed_h / mn : 0};
  uint32_t L = (uint32_t)r->m.c.n_layers;
  if (r->cfg.json) {
    json_w j;
    char key[16];
    json_begin(&j, stdout);
    json_str(&j, "model", r->m.name);
    json_u64(&j, "sequences", r->n_seqs);
    json_u64(&j, "sequences_scored", r->n_scored);
    json_u64(&j, "positions", r->positions);
    json_u64(&j, "first_target", EVAL_FIRST_TARGET);
    json_str(&j, "policy", policy);
    json_f64(&j, "budget", r->cfg.budget);
    json_str(&j, "codec", codec);
    json_f64(&j, "nll", m[0]);
    json_f64(&j, "nll_se", se[0]);
    json_f64(&j, "delta_nll", m[1]);
    json_f64(&j, "delta_nll_se", se[1]);
    json_f64(&j, "kl", m[2]);
    json_f64(&j, "kl_se", se[2]);
    json_f64(&j, "top1", m[3]);
    json_f64(&j, "top1_se", se[3]);
    json_f64(&j, "kept_fraction", kept[0]);
    json_f64(&j, "kept_tokens_fraction", kept[1]);
    json_f64(&j, "warm", r->pol.warm);
    json_f64(&j, "warm_tokens_fraction", r->warm_tok_frac / kn);
    json_u64(&j, "promotions", r->promotions);
    json_u64(&j, "promotions_exact", r->promotions_exact);
    json_u64(&j, "demotions", r->demotions);
    json_u64(&j, "positions_over_budget", r->over_positions);
    json_f64(&j, "missed_mass", kept[2]);
    json_f64(&j, "missed_mass_next32", kept[3]);
    json_u64(&j, "block_tokens", r->bt);
    json_u64(&j, "hot_layer_blocks", r->st.tier_blocks[KVT_TIER_HOT]);
    json_u64(&j, "warm_layer_blocks", r->st.tier_blocks[KVT_TIER_WARM]);
    json_u64(&j, "cold", (uint64_t)r->cfg.cold);
    json_u64(&j, "recall", (uint64_t)r->cfg.recall);
    json_u64(&j, "recalls", r->pst.recalls);
    json_u64(&j, "recall_useful", r->pst.recall_useful);
    json_u64(&j, "recall_unavailable", r->pst.recall_unavailable);
    json_u64(&j, "recall_late", r->pst.recall_late);
    json_u64(&j, "recall_bytes", r->pst.recall_bytes);
    json_f64(&j, "recall_ms", (double)r->pst.recall_ns * 1e-6);
    json_u64(&j, "cold_read_bytes", r->pst.cold_read_bytes);
    json_u64(&j, "dedup_mismatches", r->pst.dedup_mismatches);
    json_obj(&j, "layers");
    for (uint32_t l = 0; l < L; l++) {
      const layer_acc *a = &r->layers[l];
      snprintf(key, sizeof key, "%u", l);
      json_obj(&j, key);
      json_f64(&j, "top10_mass_share", a->steps ? a->top10 / (double)a->steps : NAN);
      json_f64(&j, "first_block_mass_share", a->steps ? a->first / (double)a->steps : NAN);
      json_end(&j);
    }
    json_end(&j);
    json_end(&j);
    return;
  }
  printf("model %s, %zu sequences (%zu long enough to score), %" PRIu64
         " target positions (>= %u)\n", r->m.name, r->n_seqs, r->n_scored, r->positions,
         EVAL_FIRST_TARGET);
  printf("policy %s, budget %.3g, codec %s\n\n", policy, r->cfg.budget, codec);
  printf("  nll        %8.4f  +- %.4f nats\n", m[0], se[0]);
  printf("  delta_nll  %8.4f  +- %.4f  (against the full cache)\n", m[1], se[1]);
  printf("  kl         %8.4f  +- %.4f  KL(full || this)\n", m[2], se[2]);
  printf("  top1       %8.4f  +- %.4f  agreement with the full cache\n", m[3], se[3]);
  printf("  kept       %8.4f  of the full cache's bytes (%.4f of its tokens), tail included\n",
         kept[0], kept[1]);
  printf("  warm       %8.4f  of the tokens warm (quantized, attended in place); %" PRIu64
         " promotions (%" PRIu64 " exact), %" PRIu64 " demotions\n",
         r->warm_tok_frac / kn, r->promotions, r->promotions_exact, r->demotions);
  printf("  over       %8" PRIu64 "  positions where sinks, window and tail alone exceed the budget\n",
         r->over_positions);
  printf("  missed     %8.4f  of the full cache's attention (%.4f over the next %u steps)\n",
         kept[2], kept[3], EVAL_HORIZON);
  printf("  engine     %" PRIu64 " layer blocks hot, %" PRIu64 " warm at the end\n",
         r->st.tier_blocks[KVT_TIER_HOT], r->st.tier_blocks[KVT_TIER_WARM]);
  if (r->cfg.recall)
    printf("  recall     %" PRIu64 " blocks recalled (%" PRIu64 " mattered, %" PRIu64
           " without a cold copy), %" PRIu64 " bytes read, %.1f ms\n",
           r->pst.recalls, r->pst.recall_useful, r->pst.recall_unavailable, r->pst.recall_bytes,
           (double)r->pst.recall_ns * 1e-6);
  printf("\n");
  printf("  layer  mass on top 10%% of blocks  mass on first block\n");
  for (uint32_t l = 0; l < L; l++) {
    const layer_acc *a = &r->layers[l];
    double st = a->steps ? (double)a->steps : NAN;
    printf("  %5u  %26.3f  %19.3f\n", l, a->top10 / st, a->first / st);
  }
}

/* ---- main ------------------------------------------------------------------------------ */

static void eval_free(eval_run *r) {
  if (r->pe != r->e) kvt_engine_close(r->pe);
  kvt_engine_close(r->e);
  ref_free_tokens(r->seqs, r->lens, r->n_seqs);
  free(r->nll);
  free(r->nll_full);
  free(r->kl);
  free(r->top1);
  free(r->layers);
  free(r->ret);
  free(r->sorted);
  free(r->knorm);
  free(r->fmass);
  free(r->keep);
  rm_model_free(&r->m);
}

static int eval_main(eval_run *r, const char *dir) {
  int rc = eval_sequences(r);
  if (rc != CLI_OK) return rc;
  if (r->cfg.show) {
    rm_tokenizer t;
    if ((rc = ref_load_tokenizer("eval", r->cfg.tokenizer, r->cfg.model, &r->m, &t)) != CLI_OK)
      return rc;
    eval_show(r, &t);
    rm_tok_free(&t);
  }
  if ((rc = eval_open(r, dir)) != CLI_OK) return rc;
  if (r->cfg.cold && (rc = eval_open_recall(r, dir)) != CLI_OK) return rc;
  size_t n = r->n_seqs, V = (size_t)r->m.c.vocab_size, S = (size_t)r->m.c.seq_len;
  r->nll = calloc(n, sizeof(double));
  r->nll_full = calloc(n, sizeof(double));
  r->kl = calloc(n, sizeof(double));
  r->top1 = calloc(n, sizeof(double));
  r->layers = calloc((size_t)r->m.c.n_layers, sizeof *r->layers);
  r->ret = calloc(S, sizeof *r->ret);
  r->sorted = calloc(S, sizeof *r->sorted);
  r->knorm = calloc(S, sizeof *r->knorm);
  r->fm_blocks = S / r->bt + 1;
  r->keep = calloc(r->fm_blocks, 1);

  double *lp = malloc(2 * V * sizeof *lp);
  if (!r->nll || !r->nll_full || !r->kl || !r->top1 || !r->layers || !r->ret || !r->sorted ||
      !r->knorm || !r->keep || !lp) {
    free(lp);
    return cli_lib_error("eval", "allocating", -ENOMEM);
  }
  if (r->pol.scorer != KVT_SCORER_FULL &&
      !(r->fmass = calloc(S * (size_t)r->m.c.n_layers * r->fm_blocks, sizeof *r->fmass))) {
    free(lp);
    return cli_lib_error("eval", "allocating", -ENOMEM);
  }
  if (r->cfg.trace) {
    trace_hdr h = {.n_layers = (uint32_t)r->m.c.n_layers, .n_q_heads = (uint32_t)r->m.c.n_heads,
                   .n_kv_heads = (uint32_t)r->m.c.n_kv_heads, .head_dim = r->m.head_dim,
                   .block_tokens = r->bt, .seq_len = (uint32_t)r->m.c.seq_len,
                   .scorer = r->pol.scorer, .hot_share = r->pol.budget};
    snprintf(h.model, sizeof h.model, "%s", r->m.name);
    if ((rc = trace_open(r->cfg.trace, &h, &r->tw))) {
      free(lp);
      fprintf(stderr, "kvtier eval: %s: %s\n", r->cfg.trace, strerror(-rc));
      return CLI_FAIL;
    }
  }
  if (r->cfg.logits && !(r->logits_f = fopen(r->cfg.logits, "wb"))) {
    free(lp);
    fprintf(stderr, "kvtier eval: %s: %s\n", r->cfg.logits, strerror(errno));
    return CLI_FAIL;
  }
  for (size_t i = 0; i < n && rc == CLI_OK; i++) {
    progress("eval: sequence %zu of %zu", i + 1, n);
    int e = eval_one(r, i, lp, lp + V);
    if (e) rc = cli_lib_error("eval", "decoding", e);
  }
  progress_end();
  free(lp);
  kvt_stats_get(r->e, &r->st);
  kvt_stats_get(r->pe, &r->pst);
  if (r->tw) {
    int e = trace_close(r->tw);
    r->tw = NULL;
    if (e && rc == CLI_OK) {
      fprintf(stderr, "kvtier eval: writing %s: %s\n", r->cfg.trace, strerror(-e));
      rc = CLI_FAIL;
    }
  }
  if (r->logits_f) {
    int bad = ferror(r->logits_f) | fclose(r->logits_f);
    r->logits_f = NULL;
    if (bad && rc == CLI_OK) {
      fprintf(stderr, "kvtier eval: writing %s: %s\n", r->cfg.logits, strerror(errno));
      rc = CLI_FAIL;
    }
  }
  if (rc == CLI_OK && r->positions == 0) {
    fprintf(stderr, "kvtier eval: no sequence is longer than %u tokens: nothing to score\n",
            EVAL_FIRST_TARGET);
    rc = CLI_FAIL;
  }
  if (rc == CLI_OK) eval_print(r);
  return rc;
}

int cmd_eval(int argc, char **argv) {
  eval_run *r = calloc(1, sizeof *r);
  if (!r) return cli_lib_error("eval", "allocating", -ENOMEM);
  cli_opt o[EVAL_N_OPTS];
  eval_opts(&r->cfg, o);
  r->cfg.seed = 1;
  int want_help = 0;
  int rc = cli_parse("eval", argc - 1, argv + 1, o, EVAL_N_OPTS, &want_help);
  if (want_help) eval_usage(stdout);
  if (rc == CLI_OK && !want_help) rc = eval_check(r);
  if (rc == CLI_OK && !want_help) rc = ref_load_model("eval", r->cfg.model, &r->m);
  if (rc == CLI_OK && !want_help) {
    bench_dir d;
    rc = bench_dir_open(&d, NULL, "eval");
    if (rc == CLI_OK) {
      rc = eval_main(r, d.path);
      if (r->pe != r->e) kvt_engine_close(r->pe);
      kvt_engine_close(r->e);
      r->e = r->pe = NULL;
      bench_dir_close(&d, "eval");
    }
  }
  if (r->tw) trace_close(r->tw);
  if (r->logits_f) fclose(r->logits_f);
  eval_free(r);
  free(r);
  return rc;
}
