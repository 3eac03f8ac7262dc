#!/usr/bin/env python3
"""bench_binding.py - the binding's overhead: puts and gathers of 2 MiB
token blocks (Llama-3-8B shape: 32 layers, 8 KV heads, head_dim 128, f16,
16 tokens; K and V of every layer) through Python against the same calls
from C (python/bench_binding_c.c, built beside libkvtier.so as
libbench_binding_c.so and called through ctypes), in one run: one
process, one heap, rounds interleaved.

A round opens a fresh engine with a hot tier of --hot-mib (64 MiB, 32
token blocks; --hot-mib 1024 --blocks 64 puts the working set beyond the
caches, slower and noisier here) and makes untimed passes until it is
full and one more, so that the timed passes run in a steady state where
puts evict unreferenced blocks and reuse their memory (not first-touch
page faults). A pass creates BLOCKS sequences, appends a token block to
each and puts its 32 layers (timed: put), then gathers each layer of each
into a caller-owned 2 MiB buffer (timed: gather). A round's figure is its
median pass (its least is reported too), per token block, in CPU time of
the calling thread on both sides (CLOCK_THREAD_CPUTIME_ID: the machine
may be shared, and time spent descheduled is neither side's cost).

Python runs twice per round: with the token-block calls
(Sequence.put_layers / gather_layers: checked once, then one C call,
kvt_seq_put_layers / kvt_seq_gather_layers, for the 32 layers) and with
one put() / gather() call per layer (a C call each, about a microsecond
of ctypes per call against a few for the copy). Rounds rotate the
order of the three. python_vs_c is C's time over Python's (1: no
overhead), the median of the per-round ratios; the headline is the lower
of put and gather with the token-block calls.

    KVTIER_LIB=build/libkvtier.so python3 python/bench_binding.py [--json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvtier  # noqa: E402

L, H, D, BT = 32, 8, 128, 16
TOKEN_BLOCK = 2 * L * BT * H * D * 2


def make_kv() -> tuple:
    """Finite f16 K and V for 32 layers (the C half draws other values;
    the library copies bytes, so the values do not matter)."""
    rng = np.random.default_rng(1)
    k = rng.standard_normal((L, BT, H, D)).astype(np.float16)
    v = rng.standard_normal((L, BT, H, D)).astype(np.float16)
    return k, v


def py_pass(ns, blocks: int, next_tok: int, k, v, kb, vb, per_layer: bool) -> tuple:
    """per_layer: one put() and one gather() call per layer (views made
    beforehand); else put_layers() and gather_layers() per token block."""
    seqs = [ns.sequence() for _ in range(blocks)]
    kl, vl, kbl, vbl = list(k), list(v), list(kb), list(vb)
    t0 = time.thread_time_ns()
    for b, s in enumerate(seqs):
        t = next_tok + b * BT
        info = s.append(np.arange(t, t + BT, dtype=np.uint32))
        if per_layer:
            for layer in range(L):
                s.put(info.block, layer, kl[layer], vl[layer])
        else:
            s.put_layers(info.block, k, v)
    t1 = time.thread_time_ns()
    for s in seqs:
        if per_layer:
            for layer in range(L):
                s.gather(layer, kbl[layer], vbl[layer])
        else:
            s.gather_layers(kb, vb)
    t2 = time.thread_time_ns()
    # untimed: the last token block gathered is the KV put
    if kb.tobytes() != k.tobytes() or vb.tobytes() != v.tobytes():
        raise SystemExit("bench_binding: gathered KV differs from the KV put")
    for s in seqs:
        s.release()
    return (t1 - t0) / blocks, (t2 - t1) / blocks


def py_round(d: str, blocks: int, warmup: int, passes: int, hot: int,
             per_layer: bool) -> tuple:
    k, v = make_kv()
    kb, vb = np.empty((L, BT, H, D), np.float16), np.empty((L, BT, H, D), np.float16)
    with kvtier.Engine(d, hot_bytes=hot) as e:
        ns = e.namespace("bench-binding", "0", n_layers=L, n_kv_heads=H, head_dim=D,
                         dtype="f16", block_tokens=BT)
        for p in range(warmup):
            py_pass(ns, blocks, p * blocks * BT, k, v, kb, vb, per_layer)
        res = [py_pass(ns, blocks, (warmup + p) * blocks * BT, k, v, kb, vb, per_layer)
               for p in range(passes)]
    return (statistics.median(r[0] for r in res), statistics.median(r[1] for r in res),
            min(r[0] for r in res), min(r[1] for r in res))


def c_round(cb, d: str, blocks: int, warmup: int, passes: int, hot: int) -> tuple:
    put, gat = (ctypes.c_double * 2)(), (ctypes.c_double * 2)()
    rc = cb.kvt_bench_binding_round(os.fsencode(d), blocks, warmup, passes, hot, put, gat)
    if rc:
        raise SystemExit(f"bench_binding: the C half failed: {kvtier.strerror(rc)}")
    return put[0], gat[0], put[1], gat[1]


def load_c(arg: str):
    path = arg or os.path.join(os.path.dirname(os.path.realpath(kvtier.library_path)),
                               "libbench_binding_c.so")
    if not os.path.exists(path):
        raise SystemExit(f"bench_binding: no {path}; build the target bench_binding_c "
                         "or give --c-bench")
    cb = ctypes.CDLL(path)
    cb.kvt_bench_binding_round.restype = ctypes.c_int
    cb.kvt_bench_binding_round.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint,
                                           ctypes.c_uint, ctypes.c_uint64,
                                           ctypes.POINTER(ctypes.c_double),
                                           ctypes.POINTER(ctypes.c_double)]
    return cb


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--blocks", type=int, default=16, help="token blocks per pass")
    ap.add_argument("--hot-mib", type=int, default=64, help="hot tier limit (MiB)")
    ap.add_argument("--passes", type=int, default=7, help="measured passes per round")
    ap.add_argument("--c-bench", default="",
                    help="libbench_binding_c.so (default: beside libkvtier.so)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cb = load_c(a.c_bench)
    hot = a.hot_mib << 20
    warmup = -(-hot // (a.blocks * TOKEN_BLOCK)) + 1
    runs = {"py": [], "py_layer": [], "c": []}
    order = list(runs)
    with tempfile.TemporaryDirectory(prefix="kvtier-bench-binding.") as tmp:
        for r in range(a.rounds):
            for side in order[r % 3:] + order[:r % 3]:
                d = os.path.join(tmp, f"{side}{r}")
                if side == "c":
                    runs[side].append(c_round(cb, d, a.blocks, warmup, a.passes, hot))
                else:
                    runs[side].append(py_round(d, a.blocks, warmup, a.passes, hot,
                                               side == "py_layer"))
    py, pl, c = runs["py"], runs["py_layer"], runs["c"]
    res = {"shape": "32 layers x 8 KV heads x 128 x f16 x 16 tokens",
           "token_block_bytes": TOKEN_BLOCK, "rounds": a.rounds,
           "blocks_per_pass": a.blocks, "warmup_passes": warmup, "passes": a.passes,
           "hot_bytes": hot, "clock": "thread CPU time"}
    for i, what in enumerate(("put", "gather")):
        res[f"{what}_py_us"] = statistics.median(p[i] for p in py) / 1e3
        res[f"{what}_c_us"] = statistics.median(x[i] for x in c) / 1e3
        res[f"{what}_python_vs_c"] = statistics.median(x[i] / p[i] for p, x in zip(py, c))
        res[f"{what}_py_gbps"] = res["token_block_bytes"] / res[f"{what}_py_us"] / 1e3
        res[f"{what}_py_layer_us"] = statistics.median(p[i] for p in pl) / 1e3
        res[f"{what}_per_layer_python_vs_c"] = statistics.median(x[i] / p[i]
                                                                 for p, x in zip(pl, c))
        # the least pass of all: noise on a shared machine only adds time
        res[f"{what}_py_best_us"] = min(p[i + 2] for p in py) / 1e3
        res[f"{what}_c_best_us"] = min(x[i + 2] for x in c) / 1e3
        res[f"{what}_best_python_vs_c"] = res[f"{what}_c_best_us"] / res[f"{what}_py_best_us"]
    res["python_vs_c"] = min(res["put_python_vs_c"], res["gather_python_vs_c"])
    if a.json:
        print(json.dumps(res))
        return 0
    print(f"token block {res['token_block_bytes'] >> 20} MiB ({res['shape']}), hot tier "
          f"{a.hot_mib} MiB, {a.rounds} rounds x {a.passes} passes x {a.blocks} blocks, "
          "Python and C interleaved, thread CPU time")
    print("  per 2 MiB token block   C            python (token-block calls)   "
          "python (a call per layer)")
    for what in ("put", "gather"):
        print(f"  {what:6s}  {res[what + '_c_us']:14.1f} us {res[what + '_py_us']:12.1f} us"
              f"  vs_c {res[what + '_python_vs_c']:.3f} {res[what + '_py_layer_us']:11.1f} us"
              f"  vs_c {res[what + '_per_layer_python_vs_c']:.3f}")
    print("  least pass of all rounds (noise only adds time):")
    for what in ("put", "gather"):
        print(f"  {what:6s}  {res[what + '_c_best_us']:14.1f} us {res[what + '_py_best_us']:12.1f} us"
              f"  vs_c {res[what + '_best_python_vs_c']:.3f}")
    print(f"  python_vs_c (the lower of the medians, token-block calls) {res['python_vs_c']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
