/* test_policy_tiers.c - three tiers per layer (docs/policy.md): blocks
 * ranked below the hot share go warm and are still retained; a warm block
 * that ranks into the hot set by the margin is promoted, exact from the
 * cold tier when its token block is durable there, dequantized (and not
 * exact) without it; a block at the margin does not flap; byte budgets
 * hold at every step under forks and shared blocks while blocks move
 * between tiers. Rankings are set with the "external" scorer's hints. */
#include "cold_util.h"

#include <math.h>

#define NB 8u     /* blocks of the fixed sequences */
#define MAXB 96u

typedef struct fx {
  char *dir;
  kvt_engine *e;
  kvt_shape sh;
  kvt_ns_id ns;
  uint64_t salt;
  tu_kv kv;
  uint32_t tok[MAXB * 8];
} fx;

/* An engine with a warm tier, and with a cold tier when cold is set. */
static void fx_open(fx *f, int cold) {
  kvt_options o;
  if (cold) cu_opts(&o, KVT_BACKEND_PREAD);
  else tu_opts(&o);
  o.tier_bytes_limit[KVT_TIER_WARM] = 16u << 20;
  f->dir = tu_tmpdir();
  f->e = tu_open(f->dir, &o);
  f->sh = tu_shape_small(KVT_F32);
  f->ns = tu_register(f->e, "tiers-model", &f->sh);
  f->salt = tu_salt("tiers-model");
  tu_kv_alloc(&f->kv, &f->sh);
  for (size_t i = 0; i < sizeof f->tok / sizeof f->tok[0]; i++) f->tok[i] = (uint32_t)tu_rand();
}

static void fx_close(fx *f) {
  tu_kv_free(&f->kv);
  kvt_engine_close(f->e);
  tu_rmtree(f->dir);
}

static void put_blocks(fx *f, kvt_seq *s, uint32_t from, uint32_t to) {
  for (uint32_t b = from; b < to; b++)
    tu_append_put(s, &f->sh, f->salt, f->tok + b * f->sh.block_tokens, &f->kv);
}

/* The external scorer ranks; nothing is protected. */
static kvt_policy tiers_policy(double budget, double warm, double margin) {
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(kvt_policy_parse("external", &p.scorer), 0);
  p.budget = budget;
  p.warm = warm;
  p.margin = margin;
  p.sink_blocks = 0;
  p.window_blocks = 0;
  p.delay = 0;
  return p;
}

static void hint_all(kvt_seq *s, const kvt_shape *sh, const float *score) {
  for (uint32_t l = 0; l < sh->n_layers; l++)
    assert_int_equal(kvt_seq_hint(s, l, score, kvt_seq_blocks(s)), 0);
}

/* The tier of block b in (s, layer) as kvt_seq_retained lists it, or -1
 * when it is not retained; *exact its exact flag. */
static int tier_of(kvt_seq *s, uint32_t layer, uint32_t b, uint32_t *exact) {
  kvt_gathered g[MAXB];
  size_t n;
  assert_int_equal(kvt_seq_retained(s, layer, g, MAXB, &n), 0);
  for (size_t i = 0; i < n; i++)
    if (g[i].block == b) {
      if (exact) *exact = g[i].exact;
      return (int)g[i].tier;
    }
  return -1;
}

/* Gather (s, layer) and copy block b's K and V out (f32). */
static void gather_block(fx *f, kvt_seq *s, uint32_t layer, uint32_t b, float *k, float *v) {
  size_t each = kvt_shape_block_bytes(&f->sh), cap = each * MAXB, n;
  uint8_t *ko = malloc(cap), *vo = malloc(cap);
  kvt_gathered g[MAXB];
  assert_non_null(ko);
  assert_non_null(vo);
  size_t be = cap;
  assert_int_equal(kvt_seq_gather(s, layer, ko, vo, &be, g, MAXB, &n), 0);
  size_t i = 0;
  while (i < n && g[i].block != b) i++;
  assert_true(i < n);
  memcpy(k, ko + i * each, each);
  memcpy(v, vo + i * each, each);
  free(ko);
  free(vo);
}

static kvt_seq *seq_new(fx *f) {
  kvt_seq *s = NULL;
  assert_int_equal(kvt_seq_create(f->e, f->ns, &s), 0);
  return s;
}

/* A sequence of the NB fixed blocks (durable first when cold), ranked by
 * score under a budget of 0.5, a warm share of 0.5 and a margin of 0.1. */
