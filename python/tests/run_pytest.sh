#!/usr/bin/env bash
# run_pytest.sh - the Python binding's pytest suite (python/tests) against
# one build's libkvtier.so, for ctest. Usage: run_pytest.sh PYTHON LIB SANITIZED.
# Exit 77 (skip) when PYTHON lacks numpy or pytest, or in a sanitizer
# build (its library needs the sanitizer runtime preloaded into python).
set -u
PY=${1:?usage: run_pytest.sh PYTHON LIB SANITIZED}
LIB=${2:?usage: run_pytest.sh PYTHON LIB SANITIZED}
SAN=${3:-0}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "$SAN" != 0 ]; then
  echo "SKIP: sanitizer build: python would need libasan/libtsan preloaded; the C tests cover the library"
  exit 77
fi
[ -x "$PY" ] || { echo "SKIP: no $PY (apt-get install python3)"; exit 77; }
for m in numpy pytest; do
  "$PY" -c "import $m" 2>/dev/null || { echo "SKIP: $PY has no $m (apt-get install python3-$m)"; exit 77; }
done
export KVTIER_LIB=$LIB PYTHONPATH=$HERE/..${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1
# pytest's scratch directories (stores, logits) go here and are removed
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-pytest.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
cd "$HERE" && "$PY" -m pytest -p no:cacheprovider -rs -v --basetemp "$TMP/pt" "$HERE"
