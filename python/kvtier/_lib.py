"""_lib.py - finds libkvtier.so and declares the C API of include/kvtier.h
for ctypes: the structs, byte for byte, and every function's prototype.

Nothing here is public; kvtier/__init__.py re-exports what callers use.
Adding a C call later means one line in _PROTOTYPES (and a struct here
when it takes a new one).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int,
                    c_int64, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p)
from typing import Any, List, Optional

N_TIERS = 4
TIER_NAMES = ("none", "hot", "warm", "cold")


class Key(Structure):
    _fields_ = [("b", c_uint8 * 16)]


class Shape(Structure):
    _fields_ = [("n_layers", c_uint32), ("n_kv_heads", c_uint32), ("head_dim", c_uint32),
                ("dtype", c_uint32), ("block_tokens", c_uint32)]


class NsDesc(Structure):
    _fields_ = [("model_id", c_char_p), ("weights_fingerprint", c_char_p),
                ("rope_theta", c_double), ("rope_dims", c_uint32), ("rope_scaling", c_char_p),
                ("tp_rank", c_uint32), ("tp_size", c_uint32), ("shape", Shape)]


class TestFault(Structure):
    _fields_ = [("ops", c_uint32), ("kind", c_uint32), ("after", c_uint64),
                ("count", c_uint64), ("seed", c_uint64)]


class Options(Structure):
    _fields_ = [("tier_bytes_limit", c_uint64 * N_TIERS), ("flags", c_uint32),
                ("max_seqs", c_uint32), ("max_namespaces", c_uint32),
                ("max_seq_blocks", c_uint32), ("max_load_reqs", c_uint32),
                ("tier_load_gbps", c_double * N_TIERS),
                ("tier_load_latency_us", c_double * N_TIERS),
                ("test_fail_alloc_after", c_uint64), ("cold_segment_bytes", c_uint64),
                ("cold_group_bytes", c_uint64), ("cold_index_bytes", c_uint64),
                ("cold_admit", c_uint32), ("cold_admit_min_seen", c_uint32),
                ("cold_compress", c_uint32), ("io_backend", c_uint32), ("io_depth", c_uint32),
                ("test_fault", TestFault), ("cold_evict", c_uint32), ("hot_evict", c_uint32)]


class ErrorInfo(Structure):
    _fields_ = [("code", c_int), ("call", c_char * 32), ("field", c_char * 48),
                ("expected", c_char * 96), ("got", c_char * 96), ("message", c_char * 320)]


class KV(Structure):
    _fields_ = [("k", c_void_p), ("v", c_void_p), ("dtype", c_uint32), ("n_tokens", c_uint32),
                ("n_heads", c_uint32), ("head_dim", c_uint32)]


MAX_LAYERS = 1024  # KVT_MAX_LAYERS


class AppendInfo(Structure):
    _fields_ = [("block", c_uint32), ("layers_present", c_uint32), ("key", Key),
                ("durable", c_uint32), ("pad", c_uint32),
                ("layers_mask", c_uint64 * (MAX_LAYERS // 64))]


class LookupEntry(Structure):
    _fields_ = [("key", Key), ("tier", c_uint32), ("pad", c_uint32), ("est_load_us", c_double)]


class Gathered(Structure):
    _fields_ = [("block", c_uint32), ("token_pos", c_uint32), ("tier", c_uint32),
                ("exact", c_uint32)]


class LoadReq(Structure):
    _fields_ = [("key", Key), ("layer", c_uint32), ("pad", c_uint32), ("k_out", c_void_p),
                ("v_out", c_void_p), ("bytes_each", c_size_t), ("status", c_int),
                ("tier", c_uint32)]


POLICY_DEFAULT = 0xFFFFFFFF  # KVT_POLICY_DEFAULT


class Policy(Structure):
    _fields_ = [("scorer", c_uint32), ("sink_blocks", c_uint32), ("budget", c_double),
                ("window_blocks", c_uint32), ("delay", c_uint32), ("warm", c_double),
                ("margin", c_double), ("recall", c_uint32)]


class PolicyInfo(Structure):
    _fields_ = [("scorer", c_uint32), ("over", c_uint32), ("share", c_double),
                ("tokens", c_uint64), ("kept_tokens", c_uint64), ("full_bytes", c_uint64),
                ("budget_bytes", c_uint64), ("kept_bytes", c_uint64), ("warm_share", c_double),
                ("warm_tokens", c_uint64), ("warm_bytes", c_uint64), ("promotions", c_uint64),
                ("promotions_exact", c_uint64), ("demotions", c_uint64)]


class Stats(Structure):
    _fields_ = [("tier_blocks", c_uint64 * N_TIERS), ("tier_bytes", c_uint64 * N_TIERS),
                ("tier_limit", c_uint64 * N_TIERS), ("index_bytes", c_uint64),
                ("seq_bytes", c_uint64), ("other_bytes", c_uint64), ("total_bytes", c_uint64),
                ("logical_bytes", c_uint64), ("dedup_saved_bytes", c_uint64),
                ("token_blocks", c_uint64), ("namespaces", c_uint64), ("seqs", c_uint64),
                ("puts", c_uint64), ("dedup_hits", c_uint64), ("dedup_mismatches", c_uint64),
                ("lookups", c_uint64), ("lookup_blocks_hit", c_uint64),
                ("lookup_blocks_miss", c_uint64), ("reads", c_uint64), ("reads_exact", c_uint64),
                ("evictions", c_uint64 * N_TIERS), ("put_full", c_uint64),
                ("demotions", c_uint64), ("reads_approx", c_uint64), ("attends", c_uint64),
                ("cold_records", c_uint64), ("cold_queued", c_uint64),
                ("cold_written", c_uint64), ("cold_reads", c_uint64),
                ("cold_read_bytes", c_uint64), ("cold_write_bytes", c_uint64),
                ("cold_checksum_failures", c_uint64), ("cold_write_failures", c_uint64),
                ("cold_segments", c_uint64), ("cold_segment_bytes", c_uint64),
                ("cold_reclaims", c_uint64), ("cold_relocated", c_uint64),
                ("promotions", c_uint64), ("io_backend", c_char * 32), ("io_why", c_char * 160),
                ("recalls", c_uint64), ("recall_useful", c_uint64), ("recall_unavailable", c_uint64),
                ("recall_bytes", c_uint64), ("recall_ns", c_uint64), ("sketch_bytes", c_uint64),
                ("recall_late", c_uint64)]


class TierStats(Structure):
    _fields_ = [("filled", c_uint64), ("tier", c_uint32), ("present", c_uint32),
                ("name", c_char * 16), ("blocks", c_uint64), ("bytes", c_uint64),
                ("limit", c_uint64), ("evictions", c_uint64), ("reads", c_uint64),
                ("read_bytes", c_uint64), ("write_bytes", c_uint64),
                ("checksum_failures", c_uint64), ("write_failures", c_uint64),
                ("declined", c_uint64), ("model_accesses", c_uint64),
                ("model_saved_accesses", c_uint64)]


class FsckResult(Structure):
    _fields_ = [("checked", c_uint64), ("bad", c_uint64), ("removed", c_uint64)]


_P = POINTER
_u32p = _P(c_uint32)
# name: (restype, argtypes). Handles (kvt_engine *, kvt_seq *, kvt_load *)
# are opaque c_void_p.
_PROTOTYPES = {
    "kvt_strerror": (c_char_p, [c_int]),
    "kvt_last_error": (c_int, [c_void_p, _P(ErrorInfo)]),
    "kvt_options_init": (None, [_P(Options)]),
    "kvt_engine_open_info": (c_int, [c_char_p, _P(Options), _P(c_void_p), _P(ErrorInfo)]),
    "kvt_engine_close": (None, [c_void_p]),
    "kvt_sync": (c_int, [c_void_p]),
    "kvt_stats_get": (c_int, [c_void_p, _P(Stats)]),
    "kvt_stats_tier": (c_int, [c_void_p, c_uint32, _P(TierStats), c_size_t]),
    "kvt_fsck": (c_int, [c_void_p, c_int, _P(FsckResult), c_void_p, c_void_p]),
    "kvt_ns_register": (c_int, [c_void_p, _P(NsDesc), _u32p]),
    "kvt_ns_get": (c_int, [c_void_p, c_uint32, _u32p, _P(NsDesc)]),
    "kvt_ns_shape": (c_int, [c_void_p, c_uint32, _P(Shape)]),
    "kvt_ns_drop": (c_int, [c_void_p, c_uint32]),
    "kvt_ns_set_codec": (c_int, [c_void_p, c_uint32, c_uint32, c_int, c_int]),
    "kvt_codec_parse": (c_int, [c_char_p, _P(c_int), _P(c_int)]),
    "kvt_ns_seed": (c_int, [c_void_p, c_uint32, _P(Key)]),
    "kvt_keys": (c_int, [c_void_p, c_uint32, c_void_p, c_size_t, _P(Key), c_size_t,
                         _P(c_size_t)]),
    "kvt_drop_prefix": (c_int, [c_void_p, c_uint32, c_void_p, c_size_t, _P(c_uint64)]),
    "kvt_lookup": (c_int, [c_void_p, c_uint32, c_void_p, c_size_t, _P(LookupEntry), c_size_t,
                           _P(c_size_t)]),
    "kvt_load_submit": (c_int, [c_void_p, c_uint32, _P(LoadReq), c_size_t, _P(c_void_p)]),
    "kvt_load_wait": (c_int, [c_void_p, _P(c_size_t)]),
    "kvt_seq_create": (c_int, [c_void_p, c_uint32, _P(c_void_p)]),
    "kvt_seq_fork": (c_int, [c_void_p, c_uint32, _P(c_void_p)]),
    "kvt_seq_release": (None, [c_void_p]),
    "kvt_seq_blocks": (c_uint32, [c_void_p]),
    "kvt_seq_durable": (c_uint32, [c_void_p]),
    "kvt_seq_output": (c_int, [c_void_p, c_int]),
    "kvt_seq_append": (c_int, [c_void_p, c_void_p, c_uint32, _P(AppendInfo)]),
    "kvt_seq_put": (c_int, [c_void_p, c_uint32, c_uint32, _P(KV)]),
    "kvt_seq_read": (c_int, [c_void_p, c_uint32, c_uint32, c_void_p, c_void_p, c_size_t]),
    "kvt_seq_gather": (c_int, [c_void_p, c_uint32, c_void_p, c_void_p, _P(c_size_t),
                               _P(Gathered), c_size_t, _P(c_size_t)]),
    "kvt_seq_attend": (c_int, [c_void_p, c_uint32, c_void_p, c_uint32, c_float, c_void_p,
                               c_void_p, c_void_p, c_size_t, _P(c_size_t)]),
    "kvt_policy_init": (None, [_P(Policy)]),
    "kvt_policy_parse": (c_int, [c_char_p, _u32p]),
    "kvt_policy_name": (c_char_p, [c_uint32]),
    "kvt_seq_set_policy": (c_int, [c_void_p, _P(Policy)]),
    "kvt_seq_observe": (c_int, [c_void_p, c_uint32, c_void_p, c_size_t]),
    "kvt_seq_retained": (c_int, [c_void_p, c_uint32, _P(Gathered), c_size_t, _P(c_size_t)]),
    "kvt_seq_block_mass": (c_int, [c_void_p, c_uint32, c_uint32, _P(c_double), _P(c_float),
                                   _u32p]),
    "kvt_dtype_size": (c_size_t, [c_uint32]),
    "kvt_shape_block_bytes": (c_size_t, [_P(Shape)]),
    "kvt_cold_record_bytes": (c_uint64, [_P(Shape)]),
    "kvt_codec_size": (c_size_t, [c_int, c_void_p]),
    "kvt_seq_set_tokens": (c_int, [c_void_p, c_uint64]),
    "kvt_seq_hint": (c_int, [c_void_p, c_uint32, c_void_p, c_size_t]),
    "kvt_seq_policy_info": (c_int, [c_void_p, c_uint32, _P(PolicyInfo)]),
    "kvt_ns_load_profile": (c_int, [c_void_p, c_uint32, c_char_p]),
    "kvt_ns_load_predictor": (c_int, [c_void_p, c_uint32, c_char_p]),
    "kvt_seq_pin": (c_int, [c_void_p]),
    "kvt_seq_unpin": (c_int, [c_void_p]),
    "kvt_seq_durable_error": (c_int, [c_void_p, _u32p]),
    "kvt_event_fd": (c_int, [c_void_p]),
    "kvt_metrics_render": (c_int, [c_void_p, c_void_p, c_size_t, _P(c_size_t)]),
    "kvt_load_poll": (c_int, [c_void_p, _P(c_size_t)]),
    # newer calls: bound when the library has them (see OPTIONAL)
    "kvt_seq_put_layers": (c_int, [c_void_p, c_uint32, c_uint32, c_uint32, _P(KV), c_size_t,
                                   _u32p]),
    "kvt_seq_gather_layers": (c_int, [c_void_p, c_uint32, c_uint32, c_void_p, c_void_p, c_size_t,
                                      _P(c_size_t), _u32p]),
}
# Calls an older libkvtier.so may lack: has(name) says whether it is bound,
# and the binding falls back to what it did before them.
OPTIONAL = {"kvt_seq_put_layers", "kvt_seq_gather_layers"}

_SONAME = "libkvtier.so.0"


def _candidates() -> List[str]:
    """Where to look for the library, in order: $KVTIER_LIB; the path
    `cmake --install` recorded beside the package; a build tree next to
    the source tree this package was imported from ($KVTIER_BUILD, else
    build/); the dynamic loader's own search (ldconfig, LD_LIBRARY_PATH)."""
    out = []
    env = os.environ.get("KVTIER_LIB")
    if env:
        out.append(env)
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        from . import _installed  # written by cmake --install
        out.append(os.path.normpath(os.path.join(here, _installed.LIB_RELPATH)))
    except ImportError:
        pass
    top = os.path.dirname(os.path.dirname(here))  # python/kvtier -> the source tree
    build = os.environ.get("KVTIER_BUILD") or os.path.join(top, "build")
    out.append(os.path.join(build, "libkvtier.so"))
    out.append(_SONAME)
    found = ctypes.util.find_library("kvtier")
    if found:
        out.append(found)
    return out


