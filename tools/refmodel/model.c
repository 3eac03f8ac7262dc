/* model.c - loading llama2.c checkpoints and tokenizers. A checkpoint is
 * 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
 * seq_len; vocab_size negative when the classifier is stored apart), then
 * f32 weights in a fixed order. Its size follows from the header, so a
 * file of any other size is refused rather than half read. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refmodel.h"

static int fail(char *err, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && len) vsnprintf(err, len, fmt, ap);
  va_end(ap);
  return -1;
}

static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* Header fields in range and consistent with each other. */
static int config_check(const rm_config *c, char *err, size_t len) {
  if (c->dim <= 0 || c->hidden_dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 ||
      c->n_kv_heads <= 0 || c->vocab_size <= 0 || c->seq_len <= 0)
    return fail(err, len, "a header field is zero or negative");
  if (c->dim > 65536 || c->hidden_dim > 262144 || c->n_layers > 1024 || c->vocab_size > 1 << 20 ||
      c->seq_len > 1 << 20)
    return fail(err, len, "header fields too large (dim %d, layers %d, vocab %d, seq_len %d)",
                c->dim, c->n_layers, c->vocab_size, c->seq_len);
  if (c->dim % c->n_heads || c->n_heads % c->n_kv_heads)
    return fail(err, len, "inconsistent header: dim %d, %d heads, %d kv heads", c->dim,
                c->n_heads, c->n_kv_heads);
  if ((c->dim / c->n_heads) % 2 || (uint32_t)(c->dim / c->n_heads) > KVT_MAX_HEAD_DIM)
    return fail(err, len, "head size %d: must be even and at most %u", c->dim / c->n_heads,
                KVT_MAX_HEAD_DIM);
  return 0;
}

/* Floats the weights take after the header. */
static size_t weights_floats(const rm_config *c) {
  size_t d = (size_t)c->dim, h = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
  size_t hs = d / (size_t)c->n_heads, kv = hs * (size_t)c->n_kv_heads, V = (size_t)c->vocab_size;
  size_t n = V * d + L * d * 2 + L * d * d * 2 + L * d * kv * 2 + L * h * d * 3 + d;
  n += (size_t)c->seq_len * hs; /* freq_cis_real and _imag (unused: RoPE is computed) */
  return n + (c->shared_cls ? 0 : V * d);
}

static void map_weights(rm_model *m) {
  const rm_config *c = &m->c;
  size_t d = (size_t)c->dim, h = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
  const float *p = m->data;
  m->tok_emb = p, p += (size_t)c->vocab_size * d;
  m->rms_att = p, p += L * d;
  m->wq = p, p += L * d * d;
  m->wk = p, p += L * d * m->kv_dim;
  m->wv = p, p += L * d * m->kv_dim;
  m->wo = p, p += L * d * d;
  m->rms_ffn = p, p += L * d;
  m->w1 = p, p += L * h * d;
  m->w2 = p, p += L * d * h;
  m->w3 = p, p += L * h * d;
  m->rms_final = p, p += d;
  p += (size_t)c->seq_len * m->head_dim; /* freq_cis_real, freq_cis_imag */
  m->wcls = c->shared_cls ? m->tok_emb : p;
}

