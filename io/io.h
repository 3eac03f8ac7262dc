/* io.h - the I/O layer: everything kvtier does to the file system goes
 * through here (the engine and tiers never make a system call). For now:
 * the store directory and its writer lock; the cold tier adds a method
 * table with io_uring, pread and fault-injecting backends. */
#ifndef KVT_IO_H
#define KVT_IO_H

/* Open store directory dir. A writer (rdonly == 0) creates it when create
 * is set and takes an exclusive flock() on dir/LOCK, held through *lock_fd
 * until kvt_io_dir_close(); the kernel releases it if the process dies.
 * A reader takes no lock and *lock_fd is -1.
 * Returns 0; KVT_ELOCKED when another writer holds the lock; -ENOENT,
 * -ENOTDIR or another -errno. */
int kvt_io_dir_open(const char *dir, int create, int rdonly, int *lock_fd);
void kvt_io_dir_close(int lock_fd);

#endif
