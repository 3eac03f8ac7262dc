#!/usr/bin/env bash
# cli_rebuild.sh - `kvtier fsck --rebuild-index` end to end: a demo store
# whose index is deleted, then overwritten with garbage; stat and fsck say
# the index is the problem and how to rebuild it; the rebuild brings back
# every block (fsck clean, a second demo run finds everything by lookup).
# Usage: cli_rebuild.sh <path-to-kvtier>. Exit 0 when every check passes.
set -u

T=cli_rebuild
. "$(dirname "$0")/cli_lib.sh"
# the checks below count a run that exits as wanted as passed
run() { local name=$1 want=$2; kvt_run "$@" && pass "$name: exit $want"; }

has() { if grep -q -- "$3" "$TMP/$1.$2"; then pass "$1 says '$3'"; else fail "$1: no '$3' in: $(cat "$TMP/$1.$2")"; fi; }
# py NAME CHECK: $TMP/NAME.out is one JSON object d; CHECK asserts on it
py() {
  if python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); exec(sys.argv[2])' \
       "$TMP/$1.out" "$2"; then pass "$1: JSON checks"; else fail "$1: JSON checks"; fi
}

S="$TMP/store"
run demo1 0 demo --dir "$S" --agents 1 --json || exit 1
BLOCKS=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["tiers"]["cold"]["blocks"])' "$TMP/demo1.out")

# 1. The index deleted.
rm -rf "$S/index"
run stat_lost 1 stat "$S" && has stat_lost err "--rebuild-index $S"
run fsck_lost 2 fsck "$S" && has fsck_lost err "index" && has fsck_lost err "--rebuild-index $S"
run demo_lost 1 demo --dir "$S" --agents 1 && has demo_lost err "rebuild-index"
run usage_both 2 fsck "$S" --rebuild-index --repair
run rebuild1 0 fsck "$S" --rebuild-index --json &&
  py rebuild1 "assert d['blocks'] == $BLOCKS and d['damaged'] == 0 and d['namespaces'] == 1, d
assert d['orphans'] == 0 and d['old_index'] == '' and d['segment_bytes'] == 64 << 20, d"
run fsck1 0 fsck "$S" --json && py fsck1 "assert d['checked'] == $BLOCKS and d['bad'] == 0, d"

# 2. The index overwritten with garbage; one record damaged on top.
python3 - "$S/index/data.mdb" <<'PY'
import os, sys
n = os.path.getsize(sys.argv[1])
open(sys.argv[1], "r+b").write(os.urandom(n))
PY
SEG=$(find "$S/segments" -name 'seg-*' | sort | head -n 1)
python3 - "$SEG" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:   # a byte of the first record's first slice
    f.seek(4096 + 100); b = f.read(1); f.seek(4096 + 100); f.write(bytes([b[0] ^ 0x5a]))
PY
run stat_bad 1 stat "$S" && has stat_bad err "damaged or missing"
run rebuild2 1 fsck "$S" --rebuild-index && has rebuild2 out "layer 0: slice checksum mismatch" \
  && has rebuild2 out "old index kept as $S/index.old-1"
run fsck2 0 fsck "$S" && has fsck2 out "$((BLOCKS - 1)) token blocks checked, 0 bad"

# 3. The store works on: the demo computes only the damaged block again.
run demo2 0 demo --dir "$S" --agents 1 --json &&
  py demo2 "assert d['token_blocks_computed'] == 1 and d['token_blocks_at_open'] == $BLOCKS - 1, d"
run fsck3 0 fsck "$S" && has fsck3 out "$BLOCKS token blocks checked, 0 bad"

[ "$FAILS" -eq 0 ] && echo "cli_rebuild: all checks passed" && exit 0
echo "cli_rebuild: $FAILS check(s) failed" >&2
exit 1