int rm_model_load(const char *path, rm_model *m, char *err, size_t err_len) {
  memset(m, 0, sizeof *m);
  FILE *f = fopen(path, "rb");
  if (!f) return fail(err, err_len, "%s: %s", path, strerror(errno));
  int32_t hdr[7];
  long size = -1;
  if (fread(hdr, sizeof hdr, 1, f) != 1) {
    fclose(f);
    return fail(err, err_len, "%s: truncated: shorter than the 28-byte header", path);
  }
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  m->c = (rm_config){hdr[0], hdr[1], hdr[2], hdr[3], hdr[4], hdr[5] < 0 ? -hdr[5] : hdr[5], hdr[6],
                     hdr[5] > 0};
  char why[160];
  if (config_check(&m->c, why, sizeof why)) {
    fclose(f);
    return fail(err, err_len, "%s: not a llama2.c checkpoint: %s", path, why);
  }
  size_t nf = weights_floats(&m->c), want = sizeof hdr + nf * sizeof(float);
  if (size < 0 || (size_t)size != want) {
    fclose(f);
    return fail(err, err_len, "%s: %s: %ld bytes, the header says %zu", path,
                size >= 0 && (size_t)size < want ? "truncated" : "inconsistent size", size, want);
  }
  m->data = malloc(nf * sizeof(float));
  if (!m->data || fseek(f, sizeof hdr, SEEK_SET) || fread(m->data, sizeof(float), nf, f) != nf) {
    fclose(f);
    rm_model_free(m);
    return fail(err, err_len, "%s: cannot read the weights", path);
  }
  fclose(f);
  m->data_floats = nf;
  m->head_dim = (uint32_t)(m->c.dim / m->c.n_heads);
  m->kv_dim = m->head_dim * (uint32_t)m->c.n_kv_heads;
  map_weights(m);
  m->fingerprint = fnv1a(fnv1a(0xcbf29ce484222325ull, (const uint8_t *)hdr, sizeof hdr),
                         (const uint8_t *)m->data, nf * sizeof(float));
  const char *base = strrchr(path, '/');
  snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
  return 0;
}

void rm_model_free(rm_model *m) {
  if (!m) return;
  free(m->data);
  memset(m, 0, sizeof *m);
}

/* ---- tokenizer ----------------------------------------------------------- */

/* For bsearch and qsort over ids: the pieces are reached through a
 * pointer stored next to the id being compared. */
typedef struct piece_ref {
  const char *s;
  uint32_t id;
} piece_ref;

static int piece_cmp(const void *a, const void *b) {
  return strcmp(((const piece_ref *)a)->s, ((const piece_ref *)b)->s);
}

void rm_tok_free(rm_tokenizer *t) {
  if (!t) return;
  for (uint32_t i = 0; t->vocab && i < t->vocab_size; i++) free(t->vocab[i]);
  free(t->vocab);
  free(t->scores);
  free(t->sorted);
  memset(t, 0, sizeof *t);
}

int rm_tok_load(const char *path, uint32_t vocab_size, rm_tokenizer *t, char *err, size_t err_len) {
  memset(t, 0, sizeof *t);
  FILE *f = fopen(path, "rb");
  if (!f) return fail(err, err_len, "%s: %s", path, strerror(errno));
  t->vocab_size = vocab_size;
  t->vocab = calloc(vocab_size, sizeof *t->vocab);
  t->scores = calloc(vocab_size, sizeof *t->scores);
  piece_ref *refs = calloc(vocab_size, sizeof *refs);
  int32_t max_len = 0, rc = 0;
  if (!t->vocab || !t->scores || !refs) rc = fail(err, err_len, "out of memory");
  else if (fread(&max_len, 4, 1, f) != 1 || max_len <= 0 || max_len > 4096)
    rc = fail(err, err_len, "%s: not a llama2.c tokenizer (bad header)", path);
  for (uint32_t i = 0; !rc && i < vocab_size; i++) {
    int32_t len = 0;
    if (fread(&t->scores[i], 4, 1, f) != 1 || fread(&len, 4, 1, f) != 1)
      rc = fail(err, err_len, "%s: truncated at token %u of %u", path, i, vocab_size);
    else if (len < 0 || len > max_len)
      rc = fail(err, err_len, "%s: token %u has length %d (max %d)", path, i, len, max_len);
    else if (!(t->vocab[i] = malloc((size_t)len + 1)))
      rc = fail(err, err_len, "out of memory");
    else if (fread(t->vocab[i], 1, (size_t)len, f) != (size_t)len)
      rc = fail(err, err_len, "%s: truncated at token %u of %u", path, i, vocab_size);
    else {
      t->vocab[i][len] = 0, refs[i] = (piece_ref){t->vocab[i], i};
      if ((uint32_t)len > t->longest) t->longest = (uint32_t)len;
    }
  }
  fclose(f);
  if (!rc && !(t->sorted = malloc(vocab_size * sizeof *t->sorted))) rc = fail(err, err_len, "out of memory");
  if (rc) {
    free(refs);
    rm_tok_free(t);
    return rc;
  }
  qsort(refs, vocab_size, sizeof *refs, piece_cmp);
  for (uint32_t i = 0; i < vocab_size; i++) t->sorted[i] = refs[i].id;
  free(refs);
  t->max_len = (uint32_t)max_len;
  for (int i = 0; i < 256; i++) t->bytes[i * 2] = (char)i, t->bytes[i * 2 + 1] = 0;
  return 0;
}

