/* test_serve_api.c - the calls a serving loop needs: kvt_append_info's
 * mask of the layers present (equal to what reads find, across 64-bit
 * words), kvt_load_poll() before and after completion, kvt_event_fd()
 * becoming readable when loads complete and when the durable watermark
 * moves, and durability errors that stay reported per sequence and by
 * every kvt_sync() (a cold tier too small, and injected write faults).
 * The event fd is waited for with poll(2) and a generous timeout: a bound
 * against hanging, never a timed assertion. Request pins: test_seq_pin.c. */
#include "cold_util.h"
#include "fixture.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WAIT_MS 30000 /* a bound against hanging, not a timing */

/* Is fd readable within WAIT_MS? */
static int fd_readable(int fd, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int rc = poll(&p, 1, ms);
  return rc == 1 && (p.revents & POLLIN);
}

/* Read the counter to zero; then it is not readable. */
static void fd_clear(int fd) {
  uint64_t v;
  while (read(fd, &v, sizeof v) == (ssize_t)sizeof v) {
  }
  assert_false(fd_readable(fd, 0));
}

/* An engine without a cold tier in a fresh directory (removed by close_tmp). */
static kvt_engine *open_tmp(char **dir) {
  *dir = tu_tmpdir();
  return tu_open(*dir, NULL);
}

static void close_tmp(kvt_engine *e, char *dir) {
  kvt_engine_close(e);
  tu_rmtree(dir);
}

static void tokens_of(uint32_t salt, uint32_t block, uint32_t bt, uint32_t *out) {
  for (uint32_t t = 0; t < bt; t++)
    out[t] = (uint32_t)(tu_mix(((uint64_t)salt << 40) ^ ((uint64_t)block << 20) ^ t) & 0xFFFF);
}

/* ------------------------------------------------------ the layer mask */

/* Sequence a puts some layers of a block; b appends the same block: the
 * mask names exactly the layers b can read without a put. n_layers 130
 * spans three words of the mask. */
static void check_mask(uint32_t n_layers, const uint32_t *put, size_t n_put) {
  kvt_shape sh = tu_shape_small(KVT_F16);
  sh.n_layers = n_layers;
  char *dir;
  kvt_engine *e = open_tmp(&dir);
  kvt_ns_id ns = tu_register(e, "mask", &sh);
  uint64_t salt = tu_salt("mask");
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  uint32_t tok[4];
  tokens_of(1, 0, sh.block_tokens, tok);
  kvt_seq *a, *b;
  assert_int_equal(kvt_seq_create(e, ns, &a), 0);
  assert_int_equal(kvt_seq_create(e, ns, &b), 0);
  kvt_append_info info;
  memset(&info, 0xA5, sizeof info); /* the library must write every word */
  assert_int_equal(kvt_seq_append(a, tok, sh.block_tokens, &info), 0);
  assert_int_equal(info.layers_present, 0);
  for (uint32_t w = 0; w < KVT_MAX_LAYERS / 64; w++) assert_int_equal(info.layers_mask[w], 0);
  for (size_t i = 0; i < n_put; i++) {
    tu_kv_fill(&kv, &sh, salt, put[i], 0, tok);
    assert_int_equal(kvt_seq_put(a, 0, put[i], &kv.kv), 0);
  }
  memset(&info, 0xA5, sizeof info);
  assert_int_equal(kvt_seq_append(b, tok, sh.block_tokens, &info), 0);
  assert_int_equal(info.layers_present, n_put);
  uint32_t bits = 0;
  for (uint32_t l = 0; l < KVT_MAX_LAYERS; l++) {
    unsigned set = KVT_LAYER_PRESENT(&info, l);
    bits += set;
    if (l >= n_layers) {
      if (set) fail_msg("layer %u >= n_layers %u is set in the mask", l, n_layers);
      continue;
    }
    int rc = kvt_seq_read(b, 0, l, kv.k, kv.v, kv.bytes);
    if (set) {
      assert_int_equal(rc, 0);
      tu_assert_block(b, &sh, salt, 0, l, tok);
    } else if (rc != KVT_ENOTFOUND) {
      fail_msg("layer %u not in the mask, yet its read returned %d", l, rc);
    }
  }
  assert_int_equal(bits, info.layers_present);
  kvt_seq_release(a);
  kvt_seq_release(b);
  tu_kv_free(&kv);
  close_tmp(e, dir);
}

