/* test_lock.c - one writer per store: a second writer, in this process or
 * another, gets KVT_ELOCKED; read-only opens work beside the writer; a
 * writer killed with SIGKILL leaves no stale lock behind. */
#include "testutil.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Open and close dir; the open's return code, or -99999 when a failed
 * open left *out set. */
static int open_rc(const char *dir, uint32_t flags) {
  static char not_engine;
  kvt_options o;
  kvt_engine *e = (kvt_engine *)(void *)&not_engine;
  kvt_options_init(&o);
  o.flags = flags;
  int rc = kvt_engine_open(dir, &o, &e);
  if (rc == 0) kvt_engine_close(e);
  else if (e) return -99999;
  return rc;
}

/* A writer that stores one block and checks it reads back. */
static void use_writer(kvt_engine *e) {
  kvt_shape sh = tu_shape_small(KVT_F32);
  kvt_ns_id ns = tu_register(e, "lock-model", &sh);
  uint32_t tok[4] = {1, 2, 3, 4};
  tu_kv kv;
  kvt_seq *s;
  tu_kv_alloc(&kv, &sh);
  assert_int_equal(kvt_seq_create(e, ns, &s), 0);
  tu_append_put(s, &sh, 3, tok, &kv);
  tu_assert_gather(s, &sh, 3, tok, 1);
  kvt_seq_release(s);
  tu_kv_free(&kv);
}

static void test_second_open_in_process(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_engine *w = tu_open(dir, NULL);
  assert_int_equal(open_rc(dir, 0), KVT_ELOCKED);
  assert_int_equal(open_rc(dir, KVT_OPEN_RDONLY), 0);
  assert_int_equal(open_rc(dir, KVT_OPEN_NOCREATE), KVT_ELOCKED);
  use_writer(w); /* the refused opens did not disturb the writer */
  kvt_engine_close(w);
  w = tu_open(dir, NULL);
  kvt_engine_close(w);
  tu_rmtree(dir);
}

/* Exit status of a child that opens dir: 0 when the results were
 * ELOCKED for a writer and success read-only. No cmocka in the child. */
static int child_status(const char *dir) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int w = open_rc(dir, 0), r = open_rc(dir, KVT_OPEN_RDONLY);
    _exit(w == KVT_ELOCKED && r == 0 ? 0 : 1);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  return WEXITSTATUS(st);
}

static void test_second_writer_in_child(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  kvt_engine *w = tu_open(dir, NULL);
  assert_int_equal(child_status(dir), 0);
  use_writer(w);
  kvt_engine_close(w);
  assert_int_not_equal(child_status(dir), 0); /* no writer now: the open succeeds */
  tu_rmtree(dir);
}

/* A child opens the store, stores a block, says so, and waits to die. */
static pid_t spawn_writer(const char *dir) {
  int fd[2];
  char c = 0;
  assert_int_equal(pipe(fd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    kvt_engine *e = NULL;
    close(fd[0]);
    c = kvt_engine_open(dir, NULL, &e) == 0 ? 'W' : 'E';
    if (write(fd[1], &c, 1) != 1) _exit(2);
    alarm(60); /* never outlive a parent that failed before its kill */
    for (;;) pause();
  }
  close(fd[1]);
  ssize_t n = read(fd[0], &c, 1);
  close(fd[0]);
  assert_int_equal(n, 1);
  assert_int_equal(c, 'W');
  return pid;
}

static void test_killed_writer_leaves_no_lock(void **state) {
  (void)state;
  char *dir = tu_tmpdir();
  int rounds = tu_stress() ? 50 : 4;
  for (int i = 0; i < rounds; i++) {
    pid_t pid = spawn_writer(dir);
    int st;
    assert_int_equal(open_rc(dir, 0), KVT_ELOCKED);
    assert_int_equal(open_rc(dir, KVT_OPEN_RDONLY), 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    kvt_engine *w = tu_open(dir, NULL);
    use_writer(w);
    kvt_engine_close(w);
  }
  tu_rmtree(dir);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_second_open_in_process),
      cmocka_unit_test(test_second_writer_in_child),
      cmocka_unit_test(test_killed_writer_leaves_no_lock),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