static kvt_seq *ranked_seq(fx *f, int cold, const float *score) {
  kvt_seq *s = seq_new(f);
  put_blocks(f, s, 0, NB);
  if (cold) {
    assert_int_equal(kvt_sync(f->e), 0);
    assert_int_equal(kvt_seq_durable(s), NB);
  }
  hint_all(s, &f->sh, score);
  kvt_policy p = tiers_policy(0.5, 0.5, 0.1);
  assert_int_equal(kvt_seq_set_policy(s, &p), 0);
  return s;
}

/* Blocks 0, 1 hot; 2..5 warm; 6, 7 out: budget 0.5 of 8 blocks is 4 hot
 * blocks' bytes, half of it warm (2 hot blocks; a warm block takes less
 * than half a hot one, so 4 fit). Then block 5 is scored first: it is
 * promoted in place of block 1 (the weakest hot), which goes warm. */
static void promote_case(fx *f, int cold, float *k_warm, float *v_warm, kvt_seq **out) {
  float score[NB] = {80, 70, 60, 50, 40, 30, 20, 10};
  kvt_seq *s = ranked_seq(f, cold, score);
  for (uint32_t l = 0; l < f->sh.n_layers; l++) {
    uint32_t ex = 0;
    assert_int_equal(tier_of(s, l, 0, &ex), KVT_TIER_HOT);
    assert_int_equal(ex, 1);
    assert_int_equal(tier_of(s, l, 1, NULL), KVT_TIER_HOT);
    for (uint32_t b = 2; b < 6; b++) assert_int_equal(tier_of(s, l, b, NULL), KVT_TIER_WARM);
    assert_int_equal(tier_of(s, l, 6, NULL), -1);
    assert_int_equal(tier_of(s, l, 7, NULL), -1);
  }
  gather_block(f, s, 0, 5, k_warm, v_warm); /* its warm form, decoded */
  score[5] = 1000;
  hint_all(s, &f->sh, score);
  assert_int_equal(kvt_seq_set_tokens(s, NB * f->sh.block_tokens), 0); /* applies the policy */
  *out = s;
}

/* promote_case's engine and sequence, with K and V buffers of one layer
 * block: block 5's warm form (kw, vw) and a gather (k, v). */
typedef struct promo {
  fx f;
  size_t each;
  float *kw, *vw, *k, *v;
  kvt_seq *s;
} promo;

static void promo_open(promo *p, int cold) {
  fx_open(&p->f, cold);
  p->each = kvt_shape_block_bytes(&p->f.sh);
  p->kw = malloc(p->each), p->vw = malloc(p->each);
  p->k = malloc(p->each), p->v = malloc(p->each);
  promote_case(&p->f, cold, p->kw, p->vw, &p->s);
}

static void promo_close(promo *p) {
  kvt_seq_release(p->s);
  free(p->kw), free(p->vw), free(p->k), free(p->v);
  fx_close(&p->f);
}

static void test_promote_exact_from_cold(void **state) {
  (void)state;
  promo pc;
  promo_open(&pc, 1);
  for (uint32_t l = 0; l < pc.f.sh.n_layers; l++) {
    uint32_t ex = 0;
    assert_int_equal(tier_of(pc.s, l, 5, &ex), KVT_TIER_HOT);
    assert_int_equal(ex, 1);
    assert_int_equal(tier_of(pc.s, l, 1, NULL), KVT_TIER_WARM);
    kvt_policy_info pi;
    assert_int_equal(kvt_seq_policy_info(pc.s, l, &pi), 0);
    assert_int_equal(pi.promotions, 1);
    assert_int_equal(pi.promotions_exact, 1);
    assert_true(pi.kept_bytes <= pi.budget_bytes);
    /* exact: the bytes put, bit for bit */
    tu_assert_block(pc.s, &pc.f.sh, pc.f.salt, 5, l, pc.f.tok + 5 * pc.f.sh.block_tokens);
    gather_block(&pc.f, pc.s, l, 5, pc.k, pc.v);
    tu_kv_fill(&pc.f.kv, &pc.f.sh, pc.f.salt, l, 5, pc.f.tok + 5 * pc.f.sh.block_tokens);
    assert_memory_equal(pc.k, pc.f.kv.k, pc.each);
    assert_memory_equal(pc.v, pc.f.kv.v, pc.each);
  }
  assert_true(memcmp(pc.kw, pc.k, pc.each) != 0 || memcmp(pc.vw, pc.v, pc.each) != 0); /* warm was not exact */
  promo_close(&pc);
}

