/* tool_files.h - small files for the tests of the kvtier command: a tiny
 * llama2.c checkpoint and tokenizer built on the spot (no shared data),
 * and running the command with its output captured. Header-only (static
 * inline), for tests/test_tool_*.c. */
#ifndef KVT_TOOL_FILES_H
#define KVT_TOOL_FILES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* A llama2.c checkpoint: dim 8, hidden 16, 2 layers, 2 heads of 4, shared
 * classifier; weights small and deterministic. 0, or -1 when it cannot be
 * written. */
static inline int tf_write_model(const char *path, int32_t vocab, int32_t seq_len) {
  const int32_t dim = 8, hidden = 16, layers = 2, heads = 2, kv_heads = 2;
  int32_t hdr[7] = {dim, hidden, layers, heads, kv_heads, vocab, seq_len};
  size_t d = (size_t)dim, h = (size_t)hidden, L = (size_t)layers, hs = d / (size_t)heads;
  size_t kv = hs * (size_t)kv_heads, V = (size_t)vocab;
  size_t n = V * d + L * d * 2 + L * d * d * 2 + L * d * kv * 2 + L * h * d * 3 + d +
             (size_t)seq_len * hs;
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int rc = fwrite(hdr, sizeof hdr, 1, f) == 1 ? 0 : -1;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; !rc && i < n; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    float w = (float)((double)(x >> 40) / (double)(1ull << 24) - 0.5) * 0.5f;
    rc = fwrite(&w, sizeof w, 1, f) == 1 ? 0 : -1;
  }
  return fclose(f) || rc ? -1 : 0;
}

/* A llama2.c tokenizer: max length, then (score, length, bytes) a piece. */
static inline int tf_write_tokenizer(const char *path, const char *const *pieces,
                                     const float *scores, size_t n) {
  int32_t max_len = 1;
  for (size_t i = 0; i < n; i++)
    if ((int32_t)strlen(pieces[i]) > max_len) max_len = (int32_t)strlen(pieces[i]);
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int rc = fwrite(&max_len, 4, 1, f) == 1 ? 0 : -1;
  for (size_t i = 0; !rc && i < n; i++) {
    int32_t len = (int32_t)strlen(pieces[i]);
    if (fwrite(&scores[i], 4, 1, f) != 1 || fwrite(&len, 4, 1, f) != 1 ||
        fwrite(pieces[i], 1, (size_t)len, f) != (size_t)len)
      rc = -1;
  }
  return fclose(f) || rc ? -1 : 0;
}

/* Run a shell command; stdout and stderr together into out (NUL-ended,
 * truncated to cap). Returns the exit status, or -1 when it did not exit
 * (a signal: a crash). */
static inline int tf_run(const char *cmd, char *out, size_t cap) {
  char full[16400];
  if (snprintf(full, sizeof full, "%.16380s 2>&1", cmd) < 0) return -1;
  FILE *p = popen(full, "r");
  if (!p) return -1;
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  char sink[4096];
  while (fread(sink, 1, sizeof sink, p) > 0) {
  }
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A vocabulary of n pieces for tf_write_tokenizer: <unk>, BOS, EOS; the
 * 256 byte pieces <0x00>..<0xFF> (ids 3..258) when n >= 259 + 27; then
 * " ", "a".."z"; then fillers "p<i>". pieces holds n entries of 16 bytes. */
static inline void tf_vocab(char (*pieces)[16], const char **ptr, float *scores, size_t n) {
  size_t k = 0;
  const char *sp[3] = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int i = 0; i < 3 && k < n; i++) snprintf(pieces[k++], 16, "%s", sp[i]);
  if (n >= 259 + 27)
    for (int b = 0; b < 256; b++) snprintf(pieces[k++], 16, "<0x%02X>", b);
  if (k < n) snprintf(pieces[k++], 16, " ");
  for (char c = 'a'; c <= 'z' && k < n; c++) snprintf(pieces[k++], 16, "%c", c);
  for (size_t i = 0; k < n; i++) snprintf(pieces[k++], 16, "p%zu", i);
  for (size_t i = 0; i < n; i++) ptr[i] = pieces[i], scores[i] = 0;
}

/* The kvtier binary from $KVTIER_BIN, or NULL. */
static inline const char *tf_bin(void) {
  const char *b = getenv("KVTIER_BIN");
  return b && access(b, X_OK) == 0 ? b : NULL;
}

#endif
