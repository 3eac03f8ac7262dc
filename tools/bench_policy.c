/* bench_policy.c - `kvtier bench policy`: what the policy layer costs per
 * decoding step against the attention it manages, in the same run. For
 * each scorer, over the last steps of a decode: kvt_seq_observe() of
 * every layer, and the whole rebalance of a step (the length set, which
 * applies the policy to every layer and evicts when the tail outgrew the
 * budget, plus those observations); against kvt_seq_attend() of every
 * layer over the same context with the whole cache retained, and the same
 * attention over a plain array. Rounds interleaved, medians. Speed lives
 * here, never in tests. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "refcli.h"
#include "util.h"

#define BP_ROUNDS_MAX 99u
/* Decoding steps timed per round, each alone: medians of steps keep a
 * preempted step (a loaded machine) from counting as the policy's cost;
 * the mean and the slowest step are reported beside them. */
#define BP_STEPS 64u
#define BP_SCORERS_MAX 32u

typedef struct bp_cfg {
  const char *model, *dir, *budget_s, *predictor, *remote;
  uint64_t tokens, block_tokens, rounds;
  int json;
} bp_cfg;

typedef struct bp_run {
  bp_cfg cfg;
  double budget;
  kvt_shape sh;
  uint32_t n_q_heads, n_blocks;
  kvt_engine *e;
  kvt_ns_id ns;
  kvt_seq *full;            /* every block, every layer retained */
  uint32_t *tokens;
  float *k, *v, *q, *out, *lse, *mass;
  float *plain_k, *plain_v, *p; /* [layer][token][kv_heads][head_dim]; scores */
  prng rng;
} bp_run;

typedef struct bp_scorer {
  uint32_t id;
  double warm;              /* > 0: three tiers (a warm share, promotions) */
  int attend;               /* each layer attended before its observation */
  int recall;               /* and recall on (kvt_policy.recall): "snapkv+recall" */
  double recall_ns[BP_ROUNDS_MAX]; /* the engine's recall time (kvt_stats) per step */
  /* per round: the median step, the mean step, the slowest step */
  double observe_ns[BP_ROUNDS_MAX], rebalance_ns[BP_ROUNDS_MAX], mean_ns[BP_ROUNDS_MAX],
      max_ns[BP_ROUNDS_MAX];
  double retained;          /* mean retained blocks per layer at steady state */
  int skipped;              /* the scorer needs input a bench cannot give */
} bp_scorer;

#define BP_N_OPTS 9

