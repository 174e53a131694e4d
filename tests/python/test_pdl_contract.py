"""The contract of src/cuda/launch.h, checked on the sources.

Kernels launched with programmatic dependent launch start while the previous kernel of the stream still
runs; one that reads its inputs before griddepcontrol.wait races with their producer, and the race shows
only now and then. So every __global__ function in a file that includes cuda/launch.h must call
pdl_wait() or pdl_enter() in its body (a kernel that is never launched through launch.h is exempt only
by living in a file that does not include it).
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
WAITS = re.compile(r"\bpdl_(wait|enter)\s*\(")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def kernels(text):
    """(name, body) of every __global__ function definition."""
    out = []
    for m in re.finditer(r"__global__", text):
        brace, semi = text.find("{", m.end()), text.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            continue  # a declaration
        # The name stands before the parameter list: the last parenthesised group before the body
        # (__launch_bounds__(...) and __cluster_dims__(...) come earlier).
        head = text[m.end():brace]
        close = head.rindex(")")
        depth, open_ = 0, close
        while True:
            depth += {")": 1, "(": -1}.get(head[open_], 0)
            if depth == 0:
                break
            open_ -= 1
        name = re.findall(r"[A-Za-z_]\w*", head[:open_])[-1]
        depth, i = 0, brace
        while True:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        out.append((name, text[brace:i + 1]))
    return out


def launch_files():
    for path in sorted((ROOT / "src").rglob("*")):
        if path.suffix in (".cu", ".cuh") and '#include "cuda/launch.h"' in path.read_text():
            yield path


def test_files_using_launch_h_exist():
    files = [p.relative_to(ROOT).as_posix() for p in launch_files()]
    # The decode path's kernel files; if one stops including launch.h this test should be revisited.
    for must in ("src/cuda/dense/dense_gemv.cu", "src/cuda/ops/norm.cu", "src/cuda/attn/sparse_attn.cu",
                 "src/cuda/exl3_moe.cu", "src/engine/engine_kernels.cu"):
        assert must in files


def test_every_kernel_waits_for_its_inputs():
    missing = []
    n = 0
    for path in launch_files():
        for name, body in kernels(strip_comments(path.read_text())):
            n += 1
            if not WAITS.search(body):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert n >= 40, f"only {n} kernels found: the parser no longer sees them"
    assert not missing, "kernels without pdl_wait()/pdl_enter() in files that launch with PDL:\n" + "\n".join(missing)


def test_parser_sees_a_missing_wait():
    src = """
    __global__ void good(const float* x) { pdl_enter(); }
    template <int N> __global__ void __launch_bounds__(128) bad(float* y) { y[0] = N; }
    __global__ void declared(int);
    """
    found = {name: bool(WAITS.search(body)) for name, body in kernels(strip_comments(src))}
    assert found == {"good": True, "bad": False}
