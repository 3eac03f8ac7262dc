#!/usr/bin/env bash
# cli_remote.sh - the kvtier command with --remote on the ctest fixture's
# Redis Cluster (KVT_REDIS_PORT): a demo in one directory, a second demo in
# another that loads the first one's blocks from the cluster (remote hits,
# no checksum failure), stat listing the namespace it never registered,
# and a refused open whose messages do not contain the URL's password.
# import --remote writes through (remote writes counted; stat --remote from
# an empty directory lists the imported namespace);
# a bad URL on import is a clear error, fsck and bench cold refuse --remote; bench
# policy runs with the remote tier (its counters in the JSON) and refuses a
# bad URL without printing the password.
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
  json stat_c 'assert any(n["model_id"].startswith("kvtier-demo") for n in d["namespaces"].values()), d; assert "remote" in d and d["remote"]["evictions_noticed"] == 0 and d["remote"]["write_cancelled"] == 0'
fi
if kvt_run refused 1 stat "$TMP/c" --remote "redis://kvt:Sekrit-$SEED@127.0.0.1:1"; then
  if grep -q "Sekrit" "$TMP/refused.out" "$TMP/refused.err"; then fail "refused: the password was printed"
  else pass "refused: no password in the messages"; fi
fi
# import --remote: the KV of a made-up model, written through to the cluster
"${KVT_PYTHON:-/usr/bin/python3}" "$(dirname "$0")/gen_safetensors.py" --out "$TMP/kv.st" --tokens-out "$TMP/kv.tok" \
  --tokens 64 --seed "$SEED" --first-token $((SEED % 1000)) || fail "gen_safetensors.py failed"
IMP=(import --kv "$TMP/kv.st" --tokens "$TMP/kv.tok" --model-id "cli-remote-$SEED"
     --fingerprint "f$SEED" --remote "$URL" --json)
if kvt_run import_d 0 "${IMP[@]}" --dir "$TMP/d"; then
  json import_d 'r = d["remote"]; assert d["blocks_stored"] == 4, d; assert r["writes"] + r["write_exists"] > 0, r'
fi
mkdir -p "$TMP/e"
if kvt_run stat_e 0 stat "$TMP/e" --remote "$URL" --json; then
  json stat_e "assert any(n['model_id'] == 'cli-remote-$SEED' for n in d['namespaces'].values()), d"
fi
if kvt_run import_bad 1 import --kv "$TMP/kv.st" --tokens "$TMP/kv.tok" --model-id m \
   --fingerprint f --dir "$TMP/f" --remote "redis://kvt:Sekrit-$SEED@127.0.0.1:notaport"; then
  if grep -q "Sekrit" "$TMP/import_bad.out" "$TMP/import_bad.err"; then fail "import_bad: the password was printed"
  elif ! grep -qi "remote\|redis\|URL" "$TMP/import_bad.err" || grep -q "kv.st" "$TMP/import_bad.err"; then fail "import_bad: no word of the URL in: $(cat "$TMP/import_bad.err")"
  else pass "import_bad: a clear error, no password"; fi
fi
if kvt_run fsck_remote 2 fsck "$TMP/d" --remote "$URL"; then
  if grep -q -- "--remote" "$TMP/fsck_remote.err"; then pass "fsck_remote: refused"
  else fail "fsck_remote: no word of --remote in: $(cat "$TMP/fsck_remote.err")"; fi
fi
if kvt_run bench_policy 0 bench policy --rounds 1 --tokens 64 --dir "$TMP/p" --remote "$URL" --json; then
  json bench_policy 'assert "remote" in d and d["remote"]["checksum_failures"] == 0, d'
fi
if kvt_run bench_bad 1 bench policy --rounds 1 --tokens 64 --dir "$TMP/q" \
   --remote "redis://kvt:Sekrit-$SEED@127.0.0.1:notaport"; then
  if grep -q "Sekrit" "$TMP/bench_bad.out" "$TMP/bench_bad.err"; then fail "bench_bad: the password was printed"
  elif ! grep -qi "remote" "$TMP/bench_bad.err"; then fail "bench_bad: no word of the URL in: $(cat "$TMP/bench_bad.err")"
  else pass "bench_bad: a clear error, no password"; fi
fi
if kvt_run cold_remote 2 bench cold --remote "$URL"; then
  if grep -q -- "--remote" "$TMP/cold_remote.err"; then pass "cold_remote: refused"
  else fail "cold_remote: no word of --remote in: $(cat "$TMP/cold_remote.err")"; fi
fi
# bench remote: one namespace per block size, the same every run (the
# cluster's directory holds 256 and an entry is written once): two runs
# add at most 2 bench namespaces, not one per size and run (or round);
# each round is loaded twice (first reads, then reads of values read before).
# Without redis-benchmark on the PATH the baseline is skipped (cheap).
bench_ns() { # bench_ns NAME: count the cluster's bench-remote namespaces into $TMP/NAME.n
  mkdir -p "$TMP/$1" && kvt_run "$1" 0 stat "$TMP/$1" --remote "$URL" --json &&
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
print(sum(n["model_id"].startswith("bench-remote-") for n in d["namespaces"].values()))' \
      "$TMP/$1.out" >"$TMP/$1.n"
}
if bench_ns ns_before && PATH=/nonexistent kvt_run bench_remote 0 bench remote --url "$URL" --blocks 2 --rounds 3 --json &&
   PATH=/nonexistent kvt_run bench_remote2 0 bench remote --url "$URL" --blocks 2 --rounds 2 --json &&
   bench_ns ns_after; then
  json bench_remote 'assert all(d[k]["rounds"] == 3 and d[k]["set_first_round_per_s"] > 0 and d[k]["get_blocks_per_s"] > 0 and d[k]["get_first_read_per_s"] > 0 and 0 < d[k]["first_read_load_p50_us"] <= d[k]["first_read_load_p99_us"] for k in ("block_128_KiB", "block_2048_KiB")), d'
  n0=$(cat "$TMP/ns_before.n") n1=$(cat "$TMP/ns_after.n")
  if [ "$n1" -ge 2 ] && [ $((n1 - n0)) -le 2 ]; then pass "bench_remote: 2 namespaces for two runs"
  else fail "bench_remote: $n0 bench namespaces before two runs, $n1 after; expected 2 at most added (one per block size)"; fi
fi
[ "$FAILS" -eq 0 ] || exit 1
