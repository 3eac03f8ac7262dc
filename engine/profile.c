/* profile.c - parsing and checking policy profiles (profile.h) with
 * jansson. Every refusal says what was wrong and where, since a profile is
 * written by a tool but often edited by hand. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"
#include "engine/profile.h"

#define CALL "kvt_ns_load_profile"

static int get_u32(kvt_engine *e, json_t *obj, const char *key, uint32_t *out) {
  json_t *v = json_object_get(obj, key);
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
    return KVT_ERR(e, KVT_ECORRUPT, CALL, key, "an integer", "%s",
                   v ? "another type or out of range" : "missing");
  *out = (uint32_t)json_integer_value(v);
  return 0;
}

static int check_head(kvt_engine *e, json_t *root, const kvt_shape *shape, uint32_t *version) {
  json_t *fmt = json_object_get(root, "format"), *shp = json_object_get(root, "shape");
  if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "kvtier-profile"))
    return KVT_ERR(e, KVT_ECORRUPT, CALL, "format", "\"kvtier-profile\"", "%s",
                   json_is_string(fmt) ? json_string_value(fmt) : "missing");
  int rc = get_u32(e, root, "version", version);
  if (rc) return rc;
  if (*version != 1 && *version != KVT_PROFILE_VERSION)
    return KVT_ERR(e, KVT_EVERSION, CALL, "version", "1 or 2", "%u", *version);
  if (!json_is_object(shp)) return KVT_ERR(e, KVT_ECORRUPT, CALL, "shape", "an object", "missing");
  static const char *const keys[4] = {"n_layers", "n_kv_heads", "head_dim", "block_tokens"};
  const uint32_t want[4] = {shape->n_layers, shape->n_kv_heads, shape->head_dim,
                            shape->block_tokens};
  for (int i = 0; i < 4; i++) {
    uint32_t v = 0;
    if ((rc = get_u32(e, shp, keys[i], &v))) return rc;
    if (v != want[i])
      return KVT_ERR(e, KVT_ESHAPE, CALL, keys[i], "the namespace's", "%u (namespace: %u)", v,
                     want[i]);
  }
  return 0;
}

/* One entry of "profiles": a budget and a scorer and share per layer. */
/* Version 2: a layer's optional "warm", the part of its share warm
 * blocks may take. */
static int parse_warm(kvt_engine *e, json_t *lj, uint32_t l, kvt_profile_layer *out) {
  json_t *w = json_object_get(lj, "warm");
  out->warm = 0;
  if (!w) return 0;
  if (!json_is_number(w))
    return KVT_ERR(e, KVT_ECORRUPT, CALL, "layers[i].warm", "a number", "not so at layer %u", l);
  out->warm = json_number_value(w);
  if (!(out->warm >= 0 && out->warm < 1))
    return KVT_ERR(e, KVT_EOPTION, CALL, "layers[i].warm", "in [0, 1)", "%g at layer %u",
                   out->warm, l);
  if (out->warm > 0 && out->scorer == KVT_SCORER_FULL)
    return KVT_ERR(e, KVT_EOPTION, CALL, "layers[i].warm", "0 with scorer full", "%g at layer %u",
                   out->warm, l);
  return 0;
}

