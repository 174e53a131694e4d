#!/usr/bin/env python3
"""Writes heldout_prompts.json: 20 prompts from held-out documents of the demo model's corpus (corpus.py's
split: a document is held out by the hash of its name, so the model never trained on these files), for
tools/serve/check_gpu_runner.py --prompts-file. The held-out documents of the Python 3.11 standard library
(PSF-2.0; the corpus's first source, in path order) of at least --min-doc characters, --per-doc windows each
at evenly spaced line starts: up to --chars characters, cut after the last full line. A document's first
window starts with the header the training data carries ("# file: NAME").

    python3 tools/demo_model/heldout_prompts.py [--chars 240] [--per-doc 4] [--count 20]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from corpus import STDLIB, is_heldout, read_doc, walk_py  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chars", type=int, default=240)
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--per-doc", type=int, default=4)
    ap.add_argument("--min-doc", type=int, default=4000)
    ap.add_argument("--out", default=os.path.join(HERE, "heldout_prompts.json"))
    a = ap.parse_args()
    prompts = []
    for path in walk_py(STDLIB, ("site-packages", "dist-packages")):
        docname = f"python3.11-stdlib/{os.path.relpath(path, STDLIB)}"
        if not is_heldout(docname):
            continue
        text = read_doc(path)
        if text is None or len(text) < a.min_doc:
            continue
        doc = f"# file: {docname}\n{text}"
        for k in range(a.per_doc):
            start = 0 if k == 0 else doc.index("\n", k * len(doc) // a.per_doc) + 1
            cut = doc.rfind("\n", start, start + a.chars)
            prompts.append({"source": f"{docname} @{start}", "prompt": doc[start:cut + 1]})
        if len(prompts) >= a.count:
            break
    if len(prompts) < a.count:
        raise SystemExit(f"only {len(prompts)} windows of held-out documents of at least {a.min_doc} characters")
    prompts = prompts[:a.count]
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump({"license": "PSF-2.0 (Python 3.11 standard library excerpts)", "prompts": prompts}, f, indent=1)
        f.write("\n")
    print(f"wrote {len(prompts)} prompts to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
