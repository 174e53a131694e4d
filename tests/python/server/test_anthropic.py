"""POST /v1/messages through the official `anthropic` SDK: plain and streamed text, stop sequences,
an enforced tool call streamed as input_json_delta and answered with a tool_result, thinking
blocks, and Anthropic-shaped errors. The fixture model's weights are random, so the tests check
structure, constraints and agreement with /v1/chat/completions (the same prompt and greedy
decoding must give the same text), not content."""
from __future__ import annotations

import json

import anthropic
import httpx
import pytest

SYSTEM = "You are terse."
USER = [{"role": "user", "content": "Weather in Paris, please."}]
# This SDK version has no sampling keywords; the server still reads temperature / top_p / top_k.
GREEDY = {"temperature": 0}
OPENAI_MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Paris, please."}]

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Tokyo"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["city"],
}
TOOLS = [{"name": "get_weather", "description": "Current weather for a city", "input_schema": WEATHER_SCHEMA},
         {"name": "get_time", "description": "Local time", "input_schema": {"type": "object", "properties": {}}}]
OPENAI_TOOLS = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                  "parameters": t["input_schema"]}} for t in TOOLS]


@pytest.fixture()
def ac(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base, api_key=server.api_key, max_retries=0, timeout=120)


def create(ac, messages=USER, **kw):
    kw.setdefault("max_tokens", 24)
    kw.setdefault("extra_body", GREEDY)
    return ac.messages.create(model="tiny-v41", system=SYSTEM, messages=messages, **kw)


def openai_chat(client, **kw):
    kw.setdefault("max_tokens", 24)
    return client.chat.completions.create(model="tiny-v41", messages=OPENAI_MESSAGES, temperature=0, **kw)


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def check_message(m, max_tokens: int):
    assert m.type == "message" and m.role == "assistant"
    assert m.id.startswith("msg_")
    assert m.model == "tiny-v41"
    assert m.stop_reason in ("end_turn", "max_tokens", "stop_sequence", "tool_use")
    assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= max_tokens
    if m.stop_reason == "max_tokens":
        assert m.usage.output_tokens == max_tokens
    assert m.stop_sequence is None or m.stop_reason == "stop_sequence"


def test_text_message_matches_chat_completions(ac, client, server):
    m = create(ac)
    check_message(m, 24)
    assert all(b.type == "text" for b in m.content)
    # The same chat path: greedy text and prompt length agree with /v1/chat/completions.
    ref = openai_chat(client)
    assert text_of(m) == ref.choices[0].message.content
    assert m.usage.input_tokens == ref.usage.prompt_tokens
    assert m.usage.output_tokens == ref.usage.completion_tokens
    # System text as blocks is the same prompt as a string.
    blocks = ac.messages.create(model="tiny-v41", system=[{"type": "text", "text": SYSTEM}], messages=USER,
                                max_tokens=24, extra_body=GREEDY, metadata={"user_id": "u1"})
    assert text_of(blocks) == text_of(m) and blocks.usage.input_tokens == m.usage.input_tokens


def test_streamed_text_assembles_to_the_same_message(ac):
    ref = create(ac)
    with ac.messages.stream(model="tiny-v41", system=SYSTEM, messages=USER, max_tokens=24, extra_body=GREEDY) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    check_message(final, 24)
    assert "".join(pieces) == text_of(final) == text_of(ref)
    assert final.stop_reason == ref.stop_reason
    assert final.usage.output_tokens == ref.usage.output_tokens


