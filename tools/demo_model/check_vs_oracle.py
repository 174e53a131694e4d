"""Check that model.DemoV41 (training forward) computes what the oracle's exact mode computes.

    .venv-golden/bin/python tools/demo_model/check_vs_oracle.py

Random tiny config (and random weights: every parameter perturbed), exported with export.py, reloaded by
tools/golden/oracle_v41.py (exact mode); the training model runs with fake_export=True so its weights are
the exported values.  Prints max |dlogit| over all positions of a 150-token prompt.
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "golden"))
from config import make_config  # noqa: E402
from export import export  # noqa: E402
from model import DemoV41  # noqa: E402
from oracle_v41 import OracleV41  # noqa: E402


def main(T: int = 150, seed: int = 0):
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    V = 512
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 300, size=V)
    remap, tmap = {}, np.zeros(V, dtype=np.int32)
    for t in range(V):
        tmap[t] = remap.setdefault(int(raw[t]), len(remap))
    cfg = make_config(V, len(remap), V - 1, tiny=True)
    m = DemoV41(cfg, torch.from_numpy(tmap))
    with torch.no_grad():
        for k, p in m.params.items():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() == 1 else p.std().clamp_min(0.05) * 0.5))
        for L in range(m.L):
            getattr(m, f"gate_bias_{L}").copy_(torch.randn(m.E) * 0.3)
    m.fake_export = True
    ids = torch.from_numpy(rng.integers(3, V, size=(2, T))).long()
    with torch.no_grad():
        mine = m(ids)
    worst = 0.0
    with tempfile.TemporaryDirectory() as d:
        export(m, cfg, tmap, d)
        for b in range(ids.shape[0]):
            ref = OracleV41(d, mode="exact").forward(ids[b])
            diff = float((ref - mine[b]).abs().max())
            agree = float((ref.argmax(-1) == mine[b].argmax(-1)).float().mean())
            print(f"seq {b}: max|dlogit| {diff:.3e}  (logit std {float(ref.std()):.2f})  top-1 agreement {agree:.4f}")
            worst = max(worst, diff)
    assert worst < 1e-3, worst
    print("OK: training forward == oracle exact mode")


if __name__ == "__main__":
    main()
