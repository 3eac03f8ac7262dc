/* refcli.c - loading the reference model and its inputs for the commands
 * that run it (eval.c, warm.c, bench_refmodel.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refcli.h"
#include "util.h"

int ref_load_model(const char *cmd, const char *path, rm_model *m) {
  char err[1024];
  if (rm_model_load(path, m, err, sizeof err) == 0) return CLI_OK;
  fprintf(stderr, "kvtier %s: cannot load the model: %s\n", cmd, err);
  return CLI_FAIL;
}

int ref_load_tokenizer(const char *cmd, const char *path, const char *model_path,
                       const rm_model *m, rm_tokenizer *t) {
  char guess[PATH_MAX + 32], err[1024];
  if (!path) { /* tok<vocab>.bin beside the model */
    const char *slash = strrchr(model_path, '/');
    int dir_len = slash ? (int)(slash - model_path) : 1;
    snprintf(guess, sizeof guess, "%.*s/tok%d.bin", dir_len, slash ? model_path : ".",
             m->c.vocab_size);
    path = guess;
  }
  if (rm_tok_load(path, (uint32_t)m->c.vocab_size, t, err, sizeof err) == 0) return CLI_OK;
  fprintf(stderr, "kvtier %s: cannot load the tokenizer: %s%s\n", cmd, err,
          path == guess ? " (give it with --tokenizer)" : "");
  return CLI_FAIL;
}

int ref_codec_parse(const char *name, ref_codec *c) {
  *c = (ref_codec){0};
  if (kvt_codec_parse(name, &c->k, &c->v) == 0) {
    c->warm = 1;
    return 0;
  }
  for (int id = 1; kvt_codec_name(id); id++) {
    if (strcmp(kvt_codec_name(id), name) != 0) continue;
    if (name[0] == 'k') c->k = id;
    else c->v = id;
    c->warm = 1;
    return 0;
  }
  return -1;
}

void ref_free_tokens(uint32_t **seqs, uint32_t *lens, size_t n) {
  for (size_t i = 0; seqs && i < n; i++) free(seqs[i]);
  free(seqs);
  free(lens);
}

/* Parse one line of ids into out (max_len room): the count, or -1 with
 * why set. */
static long parse_line(char *line, uint32_t vocab, uint32_t max_len, uint32_t *out,
                       const char **why) {
  long n = 0;
  for (char *tok = strtok(line, " \t\r\n"); tok; tok = strtok(NULL, " \t\r\n")) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(tok, &end, 10);
    if (*end || errno || tok[0] == '-') return *why = "not a token id", -1;
    if (v >= vocab) return *why = "token id not below the vocabulary size", -1;
    if ((uint32_t)n >= max_len) return *why = "longer than the model's context", -1;
    out[n++] = (uint32_t)v;
  }
  return n;
}

int ref_read_tokens(const char *cmd, const char *path, uint32_t vocab, uint32_t max_len,
                    uint32_t ***seqs, uint32_t **lens, size_t *n) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "kvtier %s: %s: %s\n", cmd, path, strerror(errno));
    return CLI_FAIL;
  }
  char *line = NULL;
  size_t cap = 0, count = 0, room = 0, lineno = 0;
  uint32_t **s = NULL, *l = NULL, *buf = malloc(max_len * sizeof *buf);
  int rc = buf ? CLI_OK : CLI_FAIL;
  ssize_t len;
  while (rc == CLI_OK && (len = getline(&line, &cap, f)) > 0) {
    lineno++;
    const char *nul = memchr(line, 0, (size_t)len); /* would end the line early, unseen */
    if (nul) {
      fprintf(stderr, "kvtier %s: %s line %zu: a NUL byte at column %zu (token ids are text)\n",
              cmd, path, lineno, (size_t)(nul - line) + 1);
      rc = CLI_FAIL;
      break;
    }
    const char *why = NULL;
    long k = parse_line(line, vocab, max_len, buf, &why);
    if (k < 0) {
      fprintf(stderr, "kvtier %s: %s line %zu: %s\n", cmd, path, lineno, why);
      rc = CLI_FAIL;
      break;
    }
    if (k == 0) continue;
    if (count == room) {
      room = room ? room * 2 : 16;
      uint32_t **ns = realloc(s, room * sizeof *ns), *nl = ns ? realloc(l, room * sizeof *nl) : NULL;
      if (ns) s = ns;
      if (nl) l = nl;
      if (!ns || !nl) rc = CLI_FAIL;
    }
    if (rc == CLI_OK && !(s[count] = malloc((size_t)k * sizeof **s))) rc = CLI_FAIL;
    if (rc != CLI_OK) {
      fprintf(stderr, "kvtier %s: out of memory reading %s\n", cmd, path);
      break;
    }
    memcpy(s[count], buf, (size_t)k * sizeof *buf);
    l[count++] = (uint32_t)k;
  }
  free(line);
  free(buf);
  fclose(f);
  if (rc == CLI_OK && count == 0) {
    fprintf(stderr, "kvtier %s: %s holds no token sequence\n", cmd, path);
    rc = CLI_FAIL;
  }
  if (rc != CLI_OK) {
    ref_free_tokens(s, l, count);
    return rc;
  }
  *seqs = s;
  *lens = l;
  *n = count;
  return CLI_OK;
}
