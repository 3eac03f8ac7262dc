/* plan_model.c - model shapes for `kvtier plan`: a built-in table of
 * common models and Hugging Face config.json files read with jansson.
 * Only what decides KV size is read: layers, KV heads, head dim, dtype;
 * and enough of the sizes to estimate the weights (for prefill speed). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "plan.h"

#define PLAN_CONFIG_MAX (16u << 20) /* bytes of a config.json, at most */

/* From each model's config.json on the Hugging Face hub. */
static const plan_model builtin[] = {
    {"llama-3.1-8b", 32, 8, 128, KVT_BF16, 8.03e9},
    {"llama-3.1-70b", 80, 8, 128, KVT_BF16, 70.6e9},
    {"qwen2.5-7b", 28, 4, 128, KVT_BF16, 7.62e9},
    {"qwen2.5-72b", 80, 8, 128, KVT_BF16, 72.7e9},
    {"qwen3-8b", 36, 8, 128, KVT_BF16, 8.19e9},
    {"mistral-7b", 32, 8, 128, KVT_BF16, 7.25e9},
    {"smollm2-1.7b", 24, 32, 64, KVT_BF16, 1.71e9},
};
#define N_BUILTIN (sizeof builtin / sizeof builtin[0])

void plan_model_list(FILE *f)
{
  for (size_t i = 0; i < N_BUILTIN; i++) {
    const plan_model *m = &builtin[i];
    fprintf(f, "  %-14s %3u layers, %2u KV heads, head_dim %3u, %.1fB weights\n", m->name,
            m->n_layers, m->n_kv_heads, m->head_dim, m->params / 1e9);
  }
}

int plan_model_builtin(const char *name, plan_model *m)
{
  for (size_t i = 0; i < N_BUILTIN; i++) {
    if (strcasecmp(name, builtin[i].name) == 0) {
      *m = builtin[i];
      return 0;
    }
  }
  fprintf(stderr, "kvtier plan: unknown model '%s'; built-in models:\n", name);
  plan_model_list(stderr);
  fprintf(stderr, "or give a Hugging Face config.json with --config FILE\n");
  return -1;
}

/* The line of the first "key": in text, or 0. jansson keeps no positions
 * of values, and a message that names the line saves a search. */
static int key_line(const char *text, const char *key)
{
  size_t kl = strlen(key);
  int line = 1;
  for (const char *p = text; *p; p++) {
    if (*p == '\n') line++;
    if (*p != '"' || strncmp(p + 1, key, kl) || p[1 + kl] != '"') continue;
    const char *q = p + 2 + kl;
    while (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n') q++;
    if (*q == ':') return line;
  }
  return 0;
}

static void field_fail(const char *path, const char *text, const char *key, const char *why)
{
  int line = key_line(text, key);
  if (line) fprintf(stderr, "kvtier plan: %s: line %d: %s: %s\n", path, line, key, why);
  else fprintf(stderr, "kvtier plan: %s: %s: %s\n", path, key, why);
}

/* A positive integer member, or 0 when absent or null; -1 (after saying
 * so) when present and anything else: a wrong size is refused, not
 * replaced by a default. */
static int64_t member_u64(json_t *o, const char *key, const char *path, const char *text)
{
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (json_is_integer(v) && json_integer_value(v) > 0) return (int64_t)json_integer_value(v);
  char *vs = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT), why[120];
  snprintf(why, sizeof why, "%.60s is not a positive integer", vs ? vs : "the value");
  free(vs);
  field_fail(path, text, key, why);
  return -1;
}

static int config_fail(const char *path, const char *why)
{
  fprintf(stderr, "kvtier plan: %s: %s\n", path, why);
  return -1;
}

/* dtype names as config.json writes them (torch's), or -1 after saying so. */
static int config_dtype(json_t *dt, const char *key, const char *path, const char *text)
{
  if (!dt || json_is_null(dt)) return KVT_BF16; /* the common default */
  const char *s = json_is_string(dt) ? json_string_value(dt) : "";
  if (strcmp(s, "float32") == 0) return KVT_F32;
  if (strcmp(s, "float16") == 0) return KVT_F16;
  if (strcmp(s, "bfloat16") == 0) return KVT_BF16;
  char *vs = json_dumps(dt, JSON_ENCODE_ANY | JSON_COMPACT), why[120];
  snprintf(why, sizeof why, "%.60s is not one of float32, float16, bfloat16", vs ? vs : "the value");
  free(vs);
  field_fail(path, text, key, why);
  return -1;
}

/* Weights from the sizes: per layer attention (q, o: h*h each; k, v:
 * h*kv*d each) and a gated MLP (3*h*inter), plus the embeddings (tied or
 * not: counted twice, a few percent at most). */
static double estimate_params(uint64_t L, uint64_t h, uint64_t kvd, uint64_t inter, uint64_t vocab)
{
  double per_layer = 2.0 * (double)h * (double)h + 2.0 * (double)h * (double)kvd +
                     3.0 * (double)h * (double)inter;
  return (double)L * per_layer + 2.0 * (double)vocab * (double)h;
}

