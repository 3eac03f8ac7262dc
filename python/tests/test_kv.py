"""test_kv.py - K and V through the binding: bit-exact round trips in each
dtype, arrays passed by pointer (never copied), gathers written into the
caller's arrays, and every bad shape, dtype or layout refused with its
kvtier code before anything is stored."""
import ctypes

import numpy as np
import pytest

import kvtier
from kvtier import engine as kengine
from kvtier import errors as E
from conftest import make_ns, rand_block


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_put_gather_read_round_trip_bit_exact(engine, dtype):
    ns = make_ns(engine, dtype=dtype)
    blocks = {}
    with ns.sequence() as s:
        for b in range(3):
            info = s.append(np.arange(16 * b, 16 * b + 16))
            assert info.block == b and info.layers_present == 0
            for layer in range(ns.n_layers):
                k, v = rand_block(ns, 100 * b + layer)
                s.put(b, layer, k, v)
                blocks[b, layer] = (k, v)
        for layer in range(ns.n_layers):
            k, v = s.gather(layer)
            assert k.shape == (48, ns.n_kv_heads, ns.head_dim) and k.dtype == ns.np_dtype
            want_k = np.concatenate([blocks[b, layer][0] for b in range(3)])
            want_v = np.concatenate([blocks[b, layer][1] for b in range(3)])
            assert k.tobytes() == want_k.tobytes() and v.tobytes() == want_v.tobytes()
        rk, rv = s.read(1, 2)
        assert rk.tobytes() == blocks[1, 2][0].tobytes()
        assert rv.tobytes() == blocks[1, 2][1].tobytes()


class _Spy:
    """Stands in for the library's put and gather calls to see the
    pointers they receive."""

    def __init__(self):
        self.seen = []
        self.put, self.gather = kvtier._lib.raw_seq_put, kvtier._lib.raw_seq_gather

    def raw_put(self, h, block, layer, kv_ref):
        kv = kv_ref._obj  # the kvt_kv struct byref() points at
        self.seen.append((kv.k, kv.v))
        return self.put(h, block, layer, kv_ref)

    def raw_gather(self, h, layer, k, v, *rest):
        self.seen.append((k.value, v.value))
        return self.gather(h, layer, k, v, *rest)


class _LibSpy:
    """Stands in for the typed library handle: records what the one-call
    forms (kvt_seq_put_layers, kvt_seq_gather_layers) receive, as the
    per-layer pointers they imply."""

    def __init__(self, real, n_layers):
        self.real, self.n, self.seen = real, n_layers, []

    def __getattr__(self, name):
        fn = getattr(self.real, name)
        if name == "kvt_seq_put_layers":
            def call(h, block, first, n, kv_ref, stride, done):
                kv = kv_ref._obj
                self.seen += [(kv.k + i * stride, kv.v + i * stride) for i in range(n)]
                return fn(h, block, first, n, kv_ref, stride, done)
            return call
        if name == "kvt_seq_gather_layers":
            def call(h, first, n, k, v, stride, *rest):
                self.seen += [(k + i * stride, v + i * stride) for i in range(n)]
                return fn(h, first, n, k, v, stride, *rest)
            return call
        return fn


