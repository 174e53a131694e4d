#!/usr/bin/env python3
"""Paired comparison of packs from one `spillway kl --per-position FILE` run (issue 6, end to end).

Input: the TSV kl writes (row, pos, then kl:NAME and agree:NAME per model Q; every Q on the same positions).
Output (markdown on stdout):
  - per pack: mean KL ± standard error, top-1 agreement, and, with --floor NAME, the mean KL above that pack's
    (the part the weight error adds on top of what no quantizer removes);
  - per pack also the median and the 90th / 99th percentile of the per-position KL: the mean is carried by its tail
    (on the demo model the top 10 % of positions hold most of it), and a quantizer can lower the typical position's
    KL while raising the tail's;
  - per pair A-B (--pair A,B ...): the mean paired difference KL(A) − KL(B) over the same positions, its standard
    error, a 95 % interval and t, and the difference in top-1 disagreements.
Standard errors are clustered by row: positions of one row share a context and are not independent, rows are
separate slices of the text. So se = sd(per-row mean of the difference) / sqrt(rows) (rows of equal length; the
per-position mean is the mean of the row means up to a last, shorter row, which is weighted by its length here).
Names: the part of the column name after the last '/' (e.g. /tmp/q/k3_cal → k3_cal) unless that is ambiguous.
Usage: paired_kl.py FILE.tsv [FILE.tsv ...] [--floor NAME] [--pair A,B ...]
"""
import argparse
import math
import sys


def load(paths):
    """One or more TSVs of the same packs (kl --shard I/N parts: rows are numbered globally)."""
    out = None
    for path in paths:
        part = load_one(path)
        if out is None:
            out = part
            continue
        if part[0] != out[0]:
            sys.exit(f"paired_kl: {path} has packs {part[0]}, expected {out[0]}")
        out[1].extend(part[1])
        for i in range(len(out[0])):
            out[2][i].extend(part[2][i])
            out[3][i].extend(part[3][i])
    return out


def load_one(path):
    with open(path) as f:
        head = f.readline().rstrip("\n").split("\t")
        cols = head[2:]
        names = [c.split(":", 1)[1].rstrip("/") for c in cols[0::2]]
        short = [n.rsplit("/", 1)[-1] for n in names]
        if len(set(short)) == len(short):
            names = short
        rows, kl, agree = [], [[] for _ in names], [[] for _ in names]
        for line in f:
            p = line.rstrip("\n").split("\t")
            rows.append(int(p[0]))
            for i in range(len(names)):
                kl[i].append(float(p[2 + 2 * i]))
                agree[i].append(int(p[3 + 2 * i]))
    return names, rows, kl, agree


def clustered(rows, x):
    """Mean of x over positions and its row-clustered standard error (weights = positions per row)."""
    by = {}
    for r, v in zip(rows, x):
        s = by.setdefault(r, [0.0, 0])
        s[0] += v
        s[1] += 1
    n = len(x)
    mean = sum(x) / n
    g = len(by)
    if g < 2:
        return mean, float("nan"), g
    # Ratio-estimator variance of a cluster sample: Σ (S_r − m·n_r)² · g / ((g − 1) · n²).
    var = sum((s - mean * c) ** 2 for s, c in by.values()) * g / ((g - 1) * n * n)
    return mean, math.sqrt(var), g


def quantile(x, q):
    """The q-quantile of x (nearest rank on the sorted values; x non-empty)."""
    s = sorted(x)
    return s[min(len(s) - 1, max(0, int(math.ceil(q * len(s))) - 1))]


def t975(dof):
    """97.5 % quantile of Student's t (table; conservative: the nearest tabulated dof at or below)."""
    table = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 15: 2.13,
             20: 2.09, 30: 2.04, 60: 2.00, 120: 1.98}
    below = [k for k in table if k <= dof]
    return table[max(below)] if below else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tsv", nargs="+")
    ap.add_argument("--floor", help="pack whose KL is the floor no quantizer removes (e.g. a K=8 pack)")
    ap.add_argument("--pair", action="append", default=[], help="A,B: paired KL(A) − KL(B)")
    a = ap.parse_args()
    names, rows, kl, agree = load(a.tsv)
    idx = {n: i for i, n in enumerate(names)}
    n = len(rows)
    fl = idx.get(a.floor) if a.floor else None
    if a.floor and fl is None:
        sys.exit(f"paired_kl: no pack {a.floor} in {names}")
    print(f"{n} predicted positions in {len(set(rows))} rows; standard errors clustered by row.\n")
    print("| pack | mean KL ± s.e. | median | 90th pct | 99th pct | top-1 agreement | disagreements |" +
          (" KL above the floor ± s.e. |" if fl is not None else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if fl is not None else ""))
    for i, nm in enumerate(names):
        m, se, _ = clustered(rows, kl[i])
        q = [quantile(kl[i], f) for f in (0.5, 0.9, 0.99)]
        line = (f"| {nm} | {m:.6f} ± {se:.6f} | {q[0]:.6f} | {q[1]:.6f} | {q[2]:.6f} | {100 * sum(agree[i]) / n:.2f} % | "
                f"{n - sum(agree[i])} |")
        if fl is not None:
            dm, dse, _ = clustered(rows, [x - y for x, y in zip(kl[i], kl[fl])])
            line += f" {dm:.6f} ± {dse:.6f} |"
        print(line)
    if a.pair:
        print("\n| pair A − B | mean ΔKL | s.e. | 95 % interval | t | ΔKL / KL(B) | Δ above the floor / (KL(B) − floor) | Δ disagreements |")
        print("|---|---|---|---|---|---|---|---|")
    for p in a.pair:
        x, y = p.split(",")
        if x not in idx or y not in idx:
            sys.exit(f"paired_kl: pair {p}: packs are {names}")
        d = [u - v for u, v in zip(kl[idx[x]], kl[idx[y]])]
        m, se, g = clustered(rows, d)
        mb = sum(kl[idx[y]]) / n
        rel_floor = "—"
        if fl is not None:
            above = mb - sum(kl[fl]) / n
            rel_floor = f"{100 * m / above:+.1f} %" if above > 0 else "—"
        tq = t975(g - 1)
        dis = (n - sum(agree[idx[x]])) - (n - sum(agree[idx[y]]))
        rel = f"{100 * m / mb:+.1f} %" if mb > 0 else "—"
        t = f"{m / se:+.1f}" if se > 0 else "—"
        print(f"| {x} − {y} | {m:+.6f} | {se:.6f} | [{m - tq * se:+.6f}, {m + tq * se:+.6f}] | {t} | {rel} | {rel_floor} | {dis:+d} |")


if __name__ == "__main__":
    main()
