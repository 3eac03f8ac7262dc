/* stat.c - `kvtier stat`: what a store holds, read through a read-only
 * engine (no lock, so it works beside a live writer); `kvtier fsck`: every
 * cold-tier index entry checked against its record on disk (kvt_fsck),
 * broken ones removed with --repair. Public API only, plus stat() of the
 * segment files for the bytes they take on disk. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmds.h"
#include "util.h"

static const char *const tier_names[KVT_N_TIERS] = {"none", "hot", "warm", "cold"};

static const char *dtype_name(uint32_t dt)
{
  switch (dt) {
  case KVT_F32: return "f32";
  case KVT_F16: return "f16";
  case KVT_BF16: return "bf16";
  default: return "?";
  }
}

static void key_hex(const kvt_key *k, char out[33])
{
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) {
    out[2 * i] = hex[k->b[i] >> 4];
    out[2 * i + 1] = hex[k->b[i] & 15];
  }
  out[32] = '\0';
}

/* ---- the segment files on disk ------------------------------------------- */

typedef struct seg_files {
  uint64_t n;           /* segments/seg-* files */
  uint64_t bytes;       /* their apparent sizes, summed */
  uint64_t largest;
} seg_files;

static void seg_files_scan(const char *dir, seg_files *sf)
{
  memset(sf, 0, sizeof *sf);
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/segments", dir) >= (int)sizeof path) return;
  DIR *d = opendir(path);
  if (d == NULL) return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strncmp(de->d_name, "seg-", 4) != 0) continue;
    char file[PATH_MAX];
    struct stat sb;
    if (snprintf(file, sizeof file, "%s/%s", path, de->d_name) >= (int)sizeof file) continue;
    if (stat(file, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    sf->n++;
    sf->bytes += (uint64_t)sb.st_size;
    if ((uint64_t)sb.st_size > sf->largest) sf->largest = (uint64_t)sb.st_size;
  }
  closedir(d);
}

/* ---- kvtier stat ------------------------------------------------------------ */

typedef struct stat_cfg {
  const char *dir, *remote;
  int json;
  int prometheus;
} stat_cfg;

#define STAT_N_OPTS 3

static void stat_opts(stat_cfg *c, cli_opt o[STAT_N_OPTS])
{
  const cli_opt t[STAT_N_OPTS] = {
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the figures as one JSON object"},
      {"--prometheus", NULL, CLI_FLAG, &c->prometheus, 0, 0,
       "print the metrics in the Prometheus text format (kvt_metrics_render, "
       "docs/metrics.md)"},
      CLI_OPT_REMOTE(&c->remote),
  };
  memcpy(o, t, sizeof t);
}

void stat_usage(FILE *f)
{
  stat_cfg c;
  cli_opt o[STAT_N_OPTS];
  stat_opts(&c, o);
  fprintf(f, "usage: kvtier stat DIR [--remote URL] [--json | --prometheus]\n\n"
             "Opens the store in DIR read-only (no lock: works beside a live writer) and\n"
             "prints its namespaces (model, fingerprint, tensor-parallel rank, shape), the\n"
             "blocks and bytes per tier, the cold tier's records, segments and their fill\n"
             "(live bytes / (segments x the segment size the store records)), checksum\n"
             "failures, the learned eviction models it keeps for the next writer (the\n"
             "accesses each had counted: a writer starts from them, not from nothing) and\n"
             "the I/O backend with the reason it was chosen. The RAM tiers are those of\n"
             "this read-only process (empty): what the store holds is its cold tier.\n"
             "\noptions:\n");
  cli_print_opts(f, o, STAT_N_OPTS);
}

/* Split argv[1..argc) into the one positional DIR and the options, which
 * go to rest[0..*n_rest) for cli_parse(). A value after an option that
 * takes one ("--opt VALUE") is not a positional. */
static int take_dir(const char *cmd, int argc, char **argv, const cli_opt *opts, size_t n_opts,
                    const char **dir, char **rest, int *n_rest)
{
  *dir = NULL;
  *n_rest = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2) == 0 || strcmp(a, "-h") == 0) {
      rest[(*n_rest)++] = argv[i];
      for (size_t k = 0; k < n_opts; k++)
        if (opts[k].kind != CLI_FLAG && strcmp(opts[k].name, a) == 0 && i + 1 < argc)
          rest[(*n_rest)++] = argv[++i];
      continue;
    }
    if (*dir != NULL) {
      fprintf(stderr, "kvtier %s: one store at a time: '%s' and '%s'\n"
              "run 'kvtier help %s' for its options\n", cmd, *dir, a, cmd);
      return CLI_USAGE;
    }
    *dir = a;
  }
  return CLI_OK;
}