static int str_lookup(const rm_tokenizer *t, const char *s) {
  size_t lo = 0, hi = t->vocab_size;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(s, t->vocab[t->sorted[mid]]);
    if (c == 0) return (int)t->sorted[mid];
    if (c < 0) hi = mid;
    else lo = mid + 1;
  }
  return -1;
}

/* BPE by score (llama2.c's encode): repeatedly merge the adjacent pair
 * whose concatenation is the best scored piece, the leftmost of equals,
 * until no pair is a piece. Done in O(n log n): the symbols form a linked
 * list and every adjacent pair that is a piece waits in a max-heap
 * (score, then leftmost); a merge pushes the two new pairs it makes, and
 * an entry whose pair has changed since it was pushed is skipped when
 * popped. Symbol indices are never reused and a symbol's next only moves
 * right, so "i is alive, next[i] is still j and j still holds id_j" says
 * the pair is unchanged. */
typedef struct bpe_cand {
  float score;
  uint32_t i, j, id_j, merged; /* left and right symbol, right's id, the merged piece */
} bpe_cand;

typedef struct bpe_state {
  const rm_tokenizer *t;
  uint32_t *tok, *next, *prev; /* prev/next: UINT32_MAX at the ends */
  bpe_cand *heap;
  size_t n_heap, cap_heap;
  char *buf;                   /* two pieces and a NUL */
} bpe_state;

#define BPE_NONE UINT32_MAX
#define BPE_MIN_SCORE -1e10f /* a piece scored at most this is never merged (llama2.c) */

/* a before b in the heap: higher score, then further left */
static int cand_before(const bpe_cand *a, const bpe_cand *b) {
  return a->score > b->score || (a->score == b->score && a->i < b->i);
}

/* Push the pair (i, j) if its concatenation is a piece worth merging. */
static int bpe_push(bpe_state *b, uint32_t i, uint32_t j) {
  if (i == BPE_NONE || j == BPE_NONE) return 0;
  const rm_tokenizer *t = b->t;
  snprintf(b->buf, 2 * (size_t)t->max_len + 3, "%s%s", t->vocab[b->tok[i]], t->vocab[b->tok[j]]);
  int id = str_lookup(t, b->buf);
  if (id < 0 || !(t->scores[id] > BPE_MIN_SCORE)) return 0;
  if (b->n_heap == b->cap_heap) {
    size_t cap = b->cap_heap ? 2 * b->cap_heap : 64;
    bpe_cand *h = realloc(b->heap, cap * sizeof *h);
    if (!h) return -1;
    b->heap = h, b->cap_heap = cap;
  }
  bpe_cand c = {t->scores[id], i, j, b->tok[j], (uint32_t)id};
  size_t k = b->n_heap++;
  while (k > 0 && cand_before(&c, &b->heap[(k - 1) / 2])) {
    b->heap[k] = b->heap[(k - 1) / 2];
    k = (k - 1) / 2;
  }
  b->heap[k] = c;
  return 0;
}

static bpe_cand bpe_pop(bpe_state *b) {
  bpe_cand top = b->heap[0], last = b->heap[--b->n_heap];
  size_t k = 0, n = b->n_heap;
  for (;;) {
    size_t c = 2 * k + 1;
    if (c >= n) break;
    if (c + 1 < n && cand_before(&b->heap[c + 1], &b->heap[c])) c++;
    if (!cand_before(&b->heap[c], &last)) break;
    b->heap[k] = b->heap[c];
    k = c;
  }
  if (n) b->heap[k] = last;
  return top;
}

