/* test_plan_fleet.c - the fleet mode of `kvtier plan` (tools/plan_fleet.c;
 * the binary in $KVTIER_BIN) on small traces written here: one node with no
 * remote tier is plain `kvtier plan`; an unbounded remote tier makes the
 * fleet one node of unbounded capacity (counted here, independently);
 * session routing keeps a conversation on one node; bad options refused. */
#include "testutil.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BT 512u
#define MAX_REQ 600
#define MAX_BLK 40

static int skipped;

typedef struct req {
  uint32_t in_len, n;
  uint32_t ids[MAX_BLK];
} req;

static req reqs[MAX_REQ];
static size_t n_reqs;

/* Conversations that come back longer, interleaved; every request at least
 * two blocks, the first full. shared: every request begins with block 7
 * (a system prompt all share); else each conversation has its own first
 * block. */
static void gen_trace(const char *path, size_t n_req, int shared)
{
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  static uint32_t conv[48][MAX_BLK], len[48];
  memset(len, 0, sizeof len);
  uint32_t next = 1000;
  for (size_t i = 0; i < n_req; i++) {
    uint32_t c = tu_below(48);
    if (len[c] == 0 || len[c] >= MAX_BLK - 4) { /* a new conversation */
      uint32_t b = 0;
      if (shared) conv[c][b++] = 7;
      len[c] = 2 + tu_below(4);
      for (; b < len[c]; b++) conv[c][b] = next++;
    } else { /* its next turn: the history and a few new blocks */
      uint32_t more = 1 + tu_below(3);
      for (uint32_t b = 0; b < more; b++) conv[c][len[c] + b] = next++;
      len[c] += more;
    }
    req *q = &reqs[i];
    q->n = len[c];
    memcpy(q->ids, conv[c], q->n * sizeof *q->ids);
    q->in_len = (q->n - 1) * BT + 1 + tu_below(BT);
    fprintf(f, "{\"timestamp\": %zu, \"input_length\": %u, \"output_length\": 5, \"hash_ids\": [",
            i * 250, q->in_len);
    for (uint32_t b = 0; b < q->n; b++) fprintf(f, "%s%u", b ? ", " : "", q->ids[b]);
    fprintf(f, "]}\n");
  }
  n_reqs = n_req;
  assert_int_equal(fclose(f), 0);
}

/* ---- an independent count: one node, unbounded -------------------------- */

/* A trie of the chains seen: node k is (parent, id); parent -1 for a root. */
static int64_t trie_parent[MAX_REQ * MAX_BLK];
static uint32_t trie_id[MAX_REQ * MAX_BLK];
static size_t trie_n;

static int64_t trie_find(int64_t parent, uint32_t id)
{
  for (size_t k = 0; k < trie_n; k++)
    if (trie_parent[k] == parent && trie_id[k] == id) return (int64_t)k;
  return -1;
}

/* Tokens hit by one node that keeps everything (each request's leading run
 * of chains seen before it), and the distinct blocks (*blocks). */
static uint64_t unbounded_hits(uint64_t *blocks)
{
  trie_n = 0;
  uint64_t hit = 0;
  for (size_t i = 0; i < n_reqs; i++) {
    const req *q = &reqs[i];
    int64_t at = -1;
    int run = 1;
    for (uint32_t b = 0; b < q->n; b++) {
      int64_t k = trie_find(at, q->ids[b]);
      if (k < 0) {
        run = 0;
        trie_parent[trie_n] = at;
        trie_id[trie_n] = q->ids[b];
        k = (int64_t)trie_n++;
      }
      if (run) hit += b + 1 < q->n ? BT : q->in_len - b * BT;
      at = k;
    }
  }
  *blocks = trie_n;
  return hit;
}

/* ---- running the command ------------------------------------------------- */

static const char *bin(void)
{
  const char *b = getenv("KVTIER_BIN");
  if (!b) {
    print_message("KVTIER_BIN not set: run through ctest\n");
    skipped = 1;
    skip();
  }
  return b ? b : "";
}

/* Run the command (stderr into stdout); its output, malloc'd; *status its
 * exit code (-1: killed by a signal). */
