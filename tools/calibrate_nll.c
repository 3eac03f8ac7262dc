/* calibrate_nll.c - `kvtier calibrate --objective nll`: a per-layer profile
 * (scorer, budget share, warm part) chosen by the model's own loss. Every
 * candidate is run through the reference decoder on calibration sequences,
 * as `kvtier eval --policy auto --profile` runs it, and coordinate descent
 * from the best uniform scorer keeps the moves that lower the mean ΔNLL. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "refcli.h"
#include "sample.h"
#include "util.h"

#define CN_MAX_LAYERS 64u
#define CN_MAX_SCORERS 8u
#define CN_MAX_WARM 8u
#define CN_MAX_BUDGETS 8u
#define CN_MAX_CACHE 4096u   /* evaluated points remembered (a move back costs nothing) */
#define CN_FIRST_TARGET 64u  /* as kvtier eval: positions before it are not scored */
#define CN_MIN_SHARE 0.01    /* no layer's share is moved below this */

/* One candidate: per layer a scorer (kvt_scorer_id), a share of the
 * layer's full cache and the part of it warm blocks may take. */
typedef struct cn_point {
  uint32_t scorer[CN_MAX_LAYERS];
  double share[CN_MAX_LAYERS], warm[CN_MAX_LAYERS];
} cn_point;

typedef struct cn_cfg {
  const char *model, *out, *budget_s, *scorers_s, *predictor, *start, *warm_s, *warm_codec;
  const char *objective, *step_s, *min_step_s, *min_gain_s;
  uint64_t sequences, len, seed, block_tokens, max_evals;
  int json;
} cn_cfg;

/* What the search did for one budget. */
typedef struct cn_result {
  double budget;
  cn_point best;
  double start_loss, loss, gain_se, seconds;
  const char *start_name; /* the uniform scorer or "--start" */
  uint64_t evals, moves;
} cn_result;

typedef struct cn_run {
  cn_cfg cfg;
  rm_model m;
  ref_codec wcodec;
  uint32_t L, bt;
  double budgets[CN_MAX_BUDGETS], warms[CN_MAX_WARM], step0, min_step, min_gain;
  uint32_t n_budgets, n_warms, scorers[CN_MAX_SCORERS], n_scorers;
  uint32_t **seqs, *lens;
  size_t n_seqs;
  double *nll_full;           /* [n_seqs] with the full cache */
  double *delta, *cur_delta, *start_delta; /* [n_seqs] ΔNLL: last run, current point, start */
  double *lp;                 /* [vocab] log-probabilities */
  char dir[PATH_MAX];         /* scratch: engines and candidate profiles */
  uint64_t evals, max_evals;  /* of the budget being searched */
  cn_point *cache;            /* evaluated points of this budget and their losses */
  double *cache_loss;
  uint32_t n_cache;
  cn_result res[CN_MAX_BUDGETS];
} cn_run;

#define CN_N_OPTS 18

