#!/usr/bin/env python3
"""Goldens for the C++ image processor (src/vision) from the DeepSeek-V4.1 reference processor.

Writes
  tests/unit/data/vision/processor_goldens.json  the reference processor on 20 synthetic images
  tests/unit/data/vision/decode/*                 tiny image files encoded by Pillow (and one PNG
                                                  written by hand, 16-bit RGB, which Pillow cannot
                                                  write)
  tests/unit/data/vision/decode_goldens.json      what Pillow's Image.open(...).convert("RGB") makes
                                                  of each, byte for byte

The processor below is a transcription of inference/image_processor.py of
huggingface.co/deepseek-ai/DeepSeek-V4.1-Flash @ dba1be0a40aa45a94ad051997016db3960a90277
(plan_image_grid, llm_grid, solve_resize_ratio, safe_resize, num_image_tokens, load_image) with
numpy in place of torch: the resize and padding are Pillow's own (ImageOps.pad), the bf16 cast is
round-to-nearest-even as torch's .to(torch.bfloat16).

The synthetic images are an integer formula (synth_image) that the C++ test evaluates too, so no
input image is stored; each golden keeps the canvas's FNV-1a-64 hash, per-channel sums, 64 sampled
pixels and 32 sampled bf16 patch values.

Needs Pillow and numpy (tools/vision/requirements.txt). Usage: tools/vision/make_processor_goldens.py
"""

import io
import json
import math
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "unit" / "data" / "vision"

# vision_config of DeepSeek-V4.1-Flash (specs §1.2), and two small variants that reach the
# solve_resize_ratio and max_wh_ratio branches with small images.
RELEASED = dict(patch_size=14, downsample_ratio=3, max_image_tokens=1024, min_pixels=295936, max_wh_ratio=None)
SMALL = dict(patch_size=14, downsample_ratio=3, max_image_tokens=64, min_pixels=0, max_wh_ratio=None)
WIDE = dict(patch_size=14, downsample_ratio=2, max_image_tokens=100, min_pixels=40000, max_wh_ratio=2.0)

CASES = [  # (width, height, seed, config)
    (1, 1, 1, RELEASED), (3, 5, 2, RELEASED), (14, 14, 3, RELEASED), (17, 31, 4, RELEASED),
    (100, 100, 5, RELEASED), (543, 544, 6, RELEASED), (544, 544, 7, RELEASED), (640, 480, 8, RELEASED),
    (1024, 768, 9, RELEASED), (1920, 1080, 10, RELEASED), (1080, 1920, 11, RELEASED), (4000, 3000, 12, RELEASED),
    (5000, 20, 13, RELEASED), (20, 5000, 14, RELEASED), (1, 10000, 15, RELEASED), (10000, 1, 16, RELEASED),
    (333, 777, 17, SMALL), (2047, 1023, 18, SMALL), (59, 4001, 19, SMALL), (777, 333, 20, WIDE),
]


