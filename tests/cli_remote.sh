#!/usr/bin/env bash
# cli_remote.sh - the kvtier command with --remote on the ctest fixture's
# Redis Cluster (KVT_REDIS_PORT): a demo in one directory, a second demo in
# another that loads the first one's blocks from the cluster (remote hits,
# no checksum failure), stat listing the namespace it never registered,
# and a refused open whose messages do not contain the URL's password.
# Usage: cli_remote.sh <path-to-kvtier>. Exit 0 pass, 1 fail, 77 skip.
set -u

T=cli_remote
command -v redis-server >/dev/null || { echo "skip: redis-server not installed"; exit 77; }
. "$(dirname "$0")/cli_lib.sh"
URL="redis://127.0.0.1:${KVT_REDIS_PORT:-7100}"
SEED=$RANDOM$RANDOM

json() { # json NAME PYTHON: assertions on $TMP/NAME.out as d
  if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); exec(sys.argv[2])' \
     "$TMP/$1.out" "$2"; then pass "$1: JSON checks"; else fail "$1: JSON checks"; fi
}

if kvt_run demo_a 0 demo --dir "$TMP/a" --agents 1 --seed "$SEED" --remote "$URL" --json; then
  json demo_a 'r = d["remote"]; assert r["writes"] + r["write_exists"] > 0, r'
fi
if kvt_run demo_b 0 demo --dir "$TMP/b" --agents 1 --seed "$SEED" --remote "$URL" --json; then
  # a node slower than the deadline makes misses (timeouts), never errors
  json demo_b 'r = d["remote"]; assert r["hits"] + r["timeouts"] > 0, r; assert r["checksum_failures"] == 0, r; assert d["verified"], d'
fi
mkdir -p "$TMP/c"
if kvt_run stat_c 0 stat "$TMP/c" --remote "$URL" --json; then
  json stat_c 'assert any(n["model_id"].startswith("kvtier-demo") for n in d["namespaces"].values()), d; assert "remote" in d and d["remote"]["evictions_noticed"] == 0'
fi
if kvt_run refused 1 stat "$TMP/c" --remote "redis://kvt:Sekrit-$SEED@127.0.0.1:1"; then
  if grep -q "Sekrit" "$TMP/refused.out" "$TMP/refused.err"; then fail "refused: the password was printed"
  else pass "refused: no password in the messages"; fi
fi
[ "$FAILS" -eq 0 ] || exit 1
