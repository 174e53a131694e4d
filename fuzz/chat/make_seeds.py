#!/usr/bin/env python3
"""Write fuzz seeds from the chat goldens: fuzz/chat/corpus (stream parser: flags byte, split-seed
byte, completion text) and fuzz/chat/corpus-encoding (encoder: family byte, request JSON)."""
import hashlib
import json
import pathlib

root = pathlib.Path(__file__).resolve().parents[2]
out = root / "fuzz/chat/corpus"
out.mkdir(exist_ok=True)
for family in ("v4", "v41"):
    doc = json.loads((root / f"tests/unit/data/chat_goldens_{family}.json").read_text(encoding="utf-8"))
    for c in doc["completions"]:
        data = bytes([1 if c["thinking"] else 0, 7]) + c["text"].encode("utf-8")
        (out / hashlib.sha1(data).hexdigest()).write_bytes(data)
enc = root / "fuzz/chat/corpus-encoding"
enc.mkdir(exist_ok=True)
for i, family in enumerate(("v4", "v41")):
    doc = json.loads((root / f"tests/unit/data/chat_goldens_{family}.json").read_text(encoding="utf-8"))
    for c in doc["cases"] + doc["errors"]:
        data = bytes([i]) + json.dumps(c["request"], ensure_ascii=False).encode("utf-8")
        (enc / hashlib.sha1(data).hexdigest()).write_bytes(data)
print(len(list(out.iterdir())), "seeds in", out, ";", len(list(enc.iterdir())), "seeds in", enc)
