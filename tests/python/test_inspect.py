"""`spillway inspect` on header-only copies of the real V4.1-Flash and V4-Flash checkpoints.

tools/make_header_only_checkpoint.py writes the released shapes (from the spec's inventories) as
shard headers without data; inspect must read them and report the real structure.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPILLWAY = os.environ.get("SPILLWAY_BIN", str(ROOT / "build/bin/spillway"))


def header_only(tmp_path_factory, model):
    out = tmp_path_factory.mktemp(model)
    subprocess.run([sys.executable, str(ROOT / "tools/make_header_only_checkpoint.py"), "--model", model, str(out)],
                   check=True, capture_output=True)
    return out


def inspect(path):
    r = subprocess.run([SPILLWAY, "inspect", str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def v41(tmp_path_factory):
    return inspect(header_only(tmp_path_factory, "v41"))


@pytest.fixture(scope="module")
def v4(tmp_path_factory):
    return inspect(header_only(tmp_path_factory, "v4"))


def layer_rows(text):
    return [line.split() for line in text.splitlines() if re.match(r"^\s+\d+\s+(window|csa|hca|source|reindex|reuse)\s", line)]


def test_v41_structure(v41):
    assert "deepseek_v41, 40 layers, d_model 5120, 64 heads x 512, vocab 129280" in v41
    assert "384 routed (top 6, width 2304)" in v41
    assert "48 safetensors files, 96085 tensors" in v41
    rows = layer_rows(v41)
    assert len(rows) == 40
    assert all(r[-1] == "384" for r in rows), "every layer has 384 experts"
    kinds = {int(r[0]): r[1] for r in rows}
    assert [l for l, k in kinds.items() if k == "source"] == [2, 8, 14, 20]
    assert [l for l, k in kinds.items() if k == "reindex"] == [24, 28, 32, 36]
    assert kinds[0] == kinds[1] == "window"
    engram = [int(r[0]) for r in rows if "engram" in r]
    assert engram == [1, 14]
    # The model card's 552B parameters are the backbone without Engram tables, draft and vision.
    assert re.search(r"551\.\d\dB without Engram tables", v41)


def test_v4_structure(v4):
    assert "deepseek_v4, 43 layers, d_model 4096" in v4
    assert "69187 tensors" in v4
    rows = layer_rows(v4)
    assert len(rows) == 43
    assert all(r[-1] == "256" for r in rows)
    assert [int(r[0]) for r in rows if r[3] == "hash"] == [0, 1, 2]
    assert {r[1] for r in rows[3::2]} == {"hca"} and {r[1] for r in rows[2::2]} == {"csa"}
