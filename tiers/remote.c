/* remote.c - the remote tier's client side (tiers/remote.h): a writer
 * thread that owns one cluster client and sends queued values with SET NX,
 * and a second client, under a lock, for the serving path's EXISTS and
 * GET. Every call ends within the client's deadline; whatever fails is a
 * miss or a skipped write, counted, never an error for the engine. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/key.h"
#include "io/rcluster_wire.h"
#include "tiers/remote.h"

#define WRITE_BATCH_CMDS 256u        /* SET NX a batch holds, at most */
#define WRITE_BATCH_BYTES (8u << 20) /* in flight over all masters: a master's window
                                      * is this over the masters */
#define WRITE_WINDOWS 4u             /* a batch: this many windows of each master */
#define WRITE_SCAN 1024u             /* queued jobs a batch is chosen from */
/* The writer is off the serving path: a batch (up to WRITE_WINDOWS x 8
 * MiB, all of it on one master when the cluster has one) on a loaded
 * host may take longer than a serving call's deadline, and giving up
 * would lose its writes. Still bounded: at the 2 MiB puts' slowest
 * measured here (65 a second, a new engine under load) 32 MiB take
 * about 0.25 s, 40 times less. */
#define WRITE_DEADLINE_MS 10000u
#define CACHE_N 8u                   /* checked values kept for layer-by-layer reads */
#define SL_BYTES (KVT_MAX_LAYERS * sizeof(kvt_cold_slice)) /* one block's slice table */
#define READ_BATCH 16u               /* GETs per pipeline of a batch of reads */
#define CACHE_BYTES (64u << 20)
#define QUEUE_BYTES_DEFAULT (64u << 20)
/* Blocks this process saw in the cluster (EXISTS said so, it stored them,
 * it read them), one fingerprint each in a 4-way set: a GET that then
 * finds one of them gone has noticed an eviction (maxmemory-policy)
 * rather than a plain miss. A full set forgets one: undercounted, never
 * invented. 128 KiB. */
#define SEEN_N 16384u
#define SEEN_WAYS 4u

typedef struct wjob {
  struct wjob *next;
  kvt_key key;
  uint8_t *val;               /* the value (len bytes), or its header (hdr_len) */
  size_t len, hdr_len;        /* hdr_len 0: val is the whole value, a copy */
  struct iovec *iov;          /* hdr_len: the value's parts, payloads in place */
  int n_iov, iov_cap;
  kvt_store_settled_fn settled;
  void *arg;
  size_t idx;
  int cancelled;              /* its key removed while queued: not sent (q_lock) */
  uint16_t slot;              /* its key's cluster slot: whose batch share it takes */
} wjob;

typedef struct centry {
  kvt_key key;
  uint8_t *val;               /* NULL: empty */
  size_t len;
  uint64_t tick;
  kvt_cold_entry e;
  kvt_cold_slice *sl;         /* [e.n_layers] */
} centry;

struct kvt_remote {
  kvt_mem *mem;
  int rdonly;
  kvt_rc *rd, *wr;
  pthread_mutex_t rd_lock;    /* rd and the cache */
  centry cache[CACHE_N];
  uint64_t tick, cache_bytes;
  pthread_mutex_t q_lock;     /* the queue, busy, stop, counts */
  pthread_cond_t q_cv;
  wjob *head, *tail;
  uint64_t q_bytes, q_limit;
  int busy, stop, writer_on;
  wjob **flight;              /* the batch being sent: [n_flight] (q_lock) */
  size_t n_flight;
  int hold;                   /* tests: kvt_remote_test_hold */
  uint64_t removes_waited;    /* removes that waited for a batch in flight */
  pthread_t writer;
  kvt_remote_counts n;
  uint64_t *seen;             /* [SEEN_N] fingerprints, atomics; 0 empty */
};

/* ---------- blocks seen in the cluster ---------- */

/* A block key is a hash: its first half is the fingerprint (never 0), its
 * second picks the set. */
static uint64_t *seen_set(kvt_remote *r, const kvt_key *k, uint64_t *fp) {
  uint64_t a, b;
  memcpy(&a, k->b, 8);
  memcpy(&b, k->b + 8, 8);
  *fp = a | 1;
  return &r->seen[(b % (SEEN_N / SEEN_WAYS)) * SEEN_WAYS];
}

