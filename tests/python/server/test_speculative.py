"""`serve --speculative ngram` (docs/speculative.md) through the openai SDK, on the bundled demo model, which
copies its context (what prompt lookup drafts): greedy output equals the same server without speculation
(both with --no-stale-index-k, under which verified drafts compute what decode steps compute), streamed or
not; responses and /metrics report the drafts; seeded sampling repeats; bad settings are refused at start-up.
The servers run on SPILLWAY_DEVICE's runner (the CPU runner when unset, as in CI; scripts/gpu_serve.sh sets cuda)."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from spw_server_harness import ROOT, Server

DEMO = ROOT / "models" / "demo"
DEVICE = os.environ.get("SPILLWAY_DEVICE", "cpu")
# A file an agent asks the model to write out again: the second copy is what drafts predict.
SOURCE = ("def parse_header(line):\n    key, _, value = line.partition(':')\n    return key.strip().lower(), value.strip()\n\n\n"
          "def parse_headers(lines):\n    headers = {}\n    for line in lines:\n        key, value = parse_header(line)\n"
          "        headers[key] = value\n    return headers\n")
PROMPT = SOURCE + "\n\n# The same file, written out again:\n" + SOURCE.split("\n", 1)[0] + "\n"


@pytest.fixture(scope="module")
def servers(spillway_bin):
    off = Server(spillway_bin, DEMO, "--device", DEVICE, "--no-stale-index-k", "--speculative", "off", api_key=None)
    on = Server(spillway_bin, DEMO, "--device", DEVICE, "--no-stale-index-k", "--speculative", "ngram", api_key=None)
    yield off, on
    for s in (off, on):
        assert s.stop() == 0, "".join(s.log[-30:])


def test_greedy_output_equals_plain_decoding_and_usage_reports_drafts(servers):
    off, on = servers
    a = off.client().completions.create(model="demo", prompt=PROMPT, max_tokens=64, temperature=0)
    b = on.client().completions.create(model="demo", prompt=PROMPT, max_tokens=64, temperature=0)
    assert b.choices[0].text == a.choices[0].text
    assert b.usage.completion_tokens == a.usage.completion_tokens
    spec = b.usage.model_extra["spillway_speculative"]
    assert spec["drafted_tokens"] > 0 and 0 < spec["accepted_tokens"] <= spec["drafted_tokens"], spec
    assert "spillway_speculative" not in (a.usage.model_extra or {})
    log = "".join(on.log)
    assert re.search(r"speculative decoding: ngram drafts of up to 5 tokens", log), log


def test_streamed_chat_equals_plain_decoding(servers):
    off, on = servers
    messages = [{"role": "user", "content": "Write this file out again:\n" + SOURCE}]
    want = off.client().chat.completions.create(model="demo", messages=messages, max_tokens=48, temperature=0)
    chunks = on.client().chat.completions.create(model="demo", messages=messages, max_tokens=48, temperature=0,
                                                 stream=True, stream_options={"include_usage": True})
    text, reasoning, usage = "", "", None
    for c in chunks:
        if c.choices:
            text += c.choices[0].delta.content or ""
            reasoning += (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        if c.usage:
            usage = c.usage
    assert text == (want.choices[0].message.content or "")
    assert reasoning == ((want.choices[0].message.model_extra or {}).get("reasoning_content") or "")
    assert usage is not None and "spillway_speculative" in usage.model_extra


def test_metrics_count_drafts_and_seeded_sampling_repeats(servers):
    _, on = servers
    client = on.client()
    runs = [client.completions.create(model="demo", prompt=PROMPT, max_tokens=40, temperature=0.8, seed=7).choices[0].text
            for _ in range(2)]
    assert runs[0] == runs[1]
    m = on.metrics()
    drafted = m['spillway_spec_draft_tokens_total{drafter="ngram"}']
    accepted = m['spillway_spec_accepted_tokens_total{drafter="ngram"}']
    steps = m['spillway_spec_verify_steps_total{drafter="ngram"}']
    assert drafted >= accepted > 0 and steps > 0
    assert m['spillway_spec_mean_acceptance_length{drafter="ngram"}'] == pytest.approx((accepted + steps) / steps)


@pytest.mark.parametrize("args, says", [
    (["--draft-tokens", "0"], "--draft-tokens 0 must be at least 1"),
    (["--ngram-min", "3", "--ngram-max", "2"], "n-gram match lengths"),
    (["--speculative", "dspark"], "--speculative"),
])
def test_bad_settings_are_refused_at_start_up(spillway_bin, args, says):
    extra = [] if "--speculative" in args else ["--speculative", "ngram"]
    p = subprocess.run([spillway_bin, "serve", "--model", str(DEMO), "--device", DEVICE, "--port", "0", *extra, *args],
                       capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert says in out, out


def test_logprobs_tool_calls_and_json_mode_equal_plain_decoding(servers):
    """The constraint masks (tool calls, response_format) and logprobs go through the acceptance step too."""
    off, on = servers
    a = off.client().completions.create(model="demo", prompt=PROMPT, max_tokens=32, temperature=0, logprobs=3)
    b = on.client().completions.create(model="demo", prompt=PROMPT, max_tokens=32, temperature=0, logprobs=3)
    assert b.choices[0].logprobs.tokens == a.choices[0].logprobs.tokens
    for x, y in zip(a.choices[0].logprobs.top_logprobs, b.choices[0].logprobs.top_logprobs):
        assert x.keys() == y.keys()
        for k in x:
            assert y[k] == pytest.approx(x[k], abs=1e-5)
    tools = [{"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
    messages = [{"role": "user", "content": "Open parse.py and show me parse_header:\n" + SOURCE}]
    calls = []
    for s in (off, on):  # the demo model may not finish its call in the budget: the whole output is compared
        r = s.client().chat.completions.create(model="demo", messages=messages, tools=tools, tool_choice="required",
                                               max_tokens=96, temperature=0)
        m = r.choices[0].message
        calls.append((m.content, [(c.function.name, c.function.arguments) for c in (m.tool_calls or [])],
                      r.choices[0].finish_reason, r.usage.completion_tokens))
    assert calls[1] == calls[0]
    texts = []
    for s in (off, on):
        r = s.client().chat.completions.create(model="demo", messages=messages, max_tokens=64, temperature=0,
                                               response_format={"type": "json_object"})
        texts.append(r.choices[0].message.content)
    assert texts[1] == texts[0]


def test_several_choices_and_echoed_prompt_logprobs_equal_plain_decoding(servers):
    off, on = servers
    kw = dict(model="demo", prompt=PROMPT, max_tokens=24, temperature=0, n=3)
    a = off.client().completions.create(**kw)
    b = on.client().completions.create(**kw)
    assert [c.text for c in b.choices] == [c.text for c in a.choices]
    assert b.usage.model_extra["spillway_speculative"]["drafted_tokens"] > 0
    kw = dict(model="demo", prompt=PROMPT, max_tokens=8, temperature=0, echo=True, logprobs=1)
    a = off.client().completions.create(**kw)
    b = on.client().completions.create(**kw)
    assert b.choices[0].text == a.choices[0].text
    assert b.choices[0].logprobs.token_logprobs[1:] == pytest.approx(a.choices[0].logprobs.token_logprobs[1:], abs=1e-5)