def test_stream_events_are_named_and_ordered(server):
    body = {"model": "tiny-v41", "max_tokens": 16, "temperature": 0, "stream": True, "system": SYSTEM,
            "messages": USER}
    headers = {"x-api-key": server.api_key, "anthropic-version": "2023-06-01"}
    events = []
    with httpx.stream("POST", server.base + "/v1/messages", json=body, headers=headers, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name  # the event name repeats the data's type
                events.append(data)
    names = [e["type"] for e in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    open_index = None
    n_blocks = 0
    for e in events[1:-2]:
        if e["type"] == "content_block_start":
            assert open_index is None and e["index"] == n_blocks
            open_index = e["index"]
            n_blocks += 1
        elif e["type"] in ("content_block_delta", "content_block_stop"):
            assert e["index"] == open_index
            if e["type"] == "content_block_stop":
                open_index = None
        else:
            assert e["type"] == "ping"
    assert open_index is None
    delta = events[-2]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert 0 < delta["usage"]["output_tokens"] <= 16


def test_stop_sequence_reports_which_one(ac):
    text = text_of(create(ac, max_tokens=32))
    assert len(text) > 12, text
    stop = text[8:11]
    assert stop.strip(), text
    for stream in (False, True):
        if stream:
            with ac.messages.stream(model="tiny-v41", system=SYSTEM, messages=USER, max_tokens=32, extra_body=GREEDY,
                                    stop_sequences=["never-appears-here", stop]) as s:
                m = s.get_final_message()
        else:
            m = create(ac, max_tokens=32, stop_sequences=["never-appears-here", stop])
        assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
        assert text_of(m) == text[:text.find(stop)]


def check_weather_input(block, ids: set):
    assert block.type == "tool_use" and block.id.startswith("toolu_") and block.id not in ids
    ids.add(block.id)
    assert block.name == "get_weather"
    assert isinstance(block.input, dict)
    assert set(block.input) <= {"city", "unit", "days"} and block.input["city"] in ("Paris", "Berlin", "Tokyo")
    assert block.input.get("unit", "celsius") in ("celsius", "fahrenheit")
    assert isinstance(block.input.get("days", 0), int)


@pytest.mark.parametrize("tool_choice", [{"type": "tool", "name": "get_weather"}, {"type": "any"}])
def test_streamed_tool_use_round_trip(ac, tool_choice):
    with ac.messages.stream(model="tiny-v41", system=SYSTEM, messages=USER, tools=TOOLS, tool_choice=tool_choice,
                            max_tokens=400, extra_body=GREEDY) as s:
        json_pieces = [e.partial_json for e in s if e.type == "input_json"]
        first = s.get_final_message()
    assert first.stop_reason == "tool_use", first
    calls = [b for b in first.content if b.type == "tool_use"]
    assert calls and json_pieces
    ids: set = set()
    for b in calls:
        if tool_choice["type"] == "tool":
            check_weather_input(b, ids)
        else:
            assert b.name in ("get_weather", "get_time") and isinstance(b.input, dict)
    # The non-streaming reply makes the same calls.
    same = create(ac, tools=TOOLS, tool_choice=tool_choice, max_tokens=400)
    assert [(b.name, b.input) for b in same.content if b.type == "tool_use"] == [(b.name, b.input) for b in calls]

    history = USER + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [
            *[{"type": "tool_result", "tool_use_id": b.id, "content": json.dumps({"ok": True, "tool": b.name}),
               **({"is_error": True} if i == len(calls) - 1 else {})} for i, b in enumerate(calls)],
            {"type": "text", "text": "Thanks."}]}]
    for follow_up in ({"type": "auto"}, {"type": "none"}):
        answer = create(ac, history, tools=TOOLS, tool_choice=follow_up, max_tokens=24)
        check_message(answer, 24)
        if follow_up["type"] == "none":
            assert all(b.type == "text" for b in answer.content)
        # The calls and their results are in the prompt (with "none" the tool schemas are not).
        base = create(ac, tools=TOOLS, tool_choice=follow_up, max_tokens=1).usage.input_tokens
        assert answer.usage.input_tokens > base + 20


def test_thinking_blocks(ac, client):
    kw = {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 24}
    m = create(ac, **kw)
    check_message(m, 24)
    assert m.content and m.content[0].type == "thinking", m.content
    assert m.content[0].thinking and isinstance(m.content[0].signature, str)
    assert all(b.type != "thinking" for b in m.content[1:])
    # The model's reasoning mode: the same text as reasoning_content on /v1/chat/completions.
    ref = openai_chat(client, extra_body={"thinking": {"type": "enabled"}}).choices[0].message
    assert m.content[0].thinking == ref.reasoning_content
    assert text_of(m) == (ref.content or "")
    with ac.messages.stream(model="tiny-v41", system=SYSTEM, messages=USER, extra_body=GREEDY, **kw) as s:
        kinds = {e.type for e in s}
        streamed = s.get_final_message()
    assert "thinking" in kinds and "signature" in kinds
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in m.content]
    # Disabled thinking is the plain chat mode.
    off = create(ac, thinking={"type": "disabled"})
    assert all(b.type == "text" for b in off.content)


def anthropic_error(e: anthropic.APIStatusError, status: int, type_: str) -> str:
    assert e.status_code == status
    assert e.body["type"] == "error" and e.body["error"]["type"] == type_, e.body
    return e.body["error"]["message"]


def test_errors(ac, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        create(ac, messages=[{"role": "system", "content": "hi"}])
    assert "messages.0.role" in anthropic_error(e.value, 400, "invalid_request_error")
    with pytest.raises(anthropic.BadRequestError) as e:
        create(ac, tools=TOOLS, tool_choice={"type": "tool", "name": "nope"})
    assert "nope" in anthropic_error(e.value, 400, "invalid_request_error")
    with pytest.raises(anthropic.BadRequestError) as e:
        create(ac, extra_body={"temperature": 1.5})
    assert "temperature" in anthropic_error(e.value, 400, "invalid_request_error")

    headers = {"x-api-key": server.api_key, "anthropic-version": "2023-06-01"}
    r = httpx.post(server.base + "/v1/messages", headers=headers, timeout=30,
                   json={"model": "tiny-v41", "messages": USER})
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(server.base + "/v1/messages", headers=headers, content=b"{not json", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"

    bad = anthropic.Anthropic(base_url=server.base, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model="tiny-v41", max_tokens=4, messages=USER)
    anthropic_error(e.value, 401, "authentication_error")
    # Authorization: Bearer with the right key is accepted too.
    bearer = anthropic.Anthropic(base_url=server.base, auth_token=server.api_key, max_retries=0)
    assert bearer.messages.create(model="tiny-v41", max_tokens=4, messages=USER).type == "message"
