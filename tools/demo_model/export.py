"""Export a trained DemoV41 to the released V4.1 checkpoint format (spec §1.2, §2.1, §2.3).

model.safetensors ("model."-prefixed names like tests/golden/fixtures/v41): FP8 e4m3 + 32x32 ue8m0 scales
for the dense projections, MXFP4 (I8 + ue8m0 per 32) routed experts, BF16 embed/head/norms/router/
compressor/indexer wk+weights_proj/Engram q,k weights, F32 attn_sink/hc_*/gate.bias/bias_vl, Engram
tables FP8 with one ue8m0 scale per row block of 32.  Quantizers: tools/golden/release_format.py.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden"))
import release_format as rf  # noqa: E402


def release_tensors(model) -> dict:
    T = {}
    sd = {k.replace("__", "."): v.detach().float().cpu().numpy() for k, v in model.params.items()}
    for name, w in sd.items():
        kind = model.kinds[name]
        base = name[: -len(".weight")] if name.endswith(".weight") else name
        if kind == "fp4":  # stacked experts [E, out, in] -> experts.{e}.wN
            pfx, wn = name.rsplit(".", 1)
            for e in range(w.shape[0]):
                p, s, _ = rf.quantize_mxfp4(w[e], 32)
                T[f"{pfx}.{e}.{wn}.weight"] = rf.STensor("I8", p)
                T[f"{pfx}.{e}.{wn}.scale"] = rf.STensor("F8_E8M0", s)
        elif kind == "fp8":
            q, s, _ = rf.quantize_fp8_block(w, 32)
            T[base + ".weight"] = rf.STensor("F8_E4M3", q)
            T[base + ".scale"] = rf.STensor("F8_E8M0", s)
        elif kind == "fp8rows":
            rows, hd = w.shape
            tab = w.reshape(rows, hd // 32, 32)
            amax = np.maximum(np.abs(tab).max(-1), np.float32(1e-4)).astype(np.float32)
            ex = rf.pow2_ceil_exponent(amax * np.float32(1.0 / 448.0))
            q = rf.e4m3_encode(tab / np.ldexp(np.float32(1.0), ex)[..., None].astype(np.float32))
            T[base + ".weight"] = rf.STensor("F8_E4M3", q.reshape(rows, hd))
            T[base + ".scale"] = rf.STensor("F8_E8M0", rf.e8m0_encode_exponent(ex))
        elif kind == "bf16":
            T[name] = rf.st_bf16(w)
        else:
            T[name] = rf.st_f32(w)
    for L in range(model.L):
        b = getattr(model, f"gate_bias_{L}").detach().float().cpu().numpy()
        T[f"layers.{L}.ffn.gate.bias"] = rf.st_f32(b)
        T[f"layers.{L}.ffn.gate.bias_vl"] = rf.st_f32(b)  # no image training: image tokens route like text
    return T


def export(model, cfg: dict, token_map: np.ndarray, out_dir: str, metadata: dict | None = None, n_shards: int = 1):
    """n_shards > 1 writes model-0000i-of-0000N.safetensors + index (files small enough to travel); merge()
    turns them into the single model.safetensors."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    rf.write_safetensors(os.path.join(out_dir, "engram_token_map.safetensors"),
                         {"engram_token_map": rf.STensor("I32", token_map.astype(np.int32))}, {"format": "pt"})
    md = {"format": "pt"}
    md.update(metadata or {})
    T = release_tensors(model)
    if n_shards > 1:  # greedy packing in name order, every file <= 12 MiB (the device's $OUT takes <= 16 MiB)
        groups, cur, size = [], {}, 0
        for name in sorted(T):
            nb = int(np.asarray(T[name].data).nbytes)
            if cur and size + nb > 12 * 2 ** 20:
                groups.append(cur)
                cur, size = {}, 0
            cur["model." + name] = T[name]
            size += nb
        groups.append(cur)
        wmap = {}
        for i, g in enumerate(groups):
            fn = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
            rf.write_safetensors(os.path.join(out_dir, fn), g, md)
            wmap.update({k: fn for k in g})
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": dict(sorted(wmap.items()))}, f, indent=1)
        return T
    rf.write_safetensors(os.path.join(out_dir, "model.safetensors"), {"model." + k: v for k, v in T.items()}, md)
    return T


def merge(shard_dir: str, out_dir: str, metadata: dict):
    """Shards (+ index) -> one model.safetensors (same tensors, names sorted, `metadata` in the header)."""
    import glob
    T = {}
    for fn in sorted(glob.glob(os.path.join(shard_dir, "model-*-of-*.safetensors"))):
        T.update(rf.read_safetensors(fn)[0])
    md = {"format": "pt"}
    md.update(metadata)
    rf.write_safetensors(os.path.join(out_dir, "model.safetensors"), T, md)
    return len(T)


if __name__ == "__main__":
    # python tools/demo_model/export.py merge <shard_dir> <out_dir> [seed steps]
    assert sys.argv[1] == "merge"
    extra = dict(zip(("seed", "steps"), sys.argv[4:6]))
    print(merge(sys.argv[2], sys.argv[3], extra), "tensors")
