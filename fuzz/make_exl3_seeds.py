#!/usr/bin/env python3
"""Seeds for fuzz_exl3_tensor: small safetensors files holding one EXL3 linear each (k = n = 128), valid and not.

    python3 fuzz/make_exl3_seeds.py fuzz/corpus/exl3_tensor

Standard library only (the format is an 8-byte little-endian header length, a JSON header, the data).
Trellis words are pseudo-random: any bit pattern is a valid trellis.
"""
import json
import os
import random
import struct
import sys

MUL1, MCG = 0x83DCD12D, 0xCBAC1FED


def safetensors(tensors):
    """tensors: list of (name, dtype, shape, bytes) -> file bytes (data 8-byte aligned per tensor)."""
    header, blobs, offset = {}, [], 0
    for name, dtype, shape, data in tensors:
        pad = (-offset) % 8
        blobs.append(b"\0" * pad + data)
        offset += pad
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def f16_ones(n, sign_seed):
    rng = random.Random(sign_seed)
    return b"".join(struct.pack("<H", 0xBC00 if rng.random() < 0.5 else 0x3C00) for _ in range(n))


def linear(prefix, k_x2, marker=None, marker_value=None, legacy=False, bias=None, seed=0):
    rng = random.Random(seed)
    words = 8 * k_x2
    trellis = bytes(rng.getrandbits(8) for _ in range(8 * 8 * words * 2))
    out = [(prefix + ".trellis", "I16", [8, 8, words], trellis)]
    if legacy:
        out += [(prefix + ".su", "I16", [8], bytes(rng.getrandbits(8) for _ in range(16))),
                (prefix + ".sv", "I16", [8], bytes(rng.getrandbits(8) for _ in range(16)))]
    else:
        out += [(prefix + ".suh", "F16", [128], f16_ones(128, seed + 1)),
                (prefix + ".svh", "F16", [128], f16_ones(128, seed + 2))]
    if marker:
        value = marker_value if marker_value is not None else (MUL1 if marker == "mul1" else MCG)
        out.append((prefix + "." + marker, "I32", [], struct.pack("<I", value)))
    if bias == "F16":
        out.append((prefix + ".bias", "F16", [128], f16_ones(128, seed + 3)))
    elif bias == "F32":
        out.append((prefix + ".bias", "F32", [128], struct.pack("<128f", *[0.25] * 128)))
    return out


SEEDS = {
    "k1_mul1.safetensors": linear("layers.0.ffn.experts.0.w1", 2, "mul1"),
    "k1_5_mul1.safetensors": linear("layers.0.ffn.experts.0.w2", 3, "mul1", seed=1),
    "k1_mcg_bias_f32.safetensors": linear("lin", 2, "mcg", bias="F32", seed=2),
    "k1_3inst_bias_f16.safetensors": linear("lin", 2, bias="F16", seed=3),
    "k1_legacy_signs.safetensors": linear("lin", 2, "mul1", legacy=True, seed=4),
    # rejected: a wrong multiplier, half-integer K without mul1, both markers
    "bad_marker_value.safetensors": linear("lin", 2, "mul1", marker_value=0x12345678, seed=5),
    "bad_half_k_mcg.safetensors": linear("lin", 3, "mcg", seed=6),
    "bad_both_markers.safetensors": linear("lin", 2, "mul1", seed=7) + [("lin.mcg", "I32", [], struct.pack("<I", MCG))],
}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus/exl3_tensor"
    os.makedirs(out_dir, exist_ok=True)
    for name, tensors in SEEDS.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(safetensors(tensors))
    print(f"{len(SEEDS)} seeds in {out_dir}")


if __name__ == "__main__":
    main()
