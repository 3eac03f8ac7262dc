/* import.c - `kvtier import`: store KV that another engine computed, read
 * from a safetensors file (one K and one V tensor per layer, named
 * layers.{i}.k / layers.{i}.v, [tokens, kv_heads, head_dim], f16, bf16 or
 * f32; docs/import.md), as the full token blocks of the given token ids,
 * durably in the cold tier of a store, under the namespace the user names.
 * Blocks stored already are adopted, not put again (content-addressed keys
 * of the token ids). The file and the tokens are checked whole before the
 * store is opened, so a bad file stores nothing. Public API only. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmds.h"
#include "refcli.h"
#include "safetensors.h"
#include "util.h"

#define IMPORT_COLD_BYTES (64ull << 30) /* cold tier limit, as kvtier warm */
#define IMPORT_TOKENS_MAX (1u << 24)    /* token ids in one --tokens file */

typedef struct import_cfg {
  const char *kv, *tokens, *dir, *model, *model_id, *fingerprint, *rope_theta, *rope_scaling;
  const char *remote;
  uint64_t rope_dims, tp_rank, tp_size, block_tokens;
  int json;
} import_cfg;

#define IMPORT_N_OPTS 14

static void import_opts(import_cfg *c, cli_opt o[IMPORT_N_OPTS]) {
  const cli_opt opts[IMPORT_N_OPTS] = {
      {"--kv", "FILE", CLI_STR, &c->kv, 0, 0,
       "safetensors file: layers.{i}.k and layers.{i}.v, [tokens, kv_heads, head_dim] (required)"},
      {"--tokens", "FILE", CLI_STR, &c->tokens, 0, 0,
       "the token ids the KV is of, whitespace-separated, one per token of the tensors (required)"},
      {"--dir", "D", CLI_STR, &c->dir, 0, 0, "the store (required; created when missing)"},
      {"--model-id", "ID", CLI_STR, &c->model_id, 0, 0,
       "the namespace's model id, e.g. meta-llama/Llama-3.1-8B (required without --model)"},
      {"--fingerprint", "F", CLI_STR, &c->fingerprint, 0, 0,
       "the weights' fingerprint, e.g. a SHA-256 (required without --model)"},
      {"--rope-theta", "X", CLI_STR, &c->rope_theta, 0, 0, "RoPE base (default 0: none)"},
      {"--rope-dims", "N", CLI_U64, &c->rope_dims, 0, KVT_MAX_HEAD_DIM,
       "rotated dims per head (default 0: head_dim)"},
      {"--rope-scaling", "TEXT", CLI_STR, &c->rope_scaling, 0, 0,
       "canonical text of any RoPE scaling (default none)"},
      {"--tp-rank", "N", CLI_U64, &c->tp_rank, 0, 65535, "tensor-parallel rank (default 0)"},
      {"--tp-size", "N", CLI_U64, &c->tp_size, 1, 65536, "tensor-parallel size (default 1)"},
      {"--block-tokens", "N", CLI_U64, &c->block_tokens, 1, KVT_MAX_BLOCK_TOKENS,
       "tokens per block, a power of two (default 16)"},
      {"--model", "M", CLI_STR, &c->model, 0, 0,
       "a llama2.c checkpoint: its namespace as kvtier warm names it, instead of the options "
       "above (f32, 16-token blocks)"},
      {"--json", NULL, CLI_FLAG, &c->json, 0, 0, "print the figures as one JSON object"},
      CLI_OPT_REMOTE(&c->remote),
  };
  memcpy(o, opts, sizeof opts);
}

void import_usage(FILE *f) {
  import_cfg c;
  cli_opt o[IMPORT_N_OPTS];
  import_opts(&c, o);
  fprintf(f,
          "usage: kvtier import --kv FILE.safetensors --tokens FILE --dir D\n"
          "                     (--model-id ID --fingerprint F [namespace options] | --model M)\n"
          "                     [--remote URL] [--json]\n\n"
          "Stores KV computed by any engine: the K and V tensors of every layer in a\n"
          "safetensors file (layers.{i}.k, layers.{i}.v; [tokens, kv_heads, head_dim];\n"
          "f16, bf16 or f32, stored bit for bit in that dtype) and the token ids they are\n"
          "of. Full blocks go durably into the cold tier of D under the namespace named\n"
          "by the options (the one a serving engine registers, so its lookups find them);\n"
          "tokens after the last full block are not stored. Blocks D holds already are\n"
          "not stored again. The file and the tokens are checked whole first: a bad file\n"
          "stores nothing. With --remote the blocks are written through to the\n"
          "cluster too. docs/import.md says more.\n\noptions:\n");
  cli_print_opts(f, o, IMPORT_N_OPTS);
}

