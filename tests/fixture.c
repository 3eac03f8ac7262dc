/* fixture.c - setup shared by several tests (fixture.h): a durable store
 * written by a sequence, and running the kvtier binary on the model. */
#include "fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cold_util.h"

void tf_write_durable(const char *dir, uint32_t backend, const kvt_shape *sh, const char *model,
                      uint64_t salt, const uint32_t *toks, uint32_t n) {
  kvt_options o;
  cu_opts(&o, backend);
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, model, sh);
  kvt_seq *s = NULL;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  tu_kv kv;
  tu_kv_alloc(&kv, sh);
  for (uint32_t b = 0; b < n; b++) tu_append_put(s, sh, salt, toks + (size_t)b * sh->block_tokens, &kv);
  tu_kv_free(&kv);
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(s), n);
  kvt_seq_release(s);
  kvt_engine_close(e);
}

char tf_bin[2200], tf_model[2200];

int tf_have_bin_model(void) {
  const char *d = getenv("KVTIER_DATA"), *src = getenv("KVTIER_SRC"), *b = getenv("KVTIER_BIN");
  if (d) snprintf(tf_model, sizeof tf_model, "%s/models/stories260K.bin", d);
  else snprintf(tf_model, sizeof tf_model, "%s/../shared/data/models/stories260K.bin", src ? src : ".");
  snprintf(tf_bin, sizeof tf_bin, "%s", b ? b : "");
  return b && access(tf_bin, X_OK) == 0 && access(tf_model, R_OK) == 0;
}

int tf_run(const char *args, char *out, size_t cap) {
  char cmd[16800];
  snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", tf_bin, args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

double tf_json_num(const char *js, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(js, pat);
  if (!p) fail_msg("key %s missing in %s", key, js);
  return strtod(p + strlen(pat), NULL);
}
