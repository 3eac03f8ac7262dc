/* test_metrics.c - kvt_metrics_render(): the Prometheus text of a live
 * engine with a cold tier (group commits, cold reads through loads and
 * synchronous reads, lookups that hit each tier) and of `kvtier stat
 * --prometheus` on a demo's store, each checked by tests/prom_check.h and,
 * when promtool is installed, by `promtool check metrics`; the figures
 * against what the test did; the buffer contract (size query, too small:
 * nothing partial); and the checker itself refusing broken texts. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "conv_trace.h"
#include "prom_check.h"

#define N_BLOCKS 6u

/* The value of the series written exactly as `series` (name and labels). */
static double metric(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
  fail_msg("no series %s in the text", series);
  return -1;
}

static void assert_valid(const char *text) {
  pc_state *s = malloc(sizeof *s);
  assert_non_null(s);
  int rc = pc_check(s, text);
  if (rc) print_message("checker: %s\n", s->err);
  assert_int_equal(rc, 0);
  assert_true(s->samples > 50);
  free(s);
}

/* promtool check metrics on text, when promtool is installed: 1 it ran
 * and passed, 0 not installed; fails the test when it refuses the text. */
static int promtool_passes(const char *text) {
  if (system("command -v promtool >/dev/null 2>&1") != 0) return 0;
  char *dir = tu_tmpdir(), path[4200], cmd[8600];
  snprintf(path, sizeof path, "%s/metrics.txt", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
  snprintf(cmd, sizeof cmd, "promtool check metrics < '%s' 2>&1", path);
  int st = system(cmd);
  tu_rmtree(dir);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  return 1;
}

static char *render(kvt_engine *e) {
  size_t need = 0;
  assert_int_equal(kvt_metrics_render(e, NULL, 0, &need), KVT_EBUFSIZE);
  char *buf = malloc(need + 4096);
  assert_non_null(buf);
  assert_int_equal(kvt_metrics_render(e, buf, need + 4096, &need), 0);
  assert_int_equal(strlen(buf), need);
  return buf;
}

static void opts_cold(kvt_options *o) {
  tu_opts(o);
  o->tier_bytes_limit[KVT_TIER_COLD] = 64ull << 20;
  o->cold_segment_bytes = 4ull << 20;
}

/* A writer stores N_BLOCKS durably; a second engine finds them in the
 * cold tier by lookup, loads one layer of each and reads one synchronously. */
static void test_render_live(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  opts_cold(&o);
  kvt_shape sh = tu_shape_small(KVT_F16);
  assert_int_equal(sh.block_tokens, 4); /* the token arrays below */
  uint64_t salt = tu_salt("metrics");
  uint32_t toks[N_BLOCKS * 4];
  for (uint32_t i = 0; i < N_BLOCKS * sh.block_tokens; i++) toks[i] = 100 + i;
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);

  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "metrics", &sh);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  for (uint32_t b = 0; b < N_BLOCKS; b++)
    tu_append_put(s, &sh, salt, toks + b * sh.block_tokens, &kv);
  assert_int_equal(kvt_sync(e), 0);
  size_t found = 0;
  assert_int_equal(kvt_lookup(e, ns, toks, N_BLOCKS * sh.block_tokens, NULL, 0, &found), 0);
  assert_int_equal(found, N_BLOCKS);
  char *t1 = render(e);
  assert_valid(t1);
  int promtool = promtool_passes(t1);
  assert_true(metric(t1, "kvtier_tier_puts_total{tier=\"hot\"}") == N_BLOCKS * sh.n_layers);
  assert_true(metric(t1, "kvtier_tier_puts_total{tier=\"cold\"}") == N_BLOCKS);
  assert_true(metric(t1, "kvtier_tier_hits_total{tier=\"hot\"}") == N_BLOCKS);
  assert_true(metric(t1, "kvtier_tier_misses_total{tier=\"hot\"}") == 0);
  assert_true(metric(t1, "kvtier_tier_blocks{tier=\"cold\"}") == N_BLOCKS);
  assert_true(metric(t1, "kvtier_cold_group_commit_seconds_count") >= 1);
  assert_true(metric(t1, "kvtier_cold_group_commit_seconds_sum") > 0);
  assert_true(metric(t1, "kvtier_durable_pending_blocks") == 0);
  assert_true(metric(t1, "kvtier_durable_lag_blocks") == 0); /* all synced */
  assert_true(metric(t1, "kvtier_sequences") == 1);
  /* the learned default's models: counted, none kept yet (a new store) */
  double cold_model = metric(t1, "kvtier_tier_model_accesses{tier=\"cold\"}");
  double hot_model = metric(t1, "kvtier_tier_model_accesses{tier=\"hot\"}");
  assert_true(cold_model == N_BLOCKS); /* one access a token block written */
  assert_true(hot_model >= N_BLOCKS);  /* its writes, and the lookup */
  assert_true(metric(t1, "kvtier_tier_model_accesses{tier=\"warm\"}") == 0);
  assert_true(metric(t1, "kvtier_tier_model_saved_accesses{tier=\"cold\"}") == 0);
  assert_true(metric(t1, "kvtier_tier_model_saved_accesses{tier=\"hot\"}") == 0);
  free(t1);
  kvt_seq_release(s);
  kvt_engine_close(e);

  e = tu_open(dir, &o);
  ns = tu_register(e, "metrics", &sh);
  kvt_lookup_entry ent[N_BLOCKS];
  /* one block more than stored: a miss past every tier */
  uint32_t more[(N_BLOCKS + 1) * 4];
  memcpy(more, toks, sizeof toks);
  for (uint32_t i = 0; i < sh.block_tokens; i++) more[N_BLOCKS * sh.block_tokens + i] = 7;
  assert_int_equal(
      kvt_lookup(e, ns, more, (N_BLOCKS + 1) * sh.block_tokens, ent, N_BLOCKS, &found), 0);
  assert_int_equal(found, N_BLOCKS);
  kvt_load_req req[N_BLOCKS];
  uint8_t *bufs = malloc(2 * N_BLOCKS * kv.bytes);
  assert_non_null(bufs);
  for (uint32_t b = 0; b < N_BLOCKS; b++)
    req[b] = (kvt_load_req){.key = ent[b].key, .layer = 1, .k_out = bufs + 2 * b * kv.bytes,
                            .v_out = bufs + (2 * b + 1) * kv.bytes, .bytes_each = kv.bytes};
  kvt_load *ld;
  assert_int_equal(kvt_load_submit(e, ns, req, N_BLOCKS, &ld), 0);
  size_t ok = 0;
  assert_int_equal(kvt_load_wait(ld, &ok), 0);
  assert_int_equal(ok, N_BLOCKS);
  char *t_mid = render(e);
  double loaded = metric(t_mid, "kvtier_cold_read_seconds_count"); /* merged reads count once */
  assert_true(loaded >= 1 && loaded <= N_BLOCKS);
  free(t_mid);
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  kvt_append_info ai;
  assert_int_equal(kvt_seq_append(s, toks, sh.block_tokens, &ai), 0);
  assert_int_equal(ai.durable, 1);
  assert_int_equal(kvt_seq_read(s, 0, 2, kv.k, kv.v, kv.bytes), 0); /* synchronous cold read */
  char *t2 = render(e);
  assert_valid(t2);
  promtool_passes(t2);
  assert_true(metric(t2, "kvtier_tier_hits_total{tier=\"cold\"}") == N_BLOCKS);
  assert_true(metric(t2, "kvtier_tier_hits_total{tier=\"hot\"}") == 0);
  assert_true(metric(t2, "kvtier_tier_misses_total{tier=\"hot\"}") == N_BLOCKS + 1);
  assert_true(metric(t2, "kvtier_tier_misses_total{tier=\"warm\"}") == N_BLOCKS + 1);
  assert_true(metric(t2, "kvtier_tier_misses_total{tier=\"cold\"}") == 1);
  assert_true(metric(t2, "kvtier_tier_reads_total{tier=\"cold\"}") == N_BLOCKS + 1);
  double reads = metric(t2, "kvtier_cold_read_seconds_count"); /* the synchronous read too */
  assert_true(reads == loaded + 1);
  assert_true(metric(t2, "kvtier_cold_read_seconds_bucket{le=\"+Inf\"}") == reads);
  assert_true(metric(t2, "kvtier_cold_group_commit_seconds_count") == 0); /* this engine's own */
  assert_true(metric(t2, "kvtier_durable_lag_blocks") == 0);             /* appended durable */
  /* the writer's close kept both models: this engine started from them */
  assert_true(metric(t2, "kvtier_tier_model_saved_accesses{tier=\"cold\"}") == cold_model);
  assert_true(metric(t2, "kvtier_tier_model_saved_accesses{tier=\"hot\"}") >= hot_model);
  assert_true(metric(t2, "kvtier_tier_model_accesses{tier=\"cold\"}") >= cold_model);
  print_message("rendered %zu bytes; promtool %s\n", strlen(t2),
                promtool ? "passed" : "not installed");
  free(t2);
  free(bufs);
  kvt_seq_release(s);
  kvt_engine_close(e);
  tu_kv_free(&kv);
  tu_rmtree(dir);
}

