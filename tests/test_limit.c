/* test_limit.c - a random workload of sequences, puts, reads, lookups,
 * loads and releases under a small hot limit, checked after every step
 * against a reference model kept here: the limit holds, referenced blocks
 * read back exact, KVT_EFULL comes exactly when the referenced blocks leave
 * no room, and whatever is still found reads back exact. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  MAXB = 6,     /* token blocks per sequence */
  MAXS = 5,     /* live sequences */
  NFAM = 3,     /* prefix families */
  KEEP = 22,    /* layer blocks the hot limit holds */
  MAXE = 4096,  /* model entries */
};

typedef struct mseq {
  kvt_seq *s;
  uint32_t tok[4 * MAXB];
  uint32_t nb, na;            /* blocks wanted, appended */
  kvt_key key[MAXB];
  uint8_t held[MAXB][8];      /* [block][layer]: references the layer block */
} mseq;

typedef struct ment {
  kvt_key key;
  uint32_t layer;
  uint32_t refs;
} ment;

typedef struct model {
  char *dir;
  kvt_engine *e;
  kvt_shape sh;
  kvt_ns_id ns;
  uint64_t salt, payload, cost, limit;
  uint32_t fam[NFAM][4 * MAXB];
  mseq seq[MAXS];
  ment ent[MAXE];
  size_t n_ent;
  tu_kv kv, out;
  uint64_t n_full, n_ok_put, n_found_cached; /* what the run exercised */
} model;

/* ------------------------------------------------------------- the model */

/* The model holds an entry per referenced layer block, none for others. */
static ment *ent_find(model *m, const kvt_key *k, uint32_t layer) {
  for (size_t i = 0; i < m->n_ent; i++)
    if (m->ent[i].layer == layer && !memcmp(&m->ent[i].key, k, sizeof *k)) return &m->ent[i];
  return NULL;
}

static uint32_t refs_of(model *m, const kvt_key *k, uint32_t layer) {
  ment *en = ent_find(m, k, layer);
  return en ? en->refs : 0;
}

static void ent_unref(model *m, const kvt_key *k, uint32_t layer) {
  ment *en = ent_find(m, k, layer);
  assert_non_null(en);
  if (--en->refs == 0) *en = m->ent[--m->n_ent];
}

static uint64_t referenced(const model *m) {
  return m->n_ent;
}

static uint64_t total_refs(const model *m) {
  uint64_t n = 0;
  for (size_t i = 0; i < m->n_ent; i++) n += m->ent[i].refs;
  return n;
}

static void hold(model *m, mseq *q, uint32_t b, uint32_t l) {
  assert_false(q->held[b][l]);
  q->held[b][l] = 1;
  ment *en = ent_find(m, &q->key[b], l);
  if (!en) {
    assert_true(m->n_ent < MAXE);
    en = &m->ent[m->n_ent++];
    *en = (ment){.key = q->key[b], .layer = l};
  }
  en->refs++;
}

/* Every invariant that holds after any step. */
static void check_invariants(model *m) {
  kvt_stats st;
  uint64_t live = 0;
  tu_stats(m->e, &st);
  for (int i = 0; i < MAXS; i++) live += m->seq[i].s != NULL;
  assert_true(st.tier_bytes[KVT_TIER_HOT] <= st.tier_limit[KVT_TIER_HOT]);
  assert_int_equal(st.tier_limit[KVT_TIER_HOT], m->limit);
  assert_int_equal(st.seqs, live);
  assert_true(st.tier_blocks[KVT_TIER_HOT] >= referenced(m));
  assert_int_equal(st.tier_bytes[KVT_TIER_HOT], st.tier_blocks[KVT_TIER_HOT] * m->cost);
  assert_int_equal(st.logical_bytes, total_refs(m) * m->payload);
  assert_int_equal(st.dedup_saved_bytes, (total_refs(m) - referenced(m)) * m->payload);
}

static void expect(model *m, uint32_t b, uint32_t l, const uint32_t *tok) {
  tu_kv_fill(&m->kv, &m->sh, m->salt, l, b, tok + 4 * b);
}

static void check_read(model *m, mseq *q, uint32_t b, uint32_t l) {
  int rc = kvt_seq_read(q->s, b, l, m->out.k, m->out.v, m->out.bytes);
  if (!q->held[b][l]) {
    assert_int_equal(rc, KVT_ENOTFOUND);
    return;
  }
  assert_int_equal(rc, 0);
  expect(m, b, l, q->tok);
  assert_memory_equal(m->out.k, m->kv.k, m->kv.bytes);
  assert_memory_equal(m->out.v, m->kv.v, m->kv.bytes);
}

/* ------------------------------------------------------------- the steps */

