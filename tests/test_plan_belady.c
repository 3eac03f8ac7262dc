/* test_plan_belady.c - the offline optimum of `kvtier plan` (tools/plan_belady.c):
 * MIN against an exhaustive search over every admission and eviction choice
 * on tiny random traces, against an independent count at unbounded
 * capacity, and the figures `kvtier plan` prints ($KVTIER_BIN) against a
 * direct replay of the same synthetic workload. */
#include "testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "plan_belady.h"

#define BT PLAN_BLOCK_TOKENS
#define MAX_ACC 14
#define MAX_BLK 10

static int skipped;

/* ---- traces made by hand ---------------------------------------------------- */

/* An empty trace with room for n_req requests and n_ids ids. */
static void trace_init(plan_trace *t, size_t n_req, size_t n_ids)
{
  memset(t, 0, sizeof *t);
  t->reqs = calloc(n_req ? n_req : 1, sizeof *t->reqs);
  t->ids = calloc(n_ids ? n_ids : 1, sizeof *t->ids);
  assert_non_null(t->reqs);
  assert_non_null(t->ids);
  t->cap = n_req;
  t->cap_ids = n_ids;
}

/* Append a request of n ids and in_len input tokens. */
static void trace_add(plan_trace *t, const uint64_t *ids, uint32_t n, uint32_t in_len)
{
  assert_true(t->n < t->cap && t->n_ids + n <= t->cap_ids);
  t->reqs[t->n++] = (plan_req){.t_ms = (double)t->n, .input_len = in_len, .n_blocks = n,
                               .first = t->n_ids};
  memcpy(t->ids + t->n_ids, ids, n * sizeof *ids);
  t->n_ids += n;
  t->input_tokens += in_len;
  if (n > t->max_blocks) t->max_blocks = n;
}

static plan_belady_stats min_of(const plan_trace *t, uint64_t cap)
{
  plan_future *f = NULL;
  assert_int_equal(plan_future_build(t, &f), 0);
  plan_belady_stats st;
  assert_int_equal(plan_belady_replay(t, f, cap, &st), 0);
  plan_future_free(f);
  return st;
}

/* ---- the exhaustive search ---------------------------------------------------- */

/* A tiny trace as the search sees it: per access its block (0..MAX_BLK-1)
 * and, at a request's first access, the blocks of that request. */
typedef struct tiny {
  uint32_t n, blk[MAX_ACC];
  int start[MAX_ACC];      /* the request starting here, else -1 */
  uint32_t req_first[MAX_ACC], req_n[MAX_ACC];
  uint32_t cap;
  int prefix;              /* 0: count block hits; 1: leading runs at lookup */
  int16_t memo[MAX_ACC + 1][1u << MAX_BLK];
} tiny;

static uint32_t lead(const tiny *y, int r, uint32_t mask)
{
  uint32_t k = 0;
  while (k < y->req_n[r] && (mask >> y->blk[y->req_first[r] + k] & 1)) k++;
  return k;
}

/* The most hits from access pos on with mask stored, over every choice at
 * every miss: bypass, take a free place, or give up any stored block. */
static int best(tiny *y, uint32_t pos, uint32_t mask)
{
  if (pos == y->n) return 0;
  if (y->memo[pos][mask] >= 0) return y->memo[pos][mask];
  int add = y->prefix && y->start[pos] >= 0 ? (int)lead(y, y->start[pos], mask) : 0;
  uint32_t b = 1u << y->blk[pos];
  int r;
  if (mask & b) {
    r = (y->prefix ? 0 : 1) + best(y, pos + 1, mask);
  } else {
    r = best(y, pos + 1, mask); /* bypass */
    if ((uint32_t)__builtin_popcount(mask) < y->cap) {
      int v = best(y, pos + 1, mask | b);
      if (v > r) r = v;
    } else {
      for (uint32_t s = 0; s < MAX_BLK; s++) {
        if (!(mask >> s & 1)) continue;
        int v = best(y, pos + 1, (mask & ~(1u << s)) | b);
        if (v > r) r = v;
      }
    }
  }
  y->memo[pos][mask] = (int16_t)(add + r);
  return add + r;
}

