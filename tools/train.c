/* train.c - `kvtier train`: fit the learned scorer's predictor (KVpop,
 * DESIGN.md section 4) to full-cache attention traces: features of each
 * block from what it received so far, target the mass it receives over
 * the next W steps; weighted least squares that counts most the blocks
 * near the keep/evict boundary. Writes the predictor file (docs/policy.md). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/mem.h"
#include "cmds.h"
#include "engine/predictor.h"
#include "kvtier.h"
#include "trace.h"
#include "util.h"

#define TRAIN_MAX_TRACES 64
#define TRAIN_N_BUDGETS 3
#define TRAIN_EPS 1e-3f       /* added to the future mass before the log */
#define TRAIN_FLOOR_WEIGHT 0.05 /* every block counts a little */
#define TRAIN_RIDGE 1e-3      /* on standardized features */
#define TRAIN_HELD_EVERY 5    /* every 5th sequence is held out */

static const double default_budgets[TRAIN_N_BUDGETS] = {0.1, 0.25, 0.5};

typedef struct train_cfg {
  const char *traces[TRAIN_MAX_TRACES], *out, *budget_s, *layers_s, *model_s;
  size_t n_traces;
  uint64_t window, stride, max_samples, hidden, rounds; /* rounds: UINT64_MAX unset */
  int json, no_weight;
  double budgets[TRAIN_N_BUDGETS];
  size_t n_budgets;
} train_cfg;

/* Samples: one per (sequence, layer, step, block), grouped per (sequence,
 * layer, step) since the budget ranks blocks within a group. */
typedef struct samples {
  float *x, *y, *fut, *wt; /* [n][N_FEAT], log target, future mass per step, weight */
  size_t n, cap;
  size_t *grp;             /* group starts, [n_grp + 1] */
  uint32_t *grp_layer;
  uint8_t *grp_held;
  size_t n_grp, grp_cap, lay_cap, held_cap;
} samples;

/* One sequence of a trace, dense: mass[layer][step][block]. */
typedef struct seqbuf {
  float *mass, *knorm;     /* [L][steps][blocks], [L][blocks] */
  uint32_t steps, blocks;  /* capacities */
  uint32_t n_steps;        /* steps seen (the first at pos = block_tokens) */
} seqbuf;

/* A sequence kept whole for the eviction replay: held-out ones to
 * measure, training ones to collect on-policy samples from. */
typedef struct held_seq {
  float *mass, *knorm;     /* as seqbuf, n_steps steps */
  uint32_t n_steps;
  int is_held;
} held_seq;

#define TRAIN_MAX_HELD 1024
#define TRAIN_KEEP_BYTES (384ull << 20) /* training sequences kept, at most */

typedef struct train_run {
  train_cfg cfg;
  held_seq held[TRAIN_MAX_HELD];
  size_t n_held_kept;
  uint64_t kept_bytes;
  trace_hdr h;
  samples s;
  seqbuf q;
  size_t n_seqs, n_held;
  int full;                /* samples capacity reached */
} train_run;

/* ---- options ------------------------------------------------------------ */

#define TRAIN_N_OPTS 10

static void train_opts(train_cfg *c, cli_opt o[TRAIN_N_OPTS]) {
  const cli_opt opts[TRAIN_N_OPTS] = {
      {"--window", "W", CLI_U64, &c->window, 1, 4096,
       "steps of future attention the target sums (default 32)"},
      {"--budget", "F", CLI_STR, &c->budget_s, 0, 0,
       "budget whose keep/evict boundary the loss weights (default 0.1, 0.25 and 0.5)"},
      {"--layers", "MODE", CLI_STR, &c->layers_s, 0, 0,
       "per-layer (weights per layer), shared, or auto (the better on held-out; default)"},
      {"--model", "KIND", CLI_STR, &c->model_s, 0, 0,
       "linear, mlp (one hidden ReLU layer), or auto (the better on held-out; default)"},
      {"--hidden", "H", CLI_U64, &c->hidden, 1, KVT_PRED_MAX_HIDDEN,
       "hidden units of the mlp (default 16)"},
      {"--stride", "K", CLI_U64, &c->stride, 1, 4096,
       "take every K-th step as a sample (default: to fit --max-samples)"},
      {"--max-samples", "N", CLI_U64, &c->max_samples, 1000, 100000000,
       "block samples kept in memory, at most (default 1500000)"},
      {"--rounds", "N", CLI_U64, &c->rounds, 0, 8,
       "on-policy rounds at most, each kept only if the held-out replay improves (default 1)"},
      {"--uniform-loss", NULL, CLI_FLAG, &c->no_weight, 0, 0,
       "weight every block alike (to measure the boundary weighting)"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the figures as one JSON object"},
  };
  memcpy(o, opts, sizeof opts);
}

void train_usage(FILE *f) {
  train_cfg c;
  cli_opt o[TRAIN_N_OPTS];
  train_opts(&c, o);
  fprintf(f,
          "usage: kvtier train --trace T [--trace T2 ...] -o PREDICTOR [--window W]\n"
          "                    [--budget F] [--model KIND] [--hidden H] [--layers MODE]\n"
          "                    [--stride K] [--max-samples N]\n"
          "                    [--uniform-loss] [--json]\n\n"
          "Fits the learned scorer's predictor (docs/policy.md) to full-cache attention\n"
          "traces (`kvtier eval --policy full --dump-trace T`, or a serving engine's):\n"
          "for every block at every step, its features from the attention it received so\n"
          "far and, as the target, the mass it receives over the next W steps. Weighted\n"
          "squared error on log mass (linear: closed form; mlp: Adam), the weight highest\n"
          "for blocks whose true rank is\n"
          "near the keep/evict boundary of the budget(s). Every %dth sequence is held\n"
          "out; the figures are on those (share of the next W steps' mass that the\n"
          "predictor's top blocks capture, against the best possible), then the model is\n"
          "refit on all sequences and written. Train on sequences you do not evaluate on.\n\n"
          "options:\n"
          "  --trace T          a full-cache trace, version 1 or 2 (repeat for more)\n"
          "  -o PREDICTOR       the predictor file to write\n",
          TRAIN_HELD_EVERY);
  cli_print_opts(f, o, TRAIN_N_OPTS);
}

static int usage_error(const char *msg, const char *arg) {
  fprintf(stderr, "kvtier train: %s%s%s\nrun 'kvtier help train' for its options\n", msg,
          arg ? ": " : "", arg ? arg : "");
  return CLI_USAGE;
}

/* --trace (repeatable) and -o are taken out of argv before cli_parse. */
static int take_files(train_cfg *c, int *argc, char **argv) {
  int k = 0;
  for (int i = 0; i < *argc; i++) {
    int is_trace = strcmp(argv[i], "--trace") == 0, is_out = strcmp(argv[i], "-o") == 0 ||
                                                              strcmp(argv[i], "--output") == 0;
    if (!is_trace && !is_out) {
      argv[k++] = argv[i];
      continue;
    }
    if (i + 1 >= *argc || !argv[i + 1][0]) return usage_error("missing value after", argv[i]);
    if (is_out) c->out = argv[++i];
    else if (c->n_traces == TRAIN_MAX_TRACES) return usage_error("too many --trace", NULL);
    else c->traces[c->n_traces++] = argv[++i];
  }
  *argc = k;
  return CLI_OK;
}

static int train_check(train_cfg *c) {
  if (!c->n_traces) return usage_error("--trace is required", NULL);
  if (!c->out) return usage_error("-o PREDICTOR is required", NULL);
  if (!c->window) c->window = 32;
  if (!c->max_samples) c->max_samples = 1500000;
  if (!c->layers_s) c->layers_s = "auto";
  if (!c->model_s) c->model_s = "auto";
  if (!c->hidden) c->hidden = 16;
  if (c->rounds == UINT64_MAX) c->rounds = 1;
  if (strcmp(c->model_s, "auto") && strcmp(c->model_s, "linear") && strcmp(c->model_s, "mlp"))
    return usage_error("--model must be linear, mlp or auto", c->model_s);
  if (strcmp(c->layers_s, "auto") && strcmp(c->layers_s, "per-layer") &&
      strcmp(c->layers_s, "shared"))
    return usage_error("--layers must be per-layer, shared or auto", c->layers_s);
  if (c->budget_s) {
    char *end = NULL;
    c->budgets[0] = strtod(c->budget_s, &end);
    if (*end || !(c->budgets[0] > 0 && c->budgets[0] < 1))
      return usage_error("--budget must be a fraction in (0, 1)", c->budget_s);
    c->n_budgets = 1;
  } else {
    memcpy(c->budgets, default_budgets, sizeof default_budgets);
    c->n_budgets = TRAIN_N_BUDGETS;
  }
  return CLI_OK;
}

/* ---- samples ------------------------------------------------------------ */

static int grow(void **p, size_t *cap, size_t need, size_t each) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 1024;
  while (c < need) c *= 2;
  void *q = realloc(*p, c * each);
  if (!q) return -ENOMEM;
  *p = q;
  *cap = c;
  return 0;
}

