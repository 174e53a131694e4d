#!/usr/bin/env python3
"""Random EXL3 tensors (any trellis bits are a valid trellis) for bench_exl3 and bench_exllamav3.py, so
both time the very same bytes. Usage: make_bench_tensors.py OUT_DIR"""
import os
import sys

import torch
from safetensors.torch import save_file

SHAPES = [  # name, k (in), n (out), K, codebook
    ("dense_8192x8192_k3_mul1", 8192, 8192, 3, "mul1"),
    ("dense_8192x8192_k3_mcg", 8192, 8192, 3, "mcg"),
    ("v41_w1_5120x2304_k3_mul1", 5120, 2304, 3, "mul1"),
    ("v41_w2_2304x5120_k3_mul1", 2304, 5120, 3, "mul1"),
    ("v41_w1_5120x2304_k2_mcg", 5120, 2304, 2, "mcg"),
    ("v41_w1_5120x2304_k4_mul1", 5120, 2304, 4, "mul1"),
]
MULT = {"mcg": 0xCBAC1FED, "mul1": 0x83DCD12D}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    for name, k, n, K, cb in SHAPES:
        t = {
            f"{name}.trellis": torch.randint(-32768, 32767, (k // 16, n // 16, 16 * K), generator=g, dtype=torch.int32).to(torch.int16),
            f"{name}.suh": (torch.randn(k, generator=g) * 0.03).half(),
            f"{name}.svh": torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).half(),
            f"{name}.{cb}": torch.tensor(MULT[cb] - (1 << 32), dtype=torch.int32),  # the uint32 word as int32
        }
        save_file(t, os.path.join(out, name + ".safetensors"))
        print("wrote", name)


if __name__ == "__main__":
    main()
