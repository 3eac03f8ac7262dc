/* plan_fleet.c - `kvtier plan --fleet N`: a trace served by N nodes, each a
 * metadata-only engine with its own RAM and cold tiers (the engine's own
 * index, admission and eviction code, as in plan.c), over a remote tier
 * they share, modelled here; local-only against fleet hit rates, and the
 * network bandwidth the remote tier needs. Guide: docs/capacity-planning.md.
 *
 * Why the remote tier is a model and not an engine store: it is shared by
 * N engines, and the public API (all a tool may use) opens one store per
 * engine; and its eviction is Redis's own (maxmemory-policy allkeys-lru),
 * not kvtier's, so no engine code would run there anyway. The model is an
 * exact LRU over whole-block values of a given token capacity: Redis
 * approximates LRU by sampling (maxmemory-samples, 5 by default; close to
 * exact at 10), so the figures are those of an ideal allkeys-lru.
 *
 * Per request, on its node, as the engine with a remote tier does it
 * (tiers/store_remote.c): the node's engine is looked up (RAM, then local
 * cold: its leading run of stored blocks), then the remote tier from the
 * first block the node lacks (one EXISTS a block, each hit a use); the
 * hits are loaded over the network; the blocks the node lacked are put
 * into its engine (remote hits copied to the local tiers, the rest
 * computed); the computed blocks are written to the remote tier once
 * (SET NX: the value crosses the network even when the key is there,
 * which then counts as a use and keeps the value). Bytes are charged at
 * the request's arrival on the trace's clock. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cmds.h"
#include "plan.h"
#include "util.h"

#define FLEET_MAX_NODES 256u
#define FLEET_MAX_LIST 8      /* capacities (local or remote) per run */
#define FLEET_NONE UINT32_MAX /* no entry (remote model) */
#define ROUTE_RR 0
#define ROUTE_SESSION 1

typedef struct fleet_cfg {
  const char *model, *config, *trace, *hot_gib, *warm_gib, *local, *remote, *route, *policy;
  uint64_t nodes;
  int json;
} fleet_cfg;

typedef struct fleet_setup {
  plan_model m;
  plan_trace t;
  kvt_shape shape;            /* folded (plan.c) */
  uint64_t rec_true;          /* a block's cold record, real shape: a remote value */
  uint64_t rec_folded;        /* the same, folded shape: what the engine's limits count */
  uint64_t hot_bytes, warm_bytes;
  int policy, k_codec, v_codec;
  uint32_t nodes;
  uint64_t local[FLEET_MAX_LIST], remote[FLEET_MAX_LIST]; /* tokens; PLAN_CAP_INF; remote 0: none */
  size_t n_local, n_remote;
  int routes[2];
  size_t n_routes;
  uint32_t *node_of[2];       /* per route: each request's node */
  uint32_t session_depth;     /* blocks every request shares: the root is the next */
  double t0_s, duration_s;
} fleet_setup;

/* ---- the remote tier: an LRU of whole-block values ------------------------- */

typedef struct rent {
  uint64_t key;
  uint32_t chain;             /* next in its hash bucket */
  uint32_t newer, older;      /* the LRU list */
} rent;

typedef struct rpool {
  uint64_t cap;               /* values held at most; 0: no remote tier */
  uint32_t *bucket, mask;
  rent *ent;
  uint32_t n_ent, cap_ent, free_list, newest, oldest;
  uint64_t held, evictions;
} rpool;

/* The key of block i given the key of block i-1 (prev; 0 for the first):
 * a block's value depends on its whole prefix, as the engine's keys do. */
static uint64_t chain_key(uint64_t prev, uint64_t id)
{
  return mix64(prev * 0x9e3779b97f4a7c15ull ^ mix64(id + 1));
}

/* A pool of cap values; max_keys bounds the distinct keys it can see. */
static int pool_init(rpool *p, uint64_t cap, uint64_t max_keys)
{
  memset(p, 0, sizeof *p);
  p->cap = cap;
  p->newest = p->oldest = p->free_list = FLEET_NONE;
  if (cap == 0) return 0;
  uint64_t n = cap < max_keys ? cap : max_keys;
  if (n >= FLEET_NONE / 2) return -1;
  p->cap_ent = (uint32_t)n + 1;
  uint32_t nb = 1;
  while (nb < 2 * p->cap_ent) nb *= 2;
  p->mask = nb - 1;
  p->bucket = malloc((size_t)nb * sizeof *p->bucket);
  p->ent = malloc((size_t)p->cap_ent * sizeof *p->ent);
  if (!p->bucket || !p->ent) return -1;
  memset(p->bucket, 0xff, (size_t)nb * sizeof *p->bucket); /* FLEET_NONE */
  return 0;
}

