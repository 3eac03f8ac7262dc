/* calibrate.c - `kvtier calibrate`: a per-layer policy profile (PolyKV-H,
 * DESIGN.md section 4; format in docs/policy.md) from full-cache attention
 * traces, or a PyramidKV-style one (--pyramid). Each layer's sensitivity is
 * the attention mass it loses under each scorer at each budget, replayed
 * through real engine sequences so that the engine's own scorers decide
 * (the learned one too: --predictor, and keys with the traced norms). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib.h"
#include "cmds.h"
#include "refcli.h"
#include "trace.h"
#include "util.h"

#define CAL_MAX_TRACES 16u
#define CAL_MAX_BUDGETS 8u
#define CAL_FIRST_TARGET 64u /* as kvtier eval: positions before it are not scored */
#define CAL_MAX_CFGS 1024u   /* scorers x grid points replayed at once */
#define CAL_PROFILE_VERSION 1u

typedef struct cal_cfg {
  const char *traces[CAL_MAX_TRACES];
  uint32_t n_traces;
  const char *out, *budget_s, *scorers_s, *sens_out, *model, *scorer_s, *ratio_s, *weights_s;
  const char *predictor; /* loaded for the replay namespace: "learned" can be measured */
  const char *objective; /* "mass" here; "nll" goes to calibrate_nll.c */
  uint64_t grid, block_tokens;
  int pyramid, json;
} cal_cfg;

/* One replayed configuration: a uniform scorer at one budget share. */
typedef struct cal_run_cfg {
  uint32_t scorer, g;
  kvt_seq *s;
} cal_run_cfg;

typedef struct cal_run {
  cal_cfg cfg;
  double budgets[CAL_MAX_BUDGETS];
  uint32_t n_budgets;
  uint32_t scorers[CALIB_MAX_SCORERS], n_scorers;
  double grid[CALIB_MAX_GRID];
  trace_hdr h;                /* of the first trace; the others must match */
  char model[64];
  kvt_engine *e;
  kvt_ns_id ns;
  cal_run_cfg *cfgs;
  uint32_t n_cfgs;
  double *lost, *steps;       /* [layer][scorer][g] sums and counts */
  double *weighted;           /* lost, times --layer-weights */
  uint64_t sequences, records;
  uint32_t next_token;        /* dummy tokens: never repeat, so nothing is adopted */
  uint32_t *blocks_put;       /* per cfg: token blocks appended so far */
  float *kv_zero, *k_norm, *mass;
  kvt_gathered *ret;
  trace_entry *ent;           /* one step's records: [layer][block] */
  trace_rec recs[CALIB_MAX_LAYERS];
  uint8_t have[CALIB_MAX_LAYERS]; /* the step has layer l's record */
} cal_run;

#define CAL_N_OPTS 15

