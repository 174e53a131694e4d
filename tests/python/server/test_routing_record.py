"""`serve --record-routing FILE`: routing statistics of a serving run, written at shutdown in the format
`spillway plan --routing-stats` reads (docs/placement.md "Routing statistics").

With the prefix cache off, every prompt token and every generated token but the last goes through each layer's
router once, so n_tokens is known exactly from the responses' usage, and each layer's counts sum to
n_tokens × top_k. Runs on whichever runner SPILLWAY_DEVICE picks (the GPU engine counts on the device)."""
from __future__ import annotations

import json
import os
import subprocess

from spw_server_harness import Server


def model_shape(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    return text["num_hidden_layers"], text["n_routed_experts"], text["num_experts_per_tok"]


def serve(spillway_bin, model_dir, *args):
    return Server(spillway_bin, model_dir, "--device", os.environ.get("SPILLWAY_DEVICE", "auto"), *args)


def test_a_run_is_recorded_and_plan_reads_it(spillway_bin, model_dir, tmp_path):
    stats_file = tmp_path / "routing.json"
    s = serve(spillway_bin, model_dir, "--prefix-cache-mb", "0", "--record-routing", str(stats_file))
    routed = 0
    try:
        client = s.client()
        for i, prompt in enumerate(["The quick brown fox", "def add(a, b):\n    return a + b\n", "Weather in Paris"]):
            r = client.completions.create(model="tiny-v41", prompt=prompt, max_tokens=4 + i, temperature=0)
            routed += r.usage.prompt_tokens + r.usage.completion_tokens - 1  # the last token is never fed back
    finally:
        assert s.stop() == 0, "".join(s.log[-20:])
    log = "".join(s.log)
    assert f"routing statistics of {routed} tokens written to {stats_file}" in log, log[-2000:]
    doc = json.loads(stats_file.read_text())
    n_layers, n_experts, top_k = model_shape(model_dir)
    assert doc["n_tokens"] == routed
    assert len(doc["layers"]) == n_layers
    for layer, row in enumerate(doc["layers"]):
        assert len(row) == n_experts
        assert sum(row) == routed * top_k, f"layer {layer}: {row}"
        assert min(row) >= 0
    # The planner takes the file as it is.
    out = tmp_path / "placement.json"
    p = subprocess.run([spillway_bin, "plan", "--model", str(model_dir), "--gpu-memory", "10.01", "--routing-stats",
                        str(stats_file), "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "statistics from" in p.stdout and f"{routed} tokens recorded" in p.stdout, p.stdout


def test_nothing_routed_writes_nothing_and_a_bad_path_fails_at_start(spillway_bin, model_dir, tmp_path):
    stats_file = tmp_path / "never.json"
    s = serve(spillway_bin, model_dir, "--record-routing", str(stats_file))
    assert s.stop() == 0
    assert not stats_file.exists()
    assert "no token was routed while serving" in "".join(s.log)
    bad = tmp_path / "no" / "such" / "dir" / "routing.json"
    p = subprocess.run([spillway_bin, "serve", "--model", str(model_dir), "--port", "0", "--record-routing", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "--record-routing" in p.stderr + p.stdout and "cannot write the file" in p.stderr + p.stdout
