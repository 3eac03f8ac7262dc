/* test_import.c - `kvtier import`: KV written as safetensors by a numpy
 * script (tests/gen_safetensors.py, no torch) is stored under the named
 * namespace and reads back through the C API bit for bit, in f16, bf16 and
 * f32 and at another block size; importing again stores nothing new, a
 * longer file over the same prefix stores only its new blocks; the tail
 * after the last full block is not stored; every malformed, truncated or
 * inconsistent file is refused with a message and creates no store, and
 * leaves an existing store as it was. Runs $KVTIER_BIN and
 * /usr/bin/python3 with numpy; skips (77), saying why, without them. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "tool_files.h"

#define PY "/usr/bin/python3"

static const char *bin, *src;
static char *tmp;

static int setup(void **state) {
  (void)state;
  bin = getenv("KVTIER_BIN");
  src = getenv("KVTIER_SRC");
  tmp = tu_tmpdir();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(tmp);
  return 0;
}

static void need_tools(void) {
  if (!bin || !src) {
    print_message("skipped: needs $KVTIER_BIN and $KVTIER_SRC (run through ctest)\n");
    tu_skip_mark();
    skip();
  }
  if (system(PY " -c 'import numpy' >/dev/null 2>&1") != 0) {
    print_message("skipped: needs " PY " with numpy (apt-get install python3-numpy)\n");
    tu_skip_mark();
    skip();
  }
}

/* Run a shell command, stdout to tmp/NAME.out and stderr to tmp/NAME.err;
 * the exit status (-1: no exit). */
static int run(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int run(const char *name, const char *fmt, ...) {
  char cmd[8192], full[8600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  snprintf(full, sizeof full, "%s >'%s/%s.out' 2>'%s/%s.err'", cmd, tmp, name, tmp, name);
  int st = system(full);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *name, const char *ext) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s.%s", tmp, name, ext);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  b[n] = '\0';
  fclose(f);
  return b;
}

static void assert_has(const char *name, const char *ext, const char *what) {
  char *t = slurp(name, ext);
  if (!strstr(t, what)) fail_msg("%s.%s does not say '%s': %s", name, ext, what, t);
  free(t);
}

typedef struct gen {
  uint32_t layers, tokens, heads, dim, block_tokens;
  const char *dtype;
} gen;

/* Write NAME.st, NAME.tok and NAME.raw with the generator. */
static void generate(const char *name, const gen *g, const char *corrupt) {
  char extra[64] = "";
  if (corrupt) snprintf(extra, sizeof extra, "--corrupt %s", corrupt);
  int rc = run("gen", PY " '%s/tests/gen_safetensors.py' --out '%s/%s.st' --tokens-out "
               "'%s/%s.tok' --raw-out '%s/%s.raw' --layers %u --tokens %u --heads %u --dim %u "
               "--dtype %s %s", src, tmp, name, tmp, name, tmp, name, g->layers, g->tokens,
               g->heads, g->dim, g->dtype, extra);
  if (rc) fail_msg("the generator failed: %s", slurp("gen", "err"));
}

static int import(const char *out, const char *name, const char *store, uint32_t bt) {
  return run(out, "'%s' import --kv '%s/%s.st' --tokens '%s/%s.tok' --dir '%s/%s' --model-id "
             "test/imported --fingerprint sha256:abc --rope-theta 500000 --block-tokens %u "
             "--json", bin, tmp, name, tmp, name, tmp, store, bt);
}

static uint32_t dtype_of(const char *d) {
  return !strcmp(d, "f32") ? KVT_F32 : !strcmp(d, "f16") ? KVT_F16 : KVT_BF16;
}

/* Open store, register the namespace the import named, and check every
 * full block of NAME.raw reads back bit for bit, and nothing beyond. */
static void check_store(const char *store, const char *name, const gen *g) {
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/%s", tmp, store);
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_COLD] = 1ull << 30;
  kvt_engine *e = tu_open(dir, &o);
  kvt_shape sh = {.n_layers = g->layers, .n_kv_heads = g->heads, .head_dim = g->dim,
                  .dtype = dtype_of(g->dtype), .block_tokens = g->block_tokens};
  kvt_ns_desc d = {.model_id = "test/imported", .weights_fingerprint = "sha256:abc",
                   .rope_theta = 500000, .tp_size = 1, .shape = sh};
  kvt_ns_id ns;
  assert_int_equal(kvt_ns_register(e, &d, &ns), 0);
  uint32_t *tok = malloc((g->tokens + g->block_tokens) * sizeof *tok);
  assert_non_null(tok);
  for (uint32_t t = 0; t < g->tokens + g->block_tokens; t++)
    tok[t] = 1000 + t; /* the generator's ids */
  uint32_t full = g->tokens / g->block_tokens;
  size_t found = 0;
  /* one block more than the full ones: the tail was not stored */
  assert_int_equal(
      kvt_lookup(e, ns, tok, (size_t)(full + 1) * g->block_tokens, NULL, 0, &found), 0);
  assert_int_equal(found, full);
  char *raw = slurp(name, "raw");
  size_t es = kvt_dtype_size(sh.dtype), each = kvt_shape_block_bytes(&sh);
  size_t tensor = (size_t)g->tokens * g->heads * g->dim * es;
  uint8_t *k = malloc(each), *v = malloc(each);
  assert_non_null(k);
  assert_non_null(v);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  for (uint32_t b = 0; b < full; b++) {
    kvt_append_info ai;
    assert_int_equal(kvt_seq_append(s, tok + b * g->block_tokens, g->block_tokens, &ai), 0);
    assert_int_equal(ai.durable, 1);
    for (uint32_t l = 0; l < g->layers; l++) {
      assert_int_equal(kvt_seq_read(s, b, l, k, v, each), 0);
      const char *rk = raw + 2 * l * tensor + b * each, *rv = rk + tensor;
      if (memcmp(k, rk, each) || memcmp(v, rv, each))
        fail_msg("%s block %u layer %u differs from what the file holds", g->dtype, b, l);
    }
  }
  kvt_seq_release(s);
  kvt_engine_close(e);
  free(k);
  free(v);
  free(raw);
  free(tok);
}