static void cn_opts(cn_cfg *c, cli_opt o[CN_N_OPTS]) {
  const cli_opt opts[CN_N_OPTS] = {
      {"--objective", "nll", CLI_STR, &c->objective, 0, 0,
       "nll: choose by the model's delta NLL (this page); mass: lost attention mass"},
      {"--model", "M", CLI_STR, &c->model, 0, 0, "llama2.c checkpoint (required)"},
      {"--budget", "F[,F..]", CLI_STR, &c->budget_s, 0, 0,
       "total budget(s), fractions of the full cache in (0, 1] (required)"},
      {"--out", "PROFILE", CLI_STR, &c->out, 0, 0, "write the profile here (also -o; required)"},
      {"--sequences", "N", CLI_U64, &c->sequences, 1, 1024,
       "calibration sequences sampled from the model (default 8)"},
      {"--seed", "S", CLI_U64, &c->seed, 0, UINT64_MAX,
       "their seed, as kvtier eval's (default 5000: never the evaluation seeds)"},
      {"--len", "L", CLI_U64, &c->len, CN_FIRST_TARGET + 1, 1u << 20,
       "tokens per sequence (default: the model's context)"},
      {"--block-tokens", "N", CLI_U64, &c->block_tokens, 1, 256, "tokens per block (default 16)"},
      {"--scorers", "LIST", CLI_STR, &c->scorers_s, 0, 0,
       "scorers to choose from (default recent,h2o,snapkv,tova, and learned with --predictor)"},
      {"--predictor", "P", CLI_STR, &c->predictor, 0, 0,
       "the learned scorer's model (kvtier train): \"learned\" becomes a choice"},
      {"--start", "PROFILE", CLI_STR, &c->start, 0, 0,
       "also start from this profile's entry for the budget when it beats the uniform ones"},
      {"--warm", "W,..", CLI_STR, &c->warm_s, 0, 0,
       "warm parts a layer may take, e.g. 0,0.5 (three tiers; default: none, eviction only)"},
      {"--warm-codec", "C", CLI_STR, &c->warm_codec, 0, 0,
       "the warm tier's codecs, as kvtier eval's (default k8v3)"},
      {"--step", "F", CLI_STR, &c->step_s, 0, 0,
       "first share moved between two layers (default budget / 2)"},
      {"--min-step", "F", CLI_STR, &c->min_step_s, 0, 0,
       "the step halves when no move helps, down to this (default budget / 8)"},
      {"--min-gain", "D", CLI_STR, &c->min_gain_s, 0, 0,
       "a move is kept when it lowers the mean delta NLL by more than this (default 0)"},
      {"--max-evals", "N", CLI_U64, &c->max_evals, 1, 100000,
       "model runs (each over every sequence) per budget, starts included (default 120)"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the summary as one JSON object"},
  };
  memcpy(o, opts, sizeof opts);
}

void calibrate_nll_usage(FILE *f) {
  cn_cfg c;
  cli_opt o[CN_N_OPTS];
  cn_opts(&c, o);
  fprintf(f,
          "       kvtier calibrate --objective nll --model M --budget F[,F..] -o PROFILE\n"
          "                        [--sequences N] [--seed S] [--len L] [--block-tokens N]\n"
          "                        [--scorers LIST] [--predictor P] [--start PROFILE]\n"
          "                        [--warm W,..] [--warm-codec C] [--step F] [--min-step F]\n"
          "                        [--min-gain D] [--max-evals N] [--json]\n\n"
          "With --objective nll the profile is chosen by the model's own loss: N sequences\n"
          "are sampled as kvtier eval samples them (use seeds you will not evaluate on),\n"
          "every uniform scorer is run on them, and from the best one coordinate descent\n"
          "tries, per layer, each scorer (and warm part), and moves of the step between\n"
          "every two layers' shares (the total stays the budget), keeping each move that\n"
          "lowers the mean delta NLL; the step halves when none does. Each try is one run\n"
          "of the decoder over the sequences, as kvtier eval --policy auto --profile.\n\n"
          "options with --objective nll:\n");
  cli_print_opts(f, o, CN_N_OPTS);
}

static int usage_error(const char *msg, const char *arg) {
  fprintf(stderr, "kvtier calibrate: %s%s%s\nrun 'kvtier help calibrate' for its options\n", msg,
          arg ? ": " : "", arg ? arg : "");
  return CLI_USAGE;
}

/* ---- options --------------------------------------------------------------- */

/* Comma-separated numbers in [lo, hi] (lo excluded when open_lo) into v. */
static int parse_list(const char *s, const char *what, double lo, double hi, int open_lo,
                      double *v, uint32_t cap, uint32_t *n) {
  const char *p = s;
  *n = 0;
  while (*p) {
    char *end;
    double x = strtod(p, &end);
    if (end == p || !(open_lo ? x > lo : x >= lo) || !(x <= hi) || (*end && *end != ','))
      return usage_error(what, s);
    if (*n == cap) return usage_error("too many values", s);
    v[(*n)++] = x;
    p = *end ? end + 1 : end;
  }
  return *n ? CLI_OK : usage_error(what, s);
}

static int parse_one(const char *s, const char *what, double lo, double hi, double *v) {
  char *end = NULL;
  if (!s) return CLI_OK;
  *v = strtod(s, &end);
  return *end || !(*v >= lo && *v <= hi) ? usage_error(what, s) : CLI_OK;
}

static int cn_parse_scorers(cn_run *r) {
  const char *dflt = r->cfg.predictor ? "recent,h2o,snapkv,tova,learned" : "recent,h2o,snapkv,tova";
  char buf[256];
  snprintf(buf, sizeof buf, "%s", r->cfg.scorers_s ? r->cfg.scorers_s : dflt);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    uint32_t id = UINT32_MAX;
    if (kvt_policy_parse(t, &id) || id == KVT_SCORER_FULL || id == KVT_SCORER_EXTERNAL ||
        id == KVT_SCORER_AUTO)
      return usage_error("--scorers takes recent, sink-recent, h2o, snapkv, tova, learned", t);
    if (id == KVT_SCORER_LEARNED && !r->cfg.predictor)
      return usage_error("--scorers learned needs --predictor P", t);
    if (r->n_scorers == CN_MAX_SCORERS) return usage_error("too many --scorers", t);
    r->scorers[r->n_scorers++] = id;
  }
  return r->n_scorers ? CLI_OK : usage_error("--scorers is empty", NULL);
}

