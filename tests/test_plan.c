/* test_plan.c - capacity planning. The metadata-only cold tier through the
 * public API; `kvtier plan` (the binary in $KVTIER_BIN) against simulations
 * written here, independently of the engine: a plain LRU cache on a small
 * generated trace, and the Mooncake trace's maximum prefix reuse with
 * unbounded capacity ($KVTIER_DATA, default $KVTIER_SRC/../shared/data;
 * skipped with the reason printed when absent); bad input. */
#include "testutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define BT 512u

/* ---- the metadata-only cold tier, through the public API ------------------ */

static kvt_engine *meta_open(uint64_t cold_blocks, int policy, const kvt_shape *sh) {
  kvt_options o;
  kvt_options_init(&o);
  o.flags = KVT_OPEN_METADATA_ONLY;
  o.tier_bytes_limit[KVT_TIER_HOT] = 0; /* no RAM tier: blocks go straight to cold */
  o.tier_bytes_limit[KVT_TIER_COLD] = cold_blocks * kvt_cold_record_bytes(sh);
  o.cold_evict = (uint32_t)policy;
  kvt_engine *e = NULL;
  assert_int_equal(kvt_engine_open(NULL, &o, &e), 0); /* no directory */
  return e;
}

static void put_chain(kvt_engine *e, kvt_ns_id ns, const kvt_shape *sh, uint32_t chain,
                      uint32_t n) {
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  static uint32_t tok[BT];
  kvt_kv kv = {.dtype = sh->dtype, .n_tokens = BT, .n_heads = sh->n_kv_heads,
               .head_dim = sh->head_dim};
  for (uint32_t b = 0; b < n; b++) {
    tok[0] = chain;
    tok[1] = b;
    kvt_append_info info;
    assert_int_equal(kvt_seq_append(s, tok, BT, &info), 0);
    if (!info.durable)
      for (uint32_t l = 0; l < sh->n_layers; l++) assert_int_equal(kvt_seq_put(s, b, l, &kv), 0);
  }
  kvt_seq_release(s);
}

static size_t found_of(kvt_engine *e, kvt_ns_id ns, uint32_t chain, uint32_t n) {
  static uint32_t toks[8 * BT];
  memset(toks, 0, sizeof toks);
  for (uint32_t b = 0; b < n; b++) {
    toks[b * BT] = chain;
    toks[b * BT + 1] = b;
  }
  kvt_lookup_entry ent[8];
  size_t found = 0;
  assert_int_equal(kvt_lookup(e, ns, toks, (size_t)n * BT, ent, 8, &found), 0);
  for (size_t i = 0; i < found && i < 8; i++) assert_int_equal(ent[i].tier, KVT_TIER_COLD);
  return found;
}

/* Room for 4 token blocks; chains of 3 and 2. CHAIN gives up the tail of
 * the first chain, so its prefix is still found; LRU gives up its head,
 * and nothing of it can be found any more. */
static void test_meta_cold_chain_vs_lru(void **state) {
  (void)state;
  kvt_shape sh = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 16, .dtype = KVT_F16,
                  .block_tokens = BT};
  for (int policy = 0; policy < 2; policy++) {
    kvt_engine *e = meta_open(4, policy, &sh);
    kvt_ns_id ns = tu_register(e, "plan-test", &sh);
    put_chain(e, ns, &sh, 1, 3);
    put_chain(e, ns, &sh, 2, 2);
    kvt_stats st;
    tu_stats(e, &st);
    assert_int_equal(st.cold_records, 4);
    assert_int_equal(st.evictions[KVT_TIER_COLD], 1);
    assert_int_equal(st.tier_bytes[KVT_TIER_HOT], 0);
    assert_int_equal(found_of(e, ns, 2, 2), 2);
    assert_int_equal(found_of(e, ns, 1, 3), policy == KVT_EVICT_CHAIN ? 2 : 0);
    kvt_engine_close(e);
  }
}

/* A directory is still required outside metadata-only mode, and a cold
 * tier smaller than one record refuses the write instead of failing. */
