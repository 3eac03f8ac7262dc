#!/usr/bin/env python3
"""serve_llama2c.py - a small serving loop in PyTorch over kvtier: the
llama2.c architecture (RMSNorm, RoPE on interleaved pairs, grouped-query
attention, SwiGLU, f32; tools/refmodel/ is the C reference) with kvtier as
its KV cache through the Python binding, serving several agents at once
that share a system prompt.

Per request: a prefix lookup before prefill; stored blocks are adopted
from RAM or loaded asynchronously from the cold tier (kvt_load_submit,
then put back); only the rest of the prompt is computed (attention in
torch over the gathered blocks); each completed 16-token block is
appended and put layer by layer, straight from the torch tensors (numpy
views, no copies); decoding attends through kvt_seq_attend over the
blocks, merged with the partial block held here through the log-sum-exps,
or with --attention torch over the gathered blocks; and observes each
block's attention mass (kvt_seq_observe). Everything is written through
to the cold tier of --dir, so a second run finds every prompt on disk.

    /usr/bin/python3 examples/serve_llama2c.py --agents 4 --dir /tmp/serve

The namespace is the one `kvtier warm` and `kvtier eval` register for the
same checkpoint, so a store they warmed serves this loop too.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import List, Optional, Tuple

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))  # the source tree's binding
import kvtier  # noqa: E402

BOS = 1
BLOCK_TOKENS = 16
SYSTEM_PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play "
                 "outside in the park with her friends. One day, she saw a big red ball.")
AGENT_PROMPTS = [" Lily wanted to", " Her mom said", " The ball was", " Tom came and",
                 " The sun was", " A bird saw", " Lily was sad", " They all went"]


def data_dir() -> str:
    return os.environ.get("KVTIER_DATA") or os.path.join(HERE, "..", "..", "shared", "data")


# ---- the checkpoint and the tokenizer (formats: docs/refmodel.md) ----------------------

class Model:
    """llama2.c weights as f32 torch tensors (read-only, shared by threads)."""

    def __init__(self, path: str):
        raw = np.fromfile(path, dtype=np.uint8)
        hdr = raw[:28].view(np.int32)
        dim, hidden, L, H, KVH, vocab, seq_len = (int(x) for x in hdr)
        shared = vocab > 0
        vocab = abs(vocab)
        hd = dim // H
        w = torch.from_numpy(raw[28:].view(np.float32).copy())
        sizes = [("tok_emb", (vocab, dim)), ("rms_att", (L, dim)), ("wq", (L, dim, dim)),
                 ("wk", (L, KVH * hd, dim)), ("wv", (L, KVH * hd, dim)), ("wo", (L, dim, dim)),
                 ("rms_ffn", (L, dim)), ("w1", (L, hidden, dim)), ("w2", (L, dim, hidden)),
                 ("w3", (L, hidden, dim)), ("rms_final", (dim,)), ("freq", (seq_len * hd,))]
        if not shared:
            sizes.append(("wcls", (vocab, dim)))
        off = 0
        for name, shape in sizes:
            n = int(np.prod(shape))
            setattr(self, name, w[off:off + n].view(shape))
            off += n
        if off != w.numel():
            raise ValueError(f"{path}: {w.numel()} weights, the header implies {off}")
        if shared:
            self.wcls = self.tok_emb
        self.dim, self.hidden, self.n_layers, self.n_heads = dim, hidden, L, H
        self.n_kv_heads, self.vocab, self.seq_len, self.head_dim = KVH, vocab, seq_len, hd
        self.name = os.path.basename(path)
        self.fingerprint = fnv1a64(raw.tobytes())
        # RoPE: pair (2i, 2i+1) of each head turns by pos * 10000^(-2i / head_dim), in f32
        i = torch.arange(0, hd, 2, dtype=torch.float64)
        self.freq = (1.0 / torch.pow(10000.0, i / hd)).to(torch.float32)


def fnv1a64(data: bytes) -> int:
    """The checkpoint's fingerprint, as tools/refmodel/model.c computes it."""
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


