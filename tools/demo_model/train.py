"""Train the demo DeepSeek-V4.1 model (model.DemoV41) on the tokenized corpus and export it.

    python tools/demo_model/train.py --seed 1 [--steps N | --budget-s S] [--batch 32] [--seq 512] [--device cuda]

Data: <data>/tokens.npz (tokenizer_build.py).  Each step draws `batch` windows of seq+1 tokens at offsets from
a torch.Generator seeded with --seed (same seed => same windows, same init).  Loss = next-token CE over every
position + 1e-3 x sequence-level expert-balance loss + the indexer distillation KL (it only trains the
indexer's own weights).  Router biases (ffn.gate.bias) follow DeepSeek's auxiliary-loss-free rule
bias += 1e-3 x sign(mean load - load).  AdamW (0.9, 0.95), wd 0.1 on matrices, warmup 5%, cosine to 10%.
The last --qat-frac of the steps run with fake_export=True: the forward sees exactly the exported FP8/FP4/BF16
values (straight-through gradients), so the export loses nothing.

--budget-s: time 10 warm-up steps, then fix steps = floor(budget / step time) rounded down to 50 and print it;
re-running with --steps <that number> and the same seed reproduces the run.
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from config import make_config  # noqa: E402
from model import DemoV41  # noqa: E402


def load_token_map(model_dir):
    sys.path.insert(0, os.path.join(HERE, "..", "golden"))
    import release_format as rf
    t, _ = rf.read_safetensors(os.path.join(model_dir, "engram_token_map.safetensors"))
    return t["engram_token_map"].data.astype(np.int32)


def batches(tokens: torch.Tensor, batch: int, seq: int, gen: torch.Generator):
    n = tokens.numel() - seq - 1
    while True:
        off = torch.randint(0, n, (batch,), generator=gen)
        yield torch.stack([tokens[o:o + seq + 1] for o in off.tolist()])


@torch.no_grad()
def evaluate(model, tokens: torch.Tensor, seq: int, device, max_windows: int | None = None, batch: int = 16):
    """Mean CE (nats/token) over non-overlapping windows of `seq` tokens (each a fresh sequence at position 0)."""
    model.eval()
    nwin = (tokens.numel() - 1) // seq
    if max_windows:
        nwin = min(nwin, max_windows)
    tot, cnt = 0.0, 0
    for i in range(0, nwin, batch):
        w = torch.stack([tokens[j * seq:j * seq + seq + 1] for j in range(i, min(nwin, i + batch))]).to(device)
        logits = model(w[:, :-1].long())
        tot += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten().long(),
                                                       reduction="sum"))
        cnt += w[:, 1:].numel()
    model.train()
    return tot / cnt, cnt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--qat-frac", type=float, default=0.2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--model-dir", default=os.path.join(ROOT, "models", "demo"))
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "demo"))
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--tiny", action="store_true", help="tiny widths (CPU smoke test)")
    ap.add_argument("--eval-windows", type=int, default=0, help="cap on held-out windows (0 = all)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device(args.device)
    tok = np.load(os.path.join(args.data, "tokens.npz"))
    train_tok = torch.from_numpy(tok["train"].astype(np.int32))
    held_tok = torch.from_numpy(tok["heldout"].astype(np.int32))
    tmap = load_token_map(args.model_dir)
    tj = json.load(open(os.path.join(args.model_dir, "tokenizer.json"), encoding="utf-8"))
    vocab = 1 + max(list(tj["model"]["vocab"].values()) + [t["id"] for t in tj["added_tokens"]])
    img = next(t["id"] for t in tj["added_tokens"] if t["content"] == "<｜deepseek_image｜>")
    cfg = make_config(vocab, int(tmap.max()) + 1, img, tiny=args.tiny)
    model = DemoV41(cfg, torch.from_numpy(tmap)).to(dev)
    nparam = sum(p.numel() for p in model.params.values())
    print(f"params {nparam / 1e6:.2f} M; train tokens {train_tok.numel():,}; held-out {held_tok.numel():,}", flush=True)

    decay, no_decay = [], []
    for k, p in model.params.items():
        name = k.replace("__", ".")
        (decay if p.dim() >= 2 and "hc_" not in name and "engram.embed" not in name else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    data = batches(train_tok, args.batch, args.seq, gen)
    E, k = model.E, model.topk

    def step_fn(step, total):
        warm = max(1, int(0.05 * total))
        lr = args.lr * (step + 1) / warm if step < warm else \
            args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm))))
        for g in opt.param_groups:
            g["lr"] = lr
        model.fake_export = step >= int(total * (1 - args.qat_frac))
        w = next(data).to(dev, non_blocking=True).long()
        stats, aux = [], []
        logits = model(w[:, :-1], stats=stats, aux=aux)
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten())
        bal = sum(E * ((c.float() / c.sum()) * pm).sum() for _, c, pm in stats) / len(stats)
        idx_kl = sum(aux) / len(aux)
        loss = ce + 1e-3 * bal + idx_kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.params.values(), 1.0)
        opt.step()
        with torch.no_grad():
            for L, c, _ in stats:
                b = getattr(model, f"gate_bias_{L}")
                b += 1e-3 * torch.sign(c.float().mean() - c.float())
        return ce, idx_kl, gn, lr, stats

    total = args.steps
    t0 = time.time()
    if not total:
        assert args.budget_s > 0, "--steps or --budget-s"
        # time warm-up steps on a throwaway copy of the optimizer state? No: time the real first steps of a
        # provisional schedule, then restart from scratch with the fixed step count (same seed).
        for i in range(12):
            if i == 2:
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                tb = time.time()
            step_fn(i, 1000)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dt = (time.time() - tb) / 10
        total = max(50, int((args.budget_s - (time.time() - t0)) / (dt * 1.10)) // 50 * 50)
        print(f"step time {dt * 1e3:.1f} ms -> --steps {total}", flush=True)
        torch.manual_seed(args.seed)
        model = DemoV41(cfg, torch.from_numpy(tmap)).to(dev)
        # restart cleanly (same process): rebuild optimizer and data stream
        decay, no_decay = [], []
        for kk, p in model.params.items():
            name = kk.replace("__", ".")
            (decay if p.dim() >= 2 and "hc_" not in name and "engram.embed" not in name else no_decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
        gen.manual_seed(args.seed)
        data = batches(train_tok, args.batch, args.seq, gen)
    t0 = time.time()
    log = []
    for step in range(total):
        ce, kl, gn, lr, stats = step_fn(step, total)
        if step % 50 == 0 or step == total - 1:
            loads = torch.stack([c.float() / c.sum() for _, c, _ in stats])
            rec = dict(step=step, ce=float(ce), idx_kl=float(kl), gnorm=float(gn), lr=lr,
                       max_load=float(loads.max() * E), qat=model.fake_export, t=round(time.time() - t0, 1))
            log.append(rec)
            print(json.dumps(rec), flush=True)
    train_s = time.time() - t0
    # held-out evaluation (training forward, f32): before/after export rounding
    model.fake_export = False
    ce_raw, n = evaluate(model, held_tok, args.seq, dev, args.eval_windows or None)
    model.fake_export = True
    ce_q, _ = evaluate(model, held_tok, args.seq, dev, args.eval_windows or None)
    res = dict(seed=args.seed, steps=total, batch=args.batch, seq=args.seq, lr=args.lr, qat_frac=args.qat_frac,
               train_seconds=round(train_s, 1), tokens_seen=total * args.batch * args.seq, params=nparam,
               heldout_tokens=n, heldout_ppl_float=math.exp(ce_raw), heldout_ppl_exported_weights=math.exp(ce_q),
               device=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", torch=torch.__version__)
    print(json.dumps(res), flush=True)
    from export import export
    model = model.cpu()
    export(model, cfg, tmap, args.out, metadata={"seed": args.seed, "steps": total}, n_shards=args.shards)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(dict(result=res, log=log), f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
