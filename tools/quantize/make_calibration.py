#!/usr/bin/env python3
"""Build the default calibration file for `spillway quantize` (docs/quantize.md, "Calibration data").

Only text that Debian packages ship on a stock machine, so the file can be rebuilt anywhere and its
licenses are known:

  code          Python standard library sources, /usr/lib/python3.X/*.py      (python3.X: PSF-2.0)
  chat          OpenAI-style {"messages": [...]} transcripts made from the same sources (user asks what
                a function does, the assistant answers with its docstring) and from the translation
                catalogs below (user asks for a translation, the assistant gives the catalog's);
                `spillway quantize` renders them with src/chat's DeepSeek encoder
  prose         license texts in /usr/share/common-licenses                   (base-files; each text's
                own terms allow verbatim copies)
  multilingual  GLib's message catalogs, /usr/share/locale/*/LC_MESSAGES/glib20.mo (libglib2.0-data:
                LGPL-2.1-or-later), decoded with Python's gettext

Output: JSONL, one {"text": ...} or {"messages": [...]} per line, the four sources interleaved so
that any prefix is a mixture. Deterministic (fixed seed, sorted inputs). Writes a manifest with the
per-source sizes and licenses next to the output (FILE.manifest.json).

    python3 tools/quantize/make_calibration.py /tmp/calibration.jsonl [--chars 400000]
"""
import argparse
import ast
import gettext
import glob
import hashlib
import json
import os
import random
import sys

LANGS = ["de", "fr", "es", "it", "pt_BR", "ru", "pl", "uk", "zh_CN", "zh_TW", "ja", "ko", "ar", "hi", "tr", "vi", "id"]


def python_dir():
    dirs = sorted(d for d in glob.glob("/usr/lib/python3.*") if os.path.isdir(d) and os.path.exists(d + "/os.py"))
    if not dirs:
        sys.exit("no /usr/lib/python3.X with sources found")
    return dirs[-1]


def demo_heldout(path, pydir):
    """The demo model's held-out stdlib files (tools/demo_model/corpus.py: is_heldout, 20 per mille):
    kept out of the calibration so that kl on tools/demo_model/data/heldout.txt stays clean."""
    docname = "python3.11-stdlib/" + os.path.relpath(path, pydir)
    return int(hashlib.sha256(docname.encode()).hexdigest(), 16) % 1000 < 20


def code_docs(pydir, budget):
    out, chats, used = [], [], 0
    for path in sorted(glob.glob(pydir + "/*.py")):
        if demo_heldout(path, pydir):
            continue
        try:
            src = open(path, encoding="utf-8").read()
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = src.splitlines()
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.end_lineno - node.lineno > 80:
                continue
            text = "\n".join(lines[node.lineno - 1:node.end_lineno])
            doc = ast.get_docstring(node)
            if len(text) < 200:
                continue
            out.append({"text": text, "source": os.path.basename(path)})
            used += len(text)
            if doc and len(doc) > 80:
                chats.append({"messages": [
                    {"role": "user", "content": "What does this Python code do?\n\n```python\n" + text + "\n```"},
                    {"role": "assistant", "content": doc}], "source": os.path.basename(path)})
            if used > budget:
                return out, chats
    return out, chats


def prose_docs(budget):
    out, used = [], 0
    for name in ["GPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "LGPL-2.1", "Artistic", "GPL-2"]:
        path = "/usr/share/common-licenses/" + name
        if not os.path.exists(path):
            continue
        text = open(path, encoding="utf-8", errors="replace").read()
        for para in text.split("\n\n"):
            para = para.strip()
            if len(para) > 300:
                out.append({"text": para, "source": path})
                used += len(para)
            if used > budget:
                return out
    return out


def multilingual_docs(budget):
    out, chats, used = [], [], 0
    per_lang = budget // len(LANGS) + 1
    for lang in LANGS:
        path = "/usr/share/locale/%s/LC_MESSAGES/glib20.mo" % lang
        if not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            cat = gettext.GNUTranslations(f)._catalog
        pairs = sorted((k, v) for k, v in cat.items() if isinstance(k, str) and k and isinstance(v, str) and len(v) > 20)
        block, n = [], 0
        for i, (k, v) in enumerate(pairs):
            block.append(v)
            n += len(v)
            if len(block) == 12:
                out.append({"text": "\n".join(block), "source": path})
                block = []
            if len(k) > 40 and i % 9 == 0:  # a few translation turns per language
                chats.append({"messages": [
                    {"role": "user", "content": "Translate into the language of locale %s:\n\n%s" % (lang, k)},
                    {"role": "assistant", "content": v}], "source": path})
            if n > per_lang:
                break
        used += n
    return out, chats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--chars", type=int, default=400_000, help="approximate size of the mixture")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    pydir = python_dir()
    code, code_chats = code_docs(pydir, int(a.chars * 0.35))
    prose = prose_docs(int(a.chars * 0.2))
    multi, multi_chats = multilingual_docs(int(a.chars * 0.15))
    rng = random.Random(a.seed)
    chats = code_chats + multi_chats
    rng.shuffle(chats)
    chat_budget, chosen, n = int(a.chars * 0.3), [], 0
    for c in chats:
        chosen.append(c)
        n += sum(len(m["content"]) for m in c["messages"])
        if n > chat_budget:
            break
    groups = {"code": code, "chat": chosen, "prose": prose, "multilingual": multi}
    for g in groups.values():
        rng.shuffle(g)
    # Interleave by size so that every prefix of the file has the target proportions.
    cursors = {k: 0 for k in groups}
    done_chars = {k: 0 for k in groups}
    size = lambda d: len(d["text"]) if "text" in d else sum(len(m["content"]) for m in d["messages"])
    total = {k: max(1, sum(size(d) for d in v)) for k, v in groups.items()}
    with open(a.out, "w", encoding="utf-8") as f:
        while any(cursors[k] < len(groups[k]) for k in groups):
            k = min((k for k in groups if cursors[k] < len(groups[k])), key=lambda k: done_chars[k] / total[k])
            d = groups[k][cursors[k]]
            cursors[k] += 1
            done_chars[k] += size(d)
            f.write(json.dumps({kk: vv for kk, vv in d.items() if kk != "source"}, ensure_ascii=False) + "\n")
    manifest = {
        "python": pydir,
        "chars": {k: sum(size(d) for d in v) for k, v in groups.items()},
        "documents": {k: len(v) for k, v in groups.items()},
        "licenses": {
            "code": "Python standard library (%s), PSF-2.0" % pydir,
            "chat": "derived from the code and multilingual sources (same licenses)",
            "prose": "license texts from /usr/share/common-licenses (base-files), verbatim copying permitted",
            "multilingual": "GLib message catalogs glib20.mo (libglib2.0-data), LGPL-2.1-or-later",
        },
    }
    with open(a.out + ".manifest.json", "w") as f:
        json.dump(manifest, f, indent=2)
    print(json.dumps(manifest["chars"]), file=sys.stderr)


if __name__ == "__main__":
    main()