static void seen_mark(kvt_remote *r, const kvt_key *k) {
  uint64_t fp, *set = seen_set(r, k, &fp);
  for (unsigned w = 0; w < SEEN_WAYS; w++)
    if (__atomic_load_n(&set[w], __ATOMIC_RELAXED) == fp) return;
  for (unsigned w = 0; w < SEEN_WAYS; w++) {
    uint64_t empty = 0;
    if (__atomic_compare_exchange_n(&set[w], &empty, fp, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return;
  }
  __atomic_store_n(&set[(fp >> 32) % SEEN_WAYS], fp, __ATOMIC_RELAXED); /* full: one goes */
}

/* Forget k; 1 if it was there. */
static int seen_take(kvt_remote *r, const kvt_key *k) {
  uint64_t fp, *set = seen_set(r, k, &fp);
  for (unsigned w = 0; w < SEEN_WAYS; w++) {
    uint64_t want = fp;
    if (__atomic_compare_exchange_n(&set[w], &want, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return 1;
  }
  return 0;
}

static void count(kvt_remote *r, uint64_t *field, uint64_t by) {
  pthread_mutex_lock(&r->q_lock);
  *field += by;
  pthread_mutex_unlock(&r->q_lock);
}

/* ---------- writing ---------- */

static void job_free(kvt_remote *r, wjob *j) {
  kvt_mem_free(r->mem, KVT_MEM_OTHER, j->val, j->hdr_len ? j->hdr_len : j->len);
  kvt_mem_free(r->mem, KVT_MEM_OTHER, j->iov, (size_t)j->iov_cap * sizeof *j->iov);
  kvt_mem_free(r->mem, KVT_MEM_OTHER, j, sizeof *j);
}

/* Send jobs[0..n) as one pipeline; count and settle each. */
static void write_batch(kvt_remote *r, wjob **all, size_t n_all) {
  kvt_rc_cmd cmd[WRITE_BATCH_CMDS];
  char keys[WRITE_BATCH_CMDS][KVT_REMOTE_KEY_MAX];
  wjob *jobs[WRITE_BATCH_CMDS];
  size_t n = 0;
  memset(cmd, 0, sizeof cmd);
  for (size_t i = 0; i < n_all; i++) /* set only while queued: settled once taken */
    if (!all[i]->cancelled) jobs[n++] = all[i];
  for (size_t i = 0; i < n; i++) {
    cmd[i] = (kvt_rc_cmd){.op = KVT_RC_SET_NX, .key = keys[i], .val = jobs[i]->val,
                          .val_len = jobs[i]->len};
    if (jobs[i]->hdr_len) cmd[i].val_iov = jobs[i]->iov, cmd[i].val_iovcnt = jobs[i]->n_iov;
    cmd[i].key_len = kvt_remote_block_key(&jobs[i]->key, keys[i]);
  }
  kvt_remote_counts d = {0};
  int rc[WRITE_BATCH_CMDS];
  int failed = n ? kvt_rc_exec(r->wr, cmd, n) : 0;
  if (failed) d.write_failures += n;
  for (size_t i = 0; i < n; i++) {
    rc[i] = -EIO; /* stored only when the cluster said so: a settled 0 means durable */
    if (failed) continue;
    switch (cmd[i].status) {
    case KVT_RC_OK: d.writes++, d.bytes_out += jobs[i]->len, rc[i] = 0; break;
    case KVT_RC_NIL: d.write_exists++, rc[i] = 0; break; /* another writer stored it */
    case KVT_RC_UNAVAILABLE: d.timeouts++, d.write_failures++; break;
    default: d.write_failures++; break;       /* OOM under noeviction, too big */
    }
  }
  for (size_t i = 0; i < n; i++)
    if (rc[i] == 0) seen_mark(r, &jobs[i]->key);
  kvt_rc_release(cmd, n);
  pthread_mutex_lock(&r->q_lock);
  r->n.writes += d.writes, r->n.bytes_out += d.bytes_out, r->n.write_exists += d.write_exists;
  r->n.timeouts += d.timeouts, r->n.write_failures += d.write_failures;
  r->n_flight = 0; /* answered: a remove waiting for these may DEL now */
  pthread_cond_broadcast(&r->q_cv);
  pthread_mutex_unlock(&r->q_lock);
  /* A cancelled write settles 0: it ends as a write then the remove would
   * (the block absent), and the engine counts a dropped block done. */
  for (size_t i = 0, j = 0; i < n_all; i++) {
    int c = j < n && all[i] == jobs[j] ? rc[j++] : 0;
    if (all[i]->settled) all[i]->settled(all[i]->arg, all[i]->idx, all[i]->idx + 1, c);
    job_free(r, all[i]);
  }
}

/* The master j's key goes to, in the writer's client (the writer thread
 * only); KVT_RC_NODES_MAX for a slot no master is known for. */
static int job_node(kvt_remote *r, const wjob *j) {
  int nd = kvt_rc_slot_master(r->wr, j->slot);
  return nd >= 0 && nd < (int)KVT_RC_NODES_MAX ? nd : (int)KVT_RC_NODES_MAX;
}

/* One master's window (in flight at once), q_lock held: WRITE_BATCH_BYTES
 * over the masters the first WRITE_SCAN jobs of the queue go to
 * (*masters, at least 1). */
static uint64_t batch_share(kvt_remote *r, unsigned *masters) {
  uint8_t has[KVT_RC_NODES_MAX + 1] = {0};
  unsigned n = 0, seen = 0;
  for (const wjob *j = r->head; j && seen < WRITE_SCAN; j = j->next, seen++) {
    int nd = job_node(r, j);
    n += !has[nd];
    has[nd] = 1;
  }
  *masters = n ? n : 1;
  return WRITE_BATCH_BYTES / *masters;
}

/* Take a batch off the queue, q_lock held: up to WRITE_WINDOWS of each
 * master's windows (*window: its bytes in flight at once, which the
 * client keeps it to; at least one job a master) and its part of
 * WRITE_BATCH_CMDS. The client refills a master's window as its replies
 * come, and the batch is answered when its slowest master is done:
 * values piled on one master by chance of their keys (three 2 MiB values
 * on one of three masters, the whole 8 MiB batch before) left the others
 * idle meanwhile. A job left for the next batch stays where it was in
 * the queue, ahead of later ones. */
static size_t take_jobs(kvt_remote *r, wjob **jobs, uint64_t *window) {
  uint64_t per[KVT_RC_NODES_MAX + 1] = {0};
  uint32_t cmds[KVT_RC_NODES_MAX + 1] = {0};
  unsigned masters;
  uint64_t share = (*window = batch_share(r, &masters)) * WRITE_WINDOWS;
  uint32_t each = WRITE_BATCH_CMDS / masters ? WRITE_BATCH_CMDS / masters : 1;
  size_t n = 0;
  unsigned seen = 0;
  wjob **pp = &r->head, *prev = NULL;
  while (*pp && n < WRITE_BATCH_CMDS && seen++ < WRITE_SCAN) {
    wjob *j = *pp;
    int nd = job_node(r, j);
    if (per[nd] && (per[nd] + j->len > share || cmds[nd] >= each)) {
      prev = j; /* its master has its share: next batch */
      pp = &j->next;
      continue;
    }
    *pp = j->next;
    if (r->tail == j) r->tail = prev;
    r->q_bytes -= j->len;
    per[nd] += j->len;
    cmds[nd]++;
    jobs[n++] = j;
  }
  return n;
}

static void *writer_main(void *arg) {
  kvt_remote *r = arg;
  wjob *jobs[WRITE_BATCH_CMDS];
  uint64_t window = 0;
  pthread_mutex_lock(&r->q_lock);
  for (;;) {
    while ((!r->head || r->hold == 1) && !r->stop) pthread_cond_wait(&r->q_cv, &r->q_lock);
    if (!r->head) break;
    size_t n = take_jobs(r, jobs, &window);
    r->busy = 1;
    r->flight = jobs, r->n_flight = n;
    pthread_cond_broadcast(&r->q_cv); /* room for posters */
    while (r->hold == 2 && !r->stop) pthread_cond_wait(&r->q_cv, &r->q_lock);
    pthread_mutex_unlock(&r->q_lock);
    kvt_rc_set_window(r->wr, window);
    write_batch(r, jobs, n);
    pthread_mutex_lock(&r->q_lock);
    r->busy = 0;
    pthread_cond_broadcast(&r->q_cv); /* drainers */
  }
  pthread_mutex_unlock(&r->q_lock);
  return NULL;
}

/* Queue one encoded value; 0, or 1 when it was dropped (no room, !wait). */
static int enqueue(kvt_remote *r, wjob *j, int wait) {
  pthread_mutex_lock(&r->q_lock);
  while (wait && r->q_bytes && r->q_bytes + j->len > r->q_limit && !r->stop)
    pthread_cond_wait(&r->q_cv, &r->q_lock);
  int drop = r->stop || (r->q_bytes && r->q_bytes + j->len > r->q_limit);
  if (drop) r->n.write_dropped++;
  else {
    if (r->tail) r->tail->next = j;
    else r->head = j;
    r->tail = j;
    r->q_bytes += j->len;
    pthread_cond_broadcast(&r->q_cv);
  }
  pthread_mutex_unlock(&r->q_lock);
  return drop;
}

/* j's value for rec: a copy, or (in_place) its header and its payloads
 * where they are - unless it has more parts than the wire takes for one
 * argument (more than (RC_WIRE_IOV_MAX - 1) / 2 layers): then a copy too.
 * 0, or an error of the encoding. */
static int job_encode(kvt_remote *r, wjob *j, const kvt_store_rec *rec, int in_place) {
  size_t max = kvt_remote_parts_max(rec->n_layers);
  if (!in_place || max > RC_WIRE_IOV_MAX) return kvt_remote_encode(r->mem, rec, &j->val, &j->len);
  struct iovec *iov = kvt_mem_alloc(r->mem, KVT_MEM_OTHER, max * sizeof *iov);
  int n = 0, rc = iov ? kvt_remote_encode_parts(r->mem, rec, &j->val, &j->hdr_len, iov, &n, &j->len)
                      : -ENOMEM;
  if (rc) {
    kvt_mem_free(r->mem, KVT_MEM_OTHER, iov, max * sizeof *iov);
    return rc;
  }
  j->iov = iov;
  j->n_iov = n;
  j->iov_cap = (int)max;
  return 0;
}

size_t kvt_remote_post(kvt_remote *r, const kvt_store_rec *recs, size_t n, int flags,
                       kvt_store_settled_fn settled, void *arg) {
  size_t queued = 0;
  int in_place = (flags & KVT_REMOTE_IN_PLACE) && settled;
  for (size_t i = 0; i < n; i++) {
    wjob *j = r->rdonly ? NULL : kvt_mem_calloc(r->mem, KVT_MEM_OTHER, sizeof *j);
    int rc = j ? job_encode(r, j, &recs[i], in_place) : -ENOMEM;
    if (!rc) {
      char k[KVT_REMOTE_KEY_MAX];
      j->key = recs[i].key, j->settled = settled, j->arg = arg, j->idx = i;
      j->slot = kvt_rc_slot(k, kvt_remote_block_key(&recs[i].key, k));
      if (!enqueue(r, j, flags & KVT_REMOTE_WAIT)) {
        queued++;
        continue;
      }
      job_free(r, j);
    } else {
      if (j) kvt_mem_free(r->mem, KVT_MEM_OTHER, j, sizeof *j);
      count(r, &r->n.write_failures, 1);
    }
    if (settled) settled(arg, i, i + 1, rc ? rc : -EAGAIN); /* given up, counted: not durable */
  }
  return queued;
}

/* Does keys[0..n) hold k? */
static int keys_have(const kvt_key *keys, size_t n, const kvt_key *k) {
  for (size_t i = 0; i < n; i++)
    if (kvt_key_eq(&keys[i], k)) return 1;
  return 0;
}

/* Before a remove DELs keys[0..n): queued writes of them are cancelled,
 * and a batch in flight that SETs one is waited for (its replies read),
 * so no SET of a removed key reaches the cluster after its DEL - on any
 * node, whatever the redirects. Not from the writer thread: its batch is
 * out of flight before it settles. Bounded by the writer's deadline. */
static void queue_cancel(kvt_remote *r, const kvt_key *keys, size_t n) {
  pthread_mutex_lock(&r->q_lock);
  for (wjob *j = r->head; j; j = j->next)
    if (!j->cancelled && keys_have(keys, n, &j->key)) {
      j->cancelled = 1;
      r->n.write_cancelled++;
    }
  for (int waited = 0;;) {
    int sending = 0;
    for (size_t i = 0; i < r->n_flight && !sending; i++)
      sending = !r->flight[i]->cancelled && keys_have(keys, n, &r->flight[i]->key);
    if (!sending) break;
    r->removes_waited += !waited;
    waited = 1;
    pthread_cond_wait(&r->q_cv, &r->q_lock);
  }
  pthread_mutex_unlock(&r->q_lock);
}

void kvt_remote_test_hold(kvt_remote *r, int hold, int *busy, uint64_t *waited) {
  pthread_mutex_lock(&r->q_lock);
  if (hold >= 0) r->hold = hold;
  pthread_cond_broadcast(&r->q_cv);
  if (busy) *busy = r->busy;
  if (waited) *waited = r->removes_waited;
  pthread_mutex_unlock(&r->q_lock);
}

size_t kvt_remote_test_queued(kvt_remote *r) {
  size_t n = 0;
  pthread_mutex_lock(&r->q_lock);
  for (const wjob *j = r->head; j; j = j->next) n++;
  pthread_mutex_unlock(&r->q_lock);
  return n;
}

size_t kvt_remote_test_flight(kvt_remote *r, kvt_key *keys, size_t cap) {
  pthread_mutex_lock(&r->q_lock);
  size_t n = r->n_flight;
  for (size_t i = 0; i < n && i < cap; i++) keys[i] = r->flight[i]->key;
  pthread_mutex_unlock(&r->q_lock);
  return n;
}

void kvt_remote_drain(kvt_remote *r) {
  pthread_mutex_lock(&r->q_lock);
  while ((r->head || r->busy) && r->writer_on) pthread_cond_wait(&r->q_cv, &r->q_lock);
  pthread_mutex_unlock(&r->q_lock);
}

/* ---------- reading ---------- */

/* One command on the read client; its status. Caller frees with release. */
static kvt_rc_status rd_exec(kvt_remote *r, kvt_rc_cmd *c, size_t n) {
  if (kvt_rc_exec(r->rd, c, n)) return KVT_RC_EREPLY;
  return c[0].status;
}

size_t kvt_remote_prefix(kvt_remote *r, const kvt_key *keys, size_t n) {
  enum { PREFIX_BATCH = 64 };
  size_t found = 0;
  while (found < n) {
    size_t m = n - found < PREFIX_BATCH ? n - found : PREFIX_BATCH, lead = 0;
    kvt_rc_cmd cmd[PREFIX_BATCH];
    char k[PREFIX_BATCH][KVT_REMOTE_KEY_MAX];
    memset(cmd, 0, sizeof cmd);
    for (size_t i = 0; i < m; i++) {
      cmd[i].op = KVT_RC_EXISTS;
      cmd[i].key = k[i];
      cmd[i].key_len = kvt_remote_block_key(&keys[found + i], k[i]);
    }
    pthread_mutex_lock(&r->rd_lock);
    int rc = kvt_rc_exec(r->rd, cmd, m);
    pthread_mutex_unlock(&r->rd_lock);
    uint64_t timeouts = 0;
    for (size_t i = 0; !rc && i < m; i++) timeouts += cmd[i].status == KVT_RC_UNAVAILABLE;
    while (!rc && lead < m && cmd[lead].status == KVT_RC_OK && cmd[lead].n == 1)
      seen_mark(r, &keys[found + lead++]);
    if (timeouts) count(r, &r->n.timeouts, timeouts);
    found += lead;
    if (rc || lead < m) break;
  }
  return found;
}

static void cache_drop(kvt_remote *r, centry *c) {
  if (!c->val) return;
  kvt_mem_free(r->mem, KVT_MEM_OTHER, c->val, c->len);
  kvt_mem_free(r->mem, KVT_MEM_OTHER, c->sl, c->e.n_layers * sizeof *c->sl);
  r->cache_bytes -= c->len;
  c->val = NULL;
}

/* The cached value of key, rd_lock held; NULL if none. */
static centry *cache_find(kvt_remote *r, const kvt_key *key) {
  for (unsigned i = 0; i < CACHE_N; i++)
    if (r->cache[i].val && kvt_key_eq(&r->cache[i].key, key)) {
      r->cache[i].tick = ++r->tick;
      return &r->cache[i];
    }
  return NULL;
}

/* Keep a checked value (taking v) in the least recently used place, rd_lock held. */
static centry *cache_put(kvt_remote *r, const kvt_key *key, uint8_t *v, size_t len,
                         const kvt_cold_entry *e, const kvt_cold_slice *sl) {
  kvt_cold_slice *copy = kvt_mem_alloc(r->mem, KVT_MEM_OTHER, e->n_layers * sizeof *sl);
  if (!copy || len > CACHE_BYTES) {
    kvt_mem_free(r->mem, KVT_MEM_OTHER, copy, e->n_layers * sizeof *sl);
    return NULL;
  }
  memcpy(copy, sl, e->n_layers * sizeof *sl);
  centry *lru = &r->cache[0];
  for (unsigned i = 1; i < CACHE_N; i++)
    if (!r->cache[i].val || (lru->val && r->cache[i].tick < lru->tick)) lru = &r->cache[i];
  cache_drop(r, lru);
  for (unsigned i = 0; i < CACHE_N && r->cache_bytes + len > CACHE_BYTES; i++)
    cache_drop(r, &r->cache[i]);
  *lru = (centry){.key = *key, .val = v, .len = len, .tick = ++r->tick, .e = *e, .sl = copy};
  r->cache_bytes += len;
  return lru;
}

/* A value that failed its check: counted and deleted, so no reader pays
 * for it again and a writer may store the block anew. rd_lock held. */
static void bad_value(kvt_remote *r, const char *k, size_t klen) {
  kvt_rc_cmd del = {.op = KVT_RC_DEL, .key = k, .key_len = klen};
  rd_exec(r, &del, 1);
  kvt_rc_release(&del, 1);
  pthread_mutex_lock(&r->q_lock);
  r->n.checksum_failures++;
  r->n.deleted += del.status == KVT_RC_OK && del.n > 0;
  pthread_mutex_unlock(&r->q_lock);
}

/* GET key and check it, rd_lock held: 0 and a copy in *v, or KVT_ENOTFOUND. */
static int get_locked(kvt_remote *r, const kvt_key *key, uint8_t **v, size_t *len,
                      kvt_cold_entry *e, kvt_cold_slice *sl) {
  char k[KVT_REMOTE_KEY_MAX];
  kvt_rc_cmd c = {.op = KVT_RC_GET, .key = k, .key_len = kvt_remote_block_key(key, k)};
  kvt_rc_status st = rd_exec(r, &c, 1);
  int rc = KVT_ENOTFOUND;
  int bad = st == KVT_RC_OK && kvt_remote_check(key, c.out, c.out_len, e, sl) != 0;
  if (st == KVT_RC_OK && !bad) { /* a copy we cannot allocate is a miss, not a bad value */
    *v = kvt_mem_alloc(r->mem, KVT_MEM_OTHER, c.out_len);
    if (*v) {
      memcpy(*v, c.out, c.out_len);
      *len = c.out_len;
      rc = 0;
    }
  }
  size_t got = st == KVT_RC_OK ? c.out_len : 0;
  kvt_rc_recycle(r->rd, &c, 1);
  if (bad) {
    seen_take(r, key);
    bad_value(r, k, c.key_len);
  }
  if (rc == 0) seen_mark(r, key);
  int evicted = st == KVT_RC_NIL && seen_take(r, key);
  pthread_mutex_lock(&r->q_lock);
  r->n.evictions += evicted;
  r->n.hits += rc == 0;
  r->n.misses += rc != 0;
  r->n.timeouts += st == KVT_RC_UNAVAILABLE;
  r->n.bytes_in += got;
  pthread_mutex_unlock(&r->q_lock);
  return rc;
}

int kvt_remote_get(kvt_remote *r, const kvt_key *key, uint8_t **v, size_t *len) {
  kvt_cold_entry e;
  kvt_cold_slice *sl = kvt_mem_alloc(r->mem, KVT_MEM_OTHER, SL_BYTES);
  if (!sl) return KVT_ENOTFOUND;
  pthread_mutex_lock(&r->rd_lock);
  centry *c = cache_find(r, key);
  int rc = 0;
  if (c && (*v = kvt_mem_alloc(r->mem, KVT_MEM_OTHER, c->len))) {
    memcpy(*v, c->val, c->len);
    *len = c->len;
  } else rc = get_locked(r, key, v, len, &e, sl);
  pthread_mutex_unlock(&r->rd_lock);
  kvt_mem_free(r->mem, KVT_MEM_OTHER, sl, SL_BYTES);
  return rc;
}

int kvt_remote_read_layer(kvt_remote *r, const kvt_key *key, uint32_t layer, void *k_out,
                          void *v_out, size_t each) {
  kvt_cold_entry e;
  kvt_cold_slice *sl = kvt_mem_alloc(r->mem, KVT_MEM_OTHER, SL_BYTES);
  if (!sl) return KVT_ENOTFOUND;
  pthread_mutex_lock(&r->rd_lock);
  centry *c = cache_find(r, key);
  int rc = 0;
  if (!c) {
    uint8_t *v;
    size_t len;
    rc = get_locked(r, key, &v, &len, &e, sl);
    if (!rc && !(c = cache_put(r, key, v, len, &e, sl))) { /* too big to keep: read it once */
      rc = kvt_remote_decode(r->mem, v, &e, sl, layer, k_out, v_out, each);
      kvt_mem_free(r->mem, KVT_MEM_OTHER, v, len);
    }
  }
  if (c) /* a later layer of a block already fetched: one GET per block */ rc = kvt_remote_decode(r->mem, c->val, &c->e, c->sl, layer, k_out, v_out, each);
  pthread_mutex_unlock(&r->rd_lock);
  kvt_mem_free(r->mem, KVT_MEM_OTHER, sl, SL_BYTES);
  return rc ? KVT_ENOTFOUND : 0;
}

/* GETs of keys[0..n) (not in the cache) in one pipeline of at most
 * READ_BATCH, rd_lock held: each checked value goes to fn straight from
 * the reply (no copy); a bad one is deleted; hits and misses counted. */
static void get_batch_locked(kvt_remote *r, const kvt_key *keys, size_t n, kvt_remote_got_fn fn,
                             void *arg, kvt_cold_slice *sl) {
  kvt_rc_cmd cmd[READ_BATCH];
  char k[READ_BATCH][KVT_REMOTE_KEY_MAX];
  memset(cmd, 0, sizeof cmd);
  for (size_t i = 0; i < n; i++)
    cmd[i] = (kvt_rc_cmd){.op = KVT_RC_GET, .key = k[i], .key_len = kvt_remote_block_key(&keys[i], k[i])};
  int rc = kvt_rc_exec(r->rd, cmd, n);
  kvt_remote_counts d = {0};
  for (size_t i = 0; i < n; i++) {
    kvt_cold_entry e;
    int ok = !rc && cmd[i].status == KVT_RC_OK;
    int good = ok && kvt_remote_check(&keys[i], cmd[i].out, cmd[i].out_len, &e, sl) == 0;
    if (good) {
      fn(arg, &keys[i], cmd[i].out, cmd[i].out_len, &e, sl);
      seen_mark(r, &keys[i]);
    }
    if (ok && !good) {
      seen_take(r, &keys[i]);
      bad_value(r, k[i], cmd[i].key_len);
    }
    d.evictions += !rc && cmd[i].status == KVT_RC_NIL && seen_take(r, &keys[i]);
    d.hits += good, d.misses += !good, d.bytes_in += ok ? cmd[i].out_len : 0;
    d.timeouts += !rc && cmd[i].status == KVT_RC_UNAVAILABLE;
  }
  kvt_rc_recycle(r->rd, cmd, n);
  pthread_mutex_lock(&r->q_lock);
  r->n.hits += d.hits, r->n.misses += d.misses, r->n.bytes_in += d.bytes_in;
  r->n.timeouts += d.timeouts, r->n.evictions += d.evictions;
  pthread_mutex_unlock(&r->q_lock);
}

void kvt_remote_get_many(kvt_remote *r, const kvt_key *keys, size_t n, kvt_remote_got_fn fn,
                         void *arg) {
  kvt_cold_slice *sl = kvt_mem_alloc(r->mem, KVT_MEM_OTHER, SL_BYTES);
  kvt_key *miss = kvt_mem_alloc(r->mem, KVT_MEM_OTHER, READ_BATCH * sizeof *miss);
  if (!sl || !miss) {
    kvt_mem_free(r->mem, KVT_MEM_OTHER, sl, SL_BYTES);
    kvt_mem_free(r->mem, KVT_MEM_OTHER, miss, READ_BATCH * sizeof *miss);
    return; /* all misses */
  }
  pthread_mutex_lock(&r->rd_lock);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    centry *c = cache_find(r, &keys[i]);
    if (c) fn(arg, &keys[i], c->val, c->len, &c->e, c->sl);
    else miss[m++] = keys[i];
    if (m == READ_BATCH || (i + 1 == n && m)) {
      get_batch_locked(r, miss, m, fn, arg, sl);
      m = 0;
    }
  }
  pthread_mutex_unlock(&r->rd_lock);
  kvt_mem_free(r->mem, KVT_MEM_OTHER, sl, SL_BYTES);
  kvt_mem_free(r->mem, KVT_MEM_OTHER, miss, READ_BATCH * sizeof *miss);
}

int kvt_remote_remove(kvt_remote *r, const kvt_key *key) {
  if (r->rdonly) return KVT_ERDONLY;
  char k[KVT_REMOTE_KEY_MAX];
  kvt_rc_cmd c = {.op = KVT_RC_DEL, .key = k, .key_len = kvt_remote_block_key(key, k)};
  queue_cancel(r, key, 1);
  pthread_mutex_lock(&r->rd_lock);
  centry *ce = cache_find(r, key);
  if (ce) cache_drop(r, ce);
  seen_take(r, key); /* gone by our hand: a later miss is no eviction */
  kvt_rc_status st = rd_exec(r, &c, 1);
  pthread_mutex_unlock(&r->rd_lock);
  return st == KVT_RC_OK && c.n > 0 ? 0 : KVT_ENOTFOUND;
}

uint64_t kvt_remote_remove_many(kvt_remote *r, const kvt_key *keys, size_t n) {
  enum { DEL_BATCH = 64 };
  if (r->rdonly) return 0;
  uint64_t gone = 0;
  for (size_t i0 = 0; i0 < n; i0 += DEL_BATCH) {
    size_t m = n - i0 < DEL_BATCH ? n - i0 : DEL_BATCH;
    kvt_rc_cmd cmd[DEL_BATCH];
    char k[DEL_BATCH][KVT_REMOTE_KEY_MAX];
    memset(cmd, 0, sizeof cmd);
    queue_cancel(r, keys + i0, m);
    pthread_mutex_lock(&r->rd_lock);
    for (size_t i = 0; i < m; i++) {
      cmd[i] = (kvt_rc_cmd){.op = KVT_RC_DEL, .key = k[i],
                            .key_len = kvt_remote_block_key(&keys[i0 + i], k[i])};
      centry *ce = cache_find(r, &keys[i0 + i]);
      if (ce) cache_drop(r, ce);
      seen_take(r, &keys[i0 + i]);
    }
    int rc = kvt_rc_exec(r->rd, cmd, m);
    pthread_mutex_unlock(&r->rd_lock);
    for (size_t i = 0; !rc && i < m; i++) gone += cmd[i].status == KVT_RC_OK && cmd[i].n > 0;
    kvt_rc_release(cmd, m);
  }
  return gone;
}

/* ---------- namespaces ---------- */

/* The directory is entries 0, 1, ... with no gap (each written once with
 * SET NX): seed (16 bytes) then the namespace's encoding. Read in batches
 * of NS_BATCH until the first absent entry; fn(arg, i, value, len) for
 * each present one (stops at non-zero). Returns fn's, or 0; *end the
 * first absent index (KVT_REMOTE_NS_MAX if none); -ETIMEDOUT when the
 * cluster did not answer. rd_lock held. */
#define NS_BATCH 32u
static int ns_walk(kvt_remote *r, int (*fn)(void *, uint32_t, const uint8_t *, size_t), void *arg,
                   uint32_t *end) {
  kvt_rc_cmd cmd[NS_BATCH];
  char k[NS_BATCH][KVT_REMOTE_KEY_MAX];
  memset(cmd, 0, sizeof cmd);
  int rc = 0;
  uint32_t i0 = 0;
  for (; i0 < KVT_REMOTE_NS_MAX && !rc; i0 += NS_BATCH) {
    for (uint32_t j = 0; j < NS_BATCH; j++)
      cmd[j] = (kvt_rc_cmd){.op = KVT_RC_GET, .key = k[j], .key_len = kvt_remote_ns_key(i0 + j, k[j]),
                            .reply_ = cmd[j].reply_, .out = cmd[j].out};
    if (kvt_rc_exec(r->rd, cmd, NS_BATCH)) rc = -EIO;
    uint32_t j = 0;
    for (; !rc && j < NS_BATCH && cmd[j].status == KVT_RC_OK; j++)
      rc = cmd[j].out_len > 16 ? fn(arg, i0 + j, cmd[j].out, cmd[j].out_len) : 0;
    if (!rc && j < NS_BATCH) {
      rc = cmd[j].status == KVT_RC_NIL ? 0 : -ETIMEDOUT;
      *end = i0 + j;
      kvt_rc_release(cmd, NS_BATCH);
      return rc;
    }
  }
  kvt_rc_release(cmd, NS_BATCH);
  *end = KVT_REMOTE_NS_MAX;
  return rc;
}

typedef struct ns_find_arg {
  const uint8_t *val;
  size_t len;
} ns_find_arg;

static int ns_same(void *arg, uint32_t i, const uint8_t *v, size_t len) {
  const ns_find_arg *a = arg;
  (void)i;
  return len == a->len && !memcmp(v, a->val, len);
}

int kvt_remote_ns_put(kvt_remote *r, const kvt_key *seed, const uint8_t *enc, size_t len) {
  if (r->rdonly) return 0;
  uint8_t val[16 + KVT_NS_ENCODE_MAX];
  if (len > KVT_NS_ENCODE_MAX) return KVT_EOPTION;
  memcpy(val, seed->b, 16);
  memcpy(val + 16, enc, len);
  ns_find_arg a = {val, 16 + len};
  pthread_mutex_lock(&r->rd_lock);
  /* Two writers racing for one entry: SET NX lets one win, the other
   * walks on and writes the next (or finds its twin). Bounded by the
   * directory's size. */
  for (int tries = 0; tries < 4; tries++) {
    uint32_t end;
    int rc = ns_walk(r, ns_same, &a, &end);
    if (rc || end >= KVT_REMOTE_NS_MAX) break; /* there (1), unreachable or full: no error */
    char k[KVT_REMOTE_KEY_MAX];
    kvt_rc_cmd c = {.op = KVT_RC_SET_NX, .key = k, .key_len = kvt_remote_ns_key(end, k),
                    .val = val, .val_len = a.len};
    kvt_rc_status st = rd_exec(r, &c, 1);
    if (st != KVT_RC_NIL) break;
  }
  pthread_mutex_unlock(&r->rd_lock);
  return 0; /* the cluster down: the namespace works locally, its blocks are misses */
}

typedef struct ns_each_arg {
  int (*fn)(void *, const kvt_key *, const uint8_t *, size_t);
  void *arg;
} ns_each_arg;

static int ns_call(void *arg, uint32_t i, const uint8_t *v, size_t len) {
  const ns_each_arg *a = arg;
  kvt_key seed;
  (void)i;
  memcpy(seed.b, v, 16);
  return a->fn(a->arg, &seed, v + 16, len - 16);
}

int kvt_remote_ns_each(kvt_remote *r, int (*fn)(void *, const kvt_key *, const uint8_t *, size_t),
                       void *arg) {
  ns_each_arg a = {fn, arg};
  uint32_t end;
  pthread_mutex_lock(&r->rd_lock);
  int rc = ns_walk(r, ns_call, &a, &end);
  pthread_mutex_unlock(&r->rd_lock);
  return rc == -ETIMEDOUT || rc == -EIO ? 0 : rc; /* unreachable: what is local still opens */
}

/* ---------- life ---------- */

static int client_open(const kvt_remote_cfg *cfg, uint32_t min_deadline_ms, kvt_rc **out,
                       char *err, size_t err_len) {
  kvt_rc_config c = {.url = cfg->url, .password = cfg->password, .deadline_ms = cfg->deadline_ms};
  if (min_deadline_ms && (c.deadline_ms ? c.deadline_ms : 1000u) < min_deadline_ms)
    c.deadline_ms = min_deadline_ms;
  /* A node silent for half the deadline is failed (the client's default
   * ratio, 500 of 1000 ms): a longer deadline tolerates a slower node. */
  c.command_timeout_ms = c.deadline_ms / 2;
  return kvt_rc_open(&c, out, err, err_len);
}

int kvt_remote_open(kvt_mem *m, const kvt_remote_cfg *cfg, kvt_remote **out, char *err,
                    size_t err_len) {
  *out = NULL;
  kvt_remote *r = kvt_mem_calloc(m, KVT_MEM_OTHER, sizeof *r);
  if (!r) return -ENOMEM;
  r->mem = m;
  r->rdonly = cfg->rdonly;
  r->q_limit = cfg->queue_bytes ? cfg->queue_bytes : QUEUE_BYTES_DEFAULT;
  r->seen = kvt_mem_calloc(m, KVT_MEM_OTHER, SEEN_N * sizeof *r->seen);
  if (!r->seen) {
    kvt_mem_free(m, KVT_MEM_OTHER, r, sizeof *r);
    return -ENOMEM;
  }
  pthread_mutex_init(&r->rd_lock, NULL);
  pthread_mutex_init(&r->q_lock, NULL);
  pthread_cond_init(&r->q_cv, NULL);
  int rc = client_open(cfg, 0, &r->rd, err, err_len);
  if (!rc && !r->rdonly) rc = client_open(cfg, WRITE_DEADLINE_MS, &r->wr, err, err_len);
  if (!rc && !r->rdonly) {
    rc = -pthread_create(&r->writer, NULL, writer_main, r);
    r->writer_on = rc == 0;
  }
  if (rc) {
    kvt_remote_close(r);
    return rc;
  }
  *out = r;
  return 0;
}

void kvt_remote_close(kvt_remote *r) {
  if (!r) return;
  if (r->writer_on) {
    pthread_mutex_lock(&r->q_lock);
    r->stop = 1; /* the writer sends what is queued first, each batch within the deadline */
    pthread_cond_broadcast(&r->q_cv);
    pthread_mutex_unlock(&r->q_lock);
    pthread_join(r->writer, NULL);
  }
  for (unsigned i = 0; i < CACHE_N; i++) cache_drop(r, &r->cache[i]);
  kvt_rc_close(r->rd);
  kvt_rc_close(r->wr);
  pthread_mutex_destroy(&r->rd_lock);
  pthread_mutex_destroy(&r->q_lock);
  pthread_cond_destroy(&r->q_cv);
  kvt_mem_free(r->mem, KVT_MEM_OTHER, r->seen, SEEN_N * sizeof *r->seen);
  kvt_mem_free(r->mem, KVT_MEM_OTHER, r, sizeof *r);
}

void kvt_remote_counts_get(kvt_remote *r, kvt_remote_counts *c, kvt_rc_stats *rc) {
  pthread_mutex_lock(&r->q_lock);
  *c = r->n;
  pthread_mutex_unlock(&r->q_lock);
  if (rc) {
    pthread_mutex_lock(&r->rd_lock);
    kvt_rc_stats_get(r->rd, rc);
    pthread_mutex_unlock(&r->rd_lock);
  }
}
