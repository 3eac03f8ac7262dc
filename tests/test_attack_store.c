/* test_attack_store.c - deliberate attacks on a store's files (issue 11,
 * "Hardening"): a segment file deleted or replaced by a directory, a
 * dangling symbolic link or a FIFO; the lock file replaced under a
 * writer; more segments than the process may open files; fsck --repair
 * on a directory that is not a store. Each must end in misses or a clear
 * error, never a hang, a crash, a second writer or wrong bytes. */

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cold_util.h"

#define SEG (1u << 20)

/* ~148 KiB a record: about seven to a 1 MiB segment. */
static kvt_shape big_shape(void) {
  return (kvt_shape){.n_layers = 4, .n_kv_heads = 4, .head_dim = 64, .dtype = KVT_F32,
                     .block_tokens = 16};
}

static void opts(kvt_options *o) {
  cu_opts(o, KVT_BACKEND_AUTO);
  o->tier_bytes_limit[KVT_TIER_COLD] = 1ull << 30;
  o->tier_bytes_limit[KVT_TIER_HOT] = 2u << 20;
  o->cold_compress = 0; /* fixed record sizes */
}

static void tokens_of(uint32_t b, uint32_t *t) {
  for (uint32_t i = 0; i < 16; i++) t[i] = b * 1000 + i;
}

/* Write blocks [first, first + n) durably, one released sequence each.
 * Returns 0 or the first error (usable in a forked child). */
static int write_blocks(kvt_engine *e, uint32_t first, uint32_t n) {
  kvt_shape sh = big_shape();
  kvt_ns_id ns;
  kvt_ns_desc d = tu_desc("attack", &sh);
  int rc = kvt_ns_register(e, &d, &ns);
  if (rc) return rc;
  uint64_t salt = tu_salt("attack");
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  for (uint32_t b = first; !rc && b < first + n; b++) {
    kvt_seq *s;
    uint32_t t[16];
    tokens_of(b, t);
    rc = kvt_seq_create(e, ns, &s);
    if (rc) break;
    rc = cu_append_put(s, &sh, salt, t, &kv, NULL);
    kvt_seq_release(s);
    if (!rc && (b + 1) % 8 == 0) rc = kvt_sync(e);
  }
  if (!rc) rc = kvt_sync(e);
  tu_kv_free(&kv);
  return rc;
}

/* A store in a new directory with at least `segs` segments, closed. */
static char *make_store(uint32_t segs) {
  char *dir = tu_tmpdir();
  kvt_options o;
  opts(&o);
  kvt_engine *e = tu_open(dir, &o);
  kvt_stats st;
  uint32_t n = 0;
  do {
    assert_int_equal(write_blocks(e, n, 8), 0);
    n += 8;
    tu_stats(e, &st);
  } while (st.cold_segments < segs);
  assert_int_equal(st.cold_records, n);
  kvt_engine_close(e);
  return dir;
}

typedef struct reports {
  uint64_t n, naming;          /* problems; those that name the segment file */
  const char *name;
} reports;

static void count_report(void *arg, const kvt_key *key, const char *what) {
  reports *r = arg;
  (void)key;
  r->n++;
  if (r->name && strstr(what, r->name)) r->naming++;
  else if (r->n - r->naming <= 3) fprintf(stderr, "  problem: %s\n", what);
}

/* ---------------------------------------------- a missing segment file */

enum { ATTACK_DELETE, ATTACK_DIR, ATTACK_SYMLINK, ATTACK_FIFO };

static void replace_segment(const char *dir, int how) {
  char path[512];
  snprintf(path, sizeof path, "%s/segments/seg-00000000", dir);
  assert_int_equal(unlink(path), 0);
  if (how == ATTACK_DIR) assert_int_equal(mkdir(path, 0755), 0);
  if (how == ATTACK_SYMLINK) assert_int_equal(symlink("/nonexistent/kvtier-seg", path), 0);
  if (how == ATTACK_FIFO) assert_int_equal(mkfifo(path, 0644), 0);
}

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_attack_store: an open blocked (a FIFO?)\n";
  if (write(2, msg, sizeof msg - 1) < 0) _exit(3);
  _exit(3);
}

/* Segment 0's file is gone or something else is in its place: a reader
 * and a writer open; fsck names the file for each entry in it and the
 * other entries check clean; --repair removes them; the store then checks
 * clean and takes new blocks. The attacks that could block (a FIFO) run
 * under an alarm. */
