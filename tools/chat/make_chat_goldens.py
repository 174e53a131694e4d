#!/usr/bin/env python3
"""Regenerate tests/unit/data/chat_goldens_{v4,v41}.json from DeepSeek's official chat encoders.

The official encoders are NOT part of this repository. Get them from the model releases:
  V4:   https://huggingface.co/deepseek-ai/DeepSeek-V4-Flash   encoding/encoding_dsv4.py
        (byte copy on GitHub: Mockingjay1316/deepseek-v4-flash-spark, encoding/)
  V4.1: https://huggingface.co/deepseek-ai/DeepSeek-V4.1-Flash encoding/encoding.py
        (revision dba1be0a40aa45a94ad051997016db3960a90277)
and run, for example:
  python3 tools/chat/make_chat_goldens.py --v4 /tmp/official/encoding_dsv4.py \
      --v41 /tmp/official/encoding.py --out tests/unit/data

Each golden file holds:
  "cases":       {"name", "request", "prompt"}: an OpenAI-shaped request (messages, tools,
                 thinking, reasoning_effort) and the prompt text the official encode_messages()
                 returns for it. Requests map onto the official call as serving wrappers do:
                 tools ride on message 0, a system message (an empty one is inserted when the
                 conversation does not start with one); thinking=True -> thinking_mode="thinking".
  "completions": {"name", "thinking", "text", "expected"}: an assistant turn rendered by the
                 official render_message() (what the model would generate after the prompt) and
                 the official parse_message_from_completion_text() result for it; the streaming
                 parser must reproduce "expected" however the text is split.
  "errors":      {"name", "request", "error"}: requests the C++ encoder must reject (the message
                 substring it must contain); not run through the official code.
"""
import argparse
import copy
import importlib.util
import json
import pathlib

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web.\nReturns the top results (tab\there).",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
            "threshold": {"type": "number", "minimum": 0.5, "maximum": 1e16, "multipleOf": 1e-05,
                          "default": 100.0}},
            "required": ["query"], "additionalProperties": False}}},
]
# Unusual key order, a strict flag and non-ASCII text: the schema is embedded in this exact order.
TOOLS_ODD = [
    {"type": "function", "function": {
        "parameters": {"properties": {"text": {"type": "string", "description": "要翻译的文本 ✓"}},
                       "type": "object"},
        "strict": True,
        "name": "translate",
        "description": "Übersetzen – \u0001control \\ backslash"}},
]

CALLS_2 = [
    {"id": "call_a", "type": "function",
     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}},
    {"id": "call_b", "type": "function",
     "function": {"name": "search", "arguments": "{\"query\": \"Paris events\", \"limit\": 3}"}},
]
CALLS_TYPES = [
    {"id": "call_t", "type": "function", "function": {"name": "search", "arguments": json.dumps({
        "query": "línea \"quoted\"\nnext", "limit": 5, "threshold": 0.75, "flags": [True, False, None],
        "nested": {"b": 1, "a": [1.0, 2.5e-07, 1e22]}, "emoji": "😀"}, ensure_ascii=True)}},
]


def u(text):
    return {"role": "user", "content": text}


def a(content, reasoning=None, calls=None):
    m = {"role": "assistant", "content": content}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    if calls is not None:
        m["tool_calls"] = calls
    return m


def t(call_id, content):
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def sysm(text):
    return {"role": "system", "content": text}


