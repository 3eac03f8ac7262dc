/* policy.c - retention policies: which blocks of a (sequence, layer) stay
 * retained (attended). Per layer a scorer (policy.h, one file each) and a
 * byte budget, a fraction of the layer's full f16 cache for the
 * sequence's length, counting what attention reads: retained hot blocks
 * at f16 size, warm ones at their encoded size, and the tail the caller
 * holds. After every put, observation and length change of a layer, the
 * lowest scored blocks that are not protected (sinks, the newest window,
 * blocks still in their scoring delay) leave until the layer fits: its
 * reference is dropped, so the tiers may evict the block, and nothing
 * else changes (other sequences keep their own). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"
#include "engine/internal.h"
#include "engine/policy.h"
#include "engine/recall.h"

/* One line per scorer; the index is its id. NULL: "full" (keeps
 * everything) and "auto" (resolved per layer from a profile). */
static const kvt_scorer *const scorers[] = {
    NULL, /* full */
    &kvt_scorer_recent,
    &kvt_scorer_sink_recent,
    &kvt_scorer_h2o,
    &kvt_scorer_snapkv,
    &kvt_scorer_tova,
    &kvt_scorer_external,
    &kvt_scorer_learned,
    NULL, /* auto */
};
#define N_SCORERS (sizeof scorers / sizeof scorers[0])

/* "auto" without a profile: every layer this scorer. */
#define AUTO_DEFAULT KVT_SCORER_SNAPKV

const kvt_scorer *kvt_scorer_get(uint32_t id) { return id < N_SCORERS ? scorers[id] : NULL; }

void kvt_policy_init(kvt_policy *p) {
  if (!p) return;
  *p = (kvt_policy){.scorer = KVT_SCORER_FULL, .sink_blocks = KVT_POLICY_DEFAULT, .budget = 1.0,
                    .window_blocks = KVT_POLICY_DEFAULT, .delay = KVT_POLICY_DEFAULT,
                    .margin = 0.1};
}

const char *kvt_policy_name(uint32_t scorer) {
  if (scorer == KVT_SCORER_FULL) return "full";
  if (scorer == KVT_SCORER_AUTO) return "auto";
  return scorer < N_SCORERS ? scorers[scorer]->name : NULL;
}

int kvt_policy_parse(const char *name, uint32_t *scorer) {
  if (!name || !scorer) return KVT_ENULL;
  for (uint32_t i = 0; i < N_SCORERS; i++)
    if (strcmp(name, kvt_policy_name(i)) == 0) {
      *scorer = i;
      return 0;
    }
  return KVT_EOPTION;
}

/* ---- bytes, as the budget counts them ---------------------------------- */

/* K and V of one token of one layer at 2 bytes an element. */
static uint64_t token_bytes(const kvt_shape *sh) {
  return 2ull * sh->n_kv_heads * sh->head_dim * 2;
}

/* What a retained layer block costs against the budget: f16 size when
 * hot, its encoded size when warm (a side left exact counts at f16). */
static uint64_t block_bytes(const kvt_nsrec *ns, const kvt_lblk *lb) {
  const kvt_shape *sh = &ns->desc.shape;
  if (lb->tier != KVT_TIER_WARM) return token_bytes(sh) * sh->block_tokens;
  kvt_codec_shape cs = {.n_tokens = sh->block_tokens, .n_heads = sh->n_kv_heads,
                        .head_dim = sh->head_dim};
  uint64_t half = (uint64_t)sh->block_tokens * sh->n_kv_heads * sh->head_dim * 2;
  uint64_t k = lb->k_codec ? kvt_codec_size(lb->k_codec, &cs) : half;
  uint64_t v = lb->v_codec ? kvt_codec_size(lb->v_codec, &cs) : half;
  return k + v;
}

/* block_bytes() with the warm sizes of the last codec pair kept: a layer
 * has one pair in practice, and a size is two codec-table look-ups. */
typedef struct bytes_memo {
  int k_codec, v_codec; /* -1: nothing kept yet */
  uint64_t warm;
} bytes_memo;

static uint64_t block_bytes_memo(const kvt_nsrec *ns, const kvt_lblk *lb, bytes_memo *m) {
  if (lb->tier != KVT_TIER_WARM) return block_bytes(ns, lb);
  if (m->k_codec != lb->k_codec || m->v_codec != lb->v_codec) {
    m->k_codec = lb->k_codec;
    m->v_codec = lb->v_codec;
    m->warm = block_bytes(ns, lb);
  }
  return m->warm;
}

/* The sequence's length: what the caller said, or its full blocks. */
static uint64_t seq_tokens(const kvt_seq *s) {
  uint64_t full = (uint64_t)s->n_blocks * s->ns->desc.shape.block_tokens;
  return s->n_tokens > full ? s->n_tokens : full;
}

static uint32_t tier_at(const kvt_seq *s, uint32_t block, uint32_t layer) {
  const kvt_lblk *lb = s->lb[(size_t)block * s->ns->desc.shape.n_layers + layer];
  return lb ? lb->tier : KVT_TIER_COLD;
}

static int retained_at(const kvt_seq *s, uint32_t block, uint32_t layer) {
  const kvt_lblk *lb = s->lb[(size_t)block * s->ns->desc.shape.n_layers + layer];
  return lb && lb->tier != KVT_TIER_COLD;
}

/* "full" has no per-layer policies: everything, budget 1. */
static const kvt_lpol lpol_full = {.scorer = KVT_SCORER_FULL, .share = 1.0};

static const kvt_lpol *layer_pol(const kvt_seq *s, uint32_t layer) {
  return s->lp ? &s->lp[layer] : &lpol_full;
}

