/* test_warm_random.c - the warm tier inside the engine, through the public
 * API: a random workload checked against a reference model after every step.
 * Shared helpers and the fixture: warm_util.h. */
#include "warm_util.h"

/* ------------------------------------------------ random workload */

enum {
  MAXB = 6,    /* token blocks per sequence */
  MAXS = 4,    /* live sequences */
  NFAM = 3,    /* prefix families */
  NL = 2,      /* layers */
  MAXE = 4096, /* model entries */
};

typedef struct mseq {
  kvt_seq *s;
  uint32_t tok[4 * MAXB];
  uint32_t nb, na;
  kvt_key key[MAXB];
  uint8_t held[MAXB][NL];
} mseq;

typedef struct ment {
  kvt_key key;
  uint32_t layer, refs;
} ment;

typedef struct model {
  fx f;
  uint64_t hot_limit, warm_limit;
  uint32_t fam[NFAM][4 * MAXB];
  mseq seq[MAXS];
  ment ent[MAXE];
  size_t n_ent;
  uint64_t new_stores;                   /* puts that stored a new block */
  uint64_t n_full, n_ok, n_warm_reads, n_hot_reads;
} model;

static ment *ent_find(model *m, const kvt_key *k, uint32_t l) {
  for (size_t i = 0; i < m->n_ent; i++)
    if (m->ent[i].layer == l && !memcmp(&m->ent[i].key, k, sizeof *k)) return &m->ent[i];
  return NULL;
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

static void unhold_all(model *m, mseq *q) {
  for (uint32_t b = 0; b < q->na; b++)
    for (uint32_t l = 0; l < NL; l++) {
      if (!q->held[b][l]) continue;
      ment *en = ent_find(m, &q->key[b], l);
      assert_non_null(en);
      if (--en->refs == 0) *en = m->ent[--m->n_ent];
    }
}

static uint64_t total_refs(const model *m) {
  uint64_t n = 0;
  for (size_t i = 0; i < m->n_ent; i++) n += m->ent[i].refs;
  return n;
}

static void check_invariants(model *m) {
  kvt_stats st;
  tu_stats(m->f.e, &st);
  const costs *c = &m->f.c;
  uint64_t live = 0;
  for (int i = 0; i < MAXS; i++) live += m->seq[i].s != NULL;
  assert_int_equal(st.seqs, live);
  assert_int_equal(st.tier_limit[KVT_TIER_HOT], m->hot_limit);
  assert_int_equal(st.tier_limit[KVT_TIER_WARM], m->warm_limit);
  assert_true(st.tier_bytes[KVT_TIER_HOT] <= m->hot_limit);
  assert_true(st.tier_bytes[KVT_TIER_WARM] <= m->warm_limit);
  assert_int_equal(st.tier_bytes[KVT_TIER_HOT], st.tier_blocks[KVT_TIER_HOT] * c->hot);
  assert_int_equal(st.tier_bytes[KVT_TIER_WARM], st.tier_blocks[KVT_TIER_WARM] * c->warm);
  assert_true(st.tier_blocks[KVT_TIER_HOT] + st.tier_blocks[KVT_TIER_WARM] >= m->n_ent);
  /* every warm block came from a demotion; every hot one from a put */
  assert_int_equal(st.tier_blocks[KVT_TIER_WARM] + st.evictions[KVT_TIER_WARM], st.demotions);
  assert_int_equal(st.tier_blocks[KVT_TIER_HOT] + st.demotions + st.evictions[KVT_TIER_HOT],
                   m->new_stores);
  assert_int_equal(st.logical_bytes, total_refs(m) * 2 * c->each);
  assert_int_equal(st.dedup_saved_bytes, (total_refs(m) - m->n_ent) * 2 * c->each);
  assert_int_equal(st.reads, st.reads_exact + st.reads_approx);
  check_total(&st);
}

static void m_read(model *m, mseq *q, uint32_t b, uint32_t l) {
  if (!q->held[b][l]) {
    assert_int_equal(kvt_seq_read(q->s, b, l, m->f.got.k, m->f.got.v, m->f.got.bytes),
                     KVT_ENOTFOUND);
    return;
  }
  if (read_check(&m->f, q->s, b, l, q->tok + 4 * b, KVT_CODEC_K8, KVT_CODEC_V3) == KVT_TIER_HOT)
    m->n_hot_reads++;
  else
    m->n_warm_reads++;
}

/* Every block any sequence holds reads back. */
static void verify_all(model *m) {
  for (int i = 0; i < MAXS; i++) {
    mseq *q = &m->seq[i];
    if (!q->s) continue;
    for (uint32_t b = 0; b < q->na; b++)
      for (uint32_t l = 0; l < NL; l++)
        if (q->held[b][l]) m_read(m, q, b, l);
  }
}

/* Referenced blocks that are warm now (gather tells the tier). */
static uint64_t referenced_warm(model *m) {
  kvt_key seen[MAXS * MAXB * NL];
  uint32_t seen_l[MAXS * MAXB * NL], n_seen = 0;
  for (int i = 0; i < MAXS; i++) {
    mseq *q = &m->seq[i];
    if (!q->s) continue;
    for (uint32_t l = 0; l < NL; l++) {
      uint32_t tiers[MAXB];
      size_t n, j = 0;
      gather_tiers(&m->f, q->s, l, q->tok, KVT_CODEC_K8, KVT_CODEC_V3, tiers, &n);
      for (uint32_t b = 0; b < q->na; b++) {
        if (!q->held[b][l]) continue;
        assert_true(j < n);
        if (tiers[j++] != KVT_TIER_WARM) continue;
        uint32_t k = 0;
        while (k < n_seen && !(seen_l[k] == l && !memcmp(&seen[k], &q->key[b], sizeof(kvt_key)))) k++;
        if (k == n_seen) {
          seen[n_seen] = q->key[b];
          seen_l[n_seen++] = l;
        }
      }
      assert_int_equal(j, n);
    }
  }
  return n_seen;
}

static void m_create(model *m, mseq *q) {
  uint32_t f = tu_below(NFAM), shared = tu_below(MAXB + 1);
  memset(q, 0, sizeof *q);
  memcpy(q->tok, m->fam[f], sizeof q->tok);
  for (uint32_t i = 4 * shared; i < 4 * MAXB; i++) q->tok[i] = (uint32_t)tu_rand();
  q->nb = 1 + tu_below(MAXB);
  assert_int_equal(kvt_seq_create(m->f.e, m->f.ns, &q->s), 0);
}

/* Append; find out by reading which layers were adopted (referenced ones
 * must be; cached ones may be) and check them. */
static void m_append(model *m, mseq *q) {
  kvt_append_info info;
  uint32_t b = q->na, adopted = 0;
  assert_int_equal(kvt_seq_append(q->s, q->tok + 4 * b, 4, &info), 0);
  assert_int_equal(info.block, b);
  q->key[b] = info.key;
  q->na++;
  for (uint32_t l = 0; l < NL; l++) {
    int rc = kvt_seq_read(q->s, b, l, m->f.got.k, m->f.got.v, m->f.got.bytes);
    if (rc == KVT_ENOTFOUND) {
      assert_null(ent_find(m, &info.key, l));
      continue;
    }
    assert_int_equal(rc, 0);
    hold(m, q, b, l);
    m_read(m, q, b, l);
    adopted++;
  }
  assert_int_equal(adopted, info.layers_present);
}

static void m_put(model *m, mseq *q) {
  uint32_t b = tu_below(q->na), l = tu_below(NL);
  int again = q->held[b][l];
  expect(&m->f, l, b, q->tok + 4 * b);
  kvt_stats a, z;
  tu_stats(m->f.e, &a);
  int rc = kvt_seq_put(q->s, b, l, &m->f.want.kv);
  tu_stats(m->f.e, &z);
  if (rc == KVT_EFULL) {
    /* only when warm cannot take a referenced victim */
    assert_false(again);
    assert_int_equal(z.put_full, a.put_full + 1);
    assert_true((referenced_warm(m) + 1) * m->f.c.warm > m->warm_limit);
    verify_all(m); /* nothing lost */
    m->n_full++;
    return;
  }
  assert_int_equal(rc, 0);
  assert_int_equal(z.puts, a.puts + 1);
  uint64_t hit = z.dedup_hits - a.dedup_hits;
  assert_true(hit <= 1);
  if (again || ent_find(m, &q->key[b], l)) assert_int_equal(hit, 1);
  m->new_stores += !hit;
  if (!again) hold(m, q, b, l);
  m->n_ok++;
}

static void m_gather(model *m, mseq *q) {
  uint32_t l = tu_below(NL), tiers[MAXB], want = 0;
  size_t n;
  gather_tiers(&m->f, q->s, l, q->tok, KVT_CODEC_K8, KVT_CODEC_V3, tiers, &n);
  for (uint32_t b = 0; b < q->na; b++) want += q->held[b][l];
  assert_int_equal(n, want);
}

static void m_release(model *m, mseq *q) {
  unhold_all(m, q);
  kvt_seq_release(q->s);
  q->s = NULL;
}

/* Look up a family prefix and load what was found (touches recency). */
static void m_lookup(model *m) {
  const uint32_t *tok = m->fam[tu_below(NFAM)];
  kvt_key keys[MAXB];
  kvt_lookup_entry ent[MAXB];
  size_t nk, n;
  assert_int_equal(kvt_keys(m->f.e, m->f.ns, tok, 4 * MAXB, keys, MAXB, &nk), 0);
  assert_int_equal(kvt_lookup(m->f.e, m->f.ns, tok, 4 * MAXB, ent, MAXB, &n), 0);
  assert_true(n <= nk);
  size_t guaranteed = 0;
  while (guaranteed < nk && ent_find(m, &keys[guaranteed], 0) && ent_find(m, &keys[guaranteed], 1))
    guaranteed++;
  assert_true(n >= guaranteed);
  if (!n) return;
  size_t each = m->f.c.each;
  kvt_load_req req[MAXB * NL];
  uint8_t *buf = malloc(2 * MAXB * NL * each);
  assert_non_null(buf);
  for (uint32_t b = 0; b < n; b++)
    for (uint32_t l = 0; l < NL; l++) {
      size_t r = b * NL + l;
      req[r] = (kvt_load_req){.key = keys[b], .layer = l, .k_out = buf + 2 * r * each,
                              .v_out = buf + (2 * r + 1) * each, .bytes_each = each};
    }
  kvt_load *ld;
  size_t ok;
  assert_int_equal(kvt_load_submit(m->f.e, m->f.ns, req, n * NL, &ld), 0);
  assert_int_equal(kvt_load_wait(ld, &ok), 0);
  assert_int_equal(ok, n * NL);
  for (uint32_t b = 0; b < n; b++) {
    uint32_t slowest = KVT_TIER_HOT;
    for (uint32_t l = 0; l < NL; l++) {
      kvt_load_req *r = &req[b * NL + l];
      expect(&m->f, l, b, tok + 4 * b);
      if (r->tier > slowest) slowest = r->tier;
      if (r->tier == KVT_TIER_HOT) {
        assert_memory_equal(r->k_out, m->f.want.k, each);
        assert_memory_equal(r->v_out, m->f.want.v, each);
      } else {
        char why[256];
        assert_int_equal(r->tier, KVT_TIER_WARM);
        if (!warm_ok(&m->f.sh, m->f.want.k, m->f.want.v, r->k_out, r->v_out, KVT_CODEC_K8,
                     KVT_CODEC_V3, why, sizeof why))
          fail_msg("loaded block %u layer %u (warm): %s", b, l, why);
      }
    }
    assert_int_equal(ent[b].tier, slowest);
  }
  free(buf);
}

static void m_step(model *m) {
  mseq *q = &m->seq[tu_below(MAXS)];
  uint32_t r = tu_below(100);
  if (!q->s) m_create(m, q);
  else if (r < 8) m_release(m, q);
  else if (r < 30 && q->na < q->nb) m_append(m, q);
  else if (r < 70 && q->na) m_put(m, q);
  else if (r < 82 && q->na) m_read(m, q, tu_below(q->na), tu_below(NL));
  else if (r < 92 && q->na) m_gather(m, q);
  else m_lookup(m);
  check_invariants(m);
}

static void test_random_workload(void **state) {
  (void)state;
  model *m = calloc(1, sizeof *m);
  assert_non_null(m);
  kvt_shape sh = shape1(KVT_F16, NL);
  costs c = measure(&sh);
  /* about 14 layer blocks fit; the live sequences hold ~20 on average */
  m->hot_limit = 4 * c.hot + c.hot / 2;
  m->warm_limit = 10 * c.warm + c.warm / 2;
  fx_open(&m->f, &sh, m->hot_limit, m->warm_limit, 0);
  for (int f = 0; f < NFAM; f++)
    for (int i = 0; i < 4 * MAXB; i++) m->fam[f][i] = (uint32_t)tu_rand();
  int steps = tu_stress() ? 200000 : 4000;
  for (int i = 0; i < steps; i++) {
    m_step(m);
    if (i % 500 == 0) verify_all(m);
  }
  verify_all(m);
  kvt_stats st;
  tu_stats(m->f.e, &st);
  fprintf(stderr, "warm workload: %d steps, %llu puts ok, %llu EFULL, %llu demotions, %llu warm "
          "drops, %llu hot drops, reads %llu exact / %llu approx\n", steps,
          (unsigned long long)m->n_ok, (unsigned long long)m->n_full,
          (unsigned long long)st.demotions, (unsigned long long)st.evictions[KVT_TIER_WARM],
          (unsigned long long)st.evictions[KVT_TIER_HOT], (unsigned long long)m->n_hot_reads,
          (unsigned long long)m->n_warm_reads);
  /* the run exercised what it is about */
  assert_true(m->n_full > 0);
  assert_true(st.demotions > 0 && st.evictions[KVT_TIER_WARM] > 0);
  assert_true(m->n_warm_reads > 0 && m->n_hot_reads > 0);
  for (int i = 0; i < MAXS; i++)
    if (m->seq[i].s) m_release(m, &m->seq[i]);
  check_invariants(m);
  assert_int_equal(total_refs(m), 0);
  fx_close(&m->f);
  free(m);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_workload),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
