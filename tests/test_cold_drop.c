/* test_cold_drop.c - what enters and leaves the cold tier (split from
 * test_cold.c): admission, prefix and namespace drops of durable blocks,
 * eviction of durable blocks from RAM, and a full cold tier (KVT_EFULL,
 * nothing durable lost, room made by reclaiming). Both backends;
 * KVT_TEST_FILTER (a cmocka pattern) picks tests. */
#include "cold_fx.h"

/* cold_admit_min_seen = 2: a block appended once is not written; the
 * second append of it (by another sequence) admits it. */
static void admission(cold_fx *f) {
  kvt_options o;
  fx_opts(f, &o);
  o.cold_admit_min_seen = 2;
  kvt_engine *e = fx_open_ns(f, &o, "admit", KVT_F16);
  tu_kv kv;
  tu_kv_alloc(&kv, &f->sh);
  uint32_t once[3][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}};
  uint32_t twice[2][4] = {{1, 2, 3, 4}, {13, 14, 15, 16}}; /* shares block 0 with once */
  kvt_seq *a, *b;
  assert_int_equal(kvt_seq_create(e, f->ns, &a), 0);
  for (int j = 0; j < 3; j++) tu_append_put(a, &f->sh, f->salt, once[j], &kv);
  assert_int_equal(kvt_sync(e), 0);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 0);
  assert_int_equal(st.cold_written, 0);
  assert_int_equal(kvt_seq_durable(a), 0);
  assert_int_equal(kvt_seq_create(e, f->ns, &b), 0);
  for (int j = 0; j < 2; j++) tu_append_put(b, &f->sh, f->salt, twice[j], &kv);
  assert_int_equal(kvt_sync(e), 0);
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 1); /* block 0, seen twice */
  assert_int_equal(kvt_seq_durable(a), 1);
  assert_int_equal(kvt_seq_durable(b), 1);
  kvt_seq_release(a);
  kvt_seq_release(b);
  kvt_engine_close(e);

  e = tu_open(f->dir, &o);
  f->ns = tu_register(e, "admit", &f->sh);
  size_t found;
  assert_int_equal(kvt_lookup(e, f->ns, &once[0][0], 12, NULL, 0, &found), 0);
  assert_int_equal(found, 1);
  assert_int_equal(kvt_lookup(e, f->ns, &twice[0][0], 8, NULL, 0, &found), 0);
  assert_int_equal(found, 1);
  assert_int_equal(kvt_seq_create(e, f->ns, &a), 0);
  kvt_append_info info;
  assert_int_equal(kvt_seq_append(a, once[0], 4, &info), 0);
  assert_int_equal(info.durable, 1);
  for (uint32_t l = 0; l < f->sh.n_layers; l++) tu_assert_block(a, &f->sh, f->salt, 0, l, once[0]);
  assert_int_equal(kvt_seq_append(a, once[1], 4, &info), 0);
  assert_int_equal(info.durable, 0);
  kvt_seq_release(a);
  kvt_engine_close(e);
  tu_kv_free(&kv);
}
BOTH(admission)

/* KVT_ADMIT_PROMPT: a sequence's prompt blocks are written, its output
 * blocks are not (and are not held hot for the flusher); the next turn,
 * which appends the same blocks as prompt, gets them written. */
