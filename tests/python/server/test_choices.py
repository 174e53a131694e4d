"""n > 1: each choice is its own sequence with its own RNG stream (choice 0 keeps the request's seed,
choice i a fixed derivation of it), streaming and not, for completions and chat; usage counts
every choice's tokens."""
from __future__ import annotations

import httpx

PROMPT = "Hello world"
MESSAGES = [{"role": "user", "content": "Say something."}]
SAMPLED = dict(temperature=1.0, top_p=0.95, extra_body={"ignore_eos": True})


def ids(choice) -> list[int]:
    return choice.model_extra["token_ids"]


def test_completions_n_sampled(client):
    r = client.completions.create(model="tiny-v41", prompt=PROMPT, max_tokens=16, n=3, seed=7, **SAMPLED)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(len(ids(c)) == 16 and c.finish_reason == "length" for c in r.choices)
    assert len({tuple(ids(c)) for c in r.choices}) == 3  # independent streams
    assert r.usage.completion_tokens == 48
    assert r.usage.total_tokens == r.usage.prompt_tokens + 48
    # Deterministic per seed; choice 0 is exactly the n = 1 request with the same seed.
    again = client.completions.create(model="tiny-v41", prompt=PROMPT, max_tokens=16, n=3, seed=7, **SAMPLED)
    assert [ids(c) for c in again.choices] == [ids(c) for c in r.choices]
    one = client.completions.create(model="tiny-v41", prompt=PROMPT, max_tokens=16, seed=7, **SAMPLED)
    assert ids(one.choices[0]) == ids(r.choices[0])
    other = client.completions.create(model="tiny-v41", prompt=PROMPT, max_tokens=16, n=3, seed=8, **SAMPLED)
    assert [ids(c) for c in other.choices] != [ids(c) for c in r.choices]


def test_completions_n_greedy_identical(client):
    r = client.completions.create(model="tiny-v41", prompt=PROMPT, max_tokens=12, n=2, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert len(r.choices) == 2
    assert ids(r.choices[0]) == ids(r.choices[1]) and r.choices[0].text == r.choices[1].text
    assert r.usage.completion_tokens == 24


def test_completions_n_streaming_matches(client):
    ref = client.completions.create(model="tiny-v41", prompt=PROMPT, max_tokens=10, n=3, seed=3, **SAMPLED)
    stream = client.completions.create(model="tiny-v41", prompt=PROMPT, max_tokens=10, n=3, seed=3, stream=True,
                                       stream_options={"include_usage": True}, **SAMPLED)
    got = {0: [], 1: [], 2: []}
    text = {0: "", 1: "", 2: ""}
    finish = {}
    usage = None
    for ch in stream:
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            got[c.index] += c.model_extra["token_ids"]
            text[c.index] += c.text
            if c.finish_reason:
                assert c.index not in finish
                finish[c.index] = c.finish_reason
    assert [got[i] for i in range(3)] == [ids(c) for c in ref.choices]
    assert [text[i] for i in range(3)] == [c.text for c in ref.choices]
    assert finish == {0: "length", 1: "length", 2: "length"}
    assert usage.completion_tokens == 30


def test_chat_n(client):
    kw = dict(model="tiny-v41", messages=MESSAGES, max_tokens=12, n=2, seed=11, temperature=1.0)
    r = client.chat.completions.create(logprobs=True, **kw)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(isinstance(c.message.content, str) for c in r.choices)
    assert r.choices[0].message.content != r.choices[1].message.content
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    content = {0: "", 1: ""}
    roles = []
    usage = None
    for ch in stream:
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            content[c.index] += c.delta.content or ""
            if c.delta.role:
                roles.append(c.index)
    assert sorted(roles) == [0, 1]
    assert [content[0], content[1]] == [c.message.content for c in r.choices]
    assert usage.completion_tokens == r.usage.completion_tokens
    # Greedy n = 2: identical choices.
    g = client.chat.completions.create(model="tiny-v41", messages=MESSAGES, max_tokens=12, n=2, temperature=0, logprobs=True)
    assert g.choices[0].message.content == g.choices[1].message.content
    assert g.usage.completion_tokens == 2 * len(g.choices[0].logprobs.content)


def test_n_limits(server):
    for n in (0, 17):
        r = httpx.post(server.base + "/v1/completions", headers=server.headers(), timeout=30,
                       json={"prompt": PROMPT, "n": n})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    r = httpx.post(server.base + "/v1/completions", headers=server.headers(), timeout=60,
                   json={"prompt": PROMPT, "n": 16, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200 and len(r.json()["choices"]) == 16