static int parse_entry(kvt_engine *e, json_t *ent, uint32_t n_layers, uint32_t version,
                       double *budget, kvt_profile_layer *out) {
  json_t *b = json_object_get(ent, "budget"), *layers = json_object_get(ent, "layers");
  if (!json_is_number(b)) return KVT_ERR(e, KVT_ECORRUPT, CALL, "budget", "a number", "missing");
  *budget = json_number_value(b);
  if (!(*budget > 0 && *budget <= 1))
    return KVT_ERR(e, KVT_EOPTION, CALL, "budget", "in (0, 1]", "%g", *budget);
  if (!json_is_array(layers) || json_array_size(layers) != n_layers)
    return KVT_ERR(e, KVT_ECORRUPT, CALL, "layers", "an array of one entry per layer", "%zu entries",
                   json_is_array(layers) ? json_array_size(layers) : 0);
  double sum = 0;
  for (uint32_t l = 0; l < n_layers; l++) {
    json_t *lj = json_array_get(layers, l), *sc = json_object_get(lj, "scorer"),
           *sh = json_object_get(lj, "share");
    if (!json_is_string(sc) || !json_is_number(sh))
      return KVT_ERR(e, KVT_ECORRUPT, CALL, "layers[i]", "{\"scorer\": name, \"share\": number}",
                     "not so at layer %u", l);
    if (kvt_policy_parse(json_string_value(sc), &out[l].scorer))
      return KVT_ERR(e, KVT_EOPTION, CALL, "layers[i].scorer", "a scorer kvt_policy_parse knows",
                     "\"%.64s\" at layer %u", json_string_value(sc), l);
    out[l].share = json_number_value(sh);
    if (out[l].scorer == KVT_SCORER_AUTO) /* it would leave the layer with no scorer */
      return KVT_ERR(e, KVT_EOPTION, CALL, "layers[i].scorer", "a scorer of its own, not auto",
                     "\"%.64s\" at layer %u", json_string_value(sc), l);
    if (!(out[l].share > 0 && out[l].share <= 1))
      return KVT_ERR(e, KVT_EOPTION, CALL, "layers[i].share", "in (0, 1]", "%g at layer %u",
                     out[l].share, l);
    if (out[l].scorer == KVT_SCORER_FULL && out[l].share != 1)
      return KVT_ERR(e, KVT_EOPTION, CALL, "layers[i].share", "1 with scorer full", "%g at layer %u",
                     out[l].share, l);
    sum += out[l].share;
    int rc = version >= 2 ? parse_warm(e, lj, l, &out[l]) : 0;
    if (rc) return rc;
  }
  if (fabs(sum / n_layers - *budget) > KVT_PROFILE_SHARE_TOL)
    return KVT_ERR(e, KVT_EOPTION, CALL, "layers[i].share", "a mean equal to the budget",
                   "mean %.6f, budget %g", sum / n_layers, *budget);
  return 0;
}

static int parse_root(kvt_engine *e, json_t *root, const kvt_shape *shape, kvt_profile *p) {
  int rc = check_head(e, root, shape, &p->version);
  if (rc) return rc;
  json_t *arr = json_object_get(root, "profiles");
  size_t n = json_is_array(arr) ? json_array_size(arr) : 0;
  if (n == 0 || n > KVT_PROFILE_MAX_BUDGETS)
    return KVT_ERR(e, KVT_ECORRUPT, CALL, "profiles", "an array of 1 to 16 budgets", "%zu entries", n);
  if (shape->n_layers > KVT_MAX_LAYERS)
    return KVT_ERR(e, KVT_ESHAPE, CALL, "n_layers", "at most KVT_MAX_LAYERS", "%u", shape->n_layers);
  p->n_layers = shape->n_layers;
  p->layers_bytes = n * shape->n_layers * sizeof *p->layers;
  if (!(p->layers = kvt_mem_calloc(p->mem, KVT_MEM_OTHER, p->layers_bytes))) return -ENOMEM;
  for (size_t i = 0; i < n; i++) {
    rc = parse_entry(e, json_array_get(arr, i), shape->n_layers, p->version, &p->budget[i],
                     p->layers + i * shape->n_layers);
    if (rc) return rc;
    for (size_t j = 0; j < i; j++)
      if (p->budget[j] == p->budget[i])
        return KVT_ERR(e, KVT_EOPTION, CALL, "profiles[i].budget", "each budget once", "%g twice",
                       p->budget[i]);
    p->n_budgets = (uint32_t)i + 1;
  }
  return 0;
}

