/* prom_check.h - a checker of the Prometheus text exposition format (0.0.4)
 * for the tests, used where promtool is not installed and beside it where
 * it is: the line grammar (names, labels with escapes, values), HELP and
 * TYPE once per family and TYPE before its samples, a family's samples
 * together, no series twice, counters named _total and never negative,
 * and every histogram's buckets with increasing `le`, non-decreasing
 * counts, ending in +Inf equal to its _count, with a _sum. Header-only. */
#ifndef KVT_PROM_CHECK_H
#define KVT_PROM_CHECK_H

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PC_FAMILIES 512
#define PC_SERIES 8192
#define PC_NAME 128
#define PC_LABELS 512 /* a series' labels, canonical text */

typedef struct pc_family {
  char name[PC_NAME];
  char type[16];
  int help, typed, sampled, closed;
} pc_family;

typedef struct pc_series {
  char key[PC_NAME + PC_LABELS + 80]; /* name{labels,le=...}, labels sorted */
} pc_series;

/* A histogram's buckets of one label set (le left out), in order. */
typedef struct pc_hist {
  char fam[PC_NAME];
  char labels[PC_LABELS];
  double last_le, last_count, inf_count, count;
  int n_buckets, has_inf, has_count, has_sum;
} pc_hist;

typedef struct pc_state {
  pc_family fam[PC_FAMILIES];
  size_t n_fam;
  pc_series *ser;              /* [PC_SERIES] */
  size_t n_ser;
  pc_hist hist[PC_FAMILIES];
  size_t n_hist;
  int cur;                     /* family whose samples come now, -1 none */
  char err[512];
  size_t samples;
} pc_state;

static inline int pc_fail(pc_state *s, size_t line, const char *fmt, const char *a) {
  char what[400];
  snprintf(what, sizeof what, fmt, a);
  snprintf(s->err, sizeof s->err, "line %zu: %s", line, what);
  return -1;
}

static inline int pc_name_ok(const char *p, size_t n, int metric) {
  if (n == 0 || n >= PC_NAME) return 0;
  for (size_t i = 0; i < n; i++) {
    int c = (unsigned char)p[i];
    int ok = isalpha(c) || c == '_' || (metric && c == ':') || (i > 0 && isdigit(c));
    if (!ok) return 0;
  }
  return 1;
}

/* A sample value as Go's ParseFloat takes it (and Prometheus' Inf/NaN). */
static inline int pc_value(const char *p, double *v) {
  if (!strcmp(p, "+Inf") || !strcmp(p, "Inf")) return *v = INFINITY, 1;
  if (!strcmp(p, "-Inf")) return *v = -INFINITY, 1;
  if (!strcmp(p, "NaN")) return *v = NAN, 1;
  if (!*p) return 0;
  for (const char *q = p; *q; q++)
    if (!isdigit((unsigned char)*q) && !strchr("+-.eE", *q)) return 0;
  char *end;
  *v = strtod(p, &end);
  return *end == '\0';
}

static inline pc_family *pc_find(pc_state *s, const char *name) {
  for (size_t i = 0; i < s->n_fam; i++)
    if (!strcmp(s->fam[i].name, name)) return &s->fam[i];
  return NULL;
}

static inline pc_family *pc_get(pc_state *s, const char *name) {
  pc_family *f = pc_find(s, name);
  if (f || s->n_fam == PC_FAMILIES) return f;
  f = &s->fam[s->n_fam++];
  memset(f, 0, sizeof *f);
  snprintf(f->name, sizeof f->name, "%s", name);
  return f;
}

static inline int pc_comment(pc_state *s, size_t ln, char *line) {
  char kw[8], name[PC_NAME + 1];
  int off = 0;
  if (sscanf(line, "# %7s %128s %n", kw, name, &off) < 2 ||
      (strcmp(kw, "HELP") && strcmp(kw, "TYPE")))
    return 0; /* a plain comment */
  if (line[2 + strlen(kw)] != ' ' || !pc_name_ok(name, strlen(name), 1))
    return pc_fail(s, ln, "bad %.300s line", kw);
  pc_family *f = pc_get(s, name);
  if (!f) return pc_fail(s, ln, "%.300s", "too many families");
  if (f->sampled) return pc_fail(s, ln, "%.300s after the family's samples", kw);
  if (!strcmp(kw, "HELP")) {
    if (f->help++) return pc_fail(s, ln, "second HELP for %.300s", name);
    return 0;
  }
  const char *type = line + off;
  static const char *const types[] = {"counter", "gauge", "histogram", "summary", "untyped"};
  int known = 0;
  for (size_t i = 0; i < 5; i++) known |= !strcmp(type, types[i]);
  if (!known) return pc_fail(s, ln, "unknown type '%.300s'", type);
  if (f->typed++) return pc_fail(s, ln, "second TYPE for %.300s", name);
  snprintf(f->type, sizeof f->type, "%s", type);
  if (!strcmp(type, "counter") && (strlen(name) < 6 || strcmp(name + strlen(name) - 6, "_total")))
    return pc_fail(s, ln, "counter %.300s does not end in _total", name);
  return 0;
}

