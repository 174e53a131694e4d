#!/usr/bin/env python3
"""Static report of the CUDA kernels in built objects, without a GPU: per kernel its registers, stack
(spills), shared memory, SASS instruction count and commonest opcodes.

Why: the device time is scarce, and most kernel regressions show up statically: a spill, an occupancy
cliff from registers, or an inner loop that grew (the dense GEMV's per-chunk address math was ~65 SASS
instructions, found this way). Compare before/after a change with the same filter.

Usage:
  tools/profile/sass_report.sh BUILD_DIR [--filter SUBSTRING] [--objects PATTERN]
  tools/profile/sass_report.py --cuobjdump PATH OBJ_OR_DIR... [--filter SUBSTRING]
The .sh wrapper installs cuobjdump from PyPI (nvidia-cuda-cuobjdump) into .venv-sass when the CUDA
toolkit has none (the Debian/PyPI-only dev box ships nvcc and ptxas but not cuobjdump).
"""
from __future__ import annotations

import argparse
import collections
import pathlib
import re
import subprocess
import sys

FUNC_RE = re.compile(r"^\s*Function\s*:?\s*(\S+)")
RES_RE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
# One SASS instruction line: /*0123*/  [@P0 | @!P0 | @UP0]  OPCODE.MODS operands ;
INSTR_RE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sass_report: {' '.join(cmd[:2])} failed: {r.stderr.strip()[:300]}")
    return r.stdout


def demangle(names: list[str]) -> dict[str, str]:
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    short = {}
    for n, d in zip(names, out):
        d = re.sub(r"\(anonymous namespace\)::|spw::|densedev::|engine::|cuda::|exl3dev::", "", d)
        short[n] = d
    return short


def resources(cuobjdump: str, obj: pathlib.Path) -> dict[str, tuple[int, int, int, int]]:
    res, cur = {}, None
    for line in run([cuobjdump, "-res-usage", str(obj)]).splitlines():
        m = FUNC_RE.match(line)
        if m:
            cur = m.group(1).rstrip(":")
            continue
        m = RES_RE.search(line)
        if m and cur:
            res[cur] = tuple(int(g) for g in m.groups())
    return res


def opcodes(cuobjdump: str, obj: pathlib.Path) -> dict[str, collections.Counter]:
    ops, cur = {}, None
    for line in run([cuobjdump, "-sass", str(obj)]).splitlines():
        m = FUNC_RE.match(line)
        if m:
            cur = m.group(1)
            ops[cur] = collections.Counter()
            continue
        m = INSTR_RE.search(line)
        if m and cur:
            ops[cur][m.group(1)] += 1
    return ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="object files (.cu.o) or directories searched for *.cu.o")
    ap.add_argument("--cuobjdump", default="cuobjdump")
    ap.add_argument("--filter", default="", help="only kernels whose demangled name contains this")
    ap.add_argument("--top", type=int, default=8, help="opcodes listed per kernel")
    a = ap.parse_args()
    objs: list[pathlib.Path] = []
    for p in map(pathlib.Path, a.paths):
        objs += sorted(p.rglob("*.cu.o")) if p.is_dir() else [p]
    if not objs:
        sys.exit("sass_report: no .cu.o objects found (build the CUDA targets first)")
    print("| kernel | regs | stack B | local B | shared B | SASS instr | commonest opcodes |")
    print("|---|---|---|---|---|---|---|")
    for obj in objs:
        res, ops = resources(a.cuobjdump, obj), opcodes(a.cuobjdump, obj)
        names = demangle(sorted(res))
        for mangled in sorted(res, key=lambda n: names[n]):
            name = names[mangled]
            if a.filter not in name:
                continue
            reg, stack, shared, local = res[mangled]
            c = ops.get(mangled, collections.Counter())
            top = " ".join(f"{k}:{v}" for k, v in c.most_common(a.top))
            print(f"| `{name[:120]}` | {reg} | {stack} | {local} | {shared} | {sum(c.values())} | {top} |")


if __name__ == "__main__":
    main()
