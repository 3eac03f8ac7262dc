#!/usr/bin/env bash
# pkgconfig.sh - install kvtier as Debian lays it out (prefix /usr, multiarch
# libdir lib/<triplet>) under a DESTDIR, then build and run a program
# against it through pkg-config, linked with the shared and the static library.
# Usage: pkgconfig.sh SRC_DIR CMAKE CC. Exit 0 pass, 1 fail, 77 cannot run here.
set -u

SRC=${1:?usage: pkgconfig.sh SRC_DIR CMAKE CC}
CMAKE=${2:?usage: pkgconfig.sh SRC_DIR CMAKE CC}
CC=${3:?usage: pkgconfig.sh SRC_DIR CMAKE CC}
command -v pkg-config >/dev/null || { echo "SKIP: no pkg-config"; exit 77; }
command -v "$CC" >/dev/null || { echo "SKIP: no C compiler $CC"; exit 77; }
"$CMAKE" --version >/dev/null 2>&1 || { echo "SKIP: no cmake at $CMAKE"; exit 77; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-pc.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

TRIPLET=$("$CC" -print-multiarch 2>/dev/null)
[ -n "$TRIPLET" ] || TRIPLET=x86_64-linux-gnu
ROOT=$TMP/root
LIBDIR=$ROOT/usr/lib/$TRIPLET
# A build of its own: the install directories are fixed at configure time.
# Debug (-O0) and no tests, to keep it short.
"$CMAKE" -S "$SRC" -B "$TMP/build" -DCMAKE_BUILD_TYPE=Debug -DKVT_TESTS=OFF \
  -DKVT_SANITIZE=OFF -DKVT_TSAN=OFF -DCMAKE_C_COMPILER="$CC" -DCMAKE_INSTALL_PREFIX=/usr \
  -DCMAKE_INSTALL_LIBDIR="lib/$TRIPLET" >"$TMP/configure.log" 2>&1 \
  || { cat "$TMP/configure.log" >&2; fail "configure"; }
"$CMAKE" --build "$TMP/build" -j"$(nproc)" >"$TMP/build.log" 2>&1 \
  || { tail -n 30 "$TMP/build.log" >&2; fail "build"; }
DESTDIR=$ROOT "$CMAKE" --install "$TMP/build" >"$TMP/install.log" 2>&1 \
  || { cat "$TMP/install.log" >&2; fail "install"; }
PC=$LIBDIR/pkgconfig/kvtier.pc
[ -f "$PC" ] || fail "no $PC (installed: $(cd "$ROOT" && find . -name '*.pc'))"
echo "ok: installed $PC"

export PKG_CONFIG_PATH=$LIBDIR/pkgconfig
# Where pkg-config says the header and library are, they are.
inc=$(pkg-config --variable=includedir kvtier) || fail "pkg-config --variable=includedir"
lib=$(pkg-config --variable=libdir kvtier) || fail "pkg-config --variable=libdir"
[ -f "$inc/kvtier.h" ] || fail "includedir $inc has no kvtier.h"
[ "$(cd "$inc" && pwd -P)" = "$(cd "$ROOT/usr/include" && pwd -P)" ] || fail "includedir is $inc"
[ "$(cd "$lib" && pwd -P)" = "$(cd "$LIBDIR" && pwd -P)" ] || fail "libdir is $lib"
echo "ok: includedir and libdir resolve inside the install"

cat >"$TMP/prog.c" <<'EOC'
#include <stdio.h>
#include <string.h>
#include <kvtier.h>
int main(int argc, char **argv) {
  kvt_options o;
  kvt_engine *e = NULL;
  if (argc != 2) return 2;
  kvt_options_init(&o);
  int rc = kvt_engine_open(argv[1], &o, &e);
  if (rc) {
    printf("open: %s\n", kvt_strerror(rc));
    return 1;
  }
  kvt_engine_close(e);
  printf("kvtier %d.%d.%d: %s\n", KVT_VERSION_MAJOR, KVT_VERSION_MINOR, KVT_VERSION_PATCH,
         kvt_strerror(KVT_ECORRUPT));
  return 0;
}
EOC
ver=$(pkg-config --modversion kvtier) || fail "pkg-config --modversion kvtier"
# shared: what `pkg-config --cflags --libs` gives
# shellcheck disable=SC2046 # pkg-config's words are meant to split
"$CC" -std=c11 -Wall -Werror "$TMP/prog.c" -o "$TMP/prog" $(pkg-config --cflags --libs kvtier) \
  || fail "build against pkg-config --cflags --libs kvtier"
out=$(LD_LIBRARY_PATH=$LIBDIR "$TMP/prog" "$TMP/store") || fail "shared program: $out"
case $out in "kvtier $ver: "*) ;; *) fail "shared program printed '$out', not version $ver" ;; esac
echo "ok: shared: $out"
# static: the archive and every library pkg-config --static names
libs=$(pkg-config --static --libs kvtier) || fail "pkg-config --static --libs kvtier"
libs=${libs/-lkvtier/$LIBDIR/libkvtier.a}
# shellcheck disable=SC2046,SC2086
"$CC" -std=c11 -Wall -Werror "$TMP/prog.c" -o "$TMP/prog_static" $(pkg-config --cflags kvtier) $libs \
  || fail "build against libkvtier.a with pkg-config --static --libs kvtier"
out=$("$TMP/prog_static" "$TMP/store2") || fail "static program: $out"
case $out in "kvtier $ver: "*) ;; *) fail "static program printed '$out', not version $ver" ;; esac
echo "ok: static: $out"
echo "pkgconfig: all checks passed"