static void test_roundtrip(void **state) {
  (void)state;
  need_tools();
  static const char *const dtypes[] = {"f16", "bf16", "f32"};
  for (int i = 0; i < 3; i++) {
    gen g = {.layers = 3, .tokens = 37, .heads = 2, .dim = 8, .block_tokens = 16,
             .dtype = dtypes[i]};
    char store[32];
    snprintf(store, sizeof store, "store_%s", dtypes[i]);
    generate("a", &g, NULL);
    assert_int_equal(import("imp", "a", store, 16), 0);
    assert_has("imp", "out", "\"blocks\":2,");
    assert_has("imp", "out", "\"blocks_written\":2,");
    assert_has("imp", "out", "\"tail_tokens_not_stored\":5,");
    check_store(store, "a", &g);
  }
  /* another block size: more blocks of the same file */
  gen g = {.layers = 2, .tokens = 37, .heads = 3, .dim = 4, .block_tokens = 8, .dtype = "f16"};
  generate("a8", &g, NULL);
  assert_int_equal(import("imp8", "a8", "store8", 8), 0);
  assert_has("imp8", "out", "\"blocks_written\":4,");
  check_store("store8", "a8", &g);
}

static void test_dedup(void **state) {
  (void)state;
  need_tools();
  gen g = {.layers = 2, .tokens = 40, .heads = 2, .dim = 8, .block_tokens = 16, .dtype = "f16"};
  generate("d", &g, NULL);
  assert_int_equal(import("d1", "d", "dstore", 16), 0);
  assert_has("d1", "out", "\"blocks_written\":2,");
  assert_int_equal(import("d2", "d", "dstore", 16), 0); /* the same again: nothing new */
  assert_has("d2", "out", "\"blocks_written\":0,");
  assert_has("d2", "out", "\"blocks_deduplicated\":2,");
  gen g2 = g;
  g2.tokens = 70; /* the same first 40 tokens and their KV, then more */
  generate("d_long", &g2, NULL);
  assert_int_equal(import("d3", "d_long", "dstore", 16), 0);
  assert_has("d3", "out", "\"blocks_deduplicated\":2,");
  assert_has("d3", "out", "\"blocks_written\":2,");
  check_store("dstore", "d_long", &g2);
}

