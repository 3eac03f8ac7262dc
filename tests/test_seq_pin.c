/* test_seq_pin.c - request pins (kvt_seq_pin/kvt_seq_unpin): while one
 * sequence is pinned, another thread's puts under hot-tier pressure demote
 * the unpinned sequence's blocks and never the pinned one's (checked
 * through kvt_seq_retained's tier and exact flag and through the bytes a
 * gather returns); unpinning lets them go; the bound (the hot tier keeps
 * room for one token block besides all pins) refuses a pin with
 * KVT_ELIMIT and changes nothing, counts shared blocks once, and a refused
 * re-pin keeps the previous pin. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef struct fixture {
  char *dir;
  kvt_engine *e;
  kvt_shape sh;
  kvt_ns_id ns;
  uint64_t salt;
  uint64_t cost; /* hot bytes of one layer block */
  tu_kv kv;
} fixture;

static void tokens_of(uint32_t who, uint32_t block, uint32_t bt, uint32_t *out) {
  for (uint32_t t = 0; t < bt; t++)
    out[t] = (uint32_t)(tu_mix(((uint64_t)who << 40) ^ ((uint64_t)block << 20) ^ t) & 0xFFFF);
}

/* Hot bytes of one layer block of sh, as the engine charges them. */
static uint64_t layer_block_cost(const kvt_shape *sh) {
  char *dir = tu_tmpdir();
  kvt_engine *e = tu_open(dir, NULL);
  kvt_ns_id ns = tu_register(e, "cost", sh);
  tu_kv kv;
  tu_kv_alloc(&kv, sh);
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  uint32_t tok[4];
  tokens_of(99, 0, sh->block_tokens, tok);
  tu_append_put(s, sh, tu_salt("cost"), tok, &kv);
  kvt_stats st;
  tu_stats(e, &st);
  kvt_seq_release(s);
  tu_kv_free(&kv);
  kvt_engine_close(e);
  tu_rmtree(dir);
  assert_int_equal(st.tier_bytes[KVT_TIER_HOT] % sh->n_layers, 0);
  return st.tier_bytes[KVT_TIER_HOT] / sh->n_layers;
}

/* A hot tier of hot_blocks layer blocks and a roomy warm tier. */
static void fx_open(fixture *f, uint32_t hot_blocks) {
  memset(f, 0, sizeof *f);
  f->sh = tu_shape_small(KVT_F16);
  f->cost = layer_block_cost(&f->sh);
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = hot_blocks * f->cost;
  o.tier_bytes_limit[KVT_TIER_WARM] = 1u << 20;
  f->dir = tu_tmpdir();
  f->e = tu_open(f->dir, &o);
  f->ns = tu_register(f->e, "pin", &f->sh);
  f->salt = tu_salt("pin");
  tu_kv_alloc(&f->kv, &f->sh);
}

static void fx_close(fixture *f) {
  tu_kv_free(&f->kv);
  kvt_engine_close(f->e);
  tu_rmtree(f->dir);
}

/* A sequence of n token blocks of its own (who), every layer put. */
static kvt_seq *seq_new(fixture *f, uint32_t who, uint32_t n) {
  kvt_seq *s;
  assert_int_equal(kvt_seq_create(f->e, f->ns, &s), 0);
  uint32_t tok[4];
  for (uint32_t b = 0; b < n; b++) {
    tokens_of(who, b, f->sh.block_tokens, tok);
    assert_int_equal(tu_append_put(s, &f->sh, f->salt, tok, &f->kv), 0);
  }
  return s;
}

/* How many of s's retained layer blocks are exact (hot), over all layers;
 * checks that exact and the tier agree. */
static uint32_t exact_blocks(const fixture *f, kvt_seq *s) {
  uint32_t n_exact = 0;
  kvt_gathered g[64];
  for (uint32_t l = 0; l < f->sh.n_layers; l++) {
    size_t n = 0;
    assert_int_equal(kvt_seq_retained(s, l, g, 64, &n), 0);
    assert_int_equal(n, kvt_seq_blocks(s));
    for (size_t i = 0; i < n; i++) {
      assert_int_equal(g[i].exact, g[i].tier == KVT_TIER_HOT);
      n_exact += g[i].exact;
    }
  }
  return n_exact;
}

typedef struct putter {
  fixture *f;
  uint32_t who, n;
  kvt_seq *s;
} putter;

static void *putter_main(void *arg) {
  putter *p = arg;
  p->s = seq_new(p->f, p->who, p->n); /* cmocka asserts are fine: joined before checks */
  return NULL;
}

/* Sequence a (older, so first in LRU order) is pinned; b is not. Another
 * thread puts enough to demote 8 layer blocks: all of them are b's. */
static void test_pin_under_pressure(void **state) {
  (void)state;
  fixture f;
  fx_open(&f, 16); /* four token blocks of four layers */
  kvt_seq *a = seq_new(&f, 1, 2), *b = seq_new(&f, 2, 2);
  assert_int_equal(exact_blocks(&f, a), 8);
  assert_int_equal(exact_blocks(&f, b), 8);
  assert_int_equal(kvt_seq_pin(a), 0);
  putter p = {.f = &f, .who = 3, .n = 2};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, putter_main, &p), 0);
  pthread_join(th, NULL);
  assert_non_null(p.s);
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.demotions, 8);
  assert_int_equal(exact_blocks(&f, a), 8); /* the pinned one kept every block hot */
  assert_int_equal(exact_blocks(&f, b), 0); /* the unpinned one gave them all */
  uint32_t tok[8];
  tokens_of(1, 0, f.sh.block_tokens, tok);
  tokens_of(1, 1, f.sh.block_tokens, tok + f.sh.block_tokens);
  tu_assert_gather(a, &f.sh, f.salt, tok, 2); /* and its bytes are the exact ones */

  /* Unpinned, a's blocks are the least recent: the next puts take them. */
  assert_int_equal(kvt_seq_unpin(a), 0);
  assert_int_equal(kvt_seq_unpin(a), 0); /* nothing to do */
  kvt_seq *d = seq_new(&f, 4, 1);
  assert_int_equal(exact_blocks(&f, a), 4);
  kvt_seq_release(d);
  kvt_seq_release(p.s);
  kvt_seq_release(b);
  kvt_seq_release(a);
  fx_close(&f);
}

