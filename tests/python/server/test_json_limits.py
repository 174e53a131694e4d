"""Deeply nested JSON is refused with a 400 that names the limit (64 levels, spw::JsonLimits), and the
server keeps serving: a request body 50,000 levels deep on every POST route, a tool schema and
tool-call arguments 100,000 levels deep. The server runs without --api-key (the default), so each of
these is a request anyone who can reach the port can send."""
from __future__ import annotations

import httpx
import pytest

from spw_server_harness import Server

DEPTH_LIMIT = 64
POST_ROUTES = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]


@pytest.fixture()
def open_server(spillway_bin, model_dir):
    # One server per test, so that a crash shows in the test that caused it.
    s = Server(spillway_bin, model_dir, api_key=None)
    yield s
    rc = s.stop()
    assert rc == 0, "".join(s.log[-30:])


def deep_body() -> bytes:
    n = 50_000
    return b'{"x":' + b"[" * n + b"]" * n + b',"y":1}'


def deep_tool_schema_body() -> bytes:
    n = 50_000  # two levels each: 100,000
    schema = b'{"properties":{"x":' * n + b'{"type":"string"}' + b"}}" * n
    return (b'{"messages":[{"role":"user","content":"hi"}],"tool_choice":"required",'
            b'"tools":[{"type":"function","function":{"name":"f","parameters":' + schema + b"}}]}")


def deep_arguments_body() -> bytes:
    n = 100_000
    arguments = '{"a":' * n + "1" + "}" * n  # a JSON object inside the arguments string
    return httpx.Request("POST", "/", json={"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]}).read()


def assert_still_serving(server: Server) -> None:
    assert server.proc.poll() is None, "".join(server.log[-30:])
    assert httpx.get(server.base + "/health", timeout=10).status_code == 200
    r = httpx.post(server.base + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def assert_depth_error(r: httpx.Response, contains: str) -> None:
    assert r.status_code == 400, r.text[:500]
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert contains in err["message"], err
    assert f"more than {DEPTH_LIMIT} levels deep" in err["message"], err


@pytest.mark.parametrize("route", POST_ROUTES)
def test_deep_body_is_a_400_on_every_route(open_server, route):
    r = httpx.post(open_server.base + route, content=deep_body(),
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert_depth_error(r, "the request body nests arrays/objects")
    assert_still_serving(open_server)


def test_deep_tool_schema_is_a_400(open_server):
    r = httpx.post(open_server.base + "/v1/chat/completions", content=deep_tool_schema_body(),
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert_depth_error(r, "the request body nests arrays/objects")
    assert_still_serving(open_server)


def test_deep_tool_call_arguments_are_a_400(open_server):
    r = httpx.post(open_server.base + "/v1/chat/completions", content=deep_arguments_body(),
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert_depth_error(r, "messages[1].tool_calls[0].function.arguments nests arrays/objects")
    assert_still_serving(open_server)


def test_body_at_the_depth_limit_is_accepted(open_server):
    # {"prompt": ..., "x": [[...]]}: the object is level 1, so 63 arrays reach exactly 64.
    n = DEPTH_LIMIT - 1
    body = b'{"prompt":"hello","max_tokens":2,"x":' + b"[" * n + b"]" * n + b"}"
    r = httpx.post(open_server.base + "/v1/completions", content=body,
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
    body = b'{"prompt":"hello","max_tokens":2,"x":' + b"[" * (n + 1) + b"]" * (n + 1) + b"}"
    r = httpx.post(open_server.base + "/v1/completions", content=body,
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert_depth_error(r, "the request body")


def test_too_many_values_is_a_400(open_server):
    body = b'{"prompt":"hello","x":[' + b",".join([b"0"] * ((1 << 20) + 1)) + b"]}"
    r = httpx.post(open_server.base + "/v1/completions", content=body,
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text[:500]
    assert "more than 1048576 JSON values" in r.json()["error"]["message"]
    assert_still_serving(open_server)