static void cal_opts(cal_cfg *c, cli_opt o[CAL_N_OPTS]) {
  const cli_opt opts[CAL_N_OPTS] = {
      {"--budget", "F[,F..]", CLI_STR, &c->budget_s, 0, 0,
       "total budget(s), fractions of the full cache in (0, 1] (required)"},
      {"--out", "PROFILE", CLI_STR, &c->out, 0, 0, "write the profile here (also -o; required)"},
      {"--scorers", "LIST", CLI_STR, &c->scorers_s, 0, 0,
       "comma-separated scorers to choose from (default: every built-in one)"},
      {"--grid", "N", CLI_U64, &c->grid, 2, CALIB_MAX_GRID,
       "budget shares measured per layer: 1/N, 2/N, .., 1 (default 40)"},
      {"--sensitivity", "FILE", CLI_STR, &c->sens_out, 0, 0,
       "write the measured lost mass per (layer, scorer, share) as JSON"},
      {"--layer-weights", "W,..", CLI_STR, &c->weights_s, 0, 0,
       "weigh each layer's lost mass (e.g. its delta NLL per unit of lost mass; default 1)"},
      {"--pyramid", NULL, CLI_FLAG, &c->pyramid, 0, 0,
       "write a PyramidKV profile instead: shares falling linearly with depth"},
      {"--scorer", "S", CLI_STR, &c->scorer_s, 0, 0,
       "with --pyramid: the scorer of every layer (default snapkv, as PyramidKV)"},
      {"--ratio", "R", CLI_STR, &c->ratio_s, 0, 0,
       "with --pyramid: last layer's share over the first's, (0, 1] (default 0.333)"},
      {"--model", "M", CLI_STR, &c->model, 0, 0,
       "with --pyramid: take the shape from this checkpoint instead of a trace"},
      {"--block-tokens", "N", CLI_U64, &c->block_tokens, 1, 256,
       "with --pyramid --model: tokens per block (default 16)"},
      {"--predictor", "P", CLI_STR, &c->predictor, 0, 0,
       "the learned scorer's model (kvtier train): measure \"learned\" too"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the summary as one JSON object"},
      {"--objective", "mass", CLI_STR, &c->objective, 0, 0,
       "mass (default): lost attention mass from traces; nll: the model's loss (below)"},
      {"--trace", "T", CLI_STR, NULL, 0, 0,
       "a full-cache trace (kvtier eval --policy full --dump-trace T); repeat for more"},
  };
  memcpy(o, opts, sizeof opts);
}

void calibrate_usage(FILE *f) {
  cal_cfg c;
  cli_opt o[CAL_N_OPTS];
  cal_opts(&c, o);
  fprintf(f,
          "usage: kvtier calibrate --trace T [--trace T2..] --budget F[,F..] -o PROFILE\n"
          "                        [--scorers LIST] [--grid N] [--sensitivity FILE]\n"
          "                        [--layer-weights W,..] [--predictor P] [--json]\n"
          "       kvtier calibrate --pyramid (--trace T | --model M [--block-tokens N])\n"
          "                        --budget F[,F..] -o PROFILE [--scorer S] [--ratio R]\n\n"
          "Chooses per layer a scorer and a budget share (docs/policy.md, \"Profiles\").\n"
          "Replays the traces' steps through engine sequences, one per (scorer, share),\n"
          "each layer observing the full-cache masses of the blocks it still retains,\n"
          "and measures per layer the full-cache attention mass on blocks no longer\n"
          "retained (positions >= %u). With --predictor, \"learned\" is measured too:\n"
          "the blocks put carry the key norms the trace recorded (version 2).\n"
          "Then, for each total budget, gives out the\n"
          "layers' shares by greedy marginal gain (mean share = the budget, none above\n"
          "1) and writes the profile (JSON, version %u). Calibrate on sequences other\n"
          "than those you evaluate on.\n\noptions:\n",
          CAL_FIRST_TARGET, CAL_PROFILE_VERSION);
  cli_print_opts(f, o, CAL_N_OPTS);
  fprintf(f, "\n");
  calibrate_nll_usage(f);
}

static int usage_error(const char *msg, const char *arg) {
  fprintf(stderr, "kvtier calibrate: %s%s%s\nrun 'kvtier help calibrate' for its options\n", msg,
          arg ? ": " : "", arg ? arg : "");
  return CLI_USAGE;
}

/* ---- options ------------------------------------------------------------------ */

/* Take the repeatable --trace and the short -o out of argv before
 * cli_parse sees the rest. */
static int cal_split_args(cal_cfg *c, int argc, char **argv, char **rest, int *n_rest) {
  *n_rest = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *val = NULL;
    if (strcmp(a, "--trace") == 0 || strcmp(a, "-o") == 0) {
      if (i + 1 >= argc) return usage_error("needs a value", a);
      val = argv[++i];
    } else if (strncmp(a, "--trace=", 8) == 0) {
      val = a + 8;
    } else {
      rest[(*n_rest)++] = argv[i];
      continue;
    }
    if (a[1] == 'o') {
      c->out = val;
      continue;
    }
    if (c->n_traces == CAL_MAX_TRACES) return usage_error("too many --trace (at most 16)", val);
    c->traces[c->n_traces++] = val;
  }
  return CLI_OK;
}

static int parse_budgets(cal_run *r) {
  const char *p = r->cfg.budget_s;
  while (*p) {
    char *end;
    double b = strtod(p, &end);
    if (end == p || !(b > 0 && b <= 1) || (*end && *end != ','))
      return usage_error("--budget takes fractions in (0, 1], comma-separated", r->cfg.budget_s);
    if (r->n_budgets == CAL_MAX_BUDGETS) return usage_error("at most 8 budgets", r->cfg.budget_s);
    r->budgets[r->n_budgets++] = b;
    p = *end ? end + 1 : end;
  }
  return r->n_budgets ? CLI_OK : usage_error("--budget is empty", NULL);
}

/* Scorers a replay can run: not "full" (no budget), "external" (the
 * caller's scores) or "auto" (a profile); "learned" only with --predictor
 * (the replay's keys carry the traced norms, its other features are the
 * observations). */
static int scorer_measurable(uint32_t id, int have_predictor) {
  return id != KVT_SCORER_FULL && id != KVT_SCORER_EXTERNAL && id != KVT_SCORER_AUTO &&
         (id != KVT_SCORER_LEARNED || have_predictor) && kvt_policy_name(id);
}

