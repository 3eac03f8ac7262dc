/* test_store.c - the store interface (tiers/store.h): the table picks the
 * implementation a configuration asks for (none, metadata-only, disk),
 * and the metadata store answers through the method table as cold_meta
 * does: writes, finds, prefixes, drops, stats; a missing method is a
 * no-op or KVT_ENOTFOUND. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "tiers/store.h"

static kvt_key key_of(uint8_t v) {
  kvt_key k;
  memset(k.b, v, sizeof k.b);
  return k;
}

static void test_pick(void **state) {
  (void)state;
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_store *s = (kvt_store *)1;
  /* no cold limit, no directory: no durable tier */
  assert_int_equal(kvt_store_open(&m, &(kvt_store_config){.meta_only = 1}, &s), 0);
  assert_null(s);
  /* metadata-only with a limit: the in-memory one */
  assert_int_equal(kvt_store_open(&m, &(kvt_store_config){.meta_only = 1, .bytes_limit = 1 << 20},
                                  &s), 0);
  assert_non_null(s);
  assert_string_equal(s->m->name, "metadata");
  assert_int_equal(kvt_store_caps(s), KVT_STORE_INLINE);
  kvt_store_close(s);
  /* a reader of a directory without an index: none */
  char *dir = tu_tmpdir();
  assert_int_equal(kvt_store_open(&m, &(kvt_store_config){.dir = dir, .rdonly = 1}, &s), 0);
  assert_null(s);
  assert_int_equal(kvt_store_has_index(dir), 0);
  tu_rmtree(dir);
  assert_int_equal(kvt_mem_total(&m), 0); /* every allocation of the store went back */
  kvt_mem_fini(&m);
}

static void test_meta_methods(void **state) {
  (void)state;
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_store *s;
  uint64_t rec = kvt_store_record_bytes(2, 4096);
  kvt_store_config cfg = {.meta_only = 1, .bytes_limit = 3 * rec};
  assert_int_equal(kvt_store_open(&m, &cfg, &s), 0);
  assert_int_equal(kvt_store_record_max(s, 2, 4096), rec);
  kvt_store_rec r[3];
  for (int i = 0; i < 3; i++)
    r[i] = (kvt_store_rec){.key = key_of((uint8_t)(i + 1)), .parent = key_of((uint8_t)i),
                           .pos = (uint32_t)i, .n_layers = 2, .dtype = KVT_F16, .bytes_each = 4096};
  size_t written = 0;
  assert_int_equal(kvt_store_write(s, r, 3, &written), 0);
  assert_int_equal(written, 3);
  kvt_key keys[4] = {r[0].key, r[1].key, r[2].key, key_of(9)};
  assert_int_equal(kvt_store_prefix(s, keys, 4), 3);
  assert_int_equal(kvt_store_find(s, &keys[3]), KVT_ENOTFOUND);
  uint64_t dropped = 0;
  assert_int_equal(kvt_store_drop(s, &keys[3], &r[1].key, 1, &dropped), 0);
  assert_int_equal(dropped, 1);
  assert_int_equal(kvt_store_find(s, &r[1].key), KVT_ENOTFOUND);
  assert_int_equal(kvt_store_prefix(s, keys, 4), 1);
  kvt_store_stats st;
  kvt_store_stats_get(s, &st);
  assert_int_equal(st.records, 2);
  assert_int_equal(st.records_written, 3);
  assert_string_equal(st.backend, "metadata");
  /* what the metadata store lacks */
  uint8_t buf[8];
  kvt_store_batch *b = (kvt_store_batch *)1;
  assert_int_equal(kvt_store_read_layer(s, &keys[0], 0, buf, buf, 4), KVT_ENOTFOUND);
  assert_int_equal(kvt_store_read_submit(s, NULL, 0, &b), KVT_ENOTFOUND);
  assert_null(b);
  assert_int_equal(kvt_store_read_done(NULL), 1);
  assert_int_equal(kvt_store_drain(s), 0);
  assert_int_equal(kvt_store_verify(s, 0, NULL, NULL, NULL, NULL), KVT_ENOTFOUND);
  kvt_store_close(s);
  assert_int_equal(kvt_mem_total(&m), 0);
  kvt_mem_fini(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pick),
      cmocka_unit_test(test_meta_methods),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