static int cn_check(cn_run *r) {
  cn_cfg *c = &r->cfg;
  if (!c->objective || strcmp(c->objective, "nll") != 0)
    return usage_error("--objective takes nll or mass", c->objective);
  if (!c->model) return usage_error("--objective nll needs --model M (it runs the model)", NULL);
  if (!c->budget_s) return usage_error("--budget is required", NULL);
  if (!c->out) return usage_error("-o PROFILE is required", NULL);
  int rc = parse_list(c->budget_s, "--budget takes fractions in (0, 1], comma-separated", 0, 1, 1,
                      r->budgets, CN_MAX_BUDGETS, &r->n_budgets);
  if (rc == CLI_OK) rc = cn_parse_scorers(r);
  if (rc == CLI_OK && c->warm_s)
    rc = parse_list(c->warm_s, "--warm takes warm parts in [0, 1), comma-separated", 0, 0.99, 0,
                    r->warms, CN_MAX_WARM, &r->n_warms);
  r->step0 = r->min_step = 0;
  if (rc == CLI_OK) rc = parse_one(c->step_s, "--step must be in (0, 0.5]", 1e-6, 0.5, &r->step0);
  if (rc == CLI_OK)
    rc = parse_one(c->min_step_s, "--min-step must be in (0, 0.5]", 1e-6, 0.5, &r->min_step);
  if (rc == CLI_OK)
    rc = parse_one(c->min_gain_s, "--min-gain must be in [0, 1]", 0, 1, &r->min_gain);
  if (rc != CLI_OK) return rc;
  if (c->warm_codec && (ref_codec_parse(c->warm_codec, &r->wcodec) || !r->wcodec.k || !r->wcodec.v))
    return usage_error("unknown --warm-codec (both sides: k8v3, k4v2, ...)", c->warm_codec);
  if (c->block_tokens && (c->block_tokens & (c->block_tokens - 1)))
    return usage_error("--block-tokens must be a power of two", NULL);
  r->bt = c->block_tokens ? (uint32_t)c->block_tokens : REF_BLOCK_TOKENS;
  r->max_evals = c->max_evals ? c->max_evals : 120;
  if (r->max_evals < r->n_scorers)
    return usage_error("--max-evals must cover a run of every scorer", NULL);
  return CLI_OK;
}

/* ---- a run of the model ------------------------------------------------------- */

/* The mean NLL of sequence i's targets at positions >= CN_FIRST_TARGET,
 * teacher-forced with the full cache (e NULL) or under pol in e. */
static int cn_seq_nll(cn_run *r, kvt_engine *e, kvt_ns_id ns, const kvt_policy *pol, size_t i,
                      double *nll) {
  const uint32_t *tok = r->seqs[i];
  size_t V = (size_t)r->m.c.vocab_size;
  rm_dec d;
  int rc = rm_dec_init(&d, &r->m, e, ns);
  if (!rc && e) rc = kvt_seq_set_policy(d.s, pol);
  double sum = 0;
  uint64_t n = 0;
  for (uint32_t p = 0; !rc && p + 1 < r->lens[i]; p++) {
    const float *lg;
    if ((rc = rm_dec_step(&d, tok[p], &lg)) || p + 1 < CN_FIRST_TARGET) continue;
    rm_log_softmax(lg, V, r->lp);
    sum -= r->lp[tok[p + 1]];
    n++;
  }
  rm_dec_free(&d);
  *nll = n ? sum / (double)n : NAN;
  return rc;
}

/* The profile of one budget entry: version 2 (per-layer warm) when a
 * layer has a warm part, else 1. Written as calibrate's mass objective
 * writes it (docs/policy.md, "The file"). */
