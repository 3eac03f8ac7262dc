"""importkv.py - the binding's `kvtier import`: store KV that any engine
computed, read from a safetensors file (docs/import.md: tensors
layers.{i}.k / layers.{i}.v of [tokens, kv_heads, head_dim], F16, BF16 or
F32), as full blocks of a namespace, deduplicated against what is there.
The file is checked whole before anything is stored; numpy reads the
tensors from a memory map, a block at a time."""
import json
import re
import struct
from typing import Dict, List, NamedTuple, Sequence as Seq, Tuple

import numpy as np

from . import errors as E

_DTYPES = {"F16": (np.dtype("<f2"), 2), "BF16": (np.dtype("<u2"), 2), "F32": (np.dtype("<f4"), 4)}
_NAME = re.compile(r"layers\.(0|[1-9][0-9]*)\.([kv])\Z")
_MAX_HEADER = 100 << 20


class ImportResult(NamedTuple):
    blocks: int         # full blocks in the file
    stored: int         # blocks whose layers were put
    deduplicated: int   # blocks every layer of which the store had already
    tail_tokens: int    # tokens after the last full block (not stored)


def _refuse(msg: str) -> E.KvtierError:
    return E.make_error(E.ECORRUPT, msg, "kvtier.import_safetensors")


def read_safetensors(path: str) -> Tuple[str, Dict[int, Tuple[np.ndarray, np.ndarray]]]:
    """The KV tensors of a safetensors file by layer, as read-only arrays
    over a memory map, and their dtype name. Raises KvtierError
    (KVT_ECORRUPT) for a malformed or truncated file."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    if raw.size < 8:
        raise _refuse(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8].tobytes())
    if n > _MAX_HEADER or 8 + n > raw.size:
        raise _refuse(f"{path}: header length {n} is past the end of the file")
    try:
        hdr = json.loads(raw[8:8 + n].tobytes())
    except ValueError as e:
        raise _refuse(f"{path}: the header is not JSON ({e})") from None
    if not isinstance(hdr, dict):
        raise _refuse(f"{path}: the header is not a JSON object")
    data, size = 8 + n, raw.size - 8 - n
    tensors: Dict[Tuple[int, str], np.ndarray] = {}
    dtype_name = None
    spans: List[Tuple[int, int]] = []
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict) or not {"dtype", "shape", "data_offsets"} <= set(t):
            raise _refuse(f"{path}: tensor {name!r} lacks dtype, shape or data_offsets")
        lo, hi = t["data_offsets"]
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi <= size):
            raise _refuse(f"{path}: tensor {name!r} lies outside the data")
        spans.append((lo, hi))
        m = _NAME.match(name)
        if not m:
            continue  # other tensors are ignored
        if t["dtype"] not in _DTYPES:
            raise _refuse(f"{path}: tensor {name!r} is {t['dtype']}, not F16, BF16 or F32")
        dt, width = _DTYPES[t["dtype"]]
        shape = t["shape"]
        if len(shape) != 3 or any(not isinstance(d, int) or d <= 0 for d in shape):
            raise _refuse(f"{path}: tensor {name!r} is {shape}, not [tokens, kv_heads, head_dim]")
        if hi - lo != int(np.prod(shape)) * width:
            raise _refuse(f"{path}: tensor {name!r} holds {hi - lo} bytes, its shape says "
                          f"{int(np.prod(shape)) * width}")
        if dtype_name not in (None, t["dtype"]):
            raise _refuse(f"{path}: tensors of different dtypes ({dtype_name}, {t['dtype']})")
        dtype_name = t["dtype"]
        tensors[int(m.group(1)), m.group(2)] = raw[data + lo:data + hi].view(dt).reshape(shape)
    spans.sort()
    end = 0
    for lo, hi in spans:
        if lo != end:
            raise _refuse(f"{path}: the tensors do not tile the data (a gap or overlap at {lo})")
        end = hi
    if end != size:
        raise _refuse(f"{path}: {size - end} bytes after the last tensor")
    if not tensors:
        raise _refuse(f"{path}: no layers.{{i}}.k / layers.{{i}}.v tensors")
    n_layers = 1 + max(i for i, _ in tensors)
    layers = {}
    for i in range(n_layers):
        if (i, "k") not in tensors or (i, "v") not in tensors:
            raise _refuse(f"{path}: layer {i} lacks its k or v tensor")
        layers[i] = (tensors[i, "k"], tensors[i, "v"])
    shapes = {a.shape for kv in layers.values() for a in kv}
    if len(shapes) != 1:
        raise _refuse(f"{path}: the tensors have different shapes {sorted(shapes)}")
    return dtype_name, layers


def _block(a: np.ndarray, b: int, bt: int, dtype: np.dtype) -> np.ndarray:
    """Block b of a tensor as the library takes it: C-contiguous and
    aligned (a tensor in the file may sit at any offset: then copied)."""
    return np.require(a[b * bt:(b + 1) * bt].view(dtype), requirements=["C", "A"])


def import_safetensors(ns, path: str, tokens: Seq[int]) -> ImportResult:
    """Store the KV of path (read_safetensors) for the token ids `tokens`
    as full blocks of namespace ns (whose dtype and shape the tensors must
    have), deduplicated: blocks the store holds in every layer are only
    counted. Tokens after the last full block are not stored. Nothing is
    stored when the file or the tokens are refused."""
    name, layers = read_safetensors(path)
    k0 = layers[0][0]
    toks = np.asarray(tokens, dtype=np.uint32)
    bt, kvh, hd = ns.block_shape
    if len(layers) != ns.n_layers or k0.shape[1:] != (kvh, hd):
        raise E.make_error(E.ESHAPE, f"{path}: {len(layers)} layers of {list(k0.shape[1:])}; "
                           f"the namespace has {ns.n_layers} of [{kvh}, {hd}]",
                           "kvtier.import_safetensors")
    if _DTYPES[name][0].itemsize != ns.np_dtype.itemsize or \
            (name == "BF16") != (ns.np_dtype == np.uint16):
        raise E.make_error(E.EDTYPE, f"{path}: {name} tensors, the namespace is {ns.np_dtype}",
                           "kvtier.import_safetensors")
    if toks.size != k0.shape[0]:
        raise E.make_error(E.ECOUNT, f"{path}: {k0.shape[0]} tokens of KV, {toks.size} token ids",
                           "kvtier.import_safetensors")
    for i, (k, v) in layers.items():
        if name == "BF16":  # all-ones exponent: Inf or NaN
            bad = ((k & 0x7F80) == 0x7F80).any() or ((v & 0x7F80) == 0x7F80).any()
        else:
            bad = not (np.isfinite(k).all() and np.isfinite(v).all())
        if bad:
            raise E.make_error(E.ENONFINITE, f"{path}: layer {i} holds NaN or Inf",
                               "kvtier.import_safetensors")
    n_blocks, stored, dedup = toks.size // bt, 0, 0
    with ns.sequence() as s:
        for b in range(n_blocks):
            info = s.append(toks[b * bt:(b + 1) * bt])
            if info.layers_present == ns.n_layers:
                dedup += 1
                continue
            for layer, (k, v) in layers.items():
                if layer in info.layers:
                    continue
                s.put(info.block, layer, _block(k, b, bt, ns.np_dtype),
                      _block(v, b, bt, ns.np_dtype))
            stored += 1
    return ImportResult(n_blocks, stored, dedup, toks.size - n_blocks * bt)
