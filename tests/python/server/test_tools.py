"""Enforced tool calls through the openai SDK: tool_choice "required" or a named function makes the
server constrain decoding to src/chat's DSML grammar, so even the random-weight fixture model
returns well-formed calls. Then the tool results go back for a normal answer (auto / none)."""
from __future__ import annotations

import json

import httpx
import pytest

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris, please."}]

# Small value spaces (enums, integers, no free text) so that a random model finishes a call quickly.
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Berlin", "Tokyo"]},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
        "required": ["city"],
    },
}
TIME = {"name": "get_time", "description": "Local time", "parameters": {"type": "object", "properties": {}}}
TOOLS = [{"type": "function", "function": WEATHER}, {"type": "function", "function": TIME}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def check_call(name: str, arguments: str, only: str | None = None) -> dict:
    """A call is valid: a known (or the named) tool, JSON arguments, known keys, required keys present."""
    assert name in SCHEMAS, name
    if only:
        assert name == only
    args = json.loads(arguments)
    assert isinstance(args, dict), arguments
    params = SCHEMAS[name]["parameters"]
    assert set(args) <= set(params["properties"]), args
    assert set(params.get("required", [])) <= set(args), args
    if name == "get_weather":
        assert args["city"] in ("Paris", "Berlin", "Tokyo")
        assert args.get("unit", "celsius") in ("celsius", "fahrenheit")
        assert isinstance(args.get("days", 0), int)
    return args


def create(client, messages=MESSAGES, **kw):
    kw.setdefault("max_tokens", 400)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="tiny-v41", messages=messages, tools=TOOLS, **kw)


