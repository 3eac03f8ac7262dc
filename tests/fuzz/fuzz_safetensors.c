/* fuzz_safetensors.c - libFuzzer target for the safetensors reader of
 * `kvtier import` (st_parse, tools/safetensors.c). Input: a whole file.
 * What must hold: 0 or -1 with a message; an accepted file's tensors,
 * sorted by offset, tile its data section exactly (no gap, overlap or
 * byte past the end), each range is its shape times its dtype's size,
 * names are distinct and NUL-terminated, and the header and data add up
 * to the file's size - so every range an importer reads is inside it. */
#include <stdio.h>
#include <string.h>

#include "safetensors.h"
#include "tests/fuzz/fuzz_cold.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_file(const st_file *f, size_t size) {
  FZ_CHECK(f->data_off == 8 + f->header_len && f->data_off + f->data_len == size);
  uint64_t at = 0;
  for (size_t i = 0; i < f->n; i++) {
    const st_tensor *t = &f->t[i];
    FZ_CHECK(memchr(t->name, 0, sizeof t->name) != NULL);
    FZ_CHECK(t->begin == at && t->begin <= t->end && t->end <= f->data_len);
    FZ_CHECK(t->n_dims <= ST_DIMS_MAX && t->elem_bytes >= 1 && t->elem_bytes <= 8);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) elems *= t->shape[d];
    FZ_CHECK(elems * t->elem_bytes == t->end - t->begin);
    FZ_CHECK(st_find(f, t->name) != NULL);
    for (size_t j = 0; j < i; j++) FZ_CHECK(strcmp(f->t[j].name, t->name) != 0);
    at = t->end;
  }
  FZ_CHECK(at == f->data_len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  st_file f;
  char err[512];
  err[0] = '\0';
  if (st_parse(data, size, &f, err, sizeof err) == 0) {
    check_file(&f, size);
    st_free(&f);
  } else {
    FZ_CHECK(err[0] != '\0' && memchr(err, 0, sizeof err) != NULL);
    FZ_CHECK(f.t == NULL && f.n == 0);
  }
  return 0;
}