static void admit_prompt(cold_fx *f) {
  kvt_options o;
  fx_opts(f, &o);
  o.cold_admit = KVT_ADMIT_PROMPT;
  kvt_engine *e = fx_open_ns(f, &o, "prompt", KVT_F16);
  tu_kv kv;
  tu_kv_alloc(&kv, &f->sh);
  uint32_t tok[6][4];
  for (uint32_t j = 0; j < 6; j++)
    for (uint32_t i = 0; i < 4; i++) tok[j][i] = 100 * j + i;
  kvt_seq *a, *b;
  assert_int_equal(kvt_seq_output(NULL, 1), KVT_ENULL);
  assert_int_equal(kvt_seq_create(e, f->ns, &a), 0);
  for (int j = 0; j < 3; j++) tu_append_put(a, &f->sh, f->salt, tok[j], &kv); /* prompt */
  assert_int_equal(kvt_seq_output(a, 1), 0);
  for (int j = 3; j < 5; j++) tu_append_put(a, &f->sh, f->salt, tok[j], &kv); /* output */
  assert_int_equal(kvt_sync(e), 0);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 3);
  assert_int_equal(kvt_seq_durable(a), 3);
  /* turn two: the whole conversation so far is its prompt */
  assert_int_equal(kvt_seq_create(e, f->ns, &b), 0);
  for (int j = 0; j < 6; j++) tu_append_put(b, &f->sh, f->salt, tok[j], &kv);
  assert_int_equal(kvt_sync(e), 0);
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 6);
  assert_int_equal(kvt_seq_durable(a), 5);
  assert_int_equal(kvt_seq_durable(b), 6);
  kvt_seq_release(a);
  kvt_seq_release(b);
  kvt_engine_close(e);
  /* a fork inherits the output mode; an unknown rule is refused */
  o.cold_admit = 2;
  kvt_engine *bad = NULL;
  assert_int_equal(kvt_engine_open(f->dir, &o, &bad), KVT_EOPTION);
  assert_null(bad);
  o.cold_admit = KVT_ADMIT_PROMPT;
  e = tu_open(f->dir, &o);
  f->ns = tu_register(e, "prompt", &f->sh);
  assert_int_equal(kvt_seq_create(e, f->ns, &a), 0);
  assert_int_equal(kvt_seq_output(a, 1), 0);
  uint32_t fresh[2][4] = {{7, 7, 7, 7}, {8, 8, 8, 8}};
  tu_append_put(a, &f->sh, f->salt, fresh[0], &kv);
  assert_int_equal(kvt_seq_fork(a, UINT32_MAX, &b), 0);
  tu_append_put(b, &f->sh, f->salt, fresh[1], &kv);
  assert_int_equal(kvt_sync(e), 0);
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 6); /* neither output block */
  assert_int_equal(kvt_seq_durable(b), 0);
  size_t found;
  assert_int_equal(kvt_lookup(e, f->ns, &tok[0][0], 24, NULL, 0, &found), 0);
  assert_int_equal(found, 6);
  kvt_seq_release(a);
  kvt_seq_release(b);
  kvt_engine_close(e);
  tu_kv_free(&kv);
}
BOTH(admit_prompt)

/* Store specs of one namespace, each sequence synced (and checked
 * durable) and released. */
static void store_specs(kvt_engine *e, kvt_ns_id ns, const kvt_shape *sh, uint64_t salt,
                        uint64_t seed, const cu_seqspec *specs, size_t n) {
  tu_kv kv;
  tu_kv_alloc(&kv, sh);
  for (size_t s = 0; s < n; s++) {
    kvt_seq *q;
    assert_int_equal(kvt_seq_create(e, ns, &q), 0);
    for (uint32_t j = 0; j < specs[s].n_blocks; j++) {
      uint32_t tok[64];
      cu_tokens(seed, &specs[s], j, sh->block_tokens, tok);
      assert_int_equal(cu_append_put(q, sh, salt, tok, &kv, NULL), 0);
    }
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(kvt_seq_durable(q), specs[s].n_blocks);
    kvt_seq_release(q);
  }
  tu_kv_free(&kv);
}

static size_t lookup_spec(kvt_engine *e, kvt_ns_id ns, const kvt_shape *sh, uint64_t seed,
                          const cu_seqspec *sp) {
  uint32_t *tok = cu_seq_tokens(seed, sp, sp->n_blocks, sh->block_tokens);
  size_t found = 99;
  assert_int_equal(kvt_lookup(e, ns, tok, (size_t)sp->n_blocks * sh->block_tokens, NULL, 0, &found), 0);
  free(tok);
  return found;
}

/* Load every layer of block j of sp by key: 1 when all exact, 0 when all
 * missing; fails on anything else. */
