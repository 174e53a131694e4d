"""Which model a request names and which build answered: an unknown `model` is a 404
model_not_found (as OpenAI and vLLM answer), and every completion response and stream chunk
carries the same system_fingerprint."""
from __future__ import annotations

import re

import httpx
import openai
import pytest

MESSAGES = [{"role": "user", "content": "hi"}]
FINGERPRINT = re.compile(r"^spw-\d+\.\d+\.\d+-[0-9a-f]{12}$")


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1}),
])
def test_unknown_model_is_404(server, path, body):
    r = httpx.post(server.base + path, json={"model": "gpt-4o", **body}, headers=server.headers(), timeout=30)
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert "gpt-4o" in err["message"] and "tiny-v41" in err["message"]
    # The served id, and no model at all, are accepted.
    for extra in ({"model": "tiny-v41"}, {}):
        r = httpx.post(server.base + path, json={**extra, **body}, headers=server.headers(), timeout=60)
        assert r.status_code == 200, r.text


def test_unknown_model_through_the_sdk(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="tiny-v42", messages=MESSAGES, max_tokens=1)


def test_system_fingerprint_everywhere(client):
    kw = dict(model="tiny-v41", max_tokens=4, temperature=0)
    seen = {client.chat.completions.create(messages=MESSAGES, **kw).system_fingerprint,
            client.completions.create(prompt="hi", **kw).system_fingerprint}
    for chunk in client.chat.completions.create(messages=MESSAGES, stream=True,
                                                stream_options={"include_usage": True}, **kw):
        seen.add(chunk.system_fingerprint)
    for chunk in client.completions.create(prompt="hi", stream=True, **kw):
        seen.add(chunk.system_fingerprint)
    assert len(seen) == 1, seen
    assert FINGERPRINT.match(seen.pop())