/* Size query, a buffer one byte short (nothing partial), one that fits. */
static void test_buffer_contract(void **state) {
  (void)state;
  kvt_options o;
  tu_opts(&o);
  char *dir = tu_tmpdir();
  kvt_engine *e = tu_open(dir, &o);
  size_t need = 0;
  assert_int_equal(kvt_metrics_render(NULL, NULL, 0, &need), KVT_ENULL);
  assert_int_equal(kvt_metrics_render(e, NULL, 10, &need), KVT_ENULL);
  assert_int_equal(kvt_metrics_render(e, NULL, 0, NULL), KVT_EBUFSIZE);
  assert_int_equal(kvt_metrics_render(e, NULL, 0, &need), KVT_EBUFSIZE);
  assert_true(need > 1000);
  char *buf = malloc(need + 1);
  assert_non_null(buf);
  memset(buf, 'x', need + 1);
  size_t need2 = 0;
  assert_int_equal(kvt_metrics_render(e, buf, need, &need2), KVT_EBUFSIZE);
  assert_int_equal(need2, need);
  assert_int_equal(buf[0], '\0');
  assert_int_equal(kvt_metrics_render(e, buf, need + 1, &need2), 0);
  assert_int_equal(strlen(buf), need);
  assert_valid(buf);
  /* no cold tier here: the backend says so, the histograms are empty */
  assert_non_null(strstr(buf, "io_backend=\"none\""));
  assert_true(metric(buf, "kvtier_cold_read_seconds_count") == 0);
  free(buf);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* `kvtier stat --prometheus` on the store `kvtier demo` leaves. */
static void test_stat_on_demo_store(void **state) {
  (void)state;
  const char *bin = getenv("KVTIER_BIN");
  if (!bin) {
    print_message("skipped: needs $KVTIER_BIN (run through ctest)\n");
    tu_skip_mark();
    skip();
  }
  char *dir = tu_tmpdir(), cmd[8600];
  snprintf(cmd, sizeof cmd, "'%s' demo --dir '%s/store' --agents 2 >/dev/null 2>&1", bin, dir);
  assert_int_equal(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "'%s' stat '%s/store' --prometheus", bin, dir);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t cap = 1 << 20, n = 0;
  char *text = malloc(cap);
  assert_non_null(text);
  n = fread(text, 1, cap - 1, p);
  text[n] = '\0';
  int st = pclose(p);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_valid(text);
  promtool_passes(text);
  assert_true(metric(text, "kvtier_tier_blocks{tier=\"cold\"}") > 0);
  assert_true(metric(text, "kvtier_tier_bytes{tier=\"cold\"}") > 0);
  assert_true(metric(text, "kvtier_cold_segments") > 0);
  /* --json and --prometheus together: a usage error */
  snprintf(cmd, sizeof cmd, "'%s' stat '%s/store' --prometheus --json >/dev/null 2>&1", bin, dir);
  st = system(cmd);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
  free(text);
  tu_rmtree(dir);
}

/* The cold tier's admission declines: a metadata-only engine under the
 * learned order, its cold tier full at 100 token blocks, replays the
 * conversation trace; the counter is kvt_tier_stats.declined, and some
 * writes were declined. */
static void test_admission_declines(void **state) {
  (void)state;
  static const kvt_shape sh = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 16,
                               .dtype = KVT_F16, .block_tokens = 16};
  kvt_ns_id ns;
  kvt_engine *e = ct_open_cold(&sh, 100, KVT_EVICT_LEARNED, "declines", &ns);
  char *t0 = render(e);
  assert_true(metric(t0, "kvtier_cold_admission_declines_total") == 0);
  free(t0);
  static ct_req reqs[800];
  static uint32_t tok[CT_MAX_BLK * 16];
  ct_make_trace(reqs, 800, 31);
  for (size_t i = 0; i < 800; i++) {
    ct_tokens(&reqs[i], sh.block_tokens, tok);
    ct_append_put(e, ns, &sh, tok, reqs[i].n, 1);
  }
  kvt_tier_stats ts;
  assert_int_equal(kvt_stats_tier(e, KVT_TIER_COLD, &ts, sizeof ts), 0);
  char *t1 = render(e);
  assert_valid(t1);
  promtool_passes(t1);
  double d = metric(t1, "kvtier_cold_admission_declines_total");
  print_message("admission declines %.0f (kvt_tier_stats %llu)\n", d,
                (unsigned long long)ts.declined);
  assert_true(ts.declined > 0);
  assert_true(d == (double)ts.declined);
  free(t1);
  kvt_engine_close(e);
}

