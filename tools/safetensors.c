/* safetensors.c - the checks of safetensors.h: the header is one JSON
 * object, each tensor an object with a known "dtype", a "shape" of
 * non-negative integers and two "data_offsets" whose distance is exactly
 * the shape's bytes; tensors, sorted by offset, tile the data section
 * with no gap, overlap or trailing byte; duplicate names are refused. */
#include "safetensors.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int st_err(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int st_err(char *err, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && len) vsnprintf(err, len, fmt, ap);
  va_end(ap);
  return -1;
}

typedef struct dtype_row {
  const char *text;
  uint32_t bytes;
  st_dtype id;
} dtype_row;

static const dtype_row dtypes[] = {
    {"F32", 4, ST_F32},     {"F16", 2, ST_F16},    {"BF16", 2, ST_BF16},  {"F64", 8, ST_OTHER},
    {"I64", 8, ST_OTHER},   {"U64", 8, ST_OTHER},  {"I32", 4, ST_OTHER},  {"U32", 4, ST_OTHER},
    {"I16", 2, ST_OTHER},   {"U16", 2, ST_OTHER},  {"I8", 1, ST_OTHER},   {"U8", 1, ST_OTHER},
    {"BOOL", 1, ST_OTHER},  {"F8_E4M3", 1, ST_OTHER}, {"F8_E5M2", 1, ST_OTHER},
};

static const dtype_row *dtype_find(const char *text) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (!strcmp(dtypes[i].text, text)) return &dtypes[i];
  return NULL;
}

/* A JSON integer in [0, 2^63): 0 and *v, or -1. */
static int json_u64_get(const json_t *j, uint64_t *v) {
  if (!json_is_integer(j) || json_integer_value(j) < 0) return -1;
  *v = (uint64_t)json_integer_value(j);
  return 0;
}

static int metadata_check(const json_t *m, char *err, size_t err_len) {
  if (!json_is_object(m))
    return st_err(err, err_len, "header: \"__metadata__\" is not an object of strings");
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)m, k, v) {
    if (!json_is_string(v))
      return st_err(err, err_len, "header: \"__metadata__\" entry '%.64s' is not a string", k);
  }
  return 0;
}

/* One tensor entry into *t; data_len bounds its range. */
static int tensor_parse(const char *name, const json_t *o, uint64_t data_len, st_tensor *t,
                        char *err, size_t err_len) {
  memset(t, 0, sizeof *t);
  if (strlen(name) >= ST_NAME_MAX)
    return st_err(err, err_len, "header: a tensor name of %zu bytes (at most %u)", strlen(name),
                  ST_NAME_MAX - 1);
  snprintf(t->name, sizeof t->name, "%s", name);
  if (!json_is_object(o)) return st_err(err, err_len, "header: tensor '%s' is not an object", name);
  const json_t *dt = json_object_get(o, "dtype"), *sh = json_object_get(o, "shape"),
               *off = json_object_get(o, "data_offsets");
  if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off))
    return st_err(err, err_len, "header: tensor '%s' lacks a string \"dtype\", an array "
                  "\"shape\" or an array \"data_offsets\"", name);
  const dtype_row *row = dtype_find(json_string_value(dt));
  if (!row)
    return st_err(err, err_len, "header: tensor '%s' has dtype '%.32s', which safetensors does "
                  "not define", name, json_string_value(dt));
  snprintf(t->dtype_text, sizeof t->dtype_text, "%s", row->text);
  t->dtype = row->id;
  t->elem_bytes = row->bytes;
  if (json_array_size(sh) > ST_DIMS_MAX)
    return st_err(err, err_len, "header: tensor '%s' has %zu dimensions (at most %u)", name,
                  json_array_size(sh), ST_DIMS_MAX);
  t->n_dims = (uint32_t)json_array_size(sh);
  uint64_t elems = 1;
  for (uint32_t i = 0; i < t->n_dims; i++) {
    if (json_u64_get(json_array_get(sh, i), &t->shape[i]))
      return st_err(err, err_len, "header: tensor '%s': shape[%u] is not a non-negative "
                    "integer", name, i);
    if (t->shape[i] && elems > UINT64_MAX / t->shape[i])
      return st_err(err, err_len, "header: tensor '%s': its shape overflows 64 bits", name);
    elems *= t->shape[i];
  }
  if (json_array_size(off) != 2 || json_u64_get(json_array_get(off, 0), &t->begin) ||
      json_u64_get(json_array_get(off, 1), &t->end))
    return st_err(err, err_len, "header: tensor '%s': \"data_offsets\" is not two non-negative "
                  "integers", name);
  if (t->begin > t->end)
    return st_err(err, err_len, "header: tensor '%s': data_offsets [%llu, %llu] end before they "
                  "begin", name, (unsigned long long)t->begin, (unsigned long long)t->end);
  if (t->end > data_len)
    return st_err(err, err_len, "tensor '%s': data_offsets [%llu, %llu] reach past the end of "
                  "the file (%llu bytes of data after the header): truncated?", name,
                  (unsigned long long)t->begin, (unsigned long long)t->end,
                  (unsigned long long)data_len);
  if (elems > UINT64_MAX / row->bytes || elems * row->bytes != t->end - t->begin)
    return st_err(err, err_len, "header: tensor '%s': %llu bytes in data_offsets, but its shape "
                  "and dtype %s take %llu", name, (unsigned long long)(t->end - t->begin),
                  row->text, (unsigned long long)(elems * row->bytes));
  return 0;
}