@pytest.mark.parametrize("token_block_calls", [False, True])
def test_put_and_gather_pass_the_callers_memory(engine, monkeypatch, token_block_calls):
    ns = make_ns(engine)
    spy = _Spy()
    monkeypatch.setattr(kvtier._lib, "raw_seq_put", spy.raw_put)
    monkeypatch.setattr(kvtier._lib, "raw_seq_gather", spy.raw_gather)
    if token_block_calls and kengine._HAS_LAYER_CALLS:
        spy = _LibSpy(kengine.lib, ns.n_layers)
        monkeypatch.setattr(kengine, "lib", spy)
    k = np.stack([rand_block(ns, i)[0] for i in range(ns.n_layers)])
    v = np.stack([rand_block(ns, i)[1] for i in range(ns.n_layers)])
    k_out = np.empty((ns.n_layers, 32, ns.n_kv_heads, ns.head_dim), np.float32)
    v_out = np.empty_like(k_out)
    with ns.sequence() as s:
        b = s.append(range(16)).block
        if token_block_calls:
            s.put_layers(b, k, v)
            assert s.gather_layers(k_out, v_out) == [16] * ns.n_layers
        else:
            for layer in range(ns.n_layers):
                s.put(b, layer, k[layer], v[layer])
            for layer in range(ns.n_layers):
                s.gather(layer, k_out[layer], v_out[layer])
    L, step, ostep = ns.n_layers, k[0].nbytes, k_out[0].nbytes
    assert spy.seen[:L] == [(k.ctypes.data + i * step, v.ctypes.data + i * step)
                            for i in range(L)]
    assert spy.seen[L:] == [(k_out.ctypes.data + i * ostep, v_out.ctypes.data + i * ostep)
                            for i in range(L)]
    assert np.array_equal(k_out[:, :16], k) and np.array_equal(v_out[:, :16], v)


def test_token_block_calls_check_their_arrays(engine):
    ns = make_ns(engine)
    k = np.zeros((ns.n_layers,) + ns.block_shape, np.float32)
    with ns.sequence() as s:
        b = s.append(range(16)).block
        with pytest.raises(kvtier.ShapeError) as ei:
            s.put_layers(b, k[:, :8].copy(), k[:, :8].copy())
        assert ei.value.code == E.ESHAPE
        with pytest.raises(kvtier.ShapeError) as ei:
            s.put_layers(b, k.astype(np.float16), k.astype(np.float16))
        assert ei.value.code == E.EDTYPE
        with pytest.raises(kvtier.NotFoundError):
            s.put_layers(b, k, k, first_layer=1)  # layers 1..3 of 3
        assert engine.stats()["puts"] == 0
        s.put_layers(b, k, k)
        small = np.zeros((ns.n_layers, 8, ns.n_kv_heads, ns.head_dim), np.float32)
        with pytest.raises(kvtier.ShapeError) as ei:
            s.gather_layers(small, small.copy())
        assert ei.value.code == E.EBUFSIZE and "layer 0" in str(ei.value)


def test_gather_writes_into_the_callers_arrays(engine):
    ns = make_ns(engine)
    k, v = rand_block(ns, 2)
    k_out = np.full((40, ns.n_kv_heads, ns.head_dim), -7.0, np.float32)
    v_out = np.full_like(k_out, -7.0)
    with ns.sequence() as s:
        s.put(s.append(range(16)).block, 1, k, v)
        gk, gv = s.gather(1, k_out, v_out)
    assert gk.shape[0] == 16 and np.shares_memory(gk, k_out) and np.shares_memory(gv, v_out)
    assert np.array_equal(k_out[:16], k) and np.array_equal(v_out[:16], v)
    assert (k_out[16:] == -7.0).all(), "wrote past the gathered tokens"


def test_gather_into_too_small_array_is_ebufsize_and_writes_nothing(engine):
    ns = make_ns(engine)
    k, v = rand_block(ns, 3)
    small = np.full((24, ns.n_kv_heads, ns.head_dim), 5.0, np.float32)
    small_v = small.copy()
    with ns.sequence() as s:
        for b in range(2):
            s.put(s.append(range(16 * b, 16 * b + 16)).block, 0, k, v)
        with pytest.raises(kvtier.ShapeError) as ei:
            s.gather(0, small, small_v)
    assert ei.value.code == E.EBUFSIZE
    assert (small == 5.0).all() and (small_v == 5.0).all()


def _seq_with_block(ns):
    s = ns.sequence()
    s.append(range(16))
    return s


