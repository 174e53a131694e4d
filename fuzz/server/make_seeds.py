#!/usr/bin/env python3
"""Write the seeds of the request-JSON fuzz targets (fuzz/server/corpus/<target>): ordinary requests,
plus deep and wide JSON at and just past the limits (spw::JsonLimits, max_depth 64) that fit the
fuzzers' 4,096-byte inputs."""
import hashlib
import json
import pathlib

root = pathlib.Path(__file__).resolve().parent / "corpus"

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
          "days": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": SCHEMA}}]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def deep(n, inner="1"):
    return "[" * n + inner + "]" * n


def deep_object(n):
    return '{"a":' * n + "1" + "}" * n


def schema_nested(n):
    s = {"type": "string"}
    for _ in range(n):
        s = {"type": "object", "properties": {"x": s}}
    return s


def write(target, data):
    out = root / target
    out.mkdir(parents=True, exist_ok=True)
    (out / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)


def j(v):
    return json.dumps(v, ensure_ascii=False)


bodies_chat = [
    j(CHAT),
    j({**CHAT, "tools": TOOLS, "tool_choice": "required"}),
    j({**CHAT, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
       "parallel_tool_calls": False, "thinking": {"type": "enabled"}}),
    j({**CHAT, "messages": [{"role": "user", "content": "hi"},
                            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                             "function": {"name": "get_weather", "arguments": j({"city": "Oslo", "n": [1, 2.5]})}}]},
                            {"role": "tool", "tool_call_id": "c", "content": "sunny"}], "tools": TOOLS}),
    j({**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": schema_nested(30)}}],
       "tool_choice": "required"}),
    '{"x":' + deep(62) + ',"y":1}',
    '{"x":' + deep(64) + ',"y":1}',
    '{"x":' + deep(2000) + ',"y":1}',
    '{"messages":[{"role":"user","content":"hi"}],"x":' + deep_object(70) + "}",
    '{"messages":[' + ",".join(['{"role":"user","content":""}'] * 100) + "]}",
    '{"x":[' + ",".join(["[]"] * 1000) + "]}",
]
for b in bodies_chat:
    for family in (0, 1):
        write("fuzz_chat_request", bytes([family]) + b.encode())

bodies_completion = [
    j({"model": "m", "prompt": "hello", "max_tokens": 8, "temperature": 0.7, "stop": ["a"], "n": 2,
       "stream": True, "stream_options": {"include_usage": True}, "logprobs": 2, "echo": True}),
    j({"model": "m", "prompt": list(range(200)), "max_tokens": 8}),
    '{"prompt":"x","y":' + deep(64) + "}",
    '{"prompt":"x","y":' + deep(65) + "}",
    '{"prompt":"x","y":' + deep(2000) + "}",
    '{"prompt":[' + ",".join(["0"] * 2000) + "]}",
    '{' + ",".join(f'"k{i}":{i}' for i in range(400)) + "}",
]
for b in bodies_completion:
    write("fuzz_completion_request", b.encode())

tool_sets = [
    TOOLS,
    [{"type": "function", "function": {"name": "f", "parameters": schema_nested(29)}}],
    [{"type": "function", "function": {"name": "f", "parameters": schema_nested(40)}}],
    [{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties":
      {f"p{i}": {"type": t} for i, t in enumerate(["string", "integer", "number", "boolean", "null", "object", "array"])},
      "required": ["p0", "p1"]}}},
     {"type": "function", "function": {"name": "b"}}],
]
outputs = [
    b"",
    "\n\n<\uff5cDSML\uff5ctool_calls>\n<\uff5cDSML\uff5cinvoke name=\"get_weather\">\n"
    "<\uff5cDSML\uff5cparameter name=\"city\" string=\"true\">Oslo</\uff5cDSML\uff5cparameter>\n"
    "</\uff5cDSML\uff5cinvoke>\n</\uff5cDSML\uff5ctool_calls>".encode(),
]
for tools in tool_sets:
    for out in outputs:
        for flags in (1, 7):
            write("fuzz_tool_grammar", bytes([flags]) + j(tools).encode() + (b"\0" + out if out else b""))
write("fuzz_tool_grammar", bytes([1]) + ('[{"type":"function","function":{"name":"f","parameters":' +
                                         deep_object(600) + "}}]").encode())

for text in [j({"city": "Oslo", "n": [1, 2.5, -0.0, 1e-05, 1e16, 18446744073709551615, None, True]}),
             j({"s": "\u00e9\n\t\"\\\u0001", "o": {}, "a": []}), j(j({"a": 1})), "not json",
             deep(64), deep(65), deep(2000), deep_object(64), deep_object(65), deep_object(600),
             "[" + ",".join(["{}"] * 1000) + "]"]:
    write("fuzz_py_json", text.encode())

for t in sorted(root.iterdir()):
    print(len(list(t.iterdir())), "seeds in", t)