class Tokenizer:
    """llama2.c's tokenizer.bin: BPE by merge score, byte fallback."""

    def __init__(self, path: str, vocab: int):
        with open(path, "rb") as f:
            data = f.read()
        self.pieces: List[bytes] = []
        self.scores: List[float] = []
        off = 4
        for _ in range(vocab):
            score, n = np.frombuffer(data, np.float32, 1, off)[0], \
                np.frombuffer(data, np.int32, 1, off + 4)[0]
            self.pieces.append(data[off + 8:off + 8 + n])
            self.scores.append(float(score))
            off += 8 + n
        self.ids = {p: i for i, p in enumerate(self.pieces)}

    def encode(self, text: str, bos: bool = True) -> List[int]:
        ids = [BOS] if bos else []
        if not text:
            return ids
        syms = [self.ids[b" "]]
        for ch in text:
            b = ch.encode()
            syms.extend([self.ids[b]] if b in self.ids else [x + 3 for x in b])
        while True:  # merge the best-scored adjacent pair, the leftmost of equals
            best, at = -1e10, -1
            for i in range(len(syms) - 1):
                j = self.ids.get(self.pieces[syms[i]] + self.pieces[syms[i + 1]])
                if j is not None and self.scores[j] > best:
                    best, at = self.scores[j], i
            if at < 0:
                return ids + syms
            syms[at:at + 2] = [self.ids[self.pieces[syms[at]] + self.pieces[syms[at + 1]]]]

    def decode(self, ids: List[int], prev: int = BOS) -> str:
        out = b""
        for t in ids:
            p = self.pieces[t]
            if prev == BOS and p.startswith(b" "):
                p = p[1:]
            if len(p) == 6 and p.startswith(b"<0x") and p.endswith(b">"):
                p = bytes([int(p[3:5], 16)])
            out += p
            prev = t
        return out.decode(errors="replace")


# ---- the forward pass -------------------------------------------------------------------

def rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    ss = (x * x).sum(-1, keepdim=True) / x.shape[-1] + 1e-5
    return w * (x * (1.0 / torch.sqrt(ss)))


def rope(x: torch.Tensor, pos: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim], pos [T] int: interleaved pairs turned in f32."""
    a = pos.to(torch.float32)[:, None] * freq[None, :]
    fr, fi = torch.cos(a)[:, None, :], torch.sin(a)[:, None, :]
    v0, v1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((v0 * fr - v1 * fi, v0 * fi + v1 * fr), dim=-1).flatten(-2)


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One query per head (q [H, D]) over rows k, v [n, KVH, D]: output
    [H, D], log-sum-exp [H], and each row's probability summed over heads."""
    grp = q.shape[0] // k.shape[1]
    kk, vv = k.repeat_interleave(grp, dim=1), v.repeat_interleave(grp, dim=1)
    s = torch.einsum("hd,nhd->hn", q, kk) * scale
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[:, None])
    return torch.einsum("hn,nhd->hd", p, vv), lse, p.sum(0)


def merge(ob: torch.Tensor, lb: torch.Tensor, ot: torch.Tensor, lt: torch.Tensor) -> torch.Tensor:
    """Attention over blocks and over the tail merged through their lse
    (lb is -inf where no block is retained)."""
    mx = torch.maximum(lb, lt)
    wb, wt = torch.exp(lb - mx)[:, None], torch.exp(lt - mx)[:, None]
    return (wb * ob + wt * ot) / (wb + wt)


class Server:
    """One model and one kvtier engine, serving Agents from any thread."""

    def __init__(self, model: Model, engine: kvtier.Engine, attention: str = "kvtier"):
        self.m, self.e, self.attention = model, engine, attention
        m = model
        self.ns = engine.namespace(f"llama2c/{m.name}", f"fnv1a64:{m.fingerprint:016x}",
                                   n_layers=m.n_layers, n_kv_heads=m.n_kv_heads,
                                   head_dim=m.head_dim, dtype="f32", block_tokens=BLOCK_TOKENS,
                                   rope_theta=10000.0)
        self.scale = 1.0 / float(np.sqrt(np.float32(m.head_dim)))


