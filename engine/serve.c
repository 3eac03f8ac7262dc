/* serve.c - what a serving loop needs beside puts and reads: the event fd
 * that wakes an event loop when loads complete or blocks become durable,
 * non-blocking load completion, per-sequence durability errors, and
 * request pins that hold a sequence's blocks at their precision for a step.
 * Locking as in seq.c; the event fd is written without the engine lock. */
#include <errno.h>
#include <stdlib.h>

#include "engine/internal.h"
#include "base/event.h"

/* ---------- the event fd ---------- */

int kvt_event_fd(kvt_engine *e) {
  if (!e) return KVT_ENULL;
  int fd = __atomic_load_n(&e->event_fd, __ATOMIC_ACQUIRE);
  if (fd >= 0) return fd;
  pthread_mutex_lock(&e->lock); /* one fd, however many threads ask at once */
  fd = e->event_fd;
  if (fd < 0) {
    fd = kvt_evfd_open();
    if (fd >= 0) __atomic_store_n(&e->event_fd, fd, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&e->lock);
  return fd;
}

void kvt_event_signal(kvt_engine *e) {
  int fd = __atomic_load_n(&e->event_fd, __ATOMIC_ACQUIRE);
  if (fd >= 0) kvt_evfd_signal(fd); /* nobody asked for it: no cost */
}

void kvt_event_notify(void *engine) { kvt_event_signal(engine); }

void kvt_event_close(kvt_engine *e) { kvt_evfd_close(e->event_fd); }

/* ---------- loads ---------- */

int kvt_load_poll(kvt_load *ld, size_t *n_ok) {
  if (!ld) return KVT_ENULL;
  if (!kvt_store_read_done(ld->cb)) return KVT_EBUSY; /* NULL (no device read) is done */
  return kvt_load_wait(ld, n_ok);
}

/* ---------- durability ---------- */

int kvt_seq_durable_error(const kvt_seq *s, uint32_t *n_durable) {
  if (n_durable) *n_durable = 0;
  if (!s) return KVT_ENULL;
  kvt_engine *e = s->e;
  if (!e->store) return 0;
  pthread_mutex_lock(&e->lock);
  uint32_t n = 0;
  while (n < s->n_blocks && s->tb[n]->cold) n++;
  int err = 0;
  for (uint32_t b = n; b < s->n_blocks && !err; b++)
    if (!s->tb[b]->cold) err = s->tb[b]->cold_err;
  pthread_mutex_unlock(&e->lock);
  if (n_durable) *n_durable = kvt_store_payload(e) ? n : 0; /* as kvt_seq_durable() */
  return err;
}

/* ---------- request pins ----------
 * A request pin is one tier pin (lblk.pins: the block cannot change tier
 * or be freed) per block, counted in lblk.rpins too, so the engine knows
 * the hot bytes pinned by requests (each block once, however many
 * sequences pin it) and can bound them. */

/* Hot bytes request pins may hold together: the hot limit less one token
 * block of ns in every layer, so another request can still put a whole
 * token block (and make it durable: the cold tier takes it whole). */
static uint64_t pin_allowance(const kvt_engine *e, const kvt_nsrec *ns) {
  uint64_t one = kvt_lblk_desc_bytes() + kvt_mem_round(2 * ns->bytes_each);
  uint64_t reserve = one * ns->desc.shape.n_layers, limit = e->tier[KVT_TIER_HOT].bytes_limit;
  return limit > reserve ? limit - reserve : 0;
}

static void pins_release(kvt_engine *e, kvt_lblk **set, size_t n) {
  for (size_t i = 0; i < n; i++) kvt_lblk_unpin(e, set[i]); /* may free an orphan */
}

int kvt_seq_pin(kvt_seq *s) {
  if (!s) return KVT_ENULL;
  kvt_engine *e = s->e;
  size_t all = (size_t)s->n_blocks * s->ns->desc.shape.n_layers, cap = 0;
  for (size_t i = 0; i < all; i++) cap += s->lb[i] != NULL; /* s's own array: no lock */
  kvt_lblk **set = NULL;
  if (cap && !(set = kvt_mem_alloc(&e->mem, KVT_MEM_SEQ, cap * sizeof *set))) return -ENOMEM;
  pthread_mutex_lock(&e->lock);
  /* Count the new set in, the old one out, then check the bound. */
  size_t n = 0;
  uint64_t add = 0, freed = 0;
  for (size_t i = 0; i < all; i++) {
    kvt_lblk *b = s->lb[i];
    if (!b || b->tier == KVT_TIER_COLD) continue; /* not in RAM: nothing to hold */
    set[n++] = b;
    if (b->rpins++ == 0 && b->tier == KVT_TIER_HOT) add += b->cost;
  }
  for (size_t i = 0; i < s->n_pin; i++) {
    kvt_lblk *b = s->pin[i];
    if (--b->rpins == 0 && b->tier == KVT_TIER_HOT) freed += b->cost;
  }
  uint64_t want = e->pinned_hot + add - freed, allowed = pin_allowance(e, s->ns);
  if (want > allowed) { /* undo the counts: nothing changes */
    for (size_t i = 0; i < s->n_pin; i++) s->pin[i]->rpins++;
    for (size_t i = 0; i < n; i++) set[i]->rpins--;
    pthread_mutex_unlock(&e->lock);
    kvt_mem_free(&e->mem, KVT_MEM_SEQ, set, cap * sizeof *set);
    return KVT_ERR(e, KVT_ELIMIT, "kvt_seq_pin", "hot bytes pinned",
                   "at most the hot limit less one token block in every layer",
                   "%llu (%llu allowed)", (unsigned long long)want,
                   (unsigned long long)allowed);
  }
  e->pinned_hot = want;
  for (size_t i = 0; i < n; i++) kvt_lblk_pin(e, set[i]);
  pins_release(e, s->pin, s->n_pin); /* after: a block in both never loses its pin */
  kvt_lblk **old = s->pin;
  size_t old_cap = s->pin_cap;
  s->pin = set;
  s->n_pin = n;
  s->pin_cap = cap;
  pthread_mutex_unlock(&e->lock);
  kvt_mem_free(&e->mem, KVT_MEM_SEQ, old, old_cap * sizeof *old);
  return 0;
}

void kvt_seq_unpin_locked(kvt_seq *s) {
  kvt_engine *e = s->e;
  for (size_t i = 0; i < s->n_pin; i++) {
    kvt_lblk *b = s->pin[i];
    if (--b->rpins == 0 && b->tier == KVT_TIER_HOT) e->pinned_hot -= b->cost;
  }
  pins_release(e, s->pin, s->n_pin);
  kvt_mem_free(&e->mem, KVT_MEM_SEQ, s->pin, s->pin_cap * sizeof *s->pin);
  s->pin = NULL;
  s->n_pin = s->pin_cap = 0;
}

int kvt_seq_unpin(kvt_seq *s) {
  if (!s) return KVT_ENULL;
  pthread_mutex_lock(&s->e->lock);
  kvt_seq_unpin_locked(s);
  pthread_mutex_unlock(&s->e->lock);
  return 0;
}
