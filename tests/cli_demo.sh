#!/usr/bin/env bash
# cli_demo.sh - end-to-end test of the kvtier command: usage errors, demo
# (JSON, a second run on the same directory), bench share (hot and warm),
# bench hot and bench codec.
# Usage: cli_demo.sh <path-to-kvtier>. Exit 0 when every check passes, 1 not.
set -u

T=cli_demo
. "$(dirname "$0")/cli_lib.sh"

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
run help3 0 bench --help && expect "bench --help names bench share" has help3 out "bench share" \
  && expect "bench --help names bench codec" has help3 out "bench codec"
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
usage_error share_codec --codec bench share --codec k8
usage_error codec_mib --mib bench codec --mib 1
usage_error codec_pair --codec bench codec --codec v3k8
usage_error codec_tokens --tokens bench codec --tokens 100
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
# Another writer holds the store (kvtier.h: an exclusive flock() on the directory).
if command -v flock >/dev/null; then
  flock "$DEMO" "$KVT" demo --dir "$DEMO" --agents 1 >"$TMP/locked.out" 2>"$TMP/locked.err"
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
  if run "share$n" 0 bench share --agents $n --tokens 512 --own 0 --json; then
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

# --- bench share --codec: every block warm, reduction near 1 - (encoded/f16)/N --
for n in 2 4; do
  if run "sharew$n" 0 bench share --agents $n --tokens 512 --own 0 --codec k8v3 --json; then
    json_check "sharew$n" "
N = $n
assert d['agents'] == N and d['codec'] == 'k8v3' and d['verified'] is True
assert d['hot_blocks'] == 0 and d['hot_bytes'] == 0, (d['hot_blocks'], d['hot_bytes'])
assert d['warm_blocks'] == d['n_layers'] * d['tokens'] // d['block_tokens'], d['warm_blocks']
# RAM only, by category: the parts add up to total_bytes
parts = d['hot_bytes'] + d['warm_bytes'] + d['index_bytes'] + d['seq_bytes'] + d['other_bytes']
assert parts == d['stats_total_bytes'], (parts, d['stats_total_bytes'])
assert d['warm_bytes'] >= d['encoded_bytes']
# k8 + v3 with headers: (16656 + 6416) / 65536 of f16 per layer block
arith = 1 - (16656 + 6416) / 65536 / N
assert abs(d['reduction_arithmetic'] - arith) < 1e-9, d['reduction_arithmetic']
assert d['reduction'] <= arith + 1e-9, (d['reduction'], arith)
assert d['reduction'] >= arith - 0.005, (d['reduction'], arith)
assert abs(d['reduction'] - (1 - d['stats_total_bytes'] / d['private_bytes'])) < 1e-5
assert abs(d['v_nmse'] / 0.03454 - 1) < 0.1, d['v_nmse']
"
  fi
done

# --- bench share, partial overlap: a shared prefix plus each agent's own blocks;
# the savings split into deduplication and codec and add up -------------------
if run sharep 0 bench share --agents 3 --tokens 256 --own 128 --codec k8v3 --json; then
  json_check sharep "
N, S, O = 3, 256 // 16, 128 // 16
assert d['workload'] == 'partial overlap' and d['verified'] is True
uniq = S + N * O
assert d['warm_blocks'] == d['n_layers'] * uniq, d['warm_blocks']
blk = d['n_layers'] * 16 * 8 * 128 * 2 * 2   # f16 K+V of one token block
assert d['private_bytes'] == N * (S + O) * blk and d['unique_payload_bytes'] == uniq * blk
assert d['saved_by_dedup_bytes'] == d['private_bytes'] - d['unique_payload_bytes']
assert abs(d['reduction_from_dedup'] - (1 - uniq / (N * (S + O)))) < 1e-9
assert d['saved_by_codec_bytes'] == d['unique_payload_bytes'] - d['encoded_bytes'] > 0
total = d['private_bytes'] - d['saved_by_dedup_bytes'] - d['saved_by_codec_bytes'] + d['overhead_bytes']
assert abs(total - d['stats_total_bytes']) < 1, (total, d['stats_total_bytes'])
assert d['reduction_from_dedup'] < 1 - 1 / N   # not the same-context figure by construction
"
fi

# --- bench hot: the keys, positive figures; few rounds to stay quick -----------
if run hot 0 bench hot --mib 64 --rounds 3 --lookups 200 --json; then
  json_check hot '
for k in ("put_gbps", "gather_gbps", "memcpy_gbps", "gather_vs_memcpy", "put_vs_memcpy",
          "lookup_p50_us", "lookup_p99_us"):
    assert isinstance(d[k], (int, float)) and d[k] > 0, k
assert d["working_set_bytes"] >= 64 << 20
assert d["lookup_p99_us"] >= d["lookup_p50_us"]
assert d["l3_bytes"] == 0 or abs(d["working_set_vs_l3"] - d["working_set_bytes"] / d["l3_bytes"]) < 1e-6
'
fi

