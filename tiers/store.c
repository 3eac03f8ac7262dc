/* store.c - opening a store (store.h): the table of implementations, the
 * first that wants the configuration serves it; and the store directory's
 * lock, index path and index rebuild, so the engine never touches a file. */
#include <errno.h>
#include <stdio.h>

#include "io/io.h"
#include "tiers/cold.h"
#include "tiers/cold_scan.h"
#include "tiers/store_impl.h"

/* In order of preference; a new tier is one more line. */
static const kvt_store_impl *const impls[] = {&kvt_store_remote, &kvt_store_meta, &kvt_store_disk};

int kvt_store_open(kvt_mem *m, const kvt_store_config *cfg, kvt_store **out) {
  *out = NULL;
  const kvt_store_impl *im = NULL;
  for (size_t i = 0; !im && i < sizeof impls / sizeof impls[0]; i++)
    if (impls[i]->wants(cfg)) im = impls[i];
  if (!im) return 0;
  kvt_store *s = kvt_mem_calloc(m, KVT_MEM_OTHER, sizeof *s);
  if (!s) return -ENOMEM;
  s->m = im->m;
  int rc = im->open(m, cfg, &s->impl);
  if (rc) {
    kvt_mem_free(m, KVT_MEM_OTHER, s, sizeof *s);
    return rc;
  }
  s->mem = m;
  *out = s;
  return 0;
}

void kvt_store_close(kvt_store *s) {
  if (!s) return;
  s->m->close(s->impl);
  kvt_mem_free(s->mem, KVT_MEM_OTHER, s, sizeof *s);
}

int kvt_store_lock(const char *dir, int create, int rdonly, int *lock_fd) {
  return kvt_io_dir_open(dir, create, rdonly, lock_fd);
}

void kvt_store_unlock(int lock_fd) { kvt_io_dir_close(lock_fd); }

int kvt_store_lock_holder(const char *dir, int *pid) {
  *pid = 0;
  if (kvt_io_dir_readers_only(dir)) return 1;
  int p = kvt_io_lock_owner(dir);
  *pid = p > 0 ? p : 0;
  return 0;
}

int kvt_store_has_index(const char *dir) {
  char path[4200];
  if (snprintf(path, sizeof path, "%s/index", dir) >= (int)sizeof path) return 0;
  return kvt_io_exists(path);
}

#define REBUILD_MAP_BYTES 0 /* sized from the segments found (kvt_cold_map_bytes) */

int kvt_store_rebuild(const char *dir, uint64_t segment_bytes, kvt_rebuild_result *res,
                      void (*report)(void *arg, const char *what), void *arg) {
  if (segment_bytes && (segment_bytes < (1u << 20) || segment_bytes % KVT_IO_ALIGN))
    return KVT_EOPTION;
  int lock_fd = -1;
  int rc = kvt_io_dir_open(dir, 0, 0, &lock_fd);
  if (rc) return rc;
  rc = kvt_cold_rebuild(dir, segment_bytes, REBUILD_MAP_BYTES, res, report, arg);
  kvt_io_dir_close(lock_fd);
  return rc;
}

uint64_t kvt_store_record_bytes(uint32_t n_layers, uint32_t bytes_each) {
  return kvt_cold_record_max(n_layers, bytes_each);
}
