/* fuzz_plan_trace.c - libFuzzer target for the Mooncake JSONL trace reader
 * of `kvtier plan` (plan_trace_load, tools/plan_trace.c). Input: a trace
 * file (written to a memfd, read through its /proc path). What must hold:
 * 0 or -1; an accepted trace is consistent (requests in time order, each
 * with 1..PLAN_MAX_BLOCKS ids inside the id array, positive input length,
 * totals that add up), and written back as JSONL it reads back the same. */
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "plan.h"
#include "tests/fuzz/fuzz_cold.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Load the bytes at p as a trace file. */
static int load_bytes(const void *p, size_t n, plan_trace *t) {
  int fd = memfd_create("trace", 0);
  FZ_CHECK(fd >= 0);
  FZ_CHECK(write(fd, p, n) == (ssize_t)n);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int rc = plan_trace_load(path, t);
  close(fd);
  return rc;
}

static void check_trace(const plan_trace *t) {
  uint64_t in = 0, out = 0, ids = 0;
  uint32_t max = 0;
  FZ_CHECK(t->n >= 1);
  for (size_t i = 0; i < t->n; i++) {
    const plan_req *r = &t->reqs[i];
    FZ_CHECK(isfinite(r->t_ms) && r->t_ms >= 0 && (i == 0 || r->t_ms >= t->reqs[i - 1].t_ms));
    FZ_CHECK(r->input_len > 0 && r->n_blocks >= 1 && r->n_blocks <= PLAN_MAX_BLOCKS);
    FZ_CHECK(r->first == ids && r->first + r->n_blocks <= t->n_ids);
    ids += r->n_blocks;
    in += r->input_len;
    out += r->output_len;
    if (r->n_blocks > max) max = r->n_blocks;
  }
  FZ_CHECK(ids == t->n_ids && in == t->input_tokens && out == t->output_tokens &&
           max == t->max_blocks);
  for (size_t i = 0; i < t->n_ids; i++) FZ_CHECK(t->ids[i] <= INT64_MAX);
}

/* The trace as JSONL, one request a line. */
static char *write_back(const plan_trace *t, size_t *len) {
  char *buf = NULL;
  FILE *f = open_memstream(&buf, len);
  FZ_CHECK(f != NULL);
  for (size_t i = 0; i < t->n; i++) {
    const plan_req *r = &t->reqs[i];
    fprintf(f, "{\"timestamp\": %.17g, \"input_length\": %u, \"output_length\": %u, \"hash_ids\": [",
            r->t_ms, r->input_len, r->output_len);
    for (uint32_t b = 0; b < r->n_blocks; b++)
      fprintf(f, "%s%llu", b ? ", " : "", (unsigned long long)t->ids[r->first + b]);
    fprintf(f, "]}\n");
  }
  FZ_CHECK(fclose(f) == 0);
  return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  plan_trace t;
  int rc = load_bytes(data, size, &t);
  FZ_CHECK(rc == 0 || rc == -1);
  if (rc == 0) {
    check_trace(&t);
    size_t len;
    char *jsonl = write_back(&t, &len);
    plan_trace u;
    FZ_CHECK(load_bytes(jsonl, len, &u) == 0);
    FZ_CHECK(u.n == t.n && u.n_ids == t.n_ids);
    for (size_t i = 0; i < t.n; i++) {
      const plan_req *a = &t.reqs[i], *b = &u.reqs[i];
      FZ_CHECK(a->t_ms == b->t_ms && a->input_len == b->input_len &&
               a->output_len == b->output_len && a->n_blocks == b->n_blocks);
    }
    FZ_CHECK(memcmp(t.ids, u.ids, t.n_ids * sizeof *t.ids) == 0);
    free(jsonl);
    plan_trace_free(&u);
    plan_trace_free(&t);
  }
  return 0;
}
