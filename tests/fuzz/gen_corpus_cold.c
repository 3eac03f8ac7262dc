/* gen_corpus_cold.c - writes the seed corpora of the durable-format fuzz
 * targets from what the real writers produce:
 *   fuzz_gen_corpus_cold DIR
 * A cold tier is written in a scratch directory (raw and byte-plane
 * slices, f32, f16 and bf16), and its LMDB block entries, record headers,
 * slice payloads and namespace encodings are copied out as inputs of
 * fuzz_cold_entry, fuzz_cold_header, fuzz_cold_payload and fuzz_ns, with
 * a few mutated copies (a byte flipped, one byte short, lengths pointing
 * past the record). Trace inputs (fuzz_plan_trace, fuzz_attn_trace) are
 * small hand-written files. Regenerate with
 *   cmake --build B --target fuzz_gen_corpus_cold && B/fuzz_gen_corpus_cold tests/fuzz/corpus */
#include <fcntl.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/key.h"
#include "codec/codec.h"
#include "kvtier.h"
#include "tests/fuzz/fuzz_cold.h"
#include "tiers/cold.h"
#include "tiers/cold_record.h"

static const char *g_out;
static int g_files;

static void out_file(const char *target, const char *name, const void *a, size_t na,
                     const void *b, size_t nb) {
  char path[2048];
  snprintf(path, sizeof path, "%s/%s", g_out, target);
  mkdir(g_out, 0755);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/%s/%s", g_out, target, name);
  FILE *f = fopen(path, "wb");
  if (!f) return;
  int ok = fwrite(a, 1, na, f) == na && (nb == 0 || fwrite(b, 1, nb, f) == nb);
  g_files += fclose(f) == 0 && ok;
}