int kvt_profile_parse(kvt_engine *e, const kvt_shape *shape, const char *text, size_t len,
                      kvt_profile **out) {
  if (!e || !shape || !text || !out) return KVT_ENULL;
  *out = NULL;
  if (len > KVT_PROFILE_MAX_BYTES)
    return KVT_ERR(e, KVT_ECORRUPT, CALL, "len", "at most 16 MiB", "%zu bytes", len);
  json_error_t jerr;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!json_is_object(root)) {
    json_decref(root);
    return KVT_ERR(e, KVT_ECORRUPT, CALL, "text", "a JSON object (a whole profile)",
                   "%s at line %d column %d", root ? "not an object" : jerr.text, jerr.line,
                   jerr.column);
  }
  kvt_profile *p = kvt_mem_calloc(&e->mem, KVT_MEM_OTHER, sizeof *p);
  if (p) p->mem = &e->mem;
  int rc = p ? parse_root(e, root, shape, p) : -ENOMEM;
  json_decref(root);
  if (rc) {
    kvt_profile_free(p);
    return rc;
  }
  *out = p;
  return 0;
}

void kvt_profile_free(kvt_profile *p) {
  if (!p) return;
  kvt_mem_free(p->mem, KVT_MEM_OTHER, p->layers, p->layers_bytes);
  kvt_mem_free(p->mem, KVT_MEM_OTHER, p, sizeof *p);
}

int kvt_profile_pick(const kvt_profile *p, double budget) {
  if (!p) return -1;
  if (budget == 0) return p->n_budgets == 1 ? 0 : -1;
  for (uint32_t i = 0; i < p->n_budgets; i++)
    if (fabs(p->budget[i] - budget) < 1e-9) return (int)i;
  return -1;
}

/* Scale src's shares (mean src_budget) to mean budget: layers at "full"
 * stay at 1 when the rest can pay for them; a layer that would pass 1 is
 * held there and the others scaled again. */
static void scale_entry(const kvt_profile_layer *src, uint32_t L, double budget, uint32_t *scorer,
                        double *share) {
  uint32_t n_full = 0;
  double rest = 0;
  for (uint32_t l = 0; l < L; l++) {
    scorer[l] = src[l].scorer;
    if (src[l].scorer == KVT_SCORER_FULL) n_full++;
    else rest += src[l].share;
  }
  int keep_full = n_full < L && budget * L - n_full > 1e-9 && rest > 0;
  uint8_t fixed[KVT_MAX_LAYERS] = {0};
  for (uint32_t l = 0; l < L; l++) {
    share[l] = src[l].share;
    if (src[l].scorer == KVT_SCORER_FULL && keep_full) fixed[l] = 1;
    else if (src[l].scorer == KVT_SCORER_FULL) scorer[l] = KVT_SCORER_RECENT;
  }
  for (uint32_t round = 0; round <= L; round++) {
    double fix = 0, free_sum = 0;
    for (uint32_t l = 0; l < L; l++) {
      if (fixed[l]) fix += 1;
      else free_sum += share[l];
    }
    if (free_sum <= 0) break;
    double k = (budget * L - fix) / free_sum;
    int again = 0;
    for (uint32_t l = 0; l < L; l++) {
      if (fixed[l]) continue;
      share[l] *= k;
      if (share[l] >= 1) share[l] = 1, fixed[l] = 1, again = 1;
    }
    if (!again) break;
  }
  for (uint32_t l = 0; l < L; l++)
    if (fixed[l]) share[l] = 1;
}