static void pool_free(rpool *p)
{
  free(p->bucket);
  free(p->ent);
  memset(p, 0, sizeof *p);
}

static uint32_t pool_find(const rpool *p, uint64_t key)
{
  if (!p->cap) return FLEET_NONE;
  uint32_t i = p->bucket[key & p->mask];
  while (i != FLEET_NONE && p->ent[i].key != key) i = p->ent[i].chain;
  return i;
}

static void lru_unlink(rpool *p, uint32_t i)
{
  rent *e = &p->ent[i];
  if (e->newer != FLEET_NONE) p->ent[e->newer].older = e->older;
  else p->newest = e->older;
  if (e->older != FLEET_NONE) p->ent[e->older].newer = e->newer;
  else p->oldest = e->newer;
}

static void lru_push(rpool *p, uint32_t i)
{
  p->ent[i].newer = FLEET_NONE;
  p->ent[i].older = p->newest;
  if (p->newest != FLEET_NONE) p->ent[p->newest].newer = i;
  else p->oldest = i;
  p->newest = i;
}

/* A use: the value becomes the most recent. */
static void pool_touch(rpool *p, uint32_t i)
{
  lru_unlink(p, i);
  lru_push(p, i);
}

/* Drop the least recently used value. */
static void pool_evict(rpool *p)
{
  uint32_t i = p->oldest;
  lru_unlink(p, i);
  uint32_t *link = &p->bucket[p->ent[i].key & p->mask];
  while (*link != i) link = &p->ent[*link].chain;
  *link = p->ent[i].chain;
  p->ent[i].chain = p->free_list;
  p->free_list = i;
  p->held--;
  p->evictions++;
}

/* SET NX of key: a use when held, else stored (evicting to make room). */
static void pool_set_nx(rpool *p, uint64_t key)
{
  if (!p->cap) return;
  uint32_t i = pool_find(p, key);
  if (i != FLEET_NONE) {
    pool_touch(p, i);
    return;
  }
  while (p->held >= p->cap || (p->free_list == FLEET_NONE && p->n_ent == p->cap_ent)) pool_evict(p);
  if (p->free_list != FLEET_NONE) {
    i = p->free_list;
    p->free_list = p->ent[i].chain;
  } else {
    i = p->n_ent++;
  }
  p->ent[i].key = key;
  p->ent[i].chain = p->bucket[key & p->mask];
  p->bucket[key & p->mask] = i;
  lru_push(p, i);
  p->held++;
}

/* ---- network bytes per window of the trace's clock --------------------------- */

typedef struct bw_win {
  double width_s;
  int64_t cur;                /* the window being summed; -1 before the first */
  double sum;
  double *vals;               /* sums of the windows with traffic, in time order */
  size_t n, cap;
} bw_win;

static int win_close(bw_win *w)
{
  if (w->cur < 0 || w->sum <= 0) return 0;
  if (w->n == w->cap) {
    size_t nc = w->cap ? 2 * w->cap : 1024;
    double *v = realloc(w->vals, nc * sizeof *v);
    if (!v) return -1;
    w->vals = v;
    w->cap = nc;
  }
  w->vals[w->n++] = w->sum;
  return 0;
}

static int win_add(bw_win *w, double t_s, double bytes)
{
  int64_t k = (int64_t)floor(t_s / w->width_s);
  if (k != w->cur) {
    if (win_close(w)) return -1;
    w->cur = k;
    w->sum = 0;
  }
  w->sum += bytes;
  return 0;
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The q-quantile (nearest rank) and the maximum of bytes per second over
 * every window from the trace's first to its last (those without traffic
 * count as 0). */
static void win_stats(bw_win *w, const fleet_setup *s, double q, double *quant, double *max)
{
  *quant = *max = 0;
  if (win_close(w)) return; /* out of memory: the last window is missed */
  w->cur = -1;
  int64_t first = (int64_t)floor(s->t0_s / w->width_s);
  int64_t last = (int64_t)floor((s->t0_s + s->duration_s) / w->width_s);
  uint64_t total = (uint64_t)(last - first + 1), zeros = total > w->n ? total - w->n : 0;
  if (!w->n) return;
  qsort(w->vals, w->n, sizeof *w->vals, cmp_double);
  uint64_t rank = (uint64_t)ceil(q * (double)total);
  if (rank < 1) rank = 1;
  *quant = rank <= zeros ? 0 : w->vals[rank - zeros - 1] / w->width_s;
  *max = w->vals[w->n - 1] / w->width_s;
}

/* ---- one fleet: N node engines over one remote tier -------------------------- */

typedef struct node {
  kvt_engine *e;
  kvt_ns_id ns;
  uint64_t requests;
} node;