static uint64_t g_rng = 0xC01DC0DEull;
static uint64_t rnd(void) {
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* K||V of one layer: smooth values, so the high byte planes compress. */
static void fill_layer(uint8_t *p, size_t n_bytes, uint32_t dtype) {
  size_t es = kvt_dtype_size(dtype), n = n_bytes / es;
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = (float)((int)(rnd() % 64) - 32) / 16.0f;
  kvt_from_f32(x, dtype, n, p);
  free(x);
}

/* Write a few records of each dtype into dir, compressed or not. */
static int write_store(const char *dir, int compress) {
  kvt_mem m;
  kvt_mem_init(&m, 0);
  kvt_cold_config cfg = {.dir = dir, .bytes_limit = 8u << 20, .segment_bytes = 1u << 20,
                         .map_bytes = 16u << 20, .group_bytes = 1u << 20, .compress = compress,
                         .zstd_level = 1};
  kvt_cold *c;
  int rc = kvt_cold_open(&m, &cfg, &c);
  if (rc) return rc;
  static const uint32_t dts[3] = {KVT_F32, KVT_F16, KVT_BF16};
  for (uint32_t d = 0; d < 3 && !rc; d++) {
    kvt_ns_desc nd = {.model_id = "fuzz-model", .weights_fingerprint = "sha256:seed",
                      .rope_theta = 10000.0, .rope_scaling = d == 1 ? "yarn" : NULL,
                      .tp_size = 1 + d, .tp_rank = d,
                      .shape = {2 + d, 2, 32, dts[d], 16}};
    kvt_key seed;
    kvt_ns_seed_of(&nd, &seed);
    uint8_t enc[KVT_NS_ENCODE_MAX];
    size_t len = kvt_ns_encode(&nd, enc, sizeof enc);
    rc = kvt_cold_ns_put(c, &seed, enc, len);
    uint32_t each = (uint32_t)kvt_shape_block_bytes(&nd.shape); /* K (= V) of one layer */
    uint8_t *buf[4];
    for (uint32_t l = 0; l < nd.shape.n_layers; l++) {
      buf[l] = malloc(2 * (size_t)each);
      fill_layer(buf[l], 2 * (size_t)each, dts[d]);
    }
    kvt_cold_rec r = {.pos = d, .n_layers = nd.shape.n_layers, .dtype = dts[d],
                      .bytes_each = each, .ns_seed = seed, .layers = (const uint8_t *const *)buf};
    memset(r.key.b, 0x10 * (d + 1) + compress, 16);
    memset(r.parent.b, d, 16);
    if (!rc) rc = kvt_cold_write(c, &r, 1, NULL);
    for (uint32_t l = 0; l < nd.shape.n_layers; l++) free(buf[l]);
  }
  kvt_cold_close(c);
  kvt_mem_fini(&m);
  return rc;
}

static uint8_t *read_at(const char *dir, uint32_t seg, uint64_t off, size_t len) {
  char path[2048];
  snprintf(path, sizeof path, "%s/segments/seg-%08u", dir, seg);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return NULL;
  uint8_t *b = malloc(len);
  if (b && pread(fd, b, len, (off_t)off) != (ssize_t)len) {
    free(b);
    b = NULL;
  }
  close(fd);
  return b;
}

/* The payload fuzz input: its prefix (fuzz_cold.h), then the bytes. */
static void out_payload(const char *name, const kvt_cold_slice *s, uint32_t dtype, uint32_t each,
                        int dz, const uint8_t *p, size_t len) {
  uint8_t pre[FZ_PAYLOAD_PREFIX];
  fz_payload_prefix(pre, s->codec, dtype, dz, each, s->raw_len);
  out_file("fuzz_cold_payload", name, pre, sizeof pre, p, len);
}

/* Copy out every entry, header and slice of the store in dir. */
static int harvest(const char *dir, const char *tag) {
  MDB_env *env;
  MDB_txn *t;
  MDB_dbi blocks, ns;
  MDB_cursor *cur;
  MDB_val k, v;
  char path[2048];
  snprintf(path, sizeof path, "%s/index", dir);
  if (mdb_env_create(&env) || mdb_env_set_maxdbs(env, 8) || mdb_env_open(env, path, MDB_RDONLY, 0644) ||
      mdb_txn_begin(env, NULL, MDB_RDONLY, &t) || mdb_dbi_open(t, "blocks", 0, &blocks) ||
      mdb_dbi_open(t, "ns", 0, &ns))
    return -1;
  int i = 0;
  mdb_cursor_open(t, ns, &cur);
  for (int op = MDB_FIRST; !mdb_cursor_get(cur, &k, &v, op); op = MDB_NEXT, i++) {
    char name[128];
    snprintf(name, sizeof name, "%s_ns%d", tag, i);
    out_file("fuzz_ns", name, v.mv_data, v.mv_size, NULL, 0);
    uint8_t *m = malloc(v.mv_size);
    memcpy(m, v.mv_data, v.mv_size);
    m[8 + 4] = '\0'; /* a NUL inside the model id */
    snprintf(name, sizeof name, "%s_ns%d_nul", tag, i);
    out_file("fuzz_ns", name, m, v.mv_size, NULL, 0);
    snprintf(name, sizeof name, "%s_ns%d_short", tag, i);
    out_file("fuzz_ns", name, v.mv_data, v.mv_size - 1, NULL, 0);
    free(m);
  }
  mdb_cursor_close(cur);
  mdb_cursor_open(t, blocks, &cur);
  i = 0;
  for (int op = MDB_FIRST; !mdb_cursor_get(cur, &k, &v, op); op = MDB_NEXT, i++) {
    kvt_cold_entry e;
    char name[128];
    if (k.mv_size != 16 || kvt_rec_entry_get((const kvt_key *)k.mv_data, v.mv_data, v.mv_size, &e))
      continue;
    uint8_t *ent = malloc(v.mv_size + FZ_KEY);
    memcpy(ent, k.mv_data, FZ_KEY); /* the entry input starts with its key */
    memcpy(ent + FZ_KEY, v.mv_data, v.mv_size);
    size_t elen = v.mv_size + FZ_KEY;
    snprintf(name, sizeof name, "%s_entry%d", tag, i);
    out_file("fuzz_cold_entry", name, ent, elen, NULL, 0);
    snprintf(name, sizeof name, "%s_entry%d_short", tag, i);
    out_file("fuzz_cold_entry", name, ent, elen - 1, NULL, 0);
    /* the last slice's stored length near 4 GiB: align4k of it wraps */
    uint8_t *last = ent + FZ_KEY + KVT_REC_ENTRY_FIXED + KVT_REC_SLICE * (e.n_layers - 1);
    uint8_t keep[4];
    memcpy(keep, last + 4, 4);
    memset(last + 4, 0xFF, 4);
    snprintf(name, sizeof name, "%s_entry%d_wrap", tag, i);
    out_file("fuzz_cold_entry", name, ent, elen, NULL, 0);
    memcpy(last + 4, keep, 4);
    last[1] ^= 0x10; /* the slice starts 1 MiB further: past the record */
    snprintf(name, sizeof name, "%s_entry%d_past", tag, i);
    out_file("fuzz_cold_entry", name, ent, elen, NULL, 0);
    free(ent);
    uint8_t *rec = read_at(dir, e.seg, e.offset, e.rec_len);
    if (!rec) continue;
    /* header inputs: a mode byte (1: the target fixes the checksum) */
    uint32_t hl = kvt_rec_header_len(e.n_layers);
    const uint8_t as_is = 0, fix = 1;
    snprintf(name, sizeof name, "%s_header%d", tag, i);
    out_file("fuzz_cold_header", name, &as_is, 1, rec, hl);
    rec[13] ^= 0x40; /* rec_len 16 MiB longer: the checksum fails */
    snprintf(name, sizeof name, "%s_header%d_flip", tag, i);
    out_file("fuzz_cold_header", name, &as_is, 1, rec, hl);
    snprintf(name, sizeof name, "%s_header%d_flip_fixed", tag, i); /* accepted */
    out_file("fuzz_cold_header", name, &fix, 1, rec, hl);
    rec[13] ^= 0x40;
    last = rec + KVT_REC_FIXED + KVT_REC_SLICE * (e.n_layers - 1);
    memcpy(keep, last + 4, 4);
    memset(last + 4, 0xFF, 4); /* the last slice's stored length wraps align4k */
    snprintf(name, sizeof name, "%s_header%d_wrap_fixed", tag, i);
    out_file("fuzz_cold_header", name, &fix, 1, rec, hl);
    memcpy(last + 4, keep, 4);
    rec[hl - 1] = 1; /* the zero padding is not */
    snprintf(name, sizeof name, "%s_header%d_pad_fixed", tag, i);
    out_file("fuzz_cold_header", name, &fix, 1, rec, hl);
    rec[hl - 1] = 0;
    snprintf(name, sizeof name, "%s_header%d_short", tag, i);
    out_file("fuzz_cold_header", name, &as_is, 1, rec, hl - 1);
    for (uint32_t l = 0; l < e.n_layers; l++) {
      kvt_cold_slice s;
      kvt_rec_slice_get((const uint8_t *)v.mv_data + KVT_REC_ENTRY_FIXED + KVT_REC_SLICE * l, &s);
      const uint8_t *p = rec + s.rel_off;
      snprintf(name, sizeof name, "%s_payload%d_l%u_c%u", tag, i, l, s.codec);
      out_payload(name, &s, e.dtype, e.bytes_each, 1, p, s.stored_len);
      if (l) continue;
      snprintf(name, sizeof name, "%s_payload%d_l%u_c%u_nodz", tag, i, l, s.codec);
      out_payload(name, &s, e.dtype, e.bytes_each, 0, p, s.stored_len);
      snprintf(name, sizeof name, "%s_payload%d_l%u_c%u_short", tag, i, l, s.codec);
      out_payload(name, &s, e.dtype, e.bytes_each, 1, p, s.stored_len - 1);
      if (s.codec == KVT_COLD_CODEC_PLANES) { /* a plane length one byte longer */
        uint8_t *m = malloc(s.stored_len);
        memcpy(m, p, s.stored_len);
        m[8 + 8 * (kvt_dtype_size(e.dtype) - 1)]++;
        snprintf(name, sizeof name, "%s_payload%d_l%u_c%u_planelen", tag, i, l, s.codec);
        out_payload(name, &s, e.dtype, e.bytes_each, 1, m, s.stored_len);
        free(m);
      }
    }
    free(rec);
  }
  mdb_cursor_close(cur);
  mdb_txn_abort(t);
  mdb_env_close(env);
  return 0;
}

/* Hand-made payloads for what the writer never makes: f16 planes whose
 * first (raw) plane is one byte long, without a zstd context; element size
 * 0 (an unknown dtype) with everything else zero. */
static void gen_payload_odd(void) {
  uint8_t p[24 + 9 + 8] = {0};
  kvt_cold_slice s = {.codec = KVT_COLD_CODEC_PLANES, .raw_len = 16};
  fz_put32(p, 2);
  fz_put32(p + 4, 8);
  fz_put32(p + 8, 9);
  fz_put32(p + 16, 8);
  out_payload("planes_rawlen_nodz", &s, KVT_F16, 8, 0, p, sizeof p);
  memset(p, 0, sizeof p);
  s.raw_len = 0;
  out_payload("esize0", &s, 0, 0, 1, p, 8);
}

static void out_text(const char *target, const char *name, const char *text) {
  out_file(target, name, text, strlen(text), NULL, 0);
}

/* Mooncake JSONL lines: valid, and each of the refusals plan_trace.c names. */
static void gen_plan_trace(void) {
  const char *t = "fuzz_plan_trace";
  out_text(t, "valid", "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 10, \"hash_ids\": [0, 1]}\n"
                       "\n"
                       "{\"timestamp\": 5.5, \"input_length\": 700, \"output_length\": 0, \"hash_ids\": [0, 2]}\r\n");
  out_text(t, "not_json", "{\"timestamp\": 0,\n");
  out_text(t, "not_object", "[1, 2]\n");
  out_text(t, "negative_ts", "{\"timestamp\": -1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n");
  out_text(t, "out_of_order", "{\"timestamp\": 9, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n"
                              "{\"timestamp\": 8, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n");
  out_text(t, "bad_id", "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1, -3]}\n");
  out_text(t, "empty_ids", "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}\n");
  out_text(t, "big_len", "{\"timestamp\": 0, \"input_length\": 4294967296, \"output_length\": 1, \"hash_ids\": [1]}\n");
  out_text(t, "blank", "\n \n");
}

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i); }

