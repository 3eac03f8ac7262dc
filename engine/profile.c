/* profile.c - per-layer policies ("auto"), read from a profile file
 * (docs/policy.md). Not there yet: loading any profile is refused. */
#include <stdlib.h>

#include "engine/internal.h"

int kvt_profile_read(kvt_engine *e, const char *path, const kvt_shape *sh, kvt_profile **out) {
  (void)sh;
  *out = NULL;
  return KVT_ERR(e, KVT_EOPTION, "kvt_ns_load_profile", "path", "a profile file",
                 "%s: profiles are not supported by this build", path);
}

void kvt_profile_free(kvt_profile *p) { free(p); }

void kvt_profile_layers(const kvt_profile *p, double budget, kvt_lpol *out, uint32_t n_layers) {
  (void)p;
  for (uint32_t l = 0; l < n_layers; l++)
    out[l] = (kvt_lpol){.scorer = KVT_SCORER_SNAPKV, .share = budget};
}
