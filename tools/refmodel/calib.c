/* calib.c - greedy per-layer budget allocation and PyramidKV shares for
 * `kvtier calibrate` (calib.h). */
#include <math.h>

#include "calib.h"

/* Increments a layer looks ahead when rating its next one. */
#define CALIB_LOOKAHEAD 8u
#define CALIB_EPS 1e-12

static int table_ok(const calib_table *t) {
  if (!t || !t->grid || !t->loss || t->n_layers == 0 || t->n_layers > CALIB_MAX_LAYERS ||
      t->n_scorers == 0 || t->n_scorers > CALIB_MAX_SCORERS || t->n_grid == 0 ||
      t->n_grid > CALIB_MAX_GRID)
    return 0;
  for (uint32_t g = 0; g < t->n_grid; g++)
    if (!(t->grid[g] > 0 && t->grid[g] <= 1) || (g && !(t->grid[g] > t->grid[g - 1]))) return 0;
  return 1;
}

double calib_loss_at(const calib_table *t, uint32_t layer, uint32_t scorer, double share) {
  const double *y = t->loss + ((size_t)layer * t->n_scorers + scorer) * t->n_grid;
  const double *x = t->grid;
  if (share >= x[t->n_grid - 1]) return y[t->n_grid - 1];
  double x0 = 0, y0 = 1;
  for (uint32_t g = 0; g < t->n_grid; g++) {
    if (share <= x[g]) return y0 + (y[g] - y0) * (share - x0) / (x[g] - x0);
    x0 = x[g];
    y0 = y[g];
  }
  return y0;
}

/* A layer's loss at a share: its best scorer's. */
static double envelope(const calib_table *t, uint32_t layer, double share, uint32_t *best) {
  double min = INFINITY;
  for (uint32_t s = 0; s < t->n_scorers; s++) {
    double v = calib_loss_at(t, layer, s, share);
    if (v < min) {
      min = v;
      if (best) *best = s;
    }
  }
  return min;
}

/* The best loss reduction per increment a layer at share `at` gets from
 * its next 1..CALIB_LOOKAHEAD increments of inc that stay <= 1. */
static double rate(const calib_table *t, uint32_t layer, double at, double inc, double left) {
  double here = envelope(t, layer, at, NULL), best = -INFINITY;
  for (uint32_t k = 1; k <= CALIB_LOOKAHEAD; k++) {
    double to = at + inc * k;
    if (to > 1 + CALIB_EPS || inc * k > left + CALIB_EPS) break;
    double r = (here - envelope(t, layer, to > 1 ? 1 : to, NULL)) / k;
    if (r > best) best = r;
  }
  return best;
}

int calib_allocate(const calib_table *t, double budget, double step, double *share,
                   uint32_t *scorer) {
  if (!table_ok(t) || !share || !scorer || !(budget > 0 && budget <= 1) || !(step > 0))
    return -1;
  uint32_t L = t->n_layers;
  double start = budget < t->grid[0] ? budget : t->grid[0];
  for (uint32_t l = 0; l < L; l++) share[l] = start;
  double left = (budget - start) * L;
  while (left > CALIB_EPS) {
    double inc = left < step ? left : step, best = -INFINITY;
    uint32_t pick = L;
    for (uint32_t l = 0; l < L; l++) {
      if (share[l] + inc > 1 + CALIB_EPS) continue;
      double r = rate(t, l, share[l], inc, left);
      if (r > best) { /* strict: ties go to the shallower layer */
        best = r;
        pick = l;
      }
    }
    if (pick == L) break; /* every layer at 1: cannot happen while budget <= 1 */
    share[pick] += inc;
    if (share[pick] > 1) share[pick] = 1;
    left -= inc;
  }
  for (uint32_t l = 0; l < L; l++) envelope(t, l, share[l], &scorer[l]);
  return 0;
}

int calib_pyramid(uint32_t n_layers, double budget, double ratio, double *share) {
  if (!share || n_layers == 0 || n_layers > CALIB_MAX_LAYERS || !(budget > 0 && budget <= 1) ||
      !(ratio > 0 && ratio <= 1))
    return -1;
  uint8_t capped[CALIB_MAX_LAYERS] = {0};
  double total = budget * n_layers;
  /* Layers whose share would pass 1 are held at 1, and the rest scaled
   * again over what is left, until none passes. */
  for (uint32_t round = 0; round <= n_layers; round++) {
    double fixed = 0, free_w = 0;
    for (uint32_t l = 0; l < n_layers; l++) {
      /* weight of layer l: 1 at the first, ratio at the last */
      double w = n_layers > 1 ? 1 + (ratio - 1) * l / (n_layers - 1) : 1;
      share[l] = capped[l] ? 1 : w;
      if (capped[l]) fixed += 1;
      else free_w += w;
    }
    if (free_w <= 0) break;
    double k = (total - fixed) / free_w;
    int again = 0;
    for (uint32_t l = 0; l < n_layers; l++) {
      if (capped[l]) continue;
      share[l] *= k;
      if (share[l] > 1) capped[l] = 1, again = 1;
    }
    if (!again) break;
  }
  return 0;
}