def _load() -> ctypes.CDLL:
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} (absent)")
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError("kvtier: cannot load libkvtier.so; set KVTIER_LIB to its path or "
                      "install the library (cmake --install). Tried: " + "; ".join(tried))


def _declare(lib: ctypes.CDLL) -> None:
    for name, (res, args) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            if name in OPTIONAL:
                continue
            raise ImportError(f"kvtier: {lib._name} has no {name}: an older library?")
        fn.restype = res
        fn.argtypes = args


def has(name: str) -> bool:
    """Whether the loaded library has C function name."""
    return hasattr(lib, name)


def _resolved(name: str) -> str:
    """The file the loader mapped for name (a bare soname says little)."""
    if os.sep in name:
        return os.path.realpath(name)
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "/libkvtier.so" in line:
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return name


lib = _load()
_declare(lib)
library_path: str = _resolved(lib._name)


def _untyped(name: str) -> Any:
    """A second handle on a C function, without argtypes: the hot loops
    (Sequence.put/gather and their token-block forms) pass it ctypes
    objects they built once, which skips per-call argument conversion
    (about a microsecond of an eight-argument call). Every argument must
    then be a ctypes object of the exact C type, or None for NULL."""
    fn = lib[name]  # a new function object; lib.<name> keeps its argtypes
    fn.restype = _PROTOTYPES[name][0]
    return fn


raw_seq_put = _untyped("kvt_seq_put")
raw_seq_gather = _untyped("kvt_seq_gather")


def strerror(code: int) -> str:
    """kvt_strerror(): what a kvtier code or -errno means in general."""
    s: Optional[bytes] = lib.kvt_strerror(code)
    return s.decode() if s else f"error {code}"
