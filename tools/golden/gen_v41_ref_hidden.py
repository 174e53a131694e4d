"""Per-layer residual streams of the V4.1 oracle in REFERENCE numerics, for teacher-forced layer checks.

The reference mode is chaotic on the random tiny model (one bf16 ulp flipped by f32 summation order
grows to O(1) within a few layers), so end-to-end logits cannot be compared bit-for-bit. Feeding the
engine the oracle's own input to each layer and comparing that layer's output bounds the growth to one
layer; tests/golden/test_golden.cpp (GoldenV41.ReferenceNumericsPerLayer) uses this file.

  .venv-golden/bin/python tools/golden/gen_v41_ref_hidden.py  # → tests/golden/fixtures/v41/cases/p17_ref_hidden.safetensors
"""
import argparse
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from oracle_v41 import OracleV41  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default="tests/golden/fixtures/v41")
    ap.add_argument("--case", default="p17")
    args = ap.parse_args()
    case = load_file(f"{args.fixtures}/cases/{args.case}.safetensors")
    oracle = OracleV41(f"{args.fixtures}/model", mode="reference")
    _, hidden = oracle.forward(case["prompt_ids"].tolist(), return_hidden=True)
    out = {f"ref.hidden.{i}": h.contiguous() for i, h in enumerate(hidden)}
    out["prompt_ids"] = case["prompt_ids"]
    path = f"{args.fixtures}/cases/{args.case}_ref_hidden.safetensors"
    save_file(out, path, metadata={"generator": "tools/golden/gen_v41_ref_hidden.py", "torch": torch.__version__})
    print(path, sum(v.numel() for v in out.values()), "values")


if __name__ == "__main__":
    main()