/* Each broken file: exit 1, a message naming the file, no store created. */
static void test_refuses(void **state) {
  (void)state;
  need_tools();
  static const struct { const char *kind, *says; } bad[] = {
      {"short", "shorter than the 8-byte header length"},
      {"huge-header", "the header length says"},
      {"truncated", "truncated?"},
      {"bad-json", "not JSON"},
      {"not-object", "not a JSON object"},
      {"offsets-outside", "reach past the end of the file"},
      {"overlap", "overlaps the tensor before it"},
      {"hole", "belong to no tensor"},
      {"trailing", "after its last tensor"},
      {"size-mismatch", "but its shape and dtype F16 take"},
      {"wrong-dims", "expected 3, [tokens, kv_heads, head_dim]"},
      {"shape-differs", "every K and V must have one shape and dtype"},
      {"wrong-dtype", "is F64: kvtier stores F16, BF16 or F32"},
      {"mixed-dtype", "every K and V must have one shape and dtype"},
      {"missing-v", "no tensor 'layers.1.v'"},
      {"nan", "NaN or infinity"},
      {"duplicate-name", "duplicate"},
      {"few-tokens", "36 token ids, but the KV tensors hold 37 tokens"},
  };
  gen g = {.layers = 3, .tokens = 37, .heads = 2, .dim = 8, .block_tokens = 16, .dtype = "f16"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    generate("bad", &g, bad[i].kind);
    int rc = import("badimp", "bad", "never", 16);
    if (rc != 1) fail_msg("%s: exit %d, expected 1", bad[i].kind, rc);
    assert_has("badimp", "err", bad[i].says);
    assert_has("badimp", "err", "kvtier import:");
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/never", tmp);
    if (stat(path, &sb) == 0) fail_msg("%s: a store was created", bad[i].kind);
  }
  /* into a store that holds blocks: refused, the store as it was */
  generate("ok", &g, NULL);
  assert_int_equal(import("okimp", "ok", "kept", 16), 0);
  gen g2 = g;
  g2.tokens = 80;
  generate("bad2", &g2, "nan"); /* the NaN is in token 0: the file's first block */
  assert_int_equal(import("badimp2", "bad2", "kept", 16), 1);
  assert_int_equal(run("st", "'%s' stat '%s/kept' --json", bin, tmp), 0);
  assert_has("st", "out", "\"records\":2,");
  check_store("kept", "ok", &g);
  /* usage: no namespace named */
  assert_int_equal(run("use", "'%s' import --kv '%s/ok.st' --tokens '%s/ok.tok' --dir '%s/x'",
                       bin, tmp, tmp, tmp), 2);
  assert_has("use", "err", "--model-id and --fingerprint");
}

/* --model: the namespace kvtier warm gives that checkpoint, so warm then
 * finds every imported block stored and computes nothing. */
static void test_model_namespace(void **state) {
  (void)state;
  need_tools();
  char model[4200];
  snprintf(model, sizeof model, "%s/tiny.bin", tmp);
  assert_int_equal(tf_write_model(model, 64, 64), 0); /* 2 layers, 2 KV heads of 4 */
  int rc = run("gm", PY " '%s/tests/gen_safetensors.py' --out '%s/m.st' --tokens-out '%s/m.tok' "
               "--layers 2 --tokens 37 --heads 2 --dim 4 --dtype f32 --first-token 1", src, tmp,
               tmp);
  assert_int_equal(rc, 0);
  assert_int_equal(run("mi", "'%s' import --kv '%s/m.st' --tokens '%s/m.tok' --dir '%s/mstore' "
                       "--model '%s' --json", bin, tmp, tmp, tmp, model), 0);
  assert_has("mi", "out", "\"blocks_written\":2,");
  assert_has("mi", "out", "\"model_id\":\"llama2c/");
  assert_int_equal(run("mw", "'%s' warm --model '%s' --tokens '%s/m.tok' --dir '%s/mstore' --json",
                       bin, model, tmp, tmp), 0);
  assert_has("mw", "out", "\"blocks_deduplicated\":2,");
  assert_has("mw", "out", "\"tokens_computed\":0,");
  /* the namespace options do not go with --model; f16 KV does not fit the model */
  assert_int_equal(run("mu", "'%s' import --kv '%s/m.st' --tokens '%s/m.tok' --dir '%s/x' "
                       "--model '%s' --model-id y", bin, tmp, tmp, tmp, model), 2);
  rc = run("gm2", PY " '%s/tests/gen_safetensors.py' --out '%s/m16.st' --tokens-out "
           "'%s/m16.tok' --layers 2 --tokens 37 --heads 2 --dim 4 --dtype f16 --first-token 1",
           src, tmp, tmp);
  assert_int_equal(rc, 0);
  assert_int_equal(run("m16", "'%s' import --kv '%s/m16.st' --tokens '%s/m16.tok' --dir "
                       "'%s/x' --model '%s'", bin, tmp, tmp, tmp, model), 1);
  assert_has("m16", "err", "the model's KV is 2 layers x [tokens, 2, 4] F32");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_dedup),
      cmocka_unit_test(test_refuses),
      cmocka_unit_test(test_model_namespace),
  };
  return tu_exit(cmocka_run_group_tests(tests, setup, teardown));
}