static int cn_write_profile(const cn_run *r, const char *path, const cn_result *res, uint32_t n,
                            const char *how) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "kvtier calibrate: %s: %s\n", path, strerror(errno));
    return CLI_FAIL;
  }
  int v2 = 0;
  for (uint32_t i = 0; i < n; i++)
    for (uint32_t l = 0; l < r->L; l++) v2 |= res[i].best.warm[l] > 0;
  fprintf(f, "{\n  \"format\": \"kvtier-profile\",\n  \"version\": %d,\n  \"model\": ", v2 ? 2 : 1);
  json_string(f, r->m.name);
  fprintf(f, ",\n  \"method\": ");
  json_string(f, how);
  fprintf(f, ",\n  \"shape\": {\"n_layers\": %u, \"n_kv_heads\": %d, \"head_dim\": %u, "
             "\"block_tokens\": %u},\n  \"profiles\": [",
          r->L, r->m.c.n_kv_heads, r->m.head_dim, r->bt);
  for (uint32_t i = 0; i < n; i++) {
    const cn_point *p = &res[i].best;
    fprintf(f, "%s\n    {\"budget\": %.6g, \"layers\": [", i ? "," : "", res[i].budget);
    for (uint32_t l = 0; l < r->L; l++) {
      fprintf(f, "%s\n      {\"scorer\": \"%s\", \"share\": %.9f", l ? "," : "",
              kvt_policy_name(p->scorer[l]), p->share[l]);
      if (v2) fprintf(f, ", \"warm\": %.6g", p->warm[l]);
      fprintf(f, "}");
    }
    fprintf(f, "\n    ]}");
  }
  fprintf(f, "\n  ]\n}\n");
  if (ferror(f) | fclose(f)) {
    fprintf(stderr, "kvtier calibrate: writing %s failed\n", path);
    return CLI_FAIL;
  }
  return CLI_OK;
}

/* An engine for the policy's sequences, opened as kvtier eval opens the
 * one its policy runs in (eval.c, eval_open_engine), so that a candidate's
 * figures here are the ones kvtier eval gives for its profile. */
static int cn_open_engine(cn_run *r, const char *dir, const char *profile, kvt_engine **e,
                          kvt_ns_id *ns) {
  kvt_options o;
  kvt_options_init(&o);
  o.flags |= KVT_OPEN_VERIFY_DEDUP;
  o.tier_bytes_limit[KVT_TIER_HOT] = 256u << 20;
  if (profile) {
    o.tier_bytes_limit[KVT_TIER_WARM] = 256u << 20;
    o.tier_bytes_limit[KVT_TIER_COLD] = 1ull << 30;
  }
  int rc = cli_engine_open(dir, &o, e);
  if (!rc) rc = rm_ns_register(*e, &r->m, r->bt, ns);
  if (!rc && r->wcodec.warm) rc = kvt_ns_set_codec(*e, *ns, KVT_ALL_LAYERS, r->wcodec.k, r->wcodec.v);
  if (rc) return cli_engine_error("calibrate", "opening an engine", *e, rc);
  if (profile && (rc = kvt_ns_load_profile(*e, *ns, profile)))
    return cli_engine_error("calibrate", "loading a candidate profile", *e, rc);
  if (r->cfg.predictor && (rc = kvt_ns_load_predictor(*e, *ns, r->cfg.predictor)))
    return cli_engine_error("calibrate", r->cfg.predictor, *e, rc);
  return CLI_OK;
}

/* Run every sequence under a uniform scorer (p NULL: scorer `uniform`)
 * or under point p through a profile ("auto"), in a fresh engine (blocks
 * computed under another candidate are never adopted); the per-sequence
 * ΔNLL in r->delta, its mean in *loss. */
static int cn_eval(cn_run *r, double budget, const cn_point *p, uint32_t uniform, double *loss) {
  char edir[PATH_MAX + 16], prof[PATH_MAX + 16];
  snprintf(edir, sizeof edir, "%s/engine", r->dir);
  snprintf(prof, sizeof prof, "%s/candidate.json", r->dir);
  int rc = CLI_OK;
  if (p) {
    cn_result one = {.budget = budget, .best = *p};
    rc = cn_write_profile(r, prof, &one, 1, "candidate");
  }
  kvt_engine *e = NULL;
  kvt_ns_id ns = 0;
  if (rc == CLI_OK) rc = cn_open_engine(r, edir, p ? prof : NULL, &e, &ns);
  kvt_policy pol;
  kvt_policy_init(&pol);
  pol.scorer = p ? KVT_SCORER_AUTO : uniform;
  pol.budget = budget;
  double sum = 0;
  for (size_t i = 0; rc == CLI_OK && i < r->n_seqs; i++) {
    progress("calibrate: budget %g: run %" PRIu64 ": sequence %zu of %zu", budget, r->evals + 1,
             i + 1, r->n_seqs);
    double nll;
    int e2 = cn_seq_nll(r, e, ns, &pol, i, &nll);
    if (e2) rc = cli_engine_error("calibrate", "decoding", e, e2);
    r->delta[i] = nll - r->nll_full[i];
    sum += r->delta[i];
  }
  kvt_engine_close(e);
  int rm = remove_tree(edir);
  if (rc == CLI_OK && rm) rc = cli_lib_error("calibrate", "removing a scratch engine", rm);
  r->evals++;
  *loss = sum / (double)r->n_seqs;
  return rc;
}

/* ---- the search -------------------------------------------------------------------- */

