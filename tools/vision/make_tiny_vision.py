#!/usr/bin/env python3
"""Writes a tiny random DeepSeek-V4.1-style vision tower and the oracle outputs the C++ CPU reference
(src/vision/vision_tower.*) is tested against (tests/unit/test_vision_tower.cpp).

Outputs, under tests/unit/data/vision/ by default:
  tiny_tower/config.json         nested HF form: vision_config plus text_config.hidden_size
  tiny_tower/model.safetensors   every vision.* / aligner.* / image_* tensor, BF16 (as released)
  tower_goldens.safetensors      per image k: patches_k BF16 [n, 3, 14, 14] (the processor's format:
                                 (x/255 - 0.5)/0.5 of random 8-bit pixels, rounded to BF16),
                                 grid_k I32 [2] = (n_vit_h, n_vit_w), vit_k F32 [n, d] and
                                 aligner_k F32 [ceil(n_h/3) * ceil(n_w/3), d_llm]

The oracle is this file's own numpy transcription of specs/deepseek-v4.md §5.6, computed in float64
from the BF16-rounded weights and patches, written with whole-array operations (matrix products,
reshape/transpose for the unfold) rather than the C++ loops, so the two share no code.

Tiny shapes: hidden 64, 2 layers, 4 heads of 16, intermediate 64, LLM width 32, patch 14, ratio 3.
The spec's RoPE (d_head 64: 16 frequencies 10000^(-2i/32), 16 row slots then 16 column slots, each
slot j paired with j + 32 in the rotate-half convention) generalises as: the rotated half is
d_head/2 slots, n_freq = d_head/4, f_i = theta^(-2i/(d_head/2)); slots [0, n_freq) turn by row·f_i,
[n_freq, 2·n_freq) by col·f_i. For d_head 16: 4 frequencies 10000^(-2i/8).

Cross-check against a public port (lightseekorg/tokenspeed deepseek_v41_vision.py, read, not copied):
it agrees with the spec on every detail checked here: RMSNorm eps 1e-6 (norm weights kept in f32);
rope_dim = d_head/2 with inv_freq = theta^(-arange(0, rope_dim, 2)/rope_dim), angles laid out
[row·f, col·f] and rotated with chunk(2) (rotate-half over the whole head); fused wqkv / wo with
biases; w1 chunked into (gate, up) with silu(gate)·up, no MLP biases; aligner = zero-pad right and
bottom, F.unfold(ratio, stride=ratio) (channel-major features c·r² + i·r + j, cells row-major), then
w2(gelu(w1 x)) with torch's default exact-erf GELU. No disagreement with the spec was found.

Needs numpy only. Run: .venv-test/bin/python tools/vision/make_tiny_vision.py
"""
import argparse
import json
import math
import pathlib
import struct

import numpy as np

SEED = 20260407
D_MODEL, N_LAYERS, N_HEADS, D_INTER, D_LLM = 64, 2, 4, 64, 32
PATCH, RATIO, THETA, EPS = 14, 3, 10000.0, 1e-6
GRIDS = [(4, 5), (3, 3), (7, 2)]  # (n_vit_h, n_vit_w): padded both ways, exact, one column cell


