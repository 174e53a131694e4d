"""Deterministic mixed-text corpus for tokenizer parity tests and benchmarks.

Built at run time from files Python itself ships (stdlib sources, bundled docs/metadata text) plus
generated mixtures with a fixed seed: CJK, emoji/ZWJ sequences, whitespace runs, digits in many
scripts, special tokens embedded in text, random code points from every plane, and invalid UTF-8.
The same interpreter/venv gives the same corpus. Documents are (name, bytes); only the "invalid"
ones are not valid UTF-8.
"""

import os
import random
import sysconfig
from pathlib import Path

SEED = 20240517


def _read_files(paths, budget):
    docs, total = [], 0
    for p in paths:
        if total >= budget:
            break
        try:
            data = Path(p).read_bytes()
        except OSError:
            continue
        if not data:
            continue
        data = data[: budget - total]
        docs.append((str(p), data))
        total += len(data)
    return docs


def stdlib_sources(budget):
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts
    )
    random.Random(SEED).shuffle(files)
    return _read_files(files, budget)


def bundled_docs(budget):
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    files = []
    for root in roots:
        for p in root.rglob("*"):
            if p.is_file() and (p.suffix in (".txt", ".rst", ".md", ".html") or p.name in ("METADATA", "LICENSE")):
                files.append(p)
    files.append(Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py")
    files = sorted(set(files))
    random.Random(SEED + 1).shuffle(files)
    return _read_files(files, budget)


CJK_RANGES = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3),
              (0x3000, 0x303F), (0xFF00, 0xFFEF), (0x20000, 0x2A6DF), (0x9FA0, 0x9FB0)]
EMOJI = ["👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏽‍💻", "🧑‍🤝‍🧑", "👍🏿", "🇯🇵", "🇺🇸", "🏴‍☠️", "1️⃣", "#️⃣", "❤️", "❤", "☺️",
         "🤷‍♀️", "🫠", "😀", "🙏🏻", "🐈‍⬛", "👁️‍🗨️", "🏃‍➡️", "\u200d", "\ufe0f"]
SPACES = [" ", " ", " ", "\t", "\n", "\r\n", "\r", "\u3000", "\u00a0", "\u2028", "\u2029", "\u180e", "\u0085",
          "\x0b", "\x0c", "\u200b", "\u2009", "\u202f", "\u1680", "\ufeff"]
DIGITS = "0123456789٠١٢٣٤٥٦٧٨٩۰۱۲०१२३০১২๐๑๒０１２３４５６７８９²³¹½¼⅓ⅫⅣ①②⑩𝟘𝟙𝟚"
WORDS = ["the", "The", "naïve", "café", "Straße", "ÆSIR", "İstanbul", "ΣΟΦΙΑ", "σοφία", "Москва", "привет", "שלום",
         "مرحبا", "नमस्ते", "สวัสดี", "ひらがな", "カタカナ", "한국어", "中文", "e\u0301", "n\u0303", "a\u0308\u0304",
         "ﬁ", "Ⅸ", "ｶﾀｶﾅ", "don't", "I'll", "we've", "x_y", "foo.bar", "ß", "ǅ", "Ὀδυσσεύς", "ﷺ", "𝐀𝐁𝐂", "ab12cd",
         "#include", "->", "==", "...", "—", "“quoted”", "«guillemets»", "¿qué?", "¡sí!", "£100", "€5", "¥", "©®™"]
INVALID = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf0\x80\x80\x80",
           b"\xf4\x90\x80\x80", b"\xf5\x80", b"\xff", b"\xfe", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3", b"\xe4\xbd",
           b"\xf0\x9f", b"\xc3\x28", b"\xe2\x28\xa1", b"\xf0\x28\x8c\xbc", b"\xa0\xa1"]


def _random_cp(rng):
    while True:
        cp = rng.randrange(0x110000) if rng.random() < 0.3 else rng.randrange(0x3000)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def _cjk(rng):
    lo, hi = rng.choice(CJK_RANGES)
    return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 30)))


def _piece(rng, kind, specials):
    if kind == "cjk":
        return rng.choice([_cjk(rng), _cjk(rng), rng.choice(WORDS), " ", "，", "。", "「", "」", "、", str(rng.randint(0, 99999))])
    if kind == "emoji":
        return rng.choice([rng.choice(EMOJI) * rng.randint(1, 3), chr(rng.randint(0x1F300, 0x1FAFF)), " ", rng.choice(WORDS)])
    if kind == "whitespace":
        run = "".join(rng.choice(SPACES) for _ in range(rng.choice([1, 2, 3, 8, 40, 200])))
        return rng.choice([run, run, rng.choice(WORDS), "x", "1", "."])
    if kind == "digits":
        n = rng.choice([1, 2, 3, 4, 7, 12, 40])
        return rng.choice(["".join(rng.choice(DIGITS) for _ in range(n)), str(rng.randint(0, 10**n)), " ", ",", ".",
                           rng.choice(WORDS), "-", "e+"])
    if kind == "specials":
        s = rng.choice(specials)
        return rng.choice([s, s, " " + s + " ", s[: rng.randint(1, len(s))], s + s, "\n" + s, rng.choice(WORDS),
                           " ", "<", "｜", "<think>", "</think>", "<｜User｜>", "｜DSML｜", "<｜Assistant｜>"])
    if kind == "unicode":
        return "".join(_random_cp(rng) for _ in range(rng.randint(1, 12)))
    if kind == "scripts":
        return rng.choice(WORDS) + rng.choice(["", " ", "  ", "\n", "-", "'s", "\t"])
    raise ValueError(kind)


KINDS = ["cjk", "emoji", "whitespace", "digits", "specials", "unicode", "scripts"]


def generated(budget, specials, doc_bytes=24_000):
    rng = random.Random(SEED + 2)
    docs, total, i = [], 0, 0
    while total < budget:
        kind = KINDS[i % len(KINDS)] if i % 9 else "mixed"
        parts = []
        size = 0
        while size < doc_bytes:
            k = rng.choice(KINDS) if kind == "mixed" else kind
            p = _piece(rng, k, specials)
            parts.append(p)
            size += len(p.encode("utf-8"))
        data = "".join(parts).encode("utf-8")
        docs.append((f"generated/{i:04d}-{kind}", data))
        total += len(data)
        if i % 5 == 0:  # invalid UTF-8 spliced into a copy of the document
            b = bytearray(data)
            for _ in range(rng.randint(5, 60)):
                pos = rng.randrange(len(b) + 1)
                b[pos:pos] = rng.choice(INVALID)
            docs.append((f"generated/{i:04d}-{kind}-invalid", bytes(b)))
            total += len(b)
        i += 1
    # Edge cases as their own documents.
    for j, s in enumerate(["", " ", "  ", "\n", "\r\n", "\t\t", "a", "1234567", " " * 5000, "\n" * 3000, "ab" * 3000,
                           "中" * 4000, "😀" * 1000, specials[0], specials[0] * 3, "\ufffd", "\u180e" * 3]):
        docs.append((f"edge/{j:02d}", s.encode("utf-8")))
    docs.append(("edge/invalid-only", b"".join(INVALID)))
    return docs


def build(specials, total_bytes=10_600_000):
    """About 62% stdlib sources, 14% docs text, 24% generated mixtures."""
    return (stdlib_sources(int(total_bytes * 0.62)) + bundled_docs(int(total_bytes * 0.14))
            + generated(int(total_bytes * 0.24), specials))


def as_text(data):
    """The text tokenizers sees for `data`: invalid UTF-8 replaced, as our C++ encoder does."""
    return data.decode("utf-8", errors="replace")