static int import_usage_error(const char *msg) {
  fprintf(stderr, "kvtier import: %s\nrun 'kvtier help import' for its options\n", msg);
  return CLI_USAGE;
}

/* ---- the KV file ---------------------------------------------------------- */

/* The file mapped, its tensors, and the layers found in it. */
typedef struct import_kv {
  uint8_t *map;
  size_t map_len;
  st_file st;
  uint32_t n_layers, dtype;     /* kvt_dtype */
  uint64_t n_tokens, n_heads, head_dim;
  const uint8_t **k, **v;       /* [n_layers]: each layer's tensor in the map */
  size_t ignored;               /* tensors not named layers.{i}.k/v */
} import_kv;

static void import_kv_free(import_kv *x) {
  if (x->map) munmap(x->map, x->map_len);
  st_free(&x->st);
  free(x->k);
  free(x->v);
  memset(x, 0, sizeof *x);
}

static int kv_fail(const char *path, const char *why) {
  fprintf(stderr, "kvtier import: %s: %s\n", path, why);
  return CLI_FAIL;
}

static int kv_map(const char *path, import_kv *x) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return kv_fail(path, strerror(errno));
  struct stat sb;
  int rc = fstat(fd, &sb);
  if (rc || !S_ISREG(sb.st_mode)) {
    close(fd);
    return kv_fail(path, rc ? strerror(errno) : "not a regular file");
  }
  if (sb.st_size < 8) {
    close(fd);
    char why[96];
    snprintf(why, sizeof why, "%lld bytes: shorter than the 8-byte header length",
             (long long)sb.st_size);
    return kv_fail(path, why);
  }
  x->map_len = (size_t)sb.st_size;
  void *p = mmap(NULL, x->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return kv_fail(path, strerror(errno));
  x->map = p;
  return CLI_OK;
}

/* "layers.<i>.k" or ".v" with i in decimal (no sign, no leading zero):
 * 1 and *layer, *kind ('k' or 'v'); 0 for any other name. */
static int kv_name(const char *name, uint32_t *layer, char *kind) {
  if (strncmp(name, "layers.", 7) != 0) return 0;
  const char *p = name + 7;
  if (p[0] < '0' || p[0] > '9' || (p[0] == '0' && p[1] != '.')) return 0;
  uint64_t i = 0;
  for (; *p >= '0' && *p <= '9'; p++)
    if ((i = i * 10 + (uint64_t)(*p - '0')) > UINT32_MAX) return 0;
  if (p[0] != '.' || (p[1] != 'k' && p[1] != 'v') || p[2] != '\0') return 0;
  *layer = (uint32_t)i;
  *kind = p[1];
  return 1;
}

static uint32_t kvt_dtype_of(st_dtype d) {
  return d == ST_F32 ? KVT_F32 : d == ST_F16 ? KVT_F16 : d == ST_BF16 ? KVT_BF16 : 0;
}

/* Every layer tensor: a kvtier dtype, three dimensions, the same shape and
 * dtype as layers.0.k; layers 0 .. L-1 each with k and v, none beyond. */