/* The byte figures of (s, layer) but its blocks' (kept and warm: the
 * tail only). */
static void layer_bytes_start(const kvt_seq *s, uint32_t layer, kvt_policy_info *o) {
  const kvt_shape *sh = &s->ns->desc.shape;
  uint64_t tb = token_bytes(sh), tokens = seq_tokens(s);
  uint64_t tail = tokens - (uint64_t)s->n_blocks * sh->block_tokens;
  const kvt_lpol *lp = layer_pol(s, layer);
  memset(o, 0, sizeof *o);
  o->scorer = lp->scorer;
  o->share = lp->share;
  o->tokens = tokens;
  o->full_bytes = tokens * tb;
  o->budget_bytes = (uint64_t)floor(lp->share * (double)o->full_bytes);
  o->kept_tokens = tail;
  o->kept_bytes = tail * tb;
  o->warm_share = lp->warm;
  o->promotions = lp->promotions;
  o->promotions_exact = lp->promotions_exact;
  o->demotions = lp->demotions;
}

/* One pass over the layer's block slots: the byte figures of (s, layer)
 * into o and, when pb is given, its retained blocks listed in block order
 * (returns how many). The sequence's arrays are read into locals first:
 * the list's stores could otherwise alias them, and every slot would
 * reload them. Sums of integers, in any order the same. */
static uint32_t layer_scan(const kvt_seq *s, uint32_t layer, kvt_policy_info *o, kvt_pblk *pb) {
  const kvt_shape *sh = &s->ns->desc.shape;
  uint32_t L = sh->n_layers, nb = s->n_blocks, n = 0;
  kvt_lblk *const *lbs = s->lb + layer;
  kvt_bstate *bs = s->bs + layer;
  uint8_t *ss = s->ss;
  size_t stride = s->ss_stride;
  uint64_t bt = sh->block_tokens, hot_bytes = token_bytes(sh) * bt;
  uint64_t kept = 0, kept_bytes = 0, warm = 0, warm_bytes = 0;
  bytes_memo memo = {.k_codec = -1, .v_codec = -1};
  layer_bytes_start(s, layer, o);
  for (uint32_t b = 0; b < nb; b++) {
    const kvt_lblk *lb = lbs[(size_t)b * L];
    if (lb && lb->tier == KVT_TIER_COLD && kvt_recall_reading(s, b, layer)) {
      kept++; /* counted at hot size, not listed: it is on its way */
      kept_bytes += hot_bytes;
      continue;
    }
    if (!lb || lb->tier == KVT_TIER_COLD) continue;
    kept++;
    if (lb->tier == KVT_TIER_WARM) {
      uint64_t wb = block_bytes_memo(s->ns, lb, &memo);
      warm++;
      warm_bytes += wb;
      kept_bytes += wb;
    } else {
      kept_bytes += hot_bytes;
    }
    if (!pb) continue;
    size_t at = (size_t)b * L;
    pb[n++] = (kvt_pblk){.block = b, .tier = lb->tier, .bs = &bs[at],
                         .st = stride ? ss + (at + layer) * stride : NULL};
  }
  o->kept_tokens += kept * bt;
  o->kept_bytes += kept_bytes;
  o->warm_tokens += warm * bt;
  o->warm_bytes += warm_bytes;
  o->over = o->kept_bytes > o->budget_bytes;
  return n;
}

/* layer_bytes() and the retained blocks of (s, layer) listed in block
 * order in the ranking scratch, in one pass; returns how many. */
static uint32_t layer_list(kvt_seq *s, uint32_t layer, kvt_policy_info *o) {
  return layer_scan(s, layer, o, s->scratch_pb);
}

/* Fill the byte figures of (s, layer). */
static void layer_bytes(const kvt_seq *s, uint32_t layer, kvt_policy_info *o) {
  layer_scan(s, layer, o, NULL);
}

int64_t kvt_policy_room_locked(const kvt_seq *s, uint32_t layer) {
  kvt_policy_info o;
  layer_bytes(s, layer, &o);
  return (int64_t)o.budget_bytes - (int64_t)o.kept_bytes;
}

static void ctx_of(const kvt_seq *s, uint32_t layer, kvt_pctx *c) {
  const kvt_shape *sh = &s->ns->desc.shape;
  *c = (kvt_pctx){.pol = &s->pol, .lp = layer_pol(s, layer), .model = s->ns->pred,
                  .layer = layer, .n_layers = sh->n_layers, .n_blocks = s->n_blocks,
                  .block_tokens = sh->block_tokens, .n_tokens = seq_tokens(s),
                  .n_kv_heads = sh->n_kv_heads, .head_dim = sh->head_dim};
}

static void *priv_of(const kvt_seq *s, uint32_t block, uint32_t layer) {
  if (!s->ss_stride) return NULL;
  size_t i = (size_t)block * s->ns->desc.shape.n_layers + layer;
  return s->ss + i * s->ss_stride;
}

/* ---- eviction ------------------------------------------------------------- */

/* Drop (s, block, layer) from the retained set. With the lock held. */
static void evict(kvt_seq *s, uint32_t block, uint32_t layer) {
  size_t i = (size_t)block * s->ns->desc.shape.n_layers + layer;
  kvt_recall_on_evict(s, block, layer, s->lb[i]); /* its key sketch, when s recalls */
  kvt_lineage_mark_locked(s, KVT_LOSSY_EVICTED);   /* later blocks are not the plain key's */
  kvt_lblk_unref(s->e, s->lb[i]);
  s->lb[i] = NULL;
  memset(&s->bs[i], 0, sizeof s->bs[i]);
  s->bs[i].left = 1;
  if (s->ss_stride) memset(priv_of(s, block, layer), 0, s->ss_stride);
}

