/* score_snapkv.c - "snapkv" (SnapKV): a block's importance is the mean
 * mass it received over the last SNAP_W observations (the observation
 * window), pooled over neighbouring blocks so that a kept block keeps its
 * context: the score is the largest windowed mean within a pooling
 * radius of about SNAP_POOL_TOKENS tokens on each side. Scored once
 * observed (default delay 1). */
#include "engine/policy.h"

#define SNAP_W 8u              /* observations averaged */
#define SNAP_POOL_TOKENS 3u    /* pooling half-width in tokens (SnapKV's kernel of 7) */
#define SNAP_RING 128u         /* the pooling's ring of raw means; radius at most half */

typedef struct snap_st {
  float ring[SNAP_W];          /* the last SNAP_W masses */
  uint32_t head, count;
} snap_st;

static void observe_snapkv(const kvt_pctx *c, const kvt_pblk *b, float mass) {
  (void)c;
  snap_st *st = b->st;
  st->ring[st->head] = mass;
  st->head = (st->head + 1) % SNAP_W;
  if (st->count < SNAP_W) st->count++;
}

static double window_mean(const snap_st *st) {
  if (!st->count) return 0;
  double s = 0;
  for (uint32_t i = 0; i < st->count; i++) s += st->ring[i];
  return s / st->count;
}

static void score_snapkv(const kvt_pctx *c, const kvt_pblk *b, size_t n, double *out) {
  uint32_t radius = (SNAP_POOL_TOKENS + c->block_tokens / 2) / c->block_tokens;
  for (size_t i = 0; i < n; i++) out[i] = window_mean(b[i].st);
  if (!radius) return;
  /* max-pool over blocks within radius (by block index), in place: scan
   * with the raw means kept aside in a small ring (a power of two above
   * the radius: the blocks behind within it are the ring's last) */
  double prev[SNAP_RING];
  if (radius > SNAP_RING / 2) radius = SNAP_RING / 2;
  for (size_t i = 0; i < n; i++) {
    double best = out[i];
    for (size_t j = i; j-- > 0 && b[i].block - b[j].block <= radius;)
      if (prev[j & (SNAP_RING - 1)] > best) best = prev[j & (SNAP_RING - 1)];
    for (size_t j = i + 1; j < n && b[j].block - b[i].block <= radius; j++)
      if (out[j] > best) best = out[j];
    prev[i & (SNAP_RING - 1)] = out[i];
    out[i] = best;
  }
}

const kvt_scorer kvt_scorer_snapkv = {.id = KVT_SCORER_SNAPKV, .name = "snapkv",
                                      .state_bytes = sizeof(snap_st), .default_delay = 1,
                                      .observe = observe_snapkv, .score = score_snapkv};
