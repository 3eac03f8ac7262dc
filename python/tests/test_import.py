"""test_import.py - the binding's kvtier import: a safetensors file
written here with numpy alone is stored as full blocks bit for bit, a
second import deduplicates, the tail is not stored, and malformed files
are refused with nothing stored."""
import json
import struct

import numpy as np
import pytest

import kvtier
from kvtier import errors as E
from conftest import make_ns


def write_st(path, tensors, extra=b"", header_patch=None):
    hdr, blobs, off = {}, [], 0
    for name, a in tensors.items():
        dt = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32",
              np.dtype(np.uint16): "BF16"}[a.dtype]
        b = np.ascontiguousarray(a).tobytes()
        hdr[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if header_patch:
        header_patch(hdr)
    h = json.dumps(hdr).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs) + extra)


def kv_file(path, layers, tokens, heads, dim, dtype=np.float16, seed=0, **kw):
    rng = np.random.default_rng(seed)
    t = {}
    for i in range(layers):
        t[f"layers.{i}.k"] = rng.standard_normal((tokens, heads, dim)).astype(dtype)
        t[f"layers.{i}.v"] = rng.standard_normal((tokens, heads, dim)).astype(dtype)
    write_st(path, t, **kw)
    return t


def test_import_bit_exact_dedup_and_tail(engine, tmp_path):
    ns = make_ns(engine, dtype="f16", layers=2, heads=2, dim=8, bt=16)
    toks = list(range(1000, 1000 + 40))  # two full blocks and an 8-token tail
    t = kv_file(tmp_path / "kv.safetensors", 2, 40, 2, 8)
    r = kvtier.import_safetensors(ns, str(tmp_path / "kv.safetensors"), toks)
    assert r == kvtier.ImportResult(2, 2, 0, 8)
    with ns.sequence() as s:
        for b in range(2):
            info = s.append(toks[16 * b:16 * b + 16])
            assert info.layers == (0, 1)
        for layer in range(2):
            k, v = s.gather(layer)
            assert k.tobytes() == t[f"layers.{layer}.k"][:32].tobytes()
            assert v.tobytes() == t[f"layers.{layer}.v"][:32].tobytes()
    assert ns.lookup(toks).n_found == 2  # the tail block is not stored
    r = kvtier.import_safetensors(ns, str(tmp_path / "kv.safetensors"), toks)
    assert r == kvtier.ImportResult(2, 0, 2, 8)


@pytest.mark.parametrize("case", ["truncated", "trailing", "shape", "dtype", "missing_v",
                                  "offsets", "not_json", "tokens", "nan"])
def test_bad_files_refused_and_nothing_stored(engine, tmp_path, case):
    ns = make_ns(engine, dtype="f16", layers=2, heads=2, dim=8, bt=16)
    p = str(tmp_path / "bad.safetensors")
    toks = list(range(32))
    if case == "truncated":
        kv_file(p, 2, 32, 2, 8)
        with open(p, "r+b") as f:
            f.truncate(100)
    elif case == "trailing":
        kv_file(p, 2, 32, 2, 8, extra=b"\0" * 4)
    elif case == "shape":
        kv_file(p, 2, 32, 3, 8)
    elif case == "dtype":
        kv_file(p, 2, 32, 2, 8, dtype=np.float32)
    elif case == "missing_v":
        kv_file(p, 2, 32, 2, 8, header_patch=lambda h: h.pop("layers.1.v"))
    elif case == "offsets":
        kv_file(p, 2, 32, 2, 8, header_patch=lambda h: h["layers.0.k"].update(
            data_offsets=[0, 1 << 40]))
    elif case == "not_json":
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", 5) + b"{oops")
    elif case == "tokens":
        kv_file(p, 2, 32, 2, 8)
        toks = toks[:31]
    elif case == "nan":
        t = kv_file(p, 2, 32, 2, 8)
        t["layers.1.v"][20, 1, 3] = np.nan
        write_st(p, t)
    with pytest.raises(kvtier.KvtierError) as ei:
        kvtier.import_safetensors(ns, p, toks)
    assert ei.value.code in (E.ECORRUPT, E.ESHAPE, E.EDTYPE, E.ECOUNT, E.ENONFINITE)
    assert engine.stats()["puts"] == 0
    assert ns.lookup(toks).n_found == 0