/* Parse the command line; CLI_OK with *dir set, or usage shown / refused. */
static int parse_cmd(const char *cmd, int argc, char **argv, const cli_opt *opts, size_t n_opts,
                     const char **dir, int *want_help)
{
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  if (rest == NULL) return cli_lib_error(cmd, "parsing the command line", -ENOMEM);
  int n_rest = 0;
  int rc = take_dir(cmd, argc, argv, opts, n_opts, dir, rest, &n_rest);
  if (rc == CLI_OK) rc = cli_parse(cmd, n_rest, rest, opts, n_opts, want_help);
  free(rest);
  if (rc != CLI_OK || *want_help) return rc;
  if (*dir == NULL) {
    fprintf(stderr, "kvtier %s: which store? kvtier %s DIR [options]\n"
            "run 'kvtier help %s' for its options\n", cmd, cmd, cmd);
    return CLI_USAGE;
  }
  return CLI_OK;
}

typedef struct stat_ns {
  kvt_ns_id id;
  kvt_ns_desc d;
  kvt_key seed;
} stat_ns;

#define STAT_NS_MAX 65536u

typedef struct stat_run {
  stat_cfg cfg;
  kvt_engine *e;
  kvt_stats st;
  stat_ns *ns;
  uint32_t n_ns;
  seg_files sf;
  uint64_t segment_bytes;
  kvt_tier_stats cold;       /* the cold tier's own counters (admission declines, model) */
  kvt_tier_stats hot;        /* the hot tier's: the model the store keeps for it */
} stat_run;

static int stat_collect(stat_run *r)
{
  kvt_options opt;
  kvt_options_init(&opt);
  opt.flags = KVT_OPEN_RDONLY | KVT_OPEN_NOCREATE;
  int rc = cli_engine_open_remote(r->cfg.dir, &opt, r->cfg.remote, &r->e);
  if (rc == KVT_EINDEX) {
    fprintf(stderr, "kvtier stat: %s: the cold tier's index (%s/index) is damaged or missing; "
            "rebuild it from the segment files with: kvtier fsck --rebuild-index %s\n",
            r->cfg.dir, r->cfg.dir, r->cfg.dir);
    return CLI_FAIL;
  }
  if (rc != 0) {
    char what[PATH_MAX + 64];
    snprintf(what, sizeof what, "opening '%s' read-only", r->cfg.dir);
    return cli_lib_error("stat", what, rc);
  }
  rc = kvt_stats_get(r->e, &r->st);
  if (rc == 0) rc = kvt_stats_tier(r->e, KVT_TIER_COLD, &r->cold, sizeof r->cold);
  if (rc == 0) rc = kvt_stats_tier(r->e, KVT_TIER_HOT, &r->hot, sizeof r->hot);
  if (rc != 0) return cli_lib_error("stat", "reading the counters", rc);
  uint32_t cap = 0;
  for (uint32_t i = 0; i < STAT_NS_MAX; i++) {
    kvt_ns_id id;
    kvt_ns_desc d;
    rc = kvt_ns_get(r->e, i, &id, &d);
    if (rc == KVT_ENOTFOUND) break;
    if (rc != 0) return cli_lib_error("stat", "listing the namespaces", rc);
    if (r->n_ns == cap) {
      cap = cap ? 2 * cap : 8;
      stat_ns *n = realloc(r->ns, cap * sizeof *n);
      if (n == NULL) return cli_lib_error("stat", "listing the namespaces", -ENOMEM);
      r->ns = n;
    }
    stat_ns *s = &r->ns[r->n_ns++];
    s->id = id;
    s->d = d;
    rc = kvt_ns_seed(r->e, id, &s->seed);
    if (rc != 0) return cli_lib_error("stat", "reading a namespace's seed", rc);
  }
  seg_files_scan(r->cfg.dir, &r->sf);
  r->segment_bytes = r->st.cold_segment_bytes; /* recorded in the store at its creation */
  return CLI_OK;
}

