#!/usr/bin/env python3
"""exllamav3's own kernels (LinearEXL3.forward, as its model code calls them) on the tensors of
make_bench_tensors.py, timed like bench_exl3 (CUDA events around `iters` calls rotating over enough
copies to defeat L2). The int8-GEMV mode is process-wide: run once with EXL3_INT8_GEMV unset (default,
int8 activations for mul1, m <= 2) and once with EXL3_INT8_GEMV=0 (fp16 path).
Usage: bench_exllamav3.py DIR [iters]"""
import glob
import os
import sys
import types

try:
    import pydantic  # noqa: F401
except ImportError:  # only an exception type is imported by exllamav3.util.memory
    stub = types.ModuleType("pydantic")
    stub.PydanticUserError = type("PydanticUserError", (Exception,), {})
    sys.modules["pydantic"] = stub

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from exllamav3.modules.quant.exl3 import LinearEXL3  # noqa: E402


def main():
    d = sys.argv[1]
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    mode = os.environ.get("EXL3_INT8_GEMV", "default")
    for path in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        name = os.path.basename(path)[: -len(".safetensors")]
        t = {k.split(".")[-1]: v.cuda() for k, v in load_file(path).items()}
        tr = t["trellis"]
        k, n = tr.shape[0] * 16, tr.shape[1] * 16
        tb = tr.numel() * 2
        copies = max(2, (512 << 20) // tb + 1)
        lins = [LinearEXL3(None, k, n, None, None, None, t["suh"], t["svh"], tr.clone(), t.get("mcg"), t.get("mul1"), None, key=name)
                for _ in range(copies)]
        for m in (1, 8, 16):
            x = torch.randn(m, k, device="cuda").half()
            for i in range(20):
                lins[i % copies].forward(x, {})
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for i in range(iters):
                lins[i % copies].forward(x, {})
            e1.record()
            torch.cuda.synchronize()
            us = e0.elapsed_time(e1) * 1e3 / iters
            print(f"| exllamav3 (EXL3_INT8_GEMV={mode}) | {name} | {m} | {us:.2f} | {tb / us / 1e3:.0f} |", flush=True)
        del lins


if __name__ == "__main__":
    main()
