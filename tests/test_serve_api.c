/* test_serve_api.c - the calls a serving loop needs: kvt_append_info's
 * mask of the layers present (equal to what reads find, across 64-bit
 * words), kvt_load_poll() before and after completion, kvt_event_fd()
 * becoming readable when loads complete and when the durable watermark
 * moves, and durability errors that stay reported per sequence and by
 * every kvt_sync() (a cold tier too small, and injected write faults).
 * The event fd is waited for with poll(2) and a generous timeout: a bound
 * against hanging, never a timed assertion. Request pins: test_seq_pin.c. */
#include "cold_util.h"

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
  for (uint32_t t = 0; t < bt; t++) out[t] = (uint32_t)(tu_mix(((uint64_t)salt << 40) ^ ((uint64_t)block << 20) ^ t) & 0xFFFF);
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

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layers_mask),
      cmocka_unit_test(test_layers_mask_full),
      cmocka_unit_test(test_load_poll_ram),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