static int samples_reserve(samples *s, size_t n_more) {
  size_t need = s->n + n_more, cap = s->cap;
  if (need <= cap) return 0;
  size_t c = cap ? cap : 4096;
  while (c < need) c *= 2;
  float *x = realloc(s->x, c * KVT_PRED_N_FEAT * sizeof *x);
  if (x) s->x = x;
  float *y = realloc(s->y, c * sizeof *y);
  if (y) s->y = y;
  float *fu = realloc(s->fut, c * sizeof *fu);
  if (fu) s->fut = fu;
  float *wt = realloc(s->wt, c * sizeof *wt);
  if (wt) s->wt = wt;
  if (!x || !y || !fu || !wt) return -ENOMEM;
  s->cap = c;
  return 0;
}

static void samples_free(samples *s) {
  free(s->x);
  free(s->y);
  free(s->fut);
  free(s->wt);
  free(s->grp);
  free(s->grp_layer);
  free(s->grp_held);
}

static int cmp_f_desc(const void *a, const void *b) {
  float x = **(const float *const *)a, y = **(const float *const *)b;
  return (x < y) - (x > y);
}

/* Boundary weights of one group: high for a block whose true rank is near
 * the number of blocks a budget keeps, so the fit spends its capacity on
 * the decisions the budget makes (the top and the bottom of the ranking
 * are easy and do not change what is kept). */
static void group_weights(const train_cfg *c, float *fut, float *wt, size_t n) {
  const float *ptr[4096], **p = n <= 4096 ? ptr : malloc(n * sizeof *p);
  if (!p) {
    for (size_t i = 0; i < n; i++) wt[i] = 1;
    return;
  }
  for (size_t i = 0; i < n; i++) p[i] = &fut[i];
  qsort(p, n, sizeof *p, cmp_f_desc);
  double sigma = fmax(1.0, 0.1 * (double)n);
  for (size_t r = 0; r < n; r++) {
    double w = TRAIN_FLOOR_WEIGHT;
    for (size_t b = 0; b < c->n_budgets; b++) {
      double k = fmax(1.0, c->budgets[b] * (double)n), d = ((double)r + 0.5 - k) / sigma;
      w += exp(-0.5 * d * d);
    }
    wt[p[r] - fut] = c->no_weight ? 1.0f : (float)w;
  }
  if (p != ptr) free(p);
}

/* ---- reading traces ------------------------------------------------------ */

static float *qmass(seqbuf *q, uint32_t l, uint32_t t) {
  return q->mass + ((size_t)l * q->steps + t) * q->blocks;
}

/* Turn one buffered sequence into samples: replay the observations
 * through the scorer's own state update, and at every stride-th step
 * record each block's features and its mass over the next W steps. */
static int seq_samples(train_run *r) {
  seqbuf *q = &r->q;
  const trace_hdr *h = &r->h;
  uint32_t L = h->n_layers, bt = h->block_tokens, T = q->n_steps;
  int held = r->n_seqs % TRAIN_HELD_EVERY == TRAIN_HELD_EVERY - 1;
  kvt_pred_bstate *st = calloc(q->blocks, sizeof *st);
  if (!st) return -ENOMEM;
  int rc = 0;
  for (uint32_t l = 0; !rc && l < L && !r->full; l++) {
    memset(st, 0, q->blocks * sizeof *st);
    for (uint32_t b = 0; b < q->blocks; b++) st[b].key_norm = q->knorm[(size_t)l * q->blocks + b];
    for (uint32_t t = 0; t < T && !rc; t++) {
      uint32_t nb = (bt + t) / bt;
      const float *m = qmass(q, l, t);
      for (uint32_t b = 0; b < nb; b++) kvt_pred_observe(&st[b], m[b]);
      if (t % r->cfg.stride || t + 1 >= T || nb < 2) continue;
      if (r->s.n + nb > r->cfg.max_samples) {
        r->full = 1;
        break;
      }
      if ((rc = samples_reserve(&r->s, nb)) ||
          (rc = grow((void **)&r->s.grp, &r->s.grp_cap, r->s.n_grp + 2, sizeof *r->s.grp)) ||
          (rc = grow((void **)&r->s.grp_layer, &r->s.lay_cap, r->s.n_grp + 1,
                     sizeof *r->s.grp_layer)) ||
          (rc = grow((void **)&r->s.grp_held, &r->s.held_cap, r->s.n_grp + 1, 1)))
        break;
      uint32_t t_end = t + (uint32_t)r->cfg.window < T - 1 ? t + (uint32_t)r->cfg.window : T - 1;
      size_t at = r->s.n;
      for (uint32_t b = 0; b < nb; b++) {
        double f = 0;
        for (uint32_t u = t + 1; u <= t_end; u++) f += qmass(q, l, u)[b];
        f /= (double)(t_end - t);
        r->s.fut[at + b] = (float)f;
        r->s.y[at + b] = logf((float)f + TRAIN_EPS);
        kvt_pred_features(&st[b], b, nb, bt, l, L, r->s.x + (at + b) * KVT_PRED_N_FEAT);
      }
      group_weights(&r->cfg, r->s.fut + at, r->s.wt + at, nb);
      r->s.grp[r->s.n_grp] = at;
      r->s.grp_layer[r->s.n_grp] = l;
      r->s.grp_held[r->s.n_grp++] = (uint8_t)held;
      r->s.n += nb;
      r->s.grp[r->s.n_grp] = r->s.n;
    }
  }
  free(st);
  size_t nm = (size_t)L * q->steps * q->blocks, nk = (size_t)L * q->blocks;
  if (!rc && r->n_held_kept < TRAIN_MAX_HELD &&
      (held || r->kept_bytes + (nm + nk) * 4 <= TRAIN_KEEP_BYTES)) { /* keep it for the replay */
    held_seq *hs = &r->held[r->n_held_kept];
    hs->is_held = held;
    r->kept_bytes += (nm + nk) * 4;
    hs->mass = malloc(nm * sizeof *hs->mass);
    hs->knorm = malloc(nk * sizeof *hs->knorm);
    if (!hs->mass || !hs->knorm) {
      free(hs->mass);
      free(hs->knorm);
      return -ENOMEM;
    }
    memcpy(hs->mass, q->mass, nm * sizeof *hs->mass);
    memcpy(hs->knorm, q->knorm, nk * sizeof *hs->knorm);
    hs->n_steps = T;
    r->n_held_kept++;
  }
  r->n_seqs++;
  r->n_held += (size_t)held;
  return rc;
}