static int optimum(tiny *y, uint32_t cap, int prefix)
{
  y->cap = cap;
  y->prefix = prefix;
  memset(y->memo, 0xff, sizeof y->memo);
  return best(y, 0, 0);
}

/* The search's view of t, whose ids are 100 + block. */
static void tiny_of(const plan_trace *t, tiny *y)
{
  memset(y, 0, sizeof *y);
  for (uint32_t i = 0; i < MAX_ACC; i++) y->start[i] = -1;
  for (size_t r = 0; r < t->n; r++) {
    const plan_req *q = &t->reqs[r];
    y->start[q->first] = (int)r;
    y->req_first[r] = (uint32_t)q->first;
    y->req_n[r] = q->n_blocks;
  }
  y->n = (uint32_t)t->n_ids;
  for (uint32_t i = 0; i < y->n; i++) {
    assert_true(t->ids[i] >= 100 && t->ids[i] < 100 + MAX_BLK);
    y->blk[i] = (uint32_t)(t->ids[i] - 100);
  }
}

/* Random single-block requests: any access order of 6-10 blocks. */
static void gen_flat(plan_trace *t)
{
  uint32_t k = 6 + tu_below(5), n = 10 + tu_below(5);
  trace_init(t, n, n);
  for (uint32_t i = 0; i < n; i++) {
    uint64_t id = 100 + tu_below(k);
    trace_add(t, &id, 1, BT);
  }
}

/* Requests that are root paths of a random tree of 6-10 blocks (each id
 * one block, as in the Mooncake traces), 10-14 accesses in all. */
static void gen_tree(plan_trace *t)
{
  uint32_t k = 6 + tu_below(5), n = 10 + tu_below(5), parent[MAX_BLK];
  for (uint32_t j = 0; j < k; j++) parent[j] = j == 0 || tu_below(4) == 0 ? UINT32_MAX : tu_below(j);
  trace_init(t, n, n);
  while (t->n_ids < n) {
    uint64_t path[MAX_BLK];
    uint32_t len = 0;
    for (uint32_t j = tu_below(k); j != UINT32_MAX; j = parent[j]) path[len++] = j;
    uint64_t ids[MAX_BLK];
    for (uint32_t i = 0; i < len; i++) ids[i] = 100 + path[len - 1 - i]; /* root first */
    if (len > n - t->n_ids) len = (uint32_t)(n - t->n_ids); /* a shorter root path */
    trace_add(t, ids, len, len * BT);
  }
}

/* MIN reaches the most block hits any choice of admissions and evictions
 * reaches, at every capacity from 1 to 4 blocks. On tree traces its hits
 * are leading runs, so it also reaches the most prefix hits. */
static void check_against_search(void (*gen)(plan_trace *), int tree, int trials)
{
  static tiny y;
  for (int i = 0; i < trials; i++) {
    plan_trace t;
    gen(&t);
    tiny_of(&t, &y);
    for (uint32_t cap = 1; cap <= 4; cap++) {
      plan_belady_stats st = min_of(&t, cap);
      int want = optimum(&y, cap, 0);
      if ((int)st.block_hits != want) {
        print_message("trial %d, capacity %u: MIN %llu block hits, the search %d; requests:", i,
                      cap, (unsigned long long)st.block_hits, want);
        for (size_t r = 0; r < t.n; r++)
          for (uint32_t k = 0; k < t.reqs[r].n_blocks; k++)
            print_message("%s%u", k ? " " : " | ", y.blk[t.reqs[r].first + k]);
        print_message("\n");
      }
      assert_int_equal(st.block_hits, want);
      assert_int_equal(st.accesses, t.n_ids);
      assert_int_equal(st.hit_tokens, st.hit_blocks * BT);
      if (tree) {
        assert_int_equal(st.hit_blocks, st.block_hits);
        assert_int_equal(st.hit_blocks, optimum(&y, cap, 1));
      }
    }
    plan_trace_free(&t);
  }
}