static void test_meta_open_rules(void **state) {
  (void)state;
  kvt_options o;
  kvt_options_init(&o);
  kvt_engine *e = NULL;
  assert_int_equal(kvt_engine_open(NULL, &o, &e), KVT_ENULL);
  o.flags = KVT_OPEN_METADATA_ONLY;
  o.cold_evict = 9;
  assert_int_equal(kvt_engine_open(NULL, &o, &e), KVT_EOPTION);
  kvt_shape sh = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 16, .dtype = KVT_F16,
                  .block_tokens = BT};
  assert_true(kvt_cold_record_bytes(&sh) >= 2 * 2 * BT * 16);
  e = meta_open(0, KVT_EVICT_CHAIN, &sh); /* 0: no cold tier at all */
  kvt_ns_id ns = tu_register(e, "plan-test", &sh);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  static uint32_t tok[BT];
  assert_int_equal(kvt_seq_append(s, tok, BT, NULL), 0);
  kvt_kv kv = {.dtype = KVT_F16, .n_tokens = BT, .n_heads = 1, .head_dim = 16};
  assert_int_equal(kvt_seq_put(s, 0, 0, &kv), KVT_EFULL); /* hot 0, no cold: nowhere */
  kvt_seq_release(s);
  kvt_engine_close(e);
}

/* ---- running kvtier plan ----------------------------------------------------- */

static const char *bin(void) {
  const char *b = getenv("KVTIER_BIN");
  if (!b) {
    print_message("KVTIER_BIN not set: run through ctest\n");
    skip();
  }
  return b;
}

/* Run cmd, capture stdout into a malloc'd string; *status its exit code
 * (-1 when it died of a signal). */
static char *run(const char *cmd, int *status) {
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t cap = 1 << 16, n = 0;
  char *out = malloc(cap);
  assert_non_null(out);
  size_t got;
  while ((got = fread(out + n, 1, cap - n - 1, p)) > 0) {
    n += got;
    if (cap - n < 4096) {
      out = realloc(out, cap *= 2);
      assert_non_null(out);
    }
  }
  out[n] = 0;
  int st = pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

/* The integer after "key": in the object that starts at the first
 * occurrence of section (or anywhere when section is NULL). */
static uint64_t json_u64_in(const char *json, const char *section, const char *key) {
  const char *p = section ? strstr(json, section) : json;
  assert_non_null(p);
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  p = strstr(p, pat);
  assert_non_null(p);
  return strtoull(p + strlen(pat), NULL, 10);
}

/* ---- an independent plain-LRU simulation ---------------------------------- */

typedef struct trace_req {
  uint32_t in_len, n;
  uint32_t ids[40];
} trace_req;

/* Chains that share prefixes: a few "system prompts", conversations that
 * come back longer, and one-off requests. */
static size_t gen_trace(trace_req *r, size_t n_req, const char *path) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  uint32_t next_id = 100;
  static uint32_t conv_ids[64][40], conv_len[64];
  memset(conv_len, 0, sizeof conv_len);
  for (size_t i = 0; i < n_req; i++) {
    trace_req *q = &r[i];
    uint32_t c = tu_below(64);
    if (conv_len[c] == 0 || conv_len[c] >= 36 || tu_below(5) == 0) { /* a new conversation */
      conv_len[c] = 1 + tu_below(6);
      conv_ids[c][0] = tu_below(3); /* one of three shared prompts */
      for (uint32_t b = 1; b < conv_len[c]; b++) conv_ids[c][b] = next_id++;
    } else { /* the next turn: the history plus a few new blocks */
      uint32_t more = 1 + tu_below(4);
      for (uint32_t b = 0; b < more; b++) conv_ids[c][conv_len[c] + b] = next_id++;
      conv_len[c] += more;
    }
    q->n = conv_len[c];
    memcpy(q->ids, conv_ids[c], q->n * sizeof *q->ids);
    q->in_len = (q->n - 1) * BT + 1 + tu_below(BT); /* the last block partial, mostly */
    fprintf(f, "{\"timestamp\": %zu, \"input_length\": %u, \"output_length\": 10, \"hash_ids\": [",
            i * 100, q->in_len);
    for (uint32_t b = 0; b < q->n; b++) fprintf(f, "%s%u", b ? ", " : "", q->ids[b]);
    fprintf(f, "]}\n");
  }
  fclose(f);
  return n_req;
}

/* LRU over block ids: an array ordered least recent first (small traces
 * only: every operation is linear). A request's leading run of stored
 * blocks is its hit; then every block of it is used (moved to the end)
 * or stored, evicting least recent first but never a block of the request
 * at hand; when only those are left, the block is not stored. */
