/* replay.c - run a fuzz target over corpus files without libFuzzer, so any
 * compiler's build replays the corpus on every ctest. Arguments are files
 * or directories (their regular files, in name order). Each file is passed
 * in an allocation of exactly its size. Fails when nothing was replayed. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return -1;
  }
  size_t n = (size_t)st.st_size;
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf || fread(buf, 1, n, f) != n) {
    fclose(f);
    free(buf);
    return -1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv) {
  long done = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s: not found\n", argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      if (replay_file(argv[i]) != 0) return 1;
      done++;
      continue;
    }
    struct dirent **ents;
    int n = scandir(argv[i], &ents, NULL, by_name);
    if (n < 0) return 1;
    for (int j = 0; j < n; j++) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], ents[j]->d_name);
      if (ents[j]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        if (replay_file(path) != 0) return 1;
        done++;
      }
      free(ents[j]);
    }
    free(ents);
  }
  fprintf(stderr, "replay: %ld inputs, no failure\n", done);
  return done > 0 ? 0 : 1;
}
