/* refmodel.h - a reference decoder for llama2.c checkpoints (Karpathy's
 * run.c format) whose KV cache is kvtier, through the public API only.
 * Forward pass in f32: RMSNorm, RoPE on interleaved pairs, grouped-query
 * attention, SwiGLU. Used by `kvtier eval`, `kvtier warm` and `kvtier
 * bench refmodel`; see docs/refmodel.md.
 *
 * Attention is split where the engine splits it: over the full token
 * blocks (kvt_seq_attend(), or the same arithmetic over a plain array
 * cache) and over the tail block that is not full yet (held here), the
 * two merged through their log-sum-exps. So with no budget the two caches
 * give the same logits bit for bit (tests/test_refmodel.c). */
#ifndef KVT_REFMODEL_H
#define KVT_REFMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#define RM_BOS 1u /* llama2.c: begins every story */
#define RM_EOS 2u

/* The 7 int32 of a llama2.c header. A negative vocab_size in the file
 * means the classifier is stored separately (shared_cls 0). */
typedef struct rm_config {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
  int32_t shared_cls;
} rm_config;

typedef struct rm_model {
  rm_config c;
  uint32_t head_dim, kv_dim;
  float *data;        /* every weight, read from the file (owned) */
  size_t data_floats;
  const float *tok_emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *wcls;
  uint64_t fingerprint; /* FNV-1a 64 of the whole file */
  char name[64];        /* file name without directory */
} rm_model;

/* Load a checkpoint. On failure returns -1 with a sentence in err (a
 * missing file, a truncated or inconsistent one, too large a model). */
int rm_model_load(const char *path, rm_model *m, char *err, size_t err_len);
void rm_model_free(rm_model *m);

/* ---- tokenizer (llama2.c tokenizer.bin) ------------------------------ */

typedef struct rm_tokenizer {
  char **vocab;        /* [vocab_size] NUL-terminated pieces */
  float *scores;       /* [vocab_size] merge scores */
  uint32_t *sorted;    /* ids sorted by piece, for lookups */
  uint32_t vocab_size, max_len;
  uint32_t longest;    /* bytes of the longest piece */
  char bytes[512];     /* "x\0" for every byte: decoded <0xXX> pieces */
} rm_tokenizer;

int rm_tok_load(const char *path, uint32_t vocab_size, rm_tokenizer *t, char *err, size_t err_len);
void rm_tok_free(rm_tokenizer *t);
/* Encode text (BPE by score in O(n log n), a leading space as in llama2.c,
 * byte fallback: byte b is id b + 3), with BOS first when bos. 0; -1 when
 * out (max ids) is too small or memory runs out; -2 when a byte has no
 * piece and b + 3 is not below vocab_size (a vocabulary without byte
 * pieces): *n then receives that byte's offset in text. */
int rm_tok_encode(const rm_tokenizer *t, const char *text, int bos, uint32_t *out, size_t max,
                  size_t *n);
/* The fewest ids (BOS not counted) that any text of this many bytes can
 * encode to: no piece is longer than t->longest. Lets a caller refuse a
 * text too long for a context before paying for its encoding. */
size_t rm_tok_min_ids(const rm_tokenizer *t, size_t bytes);
/* The text of token tok following prev (a space after BOS is dropped;
 * <0xXX> pieces are that byte). Never NULL; static or owned by t. */
const char *rm_tok_piece(const rm_tokenizer *t, uint32_t prev, uint32_t tok);

/* ---- decoder ------------------------------------------------------------ */

/* Register m's namespace (model id "llama2c/<file>", fingerprint of the
 * file, RoPE base 10000, f32, block_tokens) in e. kvt_ns_register()'s codes. */
int rm_ns_register(kvt_engine *e, const rm_model *m, uint32_t block_tokens, kvt_ns_id *ns);

/* Called after each layer's attention over the engine's blocks, before
 * kvt_seq_observe() (so the retained list is still the attended one):
 * mass[i] of the i-th retained block, summed over query heads. */
typedef void (*rm_mass_fn)(void *arg, uint32_t layer, uint32_t pos, kvt_seq *s,
                           const float *mass, size_t n);

typedef struct rm_dec {
  const rm_model *m;
  uint32_t bt, pos;         /* block tokens; tokens decoded so far */
  float scale;              /* 1 / sqrt(head_dim) */
  float *x, *xb, *xb2, *hb, *hb2, *q, *logits;
  float *att_b, *lse_b;     /* blocks part: [n_heads][head_dim], [n_heads] */
  float *k_tail, *v_tail;   /* [n_layers][bt][kv_dim]: the block being filled */
  uint32_t *tokens;         /* [seq_len]: every token decoded */
  /* plain cache (e == NULL): [n_layers][seq_len][kv_dim] */
  float *k_all, *v_all;
  /* kvtier cache */
  kvt_engine *e;
  kvt_ns_id ns;
  kvt_seq *s;
  float *mass;              /* [seq_len / bt + 1] */
  float *key_norm;          /* [seq_len / bt + 1][n_layers]: trace_key_norm() of each
                               block's keys as put (for traces and learned scorers) */
  float *kv_rt;             /* scratch for codec round trips */
  uint8_t *enc;
  size_t enc_len;
  int rt_codec[2];          /* K, V: quantize-dequantize before the put (0: exact) */
  int observe;              /* call kvt_seq_observe() after each attention (1) */
  rm_mass_fn on_mass;
  void *on_mass_arg;
} rm_dec;

/* A decoder at position 0 with a plain array cache (e NULL) or with a new
 * sequence of namespace ns of e as its cache. 0, -ENOMEM or a kvt code. */
int rm_dec_init(rm_dec *d, const rm_model *m, kvt_engine *e, kvt_ns_id ns);
void rm_dec_free(rm_dec *d);

/* Decode one token at position d->pos; *logits (d->logits, vocab_size
 * floats) stays valid until the next step. 0; KVT_ECOUNT past seq_len;
 * or the kvt code of a failed engine call. */
int rm_dec_step(rm_dec *d, uint32_t token, const float **logits);

/* kvtier cache at position 0: take the leading full blocks of tokens that
 * the store holds (kvt_lookup), loading each from RAM or the cold tier
 * instead of computing it. A block whose load fails its check
 * (KVT_ECORRUPT, or KVT_ENOTFOUND once the cold tier dropped it) is a
 * miss: the resume stops before it, and the caller computes it and the
 * rest. *n_tokens receives how many tokens are now decoded (a multiple of
 * bt, at most n - 1 so that the caller still has a token to step). 0 or a
 * kvt code. */
int rm_dec_resume(rm_dec *d, const uint32_t *tokens, size_t n, size_t *n_tokens);

#endif