typedef struct fleet {
  node *nodes;
  uint32_t n_nodes;
  rpool pool;
  uint64_t remote_cap;        /* tokens (PLAN_CAP_INF; 0: no remote tier) */
  uint64_t local_tokens, remote_tokens, remote_hit_blocks, remote_write_blocks;
  uint64_t put_refused;
  bw_win w1, w10;
} fleet;

static uint64_t cold_limit(const fleet_setup *s, uint64_t cap_tokens)
{
  const uint64_t unbounded = 1ull << 62; /* beyond any trace, as in plan.c */
  uint64_t blocks = cap_tokens / PLAN_BLOCK_TOKENS;
  if (cap_tokens == PLAN_CAP_INF || blocks > unbounded / s->rec_folded) return unbounded;
  return blocks * s->rec_folded;
}

static int node_open(const fleet_setup *s, uint64_t local_cap, node *n)
{
  memset(n, 0, sizeof *n);
  kvt_options o;
  kvt_options_init(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  o.tier_bytes_limit[KVT_TIER_HOT] = s->hot_bytes;
  o.tier_bytes_limit[KVT_TIER_WARM] = s->warm_bytes;
  o.tier_bytes_limit[KVT_TIER_COLD] = cold_limit(s, local_cap);
  o.cold_evict = (uint32_t)s->policy;
  o.hot_evict = (uint32_t)s->policy;
  o.max_seq_blocks = PLAN_MAX_BLOCKS;
  int rc = kvt_engine_open(NULL, &o, &n->e);
  if (rc) return cli_lib_error("plan", "opening a metadata-only engine", rc);
  kvt_ns_desc d = {.model_id = s->m.name, .weights_fingerprint = "plan", .tp_size = 1,
                   .shape = s->shape};
  rc = kvt_ns_register(n->e, &d, &n->ns);
  if (!rc) rc = kvt_ns_set_codec(n->e, n->ns, KVT_ALL_LAYERS, s->k_codec, s->v_codec);
  return rc ? cli_lib_error("plan", "registering the model", rc) : CLI_OK;
}

static void fleet_close(fleet *f)
{
  for (uint32_t i = 0; f->nodes && i < f->n_nodes; i++) kvt_engine_close(f->nodes[i].e);
  free(f->nodes);
  pool_free(&f->pool);
  free(f->w1.vals);
  free(f->w10.vals);
  memset(f, 0, sizeof *f);
}

static int fleet_open(const fleet_setup *s, uint64_t local_cap, uint64_t remote_cap, fleet *f)
{
  memset(f, 0, sizeof *f);
  f->remote_cap = remote_cap;
  f->w1 = (bw_win){.width_s = 1, .cur = -1};
  f->w10 = (bw_win){.width_s = 10, .cur = -1};
  f->nodes = calloc(s->nodes, sizeof *f->nodes);
  uint64_t blocks = remote_cap == PLAN_CAP_INF ? UINT64_MAX : remote_cap / PLAN_BLOCK_TOKENS;
  if (!f->nodes || pool_init(&f->pool, blocks, s->t.n_ids)) {
    fprintf(stderr, "kvtier plan: out of memory\n");
    return CLI_FAIL;
  }
  f->n_nodes = s->nodes;
  int rc = CLI_OK;
  for (uint32_t i = 0; !rc && i < s->nodes; i++) rc = node_open(s, local_cap, &f->nodes[i]);
  return rc;
}

/* Put the blocks [from, n) that node lacks into its engine. */
static int node_fill(const fleet_setup *s, fleet *f, node *n, const plan_req *r,
                     const uint32_t *tokens)
{
  kvt_seq *q;
  int rc = kvt_seq_create(n->e, n->ns, &q);
  if (rc) return cli_lib_error("plan", "kvt_seq_create", rc);
  kvt_kv kv = {.dtype = s->shape.dtype, .n_tokens = PLAN_BLOCK_TOKENS,
               .n_heads = s->shape.n_kv_heads, .head_dim = s->shape.head_dim};
  for (uint32_t i = 0; !rc && i < r->n_blocks; i++) {
    kvt_append_info info;
    rc = kvt_seq_append(q, tokens + (size_t)i * PLAN_BLOCK_TOKENS, PLAN_BLOCK_TOKENS, &info);
    if (rc || info.durable || info.layers_present == s->shape.n_layers) continue;
    for (uint32_t l = 0; !rc && l < s->shape.n_layers; l++) {
      rc = kvt_seq_put(q, i, l, &kv);
      if (rc == KVT_EFULL) { /* every tier full of referenced blocks: not stored */
        f->put_refused++;
        rc = 0;
      }
    }
  }
  kvt_seq_release(q);
  return rc ? cli_lib_error("plan", "replaying a request", rc) : CLI_OK;
}

/* One request on node k of fleet f (keys: its blocks' remote keys). */
static int fleet_request(const fleet_setup *s, fleet *f, uint32_t k, const plan_req *r,
                         const uint32_t *tokens, const uint64_t *keys, kvt_lookup_entry *ent)
{
  node *n = &f->nodes[k];
  n->requests++;
  size_t found = 0, n_tok = (size_t)r->n_blocks * PLAN_BLOCK_TOKENS;
  int rc = kvt_lookup(n->e, n->ns, tokens, n_tok, ent, r->n_blocks, &found);
  if (rc) return cli_lib_error("plan", "kvt_lookup", rc);
  size_t hit = found;
  for (uint32_t j; hit < r->n_blocks && (j = pool_find(&f->pool, keys[hit])) != FLEET_NONE; hit++)
    pool_touch(&f->pool, j);
  for (size_t i = 0; i < hit; i++) {
    uint64_t in = block_input((uint32_t)i, r->input_len);
    if (i < found) f->local_tokens += in;
    else f->remote_tokens += in;
  }
  rc = node_fill(s, f, n, r, tokens);
  if (rc || !f->remote_cap) return rc;
  for (size_t i = hit; i < r->n_blocks; i++) pool_set_nx(&f->pool, keys[i]);
  uint64_t moved = (hit - found) + (r->n_blocks - hit);
  f->remote_hit_blocks += hit - found;
  f->remote_write_blocks += r->n_blocks - hit;
  double bytes = (double)moved * (double)s->rec_true, t = r->t_ms / 1e3;
  if (moved && (win_add(&f->w1, t, bytes) || win_add(&f->w10, t, bytes))) {
    fprintf(stderr, "kvtier plan: out of memory\n");
    return CLI_FAIL;
  }
  return CLI_OK;
}

/* ---- routing -------------------------------------------------------------------- */

/* The blocks every request of the trace begins with (a system prompt all
 * conversations share): they say nothing of whose conversation it is. */
static uint32_t common_depth(const plan_trace *t)
{
  uint32_t d = t->reqs[0].n_blocks;
  const uint64_t *a = t->ids + t->reqs[0].first;
  for (size_t i = 1; i < t->n && d; i++) {
    const uint64_t *b = t->ids + t->reqs[i].first;
    uint32_t m = t->reqs[i].n_blocks < d ? t->reqs[i].n_blocks : d, j = 0;
    while (j < m && a[j] == b[j]) j++;
    d = j;
  }
  return d;
}

/* Each request's node: in turn (rr), or by its conversation's root
 * (session): the chain of ids up to the first block past the shared
 * ones, so every turn of a conversation lands on the same node. */
static int route_all(fleet_setup *s, int route, uint32_t *node_of)
{
  const plan_trace *t = &s->t;
  for (size_t i = 0; i < t->n; i++) {
    if (route == ROUTE_RR) {
      node_of[i] = (uint32_t)(i % s->nodes);
      continue;
    }
    const plan_req *r = &t->reqs[i];
    uint32_t last = s->session_depth < r->n_blocks ? s->session_depth : r->n_blocks - 1;
    uint64_t key = 0;
    for (uint32_t j = 0; j <= last; j++) key = chain_key(key, t->ids[r->first + j]);
    node_of[i] = (uint32_t)(mix64(key) % s->nodes);
  }
  return 0;
}

/* ---- the replay ------------------------------------------------------------------- */

/* The remote keys of request r into keys. */
static void request_keys(const plan_trace *t, const plan_req *r, uint64_t *keys)
{
  uint64_t k = 0;
  for (uint32_t i = 0; i < r->n_blocks; i++) keys[i] = k = chain_key(k, t->ids[r->first + i]);
}

/* Every request through each of n fleets, on the node the route gives. */
static int replay(const fleet_setup *s, const uint32_t *node_of, fleet *fl, size_t n)
{
  const plan_trace *t = &s->t;
  uint32_t *tokens = malloc((size_t)t->max_blocks * PLAN_BLOCK_TOKENS * sizeof *tokens);
  uint64_t *keys = malloc(t->max_blocks * sizeof *keys);
  kvt_lookup_entry *ent = malloc(t->max_blocks * sizeof *ent);
  int rc = tokens && keys && ent ? CLI_OK : CLI_FAIL;
  if (rc) fprintf(stderr, "kvtier plan: out of memory\n");
  for (size_t i = 0; !rc && i < t->n; i++) {
    const plan_req *r = &t->reqs[i];
    request_tokens(t, r, tokens);
    request_keys(t, r, keys);
    for (size_t k = 0; !rc && k < n; k++) rc = fleet_request(s, &fl[k], node_of[i], r, tokens, keys, ent);
    if ((i & 1023) == 0) progress("plan: fleet: request %zu of %zu", i, t->n);
  }
  free(tokens);
  free(keys);
  free(ent);
  return rc;
}

/* ---- results ---------------------------------------------------------------------- */

typedef struct fleet_row {
  int route;
  uint64_t local_cap, remote_cap;
  double local_only, fleet, from_local, from_remote; /* shares of the input tokens */
  uint64_t local_only_tokens, fleet_tokens;
  double gbps_mean, gbps_p99_1s, gbps_max_1s, gbps_p99_10s; /* both directions */
  double read_gbps, write_gbps; /* means: remote hits loaded; new blocks sent */
  uint64_t remote_hits, remote_writes, remote_held, remote_evictions, put_refused;
  uint64_t node_requests[FLEET_MAX_NODES];
} fleet_row;

static void row_fill(const fleet_setup *s, int route, uint64_t local_cap, const fleet *lo,
                     fleet *f, fleet_row *row)
{
  double in = (double)s->t.input_tokens, dur = s->duration_s;
  double bytes = (double)(f->remote_hit_blocks + f->remote_write_blocks) * (double)s->rec_true;
  *row = (fleet_row){.route = route, .local_cap = local_cap, .remote_cap = f->remote_cap,
                     .local_only = (double)lo->local_tokens / in,
                     .fleet = (double)(f->local_tokens + f->remote_tokens) / in,
                     .from_local = (double)f->local_tokens / in,
                     .from_remote = (double)f->remote_tokens / in,
                     .local_only_tokens = lo->local_tokens,
                     .fleet_tokens = f->local_tokens + f->remote_tokens, .gbps_mean = bytes / dur / 1e9,
                     .read_gbps = (double)f->remote_hit_blocks * (double)s->rec_true / dur / 1e9,
                     .write_gbps = (double)f->remote_write_blocks * (double)s->rec_true / dur / 1e9,
                     .remote_hits = f->remote_hit_blocks, .remote_writes = f->remote_write_blocks,
                     .remote_held = f->pool.held, .remote_evictions = f->pool.evictions,
                     .put_refused = f->put_refused};
  double q, mx;
  win_stats(&f->w1, s, 0.99, &q, &mx);
  row->gbps_p99_1s = q / 1e9;
  row->gbps_max_1s = mx / 1e9;
  win_stats(&f->w10, s, 0.99, &q, &mx);
  row->gbps_p99_10s = q / 1e9;
  for (uint32_t i = 0; i < f->n_nodes; i++) row->node_requests[i] = f->nodes[i].requests;
}

/* One route and one local capacity: the local-only fleet (no remote tier)
 * and one fleet per remote capacity, in one pass over the trace. */
static int run_local(const fleet_setup *s, size_t ri, uint64_t local_cap, fleet_row *rows)
{
  fleet fl[FLEET_MAX_LIST + 1];
  size_t n = 0;
  int rc = CLI_OK;
  for (; !rc && n <= s->n_remote; n++)
    rc = fleet_open(s, local_cap, n ? s->remote[n - 1] : 0, &fl[n]);
  if (!rc) rc = replay(s, s->node_of[ri], fl, n);
  progress_end();
  for (size_t k = 1; !rc && k < n; k++) row_fill(s, s->routes[ri], local_cap, &fl[0], &fl[k], &rows[k - 1]);
  for (size_t k = 0; k < n; k++) fleet_close(&fl[k]);
  return rc;
}

static const char *route_name(int r) { return r == ROUTE_RR ? "rr" : "session"; }

static void fmt_cap(char *buf, size_t len, uint64_t cap)
{
  if (cap == PLAN_CAP_INF) snprintf(buf, len, "inf");
  else if (cap >= 1000000 && cap % 1000000 == 0) snprintf(buf, len, "%" PRIu64 "M", cap / 1000000);
  else if (cap >= 1000000) snprintf(buf, len, "%.1fM", cap / 1e6);
  else if (cap >= 1000) snprintf(buf, len, "%.0fK", cap / 1e3);
  else snprintf(buf, len, "%" PRIu64, cap);
}

static void print_text(const fleet_setup *s, const fleet_row *rows, size_t n, const char *src)
{
  char b1[32], b2[32];
  printf("model     %s; a remote value (one 512-token block, cold record) %s\n", s->m.name,
         fmt_bytes(b1, sizeof b1, s->rec_true));
  printf("workload  %s: %zu requests over %.0f s, %.1fM input tokens\n", src, s->t.n,
         s->duration_s, s->t.input_tokens / 1e6);
  printf("remote    shared by the nodes, least recently used evicted (an ideal allkeys-lru);\n"
         "          1M tokens of it hold %s of values\n",
         fmt_bytes(b1, sizeof b1, (uint64_t)(1e6 / PLAN_BLOCK_TOKENS * (double)s->rec_true)));
  printf("fleet     %u nodes, each hot %s, warm %s and the local cold capacity below; session\n"
         "          routing keys on block %u of each request (the %u before it are shared by all)\n\n",
         s->nodes, fmt_bytes(b1, sizeof b1, s->hot_bytes), fmt_bytes(b2, sizeof b2, s->warm_bytes),
         s->session_depth, s->session_depth);
  printf("  %-7s %6s %6s %10s %7s %7s %9s %9s %8s %8s\n", "route", "local", "remote",
         "local-only", "fleet", "gain", "read GB/s", "write", "p99 1s", "p99 10s");
  for (size_t i = 0; i < n; i++) {
    const fleet_row *r = &rows[i];
    fmt_cap(b1, sizeof b1, r->local_cap);
    fmt_cap(b2, sizeof b2, r->remote_cap);
    printf("  %-7s %6s %6s %9.1f%% %6.1f%% %+6.1f%% %9.3f %9.3f %8.3f %8.3f\n",
           route_name(r->route), b1, b2, 100 * r->local_only, 100 * r->fleet,
           100 * (r->fleet - r->local_only), r->read_gbps, r->write_gbps, r->gbps_p99_1s,
           r->gbps_p99_10s);
  }
  printf("\n  local, remote: capacities in tokens, local per node (cold tier), remote shared;\n"
         "  hit rates token-weighted; gain: the fleet's hits from the remote tier; read, write:\n"
         "  mean GB/s of remote hits loaded and of new blocks sent (SET NX), the whole fleet, on\n"
         "  the trace's clock; p99 1s, 10s: both directions, the 99th percentile window\n");
}

static void json_cap(uint64_t cap)
{
  if (cap == PLAN_CAP_INF) printf("null");
  else printf("%" PRIu64, cap);
}

static void print_json(const fleet_setup *s, const fleet_row *rows, size_t n, const char *src)
{
  printf("{\"model\": ");
  json_string(stdout, s->m.name);
  printf(", \"remote_value_bytes\": %" PRIu64 ", \"nodes\": %u, \"hot_bytes\": %" PRIu64
         ", \"warm_bytes\": %" PRIu64 ", \"session_depth\": %u,\n \"workload\": {\"source\": ",
         s->rec_true, s->nodes, s->hot_bytes, s->warm_bytes, s->session_depth);
  json_string(stdout, src);
  printf(", \"requests\": %zu, \"duration_s\": %.3f, \"input_tokens\": %" PRIu64 "},\n \"rows\": [\n",
         s->t.n, s->duration_s, s->t.input_tokens);
  for (size_t i = 0; i < n; i++) {
    const fleet_row *r = &rows[i];
    printf("  {\"route\": \"%s\", \"local_tokens\": ", route_name(r->route));
    json_cap(r->local_cap);
    printf(", \"remote_tokens\": ");
    json_cap(r->remote_cap);
    printf(", \"local_only_hit_tokens\": %" PRIu64 ", \"fleet_hit_tokens\": %" PRIu64,
           r->local_only_tokens, r->fleet_tokens);
    printf(", \"local_only_hit_rate\": %.6f, \"fleet_hit_rate\": %.6f, \"from_local\": %.6f"
           ", \"from_remote\": %.6f, \"remote_read_gbps_mean\": %.6f, \"remote_write_gbps_mean\": %.6f, \"remote_gbps_mean\": %.6f, \"remote_gbps_p99_1s\": %.6f"
           ", \"remote_gbps_max_1s\": %.6f, \"remote_gbps_p99_10s\": %.6f, \"remote_hit_blocks\": %" PRIu64
           ", \"remote_write_blocks\": %" PRIu64 ", \"remote_held_blocks\": %" PRIu64
           ", \"remote_evictions\": %" PRIu64 ", \"puts_refused\": %" PRIu64 ", \"node_requests\": [",
           r->local_only, r->fleet, r->from_local, r->from_remote, r->read_gbps, r->write_gbps, r->gbps_mean, r->gbps_p99_1s,
           r->gbps_max_1s, r->gbps_p99_10s, r->remote_hits, r->remote_writes, r->remote_held,
           r->remote_evictions, r->put_refused);
    for (uint32_t k = 0; k < s->nodes; k++) printf("%s%" PRIu64, k ? ", " : "", r->node_requests[k]);
    printf("]}%s\n", i + 1 < n ? "," : "");
  }
  printf(" ]}\n");
}

/* ---- options ------------------------------------------------------------------------ */

#define FLEET_N_OPTS 11

static void fleet_opts(fleet_cfg *c, cli_opt o[FLEET_N_OPTS])
{
  const cli_opt t[FLEET_N_OPTS] = {
      {"--fleet", "N", CLI_U64, &c->nodes, 1, FLEET_MAX_NODES, "fleet mode: N nodes (up to 256)"},
      {"--model", "NAME", CLI_STR, &c->model, 0, 0, "a built-in model"},
      {"--config", "FILE", CLI_STR, &c->config, 0, 0, "or a Hugging Face config.json"},
      {"--trace", "FILE", CLI_STR, &c->trace, 0, 0, "Mooncake JSONL trace (required)"},
      {"--hot", "GIB", CLI_STR, &c->hot_gib, 0, 0, "hot tier RAM per node, GiB (default 0)"},
      {"--warm", "GIB", CLI_STR, &c->warm_gib, 0, 0, "warm tier RAM per node, GiB (default 0)"},
      {"--cold-tokens", "LIST", CLI_STR, &c->local, 0, 0, "local cold capacities per node (default 1M)"},
      {"--remote-tokens", "LIST", CLI_STR, &c->remote, 0, 0, "shared remote capacities, 0: none (default inf)"},
      {"--route", "LIST", CLI_STR, &c->route, 0, 0, "rr, session or both (default rr,session)"},
      {"--policy", "P", CLI_STR, &c->policy, 0, 0, "local cold eviction: chain (default), chain-leaf, learned, lru"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the table as JSON"},
  };
  memcpy(o, t, sizeof t);
}

void plan_fleet_usage(FILE *f)
{
  fleet_cfg d;
  cli_opt o[FLEET_N_OPTS];
  fleet_opts(&d, o);
  fprintf(f, "\nfleet mode: kvtier plan --fleet N (--model NAME | --config FILE) --trace FILE\n"
             "N nodes with local tiers over a shared remote tier (Redis, allkeys-lru); the\n"
             "trace's requests spread over the nodes in turn (rr) or by conversation\n"
             "(session); local-only against fleet hit rates and the remote bandwidth.\n"
             "Capacities: comma lists; every combination is one row.\n\n");
  cli_print_opts(f, o, FLEET_N_OPTS);
}

int plan_fleet_wanted(int argc, char **argv)
{
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--fleet") == 0 || strncmp(argv[i], "--fleet=", 8) == 0) return 1;
  return 0;
}

static int fbad(const char *opt, const char *val, const char *want)
{
  fprintf(stderr, "kvtier plan: %s must be %s, not '%s'\nrun 'kvtier help plan' for its options\n",
          opt, want, val);
  return CLI_USAGE;
}

/* A comma list of capacities ("0" allowed when zero_ok), each once. */
static int parse_list(const char *opt, const char *list, int zero_ok, uint64_t *out, size_t *n)
{
  char buf[256];
  if (snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf) return fbad(opt, list, "shorter");
  const char *want = zero_ok ? "token counts of at least 512 (e.g. 10M), inf or 0"
                             : "token counts of at least 512 (e.g. 10M) or inf";
  *n = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    uint64_t v;
    if (zero_ok && strcmp(tok, "0") == 0) v = 0;
    else if (parse_tokens(tok, &v)) return fbad(opt, tok, want);
    for (size_t i = 0; i < *n; i++)
      if (out[i] == v) return fbad(opt, list, "a list without repeats");
    if (*n == FLEET_MAX_LIST) return fbad(opt, list, "at most 8 capacities");
    out[(*n)++] = v;
  }
  return *n ? CLI_OK : fbad(opt, list, want);
}

static int parse_routes(const char *list, fleet_setup *s)
{
  if (strcmp(list, "rr") == 0) s->routes[s->n_routes++] = ROUTE_RR;
  else if (strcmp(list, "session") == 0) s->routes[s->n_routes++] = ROUTE_SESSION;
  else if (strcmp(list, "rr,session") == 0 || strcmp(list, "both") == 0) {
    s->routes[s->n_routes++] = ROUTE_RR;
    s->routes[s->n_routes++] = ROUTE_SESSION;
  } else {
    return fbad("--route", list, "rr, session, rr,session or both");
  }
  return CLI_OK;
}

static int parse_gib(const char *opt, const char *s, uint64_t *out)
{
  *out = 0;
  if (!s) return CLI_OK;
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < 0 || v > (1 << 24))
    return fbad(opt, s, "a number from 0 to 16777216");
  *out = (uint64_t)(v * (1ull << 30));
  return CLI_OK;
}