static void run_missing(int how) {
  char *dir = make_store(3);
  kvt_options o;
  opts(&o);
  replace_segment(dir, how);
  signal(SIGALRM, on_alarm);
  alarm(60);
  kvt_fsck_result res;
  reports rep = {.name = "seg-00000000"};
  kvt_options ro = o;
  ro.flags = KVT_OPEN_RDONLY | KVT_OPEN_NOCREATE;
  kvt_engine *e = NULL;
  assert_int_equal(kvt_engine_open(dir, &ro, &e), 0);
  assert_int_equal(kvt_fsck(e, 0, &res, count_report, &rep), 0);
  kvt_engine_close(e);
  printf("missing[%d]: %llu checked, %llu bad, %llu naming the file\n", how,
         (unsigned long long)res.checked, (unsigned long long)res.bad,
         (unsigned long long)rep.naming);
  assert_true(res.bad > 0);
  assert_true(res.bad < res.checked); /* the other segments' blocks are fine */
  assert_int_equal(rep.naming, res.bad);
  uint64_t before = res.checked, bad = res.bad;

  e = tu_open(dir, &o); /* a writer opens too */
  /* Block 0 (in segment 0) is a miss for a lookup and for a load, not
   * corrupt data: nothing fails a check. */
  kvt_shape sh = big_shape();
  kvt_ns_desc d = tu_desc("attack", &sh);
  kvt_ns_id ns;
  assert_int_equal(kvt_ns_register(e, &d, &ns), 0);
  uint32_t t[16];
  tokens_of(0, t);
  size_t found = 9, nk = 0;
  assert_int_equal(kvt_lookup(e, ns, t, sh.block_tokens, NULL, 0, &found), 0);
  assert_int_equal(found, 0);
  kvt_key key;
  assert_int_equal(kvt_keys(e, ns, t, sh.block_tokens, &key, 1, &nk), 0);
  tu_kv kv;
  tu_kv_alloc(&kv, &sh);
  kvt_load_req lr = {.key = key, .layer = 0, .k_out = kv.k, .v_out = kv.v, .bytes_each = kv.bytes};
  kvt_load *ld;
  assert_int_equal(kvt_load_submit(e, ns, &lr, 1, &ld), 0);
  kvt_load_wait(ld, NULL);
  assert_int_equal(lr.status, KVT_ENOTFOUND);
  kvt_stats st;
  tu_stats(e, &st);
  assert_int_equal(st.cold_checksum_failures, 0);
  tu_kv_free(&kv);
  assert_int_equal(kvt_fsck(e, 1, &res, NULL, NULL), 0);
  assert_int_equal(res.bad, bad);
  assert_int_equal(res.removed, bad);
  assert_int_equal(kvt_fsck(e, 0, &res, NULL, NULL), 0);
  assert_int_equal(res.bad, 0);
  assert_int_equal(res.checked, before - bad);
  assert_int_equal(write_blocks(e, 100000, 20), 0); /* it still takes blocks */
  assert_int_equal(kvt_fsck(e, 0, &res, NULL, NULL), 0);
  assert_int_equal(res.bad, 0);
  kvt_engine_close(e);
  alarm(0);
  tu_rmtree(dir);
}

static void test_segment_deleted(void **state) {
  (void)state;
  run_missing(ATTACK_DELETE);
}

static void test_segment_is_directory(void **state) {
  (void)state;
  run_missing(ATTACK_DIR);
}

static void test_segment_dangling_symlink(void **state) {
  (void)state;
  run_missing(ATTACK_SYMLINK);
}

static void test_segment_is_fifo(void **state) {
  (void)state;
  run_missing(ATTACK_FIFO);
}

/* ------------------------------------------------ the lock file replaced */

/* Open and close dir as a writer; the open's return code. */
static int writer_rc(const char *dir) {
  kvt_options o;
  kvt_options_init(&o);
  kvt_engine *e = NULL;
  int rc = kvt_engine_open(dir, &o, &e);
  if (rc == 0) kvt_engine_close(e);
  return rc;
}

/* A writer runs; its LOCK file (where earlier versions took the lock) is
 * deleted and replaced: a second writer is still refused, in this process
 * and in another. */
