/* calib.h - the arithmetic of `kvtier calibrate` (tools/calibrate.c):
 * per-layer budget shares and scorers chosen by greedy marginal gain from
 * a table of measured losses, and PyramidKV-style shares that fall
 * linearly with depth. Pure functions, no I/O, so tests call them. */
#ifndef KVT_REFMODEL_CALIB_H
#define KVT_REFMODEL_CALIB_H

#include <stddef.h>
#include <stdint.h>

#define CALIB_MAX_LAYERS 1024u
#define CALIB_MAX_SCORERS 16u
#define CALIB_MAX_GRID 256u

/* Measured loss (lower is better; here the share of full-cache attention
 * mass on blocks the policy no longer retains) of each layer under each
 * scorer at each budget share of the grid:
 * loss[((size_t)layer * n_scorers + scorer) * n_grid + g] at share grid[g].
 * grid is increasing, in (0, 1]. */
typedef struct calib_table {
  uint32_t n_layers, n_scorers, n_grid;
  const double *grid;
  const double *loss;
} calib_table;

/* The loss of (layer, scorer) at any share: linear between grid points,
 * between (0, 1) and the first point below it, the last point's above it. */
double calib_loss_at(const calib_table *t, uint32_t layer, uint32_t scorer, double share);

/* Choose per layer a share in (0, 1] and a scorer so that the shares'
 * mean is budget: every layer starts at min(budget, grid[0]); the rest
 * goes out in increments of step (the last one smaller), each to the
 * layer with the best loss reduction per increment over the next few
 * increments (so a flat stretch before a drop does not stall it), where a
 * layer's loss at a share is its best scorer's; no layer above 1. Then
 * each layer takes the scorer with the least loss at its share.
 * 0; -1 for bad arguments (budget outside (0, 1], step <= 0, a table
 * over the limits above). */
int calib_allocate(const calib_table *t, double budget, double step, double *share,
                   uint32_t *scorer);

/* PyramidKV-style shares: linear in depth, layer 0 the largest, the last
 * layer `ratio` (in (0, 1]) times the first, mean budget; a layer that
 * would go above 1 is held at 1 and the excess spread over the others in
 * the same proportions. 0; -1 for bad arguments. */
int calib_pyramid(uint32_t n_layers, double budget, double ratio, double *share);

#endif