def common_cases():
    c = []
    add = lambda name, **req: c.append({"name": name, "request": req})
    add("no_messages", messages=[])
    add("user_chat", messages=[u("Hello!")])
    add("user_thinking", messages=[u("Hello!")], thinking=True)
    add("system_user_chat", messages=[sysm("You are a helpful assistant."), u("Hi")])
    add("system_user_thinking", messages=[sysm("You are a helpful assistant."), u("Hi")], thinking=True)
    add("empty_user", messages=[u("")])
    multi = [sysm("Be brief."), u("What is 2+2?"), a("4", reasoning="Simple sum."), u("And 3+3?")]
    add("multi_turn_chat", messages=multi)
    add("multi_turn_thinking_drops_reasoning", messages=multi, thinking=True)
    add("thinking_two_earlier_turns", thinking=True, messages=[
        u("q1"), a("a1", reasoning="r1"), u("q2"), a("a2", reasoning="r2"), u("q3")])
    add("assistant_last_chat", messages=[u("Continue"), a("Partial answer", reasoning="why")])
    add("assistant_last_thinking", messages=[u("Continue"), a("Partial answer", reasoning="why")],
        thinking=True)
    add("consecutive_users_merge", messages=[u("first"), u("second")])
    add("assistant_after_assistant", messages=[u("q"), a("one"), a("two"), u("next")])
    add("unicode_content", messages=[sysm("Réponds en français 🙂"),
                                     u("你好，世界！ \"quotes\" \\ back\nline\ttab")])
    add("tools_with_system_chat", tools=TOOLS, messages=[sysm("You can use tools."), u("Weather in Paris?")])
    add("tools_without_system_thinking", tools=TOOLS, messages=[u("Weather in Paris?")], thinking=True)
    add("tools_odd_schema", tools=TOOLS_ODD, messages=[u("Translate 'hi'")])
    add("tool_round_trip_chat", tools=TOOLS, messages=[
        sysm("sys"), u("Weather and events in Paris?"), a("", calls=CALLS_2),
        t("call_a", "{\"temp\": 21}"), t("call_b", "Fête de la musique"), ])
    add("tool_results_sorted_by_call_order", tools=TOOLS, messages=[
        u("Weather and events in Paris?"), a(None, calls=CALLS_2),
        t("call_b", "events: none"), t("call_a", "sunny")])
    add("tools_multi_turn_thinking_keeps_reasoning", tools=TOOLS, thinking=True, messages=[
        sysm("sys"), u("Weather and events in Paris?"),
        a("Let me check.", reasoning="Need both tools.", calls=CALLS_2),
        t("call_b", "events: none"), t("call_a", "sunny"),
        a("Sunny, no events.", reasoning="Summarise."), u("Thanks! And tomorrow?")])
    add("tool_argument_types", tools=TOOLS, messages=[u("search"), a("", calls=CALLS_TYPES),
                                                      t("call_t", "ok")])
    add("tool_arguments_not_json", tools=TOOLS, messages=[u("x"), a("", calls=[
        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "not json {"}}]),
        t("c1", "r")])
    add("tool_arguments_empty_object", tools=TOOLS, messages=[u("x"), a("", calls=[
        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]),
        t("c1", "r"), u("and now?")])
    add("tool_result_then_user_text", tools=TOOLS, messages=[u("x"), a("", calls=CALLS_2[:1]),
                                                              t("call_a", "sunny"), u("Thanks")])
    add("tool_content_text_parts", tools=TOOLS, messages=[u("x"), a("", calls=CALLS_2[:1]), {
        "role": "tool", "tool_call_id": "call_a",
        "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}])
    return c


def v4_cases():
    c = common_cases()
    add = lambda name, **req: c.append({"name": name, "request": req})
    add("effort_max_thinking", messages=[sysm("sys"), u("Prove it.")], thinking=True, reasoning_effort="max")
    add("effort_high_thinking", messages=[u("Prove it.")], thinking=True, reasoning_effort="high")
    add("effort_max_chat", messages=[u("Prove it.")], reasoning_effort="max")
    add("developer_chat", messages=[{"role": "developer", "content": "Use metric units."}, u("Temp?")])
    add("developer_dropped_in_thinking", thinking=True, messages=[
        u("q1"), {"role": "developer", "content": "dev note"}, a("a1", reasoning="r1"), u("q2")])
    add("system_twice", messages=[sysm("one"), sysm("two"), u("q")])
    return c


def v41_cases():
    c = common_cases()
    add = lambda name, **req: c.append({"name": name, "request": req})
    add("effort_default_thinking_system", messages=[sysm("sys"), u("q")], thinking=True)
    add("effort_int_1", messages=[u("q")], thinking=True, reasoning_effort=1)
    add("effort_int_33", messages=[sysm("sys"), u("q")], thinking=True, reasoning_effort=33)
    add("effort_low", messages=[u("q")], thinking=True, reasoning_effort="low")
    add("effort_max", messages=[u("q")], thinking=True, reasoning_effort="max")
    add("effort_chat_mode_ignored", messages=[u("q")], reasoning_effort="max")
    add("mid_conversation_system", messages=[sysm("first"), u("q1"), a("a1"), sysm("Now answer in French."),
                                             u("q2")])
    add("mid_conversation_system_last", messages=[u("q1"), a("a1"), sysm("Wrap up.")], thinking=True)
    add("system_twice", messages=[sysm("one"), sysm("two"), u("q")])
    add("image_and_text", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])
    add("images_only_thinking", thinking=True, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/b.png"}}]}])
    add("image_in_tool_result", tools=TOOLS, messages=[u("x"), a("", calls=CALLS_2[:1]), {
        "role": "tool", "tool_call_id": "call_a",
        "content": [{"type": "text", "text": "chart:"}, {"type": "image_url", "image_url": {"url": "u"}}]}])
    add("tool_arguments_double_encoded", tools=TOOLS, messages=[u("x"), a("", calls=[
        {"id": "c1", "type": "function",
         "function": {"name": "search", "arguments": json.dumps(json.dumps({"query": "q", "limit": 2}))}}]),
        t("c1", "r")])
    add("tool_arguments_json_array", tools=TOOLS, messages=[u("x"), a("", calls=[
        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "[1, 2]"}}]),
        t("c1", "r")])
    return c


def error_cases(family):
    e = []
    add = lambda name, error, **req: e.append({"name": name, "request": req, "error": error})
    add("unknown_role", "unknown role \"robot\"", messages=[{"role": "robot", "content": "x"}])
    add("tool_without_call", "answers no tool call", messages=[u("x"), t("nope", "r")])
    add("tool_id_mismatch", "answers no tool call", tools=TOOLS,
        messages=[u("x"), a("", calls=CALLS_2[:1]), t("call_zzz", "r")])
    add("effort_bad_string", "reasoning_effort", messages=[u("x")], thinking=True, reasoning_effort="medium")
    add("effort_out_of_range", "reasoning_effort", messages=[u("x")], thinking=True, reasoning_effort=101)
    add("effort_float", "reasoning_effort", messages=[u("x")], thinking=True, reasoning_effort=50.5)
    add("bad_part_type", "unsupported content part type", messages=[{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {}}]}])
    if family == "v4":
        add("effort_int_v4", "not valid for DeepSeek-V4", messages=[u("x")], reasoning_effort=50)
        add("image_v4", "images need DeepSeek-V4.1", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "u"}}]}])
        add("arguments_array_v4", "must be a JSON object", messages=[u("x"), a("", calls=[
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]), t("c1", "r")])
        add("developer_empty", "developer message needs non-empty content",
            messages=[{"role": "developer", "content": ""}, u("x")])
    else:
        add("placeholder_in_text", "image placeholder", messages=[u("look <｜deepseek_image｜>")])
        add("placeholder_in_reasoning", "image placeholder",
            messages=[u("x"), a("y", reasoning="<｜deepseek_image｜>"), u("z")])
    return e


