/* options_tier.c - kvt_options_tier_set/get(): one tier's options by its
 * id, in a struct the caller sizes, so a tier added later takes options
 * without changing kvt_options (docs/store-interface.md, "The public ABI"). */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "engine/errinfo.h"
#include "engine/options_tier.h"

/* The ids this library has options for: hot, warm and the durable store,
 * all held in kvt_options' per-tier arrays. A later tier adds its id here
 * and its storage below. */
static int tier_known(uint32_t tier) {
  return tier == KVT_TIER_HOT || tier == KVT_TIER_WARM || tier == KVT_TIER_COLD;
}

int kvt_tier_options_check(uint32_t tier, const kvt_tier_options *t, kvt_error_info *info,
                           const char *call) {
  static const char *const gbps[KVT_N_TIERS] = {"", "tier_load_gbps[HOT]", "tier_load_gbps[WARM]",
                                                "tier_load_gbps[COLD]"};
  static const char *const lat[KVT_N_TIERS] = {"", "tier_load_latency_us[HOT]",
                                               "tier_load_latency_us[WARM]",
                                               "tier_load_latency_us[COLD]"};
  if (!tier_known(tier)) return KVT_ENOTFOUND;
  if (!(t->load_gbps > 0) || !isfinite(t->load_gbps))
    return kvt_err_fill(info, KVT_EOPTION, call, gbps[tier], "finite and > 0", "%g", t->load_gbps);
  if (!(t->load_latency_us >= 0) || !isfinite(t->load_latency_us))
    return kvt_err_fill(info, KVT_EOPTION, call, lat[tier], "finite and >= 0", "%g",
                        t->load_latency_us);
  return 0;
}

/* The first kvt_tier_options' size: the least a caller may pass to set.
 * It stays this value when fields are appended. */
#define TIER_OPTIONS_V1 (offsetof(kvt_tier_options, load_latency_us) + sizeof(double))

/* The most a caller may pass to set: far above any version of the
 * struct, so a size read from garbage is refused before the tail is read. */
#define TIER_OPTIONS_MAX 4096u

/* 1 when every byte of the caller's struct past the library's is 0. */
static int tail_zero(const kvt_tier_options *to, size_t size) {
  const unsigned char *p = (const unsigned char *)to;
  for (size_t i = sizeof *to; i < size; i++)
    if (p[i]) return 0;
  return 1;
}

int kvt_options_tier_set(kvt_options *opt, uint32_t tier, const kvt_tier_options *to, size_t size) {
  if (!opt || !to) return KVT_ENULL;
  if (!tier_known(tier)) return KVT_ENOTFOUND;
  if (size < TIER_OPTIONS_V1) return KVT_EBUFSIZE;
  if (size > TIER_OPTIONS_MAX || to->size != size || !tail_zero(to, size)) return KVT_EOPTION;
  kvt_tier_options t = {0};
  memcpy(&t, to, size < sizeof t ? size : sizeof t);
  int rc = kvt_tier_options_check(tier, &t, NULL, "kvt_options_tier_set");
  if (rc) return rc;
  opt->tier_bytes_limit[tier] = t.bytes_limit;
  opt->tier_load_gbps[tier] = t.load_gbps;
  opt->tier_load_latency_us[tier] = t.load_latency_us;
  return 0;
}

int kvt_options_tier_get(const kvt_options *opt, uint32_t tier, kvt_tier_options *to,
                         size_t size) {
  if (!opt || !to) return KVT_ENULL;
  if (size < sizeof to->size) return KVT_EBUFSIZE;
  if (!tier_known(tier)) return KVT_ENOTFOUND;
  kvt_tier_options t = {.bytes_limit = opt->tier_bytes_limit[tier],
                        .load_gbps = opt->tier_load_gbps[tier],
                        .load_latency_us = opt->tier_load_latency_us[tier]};
  size_t n = size < sizeof t ? size : sizeof t;
  t.size = n;
  memcpy(to, &t, n);
  return 0;
}
