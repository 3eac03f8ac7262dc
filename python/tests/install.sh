#!/usr/bin/env bash
# install.sh - `cmake --install` of a build into a scratch prefix, then the
# installed package, run by PYTHON with nothing but that prefix on its
# path, finds the installed libkvtier.so (not the build tree's) and round-
# trips a block. Then, when PYTHON has venv and pip, `pip install
# --no-build-isolation` of a copy of python/ into a fresh virtual
# environment with system site packages, offline (PIP_NO_INDEX=1). Usage: install.sh PYTHON CMAKE BUILD_DIR PYTHON_DIR SANITIZED
# (PYTHON_DIR: KVT_PYTHON_DIR, relative to the prefix). Exit 0, 1, or 77.
set -u
PY=${1:?usage}; CMAKE=${2:?usage}; BUILD=${3:?usage}; PYDIR=${4:?usage}; SAN=${5:-0}
if [ "$SAN" != 0 ]; then
  echo "SKIP: sanitizer build: python would need libasan/libtsan preloaded"
  exit 77
fi
[ -x "$PY" ] || { echo "SKIP: no $PY"; exit 77; }
"$PY" -c "import numpy" 2>/dev/null || { echo "SKIP: $PY has no numpy (apt-get install python3-numpy)"; exit 77; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-pyinst.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
"$CMAKE" --install "$BUILD" --prefix "$TMP/prefix" >"$TMP/install.log" 2>&1 \
  || { cat "$TMP/install.log" >&2; echo "FAIL: cmake --install"; exit 1; }
PKG=$TMP/prefix/$PYDIR/kvtier
[ -f "$PKG/__init__.py" ] || { echo "FAIL: no package at $PKG"; exit 1; }
[ -f "$PKG/_installed.py" ] || { echo "FAIL: no $PKG/_installed.py"; exit 1; }
echo "ok: package installed at $PKG"
# No KVTIER_LIB, no build tree to fall back on: run from a copy outside the source.
cd "$TMP" && env -u KVTIER_LIB -u KVTIER_BUILD PYTHONPATH="$TMP/prefix/$PYDIR" \
  PYTHONDONTWRITEBYTECODE=1 "$PY" - "$TMP/prefix" "$TMP/store" <<'PYEOF' || exit 1
import os, sys
import numpy as np
import kvtier
prefix, store = sys.argv[1], sys.argv[2]
lib = os.path.realpath(kvtier.library_path)
if not lib.startswith(os.path.realpath(prefix) + os.sep):
    sys.exit(f"FAIL: the installed package loaded {lib}, not the library under {prefix}")
print(f"ok: the installed package loads {lib}")
with kvtier.Engine(store) as e:
    ns = e.namespace("install-test", "0", n_layers=1, n_kv_heads=2, head_dim=4, dtype="f32")
    with ns.sequence() as s:
        k = np.arange(np.prod(ns.block_shape), dtype=np.float32).reshape(ns.block_shape)
        s.put(s.append(range(16)).block, 0, k, -k)
        kk, vv = s.gather(0)
        if not (np.array_equal(kk, k) and np.array_equal(vv, -k)):
            sys.exit("FAIL: gathered KV differs from the KV put")
print("ok: put and gather through the installed package")
PYEOF

SRC=${KVTIER_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
if ! "$PY" -c "import venv, ensurepip" 2>/dev/null || ! "$PY" -m pip --version >/dev/null 2>&1; then
  echo "note: $PY has no venv or pip (python3-venv, python3-pip): pip install not checked"
else
  cp -r "$SRC/python" "$TMP/src" && rm -rf "$TMP/src/build" "$TMP/src"/*.egg-info
  "$PY" -m venv --system-site-packages "$TMP/venv" >"$TMP/venv.log" 2>&1 \
    || { cat "$TMP/venv.log" >&2; echo "FAIL: python3 -m venv"; exit 1; }
  PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$TMP/venv/bin/pip" install -q \
    --no-build-isolation "$TMP/src" >"$TMP/pip.log" 2>&1 \
    || { cat "$TMP/pip.log" >&2; echo "FAIL: pip install --no-build-isolation (offline)"; exit 1; }
  lib=$(find "$TMP/prefix" -name "libkvtier.so.0" | head -n 1)
  where=$(cd "$TMP" && KVTIER_LIB=$lib "$TMP/venv/bin/python" -c \
    "import kvtier; print(kvtier.__file__); print(kvtier.strerror(kvtier.errors.ECORRUPT))") \
    || { echo "FAIL: import kvtier from the venv: $where"; exit 1; }
  case $where in "$TMP/venv/"*"stored data failed a check") ;;
    *) echo "FAIL: the venv imported kvtier from elsewhere: $where"; exit 1 ;; esac
  echo "ok: pip install --no-build-isolation offline into a venv: $(echo "$where" | head -1)"
fi
echo "python_install: all checks passed"