static int parse_fleet_policy(const char *s, int *out)
{
  if (!s || strcmp(s, "chain") == 0) *out = KVT_EVICT_CHAIN;
  else if (strcmp(s, "lru") == 0) *out = KVT_EVICT_LRU;
  else if (strcmp(s, "chain-leaf") == 0) *out = KVT_EVICT_CHAIN_LEAF;
  else if (strcmp(s, "learned") == 0) *out = KVT_EVICT_LEARNED;
  else return fbad("--policy", s, "chain, chain-leaf, learned or lru");
  return CLI_OK;
}

static int setup_model(const fleet_cfg *c, fleet_setup *s)
{
  if (!c->model == !c->config) {
    fprintf(stderr, "kvtier plan: give one of --model NAME or --config FILE\n"
                    "run 'kvtier help plan' for its options and the built-in models\n");
    return CLI_USAGE;
  }
  if (c->model ? plan_model_builtin(c->model, &s->m) : plan_model_config(c->config, &s->m))
    return c->model ? CLI_USAGE : CLI_FAIL;
  if (fold_shape(&s->m, &s->shape)) {
    fprintf(stderr, "kvtier plan: %s: a 512-token block is too large for kvtier\n", s->m.name);
    return CLI_FAIL;
  }
  kvt_shape real = {s->m.n_layers, s->m.n_kv_heads, s->m.head_dim, s->m.dtype, PLAN_BLOCK_TOKENS};
  s->rec_true = kvt_cold_record_bytes(&real);
  s->rec_folded = kvt_cold_record_bytes(&s->shape);
  return CLI_OK;
}

