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


def test_metrics_name_the_runner_and_its_kv_pages(server):
    m = server.metrics()
    devices = [k for k, v in m.items() if k.startswith("spillway_runner_info{") and v == 1]
    assert len(devices) == 1, m
    device = re.search(r'device="(\w+)"', devices[0]).group(1)
    assert device in ("cpu", "cuda")
    assert 0 <= m["spillway_kv_blocks_used"] <= m["spillway_kv_blocks_total"]
    if device == "cuda":  # the GPU runner's paged pools and the device's memory
        assert m["spillway_kv_blocks_total"] > 0
        assert 0 < m["spillway_device_memory_used_bytes"] <= m["spillway_device_memory_total_bytes"]
    else:  # the CPU reference counts blocks of 16 positions of --kv-tokens (the server's default), no device
        assert m["spillway_kv_blocks_total"] == m["spillway_kv_tokens_capacity"] / 16
        assert "spillway_device_memory_total_bytes" not in m
