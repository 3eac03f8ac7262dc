/* test_resident_refmodel.c - the reference decoder over a store whose hot
 * tier holds a fraction of the context and whose blocks leave RAM once
 * durable: attention must still run over every block (the engine brings
 * back what left RAM; the decoder never reads and puts), so its logits
 * equal a plain cache's bit for bit. Needs stories260K (KVTIER_DATA). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cold_util.h"
#include "refmodel.h"
#include "sample.h"

static char model_path[4200];

static int find_data(void) {
  const char *dir = getenv("KVTIER_DATA"), *src = getenv("KVTIER_SRC");
  char buf[2048];
  if (!dir) {
    snprintf(buf, sizeof buf, "%s/../shared/data", src ? src : ".");
    dir = buf;
  }
  snprintf(model_path, sizeof model_path, "%s/models/stories260K.bin", dir);
  return access(model_path, R_OK);
}

#define TOKENS 300

static void test_small_hot_cold_bit_identical(void **state) {
  (void)state;
  rm_model m;
  char err[512];
  int rc = rm_model_load(model_path, &m, err, sizeof err);
  if (rc) print_message("%s\n", err);
  assert_int_equal(rc, 0);
  uint32_t toks[TOKENS];
  assert_int_equal(rm_sample(&m, 7, TOKENS, toks), 0);
  /* A hot tier of one layer's blocks and a few more: most of the context
   * is in the cold tier only by the end. */
  uint64_t per = 2ull * 16 * (uint64_t)m.kv_dim * sizeof(float) + 512;
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  o.tier_bytes_limit[KVT_TIER_HOT] = (TOKENS / 16 + (uint64_t)m.c.n_layers + 4) * per;
  char *dir = tu_tmpdir();
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns;
  assert_int_equal(rm_ns_register(e, &m, 16, &ns), 0);
  rm_dec a, b;
  assert_int_equal(rm_dec_init(&a, &m, NULL, 0), 0);
  assert_int_equal(rm_dec_init(&b, &m, e, ns), 0);
  size_t V = (size_t)m.c.vocab_size;
  for (int i = 0; i < TOKENS; i++) {
    const float *la, *lb;
    assert_int_equal(rm_dec_step(&a, toks[i], &la), 0);
    rc = rm_dec_step(&b, toks[i], &lb);
    if (rc) fail_msg("position %d: %s", i, kvt_strerror(rc));
    if (memcmp(la, lb, V * sizeof *la)) fail_msg("logits differ at position %d", i);
  }
  kvt_stats st;
  tu_stats(e, &st);
  assert_true(st.evictions[KVT_TIER_HOT] > 0); /* blocks did leave RAM */
  assert_true(st.promotions > 0);              /* and came back for attention */
  assert_true(st.puts <= (uint64_t)(TOKENS / 16) * m.c.n_layers); /* each put once */
  rm_dec_free(&a);
  rm_dec_free(&b);
  kvt_engine_close(e);
  tu_rmtree(dir);
  rm_model_free(&m);
}

int main(void) {
  if (find_data()) {
    fprintf(stderr, "skipped: %s not found (set KVTIER_DATA)\n", model_path);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_small_hot_cold_bit_identical),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
