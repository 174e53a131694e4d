"""Engram compressed-token map (spec §5.4 item 1) in plain Python + unicodedata.

map[id] = class of id.  Each token id is decoded alone with the raw tokenizer (special tokens kept);
if the text contains U+FFFD the class key is the raw token string, else the text normalized as
NFKC -> NFD -> drop every combining mark (General_Category M*) -> per-character lowercase ->
[ \\t\\r\\n]+ -> " " -> (a lone " " is kept) -> strip White_Space; an empty key falls back to the
decoded text.  Classes are numbered by first appearance in id order.

    .venv-golden/bin/python tools/demo_model/engram_map.py models/demo   # writes engram_token_map.safetensors
"""
from __future__ import annotations

import os
import re
import sys
import unicodedata

import numpy as np

# Unicode White_Space property (what Rust's char::is_whitespace tests; str.isspace differs on U+001C..1F)
WHITE_SPACE = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
                  "\u200a\u2028\u2029\u202f\u205f\u3000")
_RUN = re.compile(r"[ \t\r\n]+")


def normalize(text: str) -> str:
    s = unicodedata.normalize("NFKC", text)
    s = unicodedata.normalize("NFD", s)
    s = "".join(c for c in s if not unicodedata.category(c).startswith("M"))
    s = "".join(c.lower() for c in s)  # per character: no final-sigma rule
    s = _RUN.sub(" ", s)
    if s == " ":
        return s
    b, e = 0, len(s)
    while b < e and s[b] in WHITE_SPACE:
        b += 1
    while e > b and s[e - 1] in WHITE_SPACE:
        e -= 1
    return s[b:e]


def compressed_token_map(tok) -> tuple[np.ndarray, int]:
    """tok: tokenizers.Tokenizer.  Returns (int32 [vocab] map, number of classes)."""
    n = tok.get_vocab_size(with_added_tokens=True)
    classes: dict[str, int] = {}
    out = np.zeros(n, dtype=np.int32)
    for i in range(n):
        text = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(i)
        else:
            key = normalize(text) or text
        out[i] = classes.setdefault(key, len(classes))
    return out, len(classes)


def crosscheck_with_tokenizers_normalizers(tok, n_check: int | None = None) -> int:
    """Compare `normalize` with the tokenizers normalizer chain the reference uses; returns mismatches."""
    from tokenizers import Regex, normalizers as N
    chain = N.Sequence([N.NFKC(), N.NFD(), N.StripAccents(), N.Lowercase(), N.Replace(Regex("[ \t\r\n]+"), " "),
                        N.Replace(Regex("^ $"), "\ue000"), N.Strip(), N.Replace("\ue000", " ")])
    bad = 0
    for i in range(tok.get_vocab_size() if n_check is None else n_check):
        t = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" not in t and chain.normalize_str(t) != normalize(t):
            bad += 1
    return bad


def main():
    from tokenizers import Tokenizer
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden"))
    import release_format as rf
    model_dir = sys.argv[1]
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    m, n = compressed_token_map(tok)
    bad = crosscheck_with_tokenizers_normalizers(tok)
    print(f"engram map: {m.size} ids -> {n} classes; normalizer mismatches vs tokenizers chain: {bad}")
    rf.write_safetensors(os.path.join(model_dir, "engram_token_map.safetensors"), {"engram_token_map": m})
    return n


if __name__ == "__main__":
    main()