/* Labels {a="x",b="y"} at *pp into sorted canonical text; le returned apart. */
static inline int pc_labels(pc_state *s, size_t ln, const char **pp, char *out, size_t cap,
                            char *le, size_t le_cap) {
  char names[32][64], vals[32][256];
  int n = 0;
  const char *p = *pp;
  *out = '\0';
  *le = '\0';
  if (*p != '{') return 0;
  p++;
  while (*p != '}') {
    if (n == 32) return pc_fail(s, ln, "%.300s", "too many labels");
    size_t k = 0;
    while (p[k] && p[k] != '=') k++;
    if (!pc_name_ok(p, k, 0) || k >= 64) return pc_fail(s, ln, "%.300s", "bad label name");
    memcpy(names[n], p, k);
    names[n][k] = '\0';
    p += k + 1;
    if (*p++ != '"') return pc_fail(s, ln, "%.300s", "label value not quoted");
    size_t v = 0;
    for (; *p && *p != '"'; p++) {
      if (*p == '\\') {
        p++;
        if (*p != '\\' && *p != '"' && *p != 'n') return pc_fail(s, ln, "%.300s", "bad escape");
      }
      if (v + 1 >= 256) return pc_fail(s, ln, "%.300s", "label value too long");
      vals[n][v++] = *p;
    }
    vals[n][v] = '\0';
    if (*p++ != '"') return pc_fail(s, ln, "%.300s", "unterminated label value");
    for (int i = 0; i < n; i++)
      if (!strcmp(names[i], names[n])) return pc_fail(s, ln, "label %.60s twice", names[n]);
    n++;
    if (*p == ',') p++;
    else if (*p != '}') return pc_fail(s, ln, "%.300s", "expected , or } after a label");
  }
  *pp = p + 1;
  for (int i = 0; i < n; i++) /* insertion sort by name */
    for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
      char tn[64], tv[256];
      memcpy(tn, names[j], 64), memcpy(names[j], names[j - 1], 64), memcpy(names[j - 1], tn, 64);
      memcpy(tv, vals[j], 256), memcpy(vals[j], vals[j - 1], 256), memcpy(vals[j - 1], tv, 256);
    }
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    if (!strcmp(names[i], "le")) {
      snprintf(le, le_cap, "%.63s", vals[i]);
      continue;
    }
    int w = snprintf(out + used, cap - used, "%s%s=\"%s\"", used ? "," : "", names[i], vals[i]);
    if (w < 0 || (size_t)w >= cap - used) return pc_fail(s, ln, "%.300s", "labels too long");
    used += (size_t)w;
  }
  return 0;
}

static inline pc_hist *pc_hist_get(pc_state *s, const char *fam, const char *labels) {
  for (size_t i = 0; i < s->n_hist; i++)
    if (!strcmp(s->hist[i].fam, fam) && !strcmp(s->hist[i].labels, labels)) return &s->hist[i];
  if (s->n_hist == PC_FAMILIES) return NULL;
  pc_hist *h = &s->hist[s->n_hist++];
  memset(h, 0, sizeof *h);
  snprintf(h->fam, sizeof h->fam, "%s", fam);
  snprintf(h->labels, sizeof h->labels, "%s", labels);
  h->last_le = -INFINITY;
  return h;
}

/* Which family a sample name belongs to, and its histogram suffix (0 none,
 * 1 _bucket, 2 _sum, 3 _count). */
static inline pc_family *pc_owner(pc_state *s, const char *name, int *suffix) {
  static const char *const sfx[] = {"_bucket", "_sum", "_count"};
  *suffix = 0;
  pc_family *f = pc_find(s, name);
  if (f && f->typed && strcmp(f->type, "histogram") && strcmp(f->type, "summary")) return f;
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(name), k = strlen(sfx[i]);
    if (n <= k || strcmp(name + n - k, sfx[i])) continue;
    char base[PC_NAME];
    snprintf(base, sizeof base, "%.*s", (int)(n - k), name);
    pc_family *b = pc_find(s, base);
    if (b && !strcmp(b->type, "histogram")) {
      *suffix = i + 1;
      return b;
    }
  }
  return f;
}

