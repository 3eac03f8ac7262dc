/* test_calib_alloc.c - the arithmetic of `kvtier calibrate`
 * (tools/refmodel/calib.c): greedy shares keep the total budget and the
 * per-layer cap of 1, go to the layers that lose most without them, and
 * each layer takes its best scorer; PyramidKV shares fall with depth,
 * keep the mean and the cap. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "calib.h"
#include "testutil.h"

#define T_LAYERS 6u
#define T_SCORERS 3u
#define T_GRID 20u

static double grid[T_GRID];
static double loss[T_LAYERS * T_SCORERS * T_GRID];

static calib_table make_table(void) {
  for (uint32_t g = 0; g < T_GRID; g++) grid[g] = (g + 1.0) / T_GRID;
  return (calib_table){T_LAYERS, T_SCORERS, T_GRID, grid, loss};
}

static double *at(uint32_t l, uint32_t s) { return loss + ((size_t)l * T_SCORERS + s) * T_GRID; }

/* Random loss curves that fall from about 1 to 0 at share 1, each layer
 * with its own steepness and noise (not convex). */
static void random_curves(void) {
  for (uint32_t l = 0; l < T_LAYERS; l++)
    for (uint32_t s = 0; s < T_SCORERS; s++) {
      double k = 1 + tu_below(30);
      for (uint32_t g = 0; g < T_GRID; g++)
        at(l, s)[g] = g + 1 == T_GRID ? 0 : exp(-k * grid[g]) * (0.8 + 0.4 * tu_below(1000) / 1e3);
    }
}

static void check_alloc(const calib_table *t, double budget) {
  double share[T_LAYERS], sum = 0;
  uint32_t sc[T_LAYERS];
  assert_int_equal(calib_allocate(t, budget, 1.0 / T_GRID, share, sc), 0);
  for (uint32_t l = 0; l < T_LAYERS; l++) {
    assert_true(share[l] > 0);
    assert_true(share[l] <= 1 + 1e-12);
    assert_true(sc[l] < T_SCORERS);
    for (uint32_t s = 0; s < T_SCORERS; s++) /* its scorer is the best at its share */
      assert_true(calib_loss_at(t, l, sc[l], share[l]) <= calib_loss_at(t, l, s, share[l]));
    sum += share[l];
  }
  if (fabs(sum - budget * T_LAYERS) > 1e-9)
    fail_msg("shares sum to %.12f, budget %g x %u layers", sum, budget, T_LAYERS);
}

static void test_total_and_caps(void **state) {
  (void)state;
  calib_table t = make_table();
  const double budgets[] = {0.01, 0.05, 0.1, 0.25, 0.333, 0.5, 0.77, 0.95, 1.0};
  for (int round = 0; round < 20; round++) {
    random_curves();
    for (size_t i = 0; i < sizeof budgets / sizeof *budgets; i++) check_alloc(&t, budgets[i]);
  }
}

/* Layer 2 loses everything it does not keep, the others nothing: layer 2
 * gets all it can (1), the rest split what is left evenly enough. */
static void test_sensitive_layer_first(void **state) {
  (void)state;
  calib_table t = make_table();
  for (uint32_t l = 0; l < T_LAYERS; l++)
    for (uint32_t s = 0; s < T_SCORERS; s++)
      for (uint32_t g = 0; g < T_GRID; g++) at(l, s)[g] = l == 2 ? 1 - grid[g] : 0.001 * (1 - grid[g]);
  double share[T_LAYERS];
  uint32_t sc[T_LAYERS];
  assert_int_equal(calib_allocate(&t, 0.3, 0.05, share, sc), 0);
  assert_true(fabs(share[2] - 1) < 1e-9);
  for (uint32_t l = 0; l < T_LAYERS; l++)
    if (l != 2) assert_true(share[l] < 0.3);
}