/* Merge tok[0..*n) in place; 0, or -1 out of memory. */
static int bpe_merge(const rm_tokenizer *t, uint32_t *tok, size_t *n, char *buf) {
  size_t len = *n;
  if (len < 2) return 0;
  bpe_state b = {t, tok, malloc(len * sizeof(uint32_t)), malloc(len * sizeof(uint32_t)), NULL,
                 0, 0, buf};
  int rc = b.next && b.prev ? 0 : -1;
  for (size_t i = 0; !rc && i < len; i++) {
    b.prev[i] = i ? (uint32_t)i - 1 : BPE_NONE;
    b.next[i] = i + 1 < len ? (uint32_t)i + 1 : BPE_NONE;
  }
  for (size_t i = 0; !rc && i + 1 < len; i++) rc = bpe_push(&b, (uint32_t)i, (uint32_t)i + 1);
  while (!rc && b.n_heap) {
    bpe_cand c = bpe_pop(&b);
    if (b.prev[c.i] == c.i || b.next[c.i] != c.j || tok[c.j] != c.id_j) continue; /* stale */
    tok[c.i] = c.merged;
    uint32_t k = b.next[c.j];
    b.next[c.i] = k;
    if (k != BPE_NONE) b.prev[k] = c.i;
    b.prev[c.j] = c.j; /* dead: its own prev */
    rc = bpe_push(&b, b.prev[c.i], c.i);
    if (!rc) rc = bpe_push(&b, c.i, k);
  }
  size_t m = 0; /* the list, left to right, is the survivors in index order */
  for (size_t i = 0; !rc && i < len; i++)
    if (b.prev[i] != (uint32_t)i) tok[m++] = tok[i];
  if (!rc) *n = m;
  free(b.next);
  free(b.prev);
  free(b.heap);
  return rc;
}

size_t rm_tok_min_ids(const rm_tokenizer *t, size_t bytes) {
  size_t longest = t->longest ? t->longest : 1;
  return (bytes + longest - 1) / longest;
}

int rm_tok_encode(const rm_tokenizer *t, const char *text, int bos, uint32_t *out, size_t max,
                  size_t *n) {
  size_t len = strlen(text), k = 0;
  if (max < len + 3) return -1; /* at most one id per byte, plus BOS and the space */
  char *buf = malloc(2 * (size_t)t->max_len + 3);
  if (!buf) return -1;
  if (bos) out[k++] = RM_BOS;
  if (text[0]) {
    int sp = str_lookup(t, " ");
    if (sp >= 0) out[k++] = (uint32_t)sp;
  }
  char cp[8];
  size_t cl = 0;
  for (const char *c = text; *c; c++) {
    if ((*c & 0xC0) != 0x80) cl = 0; /* not a continuation byte: a new code point */
    cp[cl++] = *c;
    cp[cl] = 0;
    if ((c[1] & 0xC0) == 0x80 && cl < 4) continue;
    int id = str_lookup(t, cp);
    if (id >= 0) out[k++] = (uint32_t)id;
    else
      for (size_t i = 0; i < cl; i++) {
        uint32_t b = (uint8_t)cp[i] + 3u; /* byte fallback: <0x00> is id 3 */
        if (b >= t->vocab_size) { /* a vocabulary without byte pieces */
          free(buf);
          *n = (size_t)(c - text) + 1 - cl + i;
          return -2;
        }
        out[k++] = b;
      }
    cl = 0;
  }
  size_t m = bos ? k - 1 : k;
  int rc = bpe_merge(t, bos ? out + 1 : out, &m, buf);
  free(buf);
  if (rc) return -1;
  *n = bos ? m + 1 : m;
  return 0;
}

const char *rm_tok_piece(const rm_tokenizer *t, uint32_t prev, uint32_t tok) {
  if (tok >= t->vocab_size) return "";
  const char *p = t->vocab[tok];
  if (prev == RM_BOS && p[0] == ' ') p++;
  unsigned byte;
  if (sscanf(p, "<0x%02X>", &byte) == 1 && strlen(p) == 6) return &t->bytes[byte * 2];
  return p;
}