def synth_image(w, h, seed):
    """uint8 [h, w, 3]: per-channel gradient + hashed noise + a 7x5 checker (tests/unit/vision_synth.h)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.uint32)
    out = np.empty((h, w, 3), dtype=np.uint8)
    for c in range(3):
        hsh = (x * np.uint32(73856093)) ^ (y * np.uint32(19349663)) ^ np.uint32((c * 83492791 + seed * 2654435761) & 0xFFFFFFFF)
        hsh ^= hsh >> np.uint32(13)
        hsh *= np.uint32(1274126177)
        hsh ^= hsh >> np.uint32(16)
        xi, yi = x.astype(np.int64), y.astype(np.int64)
        if c == 0:
            g = xi * 255 // max(w - 1, 1)
        elif c == 1:
            g = yi * 255 // max(h - 1, 1)
        else:
            g = (xi + yi) * 255 // max(w + h - 2, 1)
        checker = np.where(((xi // 7 + yi // 5) & 1) == 1, 40, -40)
        v = g + (hsh & np.uint32(31)).astype(np.int64) - 16 + checker
        out[:, :, c] = np.clip(v, 0, 255).astype(np.uint8)
    return out


# --- the reference processor, transcribed -------------------------------------------------------

def num_image_tokens(n_llm_h, n_llm_w):
    return n_llm_h * (n_llm_w + 1) + 2


def llm_grid(best_height, best_width, patch_size, downsample_ratio):
    return math.ceil((best_height // patch_size) / downsample_ratio), math.ceil((best_width // patch_size) / downsample_ratio)


def solve_resize_ratio(height, width, patch_size, downsample_ratio, max_n_token):
    r = height / width
    max_w_float = math.sqrt((max_n_token - 2) / r + 0.25) - 0.5
    max_h_float = max_w_float * r
    cell = patch_size * downsample_ratio
    if max_w_float < 1.0:
        return (max_n_token - 2) // 2 * cell, cell
    if max_h_float < 1.0:
        return cell, (max_n_token - 3) * cell
    beta = min(math.floor(max_w_float) * cell / width, math.floor(max_h_float) * cell / height)
    return math.floor(height * beta / patch_size) * patch_size, math.floor(width * beta / patch_size) * patch_size


def safe_resize(height, width, best_height, best_width, patch_size, downsample_ratio, max_n_token):
    n_llm_h, n_llm_w = llm_grid(best_height, best_width, patch_size, downsample_ratio)
    if num_image_tokens(n_llm_h, n_llm_w) > max_n_token:
        best_height, best_width = solve_resize_ratio(height, width, patch_size, downsample_ratio, max_n_token)
        n_llm_h, n_llm_w = llm_grid(best_height, best_width, patch_size, downsample_ratio)
        assert num_image_tokens(n_llm_h, n_llm_w) <= max_n_token
    return n_llm_h, n_llm_w, best_height, best_width


def plan_image_grid(width, height, cfg):
    p = cfg["patch_size"]
    if cfg["max_wh_ratio"] is not None and width > height * cfg["max_wh_ratio"]:
        width = height * cfg["max_wh_ratio"]
    if 0 < width * height < cfg["min_pixels"]:
        ratio = (cfg["min_pixels"] / (width * height)) ** 0.5
        width = int(width * ratio)
        height = int(height * ratio)
    best_width = math.ceil(width / p) * p
    best_height = math.ceil(height / p) * p
    return safe_resize(height, width, best_height, best_width, p, cfg["downsample_ratio"], cfg["max_image_tokens"])


def bf16_bits(x):
    """float32 array → bf16 bit patterns, round to nearest even (torch's .to(torch.bfloat16))."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def load_image(image, cfg):
    """The reference's load_image after Image.open(...).convert("RGB"): (canvas, patches, grid)."""
    p = cfg["patch_size"]
    n_llm_h, n_llm_w, best_height, best_width = plan_image_grid(image.width, image.height, cfg)
    n_vit_h, n_vit_w = best_height // p, best_width // p
    if cfg["max_wh_ratio"] is not None and image.width >= cfg["max_wh_ratio"] * image.height:
        image = image.resize((best_width, best_height))
    else:
        image = ImageOps.pad(image, (best_width, best_height), color=(127, 127, 127))
    canvas = np.asarray(image, dtype=np.uint8)
    x = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / np.float32(255)
    x = bf16_bits((x - np.float32(0.5)) / np.float32(0.5))
    patches = x.reshape(3, n_vit_h, p, n_vit_w, p).transpose(1, 3, 0, 2, 4).reshape(n_vit_h * n_vit_w, 3, p, p)
    grid = dict(best_width=best_width, best_height=best_height, n_vit_h=n_vit_h, n_vit_w=n_vit_w,
                n_llm_h=n_llm_h, n_llm_w=n_llm_w, n_tokens=num_image_tokens(n_llm_h, n_llm_w))
    return canvas, patches, grid


# --- goldens --------------------------------------------------------------------------------------

def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def processor_goldens():
    rng = np.random.default_rng(1234)
    cases = []
    for w, h, seed, cfg in CASES:
        image = Image.fromarray(synth_image(w, h, seed), "RGB")
        canvas, patches, grid = load_image(image, cfg)
        H, W = canvas.shape[:2]
        ys, xs = rng.integers(0, H, 64), rng.integers(0, W, 64)
        flat = patches.reshape(-1)
        idx = rng.integers(0, flat.size, 32)
        cases.append(dict(
            width=w, height=h, seed=seed, config=cfg, grid=grid,
            canvas_fnv1a64=fnv1a64(canvas.tobytes()),
            canvas_channel_sums=[int(canvas[:, :, c].sum(dtype=np.int64)) for c in range(3)],
            canvas_samples=[[int(y), int(x), *map(int, canvas[y, x])] for y, x in zip(ys, xs)],
            patch_samples=[[int(i), int(flat[i])] for i in idx],
        ))
        print(f"{w}x{h}: grid {grid['n_llm_h']}x{grid['n_llm_w']} ({grid['n_tokens']} tokens), canvas {W}x{H}")
    return cases


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_rgb16(pixels16):
    """A 16-bit RGB PNG (Pillow writes none); rows with filter 0."""
    h, w, _ = pixels16.shape
    raw = b"".join(b"\0" + pixels16[y].astype(">u2").tobytes() for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)) +
            png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b""))