static void step_create(model *m, mseq *q) {
  uint32_t f = tu_below(NFAM), shared = tu_below(MAXB + 1);
  memset(q, 0, sizeof *q);
  memcpy(q->tok, m->fam[f], sizeof q->tok);
  for (uint32_t i = 4 * shared; i < 4 * MAXB; i++) q->tok[i] = (uint32_t)tu_rand();
  q->nb = 1 + tu_below(MAXB);
  assert_int_equal(kvt_seq_create(m->e, m->ns, &q->s), 0);
}

/* Append; find out by reading which layers were adopted, and check them. */
static void step_append(model *m, mseq *q) {
  kvt_append_info info;
  uint32_t b = q->na, adopted = 0;
  assert_int_equal(kvt_seq_append(q->s, q->tok + 4 * b, 4, &info), 0);
  assert_int_equal(info.block, b);
  q->key[b] = info.key;
  q->na++;
  for (uint32_t l = 0; l < m->sh.n_layers; l++) {
    int rc = kvt_seq_read(q->s, b, l, m->out.k, m->out.v, m->out.bytes);
    if (rc == KVT_ENOTFOUND) continue;
    assert_int_equal(rc, 0);
    expect(m, b, l, q->tok);
    assert_memory_equal(m->out.k, m->kv.k, m->kv.bytes);
    assert_memory_equal(m->out.v, m->kv.v, m->kv.bytes);
    hold(m, q, b, l);
    adopted++;
  }
  assert_int_equal(adopted, info.layers_present);
}

/* Blocks LRU eviction must drop to fit one more block of cost c. */
static uint64_t must_evict(const model *m, uint64_t blocks) {
  uint64_t need = (blocks + 1) * m->cost;
  return need <= m->limit ? 0 : (need - m->limit + m->cost - 1) / m->cost;
}

static void check_put_ok(model *m, const kvt_stats *a, const kvt_stats *b, int was_ref) {
  uint64_t hit = b->dedup_hits - a->dedup_hits;
  uint64_t ev = b->evictions[KVT_TIER_HOT] - a->evictions[KVT_TIER_HOT];
  assert_int_equal(b->puts, a->puts + 1);
  assert_true(hit <= 1);
  if (was_ref) assert_int_equal(hit, 1);
  if (hit) {
    assert_int_equal(ev, 0);
    assert_int_equal(b->tier_blocks[KVT_TIER_HOT], a->tier_blocks[KVT_TIER_HOT]);
    return;
  }
  assert_int_equal(ev, must_evict(m, a->tier_blocks[KVT_TIER_HOT]));
  assert_int_equal(b->tier_blocks[KVT_TIER_HOT], a->tier_blocks[KVT_TIER_HOT] + 1 - ev);
}

/* Put one layer the sequence does not hold (or, rarely, one it holds). */
static void step_put(model *m, mseq *q) {
  uint32_t b = tu_below(q->na), l = tu_below(m->sh.n_layers);
  int again = q->held[b][l];
  int was_ref = refs_of(m, &q->key[b], l) > 0;
  uint64_t r = referenced(m);
  kvt_stats a, s;
  expect(m, b, l, q->tok);
  tu_stats(m->e, &a);
  int rc = kvt_seq_put(q->s, b, l, &m->kv.kv);
  tu_stats(m->e, &s);
  if (rc == KVT_EFULL) {
    /* Only a block no one references, when the referenced ones leave no
     * room, and a cached copy would have been a hit. */
    assert_false(was_ref);
    assert_true((r + 1) * m->cost > m->limit);
    assert_int_equal(s.put_full, a.put_full + 1);
    s.put_full = a.put_full;
    tu_assert_stats_eq(&a, &s);
    m->n_full++;
    return;
  }
  assert_int_equal(rc, 0);
  check_put_ok(m, &a, &s, was_ref);
  if (!again) hold(m, q, b, l);
  /* Nothing cached beyond the referenced blocks: a new block needs room. */
  if (!was_ref && a.tier_blocks[KVT_TIER_HOT] == r)
    assert_true((r + 1) * m->cost <= m->limit);
  m->n_ok_put++;
}

static void step_release(model *m, mseq *q) {
  for (uint32_t b = 0; b < q->na; b++)
    for (uint32_t l = 0; l < m->sh.n_layers; l++)
      if (q->held[b][l]) ent_unref(m, &q->key[b], l);
  kvt_seq_release(q->s);
  q->s = NULL;
}