static int trace_fail(const char *path, const char *what) {
  fprintf(stderr, "kvtier train: %s: %s\n", path, what);
  return CLI_FAIL;
}

/* Read one trace; records must be a full cache's (every block, in order). */
static int read_trace(train_run *r, const char *path, int first) {
  FILE *f = fopen(path, "rb");
  if (!f) return trace_fail(path, strerror(errno));
  trace_hdr h;
  int rc = trace_read_hdr(f, &h);
  if (rc) {
    fclose(f);
    return trace_fail(path, "not an attention trace (bad header, or a version this build "
                            "cannot read)");
  }
  if (h.scorer != KVT_SCORER_FULL) {
    fclose(f);
    return trace_fail(path, "not a full-cache trace: training needs every block's mass at "
                            "every step (kvtier eval --policy full --dump-trace)");
  }
  if (h.n_layers == 0 || h.n_layers > KVT_PRED_MAX_LAYERS || h.seq_len == 0 ||
      h.seq_len > (1u << 16)) {
    fclose(f);
    return trace_fail(path, "n_layers or seq_len out of range");
  }
  if (!first && (h.n_layers != r->h.n_layers || h.block_tokens != r->h.block_tokens ||
                 h.head_dim != r->h.head_dim || h.n_kv_heads != r->h.n_kv_heads ||
                 h.seq_len != r->h.seq_len)) {
    fclose(f);
    return trace_fail(path, "its shape differs from the first trace's");
  }
  r->h = h;
  seqbuf *q = &r->q;
  uint32_t L = h.n_layers, blocks = h.seq_len / h.block_tokens + 1, steps = h.seq_len;
  if (first) {
    q->mass = calloc((size_t)L * steps * blocks, sizeof *q->mass);
    q->knorm = calloc((size_t)L * blocks, sizeof *q->knorm);
    q->steps = steps;
    q->blocks = blocks;
    if (!q->mass || !q->knorm) {
      fclose(f);
      return cli_lib_error("train", "allocating", -ENOMEM);
    }
    if (!r->cfg.stride) { /* roughly max_samples from 64 sequences */
      double per_seq = (double)L * steps * (steps / (double)h.block_tokens) / 2;
      r->cfg.stride = (uint64_t)fmax(1, ceil(per_seq * 64 / (double)r->cfg.max_samples));
    }
  }
  trace_entry *e = malloc(blocks * sizeof *e);
  if (!e) {
    fclose(f);
    return cli_lib_error("train", "allocating", -ENOMEM);
  }
  trace_rec rec;
  uint32_t cur = UINT32_MAX;
  const char *bad = NULL;
  q->n_steps = 0;
  while (!bad && !r->full && (rc = trace_read_rec(f, &rec)) == 1) {
    if (rec.pos < h.block_tokens || rec.pos >= h.seq_len || rec.layer >= L ||
        rec.n_blocks != rec.pos / h.block_tokens) {
      bad = "a record is not a full cache's (every complete block at every step)";
      break;
    }
    if (trace_read_entries(f, &h, &rec, e)) {
      bad = "truncated";
      break;
    }
    if (rec.seq != cur) {
      if (cur != UINT32_MAX && q->n_steps && seq_samples(r)) {
        bad = "out of memory";
        break;
      }
      cur = rec.seq;
      q->n_steps = 0;
    }
    uint32_t t = rec.pos - h.block_tokens;
    if (t + 1 > q->n_steps) q->n_steps = t + 1;
    float *m = qmass(q, rec.layer, t);
    for (uint32_t b = 0; b < rec.n_blocks; b++) {
      if (e[b].block != b) bad = "a record is not a full cache's (blocks missing)";
      m[b] = e[b].mass;
      q->knorm[(size_t)rec.layer * q->blocks + b] = e[b].key_norm;
    }
  }
  if (rc < 0 && !bad) bad = "truncated or damaged record";
  if (!bad && !r->full && cur != UINT32_MAX && q->n_steps && seq_samples(r)) bad = "out of memory";
  free(e);
  fclose(f);
  return bad ? trace_fail(path, bad) : CLI_OK;
}

/* ---- fitting ------------------------------------------------------------- */

/* Solve A x = b (n x n, symmetric positive definite after the ridge) by
 * Gaussian elimination with partial pivoting. 0, or -1 if singular. */
static int solve(double *A, double *b, size_t n) {
  for (size_t c = 0; c < n; c++) {
    size_t piv = c;
    for (size_t i = c + 1; i < n; i++)
      if (fabs(A[i * n + c]) > fabs(A[piv * n + c])) piv = i;
    if (fabs(A[piv * n + c]) < 1e-300) return -1;
    for (size_t j = 0; j < n; j++) {
      double t = A[c * n + j];
      A[c * n + j] = A[piv * n + j];
      A[piv * n + j] = t;
    }
    double t = b[c];
    b[c] = b[piv];
    b[piv] = t;
    for (size_t i = c + 1; i < n; i++) {
      double f = A[i * n + c] / A[c * n + c];
      for (size_t j = c; j < n; j++) A[i * n + j] -= f * A[c * n + j];
      b[i] -= f * b[c];
    }
  }
  for (size_t c = n; c-- > 0;) {
    for (size_t j = c + 1; j < n; j++) b[c] -= A[c * n + j] * b[j];
    b[c] /= A[c * n + c];
  }
  return 0;
}

/* Which groups a fit uses: layer (UINT32_MAX: all), and held-out ones or not. */
typedef struct sel {
  uint32_t layer;
  int use_held; /* 0: training groups only; 1: all groups */
} sel;

