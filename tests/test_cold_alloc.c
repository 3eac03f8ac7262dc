/* test_cold_alloc.c - the disk cold tier allocates through the accounting
 * (base/mem.h): its write pipeline (chunks, slices, writes, index values,
 * staging buffers), its reads (buffers, batches, plane scratch) and its
 * index vectors are counted and reach the failing-allocator hook. Every
 * allocation of a write and read workload is failed in turn: a failure is
 * -ENOMEM and nothing else, no record reads back as other bytes, what was
 * indexed stays, writing again succeeds, and at close every counted byte
 * is back (the sizes freed match the sizes allocated). */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/key.h"
#include "testutil.h"
#include "tiers/cold.h"

#define N_REC 5
#define N_LAYERS 2
#define EACH 8192u /* K (= V) bytes of one layer */

typedef struct work {
  uint8_t *data[N_REC][N_LAYERS]; /* K||V of each layer */
  const uint8_t *ptr[N_REC][N_LAYERS];
  kvt_cold_rec rec[N_REC];
  kvt_key seed;
  uint8_t enc[KVT_NS_ENCODE_MAX];
  size_t enc_len;
} work;

/* f16 values with few distinct high bytes: the byte planes compress, so
 * reads go through the planes' scratch too. */
static void work_make(work *w) {
  kvt_ns_desc d = {.model_id = "alloc-test", .weights_fingerprint = "sha256:alloc",
                   .rope_theta = 10000.0, .tp_size = 1,
                   .shape = {N_LAYERS, 2, 32, KVT_F16, 64}};
  assert_int_equal(kvt_shape_block_bytes(&d.shape), EACH);
  kvt_ns_seed_of(&d, &w->seed);
  w->enc_len = kvt_ns_encode(&d, w->enc, sizeof w->enc);
  for (uint32_t r = 0; r < N_REC; r++) {
    for (uint32_t l = 0; l < N_LAYERS; l++) {
      uint8_t *p = malloc(2 * EACH);
      assert_non_null(p);
      for (uint32_t i = 0; i < 2 * EACH; i += 2) {
        p[i] = (uint8_t)(tu_mix(r * 1000003u + l * 7919u + i) & 0xff);
        p[i + 1] = (uint8_t)(0x3c + (i >> 11) % 3);
      }
      w->data[r][l] = p;
      w->ptr[r][l] = p;
    }
    kvt_cold_rec *c = &w->rec[r];
    *c = (kvt_cold_rec){.ns_seed = w->seed, .pos = r, .n_layers = N_LAYERS, .dtype = KVT_F16,
                        .bytes_each = EACH, .layers = w->ptr[r]};
    memset(c->key.b, 0x40 + r, 16);
    if (r) c->parent = w->rec[r - 1].key;
  }
}

static void work_free(work *w) {
  for (uint32_t r = 0; r < N_REC; r++)
    for (uint32_t l = 0; l < N_LAYERS; l++) free(w->data[r][l]);
}

static kvt_cold *open_tier(const char *dir, kvt_mem *m, uint64_t fail_after) {
  kvt_mem_init(m, fail_after);
  kvt_cold_config cfg = {.dir = dir, .bytes_limit = 16u << 20, .segment_bytes = 1u << 20,
                         .map_bytes = 16u << 20, .group_bytes = 64u << 10, .compress = 1,
                         .zstd_level = 1, .io = {.backend = KVT_BACKEND_PREAD}};
  kvt_cold *c = NULL;
  int rc = kvt_cold_open(m, &cfg, &c);
  if (rc == -ENOMEM && fail_after) { /* the failure hit the open: nothing of it is left */
    for (int cat = 0; cat < KVT_MEM_NCAT; cat++) assert_int_equal(kvt_mem_bytes(m, cat), 0);
    rc = kvt_cold_open(m, &cfg, &c);
  }
  assert_int_equal(rc, 0);
  return c;
}

/* Close, and every counted byte is back. */
static void close_tier(kvt_cold *c, kvt_mem *m) {
  kvt_cold_close(c);
  for (int cat = 0; cat < KVT_MEM_NCAT; cat++) assert_int_equal(kvt_mem_bytes(m, cat), 0);
  kvt_mem_fini(m);
}

/* Read every layer of record r one at a time: 0 with exactly its bytes,
 * or (only where allow_enomem) -ENOMEM, then again with its bytes. Returns
 * how many reads were refused. */
static int read_rec(kvt_cold *c, const work *w, uint32_t r, int allow_enomem) {
  static uint8_t k[EACH], v[EACH];
  int refused = 0;
  for (uint32_t l = 0; l < N_LAYERS; l++) {
    memset(k, 0x5a, EACH);
    int rc = kvt_cold_read_layer(c, &w->rec[r].key, l, k, v, EACH);
    if (rc == -ENOMEM && allow_enomem) {
      refused++;
      rc = kvt_cold_read_layer(c, &w->rec[r].key, l, k, v, EACH);
    }
    assert_int_equal(rc, 0);
    assert_memory_equal(k, w->data[r][l], EACH);
    assert_memory_equal(v, w->data[r][l] + EACH, EACH);
  }
  return refused;
}