static uint64_t lru_sim(const trace_req *r, size_t n_req, size_t cap, uint64_t *input) {
  uint32_t *lru = malloc((cap + 1) * sizeof *lru);
  size_t n = 0;
  uint64_t hit = 0;
  *input = 0;
  for (size_t i = 0; i < n_req; i++) {
    const trace_req *q = &r[i];
    *input += q->in_len;
    uint32_t k = 0;
    for (; k < q->n; k++) {
      size_t j = 0;
      while (j < n && lru[j] != q->ids[k]) j++;
      if (j == n) break;
    }
    uint64_t h = (uint64_t)k * BT;
    hit += h < q->in_len ? h : q->in_len;
    for (uint32_t b = 0; b < q->n; b++) {
      size_t j = 0;
      while (j < n && lru[j] != q->ids[b]) j++;
      if (j < n) { /* used: to the most recent end */
        memmove(lru + j, lru + j + 1, (n - j - 1) * sizeof *lru);
        lru[n - 1] = q->ids[b];
        continue;
      }
      if (n == cap) {
        size_t v = 0;
        for (; v < n; v++) {
          int mine = 0;
          for (uint32_t c = 0; c < q->n; c++) mine |= lru[v] == q->ids[c];
          if (!mine) break;
        }
        if (v == n) continue; /* all of it is this request's: not stored */
        memmove(lru + v, lru + v + 1, (n - v - 1) * sizeof *lru);
        n--;
      }
      lru[n++] = q->ids[b];
    }
  }
  free(lru);
  return hit;
}

static void test_replay_matches_lru_sim(void **state) {
  (void)state;
  const char *b = bin();
  char *dir = tu_tmpdir(), path[512], cmd[1024];
  snprintf(path, sizeof path, "%s/small.jsonl", dir);
  size_t n_req = 400;
  trace_req *r = calloc(n_req, sizeof *r);
  gen_trace(r, n_req, path);
  const size_t caps[] = {40, 90, 200, 100000};
  for (size_t c = 0; c < sizeof caps / sizeof *caps; c++) {
    uint64_t input, want = lru_sim(r, n_req, caps[c], &input);
    snprintf(cmd, sizeof cmd, "%s plan --model smollm2-1.7b --trace %s --policy lru --cold-tokens %zu --json",
             b, path, caps[c] * BT);
    int st;
    char *out = run(cmd, &st);
    assert_int_equal(st, 0);
    uint64_t got = json_u64_in(out, "\"lru\": {", "prefill_tokens_saved");
    uint64_t got_policy = json_u64_in(out, "\"replay\": {", "prefill_tokens_saved");
    print_message("capacity %zu blocks: LRU simulation %llu of %llu tokens, replay %llu\n", caps[c],
                  (unsigned long long)want, (unsigned long long)input, (unsigned long long)got);
    assert_int_equal(json_u64_in(out, NULL, "input_tokens"), input);
    assert_int_equal(got, want);
    assert_int_equal(got_policy, want); /* --policy lru: both engines are LRU */
    assert_true(want > 0);
    free(out);
  }
  free(r);
  tu_rmtree(dir);
}

/* ---- the Mooncake trace at unbounded capacity --------------------------------- */

/* The maximum prefix reuse of a Mooncake trace: each request hits the
 * leading run of its hash ids seen in any earlier request (capped at its
 * input length). Parsed by hand here, not with the planner's reader. */
static int max_reuse(const char *path, uint64_t *hit, uint64_t *input) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t cap = 1 << 20;
  uint8_t *seen = calloc(cap, 1);
  char *line = NULL;
  size_t lcap = 0;
  *hit = *input = 0;
  while (getline(&line, &lcap, f) > 0) {
    const char *in = strstr(line, "\"input_length\":"), *ids = strstr(line, "\"hash_ids\":");
    assert_non_null(in);
    assert_non_null(ids);
    uint64_t len = strtoull(in + 15, NULL, 10), k = 0;
    int leading = 1;
    const char *p = strchr(ids, '[') + 1;
    while (*p && *p != ']') {
      char *end;
      uint64_t id = strtoull(p, &end, 10);
      assert_true(end != p);
      if (id >= cap) {
        seen = realloc(seen, 2 * id);
        memset(seen + cap, 0, 2 * id - cap);
        cap = 2 * id;
      }
      if (leading && seen[id]) k++;
      else leading = 0;
      seen[id] = 1; /* after checking: a request does not hit itself */
      p = end;
      while (*p == ',' || *p == ' ') p++;
    }
    *input += len;
    *hit += k * BT < len ? k * BT : len;
  }
  free(line);
  free(seen);
  fclose(f);
  return 0;
}

