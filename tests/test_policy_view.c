/* test_policy_view.c - the three-tier ranking keeps, for one application
 * of the policy, a view of the layer's bytes and of each candidate's tier
 * that follows its own moves instead of re-reading every block after each
 * (policy.c). Its decisions must be the ones re-reading makes: a decode of
 * 1-token blocks with random masses, a fork sharing the prefix (shared
 * blocks stay warm), and a hot tier too small for the sequences (a
 * promotion's room demotes other blocks while the lock is dropped) gives,
 * step after step, the same retained blocks in the same tiers as the code
 * that re-read everything (a digest recorded with it), and every layer is
 * within its budget after every call. */
#include "testutil.h"

#include <string.h>

#define STEPS 160u
#define MAXB 256u

typedef struct fx {
  char *dir;
  kvt_engine *e;
  kvt_shape sh;
  kvt_ns_id ns;
  uint64_t salt, rng;
  tu_kv kv;
  uint32_t tok[MAXB];
  float mass[MAXB];
  kvt_gathered g[MAXB];
} fx;

static void fx_open(fx *f, uint64_t hot_limit) {
  kvt_options o;
  tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = hot_limit;
  o.tier_bytes_limit[KVT_TIER_WARM] = 16u << 20;
  f->dir = tu_tmpdir();
  f->e = tu_open(f->dir, &o);
  f->sh = tu_shape_small(KVT_F32);
  f->sh.block_tokens = 1;
  f->ns = tu_register(f->e, "view-model", &f->sh);
  f->salt = tu_salt("view-model");
  f->rng = 42;
  tu_kv_alloc(&f->kv, &f->sh);
  for (uint32_t i = 0; i < MAXB; i++) f->tok[i] = (uint32_t)tu_rand_r(&f->rng);
}

static void fx_close(fx *f) {
  tu_kv_free(&f->kv);
  kvt_engine_close(f->e);
  tu_rmtree(f->dir);
}

static uint64_t mix(uint64_t h, uint64_t x) { return (h ^ x) * 0x100000001b3ull; }

/* Every layer of s: within budget (once long enough); its retained blocks and their tiers
 * and the tier moves so far folded into h. */
static uint64_t check_layers(fx *f, kvt_seq *s, uint64_t h) {
  for (uint32_t l = 0; l < f->sh.n_layers; l++) {
    kvt_policy_info pi;
    size_t n = 0;
    assert_int_equal(kvt_seq_policy_info(s, l, &pi), 0);
    if (kvt_seq_blocks(s) >= 16) assert_false(pi.over); /* short: protected blocks alone */
    assert_int_equal(kvt_seq_retained(s, l, f->g, MAXB, &n), 0);
    for (size_t i = 0; i < n; i++) h = mix(mix(h, f->g[i].block), f->g[i].tier);
    h = mix(mix(mix(h, pi.promotions), pi.demotions), pi.kept_bytes);
  }
  return h;
}

/* One decoding step of s: the length grows by a token (a block), every
 * layer is observed with random masses. */
static uint64_t step(fx *f, kvt_seq *s, uint32_t pos, uint64_t h) {
  assert_int_equal(kvt_seq_set_tokens(s, (uint64_t)kvt_seq_blocks(s) + 1), 0);
  h = check_layers(f, s, h);
  for (uint32_t l = 0; l < f->sh.n_layers; l++) {
    size_t n = 0;
    assert_int_equal(kvt_seq_retained(s, l, NULL, 0, &n), 0);
    for (size_t i = 0; i < n; i++) f->mass[i] = (float)(tu_rand_r(&f->rng) % 1000) / 1000.0f;
    assert_int_equal(kvt_seq_observe(s, l, f->mass, n), 0);
  }
  h = check_layers(f, s, h);
  tu_append_put(s, &f->sh, f->salt, &f->tok[pos % MAXB], &f->kv);
  return check_layers(f, s, h);
}

static uint64_t run(uint64_t hot_limit, uint64_t *moves) {
  fx f;
  fx_open(&f, hot_limit);
  kvt_seq *a = NULL, *b = NULL;
  assert_int_equal(kvt_seq_create(f.e, f.ns, &a), 0);
  kvt_policy p;
  kvt_policy_init(&p);
  p.scorer = KVT_SCORER_SNAPKV;
  p.budget = 0.3;
  p.warm = 0.6;
  assert_int_equal(kvt_seq_set_policy(a, &p), 0);
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint32_t pos = 0; pos < 24; pos++) h = step(&f, a, pos, h);
  assert_int_equal(kvt_seq_fork(a, kvt_seq_blocks(a), &b), 0);
  assert_int_equal(kvt_seq_set_policy(b, &p), 0);
  for (uint32_t pos = 24; pos < STEPS; pos++) {
    h = step(&f, a, pos, h);
    h = step(&f, b, pos + 100, h); /* the fork goes on with other tokens */
  }
  *moves = 0;
  for (uint32_t l = 0; l < f.sh.n_layers; l++) {
    kvt_policy_info pi;
    assert_int_equal(kvt_seq_policy_info(a, l, &pi), 0);
    *moves += pi.promotions + pi.demotions;
  }
  kvt_seq_release(a);
  kvt_seq_release(b);
  fx_close(&f);
  return h;
}

/* Digests of run() recorded with the policy that re-read every block at
 * every step of an application (before the view). */
#define DIGEST_ROOMY 0xdb288ebc8d6dcb0cull
#define DIGEST_TIGHT 0xc15d2a7bdf954671ull

static void test_same_decisions_roomy(void **state) {
  (void)state;
  uint64_t moves = 0, h = run(64u << 20, &moves);
  assert_true(moves > 100); /* blocks did move between tiers, often */
  print_message("digest roomy 0x%llx\n", (unsigned long long)h);
  assert_int_equal(h, DIGEST_ROOMY);
}

static void test_same_decisions_tight_hot(void **state) {
  (void)state;
  /* room for a few dozen hot layer blocks: promotions demote others */
  uint64_t moves = 0, h = run(48u << 10, &moves);
  assert_true(moves > 100);
  print_message("digest tight 0x%llx\n", (unsigned long long)h);
  assert_int_equal(h, DIGEST_TIGHT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_decisions_roomy),
      cmocka_unit_test(test_same_decisions_tight_hot),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
