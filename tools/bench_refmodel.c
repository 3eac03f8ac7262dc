/* bench_refmodel.c - `kvtier bench refmodel`: decoder steps per second of
 * the reference model with kvtier as its KV cache against the same decoder
 * with a plain array cache, in the same run: rounds interleaved, the order
 * within a round alternating (plain first, then kvtier first), medians of
 * the per-round ratios.
 * Each kvtier round decodes a sequence of its own, so no block is found
 * stored (dedup would flatter kvtier). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "refcli.h"
#include "sample.h"
#include "util.h"

typedef struct brm_cfg {
  const char *model, *dir, *remote;
  uint64_t tokens, rounds;
  int json;
} brm_cfg;

#define BRM_N_OPTS 6

static void brm_opts(brm_cfg *c, cli_opt o[BRM_N_OPTS]) {
  const cli_opt opts[BRM_N_OPTS] = {
      {"--model", "M", CLI_STR, &c->model, 0, 0, "llama2.c checkpoint (required)"},
      {"--tokens", "T", CLI_U64, &c->tokens, 32, 1u << 20,
       "tokens decoded per round, up to the context (default: the context)"},
      {"--rounds", "R", CLI_U64, &c->rounds, 1, 1000, "rounds of each (default 7)"},
      {"--dir", "D", CLI_STR, &c->dir, 0, 0, "store directory (default: a scratch one)"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the figures as one JSON object"},
      CLI_OPT_REMOTE(&c->remote),
  };
  memcpy(o, opts, sizeof opts);
}

void bench_refmodel_usage(FILE *f) {
  brm_cfg c;
  cli_opt o[BRM_N_OPTS];
  brm_opts(&c, o);
  fprintf(f, "\nbench refmodel: decoder steps per second of the reference model (a llama2.c\n"
             "checkpoint, docs/refmodel.md) with kvtier as its KV cache (append, put per\n"
             "layer, kvt_seq_attend, kvt_seq_observe) against the same decoder with a plain\n"
             "array cache; rounds interleaved, the order alternating; kvtier_vs_plain is the\n"
             "median of the per-round ratios.\n");
  cli_print_opts(f, o, BRM_N_OPTS);
}

/* Seconds to teacher-force tok[0..n) through a decoder on cache e (NULL:
 * plain); < 0 on failure (rc set). */
static double brm_round(const rm_model *m, kvt_engine *e, kvt_ns_id ns, const uint32_t *tok,
                        uint32_t n, int *rc) {
  rm_dec d;
  if ((*rc = rm_dec_init(&d, m, e, ns))) return -1;
  uint64_t t0 = now_ns();
  for (uint32_t i = 0; i < n && !*rc; i++) *rc = rm_dec_step(&d, tok[i], NULL);
  double s = (double)(now_ns() - t0) * 1e-9;
  rm_dec_free(&d);
  return *rc ? -1 : s;
}

static int brm_main(const brm_cfg *c, const rm_model *m, const char *dir) {
  uint32_t n = c->tokens ? (uint32_t)c->tokens : (uint32_t)m->c.seq_len, R = (uint32_t)c->rounds;
  if (n > (uint32_t)m->c.seq_len) {
    fprintf(stderr, "kvtier bench refmodel: --tokens %u is beyond the model's context (%d)\n", n,
            m->c.seq_len);
    return CLI_USAGE;
  }
  kvt_options o;
  kvt_options_init(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = 256u << 20;
  kvt_engine *e;
  kvt_ns_id ns;
  int rc = cli_engine_open_remote(dir, &o, c->remote, &e);
  if (rc) return cli_lib_error("bench refmodel", "opening the engine", rc);
  if ((rc = rm_ns_register(e, m, REF_BLOCK_TOKENS, &ns))) {
    kvt_engine_close(e);
    return cli_lib_error("bench refmodel", "registering the namespace", rc);
  }
  uint32_t *tok = malloc((size_t)(R + 1) * n * sizeof *tok);
  double *tp = calloc(3 * (size_t)R, sizeof *tp), *tk = tp + R, *ratio = tk + R;
  if (!tok || !tp) rc = -ENOMEM;
  /* R + 1 sequences: one to warm up (caches, page faults), one per round. */
  for (uint32_t r = 0; !rc && r <= R; r++) rc = rm_sample(m, 1000 + r, n, tok + (size_t)r * n);
  for (uint32_t r = 0; !rc && r <= R; r++) {
    progress("bench refmodel: round %u of %u", r, R);
    const uint32_t *t = tok + (size_t)r * n;
    double p, k; /* odd rounds kvtier first: whichever runs second finds caches warmer */
    if (r % 2 == 0) {
      p = brm_round(m, NULL, 0, t, n, &rc);
      k = rc ? -1 : brm_round(m, e, ns, t, n, &rc);
    } else {
      k = brm_round(m, e, ns, t, n, &rc);
      p = rc ? -1 : brm_round(m, NULL, 0, t, n, &rc);
    }
    if (r) tp[r - 1] = n / p, tk[r - 1] = n / k, ratio[r - 1] = p / k;
  }
  progress_end();
  kvt_stats st;
  kvt_stats_get(e, &st);
  kvt_remote_stats rs;
  cli_remote_get(e, &rs);
  kvt_engine_close(e);
  free(tok);
  if (rc) {
    free(tp);
    return cli_lib_error("bench refmodel", "decoding", rc);
  }
  double plain = median_f64(tp, R), kvt = median_f64(tk, R), vs = median_f64(ratio, R);
  free(tp);
  if (c->json) {
    json_w j;
    json_begin(&j, stdout);
    json_str(&j, "model", m->name);
    json_u64(&j, "tokens", n);
    json_u64(&j, "rounds", R);
    json_f64(&j, "plain_steps_per_s", plain);
    json_f64(&j, "kvtier_steps_per_s", kvt);
    json_f64(&j, "kvtier_vs_plain", vs);
    json_f64(&j, "kvtier_vs_plain_ratio_of_medians", kvt / plain);
    json_u64(&j, "attends", st.attends);
    cli_remote_json(&j, &rs);
    json_end(&j);
    return CLI_OK;
  }
  printf("reference decoder %s, %u tokens per round, %u rounds, order alternating (medians)\n\n",
         m->name, n, R);
  printf("  plain array cache  %10.0f steps/s\n", plain);
  printf("  kvtier cache       %10.0f steps/s\n", kvt);
  printf("  kvtier_vs_plain    %10.2f  (median of per-round ratios; ratio of medians %.2f)\n", vs,
         kvt / plain);
  cli_remote_print(&rs);
  return CLI_OK;
}

int bench_refmodel(int argc, char **argv) {
  brm_cfg c = {.rounds = 7};
  cli_opt o[BRM_N_OPTS];
  brm_opts(&c, o);
  int want_help = 0, rc = cli_parse("bench refmodel", argc, argv, o, BRM_N_OPTS, &want_help);
  if (want_help) bench_refmodel_usage(stdout);
  if (rc != CLI_OK || want_help) return rc;
  if (!c.model) {
    fprintf(stderr, "kvtier bench refmodel: --model is required\nrun 'kvtier help bench' for its "
                    "options\n");
    return CLI_USAGE;
  }
  rm_model m;
  if ((rc = ref_load_model("bench refmodel", c.model, &m)) != CLI_OK) return rc;
  bench_dir d;
  rc = bench_dir_open(&d, c.dir, "bench refmodel");
  if (rc == CLI_OK) {
    rc = brm_main(&c, &m, d.path);
    bench_dir_close(&d, "bench refmodel");
  }
  rm_model_free(&m);
  return rc;
}
