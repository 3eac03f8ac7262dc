/* bench_codec.c - `kvtier bench codec`: the warm tier's codecs measured
 * through the public API on Llama-3-8B layer blocks (16 tokens x 8 KV heads
 * x head_dim 128, f16). Speed: encode and decode against memcpy of the
 * same bytes, single-threaded, interleaved rounds, medians. Error: V NMSE
 * on Gaussian vectors next to Lloyd-Max theory; K relative error of q.k on
 * realistic (outlier channels) and Gaussian keys; the attention output of
 * kvt_seq_attend over a warm context against exact attention in double.
 * And attention in place against gather (dequantize) + attention here.
 * Split by section: bench_codec_speed.c (speed, error), bench_codec_attn.c
 * (attention), this file the report and the command (bench_codec.h). */
#include "bench_codec.h"

/* ---- report -------------------------------------------------------------------------- */

typedef struct target {
  const char *name;
  double value, want;
} target;

#define N_TARGETS 4

static void targets_of(const codec_run *r, target t[N_TARGETS])
{
  t[0] = (target){"v3_decode_vs_memcpy", r->res[CI_V3].dec_x, 0.25};
  t[1] = (target){"v3_encode_vs_memcpy", r->res[CI_V3].enc_x, 0.1};
  t[2] = (target){"k8_decode_vs_memcpy", r->res[CI_K8].dec_x, 0.5};
  t[3] = (target){"attend_vs_dequant", r->at.speedup, 1.0};
}

static void json_codec(json_w *j, const codec_run *r, int ci)
{
  const codec_res *c = &r->res[ci];
  json_obj(j, cname(ci));
  json_f64(j, "bits_per_value", c->bits);
  json_u64(j, "encoded_bytes", c->enc_bytes);
  json_f64(j, "encode_gbps", c->enc);
  json_f64(j, "decode_gbps", c->dec);
  json_f64(j, "memcpy_gbps", c->mem);
  json_f64(j, "encode_vs_memcpy", c->enc_x);
  json_f64(j, "decode_vs_memcpy", c->dec_x);
  size_t n = r->cfg.rounds;
  json_f64(j, "encode_gbps_min", c->enc_gbps[0]);
  json_f64(j, "encode_gbps_max", c->enc_gbps[n - 1]);
  json_f64(j, "decode_gbps_min", c->dec_gbps[0]);
  json_f64(j, "decode_gbps_max", c->dec_gbps[n - 1]);
  if (ci >= N_KC) {
    json_f64(j, "v_nmse", c->v_nmse);
    json_f64(j, "v_nmse_theory", lloyd_max_nmse(codec_ids[ci]));
    json_f64(j, "v_nmse_vs_theory", c->v_nmse / lloyd_max_nmse(codec_ids[ci]));
  } else {
    json_f64(j, "qk_rel_err", c->qk_real);
    json_f64(j, "qk_rel_err_gaussian", c->qk_gauss);
    json_f64(j, "qk_rel_err_at_8_bits", c->qk_adj);
  }
  json_f64(j, "attn_rel_err_alone", c->attn_alone);
  json_end(j);
}

