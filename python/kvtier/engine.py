"""engine.py - the Python face of include/kvtier.h: Engine, Namespace,
Sequence and Load over ctypes, with K and V passed as numpy arrays by
pointer (never copied by the binding) and every failure raised as a
KvtierError carrying the C code and kvt_last_error()'s detail.

Lifetimes follow the C API: closing an Engine frees its sequences and
pending loads, so the Python objects are told and refuse further calls
(KVT_ESTATE) instead of touching freed memory. ctypes releases the GIL
during each C call, so several threads, each with its own Sequence, run
the engine in parallel (the C API's threading rule: a sequence belongs to
one thread at a time).

To bind a new C call: declare it in _lib._PROTOTYPES, then add a method
that calls it and passes the return code to self._check(rc, "kvt_name").
"""
from __future__ import annotations

import ctypes
import os
import threading
import weakref
from ctypes import create_string_buffer, byref, c_double, c_float, c_int, c_size_t, c_uint32, c_uint64, c_void_p
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence as Seq, Tuple, Union

import numpy as np

from . import _lib
from . import errors as E
from ._lib import lib

F32, F16, BF16 = 1, 2, 3
TIER_NONE, TIER_HOT, TIER_WARM, TIER_COLD = 0, 1, 2, 3
OPEN_RDONLY, OPEN_VERIFY_DEDUP, OPEN_METADATA_ONLY, OPEN_NOCREATE = 0x1, 0x2, 0x4, 0x8
ALL_LAYERS = 0xFFFFFFFF
SCORERS = {"full": 0, "recent": 1, "sink-recent": 2, "h2o": 3, "snapkv": 4, "tova": 5,
           "external": 6, "learned": 7, "auto": 8}

# numpy dtype -> kvt_dtype. numpy has no bfloat16: a BF16 namespace takes
# uint16 arrays holding the raw bfloat16 bits (or ml_dtypes' bfloat16).
_NP_TO_KVT = {np.dtype(np.float32): F32, np.dtype(np.float16): F16, np.dtype(np.uint16): BF16}
_KVT_TO_NP = {F32: np.dtype(np.float32), F16: np.dtype(np.float16), BF16: np.dtype(np.uint16)}
_DTYPE_NAMES = {"f32": F32, "float32": F32, "f16": F16, "float16": F16, "bf16": BF16,
                "bfloat16": BF16}

Tokens = Union[Seq[int], np.ndarray]
# kvt_seq_put_layers / kvt_seq_gather_layers: one C call per token block
_HAS_LAYER_CALLS = _lib.has("kvt_seq_put_layers") and _lib.has("kvt_seq_gather_layers")


class AppendInfo(NamedTuple):
    """What Sequence.append() found (kvt_append_info)."""
    block: int           # index of the token block in the sequence
    layers_present: int  # layers adopted from RAM: no put needed for them
    key: bytes           # the 16-byte block key
    durable: bool        # in the cold tier: its layers can be loaded
    layers: Tuple[int, ...] = ()  # which layers are present (kvt_append_info.layers_mask)


class LookupEntry(NamedTuple):
    key: bytes
    tier: int            # slowest tier any of its layers is in
    est_load_us: float


class Lookup(NamedTuple):
    """What Namespace.lookup() found: n_found leading full blocks stored."""
    n_found: int
    entries: List[LookupEntry]


class BlockInfo(NamedTuple):
    """One retained block (kvt_gathered)."""
    block: int
    token_pos: int
    tier: int
    exact: bool


class Attention(NamedTuple):
    """Sequence.attend()'s result: out [n_q_heads, head_dim] f32, lse
    [n_q_heads] (natural log of the softmax denominator, -inf when nothing
    is retained) and the mass of each retained block [n_blocks]."""
    out: np.ndarray
    lse: np.ndarray
    block_mass: np.ndarray


class LoadResult(NamedTuple):
    status: int          # 0, or the code this request failed with
    tier: int            # the tier it was loaded from


def _tokens(tokens: Tokens) -> np.ndarray:
    """Token ids as a contiguous uint32 array (ids are small; this copy is
    not of K or V). Refuses ids outside [0, 2^32) instead of wrapping."""
    a = np.asarray(tokens)
    if a.dtype == np.uint32 and a.ndim == 1 and a.flags.c_contiguous:
        return a
    if a.size and (a.dtype.kind not in "iu" or a.ndim != 1):
        raise E.ShapeError(E.ESHAPE, f"tokens must be a 1-D sequence of integers, got "
                           f"{a.dtype} of shape {a.shape}", "tokens")
    if a.size and (int(a.min()) < 0 or int(a.max()) > 0xFFFFFFFF):
        raise E.ShapeError(E.ECOUNT, "token ids must be in [0, 2^32)", "tokens")
    return np.ascontiguousarray(a, dtype=np.uint32).reshape(-1)


_addressof = ctypes.addressof
_from_buffer = ctypes.c_char.from_buffer


def _ptr(a: np.ndarray) -> int:
    """The address of a's first byte. Through the buffer protocol where
    a is writeable and not empty (several times cheaper than
    __array_interface__, which builds a dict); else numpy's own."""
    try:
        return _addressof(_from_buffer(a))
    except (TypeError, ValueError):
        return a.__array_interface__["data"][0]


def _check_array(name: str, a: Any, writeable: bool = False) -> np.ndarray:
    """a is a numpy array kvtier may read (or write) through its pointer:
    C-contiguous and aligned; raised as KVT_ESHAPE otherwise (never copied)."""
    if not isinstance(a, np.ndarray):
        raise E.ShapeError(E.ESHAPE, f"{name} must be a numpy array, got {type(a).__name__}",
                           name)
    if not a.flags.c_contiguous or not a.flags.aligned:
        raise E.ShapeError(E.ESHAPE, f"{name} must be C-contiguous and aligned (strides "
                           f"{a.strides} for shape {a.shape}); kvtier does not copy it", name)
    if writeable and not a.flags.writeable:
        raise E.ShapeError(E.ESHAPE, f"{name} is read-only; kvtier writes into it", name)
    return a


