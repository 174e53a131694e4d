"""tools/quantize/paired_kl.py: the row-clustered statistics of the calibrated-vs-identity comparison.

A synthetic `kl --per-position` file (two shards, three packs) with known numbers: the per-pack means, the
clustered standard error (equal rows: sd of the row means / sqrt(rows)), the paired difference and its interval, and
the KL above the floor, recomputed here by hand.
"""
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools/quantize"))
import paired_kl  # noqa: E402

# rows × positions: KL of pack a, b and the floor f; agreement 1 except where noted.
ROWS = {
    0: ([0.010, 0.020, 0.030], [0.012, 0.024, 0.030], [0.001, 0.001, 0.001]),
    1: ([0.004, 0.006, 0.002], [0.006, 0.006, 0.003], [0.002, 0.002, 0.002]),
    2: ([0.050, 0.010, 0.030], [0.060, 0.010, 0.035], [0.001, 0.003, 0.002]),
    3: ([0.001, 0.002, 0.003], [0.001, 0.003, 0.003], [0.000, 0.001, 0.000]),
}


def write_shards(tmp_path):
    head = "row\tpos\tkl:/w/k3_a\tagree:/w/k3_a\tkl:/w/k3_b\tagree:/w/k3_b\tkl:/w/k8_f\tagree:/w/k8_f\n"
    paths = []
    for shard in (0, 1):
        p = tmp_path / f"pp_{shard}.tsv"
        lines = [head]
        for r in sorted(ROWS):
            if r % 2 != shard:
                continue
            a, b, f = ROWS[r]
            for i in range(3):
                agree_b = 0 if (r, i) == (2, 0) else 1
                lines.append(f"{r}\t{i}\t{a[i]}\t1\t{b[i]}\t{agree_b}\t{f[i]}\t1\n")
        p.write_text("".join(lines))
        paths.append(p)
    return paths


def test_load_joins_shards_and_shortens_names(tmp_path):
    names, rows, kl, agree = paired_kl.load([str(p) for p in write_shards(tmp_path)])
    assert names == ["k3_a", "k3_b", "k8_f"]
    assert sorted(rows) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert len(kl[0]) == 12 and sum(agree[1]) == 11


def test_clustered_se_equal_rows_is_sd_of_row_means():
    rows = [r for r in sorted(ROWS) for _ in range(3)]
    d = [x - y for r in sorted(ROWS) for x, y in zip(ROWS[r][0], ROWS[r][1])]
    m, se, g = paired_kl.clustered(rows, d)
    row_means = [sum(x - y for x, y in zip(ROWS[r][0], ROWS[r][1])) / 3 for r in sorted(ROWS)]
    mu = sum(row_means) / 4
    sd = math.sqrt(sum((v - mu) ** 2 for v in row_means) / 3)
    assert g == 4
    assert abs(m - mu) < 1e-15
    assert abs(se - sd / 2) < 1e-12


def test_table_numbers(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "tools/quantize/paired_kl.py"),
                          *[str(p) for p in write_shards(tmp_path)], "--floor", "k8_f", "--pair", "k3_a,k3_b"],
                         capture_output=True, text=True, check=True).stdout
    all_a = [x for r in sorted(ROWS) for x in ROWS[r][0]]
    all_b = [x for r in sorted(ROWS) for x in ROWS[r][1]]
    mean_d = (sum(all_a) - sum(all_b)) / 12
    assert "12 predicted positions in 4 rows" in out
    assert f"| k3_b | {sum(all_b) / 12:.6f}" in out
    assert "| k3_b |" in out and "| 91.67 % | 1 |" in out  # 11/12 agree, one disagreement
    rows = [r for r in sorted(ROWS) for _ in range(3)]
    _, se, _ = paired_kl.clustered(rows, [x - y for x, y in zip(all_a, all_b)])
    t975_3 = 3.18  # 4 rows: 3 degrees of freedom
    assert f"| k3_a − k3_b | {mean_d:+.6f} | {se:.6f} | [{mean_d - t975_3 * se:+.6f}, {mean_d + t975_3 * se:+.6f}] |" in out


def test_median_and_tail_columns(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "tools/quantize/paired_kl.py"),
                          *[str(p) for p in write_shards(tmp_path)], "--floor", "k8_f"],
                         capture_output=True, text=True, check=True).stdout
    b = sorted(x for r in sorted(ROWS) for x in ROWS[r][1])
    # nearest rank of 12 values: the median is the 6th smallest, the 90th and 99th percentiles the 11th and 12th
    assert f"| k3_b | {sum(b) / 12:.6f} ± " in out
    line = next(l for l in out.splitlines() if l.startswith("| k3_b |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2:5] == [f"{b[5]:.6f}", f"{b[10]:.6f}", f"{b[11]:.6f}"]
    assert paired_kl.quantile([3.0, 1.0, 2.0], 0.5) == 2.0