static void bp_opts(bp_cfg *c, cli_opt o[BP_N_OPTS]) {
  const cli_opt opts[BP_N_OPTS] = {
      {"--model", "M", CLI_STR, &c->model, 0, 0,
       "llama2.c checkpoint whose shape to use (default: stories260K's, built in)"},
      {"--tokens", "T", CLI_U64, &c->tokens, 64, 1u << 16, "context length (default 512)"},
      {"--block-tokens", "N", CLI_U64, &c->block_tokens, 1, 256,
       "tokens per block, a power of two (default 16)"},
      {"--budget", "F", CLI_STR, &c->budget_s, 0, 0, "the scorers' budget, (0, 1] (default 0.25)"},
      {"--rounds", "R", CLI_U64, &c->rounds, 1, BP_ROUNDS_MAX, "rounds (default 7)"},
      {"--dir", "D", CLI_STR, &c->dir, 0, 0, "store directory (default: a scratch one)"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the figures as one JSON object"},
      {"--predictor", "P", CLI_STR, &c->predictor, 0, 0,
       "a predictor (kvtier train) for the shape: times \"learned\" too (else skipped)"},
      CLI_OPT_REMOTE(&c->remote),
  };
  memcpy(o, opts, sizeof opts);
}

void bench_policy_usage(FILE *f) {
  bp_cfg c;
  cli_opt o[BP_N_OPTS];
  bp_opts(&c, o);
  fprintf(f, "\nbench policy: nanoseconds per block per decoding step of each scorer over\n"
             "the last 64 steps of a decode: kvt_seq_observe of every layer, and the whole\n"
             "rebalance of a step (kvt_seq_set_tokens, which applies the policy to every\n"
             "layer, plus the observations), against kvt_seq_attend of every layer over the\n"
             "same context, whole, and the same attention over a plain array, in the same\n"
             "run; policy_vs_attention is the slowest scorer's step over one step's\n"
             "attention, both the median of single steps (docs/policy.md).\n");
  cli_print_opts(f, o, BP_N_OPTS);
}

static int bp_fail(const char *what, kvt_engine *e, int rc) {
  return cli_engine_error("bench policy", what, e, rc);
}

/* stories260K (docs/refmodel.md): 5 layers, 8 query heads over 4 KV heads
 * of 8 dimensions. */
static int bp_shape(bp_run *r) {
  r->sh = (kvt_shape){.n_layers = 5, .n_kv_heads = 4, .head_dim = 8, .dtype = KVT_F32,
                      .block_tokens = (uint32_t)r->cfg.block_tokens};
  r->n_q_heads = 8;
  if (r->cfg.model) {
    rm_model m;
    int rc = ref_load_model("bench policy", r->cfg.model, &m);
    if (rc != CLI_OK) return rc;
    r->sh.n_layers = (uint32_t)m.c.n_layers;
    r->sh.n_kv_heads = (uint32_t)m.c.n_kv_heads;
    r->sh.head_dim = m.head_dim;
    r->n_q_heads = (uint32_t)m.c.n_heads;
    rm_model_free(&m);
  }
  r->n_blocks = (uint32_t)(r->cfg.tokens / r->cfg.block_tokens);
  return CLI_OK;
}

static void fill_random(prng *g, float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = (float)prng_gauss(g);
}

/* Append one block of fresh tokens to s and put random K/V in every layer. */
static int bp_put_block(bp_run *r, kvt_seq *s) {
  uint32_t bt = r->sh.block_tokens;
  size_t each = (size_t)bt * r->sh.n_kv_heads * r->sh.head_dim;
  for (uint32_t i = 0; i < bt; i++) r->tokens[i] = (uint32_t)prng_next(&r->rng);
  kvt_append_info info;
  int rc = kvt_seq_append(s, r->tokens, bt, &info);
  kvt_kv kv = {.k = r->k, .v = r->v, .dtype = KVT_F32, .n_tokens = bt,
               .n_heads = r->sh.n_kv_heads, .head_dim = r->sh.head_dim};
  for (uint32_t l = 0; !rc && l < r->sh.n_layers; l++) {
    fill_random(&r->rng, r->k, each);
    fill_random(&r->rng, r->v, each);
    rc = kvt_seq_put(s, info.block, l, &kv);
  }
  return rc;
}

/* Nanoseconds of one step's attention, every layer, whole context. */
static int bp_attention(bp_run *r, double *ns) {
  size_t n = 0;
  float scale = 1.0f / sqrtf((float)r->sh.head_dim);
  double step[BP_STEPS];
  fill_random(&r->rng, r->q, (size_t)r->n_q_heads * r->sh.head_dim);
  for (uint32_t st = 0; st < BP_STEPS; st++) {
    uint64_t t0 = now_ns();
    for (uint32_t l = 0; l < r->sh.n_layers; l++) {
      int rc = kvt_seq_attend(r->full, l, r->q, r->n_q_heads, scale, r->out, r->lse, r->mass,
                              r->n_blocks + 1, &n);
      if (rc) return bp_fail("attending", r->e, rc);
    }
    step[st] = (double)(now_ns() - t0);
  }
  *ns = median_f64(step, BP_STEPS);
  return CLI_OK;
}

/* The same attention over a plain f32 array (what the reference decoder's
 * plain cache does): the cheapest honest baseline, independent of how fast
 * kvt_seq_attend() is. Nanoseconds of one step, every layer. */
static double bp_plain_attention(bp_run *r) {
  uint32_t D = r->sh.head_dim, KV = r->sh.n_kv_heads, H = r->n_q_heads, T = (uint32_t)r->cfg.tokens;
  size_t row = (size_t)KV * D;
  float scale = 1.0f / sqrtf((float)D), sink = 0;
  double step[BP_STEPS];
  for (uint32_t st = 0; st < BP_STEPS; st++) {
    uint64_t t0 = now_ns();
    for (uint32_t l = 0; l < r->sh.n_layers; l++)
      for (uint32_t h = 0; h < H; h++) {
        const float *q = r->q + (size_t)h * D;
        const float *k = r->plain_k + (size_t)l * T * row + (size_t)(h / (H / KV)) * D;
        const float *v = r->plain_v + (size_t)l * T * row + (size_t)(h / (H / KV)) * D;
        float mx = -INFINITY, sum = 0, *o = r->out + (size_t)h * D;
        for (uint32_t t = 0; t < T; t++) {
          float dot = 0;
          for (uint32_t i = 0; i < D; i++) dot += q[i] * k[(size_t)t * row + i];
          r->p[t] = dot * scale;
          if (r->p[t] > mx) mx = r->p[t];
        }
        for (uint32_t t = 0; t < T; t++) sum += r->p[t] = expf(r->p[t] - mx);
        float inv = 1.0f / sum;
        for (uint32_t i = 0; i < D; i++) o[i] = 0;
        for (uint32_t t = 0; t < T; t++) {
          float w = r->p[t] * inv;
          for (uint32_t i = 0; i < D; i++) o[i] += w * v[(size_t)t * row + i];
        }
        sink += o[0];
      }
    step[st] = (double)(now_ns() - t0);
  }
  r->lse[0] = sink; /* keep the loop's result alive */
  return median_f64(step, BP_STEPS);
}

/* Masses a step might give n retained blocks: positive, summing to the
 * query heads. */
static void bp_masses(bp_run *r, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += r->mass[i] = (float)(prng_below(&r->rng, 1000) + 1);
  for (size_t i = 0; i < n; i++) r->mass[i] = (float)(r->mass[i] * r->n_q_heads / sum);
}

/* Observe every layer once (one decoding step); adds the retained blocks.
 * With attend, each layer is attended first (untimed), as a decoder does:
 * recall needs the step's query, and its decision (the sketches' bounds
 * against the weakest retained block) runs inside the timed observation;
 * the row "snapkv+attend" is the same without recall (attention leaves the
 * caches cold for the observation). This engine has no cold tier: no read
 * happens (eval --recall measures reads). */
static int bp_observe_step(bp_run *r, kvt_seq *s, int attend, uint64_t *ns, double *retained) {
  for (uint32_t l = 0; l < r->sh.n_layers; l++) {
    size_t n = 0;
    int rc = attend ? kvt_seq_attend(s, l, r->q, r->n_q_heads, 0, r->out, r->lse, r->mass,
                                     r->n_blocks + 1, &n)
                    : kvt_seq_retained(s, l, NULL, 0, &n);
    if (rc) return rc;
    bp_masses(r, n);
    uint64_t t0 = now_ns();
    rc = kvt_seq_observe(s, l, r->mass, n);
    *ns += now_ns() - t0;
    if (rc) return rc;
    if (retained) *retained += (double)n;
  }
  return 0;
}

/* One round of one scorer, as a decoder drives it: the sequence grows
 * to tokens - BP_STEPS under the policy, observed as it goes; then the
 * last BP_STEPS positions are decoded, each step timed: the length set
 * (kvt_seq_set_tokens(), which applies the policy to every layer: the
 * tail grew, so blocks leave now and then) and every layer observed. A
 * block completed on the way is appended and put untimed (its bytes were
 * the tail's already). */
static int bp_scorer_round(bp_run *r, bp_scorer *sc, uint32_t round) {
  kvt_policy p;
  kvt_policy_init(&p);
  p.scorer = sc->id;
  p.budget = r->budget;
  p.warm = sc->warm;
  p.recall = (uint32_t)sc->recall;
  uint32_t bt = r->sh.block_tokens, T = (uint32_t)r->cfg.tokens, start = T - BP_STEPS;
  kvt_seq *s = NULL;
  uint64_t ignore = 0, step_max = 0;
  double retained = 0, obs[BP_STEPS], all[BP_STEPS], mean = 0;
  int rc = kvt_seq_create(r->e, r->ns, &s);
  if (!rc) rc = kvt_seq_set_policy(s, &p);
  kvt_stats st0, st1;
  uint64_t recall0 = 0;
  for (uint32_t pos = 0; !rc && pos < T; pos++) {
    int timed = pos >= start;
    uint64_t o = 0, t0 = now_ns();
    rc = kvt_seq_set_tokens(s, (uint64_t)pos + 1);
    uint64_t t_len = now_ns() - t0;
    /* before the timed stretch, observe a few steps a block: enough state */
    if (!rc && pos >= bt && (timed || pos % bt < 4))
      rc = bp_observe_step(r, s, sc->attend, timed ? &o : &ignore, timed ? &retained : NULL);
    if (pos == start && !kvt_stats_get(r->e, &st0)) recall0 = st0.recall_ns;
    if (timed) {
      obs[pos - start] = (double)o;
      all[pos - start] = (double)(o + t_len);
      mean += (double)(o + t_len) / BP_STEPS;
      if (o + t_len > step_max) step_max = o + t_len;
    }
    if (!rc && (pos + 1) % bt == 0) rc = bp_put_block(r, s);
  }
  if (!rc && !kvt_stats_get(r->e, &st1))
    sc->recall_ns[round] = (double)(st1.recall_ns - recall0) / BP_STEPS;
  kvt_seq_release(s);
  if (rc) {
    if (round == 0 && rc == KVT_EOPTION) { /* a scorer that needs input: say so */
      sc->skipped = 1;
      return CLI_OK;
    }
    return bp_fail("running a scorer", r->e, rc);
  }
  sc->observe_ns[round] = median_f64(obs, BP_STEPS);
  sc->rebalance_ns[round] = median_f64(all, BP_STEPS);
  sc->mean_ns[round] = mean;
  sc->max_ns[round] = (double)step_max;
  sc->retained = retained / BP_STEPS / r->sh.n_layers;
  return CLI_OK;
}

static int bp_setup(bp_run *r, const char *dir) {
  kvt_options o;
  kvt_options_init(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = 1024u << 20;
  o.tier_bytes_limit[KVT_TIER_WARM] = 256u << 20; /* the three-tier rows' warm share */
  if (o.max_seq_blocks < r->n_blocks + 1) o.max_seq_blocks = r->n_blocks + 1;
  int rc = cli_engine_open_remote(dir, &o, r->cfg.remote, &r->e);
  kvt_ns_desc d = {.model_id = "kvtier-bench/policy", .weights_fingerprint = "random-kv",
                   .rope_theta = 10000.0, .tp_size = 1, .shape = r->sh};
  if (!rc) rc = kvt_ns_register(r->e, &d, &r->ns);
  if (rc) return bp_fail("opening the engine", r->e, rc);
  if (r->cfg.predictor && (rc = kvt_ns_load_predictor(r->e, r->ns, r->cfg.predictor)))
    return cli_engine_error("bench policy", r->cfg.predictor, r->e, rc);
  size_t each = (size_t)r->sh.block_tokens * r->sh.n_kv_heads * r->sh.head_dim;
  size_t qd = (size_t)r->n_q_heads * r->sh.head_dim;
  r->tokens = calloc(r->sh.block_tokens, sizeof *r->tokens);
  r->k = calloc(each, sizeof(float));
  r->v = calloc(each, sizeof(float));
  r->q = calloc(qd, sizeof(float));
  r->out = calloc(qd, sizeof(float));
  r->lse = calloc(r->n_q_heads, sizeof(float));
  r->mass = calloc((size_t)r->n_blocks + 1, sizeof(float));
  size_t plain = (size_t)r->sh.n_layers * r->cfg.tokens * r->sh.n_kv_heads * r->sh.head_dim;
  r->plain_k = malloc(plain * sizeof(float));
  r->plain_v = malloc(plain * sizeof(float));
  r->p = calloc(r->cfg.tokens, sizeof(float));
  if (!r->tokens || !r->k || !r->v || !r->q || !r->out || !r->lse || !r->mass || !r->plain_k ||
      !r->plain_v || !r->p)
    return cli_lib_error("bench policy", "allocating", -ENOMEM);
  prng_seed(&r->rng, 1);
  fill_random(&r->rng, r->plain_k, plain);
  fill_random(&r->rng, r->plain_v, plain);
  if ((rc = kvt_seq_create(r->e, r->ns, &r->full))) return bp_fail("creating", r->e, rc);
  for (uint32_t b = 0; b < r->n_blocks; b++)
    if ((rc = bp_put_block(r, r->full))) return bp_fail("putting", r->e, rc);
  return CLI_OK;
}

static void bp_free(bp_run *r) {
  kvt_seq_release(r->full);
  kvt_engine_close(r->e);
  free(r->tokens);
  free(r->k);
  free(r->v);
  free(r->q);
  free(r->out);
  free(r->lse);
  free(r->mass);
  free(r->plain_k);
  free(r->plain_v);
  free(r->p);
}

static const char *bp_name(const bp_scorer *sc) {
  if (sc->recall) return "snapkv+recall";
  if (sc->attend) return "snapkv+attend";
  return sc->warm > 0 ? "snapkv+warm" : kvt_policy_name(sc->id);
}

static void bp_print(bp_run *r, bp_scorer *sc, uint32_t n_sc, double attn_ns, double plain_ns) {
  uint32_t R = (uint32_t)r->cfg.rounds, L = r->sh.n_layers;
  double worst = 0, worst_plain = 0, worst_max = 0, tiers = 0;
  json_w j;
  if (r->cfg.json) {
    json_begin(&j, stdout);
    json_u64(&j, "tokens", r->cfg.tokens);
    json_u64(&j, "block_tokens", r->sh.block_tokens);
    json_u64(&j, "blocks", r->n_blocks);
    json_u64(&j, "layers", L);
    json_u64(&j, "q_heads", r->n_q_heads);
    json_u64(&j, "kv_heads", r->sh.n_kv_heads);
    json_u64(&j, "head_dim", r->sh.head_dim);
    json_f64(&j, "budget", r->budget);
    json_u64(&j, "rounds", R);
    json_f64(&j, "attention_ns_per_step", attn_ns);
    json_f64(&j, "plain_attention_ns_per_step", plain_ns);
    json_obj(&j, "scorers");
  } else {
    printf("policy cost, %" PRIu64 " tokens in %u blocks of %u, %u layers (%u query heads over "
           "%u KV heads of %u), budget %g, medians of %u rounds\n",
           r->cfg.tokens, r->n_blocks, r->sh.block_tokens, L, r->n_q_heads, r->sh.n_kv_heads,
           r->sh.head_dim, r->budget, R);
    printf("attention, every layer over the whole context: %.0f ns a step (kvt_seq_attend), "
           "%.0f ns (plain f32 array)\n\n", attn_ns, plain_ns);
    printf("  scorer        observe ns/step  ns/block  rebalance ns/step  ns/block  vs attention\n");
  }
  for (uint32_t i = 0; i < n_sc; i++) {
    if (sc[i].skipped) continue;
    double obs = median_f64(sc[i].observe_ns, R), reb = median_f64(sc[i].rebalance_ns, R);
    double mx = median_f64(sc[i].max_ns, R), mean = median_f64(sc[i].mean_ns, R);
    double per_obs = obs / (L * sc[i].retained), per_reb = reb / (L * (double)r->n_blocks);
    if (sc[i].warm > 0) { /* tier moves encode and decode: reported on their own */
      if (reb / attn_ns > tiers) tiers = reb / attn_ns;
    } else {
      if (reb / attn_ns > worst) worst = reb / attn_ns;
      if (reb / plain_ns > worst_plain) worst_plain = reb / plain_ns;
      if (mx / plain_ns > worst_max) worst_max = mx / plain_ns;
    }
    if (r->cfg.json) {
      json_obj(&j, bp_name(&sc[i]));
      json_f64(&j, "observe_ns_per_step", obs);
      json_f64(&j, "observe_ns_per_block_step", per_obs);
      json_f64(&j, "rebalance_ns_per_step", reb);
      json_f64(&j, "rebalance_ns_per_block_step", per_reb);
      json_f64(&j, "rebalance_ns_mean_step", mean);
      json_f64(&j, "rebalance_ns_slowest_step", mx);
      json_f64(&j, "retained_blocks_per_layer", sc[i].retained);
      json_f64(&j, "rebalance_vs_attention", reb / attn_ns);
      if (sc[i].recall) json_f64(&j, "recall_ns_per_step", median_f64(sc[i].recall_ns, R));
      json_end(&j);
    } else {
      printf("  %-12s  %15.0f  %8.2f  %17.0f  %8.2f  %12.4f\n",
             bp_name(&sc[i]), obs,
             per_obs, reb, per_reb, reb / attn_ns);
    }
  }
  if (r->cfg.json) {
    json_end(&j);
    json_f64(&j, "policy_vs_attention", worst);
    json_f64(&j, "policy_vs_plain_attention", worst_plain);
    json_f64(&j, "slowest_step_vs_plain_attention", worst_max);
    json_f64(&j, "tiers_vs_attention", tiers);
    kvt_remote_stats rs;
    cli_remote_get(r->e, &rs);
    cli_remote_json(&j, &rs);
    json_end(&j);
  } else {
    printf("\npolicy_vs_attention %.4f (the slowest scorer's median step over one step's "
           "attention), %.4f against the plain array's; its slowest step %.4f of the plain "
           "array's\n", worst, worst_plain, worst_max);
    printf("tiers_vs_attention %.4f (snapkv with half of each budget warm: demotions, "
           "dequantizing promotions and evictions of a step)\n", tiers);
    kvt_remote_stats rs;
    cli_remote_get(r->e, &rs);
    cli_remote_print(&rs);
  }
}

static int bp_main(bp_run *r, const char *dir) {
  int rc = bp_setup(r, dir);
  if (rc != CLI_OK) return rc;
  bp_scorer sc[BP_SCORERS_MAX];
  uint32_t n_sc = 0, R = (uint32_t)r->cfg.rounds;
  /* "external" ranks by the caller's hints and "auto" is a profile's
   * scorers: neither is a scorer of its own to time */
  for (uint32_t id = 0; kvt_policy_name(id) && n_sc < BP_SCORERS_MAX; id++)
    if (id != KVT_SCORER_FULL && id != KVT_SCORER_EXTERNAL && id != KVT_SCORER_AUTO)
      sc[n_sc++] = (bp_scorer){.id = id};
  /* three tiers: snapkv with half of each budget warm (no cold tier here:
   * promotions dequantize) */
  if (n_sc < BP_SCORERS_MAX) sc[n_sc++] = (bp_scorer){.id = KVT_SCORER_SNAPKV, .warm = 0.5};
  /* recall's own cost: against the same steps without it */
  if (n_sc + 2 <= BP_SCORERS_MAX) {
    sc[n_sc++] = (bp_scorer){.id = KVT_SCORER_SNAPKV, .attend = 1};
    sc[n_sc++] = (bp_scorer){.id = KVT_SCORER_SNAPKV, .attend = 1, .recall = 1};
  }
  double attn[BP_ROUNDS_MAX], plain[BP_ROUNDS_MAX];
  for (uint32_t round = 0; round < R && rc == CLI_OK; round++) {
    progress("bench policy: round %u of %u", round + 1, R);
    rc = bp_attention(r, &attn[round]);
    plain[round] = bp_plain_attention(r);
    for (uint32_t i = 0; i < n_sc && rc == CLI_OK; i++)
      if (!sc[i].skipped) rc = bp_scorer_round(r, &sc[i], round);
  }
  progress_end();
  if (rc == CLI_OK) bp_print(r, sc, n_sc, median_f64(attn, R), median_f64(plain, R));
  return rc;
}

int bench_policy(int argc, char **argv) {
  bp_run *r = calloc(1, sizeof *r);
  if (!r) return cli_lib_error("bench policy", "allocating", -ENOMEM);
  cli_opt o[BP_N_OPTS];
  bp_opts(&r->cfg, o);
  r->cfg.tokens = 512;
  r->cfg.block_tokens = 16;
  r->cfg.rounds = 7;
  int want_help = 0;
  int rc = cli_parse("bench policy", argc, argv, o, BP_N_OPTS, &want_help);
  if (want_help) {
    bench_policy_usage(stdout);
    free(r);
    return rc;
  }
  char *end = NULL;
  r->budget = r->cfg.budget_s ? strtod(r->cfg.budget_s, &end) : 0.25;
  if (rc == CLI_OK && r->cfg.budget_s && (*end || !(r->budget > 0 && r->budget <= 1))) {
    fprintf(stderr, "kvtier bench policy: --budget must be in (0, 1]: %s\n", r->cfg.budget_s);
    rc = CLI_USAGE;
  }
  if (rc == CLI_OK && (r->cfg.block_tokens & (r->cfg.block_tokens - 1))) {
    fprintf(stderr, "kvtier bench policy: --block-tokens must be a power of two\n");
    rc = CLI_USAGE;
  }
  if (rc == CLI_OK && r->cfg.tokens < 2 * r->cfg.block_tokens) {
    fprintf(stderr, "kvtier bench policy: --tokens must hold at least two blocks\n");
    rc = CLI_USAGE;
  }
  if (rc == CLI_OK) rc = bp_shape(r);
  if (rc == CLI_OK) {
    bench_dir d;
    rc = bench_dir_open(&d, r->cfg.dir, "bench policy");
    if (rc == CLI_OK) {
      rc = bp_main(r, d.path);
      kvt_seq_release(r->full);
      r->full = NULL;
      kvt_engine_close(r->e);
      r->e = NULL;
      bench_dir_close(&d, "bench policy");
    }
  }
  bp_free(r);
  free(r);
  return rc;
}