static int kv_layers(const char *path, import_kv *x) {
  char why[512];
  uint32_t max_layer = 0;
  size_t named = 0;
  for (size_t i = 0; i < x->st.n; i++) {
    uint32_t l;
    char kind;
    if (!kv_name(x->st.t[i].name, &l, &kind)) {
      x->ignored++;
      continue;
    }
    named++;
    if (l >= KVT_MAX_LAYERS) {
      snprintf(why, sizeof why, "tensor '%s': kvtier stores at most %u layers", x->st.t[i].name,
               KVT_MAX_LAYERS);
      return kv_fail(path, why);
    }
    if (l + 1 > max_layer) max_layer = l + 1;
  }
  if (named == 0)
    return kv_fail(path, "no tensor named layers.{i}.k or layers.{i}.v (docs/import.md)");
  x->n_layers = max_layer;
  x->k = calloc(max_layer, sizeof *x->k);
  x->v = calloc(max_layer, sizeof *x->v);
  if (!x->k || !x->v) return kv_fail(path, "out of memory");
  const st_tensor *t0 = NULL;
  for (uint32_t l = 0; l < max_layer; l++) {
    for (int side = 0; side < 2; side++) {
      char name[64];
      snprintf(name, sizeof name, "layers.%u.%c", l, side ? 'v' : 'k');
      const st_tensor *t = st_find(&x->st, name);
      if (!t) {
        snprintf(why, sizeof why, "no tensor '%s' (layers 0..%u have tensors: each needs a k "
                 "and a v)", name, max_layer - 1);
        return kv_fail(path, why);
      }
      if (!kvt_dtype_of(t->dtype)) {
        snprintf(why, sizeof why, "tensor '%s' is %s: kvtier stores F16, BF16 or F32", name,
                 t->dtype_text);
        return kv_fail(path, why);
      }
      if (t->n_dims != 3) {
        snprintf(why, sizeof why, "tensor '%s' has %u dimensions: expected 3, [tokens, "
                 "kv_heads, head_dim]", name, t->n_dims);
        return kv_fail(path, why);
      }
      if (!t0) t0 = t;
      if (t->dtype != t0->dtype || memcmp(t->shape, t0->shape, sizeof t->shape)) {
        snprintf(why, sizeof why, "tensor '%s' is %s [%" PRIu64 ", %" PRIu64 ", %" PRIu64 "], "
                 "but '%s' is %s [%" PRIu64 ", %" PRIu64 ", %" PRIu64 "]: every K and V must "
                 "have one shape and dtype", name, t->dtype_text, t->shape[0], t->shape[1],
                 t->shape[2], t0->name, t0->dtype_text, t0->shape[0], t0->shape[1],
                 t0->shape[2]);
        return kv_fail(path, why);
      }
      const uint8_t *data = x->map + x->st.data_off + t->begin;
      if (side) x->v[l] = data;
      else x->k[l] = data;
    }
  }
  x->dtype = kvt_dtype_of(t0->dtype);
  x->n_tokens = t0->shape[0];
  x->n_heads = t0->shape[1];
  x->head_dim = t0->shape[2];
  if (x->n_tokens == 0 || x->n_heads == 0 || x->n_heads > KVT_MAX_HEADS || x->head_dim == 0 ||
      x->head_dim > KVT_MAX_HEAD_DIM) {
    snprintf(why, sizeof why, "shape [%" PRIu64 ", %" PRIu64 ", %" PRIu64 "]: tokens must be "
             "at least 1, kv_heads 1..%u, head_dim 1..%u", x->n_tokens, x->n_heads, x->head_dim,
             KVT_MAX_HEADS, KVT_MAX_HEAD_DIM);
    return kv_fail(path, why);
  }
  return CLI_OK;
}

static int kv_load(const char *path, import_kv *x) {
  int rc = kv_map(path, x);
  if (rc != CLI_OK) return rc;
  char err[512];
  if (st_parse(x->map, x->map_len, &x->st, err, sizeof err)) return kv_fail(path, err);
  return kv_layers(path, x);
}

/* Is any value NaN or infinite? Element index of the first, or -1. */
static int64_t first_nonfinite(const uint8_t *p, uint64_t n, uint32_t dtype) {
  for (uint64_t i = 0; i < n; i++) {
    if (dtype == KVT_F32) {
      uint32_t w;
      memcpy(&w, p + 4 * i, 4);
      if ((w & 0x7F800000u) == 0x7F800000u) return (int64_t)i;
    } else {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      uint16_t exp = dtype == KVT_F16 ? 0x7C00u : 0x7F80u;
      if ((h & exp) == exp) return (int64_t)i;
    }
  }
  return -1;
}

/* The tokens that will be stored hold only finite values (a put would
 * refuse them half way). */
