"""Authentication, malformed requests and limits: every failure is an OpenAI error body
{"error": {"message", "type", "param", "code"}} with the right status."""
from __future__ import annotations

import httpx
import openai
import pytest

from spw_server_harness import VOCAB


def post(server, path, body=None, content=None, headers=None):
    h = server.headers() if headers is None else headers
    return httpx.post(server.base + path, json=body, content=content, headers=h, timeout=30)


def assert_error(r, status, *, param=None, contains=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if contains is not None:
        assert contains in err["message"], err
    return err


def test_auth_failure_401(server):
    bad = openai.OpenAI(base_url=server.base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.completions.create(model="tiny-v41", prompt="hi", max_tokens=1)
    assert e.value.status_code == 401
    r = post(server, "/v1/completions", {"prompt": "hi"}, headers={})
    err = assert_error(r, 401)
    assert err["code"] == "invalid_api_key"
    r = post(server, "/v1/completions", {"prompt": "hi"}, headers={"Authorization": "Bearer sk-spillway-tes"})
    assert_error(r, 401)
    # Health and metrics stay open for probes.
    assert httpx.get(server.base + "/health").status_code == 200


@pytest.mark.parametrize("body,param", [
    ({"prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"prompt": "hi", "temperature": 3}, "temperature"),
    ({"prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 1.5}, "max_tokens"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "top_p": [1]}, "top_p"),
    ({"prompt": "hi", "stream": "yes"}, "stream"),
    ({"prompt": "hi", "stop": 5}, "stop"),
    ({"prompt": "hi", "stop": ["a", 3]}, "stop[1]"),
    ({"prompt": "hi", "n": 0}, "n"),
    ({"prompt": "hi", "n": 17}, "n"),
    ({"prompt": "hi", "n": "two"}, "n"),
    ({"prompt": "hi", "logprobs": 50}, "logprobs"),
    ({"prompt": "hi", "seed": "x"}, "seed"),
    ({"prompt": 12}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt[1]"),
    ({"prompt": [1, -4]}, "prompt"),
    ({"prompt": [[1, 2], []]}, "prompt"),
    ({"prompt": ["a", [1]]}, "prompt"),
    ({"prompt": [[1, 2], [VOCAB]]}, "prompt"),
    ({"prompt": ["a"] * 65}, "prompt"),
    ({"prompt": ["a"] * 8, "n": 9}, "prompt"),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "hi", "repetition_penalty": 2.5}, "repetition_penalty"),
    ({"prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"5": "up"}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"x": 1}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"-1": 1}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {str(VOCAB): 1}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": [1, 2]}, "logit_bias"),
    ({"prompt": "hi", "echo": True, "logprobs": 1, "stream": True}, "echo"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [VOCAB]}, "prompt"),
    ({"max_tokens": 3}, "prompt"),
    ({"prompt": "hi", "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
])
def test_completions_400(server, body, param):
    assert_error(post(server, "/v1/completions", body), 400, param=param)


@pytest.mark.parametrize("body,param", [
    ({}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": "yes"}, "logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    # Enforced tool calls need a tool that can be written in DSML: no '"' in its name.
    ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required",
      "tools": [{"type": "function", "function": {"name": 'say"hi', "parameters": {"type": "object"}}}]}, "tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}}, "response_format"),
])
def test_chat_400(server, body, param):
    assert_error(post(server, "/v1/chat/completions", body), 400, param=param)


def test_invalid_json_and_non_object(server):
    assert_error(post(server, "/v1/completions", content=b'{"prompt": "hi"'), 400, contains="not valid JSON")
    assert_error(post(server, "/v1/completions", content=b"[1, 2]"), 400)
    assert_error(post(server, "/v1/chat/completions", content=b"\xff\xfe garbage"), 400)


def test_unknown_fields_are_ignored(server):
    r = post(server, "/v1/completions", {"prompt": [0, 5], "max_tokens": 2, "temperature": 0,
                                         "frobnicate": {"x": [1, 2]}, "user": "u1"})
    assert r.status_code == 200, r.text


def test_context_length_exceeded_names_the_limit(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny-v41", prompt=[5] * 9000, max_tokens=1)
    body = e.value.body
    assert "maximum context length is 8192" in body["message"]
    assert body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny-v41", prompt=[5] * 8000, max_tokens=500)
    assert "8192" in e.value.body["message"]


def test_max_tokens_limit(server):
    err = assert_error(post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 5000}), 400, param="max_tokens")
    assert "4096" in err["message"]


def test_body_too_large(spillway_bin, model_dir):
    from spw_server_harness import Server
    s = Server(spillway_bin, model_dir, "--max-body-bytes", "2000")
    try:
        r = post(s, "/v1/completions", {"prompt": "x" * 5000, "max_tokens": 1})
        assert_error(r, 413, contains="2000")
        assert post(s, "/v1/completions", {"prompt": [0, 1], "max_tokens": 1}).status_code == 200
    finally:
        assert s.stop() == 0


def test_unknown_route_404(server):
    r = httpx.get(server.base + "/v1/nothing", headers=server.headers())
    assert_error(r, 404)
