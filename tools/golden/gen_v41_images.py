"""Golden case for V4.1 prompts with image spans, on the tiny V4.1 fixture model (tests/golden/fixtures/v41/model).

    .venv-golden/bin/python tools/golden/gen_v41_images.py --out tests/golden/fixtures/v41/cases/images.safetensors

The prompt holds two image spans laid out as the reference's image processor lays them out
(IMAGE_START, rows of IMAGE followed by IMAGE_NEW_LINE, IMAGE_END; every position carries image_token_id):
a 2 x 3 token grid (10 positions) and a 1 x 1 grid (4 positions), with text before, between and after.
The embeddings of image positions are random rows standing in for the aligner's output (the vision tower
itself is checked on its own: tools/vision/make_tiny_vision.py); START / NEW_LINE / END rows repeat one
vector each, as the learned image_start / image_newline / image_end do.

Computed with tools/golden/oracle_v41.py in exact mode (float32, no fake quant), whose image handling
transcribes the reference Transformer.forward: image rows overwrite the embeddings, every router selects
with bias_vl at image positions, Engram adds nothing there and hashes them as DEAD.

Writes: prompt_ids I64 [T], is_image U8 [T], image_rows F32 [n_image, d], prefill_logits F32 [T, vocab]
(one forward), decode_ids I64 [N] (greedy continuation) and decode_logits F32 [N, vocab] (one token per
step, teacher-forced on decode_ids). Metadata records how far the logits move when the oracle drops one
piece of the image handling (bias_vl, the Engram mask), so a test can show each piece is exercised.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import release_format as rf  # noqa: E402
from oracle_v41 import OracleV41, Weights  # noqa: E402

N_DECODE = 8
TEXT = -1
START, IMAGE, NEW_LINE, END = 0, 1, 2, 3


def span_types(n_h: int, n_w: int) -> list[int]:
    return [START] + ([IMAGE] * n_w + [NEW_LINE]) * n_h + [END]


def build_prompt(rng, vocab: int, image_token: int):
    """ids and token types: text 10, image 2x3, text 12, image 1x1, text 6."""
    def text(n):
        ids = rng.integers(3, vocab - 1, size=n)
        ids[ids == image_token] = 3
        return list(ids), [TEXT] * n

    parts = [text(10), None, text(12), None, text(6)]
    grids = [(2, 3), (1, 1)]
    ids, types = [], []
    for part in parts:
        if part is None:
            t = span_types(*grids.pop(0))
            ids += [image_token] * len(t)
            types += t
        else:
            ids += part[0]
            types += part[1]
    return np.array(ids, dtype=np.int64), np.array(types, dtype=np.int64)


def image_rows(rng, types: np.ndarray, d: int, embed_std: float) -> np.ndarray:
    special = {k: rng.standard_normal(d) * embed_std for k in (START, NEW_LINE, END)}
    rows = [special[t] if t != IMAGE else rng.standard_normal(d) * embed_std for t in types if t != TEXT]
    return np.stack(rows).astype(np.float32)


def run(W, prompt, mask, rows, decode_ids=None, patch=None):
    """Prefill logits, then greedy (or teacher-forced on decode_ids) decode logits."""
    o = OracleV41(W, mode="exact")
    if patch:
        patch(o)
    prefill = o.forward(prompt, image_mask=torch.from_numpy(mask), image_rows=torch.from_numpy(rows))
    ids, steps = [], []
    nxt = int(prefill[-1].argmax())
    for i in range(N_DECODE):
        tok = nxt if decode_ids is None else int(decode_ids[i])
        ids.append(tok)
        lg = o.forward([tok])
        steps.append(lg[0])
        nxt = int(lg[0].argmax())
    return prefill, np.array(ids, dtype=np.int64), torch.stack(steps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap.add_argument("--model", default=os.path.join(root, "tests/golden/fixtures/v41/model"))
    ap.add_argument("--out", default=os.path.join(root, "tests/golden/fixtures/v41/cases/images.safetensors"))
    ap.add_argument("--seed", type=int, default=4107)
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    W = Weights(args.model)
    cfg = W.cfg
    tc = cfg["text_config"]
    rng = np.random.default_rng(args.seed)
    prompt, types = build_prompt(rng, tc["vocab_size"], cfg["image_token_id"])
    mask = types != TEXT
    embed_std = float(W["embed.weight"].std())
    rows = image_rows(rng, types, tc["hidden_size"], embed_std)

    prefill, decode_ids, decode = run(W, prompt, mask, rows)

    # Ablations: the same forward without one piece of the image handling.
    def no_bias_vl(o):
        orig = o.moe
        o.moe = lambda L, x, image_mask=None: orig(L, x, None)

    def no_engram_mask(o):
        orig_hash, orig_engram = o.ngram_hashes, o.engram
        o.ngram_hashes = lambda ids, image_mask=None: orig_hash(ids, None)
        o.engram = lambda L, X, r, image_mask=None: orig_engram(L, X, r, None)

    moves = {}
    for name, patch in (("bias_vl", no_bias_vl), ("engram_mask", no_engram_mask)):
        p2, _, d2 = run(W, prompt, mask, rows, decode_ids, patch)
        moves[name] = float(max((p2 - prefill).abs().max(), (d2 - decode).abs().max()))
    text_only = OracleV41(W, mode="exact").forward(prompt)
    moves["image_rows"] = float((text_only - prefill).abs().max())
    for k, v in moves.items():
        print(f"without {k}: max |dlogit| {v:.3f}")

    meta = {"producer": "tools/golden/gen_v41_images.py", "seed": str(args.seed), "mode": "exact",
            "types": json.dumps(types.tolist()), **{f"ablation_max_dlogit_{k}": f"{v:.6g}" for k, v in moves.items()}}
    rf.write_safetensors(args.out, {
        "prompt_ids": prompt, "is_image": mask.astype(np.uint8), "image_rows": rows,
        "prefill_logits": prefill.numpy().astype(np.float32), "decode_ids": decode_ids,
        "decode_logits": decode.numpy().astype(np.float32),
    }, metadata=meta)
    print(f"wrote {args.out}: {len(prompt)} prompt positions ({int(mask.sum())} image), {N_DECODE} decode steps")


if __name__ == "__main__":
    main()
