"""Image + text chat requests answered end to end: `spillway serve` (the CPU runner, or the GPU runner under
SPILLWAY_DEVICE=cuda as scripts/gpu_serve.sh runs the suite) on the tiny V4.1
fixture with a small random vision tower added (2 ViT layers of width 64, the aligner into the model's
256-wide stream), driven by the official openai SDK.

What is checked through the server: an image request streams an answer; the image's span is in the prompt
(usage counts its positions); the image's content reaches the model (two images give other logprobs, the
same image the same ones); the prefix cache keys image positions by content (a cached prompt with one image
never serves the same text with another image); a request with images does not disturb text requests. The
numerics themselves are checked in C++: the tower and aligner against a numpy oracle
(tests/unit/test_vision_tower.cpp), the forward with image spans against the PyTorch oracle
(tests/golden/test_golden.cpp, GoldenV41Images)."""
from __future__ import annotations

import base64
import json
import os
import struct
import zlib

import numpy as np
import pytest

from spw_server_harness import MODEL, SPECIALS, Server, build_tokenizer

D_VIT, N_LAYERS, N_HEADS, D_INTER, PATCH, RATIO = 64, 2, 4, 64, 14, 3
MIN_PIXELS = 56 * 56


def bf16(a: np.ndarray) -> np.ndarray:
    bits = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors: dict) -> None:
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def vision_tensors(d_llm: int, seed: int = 34) -> dict:
    rng = np.random.default_rng(seed)

    def w(*shape, std):
        return bf16(rng.standard_normal(shape) * std)

    n_in = 3 * PATCH * PATCH
    t = {"vision.patch_embed.proj.weight": w(D_VIT, n_in, std=2 / n_in ** 0.5),
         "vision.patch_embed.proj.bias": w(D_VIT, std=0.1),
         "vision.norm.weight": bf16(np.ones(D_VIT)),
         "aligner.w1.weight": w(d_llm, RATIO * RATIO * D_VIT, std=1 / (RATIO * RATIO * D_VIT) ** 0.5),
         "aligner.w1.bias": w(d_llm, std=0.1),
         "aligner.w2.weight": w(d_llm, d_llm, std=1 / d_llm ** 0.5),
         "aligner.w2.bias": w(d_llm, std=0.1)}
    for b in range(N_LAYERS):
        p = f"vision.blocks.{b}."
        t[p + "norm1.weight"] = bf16(np.ones(D_VIT))
        t[p + "norm2.weight"] = bf16(np.ones(D_VIT))
        t[p + "attn.wqkv.weight"] = w(3 * D_VIT, D_VIT, std=1 / D_VIT ** 0.5)
        t[p + "attn.wqkv.bias"] = w(3 * D_VIT, std=0.1)
        t[p + "attn.wo.weight"] = w(D_VIT, D_VIT, std=1 / D_VIT ** 0.5)
        t[p + "attn.wo.bias"] = w(D_VIT, std=0.1)
        t[p + "mlp.w1.weight"] = w(2 * D_INTER, D_VIT, std=1 / D_VIT ** 0.5)
        t[p + "mlp.w2.weight"] = w(D_VIT, D_INTER, std=1 / D_INTER ** 0.5)
    for name in ("image_start", "image_end", "image_newline"):
        t[name] = w(d_llm, std=1.0)
    return t


