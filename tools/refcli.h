/* refcli.h - what the commands that run the reference model (eval, warm,
 * bench refmodel) share: loading a checkpoint and its tokenizer with a
 * clear error, and reading a --codec choice. Public API only. */
#ifndef KVT_TOOLS_REFCLI_H
#define KVT_TOOLS_REFCLI_H

#include "refmodel.h"

/* Tokens per block of the reference model's namespace. */
#define REF_BLOCK_TOKENS 16u

/* Load the checkpoint at path; on failure print "kvtier CMD: <why>" and
 * return CLI_FAIL. */
int ref_load_model(const char *cmd, const char *path, rm_model *m);

/* Load the tokenizer at path, or when path is NULL the llama2.c naming
 * convention: tok<vocab>.bin next to the model. CLI_OK or CLI_FAIL,
 * printed. */
int ref_load_tokenizer(const char *cmd, const char *path, const char *model_path,
                       const rm_model *m, rm_tokenizer *t);

/* A --codec choice: "k8v3" (a pair), a key codec alone ("k8", "k8c",
 * "k4") or a value codec alone ("v2", "v3", "v4"): every block is kept
 * warm and attended in place, the side without a codec kept exact there
 * (kvt_ns_set_codec with KVT_CODEC_NONE). */
typedef struct ref_codec {
  int k, v;   /* kvt_codec_id or 0 (KVT_CODEC_NONE: exact) */
  int warm;   /* 1: through the warm tier (every parsed choice) */
} ref_codec;

/* 0, or -1 when name is none of the above. */
int ref_codec_parse(const char *name, ref_codec *c);

/* Read token-id sequences, whitespace-separated ids, one sequence per
 * line (blank lines skipped), each 1 .. max_len ids below vocab. On
 * success *seqs and *lens are malloc'd arrays of *n entries. Errors are
 * printed with the line number; CLI_OK or CLI_FAIL. */
int ref_read_tokens(const char *cmd, const char *path, uint32_t vocab, uint32_t max_len,
                    uint32_t ***seqs, uint32_t **lens, size_t *n);
void ref_free_tokens(uint32_t **seqs, uint32_t *lens, size_t n);

#endif
