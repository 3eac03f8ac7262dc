/* shape.c - dtypes and values (shape.h): element sizes, the bytes of one
 * layer block, and the finiteness check on put. Depends on nothing of
 * kvtier's but the public types. */
#include <string.h>

#include "base/shape.h"
#include "kvtier.h"

size_t kvt_dtype_size(uint32_t dtype) {
  switch (dtype) {
  case KVT_F32: return 4;
  case KVT_F16:
  case KVT_BF16: return 2;
  default: return 0;
  }
}

size_t kvt_shape_block_bytes(const kvt_shape *s) {
  if (!s) return 0;
  return (size_t)s->block_tokens * s->n_kv_heads * s->head_dim * kvt_dtype_size(s->dtype);
}

/* Non-finite means an all-ones exponent. Four f16/bf16 (two f32) lanes of
 * a 64-bit word at a time: (x & exp) + exp_lsb carries into the lane's top
 * bit exactly when every exponent bit is set; no carry crosses lanes. */
static int any_allones(const void *data, size_t bytes, uint64_t exp, uint64_t lsb, uint64_t top) {
  const uint8_t *p = data;
  uint64_t bad = 0, w;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    memcpy(&w, p + i, 8);
    bad |= ((w & exp) + lsb) & top;
  }
  if (i < bytes) { /* a tail of 2, 4 or 6 bytes: zero-padded lanes are finite */
    w = 0;
    memcpy(&w, p + i, bytes - i);
    bad |= ((w & exp) + lsb) & top;
  }
  return bad != 0;
}

int kvt_finite_check(const void *data, size_t n, uint32_t dtype) {
  int bad;
  if (dtype == KVT_F32)
    bad = any_allones(data, n * 4, 0x7F8000007F800000ull, 0x0080000000800000ull, 0x8000000080000000ull);
  else if (dtype == KVT_F16)
    bad = any_allones(data, n * 2, 0x7C007C007C007C00ull, 0x0400040004000400ull, 0x8000800080008000ull);
  else
    bad = any_allones(data, n * 2, 0x7F807F807F807F80ull, 0x0080008000800080ull, 0x8000800080008000ull);
  return bad ? KVT_ENONFINITE : 0;
}
