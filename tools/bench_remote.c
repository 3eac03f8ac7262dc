/* bench_remote.c - `kvtier bench remote`: token blocks written and loaded
 * through the remote tier (diskless engines on a Redis Cluster), against
 * redis-benchmark's SET and GET of values of the same size at the same
 * pipeline depth, in the same run; per-block load latency p50/p99 at
 * 128 KiB and 2 MiB token blocks. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "cmds.h"
#include "util.h"

#define RB_SIZES 2
#define RB_WRITE_DEPTH 64u   /* values in flight counted at most (both sizes here are under it) */
#define RB_BASELINE_MIN 256u /* redis-benchmark requests at least (fewer measure its start) */
#define RB_ROUNDS_MAX 16u

typedef struct rb_cfg {
  const char *url;
  uint64_t blocks, rounds;
  int json;
} rb_cfg;

typedef struct rb_result {
  uint64_t block_bytes, value_bytes, blocks;
  double set_per_s, get_per_s, p50_us, p99_us; /* get: each value's second read */
  double set_first_per_s; /* the first round's puts: a new engine, fresh pages */
  double get_first_per_s, first_p50_us, first_p99_us; /* each value's first read */
  double rb_set_per_s, rb_get_per_s; /* redis-benchmark; 0: not run */
  uint32_t set_depth, get_depth;
  uint32_t set_clients, set_client_depth; /* redis-benchmark's SET: -c, -P */
  uint64_t rounds;
} rb_result;

/* n_layers, block_tokens: 8 KV heads x head_dim 64, f16. */
static const uint32_t rb_shapes[RB_SIZES][2] = {{4, 16}, {16, 64}}; /* 128 KiB, 2 MiB */

static void rb_rmdir(const char *dir);

/* A diskless engine with the remote tier in a new directory dir (removed
 * again when the engine does not open); its hot tier holds hot bytes. */