static int sel_has(const samples *s, size_t g, sel w) {
  return (w.layer == UINT32_MAX || s->grp_layer[g] == w.layer) && (w.use_held || !s->grp_held[g]);
}

/* Standardization of the selected samples' features (weighted). */
static double stats(const samples *s, sel w, double *mean, double *sd) {
  enum { F = KVT_PRED_N_FEAT };
  double sw = 0;
  memset(mean, 0, F * sizeof *mean);
  memset(sd, 0, F * sizeof *sd);
  for (size_t g = 0; g < s->n_grp; g++) {
    if (!sel_has(s, g, w)) continue;
    for (size_t i = s->grp[g]; i < s->grp[g + 1]; i++) {
      sw += s->wt[i];
      for (size_t j = 0; j < F; j++) mean[j] += s->wt[i] * s->x[i * F + j];
    }
  }
  if (sw <= 0) return 0;
  for (size_t j = 0; j < F; j++) mean[j] /= sw;
  for (size_t g = 0; g < s->n_grp; g++) {
    if (!sel_has(s, g, w)) continue;
    for (size_t i = s->grp[g]; i < s->grp[g + 1]; i++)
      for (size_t j = 0; j < F; j++) {
        double d = s->x[i * F + j] - mean[j];
        sd[j] += s->wt[i] * d * d;
      }
  }
  for (size_t j = 0; j < F; j++) sd[j] = sqrt(sd[j] / sw);
  sd[0] = 0; /* the bias feature is not standardized */
  return sw;
}

static void standardize(const float *x, const double *mean, const double *sd, float *z) {
  z[0] = 1;
  for (size_t j = 1; j < KVT_PRED_N_FEAT; j++)
    z[j] = sd[j] > 1e-9 ? (float)((x[j] - mean[j]) / sd[j]) : 0;
}

/* Weighted ridge regression of y on the features of the selected groups;
 * features are standardized for the ridge, and the weights unfolded back
 * to raw features. out[N_FEAT]. */
static int fit_linear(const samples *s, sel w, float *out) {
  enum { F = KVT_PRED_N_FEAT };
  double mean[F], sd[F], sw = stats(s, w, mean, sd);
  if (sw <= 0) return -1;
  /* z_0 = 1 (bias), z_j = (x_j - mean_j) / sd_j, or 0 for a constant feature */
  double A[F * F] = {0}, b[F] = {0}, z[F];
  for (size_t g = 0; g < s->n_grp; g++) {
    if (!sel_has(s, g, w)) continue;
    for (size_t i = s->grp[g]; i < s->grp[g + 1]; i++) {
      z[0] = 1;
      for (size_t j = 1; j < F; j++) z[j] = sd[j] > 1e-9 ? (s->x[i * F + j] - mean[j]) / sd[j] : 0;
      double wi = s->wt[i] / sw;
      for (size_t j = 0; j < F; j++) {
        b[j] += wi * z[j] * s->y[i];
        for (size_t k = j; k < F; k++) A[j * F + k] += wi * z[j] * z[k];
      }
    }
  }
  for (size_t j = 0; j < F; j++) {
    for (size_t k = 0; k < j; k++) A[j * F + k] = A[k * F + j];
    if (j) A[j * F + j] += TRAIN_RIDGE;
  }
  if (solve(A, b, F)) return -1;
  double bias = b[0];
  for (size_t j = 1; j < F; j++) {
    double c = sd[j] > 1e-9 ? b[j] / sd[j] : 0;
    out[j] = (float)c;
    bias -= c * mean[j];
  }
  out[0] = (float)bias;
  return 0;
}

#define MLP_BATCH 512
#define MLP_EPOCHS 8

/* One hidden layer of ReLUs on standardized features, weighted squared
 * error, Adam; then folded back to raw features (the file's layout:
 * W1 [H][F] with feature 0 as the bias, b1 [H] = 0, w2 [H], b2). */
static int fit_mlp(const samples *s, sel w, uint32_t H, uint64_t seed, float *out) {
  enum { F = KVT_PRED_N_FEAT };
  double mean[F], sd[F];
  if (stats(s, w, mean, sd) <= 0) return -1;
  size_t n = 0;
  for (size_t g = 0; g < s->n_grp; g++)
    if (sel_has(s, g, w)) n += s->grp[g + 1] - s->grp[g];
  size_t *idx = malloc(n * sizeof *idx);
  size_t np = (size_t)H * F + 2 * H + 1;
  float *p = calloc(np, sizeof *p), *m1 = calloc(np, sizeof *m1), *m2 = calloc(np, sizeof *m2);
  double *gr = calloc(np, sizeof *gr);
  if (!idx || !p || !m1 || !m2 || !gr) {
    free(idx), free(p), free(m1), free(m2), free(gr);
    return -1;
  }
  n = 0;
  double ymean = 0, wsum = 0;
  for (size_t g = 0; g < s->n_grp; g++)
    if (sel_has(s, g, w))
      for (size_t i = s->grp[g]; i < s->grp[g + 1]; i++) {
        idx[n++] = i;
        ymean += s->wt[i] * s->y[i];
        wsum += s->wt[i];
      }
  prng rg;
  prng_seed(&rg, seed);
  float *W1 = p, *w2 = p + (size_t)H * F + H; /* b1 (p + H*F) stays 0 */
  for (size_t i = 0; i < (size_t)H * F; i++) W1[i] = (float)(prng_gauss(&rg) / sqrt((double)F));
  for (uint32_t h = 0; h < H; h++) w2[h] = (float)(prng_gauss(&rg) / sqrt((double)H));
  w2[H] = (float)(ymean / wsum);
  const double b1m = 0.9, b2m = 0.999;
  uint64_t step = 0;
  float z[F], a[KVT_PRED_MAX_HIDDEN];
  for (int ep = 0; ep < MLP_EPOCHS; ep++) {
    for (size_t i = n; i > 1; i--) { /* shuffle */
      size_t j = prng_next(&rg) % i, t = idx[i - 1];
      idx[i - 1] = idx[j];
      idx[j] = t;
    }
    double lr = 3e-3 * pow(0.1, (double)ep / (MLP_EPOCHS - 1));
    for (size_t b0 = 0; b0 < n; b0 += MLP_BATCH) {
      size_t b1 = b0 + MLP_BATCH < n ? b0 + MLP_BATCH : n;
      memset(gr, 0, np * sizeof *gr);
      double bw = 0;
      for (size_t k = b0; k < b1; k++) {
        size_t i = idx[k];
        standardize(s->x + i * F, mean, sd, z);
        float y = w2[H];
        for (uint32_t h = 0; h < H; h++) {
          float v = 0;
          for (size_t j = 0; j < F; j++) v += W1[(size_t)h * F + j] * z[j];
          a[h] = v > 0 ? v : 0;
          y += w2[h] * a[h];
        }
        double d = 2.0 * s->wt[i] * (y - s->y[i]);
        bw += s->wt[i];
        gr[(size_t)H * F + H + H] += d;
        for (uint32_t h = 0; h < H; h++) {
          gr[(size_t)H * F + H + h] += d * a[h];
          if (a[h] <= 0) continue;
          double dh = d * w2[h];
          for (size_t j = 0; j < F; j++) gr[(size_t)h * F + j] += dh * z[j];
        }
      }
      step++;
      double c1 = 1 - pow(b1m, (double)step), c2 = 1 - pow(b2m, (double)step);
      for (size_t q = 0; q < np; q++) {
        if (q >= (size_t)H * F && q < (size_t)H * F + H) continue; /* b1 */
        double gq = gr[q] / bw;
        m1[q] = (float)(b1m * m1[q] + (1 - b1m) * gq);
        m2[q] = (float)(b2m * m2[q] + (1 - b2m) * gq * gq);
        p[q] -= (float)(lr * (m1[q] / c1) / (sqrt(m2[q] / c2) + 1e-8));
      }
    }
  }
  /* fold the standardization into W1 */
  for (uint32_t h = 0; h < H; h++) {
    double bias = W1[(size_t)h * F];
    for (size_t j = 1; j < F; j++) {
      double c = sd[j] > 1e-9 ? W1[(size_t)h * F + j] / sd[j] : 0;
      out[(size_t)h * F + j] = (float)c;
      bias -= c * mean[j];
    }
    out[(size_t)h * F] = (float)bias;
    out[(size_t)H * F + h] = 0;
    out[(size_t)H * F + H + h] = w2[h];
  }
  out[(size_t)H * F + 2 * H] = w2[H];
  free(idx), free(p), free(m1), free(m2), free(gr);
  return 0;
}