/* Gather one layer: the blocks held in it, in order, exact. */
static void step_gather(model *m, mseq *q) {
  uint32_t l = tu_below(m->sh.n_layers), want = 0;
  size_t bytes = MAXB * m->kv.bytes, n = 0;
  uint8_t *k = malloc(bytes), *v = malloc(bytes);
  kvt_gathered g[MAXB];
  assert_int_equal(kvt_seq_gather(q->s, l, k, v, &bytes, g, MAXB, &n), 0);
  for (uint32_t b = 0; b < q->na; b++) {
    if (!q->held[b][l]) continue;
    assert_true(want < n);
    assert_int_equal(g[want].block, b);
    expect(m, b, l, q->tok);
    assert_memory_equal(k + want * m->kv.bytes, m->kv.k, m->kv.bytes);
    assert_memory_equal(v + want * m->kv.bytes, m->kv.v, m->kv.bytes);
    want++;
  }
  assert_int_equal(n, want);
  assert_int_equal(bytes, want * m->kv.bytes);
  free(k);
  free(v);
}

/* Leading blocks of tok whose every layer someone references. */
static size_t guaranteed(model *m, const kvt_key *keys, size_t nk) {
  size_t g = 0;
  for (; g < nk; g++)
    for (uint32_t l = 0; l < m->sh.n_layers; l++)
      if (refs_of(m, &keys[g], l) == 0) return g;
  return g;
}

/* Load every layer of blocks 0..n and check the bytes. */
static void load_check(model *m, const uint32_t *tok, const kvt_key *keys, size_t n) {
  kvt_load_req req[MAXB * 4];
  uint8_t *buf = malloc(2 * MAXB * 4 * m->kv.bytes);
  size_t nr = 0, ok = 0;
  kvt_load *ld;
  for (uint32_t b = 0; b < n; b++)
    for (uint32_t l = 0; l < m->sh.n_layers; l++, nr++)
      req[nr] = (kvt_load_req){.key = keys[b], .layer = l, .k_out = buf + 2 * nr * m->kv.bytes,
                               .v_out = buf + (2 * nr + 1) * m->kv.bytes,
                               .bytes_each = m->kv.bytes};
  assert_int_equal(kvt_load_submit(m->e, m->ns, req, nr, &ld), 0);
  assert_int_equal(kvt_load_wait(ld, &ok), 0);
  assert_int_equal(ok, nr);
  for (size_t i = 0; i < nr; i++) {
    expect(m, i / m->sh.n_layers, req[i].layer, tok);
    assert_memory_equal(req[i].k_out, m->kv.k, m->kv.bytes);
    assert_memory_equal(req[i].v_out, m->kv.v, m->kv.bytes);
  }
  free(buf);
}

/* Look up a family prefix or a sequence's tokens; load what was found. */
static void step_lookup(model *m) {
  const uint32_t *tok = m->fam[tu_below(NFAM)];
  int i = (int)tu_below(MAXS);
  if (m->seq[i].s && tu_below(2)) tok = m->seq[i].tok;
  kvt_key keys[MAXB];
  kvt_lookup_entry out[MAXB];
  size_t nk, n;
  assert_int_equal(kvt_keys(m->e, m->ns, tok, 4 * MAXB, keys, MAXB, &nk), 0);
  assert_int_equal(kvt_lookup(m->e, m->ns, tok, 4 * MAXB, out, MAXB, &n), 0);
  assert_true(n >= guaranteed(m, keys, nk));
  assert_true(n <= nk);
  for (size_t b = 0; b < n; b++) {
    assert_memory_equal(&out[b].key, &keys[b], sizeof(kvt_key));
    assert_int_equal(out[b].tier, KVT_TIER_HOT);
  }
  if (n > guaranteed(m, keys, nk)) m->n_found_cached++;
  if (n) load_check(m, tok, keys, n);
}

static void step(model *m) {
  int i = (int)tu_below(MAXS);
  mseq *q = &m->seq[i];
  uint32_t r = tu_below(100);
  if (!q->s) {
    step_create(m, q);
  } else if (r < 8) {
    step_release(m, q);
  } else if (r < 30 && q->na < q->nb) {
    step_append(m, q);
  } else if (r < 75 && q->na) {
    step_put(m, q);
  } else if (r < 85 && q->na) {
    check_read(m, q, tu_below(q->na), tu_below(m->sh.n_layers));
  } else if (r < 92 && q->na) {
    step_gather(m, q);
  } else {
    step_lookup(m);
  }
  check_invariants(m);
}

/* ------------------------------------------------------------- the run */

