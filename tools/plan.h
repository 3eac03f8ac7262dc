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

/* ---- pieces of plan.c that the fleet mode (plan_fleet.c) shares ------------ */

#define PLAN_CAP_INF UINT64_MAX /* an unbounded capacity */

/* "inf" (PLAN_CAP_INF), or a token count of at least 512 with an optional
 * K, M or G (decimal) suffix. 0, or -1 when s is neither. */
int parse_tokens(const char *s, uint64_t *out);
/* The layers folded into as few as kvtier's limits allow (plan.c's top
 * comment says why). 0, or -1 when a 512-token block is too large. */
int fold_shape(const plan_model *m, kvt_shape *s);
/* The tokens of request r (room for r->n_blocks blocks): block i is (its
 * hash id, 0, 0, ...), so equal id chains give equal key chains. */
void request_tokens(const plan_trace *t, const plan_req *r, uint32_t *tokens);
/* Input tokens of block i of a request of len tokens. */
uint64_t block_input(uint32_t i, uint32_t len);

/* ---- the fleet mode (plan_fleet.c) -------------------------------------------- */

/* Does argv ask for the fleet mode (--fleet given)? */
int plan_fleet_wanted(int argc, char **argv);
/* `kvtier plan --fleet N ...`: a CLI_* status. */
int cmd_plan_fleet(int argc, char **argv);
/* Its options, as part of plan's usage. */
void plan_fleet_usage(FILE *f);

#endif
