"""/v1/completions through the official openai SDK: text and token-id prompts, streaming,
usage, logprobs, stop sequences and stop token ids, seeds, echo."""
from __future__ import annotations

import openai
import pytest

from spw_server_harness import VOCAB

PROMPT_IDS = [0, 17, 42, 99, 7]


def greedy(client, prompt, n=16, **kw):
    return client.completions.create(model="tiny-v41", prompt=prompt, max_tokens=n, temperature=0, **kw)


def token_ids(choice) -> list[int]:
    return choice.model_extra["token_ids"]


def test_token_id_prompt_non_streaming(client):
    r = greedy(client, PROMPT_IDS, 12, extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert r.object == "text_completion"
    assert c.finish_reason == "length"
    assert len(token_ids(c)) == 12
    assert all(0 <= t < VOCAB for t in token_ids(c))
    assert r.usage.prompt_tokens == len(PROMPT_IDS)
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == len(PROMPT_IDS) + 12


def test_greedy_is_deterministic_and_streaming_matches(client):
    a = greedy(client, "Hello world! How are you", 16)
    b = greedy(client, "Hello world! How are you", 16)
    assert a.choices[0].text == b.choices[0].text
    assert token_ids(a.choices[0]) == token_ids(b.choices[0])
    text, ids, finish = "", [], None
    for chunk in client.completions.create(model="tiny-v41", prompt="Hello world! How are you", max_tokens=16,
                                           temperature=0, stream=True):
        c = chunk.choices[0]
        text += c.text
        ids += token_ids(c)
        finish = c.finish_reason or finish
    assert text == a.choices[0].text
    assert ids == token_ids(a.choices[0])
    assert finish == a.choices[0].finish_reason


def test_text_matches_tokenizer(client, tokenizer):
    r = greedy(client, "The quick brown fox", 24, extra_body={"ignore_eos": True})
    ids = token_ids(r.choices[0])
    assert r.choices[0].text == tokenizer.decode(ids, skip_special_tokens=True)
    assert r.usage.prompt_tokens == len(tokenizer.encode("The quick brown fox", add_special_tokens=False).ids)


def test_stream_include_usage(client):
    chunks = list(client.completions.create(model="tiny-v41", prompt=PROMPT_IDS, max_tokens=5, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.prompt_tokens == len(PROMPT_IDS)
    assert chunks[-2].choices[0].finish_reason == "length"


def test_stop_sequence_truncates_and_reports_stop(client):
    full = greedy(client, "Weather in Paris", 40, extra_body={"ignore_eos": True}).choices[0].text
    assert len(full) >= 12, full
    stop = full[8:11]
    expected = full[: full.find(stop)]
    for stream in (False, True):
        if stream:
            text, finish = "", None
            for ch in client.completions.create(model="tiny-v41", prompt="Weather in Paris", max_tokens=40,
                                                temperature=0, stop=[stop, "\x00never"], stream=True,
                                                extra_body={"ignore_eos": True}):
                text += ch.choices[0].text
                finish = ch.choices[0].finish_reason or finish
        else:
            r = greedy(client, "Weather in Paris", 40, stop=[stop, "\x00never"], extra_body={"ignore_eos": True})
            text, finish = r.choices[0].text, r.choices[0].finish_reason
        assert text == expected
        assert finish == "stop"


def test_stop_token_ids(client):
    ids = token_ids(greedy(client, PROMPT_IDS, 10, extra_body={"ignore_eos": True}).choices[0])
    target = ids[4]
    first = ids.index(target)
    r = greedy(client, PROMPT_IDS, 10, extra_body={"ignore_eos": True, "stop_token_ids": [target]})
    assert token_ids(r.choices[0]) == ids[: first + 1]
    assert r.choices[0].finish_reason == "stop"


def test_logprobs(client):
    r = greedy(client, PROMPT_IDS, 6, logprobs=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 6 and len(lp.token_logprobs) == 6 and len(lp.top_logprobs) == 6
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0
        assert len(top) <= 3
        # Greedy: the chosen token is the most likely one.
        assert abs(max(top.values()) - chosen) < 1e-6
    assert lp.text_offset == sorted(lp.text_offset)


def test_same_seed_same_output_and_seeds_differ(client):
    kw = dict(model="tiny-v41", prompt="Hello world", max_tokens=24, temperature=1.0, top_p=0.95,
              extra_body={"ignore_eos": True, "min_p": 0.01, "top_k": 200})
    a = client.completions.create(seed=1234, **kw)
    b = client.completions.create(seed=1234, **kw)
    c = client.completions.create(seed=999, **kw)
    assert token_ids(a.choices[0]) == token_ids(b.choices[0])
    assert token_ids(a.choices[0]) != token_ids(c.choices[0])


def test_penalties_change_sampling(client):
    base = token_ids(greedy(client, PROMPT_IDS, 32, extra_body={"ignore_eos": True}).choices[0])
    pen = token_ids(greedy(client, PROMPT_IDS, 32, frequency_penalty=2.0, presence_penalty=2.0,
                           extra_body={"ignore_eos": True}).choices[0])
    assert len(pen) == 32
    # Heavy penalties forbid repeats that greedy decoding of a random model makes.
    assert len(set(pen)) >= len(set(base))


def test_echo(client):
    r = greedy(client, "Hello world", 4, echo=True)
    assert r.choices[0].text.startswith("Hello world")


def test_max_tokens_respected_with_eos(client):
    r = greedy(client, PROMPT_IDS, 3)
    assert len(token_ids(r.choices[0])) <= 3
    assert r.choices[0].finish_reason in ("stop", "length")


def test_models_endpoint(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-v41"]


def test_tokenize_detokenize(server, tokenizer):
    import httpx
    r = httpx.post(server.base + "/tokenize", json={"prompt": "Hello world! <｜User｜>"}, headers=server.headers())
    assert r.status_code == 200, r.text
    ids = r.json()["tokens"]
    assert ids == tokenizer.encode("Hello world! <｜User｜>", add_special_tokens=False).ids
    d = httpx.post(server.base + "/detokenize", json={"tokens": ids}, headers=server.headers())
    assert d.status_code == 200 and d.json()["prompt"] == "Hello world! <｜User｜>"


def test_logit_bias_forces_and_bans_tokens_under_greedy(client):
    base = token_ids(greedy(client, PROMPT_IDS, 6, extra_body={"ignore_eos": True}).choices[0])
    forced = token_ids(greedy(client, PROMPT_IDS, 6, logit_bias={"123": 100},
                              extra_body={"ignore_eos": True}).choices[0])
    assert forced == [123] * 6 and base != forced
    banned = {str(t): -100 for t in set(base)}
    after = token_ids(greedy(client, PROMPT_IDS, 6, logit_bias=banned, extra_body={"ignore_eos": True}).choices[0])
    assert len(after) == 6 and not set(after) & set(base)


def test_logit_bias_out_of_vocabulary_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        greedy(client, PROMPT_IDS, 2, logit_bias={str(VOCAB): 5})
    assert "logit_bias" in str(e.value) and "vocabulary" in str(e.value)


def test_batched_prompts_index_prompt_major(client):
    prompts = [[0, 17, 42], [5, 6, 7, 8], [99]]
    singles = [greedy(client, p, 5, extra_body={"ignore_eos": True}) for p in prompts]
    r = greedy(client, prompts, 5, extra_body={"ignore_eos": True, "n": 2})
    assert [c.index for c in r.choices] == list(range(6))
    for p, single in enumerate(singles):
        for i in range(2):
            assert token_ids(r.choices[p * 2 + i]) == token_ids(single.choices[0])
    assert r.usage.prompt_tokens == sum(len(p) for p in prompts)
    assert r.usage.completion_tokens == 6 * 5


def test_batched_text_prompts_stream_and_echo(client):
    prompts = ["Hello world", "The quick brown fox"]
    whole = greedy(client, prompts, 6, echo=True, extra_body={"ignore_eos": True})
    assert [c.text.startswith(p) for c, p in zip(whole.choices, prompts)] == [True, True]
    texts = {}
    for chunk in client.completions.create(model="tiny-v41", prompt=prompts, max_tokens=6, temperature=0, echo=True,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True}):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
        if chunk.usage:
            usage = chunk.usage
    assert texts == {0: whole.choices[0].text, 1: whole.choices[1].text}
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_echo_with_logprobs_scores_the_prompt(client):
    """The prompt's logprobs (first token null) equal what a completion of each prefix reports
    for the next prompt token: the teacher-forced check, with the legacy SDK fields."""
    prompt = [0, 17, 42, 99, 7, 300]
    r = client.completions.create(model="tiny-v41", prompt=prompt, max_tokens=2, temperature=0, echo=True,
                                  logprobs=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(prompt) + 2
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[0] == 0
    for i in range(1, len(prompt)):
        prefix = client.completions.create(model="tiny-v41", prompt=prompt[:i], max_tokens=1, temperature=0,
                                           logprobs=20, logit_bias={str(prompt[i]): 100})
        # The bias forces the prompt token; logprobs stay the model's own.
        assert token_ids(prefix.choices[0]) == [prompt[i]]
        assert lp.token_logprobs[i] == pytest.approx(prefix.choices[0].logprobs.token_logprobs[0], abs=1e-4)
        assert len(lp.top_logprobs[i]) == 3
    # The generated tail matches a plain request.
    plain = greedy(client, prompt, 2, logprobs=3, extra_body={"ignore_eos": True})
    assert lp.token_logprobs[len(prompt):] == pytest.approx(plain.choices[0].logprobs.token_logprobs, abs=1e-4)


def test_echo_with_logprobs_in_a_batch(client):
    r = client.completions.create(model="tiny-v41", prompt=["Hello world", "The quick fox"], max_tokens=1,
                                  temperature=0, echo=True, logprobs=0)
    for c, p in zip(r.choices, ["Hello world", "The quick fox"]):
        assert c.text.startswith(p)
        assert c.logprobs.token_logprobs[0] is None
        assert all(x is not None and x <= 0 for x in c.logprobs.token_logprobs[1:])
        assert "".join(c.logprobs.tokens) == c.text
