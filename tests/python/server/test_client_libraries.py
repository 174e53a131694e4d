"""litellm and langchain-openai against a real `spillway serve` on the fixture model: JSON mode,
structured output (json_schema and function calling) and tools. Both must work offline: litellm
reads its bundled model cost map (LITELLM_LOCAL_MODEL_COST_MAP) and ships the tiktoken encodings it
uses, and langchain-openai needs tiktoken only for token counting, which these tests do not use.
Every test runs with the HTTP(S) proxy pointed at a closed port (loopback exempt), so a library that
reaches for the internet fails here instead of passing on a machine that happens to be online."""
from __future__ import annotations

import json
import os
from typing import Literal

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import litellm  # noqa: E402
import pytest  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from pydantic import BaseModel  # noqa: E402


@pytest.fixture(autouse=True)
def no_internet(monkeypatch):
    dead = "http://127.0.0.1:9"
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(var, dead)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


MESSAGES = [{"role": "user", "content": "Name a city."}]
CITY_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "enum": ["Paris", "Berlin"]}, "population": {"type": "integer"}},
    "required": ["name", "population"],
    "additionalProperties": False,
}


class City(BaseModel):
    """A city and its population."""

    name: Literal["Paris", "Berlin"]
    population: int


@tool
def get_weather(city: Literal["Paris", "Berlin", "Tokyo"], days: int) -> str:
    """Weather for a city over some days."""
    return "sunny"


def litellm_call(server, **kw):
    return litellm.completion(model="openai/tiny-v41", api_base=server.base + "/v1", api_key=server.api_key,
                              messages=MESSAGES, max_tokens=kw.pop("max_tokens", 300), temperature=0, **kw)


def chat_model(server, **kw) -> ChatOpenAI:
    return ChatOpenAI(model="tiny-v41", base_url=server.base + "/v1", api_key=server.api_key, temperature=0,
                      max_tokens=kw.pop("max_tokens", 300), max_retries=0, **kw)


def closing_bias(tokenizer) -> dict[int, int]:
    """The random model seldom closes free strings: a bias on '"' and '}' keeps JSON-mode tests short.
    Which tokens may come next is still the constraint's alone."""
    return {tokenizer.token_to_id(t): 6 for t in ('"', "}")}


def test_litellm_json_schema(server):
    r = litellm_call(server, response_format={"type": "json_schema",
                                              "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}})
    out = json.loads(r.choices[0].message.content)
    assert out["name"] in ("Paris", "Berlin") and isinstance(out["population"], int)


def test_litellm_json_object(server, tokenizer):
    bias = {str(k): v for k, v in closing_bias(tokenizer).items()}
    r = litellm_call(server, response_format={"type": "json_object"}, logit_bias=bias, max_tokens=600)
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_litellm_tools(server):
    tools = [{"type": "function", "function": {"name": "get_city", "parameters": CITY_SCHEMA}}]
    r = litellm_call(server, tools=tools, tool_choice="required")
    calls = r.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_city"
    args = json.loads(calls[0].function.arguments)
    assert args["name"] in ("Paris", "Berlin") and isinstance(args["population"], int)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(server, method):
    city = chat_model(server).with_structured_output(City, method=method).invoke("Name a city.")
    assert isinstance(city, City) and city.name in ("Paris", "Berlin")


def test_langchain_json_schema_dict(server):
    out = chat_model(server).with_structured_output(CITY_SCHEMA | {"title": "city"}, method="json_schema").invoke("x")
    assert out["name"] in ("Paris", "Berlin") and isinstance(out["population"], int)


def test_langchain_json_mode(server, tokenizer):
    llm = chat_model(server, max_tokens=600, logit_bias=closing_bias(tokenizer))
    out = llm.with_structured_output(None, method="json_mode").invoke("Reply in JSON.")
    assert isinstance(out, dict)


def test_langchain_tools(server):
    msg = chat_model(server).bind_tools([get_weather], tool_choice="required").invoke("Weather in Paris?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    args = msg.tool_calls[0]["args"]
    assert args["city"] in ("Paris", "Berlin", "Tokyo") and isinstance(args["days"], int)