def _key_bytes(k: _lib.Key) -> bytes:
    return bytes(k.b)


def _key_struct(key: Union[bytes, bytearray]) -> _lib.Key:
    if len(key) != 16:
        raise E.ShapeError(E.ESHAPE, f"a key is 16 bytes, got {len(key)}", "key")
    k = _lib.Key()
    ctypes.memmove(k.b, bytes(key), 16)
    return k


class _Handle:
    """A C handle that its owner can invalidate (engine closed)."""
    _h: Optional[int] = None

    def _live(self, what: str) -> int:
        h = self._h
        if not h:
            raise E.KvtierError(E.ESTATE, f"{what} is closed or released", what)
        return h


class Engine(_Handle):
    """An open kvtier store (kvt_engine_open / kvt_engine_close).

    Engine(path, hot_bytes=..., warm_bytes=..., cold_bytes=..., read_only=...,
    **options): options are kvt_options fields by name (max_seqs,
    cold_segment_bytes, io_backend, ...). path may be None with
    flags=OPEN_METADATA_ONLY. Use as a context manager, or call close().
    """

    def __init__(self, path: Optional[Union[str, os.PathLike]], *, hot_bytes: Optional[int] = None,
                 warm_bytes: Optional[int] = None, cold_bytes: Optional[int] = None,
                 read_only: bool = False, flags: int = 0, **options: Any):
        opt = _lib.Options()
        lib.kvt_options_init(byref(opt))
        for tier, v in ((TIER_HOT, hot_bytes), (TIER_WARM, warm_bytes), (TIER_COLD, cold_bytes)):
            if v is not None:
                opt.tier_bytes_limit[tier] = int(v)
        opt.flags = flags | (OPEN_RDONLY if read_only else 0)
        names = {f[0] for f in _lib.Options._fields_}
        for k, v in options.items():
            if k not in names or k in ("pad", "tier_bytes_limit"):
                raise E.KvtierError(E.EOPTION, f"no kvt_options field {k!r}", "Engine")
            setattr(opt, k, v)
        info = _lib.ErrorInfo()
        out = c_void_p()
        p = None if path is None else os.fsencode(path)
        rc = lib.kvt_engine_open_info(p, byref(opt), byref(out), byref(info))
        if rc:
            detail = info.message.decode(errors="replace") if info.code == rc else ""
            raise E.make_error(rc, detail or _lib.strerror(rc), "kvt_engine_open", detail)
        self._h = out.value
        self.path = path
        self._children: "weakref.WeakSet[_Handle]" = weakref.WeakSet()
        self._lock = threading.Lock()

    # -- errors
    def _check(self, rc: int, call: str) -> None:
        """Raise the KvtierError for rc (nothing when 0), with the detail
        kvt_last_error() recorded for this thread when it is about rc."""
        if rc == 0:
            return
        raise self._error(rc, call)

    def _error(self, rc: int, call: str, cls: Optional[type] = None) -> E.KvtierError:
        detail = ""
        if self._h:
            info = _lib.ErrorInfo()
            if lib.kvt_last_error(self._h, byref(info)) == 0 and info.code == rc:
                detail = info.message.decode(errors="replace")
        if not detail:
            msg = f"{call}: {_lib.strerror(rc)}"
        elif detail.startswith(call + ":"):
            msg = detail
        else:  # the call says more (which layer): keep both
            msg = f"{call}: {detail}"
        return E.make_error(rc, msg, call, detail, cls)

    def _adopt(self, child: _Handle) -> None:
        with self._lock:
            self._children.add(child)

    # -- lifetime
    def close(self) -> None:
        """kvt_engine_close(): frees the engine, its sequences and loads."""
        with self._lock:
            h, self._h = self._h, None
            children = list(self._children)
        if not h:
            return
        for c in children:  # freed by kvt_engine_close: never touch them again
            c._h = None
        lib.kvt_engine_close(h)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def closed(self) -> bool:
        return not self._h

    # -- namespaces
    def namespace(self, model_id: str, weights_fingerprint: str, *, n_layers: int,
                  n_kv_heads: int, head_dim: int, dtype: Union[int, str] = F16,
                  block_tokens: int = 16, rope_theta: float = 0.0, rope_dims: int = 0,
                  rope_scaling: Optional[str] = None, tp_rank: int = 0,
                  tp_size: int = 1) -> "Namespace":
        """Register a namespace, or find the one with the same identity and
        shape (kvt_ns_register). dtype: F32/F16/BF16 or "f32"/"f16"/"bf16"."""
        if isinstance(dtype, str):
            if dtype not in _DTYPE_NAMES:
                raise E.ShapeError(E.EDTYPE, f"unknown dtype {dtype!r} (f32, f16, bf16)",
                                   "namespace")
            dtype = _DTYPE_NAMES[dtype]
        d = _lib.NsDesc(model_id.encode(), weights_fingerprint.encode(), float(rope_theta),
                        rope_dims, rope_scaling.encode() if rope_scaling is not None else None,
                        tp_rank, tp_size,
                        _lib.Shape(n_layers, n_kv_heads, head_dim, int(dtype), block_tokens))
        ns = c_uint32()
        self._check(lib.kvt_ns_register(self._live("engine"), byref(d), byref(ns)),
                    "kvt_ns_register")
        return Namespace(self, ns.value)

    def namespaces(self) -> List["Namespace"]:
        """Every registered namespace (kvt_ns_get), earlier processes' included."""
        out, i = [], 0
        while True:
            nid, d = c_uint32(), _lib.NsDesc()
            rc = lib.kvt_ns_get(self._live("engine"), i, byref(nid), byref(d))
            if rc == E.ENOTFOUND:
                return out
            self._check(rc, "kvt_ns_get")
            ns = Namespace(self, nid.value)
            ns.model_id = d.model_id.decode()
            ns.weights_fingerprint = d.weights_fingerprint.decode()
            out.append(ns)
            i += 1

    # -- whole engine
    def event_fd(self) -> int:
        """kvt_event_fd(): a non-blocking eventfd, readable when loads
        complete or the durable watermark moves (for loop.add_reader);
        read 8 bytes to clear it. The engine owns it."""
        fd = lib.kvt_event_fd(self._live("engine"))
        if fd < 0:
            self._check(fd, "kvt_event_fd")
        return fd

    def metrics(self) -> str:
        """kvt_metrics_render(): the engine's state in the Prometheus text
        exposition format (docs/metrics.md)."""
        h, need = self._live("engine"), c_size_t()
        rc = lib.kvt_metrics_render(h, None, 0, byref(need))  # a size query
        if rc not in (0, E.EBUFSIZE):
            self._check(rc, "kvt_metrics_render")
        while True:
            buf = create_string_buffer(need.value + 1024)
            rc = lib.kvt_metrics_render(h, buf, len(buf), byref(need))
            if rc != E.EBUFSIZE:  # it grew meanwhile: ask again
                self._check(rc, "kvt_metrics_render")
                return buf.value.decode()

    def sync(self) -> None:
        """kvt_sync(): wait until every complete, admitted block is durable."""
        self._check(lib.kvt_sync(self._live("engine")), "kvt_sync")

    def stats(self) -> Dict[str, Any]:
        """kvt_stats_get() as a dict; per-tier arrays become dicts keyed by
        tier name ("hot", "warm", "cold", "none")."""
        st = _lib.Stats()
        self._check(lib.kvt_stats_get(self._live("engine"), byref(st)), "kvt_stats_get")
        out: Dict[str, Any] = {}
        for name, _ in _lib.Stats._fields_:
            v = getattr(st, name)
            if isinstance(v, bytes):
                out[name] = v.decode(errors="replace")
            elif isinstance(v, int):
                out[name] = v
            else:
                out[name] = {_lib.TIER_NAMES[t]: int(v[t]) for t in range(_lib.N_TIERS)}
        return out

    def tier_stats(self, tier: str) -> Dict[str, Any]:
        """kvt_stats_tier() for "hot", "warm" or "cold" (the durable store) as a
        dict: its counters, and with the learned eviction order the accesses
        its model has counted (model_accesses) and those of the copy the store
        keeps for the next open (model_saved_accesses)."""
        if tier not in _lib.TIER_NAMES[1:]:
            raise ValueError(f"tier: {tier!r} is not one of {_lib.TIER_NAMES[1:]}")
        st = _lib.TierStats()
        self._check(lib.kvt_stats_tier(self._live("engine"), _lib.TIER_NAMES.index(tier),
                                       byref(st), ctypes.sizeof(st)), "kvt_stats_tier")
        out: Dict[str, Any] = {}
        for name, _ in _lib.TierStats._fields_:
            v = getattr(st, name)
            out[name] = v.decode(errors="replace") if isinstance(v, bytes) else int(v)
        del out["filled"], out["tier"]
        out["present"] = bool(out["present"])
        return out

    def fsck(self, repair: bool = False) -> Dict[str, int]:
        """kvt_fsck() without a report callback: counts checked, bad, removed."""
        r = _lib.FsckResult()
        self._check(lib.kvt_fsck(self._live("engine"), int(repair), byref(r), None, None),
                    "kvt_fsck")
        return {"checked": r.checked, "bad": r.bad, "removed": r.removed}