/* Line of byte offset at in text (1-based). */
static int line_at(const char *text, size_t at)
{
  int line = 1;
  for (size_t i = 0; i < at; i++) line += text[i] == '\n';
  return line;
}

/* The whole file, NUL-ended, or NULL after saying why. */
static char *config_read(const char *path, FILE *f, size_t size, size_t *len)
{
  if (size > PLAN_CONFIG_MAX) {
    fprintf(stderr, "kvtier plan: %s: %zu bytes, more than a config.json takes (16 MiB)\n", path,
            size);
    return NULL;
  }
  char *text = malloc(size + 1);
  if (!text) {
    config_fail(path, "out of memory");
    return NULL;
  }
  *len = fread(text, 1, size, f);
  text[*len] = 0;
  const char *nul = memchr(text, 0, *len); /* jansson would stop there, unseen */
  if (nul) {
    fprintf(stderr, "kvtier plan: %s: line %d: a NUL byte\n", path,
            line_at(text, (size_t)(nul - text)));
    free(text);
    return NULL;
  }
  return text;
}

/* The sizes config.json gives; -1 after saying which is wrong. */
static int config_sizes(json_t *c, const char *path, const char *text, int64_t v[7])
{
  static const char *const keys[7] = {"num_hidden_layers", "num_attention_heads",
                                      "num_key_value_heads", "head_dim", "hidden_size",
                                      "intermediate_size", "vocab_size"};
  for (int i = 0; i < 7; i++)
    if ((v[i] = member_u64(c, keys[i], path, text)) < 0) return -1;
  return 0;
}

int plan_model_config(const char *path, plan_model *m)
{
  json_error_t err;
  FILE *f = fopen(path, "r");
  struct stat sb;
  if (!f || fstat(fileno(f), &sb) || S_ISDIR(sb.st_mode)) {
    int e = !f ? errno : S_ISDIR(sb.st_mode) ? EISDIR : errno;
    if (f) fclose(f);
    fprintf(stderr, "kvtier plan: %s: cannot open: %s\n", path, strerror(e));
    return -1;
  }
  size_t len = 0;
  char *src = config_read(path, f, (size_t)sb.st_size, &len);
  fclose(f);
  if (!src) return -1;
  json_t *root = json_loadb(src, len, 0, &err);
  if (!root) {
    if (err.line > 0) fprintf(stderr, "kvtier plan: %s: line %d: %s\n", path, err.line, err.text);
    else fprintf(stderr, "kvtier plan: %s: %s\n", path, err.text);
    free(src);
    return -1;
  }
  int rc = 0;
  json_t *text = json_object_get(root, "text_config"); /* multimodal configs nest it */
  json_t *c = json_is_object(text) ? text : root;
  int64_t v[7] = {0};
  if (!json_is_object(root)) rc = config_fail(path, "not a JSON object");
  else rc = config_sizes(c, path, src, v);
  uint64_t L = (uint64_t)v[0], q = (uint64_t)v[1], kv = (uint64_t)v[2], d = (uint64_t)v[3];
  uint64_t h = (uint64_t)v[4];
  if (!rc && !L) rc = config_fail(path, "no positive integer num_hidden_layers");
  else if (!rc && !q && !kv) rc = config_fail(path, "no num_key_value_heads or num_attention_heads");
  if (!rc) {
    if (!kv) kv = q;
    if (!d && h && q && h % q == 0) d = h / q;
    if (!d) rc = config_fail(path, "no head_dim, and hidden_size / num_attention_heads is not whole");
  }
  if (!rc && (L > KVT_MAX_LAYERS || kv > KVT_MAX_HEADS || d > KVT_MAX_HEAD_DIM))
    rc = config_fail(path, "layers, KV heads or head_dim beyond kvtier's limits (1024 each)");
  /* "dtype" in newer configs, "torch_dtype" in older ones */
  json_t *dt = NULL;
  const char *keys[2] = {"dtype", "torch_dtype"}, *dt_key = keys[0];
  for (int k = 0; !rc && k < 2 && (!dt || json_is_null(dt)); k++) {
    dt_key = keys[k];
    dt = json_object_get(c, keys[k]);
    if (!dt || json_is_null(dt)) dt = json_object_get(root, keys[k]);
  }
  int dtype = rc ? -1 : config_dtype(dt, dt_key, path, src);
  if (!rc && dtype < 0) rc = -1;
  if (!rc) {
    const char *base = strrchr(path, '/');
    snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
    json_t *mt = json_object_get(c, "_name_or_path");
    if (json_is_string(mt) && json_string_length(mt) > 0)
      snprintf(m->name, sizeof m->name, "%s", json_string_value(mt));
    m->n_layers = (uint32_t)L;
    m->n_kv_heads = (uint32_t)kv;
    m->head_dim = (uint32_t)d;
    m->dtype = (uint32_t)dtype;
    m->params = estimate_params(L, h ? h : q * d, kv * d, (uint64_t)v[5], (uint64_t)v[6]);
  }
  json_decref(root);
  free(src);
  return rc;
}
