"""Codecs for the DeepSeek-V4 / V4.1 *released* checkpoint formats (spec §2.1, §3).

Pure numpy (torch is optional and only used by `to_torch`). Everything here is
deterministic: same input bytes -> same output bytes.

Formats
-------
- FP8 e4m3fn : 1 sign, 4 exponent (bias 7), 3 mantissa bits; max 448, no inf,
  0x7F/0xFF = NaN. Encoding rounds to nearest, ties to even, and saturates to +-448.
- E8M0 (ue8m0): 1 byte b, value 2^(b-127); 0xFF = NaN.
- FP4 e2m1 (MXFP4 element): nibble = sign bit 3 + magnitude index into
  {0, 0.5, 1, 1.5, 2, 3, 4, 6}; round to nearest, ties to the even code.
- BF16: top 16 bits of an fp32, rounded to nearest even.
- Block-FP8 weight: q [out,in] e4m3 + scale [ceil(out/B), ceil(in/B)] e8m0,
  W[i,j] = e4m3(q[i,j]) * 2^(s[i//B, j//B]-127). B=128 (V4), 32 (V4.1).
- MXFP4 expert weight: I8 [out, in/2] (byte k = element 2k low nibble, 2k+1 high
  nibble) + E8M0 scale [out, in/32]; W[i,j] = e2m1(nib) * 2^(s[i, j//32]-127).

Safetensors writer: dtypes BF16, F32, I8, I64, F8_E4M3, F8_E8M0 (plus U8, I32,
F16); header written by hand (8-byte LE length, JSON, space padding to 8),
tensors sorted by name. One file, or N shards + model.safetensors.index.json.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

import numpy as np

# ----------------------------------------------------------------------------- FP8 e4m3fn

E4M3_MAX = 448.0


def _e4m3_table() -> np.ndarray:
    """float32[256]: value of every e4m3fn byte (NaN for 0x7F/0xFF)."""
    out = np.empty(256, dtype=np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            out[b] = np.nan
        elif e == 0:
            out[b] = s * (m / 8.0) * 2.0 ** -6
        else:
            out[b] = s * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return out


E4M3_TABLE = _e4m3_table()
_E4M3_POS = E4M3_TABLE[:127].astype(np.float64)  # codes 0..126, strictly increasing


def e4m3_decode(q: np.ndarray) -> np.ndarray:
    """uint8 e4m3fn bytes -> float32 values (exact)."""
    return E4M3_TABLE[np.asarray(q, dtype=np.uint8)]


def _rne_to_grid(mag: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Index of the nearest grid value to |x| (grid increasing, mag clipped to grid), ties -> even index."""
    mag = np.clip(mag, grid[0], grid[-1])
    hi = np.searchsorted(grid, mag, side="left")  # grid[hi] >= mag
    hi = np.clip(hi, 0, len(grid) - 1)
    lo = np.clip(hi - 1, 0, len(grid) - 1)
    dlo = mag - grid[lo]
    dhi = grid[hi] - mag
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    return np.where(pick_hi, hi, lo)


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """float -> uint8 e4m3fn: round to nearest even, saturate to +-448, NaN -> 0x7F, sign kept for -0."""
    x = np.asarray(x, dtype=np.float64)
    nan = np.isnan(x)
    mag = np.where(nan, 0.0, np.abs(x))
    code = _rne_to_grid(mag, _E4M3_POS).astype(np.uint8)
    code = code | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return np.where(nan, np.uint8(0x7F), code).astype(np.uint8)


# ----------------------------------------------------------------------------- E8M0

def e8m0_decode(b: np.ndarray) -> np.ndarray:
    """uint8 e8m0 bytes -> float32 2^(b-127) (0xFF -> NaN)."""
    b = np.asarray(b, dtype=np.uint8)
    v = np.ldexp(np.float32(1.0), b.astype(np.int32) - 127).astype(np.float32)
    return np.where(b == 0xFF, np.float32(np.nan), v)


def e8m0_encode_exponent(e: np.ndarray) -> np.ndarray:
    """int exponent e (value 2^e, -127 <= e <= 127) -> uint8 e8m0 byte e+127."""
    e = np.asarray(e, dtype=np.int64)
    if np.any(e < -127) or np.any(e > 127):
        raise ValueError("e8m0 exponent out of range")
    return (e + 127).astype(np.uint8)