static void test_promote_dequantized_without_cold(void **state) {
  (void)state;
  promo pc;
  promo_open(&pc, 0);
  for (uint32_t l = 0; l < pc.f.sh.n_layers; l++) {
    uint32_t ex = 1;
    assert_int_equal(tier_of(pc.s, l, 5, &ex), KVT_TIER_HOT);
    assert_int_equal(ex, 0); /* approximate */
    kvt_policy_info pi;
    assert_int_equal(kvt_seq_policy_info(pc.s, l, &pi), 0);
    assert_int_equal(pi.promotions, 1);
    assert_int_equal(pi.promotions_exact, 0);
    assert_true(pi.kept_bytes <= pi.budget_bytes);
    gather_block(&pc.f, pc.s, l, 5, pc.k, pc.v);
    if (l == 0) { /* the warm form's values, now hot: what attention read before */
      assert_memory_equal(pc.k, pc.kw, pc.each);
      assert_memory_equal(pc.v, pc.vw, pc.each);
    }
    tu_kv_fill(&pc.f.kv, &pc.f.sh, pc.f.salt, l, 5, pc.f.tok + 5 * pc.f.sh.block_tokens);
    assert_true(memcmp(pc.k, pc.f.kv.k, pc.each) != 0 || memcmp(pc.v, pc.f.kv.v, pc.each) != 0);
  }
  promo_close(&pc);
}

/* Block 5 (warm) is scored just below, then just above, the weakest hot
 * block but within the margin, many times over: nothing moves. Past the
 * margin it is promoted once; then the two swap scores within the margin
 * again and stay where they are. */
static void test_hysteresis(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  float score[NB] = {80, 70, 60, 50, 40, 30, 20, 10};
  kvt_seq *s = ranked_seq(&f, 0, score);
  kvt_policy_info pi0;
  assert_int_equal(kvt_seq_policy_info(s, 0, &pi0), 0);
  for (int i = 0; i < 50; i++) {
    score[5] = i % 2 ? 69.0f : 76.0f; /* block 1 (hot) at 70; 77 would pass */
    hint_all(s, &f.sh, score);
    assert_int_equal(kvt_seq_set_tokens(s, NB * f.sh.block_tokens), 0);
    assert_int_equal(tier_of(s, 0, 5, NULL), KVT_TIER_WARM);
    assert_int_equal(tier_of(s, 0, 1, NULL), KVT_TIER_HOT);
  }
  kvt_policy_info pi;
  assert_int_equal(kvt_seq_policy_info(s, 0, &pi), 0);
  assert_int_equal(pi.promotions, pi0.promotions);
  assert_int_equal(pi.demotions, pi0.demotions);
  score[5] = 78; /* past the margin: one swap */
  hint_all(s, &f.sh, score);
  assert_int_equal(kvt_seq_set_tokens(s, NB * f.sh.block_tokens), 0);
  assert_int_equal(tier_of(s, 0, 5, NULL), KVT_TIER_HOT);
  assert_int_equal(tier_of(s, 0, 1, NULL), KVT_TIER_WARM);
  for (int i = 0; i < 50; i++) { /* now block 1 is the warm one near the margin */
    score[5] = 70;
    score[1] = i % 2 ? 76.0f : 72.0f;
    hint_all(s, &f.sh, score);
    assert_int_equal(kvt_seq_set_tokens(s, NB * f.sh.block_tokens), 0);
    assert_int_equal(tier_of(s, 0, 1, NULL), KVT_TIER_WARM);
  }
  assert_int_equal(kvt_seq_policy_info(s, 0, &pi), 0);
  assert_int_equal(pi.promotions, pi0.promotions + 1);
  assert_int_equal(pi.demotions, pi0.demotions + 1);
  kvt_seq_release(s);
  fx_close(&f);
}

/* The bytes the budget counts for (s, layer), from the retained list:
 * hot at f16 size, warm at the codecs' encoded size, the tail at f16. */
static uint64_t counted(fx *f, kvt_seq *s, uint32_t layer, uint64_t tail, size_t *n_ret) {
  const kvt_shape *sh = &f->sh;
  uint64_t tb = 2ull * sh->n_kv_heads * sh->head_dim * 2;
  kvt_codec_shape cs = {.n_tokens = sh->block_tokens, .n_heads = sh->n_kv_heads,
                        .head_dim = sh->head_dim};
  uint64_t warm = kvt_codec_size(KVT_CODEC_K8, &cs) + kvt_codec_size(KVT_CODEC_V3, &cs);
  kvt_gathered g[MAXB];
  size_t n;
  assert_int_equal(kvt_seq_retained(s, layer, g, MAXB, &n), 0);
  uint64_t bytes = tail * tb;
  for (size_t i = 0; i < n; i++) {
    assert_true(g[i].tier == KVT_TIER_HOT || g[i].tier == KVT_TIER_WARM);
    bytes += g[i].tier == KVT_TIER_HOT ? tb * sh->block_tokens : warm;
  }
  *n_ret = n;
  return bytes;
}