static int kv_finite(const char *path, const import_kv *x, uint64_t stored_tokens) {
  uint64_t n = stored_tokens * x->n_heads * x->head_dim;
  for (uint32_t l = 0; l < x->n_layers; l++)
    for (int side = 0; side < 2; side++) {
      int64_t i = first_nonfinite(side ? x->v[l] : x->k[l], n, x->dtype);
      if (i < 0) continue;
      char why[256];
      uint64_t per_tok = x->n_heads * x->head_dim;
      snprintf(why, sizeof why, "tensor 'layers.%u.%c' holds NaN or infinity at token %" PRIu64
               ", head %" PRIu64 ", dim %" PRIu64 ": kvtier stores finite KV only", l,
               side ? 'v' : 'k', (uint64_t)i / per_tok, (uint64_t)i % per_tok / x->head_dim,
               (uint64_t)i % x->head_dim);
      return kv_fail(path, why);
    }
  return CLI_OK;
}

/* ---- the token ids -------------------------------------------------------- */

static int tokens_read(const char *path, uint64_t want, uint32_t vocab, uint32_t **out) {
  FILE *f = fopen(path, "r");
  if (!f) return kv_fail(path, strerror(errno));
  uint32_t *ids = want <= IMPORT_TOKENS_MAX ? malloc(want * sizeof *ids) : NULL;
  uint64_t n = 0;
  int rc = ids ? CLI_OK : kv_fail(path, want > IMPORT_TOKENS_MAX ? "more tokens than kvtier "
                                  "import takes in one file (16M)" : "out of memory");
  char word[32], why[160];
  int c = 0;
  while (rc == CLI_OK && c != EOF) {
    size_t k = 0;
    while ((c = fgetc(f)) != EOF && (c == ' ' || c == '\t' || c == '\n' || c == '\r')) {}
    while (c != EOF && c != ' ' && c != '\t' && c != '\n' && c != '\r') {
      if (k + 1 < sizeof word) word[k++] = (char)c;
      else k = sizeof word; /* too long to be an id */
      c = fgetc(f);
    }
    if (k == 0) break;
    word[k < sizeof word ? k : sizeof word - 1] = '\0';
    char *end;
    errno = 0;
    unsigned long long v = strtoull(word, &end, 10);
    if (k >= sizeof word || *end || errno || word[0] == '-' || word[0] == '+' || v > UINT32_MAX) {
      snprintf(why, sizeof why, "token %" PRIu64 " ('%.20s') is not a token id (0 .. 2^32-1)",
               n + 1, word);
      rc = kv_fail(path, why);
    } else if (vocab && v >= vocab) {
      snprintf(why, sizeof why, "token %" PRIu64 " is %llu, not below the model's vocabulary "
               "size %u", n + 1, v, vocab);
      rc = kv_fail(path, why);
    } else if (n == want) {
      n++;
      break;
    } else {
      ids[n++] = (uint32_t)v;
    }
  }
  if (rc == CLI_OK && ferror(f)) rc = kv_fail(path, strerror(errno));
  fclose(f);
  if (rc == CLI_OK && n != want) {
    if (n > want)
      snprintf(why, sizeof why, "more token ids than the %" PRIu64 " tokens the KV tensors "
               "hold", want);
    else
      snprintf(why, sizeof why, "%" PRIu64 " token ids, but the KV tensors hold %" PRIu64
               " tokens", n, want);
    rc = kv_fail(path, why);
  }
  if (rc != CLI_OK) {
    free(ids);
    return rc;
  }
  *out = ids;
  return CLI_OK;
}

/* ---- the namespace -------------------------------------------------------- */

typedef struct import_ns {
  kvt_ns_desc d;
  char id[KVT_MAX_ID_LEN + 1], fp[KVT_MAX_ID_LEN + 1]; /* --model: the names warm gives */
  uint32_t vocab;                /* --model: token ids must be below it; else 0 */
} import_ns;