def pow2_ceil_exponent(v: np.ndarray) -> np.ndarray:
    """int32 e with 2^e = pow2ceil(v), from the fp32 bit pattern (exponent-127, +1 if mantissa != 0); v > 0 normal."""
    bits = np.asarray(v, dtype=np.float32).view(np.uint32)
    e = ((bits >> 23) & 0xFF).astype(np.int32) - 127
    return e + ((bits & 0x7FFFFF) != 0).astype(np.int32)


# ----------------------------------------------------------------------------- FP4 e2m1

FP4_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
FP4_TABLE = np.concatenate([FP4_MAGNITUDES, -FP4_MAGNITUDES]).astype(np.float32)  # nibble -> value


def e2m1_decode(nib: np.ndarray) -> np.ndarray:
    """uint8 nibbles (0..15) -> float32 values: sign bit 3, magnitude index bits 0..2."""
    return FP4_TABLE[np.asarray(nib, dtype=np.uint8) & 0xF]


def e2m1_encode(x: np.ndarray) -> np.ndarray:
    """float -> uint8 nibble: round to nearest, ties to even code, saturate to +-6, sign bit for x<0 (incl. -0)."""
    x = np.asarray(x, dtype=np.float64)
    code = _rne_to_grid(np.abs(x), FP4_MAGNITUDES.astype(np.float64)).astype(np.uint8)
    return code | np.where(np.signbit(x), 8, 0).astype(np.uint8)


def pack_fp4(nibbles: np.ndarray) -> np.ndarray:
    """uint8 nibbles [..., 2n] -> int8 bytes [..., n]: element 2k low nibble, 2k+1 high nibble."""
    nib = np.asarray(nibbles, dtype=np.uint8)
    assert nib.shape[-1] % 2 == 0
    b = (nib[..., 0::2] & 0xF) | ((nib[..., 1::2] & 0xF) << 4)
    return b.astype(np.uint8).view(np.int8)


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    """int8/uint8 bytes [..., n] -> uint8 nibbles [..., 2n] (low nibble first)."""
    b = np.asarray(packed).view(np.uint8)
    out = np.empty(b.shape[:-1] + (b.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = b & 0xF
    out[..., 1::2] = b >> 4
    return out


# ----------------------------------------------------------------------------- BF16

def bf16_encode(x: np.ndarray) -> np.ndarray:
    """float32 -> uint16 bf16 bits, round to nearest even (NaN stays NaN)."""
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    out = r.astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), out)


