/* fuzz_codec.h - the oracle both codec fuzz targets share (one target per
 * decoder family: fuzz_codec_k.c, fuzz_codec_v.c). An input is a 16-byte
 * prefix naming the codec, output dtype, shape and seed, then the encoded
 * bytes to check and decode:
 *   [0]     codec: below 0xF0 the family's codec number b % 3; from 0xF0 a
 *           raw id b - 0xF4 (-4 .. 11: unknown ids and the other family's)
 *   [1]     output dtype 1 + b % 3 (f32, f16, bf16); 0xFF: dtype 0 (invalid)
 *   [2..7]  n_tokens, n_heads, head_dim: u16 little-endian, unchecked
 *   [8..15] rotation seed, u64 little-endian
 * What must hold (abort() otherwise, so libFuzzer and the replay report it):
 *  - kvt_codec_check returns 0 or KVT_ECORRUPT and never reads outside the
 *    input (which sits in an allocation of exactly its size);
 *  - refused: kvt_codec_decode refuses too and writes nothing;
 *  - accepted: the length is kvt_codec_size(); decode succeeds; f32 values
 *    are finite; the AVX2 and scalar kernels decode the same bytes; f16 and
 *    bf16 outputs are the f32 values rounded to nearest even (f16 saturating
 *    at +-65504, as kvtier.h says: never infinity); kvt_codec_k_dots
 *    and kvt_codec_v_accum + v_unrotate agree with the decoded tensor; and
 *    re-encoding the decoded tensor gives an encoding that passes the check. */
#ifndef KVT_FUZZ_CODEC_H
#define KVT_FUZZ_CODEC_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"
#include "kvtier.h"

#define FZ_PREFIX 16

