# cli_lib.sh - what the shell tests of the kvtier command share: the binary
# ($1), a scratch directory $TMP removed on exit, pass/fail counting, and
# kvt_run NAME WANT_RC ARGS... (kvtier's stdout and stderr kept in
# $TMP/NAME.out and $TMP/NAME.err). Sourced with the test's name in $T:
#   T=cli_demo; . "$(dirname "$0")/cli_lib.sh"
KVT=${1:?usage: $T.sh <path-to-kvtier>}
[ -x "$KVT" ] || { echo "$T: $KVT is not an executable" >&2; exit 1; }
command -v python3 >/dev/null || { echo "$T: python3 is needed to read JSON" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-$T.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
FAILS=0

fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
pass() { echo "ok: $*"; }

kvt_run() {
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
run() { kvt_run "$@"; }