@pytest.mark.parametrize("bad,code,word", [
    (lambda ns: np.zeros((8, 2, 8), np.float32), E.ESHAPE, "n_tokens"),
    (lambda ns: np.zeros((16, 3, 8), np.float32), E.ESHAPE, "n_heads"),
    (lambda ns: np.zeros((16, 2, 4), np.float32), E.ESHAPE, "head_dim"),
    (lambda ns: np.zeros((16, 16), np.float32), E.ESHAPE, "block_tokens"),
    (lambda ns: np.zeros((16, 2, 8), np.float16), E.EDTYPE, "dtype"),
    (lambda ns: np.zeros((16, 2, 8), np.float64), E.EDTYPE, "float64"),
    (lambda ns: np.zeros((16, 8, 2), np.float32).transpose(0, 2, 1), E.ESHAPE, "contiguous"),
    (lambda ns: np.zeros((32, 2, 8), np.float32)[::2], E.ESHAPE, "contiguous"),
    (lambda ns: [[0.0] * 8] * 16, E.ESHAPE, "numpy array"),
])
def test_put_bad_arrays_raise_with_the_kvtier_code(engine, bad, code, word):
    ns = make_ns(engine)
    s = _seq_with_block(ns)
    arr = bad(ns)
    with pytest.raises(kvtier.ShapeError) as ei:
        s.put(0, 0, arr, arr)
    assert ei.value.code == code
    assert word in str(ei.value)
    assert engine.stats()["puts"] == 0, "a refused put stored something"
    s.release()


def test_put_k_and_v_of_different_shapes(engine):
    ns = make_ns(engine)
    s = _seq_with_block(ns)
    k, v = rand_block(ns, 4)
    with pytest.raises(kvtier.ShapeError) as ei:
        s.put(0, 0, k, v[:, :1].copy())
    assert ei.value.code == E.ESHAPE
    s.release()


def test_nonfinite_is_refused_by_the_library(engine):
    ns = make_ns(engine)
    s = _seq_with_block(ns)
    k, v = rand_block(ns, 5)
    k[3, 1, 2] = np.nan
    with pytest.raises(kvtier.KvtierError) as ei:
        s.put(0, 0, k, v)
    assert ei.value.code == E.ENONFINITE
    s.release()


def test_gather_out_arrays_checked(engine):
    ns = make_ns(engine)
    s = _seq_with_block(ns)
    good = ns.empty_block()
    ro = ns.empty_block()
    ro.flags.writeable = False
    cases = [(good.astype(np.float16), good, E.EDTYPE), (ro, good, E.ESHAPE),
             (np.empty((16, 2, 4), np.float32), good, E.ESHAPE),
             (np.empty((32, 2, 8), np.float32)[::2], good, E.ESHAPE)]
    for k_out, v_out, code in cases:
        with pytest.raises(kvtier.ShapeError) as ei:
            s.gather(0, k_out, v_out)
        assert ei.value.code == code
        with pytest.raises(kvtier.ShapeError):
            s.read(0, 0, k_out, v_out)
    s.release()


def test_read_buffer_must_be_one_block(engine):
    ns = make_ns(engine)
    k, v = rand_block(ns, 6)
    with ns.sequence() as s:
        s.put(s.append(range(16)).block, 0, k, v)
        big = ns.empty_block(2)
        with pytest.raises(kvtier.ShapeError) as ei:
            s.read(0, 0, big, big.copy())
        assert ei.value.code == E.EBUFSIZE


def test_tokens_are_checked(engine):
    ns = make_ns(engine)
    with ns.sequence() as s:
        with pytest.raises(kvtier.ShapeError) as ei:
            s.append(range(15))
        assert ei.value.code == E.ECOUNT
        with pytest.raises(kvtier.ShapeError):
            s.append([-1] + list(range(15)))
        with pytest.raises(kvtier.ShapeError):
            s.append(np.linspace(0, 1, 16))
        assert s.blocks == 0
