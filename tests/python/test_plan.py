"""`spillway plan` on the header-only V4.1-Flash checkpoint (real shapes) and on the demo model.

The placement file must place every expert once, fill the GPU budget, put the hottest experts on the GPU
when routing statistics are given, and carry bytes per token and tokens/s consistent with its own
inputs. Bad inputs must fail with a message naming the flag or the file.
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
DEMO = ROOT / "models/demo"
GIB = 1 << 30
TIERS = ("gpu", "host_gpu", "host_cpu")


@pytest.fixture(scope="module")
def v41(tmp_path_factory):
    out = tmp_path_factory.mktemp("v41")
    subprocess.run([sys.executable, str(ROOT / "tools/make_header_only_checkpoint.py"), "--model", "v41", str(out)],
                   check=True, capture_output=True, timeout=300)
    return out


def plan(tmp_path, model, *args, expect_ok=True):
    out = tmp_path / "placement.json"
    r = subprocess.run([SPILLWAY, "plan", "--model", str(model), "--out", str(out), *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    if not expect_ok:
        assert r.returncode != 0, r.stdout
        assert not out.exists()
        return r
    assert r.returncode == 0, r.stderr
    return r.stdout, json.loads(out.read_text())


def tier_of(placement):
    """[layer][expert] -> tier name; asserts every expert is placed exactly once."""
    n_layers, n_experts = placement["n_layers"], placement["n_experts"]
    assert len(placement["layers"]) == n_layers
    tiers = []
    for layer in placement["layers"]:
        row = [None] * n_experts
        for tier in TIERS:
            for e in layer[tier]:
                assert row[e] is None, f"expert {e} placed twice"
                row[e] = tier
        assert None not in row, "an expert is not placed"
        tiers.append(row)
    return tiers


def check_arithmetic(placement):
    """tokens/s = 1 / sum(bytes per token / GB/s) over the tiers, from the file's own numbers."""
    bw = placement["bandwidths_gbs"]
    rates = {"gpu": bw["hbm"], "host_gpu": bw["pcie"], "host_cpu": bw["cpu"]}
    seconds = 0
    for tier in TIERS:
        t = placement["tiers"][tier]
        assert t["seconds_per_token"] == pytest.approx(t["nbytes_per_token"] / (rates[tier] * 1e9), rel=1e-9)
        seconds += t["seconds_per_token"]
    assert placement["predicted_tokens_per_s"] == pytest.approx(1 / seconds, rel=1e-9)
    counts = [sum(len(layer[tier]) for layer in placement["layers"]) for tier in TIERS]
    assert counts == [placement["tiers"][tier]["n_experts"] for tier in TIERS]


def test_v41_uniform_plan_fills_an_h200(v41, tmp_path):
    stdout, p = plan(tmp_path, v41, "--gpu-memory", 141)
    assert "uniform: no --routing-stats given" in stdout
    assert "a bandwidth bound" in stdout and "not a measurement" in stdout
    assert p["routing"] == {"source": "uniform"}
    assert (p["model_type"], p["n_layers"], p["n_experts"], p["top_k"]) == ("deepseek_v41", 40, 384, 6)
    tiers = tier_of(p)
    check_arithmetic(p)
    budget = p["budget"]
    assert budget["expert_budget_nbytes"] == int((141 - 8 - 2) * GIB - budget["dense_nbytes"])
    gpu = p["tiers"]["gpu"]
    n_gpu = gpu["n_experts"]
    expert_nbytes = (gpu["resident_nbytes"] - budget["dense_nbytes"]) // n_gpu  # every V4.1 expert has one size
    assert 0 < n_gpu < 40 * 384
    # Filled: the next expert would not fit.
    assert budget["expert_budget_nbytes"] - n_gpu * expert_nbytes < expert_nbytes
    # Uniform: spread evenly over the layers.
    per_layer = [row.count("gpu") for row in tiers]
    assert max(per_layer) - min(per_layer) <= 1
    # The default bandwidths (PCIe 50 < CPU 70 GB/s) send host experts to the CPU runtime.
    assert p["tiers"]["host_cpu"]["n_experts"] == 40 * 384 - n_gpu and p["host_tier_policy"] == "auto"
    # Uniform routing: each expert is used top_k / n_experts times per token, so the tiers together read what
    # `spillway inspect` reports a decoded token reads.
    assert p["tiers"]["host_cpu"]["nbytes_per_token"] == pytest.approx((40 * 384 - n_gpu) * 6 / 384 * expert_nbytes)
    total = sum(p["tiers"][tier]["nbytes_per_token"] for tier in TIERS)
    inspect = subprocess.run([SPILLWAY, "inspect", str(v41)], capture_output=True, text=True, timeout=300).stdout
    decode_gib = float(re.search(r"decode weight bytes/token\s+([\d.]+) GiB", inspect).group(1))
    assert total / GIB == pytest.approx(decode_gib, abs=0.006)