/* May the policy evict this retained block? */
static int evictable(const kvt_seq *s, uint32_t block, uint32_t layer) {
  const kvt_policy *p = &s->pol;
  if (block < p->sink_blocks) return 0;
  if ((uint64_t)block + p->window_blocks >= s->n_blocks) return 0;
  const kvt_bstate *bs = &s->bs[(size_t)block * s->ns->desc.shape.n_layers + layer];
  return bs->observed >= p->delay && !bs->recalled;
}

int kvt_policy_evictable(const kvt_seq *s, uint32_t block, uint32_t layer) {
  return evictable(s, block, layer);
}

void kvt_policy_evict_locked(kvt_seq *s, uint32_t block, uint32_t layer) { evict(s, block, layer); }

typedef struct cand {
  double score;
  uint32_t block;
  uint32_t pad;
} cand;

size_t kvt_policy_scratch_bytes(void) { return sizeof(kvt_pblk) + sizeof(double) + sizeof(cand); }

/* Lowest score first; ties: the older block first. */
static int cand_cmp(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->score != y->score) return x->score < y->score ? -1 : 1;
  return (x->block > y->block) - (x->block < y->block);
}

/* Score every retained block of the layer and list the evictable ones
 * (unordered) in the sequence's scratch (grown with it); returns how many. */
static size_t rank_listed(kvt_seq *s, uint32_t layer, const kvt_scorer *sc, uint32_t n);

static size_t rank_layer(kvt_seq *s, uint32_t layer, const kvt_scorer *sc) {
  uint32_t L = s->ns->desc.shape.n_layers, n = 0;
  kvt_pblk *pb = s->scratch_pb;
  for (uint32_t b = 0; b < s->n_blocks; b++) {
    if (!retained_at(s, b, layer)) continue;
    pb[n++] = (kvt_pblk){.block = b, .tier = tier_at(s, b, layer),
                         .bs = &s->bs[(size_t)b * L + layer], .st = priv_of(s, b, layer)};
  }
  return rank_listed(s, layer, sc, n);
}

/* rank_layer() of the n retained blocks already listed in the scratch. */
static size_t rank_listed(kvt_seq *s, uint32_t layer, const kvt_scorer *sc, uint32_t n) {
  kvt_pblk *pb = s->scratch_pb;
  kvt_pctx c;
  ctx_of(s, layer, &c);
  double *score = s->scratch_score;
  sc->score(&c, pb, n, score);
  cand *cd = (cand *)s->scratch_cand;
  size_t m = 0;
  for (uint32_t i = 0; i < n; i++)
    if (evictable(s, pb[i].block, layer))
      cd[m++] = (cand){.score = isnan(score[i]) ? -INFINITY : score[i], .block = pb[i].block,
                       .pad = pb[i].tier};
  return m;
}

/* Bring the lowest of cd[i..m) (cand_cmp order) to cd[i]. */
static void select_lowest(cand *cd, size_t i, size_t m) {
  size_t low = i;
  for (size_t j = i + 1; j < m; j++)
    if (cand_cmp(&cd[j], &cd[low]) < 0) low = j;
  cand t = cd[i];
  cd[i] = cd[low];
  cd[low] = t;
}

/* Evictions before the rest of the candidates are sorted instead of
 * selected one at a time: a decoding step usually evicts one block (a
 * linear scan), a new policy or a big budget cut many (a sort). */
#define SELECT_FIRST 4

static void tiers_known(kvt_seq *s, uint32_t layer, const kvt_scorer *sc, int allow_promote,
                        const kvt_policy_info *known, uint32_t listed);

/* kvt_policy_apply_locked() with the layer's bytes known and its retained
 * blocks listed in the ranking scratch (listed of them; layer_list(), with
 * the lock held since), or NULL: counted and listed here. */
static void apply_known(kvt_seq *s, uint32_t layer, const kvt_policy_info *known,
                        uint32_t listed) {
  if (!s->lp) return; /* "full" */
  const kvt_lpol *lp = layer_pol(s, layer);
  const kvt_scorer *sc = kvt_scorer_get(lp->scorer);
  if (!sc || lp->share >= 1) return;
  kvt_policy_info o;
  if (lp->warm > 0) {
    if (!known) {
      listed = layer_list(s, layer, &o);
      known = &o;
    }
    tiers_known(s, layer, sc, 1, known, listed);
    return;
  }
  if (known) o = *known;
  else listed = layer_list(s, layer, &o);
  if (o.kept_bytes <= o.budget_bytes) return;
  size_t m = rank_listed(s, layer, sc, listed);
  cand *cd = (cand *)s->scratch_cand;
  uint32_t L = s->ns->desc.shape.n_layers;
  for (size_t i = 0; i < m && o.kept_bytes > o.budget_bytes; i++) {
    if (i < SELECT_FIRST) select_lowest(cd, i, m);
    else if (i == SELECT_FIRST) qsort(cd + i, m - i, sizeof *cd, cand_cmp);
    uint32_t b = cd[i].block;
    o.kept_bytes -= block_bytes(s->ns, s->lb[(size_t)b * L + layer]);
    evict(s, b, layer);
  }
}

void kvt_policy_apply_locked(kvt_seq *s, uint32_t layer) { apply_known(s, layer, NULL, 0); }

static void apply_all(kvt_seq *s) {
  for (uint32_t l = 0; l < s->ns->desc.shape.n_layers; l++) kvt_policy_apply_locked(s, l);
}