/* A fitted model is the engine's own predictor struct (weights in the
 * file's layout). */
typedef kvt_predictor model;

static int fit_model(const samples *s, const trace_hdr *h, uint32_t kind, uint32_t hidden,
                     uint32_t per_layer, int use_held, model *m) {
  uint32_t L = h->n_layers;
  *m = (model){.shape = {L, h->block_tokens, h->head_dim, h->n_kv_heads}, .kind = kind,
               .per_layer = per_layer, .hidden = kind == KVT_PRED_MLP ? hidden : 0,
               .set_floats = kvt_pred_set_floats(kind, hidden)};
  if (!(m->w = calloc((size_t)(per_layer ? L : 1) * m->set_floats, sizeof *m->w))) return -1;
  for (uint32_t l = 0; l < (per_layer ? L : 1); l++) {
    sel w = {per_layer ? l : UINT32_MAX, use_held};
    float *out = m->w + (size_t)l * m->set_floats;
    if (kind == KVT_PRED_LINEAR ? fit_linear(s, w, out) : fit_mlp(s, w, hidden, 0x7eed + l, out))
      return -1;
  }
  return 0;
}

static float model_score(const model *m, uint32_t layer, const float *x) {
  return kvt_predictor_infer(m, layer, x);
}

/* ---- held-out figures ------------------------------------------------------- */

enum { SC_MODEL, SC_H2O, SC_RECENT, SC_EMA, SC_N };
static const char *const sc_names[SC_N] = {"learned", "h2o", "recent", "ema"};

static float score_of(int sc, const model *m, uint32_t layer, const float *x) {
  switch (sc) {
  case SC_MODEL: return model_score(m, layer, x);
  case SC_H2O: return x[14];
  case SC_RECENT: return -x[1];
  default: return x[5];
  }
}

typedef struct idx_score {
  float s;
  uint32_t i;
} idx_score;

static int cmp_is_desc(const void *a, const void *b) {
  const idx_score *x = a, *y = b;
  if (x->s != y->s) return (x->s < y->s) - (x->s > y->s);
  return (x->i < y->i) - (x->i > y->i); /* ties: the newer block */
}

/* Mean over held-out groups of: future mass of the top ceil(budget * n)
 * blocks by the score, over that of the top by the true future mass. */
static double capture(const samples *s, const model *m, int sc, double budget) {
  idx_score *a = malloc(65536 * sizeof *a), *o = malloc(65536 * sizeof *o);
  double sum = 0;
  size_t n_g = 0;
  for (size_t g = 0; a && o && g < s->n_grp; g++) {
    if (!s->grp_held[g]) continue;
    size_t b0 = s->grp[g], n = s->grp[g + 1] - b0;
    if (n > 65536) continue;
    size_t k = (size_t)ceil(budget * (double)n);
    if (k < 1) k = 1;
    for (size_t i = 0; i < n; i++) {
      a[i] = (idx_score){score_of(sc, m, s->grp_layer[g], s->x + (b0 + i) * KVT_PRED_N_FEAT),
                         (uint32_t)i};
      o[i] = (idx_score){s->fut[b0 + i], (uint32_t)i};
    }
    qsort(a, n, sizeof *a, cmp_is_desc);
    qsort(o, n, sizeof *o, cmp_is_desc);
    double got = 0, best = 0;
    for (size_t i = 0; i < k; i++) {
      got += s->fut[b0 + a[i].i];
      best += s->fut[b0 + o[i].i];
    }
    if (best <= 0) continue;
    sum += got / best;
    n_g++;
  }
  free(a);
  free(o);
  return n_g ? sum / (double)n_g : NAN;
}

/* Weighted mean squared error of the log target on held-out samples. */
static double held_mse(const samples *s, const model *m) {
  double e = 0, w = 0;
  for (size_t g = 0; g < s->n_grp; g++) {
    if (!s->grp_held[g]) continue;
    for (size_t i = s->grp[g]; i < s->grp[g + 1]; i++) {
      double d = model_score(m, s->grp_layer[g], s->x + i * KVT_PRED_N_FEAT) - s->y[i];
      e += s->wt[i] * d * d;
      w += s->wt[i];
    }
  }
  return w > 0 ? e / w : NAN;
}

static double mean_capture(const samples *s, const model *m, const train_cfg *c) {
  double t = 0;
  for (size_t b = 0; b < TRAIN_N_BUDGETS; b++) t += capture(s, m, SC_MODEL, default_budgets[b]);
  (void)c;
  return t / TRAIN_N_BUDGETS;
}

/* ---- eviction replay on held-out sequences ------------------------------------ */

/* First position whose next-token loss kvtier eval scores. */
#define REPLAY_FIRST_POS 63u

enum { RP_LEARNED, RP_RECENT, RP_H2O, RP_TOVA, RP_ORACLE, RP_N };
static const char *const rp_names[RP_N] = {"learned", "recent", "h2o", "tova", "oracle"};

/* Replay one held-out (sequence, layer) with permanent eviction under a
 * byte budget (retained blocks plus the tail, as the engine counts them),
 * the retained blocks observing their masses renormalized over what is
 * retained (as attention over fewer blocks does). Returns the mean share
 * of the full cache's mass (blocks only) that the evicted blocks held,
 * over steps >= REPLAY_FIRST_POS; *n_steps receives their count. */
static double replay(train_run *r, const held_seq *hs, uint32_t l, int sc, double budget,
                     const model *m, uint64_t *n_steps, int collect);