static int cn_same(const cn_run *r, const cn_point *a, const cn_point *b) {
  for (uint32_t l = 0; l < r->L; l++)
    if (a->scorer[l] != b->scorer[l] || fabs(a->share[l] - b->share[l]) > 1e-9 ||
        fabs(a->warm[l] - b->warm[l]) > 1e-9)
      return 0;
  return 1;
}

static void cn_remember(cn_run *r, const cn_point *p, double loss) {
  if (r->n_cache == CN_MAX_CACHE) return;
  r->cache[r->n_cache] = *p;
  r->cache_loss[r->n_cache++] = loss;
}

/* The loss of candidate p: remembered, or one run (*ran = 1). A point
 * not run because the runs are spent is +inf. */
static int cn_try(cn_run *r, double budget, const cn_point *p, double *loss, int *ran) {
  *ran = 0;
  for (uint32_t i = 0; i < r->n_cache; i++)
    if (cn_same(r, &r->cache[i], p)) {
      *loss = r->cache_loss[i];
      return CLI_OK;
    }
  *loss = INFINITY;
  if (r->evals >= r->max_evals) return CLI_OK;
  int rc = cn_eval(r, budget, p, 0, loss);
  if (rc == CLI_OK) {
    *ran = 1;
    cn_remember(r, p, *loss);
  }
  return rc;
}

/* Keep candidate p when it beats the current point by the minimum gain. */
static int cn_consider(cn_run *r, cn_result *res, const cn_point *p, const char *what, int *took) {
  double loss;
  int ran, rc = cn_try(r, res->budget, p, &loss, &ran);
  *took = rc == CLI_OK && loss < res->loss - r->min_gain;
  if (!*took) return rc;
  fprintf(stderr, "calibrate: budget %g: run %" PRIu64 ": %s: delta NLL %.5f -> %.5f\n",
          res->budget, r->evals, what, res->loss, loss);
  res->best = *p;
  res->loss = loss;
  res->moves++;
  if (ran) memcpy(r->cur_delta, r->delta, r->n_seqs * sizeof *r->delta);
  return rc;
}

/* The uniform point: every layer scorer s at the budget, no warm part. */
static void cn_uniform(const cn_run *r, double budget, uint32_t s, cn_point *p) {
  memset(p, 0, sizeof *p);
  for (uint32_t l = 0; l < r->L; l++) {
    p->scorer[l] = s;
    p->share[l] = budget;
  }
}

/* 1 when scorer s alone and "auto" resolve the same sinks, window and
 * delay (then s's uniform run is its profile's run too). */
static int cn_auto_alike(cn_run *r, uint32_t s) {
  kvt_engine *e = NULL;
  kvt_ns_id ns;
  char edir[PATH_MAX + 16];
  snprintf(edir, sizeof edir, "%s/engine", r->dir);
  if (cn_open_engine(r, edir, NULL, &e, &ns) != CLI_OK) return 0;
  kvt_policy a, b, ra, rb;
  kvt_policy_init(&a);
  kvt_policy_init(&b);
  a.scorer = s;
  b.scorer = KVT_SCORER_AUTO;
  a.budget = b.budget = 0.5;
  kvt_seq *sa = NULL, *sb = NULL;
  int ok = !kvt_seq_create(e, ns, &sa) && !kvt_seq_create(e, ns, &sb) &&
           !kvt_seq_set_policy(sa, &a) && !kvt_seq_set_policy(sb, &b) &&
           !kvt_seq_get_policy(sa, &ra) && !kvt_seq_get_policy(sb, &rb) &&
           ra.sink_blocks == rb.sink_blocks && ra.window_blocks == rb.window_blocks &&
           ra.delay == rb.delay;
  kvt_seq_release(sa);
  kvt_seq_release(sb);
  kvt_engine_close(e);
  remove_tree(edir);
  return ok;
}

/* The best uniform scorer (each run as kvtier eval --policy s runs it),
 * made the current point. */