/* Options into s; the trace loaded and routed. */
static int setup(const fleet_cfg *c, fleet_setup *s)
{
  int rc = setup_model(c, s);
  if (!rc) rc = parse_gib("--hot", c->hot_gib, &s->hot_bytes);
  if (!rc) rc = parse_gib("--warm", c->warm_gib, &s->warm_bytes);
  if (!rc) rc = parse_list("--cold-tokens", c->local ? c->local : "1M", 0, s->local, &s->n_local);
  if (!rc) rc = parse_list("--remote-tokens", c->remote ? c->remote : "inf", 1, s->remote, &s->n_remote);
  if (!rc) rc = parse_routes(c->route ? c->route : "rr,session", s);
  if (!rc) rc = parse_fleet_policy(c->policy, &s->policy);
  if (!rc && kvt_codec_parse("k8v3", &s->k_codec, &s->v_codec)) rc = CLI_FAIL;
  if (rc) return rc;
  if (!c->trace) {
    fprintf(stderr, "kvtier plan: the fleet mode replays a trace: give --trace FILE\n");
    return CLI_USAGE;
  }
  s->nodes = (uint32_t)c->nodes;
  if (plan_trace_load(c->trace, &s->t)) return CLI_FAIL;
  const plan_trace *t = &s->t;
  s->t0_s = t->reqs[0].t_ms / 1e3;
  s->duration_s = (t->reqs[t->n - 1].t_ms - t->reqs[0].t_ms) / 1e3;
  if (s->duration_s < 1) s->duration_s = 1;
  s->session_depth = common_depth(t);
  for (size_t i = 0; i < s->n_routes; i++) {
    s->node_of[i] = malloc(t->n * sizeof *s->node_of[i]);
    if (!s->node_of[i]) {
      fprintf(stderr, "kvtier plan: out of memory\n");
      return CLI_FAIL;
    }
    route_all(s, s->routes[i], s->node_of[i]);
  }
  return CLI_OK;
}

