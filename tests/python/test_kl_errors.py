"""`spillway kl` bad input: a missing held-out text is named as such (it used to be reported as a missing
calibration file, pointing the user at the quantizer's flag) and nothing is computed."""
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPILLWAY = os.environ.get("SPILLWAY_BIN", str(ROOT / "build/bin/spillway"))
DEMO = ROOT / "models/demo"


def run_kl(text, command="kl"):
    return subprocess.run([SPILLWAY, command, "--model", str(DEMO), "--quantized", str(DEMO), "--text", str(text),
                           "--tokens", "64", "--row", "32"], capture_output=True, text=True, timeout=300)


def test_missing_text_names_the_held_out_text(tmp_path):
    missing = tmp_path / "no_such_heldout.txt"
    r = run_kl(missing)
    assert r.returncode != 0
    assert "held-out text" in r.stderr and str(missing) in r.stderr and "--text" in r.stderr, r.stderr
    assert "calibration" not in r.stderr, r.stderr
    assert "mean_kl" not in r.stdout


def test_eval_kl_is_an_alias_of_kl(tmp_path):
    # The command's former name still runs the same command (same error on the same input).
    missing = tmp_path / "no_such_heldout.txt"
    r = run_kl(missing, command="eval-kl")
    assert r.returncode != 0
    assert "held-out text" in r.stderr and "--text" in r.stderr, r.stderr
