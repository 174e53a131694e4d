#!/usr/bin/env python3
"""Per-cell median of several bench_exl3_cpu outputs (the same binary run back to back).

    python3 bench/exl3/bench_median.py run1.md run2.md run3.md

Prints, for each section of the bench and each row (tensor, K, codebook, shape, m), the median µs over
the runs and the spread (min–max), so a table quoted from them is not one noisy run's.
"""
import re
import statistics
import sys


def parse(path):
    cells, section = {}, None
    for line in open(path, encoding="utf-8"):
        if line.startswith("## "):
            section = line[3:].strip()
        m = re.match(r"\| (\S+) \| (\d+) \| (\w+) \| (\d+x\d+) \| (\d+) \| (\d+) \|", line)
        if m and section:
            cells[(section,) + m.groups()[:5]] = int(m.group(6))
        m = re.match(r"\| (\d+) × (\d+)( \([^)]*\))? \| (\d+) \|", line)
        if m and section:
            variant = (m.group(3) or "").strip(" ()")
            cells[(section, "moe" + (" " + variant if variant else ""), m.group(1), m.group(2))] = int(m.group(4))
    return cells


def main():
    runs = [parse(p) for p in sys.argv[1:]]
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    for k in keys:
        vals = [r[k] for r in runs]
        print(" | ".join(k) + f" | median {statistics.median(vals):.0f} | {min(vals)}–{max(vals)}")


if __name__ == "__main__":
    main()