static void test_lock_file_replaced(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_engine *w = tu_open(dir, NULL);
  char path[512];
  snprintf(path, sizeof path, "%s/LOCK", dir);
  unlink(path);
  int fd = open(path, O_CREAT | O_RDWR, 0644);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(writer_rc(dir), KVT_ELOCKED);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(writer_rc(dir) == KVT_ELOCKED ? 0 : 1);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  unlink(path);
  assert_int_equal(writer_rc(dir), KVT_ELOCKED); /* gone altogether: the same */
  kvt_engine_close(w);
  assert_int_equal(writer_rc(dir), 0);
  tu_rmtree(dir);
}

/* LOCK (the writer's pid, a hint) replaced by a FIFO or by a symbolic link
 * to another file: a writer neither blocks on the FIFO nor writes or
 * truncates through the link, and a refused second writer still says who
 * holds the store, the message read with the same care. */
static void test_lock_hint_attacks(void **state) {
  (void)state;
  char *dir = tu_tmpdir(), path[512], victim[512];
  snprintf(path, sizeof path, "%s/LOCK", dir);
  snprintf(victim, sizeof victim, "%s/victim", dir);
  FILE *f = fopen(victim, "w");
  assert_non_null(f);
  fputs("keep me", f);
  fclose(f);
  signal(SIGALRM, on_alarm);
  alarm(60);
  for (int how = 0; how < 2; how++) {
    unlink(path);
    if (how == 0) assert_int_equal(mkfifo(path, 0644), 0);
    else assert_int_equal(symlink(victim, path), 0);
    kvt_engine *w = tu_open(dir, NULL); /* no hang on the FIFO */
    assert_int_equal(writer_rc(dir), KVT_ELOCKED);
    kvt_engine_close(w);
    struct stat st;
    assert_int_equal(stat(victim, &st), 0);
    assert_int_equal(st.st_size, 7); /* nothing written or truncated through the link */
  }
  alarm(0);
  tu_rmtree(dir);
}

/* ------------------------------------ more segments than open files */

/* A store of 40 segments under a descriptor limit of 32: a writer and a
 * reader open it, every entry checks clean, new blocks are written. In a
 * child, which lowers its own limit. */
static void test_more_segments_than_files(void **state) {
  (void)state;
  char *dir = make_store(40);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    struct rlimit rl = {32, 32};
    if (setrlimit(RLIMIT_NOFILE, &rl)) _exit(2);
    kvt_options o;
    opts(&o);
    kvt_engine *e = NULL;
    int rc = kvt_engine_open(dir, &o, &e);
    if (rc) {
      fprintf(stderr, "many segments: writer open: %s\n", kvt_strerror(rc));
      _exit(1);
    }
    kvt_fsck_result res;
    rc = kvt_fsck(e, 0, &res, NULL, NULL);
    if (rc || res.bad || res.checked < 250) {
      fprintf(stderr, "many segments: fsck %s, %llu checked, %llu bad\n", kvt_strerror(rc),
              (unsigned long long)res.checked, (unsigned long long)res.bad);
      _exit(1);
    }
    rc = write_blocks(e, 200000, 30);
    if (rc) {
      fprintf(stderr, "many segments: writing: %s\n", kvt_strerror(rc));
      _exit(1);
    }
    kvt_engine_close(e);
    o.flags = KVT_OPEN_RDONLY | KVT_OPEN_NOCREATE;
    rc = kvt_engine_open(dir, &o, &e);
    if (!rc) rc = kvt_fsck(e, 0, &res, NULL, NULL);
    if (rc || res.bad) {
      fprintf(stderr, "many segments: reader: %s, %llu bad\n", kvt_strerror(rc),
              (unsigned long long)res.bad);
      _exit(1);
    }
    kvt_engine_close(e);
    _exit(0);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  tu_rmtree(dir);
}

/* ------------------------------------- fsck beside a reclaiming writer */

/* A read-only fsck runs again and again in a child while this process
 * writes through a cold tier of four segments, reclaiming all the time:
 * no run may report a bad entry (the store is healthy throughout). */
