/* policy.c - retention policies: which blocks of a (sequence, layer) stay
 * retained (attended). A sequence's policy is a scorer (policy.h, one file
 * each) and a budget; after every put and every observation of a layer,
 * the lowest scored retained blocks beyond the budget leave that layer of
 * that sequence: its reference is dropped, so the tiers may evict the
 * block, and nothing else changes (other sequences keep their own). The
 * per-block state the scorers read is fed by kvt_seq_observe(). */
#include <math.h>
#include <string.h>

#include "engine/internal.h"
#include "engine/policy.h"

static const kvt_scorer *const scorers[KVT_N_SCORERS] = {
    NULL, /* full: no scorer, nothing leaves */
    &kvt_scorer_recent,
    &kvt_scorer_sink_recent,
    &kvt_scorer_h2o,
};

void kvt_policy_init(kvt_policy *p) {
  if (!p) return;
  *p = (kvt_policy){.scorer = KVT_SCORER_FULL, .sink_blocks = 1, .hot_share = 1.0};
}

const char *kvt_policy_name(uint32_t scorer) {
  if (scorer == KVT_SCORER_FULL) return "full";
  return scorer < KVT_N_SCORERS ? scorers[scorer]->name : NULL;
}

int kvt_policy_parse(const char *name, uint32_t *scorer) {
  if (!name || !scorer) return KVT_ENULL;
  for (uint32_t i = 0; i < KVT_N_SCORERS; i++)
    if (strcmp(name, kvt_policy_name(i)) == 0) {
      *scorer = i;
      return 0;
    }
  return KVT_EOPTION;
}

/* Blocks a layer may keep when the sequence has n_blocks. */
static uint32_t budget_blocks(const kvt_policy *p, uint32_t n_blocks) {
  double keep = ceil(p->hot_share * (double)n_blocks);
  if (keep < 1) keep = 1;
  return keep >= n_blocks ? n_blocks : (uint32_t)keep;
}

/* Drop (s, block, layer) from the retained set. With the lock held. */
static void evict(kvt_seq *s, uint32_t block, uint32_t layer) {
  size_t i = (size_t)block * s->ns->desc.shape.n_layers + layer;
  kvt_lblk_unref(s->e, s->lb[i]);
  s->lb[i] = NULL;
  memset(&s->bs[i], 0, sizeof s->bs[i]);
  s->bs[i].left = 1;
}

static int retained_at(const kvt_seq *s, uint32_t block, uint32_t layer) {
  const kvt_lblk *lb = s->lb[(size_t)block * s->ns->desc.shape.n_layers + layer];
  return lb && lb->tier != KVT_TIER_COLD;
}

/* Evict the lowest scored retained block of the layer; ties go to the
 * older block. Blocks are few (a context's worth), so a linear scan per
 * eviction is cheaper than sorting. */
static void evict_weakest(kvt_seq *s, uint32_t layer, const kvt_scorer *sc) {
  uint32_t L = s->ns->desc.shape.n_layers, victim = UINT32_MAX;
  double worst = INFINITY;
  for (uint32_t b = 0; b < s->n_blocks; b++) {
    if (!retained_at(s, b, layer)) continue;
    kvt_score_in in = {.block = b, .n_blocks = s->n_blocks, .st = &s->bs[(size_t)b * L + layer],
                       .pol = &s->pol};
    double v = sc->score(&in);
    if (v < worst) { /* strict: the first (oldest) of equal scores */
      worst = v;
      victim = b;
    }
  }
  if (victim != UINT32_MAX) evict(s, victim, layer);
}

void kvt_policy_apply_locked(kvt_seq *s, uint32_t layer) {
  if (s->pol.scorer == KVT_SCORER_FULL) return;
  const kvt_scorer *sc = scorers[s->pol.scorer];
  uint32_t keep = budget_blocks(&s->pol, s->n_blocks), n = 0;
  for (uint32_t b = 0; b < s->n_blocks; b++) n += (uint32_t)retained_at(s, b, layer);
  for (; n > keep; n--) evict_weakest(s, layer, sc);
}

int kvt_seq_set_policy(kvt_seq *s, const kvt_policy *p) {
  if (!s || !p) return KVT_ENULL;
  kvt_engine *e = s->e;
  if (p->scorer >= KVT_N_SCORERS)
    return KVT_ERR(e, KVT_EOPTION, "kvt_seq_set_policy", "scorer", "a kvt_scorer_id (0..3)", "%u",
                   p->scorer);
  if (!(p->hot_share > 0 && p->hot_share <= 1))
    return KVT_ERR(e, KVT_EOPTION, "kvt_seq_set_policy", "hot_share", "in (0, 1]", "%g",
                   p->hot_share);
  pthread_mutex_lock(&e->lock);
  s->pol = *p;
  for (uint32_t l = 0; l < s->ns->desc.shape.n_layers; l++) kvt_policy_apply_locked(s, l);
  pthread_mutex_unlock(&e->lock);
  return 0;
}

