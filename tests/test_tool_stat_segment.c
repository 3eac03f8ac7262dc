/* test_tool_stat_segment.c - `kvtier stat` reads the segment size from the
 * store: a store written with 1 MiB segments (not the 64 MiB default) must
 * report segment_bytes 1 MiB and a fill of live / (segments x 1 MiB);
 * and the learned models the writer's close kept, as the writer counted.
 * Needs $KVTIER_BIN (skips without it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

enum { SEG_MIB = 1, N_BLOCKS = 20 };

/* The number after "key": in a JSON text, or fail. */
static double json_num(const char *text, const char *key) {
  char pat[80];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(text, pat);
  if (!p) fail_msg("no \"%s\" in: %s", key, text);
  return strtod(p + strlen(pat), NULL);
}

static void test_stat_reads_segment_size(void **state) {
  (void)state;
  const char *bin = getenv("KVTIER_BIN");
  char *dir = tu_tmpdir();
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_COLD] = 64u << 20;
  o.cold_segment_bytes = (uint64_t)SEG_MIB << 20;
  kvt_engine *e = tu_open(dir, &o);
  kvt_shape sh = {.n_layers = 4, .n_kv_heads = 8, .head_dim = 64, .block_tokens = 16,
                  .dtype = KVT_F16};
  kvt_ns_id ns = tu_register(e, "stat-segment", &sh);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  uint32_t tokens[16];
  for (uint32_t b = 0; b < N_BLOCKS; b++) {
    for (uint32_t i = 0; i < 16; i++) tokens[i] = b * 16 + i;
    tu_append_put(s, &sh, tu_salt("stat-segment"), tokens, &kv);
  }
  kvt_seq_release(s);
  assert_int_equal(kvt_sync(e), 0);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_segment_bytes, (uint64_t)SEG_MIB << 20);
  assert_true(st.cold_segments >= 2);
  kvt_tier_stats hot, cold_t;
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_HOT, &hot, sizeof hot), 0);
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_COLD, &cold_t, sizeof cold_t), 0);
  assert_true(hot.model_accesses > 0 && cold_t.model_accesses > 0); /* the learned default */
  kvt_engine_close(e);
  tu_kv_free(&kv);

  char cmd[4200], out[16384];
  snprintf(cmd, sizeof cmd, "%s stat %s --json", bin, dir);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  assert_int_equal(pclose(p), 0);
  const char *cold = strstr(out, "\"cold\":{");
  assert_non_null(cold);
  double seg = json_num(cold, "segment_bytes"), segs = json_num(cold, "segments");
  double live = json_num(cold, "live_bytes"), fill = json_num(cold, "fill");
  print_message("stat: %.0f segments of %.0f bytes, %.0f live, fill %.4f\n", segs, seg, live, fill);
  assert_true(seg == (double)(SEG_MIB << 20));
  assert_true(segs >= 2 && live > 0);
  double want = live / (segs * seg);
  if (fill < want - 1e-6 || fill > want + 1e-6)
    fail_msg("fill %.6f, expected live / (segments x segment size) = %.6f", fill, want);
  assert_non_null(strstr(cold, "\"segment_bytes_source\":\"the store\""));
  assert_true(json_num(cold, "model_saved_accesses") == (double)cold_t.model_accesses);
  assert_true(json_num(cold, "hot_model_saved_accesses") == (double)hot.model_accesses);

  /* the human output names the same size */
  snprintf(cmd, sizeof cmd, "%s stat %s", bin, dir);
  p = popen(cmd, "r");
  assert_non_null(p);
  n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  assert_int_equal(pclose(p), 0);
  assert_non_null(strstr(out, "of 1.0 MiB: fill"));
  char models[160];
  snprintf(models, sizeof models, "cold tier %llu accesses counted, hot tier %llu\n",
           (unsigned long long)cold_t.model_accesses, (unsigned long long)hot.model_accesses);
  assert_non_null(strstr(out, models));
  tu_rmtree(dir);
}

int main(void) {
  const char *bin = getenv("KVTIER_BIN");
  if (!bin || access(bin, X_OK) != 0) {
    fprintf(stderr, "skipped: needs $KVTIER_BIN\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stat_reads_segment_size),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
