/* profile.h - per-layer policy profiles (PolyKV-H, DESIGN.md section 4):
 * the JSON file `kvtier calibrate` writes (docs/policy.md, "Profiles"),
 * parsed from bytes and
 * checked against a namespace's shape. kvt_ns_load_profile() reads the
 * file (kvt_profile_read) and hands the bytes here. */
#ifndef KVT_PROFILE_H
#define KVT_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/policy.h"
#include "kvtier.h"

#define KVT_PROFILE_VERSION 2u /* versions 1 (no warm shares) and 2 are read */
#define KVT_PROFILE_MAX_BYTES (16u << 20) /* a profile's text, at most */
#define KVT_PROFILE_MAX_BUDGETS 16u
/* The layers' shares must average to the budget within this. */
#define KVT_PROFILE_SHARE_TOL 1e-4

typedef struct kvt_profile_layer {
  uint32_t scorer; /* kvt_scorer_id */
  double share;    /* (0, 1]: its budget, a fraction of its own full cache */
  double warm;     /* [0, 1): the part of share warm blocks may take (version 2;
                      0 in version 1) */
} kvt_profile_layer;

/* (policy.h declares kvt_profile, kvt_profile_read, kvt_profile_free and
 * kvt_profile_layers, the engine's side.) */
struct kvt_profile {
  uint32_t n_layers, n_budgets;
  uint32_t version;                       /* 1 or 2 (warm shares) */
  double budget[KVT_PROFILE_MAX_BUDGETS]; /* the total budget of each entry */
  kvt_profile_layer *layers;              /* [n_budgets][n_layers] */
  struct kvt_mem *mem;                    /* where it is counted (OTHER) */
  size_t layers_bytes;
};

/* Parse and check a profile for `shape`. On success *out is a new
 * profile (free with kvt_profile_free). Codes, each with detail recorded
 * on e (kvt_last_error): KVT_ECORRUPT (not JSON, truncated, not a kvtier
 * profile, a field missing or of the wrong type); KVT_EVERSION (another
 * format version); KVT_ESHAPE (made for another shape); KVT_EOPTION (an
 * unknown scorer, a share outside (0, 1], "full" with a share below 1,
 * shares that do not average to the budget, a budget twice or outside
 * (0, 1]); KVT_ENULL; -ENOMEM. */
int kvt_profile_parse(kvt_engine *e, const kvt_shape *shape, const char *text, size_t len,
                      kvt_profile **out);

/* The entry for total budget `budget` (within 1e-9), or the only entry
 * when budget is 0 and there is one: its index, or -1. */
int kvt_profile_pick(const kvt_profile *p, double budget);

/* Per-layer scorers and shares for any total budget in (0, 1]: an
 * entry's own when the profile has that budget; between two entries, the
 * shares interpolated linearly (so they average to the budget and stay
 * <= 1) with the nearer entry's scorers; outside them, the nearest
 * entry's shares scaled to the budget, a layer that would pass 1 held at
 * 1 and the others scaled again. A layer at "full" stays at 1 while the
 * others can pay for it; when they cannot, it scales like them and
 * becomes "recent". */
void kvt_profile_shares(const kvt_profile *p, double budget, uint32_t *scorer, double *share);

/* Per-layer warm parts (of each layer's share) for a total budget: an
 * entry's own, interpolated linearly between two entries, the nearest
 * entry's outside them. All 0 for a version-1 profile. */
void kvt_profile_warm(const kvt_profile *p, double budget, double *warm);

#endif
