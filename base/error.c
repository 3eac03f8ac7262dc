/* error.c - kvt_strerror(): one message for every kvtier code and -errno. */
#include "kvtier.h"

#include <string.h>

static const char *const kvt_msgs[] = {
  "shape is invalid or differs from the namespace",                     /* ESHAPE */
  "dtype differs from the namespace or is unknown",                     /* EDTYPE */
  "count is zero, too large, or not what the call needs",               /* ECOUNT */
  "a required pointer is NULL",                                         /* ENULL */
  "K or V holds NaN or infinity",                                       /* ENONFINITE */
  "every tier is full and all it holds is referenced",                  /* EFULL */
  "another writer (engine or process) has the store open",              /* ELOCKED */
  "the engine was opened read-only",                                    /* ERDONLY */
  "no such namespace, block or layer",                                  /* ENOTFOUND */
  "namespace is registered with a different shape",                     /* ENSCONFLICT */
  "an option is out of range or inconsistent",                          /* EOPTION */
  "call out of order (e.g. put before append)",                         /* ESTATE */
  "object still in use (open sequences or pending loads)",              /* EBUSY */
  "caller buffer size is not what the call needs",                      /* EBUFSIZE */
  "metadata-only engine: blocks carry no payload",                      /* ENOPAYLOAD */
  "a fixed limit set at open was reached",                              /* ELIMIT */
  "stored data failed a check",                                         /* ECORRUPT */
  "stored data has a format version this build cannot read",            /* EVERSION */
  "referenced blocks are only on disk and could not be brought back",  /* ENOTRESIDENT */
  "referenced blocks reached RAM only quantized: they cannot be durable", /* ENOTDURABLE */
  "the cold tier's index is damaged or missing; rebuild it from the segment files "
  "(kvtier fsck --rebuild-index DIR)",                                  /* EINDEX */
  "a remote node refused the credentials (user or password)",          /* EAUTH */
};

_Static_assert(sizeof(kvt_msgs) / sizeof(kvt_msgs[0]) == KVT_E_FIRST - KVT_E_LAST + 1,
               "one message per kvtier error code");

const char *kvt_strerror(int err) {
  if (err == 0) return "success";
  if (err <= KVT_E_FIRST && err >= KVT_E_LAST) return kvt_msgs[KVT_E_FIRST - err];
  if (err < 0 && err > -4096) {
    const char *s = strerrordesc_np(-err); /* static, thread-safe, NULL if unknown */
    if (s) return s;
  }
  return "unknown error code";
}