static int load_spec_block(kvt_engine *e, kvt_ns_id ns, const kvt_shape *sh, uint64_t salt,
                           uint64_t seed, const cu_seqspec *sp, uint32_t j) {
  uint32_t *tok = cu_seq_tokens(seed, sp, j + 1, sh->block_tokens);
  kvt_key *keys = calloc(j + 1, sizeof *keys);
  size_t nk;
  assert_int_equal(kvt_keys(e, ns, tok, (size_t)(j + 1) * sh->block_tokens, keys, j + 1, &nk), 0);
  uint32_t n_exact, n_wrong;
  int rc = cu_load_block(e, ns, sh, salt, &keys[j], j, tok + (size_t)j * sh->block_tokens, NULL,
                         NULL, &n_exact, &n_wrong);
  free(keys);
  free(tok);
  assert_int_equal(n_wrong, 0);
  if (rc == 0) {
    assert_int_equal(n_exact, sh->n_layers);
    return 1;
  }
  assert_int_equal(rc, KVT_ENOTFOUND);
  assert_int_equal(n_exact, 0);
  return 0;
}

/* kvt_drop_prefix removes, durably, the prefix and what extends it; a
 * block sharing only part of it stays stored but unreachable by lookup. */
static void drop_prefix_durable(cold_fx *f) {
  kvt_shape sh = tu_shape_small(KVT_BF16);
  uint64_t salt = tu_salt("dropper");
  /* X and Y share blocks 0-1; Z shares block 0 only; W is unrelated. */
  const cu_seqspec X = {0, 0, 2, 4}, Y = {0, 1, 2, 3}, Z = {0, 2, 1, 3}, W = {1, 0, 0, 2};
  const cu_seqspec all[4] = {X, Y, Z, W};
  kvt_engine *e = fx_open(f);
  kvt_ns_id ns = tu_register(e, "dropper", &sh);
  store_specs(e, ns, &sh, salt, f->seed, all, 4);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 9); /* b0 b1 x2 x3 y2 z1 z2 w0 w1 */
  uint32_t *px = cu_seq_tokens(f->seed, &X, 2, sh.block_tokens);
  uint64_t dropped = 0;
  assert_int_equal(kvt_drop_prefix(e, ns, px, 2 * sh.block_tokens, &dropped), 0);
  assert_int_equal(dropped, 5); /* b0 b1 x2 x3 y2 */
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 4);
  for (int pass = 0; pass < 2; pass++) {
    assert_int_equal(lookup_spec(e, ns, &sh, f->seed, &X), 0);
    assert_int_equal(lookup_spec(e, ns, &sh, f->seed, &Y), 0);
    assert_int_equal(lookup_spec(e, ns, &sh, f->seed, &Z), 0); /* lost its chain head */
    assert_int_equal(lookup_spec(e, ns, &sh, f->seed, &W), 2);
    for (uint32_t j = 0; j < 4; j++) assert_int_equal(load_spec_block(e, ns, &sh, salt, f->seed, &X, j), 0);
    assert_int_equal(load_spec_block(e, ns, &sh, salt, f->seed, &Y, 2), 0);
    assert_int_equal(load_spec_block(e, ns, &sh, salt, f->seed, &Z, 1), 1); /* kept */
    assert_int_equal(load_spec_block(e, ns, &sh, salt, f->seed, &Z, 2), 1);
    assert_int_equal(load_spec_block(e, ns, &sh, salt, f->seed, &W, 1), 1);
    kvt_engine_close(e); /* and after reopening */
    e = fx_open(f);
    ns = tu_register(e, "dropper", &sh);
    tu_stats(e, &st);
    assert_int_equal(st.cold_records, 4);
  }
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.checked, 4);
  assert_int_equal(fr.bad, 0);
  /* Writing X again makes it durable again. */
  store_specs(e, ns, &sh, salt, f->seed, &X, 1);
  assert_int_equal(lookup_spec(e, ns, &sh, f->seed, &X), 4);
  kvt_engine_close(e);
  free(px);
}
BOTH(drop_prefix_durable)

/* kvt_ns_drop removes every block of the namespace and the namespace,
 * durably; registering the same descriptor again finds no stale KV. */
