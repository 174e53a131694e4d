"""`spillway --version` and the speed lines of `spillway run`."""
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPILLWAY = os.environ.get("SPILLWAY_BIN", str(ROOT / "build/bin/spillway"))


def project_version():
    return re.search(r"project\(spillway VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)


def test_version_names_the_project_version():
    r = subprocess.run([SPILLWAY, "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"spillway {project_version()}"), r.stdout


def test_run_prints_prefill_and_decode_rates_on_stderr():
    r = subprocess.run([SPILLWAY, "run", "-p", "def main(", "-n", "4", "--temperature", "0"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    prefill = re.search(r"^prefill: (\d+) tokens in ([0-9.]+) s, ([0-9.]+) tokens/s$", r.stderr, re.M)
    decode = re.search(r"^decode: (\d+) tokens in ([0-9.]+) s, ([0-9.]+) tokens/s$", r.stderr, re.M)
    assert prefill and decode, r.stderr
    assert int(prefill.group(1)) >= 2 and float(prefill.group(3)) > 0  # BOS + the prompt
    assert 1 <= int(decode.group(1)) <= 4 and float(decode.group(3)) > 0
    assert "tokens/s" not in r.stdout  # stdout stays the generated text