static void json_report(const codec_run *r)
{
  json_w j;
  json_begin(&j, stdout);
  json_str(&j, "command", "bench codec");
  json_u64(&j, "block_tokens", C_TOKENS);
  json_u64(&j, "n_kv_heads", C_HEADS);
  json_u64(&j, "head_dim", C_DIM);
  json_str(&j, "dtype", "f16");
  json_u64(&j, "working_set_bytes", r->ws);
  json_u64(&j, "l3_bytes", r->l3_bytes);
  json_u64(&j, "rounds", r->cfg.rounds);
  json_u64(&j, "seed", r->cfg.seed);
  json_obj(&j, "codecs");
  for (int ci = 0; ci < N_CODECS; ci++) json_codec(&j, r, ci);
  json_end(&j);
  json_str(&j, "best_k_codec_realistic", cname(r->best_k));
  json_obj(&j, "attention");
  json_u64(&j, "tokens", r->cfg.tokens);
  json_u64(&j, "q_heads", C_QHEADS);
  json_u64(&j, "queries", ATT_QUERIES);
  json_f64(&j, "hot", r->attn_hot);
  for (int ki = 0; ki < N_KC; ki++)
    for (int vi = N_KC; vi < N_CODECS; vi++) {
      char name[16];
      snprintf(name, sizeof name, "%s%s", cname(ki), cname(vi));
      json_f64(&j, name, r->attn_pair[ki][vi - N_KC]);
    }
  json_end(&j);
  const attend_res *a = &r->at;
  json_obj(&j, "attend_vs_dequant");
  char pair[16];
  snprintf(pair, sizeof pair, "%s%s", kvt_codec_name(a->k_codec), kvt_codec_name(a->v_codec));
  json_str(&j, "codec", pair);
  json_u64(&j, "layers", C_LAYERS);
  json_u64(&j, "tokens", a->tokens);
  json_u64(&j, "warm_bytes", a->warm_bytes);
  json_str(&j, "tool_kernel", r->simd ? "avx2" : "scalar");
  json_f64(&j, "attend_s", a->att);
  json_f64(&j, "dequant_s", a->deq);
  json_f64(&j, "dequant_gather_s", a->gat);
  json_f64(&j, "dequant_compute_s", a->cmp);
  json_f64(&j, "speedup", a->speedup);
  json_f64(&j, "speedup_ratio_of_medians", a->speedup_m);
  json_f64(&j, "outputs_rel_diff", a->rel_diff);
  json_f64(&j, "fused_s", a->fus);
  json_f64(&j, "speedup_vs_fused", a->fspeedup);
  json_f64(&j, "speedup_vs_fused_ratio_of_medians", a->fspeedup_m);
  json_f64(&j, "fused_outputs_rel_diff", a->frel_diff);
  json_u64(&j, "rounds", a->rounds);
  json_bool(&j, "summaries_agree", fabs(a->speedup_m / a->speedup - 1) <= AGREE &&
                                        fabs(a->fspeedup_m / a->fspeedup - 1) <= AGREE);
  json_end(&j);
  target t[N_TARGETS];
  targets_of(r, t);
  json_obj(&j, "targets");
  for (int i = 0; i < N_TARGETS; i++) json_bool(&j, t[i].name, t[i].value >= t[i].want);
  json_end(&j);
  json_end(&j);
}

static void human_speed(const codec_run *r)
{
  char b1[32], b2[32];
  printf("bench codec: warm codecs on Llama-3-8B layer blocks (%u tokens x %u KV heads x %u, "
         "f16)\nworking set %s of f16 per codec (L3 %s), one thread, %" PRIu64
         " interleaved rounds, medians, seed %" PRIu64 "\n\n",
         C_TOKENS, C_HEADS, C_DIM, fmt_bytes(b1, sizeof b1, r->ws),
         r->l3_bytes ? fmt_bytes(b2, sizeof b2, r->l3_bytes) : "unknown", r->cfg.rounds,
         r->cfg.seed);
  printf("  codec  bits/value  encode GB/s (x memcpy)  decode GB/s (x memcpy)  memcpy GB/s  "
         "error\n");
  for (int ci = 0; ci < N_CODECS; ci++) {
    const codec_res *c = &r->res[ci];
    printf("  %-5s  %10.3f  %11.2f (%5.3f)      %11.2f (%5.3f)      %11.2f  ", cname(ci), c->bits,
           c->enc, c->enc_x, c->dec, c->dec_x, c->mem);
    if (ci >= N_KC)
      printf("NMSE %.5f (theory %.5f, x%.3f)\n", c->v_nmse, lloyd_max_nmse(codec_ids[ci]),
             c->v_nmse / lloyd_max_nmse(codec_ids[ci]));
    else
      printf("q.k %.5f realistic, %.5f Gaussian keys\n", c->qk_real, c->qk_gauss);
  }
}

