/* fixture.h - setup several tests repeated: a store another process left
 * behind (a sequence's blocks written durable to the cold tier), and the
 * kvtier binary run on the stories260K checkpoint with its JSON read back.
 * Linked into every test_*.c beside testutil.c; helpers assert with cmocka. */
#ifndef KVT_FIXTURE_H
#define KVT_FIXTURE_H

#include "testutil.h"

/* Into a store in dir with a cold tier (io backend `backend`, the
 * cold_util.h options): one sequence of namespace model appends the n
 * blocks of toks (block_tokens each) and puts every layer (tu_kv_fill with
 * salt); synced, every block asserted durable; the engine closed. */
void tf_write_durable(const char *dir, uint32_t backend, const kvt_shape *sh, const char *model,
                      uint64_t salt, const uint32_t *toks, uint32_t n);

/* Paths of the kvtier binary ($KVTIER_BIN) and of the stories260K
 * checkpoint ($KVTIER_DATA/models/, else beside $KVTIER_SRC), set by
 * tf_have_bin_model(): 1 when both are there. */
extern char tf_bin[2200], tf_model[2200];
int tf_have_bin_model(void);
/* Run `kvtier args` (stderr dropped), its stdout into out (cap bytes, NUL
 * terminated); returns the exit status, -1 when it did not exit. */
int tf_run(const char *args, char *out, size_t cap);
/* The number after "key": in a flat scan of JSON text; fails the test
 * when the key is missing. */
double tf_json_num(const char *js, const char *key);

#endif