/* The scorers to choose from: the list, or every measurable one. */
static int parse_scorers(cal_run *r) {
  if (!r->cfg.scorers_s) {
    for (uint32_t i = 0; kvt_policy_name(i) && r->n_scorers < CALIB_MAX_SCORERS; i++)
      if (scorer_measurable(i, r->cfg.predictor != NULL)) r->scorers[r->n_scorers++] = i;
    return CLI_OK;
  }
  char buf[256];
  snprintf(buf, sizeof buf, "%s", r->cfg.scorers_s);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    uint32_t id = UINT32_MAX;
    if (kvt_policy_parse(t, &id) || !scorer_measurable(id, r->cfg.predictor != NULL))
      return usage_error(id == KVT_SCORER_LEARNED ? "--scorers learned needs --predictor P"
                                                  : "--scorers takes recent, sink-recent, h2o, "
                                                    "snapkv, tova, learned (with --predictor)",
                         t);
    if (r->n_scorers == CALIB_MAX_SCORERS) return usage_error("too many --scorers", t);
    r->scorers[r->n_scorers++] = id;
  }
  return r->n_scorers ? CLI_OK : usage_error("--scorers is empty", NULL);
}

static int cal_check(cal_run *r) {
  cal_cfg *c = &r->cfg;
  if (c->objective && strcmp(c->objective, "mass") != 0)
    return usage_error("--objective takes mass or nll", c->objective);
  if (!c->budget_s) return usage_error("--budget is required", NULL);
  if (!c->out) return usage_error("-o PROFILE is required", NULL);
  int rc = parse_budgets(r);
  if (rc == CLI_OK) rc = parse_scorers(r);
  if (rc != CLI_OK) return rc;
  if (c->pyramid) {
    if (!c->n_traces && !c->model) return usage_error("--pyramid needs --trace or --model", NULL);
    if (c->block_tokens && (!c->model || (c->block_tokens & (c->block_tokens - 1))))
      return usage_error("--block-tokens goes with --model, a power of two", NULL);
    if (c->sens_out || c->scorers_s || c->grid || c->weights_s || c->predictor)
      return usage_error("--pyramid measures nothing: no --scorers, --grid, --sensitivity, "
                         "--layer-weights or --predictor", NULL);
    return CLI_OK;
  }
  if (c->scorer_s || c->ratio_s || c->model || c->block_tokens)
    return usage_error("--scorer, --ratio, --model and --block-tokens go with --pyramid", NULL);
  if (!c->n_traces) return usage_error("at least one --trace is required", NULL);
  uint64_t n = c->grid ? c->grid : 40;
  r->cfg.grid = n;
  for (uint32_t g = 0; g < n; g++) r->grid[g] = (double)(g + 1) / (double)n;
  if (n * r->n_scorers > CAL_MAX_CFGS) return usage_error("--grid times scorers is over 1024", NULL);
  return CLI_OK;
}

/* ---- traces -------------------------------------------------------------------------- */

static int trace_error(const char *path, const char *what) {
  fprintf(stderr, "kvtier calibrate: %s: %s\n", path, what);
  return CLI_FAIL;
}

/* Open a trace and check it is a full-cache one of the same shape as the
 * first. */
static int open_trace(cal_run *r, uint32_t i, FILE **out) {
  const char *path = r->cfg.traces[i];
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "kvtier calibrate: %s: %s\n", path, strerror(errno));
    return CLI_FAIL;
  }
  trace_hdr h;
  int rc = trace_read_hdr(f, &h);
  if (rc) {
    fclose(f);
    return trace_error(path, "not an attention trace of version 1 or 2 (docs/trace-format.md)");
  }
  if (h.scorer != KVT_SCORER_FULL || h.hot_share != 1.0) { /* hot_share: the budget */
    fclose(f);
    return trace_error(path, "not a full-cache trace: make it with kvtier eval --policy full");
  }
  if (h.n_layers == 0 || h.n_layers > CALIB_MAX_LAYERS || h.n_kv_heads == 0 ||
      h.head_dim == 0 || h.head_dim > KVT_MAX_HEAD_DIM || h.seq_len == 0 ||
      h.seq_len > (1u << 20)) {
    fclose(f);
    return trace_error(path, "its shape is out of range");
  }
  if (i == 0) {
    r->h = h;
  } else if (h.n_layers != r->h.n_layers || h.n_kv_heads != r->h.n_kv_heads ||
             h.head_dim != r->h.head_dim || h.block_tokens != r->h.block_tokens ||
             h.n_q_heads != r->h.n_q_heads || h.version != r->h.version ||
             strcmp(h.model, r->h.model)) {
    fclose(f);
    return trace_error(path, "another model, shape or trace version than the first --trace");
  }
  *out = f;
  return CLI_OK;
}

/* ---- replay ---------------------------------------------------------------------------- */

