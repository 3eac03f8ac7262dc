/* lineage.c - content addressing under a lossy policy: once a sequence's
 * attention has been lossy (eviction, quantization, approximate reads), the
 * blocks it appends are keyed under a lineage of its own, so they never
 * meet a plain key's block (docs/policy.md, "Lossy sequences do not share"). */
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "engine/internal.h"

/* 16 bytes no other engine open has: from the kernel's generator, else
 * (no getrandom) the clock, the process and where the engine lives,
 * which no two live engines share. Ids are a hash of it and a counter. */
static void nonce_init(kvt_engine *e) {
  kvt_key *n = &e->lineage_nonce;
  if (getrandom(n->b, sizeof n->b, GRND_NONBLOCK) == (ssize_t)sizeof n->b) return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t w[2] = {(uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec,
                   (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)e};
  memcpy(n->b, w, sizeof n->b);
}

static void lineage_new(kvt_engine *e, kvt_key *out) {
  if (e->lineages == 0) nonce_init(e);
  kvt_key ctr = {{0}};
  uint64_t c = ++e->lineages;
  memcpy(ctr.b, &c, sizeof c);
  kvt_key_salt(&e->lineage_nonce, &ctr, out);
}

void kvt_lineage_mark_locked(kvt_seq *s, uint32_t why) {
  if (s->lossy) return;
  s->lossy = 1;
  s->lossy_why = (uint8_t)why;
  s->salted_from = s->n_blocks; /* the blocks it holds were computed before */
  lineage_new(s->e, &s->lineage);
  s->e->tc.lossy_seqs++;
}

/* Warm blocks and hot ones a promotion dequantized are not the bytes that
 * were put. */
void kvt_lineage_check_locked(kvt_seq *s, kvt_lblk *const *blk, size_t n) {
  for (size_t i = 0; i < n && !s->lossy; i++)
    if (blk[i]->tier != KVT_TIER_HOT || blk[i]->approx) kvt_lineage_mark_locked(s, KVT_LOSSY_APPROX);
}

/* The child holds the parent's retained set as it is now, which may lack
 * what it had when the child's last blocks were computed: lossy when the
 * parent is. It takes a lineage of its own: from the fork on the two run
 * apart (policy state, recall sketches, tier moves), so equal tokens need
 * not give them equal K and V. */
void kvt_lineage_fork_locked(kvt_seq *child, const kvt_seq *parent) {
  if (!parent->lossy) return;
  kvt_lineage_mark_locked(child, KVT_LOSSY_FORK);
  if (parent->salted_from < child->salted_from) child->salted_from = parent->salted_from;
}

void kvt_lineage_on_put_locked(kvt_seq *s, uint32_t block) {
  if (block < s->salted_from) return;
  s->lossy_puts++;
  s->e->tc.lossy_puts++;
}

void kvt_lineage_key(const kvt_seq *s, const kvt_key *parent, const uint32_t *tokens,
                     uint32_t n_tokens, kvt_key *out) {
  if (!s->lossy) {
    kvt_key_next(&s->ns->seed, parent, tokens, n_tokens, out);
    return;
  }
  kvt_key salted;
  kvt_key_salt(parent, &s->lineage, &salted);
  kvt_key_next(&s->ns->seed, &salted, tokens, n_tokens, out);
}

int kvt_seq_lineage(kvt_seq *s, kvt_lineage_info *out) {
  if (!s || !out) return KVT_ENULL;
  pthread_mutex_lock(&s->e->lock);
  *out = (kvt_lineage_info){.lossy = s->lossy, .why = s->lossy_why,
                            .salted_from = s->salted_from, .lossy_puts = s->lossy_puts};
  pthread_mutex_unlock(&s->e->lock);
  return 0;
}

int kvt_seq_mark_lossy(kvt_seq *s) {
  if (!s) return KVT_ENULL;
  pthread_mutex_lock(&s->e->lock);
  kvt_lineage_mark_locked(s, KVT_LOSSY_CALLER);
  pthread_mutex_unlock(&s->e->lock);
  return 0;
}