/* A sequence's own puts under pressure demote its own older blocks, never
 * the pinned ones of another; releasing a pinned sequence lets go of its pin. */
static void test_pin_own_puts(void **state) {
  (void)state;
  fixture f;
  fx_open(&f, 8);
  kvt_seq *a = seq_new(&f, 1, 1); /* 4 of 8 layer blocks */
  assert_int_equal(kvt_seq_pin(a), 0);
  kvt_seq *b = seq_new(&f, 2, 3); /* 12 more: 8 of them demoted, never a's */
  assert_int_equal(exact_blocks(&f, a), 4);
  assert_int_equal(exact_blocks(&f, b), 4);
  kvt_seq_release(b);
  kvt_seq_release(a); /* released while pinned: the pin goes with it */
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.seqs, 0);
  fx_close(&f);
}

/* The bound: pins of every sequence together leave one token block (four
 * layer blocks here) of the hot tier's 16. */
static void test_pin_bound(void **state) {
  (void)state;
  fixture f;
  fx_open(&f, 16);
  kvt_seq *a = seq_new(&f, 1, 2), *b = seq_new(&f, 2, 2); /* 8 + 8: hot is full */
  assert_int_equal(kvt_seq_pin(a), 0);                    /* 8 <= 12 */
  assert_int_equal(kvt_seq_pin(b), KVT_ELIMIT);           /* 8 + 8 > 12 */
  kvt_error_info info;
  assert_int_equal(kvt_last_error(f.e, &info), 0);
  assert_int_equal(info.code, KVT_ELIMIT);
  assert_string_equal(info.call, "kvt_seq_pin");
  fprintf(stderr, "refused: %s\n", info.message);
  kvt_seq *fa;
  assert_int_equal(kvt_seq_fork(a, UINT32_MAX, &fa), 0);
  assert_int_equal(kvt_seq_pin(fa), 0); /* the same blocks: counted once */
  assert_int_equal(kvt_seq_pin(a), 0);  /* again: the same set, allowed */
  assert_int_equal(kvt_seq_unpin(a), 0);
  assert_int_equal(kvt_seq_pin(b), KVT_ELIMIT); /* the fork still pins a's blocks */
  assert_int_equal(kvt_seq_unpin(fa), 0);
  assert_int_equal(kvt_seq_pin(b), 0);          /* refusals leave nothing behind */
  /* The refused pin changed nothing: with b pinned, pressure demotes a. */
  kvt_seq *c = seq_new(&f, 3, 1);
  assert_int_equal(exact_blocks(&f, b), 8);
  assert_int_equal(exact_blocks(&f, a), 4);
  kvt_seq_release(c);
  kvt_seq_release(fa);
  kvt_seq_release(b);
  kvt_seq_release(a);
  assert_int_equal(kvt_seq_pin(NULL), KVT_ENULL);
  assert_int_equal(kvt_seq_unpin(NULL), KVT_ENULL);
  fx_close(&f);
}

/* A pin covers the blocks retained at the call. A re-pin over the bound
 * is refused and keeps the previous pin: the new blocks can be demoted,
 * the pinned ones cannot. One sequence filling the hot tier cannot pin. */
static void test_repin_refused_keeps_pin(void **state) {
  (void)state;
  fixture f;
  fx_open(&f, 16);
  kvt_seq *a = seq_new(&f, 1, 2);
  assert_int_equal(kvt_seq_pin(a), 0);
  uint32_t tok[4];
  for (uint32_t blk = 2; blk < 4; blk++) { /* a grows to fill the hot tier */
    tokens_of(1, blk, f.sh.block_tokens, tok);
    assert_int_equal(tu_append_put(a, &f.sh, f.salt, tok, &f.kv), 0);
  }
  assert_int_equal(exact_blocks(&f, a), 16);
  assert_int_equal(kvt_seq_pin(a), KVT_ELIMIT); /* 16 > 12 */
  kvt_seq *c = seq_new(&f, 3, 2);               /* 8 demotions: a's unpinned blocks */
  kvt_gathered g[8];
  for (uint32_t l = 0; l < f.sh.n_layers; l++) {
    size_t n = 0;
    assert_int_equal(kvt_seq_retained(a, l, g, 8, &n), 0);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++) assert_int_equal(g[i].exact, g[i].block < 2);
  }
  kvt_seq_release(c);
  assert_int_equal(kvt_seq_unpin(a), 0);
  kvt_seq_release(a);

  kvt_seq *full = seq_new(&f, 5, 4); /* every hot byte is its own */
  assert_int_equal(exact_blocks(&f, full), 16);
  assert_int_equal(kvt_seq_pin(full), KVT_ELIMIT);
  kvt_seq_release(full);
  fx_close(&f);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pin_under_pressure),
      cmocka_unit_test(test_pin_own_puts),
      cmocka_unit_test(test_pin_bound),
      cmocka_unit_test(test_repin_refused_keeps_pin),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