static kvt_engine *rb_open(const char *url, char *dir, uint64_t hot) {
  if (!mkdtemp(dir)) return NULL;
  kvt_options o;
  kvt_options_init(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = hot;
  kvt_engine *e = NULL;
  if (cli_engine_open_remote(dir, &o, url, &e) == 0) return e;
  rb_rmdir(dir);
  return NULL;
}

static kvt_ns_id rb_register(kvt_engine *e, const kvt_shape *sh, const char *model) {
  kvt_ns_desc d = {.model_id = model, .weights_fingerprint = "bench", .rope_theta = 10000,
                   .tp_size = 1, .shape = *sh};
  kvt_ns_id ns = 0;
  return kvt_ns_register(e, &d, &ns) ? UINT32_MAX : ns;
}

/* Put n blocks (tokens tok) and wait until the cluster has them. */
static int rb_put(kvt_engine *e, kvt_ns_id ns, const kvt_shape *sh, const uint32_t *tok,
                  uint64_t n, uint8_t *kv, double *secs) {
  size_t each = kvt_shape_block_bytes(sh);
  kvt_seq *s;
  int rc = kvt_seq_create(e, ns, &s);
  uint64_t t0 = now_ns();
  for (uint64_t b = 0; !rc && b < n; b++) {
    kvt_append_info info;
    rc = kvt_seq_append(s, tok + b * sh->block_tokens, sh->block_tokens, &info);
    for (uint32_t l = 0; !rc && l < sh->n_layers; l++) {
      kvt_kv x = {.k = kv, .v = kv + each, .dtype = KVT_F16, .n_tokens = sh->block_tokens,
                  .n_heads = sh->n_kv_heads, .head_dim = sh->head_dim};
      kv[b % each] ^= 1; /* every block its own bytes */
      rc = kvt_seq_put(s, (uint32_t)b, l, &x);
    }
  }
  if (!rc) rc = kvt_sync(e);
  *secs = (double)(now_ns() - t0) * 1e-9;
  if (!rc) kvt_seq_release(s);
  return rc;
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Load every layer of each block, one block a call; latencies in lat. */
static int rb_get(kvt_engine *e, kvt_ns_id ns, const kvt_shape *sh, const uint32_t *tok,
                  uint64_t n, double *lat, double *secs) {
  size_t each = kvt_shape_block_bytes(sh), found = 0;
  kvt_lookup_entry *ent = calloc(n, sizeof *ent);
  kvt_load_req *req = calloc(sh->n_layers, sizeof *req);
  uint8_t *buf = malloc(2 * each * sh->n_layers);
  int rc = ent && req && buf ? kvt_lookup(e, ns, tok, n * sh->block_tokens, ent, n, &found) : -ENOMEM;
  if (!rc && found != n) rc = KVT_ENOTFOUND;
  if (!rc) memset(buf, 0, 2 * each * sh->n_layers); /* the caller's pages, not the load's */
  uint64_t t0 = now_ns();
  for (uint64_t b = 0; !rc && b < n; b++) {
    for (uint32_t l = 0; l < sh->n_layers; l++)
      req[l] = (kvt_load_req){.key = ent[b].key, .layer = l, .k_out = buf + 2 * each * l,
                              .v_out = buf + 2 * each * l + each, .bytes_each = each};
    uint64_t t1 = now_ns();
    kvt_load *ld;
    rc = kvt_load_submit(e, ns, req, sh->n_layers, &ld);
    if (!rc) rc = kvt_load_wait(ld, NULL);
    lat[b] = (double)(now_ns() - t1) * 1e-3;
  }
  *secs = (double)(now_ns() - t0) * 1e-9;
  free(ent);
  free(req);
  free(buf);
  return rc;
}

/* redis-benchmark's requests per second for test (set, get), or 0. Its
 * SETs go to random keys (-r), new ones as the tier's SET NX are, not
 * over one key; its GETs read the key each node holds (random keys would
 * mostly miss and measure nil replies), which rb_get_key wrote. */
static double rb_baseline(const char *host, int port, const char *test, uint64_t bytes,
                          uint64_t n, uint32_t depth, uint32_t clients) {
  char cmd[512], line[512];
  snprintf(cmd, sizeof cmd,
           "redis-benchmark -h %s -p %d --cluster -t %s -d %" PRIu64 " -n %" PRIu64
           " -P %u -c %u%s --csv 2>/dev/null", host, port, test, bytes, n, depth, clients,
           strcmp(test, "set") == 0 ? " -r 1000000000" : "");
  FILE *p = popen(cmd, "r");
  double rps = 0;
  while (p && fgets(line, sizeof line, p)) {
    char name[64];
    double v;
    if (sscanf(line, "\"%63[^\"]\",\"%lf\"", name, &v) == 2 && strncmp(name, "rps", 3)) rps = v;
  }
  if (p) pclose(p);
  return rps;
}

/* The one key a node's GET baseline reads (redis-benchmark's
 * key:{tag}:__rand_int__, GET without -r), set to a value of bytes on
 * every master: the SET baseline's keys are random (-r), and without this
 * every GET read a key that did not exist and measured nil replies. */
static void rb_get_key(const char *host, int port, uint64_t bytes, uint32_t masters) {
  char cmd[512], line[512];
  snprintf(cmd, sizeof cmd,
           "redis-benchmark -h %s -p %d --cluster -t set -d %" PRIu64 " -n %u -P 1 -c %u"
           " --csv 2>/dev/null", host, port, bytes, 4 * masters, masters);
  FILE *p = popen(cmd, "r");
  while (p && fgets(line, sizeof line, p)) continue;
  if (p) pclose(p);
}

/* The cluster's masters (CLUSTER INFO's cluster_size), 1 if unknown: the
 * tier's writer keeps one connection per master busy at once. */
static uint32_t rb_masters(const char *host, int port) {
  char cmd[256], line[256];
  snprintf(cmd, sizeof cmd, "redis-cli -h %s -p %d cluster info 2>/dev/null", host, port);
  FILE *p = popen(cmd, "r");
  unsigned n = 0;
  while (p && fgets(line, sizeof line, p))
    if (sscanf(line, "cluster_size:%u", &n) == 1) break;
  if (p) pclose(p);
  return n >= 1 && n <= 1000 ? n : 1;
}

/* The first seed's host and port; 0 when the URL has credentials (the
 * baseline then does not run: a password is never put on a command line). */
static int rb_seed(const char *url, char *host, size_t len, int *port) {
  if (strncmp(url, "redis://", 8) || strchr(url, '@')) return 0;
  const char *h = url + 8, *c = strchr(h, ':');
  if (!c || (size_t)(c - h) >= len) return 0;
  memcpy(host, h, (size_t)(c - h));
  host[c - h] = 0;
  *port = atoi(c + 1);
  return *port > 0;
}

/* A diskless engine's directory holds only its lock files. */
static void rb_rmdir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *de;
  char path[256];
  while (d && (de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name) < (int)sizeof path)
      unlink(path);
  if (d) closedir(d);
  rmdir(dir);
}

/* Load c->blocks blocks (tokens tok) from a new engine on the cluster:
 * the rate, and the latencies sorted. */
static int rb_read(const rb_cfg *c, const char *model, const kvt_shape *sh, const uint32_t *tok,
                   double *lat, double *per_s) {
  char dir[] = "/tmp/kvt-bench-remote-XXXXXX";
  double secs = 0;
  kvt_engine *rd = rb_open(c->url, dir, 1ull << 30);
  int rc = rd ? rb_get(rd, rb_register(rd, sh, model), sh, tok, c->blocks, lat, &secs) : KVT_EOPTION;
  if (rd) {
    kvt_engine_close(rd);
    rb_rmdir(dir);
  }
  if (!rc) {
    *per_s = (double)c->blocks / secs;
    qsort(lat, c->blocks, sizeof *lat, cmp_dbl);
  }
  return rc;
}

static double rb_pct(const double *lat, uint64_t n, uint64_t pct) {
  uint64_t i = n * pct / 100;
  return lat[i < n ? i : n - 1];
}

/* One round of the tier at size sh: put c->blocks blocks from the writer
 * engine w (namespace ns, its model id model), then load them from a new
 * engine twice: the first loads are the server's first reads of values
 * the kernel wrote (a cost of this host's hypervisor, docs/remote.md:
 * "The first read"), the second ones read values read before, as
 * redis-benchmark's GETs of its one key do and as every later reader of
 * a shared block does. r keeps the best round of each figure. */
static int rb_tier(const rb_cfg *c, kvt_engine *w, kvt_ns_id ns, const char *model,
                   const kvt_shape *sh, const uint32_t *tok, uint8_t *kv, double *lat,
                   rb_result *r, int round) {
  double secs = 0, set_s = 0, first_s = 0, get_s = 0;
  int rc = rb_put(w, ns, sh, tok, c->blocks, kv, &secs);
  if (!rc) set_s = (double)c->blocks / secs;
  if (!rc && round == 0) r->set_first_per_s = set_s;
  if (!rc && set_s > r->set_per_s) r->set_per_s = set_s;
  if (!rc) rc = rb_read(c, model, sh, tok, lat, &first_s);
  if (!rc && first_s > r->get_first_per_s) {
    r->get_first_per_s = first_s;
    r->first_p50_us = rb_pct(lat, c->blocks, 50);
    r->first_p99_us = rb_pct(lat, c->blocks, 99);
  }
  if (!rc) rc = rb_read(c, model, sh, tok, lat, &get_s);
  if (!rc && get_s > r->get_per_s) {
    r->get_per_s = get_s;
    r->p50_us = rb_pct(lat, c->blocks, 50);
    r->p99_us = rb_pct(lat, c->blocks, 99);
  }
  return rc;
}

/* The writer engine of size si, open for all rounds as a serving engine
 * is: its hot tier holds one round's blocks (and a sixteenth more, at
 * least one block, for the descriptors), so from the second round on
 * every put makes room by evicting a block of the round before (in the
 * cluster, durable) and reuses its payload buffer (base/mem.c's pool),
 * as a serving engine with a full hot tier does. The first round fills
 * the tier with fresh pages (set_first_round_per_s). */
static kvt_engine *rb_writer(const rb_cfg *c, int si, const kvt_shape *sh, char *dir,
                             char *model, size_t model_len, kvt_ns_id *ns) {
  snprintf(model, model_len, "bench-remote-%d", si); /* the same namespace every run */
  uint64_t room = c->blocks + 1 + c->blocks / 16; /* the descriptors' room too */
  kvt_engine *w = rb_open(c->url, dir, room * 2 * kvt_shape_block_bytes(sh) * sh->n_layers);
  *ns = w ? rb_register(w, sh, model) : UINT32_MAX;
  return w;
}

/* Rounds of the tier and of redis-benchmark, alternating, so both meet
 * the same spells of load on a shared host; each side's best round. */
static int rb_size(const rb_cfg *c, int si, rb_result *r) {
  kvt_shape sh = {rb_shapes[si][0], 8, 64, KVT_F16, rb_shapes[si][1]};
  size_t each = kvt_shape_block_bytes(&sh);
  *r = (rb_result){.block_bytes = 2 * each * sh.n_layers, .blocks = c->blocks, .rounds = c->rounds,
                   .value_bytes = kvt_cold_record_bytes(&sh), .get_depth = 1};
  /* the writer's windows: 8 MiB in flight over the masters (tiers/remote.c) */
  r->set_depth = (uint32_t)((8u << 20) / r->value_bytes);
  if (r->set_depth > RB_WRITE_DEPTH) r->set_depth = RB_WRITE_DEPTH;
  uint32_t *tok = malloc(c->blocks * sh.block_tokens * sizeof *tok);
  uint8_t *kv = calloc(1, 2 * each);
  double *lat = malloc(c->blocks * sizeof *lat);
  int rc = tok && kv && lat ? 0 : -ENOMEM;
  for (uint64_t i = 0; !rc && i < c->blocks * sh.block_tokens; i++) tok[i] = (uint32_t)(i * 2654435761u % 32000);
  if (!rc) { /* this run's own blocks, in the one namespace every run uses */
    uint64_t t = now_ns() ^ ((uint64_t)getpid() << 40);
    tok[1] = (uint32_t)t, tok[2] = (uint32_t)(t >> 32);
  }
  char host[128];
  int port = 0, base = rb_seed(c->url, host, sizeof host, &port);
  if (base) { /* the writer: one connection per master, the batch spread over them */
    r->set_clients = rb_masters(host, port);
    /* never more in flight than the writer's batch: the floor, at least 1 */
    r->set_client_depth = r->set_depth / r->set_clients ? r->set_depth / r->set_clients : 1;
  }
  char dir[] = "/tmp/kvt-bench-remote-XXXXXX", model[64];
  kvt_ns_id wns = UINT32_MAX;
  kvt_engine *w = rc ? NULL : rb_writer(c, si, &sh, dir, model, sizeof model, &wns);
  if (!rc && !w) rc = KVT_EOPTION;
  for (uint64_t round = 0; !rc && round < c->rounds; round++) {
    tok[0] = (uint32_t)round; /* new blocks every round: every key is a hash of its prefix */
    rc = rb_tier(c, w, wns, model, &sh, tok, kv, lat, r, (int)round);
    if (rc || !base) continue;
    uint64_t nb = c->blocks < RB_BASELINE_MIN ? RB_BASELINE_MIN : c->blocks;
    uint64_t whole = (uint64_t)r->set_clients * r->set_client_depth;
    uint64_t ns = (nb + whole - 1) / whole * whole; /* whole pipelines: redis-benchmark
                                                     reports nothing otherwise */
    double bs = rb_baseline(host, port, "set", r->value_bytes, ns, r->set_client_depth, r->set_clients);
    rb_get_key(host, port, r->value_bytes, r->set_clients);
    double bg = rb_baseline(host, port, "get", r->value_bytes, nb, r->get_depth, 1);
    if (bs > r->rb_set_per_s) r->rb_set_per_s = bs;
    if (bg > r->rb_get_per_s) r->rb_get_per_s = bg;
  }
  if (w) {
    kvt_engine_close(w);
    rb_rmdir(dir);
  }
  free(tok);
  free(kv);
  free(lat);
  return rc;
}

static double rb_ratio(double a, double b) { return b > 0 ? a / b : 0.0 / 0.0; }

static void rb_json(const rb_result *r) {
  json_w j;
  json_begin(&j, stdout);
  json_str(&j, "command", "bench remote");
  json_f64(&j, "get_vs_redis_benchmark", rb_ratio(r[0].get_per_s, r[0].rb_get_per_s));
  json_f64(&j, "set_vs_redis_benchmark", rb_ratio(r[0].set_per_s, r[0].rb_set_per_s));
  for (int i = 0; i < RB_SIZES; i++) {
    char name[32];
    snprintf(name, sizeof name, "block_%" PRIu64 "_KiB", r[i].block_bytes >> 10);
    json_obj(&j, name);
    json_u64(&j, "blocks", r[i].blocks);
    json_u64(&j, "block_bytes", r[i].block_bytes);
    json_u64(&j, "value_bytes", r[i].value_bytes);
    json_f64(&j, "set_blocks_per_s", r[i].set_per_s);
    json_f64(&j, "set_first_round_per_s", r[i].set_first_per_s);
    json_f64(&j, "get_blocks_per_s", r[i].get_per_s);
    json_f64(&j, "load_p50_us", r[i].p50_us);
    json_f64(&j, "load_p99_us", r[i].p99_us);
    json_f64(&j, "get_first_read_per_s", r[i].get_first_per_s);
    json_f64(&j, "first_read_load_p50_us", r[i].first_p50_us);
    json_f64(&j, "first_read_load_p99_us", r[i].first_p99_us);
    json_u64(&j, "set_pipeline_depth", r[i].set_depth);
    json_u64(&j, "get_pipeline_depth", r[i].get_depth);
    json_u64(&j, "rounds", r[i].rounds);
    json_u64(&j, "redis_benchmark_set_clients", r[i].set_clients);
    json_u64(&j, "redis_benchmark_set_pipeline", r[i].set_client_depth);
    json_f64(&j, "redis_benchmark_set_per_s", r[i].rb_set_per_s > 0 ? r[i].rb_set_per_s : 0.0 / 0.0);
    json_f64(&j, "redis_benchmark_get_per_s", r[i].rb_get_per_s > 0 ? r[i].rb_get_per_s : 0.0 / 0.0);
    json_f64(&j, "get_vs_redis_benchmark", rb_ratio(r[i].get_per_s, r[i].rb_get_per_s));
    json_f64(&j, "set_vs_redis_benchmark", rb_ratio(r[i].set_per_s, r[i].rb_set_per_s));
    json_f64(&j, "get_first_read_vs_redis_benchmark", rb_ratio(r[i].get_first_per_s, r[i].rb_get_per_s));
    json_end(&j);
  }
  json_end(&j);
}

static void rb_human(const rb_result *r) {
  printf("%-10s %7s %9s %9s %9s %9s %8s %8s %9s %9s %9s\n", "block", "blocks", "set/s",
         "1st set/s", "get/s", "1st get/s", "p50 us", "p99 us", "1st p99", "rb set/s", "rb get/s");
  for (int i = 0; i < RB_SIZES; i++)
    printf("%6" PRIu64 " KiB %7" PRIu64 " %9.0f %9.0f %9.0f %9.0f %8.0f %8.0f %9.0f %9.0f %9.0f\n",
           r[i].block_bytes >> 10, r[i].blocks, r[i].set_per_s, r[i].set_first_per_s,
           r[i].get_per_s, r[i].get_first_per_s, r[i].p50_us, r[i].p99_us, r[i].first_p99_us,
           r[i].rb_set_per_s, r[i].rb_get_per_s);
  printf("\nrb: redis-benchmark --cluster, the same value size; SET at the tier writer's\n"
         "pipeline depth spread over one connection per master (as the writer does), GET\n"
         "at depth 1 on one connection (the tier loads a block with one GET); each the best\n"
         "of %" PRIu64 " rounds alternating with the tier's; 0: not run (no redis-benchmark,\n"
         "or a URL with credentials); set/s: the writing engine's best round (kept open, its\n"
         "hot tier full: steady state), 1st set/s: its first round (a new engine, fresh pages);\n"
         "get/s, p50, p99: a new engine loading values the server has read before (as\n"
         "redis-benchmark's GETs of one key are), 1st get/s and 1st p99: the first loads\n"
         "of each value, fresh from its SET (docs/remote.md, \"The first read\")\n",
         r[0].rounds);
}

#define RB_N_OPTS 4

int bench_remote(int argc, char **argv) {
  rb_cfg c = {.blocks = 64, .rounds = 3};
  const cli_opt o[RB_N_OPTS] = {
      {"--url", "URL", CLI_STR, &c.url, 0, 0, "the Redis Cluster (redis://host:port[,...])"},
      {"--blocks", "N", CLI_U64, &c.blocks, 2, 100000, "token blocks per size (default 64)"},
      {"--rounds", "R", CLI_U64, &c.rounds, 1, RB_ROUNDS_MAX,
       "rounds of tier and redis-benchmark, alternating; the best of each (default 3)"},
      {"--json", NULL, CLI_FLAG, &c.json, 0, 0, "print the figures as one JSON object"},
  };
  int want_help = 0, rc = cli_parse("bench remote", argc, argv, o, RB_N_OPTS, &want_help);
  if (want_help) {
    printf("usage: kvtier bench remote --url URL [--blocks N] [--rounds R] [--json]\n\n"
           "Writes N token blocks of 128 KiB and of 2 MiB through a diskless engine with\n"
           "a remote tier (one engine for all rounds, its hot tier one round's blocks),\n"
           "loads them from a second one and again from a third, and runs redis-benchmark\n"
           "on the same cluster with values of the same size (docs/remote.md).\n\n"
           "options:\n");
    cli_print_opts(stdout, o, RB_N_OPTS);
  }
  if (rc != CLI_OK || want_help) return rc;
  if (!c.url) {
    fprintf(stderr, "kvtier bench remote: --url is required\n");
    return CLI_USAGE;
  }
  rb_result r[RB_SIZES];
  for (int i = 0; i < RB_SIZES && !rc; i++) rc = rb_size(&c, i, &r[i]);
  if (rc) return cli_lib_error("bench remote", "running the blocks through the cluster", rc);
  if (c.json) rb_json(r);
  else rb_human(r);
  return CLI_OK;
}