static int has_cold(const stat_run *r) { return r->st.io_backend[0] != '\0'; }

static double fill(const stat_run *r)
{
  uint64_t cap = r->st.cold_segments * r->segment_bytes;
  return cap ? (double)r->st.tier_bytes[KVT_TIER_COLD] / (double)cap : 0.0;
}

static void stat_json(const stat_run *r)
{
  const kvt_stats *st = &r->st;
  json_w j;
  json_begin(&j, stdout);
  json_str(&j, "command", "stat");
  json_str(&j, "dir", r->cfg.dir);
  json_bool(&j, "read_only", 1);
  json_u64(&j, "namespace_count", r->n_ns);
  json_obj(&j, "namespaces");
  for (uint32_t i = 0; i < r->n_ns; i++) {
    const stat_ns *s = &r->ns[i];
    char seed[33];
    key_hex(&s->seed, seed);
    json_obj(&j, seed); /* the seed identifies a namespace in every process */
    json_u64(&j, "id", s->id);
    json_str(&j, "model_id", s->d.model_id);
    json_str(&j, "weights_fingerprint", s->d.weights_fingerprint);
    json_f64(&j, "rope_theta", s->d.rope_theta);
    json_u64(&j, "rope_dims", s->d.rope_dims);
    json_str(&j, "rope_scaling", s->d.rope_scaling ? s->d.rope_scaling : "");
    json_u64(&j, "tp_rank", s->d.tp_rank);
    json_u64(&j, "tp_size", s->d.tp_size);
    json_u64(&j, "n_layers", s->d.shape.n_layers);
    json_u64(&j, "n_kv_heads", s->d.shape.n_kv_heads);
    json_u64(&j, "head_dim", s->d.shape.head_dim);
    json_str(&j, "dtype", dtype_name(s->d.shape.dtype));
    json_u64(&j, "block_tokens", s->d.shape.block_tokens);
    json_u64(&j, "token_block_bytes",
             2 * (uint64_t)kvt_shape_block_bytes(&s->d.shape) * s->d.shape.n_layers);
    json_end(&j);
  }
  json_end(&j);
  json_obj(&j, "tiers");
  for (int t = KVT_TIER_HOT; t < KVT_N_TIERS; t++) {
    json_obj(&j, tier_names[t]);
    json_u64(&j, "blocks", st->tier_blocks[t]);
    json_str(&j, "unit", t == KVT_TIER_COLD ? "token blocks (all layers)" : "layer blocks");
    json_u64(&j, "bytes", st->tier_bytes[t]);
    json_str(&j, "held_by", t == KVT_TIER_COLD ? "the store" : "this read-only process");
    json_end(&j);
  }
  json_end(&j);
  json_bool(&j, "cold_tier", has_cold(r));
  json_obj(&j, "cold");
  json_u64(&j, "records", st->cold_records);
  json_u64(&j, "live_bytes", st->tier_bytes[KVT_TIER_COLD]);
  json_u64(&j, "segments", st->cold_segments);
  json_u64(&j, "segment_bytes", r->segment_bytes);
  json_str(&j, "segment_bytes_source", "the store");
  json_f64(&j, "fill", fill(r));
  json_u64(&j, "segment_files", r->sf.n);
  json_u64(&j, "segment_file_bytes", r->sf.bytes);
  json_f64(&j, "live_of_file_bytes",
           r->sf.bytes ? (double)st->tier_bytes[KVT_TIER_COLD] / (double)r->sf.bytes : 0.0);
  json_u64(&j, "checksum_failures", st->cold_checksum_failures);
  json_u64(&j, "admission_declines", r->cold.declined);
  json_u64(&j, "model_saved_accesses", r->cold.model_saved_accesses);
  json_u64(&j, "hot_model_saved_accesses", r->hot.model_saved_accesses);
  json_end(&j);
  json_str(&j, "io_backend", st->io_backend);
  json_str(&j, "io_why", st->io_why);
  json_u64(&j, "engine_total_bytes", st->total_bytes);
  kvt_remote_stats rs;
  cli_remote_get(r->e, &rs);
  cli_remote_json(&j, &rs);
  json_end(&j);
}

static void stat_cold_human(const stat_run *r);

static void stat_human(const stat_run *r)
{
  stat_cold_human(r);
  kvt_remote_stats rs;
  cli_remote_get(r->e, &rs);
  cli_remote_print(&rs);
}

