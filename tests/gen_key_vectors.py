#!/usr/bin/env python3
# gen_key_vectors.py - regenerate the key test vectors of docs/format.md
# ("Keys") without kvtier: builds each byte string with struct, writes it to
# a file and hashes it with the xxh128sum command (Debian package xxhash).
import os, struct, subprocess, sys, tempfile

def xxh128(data):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
        path = f.name
    try:
        out = subprocess.run(["xxh128sum", path], check=True,
                             capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    return bytes.fromhex(out.split()[0])

def lstr(s):
    b = b"" if s is None else s.encode()
    return struct.pack("<I", len(b)) + b

def ns_encoding(model, fpr, theta, rope_dims, scaling, tp_rank, tp_size,
                layers, heads, head_dim, dtype, block_tokens):
    if rope_dims == 0:
        rope_dims = head_dim
    return (b"KVTNS001" + lstr(model) + lstr(fpr) + struct.pack("<d", theta) +
            struct.pack("<I", rope_dims) + lstr(scaling) +
            struct.pack("<7I", tp_rank, tp_size, layers, heads, head_dim,
                        dtype, block_tokens))

def chain(seed, tokens, bt):
    prev, keys = bytes(16), []
    for i in range(len(tokens) // bt):
        blk = struct.pack("<%dI" % bt, *tokens[i * bt:(i + 1) * bt])
        prev = xxh128(seed + prev + blk)
        keys.append(prev)
    return keys

BASE = dict(model="meta-llama/Llama-3.1-8B", fpr="sha256:0123abcd",
            theta=500000.0, rope_dims=0, scaling="llama3:factor=8",
            tp_rank=0, tp_size=1, layers=32, heads=8, head_dim=128, dtype=2,
            block_tokens=16)
CASES = [
    ("A", {}),
    ("B", dict(tp_rank=0, tp_size=2)),
    ("C", dict(tp_rank=1, tp_size=2)),
    ("D", dict(scaling=None, theta=0.0, model="tiny", fpr="x",
               layers=4, heads=2, head_dim=16, dtype=1, block_tokens=4)),
]
WIDE = [(i * 2654435761) & 0xffffffff for i in range(16)]

def main():
    for name, over in CASES:
        d = dict(BASE, **over)
        e = ns_encoding(**d)
        seed = xxh128(e)
        print("namespace %s: %s" % (name, d))
        print("  E (%d bytes) = %s" % (len(e), e.hex()))
        print("  seed = %s" % seed.hex())
        bt = d["block_tokens"]
        for i, k in enumerate(chain(seed, list(range(3 * bt + bt // 2)), bt)):
            print("  key_%d (tokens %d..%d) = %s" % (i, i * bt, i * bt + bt - 1, k.hex()))
        if name == "A":
            print("  wide key_0 (token i = i*2654435761 mod 2^32) = %s"
                  % chain(seed, WIDE, bt)[0].hex())

if __name__ == "__main__":
    sys.exit(main())
