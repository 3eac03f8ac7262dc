/* plan_trace.c - workloads for `kvtier plan`: Mooncake JSONL traces, one
 * request a line ({"timestamp": ms, "input_length": n, "output_length": n,
 * "hash_ids": [...]}, one id per 512-token prefix block: equal ids mean an
 * equal prefix up to that block), read with jansson; and synthetic ones. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "plan.h"

void plan_trace_free(plan_trace *t)
{
  free(t->reqs);
  free(t->ids);
  memset(t, 0, sizeof *t);
}

static int reserve(void **v, size_t *cap, size_t need, size_t elem)
{
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap : 1024;
  while (nc < need) nc *= 2;
  void *p = realloc(*v, nc * elem);
  if (!p) return -1;
  *v = p;
  *cap = nc;
  return 0;
}

/* Append a request and room for its n ids (filled by the caller). */
static plan_req *add_req(plan_trace *t, double t_ms, uint32_t in, uint32_t out, uint32_t n)
{
  if (reserve((void **)&t->reqs, &t->cap, t->n + 1, sizeof *t->reqs) ||
      reserve((void **)&t->ids, &t->cap_ids, t->n_ids + n, sizeof *t->ids))
    return NULL;
  plan_req *r = &t->reqs[t->n++];
  *r = (plan_req){.t_ms = t_ms, .input_len = in, .output_len = out, .n_blocks = n,
                  .first = t->n_ids};
  t->n_ids += n;
  if (n > t->max_blocks) t->max_blocks = n;
  t->input_tokens += in;
  t->output_tokens += out;
  return r;
}

/* A non-negative integer member that fits max, or -1. */
static int64_t member_int(json_t *o, const char *key, int64_t max)
{
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v)) return -1;
  json_int_t x = json_integer_value(v);
  return x < 0 || x > max ? -1 : (int64_t)x;
}

/* A timestamp past this is no clock reading (about 32 years, in ms). */
#define PLAN_MAX_T_MS 1e12

static int line_fail(const char *path, size_t line, const char *why)
{
  fprintf(stderr, "kvtier plan: %s: line %zu: %s\n", path, line, why);
  return -1;
}

/* One trace line into t; -1 with the reason printed. */
static int parse_line(plan_trace *t, const char *path, size_t line_no, const char *text)
{
  json_error_t err;
  json_t *o = json_loads(text, 0, &err);
  if (!o) {
    char why[200];
    snprintf(why, sizeof why, "not JSON: %s", err.text);
    return line_fail(path, line_no, why);
  }
  int rc = 0;
  json_t *ts = json_object_get(o, "timestamp"), *ids = json_object_get(o, "hash_ids");
  int64_t in = member_int(o, "input_length", UINT32_MAX);
  int64_t out = member_int(o, "output_length", UINT32_MAX);
  double t_ms = json_is_number(ts) ? json_number_value(ts) : -1;
  if (!json_is_object(o)) rc = line_fail(path, line_no, "not a JSON object");
  else if (!(t_ms >= 0) || !isfinite(t_ms)) rc = line_fail(path, line_no, "timestamp missing or negative");
  else if (t_ms > PLAN_MAX_T_MS)
    rc = line_fail(path, line_no, "timestamp beyond 1e12 ms (32 years): not a trace's clock");
  else if (in <= 0) rc = line_fail(path, line_no, "input_length missing, not a positive integer, or too large");
  else if (out < 0) rc = line_fail(path, line_no, "output_length missing or not a non-negative integer");
  else if (!json_is_array(ids) || json_array_size(ids) == 0)
    rc = line_fail(path, line_no, "hash_ids missing or empty");
  else if (json_array_size(ids) > PLAN_MAX_BLOCKS)
    rc = line_fail(path, line_no, "more than 65536 hash_ids");
  else if (json_array_size(ids) > ((uint64_t)in + PLAN_BLOCK_TOKENS - 1) / PLAN_BLOCK_TOKENS) {
    char why[160];
    snprintf(why, sizeof why, "hash_ids: %zu ids, more than the %" PRIu64 " blocks of 512 tokens "
             "that input_length %" PRId64 " makes", json_array_size(ids),
             ((uint64_t)in + PLAN_BLOCK_TOKENS - 1) / PLAN_BLOCK_TOKENS, in);
    rc = line_fail(path, line_no, why);
  }
  else if (t->n && t_ms < t->reqs[t->n - 1].t_ms)
    rc = line_fail(path, line_no, "timestamp earlier than the line before (the trace must be in time order)");
  plan_req *r = NULL;
  if (!rc && !(r = add_req(t, t_ms, (uint32_t)in, (uint32_t)out, (uint32_t)json_array_size(ids))))
    rc = line_fail(path, line_no, "out of memory");
  for (size_t i = 0; !rc && i < r->n_blocks; i++) {
    json_t *v = json_array_get(ids, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
      rc = line_fail(path, line_no, "a hash id is not a non-negative integer");
      t->n--; /* not kept */
      t->n_ids = r->first;
    } else {
      t->ids[r->first + i] = (uint64_t)json_integer_value(v);
    }
  }
  json_decref(o);
  return rc;
}