/* ---- three tiers per layer ------------------------------------------------- */

/* Tier moves in one application of the policy, at most: a decoding step
 * makes a few (a demotion, an eviction, a promotion); a new policy or a
 * big cut makes many, each a re-scan of the candidates. */
#define TIER_MOVES_MAX 4096
/* Promotions in one application, at most: each reads the cold tier or
 * decodes, so a burst of them is spread over the next steps. */
#define PROMOTE_MAX 2
/* A margin this large turns promotion off (kvt_policy.margin). */
#define KVT_MARGIN_OFF 100.0

/* What one application of the three tiers knows of (s, layer): its bytes
 * (layer_bytes) and, in each candidate's pad, the tier its block is in
 * (KVT_TIER_COLD: not in RAM, or evicted). It is re-read from the blocks
 * only when something else may have moved: the tiers count every block
 * that enters or leaves one, and a stretch without the lock (a demotion
 * encodes, a promotion decodes or reads) that counted only the policy's
 * own move is applied to the view instead. */
typedef struct tview {
  kvt_policy_info o;
  uint64_t moves;   /* the tiers' move count the view is valid at */
  bytes_memo memo;
} tview;

static uint64_t tier_moves(const kvt_engine *e) {
  uint64_t n = 0;
  for (int t = 0; t < KVT_N_TIERS; t++) n += e->tier[t].moves;
  return n;
}

static void view_read(const kvt_seq *s, uint32_t layer, cand *cd, size_t m, tview *v) {
  layer_bytes(s, layer, &v->o);
  for (size_t i = 0; i < m; i++) cd[i].pad = tier_at(s, cd[i].block, layer);
  v->moves = tier_moves(s->e);
}

/* Candidate i (its block in RAM, with the lock held all along) changes
 * tier from its view's to `to` (KVT_TIER_COLD: evicted); bytes is what it
 * counted (before), nb what it counts now. */
static void view_move(const kvt_seq *s, cand *c, uint32_t to, uint64_t bytes, uint64_t nb,
                      tview *v) {
  uint64_t bt = s->ns->desc.shape.block_tokens;
  if (c->pad == KVT_TIER_WARM) {
    v->o.warm_bytes -= bytes;
    v->o.warm_tokens -= bt;
  }
  v->o.kept_bytes -= bytes;
  v->o.kept_tokens -= bt;
  if (to != KVT_TIER_COLD) {
    v->o.kept_bytes += nb;
    v->o.kept_tokens += bt;
  }
  if (to == KVT_TIER_WARM) {
    v->o.warm_bytes += nb;
    v->o.warm_tokens += bt;
  }
  c->pad = to;
  v->o.over = v->o.kept_bytes > v->o.budget_bytes;
}

/* The view is re-read at the next step. */
#define VIEW_STALE UINT64_MAX

/* After a move of candidate c to tier `to` that may have dropped the lock
 * (moves0: the count before it; bytes: what c counted): when the count
 * moved by exactly the two of c leaving its tier and entering `to`, the
 * view follows c; when nothing moved and c is where it was, it stands;
 * else (c evicted instead, other blocks moved) it is re-read. */
static void view_after(const kvt_seq *s, uint32_t layer, cand *c, uint32_t to, uint64_t bytes,
                       uint64_t moves0, tview *v) {
  const kvt_lblk *lb = s->lb[(size_t)c->block * s->ns->desc.shape.n_layers + layer];
  uint64_t now = tier_moves(s->e);
  if (now == moves0 && lb && lb->tier == c->pad) return; /* it stayed: nothing moved */
  if (lb && now == moves0 + 2 && lb->tier == to && c->pad != to && v->moves == moves0) {
    view_move(s, c, to, bytes, block_bytes_memo(s->ns, lb, &v->memo), v);
    v->moves = now;
    return;
  }
  v->moves = VIEW_STALE;
}

/* The candidates in RAM of the lowest score (any RAM tier), the lowest
 * hot one and the highest warm one (cand_cmp order), or -1 each: one
 * scan of the view. */
static void cand_picks(const cand *cd, size_t m, ptrdiff_t *low, ptrdiff_t *low_hot,
                       ptrdiff_t *top) {
  /* cand_cmp() unrolled, the picks' score and block kept at hand */
  double ls = 0, hs = 0, ts = 0;
  uint32_t lb = 0, hb = 0, tb = 0;
  *low = *low_hot = *top = -1;
  for (size_t i = 0; i < m; i++) {
    uint32_t t = cd[i].pad, b = cd[i].block;
    double x = cd[i].score;
    if (t == KVT_TIER_COLD) continue;
    if (*low < 0 || x < ls || (x == ls && b < lb)) {
      *low = (ptrdiff_t)i;
      ls = x;
      lb = b;
    }
    if (t == KVT_TIER_HOT && (*low_hot < 0 || x < hs || (x == hs && b < hb))) {
      *low_hot = (ptrdiff_t)i;
      hs = x;
      hb = b;
    }
    if (t == KVT_TIER_WARM && (*top < 0 || x > ts || (x == ts && b > tb))) {
      *top = (ptrdiff_t)i;
      ts = x;
      tb = b;
    }
  }
}

/* A hot block that is held for the cold tier (its exact bytes not yet
 * written) can be demoted once the flusher has written it: wait for that
 * when it is queued (bounded), so what a demotion loses can come back
 * exact. With the lock held (dropped while waiting). */
static void wait_written(kvt_engine *e, const kvt_lblk *lb) {
  for (int i = 0; i < 64 && lb->held && lb->tb->queued && kvt_flush_on(e); i++)
    kvt_flush_wait_room(e);
}

