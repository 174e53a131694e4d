#!/usr/bin/env python3
"""KV exhaustion under load: every request is answered, and the server returns to its idle state.

    python tools/serve/check_overload.py --base-url http://127.0.0.1:8000/v1 --requests 256 \
        --prompt-tokens 512 --max-tokens 64

Run it against a server whose KV capacity (--kv-tokens) and queue (--max-queue) are far smaller than the
load, so admission runs out of KV, running sequences are preempted as they grow, and the queue fills. Sends --requests non-streaming greedy
completions (random token-id prompts, ignore_eos) at once and checks:
 1. each is answered either 200 with exactly --max-tokens tokens, or 503 with a Retry-After header
    (the queue was full); anything else, a dropped connection included, counts as lost;
 2. the server's rejected-requests counter grew by the number of 503s;
 3. within --settle seconds after the last answer the server is idle again: nothing queued or running,
    no KV positions held, KV blocks back to their value before the load;
 4. the burst runs --bursts times (default 3), and the last burst leaves the device memory (when the
    runner reports it) where the one before left it: the earlier bursts may leave one-time allocations
    (CUDA graphs of a decode row count met for the first time, lazily loaded kernels), a leak grows
    with every burst.
Prints a markdown report; exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import re
import time

import httpx

GAUGES = ["spillway_queue_depth", "spillway_running_sequences", "spillway_kv_tokens_used", "spillway_kv_blocks_used",
          "spillway_device_memory_used_bytes", "spillway_requests_rejected_total", "spillway_requests_finished_total",
          "spillway_preemptions_total"]


def read_metrics(http: httpx.Client) -> dict[str, float]:
    text = http.get("/metrics").text
    out = {}
    for name in GAUGES:
        m = re.search(rf"^{name} (\S+)", text, re.M)
        if m:
            out[name] = float(m.group(1))
    return out


async def one(http: httpx.AsyncClient, body: dict, want: int) -> str:
    try:
        r = await http.post("/v1/completions", json=body)
    except httpx.HTTPError as e:
        return f"lost ({type(e).__name__})"
    if r.status_code == 200:
        n = len(r.json()["choices"][0].get("token_ids") or [])
        return "completed" if n == want else f"short ({n} tokens)"
    if r.status_code == 503:
        return "rejected 503" if r.headers.get("retry-after") else "503 without Retry-After"
    return f"lost (HTTP {r.status_code})"


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", help="model id (default: the first one GET /v1/models lists)")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=1000, help="prompt ids are drawn from [3, vocab)")
    ap.add_argument("--settle", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--bursts", type=int, default=3, help="identical bursts, one after another (at least 2)")
    args = ap.parse_args()
    root = args.base_url.removesuffix("/v1")
    sync = httpx.Client(base_url=root, timeout=60)
    model = args.model or sync.get("/v1/models").json()["data"][0]["id"]
    idle = read_metrics(sync)
    rng = random.Random(args.seed)
    bodies = [{"model": model, "prompt": [rng.randrange(3, args.vocab) for _ in range(args.prompt_tokens)],
               "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True} for _ in range(args.requests)]
    limits = httpx.Limits(max_connections=args.requests, max_keepalive_connections=0)

    async def burst() -> tuple[dict[str, int], float]:
        t0 = time.perf_counter()
        async with httpx.AsyncClient(base_url=root, timeout=900, limits=limits) as http:
            outcomes = await asyncio.gather(*(one(http, b, args.max_tokens) for b in bodies))
        counts: dict[str, int] = {}
        for o in outcomes:
            counts[o] = counts.get(o, 0) + 1
        return counts, time.perf_counter() - t0

    def settled() -> dict[str, float]:
        deadline = time.monotonic() + args.settle
        m = read_metrics(sync)
        while time.monotonic() < deadline and (m.get("spillway_running_sequences") or m.get("spillway_queue_depth")
                                               or m.get("spillway_kv_tokens_used")):
            time.sleep(0.2)
            m = read_metrics(sync)
        return m

    # Identical bursts, one after another: the first may leave one-time device allocations.
    counts: dict[str, int] = {}
    walls, after_each = [], []
    for _ in range(max(2, args.bursts)):
        c, wall = await burst()
        walls.append(wall)
        after_each.append(settled())
        for o, n in c.items():
            counts[o] = counts.get(o, 0) + n
    after = after_each[-1]

    failures = []
    print(f"{len(walls)} bursts of {args.requests} requests at once, {args.prompt_tokens} prompt tokens and "
          f"{args.max_tokens} generated each; answered in {', '.join(f'{w:.1f}' for w in walls)} s\n")
    print("| outcome | requests |\n|---|---:|")
    for o, n in sorted(counts.items()):
        print(f"| {o} | {n} |")
        if o not in ("completed", "rejected 503"):
            failures.append(f"{n} request(s): {o}")
    rejected = counts.get("rejected 503", 0)
    grew = after.get("spillway_requests_rejected_total", 0) - idle.get("spillway_requests_rejected_total", 0)
    if grew != rejected:
        failures.append(f"rejected counter grew by {grew:.0f}, 503 answers {rejected}")
    if counts.get("completed", 0) == 0:
        failures.append("no request completed")
    print("\n| gauge | before | " + " | ".join(f"after burst {i + 1}" for i in range(len(walls))) + " |\n|---|" +
          "---:|" * (len(walls) + 1))
    for name in GAUGES:
        if name in idle or name in after:
            print(f"| {name} | {idle.get(name, float('nan')):.0f} | " +
                  " | ".join(f"{m.get(name, float('nan')):.0f}" for m in after_each) + " |")
    for name in ["spillway_queue_depth", "spillway_running_sequences", "spillway_kv_tokens_used",
                 "spillway_kv_blocks_used"]:
        if name in idle and after.get(name) != idle[name]:
            failures.append(f"{name} {after.get(name)} after the load, {idle[name]} before")
    mem = "spillway_device_memory_used_bytes"
    if mem in idle:
        levels = [idle[mem]] + [m[mem] for m in after_each]
        growth = [(b - a) / 2**20 for a, b in zip(levels, levels[1:])]
        print("\ndevice memory growth per burst: " + ", ".join(f"{g:+.1f} MiB" for g in growth) +
              " (the earlier ones may be one-time allocations; the last must be 0)")
        if growth[-1] != 0:
            failures.append(f"device memory grew by {growth[-1]:+.1f} MiB in the last burst")
    for f in failures:
        print(f"\nFAIL: {f}")
    print("\nPASS" if not failures else f"\nFAIL ({len(failures)})")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
