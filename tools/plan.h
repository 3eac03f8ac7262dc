/* plan.h - pieces of `kvtier plan` (capacity planning): model shapes
 * (plan_model.c), workloads (plan_trace.c) and the replay through a
 * metadata-only engine (plan.c). Uses only the public API. */
#ifndef KVT_TOOLS_PLAN_H
#define KVT_TOOLS_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

/* ---- models ------------------------------------------------------------- */

typedef struct plan_model {
  char name[64];
  uint32_t n_layers, n_kv_heads, head_dim;
  uint32_t dtype;        /* KVT_F16, KVT_BF16 or KVT_F32 */
  double params;         /* weights, for the default prefill speed */
} plan_model;

/* A built-in model by name (case-insensitive, e.g. "llama-3.1-8b").
 * 0, or -1 with the list of names printed to stderr. */
int plan_model_builtin(const char *name, plan_model *m);
/* A Hugging Face config.json: num_hidden_layers, num_key_value_heads
 * (else num_attention_heads), head_dim (else hidden_size /
 * num_attention_heads), dtype (else torch_dtype); weights estimated from
 * the sizes (0 when they are missing).
 * 0, or -1 with the reason printed to stderr. */
int plan_model_config(const char *path, plan_model *m);
/* Print the built-in table, one model a line. */
void plan_model_list(FILE *f);

/* ---- workloads ------------------------------------------------------------ */

#define PLAN_BLOCK_TOKENS 512u /* the Mooncake traces' block */
#define PLAN_MAX_BLOCKS 65536u /* blocks of one request, at most */

typedef struct plan_req {
  double t_ms;           /* arrival, on the trace's clock */
  uint32_t input_len, output_len;
  uint32_t n_blocks;     /* hash ids: one per 512-token prefix block */
  uint64_t first;        /* index of its first id in plan_trace.ids */
} plan_req;

typedef struct plan_trace {
  plan_req *reqs;
  size_t n, cap;
  uint64_t *ids;         /* every request's hash ids, one after the other */
  size_t n_ids, cap_ids;
  uint32_t max_blocks;
  uint64_t input_tokens, output_tokens;
} plan_trace;

/* Read a Mooncake JSONL trace (timestamp ms, input_length, output_length,
 * hash_ids). 0, or -1 with the file, line and reason printed to stderr. */
int plan_trace_load(const char *path, plan_trace *t);

/* A synthetic workload: n_req requests from `agents` agents in turn (seed
 * 0) or drawn at random from seed (another seed, another order), each
 * with a context of ctx tokens whose first `shared` fraction is common to
 * all agents and the rest the agent's own (the same every turn), arriving
 * at rate per second, each producing out tokens. 0 or -1 (no memory). */
int plan_trace_synth(plan_trace *t, uint64_t seed, uint32_t agents, uint32_t ctx, double shared, double rate,
                     uint32_t n_req, uint32_t out);
void plan_trace_free(plan_trace *t);

#endif