static void ns_drop_durable(cold_fx *f) {
  kvt_shape sa = tu_shape_small(KVT_BF16), sb = tu_shape_small(KVT_F32);
  const cu_seqspec A[2] = {{0, 0, 1, 3}, {0, 1, 1, 2}}, B[1] = {{0, 0, 0, 3}};
  kvt_engine *e = fx_open(f);
  kvt_ns_id na = tu_register(e, "gone", &sa), nb = tu_register(e, "stays", &sb);
  store_specs(e, na, &sa, tu_salt("gone"), f->seed, A, 2);
  store_specs(e, nb, &sb, tu_salt("stays"), f->seed, B, 1);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 4 + 3);
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, na, &q), 0);
  assert_int_equal(kvt_ns_drop(e, na), KVT_EBUSY);
  kvt_seq_release(q);
  assert_int_equal(kvt_ns_drop(e, na), 0);
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 3);
  assert_int_equal(st.namespaces, 1);
  kvt_engine_close(e);

  e = fx_open(f);
  kvt_ns_id id;
  kvt_ns_desc d;
  assert_int_equal(kvt_ns_get(e, 0, &id, &d), 0);
  assert_string_equal(d.model_id, "stays");
  assert_int_equal(kvt_ns_get(e, 1, &id, &d), KVT_ENOTFOUND);
  tu_stats(e, &st);
  assert_int_equal(st.cold_records, 3);
  nb = id;
  assert_int_equal(lookup_spec(e, nb, &sb, f->seed, &B[0]), 3);
  for (uint32_t j = 0; j < 3; j++)
    assert_int_equal(load_spec_block(e, nb, &sb, tu_salt("stays"), f->seed, &B[0], j), 1);
  na = tu_register(e, "gone", &sa); /* same descriptor, so the same keys */
  for (int s = 0; s < 2; s++) {
    assert_int_equal(lookup_spec(e, na, &sa, f->seed, &A[s]), 0);
    for (uint32_t j = 0; j < A[s].n_blocks; j++)
      assert_int_equal(load_spec_block(e, na, &sa, tu_salt("gone"), f->seed, &A[s], j), 0);
  }
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.checked, 3);
  assert_int_equal(fr.bad, 0);
  kvt_engine_close(e);
}
BOTH(ns_drop_durable)

/* A hot tier smaller than the data: referenced blocks whose token block is
 * durable leave RAM, still read back exactly (from cold) through
 * kvt_seq_read; kvt_seq_retained lists them as cold; lookups report a
 * block with a layer out of RAM as cold; kvt_seq_gather of a layer that
 * RAM cannot hold whole refuses, writing nothing. */