static int ns_from_options(const import_cfg *c, const import_kv *x, import_ns *n) {
  double theta = 0;
  if (c->rope_theta) {
    char *end;
    errno = 0;
    theta = strtod(c->rope_theta, &end);
    if (*end || errno || !(theta >= 0) || theta > 1e300)
      return import_usage_error("--rope-theta: not a finite number >= 0");
  }
  if (c->tp_rank >= c->tp_size) return import_usage_error("--tp-rank must be below --tp-size");
  if (c->block_tokens & (c->block_tokens - 1))
    return import_usage_error("--block-tokens must be a power of two");
  n->d = (kvt_ns_desc){.model_id = c->model_id, .weights_fingerprint = c->fingerprint,
                       .rope_theta = theta, .rope_dims = (uint32_t)c->rope_dims,
                       .rope_scaling = c->rope_scaling, .tp_rank = (uint32_t)c->tp_rank,
                       .tp_size = (uint32_t)c->tp_size,
                       .shape = {.n_layers = x->n_layers, .n_kv_heads = (uint32_t)x->n_heads,
                                 .head_dim = (uint32_t)x->head_dim, .dtype = x->dtype,
                                 .block_tokens = (uint32_t)c->block_tokens}};
  if (c->rope_dims > x->head_dim) return import_usage_error("--rope-dims is above head_dim");
  if (2 * (uint64_t)kvt_shape_block_bytes(&n->d.shape) > KVT_MAX_BLOCK_BYTES) {
    fprintf(stderr, "kvtier import: one layer block of %u tokens takes %zu bytes of K and V "
            "each: above kvtier's %u-byte layer block (use fewer --block-tokens)\n",
            n->d.shape.block_tokens, kvt_shape_block_bytes(&n->d.shape), KVT_MAX_BLOCK_BYTES);
    return CLI_FAIL;
  }
  return CLI_OK;
}

/* --model: the reference model's namespace exactly as kvtier warm
 * registers it (rm_ns_register), read back from a metadata-only engine
 * (no directory, nothing stored); the tensors must be of its shape. */
