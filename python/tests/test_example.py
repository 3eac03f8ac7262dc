"""test_example.py - examples/serve_llama2c.py, the PyTorch model serving
from kvtier: its logits equal the C reference decoder's (`kvtier eval
--dump-logits`) within 1e-4, computed from scratch, resumed from blocks
another agent stored, with attention in torch, and resumed from a store
`kvtier warm` filled (the C decoder's KV loaded from disk); and its
serving loop, run twice on one store, loads the second time what it
computed the first and generates the same text. Skipped, saying why,
without torch, the model data or the kvtier command."""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import SRC

torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                            "(apt-get install python3-torch): the example cannot run")
DATA = os.environ.get("KVTIER_DATA") or os.path.join(SRC, "..", "shared", "data")
MODEL = os.path.join(DATA, "models", "stories260K.bin")
KVT = os.environ.get("KVTIER_BIN") or os.path.join(SRC, "build", "kvtier")
if not os.path.exists(MODEL):
    pytest.skip(f"no model at {MODEL} (set KVTIER_DATA)", allow_module_level=True)
if not os.access(KVT, os.X_OK):
    pytest.skip(f"no kvtier command at {KVT} (set KVTIER_BIN)", allow_module_level=True)

import kvtier  # noqa: E402

TOL = 1e-4


@pytest.fixture(scope="module")
def ex():
    spec = importlib.util.spec_from_file_location(
        "serve_llama2c", os.path.join(SRC, "examples", "serve_llama2c.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.set_num_threads(1)
    return mod


@pytest.fixture(scope="module")
def model(ex):
    return ex.Model(MODEL)


@pytest.fixture(scope="module")
def case(ex, model, tmp_path_factory):
    """100 token ids and the C decoder's logits for positions 0..98."""
    tok = ex.Tokenizer(os.path.join(DATA, "models", "tok512.bin"), model.vocab)
    ids = tok.encode(ex.SYSTEM_PROMPT + " Lily ran to the ball and kicked it high into the "
                     "sky. It flew over the trees and landed in a pond. Lily was sad, but "
                     "a kind duck swam to the ball and pushed it back to her.")[:100]
    assert len(ids) == 100
    d = tmp_path_factory.mktemp("eval")
    (d / "ids.txt").write_text(" ".join(map(str, ids)) + "\n")
    subprocess.run([KVT, "eval", "--model", MODEL, "--input", str(d / "ids.txt"),
                    "--dump-logits", str(d / "logits.bin")], check=True, capture_output=True)
    ref = np.fromfile(d / "logits.bin", np.float32).reshape(-1, model.vocab)
    assert ref.shape == (99, model.vocab)
    return ids, ref, d


def max_diff(got, ref, first):
    assert got.shape == ref[first:].shape
    return float(np.abs(got - ref[first:]).max())


def test_logits_match_c_decoder_fresh_then_resumed(ex, model, case, tmp_path):
    ids, ref, _ = case
    with kvtier.Engine(tmp_path / "s", hot_bytes=64 << 20) as e:
        sv = ex.Server(model, e)
        got, first, rep = ex.teacher_force(sv, ids, 40)
        assert first == 0 and rep["computed"] == 40
        d0 = max_diff(got, ref, first)
        # a second agent finds the first two blocks (32 tokens) stored and adopts them
        got, first, rep = ex.teacher_force(sv, ids, 40)
        assert first == 32 and rep["blocks_ram"] == 2
        d1 = max_diff(got, ref, first)
        # the sequences put all six full blocks of the 99 decoded tokens
        assert sv.ns.lookup(ids).n_found == 6
    print(f"logits max abs difference: fresh {d0:.3g}, resumed {d1:.3g}")
    assert d0 < TOL and d1 < TOL


def test_logits_match_with_torch_attention(ex, model, case, tmp_path):
    ids, ref, _ = case
    with kvtier.Engine(tmp_path / "s", hot_bytes=64 << 20) as e:
        got, first, _ = ex.teacher_force(ex.Server(model, e, "torch"), ids, 20)
    d = max_diff(got, ref, first)
    print(f"logits max abs difference, torch attention: {d:.3g}")
    assert first == 0 and d < TOL


def test_logits_match_resumed_from_kvtier_warm(ex, model, case, tmp_path):
    """The C decoder computes and stores the KV (kvtier warm); the torch
    model loads it from disk and carries on."""
    ids, ref, d = case
    store = tmp_path / "warm"
    subprocess.run([KVT, "warm", "--model", MODEL, "--tokens", str(d / "ids.txt"),
                    "--dir", str(store)], check=True, capture_output=True)
    with kvtier.Engine(store, hot_bytes=64 << 20, cold_bytes=64 << 30) as e:
        got, first, rep = ex.teacher_force(ex.Server(model, e), ids, 90)
    dd = max_diff(got, ref, first)
    print(f"logits max abs difference, resumed from kvtier warm's store: {dd:.3g}")
    assert first == 80 and rep["blocks_loaded"] == 5 and dd < TOL


def test_serving_loop_twice_on_one_store(tmp_path):
    cmd = [sys.executable, os.path.join(SRC, "examples", "serve_llama2c.py"), "--model", MODEL,
           "--agents", "4", "--tokens", "12", "--dir", str(tmp_path / "serve")]
    runs = [subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            for _ in range(2)]
    for out in runs:
        assert out.count("\nagent ") == 4, out
    texts = [[ln for ln in out.splitlines() if ln.startswith("  Once")] for out in runs]
    assert len(texts[0]) == 4 and texts[0] == texts[1], "loaded KV gave other text"
    assert "agent 0: prompt 52 tokens: 0 blocks adopted from RAM, 0 loaded" in runs[0]
    assert "agent 1: prompt 52 tokens: 3 blocks adopted from RAM" in runs[0]
    assert "agent 0: prompt 52 tokens: 0 blocks adopted from RAM, 3 loaded from disk" in runs[1]