def to_bf16_bits(x):
    """Round-to-nearest-even f32 -> BF16 bits."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, numpy array already in that dtype)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def make_weights(rng):
    """Random weights as BF16 bits, by checkpoint name."""
    n_in = 3 * PATCH * PATCH

    def normal(shape, std):
        return to_bf16_bits(rng.standard_normal(shape) * std)

    w = {
        "vision.patch_embed.proj.weight": normal((D_MODEL, n_in), 2.0 / math.sqrt(n_in)),
        "vision.patch_embed.proj.bias": normal((D_MODEL,), 0.1),
    }
    for b in range(N_LAYERS):
        p = f"vision.blocks.{b}."
        w[p + "norm1.weight"] = to_bf16_bits(1.0 + 0.1 * rng.standard_normal(D_MODEL))
        w[p + "norm2.weight"] = to_bf16_bits(1.0 + 0.1 * rng.standard_normal(D_MODEL))
        w[p + "attn.wqkv.weight"] = normal((3 * D_MODEL, D_MODEL), 1.5 / math.sqrt(D_MODEL))
        w[p + "attn.wqkv.bias"] = normal((3 * D_MODEL,), 0.1)
        w[p + "attn.wo.weight"] = normal((D_MODEL, D_MODEL), 1.0 / math.sqrt(D_MODEL))
        w[p + "attn.wo.bias"] = normal((D_MODEL,), 0.1)
        w[p + "mlp.w1.weight"] = normal((2 * D_INTER, D_MODEL), 1.0 / math.sqrt(D_MODEL))
        w[p + "mlp.w2.weight"] = normal((D_MODEL, D_INTER), 1.0 / math.sqrt(D_INTER))
    w["vision.norm.weight"] = to_bf16_bits(1.0 + 0.1 * rng.standard_normal(D_MODEL))
    w["aligner.w1.weight"] = normal((D_LLM, RATIO * RATIO * D_MODEL), 1.0 / math.sqrt(RATIO * RATIO * D_MODEL))
    w["aligner.w1.bias"] = normal((D_LLM,), 0.1)
    w["aligner.w2.weight"] = normal((D_LLM, D_LLM), 1.0 / math.sqrt(D_LLM))
    w["aligner.w2.bias"] = normal((D_LLM,), 0.1)
    for name in ("image_start", "image_end", "image_newline"):
        w[name] = normal((D_LLM,), 1.0)
    return w


# ---- the oracle (float64) ----

def rms_norm(x, weight):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * weight


def rope_tables(n_h, n_w, d_head):
    """cos, sin [n, d_head]: angle of slot s is that of s mod d_head/2 (rotate-half pairs)."""
    n_freq = d_head // 4
    freq = THETA ** (-2.0 * np.arange(n_freq) / (d_head // 2))
    rows, cols = np.meshgrid(np.arange(n_h), np.arange(n_w), indexing="ij")
    angle = np.concatenate([rows.reshape(-1, 1) * freq, cols.reshape(-1, 1) * freq], axis=1)  # [n, d_head/2]
    angle = np.concatenate([angle, angle], axis=1)
    return np.cos(angle), np.sin(angle)


def rotate(x, cos, sin):
    """x [n_heads, n, d_head]: x·cos + rotate_half(x)·sin, rotate_half(a | b) = (-b | a)."""
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def vit(w, patches, n_h, n_w):
    n = n_h * n_w
    d_head = D_MODEL // N_HEADS
    x = patches.reshape(n, -1) @ w["vision.patch_embed.proj.weight"].T + w["vision.patch_embed.proj.bias"]
    cos, sin = rope_tables(n_h, n_w, d_head)
    for b in range(N_LAYERS):
        p = f"vision.blocks.{b}."
        h = rms_norm(x, w[p + "norm1.weight"])
        qkv = h @ w[p + "attn.wqkv.weight"].T + w[p + "attn.wqkv.bias"]
        q, k, v = (t.reshape(n, N_HEADS, d_head).transpose(1, 0, 2) for t in np.split(qkv, 3, axis=1))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        logits = q @ k.transpose(0, 2, 1) / math.sqrt(d_head)
        prob = np.exp(logits - logits.max(axis=-1, keepdims=True))
        prob /= prob.sum(axis=-1, keepdims=True)
        attn = (prob @ v).transpose(1, 0, 2).reshape(n, D_MODEL)
        x = x + attn @ w[p + "attn.wo.weight"].T + w[p + "attn.wo.bias"]
        h = rms_norm(x, w[p + "norm2.weight"])
        gate, up = np.split(h @ w[p + "mlp.w1.weight"].T, 2, axis=1)
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "mlp.w2.weight"].T
    return rms_norm(x, w["vision.norm.weight"])


def aligner(w, x, n_h, n_w):
    r = RATIO
    H, W = -(-n_h // r) * r, -(-n_w // r) * r
    grid = np.zeros((H, W, D_MODEL))
    grid[:n_h, :n_w] = x.reshape(n_h, n_w, D_MODEL)
    # [cy, i, cx, j, c] -> [cy, cx, c, i, j]: cells row-major, features channel-major
    cells = grid.reshape(H // r, r, W // r, r, D_MODEL).transpose(0, 2, 4, 1, 3).reshape(-1, D_MODEL * r * r)
    h = cells @ w["aligner.w1.weight"].T + w["aligner.w1.bias"]
    h = 0.5 * h * (1.0 + np.vectorize(math.erf)(h / math.sqrt(2.0)))
    return h @ w["aligner.w2.weight"].T + w["aligner.w2.bias"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=pathlib.Path,
                    default=pathlib.Path(__file__).resolve().parents[2] / "tests/unit/data/vision")
    out = ap.parse_args().out
    rng = np.random.default_rng(SEED)
    weights = make_weights(rng)

    model_dir = out / "tiny_tower"
    model_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "deepseek_v41",
        "image_token_id": 129264,
        "text_config": {"hidden_size": D_LLM},
        "vision_config": {
            "model_type": "deepseek_v41_vision", "num_hidden_layers": N_LAYERS, "hidden_size": D_MODEL,
            "num_attention_heads": N_HEADS, "intermediate_size": D_INTER, "patch_size": PATCH,
            "rope_theta": THETA, "downsample_ratio": RATIO, "max_image_tokens": 1024,
            "min_pixels": 3136, "max_wh_ratio": None,
        },
    }
    (model_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(model_dir / "model.safetensors", {k: ("BF16", v) for k, v in weights.items()})

    w64 = {k: from_bf16_bits(v).astype(np.float64) for k, v in weights.items()}
    goldens = {}
    for k, (n_h, n_w) in enumerate(GRIDS):
        pixels = rng.integers(0, 256, size=(n_h * n_w, 3, PATCH, PATCH))
        patches = to_bf16_bits((pixels / 255.0 - 0.5) / 0.5)
        x = vit(w64, from_bf16_bits(patches).astype(np.float64), n_h, n_w)
        y = aligner(w64, x, n_h, n_w)
        goldens[f"patches_{k}"] = ("BF16", patches)
        goldens[f"grid_{k}"] = ("I32", np.array([n_h, n_w], dtype=np.int32))
        goldens[f"vit_{k}"] = ("F32", x.astype(np.float32))
        goldens[f"aligner_{k}"] = ("F32", y.astype(np.float32))
        print(f"image {k}: grid {n_h}x{n_w}, vit |max| {np.abs(x).max():.3f}, aligner |max| {np.abs(y).max():.3f}")
    write_safetensors(out / "tower_goldens.safetensors", goldens)


if __name__ == "__main__":
    main()