static inline int pc_sample(pc_state *s, size_t ln, const char *line) {
  const char *p = line;
  size_t k = 0;
  while (p[k] && p[k] != '{' && p[k] != ' ') k++;
  char name[PC_NAME];
  if (!pc_name_ok(p, k, 1)) return pc_fail(s, ln, "%.300s", "bad metric name");
  memcpy(name, p, k);
  name[k] = '\0';
  p += k;
  char labels[PC_LABELS], le[64];
  if (pc_labels(s, ln, &p, labels, sizeof labels, le, sizeof le)) return -1;
  if (*p++ != ' ') return pc_fail(s, ln, "%.300s", "no space before the value");
  char val[64];
  size_t vn = 0;
  while (*p && *p != ' ' && vn + 1 < sizeof val) val[vn++] = *p++;
  val[vn] = '\0';
  double v;
  if (!pc_value(val, &v)) return pc_fail(s, ln, "bad value '%.300s'", val);
  if (*p == ' ') { /* a timestamp: an integer */
    p++;
    if (*p == '-') p++;
    if (!*p) return pc_fail(s, ln, "%.300s", "empty timestamp");
    for (; *p; p++)
      if (!isdigit((unsigned char)*p)) return pc_fail(s, ln, "%.300s", "bad timestamp");
  }
  int suffix;
  pc_family *f = pc_owner(s, name, &suffix);
  if (!f || !f->typed) return pc_fail(s, ln, "sample %.300s before its TYPE line", name);
  if (!f->help) return pc_fail(s, ln, "family %.300s has no HELP", f->name);
  int idx = (int)(f - s->fam);
  if (f->closed) return pc_fail(s, ln, "samples of %.300s are not together", f->name);
  if (s->cur >= 0 && s->cur != idx) s->fam[s->cur].closed = 1;
  s->cur = idx;
  f->sampled = 1;
  s->samples++;
  char key[PC_NAME + PC_LABELS + 80];
  snprintf(key, sizeof key, "%s{%s%s%s}", name, labels, le[0] ? ",le=" : "", le);
  for (size_t i = 0; i < s->n_ser; i++)
    if (!strcmp(s->ser[i].key, key)) return pc_fail(s, ln, "series %.300s twice", key);
  if (s->n_ser == PC_SERIES) return pc_fail(s, ln, "%.300s", "too many series");
  snprintf(s->ser[s->n_ser++].key, sizeof s->ser[0].key, "%s", key);
  if (!strcmp(f->type, "counter") && !(v >= 0)) return pc_fail(s, ln, "counter %.300s < 0", name);
  if (strcmp(f->type, "histogram")) return 0;
  if (suffix == 0) return pc_fail(s, ln, "histogram sample %.300s without a suffix", name);
  pc_hist *h = pc_hist_get(s, f->name, labels);
  if (!h) return pc_fail(s, ln, "%.300s", "too many histograms");
  if (suffix == 1) {
    double b;
    if (!le[0] || !pc_value(le, &b)) return pc_fail(s, ln, "bucket without a valid le: %.300s", key);
    if (h->has_inf || h->has_count || h->has_sum)
      return pc_fail(s, ln, "bucket of %.300s after its +Inf, _sum or _count", f->name);
    if (!(b > h->last_le)) return pc_fail(s, ln, "le not increasing: %.300s", key);
    if (v < h->last_count) return pc_fail(s, ln, "bucket count decreases: %.300s", key);
    h->last_le = b;
    h->last_count = v;
    h->n_buckets++;
    if (isinf(b)) {
      h->has_inf = 1;
      h->inf_count = v;
    }
  } else if (le[0]) {
    return pc_fail(s, ln, "le on a non-bucket sample %.300s", name);
  } else if (suffix == 2) {
    h->has_sum = 1;
  } else {
    h->has_count = 1;
    h->count = v;
  }
  return 0;
}

/* 0 when text is valid; else -1 with s->err saying where and why. */
static inline int pc_check(pc_state *s, const char *text) {
  memset(s, 0, sizeof *s);
  s->cur = -1;
  s->ser = calloc(PC_SERIES, sizeof *s->ser);
  if (!s->ser) return snprintf(s->err, sizeof s->err, "out of memory"), -1;
  size_t ln = 0;
  int rc = 0;
  const char *p = text;
  if (!*p) rc = pc_fail(s, 0, "%s", "empty text");
  while (!rc && *p) {
    ln++;
    const char *nl = strchr(p, '\n');
    if (!nl) {
      rc = pc_fail(s, ln, "%.300s", "last line does not end in a newline");
      break;
    }
    char line[2048];
    if ((size_t)(nl - p) >= sizeof line) {
      rc = pc_fail(s, ln, "%.300s", "line too long");
      break;
    }
    memcpy(line, p, (size_t)(nl - p));
    line[nl - p] = '\0';
    if (!line[0]) rc = pc_fail(s, ln, "%.300s", "empty line");
    else if (line[0] == '#') rc = pc_comment(s, ln, line);
    else rc = pc_sample(s, ln, line);
    p = nl + 1;
  }
  for (size_t i = 0; !rc && i < s->n_hist; i++) {
    pc_hist *h = &s->hist[i];
    if (!h->has_inf || !h->has_count || !h->has_sum)
      rc = pc_fail(s, ln, "histogram %.300s lacks its +Inf bucket, _sum or _count", h->fam);
    else if (h->inf_count != h->count)
      rc = pc_fail(s, ln, "histogram %.300s: +Inf bucket differs from _count", h->fam);
  }
  for (size_t i = 0; !rc && i < s->n_fam; i++)
    if (!s->fam[i].sampled) rc = pc_fail(s, ln, "family %.300s has no sample", s->fam[i].name);
  free(s->ser);
  s->ser = NULL;
  return rc;
}

#endif