class Namespace:
    """A registered namespace of an Engine: one model's KV shape."""

    def __init__(self, engine: Engine, ns_id: int):
        self.engine = engine
        self.id = ns_id
        sh = _lib.Shape()
        engine._check(lib.kvt_ns_shape(engine._live("engine"), ns_id, byref(sh)), "kvt_ns_shape")
        self.n_layers, self.n_kv_heads, self.head_dim = sh.n_layers, sh.n_kv_heads, sh.head_dim
        self.dtype, self.block_tokens = sh.dtype, sh.block_tokens
        self.np_dtype = _KVT_TO_NP[sh.dtype]
        self.block_shape: Tuple[int, int, int] = (sh.block_tokens, sh.n_kv_heads, sh.head_dim)
        self.block_bytes = int(np.prod(self.block_shape)) * self.np_dtype.itemsize
        self.model_id: Optional[str] = None
        self.weights_fingerprint: Optional[str] = None

    def __repr__(self) -> str:
        return (f"Namespace(id={self.id}, layers={self.n_layers}, kv_heads={self.n_kv_heads}, "
                f"head_dim={self.head_dim}, dtype={self.np_dtype}, "
                f"block_tokens={self.block_tokens})")

    def empty_block(self, n_blocks: int = 1) -> np.ndarray:
        """An uninitialized [n_blocks * block_tokens, kv_heads, head_dim]
        array of the namespace dtype, for loads, reads and gathers."""
        return np.empty((n_blocks * self.block_tokens, self.n_kv_heads, self.head_dim),
                        self.np_dtype)

    def sequence(self) -> "Sequence":
        """A new, empty sequence (kvt_seq_create)."""
        out = c_void_p()
        e = self.engine
        e._check(lib.kvt_seq_create(e._live("engine"), self.id, byref(out)), "kvt_seq_create")
        return Sequence(self, out.value)

    def lookup(self, tokens: Tokens) -> Lookup:
        """How many leading full blocks of tokens are stored in every layer,
        with their keys, tiers and load estimates (kvt_lookup)."""
        t = _tokens(tokens)
        max_out = len(t) // self.block_tokens
        ent = (_lib.LookupEntry * max(max_out, 1))()
        n = c_size_t()
        e = self.engine
        e._check(lib.kvt_lookup(e._live("engine"), self.id, _ptr(t), len(t), ent, max_out,
                                byref(n)), "kvt_lookup")
        found = n.value
        return Lookup(found, [LookupEntry(_key_bytes(ent[i].key), ent[i].tier,
                                          ent[i].est_load_us) for i in range(min(found, max_out))])

    def keys(self, tokens: Tokens) -> List[bytes]:
        """Keys of the full blocks of tokens (kvt_keys): 16 bytes each."""
        t = _tokens(tokens)
        m = len(t) // self.block_tokens
        ks = (_lib.Key * max(m, 1))()
        n = c_size_t()
        e = self.engine
        e._check(lib.kvt_keys(e._live("engine"), self.id, _ptr(t), len(t), ks, m, byref(n)),
                 "kvt_keys")
        return [_key_bytes(ks[i]) for i in range(n.value)]

    def seed(self) -> bytes:
        k = _lib.Key()
        e = self.engine
        e._check(lib.kvt_ns_seed(e._live("engine"), self.id, byref(k)), "kvt_ns_seed")
        return _key_bytes(k)

    def load(self, requests: Iterable[Tuple[bytes, int, np.ndarray, np.ndarray]]) -> "Load":
        """Submit loads (kvt_load_submit) of (key, layer, k_out, v_out) into
        caller arrays, each one layer block of the namespace dtype. Returns
        at once; Load.wait() completes them. The arrays must not be freed
        or resized before then (the Load keeps references to them)."""
        reqs = list(requests)
        arr = (_lib.LoadReq * max(len(reqs), 1))()
        keep = []
        for i, (key, layer, k_out, v_out) in enumerate(reqs):
            k_out = self._out_array("k_out", k_out)
            v_out = self._out_array("v_out", v_out)
            if k_out.nbytes != v_out.nbytes:
                raise E.ShapeError(E.EBUFSIZE, f"request {i}: k_out has {k_out.nbytes} bytes, "
                                   f"v_out {v_out.nbytes}", "load")
            r = arr[i]
            r.key = _key_struct(key)
            r.layer = layer
            r.k_out, r.v_out, r.bytes_each = _ptr(k_out), _ptr(v_out), k_out.nbytes
            keep.append((k_out, v_out))
        out = c_void_p()
        e = self.engine
        e._check(lib.kvt_load_submit(e._live("engine"), self.id, arr, len(reqs), byref(out)),
                 "kvt_load_submit")
        return Load(e, out.value, arr, len(reqs), keep)

    def _out_array(self, name: str, a: np.ndarray) -> np.ndarray:
        a = _check_array(name, a, writeable=True)
        if a.dtype != self.np_dtype:
            raise E.ShapeError(E.EDTYPE, f"{name} has dtype {a.dtype}, the namespace "
                               f"{self.np_dtype}", name)
        return a

    def drop(self) -> None:
        """kvt_ns_drop(): drop the namespace and every block it stored."""
        e = self.engine
        e._check(lib.kvt_ns_drop(e._live("engine"), self.id), "kvt_ns_drop")

    def drop_prefix(self, tokens: Tokens) -> int:
        """kvt_drop_prefix(): returns the number of token blocks dropped."""
        t = _tokens(tokens)
        n = c_uint64()
        e = self.engine
        e._check(lib.kvt_drop_prefix(e._live("engine"), self.id, _ptr(t), len(t), byref(n)),
                 "kvt_drop_prefix")
        return n.value

    def load_profile(self, path: str) -> None:
        """kvt_ns_load_profile(): per-layer scorers and shares for "auto"."""
        e = self.engine
        e._check(lib.kvt_ns_load_profile(e._live("engine"), self.id, path.encode()),
                 "kvt_ns_load_profile")

    def load_predictor(self, path: str) -> None:
        """kvt_ns_load_predictor(): the "learned" scorer's model."""
        e = self.engine
        e._check(lib.kvt_ns_load_predictor(e._live("engine"), self.id, path.encode()),
                 "kvt_ns_load_predictor")

    def set_codec(self, codec: str, layer: int = ALL_LAYERS) -> None:
        """kvt_ns_set_codec() with a pair name such as "k8v3"."""
        k, v = c_int(), c_int()
        e = self.engine
        e._check(lib.kvt_codec_parse(codec.encode(), byref(k), byref(v)), "kvt_codec_parse")
        e._check(lib.kvt_ns_set_codec(e._live("engine"), self.id, layer, k.value, v.value),
                 "kvt_ns_set_codec")