/* Demote (s, block, layer) to warm; evict it when it cannot be (warm tier
 * off or full, its exact bytes held for the cold tier, a reader on it). */
static void demote_or_evict(kvt_seq *s, uint32_t block, uint32_t layer, kvt_lpol *lp) {
  kvt_engine *e = s->e;
  size_t i = (size_t)block * s->ns->desc.shape.n_layers + layer;
  kvt_lblk *lb = s->lb[i];
  wait_written(e, lb);
  lb = s->lb[i];
  if (lb && lb->tier == KVT_TIER_HOT && !lb->held && kvt_lblk_demote(e, lb) == 0) {
    lp->demotions++;
    kvt_lineage_mark_locked(s, KVT_LOSSY_QUANTIZED); /* later blocks are not the plain key's */
    return;
  }
  lb = s->lb[i];
  if (lb && lb->tier != KVT_TIER_COLD) evict(s, block, layer);
}

/* Promote warm (s, block, layer) to hot; 0 when it moved. A block another
 * sequence references stays warm: its tier is theirs too, and promoting
 * it would spend their budgets. */
static int promote(kvt_seq *s, uint32_t block, uint32_t layer, kvt_lpol *lp) {
  kvt_lblk *lb = s->lb[(size_t)block * s->ns->desc.shape.n_layers + layer];
  int exact = 0;
  if (!lb || lb->tier != KVT_TIER_WARM || lb->refs != 1) return KVT_ESTATE;
  int rc = kvt_lblk_promote(s->e, lb, &exact);
  if (rc) return rc;
  lp->promotions++;
  lp->promotions_exact += (uint64_t)exact;
  return 0;
}

/* Does warm candidate w beat hot candidate h by the policy's margin? */
static int beats(const kvt_seq *s, const cand *w, const cand *h) {
  return s->pol.margin < KVT_MARGIN_OFF && w->score > h->score + s->pol.margin * fabs(h->score);
}

/* Demote candidate c (hot) or evict it, keeping the view. */
static void view_demote(kvt_seq *s, uint32_t layer, cand *c, kvt_lpol *lp, tview *v) {
  uint64_t moves0 = tier_moves(s->e);
  uint64_t bytes = block_bytes_memo(s->ns, s->lb[(size_t)c->block * s->ns->desc.shape.n_layers +
                                                 layer], &v->memo);
  demote_or_evict(s, c->block, layer, lp);
  view_after(s, layer, c, KVT_TIER_WARM, bytes, moves0, v); /* evicted instead: re-read */
}

/* One step of the three-tier ranking of (s, layer) over the candidates cd
 * (scored once per application), with the view v of them: 1 when it moved
 * a block. */
static int tiers_step(kvt_seq *s, uint32_t layer, cand *cd, size_t m, kvt_lpol *lp,
                      int allow_promote, int *promoted, tview *v) {
  const kvt_shape *sh = &s->ns->desc.shape;
  if (v->moves != tier_moves(s->e)) view_read(s, layer, cd, m, v);
  const kvt_policy_info *o = &v->o;
  uint64_t hot = o->kept_bytes - o->warm_bytes, hb = token_bytes(sh) * sh->block_tokens;
  uint64_t hot_cap = (uint64_t)floor((lp->share - lp->warm) * (double)o->full_bytes);
  ptrdiff_t low, low_hot, top;
  cand_picks(cd, m, &low, &low_hot, &top);
  /* 1. the hot share: its weakest block goes warm */
  if (hot > hot_cap && low_hot >= 0) {
    view_demote(s, layer, &cd[low_hot], lp, v);
    return 1;
  }
  /* 2. the whole budget: the weakest block leaves */
  if (o->kept_bytes > o->budget_bytes && low >= 0) {
    const kvt_lblk *lb = s->lb[(size_t)cd[low].block * sh->n_layers + layer];
    uint64_t bytes = block_bytes_memo(s->ns, lb, &v->memo);
    evict(s, cd[low].block, layer); /* the lock held: only this block moved */
    view_move(s, &cd[low], KVT_TIER_COLD, bytes, 0, v);
    v->moves = tier_moves(s->e);
    return 1;
  }
  /* 3. promotion: the strongest warm block, when it beats the weakest hot
   * one by the margin, into room in the hot share, or in its place */
  if (!allow_promote || *promoted >= PROMOTE_MAX || top < 0 || s->pol.margin >= KVT_MARGIN_OFF)
    return 0;
  if (low_hot >= 0 && !beats(s, &cd[top], &cd[low_hot])) return 0;
  const kvt_lblk *w = s->lb[(size_t)cd[top].block * sh->n_layers + layer];
  if (w->refs != 1) return 0;
  uint64_t wb = block_bytes(s->ns, w);
  int room = hot + hb <= hot_cap && o->kept_bytes - wb + hb <= o->budget_bytes;
  if (!room) {
    if (low_hot < 0) return 0;
    view_demote(s, layer, &cd[low_hot], lp, v); /* its place */
  }
  (*promoted)++; /* attempted: a failure is not retried in this application */
  uint64_t moves0 = tier_moves(s->e);
  promote(s, cd[top].block, layer, lp);
  view_after(s, layer, &cd[top], KVT_TIER_HOT, wb, moves0, v);
  return 1;
}

/* kvt_policy_tiers_locked() with the layer's bytes known and its retained
 * blocks listed (as apply_known() takes them), or NULL. */