def test_v41_everything_fits_a_large_budget(v41, tmp_path):
    stdout, p = plan(tmp_path, v41, "--gpu-memory", 1000, "--host-tier", "gpu")
    assert p["tiers"]["gpu"]["n_experts"] == 40 * 384
    assert p["tiers"]["host_cpu"]["n_experts"] == 0
    check_arithmetic(p)


def test_v41_dense_weights_that_do_not_fit_name_the_flags(v41, tmp_path):
    r = plan(tmp_path, v41, "--gpu-memory", 10, expect_ok=False)
    assert "do not fit --gpu-memory 10" in r.stderr and "--kv-gib" in r.stderr, r.stderr


def demo_stats(tmp_path, layers=None):
    """The demo model's recorded routing loads, in the plan's statistics format."""
    recorded = json.loads((DEMO / "routing_stats.json").read_text())
    counts = layers or [layer["load"] for layer in recorded["layers"]]
    n_tokens = max(sum(row) for row in counts) // recorded["experts_per_token"]
    path = tmp_path / "stats.json"
    path.write_text(json.dumps({"model": "demo", "n_tokens": n_tokens, "layers": counts}))
    return path, counts


def test_demo_statistics_put_the_hottest_experts_on_the_gpu(tmp_path):
    _, everything = plan(tmp_path, DEMO, "--gpu-memory", 100, "--kv-gib", 0, "--workspace-gib", 0)
    dense = everything["budget"]["dense_nbytes"]
    experts = everything["tiers"]["gpu"]["resident_nbytes"] - dense
    gib = (dense + experts / 3) / GIB  # room for a third of the experts
    stats, counts = demo_stats(tmp_path)
    stdout, p = plan(tmp_path, DEMO, "--gpu-memory", gib, "--kv-gib", 0, "--workspace-gib", 0,
                     "--routing-stats", stats, "--host-tier", "gpu")
    assert f"statistics from {stats}" in stdout and "uniform" not in stdout
    assert p["routing"]["source"] == "statistics" and p["routing"]["model"] == "demo"
    tiers = tier_of(p)
    check_arithmetic(p)
    n_experts = p["n_experts"]
    assert 0 < p["tiers"]["gpu"]["n_experts"] < p["n_layers"] * n_experts
    assert p["tiers"]["host_gpu"]["n_experts"] == p["n_layers"] * n_experts - p["tiers"]["gpu"]["n_experts"]
    share = [[c / sum(row) for c in row] for row in counts]
    on_gpu = [share[l][e] for l, row in enumerate(tiers) for e, t in enumerate(row) if t == "gpu"]
    on_host = [share[l][e] for l, row in enumerate(tiers) for e, t in enumerate(row) if t != "gpu"]
    assert min(on_gpu) >= max(on_host), "a host expert is used more often than a GPU expert"
    # Skewed statistics move more traffic onto the GPU than a uniform plan of the same budget.
    _, uniform = plan(tmp_path, DEMO, "--gpu-memory", gib, "--kv-gib", 0, "--workspace-gib", 0, "--host-tier", "gpu")
    assert p["tiers"]["gpu"]["n_experts"] == uniform["tiers"]["gpu"]["n_experts"]
    assert p["tiers"]["host_gpu"]["nbytes_per_token"] < uniform["tiers"]["host_gpu"]["nbytes_per_token"]
    assert p["predicted_tokens_per_s"] > uniform["predicted_tokens_per_s"]


def test_bad_statistics_files_are_rejected_with_the_reason(tmp_path):
    short, counts = demo_stats(tmp_path)
    short.write_text(json.dumps({"model": "demo", "n_tokens": 10 ** 6, "layers": counts[:-1]}))
    r = plan(tmp_path, DEMO, "--gpu-memory", 1, "--routing-stats", short, expect_ok=False)
    assert f"has {len(counts) - 1} layers of counts, the model has {len(counts)}" in r.stderr, r.stderr
    short.write_text('{"model": "demo", "n_tokens": ')
    r = plan(tmp_path, DEMO, "--gpu-memory", 1, "--routing-stats", short, expect_ok=False)
    assert "--routing-stats" in r.stderr and "not valid JSON" in r.stderr, r.stderr
    r = plan(tmp_path, DEMO, "--gpu-memory", 1, "--host-tier", "disk", expect_ok=False)
    assert "--host-tier" in r.stderr, r.stderr