static void test_fsck_beside_reclaim(void **state) {
  (void)state;
  char *dir = make_store(2);
  int go[2], stop[2];
  assert_int_equal(pipe(go), 0);
  assert_int_equal(pipe(stop), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(go[0]);
    close(stop[1]);
    kvt_options o;
    opts(&o);
    o.flags = KVT_OPEN_RDONLY | KVT_OPEN_NOCREATE;
    kvt_engine *e = NULL;
    if (kvt_engine_open(dir, &o, &e)) _exit(2);
    if (write(go[1], "g", 1) != 1) _exit(2);
    fcntl(stop[0], F_SETFL, O_NONBLOCK);
    uint64_t runs = 0, checked = 0, bad = 0;
    char ch;
    do {
      kvt_fsck_result res;
      reports rep = {0};
      int rc = kvt_fsck(e, 0, &res, count_report, &rep);
      if (rc) {
        fprintf(stderr, "fsck beside reclaim: %s\n", kvt_strerror(rc));
        _exit(2);
      }
      runs++;
      checked += res.checked;
      bad += res.bad;
    } while (read(stop[0], &ch, 1) < 0 && errno == EAGAIN);
    kvt_engine_close(e);
    fprintf(stderr, "fsck beside reclaim: %llu runs, %llu entries checked, %llu bad\n",
           (unsigned long long)runs, (unsigned long long)checked, (unsigned long long)bad);
    _exit(bad ? 1 : 0);
  }
  close(go[1]);
  close(stop[0]);
  char ch;
  assert_int_equal(read(go[0], &ch, 1), 1); /* the reader is open */
  kvt_options o;
  opts(&o);
  o.tier_bytes_limit[KVT_TIER_COLD] = 4 * (uint64_t)SEG;
  kvt_engine *w = tu_open(dir, &o);
  assert_int_equal(write_blocks(w, 300000, 160), 0);
  kvt_stats st;
  tu_stats(w, &st);
  printf("writer: %llu segments reclaimed\n", (unsigned long long)st.cold_reclaims);
  assert_true(st.cold_reclaims > 10);
  kvt_engine_close(w);
  assert_int_equal(write(stop[1], "s", 1), 1);
  int wst;
  assert_int_equal(waitpid(pid, &wst, 0), pid);
  assert_true(WIFEXITED(wst));
  assert_int_equal(WEXITSTATUS(wst), 0);
  close(go[0]);
  close(stop[1]);
  tu_rmtree(dir);
}

/* ----------------------------------- creating a store on a full disk */

/* In a child with its own mount namespace (root, or a user namespace):
 * a 256 KiB tmpfs filled to the last byte, then a store created on it.
 * The open must fail with -ENOSPC; before LMDB's lock file was allocated
 * up front, writing its mapping killed the process with SIGBUS. Exit 77
 * when no file system can be mounted here. */
static int full_disk_child(const char *mnt) {
  if (unshare(CLONE_NEWNS) != 0 && unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return 77;
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return 77;
  if (mount("kvt-full", mnt, "tmpfs", 0, "size=256k") != 0) return 77;
  char path[256];
  snprintf(path, sizeof path, "%s/store", mnt);
  if (mkdir(path, 0755) != 0) return 2;
  snprintf(path, sizeof path, "%s/filler", mnt);
  int fd = open(path, O_CREAT | O_WRONLY, 0644);
  static char buf[4096];
  while (fd >= 0 && write(fd, buf, sizeof buf) > 0) {}
  while (fd >= 0 && write(fd, buf, 1) > 0) {} /* the last bytes too */
  snprintf(path, sizeof path, "%s/store", mnt);
  kvt_options o;
  opts(&o);
  kvt_engine *e = NULL;
  int rc = kvt_engine_open(path, &o, &e); /* SIGBUS here before the fix */
  fprintf(stderr, "full disk: open: %s\n", kvt_strerror(rc));
  kvt_engine_close(e);
  umount(mnt);
  return rc == -ENOSPC ? 0 : 1;
}

static void test_create_on_full_disk(void **state) {
  (void)state;
  char *mnt = tu_tmpdir(); /* the mount point; the mount is the child's alone */
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    signal(SIGBUS, SIG_DFL); /* not cmocka's handler: the parent sees the signal */
    _exit(full_disk_child(mnt));
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  tu_rmtree(mnt);
  if (WIFSIGNALED(st)) fprintf(stderr, "full disk: killed by signal %d\n", WTERMSIG(st));
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) {
    fprintf(stderr, "SKIP: cannot mount a small tmpfs here\n");
    tu_skip_mark();
    skip();
  }
  assert_int_equal(WEXITSTATUS(st), 0);
}

/* No descriptor left when the writer needs a new segment file: kvt_sync
 * reports -EMFILE, not a full tier (KVT_EFULL). In a child. */