class Load(_Handle):
    """A submitted batch of loads. wait() completes it; a Load that is
    dropped unwaited is waited for by its finalizer (the C side holds
    pointers into it until then)."""

    def __init__(self, engine: Engine, h: int, reqs: Any, n: int, keep: list):
        self.engine = engine
        self._h = h
        self._reqs = reqs
        self._n = n
        self._keep = keep
        self.results: Optional[List[LoadResult]] = None
        engine._adopt(self)

    def poll(self, check: bool = True) -> bool:
        """kvt_load_poll(): False while reads are outstanding; True once
        done, with .results filled as wait() fills them."""
        if self.results is not None:
            return True
        rc = lib.kvt_load_poll(self._live("load"), byref(c_size_t()))
        if rc == E.EBUSY:
            return False
        self._finish(rc, check, "kvt_load_poll")
        return True

    async def wait_async(self, check: bool = True) -> List[LoadResult]:
        """wait() for asyncio: never blocks the event loop. Clears the
        engine's event fd (Engine.event_fd), polls, and if not done waits
        for the fd to become readable (loop.add_reader), then again. One
        event loop per engine reads the fd."""
        import asyncio
        import os
        loop = asyncio.get_running_loop()
        fd = self.engine.event_fd()
        while True:
            try:
                os.read(fd, 8)  # clear first: a completion after this wakes us
            except BlockingIOError:
                pass
            if self.poll(check):
                return self.results  # type: ignore[return-value]
            fut = loop.create_future()
            loop.add_reader(fd, lambda: fut.done() or fut.set_result(None))
            try:
                await fut
            finally:
                loop.remove_reader(fd)

    def wait(self, check: bool = True) -> List[LoadResult]:
        """kvt_load_wait(): copy, unpin and free the batch. Returns each
        request's (status, tier); with check, raises the first failing
        request's error (the results are on .results and on the error)."""
        if self.results is not None:
            return self.results
        rc = lib.kvt_load_wait(self._live("load"), byref(c_size_t()))
        self._finish(rc, check, "kvt_load_wait")
        return self.results  # type: ignore[return-value]

    def _finish(self, rc: int, check: bool, call: str) -> None:
        """The batch is complete and freed by the library: collect it."""
        self._h = None
        self.results = [LoadResult(self._reqs[i].status, self._reqs[i].tier)
                        for i in range(self._n)]
        n_ok = sum(1 for r in self.results if r.status == 0)
        self._reqs = self._keep = None
        if rc and check:
            err = E.make_error(rc, f"{call}: {n_ok} of {self._n} requests "
                               f"succeeded; the first failure: {_lib.strerror(rc)}", call)
            err.results = self.results  # type: ignore[attr-defined]
            raise err

    def __enter__(self) -> "Load":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._h:
            self.wait(check=False)

    def __del__(self) -> None:
        if self._h:
            try:
                self.wait(check=False)
            except Exception:
                pass


