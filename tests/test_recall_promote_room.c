/* test_recall_promote_room.c - a recalled block found as a warm copy is
 * made hot only when that can happen: the weakest evictable blocks leave
 * for it only when leaving frees enough of the layer's budget and the
 * block is free to move (no reader pins it); else nothing leaves and it
 * stays warm (engine/recall.c, promote_recalled). */
#include <math.h>

#include "recall_fx.h"

static void fx_open(fx *f, double budget, double warm, uint32_t window) {
  f->dir = tu_tmpdir();
  f->sh = tu_shape_small(KVT_F32);
  kvt_options o;
  cu_opts(&o, KVT_BACKEND_PREAD);
  o.tier_bytes_limit[KVT_TIER_WARM] = 16u << 20;
  f->e = tu_open(f->dir, &o);
  kvt_ns_id ns = f->ns = tu_register(f->e, "m", &f->sh);
  assert_int_equal(kvt_ns_set_codec(f->e, ns, KVT_ALL_LAYERS, KVT_CODEC_K8, KVT_CODEC_V3), 0);
  assert_int_equal(kvt_seq_create(f->e, ns, &f->s), 0);
  fx_write_blocks(f, 8.0f); /* the target's channel 8 */
  assert_int_equal(kvt_sync(f->e), 0);
  kvt_policy p;
  kvt_policy_init(&p);
  assert_int_equal(kvt_policy_parse("recent", &p.scorer), 0);
  p.budget = budget;
  p.recall = 1;
  p.warm = warm;
  p.window_blocks = window;
  assert_int_equal(kvt_seq_set_policy(f->s, &p), 0);
}

/* Layer 0's retained blocks: a bit mask, and the warm ones. */
static uint32_t retained(fx *f, uint32_t *warm) {
  kvt_gathered g[BLOCKS];
  size_t n = 0;
  assert_int_equal(kvt_seq_retained(f->s, 0, g, BLOCKS, &n), 0);
  uint32_t m = 0;
  *warm = 0;
  for (size_t i = 0; i < n; i++) {
    m |= 1u << g[i].block;
    if (g[i].tier == KVT_TIER_WARM) *warm |= 1u << g[i].block;
  }
  return m;
}

static uint64_t promotions(fx *f) {
  kvt_policy_info pi;
  assert_int_equal(kvt_seq_policy_info(f->s, 0, &pi), 0);
  assert_true(pi.kept_bytes <= pi.budget_bytes);
  return pi.promotions;
}

static int popcount(uint32_t m) { return __builtin_popcount(m); }

/* Budget 0.5, a quarter of it warm: blocks 3 and 4 warm, 5..7 hot; the
 * target (1) left. A query drifts to it: it comes back, its warm copy
 * re-referenced, and is made hot exact; the weakest leave for it. */
static void test_promoted_when_room(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0.5, 0.25, 0);
  uint32_t warm, before = retained(&f, &warm);
  assert_int_equal(before, 0xf8u);
  assert_int_equal(warm, 0x18u);
  uint64_t p0 = promotions(&f);
  step(&f);
  uint32_t after = retained(&f, &warm);
  assert_true(after & (1u << TARGET));
  assert_int_equal(warm & (1u << TARGET), 0);
  assert_int_equal(promotions(&f), p0 + 1);
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.recalls, 1);
  fx_close(&f);
}

/* The same, but a reader holds the target's warm copy (a kvt_load_submit
 * not yet waited for pins it): it cannot move, so it comes back warm and
 * nothing but the one block its recall displaced leaves for it. Once the
 * reader is done, the next step makes it hot. */
static void test_pinned_evicts_nothing(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0.5, 0.25, 0);
  uint32_t warm, before = retained(&f, &warm);
  assert_int_equal(before, 0xf8u);
  uint8_t *buf = malloc(2 * f.kv.bytes);
  assert_non_null(buf);
  kvt_load_req rq = {.key = f.target_key, .layer = 0, .k_out = buf, .v_out = buf + f.kv.bytes,
                     .bytes_each = f.kv.bytes};
  kvt_load *ld = NULL;
  assert_int_equal(kvt_load_submit(f.e, f.ns, &rq, 1, &ld), 0);
  uint64_t p0 = promotions(&f);
  step(&f);
  kvt_stats st;
  tu_stats(f.e, &st);
  assert_int_equal(st.recalls, 1);
  uint32_t after = retained(&f, &warm);
  assert_true(after & (1u << TARGET));
  assert_true(warm & (1u << TARGET)); /* pinned: still warm */
  assert_int_equal(promotions(&f), p0);
  /* one block left for the recall, none for a promotion that cannot be */
  assert_int_equal(popcount(before & ~after), 1);
  size_t ok = 0;
  assert_int_equal(kvt_load_wait(ld, &ok), 0);
  assert_int_equal(ok, 1);
  free(buf);
  fx_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_promoted_when_room),
      cmocka_unit_test(test_pinned_evicts_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
