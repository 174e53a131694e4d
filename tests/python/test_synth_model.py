"""tools/synth/make_synthetic_model.py: reduced-width synthetic checkpoints of each architecture and
expert format load in the CPU reference (`spillway inspect`, `spillway run`) and decode finitely.

The widths are divided by 16 (d_model 384 for V4.1, 256 for V4) so the CPU loads them in seconds; the
vocabulary, head width, layer kinds and formats are the real ones. `spillway run --token-ids` greedy
decodes: a NaN/inf logit would make the argmax 0 every step or fail, so finite logits are checked by
the ids being in range and the run succeeding; the layer table and formats by `inspect`.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPILLWAY = os.environ.get("SPILLWAY_BIN", str(ROOT / "build/bin/spillway"))
VOCAB = 129280

CASES = {
    # name: (generator args, expected inspect lines, expected layer kinds, expert dtypes)
    "v41_mxfp4": (["--arch", "v41", "--layers", "3", "--experts", "mxfp4"],
                  ["deepseek_v41, 3 layers, d_model 384, 8 heads x 512, vocab 129280",
                   "24 routed (top 6, width 256)"],
                  ["window", "window", "source"], {"I8", "F8_E8M0"}),
    "v41_exl3": (["--arch", "v41", "--real-layers", "1,2,3", "--experts", "exl3", "--bits", "3"],
                 ["deepseek_v41, 3 layers, d_model 384, 8 heads x 512, vocab 129280",
                  "24 routed (top 6, width 256)"],
                 ["window", "source", "reuse"], {"I16", "F16", "I32"}),
    "v4_mxfp4": (["--arch", "v4", "--layers", "4", "--experts", "mxfp4"],
                 ["deepseek_v4, 4 layers, d_model 256, 8 heads x 512, vocab 129280",
                  "16 routed (top 6, width 128)"],
                 ["window", "window", "csa", "hca"], {"I8", "F8_E8M0"}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def model(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    args, *_ = CASES[request.param]
    r = subprocess.run([sys.executable, str(ROOT / "tools/synth/make_synthetic_model.py"), str(out), *args,
                        "--width-divisor", "16", "--engram-vocab", "1000", "--tokenizer", "none"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return request.param, out


def test_inspect_reports_the_structure(model):
    name, path = model
    _, lines, kinds, expert_dtypes = CASES[name]
    r = subprocess.run([SPILLWAY, "inspect", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for line in lines:
        assert line in r.stdout, f"{name}: '{line}' not in:\n{r.stdout}"
    rows = [l.split() for l in r.stdout.splitlines()
            if re.match(r"^\s+\d+\s+(window|csa|hca|source|reindex|reuse)\s", l)]
    assert [row[1] for row in rows] == kinds, r.stdout
    n_experts = int(re.search(r"(\d+) routed", lines[1]).group(1))
    assert all(row[-1] == str(n_experts) for row in rows), "every layer has all its experts"
    experts = next(l for l in r.stdout.splitlines() if l.startswith("routed experts"))
    assert set(experts.split()[6:]) == expert_dtypes, experts
    if name.startswith("v4_"):
        hash_layers = [row for row in rows if row[3] == "hash"]
        assert len(hash_layers) == 3, "V4's layers 0..2 are hash-routed"
    if name == "v41_exl3":
        assert "engram" in rows[0], "real layer 1 carries Engram"


def test_run_decodes_finite_logits(model):
    name, path = model
    r = subprocess.run([SPILLWAY, "run", "-m", str(path), "--token-ids", "-p", "0 17 4242 99999 129279",
                        "-n", "4", "--threads", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ids = [int(x) for x in r.stdout.split()]
    assert len(ids) == 4 and all(0 <= i < VOCAB for i in ids), r.stdout
    # All-NaN logits make the greedy argmax 0 at every step.
    assert ids != [0, 0, 0, 0], f"{name}: greedy ids {ids} look like NaN logits"


def expert_tensor_bytes(path):
    """Bytes of the routed-expert tensors in a checkpoint's safetensors shards, from their headers."""
    total = 0
    for shard in sorted(Path(path).glob("*.safetensors")):
        with open(shard, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        for tensor, meta in header.items():
            if ".ffn.experts." in tensor:
                begin, end = meta["data_offsets"]
                total += end - begin
    return total


def test_bench_plan_only(model, tmp_path):
    """`spillway bench --plan-only` needs no GPU: the plan and per-token costs of the synthetic model. A build
    without CUDA must refuse clearly instead. The plan's routed-expert bytes are the checkpoint's own, in its
    expert format (MXFP4, or EXL3 at the pack's bits: the planner reads quantization_config.bits)."""
    name, path = model
    out_json = tmp_path / "plan.json"
    r = subprocess.run([SPILLWAY, "bench", "--model", str(path), "--plan-only", "--json", str(out_json)],
                       capture_output=True, text=True, timeout=60)
    if r.returncode == 2 and "no GPU engine" in r.stderr:
        return  # a CPU-only build: the message says why
    assert r.returncode == 0, r.stderr
    plan = json.loads(out_json.read_text())["plan"]
    experts = [k for k in plan if k.startswith("weights: routed experts")]
    assert experts == ["weights: routed experts (EXL3, 3 bits)" if name.endswith("exl3")
                       else "weights: routed experts (MXFP4)"], plan.keys()
    stored = expert_tensor_bytes(path)
    # EXL3 tensors carry a 4-byte codebook marker each, which the plan leaves out (< 0.1 %).
    assert abs(plan[experts[0]] - stored) <= 0.001 * stored, (plan[experts[0]], stored)
    for section in ("## Memory plan", "## Bytes one batch-1 decode token reads", "## FLOPs per prefill token"):
        assert section in r.stdout, r.stdout
    n_layers = len(CASES[name][2])
    layer_rows = [l for l in r.stdout.splitlines() if re.match(r"^\| \d+ \|", l) and l.count("|") == 8]
    assert len(layer_rows) == n_layers, r.stdout
    total = re.search(r"total HBM bytes per token: weights ([\d.]+) MiB", r.stdout)
    # The head alone is 129280 x d_model bf16.
    assert total and float(total.group(1)) > 129280 * int(CASES[name][1][0].split("d_model ")[1].split(",")[0]) * 2 / 2**20


def top_quarter_shares(model_dir, stats_file):
    """Serve the model on the CPU with --record-routing, send six 64-token random-id prompts, and return per layer
    the share of all routes that went to its most used quarter of experts."""
    import random
    import signal

    import httpx

    p = subprocess.Popen([SPILLWAY, "serve", "--model", str(model_dir), "--device", "cpu", "--port", "0", "--threads",
                          "2", "--prefix-cache-mb", "0", "--record-routing", str(stats_file)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = None
        for line in p.stdout:
            m = re.search(r"on http://[^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        assert port, "the server did not start"
        rng = random.Random(1)
        for _ in range(6):
            r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=300,
                           json={"prompt": [rng.randrange(3, VOCAB) for _ in range(64)], "max_tokens": 8,
                                 "temperature": 0})
            r.raise_for_status()
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    shares = []
    for row in json.loads(Path(stats_file).read_text())["layers"]:
        ranked = sorted(row, reverse=True)
        shares.append(sum(ranked[:max(1, len(ranked) // 4)]) / sum(ranked))
    return shares


def test_routing_skew_makes_a_few_experts_hot(tmp_path):
    # Measured on the dev box: top quarter 0.29-0.30 of the routes without skew (24 experts, top 6, 432 tokens:
    # sampling noise above the uniform 0.25), 0.45 with --routing-skew 0.15.
    shares = {}
    for skew in ("0", "0.15"):
        out = tmp_path / f"skew{skew}"
        r = subprocess.run([sys.executable, str(ROOT / "tools/synth/make_synthetic_model.py"), str(out), "--arch", "v41",
                            "--layers", "2", "--experts", "mxfp4", "--width-divisor", "16", "--engram-vocab", "1000",
                            "--tokenizer", "none", "--routing-skew", skew], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        shares[skew] = top_quarter_shares(out, tmp_path / f"stats{skew}.json")
    for uniform, skewed in zip(shares["0"], shares["0.15"]):
        assert uniform < 0.35, shares
        assert skewed > uniform + 0.1, shares


@pytest.mark.parametrize("experts", [["--experts", "exl3", "--bits", "2"], ["--experts", "mxfp4"]],
                         ids=["exl3", "mxfp4"])
def test_bench_synthetic_in_memory_matches_the_generator(experts, tmp_path):
    """`spillway bench --synthetic v41-flash` builds the model in memory (model/synthetic_model.h) instead of reading
    one that this generator wrote: the same layers, tensors, formats and sizes, so the memory plan, the bytes a token
    reads, the prefill FLOPs and a --gpu-memory placement all print the same for both."""
    out = tmp_path / "model"
    r = subprocess.run([sys.executable, str(ROOT / "tools/synth/make_synthetic_model.py"), str(out), "--arch", "v41",
                        "--layers", "3", *experts, "--width-divisor", "8", "--engram-vocab", "2000",
                        "--tokenizer", "none"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    bits = experts[3] if len(experts) > 2 else "0"
    # Dense weights 0.34 GiB + the default KV (8) and workspace (2) reservations leave a few MiB for experts.
    common = ["--plan-only", "--gpu-memory", "10.355", "--host-tier", "cpu", "--prefill", "4096"]
    disk = subprocess.run([SPILLWAY, "bench", "--model", str(out), *common], capture_output=True, text=True,
                          timeout=60)
    if disk.returncode == 2 and "no GPU engine" in disk.stderr:
        return  # a CPU-only build: the message says why
    assert disk.returncode == 0, disk.stderr
    mem = subprocess.run([SPILLWAY, "bench", "--synthetic", "v41-flash", "--layers", "3", "--width-divisor", "8",
                          "--expert-bits", bits, "--engram-vocab", "2000", *common],
                         capture_output=True, text=True, timeout=60)
    assert mem.returncode == 0, mem.stderr

    def body(text):  # all but the title line, which names the model's source
        return [l for l in text.splitlines() if not l.startswith("# spillway bench:")]

    assert body(mem.stdout) == body(disk.stdout)
    assert "## Memory plan" in mem.stdout and "## FLOPs per prefill token" in mem.stdout
    placed = [re.sub(r"^\[[^\]]*\] ", "", l) for l in (disk.stderr, mem.stderr)
              for l in l.splitlines() if "expert placement" in l]
    assert len(placed) == 2 and placed[0] == placed[1], placed
    assert "on the CPU" in placed[0] and " 0 on the CPU" not in placed[0], placed  # the budget spilled some


def test_bench_synthetic_refuses_bad_specs(tmp_path):
    for args, needle in ((["--synthetic", "v4-flash"], "make_synthetic_model.py --arch v4"),
                         (["--synthetic", "v41-flash", "--layers", "41"], "--layers"),
                         (["--model", "/nonexistent", "--synthetic", "v41-flash"], "excludes"),
                         (["--layers", "3"], "--synthetic"),
                         # an Engram vocabulary of 10^9: petabytes of tables, refused before anything is allocated
                         (["--synthetic", "v41-flash", "--layers", "2", "--engram-vocab", "1000000000"],
                          "MiB of host memory")):
        r = subprocess.run([SPILLWAY, "bench", *args, "--plan-only"], capture_output=True, text=True, timeout=60)
        if r.returncode == 2 and "no GPU engine" in r.stderr:
            return
        assert r.returncode != 0 and needle in r.stderr + r.stdout, (args, r.stdout, r.stderr)
    # A placement for another layer count: the remedy for a model built in memory is fixed_share.py, not `plan`.
    wrong = tmp_path / "p40.json"
    subprocess.run([sys.executable, str(ROOT / "tools/placement/fixed_share.py"), "--v41-flash-layers", "40",
                    "--host-gpu", "0.3", "-o", str(wrong)], check=True, capture_output=True, timeout=60)
    r = subprocess.run([SPILLWAY, "bench", "--synthetic", "v41-flash", "--layers", "3", "--placement", str(wrong),
                        "--plan-only"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "fixed_share.py --v41-flash-layers 3" in r.stderr, r.stderr