static void tiers_known(kvt_seq *s, uint32_t layer, const kvt_scorer *sc, int allow_promote,
                        const kvt_policy_info *known, uint32_t listed) {
  kvt_lpol *lp = &s->lp[layer];
  size_t m = known ? rank_listed(s, layer, sc, listed) : rank_layer(s, layer, sc);
  int promoted = 0;
  tview v = {.memo = {.k_codec = -1, .v_codec = -1}};
  cand *cd = (cand *)s->scratch_cand;
  if (known) { /* view_read() with the bytes counted and the tiers listed */
    v.o = *known;
    v.moves = tier_moves(s->e);
  } else {
    view_read(s, layer, cd, m, &v);
  }
  for (int i = 0; i < TIER_MOVES_MAX; i++)
    if (!tiers_step(s, layer, cd, m, lp, allow_promote, &promoted, &v)) break;
}

void kvt_policy_tiers_locked(kvt_seq *s, uint32_t layer, const kvt_scorer *sc, int allow_promote) {
  tiers_known(s, layer, sc, allow_promote, NULL, 0);
}

/* ---- setting a policy ------------------------------------------------------ */

static uint32_t pick(uint32_t v, uint32_t dflt) { return v == KVT_POLICY_DEFAULT ? dflt : v; }

/* Check p and resolve its defaults into *r (per-layer scorers come
 * later). */
static int policy_check(kvt_engine *e, const kvt_policy *p, kvt_policy *r) {
  const char *call = "kvt_seq_set_policy";
  if (p->scorer >= N_SCORERS)
    return KVT_ERR(e, KVT_EOPTION, call, "scorer", "an id from kvt_policy_parse()", "%u",
                   p->scorer);
  if (!(p->budget > 0 && p->budget <= 1))
    return KVT_ERR(e, KVT_EOPTION, call, "budget", "in (0, 1]", "%g", p->budget);
  if (!(p->warm >= 0 && p->warm < 1))
    return KVT_ERR(e, KVT_EOPTION, call, "warm", "in [0, 1)", "%g", p->warm);
  if (!(p->margin >= 0 && p->margin <= 100))
    return KVT_ERR(e, KVT_EOPTION, call, "margin", "in [0, 100]", "%g", p->margin);
  const kvt_scorer *sc = kvt_scorer_get(p->scorer == KVT_SCORER_AUTO ? AUTO_DEFAULT : p->scorer);
  *r = *p;
  r->recall = p->recall != 0;
  r->sink_blocks = pick(p->sink_blocks, sc ? sc->default_sinks : 0);
  r->window_blocks = pick(p->window_blocks, 0);
  r->delay = pick(p->delay, sc ? sc->default_delay : 0);
  if (r->sink_blocks > (1u << 20) || r->window_blocks > (1u << 20) || r->delay > (1u << 20))
    return KVT_ERR(e, KVT_EOPTION, call, "sink_blocks, window_blocks, delay",
                   "at most 2^20 or KVT_POLICY_DEFAULT", "%u, %u, %u", r->sink_blocks,
                   r->window_blocks, r->delay);
  return 0;
}

/* The per-layer scorers and shares of r for namespace ns. With the lock
 * held. */
static void layers_of(const kvt_nsrec *ns, const kvt_policy *r, kvt_lpol *lp) {
  uint32_t L = ns->desc.shape.n_layers;
  if (r->scorer == KVT_SCORER_AUTO && ns->profile) {
    /* a version-2 profile names warm shares; a version-1 one takes the
     * policy's part of each layer's share */
    if (!kvt_profile_layers(ns->profile, r->budget, lp, L))
      for (uint32_t l = 0; l < L; l++) lp[l].warm = lp[l].share < 1 ? lp[l].share * r->warm : 0;
    return;
  }
  uint32_t id = r->scorer == KVT_SCORER_AUTO ? AUTO_DEFAULT : r->scorer;
  for (uint32_t l = 0; l < L; l++)
    lp[l] = (kvt_lpol){.scorer = id, .share = r->budget, .warm = r->budget < 1 ? r->budget * r->warm : 0};
}

static uint32_t state_stride(const kvt_lpol *lp, uint32_t L) {
  uint32_t m = 0;
  for (uint32_t l = 0; l < L; l++) {
    const kvt_scorer *sc = kvt_scorer_get(lp[l].scorer);
    if (sc && sc->state_bytes > m) m = sc->state_bytes;
  }
  return (m + 7) & ~7u;
}

static int uses_learned(const kvt_lpol *lp, uint32_t L) {
  for (uint32_t l = 0; l < L; l++)
    if (lp[l].scorer == KVT_SCORER_LEARNED) return 1;
  return 0;
}