static int cn_starts(cn_run *r, cn_result *res) {
  res->loss = INFINITY;
  uint32_t best = 0;
  for (uint32_t i = 0; i < r->n_scorers; i++) {
    double loss;
    int rc = cn_eval(r, res->budget, NULL, r->scorers[i], &loss);
    if (rc != CLI_OK) return rc;
    fprintf(stderr, "calibrate: budget %g: uniform %s: delta NLL %.5f\n", res->budget,
            kvt_policy_name(r->scorers[i]), loss);
    if (loss < res->loss) {
      res->loss = loss;
      best = r->scorers[i];
      memcpy(r->start_delta, r->delta, r->n_seqs * sizeof *r->delta);
    }
  }
  res->start_loss = res->loss;
  res->start_name = kvt_policy_name(best);
  memcpy(r->cur_delta, r->start_delta, r->n_seqs * sizeof *r->delta);
  cn_uniform(r, res->budget, best, &res->best);
  if (cn_auto_alike(r, best)) {
    cn_remember(r, &res->best, res->loss);
    return CLI_OK;
  }
  /* its profile form resolves other defaults: run it as the search's start */
  int rc = cn_eval(r, res->budget, &res->best, 0, &res->loss);
  if (rc == CLI_OK) {
    cn_remember(r, &res->best, res->loss);
    memcpy(r->cur_delta, r->delta, r->n_seqs * sizeof *r->delta);
  }
  return rc;
}

/* --start: what that profile gives each layer at this budget (the
 * engine's reading of it: kvt_seq_policy_info() of an "auto" sequence),
 * run; it replaces the current point when it is better. */
static int cn_start_file(cn_run *r, cn_result *res) {
  char edir[PATH_MAX + 16];
  snprintf(edir, sizeof edir, "%s/engine", r->dir);
  kvt_engine *e = NULL;
  kvt_ns_id ns;
  int rc = cn_open_engine(r, edir, r->cfg.start, &e, &ns);
  kvt_policy pol;
  kvt_policy_init(&pol);
  pol.scorer = KVT_SCORER_AUTO;
  pol.budget = res->budget;
  kvt_seq *s = NULL;
  cn_point p;
  memset(&p, 0, sizeof p);
  int lrc = rc == CLI_OK ? kvt_seq_create(e, ns, &s) : 0;
  if (!lrc && rc == CLI_OK) lrc = kvt_seq_set_policy(s, &pol);
  for (uint32_t l = 0; !lrc && rc == CLI_OK && l < r->L; l++) {
    kvt_policy_info pi;
    if ((lrc = kvt_seq_policy_info(s, l, &pi))) break;
    p.scorer[l] = pi.scorer;
    p.share[l] = pi.share;
    p.warm[l] = pi.share > 0 ? pi.warm_share / pi.share : 0;
  }
  if (lrc) rc = cli_engine_error("calibrate", r->cfg.start, e, lrc);
  kvt_seq_release(s);
  kvt_engine_close(e);
  remove_tree(edir);
  double loss;
  int ran;
  if (rc == CLI_OK) rc = cn_try(r, res->budget, &p, &loss, &ran);
  if (rc != CLI_OK) return rc;
  fprintf(stderr, "calibrate: budget %g: --start %s: delta NLL %.5f\n", res->budget, r->cfg.start,
          loss);
  if (loss < res->loss) {
    res->best = p;
    res->loss = res->start_loss = loss;
    res->start_name = "--start";
    memcpy(r->cur_delta, r->delta, r->n_seqs * sizeof *r->delta);
    memcpy(r->start_delta, r->delta, r->n_seqs * sizeof *r->delta);
  }
  return CLI_OK;
}

/* One sweep of scorer (and warm) moves: each layer, each alternative. */
static int cn_sweep_choices(cn_run *r, cn_result *res, int *moved) {
  char what[96];
  int rc = CLI_OK, took;
  for (uint32_t l = 0; rc == CLI_OK && l < r->L; l++) {
    for (uint32_t s = 0; rc == CLI_OK && s < r->n_scorers; s++) {
      if (r->scorers[s] == res->best.scorer[l]) continue;
      cn_point p = res->best;
      p.scorer[l] = r->scorers[s];
      snprintf(what, sizeof what, "layer %u %s -> %s", l, kvt_policy_name(res->best.scorer[l]),
               kvt_policy_name(p.scorer[l]));
      rc = cn_consider(r, res, &p, what, &took);
      *moved |= took;
    }
    for (uint32_t w = 0; rc == CLI_OK && w < r->n_warms; w++) {
      if (fabs(r->warms[w] - res->best.warm[l]) < 1e-9 || res->best.share[l] >= 1) continue;
      cn_point p = res->best;
      p.warm[l] = r->warms[w];
      snprintf(what, sizeof what, "layer %u warm %g -> %g", l, res->best.warm[l], p.warm[l]);
      rc = cn_consider(r, res, &p, what, &took);
      *moved |= took;
    }
  }
  return rc;
}

/* One sweep of share moves: step from layer i to layer j, every pair,
 * repeated while it keeps helping. A layer at 1 keeps no warm part. */
