/* options_tier.h - the rules of one tier's options (kvt_tier_options),
 * shared by kvt_options_tier_set() and kvt_engine_open(), so a value the
 * setter refuses is refused at open too, and the reverse. */
#ifndef KVT_OPTIONS_TIER_H
#define KVT_OPTIONS_TIER_H

#include "kvtier.h"

/* 0 when t's values are valid for tier `tier` (an id the library knows),
 * else KVT_EOPTION with the detail in *info (may be NULL) under `call`,
 * naming the kvt_options field the value lives in. */
int kvt_tier_options_check(uint32_t tier, const kvt_tier_options *t, kvt_error_info *info,
                           const char *call);

#endif
