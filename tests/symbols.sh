#!/usr/bin/env bash
# symbols.sh - the shared library exports exactly the public API: every
# defined dynamic symbol is a function include/kvtier.h declares, and every
# function it declares is exported. Usage: symbols.sh LIBKVTIER.so KVTIER.h
# Exit 0 pass, 1 fail, 77 cannot run here (no nm).
set -u
LIB=${1:?usage: symbols.sh LIB HEADER}
HDR=${2:?usage: symbols.sh LIB HEADER}
command -v nm >/dev/null || { echo "SKIP: no nm"; exit 77; }
declared=$(grep -E '^[A-Za-z_][A-Za-z0-9_ *]*[ *]kvt_[a-z0-9_]+\(' "$HDR" | grep -v '^typedef' |
           sed -E 's/.*[ *](kvt_[a-z0-9_]+)\(.*/\1/' | sort -u)
exported=$(nm -D --defined-only "$LIB" | awk '$2 ~ /^[TtDdBbRrVvWwGgSsi]$/ {print $3}' |
           sed 's/@.*//' | grep -v '^KVTIER_' | sort -u)
[ -n "$declared" ] || { echo "FAIL: no function found in $HDR"; exit 1; }
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
rc=0
if [ -n "$extra" ]; then
  echo "FAIL: exported but not in $(basename "$HDR"):"; echo "$extra" | sed 's/^/  /'; rc=1
fi
if [ -n "$missing" ]; then
  echo "FAIL: declared but not exported (or not defined):"; echo "$missing" | sed 's/^/  /'; rc=1
fi
[ $rc -eq 0 ] && echo "PASS: $(echo "$exported" | wc -l) symbols, all public"
exit $rc