int kvt_seq_observe(kvt_seq *s, uint32_t layer, const float *block_mass, size_t n_blocks) {
  if (!s || (n_blocks && !block_mass)) return KVT_ENULL;
  uint32_t L = s->ns->desc.shape.n_layers;
  if (layer >= L) return KVT_ENOTFOUND;
  kvt_engine *e = s->e;
  for (size_t i = 0; i < n_blocks; i++)
    if (!(block_mass[i] >= 0) || !isfinite(block_mass[i]))
      return KVT_ERR(e, KVT_EOPTION, "kvt_seq_observe", "block_mass[i]", "finite and >= 0",
                     "%g at i = %zu", block_mass[i], i);
  int rc = 0;
  pthread_mutex_lock(&e->lock);
  size_t n = kvt_retained_pin(s, layer, NULL, NULL);
  if (n != n_blocks) {
    rc = KVT_ERR(e, KVT_ECOUNT, "kvt_seq_observe", "n_blocks", "the number of retained blocks",
                 "%zu (%zu retained)", n_blocks, n);
  } else {
    for (uint32_t b = 0, i = 0; b < s->n_blocks; b++) {
      if (!retained_at(s, b, layer)) continue;
      kvt_bstate *st = &s->bs[(size_t)b * L + layer];
      st->mass_sum += block_mass[i];
      st->mass_last = block_mass[i++];
      st->observed++;
    }
    kvt_policy_apply_locked(s, layer);
  }
  pthread_mutex_unlock(&e->lock);
  return rc;
}

/* The blocks kvt_seq_nonresident() counts, in block order, as cold. */
static void list_away(const kvt_seq *s, uint32_t layer, kvt_gathered *blocks) {
  uint32_t bt = s->ns->desc.shape.block_tokens;
  for (uint32_t b = 0, i = 0; b < s->n_blocks; b++)
    if (kvt_seq_away(s, b, layer))
      blocks[i++] = (kvt_gathered){.block = b, .token_pos = b * bt, .tier = KVT_TIER_COLD};
}

int kvt_seq_retained(kvt_seq *s, uint32_t layer, kvt_gathered *blocks, size_t max_blocks,
                     size_t *n_blocks) {
  if (!s || !n_blocks || (max_blocks && !blocks)) return KVT_ENULL;
  uint32_t bt = s->ns->desc.shape.block_tokens;
  if (layer >= s->ns->desc.shape.n_layers) return KVT_ENOTFOUND;
  kvt_engine *e = s->e;
  pthread_mutex_lock(&e->lock);
  uint32_t away = kvt_seq_nonresident(s, layer);
  size_t n = away ? away : kvt_retained_pin(s, layer, NULL, NULL);
  int rc = away ? KVT_ENOTRESIDENT : n > max_blocks && blocks ? KVT_EBUFSIZE : 0;
  if (away && blocks && max_blocks >= away) list_away(s, layer, blocks);
  if (rc == KVT_EBUFSIZE)
    KVT_ERR(e, rc, "kvt_seq_retained", "max_blocks", "at least the retained blocks",
            "%zu (%zu retained)", max_blocks, n);
  for (uint32_t b = 0, i = 0; !rc && blocks && b < s->n_blocks; b++) {
    if (!retained_at(s, b, layer)) continue;
    const kvt_lblk *lb = s->lb[(size_t)b * s->ns->desc.shape.n_layers + layer];
    blocks[i++] = (kvt_gathered){.block = b, .token_pos = b * bt, .tier = lb->tier,
                                 .exact = lb->tier == KVT_TIER_HOT};
  }
  pthread_mutex_unlock(&e->lock);
  *n_blocks = n;
  return rc;
}

int kvt_seq_block_mass(kvt_seq *s, uint32_t block, uint32_t layer, double *mass_sum,
                       float *mass_last, uint32_t *observed) {
  if (!s || !mass_sum || !mass_last || !observed) return KVT_ENULL;
  uint32_t L = s->ns->desc.shape.n_layers;
  if (block >= s->n_blocks || layer >= L) return KVT_ENOTFOUND;
  const kvt_bstate *st = &s->bs[(size_t)block * L + layer];
  *mass_sum = st->mass_sum;
  *mass_last = st->mass_last;
  *observed = st->observed;
  return 0;
}