/* The checker is only worth something if it refuses what is broken. */
static void test_checker_refuses(void **state) {
  (void)state;
  static const char *const good =
      "# HELP a_total A.\n# TYPE a_total counter\na_total{tier=\"hot\"} 1\n"
      "# HELP h_seconds H.\n# TYPE h_seconds histogram\n"
      "h_seconds_bucket{le=\"0.1\"} 1\nh_seconds_bucket{le=\"+Inf\"} 2\n"
      "h_seconds_sum 0.3\nh_seconds_count 2\n";
  static const struct { const char *text, *why; } bad[] = {
      {"a_total 1\n# HELP a_total A.\n# TYPE a_total counter\n", "sample before TYPE"},
      {"# HELP a_total A.\n# TYPE a_total counter\na_total 1\na_total 2\n", "series twice"},
      {"# HELP a A.\n# TYPE a counter\na 1\n", "counter without _total"},
      {"# HELP a_total A.\n# TYPE a_total counter\na_total -1\n", "negative counter"},
      {"# HELP a_total A.\n# TYPE a_total counter\na_total 1", "no final newline"},
      {"# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1} 1\n", "unterminated label"},
      {"# HELP a_total A.\n# TYPE a_total counter\na_total one\n", "bad value"},
      {"# HELP g G.\n# TYPE g gauge\n# HELP b B.\n# TYPE b gauge\ng 1\nb 1\ng{x=\"y\"} 2\n",
       "family split"},
      {"# TYPE g gauge\ng 1\n", "no HELP"},
      {"# HELP h_seconds H.\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"0.1\"} 2\n"
       "h_seconds_bucket{le=\"+Inf\"} 1\nh_seconds_sum 0\nh_seconds_count 1\n", "bucket decreases"},
      {"# HELP h_seconds H.\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"0.1\"} 1\n"
       "h_seconds_bucket{le=\"+Inf\"} 2\nh_seconds_sum 0\nh_seconds_count 3\n", "+Inf != count"},
      {"# HELP h_seconds H.\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"0.1\"} 1\n"
       "h_seconds_sum 0\nh_seconds_count 1\n", "no +Inf bucket"},
      {"# HELP h_seconds H.\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"0.2\"} 1\n"
       "h_seconds_bucket{le=\"0.1\"} 1\nh_seconds_bucket{le=\"+Inf\"} 1\nh_seconds_sum 0\n"
       "h_seconds_count 1\n", "le not increasing"},
  };
  pc_state *s = malloc(sizeof *s);
  assert_non_null(s);
  assert_int_equal(pc_check(s, good), 0);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (pc_check(s, bad[i].text) == 0) fail_msg("the checker accepted: %s", bad[i].why);
  }
  free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_checker_refuses),
      cmocka_unit_test(test_buffer_contract),
      cmocka_unit_test(test_render_live),
      cmocka_unit_test(test_stat_on_demo_store),
      cmocka_unit_test(test_admission_declines),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
