#!/bin/sh
# cli_vmem.sh - the commands that open a store work under a virtual-memory
# limit (ulimit -v) of 3 GiB: the LMDB map is sized from the cold limit
# (1/16, at least 64 MiB), not a fixed 8 GiB that made every command fail
# with ENOMEM; a reader maps what the store records. Exit 77 when kvtier
# cannot start under the limit at all (a sanitizer build reserves more).
bin=${1:?usage: cli_vmem.sh KVTIER}
lim=3145728 # KiB
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-vmem.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
if ! (ulimit -v $lim && "$bin" help >/dev/null 2>&1); then
  echo "skipped: kvtier does not start under ulimit -v $lim (a sanitizer build?)"
  exit 77
fi
fail=0
for args in "demo --dir $tmp/d --agents 2" "stat $tmp/d" "fsck $tmp/d" "fsck $tmp/d --repair" \
  "stat $tmp/d" "demo --dir $tmp/d --agents 2"; do
  if (ulimit -v $lim && "$bin" $args >"$tmp/out" 2>&1); then
    echo "ok: kvtier $args under ulimit -v $lim"
  else
    echo "FAIL: kvtier $args under ulimit -v $lim:"; tail -n 3 "$tmp/out"; fail=1
  fi
done
exit $fail
