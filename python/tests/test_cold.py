"""test_cold.py - the cold tier through the binding: sync, a new engine
on the same store finds the prefix by lookup, loads it asynchronously
into caller arrays bit for bit, and puts it back; blocks only on disk
are brought back by the engine when a gather needs them."""
import numpy as np
import pytest

import kvtier
from kvtier import errors as E
from conftest import make_ns, open_cold, rand_block

TOKENS = list(range(100, 164))  # four blocks


def store_prefix(path):
    kv = {}
    with open_cold(path) as e:
        ns = make_ns(e, layers=2)
        with ns.sequence() as s:
            for b in range(4):
                info = s.append(TOKENS[16 * b:16 * b + 16])
                for layer in range(2):
                    kv[b, layer] = rand_block(ns, 10 * b + layer)
                    s.put(info.block, layer, *kv[b, layer])
            e.sync()
            assert s.durable == 4
        assert e.stats()["cold_records"] == 4
    return kv


def test_lookup_load_put_after_reopen(cold_dir):
    kv = store_prefix(cold_dir)
    with open_cold(cold_dir) as e:
        ns = make_ns(e, layers=2)
        hit = ns.lookup(TOKENS + [1, 2, 3])
        assert hit.n_found == 4
        assert all(x.tier == kvtier.TIER_COLD for x in hit.entries)
        outs = {(b, l): (ns.empty_block(), ns.empty_block()) for b in range(4) for l in range(2)}
        ld = ns.load([(hit.entries[b].key, l, *outs[b, l]) for b in range(4) for l in range(2)])
        res = ld.wait()
        assert [r.status for r in res] == [0] * 8
        assert all(r.tier == kvtier.TIER_COLD for r in res)
        for key, (k, v) in outs.items():
            assert k.tobytes() == kv[key][0].tobytes() and v.tobytes() == kv[key][1].tobytes()
        assert ld.wait() is res  # waiting twice returns the same results
        with ns.sequence() as s:
            for b in range(4):
                info = s.append(TOKENS[16 * b:16 * b + 16])
                assert info.durable and info.layers_present == 0
            promoted = e.stats()["promotions"]
            k, v = s.gather(0)  # only on disk: the engine promotes them
            assert k.tobytes() == b"".join(kv[b, 0][0].tobytes() for b in range(4))
            assert v.tobytes() == b"".join(kv[b, 0][1].tobytes() for b in range(4))
            assert e.stats()["promotions"] == promoted + 4
            for b in range(4):
                for layer in range(2):
                    s.put(b, layer, *outs[b, layer])
            k, v = s.gather(1)
            assert k.tobytes() == b"".join(kv[b, 1][0].tobytes() for b in range(4))


def test_load_failures_are_per_request(cold_dir):
    store_prefix(cold_dir)
    with open_cold(cold_dir) as e:
        ns = make_ns(e, layers=2)
        key = ns.keys(TOKENS)[0]
        good = (ns.empty_block(), ns.empty_block())
        small = (np.empty((8, 2, 8), np.float32), np.empty((8, 2, 8), np.float32))
        ld = ns.load([(key, 0, *good), (b"\0" * 16, 0, ns.empty_block(), ns.empty_block()),
                      (key, 1, *small)])
        with pytest.raises(kvtier.NotFoundError) as ei:
            ld.wait()
        res = ei.value.results
        assert [r.status for r in res] == [0, E.ENOTFOUND, E.EBUFSIZE]
        with pytest.raises(kvtier.ShapeError) as ei:
            ns.load([(key, 0, good[0].astype(np.float16), good[1].astype(np.float16))])
        assert ei.value.code == E.EDTYPE
        with pytest.raises(kvtier.ShapeError):
            ns.load([(b"short", 0, *good)])


def test_load_dropped_unwaited_is_completed(cold_dir):
    kv = store_prefix(cold_dir)
    with open_cold(cold_dir) as e:
        ns = make_ns(e, layers=2)
        key = ns.keys(TOKENS)[2]
        k, v = ns.empty_block(), ns.empty_block()
        ld = ns.load([(key, 1, k, v)])
        del ld  # the finalizer waits: the pins are released
        assert e.stats()["cold_reads"] == 1 and k.tobytes() == kv[2, 1][0].tobytes()
        ns.drop()  # would be KVT_EBUSY while the load were pending


def test_load_wait_async_on_the_event_fd(cold_dir):
    import asyncio
    kv = store_prefix(cold_dir)
    with open_cold(cold_dir) as e:
        ns = make_ns(e, layers=2)
        hit = ns.lookup(TOKENS)
        outs = {(b, l): (ns.empty_block(), ns.empty_block()) for b in range(4) for l in range(2)}
        ld = ns.load([(hit.entries[b].key, l, *outs[b, l]) for b in range(4) for l in range(2)])
        res = asyncio.run(ld.wait_async())
        assert [r.status for r in res] == [0] * 8
        for key, (k, v) in outs.items():
            assert k.tobytes() == kv[key][0].tobytes() and v.tobytes() == kv[key][1].tobytes()
        assert e.event_fd() >= 0 and e.event_fd() == e.event_fd()


def test_tier_stats_carry_the_model(cold_dir):
    """kvt_stats_tier through the binding: the cold tier's record count, and
    the learned models a close keeps, which the next engine starts from."""
    store_prefix(cold_dir)
    with open_cold(cold_dir) as e:
        cold, hot = e.tier_stats("cold"), e.tier_stats("hot")
        assert cold["present"] and cold["name"] == "disk"
        assert cold["blocks"] == 4
        assert hot["name"] == "hot" and hot["blocks"] == 0
        # the writer counted its 4 token blocks; this engine loaded that model
        assert cold["model_saved_accesses"] == 4
        assert cold["model_accesses"] == 4
        assert hot["model_saved_accesses"] >= 4
        assert e.tier_stats("warm")["model_accesses"] == 0
        with pytest.raises(ValueError):
            e.tier_stats("none")
