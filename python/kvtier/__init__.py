"""kvtier - Python binding of the kvtier KV-cache store (include/kvtier.h)
over ctypes: no compiler at install time, only libkvtier.so.

    import numpy as np, kvtier
    with kvtier.Engine("/tmp/store", hot_bytes=1 << 30) as e:
        ns = e.namespace("my-model", "sha256:...", n_layers=2, n_kv_heads=4,
                         head_dim=64, dtype="f16", block_tokens=16)
        with ns.sequence() as s:
            info = s.append(range(16))
            k = np.ones(ns.block_shape, np.float16)
            s.put(info.block, 0, k, k)           # read in place, not copied
            k_all, v_all = s.gather(0)           # or into arrays you own

The library is found through $KVTIER_LIB, the path `cmake --install`
recorded, a build/ directory beside this source tree ($KVTIER_BUILD), or
the dynamic loader's search path (see _lib._candidates).
"""
from . import errors
from ._lib import library_path, strerror
from .engine import (ALL_LAYERS, BF16, F16, F32, OPEN_METADATA_ONLY, OPEN_NOCREATE, OPEN_RDONLY,
                     OPEN_VERIFY_DEDUP, SCORERS, TIER_COLD, TIER_HOT, TIER_NONE, TIER_WARM,
                     AppendInfo, Attention, BlockInfo, Engine, Load, LoadResult, Lookup,
                     LookupEntry, Namespace, Sequence)
from .importkv import ImportResult, import_safetensors, read_safetensors
from .errors import (CorruptError, FullError, KvtierError, LockedError, NotFoundError,
                     NotResidentError, ShapeError)

__version__ = "0.1.0"
__all__ = [
    "ALL_LAYERS", "BF16", "F16", "F32", "OPEN_METADATA_ONLY", "OPEN_NOCREATE", "OPEN_RDONLY",
    "OPEN_VERIFY_DEDUP", "SCORERS", "TIER_COLD", "TIER_HOT", "TIER_NONE", "TIER_WARM",
    "AppendInfo", "Attention", "BlockInfo", "Engine", "Load", "LoadResult", "Lookup",
    "LookupEntry", "Namespace", "Sequence", "CorruptError", "FullError", "KvtierError",
    "LockedError", "NotFoundError", "NotResidentError", "ShapeError", "errors",
    "library_path", "strerror", "ImportResult", "import_safetensors", "read_safetensors",
]
