#!/usr/bin/env python3
"""policy_table.py - the evidence table of docs/policy.md: `kvtier eval --json`
on the same sequences (default 32 sequences of 512 tokens, seeds 1..32) at byte
budgets 0.1, 0.25, 0.5 and block sizes 16 and 1, for each uniform scorer, the
PyramidKV profile, the calibrated profile, learned, profile + learned and the
oracle; prints a markdown table. Profiles and predictors must come from
sequences other than the evaluated ones (kvtier calibrate / train on e.g.
--seed 5000). Standard library only; runs --jobs evaluations at once."""
import argparse
import concurrent.futures as cf
import json
import subprocess
import sys

UNIFORM = ["recent", "sink-recent", "h2o", "snapkv", "tova"]
BUDGETS = [0.1, 0.25, 0.5]
BLOCKS = [16, 1]
# JSON keys of kvtier eval, in table order; a key eval does not print is "-"
COLS = [("delta_nll", "delta_nll_se"), ("kl", None), ("top1", None),
        ("kept_fraction", None), ("kept_tokens_fraction", None), ("missed_mass_next32", None)]


def rows_for(a, bt):
    """(label, extra eval arguments) of every row at block size bt."""
    rows = [(s, ["--policy", s]) for s in a.uniform.split(",") if s]
    by_bt = lambda spec: dict(x.split("=", 1) for x in spec.split(",")).get(str(bt)) if spec else None
    pyr, prof = by_bt(a.pyramid), by_bt(a.profile)
    pred = by_bt(a.predictor) if a.predictor and "=" in a.predictor else a.predictor
    if pyr:
        rows.append(("pyramid (" + a.pyramid_label + ")", ["--policy", "auto", "--profile", pyr]))
    if prof:
        rows.append(("calibrated profile", ["--policy", "auto", "--profile", prof]))
    if pred:
        rows.append(("learned", ["--policy", "learned", "--predictor", pred]))
    lprof = by_bt(a.learned_profile)
    if pred and (lprof or prof):
        rows.append(("profile + learned",
                     ["--policy", "auto", "--profile", lprof or prof, "--predictor", pred]))
    rows.append(("oracle (next 32 steps)", ["--policy", "oracle"]))
    if a.only:
        keep = a.only.split(",")
        rows = [r for r in rows if any(r[0].startswith(k) for k in keep)]
    return rows


def run_eval(a, bt, budget, extra):
    cmd = [a.kvtier, "eval", "--model", a.model, "--seed", str(a.seed), "--sequences",
           str(a.sequences), "--len", str(a.len), "--budget", str(budget), "--block-tokens",
           str(bt), "--json"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[0]}
    return json.loads(p.stdout)


def cell(r, key, se):
    if "error" in r:
        return "-"
    v = r.get(key)
    if v is None:
        return "-"
    if se and r.get(se) is not None:
        return "%.4f ± %.4f" % (v, r[se])
    return "%.4f" % v


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kvtier", default="build/kvtier")
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", help="calibrated profiles by block size: 16=P16.json,1=P1.json")
    ap.add_argument("--pyramid", help="PyramidKV profiles by block size: 16=Y16.json,1=Y1.json")
    ap.add_argument("--pyramid-label", default="sink-recent")
    ap.add_argument("--predictor",
                    help="kvtier train's predictor: one file, or by block size: 16=P16.pred,1=P1.pred")
    ap.add_argument("--learned-profile",
                    help="profiles calibrated with --predictor, by block size (profile + learned; "
                         "default: --profile)")
    ap.add_argument("--sequences", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--blocks", default="16,1")
    ap.add_argument("--budgets", default="0.1,0.25,0.5")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json-out", help="also write every run's JSON here")
    ap.add_argument("--only", help="rows whose label starts with one of these (comma-separated)")
    ap.add_argument("--uniform", default=",".join(UNIFORM), help="uniform scorers to run")
    a = ap.parse_args()
    blocks = [int(x) for x in a.blocks.split(",")]
    budgets = [float(x) for x in a.budgets.split(",")]
    jobs = [(bt, b, label, extra) for bt in blocks for b in budgets for label, extra in rows_for(a, bt)]
    with cf.ThreadPoolExecutor(max_workers=a.jobs) as ex:
        futs = {ex.submit(run_eval, a, bt, b, extra): (bt, b, label) for bt, b, label, extra in jobs}
        done = {}
        for f in cf.as_completed(futs):
            done[futs[f]] = f.result()
            print("done %s" % (futs[f],), file=sys.stderr)
    print("%d sequences of %d tokens, seeds %d..%d; mean ± standard error over sequences.\n"
          % (a.sequences, a.len, a.seed, a.seed + a.sequences - 1))
    print("| block | budget | policy | ΔNLL ± se | KL | top-1 | kept bytes | kept tokens | missed mass (next 32) |")
    print("|---:|---:|---|---|---|---|---|---|---|")
    for bt, b, label, _ in jobs:
        r = done[(bt, b, label)]
        cells = [cell(r, k, se) for k, se in COLS]
        note = " (%s)" % r["error"] if "error" in r else ""
        print("| %d | %g | %s%s | %s |" % (bt, b, label, note, " | ".join(cells)))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump([{"block_tokens": bt, "budget": b, "policy": label, "result": done[(bt, b, label)]}
                       for bt, b, label, _ in jobs], f, indent=1)


if __name__ == "__main__":
    main()