static void test_min_flat_is_optimal(void **state)
{
  (void)state;
  check_against_search(gen_flat, 0, 400);
}

static void test_min_tree_is_optimal(void **state)
{
  (void)state;
  check_against_search(gen_tree, 1, 400);
}

/* The search itself, on a case worked by hand: blocks a b c a b c with
 * room for 2: MIN keeps a and b at the first c (c is next used last, so it
 * is bypassed), hits a and b, and then gets c only if it had kept it: 2
 * hits. LRU would get none. */
static void test_search_by_hand(void **state)
{
  (void)state;
  static tiny y;
  plan_trace t;
  trace_init(&t, 6, 6);
  for (uint64_t i = 0; i < 6; i++) {
    uint64_t id = 100 + i % 3;
    trace_add(&t, &id, 1, BT);
  }
  tiny_of(&t, &y);
  assert_int_equal(optimum(&y, 2, 0), 2);
  assert_int_equal(optimum(&y, 1, 0), 1);
  assert_int_equal(optimum(&y, 3, 0), 3);
  plan_belady_stats st = min_of(&t, 2);
  assert_int_equal(st.block_hits, 2);
  assert_int_equal(st.bypasses, 2); /* the first c, and the last (never used again) */
  plan_trace_free(&t);
}

/* ---- unbounded capacity ---------------------------------------------------------- */

/* Every access after a block's first is a hit; a request's hit is the
 * leading run of blocks some earlier request had, input tokens capped at
 * its length (the last block partial). Counted here without MIN. */
static void test_unbounded_counts_reuse(void **state)
{
  (void)state;
  enum { NODES = 400, REQS = 3000 };
  static uint32_t parent[NODES];
  static uint8_t seen[NODES];
  memset(seen, 0, sizeof seen);
  for (uint32_t j = 0; j < NODES; j++) parent[j] = j < 8 ? UINT32_MAX : tu_below(j);
  plan_trace t;
  trace_init(&t, REQS, (size_t)REQS * NODES);
  uint64_t distinct = 0, want_tokens = 0, want_blocks = 0;
  for (uint32_t r = 0; r < REQS; r++) {
    uint64_t path[NODES];
    uint32_t len = 0;
    for (uint32_t j = tu_below(NODES); j != UINT32_MAX; j = parent[j]) path[len++] = j;
    uint64_t ids[NODES];
    for (uint32_t i = 0; i < len; i++) ids[i] = 5000 + path[len - 1 - i];
    uint32_t in_len = (len - 1) * BT + 1 + tu_below(BT);
    int run = 1;
    for (uint32_t i = 0; i < len; i++) {
      uint32_t j = (uint32_t)(ids[i] - 5000);
      run = run && seen[j];
      if (run) {
        want_blocks++;
        want_tokens += i + 1 < len ? BT : in_len - (len - 1) * BT;
      }
    }
    for (uint32_t i = 0; i < len; i++) {
      uint32_t j = (uint32_t)(ids[i] - 5000);
      distinct += !seen[j];
      seen[j] = 1;
    }
    trace_add(&t, ids, len, in_len);
  }
  plan_belady_stats st = min_of(&t, UINT64_MAX);
  print_message("%llu accesses, %llu distinct blocks, %llu of %llu input tokens hit\n",
                (unsigned long long)t.n_ids, (unsigned long long)distinct,
                (unsigned long long)want_tokens, (unsigned long long)t.input_tokens);
  assert_int_equal(st.accesses, t.n_ids);
  assert_int_equal(st.block_hits, t.n_ids - distinct);
  assert_int_equal(st.hit_blocks, want_blocks);
  assert_int_equal(st.hit_tokens, want_tokens);
  assert_int_equal(st.evictions, 0);
  plan_trace_free(&t);
}