static void model_open(model *m) {
  kvt_options o;
  memset(m, 0, sizeof *m);
  m->sh = tu_shape_small(KVT_F32);
  m->payload = 2 * kvt_shape_block_bytes(&m->sh);
  tu_kv_alloc(&m->kv, &m->sh);
  tu_kv_alloc(&m->out, &m->sh);
  /* The per-block cost is measured from the first put; the limit is set
   * from a probe engine so that it holds KEEP blocks and half of one. */
  m->dir = tu_tmpdir();
  tu_opts(&o);
  /* The model is the LRU list's, layer block by layer block (the learned
   * order drops a token block's idle layers together: test_hot_order). */
  o.hot_evict = KVT_EVICT_LRU;
  m->e = tu_open(m->dir, &o);
  m->ns = tu_register(m->e, "limit-model", &m->sh);
  m->salt = tu_salt("limit-model");
  mseq probe;
  step_create(m, &probe);
  kvt_stats a, b;
  assert_int_equal(kvt_seq_append(probe.s, probe.tok, 4, NULL), 0);
  tu_stats(m->e, &a);
  expect(m, 0, 0, probe.tok);
  assert_int_equal(kvt_seq_put(probe.s, 0, 0, &m->kv.kv), 0);
  tu_stats(m->e, &b);
  m->cost = b.tier_bytes[KVT_TIER_HOT] - a.tier_bytes[KVT_TIER_HOT];
  assert_true(m->cost >= m->payload);
  kvt_seq_release(probe.s);
  kvt_engine_close(m->e);
  tu_rmtree(m->dir);
  m->limit = KEEP * m->cost + m->cost / 2;
  m->dir = tu_tmpdir();
  o.tier_bytes_limit[KVT_TIER_HOT] = m->limit;
  m->e = tu_open(m->dir, &o);
  m->ns = tu_register(m->e, "limit-model", &m->sh);
  for (int f = 0; f < NFAM; f++)
    for (int i = 0; i < 4 * MAXB; i++) m->fam[f][i] = (uint32_t)tu_rand();
}

static void model_close(model *m) {
  for (int i = 0; i < MAXS; i++)
    if (m->seq[i].s) step_release(m, &m->seq[i]);
  check_invariants(m);
  assert_int_equal(total_refs(m), 0);
  tu_kv_free(&m->kv);
  tu_kv_free(&m->out);
  kvt_engine_close(m->e);
  tu_rmtree(m->dir);
}

static void test_random_workload(void **state) {
  (void)state;
  model *m = malloc(sizeof *m);
  assert_non_null(m);
  model_open(m);
  int steps = tu_stress() ? 400000 : 20000;
  for (int i = 0; i < steps; i++) step(m);
  fprintf(stderr, "limit: %d steps, %llu puts ok, %llu EFULL, %llu lookups past the held\n",
          steps, (unsigned long long)m->n_ok_put, (unsigned long long)m->n_full,
          (unsigned long long)m->n_found_cached);
  assert_true(m->n_full > 0); /* the limit was reached */
  model_close(m);
  free(m);
}

/* Everything referenced, nothing evictable: the next new block is refused
 * until a release makes room. */
static void test_full_then_release(void **state) {
  (void)state;
  model *m = malloc(sizeof *m);
  assert_non_null(m);
  model_open(m);
  mseq *q = &m->seq[0], *p = &m->seq[1];
  step_create(m, q);
  q->nb = MAXB;
  uint32_t stored = 0;
  while (stored < KEEP) {
    if (q->na * m->sh.n_layers <= stored) step_append(m, q);
    uint32_t b = stored / m->sh.n_layers, l = stored % m->sh.n_layers;
    expect(m, b, l, q->tok);
    assert_int_equal(kvt_seq_put(q->s, b, l, &m->kv.kv), 0);
    hold(m, q, b, l);
    stored++;
    check_invariants(m);
  }
  uint32_t b = stored / m->sh.n_layers, l = stored % m->sh.n_layers;
  if (q->na <= b) step_append(m, q);
  expect(m, b, l, q->tok);
  kvt_stats s0, s1;
  tu_stats(m->e, &s0);
  assert_int_equal(kvt_seq_put(q->s, b, l, &m->kv.kv), KVT_EFULL);
  tu_stats(m->e, &s1);
  assert_int_equal(s1.put_full, s0.put_full + 1);
  step_create(m, p); /* another sequence cannot put either */
  memcpy(p->tok, q->tok, sizeof p->tok);
  p->tok[0] ^= 1;
  p->nb = 1;
  step_append(m, p);
  expect(m, 0, 0, p->tok);
  assert_int_equal(kvt_seq_put(p->s, 0, 0, &m->kv.kv), KVT_EFULL);
  step_release(m, p);
  for (uint32_t i = 0; i < q->na; i++) check_read(m, q, i, 0);
  step_release(m, q); /* now all of it is evictable */
  step_create(m, p);
  step_append(m, p);
  expect(m, 0, 0, p->tok);
  if (!p->held[0][0]) {
    tu_stats(m->e, &s0);
    assert_int_equal(kvt_seq_put(p->s, 0, 0, &m->kv.kv), 0);
    tu_stats(m->e, &s1);
    check_put_ok(m, &s0, &s1, 0);
    hold(m, p, 0, 0);
  }
  check_invariants(m);
  model_close(m);
  free(m);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_full_then_release),
      cmocka_unit_test(test_random_workload),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
