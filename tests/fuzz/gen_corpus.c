/* gen_corpus.c - writes the seed corpora of the codec fuzz targets:
 *   fuzz_gen_corpus DIR   writes DIR/fuzz_codec_k/ and DIR/fuzz_codec_v/
 * Each input is the 16-byte prefix of tests/fuzz/fuzz_codec.h followed by
 * a valid encoding of a few small shapes (deterministic data), and mutated
 * copies: a header byte flipped, one byte short, a scale or norm set to
 * +inf, a malformed code, an unknown codec id. Regenerate with
 *   cmake --build B --target fuzz_gen_corpus && B/fuzz_gen_corpus tests/fuzz/corpus */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvtier.h"

static uint64_t g_rng = 0x5EED5EED12345678ull;

static uint64_t rnd(void) {
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double gauss(void) {
  double u1 = ((double)(rnd() >> 11) + 0.5) * 0x1p-53, u2 = ((double)(rnd() >> 11) + 0.5) * 0x1p-53;
  return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

static void put16(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static int write_input(const char *dir, const char *name, uint8_t sel, uint8_t dt,
                       const kvt_codec_shape *s, const uint8_t *enc, size_t len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  uint8_t pre[16];
  pre[0] = sel;
  pre[1] = dt;
  put16(pre + 2, s->n_tokens);
  put16(pre + 4, s->n_heads);
  put16(pre + 6, s->head_dim);
  memcpy(pre + 8, &s->seed, 8);
  int ok = fwrite(pre, 1, 16, f) == 16 && fwrite(enc, 1, len, f) == len;
  return fclose(f) == 0 && ok ? 0 : -1;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  static const kvt_codec_shape shapes[] = {
      {1, 1, 8, 0, 11}, {4, 2, 16, 0, 22}, {3, 1, 12, 0, 33}, {2, 2, 96, 0, 44}, {2, 3, 7, 0, 55}};
  const char *fam[2] = {"fuzz_codec_k", "fuzz_codec_v"};
  int n_files = 0;
  for (int v = 0; v < 2; v++) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", argv[1], fam[v]);
    mkdir(argv[1], 0755);
    mkdir(dir, 0755);
    for (int ci = 0; ci < 3; ci++) {
      int codec = (v ? KVT_CODEC_V2 : KVT_CODEC_K8) + ci;
      for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const kvt_codec_shape *s = &shapes[si];
        size_t n = (size_t)s->n_tokens * s->n_heads * s->head_dim, len = kvt_codec_size(codec, s);
        float *x = malloc(n * 4);
        uint8_t *enc = malloc(len), *m = malloc(len);
        if (!x || !enc || !m) return 1;
        /* the last shape holds magnitudes past the f16 range of scales */
        double amp = si == 4 ? 1e6 : si == 1 ? 1e-3 : 1.0;
        for (size_t i = 0; i < n; i++) x[i] = (float)(gauss() * amp);
        if (kvt_codec_encode(codec, s, x, KVT_F32, enc, len) != (int64_t)len) return 1;
        char name[128];
        const char *cn = kvt_codec_name(codec);
        uint8_t sel = (uint8_t)ci;
        for (uint8_t dt = 0; dt < 3; dt++) { /* f32, f16, bf16 outputs */
          if (dt && si != 3 && si != 4) continue;
          snprintf(name, sizeof name, "%s_s%zu_valid_dt%u", cn, si, dt);
          n_files += write_input(dir, name, sel, dt, s, enc, len) == 0;
        }
        if (si == 2 || si == 4) goto next; /* mutations of three shapes */
        memcpy(m, enc, len);
        m[rnd() % 16] ^= (uint8_t)(1u << (rnd() % 8));
        snprintf(name, sizeof name, "%s_s%zu_header", cn, si);
        n_files += write_input(dir, name, sel, 0, s, m, len) == 0;
        snprintf(name, sizeof name, "%s_s%zu_short", cn, si);
        n_files += write_input(dir, name, sel, 1, s, enc, len - 1) == 0;
        memcpy(m, enc, len);
        put16(m + 16, 0x7C00);
        snprintf(name, sizeof name, "%s_s%zu_scale_inf", cn, si);
        n_files += write_input(dir, name, sel, 0, s, m, len) == 0;
        memcpy(m, enc, len);
        m[len - 1] = v ? (uint8_t)rnd() : 0x80; /* k8: -128; k4: a zero nibble */
        snprintf(name, sizeof name, "%s_s%zu_code", cn, si);
        n_files += write_input(dir, name, sel, 2, s, m, len) == 0;
        if (si == 0) { /* the other family's id, and an unknown one */
          snprintf(name, sizeof name, "%s_s%zu_id_other", cn, si);
          n_files += write_input(dir, name, (uint8_t)(0xF4 + (v ? KVT_CODEC_K8 : KVT_CODEC_V2)), 0,
                                 s, enc, len) == 0;
          snprintf(name, sizeof name, "%s_s%zu_id_unknown", cn, si);
          n_files += write_input(dir, name, 0xF4 + 7, 0, s, enc, len) == 0;
          snprintf(name, sizeof name, "%s_s%zu_id_self_raw", cn, si); /* its own id, raw */
          n_files += write_input(dir, name, (uint8_t)(0xF4 + codec), 0, s, enc, len) == 0;
        }
      next:
        free(x);
        free(enc);
        free(m);
      }
    }
  }
  fprintf(stderr, "gen_corpus: %d files\n", n_files);
  return 0;
}