static void evict_to_cold(cold_fx *f) {
  kvt_shape sh = tu_shape_small(KVT_BF16);
  size_t each = kvt_shape_block_bytes(&sh);
  const uint32_t nb = 16, L = sh.n_layers;
  kvt_options o;
  fx_opts(f, &o);
  o.tier_bytes_limit[KVT_TIER_HOT] = 12 * (2 * each + 256); /* ~ 12 of 64 layer blocks */
  kvt_engine *e = tu_open(f->dir, &o);
  kvt_ns_id ns = tu_register(e, "evict", &sh);
  uint64_t salt = tu_salt("evict");
  uint32_t *tok = malloc(nb * sh.block_tokens * sizeof *tok);
  for (uint32_t i = 0; i < nb * sh.block_tokens; i++) tok[i] = (uint32_t)tu_rand();
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, ns, &q), 0);
  for (uint32_t j = 0; j < nb; j++) tu_append_put(q, &sh, salt, tok + j * sh.block_tokens, &kv);
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(q), nb);
  kvt_stats st;
  tu_stats(e, &st);
  assert_true(st.evictions[KVT_TIER_HOT] > 0);
  assert_true(st.tier_bytes[KVT_TIER_HOT] <= o.tier_bytes_limit[KVT_TIER_HOT]);
  assert_true(st.tier_blocks[KVT_TIER_HOT] < (uint64_t)nb * L);
  assert_int_equal(st.cold_records, nb);
  uint64_t reads0 = st.cold_reads;

  /* kvt_seq_retained lists what left RAM as cold, without reading */
  uint8_t in_ram[16][8] = {{0}};
  uint64_t listed_hot = 0;
  uint8_t *gk = malloc(nb * each), *gv = malloc(nb * each);
  kvt_gathered g[16];
  tu_kv want;
  tu_kv_alloc(&want, &sh);
  for (uint32_t l = 0; l < L; l++) {
    size_t n = 0;
    assert_int_equal(kvt_seq_retained(q, l, g, 16, &n), 0);
    assert_int_equal(n, nb);
    for (size_t i = 0; i < n; i++) {
      assert_int_equal(g[i].block, i);
      in_ram[i][l] = g[i].tier != KVT_TIER_COLD;
      listed_hot += g[i].tier == KVT_TIER_HOT;
    }
  }
  tu_stats(e, &st);
  assert_int_equal(listed_hot, st.tier_blocks[KVT_TIER_HOT]);
  assert_true(listed_hot < (uint64_t)nb * L);
  assert_int_equal(st.cold_reads, reads0);
  /* lookups: cold when any layer left RAM */
  kvt_lookup_entry ent[16];
  size_t found;
  assert_int_equal(kvt_lookup(e, ns, tok, nb * sh.block_tokens, ent, 16, &found), 0);
  assert_int_equal(found, nb);
  uint64_t out_of_ram = 0;
  for (uint32_t j = 0; j < nb; j++) {
    int all = 1;
    for (uint32_t l = 0; l < L; l++) {
      all &= in_ram[j][l];
      out_of_ram += !in_ram[j][l];
    }
    assert_int_equal(ent[j].tier, all ? KVT_TIER_HOT : KVT_TIER_COLD);
    assert_true(ent[j].est_load_us > 0);
  }
  /* every block reads back exactly, the evicted ones from cold */
  for (uint32_t j = 0; j < nb; j++)
    for (uint32_t l = 0; l < L; l++) tu_assert_block(q, &sh, salt, j, l, tok + j * sh.block_tokens);
  tu_stats(e, &st);
  assert_int_equal(st.cold_reads - reads0, out_of_ram);
  assert_int_equal(st.cold_checksum_failures, 0);
  /* 12 layer blocks of RAM cannot hold a layer of 16: a gather brings back
   * what fits, then refuses (KVT_ENOTRESIDENT, saying RAM is full) and
   * writes nothing; the hot tier stays within its limit */
  for (uint32_t l = 0; l < L; l++) {
    size_t bytes = nb * each, n = 0;
    memset(gk, 0x3c, nb * each);
    assert_int_equal(kvt_seq_gather(q, l, gk, gv, &bytes, g, 16, &n), KVT_ENOTRESIDENT);
    assert_true(n > 0 && n <= nb);
    for (size_t i = 0; i < nb * each; i++) assert_int_equal(gk[i], 0x3c);
    kvt_error_info info;
    assert_int_equal(kvt_last_error(e, &info), 0);
    assert_non_null(strstr(info.message, "RAM is full"));
    tu_stats(e, &st);
    assert_true(st.tier_bytes[KVT_TIER_HOT] <= o.tier_bytes_limit[KVT_TIER_HOT]);
  }
  /* a hot tier that is still full of referenced blocks can take more */
  uint32_t more[4] = {1, 1, 2, 2};
  tu_append_put(q, &sh, salt, more, &kv);
  tu_assert_block(q, &sh, salt, nb, 0, more);
  kvt_seq_release(q);
  tu_kv_free(&want);
  tu_kv_free(&kv);
  free(gk);
  free(gv);
  free(tok);
  kvt_engine_close(e);
}
BOTH(evict_to_cold)

/* ------------------------------------------------- a full cold tier */

/* A cold tier of three segments (two for data, one spare for relocating
 * blocks out of a reclaimed one): a sequence that references more than it
 * holds gets KVT_EFULL from kvt_sync, its durable watermark stops, and its
 * blocks stay readable from RAM; nothing durable is lost. Once released,
 * its blocks make room (segments are reclaimed) for a new sequence, which
 * becomes durable in full and survives reopening. */
