#!/usr/bin/env bash
# layers.sh - the layer graph of the source tree: how many files of each
# folder include something of another (#include "dir/..."; "kvtier.h" counts
# as include), then every arrow that goes up or skips the layer below.
# Layers, top down: tools, include, engine, tiers, io; codec and base under
# all (docs/architecture.md). Usage: tools/layers.sh [SOURCE_DIR]
# Exit 0 when the only such arrows are the exceptions listed below, 1 else.
set -u
cd "${1:-.}" || exit 1
# file:header pairs allowed to break the rule, each explained in
# docs/architecture.md ("The layer graph").
EXCEPT="tools/train.c:engine/predictor.h"
rank() {
  case $1 in tools) echo 0 ;; include) echo 1 ;; engine) echo 2 ;; tiers) echo 3 ;;
    io) echo 4 ;; codec) echo 5 ;; base) echo 6 ;; *) echo 9 ;; esac
}
edges=$(for d in tools include engine tiers io base codec; do
  for f in $d/*.[ch] $([ $d = tools ] && echo tools/refmodel/*.[ch]); do
    [ -f "$f" ] || continue
    grep -o '^#include "[a-z_0-9]*/[a-z_0-9]*\.h"' "$f" | sed "s|#include \"||; s|\"||; s|^|$f:|"
    grep -q '^#include "kvtier.h"' "$f" && echo "$f:include/kvtier.h"
  done
done | awk -F: '{ split($1, a, "/"); split($2, b, "/"); if (a[1] != b[1]) print a[1], b[1], $0 }')
echo "files of the left folder that include the right one:"
printf '%-8s' "from\\to"; for t in include engine tiers io base codec; do printf '%8s' $t; done; echo
for s in tools engine tiers io base codec; do
  printf '%-8s' $s
  for t in include engine tiers io base codec; do
    n=$(echo "$edges" | awk -v s=$s -v t=$t '$1 == s && $2 == t { split($3, f, ":"); print f[1] }' | sort -u | wc -l)
    [ $s = $t ] && n=. ; [ "$n" = 0 ] && n=-
    printf '%8s' "$n"
  done
  echo
done
bad=0
while read -r s t pair; do
  [ -n "$s" ] || continue
  [ $t = include ] && continue # the public types, used by every layer; it includes nothing
  rs=$(rank $s); rt=$(rank $t)
  ok=1
  [ $rt -le $rs ] && ok=0                                   # up, or sideways
  [ $s = engine ] && [ $t = io ] && ok=0                    # the engine never touches a file
  [ $s = tools ] && [ $rt -ge 2 ] && [ $rt -le 4 ] && ok=0  # tools use the public API
  [ $ok = 1 ] && continue
  case " $EXCEPT " in *" $pair "*) echo "exception (documented): $s -> $t  $pair"; continue ;; esac
  echo "FAIL: $s -> $t  $pair"; bad=1
done <<< "$edges"
[ $bad = 0 ] && echo "PASS: no arrow up, none from engine to io, none from tools past the API"
exit $bad