/* The best scorer differs by layer: layer l's scorer l % 3 loses half. */
static void test_scorer_per_layer(void **state) {
  (void)state;
  calib_table t = make_table();
  for (uint32_t l = 0; l < T_LAYERS; l++)
    for (uint32_t s = 0; s < T_SCORERS; s++)
      for (uint32_t g = 0; g < T_GRID; g++) at(l, s)[g] = (1 - grid[g]) * (s == l % 3 ? 0.5 : 1);
  double share[T_LAYERS];
  uint32_t sc[T_LAYERS];
  assert_int_equal(calib_allocate(&t, 0.25, 0.05, share, sc), 0);
  for (uint32_t l = 0; l < T_LAYERS; l++) assert_int_equal(sc[l], l % 3);
}

/* A flat stretch then a drop: the lookahead still finds the drop. */
static void test_flat_then_drop(void **state) {
  (void)state;
  calib_table t = make_table();
  for (uint32_t l = 0; l < T_LAYERS; l++)
    for (uint32_t s = 0; s < T_SCORERS; s++)
      for (uint32_t g = 0; g < T_GRID; g++)
        at(l, s)[g] = l == 0 ? (grid[g] < 0.2 ? 0.9 : 0.0) : 0.3 * (1 - grid[g]);
  double share[T_LAYERS];
  uint32_t sc[T_LAYERS];
  assert_int_equal(calib_allocate(&t, 0.2, 0.05, share, sc), 0);
  assert_true(share[0] >= 0.2 - 1e-9);
}

static void test_bad_arguments(void **state) {
  (void)state;
  calib_table t = make_table();
  random_curves();
  double share[T_LAYERS];
  uint32_t sc[T_LAYERS];
  assert_int_equal(calib_allocate(&t, 0, 0.05, share, sc), -1);
  assert_int_equal(calib_allocate(&t, 1.01, 0.05, share, sc), -1);
  assert_int_equal(calib_allocate(&t, 0.5, 0, share, sc), -1);
  calib_table bad = t;
  double g2[T_GRID];
  for (uint32_t g = 0; g < T_GRID; g++) g2[g] = grid[T_GRID - 1 - g]; /* decreasing */
  bad.grid = g2;
  assert_int_equal(calib_allocate(&bad, 0.5, 0.05, share, sc), -1);
  assert_int_equal(calib_pyramid(4, 0.5, 0, share), -1);
  assert_int_equal(calib_pyramid(0, 0.5, 0.5, share), -1);
}

static void test_pyramid(void **state) {
  (void)state;
  double share[T_LAYERS];
  const double budgets[] = {0.05, 0.1, 0.25, 0.5, 0.7, 0.9, 1.0};
  for (size_t i = 0; i < sizeof budgets / sizeof *budgets; i++) {
    double b = budgets[i], sum = 0;
    assert_int_equal(calib_pyramid(T_LAYERS, b, 1.0 / 3, share), 0);
    for (uint32_t l = 0; l < T_LAYERS; l++) {
      assert_true(share[l] > 0 && share[l] <= 1 + 1e-12);
      if (l) assert_true(share[l] <= share[l - 1] + 1e-12);
      sum += share[l];
    }
    if (fabs(sum - b * T_LAYERS) > 1e-9) fail_msg("pyramid at %g sums to %.12f", b, sum);
  }
  /* below any cap: linear, last = ratio x first */
  assert_int_equal(calib_pyramid(T_LAYERS, 0.25, 1.0 / 3, share), 0);
  assert_true(fabs(share[T_LAYERS - 1] - share[0] / 3) < 1e-12);
  assert_true(fabs((share[0] - share[1]) - (share[1] - share[2])) < 1e-12);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_total_and_caps),   cmocka_unit_test(test_sensitive_layer_first),
      cmocka_unit_test(test_scorer_per_layer), cmocka_unit_test(test_flat_then_drop),
      cmocka_unit_test(test_bad_arguments),    cmocka_unit_test(test_pyramid),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