def png(width: int, height: int, seed: int) -> bytes:
    """A random RGB PNG written by hand (signature, IHDR, IDAT, IEND with their CRCs)."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def vision_server(spillway_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("vision") / "tiny-v41-vision"
    d.mkdir()
    for f in MODEL.iterdir():
        if f.is_file() and f.suffix == ".safetensors":
            (d / f.name).symlink_to(f.resolve())
    config = json.loads((MODEL / "config.json").read_text())
    d_llm = config["text_config"]["hidden_size"]
    config["image_token_id"] = SPECIALS.index("<｜deepseek_image｜>")  # the harness tokenizer's id for it
    config["vision_config"] = {
        "model_type": "deepseek_v41_vision", "num_hidden_layers": N_LAYERS, "hidden_size": D_VIT,
        "num_attention_heads": N_HEADS, "intermediate_size": D_INTER, "patch_size": PATCH, "rope_theta": 10000.0,
        "downsample_ratio": RATIO, "max_image_tokens": 64, "min_pixels": MIN_PIXELS, "max_wh_ratio": None}
    (d / "config.json").write_text(json.dumps(config))
    write_safetensors(d / "vision.safetensors", vision_tensors(d_llm))
    build_tokenizer(d / "tokenizer.json")
    s = Server(spillway_bin, d, "--device", os.environ.get("SPILLWAY_DEVICE", "cpu"), "--max-model-len", "4096")
    yield s
    assert s.stop() == 0, "".join(s.log[-30:])


TEXT = "Describe what you see in this picture in a few words, please, and be brief about it."


def ask(server, images: list[bytes], text: str = TEXT, image_first: bool = False, **kw):
    parts = [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
    content = parts + [{"type": "text", "text": text}] if image_first else [{"type": "text", "text": text}] + parts
    return server.client().chat.completions.create(
        model="tiny-v41-vision", max_tokens=kw.pop("max_tokens", 6), temperature=0,
        messages=[{"role": "user", "content": content}], **kw)


def first_logprobs(out) -> list[float]:
    return [t.logprob for t in out.choices[0].logprobs.content[0].top_logprobs]


def test_an_image_request_streams_an_answer(vision_server):
    stream = ask(vision_server, [png(16, 12, 1)], stream=True, stream_options={"include_usage": True}, max_tokens=8)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish in (["length"], ["stop"]), finish
    assert chunks[-1].usage.completion_tokens >= 1
    assert text or finish == ["stop"]
    assert any("image 0: 16x12" in line for line in vision_server.log), "".join(vision_server.log[-20:])


def test_the_image_span_is_in_the_prompt(vision_server):
    # 16x12 is scaled up to about MIN_PIXELS (64x48), padded to the patch grid (70x56): 4x5 patches, a 2x2 LLM
    # grid, so its span is START + (IMAGE x 2 + NEW_LINE) x 2 + END = 8 positions. 200x150 pads to 210x154:
    # 11x15 patches, a 4x5 grid, 26 positions. The text around them is the same, so the prompts differ by 18.
    small = ask(vision_server, [png(16, 12, 1)], max_tokens=1)
    large = ask(vision_server, [png(200, 150, 1)], max_tokens=1)
    assert large.usage.prompt_tokens - small.usage.prompt_tokens == 26 - 8
    logged = [line for line in vision_server.log if "image 0: " in line]
    assert "16x12 → 4x5 patches, 8 positions" in logged[-2], logged[-2:]
    assert "200x150 → 11x15 patches, 26 positions" in logged[-1], logged[-2:]


def test_the_image_content_reaches_the_model(vision_server):
    a = ask(vision_server, [png(16, 12, 1)], logprobs=True, top_logprobs=5, max_tokens=1)
    b = ask(vision_server, [png(16, 12, 2)], logprobs=True, top_logprobs=5, max_tokens=1)
    a2 = ask(vision_server, [png(16, 12, 1)], logprobs=True, top_logprobs=5, max_tokens=1)
    assert first_logprobs(a) != first_logprobs(b)
    assert first_logprobs(a) == first_logprobs(a2)


def test_the_prefix_cache_keys_images_by_content(vision_server):
    """The image first, then the same long text: the whole prompt of image 3's request is cached, and a cache
    keyed by token ids alone would serve it to image 4's request (their ids are equal), which would then
    answer as image 3's. Keyed by content, each repeat hits its own entry and answers as before."""
    text = TEXT * 3

    def run(seed):
        return first_logprobs(ask(vision_server, [png(20, 20, seed)], text=text, image_first=True, logprobs=True,
                                  top_logprobs=5, max_tokens=1))

    first = {seed: run(seed) for seed in (3, 4)}
    assert first[3] != first[4]
    cached = vision_server.metrics()["spillway_prompt_tokens_cached_total"]
    again = {seed: run(seed) for seed in (4, 3)}
    assert again == first
    # Each repeat was served at least one 16-token block from the cache, and every such block reaches past
    # the image span (2 template tokens, then 8 image positions).
    assert vision_server.metrics()["spillway_prompt_tokens_cached_total"] - cached >= 32


def test_text_requests_are_unaffected(vision_server):
    client = vision_server.client()
    msgs = [{"role": "user", "content": "Hello there, how are you?"}]
    before = client.chat.completions.create(model="tiny-v41-vision", max_tokens=6, temperature=0, messages=msgs)
    ask(vision_server, [png(30, 10, 5)], max_tokens=2)
    after = client.chat.completions.create(model="tiny-v41-vision", max_tokens=6, temperature=0, messages=msgs)
    assert before.choices[0].message.content == after.choices[0].message.content


def test_two_images_in_one_request(vision_server):
    out = ask(vision_server, [png(16, 12, 1), png(12, 30, 6)], max_tokens=2)
    one = ask(vision_server, [png(16, 12, 1)], max_tokens=2)
    assert out.usage.prompt_tokens > one.usage.prompt_tokens


def test_anthropic_image_blocks(vision_server):
    """/v1/messages through the official anthropic SDK: a base64 image block is the same image as the OpenAI
    part (the same first-token logprob is not exposed there, so the answer's text is compared at temperature
    0), and a url source is refused with the data: URL advice."""
    import anthropic

    client = anthropic.Anthropic(base_url=vision_server.base, api_key=vision_server.api_key, max_retries=0, timeout=120)
    image = png(16, 12, 1)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(image).decode()}}
    out = client.messages.create(model="tiny-v41-vision", max_tokens=6, extra_body={"temperature": 0},
                                 messages=[{"role": "user", "content": [{"type": "text", "text": TEXT}, block]}])
    openai_out = ask(vision_server, [image])
    assert out.content[0].text == openai_out.choices[0].message.content
    assert out.usage.input_tokens == openai_out.usage.prompt_tokens
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny-v41-vision", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}])
    assert "data: URL" in str(e.value)