int kvt_seq_set_policy(kvt_seq *s, const kvt_policy *p) {
  if (!s || !p) return KVT_ENULL;
  kvt_engine *e = s->e;
  kvt_policy r;
  int rc = policy_check(e, p, &r);
  if (rc) return rc;
  uint32_t L = s->ns->desc.shape.n_layers;
  kvt_lpol *lp = kvt_mem_calloc(&e->mem, KVT_MEM_SEQ, L * sizeof *lp);
  if (!lp) return -ENOMEM;
  pthread_mutex_lock(&e->lock);
  layers_of(s->ns, &r, lp);
  if (uses_learned(lp, L) && !s->ns->pred) {
    pthread_mutex_unlock(&e->lock);
    kvt_mem_free(&e->mem, KVT_MEM_SEQ, lp, L * sizeof *lp);
    return KVT_ERR(e, KVT_EOPTION, "kvt_seq_set_policy", "scorer",
                   "a predictor loaded for the namespace (kvt_ns_load_predictor) for \"learned\"",
                   "none loaded");
  }
  pthread_mutex_unlock(&e->lock);
  /* The private state's stride follows the scorers: resize (and reset) it
   * outside the lock, as seq.c grows a sequence. */
  uint32_t stride = state_stride(lp, L);
  if (stride != s->ss_stride && (rc = kvt_seq_resize(s, s->cap, stride))) {
    kvt_mem_free(&e->mem, KVT_MEM_SEQ, lp, L * sizeof *lp);
    return rc;
  }
  pthread_mutex_lock(&e->lock);
  kvt_lpol *old = s->lp;
  /* Another scorer in a layer, at the same stride: its state starts anew
   * (a scorer never reads another's bytes). */
  int changed = 0;
  for (uint32_t l = 0; old && l < L; l++) changed |= old[l].scorer != lp[l].scorer;
  if (changed && stride && stride == s->ss_stride && s->n_blocks)
    memset(s->ss, 0, (size_t)s->n_blocks * L * stride);
  s->pol = r;
  s->lp = r.scorer == KVT_SCORER_FULL ? NULL : lp;
  apply_all(s);
  pthread_mutex_unlock(&e->lock);
  if (old) kvt_mem_free(&e->mem, KVT_MEM_SEQ, old, L * sizeof *old);
  if (r.scorer == KVT_SCORER_FULL) kvt_mem_free(&e->mem, KVT_MEM_SEQ, lp, L * sizeof *lp);
  return 0;
}

int kvt_seq_get_policy(kvt_seq *s, kvt_policy *out) {
  if (!s || !out) return KVT_ENULL;
  pthread_mutex_lock(&s->e->lock);
  *out = s->pol;
  pthread_mutex_unlock(&s->e->lock);
  if (out->scorer == KVT_SCORER_FULL) { /* never set: resolve the defaults too */
    kvt_policy r;
    if (!policy_check(s->e, out, &r)) *out = r;
  }
  return 0;
}

int kvt_seq_set_tokens(kvt_seq *s, uint64_t n_tokens) {
  if (!s) return KVT_ENULL;
  kvt_engine *e = s->e;
  uint64_t bt = s->ns->desc.shape.block_tokens, lo = (uint64_t)s->n_blocks * bt;
  if (n_tokens < lo || n_tokens > lo + bt)
    return KVT_ERR(e, KVT_ECOUNT, "kvt_seq_set_tokens", "n_tokens",
                   "from blocks * block_tokens to one block more", "%llu (%u blocks of %llu)",
                   (unsigned long long)n_tokens, s->n_blocks, (unsigned long long)bt);
  pthread_mutex_lock(&e->lock);
  s->n_tokens = n_tokens;
  apply_all(s);
  pthread_mutex_unlock(&e->lock);
  return 0;
}

int kvt_seq_policy_info(kvt_seq *s, uint32_t layer, kvt_policy_info *out) {
  if (!s || !out) return KVT_ENULL;
  if (layer >= s->ns->desc.shape.n_layers) return KVT_ENOTFOUND;
  pthread_mutex_lock(&s->e->lock);
  layer_bytes(s, layer, out);
  pthread_mutex_unlock(&s->e->lock);
  return 0;
}

/* ---- observation ------------------------------------------------------------- */

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
  /* One pass over the layer's blocks: the retained ones (listed in the
   * ranking scratch, which the policy's application below reuses only
   * after them) and their bytes, which nothing below changes before the
   * policy is applied. */
  kvt_pblk *pb = s->scratch_pb;
  kvt_policy_info o;
  size_t n = layer_list(s, layer, &o);
  if (n != n_blocks) {
    rc = KVT_ERR(e, KVT_ECOUNT, "kvt_seq_observe", "n_blocks", "the number of retained blocks",
                 "%zu (%zu retained)", n_blocks, n);
  } else {
    const kvt_scorer *sc = s->lp ? kvt_scorer_get(s->lp[layer].scorer) : NULL;
    kvt_pctx c;
    ctx_of(s, layer, &c);
    for (size_t i = 0; i < n; i++) {
      kvt_bstate *st = &s->bs[(size_t)pb[i].block * L + layer];
      float m = block_mass[i];
      st->mass_sum += m;
      st->mass_last = m;
      if (m > st->mass_max) st->mass_max = m;
      st->observed++;
      if (sc && sc->observe) sc->observe(&c, &pb[i], m);
    }
    kvt_recall_observed_locked(s, layer, pb, n);
    apply_known(s, layer, &o, (uint32_t)n); /* ranks the list, never rewrites it */
  }
  pthread_mutex_unlock(&e->lock);
  /* this query's recalls, read during the next step; the weakest blocks
   * from the list, a superset of the retained ones after the application */
  if (!rc) kvt_recall_step(s, layer, pb, n);
  return rc;
}

int kvt_seq_hint(kvt_seq *s, uint32_t layer, const float *score, size_t n_blocks) {
  if (!s || (n_blocks && !score)) return KVT_ENULL;
  uint32_t L = s->ns->desc.shape.n_layers;
  if (layer >= L) return KVT_ENOTFOUND;
  kvt_engine *e = s->e;
  if (n_blocks != s->n_blocks)
    return KVT_ERR(e, KVT_ECOUNT, "kvt_seq_hint", "n_blocks", "the sequence's blocks",
                   "%zu (%u blocks)", n_blocks, s->n_blocks);
  for (size_t i = 0; i < n_blocks; i++)
    if (!isfinite(score[i]))
      return KVT_ERR(e, KVT_EOPTION, "kvt_seq_hint", "score[i]", "finite", "%g at i = %zu",
                     score[i], i);
  pthread_mutex_lock(&e->lock);
  for (uint32_t b = 0; b < s->n_blocks; b++) s->bs[(size_t)b * L + layer].hint = score[b];
  pthread_mutex_unlock(&e->lock);
  return 0;
}