# Assistant turns for the streaming parser, beyond those inside the cases.
EXTRA_ASSISTANTS = [
    a("Plain answer with <b>html</b>, a lone < and </thi but no markup."),
    a("Line ending\n", calls=CALLS_2[:1]),
    a("Two calls follow.\n\n", reasoning="Think: a < b and c > d.", calls=CALLS_2),
    a("", reasoning="", calls=CALLS_TYPES),
    a("Ends with newlines\n\n"),
    a("数学：∑ 😀", reasoning="推理过程\n\n步骤"),
]


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def official_prompt(enc, req):
    conv = copy.deepcopy(req["messages"])
    if req.get("tools"):
        if not conv or conv[0].get("role") != "system":
            conv.insert(0, {"role": "system", "content": ""})
        conv[0]["tools"] = req["tools"]
    kwargs = {"thinking_mode": "thinking" if req.get("thinking") else "chat"}
    if "reasoning_effort" in req:
        kwargs["reasoning_effort"] = req["reasoning_effort"]
    return enc.encode_messages(conv, **kwargs)


def completions(enc, cases):
    assistants = [m for c in cases for m in c["request"]["messages"] if m.get("role") == "assistant"]
    assistants += EXTRA_ASSISTANTS
    out, seen = [], set()
    for i, msg in enumerate(assistants):
        for thinking in (False, True):
            mode = "thinking" if thinking else "chat"
            # Index 1 after a user turn: rendered as the turn being generated (reasoning kept).
            text = enc.render_message(1, [u(""), msg], thinking_mode=mode)
            if (text, thinking) in seen:
                continue
            seen.add((text, thinking))
            parsed = enc.parse_message_from_completion_text(text, thinking_mode=mode)
            out.append({"name": f"assistant_{i}_{mode}", "thinking": thinking, "text": text, "expected": {
                "reasoning_content": parsed["reasoning_content"] if thinking else "",
                "content": parsed["content"],
                "tool_calls": [{"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}
                               for tc in parsed["tool_calls"]]}})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--v4", required=True, help="path to the official encoding_dsv4.py")
    ap.add_argument("--v41", required=True, help="path to the official V4.1 encoding.py")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parents[2] / "tests/unit/data"))
    args = ap.parse_args()
    for family, path, cases in (("v4", args.v4, v4_cases()), ("v41", args.v41, v41_cases())):
        enc = load(path, f"official_encoding_{family}")
        for case in cases:
            case["prompt"] = official_prompt(enc, case["request"])
        doc = {"family": family, "cases": cases, "completions": completions(enc, cases),
               "errors": error_cases(family)}
        dest = pathlib.Path(args.out) / f"chat_goldens_{family}.json"
        dest.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"{dest}: {len(doc['cases'])} cases, {len(doc['completions'])} completions, "
              f"{len(doc['errors'])} error cases")


if __name__ == "__main__":
    main()