static void stat_cold_human(const stat_run *r)
{
  const kvt_stats *st = &r->st;
  char b1[32], b2[32], b3[32];
  printf("store: %s (opened read-only, no lock: a writer may be running)\n", r->cfg.dir);
  printf("\nnamespaces: %u\n", r->n_ns);
  for (uint32_t i = 0; i < r->n_ns; i++) {
    const stat_ns *s = &r->ns[i];
    const kvt_shape *sh = &s->d.shape;
    char seed[33];
    key_hex(&s->seed, seed);
    printf("  [%u] %s\n      fingerprint %s, seed %s\n      TP rank %u of %u, RoPE theta %g",
           s->id, s->d.model_id, s->d.weights_fingerprint, seed, s->d.tp_rank, s->d.tp_size,
           s->d.rope_theta);
    if (s->d.rope_scaling && *s->d.rope_scaling) printf(" scaling %s", s->d.rope_scaling);
    printf("\n      shape %u layers x %u KV heads x head_dim %u, %s, %u tokens per block "
           "(%s per token block)\n",
           sh->n_layers, sh->n_kv_heads, sh->head_dim, dtype_name(sh->dtype), sh->block_tokens,
           fmt_bytes(b1, sizeof b1, 2 * (uint64_t)kvt_shape_block_bytes(sh) * sh->n_layers));
  }
  printf("\n  %-6s %14s %12s  %s\n", "tier", "blocks", "bytes", "");
  for (int t = KVT_TIER_HOT; t < KVT_N_TIERS; t++)
    printf("  %-6s %14" PRIu64 " %12s  %s\n", tier_names[t], st->tier_blocks[t],
           fmt_bytes(b1, sizeof b1, st->tier_bytes[t]),
           t == KVT_TIER_COLD ? "token blocks (all layers): what the store holds"
                              : "layer blocks in this read-only process's RAM");
  if (!has_cold(r)) {
    printf("\ncold tier: none (nothing in %s persists; a writer creates one when given\n"
           "           tier_bytes_limit[KVT_TIER_COLD])\n", r->cfg.dir);
    return;
  }
  printf("\ncold tier: %" PRIu64 " records (token blocks), %s live\n", st->cold_records,
         fmt_bytes(b1, sizeof b1, st->tier_bytes[KVT_TIER_COLD]));
  printf("  segments %" PRIu64 " of %s: fill %.1f%% "
         "(live / (segments x segment size))\n", st->cold_segments,
         fmt_bytes(b1, sizeof b1, r->segment_bytes), 100.0 * fill(r));
  printf("  on disk  %" PRIu64 " segment files, %s appended (%.1f%% of it live)\n", r->sf.n,
         fmt_bytes(b2, sizeof b2, r->sf.bytes),
         r->sf.bytes ? 100.0 * (double)st->tier_bytes[KVT_TIER_COLD] / (double)r->sf.bytes : 0.0);
  if (r->sf.largest > r->segment_bytes)
    printf("  note     a segment file holds %s, more than the segment size the store records\n",
           fmt_bytes(b3, sizeof b3, r->sf.largest));
  printf("  checksum failures %" PRIu64 " (reads by this process; 'kvtier fsck' checks every "
         "record)\n", st->cold_checksum_failures);
  printf("  admission declines %" PRIu64 " (blocks this process's writes did not store: the "
         "order's model predicted them unused)\n", r->cold.declined);
  printf("  models   the learned order's, kept for the next writer: ");
  if (r->cold.model_saved_accesses || r->hot.model_saved_accesses)
    printf("cold tier %" PRIu64 " accesses counted, hot tier %" PRIu64 "\n",
           r->cold.model_saved_accesses, r->hot.model_saved_accesses);
  else
    printf("none (a writer starts learning from nothing)\n");
  printf("  I/O      %s: %s\n", st->io_backend, st->io_why);
}

/* kvt_metrics_render() into a buffer grown until the text fits. */
static int stat_prometheus(const stat_run *r)
{
  size_t need = 0, cap = 0;
  char *buf = NULL;
  int rc = kvt_metrics_render(r->e, NULL, 0, &need);
  for (int tries = 0; rc == KVT_EBUFSIZE && tries < 4; tries++) {
    cap = need + 4096; /* room for counters that grow meanwhile */
    char *nb = realloc(buf, cap);
    if (nb == NULL) {
      free(buf);
      return cli_lib_error("stat", "rendering the metrics", -ENOMEM);
    }
    buf = nb;
    rc = kvt_metrics_render(r->e, buf, cap, &need);
  }
  if (rc == 0) fputs(buf, stdout);
  free(buf);
  return rc ? cli_lib_error("stat", "rendering the metrics", rc) : CLI_OK;
}