class Agent:
    """One conversation: a kvtier sequence plus the partial block (tail)
    the sequence cannot hold yet."""

    def __init__(self, server: Server, name: str):
        self.sv, self.m, self.name = server, server.m, name
        self.seq = server.ns.sequence()
        m = self.m
        self.tokens: List[int] = []
        self.tail_k = torch.zeros(m.n_layers, BLOCK_TOKENS, m.n_kv_heads, m.head_dim)
        self.tail_v = torch.zeros_like(self.tail_k)
        cap = m.seq_len
        # gather buffers owned here; kvtier writes into them through numpy views
        self.gk = torch.empty(cap, m.n_kv_heads, m.head_dim)
        self.gv = torch.empty_like(self.gk)
        self.report = {"blocks_ram": 0, "blocks_loaded": 0, "computed": 0, "load_s": 0.0}

    def close(self) -> None:
        self.seq.release()

    # -- the cache
    def _gather(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        k, _ = self.seq.gather(layer, self.gk.numpy(), self.gv.numpy())
        n = k.shape[0]
        return self.gk[:n], self.gv[:n]

    def _store_block(self, toks: List[int], k: List[torch.Tensor], v: List[torch.Tensor]) -> None:
        """Append one full token block and put each layer the engine does
        not hold already (k[l], v[l]: [16, KVH, D] contiguous f32)."""
        info = self.seq.append(toks)
        if info.layers_present == self.m.n_layers:
            return  # adopted: another agent stored it meanwhile
        for layer in range(self.m.n_layers):
            self.seq.put(info.block, layer, k[layer].numpy(), v[layer].numpy())

    def _resume(self, prompt: List[int]) -> int:
        """Take the stored leading blocks of prompt (all but its last token):
        adopt those in RAM, load the cold ones asynchronously (all their
        layers in one batch), put them back. Returns the tokens taken."""
        ns, L, bt = self.sv.ns, self.m.n_layers, BLOCK_TOKENS
        hit = ns.lookup(prompt[:-1])
        if hit.n_found == 0:
            return 0
        cold = [b for b, ent in enumerate(hit.entries) if ent.tier == kvtier.TIER_COLD]
        bufs = {(b, l): (ns.empty_block(), ns.empty_block()) for b in cold for l in range(L)}
        t0 = time.perf_counter()
        load = ns.load([(hit.entries[b].key, l, *bufs[b, l]) for b in cold for l in range(L)]) \
            if cold else None
        # ... free to do other work here: the loads run on the engine's I/O threads
        n_ok = hit.n_found
        if load is not None:
            res = load.wait(check=False)
            for i, r in enumerate(res):  # a block that failed its check is recomputed
                if r.status:
                    n_ok = min(n_ok, cold[i // L])
        self.report["load_s"] = time.perf_counter() - t0
        for b in range(n_ok):
            info = self.seq.append(prompt[b * bt:(b + 1) * bt])
            if info.layers_present == L:
                self.report["blocks_ram"] += 1
                continue
            if (b, 0) not in bufs:  # left RAM since the lookup: load it now
                bufs.update({(b, l): (ns.empty_block(), ns.empty_block()) for l in range(L)})
                ns.load([(info.key, l, *bufs[b, l]) for l in range(L)]).wait()
            for layer in range(L):
                self.seq.put(info.block, layer, *bufs[b, layer])
            self.report["blocks_loaded"] += 1
        self.tokens = list(prompt[:n_ok * bt])
        return n_ok * bt

    # -- the model
    def prefill(self, prompt: List[int], all_logits: bool = False) -> torch.Tensor:
        """Resume from the store, compute the rest of prompt in one pass
        (torch attention over the gathered blocks, causal over the new
        tokens), store its full blocks, keep the tail. Returns the logits
        of the last token ([T, vocab] for every computed one with all_logits)."""
        m = self.m
        p0 = self._resume(prompt)
        new = prompt[p0:]
        T = len(new)
        self.report["computed"] = T
        pos = torch.arange(p0, p0 + T)
        x = m.tok_emb[torch.tensor(new)]
        ks, vs = [], []
        for layer in range(m.n_layers):
            xb = rmsnorm(x, m.rms_att[layer])
            q = rope((xb @ m.wq[layer].T).view(T, m.n_heads, m.head_dim), pos, m.freq)
            k = rope((xb @ m.wk[layer].T).view(T, m.n_kv_heads, m.head_dim), pos, m.freq)
            v = (xb @ m.wv[layer].T).view(T, m.n_kv_heads, m.head_dim)
            ks.append(k)
            vs.append(v)
            pk, pv = self._gather(layer)  # the p0 stored tokens, written into our buffers
            kk = torch.cat((pk, k)).repeat_interleave(m.n_heads // m.n_kv_heads, dim=1)
            vv = torch.cat((pv, v)).repeat_interleave(m.n_heads // m.n_kv_heads, dim=1)
            s = torch.einsum("thd,shd->hts", q, kk) * self.sv.scale
            mask = torch.arange(p0 + T)[None, :] > pos[:, None]
            s = s.masked_fill(mask[None], float("-inf"))
            att = torch.einsum("hts,shd->thd", torch.softmax(s, dim=-1), vv)
            x = x + att.reshape(T, m.dim) @ m.wo[layer].T
            xb = rmsnorm(x, m.rms_ffn[layer])
            h1, h3 = xb @ m.w1[layer].T, xb @ m.w3[layer].T
            x = x + (torch.nn.functional.silu(h1) * h3) @ m.w2[layer].T
        logits = rmsnorm(x, m.rms_final) @ m.wcls.T
        self._keep(new, ks, vs)
        return logits if all_logits else logits[-1]

    def _keep(self, new: List[int], ks: List[torch.Tensor], vs: List[torch.Tensor]) -> None:
        """Store the full blocks among new tokens; the rest becomes the tail."""
        bt, start = BLOCK_TOKENS, len(self.tokens)
        for i, t in enumerate(new):
            p = start + i
            for layer in range(self.m.n_layers):
                self.tail_k[layer, p % bt] = ks[layer][i]
                self.tail_v[layer, p % bt] = vs[layer][i]
            self.tokens.append(t)
            if p % bt == bt - 1:
                self._store_block(self.tokens[-bt:], list(self.tail_k), list(self.tail_v))

    def step(self, token: int) -> torch.Tensor:
        """Decode one token: attention over the stored blocks (kvtier's
        attend, or torch over the gathered blocks) merged with the tail;
        observe each block's mass. Returns the next token's logits."""
        m, bt = self.m, BLOCK_TOKENS
        p = len(self.tokens)
        nt = p % bt + 1
        pos = torch.tensor([p])
        x = m.tok_emb[token][None]
        for layer in range(m.n_layers):
            xb = rmsnorm(x, m.rms_att[layer])
            q = rope((xb @ m.wq[layer].T).view(1, m.n_heads, m.head_dim), pos, m.freq)[0]
            self.tail_k[layer, p % bt] = rope((xb @ m.wk[layer].T).view(1, m.n_kv_heads,
                                                                         m.head_dim), pos, m.freq)[0]
            self.tail_v[layer, p % bt] = (xb @ m.wv[layer].T).view(m.n_kv_heads, m.head_dim)
            ot, lt, _ = attend_rows(q, self.tail_k[layer, :nt], self.tail_v[layer, :nt],
                                    self.sv.scale)
            if p >= bt:
                if self.sv.attention == "kvtier":
                    a = self.seq.attend(layer, q.contiguous().numpy(), self.sv.scale)
                    ob, lb, mass = torch.from_numpy(a.out), torch.from_numpy(a.lse), a.block_mass
                else:
                    pk, pv = self._gather(layer)
                    ob, lb, row_mass = attend_rows(q, pk, pv, self.sv.scale)
                    mass = row_mass.view(-1, bt).sum(1).numpy()
                self.seq.observe(layer, np.ascontiguousarray(mass, np.float32))
                o = merge(ob, lb, ot, lt)
            else:
                o = ot
            x = x + o.reshape(1, m.dim) @ m.wo[layer].T
            xb = rmsnorm(x, m.rms_ffn[layer])
            h1, h3 = xb @ m.w1[layer].T, xb @ m.w3[layer].T
            x = x + (torch.nn.functional.silu(h1) * h3) @ m.w2[layer].T
        self.tokens.append(token)
        if p % bt == bt - 1:
            self._store_block(self.tokens[-bt:], list(self.tail_k), list(self.tail_v))
        return (rmsnorm(x, m.rms_final) @ m.wcls.T)[0]


def teacher_force(server: Server, tokens: List[int], prompt_len: int
                  ) -> Tuple[np.ndarray, int, dict]:
    """Logits of positions first .. len-2 (first: the first position the
    prefill computed, after what it resumed from the store), prefilling
    tokens[:prompt_len] and decoding the rest one by one, and the agent's
    report. For the test against `kvtier eval --dump-logits`."""
    ag = Agent(server, "check")
    try:
        with torch.no_grad():
            out = [ag.prefill(tokens[:prompt_len], all_logits=True)]
            first = prompt_len - out[0].shape[0]
            for t in tokens[prompt_len:-1]:
                out.append(ag.step(t)[None])
        return torch.cat(out).numpy(), first, ag.report
    finally:
        ag.close()


# ---- the serving loop -------------------------------------------------------------------

def serve(server: Server, tok: Tokenizer, n_agents: int, n_new: int) -> List[dict]:
    """Agent 0 arrives first; the others arrive once its prompt is in the
    cache and run concurrently, one thread each. Greedy decoding."""
    results: List[Optional[dict]] = [None] * n_agents
    errors: List[BaseException] = []
    first_prefilled = threading.Event()

    def run(i: int) -> None:
        ag = Agent(server, f"agent {i}")
        try:
            with torch.no_grad():
                prompt = tok.encode(SYSTEM_PROMPT + AGENT_PROMPTS[i % len(AGENT_PROMPTS)])
                t0 = time.perf_counter()
                logits = ag.prefill(prompt)
                if i == 0:
                    first_prefilled.set()
                out: List[int] = []
                for _ in range(n_new):
                    nxt = int(torch.argmax(logits))
                    out.append(nxt)
                    logits = ag.step(nxt)
                results[i] = dict(ag.report, agent=i, prompt_tokens=len(prompt),
                                  text=tok.decode(prompt[1:]) + "|" +
                                  tok.decode(out, prev=prompt[-1]),
                                  blocks=ag.seq.blocks, seconds=time.perf_counter() - t0,
                                  seq=ag)
        except BaseException as e:  # reported by the caller
            errors.append(e)
            first_prefilled.set()
            ag.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_agents)]
    threads[0].start()
    first_prefilled.wait()
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    models = os.path.join(data_dir(), "models")
    ap.add_argument("--model", default=os.path.join(models, "stories260K.bin"))
    ap.add_argument("--tokenizer", default=None, help="default: tok<vocab>.bin beside the model")
    ap.add_argument("--dir", default="./kvtier-serve", help="the store (kept between runs)")
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48, help="tokens each agent generates")
    ap.add_argument("--attention", choices=("kvtier", "torch"), default="kvtier",
                    help="decode attention through kvt_seq_attend or torch over gathered blocks")
    a = ap.parse_args()
    if not os.path.exists(a.model):
        print(f"serve_llama2c: no model at {a.model} (set KVTIER_DATA)", file=sys.stderr)
        return 1
    torch.set_num_threads(1)  # one thread per agent already
    model = Model(a.model)
    tok = Tokenizer(a.tokenizer or os.path.join(os.path.dirname(a.model),
                                                f"tok{model.vocab}.bin"), model.vocab)
    with kvtier.Engine(a.dir, hot_bytes=256 << 20, cold_bytes=1 << 30) as e:
        server = Server(model, e, a.attention)
        t0 = time.perf_counter()
        res = serve(server, tok, a.agents, a.tokens)
        wall = time.perf_counter() - t0
        e.sync()
        print(f"model {model.name} (dim {model.dim}, {model.n_layers} layers, {model.n_heads} "
              f"heads, {model.n_kv_heads} KV heads), {a.agents} agents, attention via "
              f"{a.attention}, store {a.dir}\n")
        for r in res:
            print(f"agent {r['agent']}: prompt {r['prompt_tokens']} tokens: "
                  f"{r['blocks_ram']} blocks adopted from RAM, {r['blocks_loaded']} loaded "
                  f"from disk ({r['load_s'] * 1e3:.1f} ms), {r['computed']} tokens computed; "
                  f"{r['blocks']} blocks, {r['seq'].seq.durable} durable")
            print("  " + r["text"].replace("\n", "\n  "))
        for r in res:
            r["seq"].close()
        st = e.stats()
        print(f"\nengine: {st['tier_blocks']['hot']} layer blocks hot "
              f"({st['tier_bytes']['hot'] / 1024:.0f} KiB), {st['cold_records']} token blocks "
              f"on disk; dedup hits {st['dedup_hits']}; lookups {st['lookups']}: "
              f"{st['lookup_blocks_hit']} blocks hit, {st['lookup_blocks_miss']} missed; "
              f"{st['cold_reads']} layer blocks read from disk; {st['attends']} attends")
        print(f"wall {wall:.2f} s for {a.agents} x {a.tokens} tokens generated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