void kvt_profile_shares(const kvt_profile *p, double budget, uint32_t *scorer, double *share) {
  uint32_t L = p->n_layers;
  int lo = -1, hi = -1; /* the entries just below and just above budget */
  for (uint32_t i = 0; i < p->n_budgets; i++) {
    if (fabs(p->budget[i] - budget) < 1e-9) lo = hi = (int)i;
    if (lo == hi && lo >= 0) break;
    if (p->budget[i] < budget && (lo < 0 || p->budget[i] > p->budget[lo])) lo = (int)i;
    if (p->budget[i] > budget && (hi < 0 || p->budget[i] < p->budget[hi])) hi = (int)i;
  }
  if (lo >= 0 && lo == hi) {
    for (uint32_t l = 0; l < L; l++) {
      scorer[l] = p->layers[(size_t)lo * L + l].scorer;
      share[l] = p->layers[(size_t)lo * L + l].share;
    }
    return;
  }
  if (lo < 0 || hi < 0) { /* outside the profile's budgets: scale the nearest */
    int near = lo < 0 ? hi : lo;
    scale_entry(p->layers + (size_t)near * L, L, budget, scorer, share);
    return;
  }
  double t = (budget - p->budget[lo]) / (p->budget[hi] - p->budget[lo]);
  const kvt_profile_layer *a = p->layers + (size_t)lo * L, *b = p->layers + (size_t)hi * L;
  for (uint32_t l = 0; l < L; l++) {
    share[l] = (1 - t) * a[l].share + t * b[l].share;
    scorer[l] = t < 0.5 ? a[l].scorer : b[l].scorer;
    if (scorer[l] == KVT_SCORER_FULL && share[l] < 1) scorer[l] = t < 0.5 ? b[l].scorer : a[l].scorer;
    if (scorer[l] == KVT_SCORER_FULL && share[l] < 1) scorer[l] = KVT_SCORER_RECENT;
  }
}

void kvt_profile_warm(const kvt_profile *p, double budget, double *warm) {
  uint32_t L = p->n_layers;
  int lo = -1, hi = -1; /* as kvt_profile_shares chooses entries */
  for (uint32_t i = 0; i < p->n_budgets; i++) {
    if (p->budget[i] <= budget && (lo < 0 || p->budget[i] > p->budget[lo])) lo = (int)i;
    if (p->budget[i] >= budget && (hi < 0 || p->budget[i] < p->budget[hi])) hi = (int)i;
  }
  if (lo < 0) lo = hi;
  if (hi < 0) hi = lo;
  double t = p->budget[hi] > p->budget[lo]
                 ? (budget - p->budget[lo]) / (p->budget[hi] - p->budget[lo]) : 0;
  for (uint32_t l = 0; l < L; l++)
    warm[l] = (1 - t) * p->layers[(size_t)lo * L + l].warm + t * p->layers[(size_t)hi * L + l].warm;
}

/* ---- the engine's side (policy.h): reading a file, layers for a budget ---- */

int kvt_profile_read(kvt_engine *e, const char *path, const kvt_shape *sh, kvt_profile **out) {
  if (!e || !path || !sh || !out) return KVT_ENULL;
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    int err = -errno;
    return KVT_ERR(e, err, "kvt_ns_load_profile", "path", "a readable profile file", "%s: %s",
                   path, strerror(-err));
  }
  char *buf = kvt_mem_alloc(&e->mem, KVT_MEM_OTHER, (size_t)KVT_PROFILE_MAX_BYTES + 1);
  size_t n = buf ? fread(buf, 1, (size_t)KVT_PROFILE_MAX_BYTES + 1, f) : 0;
  int rd_err = ferror(f);
  fclose(f);
  if (!buf) return -ENOMEM;
  int rc = rd_err ? KVT_ERR(e, -EIO, "kvt_ns_load_profile", "path", "a readable profile file",
                            "%s: read error", path)
                  : kvt_profile_parse(e, sh, buf, n, out);
  kvt_mem_free(&e->mem, KVT_MEM_OTHER, buf, (size_t)KVT_PROFILE_MAX_BYTES + 1);
  return rc;
}

int kvt_profile_layers(const kvt_profile *p, double budget, kvt_lpol *out, uint32_t n_layers) {
  uint32_t scorer[KVT_MAX_LAYERS];
  double share[KVT_MAX_LAYERS], warm[KVT_MAX_LAYERS];
  uint32_t L = n_layers < p->n_layers ? n_layers : p->n_layers;
  kvt_profile_shares(p, budget, scorer, share);
  kvt_profile_warm(p, budget, warm);
  for (uint32_t l = 0; l < L; l++)
    out[l] = (kvt_lpol){.scorer = scorer[l], .share = share[l],
                        .warm = share[l] < 1 && scorer[l] != KVT_SCORER_FULL ? share[l] * warm[l] : 0};
  return p->version >= 2;
}