static void human_attention(const codec_run *r)
{
  printf("\n  attention over %" PRIu64 " tokens (%u query heads, %u queries): "
         "||o' - o|| / ||o|| against exact attention in double\n", r->cfg.tokens, C_QHEADS,
         ATT_QUERIES);
  printf("         ");
  for (int vi = N_KC; vi < N_CODECS; vi++) printf("%10s", cname(vi));
  printf("   K alone\n");
  for (int ki = 0; ki < N_KC; ki++) {
    printf("    %-5s", cname(ki));
    for (int vi = N_KC; vi < N_CODECS; vi++) printf("%10.5f", r->attn_pair[ki][vi - N_KC]);
    printf("%10.5f\n", r->res[ki].attn_alone);
  }
  printf("  V alone");
  for (int vi = N_KC; vi < N_CODECS; vi++) printf("%10.5f", r->res[vi].attn_alone);
  printf("\n    hot blocks (f16, exact): %.2g\n", r->attn_hot);
  const codec_res *b = &r->res[r->best_k];
  printf("\n  best key codec on realistic keys per bit: %s (q.k error %.5f at %.3f bits/value; "
         "error x 2^(bits-8) = %.5f", cname(r->best_k), b->qk_real, b->bits, b->qk_adj);
  for (int ci = 0; ci < N_KC; ci++)
    if (ci != r->best_k) printf(", %s %.5f", cname(ci), r->res[ci].qk_adj);
  printf(")\n");
}

static void human_report(const codec_run *r)
{
  human_speed(r);
  human_attention(r);
  const attend_res *a = &r->at;
  char b1[32];
  printf("\n  attend in place vs dequantize-then-attend: %s%s, %u layers x %u tokens warm (%s), "
         "32 query heads, medians\n", kvt_codec_name(a->k_codec), kvt_codec_name(a->v_codec),
         C_LAYERS, a->tokens, fmt_bytes(b1, sizeof b1, a->warm_bytes));
  printf("    kvt_seq_attend           %8.2f ms\n", 1e3 * a->att);
  printf("    gather + attend (%s)  %8.2f ms  (gather %.2f, attention %.2f)\n",
         r->simd ? "AVX2" : "C   ", 1e3 * a->deq, 1e3 * a->gat, 1e3 * a->cmp);
  printf("    tile decode + attend     %8.2f ms  (fused: one block decoded at a time, "
         "online softmax)\n", 1e3 * a->fus);
  printf("    speedup %.2fx vs gather + attend, %.2fx vs fused (> 1: in place is faster; medians\n"
         "    of per-round ratios over %u rounds; ratios of medians %.2fx, %.2fx); outputs "
         "differ by %.2g, %.2g\n", a->speedup, a->fspeedup, a->rounds, a->speedup_m,
         a->fspeedup_m, a->rel_diff, a->frel_diff);
  target t[N_TARGETS];
  targets_of(r, t);
  printf("\n  targets:");
  for (int i = 0; i < N_TARGETS; i++)
    printf(" %s %.3f %s %.2f%s", t[i].name, t[i].value, t[i].value >= t[i].want ? ">=" : "<",
           t[i].want, i + 1 < N_TARGETS ? ";" : "\n");
}

/* ---- command ------------------------------------------------------------------------- */

#define CODEC_N_OPTS 9