# --- bench codec: small working set and contexts to stay quick ------------------
if run codec 0 bench codec --mib 64 --rounds 3 --tokens 512 --attend-tokens 512 --json; then
  json_check codec '
K, V = ("k8", "k8c", "k4"), ("v2", "v3", "v4")
theory = {"v2": 0.1175, "v3": 0.03454, "v4": 0.009497}
c = d["codecs"]
assert sorted(c) == sorted(K + V), sorted(c)
assert d["working_set_bytes"] >= 64 << 20
for name, x in c.items():
    for k in ("encode_gbps", "decode_gbps", "memcpy_gbps", "encode_vs_memcpy",
              "decode_vs_memcpy", "bits_per_value", "attn_rel_err_alone"):
        assert isinstance(x[k], (int, float)) and x[k] > 0, (name, k, x.get(k))
    assert abs(x["bits_per_value"] - 8 * x["encoded_bytes"] / (16 * 8 * 128)) < 1e-9, name
assert 8 < c["k8"]["bits_per_value"] < 9, c["k8"]["bits_per_value"]
assert 3 < c["v3"]["bits_per_value"] < 3.5, c["v3"]["bits_per_value"]
for v in V:   # Gaussian vectors, rotated: the Lloyd-Max distortion
    x = c[v]
    assert x["v_nmse_theory"] == theory[v], (v, x["v_nmse_theory"])
    assert abs(x["v_nmse"] / theory[v] - 1) < 0.05, (v, x["v_nmse"], theory[v])
    assert abs(x["v_nmse_vs_theory"] - x["v_nmse"] / theory[v]) < 1e-6
for k in K:
    x = c[k]
    assert 0 < x["qk_rel_err"] < 1 and 0 < x["qk_rel_err_gaussian"] < 1, k
assert c["k8"]["qk_rel_err"] < 0.05 and c["k8c"]["qk_rel_err"] < 0.02, (c["k8"], c["k8c"])
assert c["k4"]["qk_rel_err"] > c["k8"]["qk_rel_err"]
assert d["best_k_codec_realistic"] in K
a = d["attention"]
assert a["tokens"] == 512 and a["hot"] < 1e-4, a
for k in K:
    for v in V:
        assert 0 < a[k + v] < 1, (k + v, a[k + v])
assert a["k8v4"] < a["k8v3"] < a["k8v2"], a
t = d["attend_vs_dequant"]
assert t["codec"] == "k8v3" and t["tokens"] == 512 and t["layers"] == 32
for k in ("attend_s", "dequant_s", "dequant_gather_s", "speedup", "warm_bytes"):
    assert t[k] > 0, (k, t[k])
assert t["outputs_rel_diff"] < 0.01, t["outputs_rel_diff"]   # same quantized data
assert set(d["targets"]) == {"v3_decode_vs_memcpy", "v3_encode_vs_memcpy",
                             "k8_decode_vs_memcpy", "attend_vs_dequant"}
'
fi
run codech 0 bench codec --mib 64 --rounds 3 --tokens 256 --attend-tokens 256 \
  && for word in "bits/value" "NMSE" "attention over 256 tokens" "speedup" "best key codec"; do
    expect "bench codec human output shows '$word'" has codech out "$word"
  done

# === cold tier: demo persistence, stat, fsck, bench cold ======================
# (section added with `kvtier stat`, `kvtier fsck` and `kvtier bench cold`;
# it reads the store the demo runs above made in $DEMO and corrupts a copy)
json_check demo1 '
assert d["persists_across_runs"] is True and d["synced"] is True
bt = d["shape"]["block_tokens"]
prompt, doc = d["system_prompt_tokens"] // bt, d["document_tokens"] // bt
unique = prompt + d["agents"] * doc
cold = d["tiers"]["cold"]
assert cold["blocks"] == unique == d["durable_token_blocks"], (cold, unique)
assert d["durable_agents"] == d["agents"]
assert d["cold"]["io_backend"] != ""
'
json_check demo2 '
blocks = (d["system_prompt_tokens"] + d["document_tokens"]) // d["shape"]["block_tokens"]
assert d["persists_across_runs"] is True and d["token_blocks_at_open"] > 0
assert d["lookup_found_by_tier"]["cold"] >= blocks, d["lookup_found_by_tier"]
assert d["token_blocks_loaded_cold"] >= blocks and d["token_blocks_computed"] == 0
assert d["hit_rate"] == 1 and d["agents_hit"] == d["agents"]
'
run usage_stat 2 stat && expect "stat without DIR: exit 2" has usage_stat err "which store"
run usage_fsck 2 fsck && expect "fsck without DIR: exit 2" has usage_fsck err "which store"
usage_error stat_opt --bogus stat "$DEMO" --bogus
usage_error cold_mib --mib bench cold --mib 1
usage_error cold_tokens --block-tokens bench cold --block-tokens 65
run stat_missing 1 stat "$TMP/no-such-store" \
  && expect "stat of a missing store: exit 1, the call named" has stat_missing err "opening"
