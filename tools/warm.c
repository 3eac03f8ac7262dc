/* warm.c - `kvtier warm`: offline prefix warming. Computes the KV of given
 * token sequences (or text prompts) with the reference decoder and stores
 * their full token blocks durably in the cold tier of a store, so that a
 * later process finds the prefixes by lookup and loads them instead of
 * computing them. Shared prefixes are computed and stored once: a
 * sequence resumes from the longest prefix already stored. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "refcli.h"
#include "util.h"

#define WARM_COLD_BYTES (64ull << 30) /* cold tier limit; segments keep the default size */

typedef struct warm_cfg {
  const char *model, *tokens, *tokenizer, *prompts, *dir, *remote;
  int json;
} warm_cfg;

typedef struct warm_totals {
  uint64_t sequences, tokens, computed, blocks, dedup, written;
  double seconds;
} warm_totals;

#define WARM_N_OPTS 7

static void warm_opts(warm_cfg *c, cli_opt o[WARM_N_OPTS]) {
  const cli_opt opts[WARM_N_OPTS] = {
      {"--model", "M", CLI_STR, &c->model, 0, 0, "llama2.c checkpoint (required)"},
      {"--tokens", "FILE", CLI_STR, &c->tokens, 0, 0,
       "token ids, whitespace-separated, one sequence a line"},
      {"--tokenizer", "T", CLI_STR, &c->tokenizer, 0, 0, "llama2.c tokenizer for --prompts"},
      {"--prompts", "FILE", CLI_STR, &c->prompts, 0, 0, "text prompts, one a line"},
      {"--dir", "D", CLI_STR, &c->dir, 0, 0, "the store (required; created when missing)"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the figures as one JSON object"},
      CLI_OPT_REMOTE(&c->remote),
  };
  memcpy(o, opts, sizeof opts);
}

void warm_usage(FILE *f) {
  warm_cfg c;
  cli_opt o[WARM_N_OPTS];
  warm_opts(&c, o);
  fprintf(f,
          "usage: kvtier warm --model M (--tokens FILE | --tokenizer T --prompts FILE)\n"
          "                   --dir D [--remote URL] [--json]\n\n"
          "Computes the KV of each sequence with the reference decoder (docs/refmodel.md)\n"
          "and stores its full %u-token blocks durably in the cold tier of D (a trailing\n"
          "partial block is not stored). A sequence whose prefix is stored already, by an\n"
          "earlier line or an earlier run, loads it and computes only the rest. Prompts\n"
          "are encoded with BOS first. Reports sequences, tokens, blocks written,\n"
          "blocks deduplicated and tokens computed per second.\n\noptions:\n",
          REF_BLOCK_TOKENS);
  cli_print_opts(f, o, WARM_N_OPTS);
}

static int warm_usage_error(const char *msg) {
  fprintf(stderr, "kvtier warm: %s\nrun 'kvtier help warm' for its options\n", msg);
  return CLI_USAGE;
}

/* Text prompts to token ids, BOS first. */
static int warm_encode(const warm_cfg *c, const rm_model *m, uint32_t ***seqs, uint32_t **lens,
                       size_t *n) {
  rm_tokenizer t;
  int rc = ref_load_tokenizer("warm", c->tokenizer, c->model, m, &t);
  if (rc != CLI_OK) return rc;
  FILE *f = fopen(c->prompts, "r");
  if (!f) {
    fprintf(stderr, "kvtier warm: %s: %s\n", c->prompts, strerror(errno));
    rm_tok_free(&t);
    return CLI_FAIL;
  }
  char *line = NULL;
  size_t cap = 0, count = 0, lineno = 0;
  ssize_t len;
  uint32_t **s = NULL, *l = NULL, ctx = (uint32_t)m->c.seq_len;
  while (rc == CLI_OK && (len = getline(&line, &cap, f)) > 0) {
    lineno++;
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
    if (len == 0) continue;
    const char *nul = memchr(line, 0, (size_t)len);
    if (nul) {
      fprintf(stderr, "kvtier warm: %s line %zu: a NUL byte at column %zu (prompts are text)\n",
              c->prompts, lineno, (size_t)(nul - line) + 1);
      rc = CLI_FAIL;
      break;
    }
    /* Refused before encoding: BPE time grows with the line, the context does not. */
    size_t least = 1 + rm_tok_min_ids(&t, (size_t)len);
    if (least > ctx) {
      fprintf(stderr, "kvtier warm: %s line %zu: %zd bytes, at least %zu tokens, beyond the "
              "model's context (%u)\n", c->prompts, lineno, len, least, ctx);
      rc = CLI_FAIL;
      break;
    }
    uint32_t *ids = malloc(((size_t)len + 3) * sizeof *ids);
    size_t k = 0;
    uint32_t **ns = realloc(s, (count + 1) * sizeof *ns), *nl = ns ? realloc(l, (count + 1) * sizeof *nl) : NULL;
    if (ns) s = ns;
    if (nl) l = nl;
    int erc = ids && ns && nl ? rm_tok_encode(&t, line, 1, ids, (size_t)len + 3, &k) : -1;
    if (erc == -2) {
      free(ids);
      fprintf(stderr, "kvtier warm: %s line %zu: byte 0x%02x at column %zu has no piece in the "
              "tokenizer and no byte-fallback id below its vocabulary size (%u)\n", c->prompts,
              lineno, (unsigned)(uint8_t)line[k], k + 1, t.vocab_size);
      rc = CLI_FAIL;
    } else if (erc) {
      free(ids);
      fprintf(stderr, "kvtier warm: out of memory encoding %s\n", c->prompts);
      rc = CLI_FAIL;
    } else if (k > ctx) {
      free(ids);
      fprintf(stderr, "kvtier warm: %s line %zu: %zu tokens, beyond the model's context (%u)\n",
              c->prompts, lineno, k, ctx);
      rc = CLI_FAIL;
    } else {
      s[count] = ids;
      l[count++] = (uint32_t)k;
    }
  }
  free(line);
  fclose(f);
  rm_tok_free(&t);
  if (rc == CLI_OK && count == 0) {
    fprintf(stderr, "kvtier warm: %s holds no prompt\n", c->prompts);
    rc = CLI_FAIL;
  }
  if (rc != CLI_OK) {
    ref_free_tokens(s, l, count);
    return rc;
  }
  *seqs = s;
  *lens = l;
  *n = count;
  return CLI_OK;
}

/* One sequence: resume from what is stored, compute the rest of its full
 * blocks (each completed block is appended and put, layer by layer). A
 * stored block that fails its check when loaded is a miss: computed again
 * with the rest, and written again. */
static int warm_one(kvt_engine *e, kvt_ns_id ns, const rm_model *m, const uint32_t *tok,
                    uint32_t n, warm_totals *t) {
  uint32_t full = n / REF_BLOCK_TOKENS * REF_BLOCK_TOKENS;
  size_t found = 0, done = 0;
  int rc = kvt_lookup(e, ns, tok, full, NULL, 0, &found);
  if (rc) return rc;
  t->sequences++;
  t->tokens += n;
  t->blocks += full / REF_BLOCK_TOKENS;
  if (found * REF_BLOCK_TOKENS == full) { /* every full block stored already */
    t->dedup += found;
    return 0;
  }
  rm_dec d;
  if ((rc = rm_dec_init(&d, m, e, ns))) return rc;
  d.observe = 0; /* no policy runs here: nothing to observe for */
  rc = rm_dec_resume(&d, tok, full, &done); /* stops at a stored block that fails its check */
  t->dedup += done / REF_BLOCK_TOKENS;
  for (uint32_t p = (uint32_t)done; !rc && p < full; p++) rc = rm_dec_step(&d, tok[p], NULL);
  t->computed += full - done;
  rm_dec_free(&d);
  return rc;
}

/* Tokens computed per second; NaN (null in JSON) when nothing was computed:
 * tokens found stored cost no computing and say nothing of its speed. */
static double warm_rate(const warm_totals *t) {
  return t->computed && t->seconds > 0 ? (double)t->computed / t->seconds : NAN;
}

static int warm_main(const warm_cfg *c, const rm_model *m, uint32_t **seqs, const uint32_t *lens,
                     size_t n) {
  kvt_options o;
  kvt_options_init(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = 512u << 20;
  o.tier_bytes_limit[KVT_TIER_COLD] = WARM_COLD_BYTES;
  kvt_engine *e;
  kvt_ns_id ns;
  int rc = cli_engine_open_remote(c->dir, &o, c->remote, &e);
  if (rc) {
    char what[600];
    snprintf(what, sizeof what, "opening the store in '%s'", c->dir);
    return cli_lib_error("warm", what, rc);
  }
  if ((rc = rm_ns_register(e, m, REF_BLOCK_TOKENS, &ns))) {
    kvt_engine_close(e);
    return cli_lib_error("warm", "registering the model's namespace", rc);
  }
  kvt_stats s0, s1;
  kvt_stats_get(e, &s0);
  warm_totals t = {0};
  uint64_t t0 = now_ns();
  for (size_t i = 0; i < n && !rc; i++) {
    progress("warm: sequence %zu of %zu, %" PRIu64 " blocks deduplicated", i + 1, n, t.dedup);
    rc = warm_one(e, ns, m, seqs[i], lens[i], &t);
  }
  progress_end();
  int sync_rc = rc ? 0 : kvt_sync(e);
  t.seconds = (double)(now_ns() - t0) * 1e-9;
  kvt_stats_get(e, &s1);
  kvt_remote_stats rs; /* before close, which finishes the remote writes still queued */
  cli_remote_get(e, &rs);
  kvt_engine_close(e);
  if (rc) return cli_lib_error("warm", "computing KV", rc);
  if (sync_rc) return cli_lib_error("warm", "making the blocks durable (kvt_sync)", sync_rc);
  t.written = s1.cold_written - s0.cold_written;
  if (c->json) {
    json_w j;
    json_begin(&j, stdout);
    json_str(&j, "model", m->name);
    json_str(&j, "dir", c->dir);
    json_u64(&j, "sequences", t.sequences);
    json_u64(&j, "tokens", t.tokens);
    json_u64(&j, "tokens_computed", t.computed);
    json_u64(&j, "blocks", t.blocks);
    json_u64(&j, "blocks_written", t.written);
    json_u64(&j, "blocks_deduplicated", t.dedup);
    json_u64(&j, "cold_records", s1.cold_records);
    json_f64(&j, "seconds", t.seconds);
    json_f64(&j, "tokens_per_s", warm_rate(&t)); /* null: nothing computed */
    cli_remote_json(&j, &rs);
    json_end(&j);
    return CLI_OK;
  }
  printf("warmed %s with %s (%u-token blocks)\n\n", c->dir, m->name, REF_BLOCK_TOKENS);
  printf("  sequences            %10" PRIu64 "\n", t.sequences);
  printf("  tokens               %10" PRIu64 "  (%" PRIu64 " computed; the rest stored already, or in\n"
         "                                   a partial last block, which is not stored)\n",
         t.tokens, t.computed);
  printf("  full blocks          %10" PRIu64 "\n", t.blocks);
  printf("  blocks written       %10" PRIu64 "  (durable, all layers)\n", t.written);
  printf("  blocks deduplicated  %10" PRIu64 "  (stored already: shared prefixes)\n", t.dedup);
  printf("  store                %10" PRIu64 " token blocks in the cold tier\n", s1.cold_records);
  if (t.computed)
    printf("  speed                %10.0f tokens/s computed  (%.2f s)\n", warm_rate(&t), t.seconds);
  else
    printf("  speed                %10s  (nothing computed; %.2f s)\n", "-", t.seconds);
  cli_remote_print(&rs);
  return CLI_OK;
}

int cmd_warm(int argc, char **argv) {
  warm_cfg c = {0};
  cli_opt o[WARM_N_OPTS];
  warm_opts(&c, o);
  int want_help = 0, rc = cli_parse("warm", argc - 1, argv + 1, o, WARM_N_OPTS, &want_help);
  if (want_help) warm_usage(stdout);
  if (rc != CLI_OK || want_help) return rc;
  if (!c.model) return warm_usage_error("--model is required");
  if (!c.dir) return warm_usage_error("--dir is required");
  if (!c.tokens == !c.prompts) return warm_usage_error("give either --tokens or --prompts");
  if (c.tokenizer && !c.prompts) return warm_usage_error("--tokenizer goes with --prompts");
  rm_model m;
  if ((rc = ref_load_model("warm", c.model, &m)) != CLI_OK) return rc;
  uint32_t **seqs = NULL, *lens = NULL;
  size_t n = 0;
  rc = c.tokens ? ref_read_tokens("warm", c.tokens, (uint32_t)m.c.vocab_size,
                                  (uint32_t)m.c.seq_len, &seqs, &lens, &n)
                : warm_encode(&c, &m, &seqs, &lens, &n);
  if (rc == CLI_OK) rc = warm_main(&c, &m, seqs, lens, n);
  ref_free_tokens(seqs, lens, n);
  rm_model_free(&m);
  return rc;
}