static char *run(int *status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *run(int *status, const char *fmt, ...)
{
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(cmd, sizeof cmd - 8, fmt, ap);
  va_end(ap);
  assert_true(len > 0 && len < (int)sizeof cmd - 8);
  strcat(cmd, " 2>&1");
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t cap = 1 << 16, n = 0, got;
  char *out = malloc(cap);
  assert_non_null(out);
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

/* The text of member key in row `row` of the fleet JSON, up to the next
 * comma or brace (an array: up to its end, unclosed). */
static const char *member(const char *json, int row, const char *key, char *buf, size_t len)
{
  const char *p = json;
  for (int r = 0; r <= row; r++) {
    p = strstr(r ? p + 1 : p, "{\"route\"");
    assert_non_null(p);
  }
  char pat[80];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  p = strstr(p, pat);
  if (!p) print_error("no %s in:\n%s\n", key, json);
  assert_non_null(p);
  p += strlen(pat);
  size_t n = *p == '[' ? strcspn(p, "]") : strcspn(p, ",}"); /* an array: all of it */
  assert_true(n < len);
  memcpy(buf, p, n);
  buf[n] = 0;
  return buf;
}

static uint64_t member_u64(const char *json, int row, const char *key)
{
  char b[64];
  return strtoull(member(json, row, key, b, sizeof b), NULL, 10);
}

static double member_f(const char *json, int row, const char *key)
{
  char b[64];
  return strtod(member(json, row, key, b, sizeof b), NULL);
}

/* ---- the cases -------------------------------------------------------------- */

/* One node without a remote tier is the node alone: fleet and local-only
 * equal, nothing from the remote, no traffic; and both equal plain
 * `kvtier plan` on the same trace and capacity. */
static void test_one_node_no_remote(void **state)
{
  (void)state;
  const char *b = bin();
  gen_trace("fleet1.jsonl", 500, 1);
  int st;
  char *out = run(&st, "%s plan --fleet 1 --model llama-3.1-8b --trace fleet1.jsonl --cold-tokens 20K "
                       "--remote-tokens 0 --route rr --policy chain --json", b);
  assert_int_equal(st, 0);
  char *one = run(&st, "%s plan --model llama-3.1-8b --trace fleet1.jsonl --cold-tokens 20K "
                       "--policy chain --json", b);
  assert_int_equal(st, 0);
  uint64_t lo = member_u64(out, 0, "local_only_hit_tokens");
  assert_true(lo > 0);
  assert_int_equal(member_u64(out, 0, "fleet_hit_tokens"), lo);
  assert_true(member_f(out, 0, "from_remote") == 0);
  assert_true(member_f(out, 0, "remote_gbps_mean") == 0);
  const char *rp = strstr(one, "\"replay\"");
  assert_non_null(rp);
  char pat[64];
  snprintf(pat, sizeof pat, "\"prefill_tokens_saved\": %llu,", (unsigned long long)lo);
  if (!strstr(rp, pat)) print_error("plan: %.300s\nfleet: %llu\n", rp, (unsigned long long)lo);
  assert_non_null(strstr(rp, pat));
  free(out);
  free(one);
}

/* An unbounded remote tier holds every block once computed: the fleet hits
 * what one node of unbounded capacity over every request would, however
 * small the nodes; each distinct block is written once; the traffic is
 * (hits + writes) * value bytes over the trace's duration. */
static void test_unbounded_remote_is_one_node(void **state)
{
  (void)state;
  const char *b = bin();
  gen_trace("fleet2.jsonl", 500, 1);
  uint64_t distinct;
  uint64_t expect = unbounded_hits(&distinct);
  int st;
  char *out = run(&st, "%s plan --fleet 4 --model llama-3.1-8b --trace fleet2.jsonl --cold-tokens 4K "
                       "--remote-tokens inf --route rr --json", b);
  assert_int_equal(st, 0);
  uint64_t got = member_u64(out, 0, "fleet_hit_tokens");
  if (got != expect) print_error("fleet %llu, one unbounded node %llu\n", (unsigned long long)got,
                                 (unsigned long long)expect);
  assert_int_equal(got, expect);
  assert_true(member_u64(out, 0, "local_only_hit_tokens") < expect); /* the remote tier matters */
  assert_int_equal(member_u64(out, 0, "remote_write_blocks"), distinct);
  assert_int_equal(member_u64(out, 0, "remote_held_blocks"), distinct);
  double value = (double)strtoull(strstr(out, "\"remote_value_bytes\": ") + 22, NULL, 10);
  double dur = strtod(strstr(out, "\"duration_s\": ") + 14, NULL);
  double moved = (double)(member_u64(out, 0, "remote_hit_blocks") + distinct) * value;
  assert_float_equal(member_f(out, 0, "remote_gbps_mean"), moved / dur / 1e9, 2e-6);
  free(out);
}

/* Session routing keeps every turn of a conversation on one node: with
 * unbounded local tiers and no remote, the nodes together hit what one
 * node would (less the shared first block once per further node used);
 * round-robin loses the turns that land elsewhere. */
static void check_session(int shared)
{
  const char *b = bin();
  gen_trace("fleet3.jsonl", 500, shared);
  uint64_t distinct;
  uint64_t one = unbounded_hits(&distinct);
  int st;
  char *out = run(&st, "%s plan --fleet 4 --model llama-3.1-8b --trace fleet3.jsonl --cold-tokens inf "
                       "--remote-tokens 0 --route both --json", b);
  assert_int_equal(st, 0);
  int used = 0;
  char buf[128];
  member(out, 1, "node_requests", buf, sizeof buf); /* row 1: session */
  for (char *p = buf + 1; *p;) {
    char *end;
    used += strtoull(p, &end, 10) > 0;
    p = *end ? end + 1 : end;
  }
  assert_true(used > 1);
  uint64_t expect = one - (shared ? (uint64_t)(used - 1) * BT : 0);
  uint64_t got = member_u64(out, 1, "local_only_hit_tokens");
  if (got != expect) print_error("session %llu, expected %llu (%d nodes)\n%s\n",
                                 (unsigned long long)got, (unsigned long long)expect, used, out);
  assert_int_equal(got, expect);
  assert_true(member_u64(out, 0, "local_only_hit_tokens") < expect); /* row 0: rr */
  free(out);
}

static void test_session_keeps_conversations(void **state)
{
  (void)state;
  check_session(0);
}

static void test_session_skips_shared_prompt(void **state)
{
  (void)state;
  check_session(1);
}

static void test_bad_options(void **state)
{
  (void)state;
  const char *b = bin();
  gen_trace("fleet4.jsonl", 20, 1);
  static const struct {
    const char *args, *says;
  } bad[] = {
      {"--fleet 0 --trace fleet4.jsonl", "--fleet"},
      {"--fleet 257 --trace fleet4.jsonl", "--fleet"},
      {"--fleet x --trace fleet4.jsonl", "--fleet"},
      {"--fleet 4", "--trace"},
      {"--fleet 4 --trace fleet4.jsonl --route nearest", "--route"},
      {"--fleet 4 --trace fleet4.jsonl --remote-tokens 100", "--remote-tokens"},
      {"--fleet 4 --trace fleet4.jsonl --remote-tokens 1M,1M", "--remote-tokens"},
      {"--fleet 4 --trace fleet4.jsonl --cold-tokens 0", "--cold-tokens"},
      {"--fleet 4 --trace fleet4.jsonl --hot -1", "--hot"},
      {"--fleet 4 --trace fleet4.jsonl --policy belady", "--policy"},
      {"--fleet 4 --trace fleet4.jsonl --sweep", "--sweep"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int st;
    char *out = run(&st, "%s plan --model llama-3.1-8b %s", b, bad[i].args);
    if (st != 2 || !strstr(out, bad[i].says))
      print_error("'%s': status %d, output:\n%s\n", bad[i].args, st, out);
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, bad[i].says));
    free(out);
  }
  int st; /* a trace that does not exist: a failure, not a usage error */
  char *out = run(&st, "%s plan --fleet 2 --model llama-3.1-8b --trace no-such.jsonl", b);
  assert_int_equal(st, 1);
  assert_non_null(strstr(out, "no-such.jsonl"));
  free(out);
}

int main(void)
{
  char dir[] = "/tmp/kvt_fleet_XXXXXX";
  if (!mkdtemp(dir) || chdir(dir)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_node_no_remote),
      cmocka_unit_test(test_unbounded_remote_is_one_node),
      cmocka_unit_test(test_session_keeps_conversations),
      cmocka_unit_test(test_session_skips_shared_prompt),
      cmocka_unit_test(test_bad_options),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  const char *files[] = {"fleet1.jsonl", "fleet2.jsonl", "fleet3.jsonl", "fleet4.jsonl"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) unlink(files[i]);
  if (chdir("/") == 0) rmdir(dir);
  return rc ? rc : skipped ? 77 : 0;
}