static void fz_fail(const char *what, int codec, const kvt_codec_shape *s) {
  fprintf(stderr, "fuzz oracle: %s (codec %d, T=%u H=%u D=%u seed=%llu)\n", what, codec,
          s->n_tokens, s->n_heads, s->head_dim, (unsigned long long)s->seed);
  abort();
}
#define FZ_ASSERT(c)                                 \
  do {                                               \
    if (!(c)) fz_fail(#c, codec, &s);                \
  } while (0)

static uint16_t fz_rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static uint32_t fz_f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* f32 -> f16 round to nearest even, written for the oracle only. */
static uint16_t fz_to_f16(float f) {
  uint32_t x = fz_f2u(f), sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xFF, man = x & 0x7FFFFF;
  int e = (int)exp - 127 + 15;
  if (exp == 0xFF) return (uint16_t)(sign | 0x7C00 | (man ? 0x200 : 0));
  if (e >= 31) return (uint16_t)(sign | 0x7C00);
  uint32_t m = man | 0x800000, shift = e <= 0 ? (uint32_t)(14 - e) : 13, q, rem, mid;
  if (e <= 0 && 14 - e > 24) return (uint16_t)sign;
  if (e <= 0) {
    q = m >> shift;
    rem = m & ((1u << shift) - 1);
  } else {
    q = ((uint32_t)e << 10) | (man >> 13);
    rem = man & 0x1FFF;
  }
  mid = 1u << (shift - 1);
  q += rem > mid || (rem == mid && (q & 1));
  return (uint16_t)(sign | q);
}

static uint16_t fz_to_bf16(float f) {
  uint32_t x = fz_f2u(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((x >> 16) | 0x40);
  return (uint16_t)((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

static int fz_codec_id(uint8_t b, int value_family) {
  if (b >= 0xF0) return (int)b - 0xF4;
  return (value_family ? KVT_CODEC_V2 : KVT_CODEC_K8) + b % 3;
}

/* Decode at kernel level lvl (0 scalar, 1 AVX2) into out. */
static int fz_decode(int codec, const kvt_codec_shape *s, const uint8_t *in, size_t len, void *out,
                     uint32_t dt, int lvl) {
  kvt_codec_force(lvl);
  int rc = kvt_codec_decode(codec, s, in, len, out, dt);
  kvt_codec_force(-1);
  return rc;
}

static int fz_one(const uint8_t *data, size_t size, int value_family) {
  if (size < FZ_PREFIX) return 0;
  const int codec = fz_codec_id(data[0], value_family);
  const uint32_t dt = data[1] == 0xFF ? 0 : 1u + data[1] % 3;
  kvt_codec_shape s = {fz_rd16(data + 2), fz_rd16(data + 4), fz_rd16(data + 6), 0, 0};
  memcpy(&s.seed, data + 8, 8);
  const size_t len = size - FZ_PREFIX;
  /* the payload alone in an allocation of its size: any overread is caught */
  uint8_t *in = malloc(len ? len : 1);
  FZ_ASSERT(in != NULL);
  memcpy(in, data + FZ_PREFIX, len);
  const int rc = kvt_codec_check(codec, &s, in, len);
  FZ_ASSERT(rc == 0 || rc == KVT_ECORRUPT);
  if (rc) {
    uint8_t canary[64], out[64];
    memset(canary, 0xA5, sizeof canary);
    memcpy(out, canary, sizeof out);
    int d = kvt_codec_decode(codec, &s, in, len, out, dt);
    FZ_ASSERT(d == (dt ? KVT_ECORRUPT : KVT_EDTYPE));
    FZ_ASSERT(memcmp(out, canary, sizeof out) == 0);
    free(in);
    return 0;
  }
  const kvt_codec *c = kvt_codec_get(codec);
  FZ_ASSERT(c != NULL);
  FZ_ASSERT(len == kvt_codec_size(codec, &s));
  const uint32_t T = s.n_tokens, H = s.n_heads, D = s.head_dim;
  const size_t n = (size_t)T * H * D;
  float *x = malloc(n * 4), *x2 = malloc(n * 4);
  uint16_t *h = malloc(n * 2);
  FZ_ASSERT(x && x2 && h);
  FZ_ASSERT(kvt_codec_decode(codec, &s, in, len, x, KVT_F32) == 0);
  for (size_t i = 0; i < n; i++) FZ_ASSERT(isfinite(x[i]));
  if (kvt_codec_simd()) {
    FZ_ASSERT(fz_decode(codec, &s, in, len, x2, KVT_F32, 0) == 0);
    FZ_ASSERT(memcmp(x, x2, n * 4) == 0);
    FZ_ASSERT(fz_decode(codec, &s, in, len, x2, KVT_F32, 1) == 0);
    FZ_ASSERT(memcmp(x, x2, n * 4) == 0);
  }
  if (dt == 0) {
    FZ_ASSERT(kvt_codec_decode(codec, &s, in, len, h, 0) == KVT_EDTYPE);
  } else if (dt != KVT_F32) {
    for (int lvl = 0; lvl < 1 + kvt_codec_simd(); lvl++) {
      FZ_ASSERT(fz_decode(codec, &s, in, len, h, dt, lvl) == 0);
      for (size_t i = 0; i < n; i++) {
        uint16_t want = dt == KVT_F16 ? fz_to_f16(x[i]) : fz_to_bf16(x[i]);
        if (dt == KVT_F16 && (want & 0x7C00) == 0x7C00) /* beyond the f16 range: saturated */
          want = (uint16_t)((want & 0x8000) | 0x7BFF);
        FZ_ASSERT(h[i] == want);
      }
    }
  }
  /* attention on the encoded data against the decoded tensor (tolerances
   * as in tests/test_codec.c: float sums of at most T + log2(vdim) terms) */
  float q[KVT_MAX_HEAD_DIM], acc[KVT_MAX_HEAD_DIM], o[KVT_MAX_HEAD_DIM];
  float *p = malloc((size_t)T * 4), *sc = malloc((size_t)T * 4);
  FZ_ASSERT(p && sc);
  for (uint32_t d = 0; d < D; d++) q[d] = (float)((int)(d * 7 % 11) - 5) / 4.0f;
  for (uint32_t t = 0; t < T; t++) p[t] = (float)(1 + t % 3) / (2.0f * (float)T);
  for (uint32_t hh = 0; hh < H; hh += (H > 1 ? H - 1 : 1)) {
    if (!c->is_value) {
      kvt_codec_k_dots(codec, &s, in, hh, q, sc);
      for (uint32_t t = 0; t < T; t++) {
        double ref = 0, mag = 0;
        for (uint32_t d = 0; d < D; d++) {
          double v = (double)q[d] * x[((size_t)t * H + hh) * D + d];
          ref += v;
          mag += fabs(v);
        }
        FZ_ASSERT(isfinite(sc[t]) && fabs(sc[t] - ref) <= 1e-6 * (D + 2) * mag + 1e-30);
      }
    } else {
      memset(acc, 0, sizeof acc);
      kvt_codec_v_accum(codec, &s, in, hh, p, acc);
      kvt_codec_v_unrotate(&s, acc, o);
      /* every partial sum is bounded by sum_t p_t norm_t c_max (norms: f16
       * after the 16-byte header, one per (token, head)) */
      static const double cmax[5] = {0, 0, 1.5104, 2.1520, 2.7326};
      double mag = 0;
      for (uint32_t t = 0; t < T; t++) {
        uint16_t nb = fz_rd16(in + 16 + 2 * ((size_t)t * H + hh));
        float nf;
        kvt_to_f32(&nb, KVT_F16, 1, &nf);
        mag += p[t] * (double)nf * cmax[c->bits];
      }
      uint32_t vdim = kvt_codec_vdim(D);
      double tol = 4.0 * (T + log2((double)vdim) + 2) * 0x1p-24 * mag + 1e-30;
      for (uint32_t d = 0; d < D; d++) {
        double ref = 0;
        for (uint32_t t = 0; t < T; t++) ref += (double)p[t] * x[((size_t)t * H + hh) * D + d];
        FZ_ASSERT(isfinite(o[d]) && fabs(o[d] - ref) <= tol);
      }
    }
  }
  /* what decodes re-encodes to a valid payload of the same size */
  uint8_t *re = malloc(len);
  FZ_ASSERT(re != NULL);
  FZ_ASSERT(kvt_codec_encode(codec, &s, x, KVT_F32, re, len) == (int64_t)len);
  FZ_ASSERT(kvt_codec_check(codec, &s, re, len) == 0);
  free(re);
  free(p);
  free(sc);
  free(x);
  free(x2);
  free(h);
  free(in);
  return 0;
}

#endif
