"""`spillway quantize --dry-run` on a header-only copy of the released V4.1-Flash checkpoint: the plan must read the
real inventory (46,080 routed-expert tensors) and print a calibration memory that a workstation can hold, because the
calibration streams one layer at a time (docs/quantize.md, step 3).

The expected sizes are worked out here from the spec's dimensions (d = 5120, f = 2304, 384 experts, vocab 129,280),
not read from the code: the model-wide fp32 weights are the embedding, the head and the final norm; one layer holds
its 384 × 3 experts as fp32 plus its attention; an expert's accumulators are fp64 d² (gate/up) + 3 f² (down and its
prior).
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPILLWAY = os.environ.get("SPILLWAY_BIN", str(ROOT / "build/bin/spillway"))

D, F, E, VOCAB = 5120, 2304, 384, 129280


@pytest.fixture(scope="module")
def v41(tmp_path_factory):
    out = tmp_path_factory.mktemp("v41")
    subprocess.run([sys.executable, str(ROOT / "tools/make_header_only_checkpoint.py"), "--model", "v41", str(out)],
                   check=True, capture_output=True)
    return out


def plan(model, tmp_path, *extra):
    calib = tmp_path / "calib.txt"
    calib.write_text("def f(x):\n    return x\n")
    r = subprocess.run([SPILLWAY, "quantize", "--model", str(model), "--out", str(tmp_path / "pack"), "--bits", "3",
                        "--calibration", str(calib), "--dry-run", *extra],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "pack").exists(), "a dry run writes nothing"
    return r.stdout


def gb(text, label):
    m = re.search(r"([\d.]+) (GB|MB) " + re.escape(label), text)
    assert m, f"no '{label}' in: {text}"
    return float(m.group(1)) * (1e9 if m.group(2) == "GB" else 1e6)


def test_v41_plan_streams_one_layer(v41, tmp_path):
    out = plan(v41, tmp_path, "--calibration-memory", "64")
    assert "quantize 46080 routed-expert tensors (40 layers × 384 experts × w1/w2/w3)" in out
    line = next(l for l in out.splitlines() if "calibration memory:" in l)
    model_wide = 4 * (2 * VOCAB * D + D)
    assert gb(line, "model-wide weights") == pytest.approx(model_wide, rel=0.01)
    one_layer = gb(line, "for one layer without its routed experts")
    assert 4 * 3 * F * D < one_layer < 4 * 3 * E * F * D / 20, "attention and the shared expert, not 384 experts as fp32"
    in_use = gb(line, "for the routed experts in use")
    per_thread = in_use / (4 * 3 * F * D)
    assert round(per_thread) >= 1 and abs(per_thread - round(per_thread)) < 0.01, "whole fp32 experts, one per thread"
    per_expert = 8 * (D * D + 3 * F * F)
    group = int(re.search(r"Hessians of (\d+) of 384 experts at a time", line).group(1))
    assert group == (64 << 30) // per_expert
    total = gb(line, "=")
    assert total < (64 << 30) + 20e9, "streamed: the Hessian budget plus a few GB, not ≈ 2.2 TB of fp32 weights"


def test_v41_plan_gate_up_shared_fits_more_experts(v41, tmp_path):
    out = plan(v41, tmp_path, "--calibration-memory", "64", "--gate-up-shared")
    group = int(re.search(r"Hessians of (\d+) of 384 experts at a time", out).group(1))
    assert group == min(E, (64 << 30) // (8 * 3 * F * F))