static int cn_sweep_shares(cn_run *r, cn_result *res, double step, int *moved) {
  char what[96];
  int rc = CLI_OK, took = 1;
  for (uint32_t i = 0; rc == CLI_OK && i < r->L; i++)
    for (uint32_t j = 0; rc == CLI_OK && j < r->L; j++) {
      for (took = 1; rc == CLI_OK && took && i != j;) {
        cn_point p = res->best;
        p.share[i] -= step;
        p.share[j] += step;
        if (p.share[i] < CN_MIN_SHARE - 1e-12 || p.share[j] > 1 + 1e-12) break;
        if (p.share[j] > 1 - 1e-9) {
          p.share[j] = 1;
          p.warm[j] = 0;
        }
        snprintf(what, sizeof what, "share %.4g from layer %u to %u", step, i, j);
        rc = cn_consider(r, res, &p, what, &took);
        *moved |= took;
      }
    }
  return rc;
}

/* Coordinate descent for one budget: from the best start, sweeps of
 * scorer and share moves; the step halves after a sweep that moved
 * nothing; until the step is below the minimum or the runs are spent. */
static int cn_search(cn_run *r, cn_result *res) {
  uint64_t t0 = now_ns();
  r->evals = 0;
  r->n_cache = 0;
  int rc = cn_starts(r, res);
  if (rc == CLI_OK && r->cfg.start) rc = cn_start_file(r, res);
  double step = r->step0 > 0 ? r->step0 : res->budget / 2;
  double min_step = r->min_step > 0 ? r->min_step : res->budget / 8;
  while (rc == CLI_OK && step >= min_step - 1e-12 && r->evals < r->max_evals) {
    int moved = 0;
    rc = cn_sweep_choices(r, res, &moved);
    if (rc == CLI_OK) rc = cn_sweep_shares(r, res, step, &moved);
    if (!moved) step /= 2;
  }
  double s = 0, ss = 0, n = (double)r->n_seqs;
  for (size_t i = 0; i < r->n_seqs; i++) s += r->cur_delta[i] - r->start_delta[i];
  for (size_t i = 0; i < r->n_seqs; i++) {
    double d = r->cur_delta[i] - r->start_delta[i] - s / n;
    ss += d * d;
  }
  res->gain_se = r->n_seqs > 1 ? sqrt(ss / (n - 1) / n) : 0;
  res->evals = r->evals;
  res->seconds = (double)(now_ns() - t0) * 1e-9;
  return rc;
}

/* ---- main ------------------------------------------------------------------------------ */

static int cn_sample(cn_run *r) {
  uint64_t len = r->cfg.len ? r->cfg.len : (uint64_t)r->m.c.seq_len, n = r->cfg.sequences;
  if (len > (uint64_t)r->m.c.seq_len) return usage_error("--len is beyond the model's context", NULL);
  size_t V = (size_t)r->m.c.vocab_size;
  r->n_seqs = n ? n : 8;
  r->seqs = calloc(r->n_seqs, sizeof *r->seqs);
  r->lens = calloc(r->n_seqs, sizeof *r->lens);
  r->nll_full = calloc(r->n_seqs, sizeof *r->nll_full);
  r->delta = calloc(r->n_seqs, sizeof *r->delta);
  r->cur_delta = calloc(r->n_seqs, sizeof *r->cur_delta);
  r->start_delta = calloc(r->n_seqs, sizeof *r->start_delta);
  r->lp = calloc(V, sizeof *r->lp);
  r->cache = calloc(CN_MAX_CACHE, sizeof *r->cache);
  r->cache_loss = calloc(CN_MAX_CACHE, sizeof *r->cache_loss);
  if (!r->seqs || !r->lens || !r->nll_full || !r->delta || !r->cur_delta || !r->start_delta ||
      !r->lp || !r->cache || !r->cache_loss)
    return cli_lib_error("calibrate", "allocating", -ENOMEM);
  for (size_t i = 0; i < r->n_seqs; i++) {
    progress("calibrate: sampling sequence %zu of %zu", i + 1, r->n_seqs);
    if (!(r->seqs[i] = malloc(len * sizeof **r->seqs)))
      return cli_lib_error("calibrate", "allocating", -ENOMEM);
    r->lens[i] = (uint32_t)len;
    int rc = rm_sample(&r->m, mix64(r->cfg.seed + i), (uint32_t)len, r->seqs[i]);
    if (!rc) rc = cn_seq_nll(r, NULL, 0, NULL, i, &r->nll_full[i]);
    if (rc) return cli_lib_error("calibrate", "sampling", rc);
  }
  return CLI_OK;
}