static void check_budget(fx *f, kvt_seq *s, uint64_t tail, uint64_t *moves) {
  uint64_t tokens = (uint64_t)kvt_seq_blocks(s) * f->sh.block_tokens + tail;
  for (uint32_t l = 0; l < f->sh.n_layers; l++) {
    kvt_policy_info pi;
    size_t n;
    assert_int_equal(kvt_seq_policy_info(s, l, &pi), 0);
    uint64_t bytes = counted(f, s, l, tail, &n);
    assert_int_equal(pi.tokens, tokens);
    assert_int_equal(pi.kept_bytes, bytes);
    if (n) assert_true(bytes <= pi.budget_bytes); /* the tail alone may pass it */
    *moves += pi.promotions + pi.demotions;
  }
}

/* A parent and two forks share their prefix; all three go on with blocks
 * of their own under random rankings (so blocks move hot <-> warm and
 * leave), each with its own budget; after every call every layer of every
 * sequence is within its budget, counted from what it retains. */
static void test_budget_forks_shared(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 1);
  kvt_seq *s[3] = {seq_new(&f), NULL, NULL};
  kvt_policy p = tiers_policy(0.4, 0.6, 0.05);
  assert_int_equal(kvt_seq_set_policy(s[0], &p), 0);
  put_blocks(&f, s[0], 0, 12);
  assert_int_equal(kvt_sync(f.e), 0);
  assert_int_equal(kvt_seq_fork(s[0], 12, &s[1]), 0);
  assert_int_equal(kvt_seq_fork(s[0], 10, &s[2]), 0);
  p = tiers_policy(0.3, 0.5, 0.05);
  assert_int_equal(kvt_seq_set_policy(s[2], &p), 0);
  float score[MAXB];
  uint64_t moves = 0;
  uint32_t next[3] = {12, 12, 10};
  uint64_t tails[3] = {0, 0, 0};
  uint32_t bt = f.sh.block_tokens;
  for (int step = 0; step < 120; step++) {
    int i = step % 3;
    uint32_t nb = kvt_seq_blocks(s[i]);
    for (uint32_t b = 0; b < nb; b++) score[b] = (float)tu_below(1000);
    hint_all(s[i], &f.sh, score);
    tails[i] = tu_below(bt);
    assert_int_equal(kvt_seq_set_tokens(s[i], (uint64_t)nb * bt + tails[i]), 0);
    for (int j = 0; j < 3; j++) check_budget(&f, s[j], tails[j], &moves);
    if (step % 4 == 3 && next[i] < MAXB / 2) { /* a block of its own */
      /* forks diverge: other tokens than the parent's */
      uint32_t *t = f.tok + (size_t)(next[i] + (uint32_t)i * 30u) * bt;
      tu_append_put(s[i], &f.sh, f.salt, t, &f.kv);
      next[i]++;
      tails[i] = 0;
      assert_int_equal(kvt_seq_set_tokens(s[i], (uint64_t)kvt_seq_blocks(s[i]) * bt), 0);
      for (int j = 0; j < 3; j++) check_budget(&f, s[j], tails[j], &moves);
    }
  }
  assert_true(moves > 0); /* blocks did move between tiers */
  for (int j = 0; j < 3; j++) kvt_seq_release(s[j]);
  fx_close(&f);
}

/* Bad warm shares and margins are refused, naming the field. */
static void test_refused(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  kvt_seq *s = seq_new(&f);
  const double bad_warm[] = {-0.1, 1.0, NAN};
  for (size_t i = 0; i < 3; i++) {
    kvt_policy p = tiers_policy(0.5, bad_warm[i], 0.1);
    assert_int_equal(kvt_seq_set_policy(s, &p), KVT_EOPTION);
  }
  const double bad_margin[] = {-1, 101, NAN};
  for (size_t i = 0; i < 3; i++) {
    kvt_policy p = tiers_policy(0.5, 0.5, bad_margin[i]);
    assert_int_equal(kvt_seq_set_policy(s, &p), KVT_EOPTION);
  }
  kvt_seq_release(s);
  fx_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_promote_exact_from_cold),
      cmocka_unit_test(test_promote_dequantized_without_cold),
      cmocka_unit_test(test_hysteresis),
      cmocka_unit_test(test_budget_forks_shared),
      cmocka_unit_test(test_refused),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