int plan_trace_load(const char *path, plan_trace *t)
{
  memset(t, 0, sizeof *t);
  FILE *f = fopen(path, "r");
  struct stat sb;
  if (!f || fstat(fileno(f), &sb) || S_ISDIR(sb.st_mode)) {
    int e = !f ? errno : S_ISDIR(sb.st_mode) ? EISDIR : errno;
    if (f) fclose(f);
    fprintf(stderr, "kvtier plan: %s: cannot open: %s\n", path, strerror(e));
    return -1;
  }
  char *line = NULL;
  size_t cap = 0, line_no = 0;
  ssize_t len;
  int rc = 0;
  errno = 0;
  while (!rc && (len = getline(&line, &cap, f)) >= 0) {
    line_no++;
    size_t n = (size_t)len;
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) line[--n] = 0;
    if (n == 0) continue; /* blank lines are allowed */
    const char *nul = memchr(line, 0, n); /* would end the JSON early, unseen */
    if (nul) {
      char why[80];
      snprintf(why, sizeof why, "a NUL byte at column %zu", (size_t)(nul - line) + 1);
      rc = line_fail(path, line_no, why);
      break;
    }
    rc = parse_line(t, path, line_no, line);
  }
  if (!rc && ferror(f)) { /* a read error is the file's, not a line's */
    fprintf(stderr, "kvtier plan: %s: %s\n", path, strerror(errno ? errno : EIO));
    rc = -1;
  }
  free(line);
  fclose(f);
  if (!rc && t->n == 0) {
    fprintf(stderr, "kvtier plan: %s: no requests\n", path);
    rc = -1;
  }
  if (rc) plan_trace_free(t);
  return rc;
}

int plan_trace_synth(plan_trace *t, uint64_t seed, uint32_t agents, uint32_t ctx, double shared, double rate,
                     uint32_t n_req, uint32_t out)
{
  memset(t, 0, sizeof *t);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull | 1; /* xorshift state (seed 0: unused) */
  uint32_t n = (ctx + PLAN_BLOCK_TOKENS - 1) / PLAN_BLOCK_TOKENS;
  uint32_t n_shared = (uint32_t)(shared * ctx / PLAN_BLOCK_TOKENS);
  if (n_shared > n) n_shared = n;
  /* ids: the shared blocks are 0 .. n_shared-1; agent a's own blocks
   * follow at n_shared + a * n, so no two agents share them. */
  for (uint32_t i = 0; i < n_req; i++) {
    uint32_t a = i % agents;
    if (seed) { /* agents at random, not in turn */
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      a = (uint32_t)(x % agents);
    }
    plan_req *r = add_req(t, i * 1000.0 / rate, ctx, out, n);
    if (!r) {
      plan_trace_free(t);
      return -1;
    }
    for (uint32_t b = 0; b < n; b++)
      t->ids[r->first + b] = b < n_shared ? b : n_shared + (uint64_t)a * n + b;
  }
  return 0;
}