def test_every_plan_flag_is_documented():
    r = subprocess.run([SPILLWAY, "plan", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    flags = set(re.findall(r"(--[a-z][a-z-]+)", r.stdout)) - {"--help"}
    assert {"--model", "--gpu-memory", "--routing-stats", "--host-tier", "--out"} <= flags
    documented = (ROOT / "docs/settings.md").read_text(encoding="utf-8")
    missing = sorted(f for f in flags if f"`plan {f}" not in documented)
    assert not missing, "not in docs/settings.md: " + ", ".join(missing)


def run_cli(*args, timeout=120):
    return subprocess.run([SPILLWAY, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_bench_and_serve_take_a_placement_file_or_a_budget(tmp_path):
    fixed = tmp_path / "fixed.json"
    subprocess.run([sys.executable, str(ROOT / "tools/placement/fixed_share.py"), str(DEMO), "--host-gpu", "0.25",
                    "--host-cpu", "0.5", "-o", str(fixed)], check=True, capture_output=True, timeout=60)
    doc = json.loads(fixed.read_text())
    rows = tier_of(doc)
    n_experts = doc["n_experts"]
    for row in rows:  # the shares hold in every layer
        assert row.count("host_gpu") == round(0.25 * n_experts) and row.count("host_cpu") == round(0.5 * n_experts)
    n_all = doc["n_layers"] * n_experts
    # bench resolves the placement before it needs a GPU: --plan-only shows what it read.
    r = run_cli("bench", "--plan-only", "--model", DEMO, "--placement", fixed)
    assert r.returncode == 0, r.stderr
    n_gpu = n_all - len(rows) * (round(0.25 * n_experts) + round(0.5 * n_experts))
    assert (f"{n_gpu} on the GPU, {len(rows) * round(0.25 * n_experts)} in pinned host memory read by the GPU, "
            f"{len(rows) * round(0.5 * n_experts)} on the CPU, of {n_all}") in r.stderr, r.stderr
    # A budget plans at start-up with the planner `spillway plan` uses.
    _, planned = plan(tmp_path, DEMO, "--gpu-memory", 10.03)  # past the 8 + 2 GiB reservations: part of the experts
    r = run_cli("bench", "--plan-only", "--model", DEMO, "--gpu-memory", 10.03)
    assert r.returncode == 0, r.stderr
    counts = [sum(t == tier for row in tier_of(planned) for t in row) for tier in TIERS]
    assert counts[0] > 0 and counts[1] + counts[2] > 0, counts  # the budget splits the experts
    assert (f"{counts[0]} on the GPU, {counts[1]} in pinned host memory read by the GPU, {counts[2]} on the CPU"
            in r.stderr), r.stderr
    assert "routing assumed uniform" in r.stderr
    # Smaller reservations leave more of the same budget to experts (and the error's advice works in bench too).
    r = run_cli("bench", "--plan-only", "--model", DEMO, "--gpu-memory", 10.03, "--kv-gib", 7)
    assert r.returncode == 0, r.stderr
    more = int(re.search(r"(\d+) on the GPU", r.stderr).group(1))
    assert more > counts[0], (more, counts)
    r = run_cli("bench", "--plan-only", "--model", DEMO, "--gpu-memory", 5)
    assert r.returncode != 0 and "lower the reservations" in r.stderr, r.stderr


def test_fixed_shares_for_the_synthetic_model_and_by_popularity(tmp_path):
    """fixed_share.py --v41-flash-layers N makes placements for `bench --synthetic v41-flash --layers N` (no model
    directory), and --routing-stats puts each layer's least routed experts on the host, the CPU taking the coldest."""
    stats = tmp_path / "stats.json"
    counts = [[(e * 37 + layer * 11) % 384 for e in range(384)] for layer in range(2)]  # each layer's own ranking
    stats.write_text(json.dumps({"model": "deepseek_v41", "n_tokens": 1000, "layers": counts}))
    out = tmp_path / "p.json"
    subprocess.run([sys.executable, str(ROOT / "tools/placement/fixed_share.py"), "--v41-flash-layers", "2",
                    "--host-gpu", "0.25", "--host-cpu", "0.25", "--routing-stats", str(stats), "-o", str(out)],
                   check=True, capture_output=True, timeout=60)
    doc = json.loads(out.read_text())
    assert (doc["model_type"], doc["n_layers"], doc["n_experts"]) == ("deepseek_v41", 2, 384)
    for layer, row in enumerate(doc["layers"]):
        c = counts[layer]
        cpu, host, gpu = ([c[e] for e in row[t]] for t in ("host_cpu", "host_gpu", "gpu"))
        assert len(cpu) == len(host) == 96 and len(gpu) == 192
        assert max(cpu) < min(host) and max(host) < min(gpu)  # coldest on the CPU, then pinned memory, hot on the GPU
    r = run_cli("bench", "--plan-only", "--synthetic", "v41-flash", "--layers", "2", "--expert-bits", "2",
                "--placement", out)
    if r.returncode == 2 and "no GPU engine" in r.stderr:
        return
    assert r.returncode == 0, r.stderr
    assert "384 on the GPU, 192 in pinned host memory read by the GPU, 192 on the CPU, of 768" in r.stderr, r.stderr


def test_placement_flags_that_cannot_work_say_why(v41, tmp_path):
    _, other = plan(tmp_path, v41, "--gpu-memory", 141)  # 40 layers of 384 experts: not the demo model
    wrong = tmp_path / "v41_placement.json"
    wrong.write_text(json.dumps(other))
    r = run_cli("bench", "--plan-only", "--model", DEMO, "--placement", wrong)
    assert r.returncode != 0
    assert "was planned for" in r.stderr and "run `spillway plan --model" in r.stderr, r.stderr
    r = run_cli("bench", "--plan-only", "--model", DEMO, "--placement", wrong, "--gpu-memory", 2)
    assert r.returncode != 0 and "--placement and --gpu-memory both given" in r.stderr, r.stderr
    r = run_cli("bench", "--plan-only", "--model", DEMO, "--placement", tmp_path / "missing.json")
    assert r.returncode != 0 and "cannot read the file" in r.stderr, r.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "spillway-placement", "version": 1, "model_type": "x"')
    r = run_cli("bench", "--plan-only", "--model", DEMO, "--placement", broken)
    assert r.returncode != 0 and "--placement" in r.stderr, r.stderr
    # The CPU runner holds every expert in host memory: the flags are refused, not ignored.
    r = run_cli("serve", "--model", DEMO, "--device", "cpu", "--port", 0, "--placement", wrong, timeout=60)
    assert r.returncode != 0 and "for the GPU runner" in r.stderr, r.stderr


def test_every_placement_flag_is_documented():
    documented = (ROOT / "docs/settings.md").read_text(encoding="utf-8")
    r = run_cli("serve", "--help", timeout=60)
    for flag in ("--record-routing", "--engram-tables"):  # serve only
        assert flag in r.stdout and f"`{flag}`" in documented, flag
    for command in ("serve", "bench"):
        r = run_cli(command, "--help", timeout=60)
        assert r.returncode == 0, r.stderr
        for flag in ("--placement", "--gpu-memory", "--routing-stats", "--host-tier", "--kv-gib", "--workspace-gib",
                     "--cpu-expert-threads", "--cpu-expert-activations"):
            assert flag in r.stdout, f"{command} --help lacks {flag}"
            assert f"`{flag}`" in documented, f"{flag} not in docs/settings.md"


def test_plan_from_a_calibration_text(tmp_path):
    """`plan --calibration TEXT` runs the model on the text (here the demo model on the CPU), records every layer's
    picks, writes them and plans with them: the same placement as `plan --routing-stats` of the written file, hot
    experts kept on the GPU."""
    text = tmp_path / "calibration.txt"
    text.write_text((ROOT / "docs/placement.md").read_text(encoding="utf-8"), encoding="utf-8")
    stats_path = tmp_path / "stats.json"
    out, calibrated = plan(tmp_path, DEMO, "--gpu-memory", 10.03, "--calibration", text, "--calibration-tokens", 600,
                           "--calibration-seq-len", 256, "--device", "cpu", "--record-routing", stats_path)
    assert f"by calibration on {text}" in out, out
    stats = json.loads(stats_path.read_text())
    assert stats["n_tokens"] == 600 + 3  # three sequences, each with its BOS
    for row in stats["layers"]:  # every routed row picked top_k experts
        assert sum(row) == stats["n_tokens"] * calibrated["top_k"]
    again = tmp_path / "again"
    again.mkdir()
    _, replanned = plan(again, DEMO, "--gpu-memory", 10.03, "--routing-stats", stats_path)
    assert tier_of(replanned) == tier_of(calibrated)
    rows = tier_of(calibrated)
    for layer, row in enumerate(rows):  # within a layer, no host expert is hotter than a GPU expert
        counts = stats["layers"][layer]
        on_gpu = [counts[e] for e, t in enumerate(row) if t == "gpu"]
        off = [counts[e] for e, t in enumerate(row) if t != "gpu"]
        if on_gpu and off:
            assert min(on_gpu) >= max(off), (layer, on_gpu, off)
    errors = tmp_path / "errors"
    errors.mkdir()
    r = plan(errors, DEMO, "--gpu-memory", 10.03, "--calibration", text, "--routing-stats", stats_path,
             expect_ok=False)
    assert "--calibration and --routing-stats both given" in r.stderr, r.stderr
    r = plan(errors, DEMO, "--gpu-memory", 10.03, "--calibration", tmp_path / "missing.txt", expect_ok=False)
    assert "cannot read the file" in r.stderr, r.stderr
