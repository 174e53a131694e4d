#!/usr/bin/env python3
"""exllamav3 reads the expert tensors Spillway's quantizer wrote (issue 6: "exllamav3's loader accepts the expert
tensors and reconstructs them").

For every `--dump-wh` file (W, H, W_spillway = Spillway's own decode of the packed tensor), the pack's tensors
of the same name (from tools/exl3/extract_pack_tensors.py) go into exllamav3's LinearEXL3 exactly as its model
loader builds one (trellis, suh, svh, mcg/mul1 marker), and LinearEXL3.get_weight_tensor() must equal
W_spillway up to fp16 rounding of the reconstruction: max |Δ| ≤ 2e-3·max|W_spillway| (exllamav3 reconstructs in
fp16, Spillway's reference decoder in fp64), and its proxy error tr(ΔWᵀHΔW)/tr(WᵀHW) against W must equal the one
Spillway reported within 1 %. Needs a CUDA GPU and the exllamav3 wheel (scripts/gpu_test.sh). Exit status 1 on any
mismatch.
Usage: check_pack_exllamav3.py PACK_EXPERTS.safetensors WH_DIR [WH_DIR ...]
"""
import glob
import os
import sys
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


def proxy(W, Wq, H):
    d = Wq.double() - W.double()
    return float(torch.einsum("in,ij,jn->", d, H.double(), d) / torch.einsum("in,ij,jn->", W.double(), H.double(), W.double()))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    dev = torch.device("cuda:0")
    pack = {k: v.to(dev) for k, v in load_file(sys.argv[1]).items()}
    bad = checked = 0
    print("| tensor | k×n | max |Δ| / max|W| | proxy (exllamav3 decode) | proxy (Spillway report) |")
    print("|---|---|---|---|---|")
    for d in sys.argv[2:]:
        for path in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
            name = os.path.basename(path)[: -len(".safetensors")]
            if name + ".trellis" not in pack:
                continue
            t = load_file(path)
            W, H, Ws = t["W"].to(dev), t["H"].to(dev), t["W_spillway"].to(dev).float()
            k, n = W.shape
            lin = LinearEXL3(None, k, n, None, None, None, pack[name + ".suh"], pack[name + ".svh"],
                             pack[name + ".trellis"], pack.get(name + ".mcg"), pack.get(name + ".mul1"), None, key=name)
            We = lin.get_weight_tensor().float()
            rel = float((We - Ws).abs().max() / Ws.abs().max())
            pe, ps = proxy(W, We, H), float(t["proxy_err_spillway"][0])
            ok = rel <= 2e-3 and abs(pe - ps) <= 0.01 * ps
            bad += not ok
            checked += 1
            print(f"| {name} (K={os.path.basename(d.rstrip('/'))}) | {k}×{n} | {rel:.2e} | {pe:.6f} | {ps:.6f} |"
                  + ("" if ok else " **MISMATCH**"), flush=True)
    print(f"\nexllamav3 reconstructed {checked - bad}/{checked} Spillway-packed expert tensors as Spillway decodes them")
    sys.exit(1 if bad or not checked else 0)


if __name__ == "__main__":
    main()
