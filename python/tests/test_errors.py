"""test_errors.py - every failure raises a KvtierError with the C code and
kvt_last_error()'s detail; the Python code table equals include/kvtier.h."""
import os
import re

import numpy as np
import pytest

import kvtier
from kvtier import errors as E
from conftest import SRC, make_ns


def header_codes():
    with open(os.path.join(SRC, "include", "kvtier.h")) as f:
        text = f.read()
    return {m.group(1): int(m.group(2)) for m in
            re.finditer(r"#define KVT_(E[A-Z]+)\s+\((-\d+)\)", text)}


def test_code_table_matches_header():
    h = header_codes()
    assert len(h) >= 21, "the header parse found too few codes"
    assert E.CODES == h, f"python/kvtier/errors.py and include/kvtier.h differ: " \
        f"only in C {sorted(set(h) - set(E.CODES))}, only in Python {sorted(set(E.CODES) - set(h))}"


def test_strerror_is_the_c_one():
    assert kvtier.strerror(E.ECORRUPT) == "stored data failed a check"
    assert kvtier.strerror(0) == "success"


def test_open_bad_option_carries_code_and_detail(tmp_path):
    with pytest.raises(kvtier.KvtierError) as ei:
        kvtier.Engine(tmp_path / "s", io_depth=0)
    err = ei.value
    assert err.code == E.EOPTION and err.name == "KVT_EOPTION"
    assert "io_depth" in err.detail and "1..4096" in err.detail
    assert "io_depth" in str(err)


def test_unknown_option_name_is_refused(tmp_path):
    with pytest.raises(kvtier.KvtierError) as ei:
        kvtier.Engine(tmp_path / "s", io_dpeth=4)
    assert ei.value.code == E.EOPTION


def test_second_writer_is_locked(tmp_path):
    with kvtier.Engine(tmp_path / "s"):
        with pytest.raises(kvtier.LockedError) as ei:
            kvtier.Engine(tmp_path / "s")
        assert ei.value.code == E.ELOCKED
        assert "this process" in ei.value.detail


def test_nocreate_missing_dir_is_enoent(tmp_path):
    with pytest.raises(kvtier.KvtierError) as ei:
        kvtier.Engine(tmp_path / "absent", flags=kvtier.OPEN_NOCREATE)
    assert ei.value.name == "ENOENT"


def test_namespace_conflict_and_bad_shape(engine):
    make_ns(engine, layers=2)
    with pytest.raises(kvtier.KvtierError) as ei:
        make_ns(engine, layers=3)
    assert ei.value.code == E.ENSCONFLICT
    with pytest.raises(kvtier.ShapeError) as ei:
        make_ns(engine, bt=12, model="other")
    assert ei.value.code == E.ESHAPE and "block_tokens" in ei.value.detail


def test_put_before_append_is_not_found(engine):
    ns = make_ns(engine)
    k = np.zeros(ns.block_shape, np.float32)
    with ns.sequence() as s, pytest.raises(kvtier.NotFoundError) as ei:
        s.put(0, 0, k, k)
    assert ei.value.code == E.ENOTFOUND


def test_closed_engine_refuses_calls_on_its_sequences(tmp_path):
    e = kvtier.Engine(tmp_path / "s")
    ns = make_ns(e)
    s = ns.sequence()
    e.close()
    with pytest.raises(kvtier.KvtierError) as ei:
        s.append(range(16))
    assert ei.value.code == E.ESTATE
    with pytest.raises(kvtier.KvtierError) as ei:
        e.stats()
    assert ei.value.code == E.ESTATE
    s.release()  # no-op, never touches the freed handle


def test_policy_errors(engine):
    ns = make_ns(engine)
    with ns.sequence() as s:
        with pytest.raises(kvtier.KvtierError) as ei:
            s.set_policy("lru")
        assert ei.value.code == E.EOPTION
        with pytest.raises(kvtier.KvtierError) as ei:
            s.set_policy("recent", budget=1.5)
        assert ei.value.code == E.EOPTION