class Sequence(_Handle):
    """One agent's context (kvt_seq). Use as a context manager or call
    release(). A sequence must not be used from two threads at once."""

    def __init__(self, ns: Namespace, h: int):
        self.ns = ns
        self.engine = ns.engine
        self._h = h
        self._kv = _lib.KV()
        self._kv.dtype = ns.dtype
        self._kv_ref = byref(self._kv)
        # reused by the calls of this sequence (one thread at a time uses it):
        # the untyped fast calls take these ctypes objects as they are
        self._each, self._n = c_size_t(), c_size_t()
        self._each_ref, self._n_ref = byref(self._each), byref(self._n)
        self._hc, self._blk, self._lay = c_void_p(h), c_uint32(), c_uint32()
        self._pk, self._pv, self._zero = c_void_p(), c_void_p(), c_size_t(0)
        self.engine._adopt(self)

    def release(self) -> None:
        """kvt_seq_release(): drop its references (blocks stay cached)."""
        h, self._h = self._h, None
        if h and not self.engine.closed:
            lib.kvt_seq_release(h)

    def __enter__(self) -> "Sequence":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass

    def fork(self, n_blocks: Optional[int] = None) -> "Sequence":
        """kvt_seq_fork(): a new sequence sharing the first n_blocks blocks
        (all when None); nothing is copied."""
        out = c_void_p()
        self.engine._check(lib.kvt_seq_fork(self._live("sequence"),
                                            0xFFFFFFFF if n_blocks is None else n_blocks,
                                            byref(out)), "kvt_seq_fork")
        return Sequence(self.ns, out.value)

    @property
    def blocks(self) -> int:
        """Token blocks in the sequence (kvt_seq_blocks)."""
        return lib.kvt_seq_blocks(self._live("sequence"))

    @property
    def durable(self) -> int:
        """The durable watermark: leading blocks in the cold tier (kvt_seq_durable)."""
        return lib.kvt_seq_durable(self._live("sequence"))

    def output(self, on: bool) -> None:
        """kvt_seq_output(): what append() adds from now on is model output."""
        self.engine._check(lib.kvt_seq_output(self._live("sequence"), int(on)),
                           "kvt_seq_output")

    def append(self, tokens: Tokens) -> AppendInfo:
        """Append exactly one token block (kvt_seq_append). Layers already
        stored are adopted: layers_present of them need no put."""
        t = _tokens(tokens)
        info = _lib.AppendInfo()
        self.engine._check(lib.kvt_seq_append(self._live("sequence"), _ptr(t), len(t),
                                              byref(info)), "kvt_seq_append")
        layers = tuple(w * 64 + b for w in range(len(info.layers_mask))
                       if info.layers_mask[w] for b in range(64) if info.layers_mask[w] >> b & 1)
        return AppendInfo(info.block, info.layers_present, _key_bytes(info.key),
                          bool(info.durable), layers)

    def put(self, block: int, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """Put K and V of one layer block (kvt_seq_put), each a C-contiguous
        [block_tokens, n_kv_heads, head_dim] array of the namespace dtype,
        read in place by the library (no copy here). A wrong shape or
        dtype raises ShapeError with KVT_ESHAPE or KVT_EDTYPE."""
        ns, kv = self.ns, self._kv
        self._h or self._live("sequence")
        # fast path: the common case checked in a few attribute reads
        if (type(k) is np.ndarray and type(v) is np.ndarray and k.flags.carray
                and v.flags.carray and k.dtype is ns.np_dtype and v.dtype is ns.np_dtype
                and k.shape == ns.block_shape and v.shape == ns.block_shape):
            kv.k, kv.v = _ptr(k), _ptr(v)
            kv.dtype = ns.dtype
            kv.n_tokens, kv.n_heads, kv.head_dim = ns.block_shape
        else:
            self._kv_of(k, v)  # every check, each with its own message
        self._blk.value, self._lay.value = block, layer
        rc = _lib.raw_seq_put(self._hc, self._blk, self._lay, self._kv_ref)
        if rc:
            self.engine._check(rc, "kvt_seq_put")

    def put_layers(self, block: int, k: np.ndarray, v: np.ndarray, first_layer: int = 0) -> None:
        """Put several layers of one token block in one call: k and v are
        C-contiguous [n, block_tokens, n_kv_heads, head_dim] arrays (a whole
        token block when n is n_layers), read in place; layer first_layer + i
        gets k[i], v[i]. Checked once, then one kvt_seq_put() per layer. On
        a failure the layers before the failing one are put (as with
        separate put() calls); the error names the layer."""
        ns = self.ns
        for name, a in (("k", k), ("v", v)):
            _check_array(name, a)
            if a.dtype is not ns.np_dtype and a.dtype != ns.np_dtype:
                raise E.ShapeError(E.EDTYPE, f"{name} has dtype {a.dtype}, the namespace "
                                   f"{ns.np_dtype}", "put_layers")
            if a.ndim != 4 or a.shape[1:] != ns.block_shape:
                raise E.ShapeError(E.ESHAPE, f"{name} must be [layers, "
                                   f"{', '.join(map(str, ns.block_shape))}], got "
                                   f"{list(a.shape)}", "put_layers")
        if k.shape != v.shape:
            raise E.ShapeError(E.ESHAPE, f"k is {list(k.shape)}, v {list(v.shape)}: they must "
                               "match", "put_layers")
        n = k.shape[0]
        if first_layer < 0 or first_layer + n > ns.n_layers:
            raise E.NotFoundError(E.ENOTFOUND, f"layers {first_layer}..{first_layer + n - 1}: "
                                  f"the namespace has {ns.n_layers}", "put_layers")
        h = self._live("sequence")
        kv, ref, put, step = self._kv, self._kv_ref, _lib.raw_seq_put, ns.block_bytes
        hc, blk, lay = self._hc, self._blk, self._lay
        kv.dtype = ns.dtype
        kv.n_tokens, kv.n_heads, kv.head_dim = ns.block_shape
        blk.value = block
        pk, pv = _ptr(k), _ptr(v)
        if _HAS_LAYER_CALLS:  # one C call for every layer
            kv.k, kv.v = pk, pv
            done = c_uint32()
            rc = lib.kvt_seq_put_layers(h, block, first_layer, n, ref, step, byref(done))
            if rc:
                raise self.engine._error(rc, f"kvt_seq_put (layer {first_layer + done.value})")
            return
        for i, off in enumerate(range(0, n * step, step)):
            kv.k, kv.v = pk + off, pv + off
            lay.value = first_layer + i
            rc = put(hc, blk, lay, ref)
            if rc:
                raise self.engine._error(rc, f"kvt_seq_put (layer {first_layer + i})")

    def gather_layers(self, k_out: np.ndarray, v_out: np.ndarray,
                      first_layer: int = 0) -> List[int]:
        """Gather several layers in one call, each into its slice of
        caller-owned arrays [n, capacity_tokens, n_kv_heads, head_dim]:
        layer first_layer + i into k_out[i], v_out[i] (kvt_seq_gather per
        layer). Returns the tokens written per layer (k_out[i, :t[i]]).
        Raises as gather() does, naming the layer; layers before it are
        written."""
        ns = self.ns
        for name, a in (("k_out", k_out), ("v_out", v_out)):
            ns._out_array(name, a)
            if a.ndim != 4 or a.shape[2:] != ns.block_shape[1:]:
                raise E.ShapeError(E.ESHAPE, f"{name} must be [layers, tokens, "
                                   f"{ns.n_kv_heads}, {ns.head_dim}], got {list(a.shape)}",
                                   "gather_layers")
        if k_out.shape != v_out.shape:
            raise E.ShapeError(E.ESHAPE, f"k_out is {list(k_out.shape)}, v_out "
                               f"{list(v_out.shape)}: they must match", "gather_layers")
        n = k_out.shape[0]
        if first_layer < 0 or first_layer + n > ns.n_layers:
            raise E.NotFoundError(E.ENOTFOUND, f"layers {first_layer}..{first_layer + n - 1}: "
                                  f"the namespace has {ns.n_layers}", "gather_layers")
        h = self._live("sequence")
        step = k_out.nbytes // n if n else 0
        per_token = ns.block_bytes // ns.block_tokens
        pk, pv = _ptr(k_out), _ptr(v_out)
        if _HAS_LAYER_CALLS and n:  # one C call for every layer
            got, done = (c_size_t * n)(), c_uint32()
            got[0] = step
            rc = lib.kvt_seq_gather_layers(h, first_layer, n, pk, pv, step, got, byref(done))
            if rc:
                bad = first_layer + done.value
                if rc == E.ENOTRESIDENT:
                    raise self._not_resident(bad, "kvt_seq_gather")
                raise self.engine._error(rc, f"kvt_seq_gather (layer {bad})")
            return [b // per_token for b in got]
        each, each_ref, n_ref, gather = self._each, self._each_ref, self._n_ref, _lib.raw_seq_gather
        hc, lay, ck, cv, zero = self._hc, self._lay, self._pk, self._pv, self._zero
        out = []
        for i, off in enumerate(range(0, n * step, step)):
            each.value = step
            lay.value, ck.value, cv.value = first_layer + i, pk + off, pv + off
            rc = gather(hc, lay, ck, cv, each_ref, None, zero, n_ref)
            if rc:
                if rc == E.ENOTRESIDENT:
                    raise self._not_resident(first_layer + i, "kvt_seq_gather")
                raise self.engine._error(rc, f"kvt_seq_gather (layer {first_layer + i})")
            out.append(each.value)
        return [b // per_token for b in out]

    def _kv_of(self, k: Any, v: Any) -> _lib.KV:
        _check_array("k", k)
        _check_array("v", v)
        if k.shape != v.shape or k.dtype != v.dtype:
            raise E.ShapeError(E.ESHAPE, f"k is {k.dtype}{list(k.shape)}, v is "
                               f"{v.dtype}{list(v.shape)}: they must match", "put")
        if k.ndim != 3:
            raise E.ShapeError(E.ESHAPE, f"k and v must be [block_tokens, n_kv_heads, head_dim]"
                               f" = {list(self.ns.block_shape)}, got {list(k.shape)}", "put")
        dt = _NP_TO_KVT.get(k.dtype)
        if dt is None:
            raise E.ShapeError(E.EDTYPE, f"k and v have dtype {k.dtype}; kvtier takes float32, "
                               "float16, or uint16 holding bfloat16 bits", "put")
        kv = self._kv
        kv.k, kv.v = _ptr(k), _ptr(v)
        kv.dtype = dt
        kv.n_tokens, kv.n_heads, kv.head_dim = k.shape
        return kv

    def _out_pair(self, k_out: Optional[np.ndarray], v_out: Optional[np.ndarray],
                  n_tokens: int) -> Tuple[np.ndarray, np.ndarray]:
        """Caller arrays checked for a write of n_tokens (or new ones)."""
        if k_out is None and v_out is None:
            shape = (n_tokens, self.ns.n_kv_heads, self.ns.head_dim)
            return np.empty(shape, self.ns.np_dtype), np.empty(shape, self.ns.np_dtype)
        if k_out is None or v_out is None:
            raise E.ShapeError(E.ENULL, "give both k_out and v_out, or neither", "gather")
        for name, a in (("k_out", k_out), ("v_out", v_out)):
            self.ns._out_array(name, a)
            if a.ndim != 3 or a.shape[1:] != (self.ns.n_kv_heads, self.ns.head_dim):
                raise E.ShapeError(E.ESHAPE, f"{name} must be [tokens, {self.ns.n_kv_heads}, "
                                   f"{self.ns.head_dim}], got {list(a.shape)}", name)
        if k_out.shape != v_out.shape:
            raise E.ShapeError(E.ESHAPE, f"k_out is {list(k_out.shape)}, v_out "
                               f"{list(v_out.shape)}: they must match", "gather")
        return k_out, v_out

    def read(self, block: int, layer: int, k_out: Optional[np.ndarray] = None,
             v_out: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """Copy one layer block out (kvt_seq_read) into k_out and v_out
        (each exactly one block) or into new arrays; returns them."""
        k_out, v_out = self._out_pair(k_out, v_out, self.ns.block_tokens)
        self.engine._check(lib.kvt_seq_read(self._live("sequence"), block, layer, _ptr(k_out),
                                            _ptr(v_out), k_out.nbytes), "kvt_seq_read")
        return k_out, v_out

    def gather(self, layer: int, k_out: Optional[np.ndarray] = None,
               v_out: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """Gather every retained block of layer, in block order
        (kvt_seq_gather), written straight into k_out and v_out when given
        (arrays [capacity_tokens, n_kv_heads, head_dim]; too small raises
        KVT_EBUFSIZE and writes nothing), else into new arrays. Returns
        views of the tokens written: k_out[:n], v_out[:n]."""
        h = self._h or self._live("sequence")
        ns = self.ns
        # fast path: caller arrays of the namespace dtype, writeable, contiguous
        if (type(k_out) is np.ndarray and type(v_out) is np.ndarray and k_out.flags.carray
                and v_out.flags.carray and k_out.dtype is ns.np_dtype
                and v_out.dtype is ns.np_dtype and k_out.ndim == 3
                and k_out.shape == v_out.shape and k_out.shape[1:] == ns.block_shape[1:]):
            each = self._each
            each.value = k_out.nbytes
            self._lay.value, self._pk.value, self._pv.value = layer, _ptr(k_out), _ptr(v_out)
            rc = _lib.raw_seq_gather(self._hc, self._lay, self._pk, self._pv, self._each_ref,
                                     None, self._zero, self._n_ref)
            if rc == 0:
                t = each.value // (ns.block_bytes // ns.block_tokens)
                if t == k_out.shape[0]:
                    return k_out, v_out
                return k_out[:t], v_out[:t]
            if rc == E.ENOTRESIDENT:
                raise self._not_resident(layer, "kvt_seq_gather")
            raise self.engine._error(rc, "kvt_seq_gather")
        each, n = c_size_t(0), c_size_t(0)
        if k_out is None and v_out is None:  # size query, then exact arrays
            rc = lib.kvt_seq_gather(h, layer, None, None, byref(each), None, 0, byref(n))
            if rc == E.ENOTRESIDENT:
                raise self._not_resident(layer, "kvt_seq_gather")
            self.engine._check(rc, "kvt_seq_gather")
        per_token = self.ns.block_bytes // self.ns.block_tokens
        k_out, v_out = self._out_pair(k_out, v_out, each.value // per_token)
        each.value = k_out.nbytes
        rc = lib.kvt_seq_gather(h, layer, _ptr(k_out), _ptr(v_out), byref(each), None, 0,
                                byref(n))
        if rc == E.ENOTRESIDENT:
            raise self._not_resident(layer, "kvt_seq_gather")
        self.engine._check(rc, "kvt_seq_gather")
        t = each.value // per_token
        return k_out[:t], v_out[:t]

    def _not_resident(self, layer: int, call: str) -> E.KvtierError:
        err = self.engine._error(E.ENOTRESIDENT, call)
        try:
            self.retained(layer)
        except E.NotResidentError as e2:
            err.blocks = e2.blocks  # type: ignore[attr-defined]
        return err

    def attend(self, layer: int, q: np.ndarray, scale: float = 0.0,
               out: Optional[np.ndarray] = None) -> Attention:
        """Attention of one query over the retained blocks of layer
        (kvt_seq_attend). q: f32 [n_q_heads, head_dim], C-contiguous.
        scale 0 means 1/sqrt(head_dim). out (optional) receives the result
        in place."""
        h = self._live("sequence")
        _check_array("q", q)
        hd = self.ns.head_dim
        if q.dtype != np.float32 or q.ndim != 2 or q.shape[1] != hd:
            raise E.ShapeError(E.ESHAPE, f"q must be float32 [n_q_heads, {hd}], got "
                               f"{q.dtype}{list(q.shape)}", "attend")
        if out is None:
            out = np.empty(q.shape, np.float32)
        else:
            _check_array("out", out, writeable=True)
            if out.dtype != np.float32 or out.shape != q.shape:
                raise E.ShapeError(E.ESHAPE, f"out must be float32 {list(q.shape)}, got "
                                   f"{out.dtype}{list(out.shape)}", "attend")
        lse = np.empty(q.shape[0], np.float32)
        max_blocks = lib.kvt_seq_blocks(h)
        mass = np.empty(max(max_blocks, 1), np.float32)
        n = c_size_t()
        rc = lib.kvt_seq_attend(h, layer, _ptr(q), q.shape[0], scale, _ptr(out), _ptr(lse),
                                _ptr(mass), max_blocks, byref(n))
        if rc == E.ENOTRESIDENT:
            raise self._not_resident(layer, "kvt_seq_attend")
        self.engine._check(rc, "kvt_seq_attend")
        return Attention(out, lse, mass[:n.value])

    def observe(self, layer: int, block_mass: np.ndarray) -> None:
        """Report each retained block's attention mass at one step
        (kvt_seq_observe); the policy then runs on the layer."""
        m = _check_array("block_mass", block_mass)
        if m.dtype != np.float32 or m.ndim != 1:
            raise E.ShapeError(E.ESHAPE, f"block_mass must be 1-D float32, got "
                               f"{m.dtype}{list(m.shape)}", "observe")
        self.engine._check(lib.kvt_seq_observe(self._live("sequence"), layer, _ptr(m), len(m)),
                           "kvt_seq_observe")

    def retained(self, layer: int) -> List[BlockInfo]:
        """The retained blocks of layer in block order (kvt_seq_retained).
        Raises NotResidentError, with .blocks the cold-only ones to load
        and put, when some are not in RAM."""
        h = self._live("sequence")
        max_blocks = lib.kvt_seq_blocks(h)
        g = (_lib.Gathered * max(max_blocks, 1))()
        n = c_size_t()
        rc = lib.kvt_seq_retained(h, layer, g, max_blocks, byref(n))
        blocks = [BlockInfo(g[i].block, g[i].token_pos, g[i].tier, bool(g[i].exact))
                  for i in range(min(n.value, max_blocks))]
        if rc == E.ENOTRESIDENT:
            err = self.engine._error(rc, "kvt_seq_retained")
            err.blocks = blocks  # type: ignore[attr-defined]
            raise err
        self.engine._check(rc, "kvt_seq_retained")
        return blocks

    def set_policy(self, scorer: Union[str, int] = "full", budget: float = 1.0,
                   sink_blocks: Optional[int] = None, window_blocks: Optional[int] = None,
                   delay: Optional[int] = None, warm: float = 0.0,
                   margin: Optional[float] = None) -> None:
        """kvt_seq_set_policy(): a scorer (a name of SCORERS) and the byte
        budget each layer keeps, a fraction of its full f16 cache with the
        tail (set_tokens()); warm, the part of it warm blocks may take
        (three tiers), and margin, promotion's hysteresis; None leaves a
        field at the scorer's default."""
        p = _lib.Policy()
        lib.kvt_policy_init(byref(p))
        if isinstance(scorer, str):
            sid = c_uint32()
            rc = lib.kvt_policy_parse(scorer.encode(), byref(sid))
            if rc:
                raise E.make_error(rc, f"unknown scorer {scorer!r} ({', '.join(SCORERS)})",
                                   "kvt_policy_parse")
            scorer = sid.value
        p.scorer, p.budget, p.warm = scorer, budget, warm
        if margin is not None:
            p.margin = margin
        if sink_blocks is not None:
            p.sink_blocks = sink_blocks
        if window_blocks is not None:
            p.window_blocks = window_blocks
        if delay is not None:
            p.delay = delay
        self.engine._check(lib.kvt_seq_set_policy(self._live("sequence"), byref(p)),
                           "kvt_seq_set_policy")

    def set_tokens(self, n_tokens: int) -> None:
        """kvt_seq_set_tokens(): the sequence's length, counting the tail
        the caller holds (budgets count it)."""
        self.engine._check(lib.kvt_seq_set_tokens(self._live("sequence"), n_tokens),
                           "kvt_seq_set_tokens")

    def hint(self, layer: int, scores: np.ndarray) -> None:
        """kvt_seq_hint(): scores for the "external" scorer, one float32 per
        block of the sequence."""
        a = np.ascontiguousarray(scores, dtype=np.float32)
        self.engine._check(lib.kvt_seq_hint(self._live("sequence"), layer, _ptr(a), a.size),
                           "kvt_seq_hint")

    def policy_info(self, layer: int) -> Dict[str, Any]:
        """kvt_seq_policy_info(): what the layer keeps against its budget."""
        pi = _lib.PolicyInfo()
        self.engine._check(lib.kvt_seq_policy_info(self._live("sequence"), layer, byref(pi)),
                           "kvt_seq_policy_info")
        return {f: getattr(pi, f) for f, _ in pi._fields_}

    def pin(self) -> None:
        """kvt_seq_pin(): hold the blocks it retains at their precision
        until unpin() (refused with KVT_ELIMIT past the hot tier's room)."""
        self.engine._check(lib.kvt_seq_pin(self._live("sequence")), "kvt_seq_pin")

    def unpin(self) -> None:
        """kvt_seq_unpin(): let go of the pin."""
        self.engine._check(lib.kvt_seq_unpin(self._live("sequence")), "kvt_seq_unpin")

    def durable_error(self) -> Tuple[int, int]:
        """kvt_seq_durable_error(): (the first error that stopped a block of
        the sequence from becoming durable or 0, the durable watermark)."""
        n = c_uint32()
        rc = lib.kvt_seq_durable_error(self._live("sequence"), byref(n))
        return rc, n.value

    def block_mass(self, block: int, layer: int) -> Tuple[float, float, int]:
        """kvt_seq_block_mass(): (accumulated mass, last mass, observations)."""
        s, last, obs = c_double(), c_float(), c_uint32()
        self.engine._check(lib.kvt_seq_block_mass(self._live("sequence"), block, layer,
                                                  byref(s), byref(last), byref(obs)),
                           "kvt_seq_block_mass")
        return s.value, last.value, obs.value
