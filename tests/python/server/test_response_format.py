"""response_format through the openai SDK: the random-weight fixture model writes valid JSON only
because decoding is constrained (json_object: any object; json_schema: the schema's subset, with
enums, required keys, nested objects, arrays and integers). Unsupported schemas are a 400."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

MESSAGES = [{"role": "user", "content": "Describe a city as JSON."}]

CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["Paris", "Berlin", "Tokyo"]},
        "population": {"type": "integer"},
        "coastal": {"type": "boolean"},
        "location": {
            "type": "object",
            "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
            "required": ["lat", "lon"],
            "additionalProperties": False,
        },
        "districts": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
        "mayor": {"anyOf": [{"type": "string", "enum": ["A", "B"]}, {"type": "null"}]},
        "kind": {"$ref": "#/$defs/kind"},
    },
    "required": ["name", "population", "location", "districts", "kind"],
    "additionalProperties": False,
    "$defs": {"kind": {"enum": ["capital", "port", 3]}},
}


def chat(client, response_format, **kw):
    return client.chat.completions.create(model="tiny-v41", messages=MESSAGES, response_format=response_format,
                                          max_tokens=kw.pop("max_tokens", 400), **kw)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_output_validates(client, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    r = chat(client, fmt, temperature=1, seed=seed)
    c = r.choices[0]
    assert c.finish_reason == "stop", c.message.content
    jsonschema.validate(json.loads(c.message.content), CITY)


def test_json_schema_greedy_and_streaming_agree(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
    whole = chat(client, fmt, temperature=0)
    jsonschema.validate(json.loads(whole.choices[0].message.content), CITY)
    text = "".join(ch.choices[0].delta.content or "" for ch in chat(client, fmt, temperature=0, stream=True)
                   if ch.choices)
    assert text == whole.choices[0].message.content


def test_json_object_gives_an_object(client, tokenizer):
    # Free keys and values are open strings, which the random model seldom closes: a bias on '"' and
    # '}' keeps the test short. Which tokens may come next is still the constraint's alone.
    bias = {str(tokenizer.token_to_id(t)): 6 for t in ('"', "}")}
    for seed in (4, 5):
        r = chat(client, {"type": "json_object"}, temperature=1, seed=seed, max_tokens=600, logit_bias=bias)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_unconstrained_output_is_not_json(client):
    """The constraint is what makes the output JSON: without it the fixture model writes noise."""
    r = client.chat.completions.create(model="tiny-v41", messages=MESSAGES, max_tokens=40, temperature=0)
    with pytest.raises(ValueError):
        json.loads(r.choices[0].message.content)


def test_completions_take_response_format(client):
    r = client.completions.create(model="tiny-v41", prompt="JSON:", max_tokens=400, temperature=0,
                                  extra_body={"response_format": {"type": "json_schema",
                                                                  "json_schema": {"name": "c", "schema": CITY}}})
    jsonschema.validate(json.loads(r.choices[0].text), CITY)


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "pattern": "a+"}, "'pattern'"),
    ({"type": "object", "properties": {"a": {"type": "string", "format": "date"}}}, "properties.a"),
    ({"anyOf": [{"type": "integer"}, {"type": "number"}]}, "alternatives"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}, "'required'"),
    ({"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}}},
     "recursive"),
    ({"type": "tuple"}, "unknown type"),
])
def test_unsupported_schema_is_a_400(client, schema, words):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert e.value.body["param"] == "response_format"
    assert words in e.value.body["message"]


def test_response_format_with_required_tool_is_a_400(client):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, {"type": "json_object"}, tools=[tool], tool_choice="required")
    assert e.value.body["param"] == "response_format"