def encode(image, fmt, **kw):
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def decode_fixtures():
    rgb = Image.fromarray(synth_image(16, 12, 99), "RGB")
    alpha = Image.fromarray((np.arange(16 * 12).reshape(12, 16) * 7 % 256).astype(np.uint8), "L")
    rgba = rgb.copy()
    rgba.putalpha(alpha)
    gray = rgb.convert("L")
    la = gray.copy()
    la.putalpha(alpha)
    pal = rgb.quantize(16)
    pal_trns = pal.copy()
    pal_trns.info["transparency"] = 3
    gray16 = Image.fromarray((np.arange(16 * 12).reshape(12, 16) * 3).astype(np.uint16))  # values 0..573
    second = Image.fromarray(synth_image(16, 12, 7), "RGB")
    files = {
        "rgb.png": encode(rgb, "PNG"),
        "rgba.png": encode(rgba, "PNG"),
        "gray.png": encode(gray, "PNG"),
        "gray_alpha.png": encode(la, "PNG"),
        "palette_trns.png": encode(pal_trns, "PNG", transparency=3),
        "bilevel.png": encode(gray.convert("1"), "PNG"),
        "gray16.png": encode(gray16, "PNG"),
        "rgb16.png": png_rgb16(np.asarray(rgb).astype(np.uint16) * 257 + 3),
        "q90_420.jpg": encode(rgb, "JPEG", quality=90, subsampling=2),
        "q95_444.jpg": encode(rgb, "JPEG", quality=95, subsampling=0),
        "gray.jpg": encode(gray, "JPEG", quality=90),
        "progressive.jpg": encode(rgb, "JPEG", quality=85, progressive=True),
        "lossy.webp": encode(rgb, "WEBP", quality=80),
        "lossless_alpha.webp": encode(rgba, "WEBP", lossless=True, exact=True),
        "animated.webp": encode(rgb, "WEBP", save_all=True, append_images=[second], lossless=True),
        "palette.gif": encode(pal, "GIF"),
        "transparent.gif": encode(pal_trns, "GIF", transparency=3),
        "animated.gif": encode(rgb.quantize(32), "GIF", save_all=True, append_images=[second.quantize(32)]),
        "interlaced.gif": encode(pal, "GIF", interlace=True),
    }
    (OUT / "decode").mkdir(parents=True, exist_ok=True)
    goldens = {}
    for name, data in files.items():
        (OUT / "decode" / name).write_bytes(data)
        with Image.open(io.BytesIO(data)) as im:
            mode = im.mode
            out = im.convert("RGB")
        goldens[name] = dict(mode=mode, width=out.width, height=out.height, rgb_hex=out.tobytes().hex())
        print(f"{name}: {len(data)} bytes, Pillow mode {mode}")
    return goldens


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    import PIL
    meta = dict(generator="tools/vision/make_processor_goldens.py", pillow=PIL.__version__, numpy=np.__version__,
                reference="deepseek-ai/DeepSeek-V4.1-Flash@dba1be0a40aa45a94ad051997016db3960a90277 inference/image_processor.py")
    write_json(OUT / "decode_goldens.json", meta, "files", decode_fixtures())
    write_json(OUT / "processor_goldens.json", meta, "cases", processor_goldens())


def write_json(path, meta, key, items):
    """One item per line: small files whose diffs stay readable."""
    compact = lambda v: json.dumps(v, separators=(",", ":"))
    if isinstance(items, dict):
        body = ",\n".join(f" {compact(k)}:{compact(v)}" for k, v in items.items())
        text = f'{{"meta":{compact(meta)},\n"{key}":{{\n{body}\n}}}}\n'
    else:
        body = ",\n".join(" " + compact(v) for v in items)
        text = f'{{"meta":{compact(meta)},\n"{key}":[\n{body}\n]}}\n'
    path.write_text(text)


if __name__ == "__main__":
    main()
