"""test_seq.py - sequences through the binding: attention against a numpy
reference, observe and a retention policy, forks, lifetimes (context
managers release), stats, and several threads at once."""
import threading

import numpy as np
import pytest

import kvtier
from kvtier import errors as E
from conftest import make_ns, rand_block


def fill(ns, s, n_blocks, seed=0, first_token=0):
    kv = {}
    for b in range(n_blocks):
        t0 = first_token + 16 * b
        info = s.append(range(t0, t0 + 16))
        for layer in range(ns.n_layers):
            k, v = rand_block(ns, seed + 1000 * b + layer)
            s.put(info.block, layer, k, v)
            kv[b, layer] = (k, v)
    return kv


def ref_attention(q, k, v, scale):
    """q [H, D], k/v [T, KVH, D]; GQA: query head h uses KV head h // (H // KVH)."""
    H, grp = q.shape[0], q.shape[0] // k.shape[1]
    out, lse = np.empty_like(q, dtype=np.float64), np.empty(H)
    for h in range(H):
        s = scale * (k[:, h // grp, :].astype(np.float64) @ q[h].astype(np.float64))
        m = s.max()
        p = np.exp(s - m)
        lse[h] = m + np.log(p.sum())
        out[h] = (p / p.sum()) @ v[:, h // grp, :]
    return out, lse


def test_attend_matches_numpy_and_reports_block_mass(engine):
    ns = make_ns(engine, layers=2, heads=2, dim=8)
    with ns.sequence() as s:
        kv = fill(ns, s, 3, seed=7)
        q = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
        a = s.attend(1, q)
        k = np.concatenate([kv[b, 1][0] for b in range(3)])
        v = np.concatenate([kv[b, 1][1] for b in range(3)])
        out, lse = ref_attention(q, k, v, 1 / np.sqrt(8))
        np.testing.assert_allclose(a.out, out, atol=1e-5)
        np.testing.assert_allclose(a.lse, lse, atol=1e-5)
        assert a.block_mass.shape == (3,)
        # each block's mass summed over the 4 query heads: 4 in all
        assert abs(a.block_mass.sum() - 4.0) < 1e-4
        out_arr = np.zeros_like(q)
        b = s.attend(1, q, out=out_arr)
        assert b.out is out_arr and np.array_equal(out_arr, a.out)
        with pytest.raises(kvtier.ShapeError):
            s.attend(1, q.astype(np.float64))
        with pytest.raises(kvtier.ShapeError) as ei:
            s.attend(1, np.zeros((3, 8), np.float32))  # not a multiple of kv heads
        assert ei.value.code == E.ECOUNT


def test_observe_and_recent_policy_evict(engine):
    ns = make_ns(engine, layers=1)
    with ns.sequence() as s:
        fill(ns, s, 4)
        assert [b.block for b in s.retained(0)] == [0, 1, 2, 3]
        s.observe(0, np.array([0.1, 0.2, 0.3, 0.4], np.float32))
        assert s.block_mass(2, 0)[2] == 1 and abs(s.block_mass(2, 0)[1] - 0.3) < 1e-7
        with pytest.raises(kvtier.ShapeError) as ei:
            s.observe(0, np.ones(3, np.float32))
        assert ei.value.code == E.ECOUNT
        with pytest.raises(kvtier.KvtierError) as ei:
            s.observe(0, np.array([0.1, -1, 0.3, 0.4], np.float32))
        assert ei.value.code == E.EOPTION
        s.set_policy("recent", budget=0.5)
        assert [b.block for b in s.retained(0)] == [2, 3]
        k, _ = s.gather(0)
        assert k.shape[0] == 32


def test_fork_shares_blocks_and_release_drops_references(engine):
    ns = make_ns(engine, layers=1)
    s = ns.sequence()
    kv = fill(ns, s, 2)
    with s.fork(1) as f:
        assert f.blocks == 1
        k, _ = f.gather(0)
        assert np.array_equal(k, kv[0, 0][0])
        assert engine.stats()["seqs"] == 2
    assert engine.stats()["seqs"] == 1
    s.release()
    assert engine.stats()["seqs"] == 0
    with pytest.raises(kvtier.KvtierError) as ei:
        s.blocks
    assert ei.value.code == E.ESTATE


def test_dedup_adopts_and_stats_count(engine):
    ns = make_ns(engine, layers=2)
    with ns.sequence() as a, ns.sequence() as b:
        fill(ns, a, 2)
        info = b.append(range(16))
        assert info.layers_present == 2, "a stored block is adopted at append"
        st = engine.stats()
        assert st["tier_blocks"]["hot"] == 4 and st["dedup_hits"] == 2 and st["seqs"] == 2
        hit = ns.lookup(list(range(40)))
        assert hit.n_found == 2 and [e.tier for e in hit.entries] == [kvtier.TIER_HOT] * 2
        assert [e.key for e in hit.entries] == ns.keys(range(32))
        assert ns.keys(range(16))[0] == info.key


def test_threads_each_with_a_sequence(engine):
    ns = make_ns(engine, layers=2)
    errors = []

    def agent(i):
        try:
            with ns.sequence() as s:
                kv = fill(ns, s, 6, seed=10000 * i, first_token=1000 * i)
                for layer in range(2):
                    k, v = s.gather(layer)
                    assert k.tobytes() == np.concatenate([kv[b, layer][0] for b in range(6)]).tobytes()
        except Exception as e:  # reported below
            errors.append(e)

    ts = [threading.Thread(target=agent, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert engine.stats()["puts"] == 4 * 6 * 2


def test_byte_budget_tail_and_policy_info(engine):
    ns = make_ns(engine, layers=1)
    s = ns.sequence()
    fill(ns, s, 4)
    s.set_policy("recent", budget=0.5)
    info = s.policy_info(0)
    assert info["kept_bytes"] <= info["budget_bytes"] and info["over"] == 0
    assert [b.block for b in s.retained(0)] == [2, 3]
    # a tail of one more block's tokens counts too: only the newest fits
    bt = 16
    s.set_tokens(4 * bt + bt)
    assert [b.block for b in s.retained(0)] == [3]
    info = s.policy_info(0)
    assert info["tokens"] == 5 * bt and info["kept_tokens"] == 2 * bt
    with pytest.raises(kvtier.KvtierError) as ei:
        s.set_tokens(3)
    assert ei.value.code == E.ECOUNT



def test_append_reports_which_layers_are_present(engine):
    ns = make_ns(engine, layers=3)
    s = ns.sequence()
    fill(ns, s, 1)
    info = ns.sequence().append(range(0, 16))  # every layer put by s
    assert info.layers_present == 3 and info.layers == (0, 1, 2)
    u = ns.sequence()
    b = u.append(range(100, 116)).block
    k, v = rand_block(ns, 7)
    u.put(b, 1, k, v)  # only layer 1
    info = ns.sequence().append(range(100, 116))
    assert info.layers_present == 1 and info.layers == (1,)


def test_metrics_render_is_prometheus_text(engine):
    ns = make_ns(engine, layers=2)
    s = ns.sequence()
    fill(ns, s, 3)
    text = engine.metrics()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    samples = dict(ln.rsplit(" ", 1) for ln in lines)
    assert float(samples['kvtier_tier_blocks{tier="hot"}']) == 3 * 2
    assert float(samples['kvtier_tier_puts_total{tier="hot"}']) >= 6
    assert "# TYPE kvtier_cold_read_seconds histogram" in text
