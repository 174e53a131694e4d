#!/usr/bin/env python3
"""Spillway's EXL3 quantizer vs exllamav3's `quantize_exl3` on the very same W and H (issue 6 acceptance).

Input: directories written by `spillway quantize --dump-wh DIR` (docs/quantize.md), one per bitrate, given as
K=DIR (e.g. 2=/tmp/wh2 3=/tmp/wh3 4=/tmp/wh4). Each file holds W [k, n] (EXL3 orientation), H [k, k] (normalized,
undamped), W_spillway (our quantized weight, decoded) and proxy_err_spillway.

For every file and K this runs exllamav3's quantizer (its own regularisation sigma_reg = 0.025, random signs,
Hadamard, LDLQ, Viterbi and — in versions that have it — scale refit) with H as the captured Hessian, decodes the
result with exllamav3's own LinearEXL3.get_weight_tensor, and computes for both quantizers the same ratio
    proxy = tr(ΔWᵀ H ΔW) / tr(Wᵀ H W)        (float64, on the GPU)
It also times exllamav3's quantizer on one V4.1-shaped expert tensor (2304 × 5120, K=3, random H from random
activations) for the speed comparison. Prints a markdown table; --json writes the raw numbers.

Needs a CUDA GPU and the exllamav3 wheel (see scripts/gpu_test.sh). Codebook: --codebook mul1|mcg|3inst (the
one the dumps were made with).
Usage: compare_exllamav3.py [--codebook mul1] [--json OUT.json] K=DIR [K=DIR ...]
"""
import argparse
import glob
import json
import os
import sys
import time
import types

try:
    import pydantic  # noqa: F401
except ImportError:  # exllamav3.util.memory imports pydantic only for an exception type
    stub = types.ModuleType("pydantic")
    stub.PydanticUserError = type("PydanticUserError", (Exception,), {})
    sys.modules["pydantic"] = stub

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from exllamav3.modules.quant.exl3 import LinearEXL3  # noqa: E402
from exllamav3.modules.quant.exl3_lib.quantize import quantize_exl3  # noqa: E402


def h_data(H, dev):
    k = H.shape[0]
    return {"H": H.clone(), "packed": False, "n": k, "first_key": "compare", "count": 1, "finalized": False,
            "num_total": 1, "inf_nan": torch.zeros(2, dtype=torch.long, device=dev), "device": dev, "L": None}


def proxy(W, Wq, H):
    d = (Wq.double() - W.double())
    num = torch.einsum("in,ij,jn->", d, H.double(), d)
    den = torch.einsum("in,ij,jn->", W.double(), H.double(), W.double())
    return float(num / den)


def exl3_quantize(W, H, K, cb, seed, dev):
    qa = {"K": K, "seed": seed, "devices": [dev], "apply_out_scales": None, "sigma_reg": 0.025}
    if cb in ("mcg", "mul1"):
        qa[cb] = True
    torch.cuda.synchronize()
    t0 = time.time()
    _, _, tensors = quantize_exl3(W.float().clone(), h_data(H, dev), qa, False)
    torch.cuda.synchronize()
    secs = time.time() - t0
    k, n = W.shape
    lin = LinearEXL3(None, k, n, None, None, None, tensors["suh"], tensors["svh"], tensors["trellis"],
                     tensors.get("mcg"), tensors.get("mul1"), None, key="compare")
    return lin.get_weight_tensor().float(), secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+", help="K=DIR")
    ap.add_argument("--codebook", default="mul1")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    rows = []
    print("| tensor | k×n | K | Spillway proxy | exllamav3 proxy | ratio S/E | exllamav3 s |")
    print("|---|---|---|---|---|---|---|")
    for spec in args.dirs:
        K, d = spec.split("=", 1)
        K = int(K)
        for path in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
            t = load_file(path)
            W, H, Ws = t["W"].to(dev), t["H"].to(dev), t["W_spillway"].to(dev)
            ours = proxy(W, Ws, H)
            theirs_w, secs = exl3_quantize(W, H, K, args.codebook, 0, dev)
            theirs = proxy(W, theirs_w, H)
            name = os.path.basename(path)[: -len(".safetensors")]
            rows.append({"tensor": name, "K": K, "k": W.shape[0], "n": W.shape[1], "spillway": ours,
                         "spillway_reported": float(t["proxy_err_spillway"][0]), "exllamav3": theirs,
                         "exllamav3_s": secs})
            print(f"| {name} | {W.shape[0]}×{W.shape[1]} | {K} | {ours:.6f} | {theirs:.6f} | {ours / theirs:.3f} | {secs:.2f} |",
                  flush=True)
    for K in sorted({r["K"] for r in rows}):
        rk = [r for r in rows if r["K"] == K]
        better = sum(r["spillway"] <= r["exllamav3"] for r in rk)
        ms = sum(r["spillway"] for r in rk) / len(rk)
        me = sum(r["exllamav3"] for r in rk) / len(rk)
        print(f"\nK={K}: Spillway equal or lower on {better}/{len(rk)} tensors; mean proxy Spillway {ms:.6f}, exllamav3 {me:.6f}")
    # Speed on a V4.1 expert shape (w2: 2304 in × 5120 out), H from 4096 random correlated activations.
    g = torch.Generator(device="cpu").manual_seed(5)
    k, n = 2304, 5120
    W = (torch.randn(k, n, generator=g) * 0.02).to(dev)
    X = (torch.randn(4096, k, generator=g) * (0.2 + torch.rand(1, k, generator=g) * 2)).to(dev)
    H = X.T @ X / X.shape[0]
    _, secs = exl3_quantize(W, H, 3, args.codebook, 0, dev)
    print(f"\nexllamav3 quantize_exl3, one V4.1 expert tensor 2304×5120, K=3 {args.codebook}: {secs:.2f} s "
          f"(× 46,080 routed-expert tensors = {secs * 46080 / 3600:.1f} h on this GPU)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "v41_tensor_s": secs, "device": torch.cuda.get_device_name(0)}, f, indent=1)


if __name__ == "__main__":
    main()
