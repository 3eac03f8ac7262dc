"""conftest.py - fixtures of the binding's tests: a fresh store per test
and small namespaces; the package is imported from this source tree
(run_pytest.sh sets PYTHONPATH and KVTIER_LIB to the build's library)."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvtier  # noqa: E402

SRC = os.environ.get("KVTIER_SRC") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture
def engine(tmp_path):
    with kvtier.Engine(tmp_path / "store", hot_bytes=64 << 20) as e:
        yield e


@pytest.fixture
def cold_dir(tmp_path):
    return tmp_path / "cold"


def open_cold(path, **kw):
    """An engine with a cold tier small enough for tests (two 1 MiB segments+)."""
    return kvtier.Engine(path, hot_bytes=kw.pop("hot_bytes", 64 << 20), cold_bytes=64 << 20,
                         cold_segment_bytes=1 << 20, **kw)


def make_ns(e, dtype="f32", layers=3, heads=2, dim=8, bt=16, model="pytest-model"):
    return e.namespace(model, "fp-1", n_layers=layers, n_kv_heads=heads, head_dim=dim,
                       dtype=dtype, block_tokens=bt)


def rand_block(ns, seed, scale=1.0):
    """Random K and V of one layer block in ns's dtype."""
    rng = np.random.default_rng(seed)
    k = (rng.standard_normal(ns.block_shape) * scale).astype(np.float32)
    v = (rng.standard_normal(ns.block_shape) * scale).astype(np.float32)
    if ns.np_dtype == np.uint16:  # bfloat16 bits: the top half of f32
        return (k.view(np.uint32) >> 16).astype(np.uint16), (v.view(np.uint32) >> 16).astype(np.uint16)
    return k.astype(ns.np_dtype), v.astype(ns.np_dtype)
