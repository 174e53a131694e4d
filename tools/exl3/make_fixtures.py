#!/usr/bin/env python3
"""Compatibility fixtures for Spillway's EXL3 reader, made by exllamav3's own quantizer.

For several bitrates K (2..6, plus half-integer 2.5/3.5 on mul1) and each codebook (3INST, MCG, MUL1)
this quantizes small random matrices with `quantize_exl3` (uncalibrated fallback path, and two
calibrated cases with a random Hessian, which exercise LDLQ and the scale refit) and stores, per case P:

  P.trellis / P.suh / P.svh / P.mcg|P.mul1   exactly what exllamav3 writes into a model
  P.inner    fp16 [k, n]  exllamav3's `ext.reconstruct` (Ŵ, the bit-exact decode target)
  P.weight   fp16 [k, n]  exllamav3's `get_weight_tensor` (original-basis W; its own fp16 rounding)
  P.x        fp16 [4, k]  activations
  P.y1, P.y4 fp16 [1|4, n]  exllamav3's LinearEXL3.forward(x[:1]) / forward(x), EXL3_INT8_GEMV=0

plus manifest.json (cases, K, codebook, shapes, exllamav3 version). tests/unit/test_exl3_fixtures.cpp
checks Ŵ bit-for-bit and W, y with tolerances.

Needs a CUDA GPU (exllamav3's trellis encoder is a CUDA kernel; there is no CPU quantizer) and the
exllamav3 wheel (pip install --no-deps); the extension JIT-builds on first import (~3-4 min on an H200).
Usage: python3 tools/exl3/make_fixtures.py OUT_DIR
"""
import json
import os
import sys
import types

os.environ.setdefault("EXL3_INT8_GEMV", "0")  # exact fp16 path for the stored y (spec §3.1, §9.3)

# exllamav3/__init__ imports its whole generator stack; util/memory.py needs pydantic only for an
# exception type. Stub it if absent (the lent GPU image lacks pydantic; nothing here uses it).
try:
    import pydantic  # noqa: F401
except ImportError:
    stub = types.ModuleType("pydantic")
    stub.PydanticUserError = type("PydanticUserError", (Exception,), {})
    sys.modules["pydantic"] = stub

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from exllamav3.modules.quant.exl3 import LinearEXL3  # noqa: E402
from exllamav3.modules.quant.exl3_lib.quantize import quantize_exl3  # noqa: E402


def h_data(k, dev, H=None):
    if H is None:
        return {"H": torch.zeros(k, k, dtype=torch.float32, device="meta"), "packed": False, "n": k,
                "first_key": "fixture", "count": 0, "finalized": False, "num_total": 0,
                "inf_nan": torch.zeros(2, dtype=torch.long, device=dev), "device": dev}
    return {"H": H.clone(), "packed": False, "n": k, "first_key": "fixture", "count": 1, "finalized": False,
            "num_total": 1, "inf_nan": torch.zeros(2, dtype=torch.long, device=dev), "device": dev, "L": None}


def make_case(name, K, cb, k, n, seed, calibrated, dev):
    g = torch.Generator(device="cpu").manual_seed(seed)
    w = torch.randn(k, n, generator=g) * (0.02 * (1 + torch.rand(1, n, generator=g)))
    w[:, 5] = 0.0  # a zero output channel (svh = 0 path)
    w = w.to(dev)
    H = None
    if calibrated:
        X = torch.randn(4 * k, k, generator=g) * (0.2 + torch.rand(1, k, generator=g) * 2)
        H = (X.T @ X / X.shape[0]).to(dev)
    qa = {"K": K, "seed": seed, "devices": [dev], "apply_out_scales": None, "sigma_reg": 0.025}
    if cb == "mcg":
        qa["mcg"] = True
    if cb == "mul1":
        qa["mul1"] = True
    _, proxy, tensors = quantize_exl3(w.float(), h_data(k, dev, H), qa, False)
    lin = LinearEXL3(None, k, n, None, None, None, tensors["suh"], tensors["svh"], tensors["trellis"],
                     tensors.get("mcg"), tensors.get("mul1"), None, key=name)
    inner = lin.get_inner_weight_tensor()
    weight = lin.get_weight_tensor().half()
    x = torch.randn(4, k, generator=g).half().to(dev)
    y1 = lin.forward(x[:1].contiguous(), {}).half()
    y4 = lin.forward(x.contiguous(), {}).half()
    torch.cuda.synchronize()
    out = {f"{name}.{key}": t.contiguous().cpu() for key, t in tensors.items()}
    out.update({f"{name}.inner": inner.cpu(), f"{name}.weight": weight.cpu(), f"{name}.x": x.cpu(),
                f"{name}.y1": y1.cpu(), f"{name}.y4": y4.cpu()})
    meta = {"name": name, "K": K, "codebook": cb, "k": k, "n": n, "calibrated": calibrated,
            "proxy_err": float(proxy), "trellis_shape": list(tensors["trellis"].shape)}
    return out, meta


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/exl3"
    os.makedirs(out_dir, exist_ok=True)
    dev = torch.device("cuda:0")
    cases = []
    for K in (2, 3, 4, 5, 6):
        for cb in ("3inst", "mcg", "mul1"):
            cases.append((f"k{K}_{cb}", K, cb, 128, 128, 100 + 10 * K + len(cb), False))
    cases.append(("k2.5_mul1", 2.5, "mul1", 128, 128, 201, False))
    cases.append(("k3.5_mul1", 3.5, "mul1", 128, 128, 202, False))
    # Calibrated (LDLQ + refit), 256 × 256, one named as a V4.1 routed expert projection.
    cases.append(("layers.0.ffn.experts.5.w2", 3, "mul1", 256, 256, 301, True))
    cases.append(("cal_k4_mcg", 4, "mcg", 256, 128, 302, True))
    tensors, metas, failures = {}, [], []
    for name, K, cb, k, n, seed, cal in cases:
        try:
            t, m = make_case(name, K, cb, k, n, seed, cal, dev)
            tensors.update(t)
            metas.append(m)
            print(f"ok   {name}: K={K} cb={cb} {k}x{n} proxy_err={m['proxy_err']:.5f}", flush=True)
        except Exception as e:  # keep the other cases; the failure is recorded in the manifest
            failures.append({"name": name, "error": repr(e)})
            print(f"FAIL {name}: {e!r}", flush=True)
    save_file(tensors, os.path.join(out_dir, "exl3_fixtures.safetensors"))
    from exllamav3.version import __version__ as exl3_version
    manifest = {"exllamav3_version": exl3_version,
                "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                "EXL3_INT8_GEMV": os.environ["EXL3_INT8_GEMV"], "cases": metas, "failures": failures}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"wrote {len(metas)} cases, {len(failures)} failures to {out_dir}")


if __name__ == "__main__":
    main()