/* Every layer of every record in one batch through the reader threads:
 * each status 0 with exactly its bytes, or -ENOMEM where allowed. Returns
 * how many were refused (a refused submit counts once). */
static int read_batch(kvt_cold *c, const work *w, int allow_enomem) {
  kvt_cold_read rq[N_REC * N_LAYERS];
  uint8_t *buf = malloc((size_t)N_REC * N_LAYERS * 2 * EACH);
  assert_non_null(buf);
  memset(buf, 0x5a, (size_t)N_REC * N_LAYERS * 2 * EACH);
  for (uint32_t i = 0; i < N_REC * N_LAYERS; i++)
    rq[i] = (kvt_cold_read){.key = w->rec[i / N_LAYERS].key, .layer = i % N_LAYERS,
                            .k_out = buf + 2 * (size_t)EACH * i,
                            .v_out = buf + 2 * (size_t)EACH * i + EACH, .bytes_each = EACH};
  kvt_cold_batch *b = NULL;
  int rc = kvt_cold_read_submit(c, rq, N_REC * N_LAYERS, &b), refused = 0;
  if (rc == -ENOMEM && allow_enomem) {
    free(buf);
    return 1;
  }
  assert_int_equal(rc, 0);
  kvt_cold_read_wait(b);
  for (uint32_t i = 0; i < N_REC * N_LAYERS; i++) {
    if (rq[i].status == -ENOMEM && allow_enomem) {
      refused++;
      continue;
    }
    assert_int_equal(rq[i].status, 0);
    assert_memory_equal(rq[i].k_out, w->data[i / N_LAYERS][i % N_LAYERS], 2 * EACH);
  }
  free(buf);
  return refused;
}

/* The workload under fail_after (0: never): write every record, read them
 * back one by one and in a batch. *writes_refused / *reads_refused count
 * the -ENOMEM answers. Returns the allocations counted in it. */
static uint64_t run(const work *w, uint64_t fail_after, int *writes_refused, int *reads_refused) {
  char *dir = tu_tmpdir();
  kvt_mem m;
  kvt_cold *c = open_tier(dir, &m, fail_after);
  uint64_t a0 = atomic_load(&m.n_allocs);
  int rc = kvt_cold_ns_put(c, &w->seed, w->enc, w->enc_len);
  if (rc == -ENOMEM) rc = kvt_cold_ns_put(c, &w->seed, w->enc, w->enc_len);
  assert_int_equal(rc, 0);
  size_t written = 0;
  rc = kvt_cold_write(c, w->rec, N_REC, &written);
  if (rc == -ENOMEM) {
    (*writes_refused)++;
    assert_true(written < N_REC);
    for (uint32_t r = 0; r < written; r++) read_rec(c, w, r, 1); /* what was indexed stays */
    rc = kvt_cold_write(c, w->rec, N_REC, &written);           /* and the rest goes now */
  }
  assert_int_equal(rc, 0);
  assert_int_equal(written, N_REC);
  for (uint32_t r = 0; r < N_REC; r++) *reads_refused += read_rec(c, w, r, 1);
  *reads_refused += read_batch(c, w, 1);
  uint64_t used = atomic_load(&m.n_allocs) - a0;
  close_tier(c, &m);
  /* Reopened without failures: everything written is there, exactly. */
  c = open_tier(dir, &m, 0);
  for (uint32_t r = 0; r < N_REC; r++) read_rec(c, w, r, 0);
  assert_int_equal(read_batch(c, w, 0), 0);
  close_tier(c, &m);
  tu_rmtree(dir);
  return used;
}

static void test_counted(void **state) {
  (void)state;
  work w;
  work_make(&w);
  int wr = 0, rd = 0;
  uint64_t used = run(&w, 0, &wr, &rd);
  fprintf(stderr, "cold workload: %llu counted allocations\n", (unsigned long long)used);
  assert_int_equal(wr + rd, 0);
  /* A chunk per record (64 KiB groups) and its slices, parts and writes;
   * an index value per group; read buffers, plane scratch, a batch. */
  assert_true(used >= 8 * N_REC);
  work_free(&w);
}

static void test_every_allocation_fails(void **state) {
  (void)state;
  work w;
  work_make(&w);
  int wr = 0, rd = 0;
  uint64_t used = run(&w, 0, &wr, &rd);
  /* The hook counts from the open: walk from there to past the workload
   * (reader threads allocate on their own, so n is not one fixed call). */
  char *dir = tu_tmpdir();
  kvt_mem m;
  kvt_cold *c = open_tier(dir, &m, 0);
  uint64_t at_open = atomic_load(&m.n_allocs);
  close_tier(c, &m);
  tu_rmtree(dir);
  wr = rd = 0;
  for (uint64_t n = at_open + 1; n <= at_open + used + 8; n++) run(&w, n, &wr, &rd);
  fprintf(stderr, "%llu runs: %d writes and %d reads refused with -ENOMEM\n",
          (unsigned long long)used + 8, wr, rd);
  assert_true(wr >= N_REC); /* the write pipeline's allocations reach the hook */
  assert_true(rd >= N_REC); /* and the reads' */
  work_free(&w);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_counted),
      cmocka_unit_test(test_every_allocation_fails),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