static int ns_from_model(const import_cfg *c, const import_kv *x, import_ns *n) {
  rm_model m;
  if (ref_load_model("import", c->model, &m) != CLI_OK) return CLI_FAIL;
  n->vocab = (uint32_t)m.c.vocab_size;
  kvt_options o;
  kvt_options_init(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  kvt_engine *e = NULL;
  kvt_ns_id id;
  kvt_ns_desc d;
  int rc = kvt_engine_open(NULL, &o, &e);
  if (!rc) rc = rm_ns_register(e, &m, REF_BLOCK_TOKENS, &id);
  if (!rc) rc = kvt_ns_get(e, 0, &id, &d);
  if (!rc) {
    snprintf(n->id, sizeof n->id, "%s", d.model_id);
    snprintf(n->fp, sizeof n->fp, "%s", d.weights_fingerprint);
    n->d = d;
    n->d.model_id = n->id;
    n->d.weights_fingerprint = n->fp;
    n->d.rope_scaling = NULL;
  }
  kvt_engine_close(e);
  rm_model_free(&m);
  if (rc) return cli_lib_error("import", "naming the model's namespace", rc);
  const kvt_shape *s = &n->d.shape;
  if (x->dtype != s->dtype || x->n_layers != s->n_layers || x->n_heads != s->n_kv_heads ||
      x->head_dim != s->head_dim) {
    fprintf(stderr, "kvtier import: %s: the tensors are %u layers x [tokens, %" PRIu64 ", %"
            PRIu64 "] %s; the model's KV is %u layers x [tokens, %u, %u] F32\n", c->kv,
            x->n_layers, x->n_heads, x->head_dim,
            x->dtype == KVT_F32 ? "F32" : x->dtype == KVT_F16 ? "F16" : "BF16", s->n_layers,
            s->n_kv_heads, s->head_dim);
    return CLI_FAIL;
  }
  return CLI_OK;
}

/* ---- storing -------------------------------------------------------------- */

typedef struct import_totals {
  uint64_t blocks, stored, dedup, written, tail_tokens;
  double seconds;
  kvt_remote_stats remote; /* size 0: no remote tier */
} import_totals;

/* Append every full block; put the layers of those not stored yet. */
static int import_blocks(kvt_engine *e, kvt_ns_id ns, const import_kv *x, const uint32_t *tok,
                         uint32_t bt, import_totals *t) {
  kvt_seq *s;
  int rc = kvt_seq_create(e, ns, &s);
  if (rc) return cli_engine_error("import", "creating a sequence", e, rc);
  size_t es = kvt_dtype_size(x->dtype), tok_bytes = (size_t)x->n_heads * x->head_dim * es;
  for (uint64_t b = 0; b < t->blocks && !rc; b++) {
    progress("import: block %" PRIu64 " of %" PRIu64, b + 1, t->blocks);
    kvt_append_info ai;
    rc = kvt_seq_append(s, tok + b * bt, bt, &ai);
    if (rc) {
      rc = cli_engine_error("import", "appending a token block", e, rc);
      break;
    }
    if (ai.durable || ai.layers_present == x->n_layers) { /* stored already */
      t->dedup++;
      continue;
    }
    size_t off = (size_t)b * bt * tok_bytes;
    for (uint32_t l = 0; l < x->n_layers && !rc; l++) {
      kvt_kv kv = {.k = x->k[l] + off, .v = x->v[l] + off, .dtype = x->dtype, .n_tokens = bt,
                   .n_heads = (uint32_t)x->n_heads, .head_dim = (uint32_t)x->head_dim};
      rc = kvt_seq_put(s, ai.block, l, &kv);
      if (rc) rc = cli_engine_error("import", "putting a layer block", e, rc);
    }
    t->stored += rc == 0;
  }
  progress_end();
  kvt_seq_release(s);
  return rc;
}

static int import_store(const import_cfg *c, const import_kv *x, const uint32_t *tok,
                        const import_ns *n, import_totals *t) {
  kvt_options o;
  kvt_options_init(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = 512u << 20;
  o.tier_bytes_limit[KVT_TIER_COLD] = IMPORT_COLD_BYTES;
  kvt_engine *e;
  int rc = cli_engine_open_remote(c->dir, &o, c->remote, &e);
  if (rc) {
    char what[600];
    snprintf(what, sizeof what, "opening the store in '%s'", c->dir);
    return cli_lib_error("import", what, rc);
  }
  kvt_ns_id ns;
  if ((rc = kvt_ns_register(e, &n->d, &ns))) {
    rc = cli_engine_error("import", "registering the namespace", e, rc);
    kvt_engine_close(e);
    return rc;
  }
  kvt_stats s0, s1;
  kvt_stats_get(e, &s0);
  kvt_tier_stats d0 = {0}, d1 = {0}; /* the cold tier's declines: not sent to the cluster */
  kvt_stats_tier(e, KVT_TIER_COLD, &d0, sizeof d0);
  uint64_t t0 = now_ns();
  rc = import_blocks(e, ns, x, tok, n->d.shape.block_tokens, t);
  int sync_rc = rc ? 0 : kvt_sync(e);
  t->seconds = (double)(now_ns() - t0) * 1e-9;
  kvt_stats_get(e, &s1);
  /* before close, as kvtier warm; once the blocks put are settled there */
  kvt_stats_tier(e, KVT_TIER_COLD, &d1, sizeof d1);
  uint64_t declined = d1.declined - d0.declined;
  uint64_t want = rc || sync_rc || declined >= t->stored ? 0 : t->stored - declined;
  cli_remote_get_settled(e, &t->remote, want, 10000);
  kvt_engine_close(e);
  if (rc) return rc;
  if (sync_rc) return cli_lib_error("import", "making the blocks durable (kvt_sync)", sync_rc);
  t->written = s1.cold_written - s0.cold_written;
  return CLI_OK;
}

static void import_report(const import_cfg *c, const import_kv *x, const import_ns *n,
                          const import_totals *t) {
  const char *dt = x->dtype == KVT_F32 ? "f32" : x->dtype == KVT_F16 ? "f16" : "bf16";
  if (c->json) {
    json_w j;
    json_begin(&j, stdout);
    json_str(&j, "command", "import");
    json_str(&j, "dir", c->dir);
    json_str(&j, "model_id", n->d.model_id);
    json_str(&j, "weights_fingerprint", n->d.weights_fingerprint);
    json_u64(&j, "n_layers", x->n_layers);
    json_u64(&j, "n_kv_heads", x->n_heads);
    json_u64(&j, "head_dim", x->head_dim);
    json_str(&j, "dtype", dt);
    json_u64(&j, "block_tokens", n->d.shape.block_tokens);
    json_u64(&j, "tokens", x->n_tokens);
    json_u64(&j, "tail_tokens_not_stored", t->tail_tokens);
    json_u64(&j, "blocks", t->blocks);
    json_u64(&j, "blocks_stored", t->stored);
    json_u64(&j, "blocks_written", t->written);
    json_u64(&j, "blocks_deduplicated", t->dedup);
    json_u64(&j, "tensors_ignored", x->ignored);
    json_f64(&j, "seconds", t->seconds);
    cli_remote_json(&j, &t->remote);
    json_end(&j);
    return;
  }
  printf("imported %s into %s\n\n", c->kv, c->dir);
  printf("  namespace            %s (%s)\n", n->d.model_id, n->d.weights_fingerprint);
  printf("  shape                %u layers x %" PRIu64 " KV heads x head_dim %" PRIu64 ", %s, "
         "%u tokens per block\n", x->n_layers, x->n_heads, x->head_dim, dt,
         n->d.shape.block_tokens);
  printf("  tokens               %10" PRIu64 "  (%" PRIu64 " after the last full block, not "
         "stored)\n", x->n_tokens, t->tail_tokens);
  printf("  full blocks          %10" PRIu64 "\n", t->blocks);
  printf("  blocks written       %10" PRIu64 "  (durable, all layers)\n", t->written);
  printf("  blocks deduplicated  %10" PRIu64 "  (stored already)\n", t->dedup);
  if (x->ignored)
    printf("  tensors ignored      %10zu  (not named layers.{i}.k or layers.{i}.v)\n", x->ignored);
  printf("  time                 %10.2f s\n", t->seconds);
  cli_remote_print(&t->remote);
}

static int import_check_cfg(const import_cfg *c) {
  if (!c->kv) return import_usage_error("--kv is required");
  if (!c->tokens) return import_usage_error("--tokens is required");
  if (!c->dir) return import_usage_error("--dir is required");
  int ns_opts = c->model_id || c->fingerprint || c->rope_theta || c->rope_dims ||
                c->rope_scaling || c->tp_rank || c->tp_size != 1 || c->block_tokens != 16;
  if (c->model && ns_opts)
    return import_usage_error("--model names the namespace: no --model-id, --fingerprint, "
                              "--rope-*, --tp-* or --block-tokens with it");
  if (!c->model && (!c->model_id || !c->fingerprint))
    return import_usage_error("name the namespace: --model-id and --fingerprint (or --model)");
  return CLI_OK;
}

int cmd_import(int argc, char **argv) {
  import_cfg c = {.tp_size = 1, .block_tokens = 16};
  cli_opt o[IMPORT_N_OPTS];
  import_opts(&c, o);
  int want_help = 0, rc = cli_parse("import", argc - 1, argv + 1, o, IMPORT_N_OPTS, &want_help);
  if (want_help) import_usage(stdout);
  if (rc != CLI_OK || want_help) return rc;
  if ((rc = import_check_cfg(&c)) != CLI_OK) return rc;
  import_kv x = {0};
  import_ns n = {0};
  uint32_t *tok = NULL;
  rc = kv_load(c.kv, &x);
  if (rc == CLI_OK) rc = c.model ? ns_from_model(&c, &x, &n) : ns_from_options(&c, &x, &n);
  import_totals t = {0};
  uint32_t bt = n.d.shape.block_tokens;
  if (rc == CLI_OK) {
    t.blocks = x.n_tokens / bt;
    t.tail_tokens = x.n_tokens % bt;
    rc = kv_finite(c.kv, &x, t.blocks * bt);
  }
  if (rc == CLI_OK) rc = tokens_read(c.tokens, x.n_tokens, n.vocab, &tok);
  if (rc == CLI_OK) rc = import_store(&c, &x, tok, &n, &t);
  if (rc == CLI_OK) import_report(&c, &x, &n, &t);
  free(tok);
  import_kv_free(&x);
  return rc;
}