static void cold_full(cold_fx *f) {
  kvt_options o;
  fx_opts(f, &o);
  o.tier_bytes_limit[KVT_TIER_COLD] = 3 * o.cold_segment_bytes;
  kvt_engine *e = fx_open_ns(f, &o, "full", KVT_BF16);
  const uint32_t na = 150, nb = 60; /* records of ~20 KiB: ~100 fit in two segments */
  cu_seqspec a = {0, 0, 0, na}, b = {1, 0, 0, nb};
  uint32_t *ta = cu_seq_tokens(f->seed, &a, na, f->sh.block_tokens);
  uint32_t *tb = cu_seq_tokens(f->seed, &b, nb, f->sh.block_tokens);
  tu_kv kv;
  tu_kv_alloc(&kv, &f->sh);
  kvt_seq *q;
  assert_int_equal(kvt_seq_create(e, f->ns, &q), 0);
  int full = 0;
  for (uint32_t j = 0; j < na; j++) {
    tu_append_put(q, &f->sh, f->salt, ta + j * f->sh.block_tokens, &kv);
    if ((j + 1) % 10) continue;
    int rc = kvt_sync(e);
    if (rc && rc != KVT_EFULL) fprintf(stderr, "cold_full: sync after %u blocks: %s\n", j + 1, kvt_strerror(rc));
    assert_true(rc == 0 || rc == KVT_EFULL);
    full |= rc == KVT_EFULL;
  }
  assert_true(full);
  uint32_t da = kvt_seq_durable(q);
  assert_true(da > 0 && da < na);
  kvt_stats st;
  tu_stats(e, &st);
  assert_true(st.cold_segments <= 3);
  assert_true(st.cold_write_failures > 0);
  assert_true(st.tier_bytes[KVT_TIER_COLD] <= o.tier_bytes_limit[KVT_TIER_COLD]);
  for (uint32_t j = 0; j < na; j += 7) /* still readable, exactly */
    for (uint32_t l = 0; l < f->sh.n_layers; l++) tu_assert_block(q, &f->sh, f->salt, j, l, ta + j * f->sh.block_tokens);
  size_t found = 0;
  assert_int_equal(kvt_lookup(e, f->ns, ta, (size_t)na * f->sh.block_tokens, NULL, 0, &found), 0);
  assert_int_equal(found, na); /* in RAM, all of them */
  kvt_seq_release(q);

  assert_int_equal(kvt_seq_create(e, f->ns, &q), 0);
  for (uint32_t j = 0; j < nb; j++) tu_append_put(q, &f->sh, f->salt, tb + j * f->sh.block_tokens, &kv);
  assert_int_equal(kvt_sync(e), 0);
  assert_int_equal(kvt_seq_durable(q), nb);
  kvt_seq_release(q);
  kvt_engine_close(e);

  e = tu_open(f->dir, &o);
  f->ns = tu_register(e, "full", &f->sh);
  assert_int_equal(kvt_lookup(e, f->ns, tb, (size_t)nb * f->sh.block_tokens, NULL, 0, &found), 0);
  assert_int_equal(found, nb);
  for (uint32_t j = 0; j < nb; j++) assert_int_equal(load_spec_block(e, f->ns, &f->sh, f->salt, f->seed, &b, j), 1);
  for (uint32_t j = 0; j < na; j += 3) /* the first sequence: exact or evicted, never other bytes */
    load_spec_block(e, f->ns, &f->sh, f->salt, f->seed, &a, j);
  kvt_fsck_result fr;
  assert_int_equal(kvt_fsck(e, 0, &fr, NULL, NULL), 0);
  assert_int_equal(fr.bad, 0);
  tu_stats(e, &st);
  assert_int_equal(fr.checked, st.cold_records);
  assert_true(st.cold_segments <= 3);
  kvt_engine_close(e);
  tu_kv_free(&kv);
  free(ta);
  free(tb);
}
BOTH(cold_full)

int main(void) {
  const struct CMUnitTest tests[] = {
      BOTH_TESTS(admission),
      BOTH_TESTS(admit_prompt),
      BOTH_TESTS(drop_prefix_durable),
      BOTH_TESTS(ns_drop_durable),
      BOTH_TESTS(evict_to_cold),
      BOTH_TESTS(cold_full),
  };
  return FX_MAIN(tests);
}
