#!/usr/bin/env python3
"""Issue 6 quality bar on a wide sample: Spillway's quantizer vs exllamav3's `quantize_exl3` on the same W and H.

Input: one directory of `spillway quantize --dump-wh` files (W [k, n], H [k, k]; the W_spillway in them is ignored,
it is for one K only) and, per K, the proxy errors Spillway's default quantizer (candidate search) gets on those
files, as written by `quantize_candidates --json` (field "best"; the CPU quantizer, which the CUDA quantizer equals
bit for bit: tests/gpu/test_quantize_cuda.cpp). For every file and K this runs exllamav3's quantizer with its own
defaults (sigma_reg 0.025, seed 0) exactly as tools/quantize/compare_exllamav3.py does, decodes with LinearEXL3 and
computes proxy = tr(ΔWᵀ H ΔW) / tr(Wᵀ H W) in float64.
Prints a markdown table per tensor and a summary per K and over all K (bar: Spillway equal or lower on ≥ 90 % of
tensors, and lower in the mean at each K). Needs a CUDA GPU and the exllamav3 wheel (tools/quantize/compare_wide.sh).
Usage: compare_wide.py --wh DIR --spillway 2=K2.json 3=K3.json 4=K4.json [--codebook mul1] [--json OUT.json]
"""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_exllamav3 import exl3_quantize, proxy  # noqa: E402  (imports torch and exllamav3)

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wh", required=True)
    ap.add_argument("--spillway", nargs="+", required=True, help="K=JSON from quantize_candidates --json")
    ap.add_argument("--codebook", default="mul1")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    ours = {}
    for spec in args.spillway:
        K, path = spec.split("=", 1)
        with open(path) as f:
            d = json.load(f)
        if int(d["bits"]) != int(K):
            sys.exit(f"compare_wide: {path} holds K={d['bits']}, given as K={K}")
        ours[int(K)] = {stem: v["best"] for stem, v in d["tensors"].items()}
    files = sorted(glob.glob(os.path.join(args.wh, "*.safetensors")))
    if not files:
        sys.exit(f"compare_wide: no .safetensors in {args.wh}")
    rows = []
    print("| tensor | k×n | K | Spillway proxy | exllamav3 proxy | ratio S/E | exllamav3 s |")
    print("|---|---|---|---|---|---|---|")
    for path in files:
        t = load_file(path)
        W, H = t["W"].to(dev), t["H"].to(dev)
        name = os.path.basename(path)[: -len(".safetensors")]
        for K in sorted(ours):
            if name not in ours[K]:
                sys.exit(f"compare_wide: no Spillway result for {name} at K={K}")
            theirs_w, secs = exl3_quantize(W, H, K, args.codebook, 0, dev)
            theirs = proxy(W, theirs_w, H)
            s = ours[K][name]
            rows.append({"tensor": name, "K": K, "k": W.shape[0], "n": W.shape[1], "spillway": s, "exllamav3": theirs,
                         "exllamav3_s": secs})
            print(f"| {name} | {W.shape[0]}×{W.shape[1]} | {K} | {s:.6f} | {theirs:.6f} | {s / theirs:.4f} | {secs:.2f} |",
                  flush=True)
    print("\n| K | Spillway equal or lower | mean Spillway | mean exllamav3 | Δ mean | worst ratio S/E |")
    print("|---|---|---|---|---|---|")
    for K in sorted(ours) + ["all"]:
        rk = [r for r in rows if K == "all" or r["K"] == K]
        better = sum(r["spillway"] <= r["exllamav3"] for r in rk)
        ms = sum(r["spillway"] for r in rk) / len(rk)
        me = sum(r["exllamav3"] for r in rk) / len(rk)
        worst = max(r["spillway"] / r["exllamav3"] for r in rk)
        delta = f"{100 * (ms / me - 1):+.2f} %" if K != "all" else "—"
        print(f"| {K} | {better}/{len(rk)} ({100 * better / len(rk):.0f} %) | {ms:.6f} | {me:.6f} | {delta} | {worst:.4f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "device": torch.cuda.get_device_name(0)}, f, indent=1)


if __name__ == "__main__":
    main()
