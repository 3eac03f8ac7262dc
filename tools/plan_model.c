/* plan_model.c - model shapes for `kvtier plan`: a built-in table of
 * common models and Hugging Face config.json files read with jansson.
 * Only what decides KV size is read: layers, KV heads, head dim, dtype;
 * and enough of the sizes to estimate the weights (for prefill speed). */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "plan.h"

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

/* A positive integer member, or 0 when absent or not one. */
static uint64_t member_u64(json_t *o, const char *key)
{
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v) || json_integer_value(v) <= 0) return 0;
  return (uint64_t)json_integer_value(v);
}

static int config_fail(const char *path, const char *why)
{
  fprintf(stderr, "kvtier plan: %s: %s\n", path, why);
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

int plan_model_config(const char *path, plan_model *m)
{
  json_error_t err;
  json_t *root = json_load_file(path, 0, &err);
  if (!root) {
    fprintf(stderr, "kvtier plan: %s: line %d: %s\n", path, err.line, err.text);
    return -1;
  }
  int rc = 0;
  json_t *text = json_object_get(root, "text_config"); /* multimodal configs nest it */
  json_t *c = json_is_object(text) ? text : root;
  uint64_t L = member_u64(c, "num_hidden_layers"), q = member_u64(c, "num_attention_heads");
  uint64_t kv = member_u64(c, "num_key_value_heads"), d = member_u64(c, "head_dim");
  uint64_t h = member_u64(c, "hidden_size");
  if (!json_is_object(root)) rc = config_fail(path, "not a JSON object");
  else if (!L) rc = config_fail(path, "no positive integer num_hidden_layers");
  else if (!q && !kv) rc = config_fail(path, "no num_key_value_heads or num_attention_heads");
  if (!rc) {
    if (!kv) kv = q;
    if (!d && h && q && h % q == 0) d = h / q;
    if (!d) rc = config_fail(path, "no head_dim, and hidden_size / num_attention_heads is not whole");
  }
  if (!rc && (L > KVT_MAX_LAYERS || kv > KVT_MAX_HEADS || d > KVT_MAX_HEAD_DIM))
    rc = config_fail(path, "layers, KV heads or head_dim beyond kvtier's limits (1024 each)");
  if (!rc) {
    const char *base = strrchr(path, '/');
    snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
    json_t *mt = json_object_get(c, "_name_or_path");
    if (json_is_string(mt) && json_string_length(mt) > 0)
      snprintf(m->name, sizeof m->name, "%s", json_string_value(mt));
    m->n_layers = (uint32_t)L;
    m->n_kv_heads = (uint32_t)kv;
    m->head_dim = (uint32_t)d;
    json_t *dt = json_object_get(c, "torch_dtype");
    if (!json_is_string(dt)) dt = json_object_get(root, "torch_dtype");
    const char *dts = json_is_string(dt) ? json_string_value(dt) : "bfloat16";
    m->dtype = strcmp(dts, "float32") == 0 ? KVT_F32 : strcmp(dts, "float16") == 0 ? KVT_F16 : KVT_BF16;
    m->params = estimate_params(L, h ? h : q * d, kv * d, member_u64(c, "intermediate_size"),
                                member_u64(c, "vocab_size"));
  }
  json_decref(root);
  return rc;
}