def assistant_turn(message) -> dict:
    return {"role": "assistant", "content": message.content or "",
            "tool_calls": [{"id": c.id, "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments}}
                           for c in message.tool_calls]}


def tool_results(calls) -> list[dict]:
    return [{"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"ok": True, "tool": c["function"]["name"]})}
            for c in calls]


def stream_tool_calls(client, messages=MESSAGES, **kw):
    """Streams one request and reassembles the message the chunks describe."""
    chunks = list(create(client, messages, stream=True, stream_options={"include_usage": True}, **kw))
    calls: dict[int, dict] = {}
    content = ""
    finish = []
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            c["id"] += tc.id or ""
            c["function"]["name"] += tc.function.name or ""
            c["function"]["arguments"] += tc.function.arguments or ""
        if ch.choices[0].finish_reason:
            finish.append(ch.choices[0].finish_reason)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    return [calls[i] for i in sorted(calls)], content, finish


@pytest.mark.parametrize("tool_choice,only", [("required", None), (NAMED, "get_weather")])
def test_enforced_tool_call_then_answer(client, tool_choice, only):
    r = create(client, tool_choice=tool_choice)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert c.message.tool_calls, c.message
    assert c.message.content is None  # nothing but the block
    ids = set()
    for call in c.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        ids.add(call.id)
        check_call(call.function.name, call.function.arguments, only)
    assert len(ids) == len(c.message.tool_calls)

    history = MESSAGES + [assistant_turn(c.message)]
    history += tool_results(history[-1]["tool_calls"])
    for follow_up in ("auto", "none"):
        a = create(client, history, tool_choice=follow_up, max_tokens=24)
        assert a.choices[0].finish_reason in ("stop", "length")
        assert a.choices[0].message.tool_calls is None
        assert isinstance(a.choices[0].message.content, str)
        # The calls and their results are in the prompt (with "none" the tool schemas are not).
        base = create(client, MESSAGES, tool_choice=follow_up, max_tokens=1).usage.prompt_tokens
        assert a.usage.prompt_tokens > base + 20


@pytest.mark.parametrize("tool_choice,only", [("required", None), (NAMED, "get_weather")])
def test_enforced_tool_call_streaming(client, tool_choice, only):
    calls, content, finish = stream_tool_calls(client, tool_choice=tool_choice)
    assert finish == ["tool_calls"]
    assert calls and content == ""
    for call in calls:
        check_call(call["function"]["name"], call["function"]["arguments"], only)
    # Streaming and non-streaming greedy runs make the same calls.
    ref = create(client, tool_choice=tool_choice).choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in ref] == \
           [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]

    history = MESSAGES + [{"role": "assistant", "content": "", "tool_calls": calls}] + tool_results(calls)
    calls2, content2, finish2 = stream_tool_calls(client, history, tool_choice="none", max_tokens=24)
    assert calls2 == [] and finish2[0] in ("stop", "length")
    assert isinstance(content2, str)


@pytest.mark.parametrize("tool_choice", ["required", NAMED])
def test_streamed_arguments_arrive_incrementally(client, tool_choice):
    """A call's first delta carries its id, type and name; its arguments follow in several deltas
    as they are generated (id and name not repeated), and add up byte for byte to the arguments of
    the same greedy request unstreamed."""
    chunks = list(create(client, stream=True, tool_choice=tool_choice))
    deltas: dict[int, list] = {}
    for ch in chunks:
        for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            deltas.setdefault(tc.index, []).append(tc)
    ref = create(client, tool_choice=tool_choice).choices[0].message.tool_calls
    assert sorted(deltas) == list(range(len(ref)))
    for i, call in enumerate(ref):
        first, rest = deltas[i][0], deltas[i][1:]
        assert first.id.startswith("call_") and first.type == "function"
        assert first.function.name == call.function.name
        assert all(d.id is None and d.function.name is None for d in rest)
        pieces = [d.function.arguments for d in deltas[i] if d.function.arguments]
        assert "".join(pieces) == call.function.arguments
        if call.function.name == "get_weather":  # head, value, closing quote, brace at least
            assert len(pieces) >= 3, pieces


def test_sampled_tool_calls_are_valid(client):
    """Sampling (temperature 1, several seeds, n = 2) stays inside the grammar too. With
    parallel_tool_calls off the block holds exactly one call (a random model sampled freely may
    chain invokes past max_tokens)."""
    for seed in range(3):
        r = create(client, tool_choice="required", temperature=1.0, seed=seed, n=2, max_tokens=600,
                   parallel_tool_calls=False)
        assert len(r.choices) == 2
        for c in r.choices:
            assert c.finish_reason == "tool_calls", c
            assert len(c.message.tool_calls) == 1
            check_call(c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments)


def test_logprobs_come_from_the_masked_distribution(client):
    r = create(client, tool_choice=NAMED, logprobs=True, top_logprobs=5, max_tokens=400)
    content = r.choices[0].logprobs.content
    assert r.choices[0].finish_reason == "tool_calls"
    text = "".join(t.token for t in content)
    assert "get_weather" in text
    # The first token can only open the block: whitespace or the start of "<｜DSML｜ calls>".
    for alt in content[0].top_logprobs:
        assert alt.token.strip() == "" or "<｜DSML｜ calls>".startswith(alt.token.lstrip()), alt.token
    # Once the name is fixed, the rest of `get_weather` is forced: probability 1.
    for t in content:
        assert t.logprob <= 0
        assert sum(2.718281828 ** a.logprob for a in t.top_logprobs) <= 1.0001


def test_max_tokens_first_is_length(client):
    r = create(client, tool_choice="required", max_tokens=4)
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.tool_calls is None
    assert r.usage.completion_tokens == 4


def test_tool_choice_none_never_returns_calls(server, client):
    # Even a model that wrote a DSML block would get it back as content.
    for seed in range(3):
        r = create(client, tool_choice="none", temperature=1.0, seed=seed, max_tokens=32)
        assert r.choices[0].message.tool_calls is None
        assert r.choices[0].finish_reason in ("stop", "length")


def test_enforced_tools_need_tools(server):
    r = httpx.post(server.base + "/v1/chat/completions", headers=server.headers(), timeout=30,
                   json={"messages": MESSAGES, "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = httpx.post(server.base + "/v1/chat/completions", headers=server.headers(), timeout=30,
                   json={"messages": MESSAGES, "tools": TOOLS,
                         "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
