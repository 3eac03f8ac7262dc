#!/usr/bin/python3
"""gen_safetensors.py - writes the KV of a made-up model as a safetensors file
for `kvtier import` (docs/import.md), with numpy alone: layers.{i}.k and
layers.{i}.v, each [tokens, kv_heads, head_dim] in f16, bf16 or f32, the
header's 8-byte little-endian length, the JSON header, the raw tensors.
Also writes the token ids (--tokens-out) and, as the truth the test
compares with, every layer's K then V as raw bytes (--raw-out), laid out
by this script and not by the safetensors layout. --corrupt KIND writes a
file kvtier must refuse instead (the kinds are listed in CORRUPTIONS).

usage: gen_safetensors.py --out F.safetensors --tokens-out T [--raw-out R]
       [--layers L] [--tokens N] [--heads H] [--dim D] [--dtype f16|bf16|f32]
       [--seed S] [--first-token X] [--corrupt KIND]
"""
import argparse
import json
import struct
import sys

import numpy as np

CORRUPTIONS = [
    "short",           # 5 bytes: not even the header length
    "huge-header",     # the header length says 2^40 bytes
    "truncated",       # the last 100 bytes of data cut off
    "bad-json",        # the header is not JSON
    "not-object",      # the header is a JSON array
    "offsets-outside", # a tensor's data_offsets end past the file
    "overlap",         # two tensors share bytes
    "hole",            # bytes between two tensors belong to none
    "trailing",        # bytes after the last tensor
    "size-mismatch",   # data_offsets do not match shape x dtype
    "wrong-dims",      # layers.0.k is 2-D
    "shape-differs",   # layers.1.v has another head_dim
    "wrong-dtype",     # layers.0.v is F64
    "mixed-dtype",     # layers.1.k is F32 while the rest are F16
    "missing-v",       # layers.1.v absent
    "nan",             # a NaN in layers.0.v
    "duplicate-name",  # one tensor name twice in the header
    "few-tokens",      # the token file holds one id fewer than the tensors
]


def to_bf16(a):
    """f32 -> bf16 bits, rounding to nearest even (finite inputs)."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)


def tensor_bytes(a, dtype):
    if dtype == "f32":
        return a.astype("<f4").tobytes()
    if dtype == "f16":
        return a.astype("<f2").tobytes()
    return to_bf16(a).astype("<u2").tobytes()


def header_bytes(entries):
    """entries: list of (name, dtype_text, shape, begin, end); JSON padded to 8."""
    h = {"__metadata__": {"producer": "gen_safetensors.py"}}
    for name, dt, shape, b, e in entries:
        h[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [b, e]}
    text = json.dumps(h, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens-out", required=True)
    ap.add_argument("--raw-out")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=37)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--dtype", choices=["f16", "bf16", "f32"], default="f16")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--first-token", type=int, default=1000)
    ap.add_argument("--corrupt", choices=CORRUPTIONS)
    a = ap.parse_args()

    # KV of token t depends on (seed, layer, t) only, so two files over a
    # shared prefix hold the same KV for it (what dedup relies on).
    shape = (a.tokens, a.heads, a.dim)
    names, arrays = [], []
    for l in range(a.layers):
        for side in "kv":
            rows = []
            for t in range(a.tokens):
                g = np.random.default_rng([a.seed, l, ord(side), t])
                rows.append(g.standard_normal((a.heads, a.dim), dtype=np.float32) * 2.0)
            names.append("layers.%d.%s" % (l, side))
            arrays.append(np.stack(rows) if rows else np.zeros(shape, np.float32))
    tt = {"f32": "F32", "f16": "F16", "bf16": "BF16"}[a.dtype]
    c = a.corrupt
    if c == "nan":
        arrays[1][0, 0, 0] = np.nan
    blobs = [tensor_bytes(x, a.dtype) for x in arrays]
    dts = [tt] * len(names)
    shapes = [shape] * len(names)
    if c == "wrong-dims":
        shapes[0] = (a.tokens, a.heads * a.dim)
    if c == "shape-differs":
        shapes[3] = (a.tokens, a.heads * 2, a.dim // 2)
    if c == "wrong-dtype":
        dts[1] = "F64"
        blobs[1] = arrays[1].astype("<f8").tobytes()
    if c == "mixed-dtype":
        dts[2] = "F32"
        blobs[2] = arrays[2].astype("<f4").tobytes()
    if c == "missing-v":
        del names[3], dts[3], shapes[3], blobs[3]
    entries, off = [], 0
    for n, dt, sh, b in zip(names, dts, shapes, blobs):
        entries.append([n, dt, sh, off, off + len(b)])
        off += len(b)
    data = b"".join(blobs)
    if c == "offsets-outside":
        entries[-1][4] += 64
        entries[-1][3] += 64
    if c == "overlap":
        entries[1][3] -= 2
        entries[1][4] -= 2
    if c == "hole":
        for e in entries[1:]:
            e[3] += 8
            e[4] += 8
        data = data[: entries[0][4]] + b"\0" * 8 + data[entries[0][4]:]
    if c == "trailing":
        data += b"\0" * 16
    if c == "size-mismatch":
        entries[0][2] = (a.tokens, a.heads, a.dim + 1)
    hdr = header_bytes(entries)
    if c == "bad-json":
        hdr = b'{"layers.0.k": {"dtype": "F16",' + b" " * 6
    if c == "not-object":
        hdr = b"[1, 2, 3]" + b" " * 7
    if c == "duplicate-name":
        text = hdr.rstrip().decode()
        first = text.index('"layers.0.k"')
        dup = text[first:text.index("}", first) + 1]
        hdr = (text[:-1] + "," + dup + "}").encode()
        hdr += b" " * (-len(hdr) % 8)
    length = struct.pack("<Q", len(hdr))
    if c == "huge-header":
        length = struct.pack("<Q", 1 << 40)
    out = length + hdr + data
    if c == "truncated":
        out = out[:-100]
    if c == "short":
        out = out[:5]
    with open(a.out, "wb") as f:
        f.write(out)
    n_ids = a.tokens - (1 if c == "few-tokens" else 0)
    with open(a.tokens_out, "w") as f:
        f.write(" ".join(str(a.first_token + t) for t in range(n_ids)) + "\n")
    if a.raw_out:
        with open(a.raw_out, "wb") as f:
            for b in blobs:
                f.write(b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