/* An on-policy group: the n retained blocks ids[] at step t, of which the
 * budget keeps `keep`; targets from the full cache's future. */
static int add_policy_group(train_run *r, const held_seq *hs, uint32_t l, uint32_t t,
                            const uint32_t *ids, uint32_t n, uint32_t keep,
                            const kvt_pred_bstate *st, uint32_t nb) {
  samples *s = &r->s;
  uint32_t B = r->q.blocks, T = hs->n_steps;
  const float *mass = hs->mass + (size_t)l * r->q.steps * B;
  if (s->n + n > r->cfg.max_samples * 2) return 1;
  if (samples_reserve(s, n) || grow((void **)&s->grp, &s->grp_cap, s->n_grp + 2, sizeof *s->grp) ||
      grow((void **)&s->grp_layer, &s->lay_cap, s->n_grp + 1, sizeof *s->grp_layer) ||
      grow((void **)&s->grp_held, &s->held_cap, s->n_grp + 1, 1))
    return -ENOMEM;
  uint32_t t_end = t + (uint32_t)r->cfg.window < T - 1 ? t + (uint32_t)r->cfg.window : T - 1;
  size_t at = s->n;
  for (uint32_t i = 0; i < n; i++) {
    double f = 0;
    for (uint32_t u = t + 1; u <= t_end; u++) f += mass[(size_t)u * B + ids[i]];
    f /= (double)(t_end - t);
    s->fut[at + i] = (float)f;
    s->y[at + i] = logf((float)f + TRAIN_EPS);
    kvt_pred_features(&st[ids[i]], ids[i], nb, r->h.block_tokens, l, r->h.n_layers,
                      s->x + (at + i) * KVT_PRED_N_FEAT);
  }
  /* the boundary is at `keep` among the retained */
  train_cfg one = r->cfg;
  one.n_budgets = 1;
  one.budgets[0] = (double)keep / (double)n;
  group_weights(&one, s->fut + at, s->wt + at, n);
  s->grp[s->n_grp] = at;
  s->grp_layer[s->n_grp] = l;
  s->grp_held[s->n_grp++] = 0;
  s->n += n;
  s->grp[s->n_grp] = s->n;
  return 0;
}

static double replay(train_run *r, const held_seq *hs, uint32_t l, int sc, double budget,
                     const model *m, uint64_t *n_steps, int collect) {
  const trace_hdr *h = &r->h;
  uint32_t bt = h->block_tokens, L = h->n_layers, T = hs->n_steps, B = r->q.blocks;
  const float *mass = hs->mass + (size_t)l * r->q.steps * B;
  kvt_pred_bstate *st = calloc(B, sizeof *st);
  uint8_t *ret = calloc(B, 1);
  double *score = calloc(B, sizeof *score), missed = 0;
  *n_steps = 0;
  if (!st || !ret || !score) {
    free(st), free(ret), free(score);
    return NAN;
  }
  for (uint32_t b = 0; b < B; b++) st[b].key_norm = hs->knorm[(size_t)l * B + b];
  for (uint32_t t = 0; t < T; t++) {
    uint32_t pos = bt + t, nb = pos / bt;
    const float *mt = mass + (size_t)t * B;
    ret[nb - 1] |= t == 0 || pos % bt == 0; /* the block that just joined */
    double all = 0, kept = 0;
    for (uint32_t b = 0; b < nb; b++) {
      all += mt[b];
      kept += ret[b] ? mt[b] : 0;
    }
    if (pos >= REPLAY_FIRST_POS && all > 0) {
      missed += 1 - kept / all;
      (*n_steps)++;
    }
    for (uint32_t b = 0; b < nb; b++)
      if (ret[b] && kept > 0) kvt_pred_observe(&st[b], (float)(mt[b] * all / kept));
    /* what the budget leaves for blocks: budget * (pos + 1) tokens minus the tail */
    double room = budget * (double)(pos + 1) - (double)(pos % bt + 1);
    uint32_t allowed = room > 0 ? (uint32_t)floor(room / bt) : 0, n_ret = 0;
    for (uint32_t b = 0; b < nb; b++) {
      if (!ret[b]) continue;
      n_ret++;
      float f[KVT_PRED_N_FEAT];
      switch (sc) {
      case RP_LEARNED:
        kvt_pred_features(&st[b], b, nb, bt, l, L, f);
        score[b] = kvt_predictor_infer(m, l, f);
        break;
      case RP_RECENT: score[b] = b; break;
      case RP_H2O: score[b] = st[b].sum; break;
      case RP_TOVA: score[b] = st[b].last; break;
      default: { /* the full cache's mass over the next W steps */
        double fu = 0;
        for (uint32_t u = t + 1; u < T && u <= t + r->cfg.window; u++)
          fu += mass[(size_t)u * B + b];
        score[b] = fu;
      }
      }
    }
    if (collect && n_ret > allowed && t % r->cfg.stride == 0 && t + 1 < T) {
      uint32_t ids[4096], k = 0;
      for (uint32_t b = 0; b < nb && k < 4096; b++)
        if (ret[b]) ids[k++] = b;
      if (k >= 2 && add_policy_group(r, hs, l, t, ids, k, allowed ? allowed : 1, st, nb)) break;
    }
    for (; n_ret > allowed && n_ret > 1; n_ret--) { /* evict the weakest; ties: the older */
      uint32_t v = UINT32_MAX;
      for (uint32_t b = 0; b < nb; b++)
        if (ret[b] && b + 1 < nb && (v == UINT32_MAX || score[b] < score[v])) v = b;
      if (v == UINT32_MAX) break; /* only the newest is left (its delay) */
      ret[v] = 0;
    }
  }
  free(st), free(ret), free(score);
  return missed;
}

/* On-policy samples: replay the training sequences under model m at the
 * training budgets and add, at each eviction, the retained blocks with
 * the features they have there (masses renormalized over fewer blocks). */
static void collect_policy(train_run *r, const model *m) {
  for (size_t bi = 0; bi < r->cfg.n_budgets; bi++)
    for (size_t i = 0; i < r->n_held_kept; i++)
      for (uint32_t l = 0; !r->held[i].is_held && l < r->h.n_layers; l++) {
        uint64_t k;
        replay(r, &r->held[i], l, RP_LEARNED, r->cfg.budgets[bi], m, &k, 1);
      }
}

static double mean_missed(double m[RP_N][TRAIN_N_BUDGETS]) {
  return (m[RP_LEARNED][0] + m[RP_LEARNED][1] + m[RP_LEARNED][2]) / 3;
}

/* Mean missed mass share per scorer and budget over held-out sequences. */
static void replay_all(train_run *r, const model *m, double out[RP_N][TRAIN_N_BUDGETS]) {
  for (int sc = 0; sc < RP_N; sc++)
    for (size_t bi = 0; bi < TRAIN_N_BUDGETS; bi++) {
      double sum = 0;
      uint64_t n = 0;
      for (size_t i = 0; i < r->n_held_kept; i++)
        for (uint32_t l = 0; r->held[i].is_held && l < r->h.n_layers; l++) {
          uint64_t k;
          sum += replay(r, &r->held[i], l, sc, default_budgets[bi], m, &k, 0);
          n += k;
        }
      out[sc][bi] = n ? sum / (double)n : NAN;
    }
}

