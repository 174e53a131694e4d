#!/usr/bin/env python3
"""Load generator for `spillway serve`: N concurrent streaming requests through the official async
openai client, reporting time to first token, inter-token latency and aggregate tokens/s.

    python bench/load.py --base-url http://127.0.0.1:8000/v1 --concurrency 1,4,16,64 \
        --requests-per-stream 2 --prompt-tokens 64 --max-tokens 32

Prompts are random token-id lists (the /v1/completions token-id path, so the numbers measure the
engine and transport, not a tokenizer); --chat sends chat messages instead. Greedy unless
--temperature is given; ignore_eos so every request generates exactly --max-tokens tokens.
TTFT: request sent → first token chunk. ITL: gaps between token chunks of one request.
Tokens/s: completion tokens of all requests / wall time of the level.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import openai


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[k]


async def one_request(client, args, rng) -> tuple[float, list[float], int]:
    kw = dict(model=args.model, max_tokens=args.max_tokens, temperature=args.temperature, stream=True,
              extra_body={"ignore_eos": True})
    t0 = time.perf_counter()
    if args.chat:
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega"]) for _ in range(args.prompt_tokens))
        stream = await client.chat.completions.create(messages=[{"role": "user", "content": words}], **kw)
    else:
        prompt = [rng.randrange(3, args.vocab) for _ in range(args.prompt_tokens)]
        stream = await client.completions.create(prompt=prompt, **kw)
    ttft, last, gaps, n = None, None, [], 0
    async for chunk in stream:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        k = len((c.model_extra or {}).get("token_ids", [])) if not args.chat else (1 if c.delta and (
            c.delta.content or (c.delta.model_extra or {}).get("reasoning_content")) else 0)
        if k == 0:
            continue
        now = time.perf_counter()
        if ttft is None:
            ttft = now - t0
        else:
            gaps.append(now - last)
        last = now
        n += k
    return ttft if ttft is not None else float("nan"), gaps, n


async def level(client, args, concurrency: int) -> dict:
    rng = random.Random(concurrency)
    results = []

    async def worker(i):
        r = random.Random(rng.random())
        for _ in range(args.requests_per_stream):
            results.append(await one_request(client, args, r))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    wall = time.perf_counter() - t0
    ttfts = [r[0] for r in results]
    gaps = [g for r in results for g in r[1]]
    tokens = sum(r[2] for r in results)
    return dict(concurrency=concurrency, requests=len(results), tokens=tokens, wall=wall, tok_s=tokens / wall,
                ttft_p50=pct(ttfts, 50), ttft_p90=pct(ttfts, 90), ttft_p99=pct(ttfts, 99), itl_p50=pct(gaps, 50),
                itl_p90=pct(gaps, 90), itl_p99=pct(gaps, 99),
                itl_mean=statistics.fmean(gaps) if gaps else float("nan"))


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--model", help="model id (default: the first one GET /v1/models lists)")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--vocab", type=int, default=1000, help="prompt ids are drawn from [3, vocab)")
    ap.add_argument("--chat", action="store_true")
    args = ap.parse_args()
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=600)
    if not args.model:  # the server answers 404 model_not_found to any other name
        args.model = (await client.models.list()).data[0].id
    print("| streams | requests | tokens | wall s | tokens/s | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | ITL p50 ms | "
          "ITL p90 ms | ITL p99 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in [int(x) for x in args.concurrency.split(",")]:
        r = await level(client, args, c)
        print(f"| {r['concurrency']} | {r['requests']} | {r['tokens']} | {r['wall']:.1f} | {r['tok_s']:.1f} | "
              f"{r['ttft_p50'] * 1e3:.0f} | {r['ttft_p90'] * 1e3:.0f} | {r['ttft_p99'] * 1e3:.0f} | "
              f"{r['itl_p50'] * 1e3:.1f} | {r['itl_p90'] * 1e3:.1f} | {r['itl_p99'] * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