run fsck_missing 2 fsck "$TMP/no-such-store"
expect "stat and fsck create no store" test ! -e "$TMP/no-such-store"

if run stat1 0 stat "$DEMO" --json; then
  json_check stat1 '
ns = d["namespaces"]
assert d["namespace_count"] == 1 and len(ns) == 1, ns
n = list(ns.values())[0]
assert n["model_id"] == "kvtier-demo/llama-3-8b-like-16L", n
assert n["tp_rank"] == 0 and n["tp_size"] == 1 and n["n_layers"] == 16 and n["dtype"] == "f16"
assert d["read_only"] is True and d["cold_tier"] is True
c = d["cold"]
assert c["records"] > 0 and c["segments"] > 0 and 0 < c["fill"] <= 1, c
assert d["tiers"]["cold"]["blocks"] == c["records"]
assert d["io_backend"] != "" and d["io_why"] != ""
'
fi
run stat2 0 stat "$DEMO" && expect "stat shows the model" has stat2 out "llama-3-8b-like" \
  && expect "stat shows the I/O backend" has stat2 out "I/O"
run fsck_clean 0 fsck "$DEMO" && expect "fsck of the demo store: clean" has fsck_clean out " 0 bad"
if command -v flock >/dev/null; then
  flock "$DEMO" "$KVT" stat "$DEMO" >"$TMP/stat_locked.out" 2>&1
  rc=$?
  expect "stat beside a writer (lock held): exit 0 (got $rc)" test "$rc" -eq 0
  flock "$DEMO" "$KVT" fsck "$DEMO" --repair >"$TMP/fsck_locked.out" 2>"$TMP/fsck_locked.err"
  rc=$?
  expect "fsck --repair beside a writer: exit 2 (got $rc)" test "$rc" -eq 2
  expect "fsck --repair beside a writer: says why" has fsck_locked err "open for writing"
fi

# One flipped byte inside the first layer slice of the first record (the
# record header takes the first 4 KiB; docs/format.md): fsck must name it.
BAD="$TMP/corrupt-store"
cp -r "$DEMO" "$BAD"
SEG=$(find "$BAD/segments" -name 'seg-*' 2>/dev/null | sort | head -n 1)
if [ -n "$SEG" ] && python3 -c '
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(4096 + 100)
    b = f.read(1)
    f.seek(4096 + 100)
    f.write(bytes([b[0] ^ 0x5a]))
' "$SEG"; then
  run fsck_bad 1 fsck "$BAD" \
    && expect "fsck names the broken block" has fsck_bad out "^bad  [0-9a-f]\{32\}  "
  if run fsck_bad_json 1 fsck "$BAD" --json; then
    json_check fsck_bad_json '
assert d["bad"] >= 1 and d["clean"] is False and d["removed"] == 0
assert len(d["problems"]) == d["problems_listed"] >= 1
p = d["problems"][0]
assert len(p["key"]) == 32 and int(p["key"], 16) >= 0 and p["what"]
'
  fi
  run fsck_repair 1 fsck "$BAD" --repair \
    && expect "fsck --repair reports the removal" has fsck_repair out "removed"
  run fsck_after 0 fsck "$BAD" && expect "fsck after --repair: clean" has fsck_after out " 0 bad"
else
  fail "could not corrupt a segment file of $BAD"
fi

# bench cold: every key, figures positive (ratios are not asserted here)
if run cold 0 bench cold --mib 64 --rounds 2 --samples 50 --json; then
  json_check cold '
for k in ("write_gbps", "raw_write_gbps", "file_per_block_gbps", "read_gbps", "raw_read_gbps",
          "write_vs_raw", "read_vs_raw", "write_vs_file_per_block", "rand_read_p50_us",
          "rand_read_p99_us", "rand_read_qd32_gbps", "raw_vs_file_per_block"):
    assert isinstance(d[k], (int, float)) and d[k] > 0, k
assert d["block_tokens"] == 16 and d["token_block_bytes"] == 32 * d["layer_block_bytes"]
assert d["rand_read_p99_us"] >= d["rand_read_p50_us"]
assert d["bytes"] >= 64 << 20 and d["rounds"] == 2 and isinstance(d["compression"], bool)
assert d["io_backend"] != "" and d["io_why"] != ""
for v in ("compress_on", "compress_off"):
    assert d[v]["write_gbps"]["median"] > 0 and d[v]["cold_write_bytes"] > 0, v
'
fi
# === end of the cold-tier section ============================================

if [ "$FAILS" -ne 0 ]; then
  echo "cli_demo: $FAILS check(s) failed" >&2
  exit 1
fi
echo "cli_demo: all checks passed"
exit 0