static int cal_open_engine(cal_run *r, const char *dir) {
  kvt_options o;
  kvt_options_init(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = 512u << 20;
  if (o.max_seqs < r->n_cfgs) o.max_seqs = r->n_cfgs;
  uint32_t max_blocks = r->h.seq_len / r->h.block_tokens + 1;
  if (o.max_seq_blocks < max_blocks) o.max_seq_blocks = max_blocks;
  int rc = cli_engine_open(dir, &o, &r->e);
  kvt_ns_desc d = {.model_id = "kvtier-calibrate/replay", .weights_fingerprint = "none",
                   .rope_theta = 10000.0, .tp_size = 1,
                   .shape = {.n_layers = r->h.n_layers, .n_kv_heads = r->h.n_kv_heads,
                             .head_dim = r->h.head_dim, .dtype = KVT_F32,
                             .block_tokens = r->h.block_tokens}};
  if (!rc) rc = kvt_ns_register(r->e, &d, &r->ns);
  if (rc) return cli_engine_error("calibrate", "opening the replay engine", r->e, rc);
  if (r->cfg.predictor && (rc = kvt_ns_load_predictor(r->e, r->ns, r->cfg.predictor)))
    return cli_engine_error("calibrate", r->cfg.predictor, r->e, rc);
  if (r->cfg.predictor && r->h.version < 2)
    fprintf(stderr, "kvtier calibrate: note: %s is a version-1 trace (no key norms): "
                    "\"learned\" is replayed with key norm 0\n", r->cfg.traces[0]);
  return CLI_OK;
}

static void cal_release(cal_run *r) {
  for (uint32_t c = 0; c < r->n_cfgs; c++) {
    kvt_seq_release(r->cfgs[c].s);
    r->cfgs[c].s = NULL;
  }
}

/* New sequences for the next traced sequence, one per configuration. */
static int cal_begin_seq(cal_run *r) {
  cal_release(r);
  for (uint32_t c = 0; c < r->n_cfgs; c++) {
    kvt_policy p;
    kvt_policy_init(&p);
    p.scorer = r->scorers[r->cfgs[c].scorer];
    p.budget = r->grid[r->cfgs[c].g];
    int rc = kvt_seq_create(r->e, r->ns, &r->cfgs[c].s);
    if (!rc) rc = kvt_seq_set_policy(r->cfgs[c].s, &p);
    if (rc) return cli_engine_error("calibrate", "creating a replay sequence", r->e, rc);
    r->blocks_put[c] = 0;
  }
  r->sequences++;
  return CLI_OK;
}

/* The keys of one (block, layer) put by the replay: every key vector is
 * (norm, 0, ..), so the mean L2 norm the engine takes at put
 * (kvt_bstate.key_norm, a learned feature) is the one the trace recorded
 * for that block and layer (0 when the step has no such entry). Attention
 * never reads them: the replay observes the traced masses. */
static const float *cal_keys(cal_run *r, uint32_t block, uint32_t layer) {
  uint32_t maxb = r->h.seq_len / r->h.block_tokens + 1;
  float norm = r->have[layer] && block < r->recs[layer].n_blocks
                   ? r->ent[(size_t)layer * maxb + block].key_norm
                   : 0;
  if (!(norm >= 0) || !isfinite(norm)) norm = 0;
  size_t rows = (size_t)r->h.block_tokens * r->h.n_kv_heads;
  for (size_t i = 0; i < rows; i++) r->k_norm[i * r->h.head_dim] = norm;
  return r->k_norm;
}

/* Append and put every block complete before query position pos, as the
 * reference decoder does after the step that fills a block (keys from
 * cal_keys, values zero); then the length, tail included, that the budget
 * counts at this step. */
static int cal_fill(cal_run *r, uint32_t c, uint32_t pos) {
  uint32_t bt = r->h.block_tokens, need = pos / bt;
  uint32_t tok[KVT_MAX_BLOCK_TOKENS];
  kvt_kv kv = {.k = r->kv_zero, .v = r->kv_zero, .dtype = KVT_F32, .n_tokens = bt,
               .n_heads = r->h.n_kv_heads, .head_dim = r->h.head_dim};
  while (r->blocks_put[c] < need) {
    kvt_append_info info;
    for (uint32_t i = 0; i < bt; i++) tok[i] = r->next_token++;
    int rc = kvt_seq_append(r->cfgs[c].s, tok, bt, &info);
    for (uint32_t l = 0; !rc && l < r->h.n_layers; l++) {
      kv.k = cal_keys(r, r->blocks_put[c], l);
      rc = kvt_seq_put(r->cfgs[c].s, info.block, l, &kv);
    }
    if (rc) return cli_engine_error("calibrate", "putting a replay block", r->e, rc);
    r->blocks_put[c]++;
  }
  int rc = kvt_seq_set_tokens(r->cfgs[c].s, (uint64_t)pos + 1);
  return rc ? cli_engine_error("calibrate", "setting the length", r->e, rc) : CLI_OK;
}

/* One traced record (every block of a layer at one step, full cache) for
 * one configuration: count the mass on blocks it no longer retains, then
 * observe the retained ones' masses, scaled to the full total (each query
 * head's softmax would renormalize over what is left). */
static int cal_step(cal_run *r, uint32_t c, const trace_rec *rec, const trace_entry *ent) {
  cal_run_cfg *k = &r->cfgs[c];
  size_t n = 0;
  int rc = kvt_seq_retained(k->s, rec->layer, r->ret, rec->n_blocks, &n);
  if (rc) return cli_engine_error("calibrate", "listing retained blocks", r->e, rc);
  double total = 0, kept = 0;
  for (uint32_t i = 0; i < rec->n_blocks; i++) total += ent[i].mass;
  for (size_t i = 0; i < n; i++) {
    uint32_t b = r->ret[i].block;
    r->mass[i] = b < rec->n_blocks ? ent[b].mass : 0;
    kept += r->mass[i];
  }
  if (rec->pos + 1 >= CAL_FIRST_TARGET && total > 0) {
    size_t at = ((size_t)rec->layer * r->n_scorers + k->scorer) * r->cfg.grid + k->g;
    r->lost[at] += (total - kept) / total;
    r->steps[at] += 1;
  }
  float scale = kept > 0 ? (float)(total / kept) : 1.0f;
  for (size_t i = 0; i < n; i++) r->mass[i] *= scale;
  rc = kvt_seq_observe(k->s, rec->layer, r->mass, n);
  return rc ? cli_engine_error("calibrate", "observing", r->e, rc) : CLI_OK;
}

/* One step, every layer's record read: for each configuration, the blocks
 * and length first (their keys need every layer's record), then each
 * layer's record in order. */
static int cal_run_step(cal_run *r, uint32_t pos) {
  uint32_t maxb = r->h.seq_len / r->h.block_tokens + 1;
  int rc = CLI_OK;
  for (uint32_t c = 0; rc == CLI_OK && c < r->n_cfgs; c++) {
    rc = cal_fill(r, c, pos);
    for (uint32_t l = 0; rc == CLI_OK && l < r->h.n_layers; l++)
      if (r->have[l]) rc = cal_step(r, c, &r->recs[l], r->ent + (size_t)l * maxb);
  }
  memset(r->have, 0, sizeof r->have);
  return rc;
}

static int cal_replay_trace(cal_run *r, FILE *f, const char *path) {
  trace_rec rec;
  uint32_t cur_seq = UINT32_MAX, cur_pos = UINT32_MAX, maxb = r->h.seq_len / r->h.block_tokens + 1;
  int got = 0, rc = CLI_OK, open = 0;
  while (rc == CLI_OK && (got = trace_read_rec(f, &rec)) == 1) {
    if (rec.layer >= r->h.n_layers || rec.n_blocks > maxb || rec.pos >= r->h.seq_len ||
        rec.n_blocks != rec.pos / r->h.block_tokens)
      return trace_error(path, "a record does not fit the header or is not full-cache");
    if (open && (rec.seq != cur_seq || rec.pos != cur_pos)) { /* the step before is whole */
      open = 0;
      if ((rc = cal_run_step(r, cur_pos)) != CLI_OK) break;
    }
    trace_entry *ent = r->ent + (size_t)rec.layer * maxb;
    if (trace_read_entries(f, &r->h, &rec, ent)) return trace_error(path, "truncated");
    for (uint32_t i = 0; i < rec.n_blocks; i++)
      if (ent[i].block != i) return trace_error(path, "a record misses blocks: not full-cache");
    if (r->have[rec.layer]) return trace_error(path, "a step has a layer's record twice");
    if (rec.seq != cur_seq) {
      cur_seq = rec.seq;
      progress("calibrate: %s: sequence %u", path, cur_seq);
      rc = cal_begin_seq(r);
    }
    cur_pos = rec.pos;
    r->recs[rec.layer] = rec;
    r->have[rec.layer] = 1;
    open = 1;
    r->records++;
  }
  if (rc == CLI_OK && open) rc = cal_run_step(r, cur_pos);
  if (rc == CLI_OK && got < 0) return trace_error(path, "truncated or a bad record");
  return rc;
}

static int cal_measure(cal_run *r, const char *dir) {
  FILE *f = NULL;
  int rc = open_trace(r, 0, &f);
  if (rc != CLI_OK) return rc;
  fclose(f);
  r->n_cfgs = r->n_scorers * (uint32_t)r->cfg.grid;
  size_t cells = (size_t)r->h.n_layers * r->n_cfgs, maxb = r->h.seq_len / r->h.block_tokens + 1;
  size_t each = (size_t)r->h.block_tokens * r->h.n_kv_heads * r->h.head_dim;
  r->cfgs = calloc(r->n_cfgs, sizeof *r->cfgs);
  r->blocks_put = calloc(r->n_cfgs, sizeof *r->blocks_put);
  r->lost = calloc(cells, sizeof *r->lost);
  r->steps = calloc(cells, sizeof *r->steps);
  r->kv_zero = calloc(each, sizeof *r->kv_zero);
  r->k_norm = calloc(each, sizeof *r->k_norm);
  r->mass = calloc(maxb, sizeof *r->mass);
  r->ret = calloc(maxb, sizeof *r->ret);
  r->ent = calloc(maxb * r->h.n_layers, sizeof *r->ent);
  if (!r->cfgs || !r->blocks_put || !r->lost || !r->steps || !r->kv_zero || !r->k_norm ||
      !r->mass || !r->ret || !r->ent)
    return cli_lib_error("calibrate", "allocating", -ENOMEM);
  for (uint32_t s = 0, c = 0; s < r->n_scorers; s++)
    for (uint32_t g = 0; g < r->cfg.grid; g++, c++) r->cfgs[c] = (cal_run_cfg){.scorer = s, .g = g};
  if ((rc = cal_open_engine(r, dir)) != CLI_OK) return rc;
  for (uint32_t i = 0; rc == CLI_OK && i < r->cfg.n_traces; i++) {
    if ((rc = open_trace(r, i, &f)) != CLI_OK) break;
    rc = cal_replay_trace(r, f, r->cfg.traces[i]);
    fclose(f);
  }
  cal_release(r);
  progress_end();
  if (rc == CLI_OK && r->sequences == 0)
    return trace_error(r->cfg.traces[0], "no records: nothing to calibrate on");
  for (size_t i = 0; i < cells; i++) r->lost[i] = r->steps[i] > 0 ? r->lost[i] / r->steps[i] : 0;
  return rc;
}

/* ---- the profile ------------------------------------------------------------------------ */

typedef struct cal_choice {
  double budget;
  double share[CALIB_MAX_LAYERS];
  uint32_t scorer[CALIB_MAX_LAYERS]; /* kvt_scorer_id */
  double lost;                       /* mean over layers of the measured loss (NAN: none) */
} cal_choice;

/* Written by hand (util.h's escaping for the model name): the file is
 * small and its layout is the documented one. */
static int write_profile(const cal_run *r, const cal_choice *ch, uint32_t n, const char *how) {
  FILE *f = fopen(r->cfg.out, "w");
  if (!f) {
    fprintf(stderr, "kvtier calibrate: %s: %s\n", r->cfg.out, strerror(errno));
    return CLI_FAIL;
  }
  fprintf(f, "{\n  \"format\": \"kvtier-profile\",\n  \"version\": %u,\n  \"model\": ",
          CAL_PROFILE_VERSION);
  json_string(f, r->model);
  fprintf(f, ",\n  \"method\": ");
  json_string(f, how);
  fprintf(f, ",\n  \"shape\": {\"n_layers\": %u, \"n_kv_heads\": %u, \"head_dim\": %u, "
             "\"block_tokens\": %u},\n  \"profiles\": [",
          r->h.n_layers, r->h.n_kv_heads, r->h.head_dim, r->h.block_tokens);
  for (uint32_t i = 0; i < n; i++) {
    fprintf(f, "%s\n    {\"budget\": %.6g, \"layers\": [", i ? "," : "", ch[i].budget);
    for (uint32_t l = 0; l < r->h.n_layers; l++)
      fprintf(f, "%s\n      {\"scorer\": \"%s\", \"share\": %.9f}", l ? "," : "",
              kvt_policy_name(ch[i].scorer[l]), ch[i].share[l]);
    fprintf(f, "\n    ]}");
  }
  fprintf(f, "\n  ]\n}\n");
  if (ferror(f) | fclose(f)) {
    fprintf(stderr, "kvtier calibrate: writing %s failed\n", r->cfg.out);
    return CLI_FAIL;
  }
  return CLI_OK;
}

static int write_sensitivity(const cal_run *r) {
  FILE *f = fopen(r->cfg.sens_out, "w");
  if (!f) {
    fprintf(stderr, "kvtier calibrate: %s: %s\n", r->cfg.sens_out, strerror(errno));
    return CLI_FAIL;
  }
  fprintf(f, "{\"what\": \"mean share of full-cache attention mass on blocks not retained\",\n"
             " \"shares\": [");
  for (uint32_t g = 0; g < r->cfg.grid; g++) fprintf(f, "%s%.6g", g ? ", " : "", r->grid[g]);
  fprintf(f, "],\n \"layers\": [");
  for (uint32_t l = 0; l < r->h.n_layers; l++) {
    fprintf(f, "%s\n  {", l ? "," : "");
    for (uint32_t s = 0; s < r->n_scorers; s++) {
      fprintf(f, "%s\"%s\": [", s ? ",\n   " : "", kvt_policy_name(r->scorers[s]));
      for (uint32_t g = 0; g < r->cfg.grid; g++)
        fprintf(f, "%s%.6f", g ? ", " : "",
                r->lost[((size_t)l * r->n_scorers + s) * r->cfg.grid + g]);
      fprintf(f, "]");
    }
    fprintf(f, "}");
  }
  fprintf(f, "\n]}\n");
  if (ferror(f) | fclose(f)) {
    fprintf(stderr, "kvtier calibrate: writing %s failed\n", r->cfg.sens_out);
    return CLI_FAIL;
  }
  return CLI_OK;
}

static void print_summary(const cal_run *r, const cal_choice *ch, uint32_t n) {
  if (r->cfg.json) {
    json_w j;
    char key[32];
    json_begin(&j, stdout);
    json_str(&j, "profile", r->cfg.out);
    json_u64(&j, "sequences", r->sequences);
    json_u64(&j, "records", r->records);
    json_obj(&j, "budgets");
    for (uint32_t i = 0; i < n; i++) {
      snprintf(key, sizeof key, "%g", ch[i].budget);
      json_obj(&j, key);
      json_f64(&j, "lost_mass", ch[i].lost);
      json_end(&j);
    }
    json_end(&j);
    json_end(&j);
    return;
  }
  printf("profile %s for %s (%u layers, %u KV heads of %u, %u tokens a block)",
         r->cfg.out, r->model, r->h.n_layers, r->h.n_kv_heads, r->h.head_dim, r->h.block_tokens);
  if (r->sequences) printf(", from %" PRIu64 " traced sequences", r->sequences);
  printf("\n");
  for (uint32_t i = 0; i < n; i++) {
    printf("\nbudget %g", ch[i].budget);
    if (!isnan(ch[i].lost)) printf(": lost attention mass %.4f (mean over layers)", ch[i].lost);
    printf("\n  layer  scorer        share\n");
    for (uint32_t l = 0; l < r->h.n_layers; l++)
      printf("  %5u  %-12s  %.4f\n", l, kvt_policy_name(ch[i].scorer[l]), ch[i].share[l]);
  }
}

/* --layer-weights: one non-negative weight per layer, applied to the
 * measured losses before the allocation (the written sensitivity stays
 * unweighted: it is taken after). */
static int apply_weights(cal_run *r) {
  if (!r->cfg.weights_s) return CLI_OK;
  const char *p = r->cfg.weights_s;
  for (uint32_t l = 0; l < r->h.n_layers; l++) {
    char *end;
    double w = strtod(p, &end);
    if (end == p || !(w >= 0) || !isfinite(w) || (*end && *end != ','))
      return usage_error("--layer-weights takes one weight >= 0 per layer, comma-separated",
                         r->cfg.weights_s);
    for (size_t i = 0; i < (size_t)r->n_scorers * r->cfg.grid; i++)
      r->weighted[(size_t)l * r->n_scorers * r->cfg.grid + i] *= w;
    p = *end ? end + 1 : end;
    if (!*end && l + 1 < r->h.n_layers)
      return usage_error("--layer-weights has fewer weights than layers", r->cfg.weights_s);
  }
  return *p ? usage_error("--layer-weights has more weights than layers", r->cfg.weights_s)
            : CLI_OK;
}

static int cal_calibrate(cal_run *r, cal_choice *ch) {
  size_t cells = (size_t)r->h.n_layers * r->n_scorers * r->cfg.grid;
  if (!(r->weighted = malloc(cells * sizeof *r->weighted)))
    return cli_lib_error("calibrate", "allocating", -ENOMEM);
  memcpy(r->weighted, r->lost, cells * sizeof *r->weighted);
  int wrc = apply_weights(r);
  if (wrc != CLI_OK) return wrc;
  calib_table t = {.n_layers = r->h.n_layers, .n_scorers = r->n_scorers,
                   .n_grid = (uint32_t)r->cfg.grid, .grid = r->grid, .loss = r->weighted};
  calib_table raw = t;
  raw.loss = r->lost;
  for (uint32_t i = 0; i < r->n_budgets; i++) {
    uint32_t pick[CALIB_MAX_LAYERS];
    ch[i].budget = r->budgets[i];
    if (calib_allocate(&t, r->budgets[i], 1.0 / (double)r->cfg.grid, ch[i].share, pick))
      return usage_error("the allocation refused its arguments", NULL);
    ch[i].lost = 0;
    for (uint32_t l = 0; l < r->h.n_layers; l++) {
      ch[i].scorer[l] = r->scorers[pick[l]];
      ch[i].lost += calib_loss_at(&raw, l, pick[l], ch[i].share[l]) / r->h.n_layers;
    }
  }
  return CLI_OK;
}

static int cal_pyramid(cal_run *r, cal_choice *ch) {
  uint32_t scorer = KVT_SCORER_SNAPKV;
  if (r->cfg.scorer_s && (kvt_policy_parse(r->cfg.scorer_s, &scorer) || scorer == KVT_SCORER_FULL ||
                          scorer == KVT_SCORER_AUTO))
    return usage_error("unknown --scorer (not full or auto)", r->cfg.scorer_s);
  double ratio = 1.0 / 3;
  char *end = NULL;
  if (r->cfg.ratio_s && (ratio = strtod(r->cfg.ratio_s, &end), *end || !(ratio > 0 && ratio <= 1)))
    return usage_error("--ratio must be in (0, 1]", r->cfg.ratio_s);
  if (r->cfg.model) {
    rm_model m;
    int rc = ref_load_model("calibrate", r->cfg.model, &m);
    if (rc != CLI_OK) return rc;
    r->h = (trace_hdr){.n_layers = (uint32_t)m.c.n_layers, .n_kv_heads = (uint32_t)m.c.n_kv_heads,
                       .head_dim = m.head_dim,
                       .block_tokens = r->cfg.block_tokens ? (uint32_t)r->cfg.block_tokens
                                                           : REF_BLOCK_TOKENS};
    snprintf(r->h.model, sizeof r->h.model, "%s", m.name);
    rm_model_free(&m);
  } else {
    FILE *f = NULL;
    int rc = open_trace(r, 0, &f);
    if (rc != CLI_OK) return rc;
    fclose(f);
  }
  for (uint32_t i = 0; i < r->n_budgets; i++) {
    ch[i].budget = r->budgets[i];
    ch[i].lost = NAN;
    if (calib_pyramid(r->h.n_layers, r->budgets[i], ratio, ch[i].share))
      return usage_error("the pyramid refused its arguments", NULL);
    for (uint32_t l = 0; l < r->h.n_layers; l++) ch[i].scorer[l] = scorer;
  }
  return CLI_OK;
}

static void cal_free(cal_run *r) {
  cal_release(r);
  kvt_engine_close(r->e);
  free(r->cfgs);
  free(r->blocks_put);
  free(r->lost);
  free(r->weighted);
  free(r->steps);
  free(r->kv_zero);
  free(r->k_norm);
  free(r->mass);
  free(r->ret);
  free(r->ent);
}

static int cal_main(cal_run *r) {
  cal_choice *ch = calloc(r->n_budgets, sizeof *ch);
  if (!ch) return cli_lib_error("calibrate", "allocating", -ENOMEM);
  int rc;
  const char *how;
  if (r->cfg.pyramid) {
    rc = cal_pyramid(r, ch);
    how = "pyramid: shares linear in depth";
  } else {
    bench_dir d;
    rc = bench_dir_open(&d, NULL, "calibrate");
    if (rc == CLI_OK) {
      rc = cal_measure(r, d.path);
      kvt_engine_close(r->e);
      r->e = NULL;
      bench_dir_close(&d, "calibrate");
    }
    if (rc == CLI_OK) rc = cal_calibrate(r, ch);
    if (rc == CLI_OK && r->cfg.sens_out) rc = write_sensitivity(r);
    how = "greedy marginal gain on lost attention mass";
  }
  snprintf(r->model, sizeof r->model, "%s", r->h.model);
  if (rc == CLI_OK) rc = write_profile(r, ch, r->n_budgets, how);
  if (rc == CLI_OK) print_summary(r, ch, r->n_budgets);
  free(ch);
  return rc;
}

/* --objective nll (calibrate_nll.c) runs the model instead of replaying
 * traces; --objective mass is the default, this file. */
static int objective_nll(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--objective=nll") == 0) return 1;
    if (strcmp(argv[i], "--objective") == 0 && i + 1 < argc) return strcmp(argv[i + 1], "nll") == 0;
  }
  return 0;
}

int cmd_calibrate(int argc, char **argv) {
  if (objective_nll(argc, argv)) return calibrate_nll(argc, argv);
  cal_run *r = calloc(1, sizeof *r);
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  if (!r || !rest) {
    free(r);
    free(rest);
    return cli_lib_error("calibrate", "allocating", -ENOMEM);
  }
  cli_opt o[CAL_N_OPTS];
  cal_opts(&r->cfg, o);
  int n_rest = 0, want_help = 0;
  int rc = cal_split_args(&r->cfg, argc - 1, argv + 1, rest, &n_rest);
  if (rc == CLI_OK) rc = cli_parse("calibrate", n_rest, rest, o, CAL_N_OPTS - 1, &want_help);
  if (want_help) calibrate_usage(stdout);
  if (rc == CLI_OK && !want_help) rc = cal_check(r);
  if (rc == CLI_OK && !want_help) rc = cal_main(r);
  cal_free(r);
  free(r);
  free(rest);
  return rc;
}
