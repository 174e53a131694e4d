"""Golden data for tests/unit/test_demo_model.cpp, computed with the oracle (exact mode) on models/demo.

    .venv-golden/bin/python tools/demo_model/make_fixture.py [models/demo] [tests/golden/fixtures/demo]

demo_cases.safetensors:
  prompt_ids I64 [160]      the first 160 tokens of held-out window 0 (BOS + a held-out Python file)
  prefill_argmax I64 [160], prefill_margin F32 [160] (top-1 minus top-2 logit), prefill_nll F32 [1] (mean
  next-token NLL over positions 0..158), last_logits F32 [vocab] (position 159)
  decode_ids I64 [16]       greedy continuation fed back one token at a time (teacher forcing)
  decode_argmax I64 [16], decode_margin F32 [16]
  text U8 [n], text_ids I64 [m]   a held-out text and its tokenizers ids (encode, add_special_tokens=False)
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "golden"))
import release_format as rf  # noqa: E402
from oracle_v41 import OracleV41  # noqa: E402

T, N_DECODE = 160, 16


def margin(lg):
    t = lg.topk(2, dim=-1).values
    return (t[..., 0] - t[..., 1]).float()


def main():
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "models", "demo")
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "tests", "golden", "fixtures", "demo")
    torch.set_num_threads(2)
    held = np.load(os.path.join(HERE, "data", "tokens.npz"))["heldout"].astype(np.int64)
    prompt = torch.from_numpy(held[:T])
    o = OracleV41(model_dir, mode="exact")
    lg = o.forward(prompt)
    nll = F.cross_entropy(lg[:-1], prompt[1:])
    ids, dl = [int(lg[-1].argmax())], []
    for _ in range(N_DECODE):
        step = o.forward([ids[-1]])[0]
        dl.append(step)
        ids.append(int(step.argmax()))
    dl = torch.stack(dl)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    docs = open(os.path.join(HERE, "data", "heldout.txt"), encoding="utf-8").read().split("\0")
    text = docs[1][:3000] + "\n<｜User｜>héllo wörld — ünïcode ✓ 数字 12345<｜Assistant｜><think>…</think>"
    out = dict(prompt_ids=prompt.numpy(), prefill_argmax=lg.argmax(-1).numpy().astype(np.int64),
               prefill_margin=margin(lg).numpy(), prefill_nll=np.array([float(nll)], np.float32),
               last_logits=lg[-1].numpy().astype(np.float32),
               decode_ids=np.array(ids[:N_DECODE], np.int64), decode_argmax=dl.argmax(-1).numpy().astype(np.int64),
               decode_margin=margin(dl).numpy(),
               text=np.frombuffer(text.encode("utf-8"), np.uint8).copy(),
               text_ids=np.array(tok.encode(text, add_special_tokens=False).ids, np.int64))
    os.makedirs(out_dir, exist_ok=True)
    rf.write_safetensors(os.path.join(out_dir, "demo_cases.safetensors"), out,
                         {"format": "pt", "generator": "tools/demo_model/make_fixture.py", "oracle_mode": "exact"})
    print(f"prefill nll {float(nll):.4f} (ppl {float(nll.exp()):.2f}); min margin prefill "
          f"{float(margin(lg).min()):.4f} decode {float(margin(dl).min()):.4f}; decode ids {ids[:N_DECODE]}")
    print("decoded continuation:", repr(tok.decode(ids)))


if __name__ == "__main__":
    main()