/* A block is its whole prefix chain, as the engine's keys are: the same id
 * after another prefix is another block. */
static void test_block_is_its_chain(void **state)
{
  (void)state;
  plan_trace t;
  trace_init(&t, 3, 6);
  const uint64_t a[] = {5, 7}, b[] = {6, 7};
  trace_add(&t, a, 2, 2 * BT);
  trace_add(&t, b, 2, 2 * BT);
  trace_add(&t, a, 2, 2 * BT);
  plan_future *f = NULL;
  assert_int_equal(plan_future_build(&t, &f), 0);
  assert_int_equal(plan_future_blocks(f), 4);
  plan_belady_stats st;
  assert_int_equal(plan_belady_replay(&t, f, UINT64_MAX, &st), 0);
  assert_int_equal(st.block_hits, 2);
  assert_int_equal(st.hit_tokens, 2 * BT);
  /* No room at all: nothing is stored, nothing hits. */
  assert_int_equal(plan_belady_replay(&t, f, 0, &st), 0);
  assert_int_equal(st.block_hits, 0);
  assert_int_equal(st.bypasses, 6);
  plan_future_free(f);
  plan_trace_free(&t);
}

/* ---- kvtier plan ------------------------------------------------------------------- */

static char *run(const char *cmd, int *status)
{
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

/* A Mooncake-format trace of conversations: a shared system prompt, then
 * each turn the conversation's history grown by 1-3 blocks and a partial
 * last block of its own (the next turn extends the prefix with another
 * block there, as in the real traces), turns of 24 conversations
 * interleaved at random. */
static void write_conversations(const char *path, uint32_t n_req)
{
  enum { CONV = 24, SYS = 2, HIST = 24 };
  static uint64_t hist[CONV][HIST];
  uint32_t len[CONV] = {0};
  uint64_t next_id = 1000;
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (uint32_t r = 0; r < n_req; r++) {
    uint32_t c = tu_below(CONV), grow = 1 + tu_below(3);
    if (len[c] + grow > HIST) len[c] = 0; /* a new conversation in its place */
    for (uint32_t k = 0; k < grow; k++) hist[c][len[c]++] = next_id++;
    uint32_t n = SYS + len[c] + 1, in_len = (n - 1) * BT + 1 + tu_below(BT - 1);
    fprintf(f, "{\"timestamp\": %u, \"input_length\": %u, \"output_length\": 100, \"hash_ids\": [",
            r * 500, in_len);
    for (uint32_t k = 0; k < SYS; k++) fprintf(f, "%u, ", k);
    for (uint32_t k = 0; k < len[c]; k++) fprintf(f, "%llu, ", (unsigned long long)hist[c][k]);
    fprintf(f, "%llu]}\n", (unsigned long long)next_id++);
  }
  assert_int_equal(fclose(f), 0);
}

/* Every sweep row carries the optimum of the same trace at the same
 * capacity (capacity / 512 blocks, as the cold tier counts it), at least
 * both policies' rates, and gap_closed from the three, null where Belady
 * is no better than LRU (everything fits); the chart draws all three. */
static void test_plan_sweep_rows(void **state)
{
  (void)state;
  const char *bin = getenv("KVTIER_BIN");
  if (!bin) {
    print_message("KVTIER_BIN not set: run through ctest\n");
    skipped = 1;
    skip();
  }
  char *dir = tu_tmpdir(), path[512], svg[512], cmd[2048];
  snprintf(path, sizeof path, "%s/conv.jsonl", dir);
  snprintf(svg, sizeof svg, "%s/chart.svg", dir);
  write_conversations(path, 600);
  snprintf(cmd, sizeof cmd, "%s plan --model llama-3.1-8b --trace %s --sweep"
           " --capacities 10K,20K,40K,80K,160K,inf --json --svg %s", bin, path, svg);
  int st;
  char *out = run(cmd, &st);
  assert_int_equal(st, 0);
  json_error_t err;
  json_t *doc = json_loads(out, 0, &err);
  if (!doc) print_message("not JSON: %s\n%s\n", err.text, out);
  assert_non_null(doc);
  plan_trace t;
  assert_int_equal(plan_trace_load(path, &t), 0);
  plan_future *f = NULL;
  assert_int_equal(plan_future_build(&t, &f), 0);
  json_t *rows = json_object_get(doc, "rows");
  const uint64_t caps[] = {10000 / BT, 20000 / BT, 40000 / BT, 80000 / BT, 160000 / BT, UINT64_MAX};
  assert_int_equal(json_array_size(rows), 6);
  int gaps = 0;
  for (size_t i = 0; i < 6; i++) {
    json_t *r = json_array_get(rows, i);
    plan_belady_stats b;
    assert_int_equal(plan_belady_replay(&t, f, caps[i], &b), 0);
    double hit = json_number_value(json_object_get(r, "hit_rate"));
    double lru = json_number_value(json_object_get(r, "lru_hit_rate"));
    double bel = json_number_value(json_object_get(r, "belady_hit_rate"));
    json_int_t saved = json_integer_value(json_object_get(r, "prefill_tokens_saved"));
    json_int_t lru_saved = json_integer_value(json_object_get(r, "lru_prefill_tokens_saved"));
    json_int_t bel_saved = json_integer_value(json_object_get(r, "belady_prefill_tokens_saved"));
    json_t *gap = json_object_get(r, "gap_closed");
    print_message("row %zu: policy %.4f, LRU %.4f, Belady %.4f, gap closed %.4f\n", i, hit, lru,
                  bel, json_is_null(gap) ? NAN : json_number_value(gap));
    assert_int_equal(bel_saved, b.hit_tokens);
    assert_true(fabs(bel - (double)b.hit_tokens / (double)t.input_tokens) < 1e-6);
    assert_true(bel_saved >= saved && bel_saved >= lru_saved);
    if (bel_saved > lru_saved) {
      assert_true(json_is_number(gap));
      double want = (double)(saved - lru_saved) / (double)(bel_saved - lru_saved);
      assert_true(fabs(json_number_value(gap) - want) < 1e-5);
      gaps += saved != lru_saved; /* the formula seen with a nonzero numerator */
    } else {
      assert_true(json_is_null(gap));
    }
  }
  assert_true(gaps > 0);
  /* Unbounded: everything fits, no gap to close. */
  assert_true(json_is_null(json_object_get(json_array_get(rows, 5), "gap_closed")));
  FILE *c = fopen(svg, "r");
  assert_non_null(c);
  static char chart[1 << 16];
  chart[fread(chart, 1, sizeof chart - 1, c)] = 0;
  fclose(c);
  int lines = 0;
  for (const char *q = chart; (q = strstr(q, "<polyline")); q++) lines++;
  assert_int_equal(lines, 3);
  assert_non_null(strstr(chart, "offline optimum (Belady)"));
  plan_future_free(f);
  plan_trace_free(&t);
  json_decref(doc);
  free(out);
  tu_rmtree(dir);
}

int main(void)
{
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_search_by_hand),
      cmocka_unit_test(test_min_flat_is_optimal),
      cmocka_unit_test(test_min_tree_is_optimal),
      cmocka_unit_test(test_unbounded_counts_reuse),
      cmocka_unit_test(test_block_is_its_chain),
      cmocka_unit_test(test_plan_sweep_rows),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  if (rc == 0 && skipped) {
    printf("test_plan_belady: every other case passed, but a case was skipped (reason above): exit 77\n");
    return 77;
  }
  return rc;
}