static void test_layers_mask(void **state) {
  (void)state;
  const uint32_t few[] = {0, 2};
  check_mask(4, few, 2);
  const uint32_t wide[] = {0, 1, 63, 64, 100, 127, 128, 129};
  check_mask(130, wide, sizeof wide / sizeof *wide);
}

/* A block stored in every layer is adopted whole: every bit is set. */
static void test_layers_mask_full(void **state) {
  (void)state;
  kvt_shape sh = tu_shape_small(KVT_BF16);
  char *dir;
  kvt_engine *e = open_tmp(&dir);
  kvt_ns_id ns = tu_register(e, "full", &sh);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  uint32_t tok[4];
  tokens_of(2, 0, sh.block_tokens, tok);
  kvt_seq *a, *b;
  assert_int_equal(kvt_seq_create(e, ns, &a), 0);
  assert_int_equal(kvt_seq_create(e, ns, &b), 0);
  tu_append_put(a, &sh, tu_salt("full"), tok, &kv);
  kvt_append_info info;
  assert_int_equal(kvt_seq_append(b, tok, sh.block_tokens, &info), 0);
  assert_int_equal(info.layers_present, sh.n_layers);
  assert_int_equal(info.layers_mask[0], (1ull << sh.n_layers) - 1);
  kvt_seq_release(a);
  kvt_seq_release(b);
  tu_kv_free(&kv);
  close_tmp(e, dir);
}

/* ------------------------------------------------- loads and the event fd */

/* Every layer of a block in RAM: kvt_load_poll() completes it at once,
 * and the fd says so (the batch is complete from submit on). */
static void test_load_poll_ram(void **state) {
  (void)state;
  kvt_shape sh = tu_shape_small(KVT_F16);
  char *dir;
  kvt_engine *e = open_tmp(&dir);
  int fd = kvt_event_fd(e);
  assert_true(fd >= 0);
  assert_int_equal(kvt_event_fd(e), fd); /* the same one every time */
  assert_int_equal(kvt_event_fd(NULL), KVT_ENULL);
  assert_int_equal(kvt_load_poll(NULL, NULL), KVT_ENULL);
  kvt_ns_id ns = tu_register(e, "ram", &sh);
  uint64_t salt = tu_salt("ram");
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  uint32_t tok[4];
  tokens_of(3, 0, sh.block_tokens, tok);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  tu_append_put(s, &sh, salt, tok, &kv);
  kvt_key key;
  size_t nk;
  assert_int_equal(kvt_keys(e, ns, tok, sh.block_tokens, &key, 1, &nk), 0);
  fd_clear(fd);
  kvt_load_req req[4];
  tu_kv out[4];
  for (uint32_t l = 0; l < 4; l++) {
    tu_kv_alloc(&out[l], &sh);
    req[l] = (kvt_load_req){.key = key, .layer = l, .k_out = out[l].k, .v_out = out[l].v,
                            .bytes_each = out[l].bytes};
  }
  kvt_load *ld;
  assert_int_equal(kvt_load_submit(e, ns, req, 4, &ld), 0);
  assert_true(fd_readable(fd, WAIT_MS));
  size_t ok = 99;
  assert_int_equal(kvt_load_poll(ld, &ok), 0); /* done: no device read */
  assert_int_equal(ok, 4);
  for (uint32_t l = 0; l < 4; l++) {
    assert_int_equal(req[l].status, 0);
    assert_int_equal(req[l].tier, KVT_TIER_HOT);
    assert_true(cu_same(&out[l], &kv, &sh, salt, l, 0, tok));
    tu_kv_free(&out[l]);
  }
  kvt_seq_release(s);
  tu_kv_free(&kv);
  close_tmp(e, dir);
}

