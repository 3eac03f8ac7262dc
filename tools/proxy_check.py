#!/usr/bin/env python3
"""proxy_check.py - does the lost-attention-mass proxy of `kvtier calibrate`
track ΔNLL? For a few (layer, scorer, share) points it writes a profile that
limits only that layer (the others keep everything: scorer "full", share 1),
runs `kvtier eval --policy auto --profile` on sequences other than the
evaluation set, and prints the Spearman rank correlation between the proxy
(from calibrate --sensitivity) and ΔNLL; the same for uniform policies (every
layer at one scorer and budget, proxy = mean over layers). Standard library
only."""
import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile


def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2.0
        i = j + 1
    return r


def spearman(x, y):
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else float("nan")


def proxy_at(sens, layer, scorer, share):
    xs, ys = sens["shares"], sens["layers"][layer][scorer]
    x0, y0 = 0.0, 1.0
    for x, y in zip(xs, ys):
        if share <= x:
            return y0 + (y - y0) * (share - x0) / (x - x0)
        x0, y0 = x, y
    return ys[-1]


def eval_json(a, extra):
    cmd = [a.kvtier, "eval", "--model", a.model, "--seed", str(a.seed), "--sequences",
           str(a.sequences), "--block-tokens", str(a.block_tokens), "--json"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit("eval failed: %s: %s" % (" ".join(cmd), p.stderr.strip()))
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kvtier", default="build/kvtier")
    ap.add_argument("--model", required=True)
    ap.add_argument("--sensitivity", required=True, help="kvtier calibrate --sensitivity output")
    ap.add_argument("--shape", required=True, help="n_layers,n_kv_heads,head_dim,block_tokens")
    ap.add_argument("--seed", type=int, default=9000)
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--points", default="0:recent:0.1,1:recent:0.1,2:recent:0.1,3:recent:0.1,"
                    "4:recent:0.1,0:h2o:0.25,2:h2o:0.25,4:h2o:0.25,1:sink-recent:0.25,"
                    "3:sink-recent:0.25,2:recent:0.5,4:h2o:0.5")
    ap.add_argument("--uniform", default="recent:0.1,recent:0.25,recent:0.5,sink-recent:0.1,"
                    "sink-recent:0.25,sink-recent:0.5,h2o:0.1,h2o:0.25,h2o:0.5")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    sens = json.load(open(a.sensitivity))
    L, kvh, hd, bt = (int(x) for x in a.shape.split(","))
    a.block_tokens = bt
    tmp = tempfile.mkdtemp(prefix="kvt_proxy_")
    jobs = []
    for i, pt in enumerate(filter(None, a.points.split(","))):
        l, s, sh = pt.split(":")
        l, sh = int(l), float(sh)
        layers = [{"scorer": "full", "share": 1.0} for _ in range(L)]
        layers[l] = {"scorer": s, "share": sh}
        budget = sum(x["share"] for x in layers) / L
        prof = {"format": "kvtier-profile", "version": 1, "model": "proxy-check",
                "shape": {"n_layers": L, "n_kv_heads": kvh, "head_dim": hd, "block_tokens": bt},
                "profiles": [{"budget": budget, "layers": layers}]}
        path = os.path.join(tmp, "p%d.json" % i)
        with open(path, "w") as f:
            json.dump(prof, f)
        jobs.append(("layer", pt, proxy_at(sens, l, s, sh),
                     ["--policy", "auto", "--profile", path, "--budget", repr(budget)]))
    for pt in filter(None, a.uniform.split(",")):
        s, b = pt.split(":")
        b = float(b)
        px = sum(proxy_at(sens, l, s, b) for l in range(L)) / L
        jobs.append(("uniform", pt, px, ["--policy", s, "--budget", str(b)]))
    with cf.ThreadPoolExecutor(max_workers=a.jobs) as ex:
        res = list(ex.map(lambda j: eval_json(a, j[3]), jobs))
    print("| kind | point | lost mass (proxy) | ΔNLL ± se |")
    print("|---|---|---:|---:|")
    for j, r in zip(jobs, res):
        print("| %s | %s | %.4f | %.4f ± %.4f |" % (j[0], j[1], j[2], r["delta_nll"], r["delta_nll_se"]))
    for kind in ("layer", "uniform"):
        xs = [j[2] for j in jobs if j[0] == kind]
        ys = [r["delta_nll"] for j, r in zip(jobs, res) if j[0] == kind]
        if len(xs) > 2:
            print("\n%s points: Spearman rank correlation %.3f over %d points" % (kind, spearman(xs, ys), len(xs)))


if __name__ == "__main__":
    main()
