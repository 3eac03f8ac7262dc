/* rebuild.c - kvt_store_rebuild_index(): the cold tier's index made again
 * from its segment files, with the store's writer lock held throughout so
 * no engine opens it meanwhile (tiers/store.c does the work). */
#include "kvtier.h"
#include "tiers/store.h"

int kvt_store_rebuild_index(const char *dir, uint64_t segment_bytes, kvt_rebuild_result *res,
                            void (*report)(void *arg, const char *what), void *arg) {
  if (!dir || !res) return KVT_ENULL;
  *res = (kvt_rebuild_result){0};
  return kvt_store_rebuild(dir, segment_bytes, res, report, arg);
}