static void test_mooncake_unbounded_is_max_reuse(void **state) {
  (void)state;
  const char *b = bin();
  char data[1024], path[1200], cmd[1600];
  if (getenv("KVTIER_DATA")) snprintf(data, sizeof data, "%s", getenv("KVTIER_DATA"));
  else snprintf(data, sizeof data, "%s/../shared/data", getenv("KVTIER_SRC") ? getenv("KVTIER_SRC") : ".");
  snprintf(path, sizeof path, "%s/traces/conversation_trace.jsonl", data);
  uint64_t hit = 0, input = 0;
  if (max_reuse(path, &hit, &input)) {
    print_message("skipped: %s not found (set KVTIER_DATA to the shared data directory)\n", path);
    skip();
  }
  print_message("maximum prefix reuse, computed here: %llu of %llu tokens = %.4f\n",
                (unsigned long long)hit, (unsigned long long)input, (double)hit / (double)input);
  snprintf(cmd, sizeof cmd, "%s plan --model llama-3.1-8b --trace %s --json", b, path);
  int st;
  char *out = run(cmd, &st);
  assert_int_equal(st, 0);
  assert_int_equal(json_u64_in(out, NULL, "input_tokens"), input);
  assert_int_equal(json_u64_in(out, "\"replay\": {", "prefill_tokens_saved"), hit);
  assert_int_equal(json_u64_in(out, "\"lru\": {", "prefill_tokens_saved"), hit);
  assert_int_equal(json_u64_in(out, "\"replay\": {", "cold_evictions"), 0);
  double rate = (double)hit / (double)input;
  assert_true(rate > 0.37 && rate < 0.38); /* the figure, about 0.374 */
  free(out);
}

/* ---- bad input: a message and a non-zero exit, never a crash --------------- */

static void expect_exit(const char *args, int want) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s plan %s 2>/dev/null", bin(), args);
  int st;
  char *out = run(cmd, &st);
  if (st != want) print_message("'%s' exited %d, wanted %d\n", args, st, want);
  assert_int_equal(st, want);
  free(out);
}

static void test_bad_input(void **state) {
  (void)state;
  char *dir = tu_tmpdir(), path[512], args[1024], cfg[512];
  expect_exit("--model no-such-model", 2);
  expect_exit("--model llama-3.1-8b --cold-tokens lots", 2);
  expect_exit("--model llama-3.1-8b --sweep --capacities 1M,,x", 2);
  expect_exit("--model llama-3.1-8b --nvme-read -1", 2);
  expect_exit("--model llama-3.1-8b --policy fifo", 2);
  expect_exit("--model llama-3.1-8b --bogus", 2);
  expect_exit("--model llama-3.1-8b --config x.json", 2);
  expect_exit("--model llama-3.1-8b --trace /no/such/file.jsonl", 1);
  const char *bad_lines[] = {
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\nnot json\n",
      "{\"timestamp\": 0, \"input_length\": -5, \"output_length\": 1, \"hash_ids\": [1]}\n",
      "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": []}\n",
      "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1, \"x\"]}\n",
      "{\"timestamp\": 9, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 3, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n",
      "[1, 2, 3]\n",
      "",
  };
  for (size_t i = 0; i < sizeof bad_lines / sizeof *bad_lines; i++) {
    snprintf(path, sizeof path, "%s/bad%zu.jsonl", dir, i);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(bad_lines[i], f);
    fclose(f);
    snprintf(args, sizeof args, "--model qwen2.5-7b --trace %s", path);
    expect_exit(args, 1);
  }
  snprintf(cfg, sizeof cfg, "%s/config.json", dir);
  FILE *f = fopen(cfg, "w");
  fputs("{\"num_hidden_layers\": 4, \"hidden_size\": 256}", f); /* no heads */
  fclose(f);
  snprintf(args, sizeof args, "--config %s --requests 10", cfg);
  expect_exit(args, 1);
  f = fopen(cfg, "w");
  fputs("{\"num_hidden_layers\": 4, \"hidden_size\": 256, \"num_attention_heads\": 4,"
        " \"num_key_value_heads\": 2, \"torch_dtype\": \"float16\"}", f);
  fclose(f);
  expect_exit(args, 0); /* a good config, a small synthetic workload */
  tu_rmtree(dir);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_meta_cold_chain_vs_lru),
      cmocka_unit_test(test_meta_open_rules),
      cmocka_unit_test(test_replay_matches_lru_sim),
      cmocka_unit_test(test_mooncake_unbounded_is_max_reuse),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
