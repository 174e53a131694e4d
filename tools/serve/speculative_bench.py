#!/usr/bin/env python3
"""Speculative decoding through `spillway serve`, against the same server without it (needs the server
suite's Python packages, tests/python/requirements.txt).

    python tools/serve/speculative_bench.py --bin build/bin/spillway [--model models/demo --device cpu]

Runs `--concurrency` requests at a time (default 1: batch 1), greedy, `--tokens` tokens each, on three workloads:
  code    the demo model's 20 held-out Python prompts (tools/demo_model/heldout_prompts.json);
  replay  an agent re-emitting a file: each code prompt plus the model's own continuation of it, then a
          header announcing the same file again and its first line (the model should write the file out
          once more; what prompt lookup predicts);
  random  random token ids (nothing in the prompt to look up; what the model then writes may still repeat).
For each, servers with `--speculative off` and `--speculative ngram` (both `--no-stale-index-k`, so greedy
outputs must be identical), and the pair again with the reference's stale-index quirk (outputs may
differ there; docs/speculative.md says why). Prints a markdown report: identical outputs, tokens/s,
speedup, drafted/accepted tokens and the mean acceptance length (tokens per verifying step); with
--concurrency above 1, tokens/s is the aggregate (all tokens over the workload's wall time). Exits 1 when
an output with `--no-stale-index-k` differs.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import shlex
import random
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python" / "server"))
from spw_server_harness import Server  # noqa: E402  (the suite's server process)

SPEC_METRICS = ("spillway_spec_verify_steps_total", "spillway_spec_draft_tokens_total",
                "spillway_spec_accepted_tokens_total")


def spec_counts(server: Server) -> dict[str, float]:
    m = server.metrics()
    return {name: next((v for k, v in m.items() if k.startswith(name)), 0.0) for name in SPEC_METRICS}


def complete(http: httpx.Client, prompt, tokens: int) -> tuple[list[int], float]:
    t0 = time.perf_counter()
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True})
    r.raise_for_status()
    return r.json()["choices"][0]["token_ids"], time.perf_counter() - t0


def run(args, extra: list[str], workloads: dict[str, list]) -> dict[str, dict]:
    """Each workload's outputs, seconds and speculation counters on one server."""
    server = Server(args.bin, Path(args.model), "--device", args.device, *shlex.split(args.server_args), *extra,
                    api_key=None)
    http = httpx.Client(base_url=server.base, timeout=3600,
                        limits=httpx.Limits(max_connections=max(10, args.concurrency)))
    out = {}
    try:
        complete(http, [1, 2, 3], 2)  # warm-up
        for name, prompts in workloads.items():
            before = spec_counts(server)
            if args.concurrency <= 1:
                ids, secs = [], 0.0
                for p in prompts:
                    got, s = complete(http, p, args.tokens)
                    ids.append(got)
                    secs += s
            else:
                t0 = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                    ids = [got for got, _ in pool.map(lambda p: complete(http, p, args.tokens), prompts)]
                secs = time.perf_counter() - t0
            after = spec_counts(server)
            out[name] = {"ids": ids, "seconds": secs, **{k: after[k] - before[k] for k in SPEC_METRICS}}
    finally:
        server.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "build" / "bin" / "spillway"))
    ap.add_argument("--model", default=str(ROOT / "models" / "demo"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--draft-tokens", type=int, default=5)
    ap.add_argument("--ngram-min", type=int, default=2)
    ap.add_argument("--workloads", default="code,replay,random",
                    help="comma-separated subset; models without a tokenizer take only random")
    ap.add_argument("--quirk", default="off,on", help="stale-index quirk settings to run: off, on or both")
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    ap.add_argument("--server-args", default="", help="more `spillway serve` arguments for every server, one string")
    args = ap.parse_args()
    wanted = args.workloads.split(",")

    code = [p["prompt"] for p in json.loads((ROOT / "tools/demo_model/heldout_prompts.json").read_text())["prompts"]]
    code = code[:args.prompts]
    rng = random.Random(5)
    vocab = json.loads((Path(args.model) / "config.json").read_text())
    vocab = vocab.get("text_config", vocab)["vocab_size"]
    randoms = [[rng.randrange(3, vocab) for _ in range(40)] for _ in range(args.prompts)]

    # The replay prompts need the model's own continuations of the code prompts.
    replay = []
    if "replay" in wanted:
        server = Server(args.bin, Path(args.model), "--device", args.device, "--no-stale-index-k", api_key=None)
        http = httpx.Client(base_url=server.base, timeout=3600)
        try:
            for p in code:
                r = http.post("/v1/completions", json={"prompt": p, "max_tokens": args.tokens, "temperature": 0,
                                                        "ignore_eos": True})
                r.raise_for_status()
                text = p + r.json()["choices"][0]["text"]
                first_line = text.split("\n", 1)[0]
                replay.append(f"{text}\n\n# The same file, written out again:\n{first_line}\n")
        finally:
            server.stop()
    workloads = {k: v for k, v in {"code": code, "replay": replay, "random": randoms}.items() if k in wanted}

    configs = {}
    quirks = [q == "on" for q in args.quirk.split(",")]
    for quirk in quirks:
        base = [] if quirk else ["--no-stale-index-k"]
        configs[(quirk, "off")] = run(args, base + ["--speculative", "off"], workloads)
        configs[(quirk, "ngram")] = run(args, base + ["--speculative", "ngram", "--draft-tokens", str(args.draft_tokens),
                                                      "--ngram-min", str(args.ngram_min)], workloads)

    failures = 0
    print(f"## Speculative decoding (prompt lookup) on {args.model}, {args.device} runner\n")
    at_once = "one request at a time" if args.concurrency <= 1 else f"{args.concurrency} requests at a time"
    print(f"{args.prompts} prompts per workload, {args.tokens} greedy tokens each, {at_once}; "
          f"`--draft-tokens {args.draft_tokens} --ngram-min {args.ngram_min}`\n")
    print("| stale-index quirk | workload | identical to off | off tok/s | ngram tok/s | speedup | drafted "
          "| accepted | verifying steps | mean acceptance length |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for quirk in quirks:
        off, on = configs[(quirk, "off")], configs[(quirk, "ngram")]
        for name in workloads:
            a, b = off[name], on[name]
            same = sum(x == y for x, y in zip(a["ids"], b["ids"]))
            if not quirk:
                failures += len(a["ids"]) - same
            n_tokens = sum(len(x) for x in b["ids"])
            tps_off = sum(len(x) for x in a["ids"]) / a["seconds"]
            tps_on = n_tokens / b["seconds"]
            steps, drafted, accepted = (b[k] for k in SPEC_METRICS)
            mal = (accepted + steps) / steps if steps else 0.0
            print(f"| {'on' if quirk else 'off'} | {name} | {same}/{len(a['ids'])} | {tps_off:.1f} | {tps_on:.1f} "
                  f"| {tps_on / tps_off:.2f}× | {drafted:.0f} | {accepted:.0f} | {steps:.0f} | {mal:.2f} |")
    print(f"\noutputs differing with --no-stale-index-k: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