/* A store with a cold tier, pread or io_uring as the machine allows. */
static kvt_engine *open_cold(const char *dir, uint64_t cold_limit) {
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_AUTO);
  if (cold_limit) o.tier_bytes_limit[KVT_TIER_COLD] = cold_limit;
  return tu_open(dir, &o);
}

/* Write n blocks of one sequence (all layers), make them durable, close. */
static void write_durable(const char *dir, const kvt_shape *sh, const char *model, uint32_t n) {
  uint32_t tok[16 * 64];
  assert_true((size_t)n * sh->block_tokens <= sizeof tok / sizeof tok[0]);
  for (uint32_t b = 0; b < n; b++) tokens_of(4, b, sh->block_tokens, tok + (size_t)b * sh->block_tokens);
  tf_write_durable(dir, KVT_BACKEND_AUTO, sh, model, tu_salt(model), tok, n);
}

/* Loads of blocks only on disk: poll until done, waiting on the fd
 * between polls as an event loop would; every poll before completion
 * returns KVT_EBUSY and leaves the batch as it was, and the fd becomes
 * readable when the last read finished. Whether any poll comes before
 * completion depends on the device: both paths assert the fd's notice. */
static void test_load_poll_cold(void **state) {
  (void)state;
  kvt_shape sh = {.n_layers = 8, .n_kv_heads = 4, .head_dim = 64, .dtype = KVT_F16,
                  .block_tokens = 16};
  const uint32_t nb = 6;
  char *dir = tu_tmpdir();
  write_durable(dir, &sh, "cold-load", nb);
  kvt_engine *e = open_cold(dir, 0); /* nothing in RAM now */
  kvt_ns_id ns = tu_register(e, "cold-load", &sh);
  uint64_t salt = tu_salt("cold-load");
  int fd = kvt_event_fd(e);
  assert_true(fd >= 0);
  fd_clear(fd);
  size_t n = (size_t)nb * sh.n_layers;
  kvt_load_req *req = calloc(n, sizeof *req);
  tu_kv *out = calloc(n, sizeof *out);
  uint32_t tok[16];
  kvt_key prev, key, seed;
  assert_int_equal(kvt_ns_seed(e, ns, &seed), 0);
  for (uint32_t b = 0; b < nb; b++) {
    tokens_of(4, b, sh.block_tokens, tok);
    kvt_key_next(&seed, b ? &prev : NULL, tok, sh.block_tokens, &key);
    prev = key;
    for (uint32_t l = 0; l < sh.n_layers; l++) {
      size_t i = (size_t)b * sh.n_layers + l;
      tu_kv_alloc(&out[i], &sh);
      req[i] = (kvt_load_req){.key = key, .layer = l, .k_out = out[i].k, .v_out = out[i].v,
                              .bytes_each = out[i].bytes};
    }
  }
  kvt_load *ld;
  assert_int_equal(kvt_load_submit(e, ns, req, n, &ld), 0);
  size_t ok = 12345, busy = 0;
  int rc;
  while ((rc = kvt_load_poll(ld, &ok)) == KVT_EBUSY) {
    busy++;
    assert_int_equal(ok, 12345); /* untouched while not done */
    if (!fd_readable(fd, WAIT_MS))
      fail_msg("load not done and the fd not readable in %d ms", WAIT_MS);
    uint64_t v;
    assert_int_equal(read(fd, &v, sizeof v), (ssize_t)sizeof v);
  }
  fprintf(stderr, "kvt_load_poll: %zu polls before completion\n", busy);
  assert_int_equal(rc, 0);
  assert_int_equal(ok, n);
  /* Done at the first poll: the notice of the last read comes anyway (it
   * may follow the poll). Otherwise the loop above already waited for it:
   * nothing else signals this engine (no puts, nothing to flush). */
  if (!busy) assert_true(fd_readable(fd, WAIT_MS));
  tu_kv want;
  tu_kv_alloc(&want, &sh);
  for (uint32_t b = 0; b < nb; b++) {
    tokens_of(4, b, sh.block_tokens, tok);
    for (uint32_t l = 0; l < sh.n_layers; l++) {
      size_t i = (size_t)b * sh.n_layers + l;
      assert_int_equal(req[i].status, 0);
      assert_int_equal(req[i].tier, KVT_TIER_COLD);
      assert_true(cu_same(&out[i], &want, &sh, salt, l, b, tok));
      tu_kv_free(&out[i]);
    }
  }
  tu_kv_free(&want);
  free(req);
  free(out);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* The durable watermark moves: the flusher writes a completed block and
 * the fd becomes readable; kvt_sync() then finds it durable. */
static void test_event_fd_durable(void **state) {
  (void)state;
  kvt_shape sh = tu_shape_small(KVT_F16);
  char *dir = tu_tmpdir();
  kvt_engine *e = open_cold(dir, 0);
  kvt_ns_id ns = tu_register(e, "durable-fd", &sh);
  int fd = kvt_event_fd(e);
  assert_true(fd >= 0);
  fd_clear(fd);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  uint32_t tok[4];
  for (uint32_t b = 0; b < 3; b++) {
    tokens_of(5, b, sh.block_tokens, tok);
    tu_append_put(s, &sh, tu_salt("durable-fd"), tok, &kv);
    /* The flusher writes it on its own; the fd says when to look. */
    if (!fd_readable(fd, WAIT_MS)) fail_msg("block %u: fd not readable in %d ms", b, WAIT_MS);
    fd_clear(fd);
    uint32_t d = 0;
    for (int tries = 0; tries < 1000 && (d = kvt_seq_durable(s)) < b + 1; tries++) {
      /* A group may settle in parts: wait for the next notice. */
      if (!fd_readable(fd, WAIT_MS)) break;
      fd_clear(fd);
    }
    assert_int_equal(d, b + 1);
  }
  assert_int_equal(kvt_sync(e), 0);
  uint32_t nd = 99;
  assert_int_equal(kvt_seq_durable_error(s, &nd), 0);
  assert_int_equal(nd, 3);
  kvt_seq_release(s);
  tu_kv_free(&kv);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* ------------------------------------------------------ durability errors */

/* A cold tier too small for what a sequence holds: the blocks it cannot
 * take stay in RAM, and every kvt_sync() reports KVT_EFULL while they are
 * referenced, not only the first; the sequence holding them reports it
 * too, another sequence does not; releasing it ends the report. */
static void test_durable_error_full(void **state) {
  (void)state;
  /* 64 KiB a layer block, 4 layers: ~260 KiB a record; 2 MiB of cold
   * (two 1 MiB segments, one kept spare) holds three or four. */
  kvt_shape sh = {.n_layers = 4, .n_kv_heads = 8, .head_dim = 128, .dtype = KVT_F16,
                  .block_tokens = 16};
  const uint32_t nb = 10;
  char *dir = tu_tmpdir();
  kvt_engine *e = open_cold(dir, 2u << 20);
  kvt_ns_id ns = tu_register(e, "full", &sh);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_seq *big, *small;
  assert_int_equal(kvt_seq_create(e, ns, &small), 0);
  uint32_t tok[16];
  tokens_of(6, 0, sh.block_tokens, tok);
  tu_append_put(small, &sh, tu_salt("full"), tok, &kv); /* one block, its own */
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(small), 1);
  assert_int_equal(kvt_seq_create(e, ns, &big), 0);
  for (uint32_t b = 0; b < nb; b++) {
    tokens_of(7, b, sh.block_tokens, tok);
    tu_append_put(big, &sh, tu_salt("full"), tok, &kv);
  }
  int first = kvt_sync(e);
  assert_int_equal(first, KVT_EFULL);
  for (int i = 0; i < 3; i++) assert_int_equal(kvt_sync(e), KVT_EFULL); /* every call */
  uint32_t nd = 99;
  assert_int_equal(kvt_seq_durable_error(big, &nd), KVT_EFULL);
  assert_true(nd < nb);
  assert_int_equal(nd, kvt_seq_durable(big));
  assert_int_equal(kvt_seq_durable_error(big, NULL), KVT_EFULL); /* seen, still reported */
  assert_int_equal(kvt_seq_durable_error(small, &nd), 0);
  assert_int_equal(nd, 1);
  /* Every block the cold tier refused is still in RAM, exact. */
  for (uint32_t b = 0; b < nb; b++) {
    tokens_of(7, b, sh.block_tokens, tok);
    for (uint32_t l = 0; l < sh.n_layers; l++)
      tu_assert_block(big, &sh, tu_salt("full"), b, l, tok);
  }
  kvt_seq_release(big);
  assert_int_equal(kvt_sync(e), 0); /* nothing referenced is kept out any more */
  assert_int_equal(kvt_seq_durable_error(small, NULL), 0);
  kvt_seq_release(small);
  assert_int_equal(kvt_seq_durable_error(NULL, &nd), KVT_ENULL);
  assert_int_equal(nd, 0);
  tu_kv_free(&kv);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

/* Every segment write fails (-ENOSPC injected): the sequence reports the
 * error until it is released, kvt_sync() on every call, and the blocks
 * stay readable in RAM. */
static void test_durable_error_fault(void **state) {
  (void)state;
  kvt_shape sh = tu_shape_small(KVT_F32);
  char *dir = tu_tmpdir();
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_AUTO);
  o.test_fault = (kvt_test_fault){.ops = 1u << 2, .kind = 2, .after = 1, .count = 0};
  kvt_engine *e = tu_open(dir, &o);
  kvt_ns_id ns = tu_register(e, "fault", &sh);
  int fd = kvt_event_fd(e);
  assert_true(fd >= 0);
  fd_clear(fd);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  uint32_t tok[4];
  for (uint32_t b = 0; b < 3; b++) {
    tokens_of(8, b, sh.block_tokens, tok);
    tu_append_put(s, &sh, tu_salt("fault"), tok, &kv);
  }
  int rc = kvt_sync(e);
  fprintf(stderr, "kvt_sync with failing writes: %s\n", kvt_strerror(rc));
  assert_true(rc < 0);
  assert_true(fd_readable(fd, WAIT_MS)); /* the failed group was told of too */
  for (int i = 0; i < 3; i++) assert_int_equal(kvt_sync(e), rc);
  uint32_t nd = 99;
  assert_int_equal(kvt_seq_durable_error(s, &nd), rc);
  assert_int_equal(nd, 0);
  for (uint32_t b = 0; b < 3; b++) {
    tokens_of(8, b, sh.block_tokens, tok);
    for (uint32_t l = 0; l < sh.n_layers; l++) tu_assert_block(s, &sh, tu_salt("fault"), b, l, tok);
  }
  kvt_seq_release(s);
  assert_int_equal(kvt_sync(e), 0);
  tu_kv_free(&kv);
  kvt_engine_close(e);
  tu_rmtree(dir);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layers_mask),
      cmocka_unit_test(test_layers_mask_full),
      cmocka_unit_test(test_load_poll_ram),
      cmocka_unit_test(test_load_poll_cold),
      cmocka_unit_test(test_event_fd_durable),
      cmocka_unit_test(test_durable_error_full),
      cmocka_unit_test(test_durable_error_fault),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