static void cn_print(const cn_run *r) {
  json_w j;
  char key[32];
  if (r->cfg.json) {
    json_begin(&j, stdout);
    json_str(&j, "profile", r->cfg.out);
    json_str(&j, "objective", "nll");
    json_u64(&j, "sequences", r->n_seqs);
    json_u64(&j, "seed", r->cfg.seed);
    json_obj(&j, "budgets");
  } else {
    printf("profile %s for %s (%u layers, %u tokens a block), by delta NLL on %zu sequences "
           "of seeds %" PRIu64 "..\n", r->cfg.out, r->m.name, r->L, r->bt, r->n_seqs, r->cfg.seed);
  }
  for (uint32_t i = 0; i < r->n_budgets; i++) {
    const cn_result *s = &r->res[i];
    if (r->cfg.json) {
      snprintf(key, sizeof key, "%g", s->budget);
      json_obj(&j, key);
      json_str(&j, "start", s->start_name);
      json_f64(&j, "start_delta_nll", s->start_loss);
      json_f64(&j, "delta_nll", s->loss);
      json_f64(&j, "gain_se", s->gain_se);
      json_u64(&j, "runs", s->evals);
      json_u64(&j, "moves", s->moves);
      json_f64(&j, "seconds", s->seconds);
      json_end(&j);
      continue;
    }
    printf("\nbudget %g: delta NLL %.5f, from %.5f (%s%s; paired se of the gain %.5f); %" PRIu64
           " runs, %" PRIu64 " moves, %.0f s\n", s->budget, s->loss, s->start_loss,
           strcmp(s->start_name, "--start") ? "uniform " : "", s->start_name, s->gain_se, s->evals,
           s->moves, s->seconds);
    printf("  layer  scorer        share   warm\n");
    for (uint32_t l = 0; l < r->L; l++)
      printf("  %5u  %-12s  %.4f  %.3g\n", l, kvt_policy_name(s->best.scorer[l]), s->best.share[l],
             s->best.warm[l]);
  }
  if (r->cfg.json) {
    json_end(&j);
    json_end(&j);
  }
}

static int cn_main(cn_run *r) {
  int rc = ref_load_model("calibrate", r->cfg.model, &r->m);
  if (rc != CLI_OK) return rc;
  r->L = (uint32_t)r->m.c.n_layers;
  if (r->L > CN_MAX_LAYERS) return usage_error("--objective nll takes models of at most 64 layers", NULL);
  if ((rc = cn_sample(r)) != CLI_OK) return rc;
  bench_dir d;
  if ((rc = bench_dir_open(&d, NULL, "calibrate")) != CLI_OK) return rc;
  snprintf(r->dir, sizeof r->dir, "%s", d.path);
  for (uint32_t i = 0; rc == CLI_OK && i < r->n_budgets; i++) {
    r->res[i].budget = r->budgets[i];
    rc = cn_search(r, &r->res[i]);
  }
  progress_end();
  bench_dir_close(&d, "calibrate");
  char how[256];
  snprintf(how, sizeof how, "coordinate descent on delta NLL from the best uniform scorer, %zu "
           "sequences of %u tokens, seeds %" PRIu64 "..", r->n_seqs, r->lens[0], r->cfg.seed);
  if (rc == CLI_OK) rc = cn_write_profile(r, r->cfg.out, r->res, r->n_budgets, how);
  if (rc == CLI_OK) cn_print(r);
  return rc;
}

static void cn_free(cn_run *r) {
  ref_free_tokens(r->seqs, r->lens, r->n_seqs);
  free(r->nll_full);
  free(r->delta);
  free(r->cur_delta);
  free(r->start_delta);
  free(r->lp);
  free(r->cache);
  free(r->cache_loss);
  rm_model_free(&r->m);
}

int calibrate_nll(int argc, char **argv) {
  cn_run *r = calloc(1, sizeof *r);
  if (!r) return cli_lib_error("calibrate", "allocating", -ENOMEM);
  cli_opt o[CN_N_OPTS];
  cn_opts(&r->cfg, o);
  r->cfg.seed = 5000;
  /* -o is --out (cli_parse knows long names only) */
  char **args = calloc((size_t)argc + 1, sizeof *args), out_opt[] = "--out";
  if (!args) {
    free(r);
    return cli_lib_error("calibrate", "allocating", -ENOMEM);
  }
  for (int i = 0; i < argc; i++) args[i] = strcmp(argv[i], "-o") == 0 ? out_opt : argv[i];
  int want_help = 0;
  int rc = cli_parse("calibrate", argc - 1, args + 1, o, CN_N_OPTS, &want_help);
  free(args);
  if (want_help) calibrate_usage(stdout);
  if (rc == CLI_OK && !want_help) rc = cn_check(r);
  if (rc == CLI_OK && !want_help) rc = cn_main(r);
  cn_free(r);
  free(r);
  return rc;
}
