#!/usr/bin/env bash
# funclen.sh - no library function is over 80 lines: tools/funclen.awk over
# the library's C files (base, codec, engine, tiers, io; not tools or tests).
# Usage: funclen.sh SOURCE_DIR [LIMIT]. Exit 0 pass, 1 fail.
set -u
SRC=${1:?usage: funclen.sh SOURCE_DIR [LIMIT]}
LIMIT=${2:-80}
cd "$SRC" || exit 1
files=$(ls base/*.c codec/*.c engine/*.c tiers/*.c io/*.c)
all=$(awk -f tools/funclen.awk $files)
# The script must see the functions at all: a broken pattern would pass.
[ "$(echo "$all" | wc -l)" -ge 100 ] || { echo "FAIL: only $(echo "$all" | wc -l) functions found"; exit 1; }
over=$(echo "$all" | awk -v lim="$LIMIT" '$1 > lim' | sort -rn)
if [ -n "$over" ]; then
  echo "FAIL: library functions over $LIMIT lines (lines file:line name):"
  echo "$over" | sed 's/^/  /'
  exit 1
fi
echo "PASS: $(echo "$all" | wc -l) functions, the longest $(echo "$all" | sort -rn | head -1)"
