#!/usr/bin/env python3
"""Write a placement file (docs/placement.md "Placement file") that puts fixed shares of every layer's routed
experts on each tier, for benchmarks and tests that want "a third on the host" rather than what a memory budget
gives (`spillway plan --gpu-memory` makes budget-driven ones).

Experts are dealt in a repeating pattern over the expert index, so each tier gets an even spread of indices (the
synthetic models route uniformly, so which indices does not matter there). With --routing-stats FILE (from `serve
--record-routing` or `bench --record-routing`) each layer's coldest experts go to the host instead, the CPU taking the
coldest: the same shares, placed by measured popularity (a budget-driven plan is `spillway plan --routing-stats`).

Usage: fixed_share.py MODEL_DIR --host-gpu 0.33 --host-cpu 0 -o placement.json
       fixed_share.py --v41-flash-layers 40 --host-gpu 0.33 -o placement.json   (for `spillway bench --synthetic
       v41-flash --layers 40`: the released config, models/configs/deepseek-v4.1-flash.json, cut to 40 layers)
Needs the standard library only.
"""

import argparse
import json
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", nargs="?", help="a checkpoint directory (its config.json)")
    ap.add_argument("--v41-flash-layers", type=int, default=0,
                    help="instead of MODEL_DIR: V4.1-Flash's released config with this many layers")
    ap.add_argument("--host-gpu", type=float, default=0.0, help="share of each layer's experts in pinned host memory")
    ap.add_argument("--host-cpu", type=float, default=0.0, help="share of each layer's experts on the CPU")
    ap.add_argument("--routing-stats", help="put each layer's coldest experts on the host (routing statistics file)")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    if a.host_gpu < 0 or a.host_cpu < 0 or a.host_gpu + a.host_cpu > 1:
        print("fixed_share.py: --host-gpu and --host-cpu must be shares in [0, 1] that sum to at most 1", file=sys.stderr)
        return 2
    if bool(a.model_dir) == bool(a.v41_flash_layers):
        print("fixed_share.py: give MODEL_DIR or --v41-flash-layers N (one of them)", file=sys.stderr)
        return 2
    config_path = (os.path.join(a.model_dir, "config.json") if a.model_dir else
                   os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "configs",
                                "deepseek-v4.1-flash.json"))
    with open(config_path) as f:
        cfg = json.load(f)
    text = cfg.get("text_config", cfg)  # V4.1 nests the language model's settings
    n_layers = a.v41_flash_layers or text["num_hidden_layers"]
    n_experts = text["n_routed_experts"]
    n_host_gpu = round(a.host_gpu * n_experts)
    n_host_cpu = round(a.host_cpu * n_experts)
    counts = None
    if a.routing_stats:
        with open(a.routing_stats) as f:
            counts = json.load(f)["layers"]
        if len(counts) != n_layers or any(len(row) != n_experts for row in counts):
            print(f"fixed_share.py: {a.routing_stats} has {len(counts)} layers of {len(counts[0]) if counts else 0} "
                  f"experts; the model has {n_layers} of {n_experts}", file=sys.stderr)
            return 2
    layers = []
    for layer in range(n_layers):
        if counts:  # coldest first
            order = sorted(range(n_experts), key=lambda e: (counts[layer][e], e))
        else:  # expert e's rank in a stride that spreads each tier over the index range
            order = sorted(range(n_experts), key=lambda e: ((e * 7919 + layer * 104729) % n_experts, e))
        tiers = {"gpu": [], "host_gpu": [], "host_cpu": []}
        for rank, e in enumerate(order):
            tier = "host_cpu" if rank < n_host_cpu else "host_gpu" if rank < n_host_cpu + n_host_gpu else "gpu"
            tiers[tier].append(e)
        layers.append({k: sorted(v) for k, v in tiers.items()})
    doc = {"format": "spillway-placement", "version": 1, "model_type": cfg.get("model_type", ""),
           "n_layers": n_layers, "n_experts": n_experts,
           "note": f"fixed shares: host_gpu {a.host_gpu}, host_cpu {a.host_cpu}"
                   f"{', coldest on the host by ' + a.routing_stats if counts else ''} (tools/placement/fixed_share.py)",
           "layers": layers}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{a.out}: {n_layers} layers x {n_experts} experts: {n_experts - n_host_gpu - n_host_cpu} gpu, "
          f"{n_host_gpu} host_gpu, {n_host_cpu} host_cpu per layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