/* ---- writing ------------------------------------------------------------------ */

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void putf(uint8_t *p, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  put32(p, u);
}

/* The predictor file's bytes (docs/policy.md), malloc'ed into *out. */
static int predictor_bytes(const train_run *r, const model *m, uint8_t **out, size_t *len) {
  uint32_t sets = m->per_layer ? r->h.n_layers : 1, n_w = sets * m->set_floats;
  size_t n = KVT_PRED_HDR_BYTES + (size_t)n_w * 4 + 8;
  uint8_t *b = calloc(1, n);
  if (!b) return -ENOMEM;
  memcpy(b, KVT_PRED_MAGIC, 8);
  const uint32_t hdr[] = {KVT_PRED_VERSION, KVT_PRED_HDR_BYTES, KVT_PRED_N_FEAT,
                          m->kind, m->per_layer, m->hidden, r->h.n_layers, r->h.block_tokens,
                          r->h.head_dim, r->h.n_kv_heads, (uint32_t)r->cfg.window};
  for (size_t i = 0; i < sizeof hdr / sizeof hdr[0]; i++) put32(b + 8 + 4 * i, hdr[i]);
  putf(b + 52, r->cfg.n_budgets == 1 ? (float)r->cfg.budgets[0] : 0.0f);
  put32(b + 56, n_w);
  for (uint32_t i = 0; i < n_w; i++) putf(b + KVT_PRED_HDR_BYTES + 4 * i, m->w[i]);
  uint64_t ck = kvt_predictor_checksum(b, n - 8);
  put32(b + n - 8, (uint32_t)ck);
  put32(b + n - 4, (uint32_t)(ck >> 32));
  *out = b;
  *len = n;
  return 0;
}

static int write_file(const char *path, const uint8_t *b, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -errno;
  int rc = fwrite(b, 1, n, f) == n ? 0 : -EIO;
  if (fclose(f) && !rc) rc = -errno;
  return rc;
}

static uint64_t cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Nanoseconds per block of features + inference through the engine's
 * code, in this thread's CPU time (the machine may be shared). */
static double infer_ns(const kvt_predictor *p, const samples *s, uint32_t L) {
  kvt_pred_bstate st = {.ema = {0.1f, 0.2f, 0.3f}, .max = 1, .sum = 3, .last = 0.2f,
                        .key_norm = 2, .count = 9};
  float f[KVT_PRED_N_FEAT];
  volatile float sink = 0;
  uint64_t n = 2000000, t0 = cpu_ns();
  for (uint64_t i = 0; i < n; i++) {
    st.last = (float)(i & 15) * 0.01f;
    kvt_pred_features(&st, (uint32_t)(i & 31), 32, 16, (uint32_t)(i % L), L, f);
    sink += kvt_predictor_infer(p, (uint32_t)(i % L), f);
  }
  (void)sink;
  (void)s;
  return (double)(cpu_ns() - t0) / (double)n;
}

/* ---- main -------------------------------------------------------------------- */