/* The mean L2 norm of a block's key rows (the learned predictor's key_norm
 * feature). Each row's squares are summed in channel order in double and
 * the row norms in row order, as one row at a time would: the same bits.
 * Rows are converted in groups of four and summed side by side, so the
 * four sums' additions overlap instead of waiting on each other. */
float kvt_policy_key_norm(const kvt_kv *kv) {
  size_t rows = (size_t)kv->n_tokens * kv->n_heads, hd = kv->head_dim;
  size_t elt = kv->dtype == KVT_F32 ? 4 : 2;
  float buf[4 * KVT_MAX_HEAD_DIM];
  double sum = 0;
  for (size_t r = 0; r < rows;) {
    size_t g = rows - r < 4 ? 1 : 4;
    const char *src = (const char *)kv->k + r * hd * elt;
    const float *x = (const float *)(const void *)src;
    if (kv->dtype != KVT_F32) {
      kvt_to_f32(src, kv->dtype, g * hd, buf);
      x = buf;
    }
    if (g == 4) {
      const float *x1 = x + hd, *x2 = x1 + hd, *x3 = x2 + hd;
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (size_t d = 0; d < hd; d++) {
        s0 += (double)x[d] * x[d];
        s1 += (double)x1[d] * x1[d];
        s2 += (double)x2[d] * x2[d];
        s3 += (double)x3[d] * x3[d];
      }
      sum += sqrt(s0);
      sum += sqrt(s1);
      sum += sqrt(s2);
      sum += sqrt(s3);
    } else {
      double s0 = 0;
      for (size_t d = 0; d < hd; d++) s0 += (double)x[d] * x[d];
      sum += sqrt(s0);
    }
    r += g;
  }
  return rows ? (float)(sum / (double)rows) : 0;
}

/* A put of (s, block, layer) just succeeded: the block is retained again
 * with fresh state (its key norm from k). Without the lock. */
void kvt_policy_on_put(kvt_seq *s, uint32_t block, uint32_t layer, const kvt_kv *kv) {
  kvt_bstate *bs = &s->bs[(size_t)block * s->ns->desc.shape.n_layers + layer];
  bs->left = 0;
  if (kv->k) bs->key_norm = kvt_policy_key_norm(kv);
}

/* ---- per-namespace profiles and predictors ------------------------------------ */

static int ns_load(kvt_engine *e, kvt_ns_id id, const char *path, int predictor) {
  if (!e || !path) return KVT_ENULL;
  kvt_shape sh;
  int rc = kvt_ns_shape(e, id, &sh);
  if (rc) return rc;
  void *obj = NULL;
  rc = predictor ? kvt_predictor_read(e, path, &sh, (kvt_predictor **)&obj)
                 : kvt_profile_read(e, path, &sh, (kvt_profile **)&obj);
  if (rc) return rc;
  pthread_mutex_lock(&e->lock);
  kvt_nsrec *ns = kvt_ns_find(e, id);
  void *old = NULL;
  if (ns) {
    if (predictor) {
      old = ns->pred;
      ns->pred = obj;
    } else {
      old = ns->profile;
      ns->profile = obj;
    }
  }
  pthread_mutex_unlock(&e->lock);
  if (!ns) old = obj; /* dropped meanwhile */
  if (predictor) kvt_predictor_free(old);
  else kvt_profile_free(old);
  return ns ? 0 : KVT_ENOTFOUND;
}

int kvt_ns_load_profile(kvt_engine *e, kvt_ns_id ns, const char *path) {
  return ns_load(e, ns, path, 0);
}

int kvt_ns_load_predictor(kvt_engine *e, kvt_ns_id ns, const char *path) {
  return ns_load(e, ns, path, 1);
}

/* ---- listing ------------------------------------------------------------------ */

int kvt_seq_retained(kvt_seq *s, uint32_t layer, kvt_gathered *blocks, size_t max_blocks,
                     size_t *n_blocks) {
  if (!s || !n_blocks || (max_blocks && !blocks)) return KVT_ENULL;
  uint32_t bt = s->ns->desc.shape.block_tokens;
  if (layer >= s->ns->desc.shape.n_layers) return KVT_ENOTFOUND;
  kvt_engine *e = s->e;
  pthread_mutex_lock(&e->lock);
  /* Blocks only on disk are listed as cold: attention and gathers bring
   * them back (promote.c). */
  size_t n = kvt_seq_nonresident(s, layer) + kvt_retained_pin(s, layer, NULL, NULL);
  int rc = n > max_blocks && blocks ? KVT_EBUFSIZE : 0;
  if (rc == KVT_EBUFSIZE)
    KVT_ERR(e, rc, "kvt_seq_retained", "max_blocks", "at least the retained blocks",
            "%zu (%zu retained)", max_blocks, n);
  for (uint32_t b = 0, i = 0; !rc && blocks && b < s->n_blocks; b++) {
    if (kvt_seq_away(s, b, layer)) {
      blocks[i++] = (kvt_gathered){.block = b, .token_pos = b * bt, .tier = KVT_TIER_COLD};
      continue;
    }
    if (!retained_at(s, b, layer)) continue;
    const kvt_lblk *lb = s->lb[(size_t)b * s->ns->desc.shape.n_layers + layer];
    blocks[i++] = (kvt_gathered){.block = b, .token_pos = b * bt, .tier = lb->tier,
                                 .exact = lb->tier == KVT_TIER_HOT && !lb->approx};
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
