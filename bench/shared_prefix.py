#!/usr/bin/env python3
"""Time to first token with and without the prefix cache, through `spillway serve`'s HTTP API.

    python bench/shared_prefix.py --base-url http://127.0.0.1:8000/v1 --prefix-tokens 8192 --requests 32

Cold: --cold requests, one at a time, each a fresh random prompt of prefix + suffix tokens (nothing to
reuse). Warm: one request primes a shared prefix of --prefix-tokens tokens, then --requests requests
that share it (each with its own random suffix of --suffix-tokens tokens) are sent one at a time, and
again --requests with new suffixes all at once. Token-id prompts (/v1/completions), greedy, ignore_eos,
streaming; TTFT is request sent → first token chunk. `/metrics` is read before and after the warm
phases for the prompt tokens the server served from its prefix cache.

Prints a markdown report. Exits 1 when the warm requests got no cached tokens, or when cold TTFT p50 /
warm (one at a time) TTFT p50 is below --min-speedup.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import re
import time

import httpx
import openai

from load import pct  # bench/load.py, beside this script


async def ttft(client, model: str, prompt: list[int], max_tokens: int) -> float:
    t0 = time.perf_counter()
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, extra_body={"ignore_eos": True})
    first = None
    async for chunk in stream:
        if first is None and chunk.choices and (chunk.choices[0].model_extra or {}).get("token_ids"):
            first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("a stream ended without a token")
    return first


def cached_tokens(base_url: str) -> float:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    m = re.search(r"^spillway_prompt_tokens_cached_total (\S+)", text, re.M)
    return float(m.group(1)) if m else float("nan")


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--model", help="model id (default: the first one GET /v1/models lists)")
    ap.add_argument("--prefix-tokens", type=int, default=8192)
    ap.add_argument("--suffix-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--cold", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1000, help="prompt ids are drawn from [3, vocab)")
    ap.add_argument("--min-speedup", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=600)
    model = args.model or (await client.models.list()).data[0].id

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, args.vocab) for _ in range(n)]

    n_prompt = args.prefix_tokens + args.suffix_tokens
    cold = [await ttft(client, model, ids(n_prompt), args.max_tokens) for _ in range(args.cold)]
    prefix = ids(args.prefix_tokens)
    priming = await ttft(client, model, prefix + ids(args.suffix_tokens), args.max_tokens)
    before = cached_tokens(args.base_url)
    one_at_a_time = [await ttft(client, model, prefix + ids(args.suffix_tokens), args.max_tokens)
                     for _ in range(args.requests)]
    at_once = await asyncio.gather(*(ttft(client, model, prefix + ids(args.suffix_tokens), args.max_tokens)
                                     for _ in range(args.requests)))
    served = cached_tokens(args.base_url) - before

    print(f"prompts of {n_prompt} tokens ({args.prefix_tokens} shared + {args.suffix_tokens} own), "
          f"{args.max_tokens} tokens generated each\n")
    print("| requests | n | TTFT p50 ms | TTFT p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    for name, xs in [("cold, one at a time", cold), ("priming the prefix", [priming]),
                     ("warm, one at a time", one_at_a_time), ("warm, all at once", list(at_once))]:
        print(f"| {name} | {len(xs)} | {pct(xs, 50) * 1e3:.1f} | {pct(xs, 99) * 1e3:.1f} | {max(xs) * 1e3:.1f} |")
    speedup = pct(cold, 50) / pct(one_at_a_time, 50)
    expected = 2 * args.requests * args.prefix_tokens
    print(f"\nprompt tokens served from the prefix cache in the warm phases: {served:.0f} "
          f"(the shared prefixes: {expected})")
    print(f"cold / warm TTFT p50 (one at a time): {speedup:.1f}x (at least {args.min_speedup}x wanted); "
          f"cold / warm p50 all at once: {pct(cold, 50) / pct(list(at_once), 50):.1f}x")
    ok = served > 0 and speedup >= args.min_speedup
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
