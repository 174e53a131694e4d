"""Image parts of /v1/chat/completions ({"type": "image_url", "image_url": {"url": "data:..."}}) on the
bundled demo model, which has no vision tower: every unusable image gets a 400 that says what to change
(remote URL, malformed data URL, bad base64, corrupt image, unsupported or mismatched MIME type), a valid
image gets "this model does not take images", and the server keeps serving. The success path (placeholder
expansion into image tokens) is tested in C++ (tests/unit/test_vision_tokens.cpp). The images are the
decoder fixtures of the C++ tests (tests/unit/data/vision/decode)."""
from __future__ import annotations

import base64
import os

import openai
import pytest

from spw_server_harness import ROOT, Server

DEMO = ROOT / "models" / "demo"
FIXTURES = ROOT / "tests" / "unit" / "data" / "vision" / "decode"
PNG = (FIXTURES / "rgb.png").read_bytes()
JPEG = (FIXTURES / "q90_420.jpg").read_bytes()


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def demo(spillway_bin):
    s = Server(spillway_bin, DEMO, "--device", os.environ.get("SPILLWAY_DEVICE", "cpu"), api_key=None)
    yield s
    assert s.stop() == 0, "".join(s.log[-30:])


def ask(server, url: str):
    return server.client().chat.completions.create(
        model="demo", max_tokens=4,
        messages=[{"role": "user", "content": [{"type": "text", "text": "What is in this image?"},
                                                {"type": "image_url", "image_url": {"url": url}}]}])


@pytest.mark.parametrize("url,says", [
    ("https://example.com/cat.png", "fetches nothing"),
    ("http://example.com/cat.png", "send the image inline as a data: URL"),
    ("ftp://example.com/cat.png", "unsupported image URL"),
    ("data:image/png;base64" + base64.b64encode(PNG).decode(), "malformed data URL"),
    ("data:image/png," + PNG[:40].hex(), "not base64-encoded"),
    ("data:image/png;base64,iVBORw0KGgo*AAAANSUhEUg==", "invalid base64"),
    ("data:image/png;base64,iVBORw0KGgoAAAANSUhEU", "invalid base64"),
    ("data:image/png;base64,", "carries no data"),
    (data_url("image/png", PNG[: len(PNG) // 2]), "corrupt or truncated PNG"),
    (data_url("image/png", PNG[:16] + bytes(64)), "corrupt or truncated PNG"),
    (data_url("image/jpeg", JPEG[: len(JPEG) // 2]), "corrupt or truncated JPEG"),
    (data_url("image/png", JPEG), "says image/png but the bytes are a JPEG image"),
    (data_url("image/bmp", b"BM" + bytes(60)), "unsupported image MIME type"),
    (data_url("", b"BM" + bytes(60)), "unsupported image format (the bytes look like BMP)"),
    (data_url("text/plain", PNG), "unsupported image MIME type"),
])
def test_unusable_image_is_a_400_that_says_what_to_change(demo, url, says):
    with pytest.raises(openai.BadRequestError) as e:
        ask(demo, url)
    assert e.value.status_code == 400
    err = e.value.body
    assert says in err["message"], err
    assert err["param"] == "messages[0].content[1].image_url", err


@pytest.mark.parametrize("name,mime", [("rgb.png", "image/png"), ("q90_420.jpg", "image/jpeg"),
                                       ("lossy.webp", "image/webp"), ("palette.gif", "image/gif")])
def test_valid_image_to_a_model_without_vision_tower_is_refused(demo, name, mime):
    with pytest.raises(openai.BadRequestError) as e:
        ask(demo, data_url(mime, (FIXTURES / name).read_bytes()))
    assert "does not take images" in e.value.body["message"], e.value.body


def test_declared_size_over_the_pixel_limit_is_refused_before_decoding(demo):
    gif = bytearray((FIXTURES / "palette.gif").read_bytes())
    gif[6:10] = b"\xff\xff\xff\xff"  # logical screen 65535 x 65535
    with pytest.raises(openai.BadRequestError) as e:
        ask(demo, data_url("image/gif", bytes(gif)))
    assert "over the limit" in e.value.body["message"], e.value.body


def test_server_keeps_serving_after_image_errors(demo):
    for url in ("https://example.com/x.png", data_url("image/png", PNG[:20])):
        with pytest.raises(openai.BadRequestError):
            ask(demo, url)
    out = demo.client().chat.completions.create(model="demo", max_tokens=4,
                                                messages=[{"role": "user", "content": "Hello"}])
    assert out.choices[0].message.content is not None


def one_pixel_png() -> bytes:
    """A valid 1x1 RGB PNG, written by hand (signature, IHDR, IDAT, IEND with their CRCs)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00\x80\x80\x80"))
            + chunk(b"IEND", b""))


def test_image_limits_are_settings(spillway_bin):
    """--max-images and --max-image-pixels (docs/settings.md) replace the defaults: a 16x12 PNG (192 pixels) is
    refused under --max-image-pixels 100, and a second image (1x1, within it) under --max-images 1."""
    s = Server(spillway_bin, DEMO, "--device", os.environ.get("SPILLWAY_DEVICE", "cpu"), "--max-images", "1",
               "--max-image-pixels", "100", api_key=None)
    try:
        with pytest.raises(openai.BadRequestError) as e:
            ask(s, data_url("image/png", PNG))
        assert "over the limit of 100 pixels" in e.value.body["message"], e.value.body
        with pytest.raises(openai.BadRequestError) as e:
            ask(s, data_url("image/png", one_pixel_png()))
        assert "does not take images" in e.value.body["message"], e.value.body
        two = [{"type": "image_url", "image_url": {"url": data_url("image/png", one_pixel_png())}}] * 2
        with pytest.raises(openai.BadRequestError) as e:
            s.client().chat.completions.create(model="demo", max_tokens=4,
                                               messages=[{"role": "user", "content": two}])
        assert "too many images: at most 1 per request" in e.value.body["message"], e.value.body
        assert e.value.body["param"] == "messages[0].content[1].image_url", e.value.body
    finally:
        assert s.stop() == 0, "".join(s.log[-30:])