int cmd_plan_fleet(int argc, char **argv)
{
  fleet_cfg c = {0};
  cli_opt o[FLEET_N_OPTS];
  fleet_opts(&c, o);
  int help = 0;
  int rc = cli_parse("plan", argc - 1, argv + 1, o, FLEET_N_OPTS, &help);
  if (rc != CLI_OK) return rc;
  if (help) {
    plan_usage(stdout);
    return CLI_OK;
  }
  fleet_setup s;
  memset(&s, 0, sizeof s);
  rc = setup(&c, &s);
  size_t per = s.n_remote, n_rows = s.n_routes * s.n_local * per;
  fleet_row *rows = rc ? NULL : calloc(n_rows, sizeof *rows);
  if (!rc && !rows) {
    fprintf(stderr, "kvtier plan: out of memory\n");
    rc = CLI_FAIL;
  }
  for (size_t ri = 0; !rc && ri < s.n_routes; ri++)
    for (size_t li = 0; !rc && li < s.n_local; li++)
      rc = run_local(&s, ri, s.local[li], rows + (ri * s.n_local + li) * per);
  if (!rc && c.json) print_json(&s, rows, n_rows, c.trace);
  else if (!rc) print_text(&s, rows, n_rows, c.trace);
  free(rows);
  for (size_t i = 0; i < 2; i++) free(s.node_of[i]);
  plan_trace_free(&s.t);
  return rc;
}
