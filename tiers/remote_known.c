/* remote_known.c - the keys a remote lookup found, exact (whole keys, no
 * fingerprints: a key it answers for was found in the cluster), in a
 * 4-way set table under one short lock. */
#include "tiers/remote_known.h"

#include <errno.h>
#include <string.h>

#include "base/key.h"

#define KN_N (KVT_KNOWN_SETS * KVT_KNOWN_WAYS)

int kvt_known_open(kvt_known *kn, kvt_mem *m) {
  *kn = (kvt_known){.mem = m};
  pthread_mutex_init(&kn->lock, NULL);
  kn->keys = kvt_mem_calloc(m, KVT_MEM_OTHER, KN_N * sizeof *kn->keys);
  kn->born = kvt_mem_calloc(m, KVT_MEM_OTHER, KN_N * sizeof *kn->born);
  kn->used = kvt_mem_calloc(m, KVT_MEM_OTHER, KN_N);
  kn->next = kvt_mem_calloc(m, KVT_MEM_OTHER, KVT_KNOWN_SETS);
  return kn->keys && kn->born && kn->used && kn->next ? 0 : -ENOMEM;
}

void kvt_known_close(kvt_known *kn) {
  kvt_mem_free(kn->mem, KVT_MEM_OTHER, kn->keys, KN_N * sizeof *kn->keys);
  kvt_mem_free(kn->mem, KVT_MEM_OTHER, kn->born, KN_N * sizeof *kn->born);
  kvt_mem_free(kn->mem, KVT_MEM_OTHER, kn->used, KN_N);
  kvt_mem_free(kn->mem, KVT_MEM_OTHER, kn->next, KVT_KNOWN_SETS);
  pthread_mutex_destroy(&kn->lock);
}

/* The first way of key's set (block keys are hashes: any 8 bytes spread). */
static size_t known_set(const kvt_key *key) {
  uint64_t h;
  memcpy(&h, key->b, sizeof h);
  return (size_t)(h % KVT_KNOWN_SETS) * KVT_KNOWN_WAYS;
}

/* key's place in the table, or KN_N; lock held. */
static size_t known_find(const kvt_known *kn, const kvt_key *key) {
  size_t s = known_set(key);
  for (size_t w = 0; w < KVT_KNOWN_WAYS; w++)
    if (kn->used[s + w] && kvt_key_eq(&kn->keys[s + w], key)) return s + w;
  return KN_N;
}

uint64_t kvt_known_gen(kvt_known *kn) {
  pthread_mutex_lock(&kn->lock);
  uint64_t g = kn->gen;
  pthread_mutex_unlock(&kn->lock);
  return g;
}

void kvt_known_add(kvt_known *kn, const kvt_key *keys, size_t n, uint64_t gen, uint64_t now) {
  if (!kn->keys || !kn->born || !kn->used || !kn->next) return;
  pthread_mutex_lock(&kn->lock);
  for (size_t i = 0; i < n && kn->gen == gen; i++) {
    size_t s = known_find(kn, &keys[i]);
    if (s < KN_N) {
      kn->born[s] = now;
      continue;
    }
    s = known_set(&keys[i]);
    size_t w = 0;
    while (w < KVT_KNOWN_WAYS && kn->used[s + w]) w++;
    if (w == KVT_KNOWN_WAYS) { /* full: its ways are replaced in turn */
      w = kn->next[s / KVT_KNOWN_WAYS];
      kn->next[s / KVT_KNOWN_WAYS] = (uint8_t)((w + 1) % KVT_KNOWN_WAYS);
    }
    kn->keys[s + w] = keys[i];
    kn->born[s + w] = now;
    kn->used[s + w] = 1;
  }
  pthread_mutex_unlock(&kn->lock);
}

/* Take key out; 1 if it was there and young enough at now. Lock held. */
static int known_take_locked(kvt_known *kn, const kvt_key *key, uint64_t now) {
  size_t i = known_find(kn, key);
  if (i == KN_N) return 0;
  kn->used[i] = 0;
  return now >= kn->born[i] && now - kn->born[i] < KVT_KNOWN_TTL_NS;
}

int kvt_known_take(kvt_known *kn, const kvt_key *key, uint64_t now) {
  if (!kn->keys || !kn->born || !kn->used) return 0;
  pthread_mutex_lock(&kn->lock);
  int r = known_take_locked(kn, key, now);
  pthread_mutex_unlock(&kn->lock);
  return r;
}

void kvt_known_forget(kvt_known *kn, const kvt_key *keys, size_t n) {
  if (!kn->keys || !kn->born || !kn->used) return;
  pthread_mutex_lock(&kn->lock);
  kn->gen++;
  for (size_t i = 0; i < n; i++) (void)known_take_locked(kn, &keys[i], 0);
  pthread_mutex_unlock(&kn->lock);
}
