#!/usr/bin/env bash
# cli_demo.sh - end-to-end test of the kvtier command: usage errors, demo
# (JSON, a second run on the same directory), bench share and bench hot.
# Usage: cli_demo.sh <path-to-kvtier>. Exit 0 when every check passes, 1 not.
set -u

KVT=${1:?usage: cli_demo.sh <path-to-kvtier>}
[ -x "$KVT" ] || { echo "cli_demo: $KVT is not an executable" >&2; exit 1; }
command -v python3 >/dev/null || { echo "cli_demo: python3 is needed to read JSON" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-cli.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
FAILS=0

fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
pass() { echo "ok: $*"; }

# run NAME WANT_RC ARGS...: run kvtier, keep stdout/stderr in $TMP/NAME.{out,err}
run() {
  local name=$1 want=$2 rc
  shift 2
  "$KVT" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$name: 'kvtier $*' exited $rc, expected $want; stderr: $(head -c 400 "$TMP/$name.err")"
    return 1
  fi
  return 0
}

# usage_error NAME WORD ARGS...: exit 2 and a message on stderr that names WORD
usage_error() {
  local name=$1 word=$2
  shift 2
  run "$name" 2 "$@" || return
  if ! grep -q -- "$word" "$TMP/$name.err"; then
    fail "$name: stderr does not name '$word': $(cat "$TMP/$name.err")"
  elif [ -s "$TMP/$name.out" ]; then
    fail "$name: a usage error wrote to stdout"
  else
    pass "$name"
  fi
}

# json_check NAME PYTHON: parse $TMP/NAME.out as one JSON object d, run the check
json_check() {
  local name=$1 check=$2
  if python3 - "$TMP/$name.out" "$check" <<'EOF'
import json, sys
with open(sys.argv[1]) as f:
    text = f.read()
d = json.loads(text)                 # exactly one JSON document, nothing else
assert isinstance(d, dict), "not an object"
exec(sys.argv[2])
EOF
  then pass "$name: JSON checks"; else fail "$name: JSON checks (the assertion is above)"; fi
}

# expect DESC CMD...: pass when CMD succeeds, fail when it does not
expect() {
  local desc=$1
  shift
  if "$@"; then pass "$desc"; else fail "$desc"; fi
}

# has NAME STREAM WORD: the saved stdout (out) or stderr (err) of NAME contains WORD
# shellcheck disable=SC2317 # called through expect
has() { grep -q -- "$3" "$TMP/$1.$2"; }

# --- help and usage errors ---------------------------------------------------
run help 0 --help && expect "--help lists demo" has help out demo \
  && expect "--help lists bench" has help out bench
run help2 0 help demo && expect "help demo lists its options" has help2 out --agents
run help3 0 bench --help && expect "bench --help names bench share" has help3 out "bench share"
run noargs 2 && expect "no arguments: exit 2, usage on stderr" test -s "$TMP/noargs.err"
usage_error unknown_cmd frobnicate frobnicate
usage_error unknown_opt --bogus demo --bogus --dir "$TMP/never"
usage_error missing_val --agents demo --agents
usage_error zero_agents --agents demo --agents 0
usage_error text_agents --agents demo --agents many
usage_error flag_value --json demo --json=yes
usage_error stray_arg extra demo extra
usage_error bench_none bench bench
usage_error bench_unknown nope bench nope
usage_error share_tokens --tokens bench share --tokens 100
usage_error hot_mib --mib bench hot --mib 1
expect "a usage error creates no store" test ! -e "$TMP/never"

# --- a library error: exit 1, the failed call named on stderr ------------------
: >"$TMP/afile"
run liberr 1 demo --dir "$TMP/afile/store" --agents 1 \
  && expect "library error: exit 1 with the call named" has liberr err "opening the store"

# --- demo: JSON, figures that add up, then a second run on the same directory --
DEMO="$TMP/demo-store"
if run demo1 0 demo --dir "$DEMO" --agents 4 --json; then
  expect "demo1: nothing on stderr without a terminal" test ! -s "$TMP/demo1.err"
  json_check demo1 '
N = 4
assert d["agents"] == N and d["verified"] is True
hot = d["tiers"]["hot"]
assert hot["blocks"] > 0 and hot["bytes"] > 0 and hot["bytes"] <= hot["limit"]
assert d["stored_bytes"] < d["private_bytes"], "nothing shared"
assert d["dedup_saved_bytes"] > 0 and 0 < d["dedup_saved_pct"] < 100
assert d["logical_bytes"] == d["private_bytes"], (d["logical_bytes"], d["private_bytes"])
assert d["stored_bytes"] + d["dedup_saved_bytes"] >= d["private_bytes"]
# lookups: one per agent; all but the first find the shared system prompt
assert d["lookups"] == N
prompt_blocks = d["system_prompt_tokens"] // d["shape"]["block_tokens"]
assert d["lookup_blocks_hit"] == (N - 1) * prompt_blocks, d["lookup_blocks_hit"]
asked = d["lookup_blocks_hit"] + d["lookup_blocks_miss"]
assert abs(d["hit_rate"] - d["lookup_blocks_hit"] / asked) < 1e-6
assert d["token_blocks_adopted"] == d["lookup_blocks_hit"]
assert d["gathers"] == N * d["shape"]["n_layers"]
'
fi
[ -d "$DEMO" ] && echo "not kvtier's: must survive" >"$DEMO/user-file"
if run demo2 0 demo --dir "$DEMO" --agents 4 --json; then
  expect "second run: hit rate not lower than the first" python3 -c '
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert b["hit_rate"] >= a["hit_rate"], (a["hit_rate"], b["hit_rate"])
assert b["verified"] is True
' "$TMP/demo1.out" "$TMP/demo2.out"
fi
expect "the second run did not wipe its directory" test -f "$DEMO/user-file"
# Another writer holds the store (kvtier.h: an exclusive flock() on dir/LOCK).
if command -v flock >/dev/null; then
  flock "$DEMO/LOCK" "$KVT" demo --dir "$DEMO" --agents 1 >"$TMP/locked.out" 2>"$TMP/locked.err"
  rc=$?
  expect "a locked store: exit 1 (got $rc)" test "$rc" -eq 1
  expect "a locked store: the failed call on stderr" has locked err "opening the store"
fi
if run demo3 0 demo --dir "$DEMO" --agents 2; then
  for word in "store:" "hot" "dedup" "hit rate" "What it means"; do
    expect "human output shows '$word'" has demo3 out "$word"
  done
fi

# --- bench share: reduction close to 1 - 1/N -----------------------------------
for n in 2 4; do
  if run "share$n" 0 bench share --agents $n --tokens 512 --json; then
    json_check "share$n" "
N = $n
for k in ('agents', 'tokens', 'stored_bytes', 'stats_total_bytes', 'private_bytes', 'reduction'):
    assert k in d, k
assert d['agents'] == N and d['tokens'] == 512
ceiling = 1 - 1 / N
assert d['reduction'] <= ceiling + 1e-9, d['reduction']
assert d['reduction'] >= ceiling - 0.02, (d['reduction'], ceiling)
assert abs(d['reduction'] - (1 - d['stats_total_bytes'] / d['private_bytes'])) < 1e-5
assert d['stats_total_bytes'] >= d['payload_bytes'] and d['verified'] is True
"
  fi
done

# --- bench hot: the keys, positive figures; few rounds to stay quick -----------
if run hot 0 bench hot --rounds 3 --lookups 200 --json; then
  json_check hot '
for k in ("put_gbps", "gather_gbps", "memcpy_gbps", "gather_vs_memcpy", "put_vs_memcpy",
          "lookup_p50_us", "lookup_p99_us"):
    assert isinstance(d[k], (int, float)) and d[k] > 0, k
assert d["working_set_bytes"] >= 64 << 20
assert d["lookup_p99_us"] >= d["lookup_p50_us"]
'
fi

if [ "$FAILS" -ne 0 ]; then
  echo "cli_demo: $FAILS check(s) failed" >&2
  exit 1
fi
echo "cli_demo: all checks passed"
exit 0