def bf16_decode(u: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits -> float32 (exact)."""
    return (np.asarray(u, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> float32 rounded to the nearest bf16 value."""
    return bf16_decode(bf16_encode(x))


# ----------------------------------------------------------------------------- block quantizers

def quantize_fp8_block(w: np.ndarray, block: int = 128):
    """float [out,in] -> (q uint8 e4m3 [out,in], s uint8 e8m0 [ceil(out/B),ceil(in/B)], W_eff float32):
    per BxB block s = pow2ceil(max(amax,1e-4)/448), q = e4m3_rne(w/s), W_eff = e4m3(q)*2^(s-127)."""
    w = np.asarray(w, dtype=np.float32)
    out_f, in_f = w.shape
    nb_o, nb_i = -(-out_f // block), -(-in_f // block)
    pad = np.zeros((nb_o * block, nb_i * block), dtype=np.float32)
    pad[:out_f, :in_f] = w
    blocks = pad.reshape(nb_o, block, nb_i, block)
    amax = np.abs(blocks).max(axis=(1, 3))
    amax = np.maximum(amax, np.float32(1e-4)).astype(np.float32)
    e = pow2_ceil_exponent(amax * np.float32(1.0 / E4M3_MAX))
    s = e8m0_encode_exponent(e)
    scale = np.ldexp(np.float32(1.0), e).astype(np.float32)
    full_scale = np.repeat(np.repeat(scale, block, axis=0), block, axis=1)[:out_f, :in_f]
    q = e4m3_encode(w / full_scale)
    w_eff = (e4m3_decode(q) * full_scale).astype(np.float32)
    return q, s, w_eff


def dequantize_fp8_block(q: np.ndarray, s: np.ndarray, block: int = 128) -> np.ndarray:
    """(q uint8 e4m3 [out,in], s uint8 e8m0 [ceil(out/B),ceil(in/B)]) -> float32 W[i,j] = e4m3(q)*2^(s[i//B,j//B]-127)."""
    out_f, in_f = q.shape
    scale = e8m0_decode(s)
    full = np.repeat(np.repeat(scale, block, axis=0), block, axis=1)[:out_f, :in_f]
    return (e4m3_decode(q) * full).astype(np.float32)


def quantize_mxfp4(w: np.ndarray, block: int = 32):
    """float [out,in] -> (packed int8 [out,in/2], s uint8 e8m0 [out,in/32], W_eff float32):
    per 1x32 block s = pow2ceil(max(amax, 6*2^-126)/6), nib = e2m1_rne(w/s), W_eff = e2m1(nib)*2^(s-127)."""
    w = np.asarray(w, dtype=np.float32)
    out_f, in_f = w.shape
    assert in_f % block == 0, "MXFP4 needs in % 32 == 0"
    blocks = w.reshape(out_f, in_f // block, block)
    amax = np.maximum(np.abs(blocks).max(axis=2), np.float32(6.0 * 2.0 ** -126)).astype(np.float32)
    e = pow2_ceil_exponent(amax * np.float32(1.0 / 6.0))
    s = e8m0_encode_exponent(e)
    scale = np.ldexp(np.float32(1.0), e).astype(np.float32)
    nib = e2m1_encode(blocks / scale[..., None]).reshape(out_f, in_f)
    w_eff = (e2m1_decode(nib).reshape(out_f, in_f // block, block) * scale[..., None]).reshape(out_f, in_f)
    return pack_fp4(nib), s, w_eff.astype(np.float32)


def dequantize_mxfp4(packed: np.ndarray, s: np.ndarray, block: int = 32) -> np.ndarray:
    """(packed int8 [out,in/2], s uint8 e8m0 [out,in/32]) -> float32 W[i,j] = e2m1(nib[i,j])*2^(s[i,j//32]-127)."""
    nib = unpack_fp4(packed)
    out_f, in_f = nib.shape
    v = e2m1_decode(nib).reshape(out_f, in_f // block, block) * e8m0_decode(s)[..., None]
    return v.reshape(out_f, in_f).astype(np.float32)


# ----------------------------------------------------------------------------- safetensors

# dtype name -> (numpy storage dtype, bytes per element)
ST_DTYPES = {
    "BF16": (np.uint16, 2),
    "F16": (np.float16, 2),
    "F32": (np.float32, 4),
    "I8": (np.int8, 1),
    "U8": (np.uint8, 1),
    "I32": (np.int32, 4),
    "I64": (np.int64, 8),
    "F8_E4M3": (np.uint8, 1),
    "F8_E8M0": (np.uint8, 1),
}


@dataclass(frozen=True)
class STensor:
    """A tensor tagged with its safetensors dtype; `data` is the raw storage array (BF16 as uint16 bits, F8 as uint8)."""

    dtype: str
    data: np.ndarray


def st_bf16(x) -> STensor:
    """float array -> BF16 STensor (round to nearest even)."""
    return STensor("BF16", bf16_encode(np.asarray(x, dtype=np.float32)))


def st_f32(x) -> STensor:
    """float array -> F32 STensor."""
    return STensor("F32", np.asarray(x, dtype=np.float32))


def st_i64(x) -> STensor:
    """int array -> I64 STensor."""
    return STensor("I64", np.asarray(x, dtype=np.int64))


def _as_stensor(v) -> STensor:
    """Accept STensor, numpy (F32/F16/I8/U8/I32/I64 by dtype) or torch tensor (incl. bf16 / float8)."""
    if isinstance(v, STensor):
        return v
    if isinstance(v, np.ndarray):
        m = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int8): "I8",
             np.dtype(np.uint8): "U8", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}
        if v.dtype not in m:
            raise TypeError(f"numpy dtype {v.dtype} needs an explicit STensor tag")
        return STensor(m[v.dtype], v)
    import torch  # optional

    t = v.detach().cpu().contiguous()
    tm = {torch.bfloat16: ("BF16", torch.uint16 if hasattr(torch, "uint16") else torch.int16),
          torch.float8_e4m3fn: ("F8_E4M3", torch.uint8), torch.float8_e8m0fnu: ("F8_E8M0", torch.uint8)}
    if t.dtype in tm:
        name, view = tm[t.dtype]
        return STensor(name, t.view(view).numpy().view(ST_DTYPES[name][0]))
    return _as_stensor(t.numpy())


def _header_bytes(entries: dict, metadata: dict | None) -> bytes:
    hdr = {}
    if metadata:
        hdr["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hdr.update(entries)
    raw = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
    raw += b" " * ((-len(raw)) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_safetensors(path: str, tensors: dict, metadata: dict | None = None) -> int:
    """Write {name: STensor|ndarray|torch.Tensor} to one safetensors file (names sorted); returns data bytes."""
    items = sorted((k, _as_stensor(v)) for k, v in tensors.items())
    entries, blobs, off = {}, [], 0
    for name, st in items:
        if st.dtype not in ST_DTYPES:
            raise ValueError(f"unsupported dtype {st.dtype}")
        npdt, size = ST_DTYPES[st.dtype]
        arr = np.ascontiguousarray(st.data)
        if arr.dtype.itemsize != size:
            raise TypeError(f"{name}: storage itemsize {arr.dtype.itemsize} != {size} for {st.dtype}")
        b = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        entries[name] = {"dtype": st.dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(_header_bytes(entries, metadata))
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    return off


def read_safetensors(path: str):
    """Read a safetensors file -> ({name: STensor}, metadata dict); BF16 as uint16 bits, F8 as uint8."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
        data = f.read()
    meta = hdr.pop("__metadata__", {}) or {}
    out = {}
    for name, e in hdr.items():
        npdt, _ = ST_DTYPES[e["dtype"]]
        a, b = e["data_offsets"]
        out[name] = STensor(e["dtype"], np.frombuffer(data[a:b], dtype=np.dtype(npdt).newbyteorder("<"))
                            .reshape(e["shape"]).copy())
    return out, meta


def stensor_to_float32(st: STensor) -> np.ndarray:
    """Decode a float-typed STensor (BF16/F16/F32/F8_E4M3/F8_E8M0) to float32 values."""
    if st.dtype == "BF16":
        return bf16_decode(st.data)
    if st.dtype == "F8_E4M3":
        return e4m3_decode(st.data)
    if st.dtype == "F8_E8M0":
        return e8m0_decode(st.data)
    return np.asarray(st.data, dtype=np.float32)


def _nbytes(st: STensor) -> int:
    return int(np.asarray(st.data).size * ST_DTYPES[st.dtype][1])


def write_checkpoint(out_dir: str, tensors: dict, n_shards: int = 1, prefix: str = "",
                     metadata: dict | None = None) -> list[str]:
    """Write a checkpoint dir: model.safetensors (n_shards=1) or model-0000i-of-0000N.safetensors shards +
    model.safetensors.index.json {"metadata": {total_size,...}, "weight_map": {name: shard}}; names get `prefix`.
    Tensors are assigned to shards in sorted-name order, cutting at equal byte fractions. Returns file names."""
    os.makedirs(out_dir, exist_ok=True)
    items = sorted((prefix + k, _as_stensor(v)) for k, v in tensors.items())
    if n_shards <= 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), dict(items), {"format": "pt"})
        return ["model.safetensors"]
    total = sum(_nbytes(st) for _, st in items)
    names = [f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors" for i in range(n_shards)]
    groups = [dict() for _ in range(n_shards)]
    acc = 0
    for name, st in items:
        idx = min(n_shards - 1, (acc * n_shards) // max(total, 1))
        groups[idx][name] = st
        acc += _nbytes(st)
    weight_map = {}
    for fname, g in zip(names, groups):
        write_safetensors(os.path.join(out_dir, fname), g, {"format": "pt"})
        for k in g:
            weight_map[k] = fname
    meta = {"total_size": total}
    if metadata:
        meta.update(metadata)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": meta, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")
    return names + ["model.safetensors.index.json"]


def read_checkpoint(ckpt_dir: str, prefix: str = "") -> dict:
    """Read a checkpoint dir (single file or index + shards) -> {name without prefix: STensor}."""
    idx = os.path.join(ckpt_dir, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx)
             else ["model.safetensors"])
    out = {}
    for fn in files:
        t, _ = read_safetensors(os.path.join(ckpt_dir, fn))
        for k, v in t.items():
            out[k[len(prefix):] if prefix and k.startswith(prefix) else k] = v
    return out


def to_torch(st: STensor):
    """STensor -> torch tensor of the matching torch dtype (bf16, float8_e4m3fn, float8_e8m0fnu, ...)."""
    import torch

    a = np.ascontiguousarray(st.data)
    if st.dtype == "BF16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if st.dtype == "F8_E4M3":
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    if st.dtype == "F8_E8M0":
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e8m0fnu)
    return torch.from_numpy(a)
