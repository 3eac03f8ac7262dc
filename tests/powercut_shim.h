/* powercut_shim.h - a recorder of every change a process makes to the
 * files under one directory, for the power-cut test (test_powercut.c).
 * Linked into that test only: it defines open/pwrite/fdatasync/... itself,
 * so the library's calls and LMDB's (through the dynamic linker) reach it. */
#ifndef KVT_POWERCUT_SHIM_H
#define KVT_POWERCUT_SHIM_H

#include <stdint.h>

/* The log: records one after another, each a pc_rec, then path_len bytes
 * of path (no NUL), then len bytes of data (WRITE and NOTE only). */
enum pc_kind {
  PC_CREATE = 1, /* a new file: path */
  PC_MKDIR,      /* a new directory: path */
  PC_WRITE,      /* len bytes at off; flags PC_F_DSYNC: through an O_DSYNC/O_SYNC fd */
  PC_TRUNC,      /* the file's size set to off (ftruncate, O_TRUNC, fallocate growing it) */
  PC_SYNC,       /* fsync or fdatasync of a file */
  PC_DIRSYNC,    /* fsync of a directory: the names in it are durable */
  PC_UNLINK,     /* a name removed (file or directory) */
  PC_NOTE,       /* the test's own record (len bytes), in order with the rest */
};

#define PC_F_DSYNC 1u

typedef struct pc_rec {
  uint32_t kind, flags;
  uint64_t off, len;
  uint32_t path_len, pad;
} pc_rec;

/* Record every change under root (an absolute path without a trailing
 * slash; root itself counts as durable and is not recorded) into log_path,
 * which must lie outside root. Descriptors opened before this call are not
 * followed. Returns 0 or -errno. */
int pc_record_start(const char *root, const char *log_path);
/* Stop recording and close the log. */
void pc_record_stop(void);
/* Append a PC_NOTE record holding data. */
void pc_note(const void *data, uint32_t len);
/* Calls the recorder refused (renames under root, descriptors out of
 * range, a short log write): a test fails when this is not 0. */
uint64_t pc_refused(void);

#endif
