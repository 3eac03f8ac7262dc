/* rebuild.c - kvt_store_rebuild_index(): the cold tier's index made again
 * from its segment files, with the store's writer lock held throughout so
 * no engine opens it meanwhile. */
#include <errno.h>

#include "io/io.h"
#include "kvtier.h"
#include "tiers/cold_scan.h"

#define REBUILD_MAP_BYTES 0 /* sized from the segments found (kvt_cold_map_bytes) */

int kvt_store_rebuild_index(const char *dir, uint64_t segment_bytes, kvt_rebuild_result *res,
                            void (*report)(void *arg, const char *what), void *arg) {
  if (!dir || !res) return KVT_ENULL;
  *res = (kvt_rebuild_result){0};
  if (segment_bytes && (segment_bytes < (1u << 20) || segment_bytes % KVT_IO_ALIGN))
    return KVT_EOPTION;
  int lock_fd = -1;
  int rc = kvt_io_dir_open(dir, 0, 0, &lock_fd);
  if (rc) return rc;
  rc = kvt_cold_rebuild(dir, segment_bytes, REBUILD_MAP_BYTES, res, report, arg);
  kvt_io_dir_close(lock_fd);
  return rc;
}