int cmd_stat(int argc, char **argv)
{
  stat_run r;
  memset(&r, 0, sizeof r);
  cli_opt o[STAT_N_OPTS];
  stat_opts(&r.cfg, o);
  int want_help = 0;
  int rc = parse_cmd("stat", argc, argv, o, STAT_N_OPTS, &r.cfg.dir, &want_help);
  if (want_help) stat_usage(stdout);
  if (rc != CLI_OK || want_help) return rc;
  if (r.cfg.json && r.cfg.prometheus) {
    fprintf(stderr, "kvtier stat: --json or --prometheus, not both\n"
            "run 'kvtier help stat' for its options\n");
    return CLI_USAGE;
  }
  rc = stat_collect(&r);
  if (rc == CLI_OK) {
    if (r.cfg.prometheus)
      rc = stat_prometheus(&r);
    else if (r.cfg.json)
      stat_json(&r);
    else
      stat_human(&r);
  }
  kvt_engine_close(r.e);
  free(r.ns);
  return rc;
}

/* ---- kvtier fsck ------------------------------------------------------------ */

#define FSCK_LIST_MAX 1000u /* problems kept for --json; all are counted */

typedef struct fsck_problem {
  char key[33];
  char what[192];
} fsck_problem;

typedef struct fsck_run {
  const char *dir, *remote;
  int repair, json, rebuild;
  uint64_t segment_bytes;
  fsck_problem *list;
  uint32_t n_list;
  uint64_t reported;
  int alloc_failed;
} fsck_run;

#define FSCK_N_OPTS 5

