"""test_layout.py - the ctypes structs of kvtier/_lib.py have the size,
field offsets and field sizes of include/kvtier.h's, as the C compiler
lays them out. A field added in C and not in Python would otherwise let
the library write past a Python-owned struct. Needs a C compiler (cc, or $CC); skipped
without one."""
import ctypes
import os
import shutil
import subprocess

import pytest

from kvtier import _lib
from conftest import SRC

STRUCTS = {
    "kvt_key": _lib.Key, "kvt_shape": _lib.Shape, "kvt_ns_desc": _lib.NsDesc,
    "kvt_test_fault": _lib.TestFault, "kvt_options": _lib.Options,
    "kvt_error_info": _lib.ErrorInfo, "kvt_kv": _lib.KV, "kvt_append_info": _lib.AppendInfo,
    "kvt_lookup_entry": _lib.LookupEntry, "kvt_gathered": _lib.Gathered,
    "kvt_load_req": _lib.LoadReq, "kvt_policy": _lib.Policy, "kvt_stats": _lib.Stats,
    "kvt_fsck_result": _lib.FsckResult, "kvt_tier_stats": _lib.TierStats,
}


def test_structs_match_the_header(tmp_path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to lay out include/kvtier.h's structs")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "kvtier.h"',
             "int main(void) {"]
    for cname, py in STRUCTS.items():
        lines.append(f'  printf("{cname} %zu\\n", sizeof({cname}));')
        for f in py._fields_:
            lines.append(f'  printf("{cname}.{f[0]} %zu+%zu\\n", offsetof({cname}, {f[0]}), '
                         f'sizeof((({cname} *)0)->{f[0]}));')
    lines += ["  return 0;", "}"]
    (tmp_path / "layout.c").write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-std=c11", "-I", os.path.join(SRC, "include"), "-o",
                    str(tmp_path / "layout"), str(tmp_path / "layout.c")], check=True)
    out = subprocess.run([str(tmp_path / "layout")], check=True, capture_output=True,
                         text=True).stdout
    c = dict(line.rsplit(" ", 1) for line in out.splitlines())
    py = {}
    for cname, st in STRUCTS.items():
        py[cname] = str(ctypes.sizeof(st))
        for f in st._fields_:
            d = getattr(st, f[0])
            py[f"{cname}.{f[0]}"] = f"{d.offset}+{d.size}"
    diff = {k: (c[k], py[k]) for k in c if c[k] != py[k]}
    assert not diff, f"(C, Python) differ: {diff}"