static void test_emfile_is_not_full(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    struct rlimit rl = {64, 64};
    if (setrlimit(RLIMIT_NOFILE, &rl)) _exit(2);
    kvt_options o;
    opts(&o);
    kvt_engine *e = NULL;
    if (kvt_engine_open(dir, &o, &e)) _exit(2);
    while (dup(0) >= 0) {} /* every descriptor taken */
    int rc = write_blocks(e, 0, 4);
    fprintf(stderr, "no descriptors left: writing: %s\n", kvt_strerror(rc));
    kvt_engine_close(e);
    _exit(rc == -EMFILE ? 0 : 1);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  tu_rmtree(dir);
}

/* ------------------------------- fsck --repair on a directory, no store */

/* A writer opened with KVT_OPEN_NOCREATE (what fsck --repair does) on a
 * directory that holds no store is refused and creates nothing; so is
 * `kvtier fsck --repair` (exit 2) when KVTIER_BIN names the command. */
static void test_repair_not_a_store(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_options o;
  opts(&o);
  o.flags = KVT_OPEN_NOCREATE;
  kvt_engine *e = NULL;
  assert_int_equal(kvt_engine_open(dir, &o, &e), -ENOENT);
  char path[512];
  snprintf(path, sizeof path, "%s/index", dir);
  assert_int_equal(access(path, F_OK), -1);
  const char *bin = getenv("KVTIER_BIN");
  if (bin && *bin) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' fsck '%s' --repair >/dev/null 2>&1", bin, dir);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 2);
    assert_int_equal(access(path, F_OK), -1);
  }
  tu_rmtree(dir);
}

/* ------------------------ a reader that may not write index/lock.mdb */

/* In a child running as nobody: open dir read-only and check it. Exit 0
 * when the open's result is want (and, when 0, fsck finds no bad entry). */
static int nobody_reads(const char *dir, int want) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
    kvt_options o;
    opts(&o);
    o.flags = KVT_OPEN_RDONLY | KVT_OPEN_NOCREATE;
    kvt_engine *e = NULL;
    int rc = kvt_engine_open(dir, &o, &e);
    if (rc == -EACCES && access(dir, X_OK) != 0) _exit(77); /* $TMPDIR is closed to nobody */
    if (rc != want) fprintf(stderr, "reader as nobody: open: %s\n", kvt_strerror(rc));
    if (rc) _exit(rc == want ? 0 : 1);
    kvt_fsck_result res;
    rc = kvt_fsck(e, 0, &res, NULL, NULL);
    kvt_engine_close(e);
    _exit(!rc && res.checked > 0 && res.bad == 0 ? 0 : 1);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  return WEXITSTATUS(st);
}

/* stat and fsck of another user's store: the reader cannot register in
 * LMDB's lock file, so it takes a shared lock on the store instead; it
 * works while no writer runs and is refused (KVT_ELOCKED) while one does. */
static void test_reader_without_lock_access(void **state) {
  (void)state;
  if (getuid() != 0) {
    fprintf(stderr, "SKIP: needs root to read as another user\n");
    tu_skip_mark();
    skip();
  }
  char *dir = make_store(1);
  assert_int_equal(chmod(dir, 0755), 0);
  int rc = nobody_reads(dir, 0);
  if (rc == 77) {
    fprintf(stderr, "SKIP: user nobody cannot reach %s\n", dir);
    tu_rmtree(dir);
    tu_skip_mark();
    skip();
  }
  assert_int_equal(rc, 0);
  kvt_options o;
  opts(&o);
  kvt_engine *w = tu_open(dir, &o);
  assert_int_equal(nobody_reads(dir, KVT_ELOCKED), 0);
  kvt_engine_close(w);
  tu_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_segment_deleted),
      cmocka_unit_test(test_segment_is_directory),
      cmocka_unit_test(test_segment_dangling_symlink),
      cmocka_unit_test(test_segment_is_fifo),
      cmocka_unit_test(test_lock_file_replaced),
      cmocka_unit_test(test_lock_hint_attacks),
      cmocka_unit_test(test_more_segments_than_files),
      cmocka_unit_test(test_fsck_beside_reclaim),
      cmocka_unit_test(test_create_on_full_disk),
      cmocka_unit_test(test_emfile_is_not_full),
      cmocka_unit_test(test_repair_not_a_store),
      cmocka_unit_test(test_reader_without_lock_access),
  };
  return tu_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