static void fsck_opts(fsck_run *c, cli_opt o[FSCK_N_OPTS])
{
  const cli_opt t[FSCK_N_OPTS] = {
      {"--repair", NULL, CLI_FLAG, &c->repair, 0, 0,
       "remove broken entries (they become misses); needs the writer lock"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the result as one JSON object"},
      {"--rebuild-index", NULL, CLI_FLAG, &c->rebuild, 0, 0,
       "make a fresh index from the records in the segment files (the old one is kept as "
       "DIR/index.old-N); for an index that is damaged or lost; needs the writer lock"},
      {"--segment-bytes", "N", CLI_U64, &c->segment_bytes, 1u << 20, 1ull << 40,
       "with --rebuild-index: the store's segment size, when the old index cannot say "
       "(default: the largest segment file, rounded up to a MiB)"},
      CLI_OPT_REMOTE(&c->remote),
  };
  memcpy(o, t, sizeof t);
}

void fsck_usage(FILE *f)
{
  fsck_run c;
  cli_opt o[FSCK_N_OPTS];
  fsck_opts(&c, o);
  fprintf(f, "usage: kvtier fsck DIR [--repair] [--json]\n"
             "       kvtier fsck --rebuild-index DIR [--segment-bytes N] [--json]\n\n"
             "Checks every entry of the cold tier's index in DIR against its record on\n"
             "disk: record header, key, segment generation and every layer slice's\n"
             "checksum. Without --repair the store is opened read-only (works beside a live\n"
             "writer). Prints each problem (the token block's key in hex, what failed) and\n"
             "a summary. Exit status: 0 clean, 1 problems found (with --repair: found and\n"
             "removed), 2 could not run (bad command line, no store, no cold tier, or the\n"
             "store is open for writing elsewhere with --repair).\n\n"
             "With --rebuild-index, the index is made again from the segment files: every\n"
             "record is checked (header and every layer's checksum) and each intact one\n"
             "goes back in, the newest segment generation winning; namespaces come from\n"
             "DIR/namespaces/ and from the old index where it still reads. Exit status 0\n"
             "when no damaged record was found, 1 when some were left out, 2 could not run.\n"
             "\n--remote is refused: fsck checks the files of DIR only; the remote tier's\n"
             "values are checked on every load instead (a bad one is a miss, counted and\n"
             "deleted; docs/remote.md).\n"
             "\noptions:\n");
  cli_print_opts(f, o, FSCK_N_OPTS);
}

static void fsck_report(void *arg, const kvt_key *key, const char *what)
{
  fsck_run *r = arg;
  char hex[33];
  key_hex(key, hex);
  r->reported++;
  if (!r->json) {
    printf("bad  %s  %s\n", hex, what);
    return;
  }
  if (r->n_list >= FSCK_LIST_MAX) return;
  if (r->list == NULL) {
    r->list = calloc(FSCK_LIST_MAX, sizeof *r->list);
    if (r->list == NULL) {
      r->alloc_failed = 1;
      return;
    }
  }
  fsck_problem *p = &r->list[r->n_list++];
  memcpy(p->key, hex, sizeof p->key);
  snprintf(p->what, sizeof p->what, "%s", what);
}

static void fsck_json(const fsck_run *r, const kvt_fsck_result *res)
{
  json_w j;
  json_begin(&j, stdout);
  json_str(&j, "command", "fsck");
  json_str(&j, "dir", r->dir);
  json_bool(&j, "repair", r->repair);
  json_u64(&j, "checked", res->checked);
  json_u64(&j, "bad", res->bad);
  json_u64(&j, "removed", res->removed);
  json_bool(&j, "clean", res->bad == 0);
  json_u64(&j, "problems_listed", r->n_list);
  /* "problems": [{"key": ..., "what": ...}, ...] written by hand. */
  fputs(",\"problems\":[", stdout);
  for (uint32_t i = 0; i < r->n_list; i++) {
    fputs(i ? ",{\"key\":" : "{\"key\":", stdout);
    json_string(stdout, r->list[i].key);
    fputs(",\"what\":", stdout);
    json_string(stdout, r->list[i].what);
    fputc('}', stdout);
  }
  fputc(']', stdout);
  json_end(&j);
}

/* Why fsck could not run, in words a user can act on; returns CLI_USAGE
 * (exit 2: it did not run). */
static int fsck_cannot(const fsck_run *r, const char *what, int rc)
{
  progress_end();
  if (rc == KVT_ELOCKED)
    fprintf(stderr, "kvtier fsck: %s: another writer has the store open for writing; "
            "--repair needs it closed (without --repair fsck runs read-only beside it)\n", what);
  else if (rc == KVT_ENOTFOUND)
    fprintf(stderr, "kvtier fsck: %s has no cold tier: nothing to check\n", r->dir);
  else if (rc == KVT_EINDEX)
    fprintf(stderr, "kvtier fsck: %s: the cold tier's index (%s/index) is damaged or missing; "
            "rebuild it from the segment files with: kvtier fsck --rebuild-index %s\n", what,
            r->dir, r->dir);
  else if (rc == -ENOENT)
    fprintf(stderr, "kvtier fsck: %s: %s: not a kvtier store (no index/); nothing to check%s\n",
            what, kvt_strerror(rc), r->repair ? ", and --repair creates nothing" : "");
  else
    fprintf(stderr, "kvtier fsck: %s: %s\n", what, kvt_strerror(rc));
  cli_open_detail("fsck", rc);
  return CLI_USAGE;
}

static int fsck_open(const fsck_run *r, kvt_engine **e)
{
  kvt_options opt;
  kvt_options_init(&opt);
  opt.flags = KVT_OPEN_NOCREATE | (r->repair ? 0 : KVT_OPEN_RDONLY);
  /* A writer has a cold tier only when given a limit. The limit is not a
   * property of the store and fsck writes nothing but index removals, so
   * any limit above what the store holds will do. */
  if (r->repair) { /* no limit to enforce: only removals; the map as small as the store allows */
    opt.tier_bytes_limit[KVT_TIER_COLD] = 1ull << 50;
    opt.cold_index_bytes = 1u << 20;
  }
  int rc = cli_engine_open(r->dir, &opt, e);
  if (rc != 0) {
    char what[PATH_MAX + 64];
    snprintf(what, sizeof what, "opening '%s' %s", r->dir,
             r->repair ? "for writing (--repair)" : "read-only");
    return fsck_cannot(r, what, rc);
  }
  return CLI_OK;
}

static void rebuild_report(void *arg, const char *what)
{
  const fsck_run *r = arg;
  if (!r->json) printf("%s\n", what);
}

/* kvtier fsck --rebuild-index: a fresh index from the segment files. */
static int fsck_rebuild(const fsck_run *r)
{
  kvt_rebuild_result res;
  progress("fsck: rebuilding the index of %s", r->dir);
  int rc = kvt_store_rebuild_index(r->dir, r->segment_bytes, &res, rebuild_report, (void *)r);
  progress_end();
  if (rc == KVT_ELOCKED) {
    fprintf(stderr, "kvtier fsck: %s: another process has the store open for writing; "
            "--rebuild-index needs it closed\n", r->dir);
    return CLI_USAGE;
  }
  if (rc) return fsck_cannot(r, "rebuilding the index", rc);
  if (r->json) {
    json_w j;
    json_begin(&j, stdout);
    json_str(&j, "command", "fsck");
    json_str(&j, "dir", r->dir);
    json_bool(&j, "rebuild_index", 1);
    json_u64(&j, "segments", res.segments);
    json_u64(&j, "records", res.records);
    json_u64(&j, "damaged", res.damaged);
    json_u64(&j, "superseded", res.superseded);
    json_u64(&j, "blocks", res.blocks);
    json_u64(&j, "namespaces", res.namespaces);
    json_u64(&j, "orphans", res.orphans);
    json_u64(&j, "segment_bytes", res.segment_bytes);
    json_str(&j, "old_index", res.old_index);
    json_end(&j);
  } else {
    printf("rebuild %s: %" PRIu64 " segments scanned, %" PRIu64 " intact records, %" PRIu64
           " damaged, %" PRIu64 " superseded; index now holds %" PRIu64 " token blocks of %" PRIu64
           " namespaces (%" PRIu64 " of unknown namespaces); segment size %" PRIu64 "\n",
           r->dir, res.segments, res.records, res.damaged, res.superseded, res.blocks,
           res.namespaces, res.orphans, res.segment_bytes);
    if (res.old_index[0]) printf("old index kept as %s/%s\n", r->dir, res.old_index);
  }
  return res.damaged ? CLI_FAIL : CLI_OK;
}

int cmd_fsck(int argc, char **argv)
{
  fsck_run r;
  memset(&r, 0, sizeof r);
  cli_opt o[FSCK_N_OPTS];
  fsck_opts(&r, o);
  int want_help = 0;
  int rc = parse_cmd("fsck", argc, argv, o, FSCK_N_OPTS, &r.dir, &want_help);
  if (want_help) fsck_usage(stdout);
  if (rc != CLI_OK || want_help) return rc;
  if (r.rebuild && r.repair) {
    fprintf(stderr, "kvtier fsck: --rebuild-index and --repair do not go together (a rebuilt "
                    "index holds only intact records)\n");
    return CLI_USAGE;
  }
  if (r.remote) {
    fprintf(stderr, "kvtier fsck: --remote: fsck checks the local files of DIR only, not the "
                    "remote tier (its values are checked on every load: a bad one is a miss, "
                    "counted and deleted; docs/remote.md)\n");
    return CLI_USAGE;
  }
  if (r.segment_bytes && !r.rebuild) {
    fprintf(stderr, "kvtier fsck: --segment-bytes goes with --rebuild-index\n");
    return CLI_USAGE;
  }
  if (r.rebuild) return fsck_rebuild(&r);
  kvt_engine *e = NULL;
  rc = fsck_open(&r, &e);
  if (rc != CLI_OK) return rc;
  kvt_fsck_result res;
  progress("fsck: checking %s", r.dir);
  int lrc = kvt_fsck(e, r.repair, &res, fsck_report, &r);
  progress_end();
  kvt_engine_close(e);
  if (lrc != 0) {
    free(r.list);
    return fsck_cannot(&r, "checking the cold tier", lrc);
  }
  if (r.alloc_failed) fprintf(stderr, "kvtier fsck: out of memory listing problems\n");
  if (r.json) {
    fsck_json(&r, &res);
  } else {
    printf("fsck %s: %" PRIu64 " token blocks checked, %" PRIu64 " bad", r.dir, res.checked,
           res.bad);
    if (r.repair)
      printf(", %" PRIu64 " removed from the index (now misses)", res.removed);
    else if (res.bad)
      printf(" (kvtier fsck --repair removes them: they become misses)");
    printf("\n");
  }
  free(r.list);
  return res.bad ? CLI_FAIL : CLI_OK;
}