static int by_offset(const void *a, const void *b) {
  const st_tensor *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

/* Sorted tensors tile [0, data_len) exactly. */
static int tiling_check(const st_file *f, uint64_t data_len, char *err, size_t err_len) {
  uint64_t at = 0;
  for (size_t i = 0; i < f->n; i++) {
    const st_tensor *t = &f->t[i];
    if (t->begin < at)
      return st_err(err, err_len, "header: tensor '%s' overlaps the tensor before it (bytes "
                    "%llu..%llu)", t->name, (unsigned long long)t->begin,
                    (unsigned long long)at);
    if (t->begin > at)
      return st_err(err, err_len, "header: %llu bytes before tensor '%s' belong to no tensor",
                    (unsigned long long)(t->begin - at), t->name);
    at = t->end;
  }
  if (at != data_len)
    return st_err(err, err_len, "the file holds %llu bytes after its last tensor (the header "
                  "covers %llu of %llu)", (unsigned long long)(data_len - at),
                  (unsigned long long)at, (unsigned long long)data_len);
  return 0;
}

int st_parse_header(const uint8_t *hdr, size_t hdr_len, uint64_t data_len, st_file *out,
                    char *err, size_t err_len) {
  memset(out, 0, sizeof *out);
  out->header_len = hdr_len;
  out->data_off = 8 + (uint64_t)hdr_len;
  out->data_len = data_len;
  json_error_t je;
  json_t *root = json_loadb((const char *)hdr, hdr_len, JSON_REJECT_DUPLICATES, &je);
  if (!root)
    return st_err(err, err_len, "header: not JSON: %s at byte %d", je.text, je.position);
  int rc = 0;
  if (!json_is_object(root)) rc = st_err(err, err_len, "header: not a JSON object");
  size_t n = rc ? 0 : json_object_size(root);
  if (!rc && n > ST_TENSORS_MAX)
    rc = st_err(err, err_len, "header: %zu entries (at most %u tensors)", n, ST_TENSORS_MAX);
  if (!rc && n && !(out->t = calloc(n, sizeof *out->t)))
    rc = st_err(err, err_len, "out of memory reading the header");
  const char *k;
  json_t *v;
  if (!rc) {
    json_object_foreach(root, k, v) {
      if (!strcmp(k, "__metadata__")) rc = metadata_check(v, err, err_len);
      else rc = tensor_parse(k, v, data_len, &out->t[out->n++], err, err_len);
      if (rc) break;
    }
  }
  json_decref(root);
  if (!rc) {
    if (out->n) qsort(out->t, out->n, sizeof *out->t, by_offset);
    rc = tiling_check(out, data_len, err, err_len);
  }
  if (rc) st_free(out);
  return rc;
}

int st_parse(const uint8_t *buf, size_t len, st_file *out, char *err, size_t err_len) {
  memset(out, 0, sizeof *out);
  if (len < 8)
    return st_err(err, err_len, "%zu bytes: shorter than the 8-byte header length", len);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | buf[i];
  if (n < 2 || n > ST_HEADER_MAX)
    return st_err(err, err_len, "the header length says %llu bytes (a header takes 2 .. %u)",
                  (unsigned long long)n, ST_HEADER_MAX);
  if (n > len - 8)
    return st_err(err, err_len, "truncated: the header length says %llu bytes, the file holds "
                  "%zu after it", (unsigned long long)n, len - 8);
  return st_parse_header(buf + 8, (size_t)n, len - 8 - n, out, err, err_len);
}

const st_tensor *st_find(const st_file *f, const char *name) {
  for (size_t i = 0; i < f->n; i++)
    if (!strcmp(f->t[i].name, name)) return &f->t[i];
  return NULL;
}

void st_free(st_file *f) {
  if (!f) return;
  free(f->t);
  f->t = NULL;
  f->n = 0;
}