static int train_main(train_run *r) {
  train_cfg *c = &r->cfg;
  for (size_t i = 0; i < c->n_traces; i++) {
    progress("train: reading %s", c->traces[i]);
    int rc = read_trace(r, c->traces[i], i == 0);
    if (rc != CLI_OK) {
      progress_end();
      return rc;
    }
  }
  progress_end();
  samples *s = &r->s;
  if (r->n_seqs < 2 || !r->n_held || s->n_grp == 0) {
    fprintf(stderr, "kvtier train: too little data: %zu sequences (at least %d, so that one "
                    "is held out), %zu samples\n", r->n_seqs, TRAIN_HELD_EVERY, s->n);
    return CLI_FAIL;
  }
  uint32_t L = r->h.n_layers;
  /* Candidates: linear and MLP, per layer and shared; --model and
   * --layers restrict them, and the best held-out capture wins. */
  model cand[4] = {0};
  double cap[4] = {-1, -1, -1, -1};
  int best = -1;
  for (int k = 0; k < 4; k++) {
    uint32_t kind = k / 2 ? KVT_PRED_MLP : KVT_PRED_LINEAR, per = k % 2 == 0;
    if ((strcmp(c->model_s, "auto") && strcmp(c->model_s, kind ? "mlp" : "linear")) ||
        (strcmp(c->layers_s, "auto") && strcmp(c->layers_s, per ? "per-layer" : "shared")))
      continue;
    progress("train: fitting %s %s", kind ? "mlp" : "linear", per ? "per-layer" : "shared");
    if (fit_model(s, &r->h, kind, (uint32_t)c->hidden, per, 0, &cand[k])) {
      progress_end();
      for (int i = 0; i < 4; i++) free(cand[i].w);
      fprintf(stderr, "kvtier train: the fit failed (too few distinct samples, or memory)\n");
      return CLI_FAIL;
    }
    cap[k] = mean_capture(s, &cand[k], c);
    if (best < 0 || cap[k] > cap[best]) best = k;
  }
  progress_end();
  const model *bm = &cand[best];
  double caps[SC_N][TRAIN_N_BUDGETS], mse = held_mse(s, bm);
  for (int sc = 0; sc < SC_N; sc++)
    for (size_t b = 0; b < TRAIN_N_BUDGETS; b++)
      caps[sc][b] = capture(s, bm, sc, default_budgets[b]);
  double missed[RP_N][TRAIN_N_BUDGETS], missed0 = NAN;
  progress("train: replaying held-out sequences");
  replay_all(r, bm, missed);
  progress_end();
  /* One round of on-policy samples (the blocks the policy still holds
   * when it evicts, with the features they have there), kept if the
   * held-out replay loses less mass. */
  int rounds = 0;
  for (int round = 0; round < (int)c->rounds; round++) {
    size_t n0 = s->n, g0 = s->n_grp;
    progress("train: on-policy round %d", round + 1);
    collect_policy(r, bm);
    /* the round's samples weigh as much as all before them: they are the
     * decisions the scorer actually makes */
    double w_old = 0, w_new = 0;
    for (size_t i = 0; i < s->n; i++) *(i < n0 ? &w_old : &w_new) += s->wt[i];
    float scale = w_new > 0 ? (float)fmin(50.0, w_old / w_new) : 1.0f;
    for (size_t i = n0; i < s->n; i++) s->wt[i] *= scale;
    model next;
    double m2[RP_N][TRAIN_N_BUDGETS];
    int frc2 = fit_model(s, &r->h, bm->kind, bm->hidden, bm->per_layer, 0, &next);
    if (!frc2) replay_all(r, &next, m2);
    progress_end();
    if (frc2 || !(mean_missed(m2) < mean_missed(missed))) {
      free(next.w);
      s->n = n0; /* drop the round's samples */
      s->n_grp = g0;
      break;
    }
    if (round == 0) missed0 = mean_missed(missed);
    free(cand[best].w);
    cand[best] = next;
    bm = &cand[best];
    memcpy(missed, m2, sizeof m2);
    rounds++;
  }
  if (rounds) {
    mse = held_mse(s, bm);
    for (int sc = 0; sc < SC_N; sc++)
      for (size_t b = 0; b < TRAIN_N_BUDGETS; b++)
        caps[sc][b] = capture(s, bm, sc, default_budgets[b]);
  }
  /* The file gets the chosen form refit on every sequence. */
  model final;
  progress("train: refitting on every sequence");
  int frc = fit_model(s, &r->h, bm->kind, bm->hidden, bm->per_layer, 1, &final);
  progress_end();
  uint32_t per_layer = bm->per_layer, kind = bm->kind;
  for (int i = 0; i < 4; i++) free(cand[i].w);
  if (frc) {
    free(final.w);
    fprintf(stderr, "kvtier train: the fit failed\n");
    return CLI_FAIL;
  }
  uint8_t *bytes;
  size_t len;
  int rc = predictor_bytes(r, &final, &bytes, &len);
  free(final.w);
  if (rc) return cli_lib_error("train", "allocating", rc);
  kvt_pred_shape want = {L, r->h.block_tokens, r->h.head_dim, r->h.n_kv_heads};
  kvt_predictor *p = NULL;
  char why[256] = "";
  kvt_mem mem;
  kvt_mem_init(&mem, 0);
  if ((rc = kvt_predictor_parse(&mem, bytes, len, &want, &p, why, sizeof why))) {
    kvt_mem_fini(&mem);
    free(bytes);
    fprintf(stderr, "kvtier train: the predictor does not read back: %s\n", why);
    return CLI_FAIL;
  }
  double ns = infer_ns(p, s, L);
  kvt_predictor_free(p);
  kvt_mem_fini(&mem);
  rc = write_file(c->out, bytes, len);
  free(bytes);
  if (rc) {
    fprintf(stderr, "kvtier train: %s: %s\n", c->out, strerror(-rc));
    return CLI_FAIL;
  }
  if (c->json) {
    json_w j;
    json_begin(&j, stdout);
    json_str(&j, "predictor", c->out);
    json_u64(&j, "sequences", r->n_seqs);
    json_u64(&j, "held_out_sequences", r->n_held);
    json_u64(&j, "samples", s->n);
    json_u64(&j, "stride", c->stride);
    json_u64(&j, "window", c->window);
    json_str(&j, "model", kind ? "mlp" : "linear");
    json_str(&j, "layers", per_layer ? "per-layer" : "shared");
    json_obj(&j, "held_capture_mean");
    for (int k = 0; k < 4; k++) {
      char key[32];
      snprintf(key, sizeof key, "%s_%s", k / 2 ? "mlp" : "linear", k % 2 ? "shared" : "per_layer");
      json_f64(&j, key, cap[k] >= 0 ? cap[k] : NAN);
    }
    json_end(&j);
    json_f64(&j, "held_weighted_mse", mse);
    json_f64(&j, "infer_ns_per_block", ns);
    json_obj(&j, "held_capture");
    for (int sc = 0; sc < SC_N; sc++) {
      json_obj(&j, sc_names[sc]);
      for (size_t b = 0; b < TRAIN_N_BUDGETS; b++) {
        char key[16];
        snprintf(key, sizeof key, "%g", default_budgets[b]);
        json_f64(&j, key, caps[sc][b]);
      }
      json_end(&j);
    }
    json_end(&j);
    json_u64(&j, "on_policy_rounds", (uint64_t)rounds);
    json_f64(&j, "held_missed_before_rounds", missed0);
    json_obj(&j, "held_missed_mass");
    for (int sc = 0; sc < RP_N; sc++) {
      json_obj(&j, rp_names[sc]);
      for (size_t b = 0; b < TRAIN_N_BUDGETS; b++) {
        char key[16];
        snprintf(key, sizeof key, "%g", default_budgets[b]);
        json_f64(&j, key, missed[sc][b]);
      }
      json_end(&j);
    }
    json_end(&j);
    json_end(&j);
    return CLI_OK;
  }
  printf("trained on %zu sequences (%zu held out), %zu block samples (every %" PRIu64
         " step), W %" PRIu64 "\n", r->n_seqs, r->n_held, s->n, c->stride, c->window);
  printf("held-out capture (mean over budgets 0.1, 0.25, 0.5):\n");
  for (int k = 0; k < 4; k++)
    if (cap[k] >= 0)
      printf("  %-6s %-9s %.4f%s\n", k / 2 ? "mlp" : "linear", k % 2 ? "shared" : "per-layer",
             cap[k], k == best ? "  <- written" : "");
  printf("held-out share of the next %" PRIu64 " steps' mass the top blocks capture, of the "
         "best possible:\n  scorer      0.1     0.25    0.5\n", c->window);
  for (int sc = 0; sc < SC_N; sc++)
    printf("  %-8s  %.4f  %.4f  %.4f\n", sc_names[sc], caps[sc][0], caps[sc][1], caps[sc][2]);
  if (rounds)
    printf("on-policy rounds kept: %d (held-out missed mass, mean over budgets: %.4f -> %.4f)\n",
           rounds, missed0, mean_missed(missed));
  printf("held-out replay, permanent eviction under the byte budget (tail counted): share\n"
         "of the full cache's attention mass on evicted blocks, mean over steps >= %u:\n"
         "  scorer      0.1     0.25    0.5\n", REPLAY_FIRST_POS);
  for (int sc = 0; sc < RP_N; sc++)
    printf("  %-8s  %.4f  %.4f  %.4f\n", rp_names[sc], missed[sc][0], missed[sc][1],
           missed[sc][2]);
  printf("held-out weighted MSE of log mass %.4f; inference %.1f ns per block\n", mse, ns);
  printf("wrote %s\n", c->out);
  return CLI_OK;
}

int cmd_train(int argc, char **argv) {
  train_run *r = calloc(1, sizeof *r);
  if (!r) return cli_lib_error("train", "allocating", -ENOMEM);
  cli_opt o[TRAIN_N_OPTS];
  train_opts(&r->cfg, o);
  r->cfg.rounds = UINT64_MAX;
  int want_help = 0, n = argc - 1;
  int rc = take_files(&r->cfg, &n, argv + 1);
  if (rc == CLI_OK) rc = cli_parse("train", n, argv + 1, o, TRAIN_N_OPTS, &want_help);
  if (want_help) train_usage(stdout);
  if (rc == CLI_OK && !want_help) rc = train_check(&r->cfg);
  if (rc == CLI_OK && !want_help) rc = train_main(r);
  samples_free(&r->s);
  for (size_t i = 0; i < r->n_held_kept; i++) {
    free(r->held[i].mass);
    free(r->held[i].knorm);
  }
  free(r->q.mass);
  free(r->q.knorm);
  free(r);
  return rc;
}
