/* safetensors.h - a reader of safetensors files for `kvtier import`: an
 * 8-byte little-endian header length, a JSON header (parsed with jansson)
 * naming each tensor's dtype, shape and byte range, then the raw
 * little-endian tensors. Every field is checked before any byte of data
 * is used: a file that does not parse, names a range outside itself,
 * overlaps or leaves holes between tensors, or is shorter than its header
 * says is refused with a message saying where. No kvtier API here. */
#ifndef KVT_TOOLS_SAFETENSORS_H
#define KVT_TOOLS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_HEADER_MAX (100u << 20) /* bytes of JSON header, at most (as the format's own reader) */
#define ST_TENSORS_MAX 65536u      /* tensors in one file */
#define ST_DIMS_MAX 8u
#define ST_NAME_MAX 256u

/* The dtypes kvtier stores; others parse (and are sized) but are named
 * ST_OTHER. */
typedef enum st_dtype { ST_OTHER = 0, ST_F32 = 1, ST_F16 = 2, ST_BF16 = 3 } st_dtype;

typedef struct st_tensor {
  char name[ST_NAME_MAX];
  char dtype_text[16];         /* as the header writes it: "F16", "I64", ... */
  st_dtype dtype;
  uint32_t elem_bytes;
  uint32_t n_dims;
  uint64_t shape[ST_DIMS_MAX];
  uint64_t begin, end;         /* byte range in the data section */
} st_tensor;

typedef struct st_file {
  uint64_t header_len;         /* bytes of JSON */
  uint64_t data_off;           /* 8 + header_len: where the data section starts */
  uint64_t data_len;           /* bytes of data the file holds after the header */
  st_tensor *t;                /* [n], sorted by begin */
  size_t n;
} st_file;

/* Parse a header: hdr[0..hdr_len) is the JSON text, data_len the bytes
 * that follow it in the file. Fills *out (st_free() it); 0, or -1 with a
 * message in err (what and where). Pure: no I/O, for the fuzz target. */
int st_parse_header(const uint8_t *hdr, size_t hdr_len, uint64_t data_len, st_file *out,
                    char *err, size_t err_len);

/* Parse a whole file image buf[0..len): length prefix, header, data. */
int st_parse(const uint8_t *buf, size_t len, st_file *out, char *err, size_t err_len);

/* The tensor called name, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);

void st_free(st_file *f);

#endif
