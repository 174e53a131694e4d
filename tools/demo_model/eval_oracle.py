"""Held-out perplexity and routing statistics of an exported demo checkpoint, computed with the ORACLE
(tools/golden/oracle_v41.py, exact mode: float32, the checkpoint's dequantized FP8/FP4/BF16 weights).

    .venv-golden/bin/python tools/demo_model/eval_oracle.py models/demo [--seq 512] [--max-windows N]
        [--budget-s S] [--device cpu|cuda] [--out models/demo/routing_stats.json] [--ppl-out FILE]

Windows: the held-out token stream (tokenizer_build.py) cut into consecutive windows of seq+1 tokens; each is a
fresh sequence (positions 0..seq-1) scoring its seq next-token predictions, as in training.  Routing: for every
layer, how often each routed expert is among a token's top-k (same routing code as the oracle's moe()).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "golden"))
from oracle_v41 import OracleV41, Weights, stable_topk_desc  # noqa: E402


class RecordingOracle(OracleV41):
    def moe(self, L, x):
        if not hasattr(self, "counts"):
            self.counts = torch.zeros(self.L, self.tc["n_routed_experts"], dtype=torch.int64, device="cpu")
        pfx = f"layers.{L}.ffn."
        sc = F.softplus(x @ self.W[pfx + "gate.weight"].T).sqrt()
        _, idx = stable_topk_desc(sc + self.W[pfx + "gate.bias"], self.tc["num_experts_per_tok"])
        self.counts[L] += torch.bincount(idx.flatten().cpu(), minlength=self.counts.shape[1])
        return super().moe(L, x)


def routing_summary(counts: np.ndarray, k: int) -> dict:
    L, E = counts.shape
    top = max(1, math.ceil(0.1 * E))
    layers = []
    for l in range(L):
        c = counts[l].astype(np.float64)
        p = c / c.sum()
        nz = p[p > 0]
        ent = float(-(nz * np.log(nz)).sum())
        layers.append(dict(layer=l, assignments=int(c.sum()), load=[int(v) for v in counts[l]],
                           entropy_nats=round(ent, 4), normalized_entropy=round(ent / math.log(E), 4),
                           top10pct_share=round(float(np.sort(p)[::-1][:top].sum()), 4),
                           max_over_mean=round(float(p.max() * E), 3), min_over_mean=round(float(p.min() * E), 3),
                           unused_experts=int((c == 0).sum())))
    return dict(n_routed_experts=E, experts_per_token=k, top10pct_experts=top,
                uniform_top10pct_share=round(top / E, 4),
                mean_normalized_entropy=round(float(np.mean([x["normalized_entropy"] for x in layers])), 4),
                mean_top10pct_share=round(float(np.mean([x["top10pct_share"] for x in layers])), 4),
                layers=layers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--max-windows", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=0)
    ap.add_argument("--every", type=int, default=1, help="score every k-th window (spread over all sources)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="")
    ap.add_argument("--ppl-out", default="")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    held = np.load(os.path.join(a.data, "tokens.npz"))["heldout"].astype(np.int64)
    nwin = (held.size - 1) // a.seq
    if a.max_windows:
        nwin = min(nwin, a.max_windows)
    W = Weights(a.model_dir)
    if a.device != "cpu":
        torch.set_default_device(a.device)
        W.w = {k: v.to(a.device) for k, v in W.w.items()}
        W.token_map = W.token_map.to(a.device)
    o = RecordingOracle(W, mode="exact")
    if a.device != "cpu":
        o.eng_mult = o.eng_mult.to(a.device)
    t0, nll, cnt, done = time.time(), 0.0, 0, 0
    for w in range(0, nwin, a.every):
        if a.budget_s and time.time() - t0 > a.budget_s:
            break
        seg = torch.from_numpy(held[w * a.seq: w * a.seq + a.seq + 1]).to(a.device)
        o.reset()
        logits = o.forward(seg[:-1])
        nll += float(F.cross_entropy(logits, seg[1:], reduction="sum"))
        cnt += a.seq
        done += 1
    res = dict(evaluator="tools/golden/oracle_v41.py exact mode", model_dir=a.model_dir, seq=a.seq,
               every=a.every, windows=done, windows_available=(held.size - 1) // a.seq, tokens_scored=cnt,
               heldout_nll_nats=nll / cnt, heldout_ppl=math.exp(nll / cnt), seconds=round(time.time() - t0, 1),
               device=a.device)
    print(json.dumps(res), flush=True)
    if a.ppl_out:
        json.dump(res, open(a.ppl_out, "w"), indent=1)
    if a.out:
        summ = routing_summary(o.counts.numpy(), o.tc["num_experts_per_tok"])
        summ.update(source=f"oracle exact mode over {cnt} held-out tokens ({done} windows of {a.seq})", perplexity=res)
        json.dump(summ, open(a.out, "w"), indent=1)
        print(json.dumps({k: v for k, v in summ.items() if k != "layers"}))


if __name__ == "__main__":
    main()