/* Attention traces (docs/trace-format.md): a header and two records. */
static void gen_attn_trace(void) {
  uint8_t b[128 + 2 * 16 + 3 * 16];
  memset(b, 0, sizeof b);
  memcpy(b, "KVTTRACE", 8);
  uint32_t hv[] = {1, 128, 2, 4, 2, 16, 16, 256, 3};
  for (int i = 0; i < 9; i++) put32(b + 8 + 4 * i, hv[i]);
  double share = 0.25;
  memcpy(b + 48, &share, 8);
  memcpy(b + 56, "stories260K", 11);
  uint8_t *r = b + 128;
  uint32_t rec1[] = {0, 40, 0, 2, 0, 0, 25, 0x3f800000, 1, 16, 9, 0x3f800000};
  for (int i = 0; i < 12; i++) put32(r + 4 * i, rec1[i]);
  r += 48;
  uint32_t rec2[] = {0, 40, 1, 1, 1, 16, 9, 0x40000000};
  for (int i = 0; i < 8; i++) put32(r + 4 * i, rec2[i]);
  const char *t = "fuzz_attn_trace";
  out_file(t, "valid", b, sizeof b, NULL, 0);
  out_file(t, "header_only", b, 128, NULL, 0);
  out_file(t, "truncated", b, sizeof b - 3, NULL, 0);
  put32(b + 128 + 12, 0x40000000); /* n_blocks past any trace */
  out_file(t, "huge_n_blocks", b, sizeof b, NULL, 0);
  put32(b + 128 + 12, 0);
  out_file(t, "zero_blocks", b, sizeof b, NULL, 0);
  b[0] = 'k';
  out_file(t, "bad_magic", b, sizeof b, NULL, 0);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  g_out = argv[1];
  char tmp[] = "/tmp/kvt-corpus-XXXXXX";
  if (!mkdtemp(tmp)) return 1;
  for (int compress = 0; compress < 2; compress++) {
    char dir[512], cmd[600];
    snprintf(dir, sizeof dir, "%s/store%d", tmp, compress);
    int rc = mkdir(dir, 0755) ? -1 : write_store(dir, compress);
    if (rc || harvest(dir, compress ? "z" : "raw")) {
      fprintf(stderr, "gen_corpus_cold: store %d: %s\n", compress, kvt_strerror(rc));
      return 1;
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) return 1;
  }
  rmdir(tmp);
  gen_payload_odd();
  gen_plan_trace();
  gen_attn_trace();
  fprintf(stderr, "gen_corpus_cold: %d files\n", g_files);
  return 0;
}
