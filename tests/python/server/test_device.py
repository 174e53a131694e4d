"""`serve --device`: which model runner serves (model/model_runner.h), logged at start-up, and a clear
failure when the GPU runner cannot start. The suite runs on the CPU runner in CI; scripts/gpu_serve.sh runs it
with SPILLWAY_DEVICE=cuda on a GPU."""
from __future__ import annotations

import os
import re
import subprocess


def test_the_runner_is_named_at_start_up(server):
    log = "".join(server.log)
    m = re.search(r"serving .* \((?:model id \"[^\"]*\", )?(\w+) runner\)", log)
    assert m, log
    wanted = os.environ.get("SPILLWAY_DEVICE", "auto")
    if wanted == "auto":
        assert re.search(r"--device auto: (cpu|cuda) \(", log), log
        assert m.group(1) in ("cpu", "cuda")
    else:
        assert m.group(1) == wanted, log


def run_serve(spillway_bin, model_dir, *args, env=None):
    return subprocess.run([spillway_bin, "serve", "--model", str(model_dir), "--port", "0", "--threads", "1", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_cuda_without_a_visible_gpu_fails_clearly(spillway_bin, model_dir):
    # CUDA_VISIBLE_DEVICES="" hides every GPU, so this holds on GPU machines too; a CPU-only build says so instead.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("SPILLWAY_DEVICE", None)
    p = run_serve(spillway_bin, model_dir, "--device", "cuda", env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert re.search(r"--device cuda: (no CUDA device is visible|this spillway was built without CUDA)", out), out


def test_unknown_device_is_refused(spillway_bin, model_dir):
    p = run_serve(spillway_bin, model_dir, "--device", "tpu")
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert "--device" in out and "tpu" in out, out