static void codec_opts(codec_cfg *c, cli_opt o[CODEC_N_OPTS])
{
  const cli_opt t[CODEC_N_OPTS] = {
      {"--mib", "M", CLI_U64, &c->mib, MIB_MIN, MIB_MAX,
       "f16 working set per codec in MiB, 64 to 8192 (default: 2 x the L3 cache, at least 512)"},
      {"--rounds", "R", CLI_U64, &c->rounds, 3, ROUNDS_MAX,
       "interleaved rounds, 3 to 99 (default 7)"},
      {"--tokens", "T", CLI_U64, &c->tokens, C_TOKENS, TOKENS_MAX,
       "context of the attention error test, a multiple of 16 (default 4096)"},
      {"--attend-tokens", "T", CLI_U64, &c->attend_tokens, C_TOKENS, TOKENS_MAX,
       "context per layer of the attend timing, 32 layers (default 8192)"},
      {"--codec", "KV", CLI_STR, &c->codec, 0, 0, "codec pair of the attend timing (default k8v3)"},
      {"--seed", "S", CLI_U64, &c->seed, 0, UINT64_MAX, "seed of KV and queries (default 1)"},
      {"--dir", "D", CLI_STR, &c->dir, 0, 0, "store directory (default: a scratch one, removed)"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the figures as one JSON object"},
      CLI_OPT_REMOTE(&c->remote),
  };
  memcpy(o, t, sizeof t);
}

void bench_codec_usage(FILE *f)
{
  codec_cfg c;
  cli_opt o[CODEC_N_OPTS];
  codec_opts(&c, o);
  fprintf(f, "\nbench codec: the warm codecs (k8, k8c, k4, v2, v3, v4) on Llama-3-8B layer\n"
             "blocks. Encode and decode GB/s of f16 against memcpy of the same bytes (one\n"
             "thread, interleaved rounds, medians) and bits per value (kvt_codec_size).\n"
             "Error: v_nmse on Gaussian vectors next to Lloyd-Max theory; qk_rel_err, RMS of\n"
             "q.k' - q.k over RMS of q.k, on realistic keys (outlier channels; and _gaussian);\n"
             "attention output error of kvt_seq_attend on a warm context against exact\n"
             "attention in double, per codec pair. And kvt_seq_attend against gather\n"
             "(dequantize) + attention in f32: speedup = dequant time / attend time.\n");
  cli_print_opts(f, o, CODEC_N_OPTS);
}

static int codec_check_cfg(codec_cfg *c, attend_res *a)
{
  if (c->tokens % C_TOKENS != 0 || c->attend_tokens % C_TOKENS != 0) {
    fprintf(stderr, "kvtier bench codec: --tokens and --attend-tokens must be multiples of %u\n",
            C_TOKENS);
    return CLI_USAGE;
  }
  if (kvt_codec_parse(c->codec, &a->k_codec, &a->v_codec) != 0) {
    fprintf(stderr, "kvtier bench codec: --codec '%s' is not a codec pair such as k8v3, k8cv3, "
            "k4v2\nrun 'kvtier help bench' for its options\n", c->codec);
    return CLI_USAGE;
  }
  a->tokens = (uint32_t)c->attend_tokens;
  a->blocks = a->tokens / C_TOKENS;
  return CLI_OK;
}

static int codec_main(codec_run *r)
{
  r->l3_bytes = cpu_l3_bytes();
  r->simd = cpu_avx2();
  int rc = speed_all(r);
  if (rc == CLI_OK) rc = error_tests(r);
  if (rc == CLI_OK) rc = attention_tests(r);
  if (rc == CLI_OK) rc = attend_timing(r);
  if (rc != CLI_OK) return rc;
  if (r->cfg.json) json_report(r);
  else human_report(r);
  return CLI_OK;
}

int bench_codec(int argc, char **argv)
{
  codec_cfg cfg = {.mib = 0, .rounds = 7, .tokens = 4096, .attend_tokens = 8192, .seed = 1,
                   .codec = "k8v3"};
  cli_opt opts[CODEC_N_OPTS];
  codec_opts(&cfg, opts);
  int want_help = 0;
  int rc = cli_parse("bench codec", argc, argv, opts, CODEC_N_OPTS, &want_help);
  if (want_help) bench_usage(stdout);
  if (rc != CLI_OK || want_help) return rc;
  if (cfg.remote) { /* its engines register one model id with 1 and with 32 layers */
    fprintf(stderr, "kvtier bench codec: --remote: bench codec measures the codecs in RAM and "
                    "its engines register one model id with two shapes, which a cluster's "
                    "shared namespaces refuse; 'kvtier bench remote --url URL' measures the "
                    "remote tier (docs/remote.md)\n");
    return CLI_USAGE;
  }
  codec_run *r = calloc(1, sizeof *r);
  if (r == NULL) return codec_fail("allocating state", -ENOMEM);
  r->cfg = cfg;
  if (r->cfg.mib == 0) { /* twice L3, so the codecs run from memory, not the cache */
    uint64_t l3_mib = (cpu_l3_bytes() + (1u << 20) - 1) >> 20;
    r->cfg.mib = 2 * l3_mib < 512 ? 512 : 2 * l3_mib > MIB_MAX ? MIB_MAX : 2 * l3_mib;
  }
  rc = codec_check_cfg(&r->cfg, &r->at);
  bench_dir d;
  if (rc == CLI_OK) rc = bench_dir_open(&d, cfg.dir, "bench codec");
  if (rc == CLI_OK) {
    r->dir = d.path;
    rc = codec_main(r);
    bench_dir_close(&d, "bench codec");
  }
  free(r->src);
  free(r->dst);
  free(r->enc);
  free(r->pool_k);
  free(r->pool_v);
  free(r);
  return rc;
}
