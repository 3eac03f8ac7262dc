/* bench_binding_c.c - the C half of python/bench_binding.py: rounds of
 * puts and gathers of 2 MiB token blocks (Llama-3-8B shape: 32 layers, 8
 * KV heads, head_dim 128, f16, 16 tokens) through the shared library, the
 * same calls in the same order as the Python half makes through the
 * binding; each token block is gathered into one 2 MiB caller buffer.
 * Built as a shared library: the script calls kvt_bench_binding_round()
 * through ctypes, so both halves run in one process, on one heap, with
 * their rounds interleaved. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvtier.h"

#define L 32u
#define H 8u
#define D 128u
#define BT 16u
#define EACH (BT * H * D) /* f16 values in one layer block's K */
#define MAX_BLOCKS 1024u
#define MAX_PASSES 1024u

/* One round in a fresh engine at dir with hot limit hot_bytes: `warmup`
 * untimed passes, then P timed ones of B token blocks; per token block
 * (ns), the median and the least pass go to put_ns[0..1] and
 * gather_ns[0..1]. 0, -EINVAL (a count out of range), -ENOMEM, -EIO
 * (gathered bytes differ from those put) or a kvt code. */
int kvt_bench_binding_round(const char *dir, unsigned B, unsigned warmup, unsigned P,
                            uint64_t hot_bytes, double *put_ns, double *gather_ns);

/* CPU time of the calling thread: the machine may be shared, and time
 * spent descheduled is neither side's cost. */
static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, unsigned n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One pass: B new token blocks (tokens from *next_tok on) appended and
 * put in B sequences, then gathered layer by layer, each block into kb
 * and vb (all its layers); the sequences are released at the end. */
static int pass(kvt_engine *e, kvt_ns_id ns, unsigned B, uint32_t *next_tok, const uint16_t *k,
                const uint16_t *v, uint16_t *kb, uint16_t *vb, double *put_ns, double *gather_ns) {
  kvt_seq *s[MAX_BLOCKS] = {0};
  uint32_t tok[BT];
  int rc = 0;
  for (unsigned b = 0; b < B && !rc; b++) rc = kvt_seq_create(e, ns, &s[b]);
  double t0 = now_ns();
  for (unsigned b = 0; b < B && !rc; b++) {
    for (unsigned i = 0; i < BT; i++) tok[i] = (*next_tok)++;
    kvt_append_info info;
    rc = kvt_seq_append(s[b], tok, BT, &info);
    for (unsigned l = 0; l < L && !rc; l++) {
      kvt_kv kv = {.k = k + (size_t)l * EACH, .v = v + (size_t)l * EACH, .dtype = KVT_F16,
                   .n_tokens = BT, .n_heads = H, .head_dim = D};
      rc = kvt_seq_put(s[b], info.block, l, &kv);
    }
  }
  double t1 = now_ns();
  for (unsigned b = 0; b < B && !rc; b++)
    for (unsigned l = 0; l < L && !rc; l++) {
      size_t each = EACH * 2, n = 0;
      rc = kvt_seq_gather(s[b], l, kb + (size_t)l * EACH, vb + (size_t)l * EACH, &each, NULL, 0,
                          &n);
    }
  double t2 = now_ns();
  /* untimed: the last token block gathered is the KV put */
  if (!rc && (memcmp(kb, k, L * EACH * 2) || memcmp(vb, v, L * EACH * 2))) rc = -EIO;
  for (unsigned b = 0; b < B; b++) kvt_seq_release(s[b]);
  *put_ns = (t1 - t0) / B;
  *gather_ns = (t2 - t1) / B;
  return rc;
}

int kvt_bench_binding_round(const char *dir, unsigned B, unsigned warmup, unsigned P,
                            uint64_t hot_bytes, double *put_ns, double *gather_ns) {
  if (B < 1 || B > MAX_BLOCKS || P < 1 || P > MAX_PASSES || warmup > MAX_PASSES)
    return -EINVAL;
  uint16_t *k = malloc(L * EACH * 2), *v = malloc(L * EACH * 2), *kb = malloc(L * EACH * 2),
           *vb = malloc(L * EACH * 2);
  double *put = calloc(P, sizeof *put), *gat = calloc(P, sizeof *gat), pu, ga;
  int rc = k && v && kb && vb && put && gat ? 0 : -ENOMEM;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; !rc && i < L * EACH; i++) { /* finite f16: exponent 1..29 */
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    k[i] = (uint16_t)((x & 0x83ff) | (((x >> 16) % 29 + 1) << 10));
    v[i] = (uint16_t)(((x >> 20) & 0x83ff) | (((x >> 40) % 29 + 1) << 10));
  }
  kvt_options o;
  kvt_options_init(&o);
  o.tier_bytes_limit[KVT_TIER_HOT] = hot_bytes;
  kvt_engine *e = NULL;
  kvt_ns_id ns;
  kvt_ns_desc d = {.model_id = "bench-binding", .weights_fingerprint = "0", .tp_size = 1,
                   .shape = {L, H, D, KVT_F16, BT}};
  if (!rc) rc = kvt_engine_open(dir, &o, &e);
  if (!rc) rc = kvt_ns_register(e, &d, &ns);
  uint32_t next = 0;
  for (unsigned p = 0; p < warmup && !rc; p++) rc = pass(e, ns, B, &next, k, v, kb, vb, &pu, &ga);
  for (unsigned p = 0; p < P && !rc; p++) rc = pass(e, ns, B, &next, k, v, kb, vb, &put[p], &gat[p]);
  if (!rc) {
    put_ns[0] = median(put, P), put_ns[1] = put[0]; /* median() sorted them */
    gather_ns[0] = median(gat, P), gather_ns[1] = gat[0];
  }
  kvt_engine_close(e);
  free(k), free(v), free(kb), free(vb), free(put), free(gat);
  return rc;
}
